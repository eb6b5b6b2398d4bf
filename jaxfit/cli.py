"""The ``jaxfit`` command line: a thin tyro layer over the Python API."""

from __future__ import annotations

import sys
from typing import Annotated

import tyro
from rich.console import Console

from jaxfit import budget as budget_mod
from jaxfit.errors import JaxfitError

app = tyro.extras.SubcommandApp()

# The training command after ``--`` (tyro never sees it): ``jaxfit fit --script -- python train.py ...``.
_COMMAND: list[str] = []


def _overrides(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise JaxfitError(f"--set {pair!r} must look like KEY=VALUE, e.g. --set n_layers=6")
        out[key.strip()] = value.strip()
    return out


@app.command(name="fit")
def fit_command(
    example: str | None = None,
    overrides: Annotated[tuple[str, ...], tyro.conf.arg(name="set"), tyro.conf.UseAppendAction] = (),
    entry: str | None = None,
    mem_fraction: float | None = None,
    batch_size: int | None = None,
    headroom: str = "0",
    device_memory: str | None = None,
    min_batch: int = 1,
    max_batch: int = 65536,
    multiple_of: int = 1,
    width: int | None = None,
    cache: bool = True,
    verify: bool = True,
    json: str | None = None,
    quiet: bool = False,
    script: bool = False,
    step_name: str = "train_step",
    batch_flag: str = "--batch-size",
    batch_arg: int | None = None,
    probe_timeout: float = 900.0,
) -> None:
    """Find the largest batch that fits a memory fraction (or, with --batch-size, the smallest fraction a batch needs) by compiling the train step, never running it.

    Compiles run in a child process started with XLA_PYTHON_CLIENT_MEM_FRACTION set to the target
    (XLA's peak depends on the limit it sees) and preallocation off, so jobs already on the GPU are
    not disturbed. With no arguments: the built-in gpt-tiny example at fraction 0.45 (or
    $XLA_PYTHON_CLIENT_MEM_FRACTION).

    Args:
        example: Built-in example to fit (see `jaxfit examples`); default gpt-tiny.
        overrides: Override a config key of the example, KEY=VALUE; repeatable (--set n_layers=6 --set dtype=bfloat16).
        entry: Your own workload: package.module:function returning a jaxfit.Workload (imported from the current directory).
        mem_fraction: The XLA_PYTHON_CLIENT_MEM_FRACTION to fit under, in (0, 1]; default $XLA_PYTHON_CLIENT_MEM_FRACTION or 0.45.
        batch_size: Inverse question: the smallest fraction (to 0.01) that this batch needs.
        headroom: Memory to keep free inside the budget, e.g. 2GiB.
        device_memory: Plan for a device of this size, e.g. 96GiB (GPU: compiled under the equivalent limit; CPU: replaces the host RAM).
        min_batch: Smallest batch size to consider.
        max_batch: Largest batch size to consider.
        multiple_of: Only consider multiples of this (e.g. the number of devices).
        width: Concurrent compiles per search round (default 4 on a GPU, up to 4 CPU cores otherwise).
        cache: Use the answer and compile cache (~/.cache/jaxfit or $JAXFIT_CACHE_DIR); --no-cache compiles afresh.
        verify: On a GPU, re-compile the winner with autotuning on (the search runs with it off).
        json: Also write the result as JSON to this file.
        quiet: Print only the answer line.
        script: Fit the train step inside an unmodified training script given after --, e.g. `jaxfit fit --script -- python scripts/train.py debug --exp-name=x`. The script runs (in its own environment, under the target fraction) up to its first call of the jitted step, which is compiled instead of run; then it is stopped.
        step_name: With --script: the name of the jitted train step function (found through functools.partial).
        batch_flag: With --script: the script's batch-size flag (write --batch-flag=--bs); its value in the command identifies the batch argument.
        batch_arg: With --script: which positional argument of the step is the batch (default: found by shape).
        probe_timeout: With --script: seconds to wait for the script to call its step.
    """
    from jaxfit.fit import FitOptions, fit_batch, fit_fraction
    from jaxfit.report import ProgressPrinter, check_writable, print_result, write_json
    from jaxfit.sources import entry_source, example_source, script_source

    if sum(bool(x) for x in (example, entry, script)) > 1:
        raise JaxfitError("give one of --example, --entry or --script")
    if _COMMAND and not script:
        raise JaxfitError("a command after -- needs --script (or use `jaxfit run`)")
    if entry and overrides:
        raise JaxfitError("--set applies to built-in examples only; configure an --entry in its own code")
    if json:
        check_writable(json)
    if script:
        source = script_source(_COMMAND, step_name=step_name, batch_flag=batch_flag, batch_arg=batch_arg)
    elif entry:
        source = entry_source(entry)
    else:
        from jaxfit.examples import DEFAULT_EXAMPLE

        source = example_source(example or DEFAULT_EXAMPLE, _overrides(overrides))
    options = FitOptions(
        mem_fraction=mem_fraction, headroom_bytes=budget_mod.parse_size(headroom) if headroom not in ("0", "") else 0,
        device_memory_bytes=budget_mod.parse_size(device_memory) if device_memory else None,
        min_batch=min_batch, max_batch=max_batch, multiple_of=multiple_of, width=width,
        use_cache=cache, verify=verify, start_timeout=probe_timeout,
    )
    if mem_fraction is not None:
        options.resolved_fraction()
    if batch_size is None:
        options.grid()
    err = Console(stderr=True)
    out = Console() if sys.stdout.isatty() else Console(width=160)
    progress = None if quiet else ProgressPrinter(err)
    if batch_size is None:
        result = fit_batch(source, options, progress=progress)
    else:
        result = fit_fraction(source, batch_size, options, progress=progress)
    if json:
        write_json(json, result.to_dict())
    if quiet:
        out.print(result.message, highlight=False)
    else:
        print_result(result, out)


@app.command(name="examples")
def examples_command() -> None:
    """List the built-in example workloads and what they are."""
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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``jaxfit`` console script. Returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" in args:
        split = args.index("--")
        _COMMAND[:] = args[split + 1:]
        args = args[:split]
    if not args:
        args = ["fit"]
    try:
        app.cli(prog="jaxfit", args=args, description="jaxfit: ask the XLA compiler what fits, before an OOM does.")
    except JaxfitError as e:
        print(f"jaxfit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("jaxfit: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
