"""Showing results: a table for people, a JSON file for machines, progress while searching."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from jaxfit.budget import format_bytes
from jaxfit.errors import ConfigError
from jaxfit.fit import FitResult


def check_writable(path: str | os.PathLike[str]) -> Path:
    """Fail early (before a long fit) if ``path``'s folder does not exist or is not writable."""
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ConfigError(f"--json {path} is a folder; give a file name such as {p / 'fit.json'}")
    if not folder.is_dir():
        raise ConfigError(f"--json {path}: folder {folder} does not exist; create it or choose another path")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"--json {path}: folder {folder} is not writable")
    return p


def write_json(path: str | os.PathLike[str], data: Mapping[str, Any]) -> None:
    """Write ``data`` as JSON atomically: the file is either the whole new object or untouched."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent if str(p.parent) else ".")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=False)
            f.write("\n")
        os.replace(tmp, p)
    except BaseException:
        os.unlink(tmp)
        raise


def result_table(result: FitResult) -> Table:
    """The candidates of a fit as a rich table."""
    fraction_mode = result.mode == "fraction"
    title = f"{result.workload.get('name', 'workload')} on {result.device.get('device_kind', '?')}"
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
        row += [format_bytes(c.argument_bytes), format_bytes(c.temp_bytes), format_bytes(c.output_bytes),
                format_bytes(c.alias_bytes), format_bytes(c.peak_bytes)]
        row.append("[green]yes[/]" if c.fits else ("[red]OOM[/]" if c.oom else "[red]no[/]"))
        note = " cache" if c.cached else (" tuned" if c.autotuned and result.device.get("limit_sensitive") else "")
        row.append(f"{c.compile_seconds:.1f}{note}")
        table.add_row(*row)
    return table


def print_result(result: FitResult, console: Console) -> None:
    """The table, then a summary of the answer."""
    console.print(result_table(result))
    total = result.device.get("total_bytes")
    console.print(
        f"[bold]{result.message}[/]\n"
        f"fraction {result.mem_fraction:.2f} of {format_bytes(total)} -> limit {format_bytes(result.limit_bytes)}, "
        f"headroom {format_bytes(result.headroom_bytes)}, budget {format_bytes(result.budget_bytes)}\n"
        f"{result.compiles} compiles in {result.rounds} rounds, {result.wall_seconds:.1f} s"
        + (" (answer cache)" if result.cached else "")
        + (f"; per-process overhead outside the pool: {format_bytes(result.process_overhead_bytes)}"
           if result.process_overhead_bytes else "")
    )
    if result.mode == "batch":
        console.print(
            f"run with: XLA_PYTHON_CLIENT_MEM_FRACTION={result.mem_fraction:g} ... --batch-size={result.batch_size}"
        )


class ProgressPrinter:
    """Turns fit progress events into lines on stderr."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __call__(self, event: str, data: Mapping[str, Any]) -> None:
        c = self.console
        if event == "starting":
            c.print(f"[dim]starting a compile child under XLA_PYTHON_CLIENT_MEM_FRACTION={data['fraction']:g}...[/]")
        elif event == "start":
            info = data["device"]
            c.print(
                f"[dim]{info.device_kind} ({info.platform}), jax {info.jax_version}; "
                f"budget {format_bytes(data['budget'])}[/]"
            )
        elif event == "round":
            what = (f"fractions {', '.join(f'{f:.2f}' for f in data['fractions'])}" if "fractions" in data
                    else f"batch {', '.join(map(str, data['batches']))}")
            tuned = " (autotuned)" if data.get("autotune") else ""
            c.print(f"[dim]round {data['round']}: compiling {what}{tuned}[/]")
        elif event == "compiled":
            o = data["outcome"]
            where = f" @ {data['fraction']:.2f}" if "fraction" in data else ""
            if o.memory is None:
                c.print(f"[dim]  batch {o.batch_size}{where}: out of memory while compiling ({o.compile_seconds:.1f} s)[/]")
            else:
                fits = o.memory.peak_bytes <= data["budget"]
                c.print(
                    f"[dim]  batch {o.batch_size}{where}: peak {format_bytes(o.memory.peak_bytes)} "
                    f"{'fits' if fits else 'does not fit'} ({o.compile_seconds:.1f} s{', cache' if o.cached else ''})[/]"
                )
        elif event == "note":
            c.print(f"[dim]{data['text']}[/]")
        elif event == "cached":
            c.print("[dim]answered from the cache (use --no-cache to compile afresh)[/]")
