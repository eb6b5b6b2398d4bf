"""Run one scheduled attempt and record how it ended, even if the scheduler is gone by then.

Usage: ``python jaxfit_runner.py STATUS.json -- command args...`` (standard library only).

The scheduler starts this runner as the leader of a new process session, with its output already
sent to the attempt's log file. The runner starts the command in the same process group (so the
scheduler's signals to the group reach all of it), passes on SIGINT, SIGTERM and SIGHUP, waits for
the command, writes ``{"exit_code", "ended_at", "pid"}`` to STATUS.json atomically (``exit_code``
is negative for a signal, as in ``subprocess``), and then ends whatever the command left in the
group (data-loader workers that outlive a crashed or killed run hold gigabytes). If the scheduler
is killed, even by SIGKILL, the runner keeps the command going and still records its end, so
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
                child.send_signal(signum)
            except ProcessLookupError:
                pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
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
    _end_leftovers()
    return code if code >= 0 else 128 - code


def _end_leftovers() -> None:
    """SIGKILL every other process of this process group: what the command started and left behind."""
    group, me = os.getpgrp(), os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:  # no /proc (not Linux): leave them
        return
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == group:  # the fields after the name: state, ppid, pgrp, ...
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, IndexError, ValueError):
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
