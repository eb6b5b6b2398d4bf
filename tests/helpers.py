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


def process_environ(pid: str) -> str:
    """The environment of a live (not zombie) process, its variables separated by spaces, or ''."""
    entry = Path("/proc") / pid
    try:
        if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return ""
        return (entry / "environ").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, IndexError):
        return ""


def processes_with(text: str) -> list[str]:
    """The pids of live processes whose environment holds ``text`` (a marker the test set, which
    every process it starts inherits)."""
    return [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and text in process_environ(p.name)]


def wait_for_code(handle, timeout: float = 30.0) -> int:
    """The exit code of a scheduler attempt's handle (``poll()`` until it answers), or an assertion
    error after ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = handle.poll()
        if code is not None:
            return code
        time.sleep(0.05)
    raise AssertionError(f"the attempt did not end within {timeout} s")
