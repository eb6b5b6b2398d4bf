"""How the scheduler starts an attempt and learns how it ended: the local backend (and the interface
the Ray backend in :mod:`jaxfit.schedule.backends.ray` implements).

Every attempt runs under ``_probe/jaxfit_runner.py``: the runner leads its own process session,
starts the command with its output in the attempt's log file, and writes the exit code to a status
file when the command ends, whether or not the scheduler is still alive. So a scheduler killed by
SIGKILL loses nothing: ``--resume`` adopts live attempts by pid and reads the ones that ended from
their status files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from jaxfit.errors import ConfigError
from jaxfit.fit.budget import overlay_environment

DEFAULT_GRACE_SECONDS = 10.0
"""Seconds between SIGTERM and SIGKILL when a run is stopped."""
RUNNER = str(Path(__file__).resolve().parents[2] / "_probe" / "jaxfit_runner.py")
"""The runner script every attempt is started under."""


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one attempt.

    Attributes:
      name: The experiment.
      attempt: 1 for the first start, then 2, 3...
      command: The command line (batch and accumulation flags already set).
      env: Variables added to the scheduler's environment (CUDA_VISIBLE_DEVICES, the fraction,
        preallocation, WandB group and settings, the queue's own ``env``).
      log_path: The attempt's log file (stdout and stderr).
      status_path: Where the runner writes ``{"exit_code", "ended_at", "pid"}`` at the end.
      gpu: The plan's GPU index.
      gpu_share: The share of that GPU the plan charges the run (its need over the GPU's total),
        what the Ray backend asks for as ``num_gpus``.
      cwd: The working directory of the command.
      gpu_count: GPUs the run takes (``gpus: N`` in the queue); above 1 the Ray backend asks for
        that many whole GPUs.
      gpu_total_bytes: The memory of the GPU the plan placed it on, of which its fraction is a
        share (None on logical GPUs): the Ray backend does not start it on a GPU of another size.
    """

    name: str
    attempt: int
    command: tuple[str, ...]
    env: Mapping[str, str]
    log_path: str
    status_path: str
    gpu: int
    gpu_share: float
    cwd: str
    gpu_count: int = 1
    gpu_total_bytes: int | None = None


class Handle(Protocol):
    """A started attempt."""

    pid: int | None
    """The runner's pid (its process group), or None when the backend does not expose one."""
    host: str | None
    """The host the attempt runs on (``host (node id)`` on a Ray cluster), or None until known."""

    def poll(self) -> int | None:
        """The exit code once the attempt has ended (negative: killed by that signal), else None."""

    def terminate(self) -> None:
        """Ask the attempt to stop (SIGTERM to its whole process group)."""

    def kill(self) -> None:
        """Stop the attempt now (SIGKILL to its whole process group)."""


class Launcher(Protocol):
    """A backend: starts attempts and re-attaches to attempts of an earlier scheduler."""

    name: str
    resumable: bool
    """Whether attempts outlive the scheduler so ``--resume`` can adopt them."""

    def start(self, spec: LaunchSpec) -> Handle:
        """Start an attempt (raises ConfigError when its command cannot be started)."""

    def adopt(self, pid: int | None, status_path: str) -> Handle | None:
        """Re-attach to the attempt whose runner has ``pid`` (None: a runner on another machine,
        which only a backend that keeps its attempts elsewhere can find); None when it is gone."""

    def cluster_gpus(self) -> float | None:
        """The GPUs of the cluster the attempts run on, now (a node that joined or died changes
        it), when the backend places attempts itself; None: the plan's GPUs are the machine's."""

    def close(self) -> None:
        """Release the backend."""


def read_status(status_path: str) -> int | None:
    """The exit code the runner recorded, or None when it has not (yet) written one."""
    status = read_status_file(status_path)
    return None if status is None else int(status["exit_code"])


def read_status_file(status_path: str) -> dict[str, float | int] | None:
    """What the runner recorded at the end (``exit_code``, ``ended_at``), or None when it has not."""
    try:
        with open(status_path) as f:
            data = json.load(f)
        return {"exit_code": int(data["exit_code"]), "ended_at": float(data["ended_at"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _signal_group(pid: int | None, sig: int) -> None:
    if pid is None:
        return
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _GroupSignals:
    """``terminate`` and ``kill`` of a handle whose ``pid`` leads the attempt's process group."""

    pid: int | None

    def terminate(self) -> None:
        _signal_group(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        _signal_group(self.pid, signal.SIGKILL)


class LocalHandle(_GroupSignals):
    """An attempt started by this scheduler (a child process)."""

    def __init__(self, proc: subprocess.Popen[bytes], status_path: str) -> None:
        self._proc = proc
        self.pid: int | None = proc.pid
        self.status_path = status_path
        self.host: str | None = socket.gethostname()

    def poll(self) -> int | None:
        code = self._proc.poll()
        if code is None:
            return None
        recorded = read_status(self.status_path)
        # The runner returns 128+n for a command killed by signal n; its file keeps the -n.
        return recorded if recorded is not None else code


def _is_runner(pid: int, status_path: str) -> bool:
    """Whether ``pid`` is still the runner of this attempt (not a reused pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False
        return True  # no /proc (not Linux): trust the pid
    return os.fsencode(status_path) in args and any(a.endswith(b"jaxfit_runner.py") for a in args)


class AdoptedHandle(_GroupSignals):
    """An attempt started by an earlier scheduler that was killed; watched through its pid."""

    def __init__(self, pid: int, status_path: str) -> None:
        self.pid: int | None = pid
        self.status_path = status_path
        self.host: str | None = socket.gethostname()

    def poll(self) -> int | None:
        recorded = read_status(self.status_path)
        if recorded is not None:
            return recorded
        if self.pid is not None and _is_runner(self.pid, self.status_path):
            return None
        recorded = read_status(self.status_path)  # it may have ended between the two reads
        return recorded if recorded is not None else LOST


LOST = -1000
"""The exit code given to an attempt whose runner vanished without recording one."""

LOST_WITH_NODE = -1001
"""The exit code of an attempt that died with the machine under it (a Ray task whose worker or
node died before its runner recorded a code): not the run's fault, so the scheduler starts it
again without spending one of its retries."""


class LocalLauncher:
    """Runs attempts as child processes of this machine."""

    name = "local"
    resumable = True

    def cluster_gpus(self) -> float | None:
        """None: attempts run on the plan's GPUs of this machine."""
        return None

    def start(self, spec: LaunchSpec) -> LocalHandle:
        env = overlay_environment(os.environ, spec.env)
        Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spec.status_path)
        with open(spec.log_path, "ab") as log:
            try:
                proc = subprocess.Popen(
                    [sys.executable, RUNNER, spec.status_path, "--", *spec.command],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=spec.cwd,
                    start_new_session=True,
                )
            except OSError as e:
                raise ConfigError(f"experiment {spec.name!r}: cannot start the runner: {e.strerror}") from None
        return LocalHandle(proc, spec.status_path)

    def adopt(self, pid: int | None, status_path: str) -> AdoptedHandle | None:
        if pid is None:
            return None
        if read_status(status_path) is None and not _is_runner(pid, status_path):
            return None
        return AdoptedHandle(pid, status_path)

    def close(self) -> None:
        return None
