"""Showing results to people: the candidate table, the answer, how to run it, progress lines."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from jaxfit.fit.budget import format_bytes, fraction_variable
from jaxfit.fit.results import FitResult


def where(result: FitResult) -> str:
    """``cpu``, ``NVIDIA H100 80GB HBM3``, or ``4 x cpu, mesh batch 2 x fsdp 2 (per device)``."""
    kind = str(result.device.get("device_kind", "?"))
    if result.device_count <= 1:
        return kind
    mesh = " x ".join(f"{axis} {size}" for axis, size in result.mesh.items())
    mock = ", mocked topology" if result.device.get("topology") == "mock" else ""
    return f"{result.device_count} x {kind}{mock}" + (f", mesh {mesh}" if mesh else "") + " (bytes per device)"


def result_table(result: FitResult) -> Table:
    """The candidates of a fit as a rich table."""
    fraction_mode = result.mode == "fraction"
    title = f"{result.workload.get('name', 'workload')} on {where(result)}"
    table = Table(title=title, title_justify="left")
    if fraction_mode:
        table.add_column("fraction", justify="right")
        table.add_column("limit", justify="right")
    else:
        table.add_column("batch", justify="right")
    for name in ("argument", "temp", "output", "alias", "peak"):
        table.add_column(name, justify="right")
    table.add_column("fits", justify="center")
    table.add_column("compile s", justify="right")
    for c in result.candidates:
        row = []
        if fraction_mode:
            row += [f"{c.mem_fraction:.2f}", format_bytes(c.limit_bytes)]
        else:
            row.append(str(c.batch_size))
        row += [
            format_bytes(c.argument_bytes),
            format_bytes(c.temp_bytes),
            format_bytes(c.output_bytes),
            format_bytes(c.alias_bytes),
            format_bytes(c.peak_bytes),
        ]
        row.append(
            "[green]yes[/]"
            if c.fits
            else ("[red]start-up OOM[/]" if c.start_up_oom else "[red]OOM[/]" if c.oom else "[red]no[/]")
        )
        note = " cache" if c.cached else (" tuned" if c.autotuned and result.device.get("limit_sensitive") else "")
        row.append(f"{c.compile_seconds:.1f}{note}")
        table.add_row(*row)
    return table


def breakdown_table(result: FitResult) -> Table:
    """The peak of the answer by component (``--breakdown``): exact bytes, and the estimates marked."""
    sharded = result.device_count > 1
    title = f"peak at batch {result.batch_size}, by component" + (
        f", per device of {result.device_count}" if sharded else ""
    )
    table = Table(title=title, title_justify="left")
    columns = [("component", "left"), ("category", "left"), ("bytes", "right")]
    if sharded:
        columns.append(("replicated", "right"))  # what one device would hold without sharding
    columns += [("share", "right"), ("", "left")]
    for column, justify in columns:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for c in result.breakdown:
        share = c["bytes"] / result.peak_bytes if result.peak_bytes else 0.0
        row = [c["name"], c["category"], format_bytes(c["bytes"])]
        if sharded:
            whole = c.get("whole_bytes")
            row.append(format_bytes(whole) if whole is not None else "")
        row += [f"{share:.1%}", "" if c["exact"] else "estimate"]
        table.add_row(*row)
    table.add_row("peak", "", format_bytes(result.peak_bytes), *([""] if sharded else []), "100.0%", "", style="bold")
    return table


def run_line(result: FitResult, command: list[str] | None = None, batch_flag: str = "--batch-size") -> str:
    """``run with: ENV... COMMAND --batch-size=N``: the environment that runs the proven program in a
    user's own shell (the pin, loaded by jaxfit's start-up hook), then the command with its batch
    (the answer, or in the inverse mode the batch asked about: the pin was made for it)."""
    import shlex

    from jaxfit.fit.command import with_batch
    from jaxfit.fit.pin import env_words

    words = env_words(result.run_env())
    # Both modes: the answer's batch, or the batch the inverse question was asked (and pinned) for.
    if command:
        words.append(shlex.join(with_batch(command, batch_flag, result.batch_size)))
    else:
        words.append(f"... {batch_flag}={result.batch_size}")
    if result.pinned and result.step_name:  # a shell comment: the line still pastes as it is
        words.append(f"  # loads the proven program of {result.step_name!r}")
    return "run with: " + " ".join(words)


def phases_words(phases: dict) -> str:
    """`` (start-up 61.2 s, search 3 rounds 150.3 s, proof 2 rounds 120.9 s, pin 2.1 s; 20.4 s of the
    rounds tracing the step)``: where a
    fit's time went; empty when not known (a cached answer)."""
    if not phases:
        return ""
    words = [f"start-up {phases['start_seconds']:.1f} s"]
    for part in ("search", "proof"):
        if phases.get(f"{part}_rounds"):
            n = phases[f"{part}_rounds"]
            words.append(f"{part} {n} round{'s' if n != 1 else ''} {phases[f'{part}_seconds']:.1f} s")
    if phases.get("pin_seconds"):
        words.append(f"pin {phases['pin_seconds']:.1f} s")
    lowering = (
        f"; {phases['lower_seconds']:.1f} s of the rounds tracing the step" if phases.get("lower_seconds") else ""
    )
    return " (" + ", ".join(words) + lowering + ")"


