"""Helpers the tests share (fixtures live in conftest.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one ``jaxfit: error:`` line of a failed command (exit code 2, no traceback)."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("jaxfit: error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]
