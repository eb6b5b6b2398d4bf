"""The ``jaxfit`` command line: a thin tyro layer over the Python API."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING, Annotated, Any, Literal

import tyro
from rich.console import Console

from jaxfit.fit import budget as budget_mod
from jaxfit.errors import JaxfitError

if TYPE_CHECKING:  # the CLI imports the fit machinery only when a command runs
    from jaxfit.fit.options import FitOptions
    from jaxfit.cli.output import ProgressPrinter

app = tyro.extras.SubcommandApp()

# The training command after ``--`` (tyro never sees it): ``jaxfit run -- python train.py ...``.
_COMMAND: list[str] = []

WandbMode = Literal["online", "offline", "disabled"]


@dataclasses.dataclass(frozen=True)
class SearchArgs:
    """How to fit."""

    mem_fraction: float | None = None
    """The XLA_PYTHON_CLIENT_MEM_FRACTION to fit under, in (0, 1]; default $XLA_PYTHON_CLIENT_MEM_FRACTION or 0.45."""
    headroom: str = "0"
    """Memory to keep free inside the budget, e.g. 2GiB."""
    device_memory: str | None = None
    """Plan for a device of this size, e.g. 96GiB (GPU: compiled under the equivalent limit; CPU: replaces the host RAM)."""
    min_batch: int = 1
    """Smallest batch size to consider."""
    max_batch: int = 65536
    """Largest batch size to consider."""
    multiple_of: int = 1
    """Only consider multiples of this (e.g. the number of devices)."""
    width: int | None = None
    """Concurrent compiles per search round (default 4 on a GPU, up to 4 CPU cores otherwise)."""
    cache: bool = True
    """Use the answer and compile cache (~/.cache/jaxfit or $JAXFIT_CACHE_DIR); --no-cache compiles afresh."""
    verify: bool = True
    """On a GPU, prove the answer with autotuned compiles (the step as it will run) after searching with untuned ones; --no-verify: the untuned answer (faster, approximate)."""

    def options(self, start_timeout: float = 900.0) -> FitOptions:
        """The fit options these flags describe (validated)."""
        from jaxfit.fit.options import FitOptions

        options = FitOptions(
            mem_fraction=self.mem_fraction,
            headroom_bytes=budget_mod.parse_size(self.headroom) if self.headroom not in ("0", "") else 0,
            device_memory_bytes=budget_mod.parse_size(self.device_memory) if self.device_memory else None,
            min_batch=self.min_batch, max_batch=self.max_batch, multiple_of=self.multiple_of, width=self.width,
            use_cache=self.cache, verify=self.verify, start_timeout=start_timeout,
        )
        return options.validate()


@dataclasses.dataclass(frozen=True)
class ScriptArgs:
    """How to find the train step inside a training script."""

    step_name: str | None = None
    """The name of the jitted train step function (found through functools.partial). Default: train_step, or, when the script calls none, the first jitted function that looks like a train step (it donates an argument and takes a batch, or is called a second time with one); the output says which it took."""
    batch_flag: str = "--batch-size"
    """The script's batch-size flag, e.g. --batch-flag=--bs or --batch-flag --config.batch_size."""
    accum_flag: str = "--grad-accum-steps"
    """The script's gradient-accumulation flag (used by --global-batch)."""
    batch_arg: int | None = None
    """Which positional argument of the step is the batch (default: found by shape)."""
    probe_timeout: float = 900.0
    """Seconds to wait for the script to reach its first call of the step."""
    probe_args: Annotated[tuple[str, ...], tyro.conf.arg(name="probe-arg"), tyro.conf.UseAppendAction] = ()
    """An argument added to the command only while probing; repeatable. The probe runs the script's start-up, which may create its checkpoint folder (openpi's does): e.g. --probe-arg=--checkpoint-base-dir=/tmp/jaxfit-probe keeps that out of the real run's way."""

    def source(self) -> dict[str, object]:
        from jaxfit.fit.sources import script_source

        return script_source(_COMMAND, step_name=self.step_name, batch_flag=self.batch_flag,
                             batch_arg=self.batch_arg, probe_args=list(self.probe_args), accum_flag=self.accum_flag)


