"""``jaxfit tune``: the fastest settings that fit, measured."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import tyro
from rich.console import Console

from jaxfit.cli.app import COMMAND, Flat, ScriptArgs, WandbMode, app, consoles, example_name, parsed
from jaxfit.errors import JaxfitError
from jaxfit.fit.options import FitOptions

if TYPE_CHECKING:
    from jaxfit.tune.model import TuneResult


@app.command(name="tune")
def tune_command(
    options: Annotated[FitOptions, Flat] = FitOptions(),
    probe: Annotated[ScriptArgs, Flat] = ScriptArgs(),
    example: str | None = None,
    overrides: Annotated[tuple[str, ...], tyro.conf.arg(name="set"), tyro.conf.UseAppendAction] = (),
    script: bool = False,
    global_batch: int | None = None,
    remat: str | None = None,
    precision: str = "float32,bfloat16",
    axes: Annotated[tuple[str, ...], tyro.conf.arg(name="axis"), tyro.conf.UseAppendAction] = (),
    warmup: int = 2,
    steps: int = 5,
    budget: float | None = None,
    peak_tflops: float | None = None,
    micro_batches: int = 3,
    measure: Literal["auto", "process", "inline"] = "auto",
    drop_margin: float | None = 0.1,
    rank_untuned: bool = False,
    input_steps: int = 3,
    one_process: bool = True,
    parallel: int = 1,
    standby: bool = True,
    share_compile_cache: bool = True,
    json: str | None = None,
    png: str | None = None,
    quiet: bool = False,
    wandb: bool = False,
    wandb_mode: WandbMode | None = None,
    wandb_project: str = "jaxfit",
) -> int:
    """Find the settings that train fastest and fit: each compiled to prove it fits, the candidates that can win measured (on a GPU, a built-in example's in the process that proved them; else in fresh training processes).

    Usage: `jaxfit tune --example gpt-small --global-batch 64 --mem-fraction 0.3` (remat and
    precision of a built-in example), or `jaxfit tune --script --global-batch 64
    --axis=--remat=none,full --axis=--precision=float32,bfloat16 -- python scripts/train.py
    gpt_small --exp-name=t` (a script's own flags). For each setting the largest micro-batch that
    fits is found, then the micro-batches that divide the global batch (with --grad-accum-steps)
    are compiled as they will run (a remat setting, an example's or a script's --remat, only above the largest
    micro-batch its twin without remat fits: at one micro-batch remat only adds work); a candidate
    that cannot beat the best measured rate at the device's peak FLOP/s is skipped; the others run warm-up and timed steps with their proven
    (pinned) program (--measure), and are ranked by samples per second; one clearly slower than
    the best so far is dropped after its first timed steps (--drop-margin). With --rank-untuned
    (experimental, a GPU with --measure inline), every micro-batch's untuned program from the
    search is first run a few steps and the proofs go fastest first: one more than --drop-margin
    below the best proved so far is not proved at all (its row says ranked out).

    Args:
        options: How to fit.
        probe: With --script: how to find the train step, and its batch and accumulation flags.
        example: Built-in example to tune (see `jaxfit examples`); default gpt-tiny.
        overrides: Override a config key of the example for every setting, KEY=VALUE; repeatable.
        script: Tune a training script given after -- (its flags as --axis).
        global_batch: Samples per optimizer step to keep (micro-batch x accumulation); default: each setting's largest batch.
        remat: Built-in examples: rematerialisation choices, comma-separated, of none, full, dots, dots_no_batch (default none,full; none alone for a model without remat, the MLPs).
        precision: Built-in examples: float32, bfloat16, comma-separated.
        axes: Scripts: a flag and its values, --axis=--FLAG=V1,V2; repeatable (the settings are their cross product).
        warmup: Steps run before timing (the first loads the program).
        steps: Steps timed per candidate (the median is its step time).
        budget: Seconds to spend measuring, counted from the first measurement (the fits before it are not counted); the rows not measured say so.
        peak_tflops: The device's peak TFLOP/s, for MFU and to prune candidates that cannot win (default: a table of GPUs; none on a CPU).
        micro_batches: Micro-batches proved per setting (largest first; on a GPU inline, fastest untuned first).
        measure: process: each candidate trains in a fresh process with its pinned program (step and time between steps); inline: the proven program is timed in the compile process that proved it, on real arguments of its shapes (no start-up per candidate; the step alone; a program that process cannot hold is measured in a fresh one; a script is timed in its probe, on the state it built and its own batch, then the fastest row and those its rate there says may win again in a fresh process of the script, with its input; on an H200 the probe rates are within 3 % of a fresh process's since they run on the script's batch, not zero tokens); auto: inline for a built-in example on a GPU, process otherwise.
        drop_margin: Stop measuring a candidate after the first quarter of --steps (4 or more) when it runs this share below the best rate measured so far (0.1: 10% slower); its row says dropped. With --rank-untuned, also the margin under which a micro-batch's untuned rate leaves it unproved (ranked out). None measures every candidate fully.
        input_steps: Fresh-process measuring: after the timed steps, time the script's loop this many iterations with the step skipped, its input pipeline's own rate (the row's input alone /s; limited by input when it is slower than the step); 0: not measured.
        one_process: Fresh-process measuring: time a setting's proven programs (its accumulations of one global batch) one after another in one fresh process, each loaded in turn into the same training loop, instead of starting a process for each; a program that cannot stand in for the first (other arguments) gets a process of its own.
        parallel: A script: run its settings' searches, then every setting's proofs in one wave, this many probes of the script at once (on a GPU at most 0.95 / the fraction of them, each holding its own pool; with --measure inline each probe times its proof alone on the GPU). On one H200, with --standby and --share-compile-cache, 5 inline probes tuned scripts/train.py gpt_small in 109 s and 4 with fresh processes in 136 s, 0.16x and 0.20x of its grid of plain runs, both naming the grid's winner.
        standby: A script measured in fresh processes: start the fresh process of the micro-batch a setting proves first as soon as its search answers; it starts up beside the proofs and waits at its first step until its program is proved, then is measured (on a GPU each waiting process holds its pool, so only as many as fit beside the probes under 0.95 of the card).
        share_compile_cache: A script: its probes and measuring processes share a JAX compilation cache in a temporary folder (removed after), so what the script compiles before its train step (its state's init: 21.5 s of a 25 s start-up for gpt-small on an H200) is compiled once; the train step never comes from it. Nothing changes when $JAX_COMPILATION_CACHE_DIR is set.
        rank_untuned: Experimental (GPU, --measure inline, --global-batch): run each micro-batch's untuned program a few steps first, prove the fastest first and leave out the clearly slower (ranked out). Off by default: on an H200 the untuned programs ran about 12x slower than the proven ones, so ranking cost more than the proofs it saved.
        json: Write the result (rows, best, breakdown of the best) to this file.
        png: Draw samples/s against micro-batch per setting to this PNG.
        quiet: No progress.
        wandb: Log the tune as a Weights & Biases run with a table of the candidates.
        wandb_mode: online, offline or disabled; default $WANDB_MODE, else online with credentials and offline without.
        wandb_project: The W&B project of --wandb.
    """
    parsed()
    from jaxfit.files import check_writable, write_json
    from jaxfit.fit.sources import example_source
    from jaxfit.tune import Target, TuneOptions, example_settings, script_settings, tune
    from jaxfit.tune.report import draw, tune_table

    if example and script:
        raise JaxfitError("give one of --example or --script")
    if COMMAND and not script:
        raise JaxfitError("a command after -- needs --script")
    for path, flag in ((json, "--json"), (png, "--png")):
        if path:
            check_writable(path, flag)
    tuning = TuneOptions(
        global_batch=global_batch,
        warmup=warmup,
        steps=steps,
        budget_seconds=budget,
        peak_tflops=peak_tflops,
        micro_batches=micro_batches,
        use_cache=options.use_cache,
        measure=measure,
        drop_margin=drop_margin,
        rank_untuned=rank_untuned,
        input_steps=input_steps,
        one_process=one_process,
        parallel=parallel,
        standby=standby,
        share_compile_cache=share_compile_cache,
    ).validate()
    if script:
        if overrides:
            raise JaxfitError("--set applies to built-in examples; give a script's flags with --axis")
        source = probe.source()
        _check_axes(list(source.run_command), axes, source.batch_flag, source.accum_flag if global_batch else None)
        target, settings = Target(script=source), script_settings(axes)
    else:
        if axes:
            raise JaxfitError(
                "--axis applies to scripts; give a built-in example's choices with --remat and --precision"
            )
        from jaxfit.examples import load_config, parse_overrides

        name = example_name(example)
        target = Target(example=example_source(name, parse_overrides(overrides)))
        has_remat = hasattr(load_config(name), "remat")
        chosen = _choices(remat) if remat is not None else (["none", "full"] if has_remat else ["none"])
        settings = example_settings(chosen, _choices(precision), has_remat)
    out, progress = consoles(quiet)
    result = tune(target, settings, options.validate(), tuning, progress=progress)
    out.print(tune_table(result))
    out.print(f"[bold]{result.message}[/]", highlight=False)
    if result.command:
        import shlex

        from jaxfit.fit.pin import env_words

        out.print(
            f"train with: {' '.join([*env_words(result.env), shlex.join(result.command)])}",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        if script:
            note = (
                "(JAXFIT_PIN makes the train step load the program proved for the fastest row)"
                if result.pinned
                else "(not pinned: the fastest row's proven program is not stored; the training process compiles its own)"
            )
        else:
            note = "(scripts/train.py trains this example: `jaxfit examples --copy DIR` writes it; jaxfit run proves its step first)"
        out.print(note, style="dim", highlight=False)
    elif result.best is not None:
        out.print(
            f"settings: {example_settings_line(result)} (no training script trains this example as tuned)",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
    if json:  # after the answer is shown: a file that cannot be written loses nothing
        write_json(json, result.to_dict())
    if png:
        out.print(f"plot: {draw(result, png)}", highlight=False)
    if wandb:
        from jaxfit.tune.report import log_tune

        Console(stderr=True).print(
            f"[dim]logged to Weights & Biases: {log_tune(result, mode=wandb_mode, project=wandb_project)}[/]"
        )
    return 0 if result.best is not None else 1


def example_settings_line(result: TuneResult) -> str:
    """The best row of a built-in example's tune as the settings to train with."""
    best = result.best
    assert best is not None
    accum = (
        f" x {best.accum_steps} accumulation steps (global batch {best.global_batch})" if best.accum_steps > 1 else ""
    )
    return (
        f"{best.setting}, micro-batch {best.micro_batch}{accum}, XLA_PYTHON_CLIENT_MEM_FRACTION={result.mem_fraction:g}"
    )


def _choices(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values:
        raise JaxfitError(f"{text!r} names no choice; give them comma-separated, e.g. none,full")
    return values


def _check_axes(command: list[str], axes: tuple[str, ...], batch_flag: str, accum_flag: str | None) -> None:
    """Every flag an axis, the batch or the accumulation needs must be one the script takes (its --help)."""
    from jaxfit.fit.command import check_batch_flag
    from jaxfit.tune.space import parse_axis

    for axis in axes:
        flag, _ = parse_axis(axis)
        carried = next(
            (
                word if "=" in word else f"{word} {command[i + 1]}" if i + 1 < len(command) else word
                for i, word in enumerate(command)
                if word == flag or word.startswith(flag + "=")
            ),
            None,
        )
        if carried is not None:
            raise JaxfitError(
                f"the command carries {carried} and --axis varies {flag}; drop {carried} from the command "
                "(each setting sets it)"
            )
        check_batch_flag(command, flag, fix=f"--axis names {flag}, which the script does not take; check its --help")
    check_batch_flag(command, batch_flag)
    if accum_flag:
        check_batch_flag(command, accum_flag, fix="--global-batch needs the script's accumulation flag (--accum-flag)")
