"""``jaxfit schedule`` (a queue of runs packed onto GPUs) and ``jaxfit calibrate`` (what each
process holds outside its pool)."""

from __future__ import annotations

import sqlite3
from typing import Annotated, Any, Literal

import tyro
from rich.console import Console

from jaxfit.cli.app import COMMAND, app, consoles, no_command, parsed
from jaxfit.errors import JaxfitError
from jaxfit.fit import budget as budget_mod
from jaxfit.fit.options import DEFAULT_MAX_BATCH, Size
from jaxfit.schedule.backends.local import DEFAULT_GRACE_SECONDS


@app.command(name="schedule")
def schedule_command(
    queue: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="QUEUE.yaml")],
    dry_run: bool = False,
    resume: bool = False,
    state_dir: str | None = None,
    backend: Literal["local", "ray"] = "local",
    ray_address: str | None = None,
    gpus: int | None = None,
    device_memory: Size | None = None,
    json: str | None = None,
    timeline: str | None = None,
    quiet: bool = False,
    max_batch: int = DEFAULT_MAX_BATCH,
    grace: float = DEFAULT_GRACE_SECONDS,
    monitor_interval: float = 2.0,
    wandb_group: str | None = None,
    plan: str | None = None,
    plan_on_cluster: bool = False,
    probe_args: Annotated[tuple[str, ...], tyro.conf.arg(name="probe-arg"), tyro.conf.UseAppendAction] = (),
) -> int:
    """Run a queue of training runs side by side on GPUs, each with the batch and fraction its measured need gives.

    Usage: `jaxfit schedule configs/queue-debug.yaml` (add --dry-run to only print the plan; `jaxfit examples --copy DIR` writes that queue and the script it runs into DIR). Each
    experiment's command is probed in the current directory (its train step is compiled, never run)
    to fit what its queue entry leaves `auto`; runs with both batch and fraction given are not
    probed. Runs with both `auto` get an equal share of a GPU. The runs are packed onto the GPUs
    and started as memory frees; out-of-memory runs are retried with more
    gradient accumulation (same global batch), crashes up to their `retries`, hangs stopped at their
    `timeout`. State, logs and a timeline PNG go to --state-dir (default jaxfit-runs/<queue name>);
    after Ctrl-C, SIGTERM or even SIGKILL of jaxfit, `--resume` continues without re-running
    finished runs. Exit code: 0 all done, 1 some failed, 130/143 when stopped.

    Args:
        queue: The queue file (YAML: `gpus`, `reserve`, `device_memory` and `experiments`, each with a `name`, a `command` and optional `batch`, `fraction`, `global_batch`, `priority`, `retries`, `timeout` and `env`; `jaxfit examples --copy DIR` writes two examples).
        dry_run: Print the plan and stop.
        resume: Continue the schedule stored in --state-dir (its plan is kept; the queue file gives only its env values again).
        state_dir: Where the state (SQLite), logs and timeline go (default: jaxfit-runs/<queue file stem>).
        backend: local (child processes here) or ray (one Ray task per run, num_gpus = its share of a GPU).
        ray_address: The Ray cluster (e.g. auto, or host:6379); default: a local Ray started for this schedule. A run Ray places on another node takes its files along (pin, settings, start-up hook) and brings its log and status back when it ends; its variables come from the queue's env, and it is not started on a GPU of another size than planned (exit 78).
        gpus: Plan on this many GPUs (with --device-memory: logical GPUs; runs then compute on the CPU).
        device_memory: The memory of each logical GPU, e.g. 80GiB (overrides the queue's device_memory; with GPUs visible, only for --dry-run).
        json: Write the plan (--dry-run) or each run's outcome (name, gpu, mem_fraction, batch_size, state, attempts, started_at, ended_at...) to this file.
        timeline: Where the timeline PNG goes (default: <state dir>/timeline.png).
        quiet: No fit progress, no live table; only failures and the summary.
        max_batch: Largest batch size to consider when fitting a batch.
        grace: Seconds between SIGTERM and SIGKILL when a run is stopped.
        monitor_interval: Seconds between memory samples of the live runs (0: no monitor).
        wandb_group: The WandB group of all runs (default: <queue name>-<start time>).
        plan: Run the plan that `--dry-run --json PATH` wrote for this queue and these GPUs, without fitting again.
        plan_on_cluster: With --backend ray --ray-address: plan on a node of the cluster with GPUs (one Ray task runs the dry run there and brings the plan and its proven programs back), for a scheduling machine without the cluster's GPUs (a KubeRay head). The node needs jaxfit and the commands' programs.
        probe_args: An argument added to every command only while probing; repeatable (e.g. --probe-arg=--checkpoint-base-dir=/tmp/jaxfit-probe).
    """
    parsed()
    from pathlib import Path

    from jaxfit.files import check_writable
    from jaxfit.fit.options import FitOptions
    from jaxfit.schedule.flow import target_gpus
    from jaxfit.schedule.folder import check_state_dir, default_state_dir
    from jaxfit.schedule.planner import plan_queue
    from jaxfit.schedule.queue_file import load_queue
    from jaxfit.schedule.scheduler import ExecuteOptions

    if COMMAND:
        raise JaxfitError("jaxfit schedule takes no command after --; the commands are in the queue file")
    if dry_run and resume:
        raise JaxfitError("--dry-run and --resume exclude each other; --dry-run plans a new schedule")
    if plan and (dry_run or resume):
        raise JaxfitError("--plan runs a stored plan; it goes with neither --dry-run nor --resume")
    if plan_on_cluster and (backend != "ray" or not ray_address):
        raise JaxfitError("--plan-on-cluster plans on a node of a Ray cluster; add --backend ray --ray-address ADDRESS")
    if plan_on_cluster and (plan or resume):
        raise JaxfitError("--plan-on-cluster makes a new plan; it goes with neither --plan nor --resume")
    for value, flag in ((grace, "--grace"), (monitor_interval, "--monitor-interval")):
        if not value >= 0:
            raise JaxfitError(f"{flag} {value} must be >= 0 seconds")
    if json:
        check_writable(json)
    if timeline:
        check_writable(timeline, "--timeline")
    folder = (Path(state_dir) if state_dir else default_state_dir(queue)).resolve()
    if not dry_run:
        check_state_dir(folder)
    out, progress = consoles(quiet)
    execute_options = ExecuteOptions(grace_seconds=grace, monitor_interval=monitor_interval, wandb_group=wandb_group)
    if resume:
        from jaxfit.schedule.flow import resume_schedule

        outcome = resume_schedule(
            folder,
            console=out,
            execute_options=execute_options,
            ray_address=ray_address,
            quiet=quiet,
            timeline_path=Path(timeline) if timeline else None,
            queue=load_queue(queue) if Path(queue).exists() else None,
        )
        return _schedule_outcome(out, outcome, json)
    loaded = load_queue(queue)
    size = device_memory
    start: dict[str, Any] = dict(  # how start_schedule runs the plan, wherever it was made
        state_dir=folder,
        backend=backend,
        console=out,
        options_base=FitOptions(max_batch=max_batch),
        progress=progress,
        probe_args=list(probe_args),
        execute_options=execute_options,
        ray_address=ray_address,
        quiet=quiet,
        timeline_path=Path(timeline) if timeline else None,
    )
    if plan_on_cluster:
        return _plan_on_cluster_and_run(
            loaded,
            ray_address or "",
            arguments=[
                f"--max-batch={max_batch}",
                *[f"--probe-arg={a}" for a in probe_args],
                *(["--gpus", str(gpus)] if gpus is not None else []),
                *(["--device-memory", str(size)] if size is not None else []),
            ],
            logical=size is not None,
            dry_run=dry_run,
            json_path=json,
            out=out,
            start=start,
        )
    loaded, targets, on_device = target_gpus(
        loaded, gpus=gpus, device_memory_bytes=size, dry_run=dry_run, note=lambda text: out.print(text, highlight=False)
    )
    if dry_run:
        from jaxfit.schedule.planner import check_commands

        check_commands(loaded)  # as the real run does: a program that does not exist is refused now
        runs, planned = plan_queue(
            loaded,
            targets,
            options_base=FitOptions(max_batch=max_batch),
            progress=progress,
            probe_args=list(probe_args),
            on_device=on_device,
        )
        return _print_plan(out, runs, planned, json)
    return _run_schedule(out, loaded, targets, logical=not on_device, plan_path=plan, json_path=json, start=start)


