"""Planning a queue: each experiment's batch, accumulation and fraction (fitting what is ``auto``),
then packed onto GPUs (:mod:`jaxfit.schedule.packing`); it starts no training (``--dry-run``).

The design, at length: docs/guides/how-it-works.md, "Planning a queue: what each run gets".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from jaxfit.errors import ConfigError, DoesNotFitError, JaxfitError
from jaxfit.fit import FitOptions, fit_batch, fit_fraction
from jaxfit.fit.budget import format_bytes
from jaxfit.fit.common import Progress, extra_environment
from jaxfit.fit.devices import detect_gpus, visible_entry
from jaxfit.fit.sources import script_source
from jaxfit.run.accumulation import BATCH_FLAG, fit_accumulated, with_steps
from jaxfit.schedule import packing
from jaxfit.schedule.queue_file import Experiment, Queue

QUEUE_HINT = "raise the fraction or use fraction: auto"
NO_GPU_HINT = "pass --gpus N --device-memory SIZE to plan on N GPUs of SIZE (e.g. --gpus 1 --device-memory 80GiB)"


@dataclasses.dataclass(frozen=True)
class ScheduledRun:
    """What one experiment of a queue will run with.

    Attributes:
      name: The experiment.
      command: Its command with ``--batch-size=N`` set.
      mem_fraction: Its ``XLA_PYTHON_CLIENT_MEM_FRACTION`` on the GPU size it was measured on.
      peak_bytes: The compiled peak at that batch and fraction (None when nothing was fitted).
      batch_size: The ``--batch-size`` it runs at: samples per optimizer step (the queue's
        ``global_batch`` when given).
      grad_accum_steps: The ``--grad-accum-steps`` that splits ``batch_size`` into micro-batches
        (1: none); the compiled micro-batch is ``batch_size / grad_accum_steps``.
      fitted: Whether anything was fitted (False: batch and fraction both given).
      priority: The experiment's priority.
      pin: The proven program of its fit (:class:`jaxfit.fit.pin.Pin` as a dict), which its training
        process loads; None when nothing was fitted or it could not be stored.
    """

    name: str
    command: tuple[str, ...]
    batch_size: int
    mem_fraction: float
    peak_bytes: int | None
    grad_accum_steps: int
    fitted: bool
    priority: int = 0
    pin: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        data = dataclasses.asdict(self)
        data["command"] = list(self.command)
        return data


def floor_to_hundredths(value: float) -> float:
    """``value`` rounded down to a multiple of 0.01 (tolerant of float noise just below one)."""
    return math.floor(value * 100 + 1e-9) / 100


def equal_share(total_bytes: int, runs_per_gpu: int, reserve_bytes: int, overhead_bytes: int) -> float:
    """The fraction each of ``runs_per_gpu`` runs gets so that they all fit one GPU together.

    ``floor_to_0.01((total - reserve - n x overhead) / n / total)``.

    Raises:
      ConfigError: the share is below 0.01 (too many runs for the GPU).
    """
    n = max(1, runs_per_gpu)
    capacity = total_bytes - reserve_bytes
    share = floor_to_hundredths((capacity - n * overhead_bytes) / n / total_bytes)
    if share < 0.01:
        raise ConfigError(
            f"{n} runs per GPU leave less than 1% of {format_bytes(total_bytes)} each (reserve "
            f"{format_bytes(reserve_bytes)}, overhead {format_bytes(overhead_bytes)} per run); "
            "give the experiments fixed fractions, use more GPUs, or lower the reserve"
        )
    return min(share, 1.0)


def _notify(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress("note", {"text": text})


def _measure_one(
    experiment: Experiment, options: FitOptions, auto_share: float, probe_args: Sequence[str], progress: Progress | None
) -> tuple[ScheduledRun, packing.Need]:
    """Decide one experiment's batch, accumulation and fraction (fitting what is ``auto``) and its need.

    Without ``global_batch`` the run trains at the batch given or fitted (``micro = batch``). With
    it, the run trains at ``--batch-size=global_batch`` split into ``--grad-accum-steps`` micro-
    batches of at most the given or fitted batch; the accumulated step is compiled to prove it fits.
    """
    name, priority, headroom, global_batch = (
        experiment.name,
        experiment.priority,
        options.headroom_bytes,
        experiment.global_batch,
    )
    if global_batch is not None and experiment.batch is not None and global_batch % experiment.batch:
        raise ConfigError(
            f"global_batch {global_batch} is not a multiple of batch {experiment.batch}; "
            "make it one so every optimizer step sees the same number of samples"
        )
    steps = 1
    pin: dict[str, Any] | None = None
    if experiment.batch is not None and experiment.fraction is not None:
        batch, fraction, peak, fitted = experiment.batch, experiment.fraction, None, False
        if global_batch is not None:
            batch, steps = global_batch, global_batch // experiment.batch
        need = packing.Need(name, fraction=fraction, priority=priority, gpus=experiment.gpus)
    else:
        source = script_source(list(experiment.command), batch_flag=BATCH_FLAG, probe_args=list(probe_args))
        with extra_environment(experiment.env):
            if experiment.batch is not None and global_batch is None:
                _notify(progress, f"{name}: the smallest fraction for batch {experiment.batch}")
                result = fit_fraction(source, experiment.batch, options, progress=progress)
            elif experiment.batch is not None:
                assert global_batch is not None
                steps, result = fit_accumulated(
                    source,
                    global_batch,
                    options,
                    fraction=None,
                    micro_limit=experiment.batch,
                    progress=progress,
                    label=f"{name}: ",
                    hint=QUEUE_HINT,
                )
            else:
                fraction = experiment.fraction if experiment.fraction is not None else auto_share
                how = "given" if experiment.fraction is not None else "equal share"
                _notify(progress, f"{name}: the largest batch under fraction {fraction:.2f} ({how})")
                result = fit_batch(source, dataclasses.replace(options, mem_fraction=fraction), progress=progress)
                if global_batch is not None:
                    # Train at the global batch, accumulated over micro-batches of at most the fitted
                    # batch, compiled to prove it: even when the fitted batch is larger (then without
                    # accumulation), since the peak need not grow with the batch (an MLP on an H100
                    # fits at 2473 but not at 2253-2326).
                    steps, result = fit_accumulated(
                        source,
                        global_batch,
                        options,
                        fraction=fraction,
                        micro_limit=result.batch_size,
                        progress=progress,
                        label=f"{name}: ",
                        hint=QUEUE_HINT,
                    )
        batch, fraction, peak, fitted = result.batch_size, result.mem_fraction, result.peak_bytes, True
        pin = result.pin
        # The fit proved this fraction holds the peak (on a GPU the peak depends on the limit, so
        # a smaller fraction worked out from the peak alone is not proven): the run needs it.
        need = packing.Need(
            name, peak_bytes=peak, fraction=fraction, priority=priority, headroom_bytes=headroom, gpus=experiment.gpus
        )
    run = ScheduledRun(
        name=name,
        command=with_steps(experiment.command, batch, steps),
        batch_size=batch,
        mem_fraction=fraction,
        peak_bytes=peak,
        grad_accum_steps=steps,
        fitted=fitted,
        priority=priority,
        pin=pin,
    )
    return run, need


def _measure(
    queue: Queue,
    gpu_total_bytes: int,
    gpu_count: int,
    options_base: FitOptions,
    progress: Progress | None,
    probe_args: Sequence[str],
    on_device: bool = False,
) -> list[tuple[ScheduledRun, packing.Need]]:
    if gpu_total_bytes <= 0:
        raise ConfigError(f"GPU memory {gpu_total_bytes} must be positive")
    if gpu_count < 1:
        raise ConfigError(f"--gpus {gpu_count} must be at least 1")
    overhead = queue.process_overhead_bytes or 0
    # On the GPUs themselves the fits compile under the real limits; otherwise plan for GPUs of the size.
    options = options_base if on_device else dataclasses.replace(options_base, device_memory_bytes=gpu_total_bytes)
    share: float | None = None
    if any(e.auto_batch and e.auto_fraction for e in queue.experiments):
        runs_per_gpu = math.ceil(sum(e.gpus for e in queue.experiments) / gpu_count)
        share = equal_share(gpu_total_bytes, runs_per_gpu, queue.reserve_bytes, overhead)
    out = []
    for experiment in queue.experiments:
        env = dict(experiment.env)
        if on_device and "CUDA_VISIBLE_DEVICES" not in env:
            # The probe sees as many GPUs as the run will: its script shards over what it sees.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(visible_entry(i) for i in range(experiment.gpus))
        experiment = dataclasses.replace(experiment, env=env)
        try:
            out.append(_measure_one(experiment, options, share or 1.0, probe_args, progress))
        except DoesNotFitError as err:  # its advice in the queue's words, not the CLI's
            raise DoesNotFitError(
                f"experiment {experiment.name!r}: {err.what}",
                "give it a larger fraction in the queue (or fraction: auto), a smaller batch "
                "with global_batch, or shrink the model (remat, bf16)",
            ) from None
        except JaxfitError as err:
            raise type(err)(f"experiment {experiment.name!r}: {err}") from None
    return out


def measure_needs(
    queue: Queue,
    gpu_total_bytes: int,
    *,
    options_base: FitOptions = FitOptions(),
    progress: Progress | None = None,
    gpu_count: int = 1,
    probe_args: Sequence[str] = (),
) -> list[ScheduledRun]:
    """Decide every experiment's batch and fraction on a GPU of ``gpu_total_bytes`` (module docstring).

    Args:
      queue: The validated queue.
      gpu_total_bytes: The memory of the GPU the runs are measured for (the base of fractions).
      options_base: Fit options (headroom, batch bounds, cache...); ``device_memory_bytes`` and
        ``mem_fraction`` are set here.
      progress: Fit progress events (plus a ``note`` naming each experiment as it is measured).
      gpu_count: How many GPUs the queue shares (sets the equal share of ``auto`` runs).
      probe_args: Arguments added to every command while probing only (e.g.
        ``--checkpoint-base-dir=/tmp/probe``).

    Returns:
      One :class:`ScheduledRun` per experiment, in queue order.

    Raises:
      JaxfitError: a fit failed (the message names the experiment), or the equal share is empty.
    """
    return [run for run, _ in _measure(queue, gpu_total_bytes, gpu_count, options_base, progress, probe_args)]


def check_commands(queue: Queue) -> None:
    """Every experiment's program exists (a missing one is rejected now, not retried as a crash).

    Raises:
      ConfigError: naming the experiment and the program.
    """
    from jaxfit.fit.command import check_command

    for experiment in queue.experiments:
        try:
            check_command(list(experiment.command))
        except ConfigError as err:
            raise ConfigError(f"experiment {experiment.name!r}: {err}") from None


def plan_queue(
    queue: Queue,
    gpus: Sequence[packing.GPU],
    *,
    options_base: FitOptions = FitOptions(),
    progress: Progress | None = None,
    probe_args: Sequence[str] = (),
    on_device: bool = False,
) -> tuple[list[ScheduledRun], packing.Plan]:
    """Measure every experiment (on the smallest of ``gpus``), then pack them onto ``gpus``.

    ``on_device``: ``gpus`` are the visible GPUs (with CUDA's totals,
    :meth:`jaxfit.schedule.calibrate.Calibration.cuda_totals`), so fits compile under the device's own
    limits; otherwise they plan for GPUs of the smallest size given.

    Raises:
      ConfigError: no GPU, a run that fits no GPU even alone (one line with its need), and every
        error of :func:`measure_needs`.
    """
    if not gpus:
        raise ConfigError(f"no GPU to plan on; {NO_GPU_HINT}")
    for experiment in queue.experiments:  # before any fit: a run that cannot be placed at all
        if experiment.gpus > len(gpus):
            raise ConfigError(
                f"experiment {experiment.name!r} takes gpus: {experiment.gpus} but the plan has {len(gpus)} "
                f"GPU{'s' if len(gpus) != 1 else ''}; plan on {experiment.gpus} or more (gpus: in the queue, "
                "--gpus) or lower its gpus"
            )
    smallest = min(g.total_bytes for g in gpus)
    measured = _measure(queue, smallest, len(gpus), options_base, progress, probe_args, on_device)
    plan = packing.plan(
        [need for _, need in measured],
        gpus,
        reserve_bytes=queue.reserve_bytes,
        overhead_bytes=queue.process_overhead_bytes or 0,
    )
    return [run for run, _ in measured], plan


# -- which GPUs ---------------------------------------------------------------------------------


def resolve_gpus(
    queue: Queue,
    *,
    gpus: int | None = None,
    device_memory_bytes: int | None = None,
    detected: Sequence[packing.GPU] | None = None,
) -> list[packing.GPU]:
    """The GPUs to plan on (module docstring): CLI flags, else the queue's, else the visible GPUs.

    Args:
      gpus: ``--gpus N`` (None: the queue's ``gpus:`` selection).
      device_memory_bytes: ``--device-memory`` (None: the queue's ``device_memory``, else each
        GPU's own total).
      detected: The visible GPUs (None: :func:`detect_gpus`).

    Raises:
      ConfigError: no GPU and no size to plan with, or more GPUs asked for than are visible.
    """
    if gpus is not None and gpus < 1:
        raise ConfigError(f"--gpus {gpus} must be at least 1")
    size = device_memory_bytes if device_memory_bytes is not None else queue.device_memory_bytes
    if size is not None and size <= queue.reserve_bytes:
        raise ConfigError(
            f"device memory {format_bytes(size)} is not more than the queue's reserve "
            f"{format_bytes(queue.reserve_bytes)}; plan on larger GPUs or lower the reserve"
        )
    if gpus is not None and size is not None:
        return [packing.GPU(i, size) for i in range(gpus)]
    visible = list(detect_gpus() if detected is None else detected)
    if not visible:
        if size is None:
            raise ConfigError(f"{queue.source}: no GPU is visible and no device memory is set; {NO_GPU_HINT}")
        return [packing.GPU(i, size) for i in queue.select_gpus(0)]
    if gpus is not None:
        if gpus > len(visible):
            raise ConfigError(
                f"--gpus {gpus} asks for {gpus} GPUs but {len(visible)} are visible; use --gpus "
                f"{len(visible)} or fewer, or add --device-memory SIZE to plan on logical GPUs"
            )
        indices: Sequence[int] = range(gpus)
    else:
        indices = queue.select_gpus(len(visible))
    return [packing.GPU(i, size if size is not None else visible[i].total_bytes) for i in indices]


# -- showing a plan -----------------------------------------------------------------------------


def schedule_dict(runs: Sequence[ScheduledRun], plan: packing.Plan) -> dict[str, Any]:
    """The ``--json`` object: ``{"runs": [...], "plan": plan.to_dict()}``."""
    return {"runs": [run.to_dict() for run in runs], "plan": plan.to_dict()}


def load_plan(path: str, queue: Queue) -> tuple[list[ScheduledRun], packing.Plan]:
    """Read a plan that ``--dry-run --json PATH`` wrote, to run it without fitting again.

    Raises:
      ConfigError: the file is not such a plan, or it does not hold the queue's experiments.
    """
    import json

    try:
        with open(path) as f:
            data = json.load(f)
        runs = [ScheduledRun(**{**r, "command": tuple(r["command"])}) for r in data["runs"]]
        plan = packing.Plan.from_dict(data["plan"])
        placements = plan.placements
    except OSError as e:
        raise ConfigError(f"cannot read plan file {path!r}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path} is not a plan written by `jaxfit schedule --dry-run --json` ({e})") from None
    planned, queued = sorted(r.name for r in runs), sorted(e.name for e in queue.experiments)
    if planned != queued or sorted(p.name for p in placements) != queued:
        raise ConfigError(
            f"{path} plans {', '.join(planned)} but {queue.source} has {', '.join(queued)}; "
            "plan this queue again with --dry-run --json"
        )
    return runs, plan


def schedule_table(runs: Sequence[ScheduledRun], plan: packing.Plan) -> Any:
    """The plan as a rich table, one row per run in start order."""
    from rich.table import Table

    by_name = {run.name: run for run in runs}
    table = Table(
        title=f"schedule: {len(runs)} runs on {len(plan.gpus)} GPUs in {plan.waves} waves", title_justify="left"
    )
    for column, justify in (
        ("name", "left"),
        ("gpu", "right"),
        ("fraction", "right"),
        ("batch", "right"),
        ("accum", "right"),
        ("peak", "right"),
        ("need", "right"),
        ("start", "right"),
        ("wave", "right"),
        ("after", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for p in plan.placements:
        run = by_name[p.name]
        table.add_row(
            p.name,
            ",".join(map(str, p.gpus)),
            f"{p.mem_fraction:.2f}",
            f"{run.batch_size}" + ("" if run.fitted else " (given)"),
            str(run.grad_accum_steps),
            format_bytes(p.peak_bytes),
            format_bytes(p.need_bytes),
            str(p.start),
            str(p.wave),
            "now" if p.immediate else ", ".join(p.after),
        )
    return table


def gpu_lines(plan: packing.Plan) -> list[str]:
    """One line per GPU: the most the plan has live on it against its capacity."""
    lines = []
    for g in plan.gpus:
        reserve = g.total_bytes - g.capacity_bytes
        lines.append(
            f"GPU {g.index}: {format_bytes(g.planned_bytes)} live at most of {format_bytes(g.capacity_bytes)} "
            f"capacity ({format_bytes(g.total_bytes)}"
            + (f" less a {format_bytes(reserve)} reserve" if reserve else "")
            + f"); {len(g.runs)} runs"
            + (f": {', '.join(g.runs)}" if g.runs else "")
        )
    if plan.overhead_bytes:
        lines.append(f"each run's need includes {format_bytes(plan.overhead_bytes)} per-process overhead")
    return lines
