"""The what-if table: one fit per card x mesh (:func:`what_if`)."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from jaxfit.errors import ConfigError, DoesNotFitError
from jaxfit.fit import budget as budget_mod
from jaxfit.fit.batch import fit_batch
from jaxfit.fit.breakdown import Component, by_category
from jaxfit.fit.children import shared_target_probe
from jaxfit.fit.fraction import fit_fraction
from jaxfit.fit.guides import shared_untuned_curves
from jaxfit.fit.mesh import MeshSpec
from jaxfit.fit.options import FitOptions
from jaxfit.fit.results import FitResult
from jaxfit.fit.sources import Source
from jaxfit.fit.targets import Target

GiB = 2**30
MiB = 2**20


@dataclasses.dataclass(frozen=True)
class Card:
    """A device to plan for: a name and the memory CUDA reports for it (the base of a fraction);
    ``target``: a GPU model compiled for without it (``--gpu``: the cell is a deviceless estimate)."""

    name: str
    total_bytes: int
    target: Target | None = None


DEFAULT_CARDS = tuple(Card(f"{n}GB", n * GiB) for n in (24, 32, 48, 80, 96, 141))
"""Nominal sizes, read as GiB. A real card gives JAX a little less (an H100 80GB 81,080 MiB, about
1 % less than 80 GiB; docs/guides/facts.md #16): plan a measured card by name (:data:`MEASURED_CARDS`,
``--card H100``) or give the exact size with ``--card NAME=SIZE``."""

MEASURED_CARDS: Mapping[str, Card] = {
    "H100": Card("H100", 81_080 * MiB),
    "H200": Card("H200", 143_160 * MiB),
}
"""Cards whose total CUDA hands JAX was measured (``bytes_limit / fraction``; docs/guides/facts.md #4 and
#16), usable as ``--card H100``: an H100 80GB HBM3 gives 81,080 MiB (nvidia-smi shows 81,559), an
H200 143,160 MiB (nvidia-smi 143,771). Other cards: ``--card NAME=SIZE`` with CUDA's total."""

Status = Literal["gpu", "mock", "cpu", "estimate", "does not fit", "not available"]
"""How a cell was answered: compiled on this machine's GPUs (``gpu``), for a mocked GPU topology
larger than this machine (``mock``), on CPU devices, whose compiler ignores the limit (``cpu``);
or the step does not fit even batch ``min_batch`` (``does not fit``), or the card cannot be
planned here (``not available``: larger than this GPU at the fraction)."""

STATUS_TEXT: Mapping[str, str] = {
    "gpu": "compiled on this GPU",
    "mock": "compiled for a mocked topology",
    "cpu": "compiled on CPU devices",
    "estimate": "estimated deviceless for the GPU model (untuned)",
    "does not fit": "does not fit",
    "not available": "not available here",
}


DEVICELESS_KIND = "this machine's CPU (deviceless)"
"""What compiled a plan whose first answered cell is an estimate for a GPU model, as in a plan of GPU
models alone (:attr:`PlanResult.device_kind`)."""


@dataclasses.dataclass(frozen=True)
class Cell:
    """One card and mesh.

    Attributes:
      card: The card's name.
      card_bytes: Its total memory.
      devices: Devices in the mesh.
      fsdp: The FSDP size.
      status: How it was answered (:data:`Status`).
      batch_size: The largest global batch that fits (a multiple of ``devices``), or None.
      peak_bytes: Its compiled peak per device, or None.
      budget_bytes: The per-device budget under the fraction, or None.
      parameter_bytes: Parameters and optimizer state one device holds (what FSDP divides), or None.
      outcome: ``boundary`` or ``max`` (``--max-batch`` fits; larger may too), or None.
      note: Why a cell has no answer, or the fit's message.
      seconds: Wall time of the cell's fit.
      cached: Answered from jaxfit's cache (the same question fitted before).
      breakdown: The peak at ``batch_size`` by category (parameters, optimizer state, other state,
        batch, gradients, activations and workspace), bytes per device; empty when not known.
      process_overhead_bytes: What a process holds on the GPU outside the pool (CUDA context,
        libraries), measured; None on a CPU or when not measured.
      fraction_batch: The batch the smallest fraction was asked for (``--batch-size``), or None.
      fraction: The smallest fraction (to 0.01) of the card under which ``fraction_batch``
        fits, or None (not asked, or it does not fit the whole card).
      fraction_note: Why ``fraction`` is missing when it was asked for.
      squeezed_batch_size: For an estimate: the largest batch that fits only through XLA's
        rematerialisation toward the card's limit (``batch_size`` is the safe one).
    """

    card: str
    card_bytes: int
    devices: int
    fsdp: int
    status: Status
    batch_size: int | None = None
    peak_bytes: int | None = None
    budget_bytes: int | None = None
    parameter_bytes: int | None = None
    outcome: str | None = None
    note: str = ""
    seconds: float = 0.0
    cached: bool = False
    breakdown: dict[str, int] = dataclasses.field(default_factory=dict)
    process_overhead_bytes: int | None = None
    fraction_batch: int | None = None
    fraction: float | None = None
    fraction_note: str = ""
    squeezed_batch_size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PlanResult:
    """The what-if table of one workload under one fraction.

    Attributes:
      workload: The workload's name.
      mem_fraction: The fraction every card is planned under.
      device_kind: The device the compiles ran on.
      cells: One per card x mesh, cards in the given order, meshes in the given order.
      wall_seconds: Wall time of the whole table.
      step: Which function was proven in the first computed cell (``FitResult.step``).
      jax_version: The jax version that compiled.
    """

    workload: str
    mem_fraction: float
    device_kind: str
    cells: list[Cell]
    wall_seconds: float
    step: dict[str, Any] = dataclasses.field(default_factory=dict)
    jax_version: str = ""

    @property
    def computed(self) -> list[Cell]:
        """The cells with an answer (a batch, or "does not fit")."""
        return [c for c in self.cells if c.status != "not available"]

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "cells": [c.to_dict() for c in self.cells]}