def _print_plan(out: Console, runs: Any, planned: Any, json_path: str | None) -> int:
    """``--dry-run``'s output: the plan's table and GPU lines, and its JSON to ``json_path``."""
    from jaxfit.files import write_json
    from jaxfit.schedule.planner import gpu_lines, schedule_dict, schedule_table

    if json_path:
        write_json(json_path, schedule_dict(runs, planned))
    out.print(schedule_table(runs, planned))
    for line in gpu_lines(planned):
        out.print(line, highlight=False)
    return 0


def _run_schedule(
    out: Console,
    queue: Any,
    targets: Any,
    *,
    logical: bool,
    plan_path: str | None,
    json_path: str | None,
    start: dict[str, Any],
) -> int:
    """Run a schedule (:func:`jaxfit.schedule.flow.start_schedule`) and print its outcome; a state
    folder that cannot be written is one line."""
    from jaxfit.schedule.flow import start_schedule

    try:
        outcome = start_schedule(queue, targets, logical=logical, plan_path=plan_path, **start)
    except (sqlite3.Error, OSError) as e:  # the state folder cannot be written (a full disk)
        raise JaxfitError(
            f"cannot write the schedule state in {start['state_dir']} ({getattr(e, 'strerror', None) or e}; is its "
            "disk full?); free space, then rerun with --resume"
        ) from None
    return _schedule_outcome(out, outcome, json_path)