def _overrides(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise JaxfitError(f"--set {pair!r} must look like KEY=VALUE, e.g. --set n_layers=6")
        out[key.strip()] = value.strip()
    return out


def _consoles(quiet: bool) -> tuple[Console, ProgressPrinter | None]:
    from jaxfit.cli.output import ProgressPrinter

    out = Console() if sys.stdout.isatty() else Console(width=160)
    return out, (None if quiet else ProgressPrinter(Console(stderr=True)))


Flat = tyro.conf.OmitArgPrefixes


@app.command(name="fit")
def fit_command(
    search: Annotated[SearchArgs, Flat] = SearchArgs(),
    probe: Annotated[ScriptArgs, Flat] = ScriptArgs(),
    example: str | None = None,
    overrides: Annotated[tuple[str, ...], tyro.conf.arg(name="set"), tyro.conf.UseAppendAction] = (),
    entry: str | None = None,
    script: bool = False,
    batch_size: int | None = None,
    json: str | None = None,
    quiet: bool = False,
    wandb: bool = False,
    wandb_mode: WandbMode | None = None,
    wandb_project: str = "jaxfit",
) -> None:
    """Find the largest batch that fits a memory fraction (or, with --batch-size, the smallest fraction a batch needs) by compiling the train step, never running it.

    Compiles run in a child process started with XLA_PYTHON_CLIENT_MEM_FRACTION set to the target
    (XLA's peak depends on the limit it sees) and preallocation off, so jobs already on the GPU are
    not disturbed. With no arguments: the built-in gpt-tiny example at fraction 0.45 (or
    $XLA_PYTHON_CLIENT_MEM_FRACTION).

    Args:
        search: How to fit.
        probe: With --script: how to find the train step.
        example: Built-in example to fit (see `jaxfit examples`); default gpt-tiny.
        overrides: Override a config key of the example, KEY=VALUE; repeatable (--set n_layers=6 --set dtype=bfloat16).
        entry: Your own workload: package.module:function returning a jaxfit.Workload (imported from the current directory).
        script: Fit the train step inside an unmodified training script given after --, e.g. `jaxfit fit --script -- python scripts/train.py debug --exp-name=x`. The script runs (in its own environment, under the target fraction) up to its first call of the jitted step, which is compiled instead of run; then it is stopped.
        batch_size: Inverse question: the smallest fraction (to 0.01) that this batch needs.
        json: Also write the result as JSON to this file.
        quiet: Print only the answer line.
        wandb: Log the fit as its own Weights & Biases run (settings in its config, candidates as a table).
        wandb_mode: online, offline or disabled; default $WANDB_MODE, else online with credentials and offline without.
        wandb_project: The W&B project of --wandb.
    """
    _parsed()
    from jaxfit.fit import fit_batch, fit_fraction
    from jaxfit.cli.output import print_result
    from jaxfit.files import check_writable, write_json
    from jaxfit.fit.sources import ScriptSource, entry_source, example_source

    if sum(bool(x) for x in (example, entry, script)) > 1:
        raise JaxfitError("give one of --example, --entry or --script")
    if _COMMAND and not script:
        raise JaxfitError("a command after -- needs --script (or use `jaxfit run`)")
    if entry and overrides:
        raise JaxfitError("--set applies to built-in examples only; configure an --entry in its own code")
    if json:
        check_writable(json)
    if script:
        source = probe.source()
    elif entry:
        source = entry_source(entry)
    else:
        from jaxfit.examples import DEFAULT_EXAMPLE

        source = example_source(example or DEFAULT_EXAMPLE, _overrides(overrides))
    options = search.options(probe.probe_timeout)
    if batch_size is None:
        options.grid()
    out, progress = _consoles(quiet)
    if batch_size is None:
        result = fit_batch(source, options, progress=progress)
    else:
        result = fit_fraction(source, batch_size, options, progress=progress)
    if json:
        write_json(json, result.to_dict())
    command = list(source.run_command) if isinstance(source, ScriptSource) else None
    batch_flag = source.batch_flag if isinstance(source, ScriptSource) else "--batch-size"
    if quiet:
        out.print(result.message, highlight=False)
    else:
        print_result(result, out, command, batch_flag)
    if wandb:
        from jaxfit.run.tracking import log_fit

        where = log_fit(result, mode=wandb_mode, project=wandb_project)
        Console(stderr=True).print(f"[dim]logged to Weights & Biases: {where}[/]")


@app.command(name="run")
def run_command(
    search: Annotated[SearchArgs, Flat] = SearchArgs(),
    probe: Annotated[ScriptArgs, Flat] = ScriptArgs(),
    batch_size: int | None = None,
    global_batch: int | None = None,
    wandb_mode: WandbMode | None = None,
    dry_run: bool = False,
    json: str | None = None,
    quiet: bool = False,
) -> int:
    """Fit, then run a training command with the chosen XLA_PYTHON_CLIENT_MEM_FRACTION and batch size, and log them to its own W&B run.

    Usage: `jaxfit run --mem-fraction 0.45 -- uv run scripts/train.py pi0_config --exp-name=v1 --overwrite`.
    The command's train step is fitted by probing (see `jaxfit fit --script`), then the command is
    run with the fraction in its environment and the batch flag set (replaced or added); its output
    streams through, Ctrl-C and SIGTERM are forwarded, and its exit code is jaxfit's. The chosen
    settings reach the script's own wandb run as config key `jaxfit`, without editing the script.
    With --batch-size B and --mem-fraction F nothing is fitted; with --batch-size alone, the
    smallest fraction for B is fitted.

    Args:
        search: How to fit.
        probe: How to find the train step.
        batch_size: Run at this batch instead of the largest that fits.
        global_batch: Keep this many samples per optimizer step: the batch flag gets this value and --grad-accum-steps splits it into micro-batches of at most --batch-size (or the largest that fits), fewest steps first; the accumulated step is compiled to prove it fits (the script must take --grad-accum-steps, as openpi-style scripts and scripts/train.py do).
        wandb_mode: Set WANDB_MODE for the command: online, offline or disabled (default: leave it as it is).
        dry_run: Print the command and environment that would run, and stop.
        json: Write the plan (command, settings, and the fit when there was one) to this file before the command starts.
        quiet: No fit progress.
    """
    _parsed()
    from jaxfit.run.launch import execute, plan_run
    from jaxfit.files import check_writable, write_json

    if json:
        check_writable(json)
    out, progress = _consoles(quiet)
    plan = plan_run(probe.source(), search.options(probe.probe_timeout), batch_size=batch_size,
                    fraction_given=search.mem_fraction is not None, global_batch=global_batch, progress=progress)
    err = Console(stderr=True)
    err.print(f"[bold]jaxfit run:[/] {plan.summary()}", highlight=False)
    if json:
        write_json(json, plan.to_dict())
    if dry_run:
        out.print(plan.describe(), highlight=False, soft_wrap=True)
        return 0
    outcome = execute(plan, wandb_mode=wandb_mode)
    err.print(f"[bold]jaxfit run:[/] exit code {outcome.exit_code}; {outcome.summary()}", highlight=False)
    if json:
        write_json(json, dict(plan.to_dict(), run=outcome.to_dict(), program_pinned=outcome.program_pinned,
                              pinned_peak_bytes=outcome.pinned_peak_bytes))
    return outcome.exit_code


@app.command(name="examples")
def examples_command() -> None:
    """List the built-in example workloads and what they are."""
    _parsed()
    from rich.table import Table

    from jaxfit.examples import DEFAULT_EXAMPLE, example_description, list_examples, load_config

    table = Table(title="built-in examples (configs/*.yaml)", title_justify="left")
    table.add_column("name")
    table.add_column("family")
    table.add_column("description")
    for name in list_examples():
        family = load_config(name).family
        table.add_row(name + (" (default)" if name == DEFAULT_EXAMPLE else ""), family, example_description(name))
    Console().print(table)


@app.command(name="schedule")
def schedule_command(
    queue: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="QUEUE.yaml")],
    dry_run: bool = False,
    resume: bool = False,
    state_dir: str | None = None,
    backend: Literal["local", "ray"] = "local",
    ray_address: str | None = None,
    gpus: int | None = None,
    device_memory: str | None = None,
    json: str | None = None,
    timeline: str | None = None,
    quiet: bool = False,
    max_batch: int = 65536,
    grace: float = 10.0,
    monitor_interval: float = 2.0,
    wandb_group: str | None = None,
    plan: str | None = None,
    probe_args: Annotated[tuple[str, ...], tyro.conf.arg(name="probe-arg"), tyro.conf.UseAppendAction] = (),
) -> int:
    """Run a queue of training runs side by side on GPUs, each with the batch and fraction its measured need gives.

    Usage: `jaxfit schedule configs/queue-debug.yaml` (add --dry-run to only print the plan). Each
    experiment's command is probed in the current directory (its train step is compiled, never run)
    to fit what its queue entry leaves `auto`; runs with both batch and fraction given are not
    probed. Runs with both `auto` get an equal share of a GPU. The runs are packed onto the GPUs
    (jaxfit/packing.py) and started as memory frees; out-of-memory runs are retried with more
    gradient accumulation (same global batch), crashes up to their `retries`, hangs stopped at their
    `timeout`. State, logs and a timeline PNG go to --state-dir (default jaxfit-runs/<queue name>);
    after Ctrl-C, SIGTERM or even SIGKILL of jaxfit, `--resume` continues without re-running
    finished runs. Exit code: 0 all done, 1 some failed, 130/143 when stopped.

    Args:
        queue: The queue file (YAML; see jaxfit/queue.py and configs/queue-debug.yaml).
        dry_run: Print the plan and stop.
        resume: Continue the schedule stored in --state-dir (the queue file is not re-read).
        state_dir: Where the state (SQLite), logs and timeline go (default: jaxfit-runs/<queue file stem>).
        backend: local (child processes here) or ray (one Ray task per run, num_gpus = its share of a GPU).
        ray_address: The Ray cluster (e.g. auto); default: a local Ray started for this schedule.
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
        probe_args: An argument added to every command only while probing; repeatable (e.g. --probe-arg=--checkpoint-base-dir=/tmp/jaxfit-probe).
    """
    _parsed()
    from pathlib import Path

    from jaxfit.schedule.folder import check_state_dir, default_state_dir
    from jaxfit.schedule.scheduler import ExecuteOptions
    from jaxfit.fit.options import FitOptions
    from jaxfit.schedule.queue_file import load_queue
    from jaxfit.files import check_writable, write_json
    from jaxfit.schedule.planner import gpu_lines, plan_queue, schedule_dict, schedule_table
    from jaxfit.schedule.flow import target_gpus

    if _COMMAND:
        raise JaxfitError("jaxfit schedule takes no command after --; the commands are in the queue file")
    if dry_run and resume:
        raise JaxfitError("--dry-run and --resume exclude each other; --dry-run plans a new schedule")
    if plan and (dry_run or resume):
        raise JaxfitError("--plan runs a stored plan; it goes with neither --dry-run nor --resume")
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
    out, progress = _consoles(quiet)
    execute_options = ExecuteOptions(grace_seconds=grace, monitor_interval=monitor_interval, wandb_group=wandb_group)
    if resume:
        from jaxfit.schedule.flow import resume_schedule

        outcome = resume_schedule(folder, console=out, execute_options=execute_options, ray_address=ray_address,
                                  quiet=quiet, timeline_path=Path(timeline) if timeline else None,
                                  queue=load_queue(queue) if Path(queue).exists() else None)
        return _schedule_outcome(out, outcome, json)
    parsed = load_queue(queue)
    size = budget_mod.parse_size(device_memory) if device_memory else None
    parsed, targets, on_device = target_gpus(parsed, gpus=gpus, device_memory_bytes=size, dry_run=dry_run,
                                             note=lambda text: out.print(text, highlight=False))
    if dry_run:
        runs, planned = plan_queue(parsed, targets, options_base=FitOptions(max_batch=max_batch), progress=progress,
                                   probe_args=list(probe_args), on_device=on_device)
        if json:
            write_json(json, schedule_dict(runs, planned))
        out.print(schedule_table(runs, planned))
        for line in gpu_lines(planned):
            out.print(line, highlight=False)
        return 0
    from jaxfit.schedule.flow import start_schedule

    outcome = start_schedule(
        parsed, targets, logical=not on_device, state_dir=folder, backend=backend, console=out,
        options_base=FitOptions(max_batch=max_batch), progress=progress, probe_args=list(probe_args),
        execute_options=execute_options, ray_address=ray_address, quiet=quiet,
        timeline_path=Path(timeline) if timeline else None, plan_path=plan,
    )
    return _schedule_outcome(out, outcome, json)


