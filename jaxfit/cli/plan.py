"""``jaxfit plan``: what-if tables of cards x device counts x FSDP sizes."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import tyro
from rich.console import Console
from rich.table import Table

from jaxfit.cli.app import COMMAND, Flat, ScriptArgs, app, example_name, parsed
from jaxfit.errors import JaxfitError
from jaxfit.fit.budget import format_bytes
from jaxfit.fit.mesh import MIN_SHARD_BYTES, MeshSpec
from jaxfit.fit.options import FitOptions, Size
from jaxfit.plan.whatif import STATUS_TEXT, Card, Cell, PlanResult

MARKS = {"gpu": "", "mock": " (mock)", "cpu": " (cpu)", "estimate": " (est.)"}


@app.command(name="plan")
def plan_command(
    options: Annotated[FitOptions, Flat] = FitOptions(),
    probe: Annotated[ScriptArgs, Flat] = ScriptArgs(),
    example: str | None = None,
    overrides: Annotated[tuple[str, ...], tyro.conf.arg(name="set"), tyro.conf.UseAppendAction] = (),
    entry: str | None = None,
    script: bool = False,
    cards: Annotated[tuple[str, ...], tyro.conf.arg(name="card"), tyro.conf.UseAppendAction] = (),
    default_cards: bool = True,
    devices: tuple[int, ...] | None = None,
    fsdp: tuple[int, ...] | None = None,
    fsdp_min_size: Annotated[Size, tyro.conf.arg(name="fsdp-min-size")] = MIN_SHARD_BYTES,
    fsdp_flag: str = "--fsdp-devices",
    batch_size: int | None = None,
    json: str | None = None,
    markdown: str | None = None,
    quiet: bool = False,
    gpus: Annotated[tuple[str, ...], tyro.conf.arg(name="gpu"), tyro.conf.UseAppendAction] = (),
    gpu_specs: Annotated[tuple[str, ...], tyro.conf.arg(name="gpu-spec"), tyro.conf.UseAppendAction] = (),
) -> None:
    """What-if table: the largest global batch and its per-device peak for card sizes x device counts x FSDP sizes, each compiled under the limit that card and fraction would give.

    Usage: `jaxfit plan --example gpt-small --mem-fraction 0.9 --devices 1 2 4 --card L4=24GB`, or for
    an unmodified training script `jaxfit plan --script --mem-fraction 0.9 --markdown HARDWARE.md --
    python scripts/train.py pi0_libero --exp-name=plan`. Examples and entries: cells for more
    devices than this machine has are compiled for a mocked GPU topology (never run); on a CPU-only
    machine, for host devices (the CPU compiler ignores the limit, so a cell compares the analysis
    with the card's budget). Scripts: each cell probes the command with its devices visible (the
    first N GPUs; host devices without GPUs) and, with --fsdp, its --fsdp-flag set; more GPUs than
    this machine has cannot be planned for a script (it runs its own start-up on them), except for
    --gpu models: their cells run the script's start-up on the CPU (N host devices) and compile its
    step for N compile-only devices of the model, as `jaxfit fit --script --gpu` does. A card
    larger than this GPU at the fraction cannot be planned here and is marked not available. Every
    cell is cached when found: a plan cut short by Ctrl-C picks up where it stopped.

    Args:
        options: How to fit each cell (--device-memory is set per card).
        probe: With --script: how to find the train step.
        example: Built-in example to plan (see `jaxfit examples`); default gpt-tiny.
        overrides: Override a config key of the example, KEY=VALUE; repeatable.
        entry: Your own workload: package.module:function returning a jaxfit.Workload.
        script: Plan the train step of an unmodified training script given after --, as `jaxfit fit --script` fits it.
        cards: A card to plan for, NAME=SIZE with the total CUDA reports (e.g. --card 4090=24564MiB), or a card measured on real hardware, H100 (80GB HBM3: 81,080 MiB) or H200 (143,160 MiB); repeatable, added to the defaults.
        default_cards: Include the nominal 24, 32, 48, 80, 96 and 141 GB cards (read as GiB; a real card gives JAX about 1 % less, see --card H100); --no-default-cards plans only the --card ones.
        devices: Device counts to plan for (default 1 2 4; with --script, 1, 2, 4 and 8 up to the GPUs here, or 1 when every card is a --gpu model).
        fsdp: FSDP sizes to plan for each device count (those that divide it); default 1 and the count itself (with --script: the command's own --fsdp-flag value, left as it is).
        fsdp_min_size: Arrays smaller than this stay replicated under FSDP (examples and entries).
        fsdp_flag: With --script and --fsdp: the script's FSDP-size flag, set to each size (openpi's --fsdp-devices).
        batch_size: Also find, per cell, the smallest fraction of the card under which this global batch fits.
        json: Also write the table as JSON to this file.
        markdown: Also write a hardware-requirements page (Markdown) to this file: per card, whether it fits, the largest batch, the breakdown, what to change to fit, and how it was made.
        quiet: No progress lines.
        gpus: A GPU model to plan for without it (jaxfit gpus list), repeatable: its cells are compiled deviceless, on this machine's CPU, and are estimates (untuned; the safe batch, and how far XLA's rematerialisation might go beyond it). With --gpu or --gpu-spec the nominal cards are left out unless --card names some. With --script, each such cell is `jaxfit fit --script --gpu MODEL`'s answer: the script runs on the CPU up to its first step once per device count, and its probe compiles for each model and memory size in turn. Needs jax's CUDA plugin (pip install "jaxfit[targets]"; with --script, in the script's environment too).
        gpu_specs: A card's target config file to plan for, as --gpu (jaxfit gpus capture writes one on the card); repeatable.
    """
    parsed()
    from jaxfit.examples import parse_overrides
    from jaxfit.files import check_writable, write_json, write_text
    from jaxfit.fit.mesh import meshes_for
    from jaxfit.fit.sources import Source, entry_source, example_source
    from jaxfit.plan.whatif import DEFAULT_CARDS, parse_card, what_if

    if sum(bool(x) for x in (example, entry, script)) > 1:
        raise JaxfitError("give one of --example, --entry or --script")
    if COMMAND and not script:
        raise JaxfitError("a command after -- needs --script")
    if (entry or script) and overrides:
        raise JaxfitError("--set applies to built-in examples only; configure an --entry or a script in its own code")
    if options.device_memory_bytes is not None:
        raise JaxfitError("--device-memory is set per card by plan; give cards with --card NAME=SIZE")
    if batch_size is not None:
        from jaxfit.fit.options import check_batch_number

        check_batch_number(batch_size, "--batch-size")
    for path, flag in ((json, "--json"), (markdown, "--markdown")):
        if path:
            check_writable(path, flag)
    from jaxfit.fit import targets

    models = [targets.target_for(targets.find_model(g)) for g in gpus] + [targets.read_spec(f) for f in gpu_specs]
    nominal = list(DEFAULT_CARDS) if default_cards and not models else []
    chosen: list[Card] = (
        nominal
        + [parse_card(c) for c in cards]
        + [Card(m.key if m.key in {t.key for t in targets.MODELS} else m.name, m.memory_bytes, m) for m in models]
    )
    if not chosen:
        raise JaxfitError("no cards to plan for: give --card NAME=SIZE or drop --no-default-cards")
    names = [c.name for c in chosen]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        defaults = {c.name for c in DEFAULT_CARDS} if default_cards else set()
        if repeated[0] in defaults:
            raise JaxfitError(
                f"--card {repeated[0]} is one of the default cards; pass --no-default-cards to plan your own "
                "cards alone, or give it another name"
            )
        raise JaxfitError(f"--card {repeated[0]} is given twice; give each card once (or name them apart)")
    options.validate()
    options.grid()
    source_for: Callable[[MeshSpec], Source]
    estimate_source_for: Callable[[MeshSpec], Source] | None = None
    if script:
        from jaxfit.plan.script import default_device_counts, script_meshes, source_for_mesh

        base = probe.source()
        if devices is None:  # GPU models alone: one device each (--devices N: N compile-only devices)
            devices = (1,) if len(models) == len(chosen) else default_device_counts()
        meshes = script_meshes(base, devices, fsdp, fsdp_flag)
        set_fsdp = fsdp is not None

        def source_for(mesh: MeshSpec) -> Source:
            return source_for_mesh(base, mesh, fsdp_flag, set_fsdp)

        def estimate_source_for(mesh: MeshSpec) -> Source:  # the start-up on the CPU, as fit --script --gpu
            return source_for_mesh(base, mesh, fsdp_flag, set_fsdp, deviceless=True)

        what = shlex.join(base.run_command)
    else:
        meshes = [
            MeshSpec(m.devices, m.fsdp, fsdp_min_size).validate()  # what_if lets its cells be mocked
            for m in meshes_for((1, 2, 4) if devices is None else devices, list(fsdp) if fsdp is not None else None)
        ]
        parsed_overrides = parse_overrides(overrides)
        name = example_name(example)
        example_source(name, parsed_overrides)  # a bad example or key fails now, before any compile

        def source_for(mesh: MeshSpec) -> Source:
            return entry_source(entry, mesh=mesh) if entry else example_source(name, parsed_overrides, mesh)

        what = f"--entry {entry}" if entry else f"--example {name}"

    err = Console(stderr=True)

    def progress(cell: Cell, index: int, total: int) -> None:
        if quiet:
            return
        answer = (
            f"batch {cell.batch_size}, peak {format_bytes(cell.peak_bytes)}"
            if cell.batch_size is not None
            else STATUS_TEXT[cell.status]
        )
        if cell.fraction is not None:
            answer += f"; batch {cell.fraction_batch} needs fraction {cell.fraction:g}"
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
    result = what_if(
        source_for,
        chosen,
        meshes,
        options,
        progress,
        fit_progress,
        batch_size=batch_size,
        estimate_source_for=estimate_source_for,
    )
    if not result.computed:
        reasons = sorted({c.note for c in result.cells})
        raise JaxfitError(f"no cell of the plan can be computed here: {reasons[0]}")
    Console().print(plan_table(result))
    notes = sorted({c.note for c in result.cells if c.status in ("does not fit", "not available")})
    for note in notes:
        Console().print(f"[dim]- {note}[/]", highlight=False)
    for cell in result.cells:  # each estimate: its safe batch, how far squeezing might go, never a pin
        if cell.status == "estimate":
            Console().print(
                f"[dim]- (est.) {cell.card} x {cell.devices} (safe {cell.batch_size}, squeezed "
                f"{cell.squeezed_batch_size}): {cell.note}[/]",
                highlight=False,
            )
    # written after the table is shown: a file that cannot be written loses nothing
    if json:
        write_json(json, result.to_dict())
    if markdown:
        from jaxfit.plan.markdown import requirements_page

        page = requirements_page(result, what=what, command=["jaxfit", *sys.argv[1:]])
        write_text(markdown, page, flag="--markdown")


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