def parse_card(text: str) -> Card:
    """``NAME=SIZE`` (``L4=24GB``, ``4090=24564MiB``), or the name of a measured card (``H100``,
    :data:`MEASURED_CARDS`), as a :class:`Card`.

    Raises:
      ConfigError: neither, or a size that is not one.
    """
    name, sep, size = text.partition("=")
    if not sep and text.strip().upper() in MEASURED_CARDS:
        return MEASURED_CARDS[text.strip().upper()]
    if not sep or not name.strip() or not size.strip():
        raise ConfigError(
            f"--card {text!r} must look like NAME=SIZE, e.g. --card L4=24GB, or name a measured card "
            f"({', '.join(MEASURED_CARDS)})"
        )
    try:
        return Card(name.strip(), budget_mod.parse_size(size.strip()))
    except ConfigError as e:
        raise ConfigError(f"--card {text!r}: {e}") from None


def _state_bytes(result: FitResult) -> int | None:
    parts = [c for c in result.breakdown if c["category"] in ("parameters", "optimizer state")]
    return sum(int(c["bytes"]) for c in parts) if parts else None


def _status(result: FitResult) -> Status:
    if result.device.get("topology") == "mock":
        return "mock"
    return "gpu" if result.device.get("limit_sensitive") else "cpu"


def what_if(
    source_for: Callable[[MeshSpec], Source],
    cards: Sequence[Card],
    meshes: Sequence[MeshSpec],
    options: FitOptions = FitOptions(),
    progress: Callable[[Cell, int, int], None] | None = None,
    fit_progress: Callable[[str, Mapping[str, Any]], None] | None = None,
    *,
    batch_size: int | None = None,
    estimate_source_for: Callable[[MeshSpec], Source] | None = None,
) -> PlanResult:
    """Fit ``source_for(mesh)`` on every card of ``cards`` for every mesh of ``meshes``.

    Each cell is :func:`jaxfit.fit.fit_batch` with ``device_memory_bytes`` set to the card's size:
    on a GPU the compile runs under the limit that card would give at the fraction, on a CPU the
    analysis is compared with that budget. Cells that cannot be answered say why instead of
    ending the table. Every cell's answer is cached as it is found, so a table cut short (Ctrl-C)
    resumes where it stopped.

    Args:
      source_for: The workload source on a mesh; raising
        :class:`jaxfit.plan.script.CellUnavailable` marks the cell not available here.
      cards: The cards to plan for.
      meshes: The device counts and FSDP sizes.
      options: The fit options (fraction, headroom, bounds, cache) every cell shares.
      progress: Called with ``(cell, index, total)`` after each cell.
      fit_progress: Passed to every cell's fit (its rounds and compiles, as ``jaxfit fit`` shows them).
      batch_size: Also find, per cell, the smallest fraction of the card under which this global
        batch fits (:func:`jaxfit.fit.fit_fraction`).
      estimate_source_for: The workload source of a cell estimated for a GPU model that is not here
        (a card with a ``target``; default ``source_for``): a script's start-up then runs on host
        devices (:func:`jaxfit.plan.script.deviceless_environment`).

    Raises:
      ConfigError: no card or no mesh, bad options, or a workload that cannot be built (the first
        cell says so).
    """
    from jaxfit.plan.script import CellUnavailable

    if not cards:
        raise ConfigError("no cards to plan for: give --card NAME=SIZE or drop --no-default-cards")
    if not meshes:
        raise ConfigError("no mesh to plan: give device counts with --devices and FSDP sizes that divide them")
    start = time.perf_counter()
    fraction = options.resolved_fraction()
    cells: list[Cell] = []
    first: FitResult | None = None
    total = len(cards) * len(meshes)
    # a cell's untuned search starts from what earlier cells compiled; a script's deviceless cells share one start-up
    with shared_untuned_curves(), shared_target_probe():
        for card in cards:
            for mesh in meshes:
                cell_start = time.perf_counter()
                base = functools.partial(Cell, card.name, card.total_bytes, mesh.devices, mesh.fsdp)
                # No program is written: a cell plans a card or mesh, it is not run here.
                card_options = dataclasses.replace(options, device_memory_bytes=card.total_bytes, pin=False)
                try:
                    if card.target is not None:
                        source = (estimate_source_for or source_for)(dataclasses.replace(mesh, allow_mock=True))
                        estimated, found = _estimated(base, source, card.target, options, fit_progress)
                        first = first or found
                        cells.append(estimated)
                        if progress is not None:
                            progress(cells[-1], len(cells), total)
                        continue
                    source = source_for(dataclasses.replace(mesh, allow_mock=True))  # more devices than here: mocked
                    result = fit_batch(source, card_options, progress=fit_progress)
                except CellUnavailable as e:
                    cell = base(status="not available", note=str(e))
                except DoesNotFitError as e:
                    cell = base(status="does not fit", note=str(e))
                except ConfigError as e:
                    if "--device-memory" not in str(e):
                        raise
                    cell = base(status="not available", note=str(e))
                else:
                    first = first or result
                    cell = base(
                        status=_status(result),
                        batch_size=result.batch_size,
                        peak_bytes=result.peak_bytes,
                        budget_bytes=result.budget_bytes,
                        parameter_bytes=_state_bytes(result),
                        outcome=result.outcome,
                        note=result.message,
                        cached=result.cached,
                        breakdown=by_category([Component(**c) for c in result.breakdown]),
                        process_overhead_bytes=result.process_overhead_bytes,
                    )
                if batch_size is not None and cell.status != "not available":
                    cell = _with_fraction(cell, source, batch_size, card_options, fit_progress)
                cell = dataclasses.replace(cell, seconds=round(time.perf_counter() - cell_start, 2))
                cells.append(cell)
                if progress is not None:
                    progress(cell, len(cells), total)
    device_kind = str(first.device.get("device_kind", "")) if first else ""
    if first is not None and first.device.get("topology") == "target":  # compiled here, for the GPU model
        device_kind = DEVICELESS_KIND
    return PlanResult(
        str(first.workload.get("name", "")) if first else "",
        fraction,
        device_kind,
        cells,
        round(time.perf_counter() - start, 2),
        step=first.step if first else {},
        jax_version=str(first.device.get("jax_version", "")) if first else "",
    )