@app.command(name="calibrate")
def calibrate_command(json: str | None = None, cache: bool = True) -> int:
    """Measure the GPU memory each JAX process holds outside its XLA pool (CUDA context, libraries).

    `jaxfit schedule` adds it to every run's need when the queue does not set process_overhead
    (FACTS.md #5: 618 MiB on an H200). Measured once per GPU model and jax version, then cached.

    Args:
        json: Also write the measurement to this file.
        cache: Use the measurement cached for this GPU model and jax version; --no-cache measures again.
    """
    _parsed()
    from jaxfit.schedule.calibrate import calibrate
    from jaxfit.files import check_writable, write_json

    if _COMMAND:
        raise JaxfitError("jaxfit calibrate takes no command after --")
    if json:
        check_writable(json)
    result = calibrate(use_cache=cache)
    if json:
        write_json(json, result.to_dict())
    used = f", process {budget_mod.format_bytes(result.process_used_bytes)} - pool " \
        f"{budget_mod.format_bytes(result.pool_bytes)}" if result.process_used_bytes is not None else ""
    print(f"per-process overhead: {budget_mod.format_bytes(result.process_overhead_bytes)} "
          f"({result.process_overhead_bytes} B{used}; {'cached' if result.cached else 'measured'}, jax "
          f"{result.jax_version})")
    return 0


