"""Measuring processes started before their programs are proven: the start-up paid while the tune proves.

A fresh process of a script costs its start-up before its first step (Python, imports, the
device, the state: about 25 s of a 31 s measurement of gpt-small on an H200,
benchmarks/JOURNAL.md section 35), and a tune of a script used to pay it after the proofs, once
per setting measured. A *standby* is that process started as soon as a setting's search has
answered, with the command of the micro-batch the setting will prove first (so its own program
is the one that will be pinned): it starts up beside the proofs and waits at the first call of
its train step (:class:`jaxfit._probe.jaxfit_measure.Standby`). When the tune measures that row,
the standby is told its pins, give-up test and deadline, and runs exactly as a fresh measuring
process started then would (:func:`jaxfit.tune.measure._measure_in`); a standby that is not used
is told to stop and ends having run nothing.

On a GPU each standby holds its pool while it waits, so no more start than fit beside the probes
under 0.95 of the card (:func:`allowed`). A script that refuses to start beside another run of
itself (openpi over its own checkpoint folder, without ``--overwrite``) would refuse the probes
started after a standby: a probe that fails for another reason than memory while standbys wait
makes them stand down for the rest of the tune (:func:`stand_down`), and it is proved again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from jaxfit._probe.jaxfit_measure import WAIT_ENV
from jaxfit.errors import DoesNotFitError, JaxfitError
from jaxfit.fit import FitResult
from jaxfit.fit.common import Progress, notify
from jaxfit.fit.devices import cuda_total_bytes
from jaxfit.fit.leftovers import probe_ended, probe_environment, probe_started
from jaxfit.tune.measure import _finish, _launch, _orders, _start_environment, _step_name
from jaxfit.tune.model import Target, TuneOptions
from jaxfit.tune.space import Setting

T = TypeVar("T")

__all__ = ["Standby", "Standbys", "allowed", "stand_down", "without_standbys_on_failure"]


def allowed(target: Target, tuning: TuneOptions, fraction: float, probes: int, settings: int) -> int:
    """How many standbys a tune keeps: one a setting, for a script measured in fresh processes
    (``process``, or ``inline`` with its fresh confirmation) with ``tuning.standby``; on a GPU no
    more than fit beside ``probes`` probes, each process holding ``fraction`` of the card, under
    0.95 of it."""
    if target.script is None or not tuning.standby or tuning.measure not in ("process", "inline"):
        return 0
    if cuda_total_bytes() is None:
        return settings
    return max(0, min(settings, int(0.95 / fraction) - probes))


class Standby:
    """One waiting measuring process of ``setting`` at ``micro x accum`` (module docstring).

    ``searched``: the setting's search, for the fraction the process runs under and the name of
    its train step (the same for every micro-batch of the setting)."""

    def __init__(
        self, target: Target, setting: Setting, micro: int, accum: int, searched: FitResult, tune: TuneOptions
    ) -> None:
        self.setting, self.micro, self.accum = setting.name, micro, accum
        self.command = target.command(setting, micro, accum, measuring=True)
        self.folder = Path(tempfile.mkdtemp(prefix="jaxfit-standby-"))
        self._orders = self.folder / "orders.json"
        self._lock = threading.Lock()
        self._done = False
        env = _start_environment(self.folder, tune, searched.process_fraction, _step_name(searched))
        env[WAIT_ENV] = str(self._orders)
        env.update(probe_environment())  # its writes are the tune's to take away, once it has ended
        self._recording = probe_started(env)
        self._log: IO[bytes] = open(self.folder / "log.txt", "wb")  # noqa: SIM115 (closed by close())
        cwd = target.script.cwd if target.script is not None else None
        self._proc = _launch(self.command, env, cwd, self._log)
        self.started = time.perf_counter()

    def matches(self, setting: str, micro: int, accum: int) -> bool:
        return not self._done and (self.setting, self.micro, self.accum) == (setting, micro, accum)

    def measure(
        self,
        fit: FitResult,
        tune: TuneOptions,
        give_up: tuple[int, float] | None,
        more: Sequence[str] = (),
        deadline: float | None = None,
    ) -> dict[str, Any] | None:
        """Hand the waiting process its orders (``fit``'s pin first, then ``more``; ``give_up`` per
        step) and what it measured, as :func:`jaxfit.tune.measure._measure_in` gives it; None when
        the process is gone (it failed to start: measured afresh instead)."""
        with self._lock:
            if self._done:
                return None
            self._done = True
        try:
            if self._proc.poll() is not None:  # ended before its orders: the script may not start beside itself
                stand_down()
                return None
            waited = time.perf_counter() - self.started
            self._write({"env": _orders(self.folder, fit, tune, give_up, more, deadline)})
            measured = _finish(self.folder, self._proc, tune.measure_timeout * (1 + len(more)))
            return dict(measured, standby_seconds=round(waited, 3))
        finally:
            self._end()

    def close(self) -> None:
        """Tell the process to stop (it ends before its first step) and take its folder away."""
        with self._lock:
            if self._done:
                return
            self._done = True
        try:
            self._write({"stop": True, "why": "the tune did not need it"})
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        finally:
            self._end()

    def _write(self, orders: dict[str, Any]) -> None:
        tmp = self._orders.with_suffix(".tmp")
        tmp.write_text(json.dumps(orders))
        os.replace(tmp, self._orders)

    def _end(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._proc.wait()
        self._log.close()
        probe_ended(self._recording)
        shutil.rmtree(self.folder, ignore_errors=True)


_ACTIVE: list[Standbys] = []
"""The standbys of the tunes running in this process (one, but for tests)."""
_ACTIVE_LOCK = threading.Lock()


def stand_down() -> bool:
    """Stop every waiting standby of the running tunes and start none for the rest of them (a
    probe failed beside them: its script may refuse to start beside another run of itself).
    Whether any was waiting."""
    with _ACTIVE_LOCK:
        active = list(_ACTIVE)
    return any([standbys.stand_down() for standbys in active])  # a list: every tune's, not the first's


def without_standbys_on_failure(run: Callable[[], T]) -> T:
    """``run()`` (a probe of the script); when it fails for another reason than not fitting while
    standbys wait, they stand down (:func:`stand_down`) and it runs once more without them."""
    try:
        return run()
    except DoesNotFitError:
        raise
    except JaxfitError:
        if not stand_down():
            raise
        return run()


class Standbys:
    """A tune's standbys: at most ``limit`` alive at once, one a setting."""

    def __init__(self, target: Target, tune: TuneOptions, limit: int, progress: Progress | None = None) -> None:
        self._target, self._tune, self._limit, self._progress = target, tune, limit, progress
        self._waiting: list[Standby] = []
        self._lock = threading.Lock()
        if limit > 0:
            with _ACTIVE_LOCK:
                _ACTIVE.append(self)

    def stand_down(self) -> bool:
        """Stop the waiting standbys and start no more (said once, when any was started); whether
        any was waiting."""
        with self._lock:
            started, self._limit = bool(self._waiting) and self._limit > 0, 0
            waiting, self._waiting = [s for s in self._waiting if not s._done], []
        for standby in waiting:
            standby.close()
        if started:
            notify(
                self._progress,
                "note",
                text="tune: a run of the script failed or ended beside a process on standby (a script that refuses "
                "to start beside itself?): standby is off for the rest of the tune, and that run starts again alone",
            )
        return bool(waiting)

    def start(self, setting: Setting, micro: int, accum: int, searched: FitResult) -> None:
        """Start a standby for ``setting`` at ``micro x accum``, unless the limit is reached or the
        setting has one."""
        with self._lock:
            alive = [s for s in self._waiting if not s._done]
            if len(alive) >= self._limit or any(s.setting == setting.name for s in alive):
                return
            standby = Standby(self._target, setting, micro, accum, searched, self._tune)
            self._waiting.append(standby)
        notify(
            self._progress,
            "note",
            text=f"tune: a process of the script for {setting.name} at {micro} x {accum} starts up on standby, "
            "to be measured once proved",
        )

    def take(self, setting: str, micro: int, accum: int) -> Standby | None:
        """The waiting standby of that row, if any (it is then the caller's to use)."""
        with self._lock:
            return next((s for s in self._waiting if s.matches(setting, micro, accum)), None)

    def close(self) -> None:
        """Stop every standby not used."""
        with _ACTIVE_LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for standby in waiting:
            standby.close()
