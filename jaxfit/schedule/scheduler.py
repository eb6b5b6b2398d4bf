"""Running a planned schedule: start runs as memory frees, survive their faults and our own death.

The loop (``Scheduler.run``) polls every ``poll_interval`` seconds:

1. **Ends.** A run that exited 0 is ``done``. One whose log shows it ran out of memory
   (``RESOURCE_EXHAUSTED`` / ``Out of memory``) is started again with more gradient accumulation
   steps, so the same ``--batch-size`` (the global batch) is split into smaller micro-batches
   (:func:`jaxfit.run.accumulation.next_accumulation`); these retries do not count against ``retries``, and
   when no larger accumulation divides the batch the run ``failed``. Any other non-zero exit is a
   crash: it is retried while it has ``retries`` left, then ``failed``.
2. **Timeouts.** A run past its ``timeout`` gets SIGTERM, and SIGKILL ``grace_seconds`` later; it
   ends ``timeout`` (not retried: it would hit the limit again).
3. **Starts.** A waiting run starts as soon as the needs of the runs live on its GPU plus its own
   fit the GPU's capacity (``total - reserve``), taken in plan order, except that a run never
   overtakes a still-waiting run that the plan starts in an earlier wave on the same GPU (so
   priorities hold, while runs the plan starts at once next to a big waiting one still do). This is
   the plan's ``after`` rule measured on the clock: runs start no later than the plan says, often
   earlier, and no GPU ever holds more than its capacity. Retried runs keep their GPU and fraction
   (a smaller micro-batch needs less, not more).

Every decision is an event in the SQLite state (:mod:`jaxfit.schedule.state`), committed at once. Each
attempt runs under a runner that outlives the scheduler (:mod:`jaxfit.schedule.backends.local`), so after a
SIGKILL ``--resume`` adopts attempts that are still running, reads how the others ended, and
starts only what never finished; finished runs are never run again and every log stays on disk.
Ctrl-C or SIGTERM stop the runs gracefully (SIGTERM, then SIGKILL after the grace), mark them
``interrupted`` and exit; ``--resume`` starts them again.

What each attempt gets: ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (its plan fraction),
``XLA_PYTHON_CLIENT_PREALLOCATE=true`` (the plan charges the whole pool; taking it at start makes
a crowded GPU fail in seconds, not an hour in), ``CUDA_VISIBLE_DEVICES`` (its GPU; on logical GPUs
``JAX_PLATFORMS=cpu`` instead), ``WANDB_RUN_GROUP`` (one group per schedule) and
``JAXFIT_WANDB_CONFIG`` (its scheduled settings, added to its WandB config by jaxfit's start-up
hook), plus the queue's ``env``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxfit.schedule import packing
from jaxfit._probe.jaxfit_compile_server import is_out_of_memory
from jaxfit.fit.compiler import PROBE_DIR
from jaxfit.fit.devices import visible_entry
from jaxfit._probe.jaxfit_pin import GUARD_MARKER
from jaxfit.errors import ConfigError
from jaxfit.schedule.backends.local import LOST, Handle, LaunchSpec, Launcher, read_status_file
from jaxfit.fit.pin import Pin, hook_environment, read_report
from jaxfit.fit.pin import copy_to as copy_pin
from jaxfit.schedule.queue_file import Queue
from jaxfit.cli.output import write_json
from jaxfit.schedule.state import Attempt, ExperimentRecord, StateStore
from jaxfit.run.accumulation import next_accumulation, with_steps
from jaxfit.schedule.planner import ScheduledRun
from jaxfit.run.tracking import resolve_mode

LOG_OOM_MARKERS = ("OutOfMemoryError", GUARD_MARKER)
"""Text in a failed attempt's log that means it ran out of memory, beyond XLA's own markers
(:func:`jaxfit._probe.jaxfit_compile_server.is_out_of_memory`, docs/facts.md #8): also jaxfit's
guard, which stops a run whose own program does not fit before its first step."""

STATE_FILE = "state.sqlite"
"""The state file inside a schedule's state folder."""

Report = Callable[[str, str | None, str], None]
"""``report(kind, experiment, text)``: one line for people per decision."""


@dataclasses.dataclass(frozen=True)
class ExecuteOptions:
    """How a schedule runs.

    Attributes:
      poll_interval: Seconds between looks at the runs.
      grace_seconds: Seconds between SIGTERM and SIGKILL when a run is stopped.
      monitor_interval: Seconds between memory samples (0: no monitor).
      wandb_group: The WandB group of every run (None: no group is set).
      cwd: The working directory of the commands (default: the current one).
    """

    poll_interval: float = 0.5
    grace_seconds: float = 10.0
    monitor_interval: float = 2.0
    wandb_group: str | None = None
    cwd: str | None = None


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
            raise ConfigError(f"{state_dir} is being run by jaxfit right now (pid {holder}; {summary}); wait for it, "
                              "or stop it (Ctrl-C / kill) and then pass --resume")
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


def create_state(state_dir: Path, queue: Queue, runs: Sequence[ScheduledRun], plan: packing.Plan, *,
                 logical: bool, backend: str, wandb_group: str | None) -> StateStore:
    """Write a new schedule's state: the plan, one ``pending`` row per experiment, a ``planned`` event.

    Raises:
      ConfigError: the folder holds an unfinished schedule (resume it, or choose another folder).
    """
    ensure_no_schedule(state_dir)
    store = StateStore(state_dir / STATE_FILE)
    by_name = {run.name: run for run in runs}
    records = []
    for placement in plan.placements:
        run, experiment = by_name[placement.name], queue.experiment(placement.name)
        records.append(ExperimentRecord(
            name=run.name, position=placement.start, gpu=placement.gpu, mem_fraction=placement.mem_fraction,
            batch_size=run.batch_size, grad_accum_steps=run.grad_accum_steps,
            need_bytes=placement.need_bytes, command=run.command,
            env=tuple(sorted(experiment.env)), retries=experiment.retries, timeout=experiment.timeout,
            pin_path=_keep_pin(run, state_dir),
        ))
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
            raise ConfigError(f"{self.path.with_suffix('')} is being run by jaxfit (pid {holder}); wait for it, "
                              "or stop it (Ctrl-C / kill) and then --resume") from None
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
        raise ConfigError(f"--state-dir {state_dir}: {existing} is not writable ({e.strerror or e}); choose another "
                          "--state-dir") from None


def open_state(state_dir: Path) -> StateStore:
    """Open an existing schedule for ``--resume``.

    Raises:
      ConfigError: there is none in that folder.
    """
    path = state_dir / STATE_FILE
    if not path.exists():
        raise ConfigError(f"no schedule to resume in {state_dir} (no {STATE_FILE}); start one without --resume")
    return StateStore(path)


def ran_out_of_memory(log_path: str | None, tail_bytes: int = 256 * 1024) -> bool:
    """Whether the end of a log shows an out-of-memory error."""
    if not log_path:
        return False
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return False
    return is_out_of_memory(text) or any(marker in text for marker in LOG_OOM_MARKERS)


def status_path_of(log_path: str) -> str:
    """The runner's status file of the attempt whose log is ``log_path`` (``NAME.N.log``)."""
    return log_path.removesuffix(".log") + ".status.json"


def report_path_of(log_path: str) -> str:
    """Where the start-up hook of the attempt whose log is ``log_path`` reports its pinned program."""
    return log_path.removesuffix(".log") + ".pin.json"


def _pin_at(path: str | None) -> Pin | None:
    if not path:
        return None
    from jaxfit._probe.jaxfit_pin import load_pin

    try:
        return Pin.from_dict(load_pin(path)["summary"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Scheduler:
    """Runs the experiments of a stored schedule to the end (module docstring).

    Args:
      store: The schedule's state (:func:`create_state` or :func:`open_state`).
      launcher: The backend that starts attempts.
      state_dir: The folder of the state, logs and settings files.
      options: Polling, grace, monitor, WandB group.
      report: Called with one line per decision (None: silent).
      on_tick: Called after every poll (e.g. to refresh a live table).
      env: Each experiment's ``env`` from the queue file (the state keeps only the names).
    """

    def __init__(self, store: StateStore, launcher: Launcher, state_dir: Path, options: ExecuteOptions = ExecuteOptions(),
                 report: Report | None = None, on_tick: Callable[[], None] | None = None,
                 env: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.store, self.launcher, self.state_dir, self.options = store, launcher, Path(state_dir), options
        self.env = {name: dict(values) for name, values in (env or {}).items()}
        self._report, self.on_tick = report, on_tick
        self.plan: dict[str, Any] = store.meta("plan")
        self.logical: bool = bool(store.meta("logical", False))
        self.capacity = {g["index"]: g["capacity_bytes"] for g in self.plan["gpus"]}
        self.totals = {g["index"]: g["total_bytes"] for g in self.plan["gpus"]}
        self.waves: dict[str, int] = {p["name"]: p["wave"] for p in self.plan["placements"]}
        self.handles: dict[str, Handle] = {}
        self.attempt_started: dict[str, float] = {}
        self.stopping_since: dict[str, float] = {}
        self.timed_out: set[str] = set()
        self.stop_signal: int | None = None

    # -- reporting --------------------------------------------------------------------------------

    def _event(self, kind: str, name: str | None, text: str) -> None:
        self.store.event(kind, text, name)
        if self._report is not None:
            self._report(kind, name, text)

    # -- starting -----------------------------------------------------------------------------------

    def _settings(self, record: ExperimentRecord, attempt: int) -> dict[str, Any]:
        """What the run's WandB config gets under ``jaxfit``."""
        return {
            "scheduled": True, "schedule": str(self.state_dir), "gpu": record.gpu,
            "mem_fraction": record.mem_fraction, "batch_size": record.batch_size,
            "grad_accum_steps": record.grad_accum_steps,
            "micro_batch_size": record.batch_size // max(1, record.grad_accum_steps),
            "need_bytes": record.need_bytes, "attempt": attempt, "backend": self.launcher.name,
        }

    def _spec(self, record: ExperimentRecord, attempt: int) -> LaunchSpec:
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        stem = str((logs / f"{record.name}.{attempt}").resolve())
        settings_path = Path(stem + ".settings.json")
        write_json(settings_path, self._settings(record, attempt))
        env: dict[str, str] = {
            "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{record.mem_fraction:g}",
            "XLA_PYTHON_CLIENT_PREALLOCATE": "true",
            "JAXFIT_WANDB_CONFIG": str(settings_path.resolve()),
            "PYTHONUNBUFFERED": "1",
        }
        path = os.environ.get("PYTHONPATH")
        env["PYTHONPATH"] = PROBE_DIR + (os.pathsep + path if path else "")
        if self.logical:
            env["JAX_PLATFORMS"] = "cpu"
        else:
            env["CUDA_VISIBLE_DEVICES"] = visible_entry(record.gpu)
        if self.options.wandb_group:
            env["WANDB_RUN_GROUP"] = self.options.wandb_group
        env["WANDB_MODE"] = resolve_mode(None)  # offline without credentials; a queue's env may override
        env.update(self.env.get(record.name, {}))
        pin = _pin_at(record.pin_path)
        env.update(hook_environment(pin, report_path_of(stem + ".log") if pin else None))
        command = with_steps(record.command, record.batch_size, record.grad_accum_steps)
        return LaunchSpec(
            name=record.name, attempt=attempt, command=command, env=env,
            log_path=stem + ".log", status_path=status_path_of(stem + ".log"),
            gpu=record.gpu, gpu_share=min(1.0, record.need_bytes / self.totals[record.gpu]),
            cwd=self.options.cwd or os.getcwd(),
        )

    def _start(self, record: ExperimentRecord) -> None:
        attempt = record.attempts + 1
        spec = self._spec(record, attempt)
        now = time.time()
        try:
            handle = self.launcher.start(spec)
        except ConfigError as err:
            self.store.update(record.name, state="failed", ended_at=now, reason=str(err), attempts=attempt)
            self._event("failed", record.name, str(err))
            return
        self.handles[record.name] = handle
        self.attempt_started[record.name] = now
        self.store.start_attempt(Attempt(record.name, attempt, record.batch_size, record.grad_accum_steps, handle.pid,
                                         now, None, None, None, spec.log_path))
        self.store.update(record.name, state="running", attempts=attempt, pid=handle.pid, log_path=spec.log_path,
                          started_at=record.started_at or now, reason=None)
        accum = f" x {record.grad_accum_steps} accumulation" if record.grad_accum_steps > 1 else ""
        self._event("started", record.name,
                    f"attempt {attempt} on GPU {record.gpu} at fraction {record.mem_fraction:.2f}, batch "
                    f"{record.batch_size}{accum}; log {spec.log_path}")

    def _admit(self, records: Sequence[ExperimentRecord]) -> None:
        """Start every pending run whose turn has come and whose need fits its GPU now."""
        live: dict[int, int] = {}
        for r in records:
            if r.state == "running":
                live[r.gpu] = live.get(r.gpu, 0) + r.need_bytes
        waiting_wave: dict[int, int] = {}  # per GPU: the earliest wave of a run that still waits
        for r in records:  # plan order
            if r.state != "pending":
                continue
            wave = self.waves.get(r.name, 0)
            if r.gpu in waiting_wave and wave > waiting_wave[r.gpu]:
                continue  # never overtake a run the plan starts in an earlier wave
            if live.get(r.gpu, 0) + r.need_bytes <= self.capacity[r.gpu]:
                self._start(r)
                live[r.gpu] = live.get(r.gpu, 0) + r.need_bytes
            else:
                waiting_wave[r.gpu] = min(wave, waiting_wave.get(r.gpu, wave))

    # -- ending -------------------------------------------------------------------------------------

    def _finish(self, record: ExperimentRecord, code: int) -> None:
        """Decide what an ended attempt means (module docstring) and record it, at the time its
        runner recorded (which may be long before a resumed scheduler learns of it)."""
        status = read_status_file(status_path_of(record.log_path)) if record.log_path else None
        name, now = record.name, float(status["ended_at"]) if status else time.time()
        self.handles.pop(name, None)
        self.attempt_started.pop(name, None)
        self.stopping_since.pop(name, None)
        common: dict[str, Any] = {"pid": None, "exit_code": None if code == LOST else code}
        if name in self.timed_out:
            self.timed_out.discard(name)
            outcome, changes = "timeout", dict(state="timeout", ended_at=now, reason=f"stopped at its {record.timeout:g} s timeout")
            self._event("timeout", name, changes["reason"])
        elif code == 0:
            outcome, changes = "done", dict(state="done", ended_at=now, reason=None)
            self._event("done", name, f"finished in {self._elapsed(record, now)}")
        elif self.stop_signal is not None:
            outcome, changes = "interrupted", dict(state="interrupted", reason="stopped with the scheduler")
            self._event("interrupted", name, "stopped with the scheduler; --resume starts it again")
        elif code == LOST:
            outcome, changes = "lost", dict(state="pending", reason="its runner vanished without an exit code")
            self._event("lost", name, "its runner vanished without recording an exit code; starting it again")
        elif ran_out_of_memory(record.log_path):
            outcome = "oom"
            steps = next_accumulation(record.batch_size, record.grad_accum_steps)
            if steps is None:
                changes = dict(state="failed", ended_at=now,
                               reason=f"out of memory at micro-batch {record.batch_size // record.grad_accum_steps}, "
                                      "the smallest that divides its batch")
                self._event("failed", name, changes["reason"])
            else:
                micro = record.batch_size // steps
                changes = dict(state="pending", grad_accum_steps=steps,
                               reason=f"out of memory; retrying as {steps} x {micro}")
                self._event("oom", name, f"out of memory at batch {record.batch_size} x {record.grad_accum_steps} "
                                         f"accumulation; retrying with {steps} steps of {micro} (same global batch "
                                         f"{record.batch_size})")
        else:
            outcome = "crashed"
            crashes = record.crashes + 1
            if crashes <= record.retries:
                changes = dict(state="pending", crashes=crashes, reason=f"exit code {code}; retry {crashes} of {record.retries}")
                self._event("crashed", name, f"exit code {code} (log {record.log_path}); retry {crashes} of {record.retries}")
            else:
                changes = dict(state="failed", crashes=crashes, ended_at=now,
                               reason=f"exit code {code} after {record.attempts} attempts")
                self._event("failed", name, f"exit code {code}; no retries left (log {record.log_path})")
        self.store.end_attempt(name, record.attempts, ended_at=now, exit_code=common["exit_code"], outcome=outcome)
        self.store.update(name, **common, **changes)

    @staticmethod
    def _elapsed(record: ExperimentRecord, now: float) -> str:
        seconds = now - (record.started_at or now)
        return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"

    def _poll(self, records: Sequence[ExperimentRecord]) -> None:
        now = time.time()
        for record in records:
            handle = self.handles.get(record.name)
            if record.state != "running" or handle is None:
                continue
            code = handle.poll()
            if code is not None:
                self._finish(record, code)
                continue
            stopping = self.stopping_since.get(record.name)
            if stopping is not None:
                if now - stopping > self.options.grace_seconds:
                    handle.kill()
                continue
            started = self.attempt_started.get(record.name, now)
            if record.timeout is not None and now - started > record.timeout:
                self.timed_out.add(record.name)
                self.stopping_since[record.name] = now
                self._event("timeout", record.name, f"past its {record.timeout:g} s timeout; stopping it")
                handle.terminate()

    # -- resume ----------------------------------------------------------------------------------------

    def reattach(self) -> None:
        """After an earlier scheduler died: adopt its live attempts, requeue what it left unfinished."""
        for record in self.store.experiments():
            if record.state == "interrupted":
                self.store.update(record.name, state="pending")
                self._event("resumed", record.name, "interrupted earlier; starting it again")
            if record.state != "running":
                continue
            attempts = self.store.attempts(record.name)
            latest = attempts[-1] if attempts else None
            status = status_path_of(record.log_path) if record.log_path else ""
            handle = self.launcher.adopt(record.pid, status) if (record.pid and self.launcher.resumable) else None
            if handle is None:
                if latest is not None:
                    self.store.end_attempt(record.name, latest.attempt, ended_at=time.time(), exit_code=None,
                                           outcome="lost")
                self.store.update(record.name, state="pending", pid=None, reason="its attempt was lost with the scheduler")
                self._event("lost", record.name, "its attempt did not survive the scheduler; starting it again")
                continue
            self.handles[record.name] = handle
            self.attempt_started[record.name] = latest.started_at if latest else time.time()
            ended = read_status_file(status)
            if ended is not None:
                when = time.strftime("%H:%M:%S", time.localtime(float(ended["ended_at"])))
                self._event("adopted", record.name, f"attempt {record.attempts} ended at {when}, while no scheduler "
                                                    f"was running (exit code {ended['exit_code']})")
            else:
                self._event("adopted", record.name,
                            f"attempt {record.attempts} is still running (pid {record.pid}); watching it")

    # -- the loop --------------------------------------------------------------------------------------

    def request_stop(self, signum: int) -> None:
        """Stop every live run gracefully (the loop ends once they have)."""
        if self.stop_signal is None:
            self.stop_signal = signum
            self._event("stopping", None, f"{signal.Signals(signum).name}: stopping {len(self.handles)} runs")
            now = time.time()
            for name, handle in self.handles.items():
                self.stopping_since.setdefault(name, now)
                handle.terminate()
        else:  # a second Ctrl-C: no more grace
            for handle in self.handles.values():
                handle.kill()

    def run(self) -> int:
        """Run until every experiment is final (or a stop signal); returns the exit code.

        0 when all are ``done``; 1 when some failed or timed out; 128 + the signal when stopped.
        Installs SIGINT/SIGTERM handlers for the duration (main thread only).
        """
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, _frame: self.request_stop(signum))
        try:
            while True:
                records = self.store.experiments()
                self._poll(records)
                records = self.store.experiments()
                if self.stop_signal is None:
                    self._admit(records)
                    records = self.store.experiments()
                if self.on_tick is not None:
                    self.on_tick()
                if self.stop_signal is not None and not self.handles:
                    return 128 + self.stop_signal
                if all(r.final for r in records):
                    break
                time.sleep(self.options.poll_interval)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        failed = [r.name for r in self.store.experiments() if r.state != "done"]
        self._event("finished", None, "all runs done" if not failed else f"not done: {', '.join(failed)}")
        return 0 if not failed else 1

    def owners(self) -> dict[int, tuple[str, int]]:
        """``{runner pid: (experiment, plan GPU)}`` of the live attempts (for the memory monitor)."""
        gpus = {r.name: r.gpu for r in self.store.experiments()}
        return {h.pid: (name, gpus[name]) for name, h in list(self.handles.items()) if h.pid is not None}


def pin_status(record: ExperimentRecord) -> dict[str, Any]:
    """``program_pinned``, ``pinned_peak_bytes``, ``program_peak_bytes`` and ``pin_reason`` of a run's
    latest attempt, from its start-up hook's report."""
    pin = _pin_at(record.pin_path)
    report = read_report(report_path_of(record.log_path)) if record.log_path else None
    if report is None:
        reason = ("nothing was fitted" if record.pin_path is None and pin is None else
                  "its pin is gone" if pin is None else
                  "not started" if record.log_path is None else "the train step was not called")
        return {"program_pinned": False, "pinned_peak_bytes": pin.peak_bytes if pin else None,
                "program_peak_bytes": None, "pin_reason": reason}
    return {"program_pinned": bool(report.get("program_pinned")), "pinned_peak_bytes": report.get("pinned_peak_bytes"),
            "program_peak_bytes": report.get("program_peak_bytes"), "pin_reason": report.get("reason")}


def result_rows(store: StateStore) -> list[dict[str, Any]]:
    """The ``--json`` entries after a run: name, gpu, mem_fraction, batch_size, state, attempts, times..."""
    rows = []
    for record in store.experiments():
        data = record.to_dict()
        data.update(pin_status(record))
        data["micro_batch_size"] = record.batch_size // max(1, record.grad_accum_steps)
        data["duration_seconds"] = (
            None if record.started_at is None or record.ended_at is None else round(record.ended_at - record.started_at, 3)
        )
        rows.append(data)
    return rows

