"""Run one scheduled attempt and record how it ended, even if the scheduler is gone by then.

Usage: ``python jaxfit_runner.py STATUS.json -- command args...`` (standard library only).

The scheduler starts this runner as the leader of a new process session, with its output already
sent to the attempt's log file. The runner starts the command in a process group of its own, passes
SIGINT, SIGTERM and SIGHUP on to that whole group, waits for the command, writes
``{"exit_code", "ended_at", "pid"}`` to STATUS.json atomically (``exit_code`` is negative for a
signal, as in ``subprocess``), and then ends whatever the command left in its group (data-loader
workers that outlive a crashed or killed run hold gigabytes). If the scheduler is killed, even by
SIGKILL, the runner keeps the command going and still records its end, so
``jaxfit schedule --resume`` can adopt the attempt instead of losing or repeating it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def _write_status(path: str, status: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(status, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: jaxfit_runner.py STATUS.json -- command [args...]", file=sys.stderr)
        return 2
    status_path, command = argv[0], argv[2:]
    child = None

    def forward(signum: int, _frame: object) -> None:
        # A Python handler (not SIG_IGN) so the command starts with default signal handling.
        if child is not None and child.poll() is None:
            try:
                os.killpg(child.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, process_group=0)
    except OSError as e:
        print(f"jaxfit: cannot start {command[0]!r}: {e.strerror}", flush=True)
        _write_status(status_path, {"exit_code": 127, "ended_at": time.time(), "pid": None})
        return 127
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for safety
            continue
    sys.stdout.flush()
    _write_status(status_path, {"exit_code": code, "ended_at": time.time(), "pid": child.pid})
    try:  # what the command started and left behind ends with it
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
