"""``jaxfit fit``: the largest batch under a fraction, or the smallest fraction for a batch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import tyro
from rich.console import Console

from jaxfit.cli.app import COMMAND, Flat, MeshArgs, ScriptArgs, WandbMode, app, consoles, example_name, parsed
from jaxfit.errors import JaxfitError
from jaxfit.fit.options import FitOptions
from jaxfit.fit.sources import Source

if TYPE_CHECKING:
    pass


@app.command(name="fit")
def fit_command(
    options: Annotated[FitOptions, Flat] = FitOptions(),
    probe: Annotated[ScriptArgs, Flat] = ScriptArgs(),
    devices: Annotated[MeshArgs, Flat] = MeshArgs(),
    example: str | None = None,
    overrides: Annotated[tuple[str, ...], tyro.conf.arg(name="set"), tyro.conf.UseAppendAction] = (),
    entry: str | None = None,
    script: bool = False,
    batch_size: int | None = None,
    json: str | None = None,
    quiet: bool = False,
    breakdown: bool = False,
    plot: str | None = None,
    wandb: bool = False,
    wandb_mode: WandbMode | None = None,
    wandb_project: str = "jaxfit",
    gpu: str | None = None,
    gpu_spec: str | None = None,
) -> None:
    """Find the largest batch that fits a memory fraction (or, with --batch-size, the smallest fraction a batch needs) by compiling the train step, never running it.

    Compiles run in a child process started with XLA_PYTHON_CLIENT_MEM_FRACTION set to the target
    (XLA's peak depends on the limit it sees) and preallocation off, so jobs already on the GPU are
    not disturbed. With no arguments: the built-in gpt-tiny example at fraction 0.45 (or
    $XLA_PYTHON_CLIENT_MEM_FRACTION).

    Args:
        options: How to fit.
        probe: With --script: how to find the train step.
        devices: With --example or --entry: the devices and the FSDP size of the step's mesh; every byte count is then per device.
        example: Built-in example to fit (see `jaxfit examples`); default gpt-tiny.
        overrides: Override a config key of the example, KEY=VALUE; repeatable (--set n_layers=6 --set dtype=bfloat16).
        entry: Your own workload: package.module:function returning a jaxfit.Workload (imported from the current directory).
        script: Fit the train step inside an unmodified training script given after --, e.g. `jaxfit fit --script -- python scripts/train.py debug --exp-name=x`. The script runs (in its own environment, under the target fraction) up to its first call of the jitted step, which is compiled instead of run; then it is stopped.
        batch_size: Inverse question: the smallest fraction (to 0.01) that this batch needs.
        json: Also write the result as JSON to this file.
        quiet: Print only the answer line.
        breakdown: Also print the answer's peak by component: parameters, optimizer state, other state, batch, gradients, activations and workspace (the JSON always has it).
        plot: Also draw the answer's peak by component (a stacked bar against the budget, estimates hatched) to this .png, .svg or .pdf file; the picture of --breakdown, which it does not need.
        wandb: Log the fit as its own Weights & Biases run (settings in its config, candidates as a table).
        wandb_mode: online, offline or disabled; default $WANDB_MODE, else online with credentials and offline without.
        wandb_project: The W&B project of --wandb.
        gpu: Estimate for a GPU model that is not here (jaxfit gpus list: rtx-4090, rtx-a6000, a100-80gb, h100-sxm, rtx-pro-6000, h200, ...): the step (of a built-in example, an --entry step, or a --script's, whose start-up runs on the CPU) is compiled deviceless for that card, on this machine's CPU, under the limit --mem-fraction of the card gives (--device-memory: another size of it). An estimate of an untuned program, never pinned: the answer keeps its plain program within the budget with a 12% margin for autotuning, and says how far XLA's rematerialisation might go beyond it. Needs jax's CUDA plugin (pip install "jaxfit[targets]").
        gpu_spec: As --gpu, for a card described by a target config file (jaxfit gpus capture writes one on the card).
    """
    parsed()
    from jaxfit.cli.output import print_result
    from jaxfit.files import check_writable, write_json
    from jaxfit.fit import fit_batch, fit_fraction
    from jaxfit.fit.sources import ScriptSource, entry_source, example_source

    if sum(bool(x) for x in (example, entry, script)) > 1:
        raise JaxfitError("give one of --example, --entry or --script")
    if COMMAND and not script:
        raise JaxfitError("a command after -- needs --script (or use `jaxfit run`)")
    if entry and overrides:
        raise JaxfitError("--set applies to built-in examples only; configure an --entry in its own code")
    if json:
        check_writable(json)
    if plot:
        from jaxfit.figures import check_figure_path

        check_figure_path(plot, "--plot")
    mesh = devices.spec()
    source: Source
    if script:
        if mesh.sharded:
            raise JaxfitError(
                "--devices/--fsdp apply to --example and --entry; a script fits on its own mesh "
                "(scripts/train.py: --fsdp-devices; the devices it sees: CUDA_VISIBLE_DEVICES)"
            )
        source = probe.source()
    elif entry:
        source = entry_source(entry, mesh=mesh)
    else:
        from jaxfit.examples import parse_overrides

        source = example_source(example_name(example), parse_overrides(overrides), mesh)
    options.validate()
    if batch_size is None:
        options.grid()
    from jaxfit.cli.gpus import resolve_target

    target = resolve_target(gpu, gpu_spec, options.device_memory_bytes)
    out, progress = consoles(quiet)
    if target is not None:
        if batch_size is not None:
            raise JaxfitError(
                "--gpu estimates the largest batch; for the inverse question (--batch-size), fit on the card itself"
            )
        _estimate(source, target, options, out, progress, quiet=quiet, json=json)
        return
    if batch_size is None:
        result = fit_batch(source, options, progress=progress)
    else:
        result = fit_fraction(source, batch_size, options, progress=progress)
    command = list(source.run_command) if isinstance(source, ScriptSource) else None
    batch_flag = source.batch_flag if isinstance(source, ScriptSource) else "--batch-size"
    if quiet:
        out.print(f"{result.message}; {result.step_phrase()}", highlight=False, markup=False)
    else:
        print_result(result, out, command, batch_flag)
    if breakdown:
        from jaxfit.cli.output import breakdown_table

        if result.breakdown:
            out.print(breakdown_table(result))
        else:
            out.print("no breakdown: the step's arguments were not reported (fit again with --no-cache)")
    if json:  # after the answer is shown: a file that cannot be written loses nothing
        write_json(json, result.to_dict())
    if plot:
        from jaxfit.figures import breakdown_figure

        written = breakdown_figure(result, plot)
        if not quiet:
            out.print(f"plot: {written}", highlight=False, markup=False)
    if wandb:
        from jaxfit.run.tracking import log_fit

        where = log_fit(result, mode=wandb_mode, project=wandb_project)
        Console(stderr=True).print(f"[dim]logged to Weights & Biases: {where}[/]")


def _estimate(
    source: Source,
    target: object,
    options: FitOptions,
    out: Console,
    progress: object,
    *,
    quiet: bool,
    json: str | None,
) -> None:
    """``fit --gpu``: the deviceless estimate, its table and what it means."""
    from jaxfit.cli.output import result_table
    from jaxfit.files import write_json
    from jaxfit.fit.estimate import fit_for_gpu
    from jaxfit.fit.targets import Target

    assert isinstance(target, Target)
    estimate = fit_for_gpu(source, target, options, progress=progress)  # type: ignore[arg-type]
    shown = estimate.safe or estimate.squeezed
    if shown is not None and not quiet:
        out.print(result_table(shown))
    out.print(f"[bold]{estimate.summary()}[/]", highlight=False)
    if json:
        write_json(json, estimate.to_dict())