@app.command(name="calibrate")
def calibrate_command(json: str | None = None, cache: bool = True) -> int:
    """Measure the GPU memory each JAX process holds outside its XLA pool (CUDA context, libraries).

    `jaxfit schedule` adds it to every run's need when the queue does not set process_overhead
    (618 MiB on an H200 and on an H100). Measured once per GPU model and jax version, then cached.

    Args:
        json: Also write the measurement to this file.
        cache: Use the measurement cached for this GPU model and jax version; --no-cache measures again.
    """
    parsed()
    from jaxfit.files import check_writable, write_json
    from jaxfit.schedule.calibrate import calibrate

    no_command("calibrate")
    if json:
        check_writable(json)
    result = calibrate(use_cache=cache)
    if json:
        write_json(json, result.to_dict())
    used = (
        f", process {budget_mod.format_bytes(result.process_used_bytes)} - pool "
        f"{budget_mod.format_bytes(result.pool_bytes)}"
        if result.process_used_bytes is not None
        else ""
    )
    print(
        f"per-process overhead: {budget_mod.format_bytes(result.process_overhead_bytes)} "
        f"({result.process_overhead_bytes} B{used}; {'cached' if result.cached else 'measured'}, jax "
        f"{result.jax_version})"
    )
    return 0


def _plan_on_cluster_and_run(
    queue: Any,
    ray_address: str,
    *,
    arguments: list[str],
    logical: bool,
    dry_run: bool,
    json_path: str | None,
    out: Console,
    start: dict[str, Any],
) -> int:
    """``--plan-on-cluster``: the plan made on a node of the cluster, printed (``--dry-run``) or run."""
    import os
    import shutil

    from jaxfit.schedule.cluster_plan import plan_on_cluster
    from jaxfit.schedule.planner import load_plan

    plan_path, targets = plan_on_cluster(
        queue, ray_address, arguments=arguments, note=lambda text: out.print(text, highlight=False)
    )
    if dry_run:
        return _print_plan(out, *load_plan(plan_path, queue), json_path)
    try:
        return _run_schedule(
            out, queue, targets, logical=logical, plan_path=plan_path, json_path=json_path, start=start
        )
    finally:  # the state folder keeps its own copies of the pins
        shutil.rmtree(os.path.dirname(plan_path), ignore_errors=True)


def _schedule_outcome(out: Console, outcome: Any, json_path: str | None) -> int:
    """Print the summary of a finished (or stopped) schedule; write its --json."""
    from jaxfit.files import write_json
    from jaxfit.schedule.flow import status_table
    from jaxfit.schedule.folder import STATE_FILE
    from jaxfit.schedule.state import StateStore

    if json_path:
        write_json(
            json_path,
            {
                "state_dir": str(outcome.state_dir),
                "exit_code": outcome.exit_code,
                "experiments": outcome.rows,
                "timeline": str(outcome.timeline) if outcome.timeline else None,
            },
        )
    store = StateStore(outcome.state_dir / STATE_FILE)
    try:
        out.print(status_table(store, title=f"schedule {outcome.state_dir}"))
    finally:
        store.close()
    if outcome.monitor_note:
        out.print(f"memory monitor: {outcome.monitor_note}", highlight=False)
    if outcome.timeline:
        out.print(f"timeline: {outcome.timeline}", highlight=False)
    if outcome.exit_code >= 128:
        out.print(
            f"stopped; continue with: jaxfit schedule <queue> --resume --state-dir {outcome.state_dir}", highlight=False
        )
    return int(outcome.exit_code)
