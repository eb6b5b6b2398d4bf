"""mkdocs hook: the command-line reference is ``jaxfit <command> --help``, captured at build time.

A line ``<!-- jaxfit-help: COMMAND -->`` in a page becomes a code block of that command's help, as
the installed jaxfit prints it, so the reference cannot drift from the code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

MARKER = re.compile(r"^<!-- jaxfit-help: ?([a-z ]*) -->$", re.MULTILINE)


def _help(command: str) -> str:
    env = dict(os.environ, COLUMNS="100", NO_COLOR="1", TERM="dumb")
    proc = subprocess.run(
        [sys.executable, "-m", "jaxfit.cli", *command.split(), "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"jaxfit {command} --help failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout.rstrip()


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace every help marker with the command's help."""
    return MARKER.sub(lambda m: f"```text\n{_help(m.group(1).strip())}\n```", markdown)
