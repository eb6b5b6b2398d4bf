"""``jaxfit schedule`` without ``--dry-run``: plan, store, run, monitor, report (the flow the CLI calls).

- :func:`start_schedule` plans the queue (:func:`jaxfit.schedule.planner.plan_queue`), writes the state
  (:func:`jaxfit.schedule.folder.create_state`) and runs it;
- :func:`resume_schedule` opens a stored schedule, adopts what still runs, and runs the rest;
- both run the memory monitor (:mod:`jaxfit.schedule.monitor`) beside the scheduler, show a live table on a
  terminal (event lines otherwise), and end with a summary table, ``--json`` and a timeline PNG.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from jaxfit.errors import ConfigError
from jaxfit.fit.budget import format_bytes
from jaxfit.fit.common import Progress
from jaxfit.fit.devices import detect_gpus, visible_entry
from jaxfit.fit.options import FitOptions
from jaxfit.schedule import packing
from jaxfit.schedule.backends.local import Launcher, LocalLauncher
from jaxfit.schedule.folder import ScheduleLock, create_state, ensure_no_schedule, open_state
from jaxfit.schedule.planner import check_commands, load_plan, plan_queue, resolve_gpus
from jaxfit.schedule.queue_file import Queue
from jaxfit.schedule.scheduler import ExecuteOptions, Scheduler, gpus_by_run, pin_status, result_rows
from jaxfit.schedule.state import StateStore

BACKENDS = ("local", "ray")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a schedule ended.

    Attributes:
      exit_code: 0 all done, 1 some failed or timed out, 128 + signal when stopped.
      state_dir: Where its state, logs and timeline are.
      rows: The ``--json`` entries (:func:`jaxfit.schedule.scheduler.result_rows`).
      timeline: The timeline PNG, or None when it could not be drawn.
      monitor_note: Why the GPU monitor sampled host memory or nothing, if it did.
    """

    exit_code: int
    state_dir: Path
    rows: list[dict[str, Any]]
    timeline: Path | None
    monitor_note: str | None


def make_launcher(backend: str, ray_address: str | None = None, *, logical_gpus: int | None = None) -> Launcher:
    """The backend by name (``local`` or ``ray``).

    Raises:
      ConfigError: an unknown backend, or ray missing.
    """
    if backend == "local":
        return LocalLauncher()
    if backend == "ray":
        from jaxfit.schedule.backends.ray import RayLauncher

        return RayLauncher(ray_address, num_gpus=logical_gpus if ray_address is None else None)
    raise ConfigError(f"unknown backend {backend!r}; use one of: {', '.join(BACKENDS)}")


