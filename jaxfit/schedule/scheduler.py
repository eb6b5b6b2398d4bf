"""Running a planned schedule: start runs as memory frees, survive their faults and our own death
(:class:`Scheduler`); out-of-memory runs retried with more accumulation, crashes with their
``retries``, hangs stopped at their ``timeout``.

The design, at length: docs/guides/how-it-works.md, "The scheduler loop".
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxfit._probe.jaxfit_cap import CAP_EXIT
from jaxfit._probe.jaxfit_compile_server import is_out_of_memory
from jaxfit._probe.jaxfit_pin import GUARD_MARKER
from jaxfit.errors import ConfigError
from jaxfit.files import write_json
from jaxfit.fit.budget import fraction_variable
from jaxfit.fit.command import PROBE_DIR
from jaxfit.fit.devices import visible_entry
from jaxfit.fit.pin import Pin, hook_environment, pool_environment, read_report
from jaxfit.run.accumulation import next_accumulation, with_steps
from jaxfit.run.tracking import resolve_mode
from jaxfit.schedule import packing
from jaxfit.schedule.backends.local import (
    DEFAULT_GRACE_SECONDS,
    LOST,
    LOST_WITH_NODE,
    Handle,
    Launcher,
    LaunchSpec,
    read_status_file,
)
from jaxfit.schedule.state import Attempt, ExperimentRecord, RunState, StateStore

LOG_OOM_MARKERS = ("OutOfMemoryError", GUARD_MARKER)

MAX_NODE_LOSSES = 3
"""Attempts of one run that may die with their node or worker (Ray) before a further loss counts
as a crash, which spends a retry: a node that keeps dying under one run is not bad luck."""
"""Text in a failed attempt's log that means it ran out of memory, beyond XLA's own markers
(:func:`jaxfit._probe.jaxfit_compile_server.is_out_of_memory`, docs/guides/facts.md #8): also jaxfit's
guard, which stops a run whose own program does not fit before its first step."""

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
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    monitor_interval: float = 2.0
    wandb_group: str | None = None
    cwd: str | None = None


def fits_gpus(shares: Sequence[float], gpus: int) -> bool:
    """Whether runs taking ``shares`` (a fraction of one GPU each, or a whole number of GPUs of
    their own for a run on several) fit ``gpus`` GPUs, placed largest first, each on the first GPU
    with room: the GPUs count as Ray counts them, so two runs of 0.6 do not share one."""
    free = [1.0] * max(0, gpus)
    for share in sorted(shares, reverse=True):
        if share > 1:  # whole GPUs, untouched by any other run
            whole = [i for i, room in enumerate(free) if room >= 1 - 1e-9][: math.ceil(share - 1e-9)]
            if len(whole) < math.ceil(share - 1e-9):
                return False
            for i in whole:
                free[i] = 0.0
            continue
        spot = next((i for i, room in enumerate(free) if room + 1e-9 >= share), None)
        if spot is None:
            return False
        free[spot] -= share
    return True


def spread_share(need: float, live: Sequence[float], one_gpu_runs: int, gpus: int) -> float:
    """The share of a GPU a one-GPU run asks a Ray cluster for: at least ``1 / k`` when
    ``one_gpu_runs`` (running or waiting) spread evenly put ``k`` of them on each GPU that runs on
    several GPUs leave, as long as that still fits next to ``live``; else its ``need``.

    Ray chooses the GPU of a fractional request inside a node and packs them: on four H100s four
    runs of 0.10-0.16 went to one GPU while the node's other GPU idled (benchmarks/JOURNAL.md
    section 14). Asking for an even split of the GPUs makes Ray spread them; it costs no memory
    (each run's pool is its own fraction), only logical room Ray could otherwise have packed.
    """
    if need >= 1 or one_gpu_runs < 1:
        return need
    free = gpus - sum(s for s in live if s >= 1)
    per_gpu = math.ceil(one_gpu_runs / max(1, free))
    asked = max(need, 1.0 / per_gpu)
    return asked if asked > need and fits_gpus([*live, asked], gpus) else need


def _log_tail(log_path: str | None, tail_bytes: int = 256 * 1024) -> str:
    """The end of a log ("" when there is none)."""
    if not log_path:
        return ""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def ran_out_of_memory(log_path: str | None) -> bool:
    """Whether the end of a log shows an out-of-memory error."""
    text = _log_tail(log_path)
    return bool(text) and (is_out_of_memory(text) or any(marker in text for marker in LOG_OOM_MARKERS))


def _log_error(log_path: str | None) -> str | None:
    """jaxfit's last error line in a log (its start-up hook's), without the prefix."""
    lines = [line for line in _log_tail(log_path).splitlines() if line.startswith("jaxfit: error: ")]
    return lines[-1].removeprefix("jaxfit: error: ").strip() if lines else None


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

    def __init__(
        self,
        store: StateStore,
        launcher: Launcher,
        state_dir: Path,
        options: ExecuteOptions = ExecuteOptions(),
        report: Report | None = None,
        on_tick: Callable[[], None] | None = None,
        env: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.store, self.launcher, self.state_dir, self.options = store, launcher, Path(state_dir), options
        self.env = {name: dict(values) for name, values in (env or {}).items()}
        self._report, self.on_tick = report, on_tick
        self.plan = packing.Plan.from_dict(store.meta("plan"))
        self.logical: bool = bool(store.meta("logical", False))
        self.capacity = {g.index: g.capacity_bytes for g in self.plan.gpus}
        self.totals = {g.index: g.total_bytes for g in self.plan.gpus}
        self.waves: dict[str, int] = {p.name: p.wave for p in self.plan.placements}
        self.gpus_of = self.plan.gpus_of()
        self.handles: dict[str, Handle] = {}
        self.attempt_started: dict[str, float] = {}
        self.stopping_since: dict[str, float] = {}
        self.timed_out: set[str] = set()
        self.stop_signal: int | None = None
        self._waiting_for: tuple[str, float] | None = None
        self._asked: dict[str, float] = {}  # on a Ray cluster: the share of a GPU each live run asked Ray for
        self._hosts: dict[str, tuple[int, str]] = {}  # the host recorded for each run's latest attempt

    # -- reporting --------------------------------------------------------------------------------

    def _event(self, kind: str, name: str | None, text: str) -> None:
        self.store.event(kind, text, name)
        if self._report is not None:
            self._report(kind, name, text)

    # -- starting -----------------------------------------------------------------------------------

    def _settings(self, record: ExperimentRecord, attempt: int) -> dict[str, Any]:
        """What the run's WandB config gets under ``jaxfit``."""
        return {
            "scheduled": True,
            "schedule": str(self.state_dir),
            "gpu": record.gpu,
            "gpus": list(self._gpus(record)),
            "mem_fraction": record.mem_fraction,
            "batch_size": record.batch_size,
            "grad_accum_steps": record.grad_accum_steps,
            "micro_batch_size": record.batch_size // max(1, record.grad_accum_steps),
            "need_bytes": record.need_bytes,
            "attempt": attempt,
            "backend": self.launcher.name,
        }

    def _gpus(self, record: ExperimentRecord) -> tuple[int, ...]:
        """Every GPU the run takes (its plan placement; one for most runs)."""
        return self.gpus_of.get(record.name) or (record.gpu,)

    def _spec(self, record: ExperimentRecord, attempt: int, share: float | None = None) -> LaunchSpec:
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        stem = str((logs / f"{record.name}.{attempt}").resolve())
        settings_path = Path(stem + ".settings.json")
        write_json(settings_path, self._settings(record, attempt))
        env: dict[str, str] = {
            fraction_variable(): f"{record.mem_fraction:g}",  # never both spellings: jaxlib refuses that
            "XLA_PYTHON_CLIENT_PREALLOCATE": "true",
            "JAXFIT_WANDB_CONFIG": str(settings_path.resolve()),
            "PYTHONUNBUFFERED": "1",
        }
        queue_env = dict(self.env.get(record.name, {}))
        paths = [p for p in (queue_env.pop("PYTHONPATH", None), os.environ.get("PYTHONPATH")) if p]
        env["PYTHONPATH"] = os.pathsep.join([PROBE_DIR, *paths])  # the hook first: the queue's own after it
        if self.logical:
            env["JAX_PLATFORMS"] = "cpu"
        else:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(visible_entry(gpu) for gpu in self._gpus(record))
        if self.options.wandb_group:
            env["WANDB_RUN_GROUP"] = self.options.wandb_group
        env["WANDB_MODE"] = resolve_mode(None)  # offline without credentials; a queue's env may override
        env.update(queue_env)
        # the run checks, before its first step, that it holds its pool and no more (jaxfit_cap)
        env.update(pool_environment(record.mem_fraction, None if self.logical else self.totals[record.gpu]))
        pin = _pin_at(record.pin_path)
        env.update(hook_environment(pin, report_path_of(stem + ".log") if pin else None))
        command = with_steps(record.command, record.batch_size, record.grad_accum_steps)
        return LaunchSpec(
            name=record.name,
            attempt=attempt,
            command=command,
            env=env,
            log_path=stem + ".log",
            status_path=status_path_of(stem + ".log"),
            gpu=record.gpu,
            gpu_share=share if share is not None else min(1.0, record.need_bytes / self.totals[record.gpu]),
            gpu_count=len(self._gpus(record)),
            cwd=self.options.cwd or os.getcwd(),
            gpu_total_bytes=None if self.logical else self.totals[record.gpu],
        )

    def _start(self, record: ExperimentRecord, share: float | None = None) -> None:
        attempt = record.attempts + 1
        spec = self._spec(record, attempt, share)
        now = time.time()
        try:
            handle = self.launcher.start(spec)
        except ConfigError as err:
            self.store.update(record.name, state=RunState.FAILED, ended_at=now, reason=str(err), attempts=attempt)
            self._event("failed", record.name, str(err))
            return
        self.handles[record.name] = handle
        self.attempt_started[record.name] = now
        self.store.start_attempt(
            Attempt(
                record.name,
                attempt,
                record.batch_size,
                record.grad_accum_steps,
                handle.pid,
                now,
                None,
                None,
                None,
                spec.log_path,
            )
        )
        self.store.update(
            record.name,
            state=RunState.RUNNING,
            attempts=attempt,
            pid=handle.pid,
            log_path=spec.log_path,
            started_at=record.started_at or now,
            reason=None,
        )
        accum = f" x {record.grad_accum_steps} accumulation" if record.grad_accum_steps > 1 else ""
        where = (
            "on the Ray cluster"
            if self.launcher.cluster_gpus() is not None
            else f"on GPU {','.join(map(str, self._gpus(record)))}"
        )
        self._event(
            "started",
            record.name,
            f"attempt {attempt} {where} at fraction "
            f"{record.mem_fraction:.2f}, batch "
            f"{record.batch_size}{accum}; log {spec.log_path}",
        )

    def _cluster_share(self, record: ExperimentRecord) -> float:
        """The GPUs a run takes of a Ray cluster as Ray counts them: its share of one GPU, or whole
        GPUs for a run on several (Ray has no fraction of several GPUs)."""
        gpus = self._gpus(record)
        return float(len(gpus)) if len(gpus) > 1 else min(1.0, record.need_bytes / self.totals[record.gpu])

    def _admit_to_cluster(self, records: Sequence[ExperimentRecord], cluster_gpus: float) -> None:
        """On a Ray cluster Ray places each attempt on any node, and packs each GPU by the shares:
        start pending runs in plan order while what they take fits the cluster's GPUs now (a node
        that joins adds its GPUs, one that dies takes them away). The first run that does not fit
        holds back the ones after it, as an earlier wave does on one machine."""
        gpus = int(cluster_gpus + 1e-9)
        running = [r for r in records if r.state == RunState.RUNNING]
        live = [self._asked.get(r.name, self._cluster_share(r)) for r in running]
        one_gpu = sum(1 for r in records if r.state in (RunState.RUNNING, RunState.PENDING) and len(self._gpus(r)) == 1)
        for r in records:
            if r.state != RunState.PENDING:
                continue
            need = self._cluster_share(r)
            if not fits_gpus([*live, need], gpus):
                if not live and self._waiting_for != (r.name, cluster_gpus):
                    self._waiting_for = (r.name, cluster_gpus)
                    self._event(
                        "waiting",
                        r.name,
                        f"takes {need:.2f} of a GPU and the Ray cluster has {cluster_gpus:g} GPUs; "
                        "waiting for a node with GPUs to join",
                    )
                return
            asked = spread_share(need, live, one_gpu, gpus)
            self._asked[r.name] = asked
            self._start(r, share=asked if asked != need else None)
            live.append(asked)

    def _admit(self, records: Sequence[ExperimentRecord]) -> None:
        """Start every pending run whose turn has come and whose need fits its GPU now."""
        cluster_gpus = self.launcher.cluster_gpus()
        if cluster_gpus is not None:
            self._admit_to_cluster(records, cluster_gpus)
            return
        live: dict[int, int] = {}
        for r in records:
            if r.state == RunState.RUNNING:
                for gpu in self._gpus(r):
                    live[gpu] = live.get(gpu, 0) + r.need_bytes
        waiting_wave: dict[int, int] = {}  # per GPU: the earliest wave of a run that still waits
        for r in records:  # plan order
            if r.state != RunState.PENDING:
                continue
            wave, gpus = self.waves.get(r.name, 0), self._gpus(r)
            if any(gpu in waiting_wave and wave > waiting_wave[gpu] for gpu in gpus):
                continue  # never overtake a run the plan starts in an earlier wave
            if all(live.get(gpu, 0) + r.need_bytes <= self.capacity[gpu] for gpu in gpus):
                self._start(r)
                for gpu in gpus:
                    live[gpu] = live.get(gpu, 0) + r.need_bytes
            else:  # a run on several GPUs holds back each of them
                for gpu in gpus:
                    waiting_wave[gpu] = min(wave, waiting_wave.get(gpu, wave))

    # -- ending -------------------------------------------------------------------------------------

    def _finish(self, record: ExperimentRecord, code: int) -> None:
        """Decide what an ended attempt means (module docstring) and record it, at the time its
        runner recorded (which may be long before a resumed scheduler learns of it)."""
        status = read_status_file(status_path_of(record.log_path)) if record.log_path else None
        name, now = record.name, float(status["ended_at"]) if status else time.time()
        self.handles.pop(name, None)
        self.attempt_started.pop(name, None)
        self.stopping_since.pop(name, None)
        common: dict[str, Any] = {"pid": None, "exit_code": None if code in (LOST, LOST_WITH_NODE) else code}
        changes: dict[str, Any]
        if name in self.timed_out:
            self.timed_out.discard(name)
            outcome, changes = (
                "timeout",
                dict(state=RunState.TIMEOUT, ended_at=now, reason=f"stopped at its {record.timeout:g} s timeout"),
            )
            self._event("timeout", name, changes["reason"])
        elif code == 0:
            outcome, changes = "done", dict(state=RunState.DONE, ended_at=now, reason=None)
            self._event("done", name, f"finished in {self._elapsed(record, now)}")
        elif self.stop_signal is not None:
            outcome, changes = "interrupted", dict(state=RunState.INTERRUPTED, reason="stopped with the scheduler")
            self._event("interrupted", name, "stopped with the scheduler; --resume starts it again")
        elif code == LOST:
            outcome, changes = "lost", dict(state=RunState.PENDING, reason="its runner vanished without an exit code")
            self._event("lost", name, "its runner vanished without recording an exit code; starting it again")
        elif code == LOST_WITH_NODE and self._losses(name) < MAX_NODE_LOSSES:
            outcome = "lost"
            changes = dict(state=RunState.PENDING, reason="its worker or node died under it; starting it again")
            where = self._hosts.get(name, (0, ""))[1]
            self._event(
                "lost",
                name,
                f"its worker or node{f' ({where})' if where else ''} died under it; starting it again (no retry spent)",
            )
        elif code == CAP_EXIT:  # its GPU pool is not the one it was given: another attempt would not be
            outcome = "crashed"
            why = _log_error(record.log_path) or "its GPU pool is not the fraction jaxfit set"
            changes = dict(state=RunState.FAILED, ended_at=now, reason=why)
            self._event("failed", name, f"{why} (log {record.log_path})")
        elif ran_out_of_memory(record.log_path):
            outcome = "oom"
            steps = next_accumulation(record.batch_size, record.grad_accum_steps)
            if steps is None:
                changes = dict(
                    state=RunState.FAILED,
                    ended_at=now,
                    reason=f"out of memory at micro-batch {record.batch_size // record.grad_accum_steps}, "
                    "the smallest that divides its batch",
                )
                self._event("failed", name, changes["reason"])
            else:
                micro = record.batch_size // steps
                changes = dict(
                    state=RunState.PENDING,
                    grad_accum_steps=steps,
                    reason=f"out of memory; retrying as {steps} x {micro}",
                )
                self._event(
                    "oom",
                    name,
                    f"out of memory at batch {record.batch_size} x {record.grad_accum_steps} "
                    f"accumulation; retrying with {steps} steps of {micro} (same global batch "
                    f"{record.batch_size})",
                )
        else:
            outcome = "crashed"
            crashes = record.crashes + 1
            if crashes <= record.retries:
                changes = dict(
                    state=RunState.PENDING,
                    crashes=crashes,
                    reason=f"exit code {code}; retry {crashes} of {record.retries}",
                )
                self._event(
                    "crashed", name, f"exit code {code} (log {record.log_path}); retry {crashes} of {record.retries}"
                )
            else:
                changes = dict(
                    state=RunState.FAILED,
                    crashes=crashes,
                    ended_at=now,
                    reason=f"exit code {code} after {record.attempts} attempts",
                )
                self._event("failed", name, f"exit code {code}; no retries left (log {record.log_path})")
        self.store.end_attempt(name, record.attempts, ended_at=now, exit_code=common["exit_code"], outcome=outcome)
        self.store.update(name, **common, **changes)

    def _losses(self, name: str) -> int:
        """How many attempts of ``name`` were lost with their node or worker so far."""
        return sum(1 for a in self.store.attempts(name) if a.outcome == "lost")

    @staticmethod
    def _elapsed(record: ExperimentRecord, now: float) -> str:
        seconds = now - (record.started_at or now)
        return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"

    def _note_host(self, record: ExperimentRecord, handle: Handle) -> None:
        """Record where an attempt runs, once its backend knows (on a Ray cluster: which node);
        on a cluster, say so as an event, so that a lost attempt's node is known."""
        host = getattr(handle, "host", None)
        if not host or self._hosts.get(record.name) == (record.attempts, host):
            return
        self._hosts[record.name] = (record.attempts, host)
        self.store.set_attempt_host(record.name, record.attempts, host)
        if self.launcher.name == "ray":
            self._event("placed", record.name, f"attempt {record.attempts} runs on {host}")

    def _poll(self, records: Sequence[ExperimentRecord]) -> None:
        now = time.time()
        for record in records:
            handle = self.handles.get(record.name)
            if record.state != RunState.RUNNING or handle is None:
                continue
            code = handle.poll()
            self._note_host(record, handle)
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
            if record.state == RunState.INTERRUPTED:
                self.store.update(record.name, state=RunState.PENDING)
                self._event("resumed", record.name, "interrupted earlier; starting it again")
            if record.state != RunState.RUNNING:
                continue
            attempts = self.store.attempts(record.name)
            latest = attempts[-1] if attempts else None
            status = status_path_of(record.log_path) if record.log_path else ""
            handle = self.launcher.adopt(record.pid, status) if (status and self.launcher.resumable) else None
            if handle is None:
                if latest is not None:
                    self.store.end_attempt(
                        record.name, latest.attempt, ended_at=time.time(), exit_code=None, outcome="lost"
                    )
                self.store.update(
                    record.name, state=RunState.PENDING, pid=None, reason="its attempt was lost with the scheduler"
                )
                self._event("lost", record.name, "its attempt did not survive the scheduler; starting it again")
                continue
            self.handles[record.name] = handle
            self.attempt_started[record.name] = latest.started_at if latest else time.time()
            ended = read_status_file(status)
            if ended is not None:
                when = time.strftime("%H:%M:%S", time.localtime(float(ended["ended_at"])))
                self._event(
                    "adopted",
                    record.name,
                    f"attempt {record.attempts} ended at {when}, while no scheduler "
                    f"was running (exit code {ended['exit_code']})",
                )
            else:
                self._event(
                    "adopted",
                    record.name,
                    f"attempt {record.attempts} is still running (pid {record.pid}); watching it",
                )

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

    def _stop_now(self) -> None:
        """Stop every live run: SIGTERM, then SIGKILL after the grace period (nothing is recorded:
        the state is what failed)."""
        for handle in self.handles.values():
            handle.terminate()
        deadline = time.monotonic() + self.options.grace_seconds
        while any(h.poll() is None for h in self.handles.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for handle in self.handles.values():
            if handle.poll() is None:
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
        except (sqlite3.Error, OSError) as e:  # the state cannot be written (a full disk): stop, say so
            self._stop_now()
            resumable = self.store.path.is_file() and self.store.path.stat().st_size > 0
            then = (
                "then rerun with --resume to continue"
                if resumable
                else "then run the schedule again without --resume (no state was written to resume from)"
            )
            raise ConfigError(
                f"cannot write the schedule state {self.store.path} ({getattr(e, 'strerror', None) or e}; is its disk "
                f"full?): the runs were stopped; free space, {then}"
            ) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        failed = [r.name for r in self.store.experiments() if r.state != RunState.DONE]
        self._event("finished", None, "all runs done" if not failed else f"not done: {', '.join(failed)}")
        return 0 if not failed else 1

    def owners(self) -> dict[int, tuple[str, int]]:
        """``{runner pid: (experiment, plan GPU)}`` of the live attempts (for the memory monitor)."""
        gpus = {r.name: r.gpu for r in self.store.experiments()}
        return {h.pid: (name, gpus[name]) for name, h in list(self.handles.items()) if h.pid is not None}


def pin_status(record: ExperimentRecord) -> dict[str, Any]:
    """``program_pinned``, ``pinned_peak_bytes``, ``program_peak_bytes``, ``pin_reason`` and
    ``pinned_step`` (the function the pin covers) of a run's latest attempt, from its start-up hook's
    report."""
    pin = _pin_at(record.pin_path)
    report = read_report(report_path_of(record.log_path)) if record.log_path else None
    if report is None:
        reason = (
            "nothing was fitted"
            if record.pin_path is None and pin is None
            else "its pin is gone"
            if pin is None
            else "not started"
            if record.log_path is None
            else "the train step was not called"
        )
        return {
            "program_pinned": False,
            "pinned_peak_bytes": pin.peak_bytes if pin else None,
            "program_peak_bytes": None,
            "pin_reason": reason,
            "pinned_step": pin.step_name if pin else None,
        }
    return {
        "program_pinned": bool(report.get("program_pinned")),
        "pinned_peak_bytes": report.get("pinned_peak_bytes"),
        "program_peak_bytes": report.get("program_peak_bytes"),
        "pin_reason": report.get("reason"),
        "pinned_step": report.get("step_name") or (pin.step_name if pin else None),
    }


def gpus_by_run(store: StateStore) -> dict[str, tuple[int, ...]]:
    """Every GPU of each stored run: its placement's in the stored plan (``gpus: N`` runs take N),
    else the GPU its record names."""
    plan = store.meta("plan")
    placed = packing.Plan.from_dict(plan).gpus_of() if plan else {}
    return {r.name: placed.get(r.name) or (r.gpu,) for r in store.experiments()}


def result_rows(store: StateStore) -> list[dict[str, Any]]:
    """The ``--json`` entries after a run: name, gpu (and every GPU, ``gpus``), mem_fraction,
    batch_size, state, attempts, times..."""
    rows = []
    gpus = gpus_by_run(store)
    for record in store.experiments():
        data = record.to_dict()
        data["gpus"] = list(gpus[record.name])
        data.update(pin_status(record))
        data["micro_batch_size"] = record.batch_size // max(1, record.grad_accum_steps)
        attempts = store.attempts(record.name)
        data["hosts"] = [a.host for a in attempts]  # where each attempt ran (None: never known)
        data["host"] = attempts[-1].host if attempts else None
        data["duration_seconds"] = (
            None
            if record.started_at is None or record.ended_at is None
            else round(record.ended_at - record.started_at, 3)
        )
        rows.append(data)
    return rows