def _estimated(
    base: Callable[..., Cell],
    source: Source,
    target: Target,
    options: FitOptions,
    fit_progress: Callable[[str, Mapping[str, Any]], None] | None,
) -> tuple[Cell, FitResult | None]:
    """A cell for a GPU model compiled for without it (:func:`jaxfit.fit.estimate.fit_for_gpu`), and
    the safe fit behind it."""
    from jaxfit.fit.estimate import fit_for_gpu

    start = time.perf_counter()
    estimate = fit_for_gpu(
        source, target, dataclasses.replace(options, device_memory_bytes=None), progress=fit_progress
    )
    result, squeezed = estimate.safe, estimate.squeezed
    # answered from the cache when both searches were (a repeated plan, or one after jaxfit fit --gpu)
    answered = [r for r in (squeezed, result) if r is not None]
    cached = bool(answered) and all(r.cached for r in answered)
    if result is None:
        return base(
            status="does not fit",
            note=estimate.summary(),
            cached=cached,
            squeezed_batch_size=estimate.squeezed_batch_size,
            seconds=round(time.perf_counter() - start, 2),
        ), estimate.squeezed
    return base(
        status="estimate",
        batch_size=result.batch_size,
        peak_bytes=result.peak_bytes,
        budget_bytes=result.limit_bytes - options.headroom_bytes,
        parameter_bytes=_state_bytes(result),
        # the safe search stops at the squeezed answer: --max-batch is reached only when that one reached it
        outcome=squeezed.outcome if squeezed is not None and squeezed.batch_size == result.batch_size else "boundary",
        note=estimate.summary(),
        cached=cached,
        breakdown=by_category([Component(**c) for c in result.breakdown]),
        squeezed_batch_size=estimate.squeezed_batch_size,
        seconds=round(time.perf_counter() - start, 2),
    ), result


def _with_fraction(
    cell: Cell,
    source: Source,
    batch_size: int,
    options: FitOptions,
    fit_progress: Callable[[str, Mapping[str, Any]], None] | None,
) -> Cell:
    """``cell`` with the smallest fraction of its card for ``batch_size`` (or why there is none)."""
    if batch_size % cell.devices:
        return dataclasses.replace(
            cell,
            fraction_batch=batch_size,
            fraction_note=f"batch {batch_size} does not split over {cell.devices} devices",
        )
    try:
        found = fit_fraction(source, batch_size, options, progress=fit_progress)
    except DoesNotFitError as e:
        return dataclasses.replace(cell, fraction_batch=batch_size, fraction_note=str(e))
    return dataclasses.replace(cell, fraction_batch=batch_size, fraction=found.mem_fraction)