def _schedule_outcome(out: Console, outcome: Any, json_path: str | None) -> int:
    """Print the summary of a finished (or stopped) schedule; write its --json."""
    from jaxfit.files import write_json
    from jaxfit.schedule.state import StateStore
    from jaxfit.schedule.flow import status_table

    if json_path:
        write_json(json_path, {"state_dir": str(outcome.state_dir), "exit_code": outcome.exit_code,
                               "experiments": outcome.rows,
                               "timeline": str(outcome.timeline) if outcome.timeline else None})
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
        out.print(f"stopped; continue with: jaxfit schedule <queue> --resume --state-dir {outcome.state_dir}",
                  highlight=False)
    return int(outcome.exit_code)


FLAGS_WITH_FLAG_VALUES = ("--batch-flag", "--accum-flag", "--probe-arg")
"""Options whose value is itself a flag (``--batch-flag --config.batch_size``), joined with ``=``
before tyro parses them, since it would read the value as an option of its own."""


def join_flag_values(args: list[str]) -> list[str]:
    """``["--batch-flag", "--bs"]`` -> ``["--batch-flag=--bs"]`` for :data:`FLAGS_WITH_FLAG_VALUES`."""
    out: list[str] = []
    i = 0
    while i < len(args):
        if args[i] in FLAGS_WITH_FLAG_VALUES and i + 1 < len(args):
            out.append(f"{args[i]}={args[i + 1]}")
            i += 2
        else:
            out.append(args[i])
            i += 1
    return out


