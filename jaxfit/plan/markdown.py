"""``jaxfit plan --markdown``: a hardware-requirements page a project can commit.

Per card: whether the train step fits, the largest batch at the fraction, the peak and what it is
made of, and what to change when it does not fit, each line from the plan's own compiles; with the
provenance (jaxfit and jax versions, the device that compiled, the date, the command).
"""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Sequence

from jaxfit.fit.budget import format_bytes
from jaxfit.fit.estimate import AUTOTUNE_MARGIN
from jaxfit.plan.whatif import Cell, PlanResult
from jaxfit.versions import jaxfit_version

BREAKDOWN_ORDER = (
    "parameters",
    "optimizer state",
    "other state",
    "gradients",
    "activations and workspace",
    "batch",
)


def mesh_label(cell: Cell) -> str:
    """``1 device``, ``4 devices, FSDP 2``."""
    devices = f"{cell.devices} device{'s' if cell.devices > 1 else ''}"
    return devices + (f", FSDP {cell.fsdp}" if cell.fsdp > 1 else "")


def _answer(cell: Cell) -> str:
    if cell.batch_size is not None:
        more = "+" if cell.outcome == "max" else ""
        return f"**{cell.batch_size}{more}** ({format_bytes(cell.peak_bytes)})"
    return "does not fit" if cell.status == "does not fit" else "not computed here"


def _state_of_mesh(result: PlanResult, cell: Cell) -> dict[str, int]:
    """The batch-independent part (parameters, optimizer and other state) of ``cell``'s mesh, from
    any computed cell of the same mesh (a cell that does not fit has none of its own)."""
    for other in result.cells:
        if (other.devices, other.fsdp) == (cell.devices, cell.fsdp) and other.breakdown:
            return {k: v for k, v in other.breakdown.items() if k in ("parameters", "optimizer state", "other state")}
    return {}


def advice(result: PlanResult, cell: Cell) -> list[str]:
    """What to change to fit ``cell``'s card, from the plan's own numbers (nothing guessed beyond
    what each line says)."""
    out: list[str] = []
    if cell.status == "does not fit":
        fitting = [
            c
            for c in result.cells
            if c.card == cell.card and c.batch_size is not None and (c.devices, c.fsdp) != (cell.devices, cell.fsdp)
        ]
        for c in fitting:
            out.append(f"on {mesh_label(c)} it fits: batch {c.batch_size} ({format_bytes(c.peak_bytes)} per device)")
        state = _state_of_mesh(result, cell)
        held = sum(state.values())
        budget = int(cell.card_bytes * result.mem_fraction)
        if held and held >= budget:
            shards = math.ceil(held / max(1, budget))
            out.append(
                f"the state alone is {format_bytes(held)} per device, over the {format_bytes(budget)} this card gives "
                f"at {result.mem_fraction:g}: shard it (FSDP over at least {shards} devices) or train fewer "
                "parameters (LoRA: optimizer state and gradients only for the adapters)"
            )
        elif held:
            out.append(
                f"the state is {format_bytes(held)} per device of {format_bytes(budget)}: the rest of batch 1's peak is "
                "gradients and activations; recompute activations (remat), train fewer parameters (LoRA), "
                "or shard the state (FSDP)"
            )
        out.append(f"why: {cell.note}")
        return out
    if cell.batch_size is not None and cell.breakdown:
        activations = cell.breakdown.get("activations and workspace", 0)
        if activations > (cell.peak_bytes or 0) / 2:
            out.append(
                "activations and workspace are most of the peak: remat raises the batch; a larger global batch "
                f"runs as micro-batches of {cell.batch_size} with gradient accumulation (jaxfit run --global-batch N)"
            )
        else:
            out.append(
                "the state is most of the peak: FSDP over more devices or LoRA frees the most; a larger global batch "
                f"runs as micro-batches of {cell.batch_size} (jaxfit run --global-batch N)"
            )
    return out


def _platform_note(result: PlanResult) -> list[str]:
    """A warning when cells were not compiled for a real GPU of the card's kind."""
    statuses = {c.status for c in result.cells}
    out = []
    if "cpu" in statuses:
        out.append(
            "**Compiled for CPU devices**: the CPU compiler ignores the memory limit and its programs differ "
            "from a GPU's, so these cells compare the CPU's analysis with each card's budget. Plan on a GPU "
            "for numbers to rely on."
        )
    if "mock" in statuses:
        out.append("Cells marked for more GPUs than the machine had were compiled for a mocked topology (never run).")
    if "estimate" in statuses:
        squeezed = [
            c for c in result.cells if c.status == "estimate" and (c.squeezed_batch_size or 0) > (c.batch_size or 0)
        ]
        out.append(
            "**Estimates for GPU models that were not here** (marked est.): compiled deviceless for each model's "
            "target config, on a CPU. Deviceless programs are untuned, so the batch shown is the safe one: its plain "
            f"program fits the budget with a {AUTOTUNE_MARGIN:.0%} margin for what autotuning adds."
            + (
                " Larger batches fit only through XLA's rematerialisation toward the card's limit ("
                + ", ".join(f"{c.card} x {c.devices}: up to {c.squeezed_batch_size}" for c in squeezed)
                + "), which the card's own autotuned compile may not manage."
                if squeezed
                else ""
            )
            + " A proof, and a pinned program, come from `jaxfit fit` on the card itself."
        )
    return [*out, ""] if out else []


