"""The guard of an attempt of the Ray backend: it stands between the Ray task and the runner.

It forks and its parent exits at once, so the guard is no child of the Ray worker: Ray kills a
worker's children when the worker dies, which would leave the runner's command running unwatched.
The guard starts the runner (its child, a new session, output to the log file that is the
guard's stderr), reports ``pid N`` then ``exit N`` on its stdout, and watches its stdin: a line
from the task ("stop") or end of file (the worker died) makes it SIGTERM the runner's process
group, wait up to GRACE seconds, then SIGKILL the group. If the runner ends without recording a
status (killed) while its group lives on, the guard stops the group the same way. Before starting
the runner it unblocks every signal and restores ignored ones (but SIGPIPE and SIGXFSZ, which
``subprocess`` restores) to their default, and it gives the runner a parent-death SIGTERM.

Usage: ``python -I -S jaxfit_ray_guard.py GRACE STATUS RUNNER...`` (standard library only). The
Ray backend ships this file's source to its workers and runs it with ``python -c``.
"""

import os
import select
import signal
import subprocess
import sys
import time

grace, status_path, argv = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
if os.fork():
    os._exit(0)  # the Ray task reaps this parent; the guard is then no child of the worker
# Undo what the Ray worker passes down: blocked SIGINT, ignored SIGCHLD (which zeroes exit codes).
signal.pthread_sigmask(signal.SIG_SETMASK, [])
for sig in signal.valid_signals():
    if sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGPIPE, signal.SIGXFSZ):
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass


try:
    import ctypes

    prctl = ctypes.CDLL(None).prctl
except Exception:  # not Linux, or no ctypes
    prctl = None


def death_signal():
    # If the guard itself is killed (Ray's subreaper mode adopts and kills it), the runner gets SIGTERM.
    if prctl is not None:
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG


try:
    runner = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=2, stderr=2, start_new_session=True, preexec_fn=death_signal
    )
except OSError as e:
    os.write(1, ("error cannot start the runner: %s\n" % e.strerror).encode())
    os._exit(0)
os.write(1, b"pid %d\n" % runner.pid)


def group_alive():
    runner.poll()  # reap the leader, so that a dead group counts as dead
    try:
        os.killpg(runner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def signal_group(sig):
    try:
        os.killpg(runner.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group():
    signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while group_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if group_alive():
        signal_group(signal.SIGKILL)


while runner.poll() is None:
    if select.select([0], [], [], 0.2)[0]:
        os.read(0, 64)  # "stop" from the task, or end of file: the task's worker is gone
        stop_group()
        break
code = runner.wait()
if not os.path.exists(status_path) and group_alive():
    stop_group()  # the runner was killed: its command must not live on unwatched
try:
    os.write(1, b"exit %d\n" % code)
except OSError:
    pass