_REAL_STDERR: list[Any] = []


def _parsed(replay: bool = True) -> None:
    """Called first by every command: tyro is done, stderr is the terminal's again (and gets what
    was written meanwhile, unless ``replay`` is off: a parsing error is said in one line instead)."""
    if _REAL_STDERR:
        held = sys.stderr
        sys.stderr = _REAL_STDERR.pop()
        text = held.getvalue() if replay and hasattr(held, "getvalue") else ""
        if text:
            sys.stderr.write(text)


def one_line(box: str) -> str:
    """tyro's boxed parsing error as one line: its title and its first section."""
    lines = [line.strip().strip("│╭╮╰╯").strip() for line in box.splitlines()]
    title = ""
    if lines and lines[0].startswith("─"):
        title = lines[0].strip("─ ").strip()
    body: list[str] = []
    for line in lines[1:]:
        if line.startswith("────"):
            break
        if line and not line.startswith("─"):
            body.append(line)
    text = " ".join(" ".join(body).split())
    if title and not text.lower().startswith(title.lower()):
        text = f"{title.lower()}: {text}"
    return text or " ".join(box.split())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``jaxfit`` console script. Returns the exit code.

    Every error is one line ``jaxfit: error: ...`` with exit code 2: jaxfit's own, and tyro's
    parsing errors (held back while tyro parses, then folded into one line with the help to read).
    """
    import io

    args = list(sys.argv[1:] if argv is None else argv)
    if "--" in args:
        split = args.index("--")
        _COMMAND[:] = args[split + 1:]
        args = args[:split]
    if not args:
        args = ["fit"]
    args = join_flag_values(args)
    _REAL_STDERR[:] = [sys.stderr]
    sys.stderr = io.StringIO()
    try:
        code = app.cli(prog="jaxfit", args=args,
                       description="jaxfit: ask the XLA compiler what fits, before an OOM does.")
    except SystemExit as e:
        held = sys.stderr
        _parsed(replay=e.code != 2)
        if e.code == 2 and isinstance(held, io.StringIO):  # tyro's parsing error, held back
            command = next((a for a in args if not a.startswith("-")), "")
            command = command if command in ("fit", "run", "examples", "schedule", "calibrate") else ""
            print(f"jaxfit: error: {one_line(held.getvalue())}; see jaxfit {command + ' ' if command else ''}--help",
                  file=sys.stderr)
            return 2
        raise
    except JaxfitError as e:
        _parsed()
        print(f"jaxfit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _parsed()
        print("jaxfit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `jaxfit ... | head`: the reader left; nothing more to say
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python flushes stdout at exit
        return 0
    finally:
        _parsed()
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
