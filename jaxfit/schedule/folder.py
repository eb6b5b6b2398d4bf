"""A schedule's state folder, from its birth to its archive: create it, lock it, open it again.

``<state dir>/state.sqlite`` (:mod:`jaxfit.schedule.state`), ``logs/NAME.ATTEMPT.*`` (each
attempt's log, runner status, settings and pin report), ``pins/NAME/`` (each run's proven
program), and ``<state dir>.lock`` beside the folder (so it holds while a finished schedule is
moved aside).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from jaxfit.errors import ConfigError
from jaxfit.fit.pin import Pin
from jaxfit.fit.pin import copy_to as copy_pin
from jaxfit.schedule import packing
from jaxfit.schedule.planner import ScheduledRun
from jaxfit.schedule.queue_file import Queue
from jaxfit.schedule.state import ExperimentRecord, StateStore

STATE_FILE = "state.sqlite"
"""The state file inside a schedule's state folder."""


def default_state_dir(queue_path: str | Path) -> Path:
    """``jaxfit-runs/<queue file stem>`` in the current directory: where a queue's schedule lives."""
    return Path("jaxfit-runs") / Path(queue_path).stem


def state_summary(store: StateStore) -> str:
    """``"3 done, 1 failed, 2 pending"``: how far a stored schedule got."""
    counts: dict[str, int] = {}
    for record in store.experiments():
        counts[record.state] = counts.get(record.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def ensure_no_schedule(state_dir: Path, *, archive: bool = False) -> Path | None:
    """Make sure a new schedule may start in ``state_dir``.

    A folder holding an unfinished schedule is refused (nothing in it is touched). One whose runs
    are all final (done, failed, timeout) is kept: with ``archive`` it is renamed to
    ``<name>-<its start time>`` beside it, and that path is returned.

    Raises:
      ConfigError: an unfinished schedule is there (resume it, or choose another folder).
    """
    path = state_dir / STATE_FILE
    if not path.exists():
        return None
    store = StateStore(path)
    try:
        summary = state_summary(store)
        finished = all(r.final for r in store.experiments())
        created = store.meta("created_at", None) or path.stat().st_mtime
    finally:
        store.close()
    if not finished:
        holder = ScheduleLock(state_dir).holder()
        if holder is not None:
            raise ConfigError(
                f"{state_dir} is being run by jaxfit right now (pid {holder}; {summary}); wait for it, "
                "or stop it (Ctrl-C / kill) and then pass --resume"
            )
        raise ConfigError(
            f"{state_dir} holds an unfinished schedule ({summary}); pass --resume to continue it, or "
            "--state-dir DIR to start a new one elsewhere"
        )
    if not archive:
        return None
    target = state_dir.with_name(f"{state_dir.name}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(created))}")
    n = 1
    while target.exists():
        n += 1
        target = target.with_name(f"{target.name.split('.')[0]}.{n}")
    state_dir.rename(target)
    return target


def create_state(
    state_dir: Path,
    queue: Queue,
    runs: Sequence[ScheduledRun],
    plan: packing.Plan,
    *,
    logical: bool,
    backend: str,
    wandb_group: str | None,
) -> StateStore:
    """Write a new schedule's state: the plan, one ``pending`` row per experiment, a ``planned`` event.

    Raises:
      ConfigError: the folder holds an unfinished schedule (resume it, or choose another folder), or
        the state cannot be made (a full disk: nothing of it is left).
    """
    ensure_no_schedule(state_dir)
    with _whole_or_nothing(state_dir):
        store = StateStore(state_dir / STATE_FILE)
        by_name = {run.name: run for run in runs}
        records = []
        for placement in plan.placements:
            run, experiment = by_name[placement.name], queue.experiment(placement.name)
            records.append(
                ExperimentRecord(
                    name=run.name,
                    position=placement.start,
                    gpu=placement.gpu,
                    mem_fraction=placement.mem_fraction,
                    batch_size=run.batch_size,
                    grad_accum_steps=run.grad_accum_steps,
                    need_bytes=placement.need_bytes,
                    command=run.command,
                    env=tuple(sorted(experiment.env)),
                    retries=experiment.retries,
                    timeout=experiment.timeout,
                    pin_path=_keep_pin(run, state_dir),
                )
            )
        store.add_experiments(records)
        store.set_meta("queue", queue.to_dict())
        store.set_meta("runs", [run.to_dict() for run in runs])
        store.set_meta("plan", plan.to_dict())
        store.set_meta("logical", logical)
        store.set_meta("backend", backend)
        store.set_meta("wandb_group", wandb_group)
        store.set_meta("created_at", time.time())
        store.event("planned", f"{len(records)} runs on {len(plan.gpus)} GPUs in {plan.waves} waves")
        return store


@contextlib.contextmanager
def _whole_or_nothing(state_dir: Path) -> Iterator[None]:
    """A new state is made whole or not at all: when its disk takes no more (or it cannot be opened),
    what this call made is removed (a state that was there before is never touched) and the error
    is one line.

    Raises:
      ConfigError: naming the folder and the cause; others' ConfigErrors as they are.
    """
    existed = state_dir.exists()
    had_state = (state_dir / STATE_FILE).exists()
    try:
        yield
    except (ConfigError, OSError, sqlite3.Error) as e:
        if not existed:
            shutil.rmtree(state_dir, ignore_errors=True)
        elif not had_state:
            for name in (STATE_FILE, STATE_FILE + "-wal", STATE_FILE + "-shm", "pins"):
                path = state_dir / name
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        if isinstance(e, ConfigError):
            if not str(e).startswith("cannot create"):
                raise
            raise ConfigError(f"{e}; nothing was started: free space and run again") from None
        raise ConfigError(
            f"cannot create the schedule state in {state_dir} ({getattr(e, 'strerror', None) or e}; is its disk "
            "full?); nothing was started: free space and run again"
        ) from None


def _keep_pin(run: ScheduledRun, state_dir: Path) -> str | None:
    """A copy of the run's pin in the state folder (``pins/NAME``), out of reach of the cache's
    pruning; None when it has none or it is gone (a stored ``--plan`` whose pins were pruned)."""
    if run.pin is None:
        return None
    pin = Pin.from_dict(run.pin)
    if not pin.usable():
        return None
    try:
        return copy_pin(pin, state_dir / "pins" / run.name).path
    except OSError:
        return None


class ScheduleLock:
    """An exclusive ``flock`` on ``<state dir>.lock`` (beside the folder, so it holds while a finished
    schedule is moved aside) while a scheduler runs the schedule, so that a second ``jaxfit schedule``
    or ``--resume`` cannot start the same runs twice. The kernel drops it when the process dies, even
    by SIGKILL, so a killed scheduler never leaves a stale lock."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir).with_name(Path(state_dir).name + ".lock")
        self._fd: int | None = None

    def __enter__(self) -> ScheduleLock:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(
                f"{self.path.with_suffix('')} is being run by jaxfit (pid {holder}); wait for it, "
                "or stop it (Ctrl-C / kill) and then --resume"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def holder(self) -> str | None:
        """The pid of the jaxfit that holds the lock now, or None when nobody does."""
        import fcntl

        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return os.read(fd, 64).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)
        return None


def check_state_dir(state_dir: Path) -> None:
    """Fail before any fit when the state folder could not be written (or is a file).

    Raises:
      ConfigError: one line naming ``--state-dir``.
    """
    import tempfile

    existing = Path(state_dir)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"--state-dir {state_dir}: {existing} is a file, not a folder; choose another --state-dir")
    try:
        fd, probe = tempfile.mkstemp(prefix=".jaxfit-check.", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(
            f"--state-dir {state_dir}: {existing} is not writable ({e.strerror or e}); choose another --state-dir"
        ) from None


def open_state(state_dir: Path) -> StateStore:
    """Open an existing schedule for ``--resume``.

    Raises:
      ConfigError: there is none in that folder.
    """
    path = state_dir / STATE_FILE
    if not path.exists():
        raise ConfigError(f"no schedule to resume in {state_dir} (no {STATE_FILE}); start one without --resume")
    return StateStore(path)
