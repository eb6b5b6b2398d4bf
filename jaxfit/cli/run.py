"""``jaxfit run``: fit, then run the training command with the answer and its pinned program."""

from __future__ import annotations

from typing import Annotated

from rich.console import Console

from jaxfit.cli.app import Flat, ScriptArgs, WandbMode, app, consoles, parsed
from jaxfit.fit.options import FitOptions


@app.command(name="run")
def run_command(
    options: Annotated[FitOptions, Flat] = FitOptions(),
    probe: Annotated[ScriptArgs, Flat] = ScriptArgs(),
    batch_size: int | None = None,
    global_batch: int | None = None,
    gpus: int | None = None,
    wandb_mode: WandbMode | None = None,
    dry_run: bool = False,
    json: str | None = None,
    quiet: bool = False,
    grace: float = 30.0,
) -> int:
    """Fit, then run a training command with the chosen XLA_PYTHON_CLIENT_MEM_FRACTION and batch size, and log them to its own W&B run.

    Usage: `jaxfit run --mem-fraction 0.45 -- uv run scripts/train.py pi0_config --exp-name=v1 --overwrite`.
    The command's train step is fitted by probing (see `jaxfit fit --script`), then the command is
    run with the fraction in its environment and the batch flag set (replaced or added); its output
    streams through, Ctrl-C and SIGTERM are forwarded, and its exit code is jaxfit's. The chosen
    settings reach the script's own wandb run as config key `jaxfit`, without editing the script.
    Before the first step the run stops (exit 75) when its own step does not fit the proven budget,
    and (exit 76) when its GPU pool is not the fraction it was given (an allocator without a limit).
    With --batch-size B and --mem-fraction F nothing is fitted; with --batch-size alone, the
    smallest fraction for B is fitted.

    Args:
        options: How to fit.
        probe: How to find the train step.
        batch_size: Run at this batch instead of the largest that fits.
        global_batch: Keep this many samples per optimizer step: the batch flag gets this value and --grad-accum-steps splits it into micro-batches of at most --batch-size (or the largest that fits), fewest steps first; the accumulated step is compiled to prove it fits (the script must take --grad-accum-steps, as openpi-style scripts and scripts/train.py do).
        gpus: Let the fit and the run see this many GPUs and no other (CUDA_VISIBLE_DEVICES: those with the least memory in use; without GPUs, host devices). JAX preallocates on every GPU it sees, so a one-GPU run on a four-GPU host takes memory on all four unless it is given --gpus 1; an FSDP run over N GPUs: --gpus N. Default: the devices visible now.
        wandb_mode: Set WANDB_MODE for the command: online, offline or disabled (default: leave it as it is).
        dry_run: Print the command and environment that would run, and stop.
        json: Write the plan (command, settings, and the fit when there was one) to this file before the command starts.
        quiet: No fit progress.
        grace: Seconds the command has to end after Ctrl-C or SIGTERM (forwarded to its whole process group) before it is killed (a second Ctrl-C kills at once); it is also killed when jaxfit itself dies.
    """
    parsed()
    from jaxfit.files import check_writable, write_json
    from jaxfit.run.launch import execute, plan_run

    if json:
        check_writable(json)
    if not grace >= 0:
        from jaxfit.errors import ConfigError

        raise ConfigError(f"--grace {grace:g} must be 0 or more seconds")
    visible: dict[str, str] = {}
    if gpus is not None:
        import os

        from jaxfit.fit.devices import devices_environment

        visible = devices_environment(gpus, least_used=True)
        os.environ.update(visible)  # the probe, the fit's children and the run all see only these
    out, progress = consoles(quiet)
    plan = plan_run(
        probe.source(),
        options.validate(),
        batch_size=batch_size,
        fraction_given=options.mem_fraction is not None,
        global_batch=global_batch,
        progress=progress,
    )
    if visible:
        import dataclasses

        plan = dataclasses.replace(plan, env={**visible, **plan.env}, settings={**plan.settings, "gpus": gpus})
    err = Console(stderr=True)
    err.print(f"[bold]jaxfit run:[/] {plan.summary()}", highlight=False)
    if json:
        write_json(json, plan.to_dict())
    if dry_run:
        out.print(plan.describe(), highlight=False, soft_wrap=True)
        return 0
    outcome = execute(plan, wandb_mode=wandb_mode, grace_seconds=grace)
    err.print(f"[bold]jaxfit run:[/] exit code {outcome.exit_code}; {outcome.summary()}", highlight=False)
    if json:
        write_json(
            json,
            dict(
                plan.to_dict(),
                run=outcome.to_dict(),
                program_pinned=outcome.program_pinned,
                pinned_peak_bytes=outcome.pinned_peak_bytes,
                pinned_step=outcome.pinned_step,
                pinned_step_repeated=outcome.step_repeated,
            ),
        )
    return outcome.exit_code