def status_table(store: StateStore, title: str = "") -> Table:
    """One row per experiment: its GPU, fraction, batch, accumulation, state, attempts, time."""
    table = Table(title=title or None, title_justify="left")
    for column, justify in (
        ("experiment", "left"),
        ("gpu", "right"),
        ("fraction", "right"),
        ("batch", "right"),
        ("accum", "right"),
        ("need", "right"),
        ("state", "left"),
        ("attempts", "right"),
        ("time", "right"),
        ("pinned", "center"),
        ("note", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    now = time.time()
    gpus = gpus_by_run(store)
    hosts = {a.name: a.host for a in store.attempts()}  # each run's latest attempt's host
    if store.meta("backend", "local") == "ray":  # where each run ran: a cluster has several nodes
        table.add_column("host", justify="left")
    colours = {"done": "green", "running": "cyan", "failed": "red", "timeout": "red", "interrupted": "yellow"}
    for r in store.experiments():
        elapsed = ""
        if r.started_at is not None:
            elapsed = f"{(r.ended_at or now) - r.started_at:.0f} s"
        colour = colours.get(r.state)
        state = f"[{colour}]{r.state}[/]" if colour else r.state
        pinned = "-"
        if r.attempts:
            status = pin_status(r)
            pinned = "yes" if status["program_pinned"] else "no"
        table.add_row(
            r.name,
            ",".join(map(str, gpus[r.name])),
            f"{r.mem_fraction:.2f}",
            str(r.batch_size),
            str(r.grad_accum_steps),
            format_bytes(r.need_bytes),
            state,
            str(r.attempts),
            elapsed,
            pinned,
            r.reason or "",
            *([hosts.get(r.name) or "-"] if store.meta("backend", "local") == "ray" else []),
        )
    return table


def _run(
    store: StateStore,
    scheduler: Scheduler,
    state_dir: Path,
    console: Console,
    *,
    quiet: bool,
    monitor_interval: float,
    timeline_path: Path | None,
) -> Outcome:
    """Run the scheduler with the monitor and the display; then draw the timeline."""
    from jaxfit.schedule.monitor import Monitor

    physical: dict[int, int | None] = {}
    for g in scheduler.plan.gpus:
        physical[g.index] = None if scheduler.logical else _physical_index(g.index)
    monitor = Monitor(store, physical, scheduler.owners, interval=monitor_interval) if monitor_interval > 0 else None
    if monitor is not None:
        monitor.start()
    live: Live | None = None
    if console.is_terminal and not quiet:
        live = Live(status_table(store), console=console, refresh_per_second=2, transient=False)

        def tick() -> None:
            assert live is not None
            live.update(status_table(store))

        scheduler.on_tick = tick
    try:
        if live is not None:
            with live:
                code = scheduler.run()
        else:
            code = scheduler.run()
    finally:
        if monitor is not None:
            monitor.stop()
        scheduler.launcher.close()
    note = None
    if monitor is not None and not monitor.available:
        note = (
            f"{monitor.reason}; sampled each run's host memory (RSS) instead" if monitor.host_gpus else monitor.reason
        )
    timeline = None
    if timeline_path is not None:
        timeline = draw(store, timeline_path)
    return Outcome(code, state_dir, result_rows(store), timeline, note)


def draw(store: StateStore, path: Path, title: str = "") -> Path:
    """Draw a stored schedule's timeline PNG (one lane per GPU: planned needs, measured memory)."""
    from jaxfit.schedule.timeline import draw_timeline

    plan = packing.Plan.from_dict(store.meta("plan"))
    gpus = [(g.index, g.total_bytes, g.capacity_bytes) for g in plan.gpus]
    return draw_timeline(
        path,
        store.experiments(),
        store.attempts(),
        store.samples(),
        gpus,
        title=title or f"jaxfit schedule {Path(store.meta('queue')['source']).stem}",
        run_gpus=plan.gpus_of(),
    )


def _physical_index(position: int) -> int:
    """The NVML index of the visible GPU at ``position`` (NVML ignores CUDA_VISIBLE_DEVICES;
    a UUID entry is taken as the position)."""
    entry = visible_entry(position)
    return int(entry) if entry.isdigit() else position


def _reporter(console: Console, quiet: bool) -> Any:
    def report(kind: str, name: str | None, text: str) -> None:
        if quiet and kind not in ("failed", "timeout", "oom", "crashed", "finished"):
            return
        stamp = time.strftime("%H:%M:%S")
        console.print(
            f"[dim]{stamp}[/] {kind:<11} " + (f"[bold]{name}[/]: " if name else "") + text,
            highlight=False,
            soft_wrap=True,
        )

    return report


def target_gpus(
    queue: Queue,
    *,
    gpus: int | None,
    device_memory_bytes: int | None,
    dry_run: bool,
    note: Callable[[str], None] = lambda _text: None,
) -> tuple[Queue, list[packing.GPU], bool]:
    """The GPUs a queue is planned on, and the queue with its per-process overhead filled in.

    On the visible GPUs (no ``--device-memory``, no more ``--gpus`` than are visible) fractions are
    of CUDA's total, which is less than nvidia-smi's (docs/guides/facts.md #4), and each process holds memory
    outside its pool (docs/guides/facts.md #5): both come from :func:`jaxfit.schedule.calibrate.calibrate` (measured
    once, then cached). Otherwise the GPUs are logical (:func:`jaxfit.schedule.planner.resolve_gpus`).

    Returns:
      ``(queue, gpus, on_device)``: ``on_device`` is False for logical GPUs (runs compute on the CPU).

    Raises:
      ConfigError: logical GPUs asked for while GPUs are visible, outside ``--dry-run``; every error
        of :func:`jaxfit.schedule.planner.resolve_gpus` and of calibration.
    """
    visible = detect_gpus()
    if visible and not dry_run and (device_memory_bytes is not None or (gpus is not None and gpus > len(visible))):
        raise ConfigError(
            f"{len(visible)} GPUs are visible, so the runs go on them at their own size; --device-memory and "
            "more --gpus than are visible only plan (add --dry-run)"
        )
    on_device = bool(visible) and device_memory_bytes is None and (gpus is None or gpus <= len(visible))
    if on_device:
        from jaxfit.schedule.calibrate import calibrate

        calibration = calibrate()
        visible = calibration.cuda_totals(visible)
        source = "the queue's"
        if queue.process_overhead_bytes is None:
            queue = dataclasses.replace(queue, process_overhead_bytes=calibration.process_overhead_bytes)
            source = "jaxfit calibrate"
        note(
            f"GPU 0: {format_bytes(calibration.cuda_total_bytes)} as CUDA reports it; per-process overhead "
            f"{format_bytes(queue.process_overhead_bytes or 0)} ({source})"
        )
    targets = resolve_gpus(queue, gpus=gpus, device_memory_bytes=device_memory_bytes, detected=visible)
    if not on_device:
        from jaxfit._probe.jaxfit_compile_server import host_memory_bytes

        planned, host = sum(g.total_bytes for g in targets), host_memory_bytes()
        if planned > host:
            note(
                f"warning: {len(targets)} logical GPUs of {format_bytes(targets[0].total_bytes)} hold "
                f"{format_bytes(planned)} in all, more than this machine's {format_bytes(host)} of RAM; on logical "
                "GPUs the runs compute on the CPU, so runs planned side by side may run out of host memory (data-"
                "loader workers add to it); plan fewer or smaller logical GPUs"
            )
    return queue, targets, on_device


def start_schedule(
    queue: Queue,
    gpus: Sequence[packing.GPU],
    *,
    logical: bool,
    state_dir: Path,
    backend: str,
    console: Console,
    options_base: FitOptions = FitOptions(),
    progress: Progress | None = None,
    probe_args: Sequence[str] = (),
    execute_options: ExecuteOptions = ExecuteOptions(),
    ray_address: str | None = None,
    quiet: bool = False,
    timeline_path: Path | None = None,
    plan_path: str | None = None,
) -> Outcome:
    """Plan ``queue`` onto ``gpus`` (or take the plan in ``plan_path``), store it in ``state_dir``, run it.

    Raises:
      ConfigError: every planning error, an existing schedule in ``state_dir``, an unknown backend.
    """
    ensure_no_schedule(state_dir)  # refuse before spending minutes on fits
    check_commands(queue)
    if backend == "ray":  # ray missing or a cluster that does not answer: say so before the fits
        from jaxfit.schedule.backends.ray import _import_ray, check_reachable

        _import_ray()
        if ray_address is not None:
            check_reachable(ray_address)
    if plan_path is not None:
        runs, plan = load_plan(plan_path, queue)
        if sorted((g.index, g.total_bytes) for g in plan.gpus) != sorted((g.index, g.total_bytes) for g in gpus):
            raise ConfigError(f"{plan_path} was planned for other GPUs than these; plan again with --dry-run --json")
    else:
        runs, plan = plan_queue(
            queue, gpus, options_base=options_base, progress=progress, probe_args=probe_args, on_device=not logical
        )
    group = execute_options.wandb_group or f"{Path(queue.source).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    options = dataclasses.replace(execute_options, wandb_group=group)
    with ScheduleLock(state_dir):
        # Again under the lock (another jaxfit may have started meanwhile); a finished one moves aside.
        archived = ensure_no_schedule(state_dir, archive=True)
        if archived is not None:
            console.print(f"the finished schedule that was in {state_dir} is now in {archived}", highlight=False)
        launcher = make_launcher(backend, ray_address, logical_gpus=len(gpus) if logical else None)
        store = create_state(state_dir, queue, runs, plan, logical=logical, backend=backend, wandb_group=group)
        if ray_address is not None:  # --resume finds the cluster (and the attempts it keeps) again
            store.set_meta("ray_address", ray_address)
        scheduler = Scheduler(
            store,
            launcher,
            state_dir,
            options,
            report=_reporter(console, quiet),
            env={e.name: e.env for e in queue.experiments},
        )
        try:
            return _run(
                store,
                scheduler,
                state_dir,
                console,
                quiet=quiet,
                monitor_interval=options.monitor_interval,
                timeline_path=timeline_path or state_dir / "timeline.png",
            )
        finally:
            store.close()


def queue_env(store: StateStore, queue: Queue | None) -> dict[str, dict[str, str]]:
    """The values of each experiment's ``env`` (the state keeps only their names) from the queue file.

    Raises:
      ConfigError: an unfinished experiment sets variables the queue file no longer gives.
    """
    given = {e.name: dict(e.env) for e in queue.experiments} if queue is not None else {}
    for record in store.experiments():
        missing = [key for key in record.env if key not in given.get(record.name, {})]
        if missing and not record.final:
            raise ConfigError(
                f"experiment {record.name!r} sets {', '.join(missing)} in its env, whose values jaxfit does not "
                f"store (they may be secrets); resume with the queue file that gives them: "
                f"jaxfit schedule QUEUE.yaml --resume"
            )
    return given


def resume_schedule(
    state_dir: Path,
    *,
    console: Console,
    execute_options: ExecuteOptions = ExecuteOptions(),
    ray_address: str | None = None,
    quiet: bool = False,
    timeline_path: Path | None = None,
    queue: Queue | None = None,
) -> Outcome:
    """Continue the schedule stored in ``state_dir``: adopt live attempts, never re-run finished ones.

    Args:
      queue: The queue file, read again for the values of the experiments' ``env``.

    Raises:
      ConfigError: no schedule there, its backend cannot be resumed, or env values are missing.
    """
    store = open_state(state_dir)
    try:
        env = queue_env(store, queue)
        with ScheduleLock(state_dir):
            backend = store.meta("backend", "local")
            logical = bool(store.meta("logical", False))
            launcher = make_launcher(
                backend,
                ray_address or store.meta("ray_address"),
                logical_gpus=len(packing.Plan.from_dict(store.meta("plan")).gpus) if logical else None,
            )
            options = dataclasses.replace(
                execute_options, wandb_group=execute_options.wandb_group or store.meta("wandb_group")
            )
            scheduler = Scheduler(store, launcher, state_dir, options, report=_reporter(console, quiet), env=env)
            scheduler.reattach()
            return _run(
                store,
                scheduler,
                state_dir,
                console,
                quiet=quiet,
                monitor_interval=options.monitor_interval,
                timeline_path=timeline_path or state_dir / "timeline.png",
            )
    finally:
        store.close()