def print_result(
    result: FitResult, console: Console, command: list[str] | None = None, batch_flag: str = "--batch-size"
) -> None:
    """The table, then a summary of the answer, then how to run it (:func:`run_line`)."""
    console.print(result_table(result))
    total = result.device.get("total_bytes")
    console.print(
        f"[bold]{result.message}[/]\n"
        f"proved: {result.step_phrase()}\n"
        f"fraction {result.mem_fraction:g} of {format_bytes(total)} -> limit {format_bytes(result.limit_bytes)}, "
        f"headroom {format_bytes(result.headroom_bytes)}, budget {format_bytes(result.budget_bytes)}\n"
        f"{result.compiles} compiles in {result.rounds} rounds, {result.wall_seconds:.1f} s"
        + (" (answer cache)" if result.cached else "")
        + phases_words(result.phases)
        + (
            f"; per-process overhead outside the pool: {format_bytes(result.process_overhead_bytes)}"
            if result.process_overhead_bytes
            else ""
        )
    )
    console.print(run_line(result, command, batch_flag), highlight=False, soft_wrap=True, markup=False)
    if result.pinned:
        console.print(
            "(JAXFIT_PIN makes the train step load the very program proved above; without it the "
            "training process compiles its own, which near the limit can need more memory. A pin is a "
            "program: it loads only in your own processes, signed with your key"
            + (f"; {result.pin_note}" if result.pin_note else "")
            + ")",
            style="dim",
            highlight=False,
        )
    elif result.pin_note:
        console.print(f"({result.pin_note})", style="dim", highlight=False)


class ProgressPrinter:
    """Turns fit progress events into lines on stderr."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.began = time.perf_counter()

    def __call__(self, event: str, data: Mapping[str, Any]) -> None:
        c = self.console
        if event == "starting":
            self.began = time.perf_counter()
            c.print(f"[dim]starting a compile child under {fraction_variable()}={data['fraction']:g}...[/]")
        elif event == "start":
            info = data["device"]
            c.print(
                f"[dim]{info.device_kind} ({info.platform}), jax {info.jax_version}; "
                f"budget {format_bytes(data['budget'])}[/]"
            )
        elif event == "round":
            what = (
                f"fractions {', '.join(f'{f:.2f}' for f in data['fractions'])}"
                if "fractions" in data
                else f"batch {', '.join(map(str, data['batches']))}"
            )
            tuned = " (autotuned)" if data.get("autotune") else ""
            at = time.perf_counter() - self.began
            c.print(f"[dim]round {data['round']} at {at:.1f} s: compiling {what}{tuned}[/]")
        elif event == "alone":
            c.print(
                f"[dim]  batch {data['batch']}: compiling it again alone (autotuning beside another can run out)[/]"
            )
        elif event == "compiled":
            o = data["outcome"]
            where = f" @ {data['fraction']:.2f}" if "fraction" in data else ""
            if o.start_up_oom:
                c.print(
                    f"[dim]  batch {o.batch_size}{where}: the script's start-up ran out of memory before its step "
                    f"({o.compile_seconds:.1f} s)[/]"
                )
            elif o.memory is None and o.oom:
                c.print(
                    f"[dim]  batch {o.batch_size}{where}: out of memory while compiling ({o.compile_seconds:.1f} s)[/]"
                )
            elif o.memory is None:
                error = (o.error or "unknown error").strip().splitlines()[0][:160]
                c.print(
                    f"  batch {o.batch_size}{where}: failed to compile: {error}",
                    markup=False,
                    style="dim",
                    highlight=False,
                )
            else:
                fits = o.memory.need_bytes <= data["budget"]
                c.print(
                    f"[dim]  batch {o.batch_size}{where}: peak {o.memory.need_words()} "
                    f"{'fits' if fits else 'does not fit'} ({o.compile_seconds:.1f} s{', cache' if o.cached else ''})[/]"
                )
        elif event == "note":
            c.print(f"[dim]{data['text']}[/]")
        elif event == "cached":
            c.print("[dim]answered from the cache (use --no-cache to compile afresh)[/]")