def _nominal_note(result: PlanResult) -> list[str]:
    """A warning when a card is planned at its nominal size: a real card gives JAX less."""
    from jaxfit.plan.whatif import DEFAULT_CARDS, MEASURED_CARDS

    nominal = {c.name for c in DEFAULT_CARDS}
    named = sorted({c.card for c in result.cells if c.card in nominal}, key=lambda n: int(n[:-2]))
    if not named:
        return []
    h100 = MEASURED_CARDS["H100"].total_bytes
    short = int(((80 << 30) - h100) * result.mem_fraction)
    return [
        f"**Nominal sizes** ({', '.join(named)}): a real card gives JAX less than its name says. An H100 80GB "
        f"gives {format_bytes(h100)}, so at fraction {result.mem_fraction:g} its pool is {format_bytes(short)} "
        "smaller than the 80GB column's, and an answer with less headroom than that does not fit the real "
        "card. jaxfit fits your own card itself (`jaxfit run` without `--device-memory`); plan `--card H100` "
        "(measured) or `--card NAME=SIZE` with what your card gives JAX.",
        "",
    ]


def _breakdown_rows(cell: Cell) -> list[str]:
    rows = [
        f"| {name}{' (estimate)' if name in ('gradients', 'activations and workspace') else ''} | "
        f"{format_bytes(cell.breakdown[name])} |"
        for name in BREAKDOWN_ORDER
        if name in cell.breakdown
    ]
    rows.append(f"| **peak (compiled)** | **{format_bytes(cell.peak_bytes)}** of {format_bytes(cell.budget_bytes)} |")
    if cell.process_overhead_bytes:
        rows.append(
            f"| outside the pool (CUDA context, libraries; measured) | {format_bytes(cell.process_overhead_bytes)} |"
        )
    return rows


def requirements_page(result: PlanResult, *, what: str, command: Sequence[str], when: float | None = None) -> str:
    """The page: a table of cards x meshes, then each card in turn, then how to reproduce it."""
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(time.time() if when is None else when))
    step = result.step.get("name") or "?"
    chosen = result.step.get("chosen") or "?"
    lines = [
        f"# Hardware requirements: `{what}`",
        "",
        f"Made by jaxfit {jaxfit_version()} with jax {result.jax_version or '?'} on {result.device_kind or '?'}, "
        f"{stamp}, by `{shlex.join(command)}`. Every number is XLA's compiled memory analysis of the train step "
        f"`{step}` ({chosen}), per device, under the limit each card gives at "
        f"XLA_PYTHON_CLIENT_MEM_FRACTION={result.mem_fraction:g}; nothing was run. Cards are read as GiB.",
        "",
        *_nominal_note(result),
        *_platform_note(result),
        f"## Largest batch per card (fraction {result.mem_fraction:g})",
        "",
    ]
    cards: list[Cell] = []
    meshes: list[Cell] = []
    for cell in result.cells:
        if all(c.card != cell.card for c in cards):
            cards.append(cell)
        if all((c.devices, c.fsdp) != (cell.devices, cell.fsdp) for c in meshes):
            meshes.append(cell)
    lines.append("| card | " + " | ".join(mesh_label(m) for m in meshes) + " |")
    lines.append("| --- |" + " ---: |" * len(meshes))
    by_key = {(c.card, c.devices, c.fsdp): c for c in result.cells}
    for card in cards:
        row = [_answer(c) if (c := by_key.get((card.card, m.devices, m.fsdp))) else "-" for m in meshes]
        lines.append(f"| {card.card} ({format_bytes(card.card_bytes)}) | " + " | ".join(row) + " |")
    lines += ["", "Batch is the global batch (split over the devices); `+`: the largest batch tried fits.", ""]
    asked = [c for c in result.cells if c.fraction_batch is not None]
    if asked:
        batch = asked[0].fraction_batch
        lines += [f"## Smallest fraction for batch {batch}", ""]
        lines.append("| card | " + " | ".join(mesh_label(m) for m in meshes) + " |")
        lines.append("| --- |" + " ---: |" * len(meshes))
        for card in cards:
            row = []
            for m in meshes:
                c = by_key.get((card.card, m.devices, m.fsdp))
                if c is None or (c.fraction is None and not c.fraction_note):
                    row.append("-")
                else:
                    row.append(f"{c.fraction:g}" if c.fraction is not None else "does not fit")
            lines.append(f"| {card.card} | " + " | ".join(row) + " |")
        lines.append("")
    lines += ["## Card by card", ""]
    for card in cards:
        for m in meshes:
            found = by_key.get((card.card, m.devices, m.fsdp))
            if found is None:  # a table given only some cells
                continue
            cell = found
            if cell.status == "not available":
                lines += [f"### {card.card}, {mesh_label(cell)}: not computed here", "", f"{cell.note}", ""]
                continue
            head = (
                f"fits batch {cell.batch_size}{'+' if cell.outcome == 'max' else ''}"
                if cell.batch_size is not None
                else "does not fit"
            )
            lines += [f"### {card.card}, {mesh_label(cell)}: {head}", ""]
            if cell.batch_size is not None and cell.breakdown:
                lines += ["| part of the peak (per device) | bytes |", "| --- | ---: |", *_breakdown_rows(cell), ""]
            lines += [f"- {line}" for line in advice(result, cell)]
            lines.append("")
    lines += [
        "## Reproduce",
        "",
        "```",
        shlex.join(command),
        "```",
        "",
        "Each cell is cached when found (`~/.cache/jaxfit`); a card larger than the GPU that compiles "
        "cannot be planned on it. Gradients are estimated as one copy of the parameters; the rest of the "
        "peak beyond the arguments is activations and workspace (exact as a total).",
        "",
    ]
    return "\n".join(lines)
