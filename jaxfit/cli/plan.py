"""``jaxfit plan``: what-if tables of cards x device counts x FSDP sizes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import tyro
from rich.console import Console
from rich.table import Table

from jaxfit.cli.app import Flat, app, no_command, parsed
from jaxfit.errors import JaxfitError
from jaxfit.fit.budget import format_bytes
from jaxfit.fit.mesh import MIN_SHARD_BYTES, MeshSpec
from jaxfit.fit.options import FitOptions, Size
from jaxfit.plan.whatif import STATUS_TEXT, Card, Cell, PlanResult

MARKS = {"gpu": "", "mock": " (mock)", "cpu": " (cpu)"}


@app.command(name="plan")
def plan_command(
    options: Annotated[FitOptions, Flat] = FitOptions(),
    example: str | None = None,
    overrides: Annotated[tuple[str, ...], tyro.conf.arg(name="set"), tyro.conf.UseAppendAction] = (),
    entry: str | None = None,
    cards: Annotated[tuple[str, ...], tyro.conf.arg(name="card"), tyro.conf.UseAppendAction] = (),
    default_cards: bool = True,
    devices: tuple[int, ...] = (1, 2, 4),
    fsdp: tuple[int, ...] | None = None,
    fsdp_min_size: Annotated[Size, tyro.conf.arg(name="fsdp-min-size")] = MIN_SHARD_BYTES,
    json: str | None = None,
    quiet: bool = False,
) -> None:
    """What-if table: the largest global batch and its per-device peak for card sizes x device counts x FSDP sizes, each compiled under the limit that card and fraction would give.

    Usage: `jaxfit plan --example gpt-small --mem-fraction 0.9 --devices 1 2 4 --card L4=24GB`.
    Cells for more devices than this machine has are compiled for a mocked GPU topology (never
    run); on a CPU-only machine, for host devices (the CPU compiler ignores the limit, so a cell
    compares the analysis with the card's budget). A card larger than this GPU at the fraction
    cannot be planned here and is marked not available.

    Args:
        options: How to fit each cell (--device-memory is set per card).
        example: Built-in example to plan (see `jaxfit examples`); default gpt-tiny.
        overrides: Override a config key of the example, KEY=VALUE; repeatable.
        entry: Your own workload: package.module:function returning a jaxfit.Workload.
        cards: A card to plan for, NAME=SIZE with the total CUDA reports (e.g. --card 4090=24564MiB), or a card measured on real hardware, H100 (80GB HBM3: 81,080 MiB) or H200 (143,160 MiB); repeatable, added to the defaults.
        default_cards: Include the nominal 24, 32, 48, 80, 96 and 141 GB cards (read as GiB; a real card gives JAX about 1 % less, see --card H100); --no-default-cards plans only the --card ones.
        devices: Device counts to plan for.
        fsdp: FSDP sizes to plan for each device count (those that divide it); default 1 and the count itself.
        fsdp_min_size: Arrays smaller than this stay replicated under FSDP.
        json: Also write the table as JSON to this file.
        quiet: No progress lines.
    """
    parsed()
    no_command("plan")
    from jaxfit.examples import DEFAULT_EXAMPLE, parse_overrides
    from jaxfit.files import check_writable, write_json
    from jaxfit.fit.sources import Source, entry_source, example_source
    from jaxfit.plan.whatif import DEFAULT_CARDS, meshes_for, parse_card, what_if

    if example and entry:
        raise JaxfitError("give one of --example or --entry")
    if entry and overrides:
        raise JaxfitError("--set applies to built-in examples only; configure an --entry in its own code")
    if options.device_memory_bytes is not None:
        raise JaxfitError("--device-memory is set per card by plan; give cards with --card NAME=SIZE")
    if json:
        check_writable(json)
    chosen: list[Card] = (list(DEFAULT_CARDS) if default_cards else []) + [parse_card(c) for c in cards]
    if not chosen:
        raise JaxfitError("no cards to plan for: give --card NAME=SIZE or drop --no-default-cards")
    meshes = [
        MeshSpec(m.devices, m.fsdp, fsdp_min_size).validate()  # what_if lets its cells be mocked
        for m in meshes_for(devices, list(fsdp) if fsdp is not None else None)
    ]
    options.validate()
    options.grid()
    parsed_overrides = parse_overrides(overrides)
    name = example or DEFAULT_EXAMPLE
    example_source(name, parsed_overrides)  # a bad example or key fails now, before any compile

    def source_for(mesh: MeshSpec) -> Source:
        return entry_source(entry, mesh=mesh) if entry else example_source(name, parsed_overrides, mesh)

    err = Console(stderr=True)

    def progress(cell: Cell, index: int, total: int) -> None:
        if quiet:
            return
        answer = (
            f"batch {cell.batch_size}, peak {format_bytes(cell.peak_bytes)}"
            if cell.batch_size is not None
            else STATUS_TEXT[cell.status]
        )
        err.print(
            f"[{index}/{total}] {cell.card} x {cell.devices} (fsdp {cell.fsdp}): {answer} "
            f"[dim]({STATUS_TEXT[cell.status]}, {cell.seconds:.1f} s)[/]",
            highlight=False,
        )

    from jaxfit.cli.output import ProgressPrinter

    printer = None if quiet else ProgressPrinter(err)

    def fit_progress(event: str, data: Mapping[str, Any]) -> None:
        if printer is not None and event in ("starting", "round", "compiled", "note"):
            printer(event, data)

    if not quiet:
        err.print(f"[dim]{len(chosen) * len(meshes)} cells: {len(chosen)} cards x {len(meshes)} meshes[/]")
    result = what_if(source_for, chosen, meshes, options, progress, fit_progress)
    if json:
        write_json(json, result.to_dict())
    Console().print(plan_table(result))
    notes = sorted({c.note for c in result.cells if c.status in ("does not fit", "not available")})
    for note in notes:
        Console().print(f"[dim]- {note}[/]", highlight=False)


def plan_table(result: PlanResult) -> Table:
    """Rows: meshes; columns: cards; each cell the largest global batch and its per-device peak."""
    table = Table(
        title=f"{result.workload} at fraction {result.mem_fraction:g} on {result.device_kind or '?'}: "
        "largest global batch (+: --max-batch reached), peak per device",
        title_justify="left",
    )
    table.add_column("devices", justify="right")
    table.add_column("fsdp", justify="right")
    table.add_column("state / device", justify="right")
    cards: list[str] = []
    for cell in result.cells:
        if cell.card not in cards:
            cards.append(cell.card)
    for card in cards:
        table.add_column(card, justify="right")
    rows: dict[tuple[int, int], dict[str, Cell]] = {}
    for cell in result.cells:
        rows.setdefault((cell.devices, cell.fsdp), {})[cell.card] = cell
    for (devices, fsdp), by_card in rows.items():
        state = next((c.parameter_bytes for c in by_card.values() if c.parameter_bytes is not None), None)
        row = [str(devices), str(fsdp), format_bytes(state) if state is not None else "-"]
        for card in cards:
            found = by_card.get(card)
            if found is None:
                row.append("")
            elif found.batch_size is None:
                row.append(f"[dim]{found.status}[/]")
            else:
                more = "+" if found.outcome == "max" else ""
                row.append(f"{found.batch_size}{more}  {format_bytes(found.peak_bytes)}{MARKS.get(found.status, '')}")
        table.add_row(*row)
    return table
