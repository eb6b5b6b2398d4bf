"""Packing training runs onto GPUs by their measured memory needs (pure logic, no devices):
decreasing need, in order of start, spread over the GPUs before packing them (best fit among
equals), with runs that wait for others to end.

The design, at length: docs/guides/how-it-works.md, "Packing runs onto GPUs".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from jaxfit.errors import ConfigError
from jaxfit.fit.budget import format_bytes, fraction_for_bytes
from jaxfit.fit.devices import GPU


@dataclasses.dataclass(frozen=True)
class Need:
    """What one run needs inside its pool.

    Attributes:
      name: The run's name (unique within a plan).
      peak_bytes: The run's fitted peak (``FitResult.peak_bytes``), or None when only a fixed
        ``fraction`` is known.
      priority: Higher is placed, and started, earlier.
      fraction: A fixed memory fraction for the run; None to derive it from ``peak_bytes``.
        When both are given, the fraction sets the pool and a GPU whose pool at that fraction is
        smaller than ``peak_bytes + headroom_bytes`` is not used for the run.
      headroom_bytes: Extra bytes kept inside the pool on top of the peak.
      gpus: GPUs the run takes at once (a sharded run); ``peak_bytes`` is per GPU, and each of
        them gets the same fraction.
    """

    name: str
    peak_bytes: int | None = None
    priority: int = 0
    fraction: float | None = None
    headroom_bytes: int = 0
    gpus: int = 1

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("a packing need has an empty name; name every run")
        if self.peak_bytes is None and self.fraction is None:
            raise ConfigError(
                f"run {self.name!r} has neither a peak nor a fraction; fit it first or give it a fraction"
            )
        if self.peak_bytes is not None and self.peak_bytes <= 0:
            raise ConfigError(f"run {self.name!r}: peak_bytes={self.peak_bytes} must be positive")
        if self.fraction is not None and not (math.isfinite(self.fraction) and 0 < self.fraction <= 1):
            raise ConfigError(f"run {self.name!r}: fraction={self.fraction!r} must be in (0, 1]")
        if self.headroom_bytes < 0:
            raise ConfigError(f"run {self.name!r}: headroom_bytes={self.headroom_bytes} must be >= 0")
        if self.gpus < 1:
            raise ConfigError(f"run {self.name!r}: gpus={self.gpus} must be at least 1")

    def fraction_on(self, total_bytes: int) -> float:
        """The pool fraction on a GPU of ``total_bytes`` (may exceed 1: the run does not fit)."""
        if self.fraction is not None:
            return self.fraction
        assert self.peak_bytes is not None  # __post_init__ guarantees one of the two
        return fraction_for_bytes(self.peak_bytes + self.headroom_bytes, total_bytes)

    def pool_on(self, total_bytes: int) -> int:
        """The pool in bytes on a GPU of ``total_bytes``: the fraction's share, rounded up."""
        return math.ceil(self.fraction_on(total_bytes) * total_bytes)

    def need_on(self, total_bytes: int, overhead_bytes: int) -> int:
        """The physical memory the run takes on a GPU of ``total_bytes``: pool plus overhead."""
        return self.pool_on(total_bytes) + overhead_bytes

    def fits_pool_on(self, total_bytes: int) -> bool:
        """Whether the pool holds the run (fraction <= 1, and a fixed fraction holds the peak)."""
        if self.fraction_on(total_bytes) > 1:
            return False
        if self.fraction is not None and self.peak_bytes is not None:
            return self.pool_on(total_bytes) >= self.peak_bytes + self.headroom_bytes
        return True


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where and when one run goes.

    Attributes:
      name: The run.
      gpu: The GPU index it runs on (the first of ``gpus``).
      mem_fraction: Its ``XLA_PYTHON_CLIENT_MEM_FRACTION`` on that GPU.
      peak_bytes: Its fitted peak (None when only a fixed fraction was given).
      pool_bytes: Its allocator pool, ``mem_fraction x total`` rounded up.
      need_bytes: The physical memory it takes: pool plus the per-process overhead.
      priority: Its priority.
      start: Its position in the plan's start order (0 first).
      wave: 0 when it starts at once, else one more than the latest wave of the runs in ``after``.
      after: The runs on the same GPU(s) that must finish before it starts (empty: at once).
      gpus: Every GPU it runs on, each with ``need_bytes`` (one for most runs; ``gpus: N`` in the
        queue for a run sharded over N).
    """

    name: str
    gpu: int
    mem_fraction: float
    peak_bytes: int | None
    pool_bytes: int
    need_bytes: int
    priority: int
    start: int
    wave: int
    after: tuple[str, ...]
    gpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.gpus:
            object.__setattr__(self, "gpus", (self.gpu,))

    @property
    def immediate(self) -> bool:
        """Whether the run starts at once."""
        return not self.after

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        data = dataclasses.asdict(self)
        data["after"] = list(self.after)
        data["gpus"] = list(self.gpus)
        return data


@dataclasses.dataclass(frozen=True)
class GpuPlan:
    """What the plan puts on one GPU.

    Attributes:
      index: The GPU index.
      total_bytes: Its total memory.
      capacity_bytes: ``total - reserve``: what runs live together on it may take.
      initial_bytes: The needs of the runs that start on it at once.
      planned_bytes: The most the plan has live on it at any one time (<= capacity).
      runs: The names of its runs, in start order.
    """

    index: int
    total_bytes: int
    capacity_bytes: int
    initial_bytes: int
    planned_bytes: int
    runs: tuple[str, ...]

    @property
    def free_bytes(self) -> int:
        """Capacity left at the plan's fullest moment on this GPU."""
        return self.capacity_bytes - self.planned_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        data = dataclasses.asdict(self)
        data["runs"] = list(self.runs)
        data["free_bytes"] = self.free_bytes
        return data


ROW_HEADERS: tuple[str, ...] = (
    "start",
    "experiment",
    "gpu",
    "fraction",
    "peak",
    "need",
    "priority",
    "after",
)
"""Column names of :meth:`Plan.rows`."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """The packing of runs onto GPUs.

    Attributes:
      placements: One per run, in start order.
      gpus: One per GPU given, in the order given.
      reserve_bytes: Memory kept free on every GPU.
      overhead_bytes: Per-process memory outside the pool, counted for every run.
    """

    placements: tuple[Placement, ...]
    gpus: tuple[GpuPlan, ...]
    reserve_bytes: int
    overhead_bytes: int

    def placement(self, name: str) -> Placement:
        """The placement of the run ``name`` (KeyError if none)."""
        for placement in self.placements:
            if placement.name == name:
                return placement
        raise KeyError(name)

    def gpus_of(self) -> dict[str, tuple[int, ...]]:
        """Every GPU of each run (one for most; ``gpus: N`` runs take N)."""
        return {p.name: p.gpus for p in self.placements}

    def gpu(self, index: int) -> GpuPlan:
        """The plan of GPU ``index`` (KeyError if none)."""
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(index)

    @property
    def waves(self) -> int:
        """How many waves the plan has (1: everything starts at once)."""
        return 1 + max((p.wave for p in self.placements), default=0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data: the placements, the GPUs, the reserve and the overhead."""
        return {
            "reserve_bytes": self.reserve_bytes,
            "overhead_bytes": self.overhead_bytes,
            "waves": self.waves,
            "placements": [p.to_dict() for p in self.placements],
            "gpus": [g.to_dict() for g in self.gpus],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """Inverse of :meth:`to_dict` (a stored plan read back).

        Raises:
          KeyError, TypeError, ValueError: not such data.
        """
        placements = tuple(
            Placement(**{**p, "after": tuple(p["after"]), "gpus": tuple(p.get("gpus") or (p["gpu"],))})
            for p in data["placements"]
        )
        gpus = tuple(
            GpuPlan(**{k: v for k, v in g.items() if k != "free_bytes"} | {"runs": tuple(g["runs"])})
            for g in data["gpus"]
        )
        return cls(placements, gpus, int(data["reserve_bytes"]), int(data["overhead_bytes"]))

    def rows(self) -> list[tuple[str, ...]]:
        """One row of strings per run, in start order, under :data:`ROW_HEADERS`."""
        return [
            (
                str(p.start),
                p.name,
                ",".join(map(str, p.gpus)),
                f"{p.mem_fraction:.2f}",
                format_bytes(p.peak_bytes),
                format_bytes(p.need_bytes),
                str(p.priority),
                "now" if p.immediate else "after " + ", ".join(p.after),
            )
            for p in self.placements
        ]


@dataclasses.dataclass
class _GpuState:
    """A GPU during planning: its live runs (start order) and the runs that finished."""

    gpu: GPU
    capacity: int
    live: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    finished: list[str] = dataclasses.field(default_factory=list)
    planned: int = 0
    initial: int = 0

    def used(self) -> int:
        return sum(need for _, need in self.live)

    def releases_needed(self, need: int) -> int | None:
        """How many of the oldest live runs must finish before ``need`` fits (None: never)."""
        if need > self.capacity:
            return None
        used = self.used()
        for k, (_, run_need) in enumerate(self.live):
            if used + need <= self.capacity:
                return k
            used -= run_need
        return len(self.live)


def _check_inputs(needs: Sequence[Need], gpus: Sequence[GPU], reserve_bytes: int, overhead_bytes: int) -> None:
    """Reject empty, duplicate or negative inputs with one-line messages."""
    if not gpus:
        raise ConfigError("no GPU to plan on; give at least one GPU (or set device_memory)")
    indices = [g.index for g in gpus]
    if len(set(indices)) != len(indices):
        raise ConfigError(f"GPU indices {indices} repeat; list each GPU once")
    for g in gpus:
        if g.total_bytes <= 0:
            raise ConfigError(f"GPU {g.index} has total memory {g.total_bytes}; it must be positive")
    if reserve_bytes < 0 or overhead_bytes < 0:
        raise ConfigError(f"reserve ({reserve_bytes}) and process overhead ({overhead_bytes}) must be >= 0 bytes")
    names = [n.name for n in needs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"run {duplicates[0]!r} appears twice; give each run its own name")


def _holds_alone(state: _GpuState, need: Need, overhead_bytes: int) -> bool:
    """Whether the GPU of ``state`` holds ``need`` with nothing else on it."""
    total = state.gpu.total_bytes
    return need.fits_pool_on(total) and need.need_on(total, overhead_bytes) <= state.capacity


def _reject_if_too_big(need: Need, states: Sequence[_GpuState], overhead_bytes: int) -> None:
    """Raise a one-line ``ConfigError`` when ``need`` fits no GPU even alone (or, for a run on
    several GPUs, fewer GPUs than it takes)."""
    if need.gpus > len(states):
        raise ConfigError(
            f"run {need.name!r} takes {need.gpus} GPUs but the plan has {len(states)}; "
            f"plan on {need.gpus} or more GPUs (gpus: in the queue, --gpus) or lower its gpus"
        )
    holding = sum(1 for state in states if _holds_alone(state, need, overhead_bytes))
    if holding >= need.gpus:
        return
    if holding:
        raise ConfigError(
            f"run {need.name!r} takes {need.gpus} GPUs but only {holding} of the plan's GPUs can hold "
            f"its share; lower its batch or fraction, lower the reserve, or use larger GPUs"
        )
    largest = max(states, key=lambda s: (s.capacity, s.gpu.total_bytes))
    total = largest.gpu.total_bytes
    reserve = total - largest.capacity
    offers = (
        f"the largest GPU offers {format_bytes(max(largest.capacity, 0))} "
        f"(GPU {largest.gpu.index}: {format_bytes(total)}"
        + (f" less a {format_bytes(reserve)} reserve)" if reserve else ")")
    )
    overhead = f"{format_bytes(overhead_bytes)} per-process overhead"
    fraction = need.fraction_on(total)
    peak = ""
    if need.peak_bytes is not None:
        peak = (
            format_bytes(need.peak_bytes)
            + " peak"
            + (f" + {format_bytes(need.headroom_bytes)} headroom" if need.headroom_bytes else "")
        )
    if fraction <= 1 and not need.fits_pool_on(total):  # a fixed fraction below the peak
        raise ConfigError(
            f"run {need.name!r}: fraction {fraction:.2f} gives a {format_bytes(need.pool_on(total))} "
            f"pool on the largest GPU, less than its {peak}; raise its fraction or use fraction: auto"
        )
    if fraction <= 1:
        needed = need.need_on(total, overhead_bytes)
        what = f"fraction {fraction:.2f} of {format_bytes(total)}"
        detail = f"{what} for a {peak} + {overhead}" if need.fraction is None else f"{what} + {overhead}"
    else:  # the peak alone is more than the whole GPU
        assert need.peak_bytes is not None
        needed = need.peak_bytes + need.headroom_bytes + overhead_bytes
        detail = f"{peak} + {overhead}"
    raise ConfigError(
        f"run {need.name!r} needs {format_bytes(needed)} ({detail}) but {offers}; "
        "lower its batch or fraction, lower the reserve, or use a larger GPU"
    )


def _choose_gpus(need: Need, states: Sequence[_GpuState], overhead_bytes: int) -> list[tuple[_GpuState, int, int]]:
    """Where ``need`` goes: ``need.gpus`` of ``(gpu state, oldest live runs that must finish
    first, its need there)``.

    The GPUs where it waits for the fewest runs in all (those already planned to finish there plus
    the ones it needs freed), then those where it shares the GPU with the fewest runs (runs side
    by side share its compute: four runs packed onto one GPU of a node while the other idled took
    1.5x the lower bound on four H100s, benchmarks/JOURNAL.md section 14), then those it leaves
    with the least capacity (best fit), then the first given.
    """
    options: list[tuple[tuple[int, int, int, int], _GpuState, int, int]] = []
    for position, state in enumerate(states):
        total = state.gpu.total_bytes
        if not need.fits_pool_on(total):
            continue
        bytes_needed = need.need_on(total, overhead_bytes)
        releases = state.releases_needed(bytes_needed)
        if releases is None:
            continue
        still_live = state.used() - sum(n for _, n in state.live[:releases])
        sharing = len(state.live) - releases  # runs it would share the GPU's compute with
        key = (len(state.finished) + releases, sharing, state.capacity - still_live - bytes_needed, position)
        options.append((key, state, releases, bytes_needed))
    options.sort(key=lambda option: option[0])
    assert len(options) >= need.gpus  # _reject_if_too_big made sure enough GPUs hold it alone
    chosen = options[: need.gpus]
    return [
        (state, releases, bytes_needed) for _, state, releases, bytes_needed in sorted(chosen, key=lambda o: o[0][2])
    ]


def plan(needs: Sequence[Need], gpus: Sequence[GPU], reserve_bytes: int = 0, overhead_bytes: int = 0) -> Plan:
    """Pack ``needs`` onto ``gpus`` (decreasing need in waves; the module docstring has the policy).

    Args:
      needs: One per run (unique names). Input order breaks ties of priority and need.
      gpus: The GPUs to use (unique indices; sizes may differ).
      reserve_bytes: Memory kept free on every GPU.
      overhead_bytes: Memory each process holds outside its pool (CUDA context; ~618 MiB).

    Returns:
      The plan: placements in start order, and per GPU what it holds.

    Raises:
      ConfigError: bad inputs, or a run that fits no GPU even alone (one line: what it needs
        and what the largest GPU offers).
    """
    _check_inputs(needs, gpus, reserve_bytes, overhead_bytes)
    states = [_GpuState(gpu=g, capacity=g.total_bytes - reserve_bytes) for g in gpus]
    for need in needs:
        _reject_if_too_big(need, states, overhead_bytes)

    largest_total = max(g.total_bytes for g in gpus)
    order = sorted(
        range(len(needs)),
        key=lambda i: (-needs[i].priority, -needs[i].need_on(largest_total, overhead_bytes), i),
    )
    waves: dict[str, int] = {}
    placements: list[Placement] = []
    for start, i in enumerate(order):
        need = needs[i]
        chosen = _choose_gpus(need, states, overhead_bytes)
        after_names: list[str] = []
        for state, releases, bytes_needed in chosen:
            state.finished.extend(name for name, _ in state.live[:releases])
            del state.live[:releases]
            state.live.append((need.name, bytes_needed))
            state.planned = max(state.planned, state.used())
            after_names += [name for name in state.finished if name not in after_names]
        after = tuple(after_names)
        if not after:
            for state, _, bytes_needed in chosen:
                state.initial += bytes_needed
        waves[need.name] = 1 + max(waves[name] for name in after) if after else 0
        # One fraction on every GPU of the run: the largest any of them needs (equal totals: the same).
        first, _, _ = chosen[0]
        largest = max(chosen, key=lambda c: (need.fraction_on(c[0].gpu.total_bytes), c[2]))
        total = largest[0].gpu.total_bytes
        placements.append(
            Placement(
                name=need.name,
                gpu=first.gpu.index,
                mem_fraction=need.fraction_on(total),
                peak_bytes=need.peak_bytes,
                pool_bytes=need.pool_on(total),
                need_bytes=largest[2],
                priority=need.priority,
                start=start,
                wave=waves[need.name],
                after=after,
                gpus=tuple(state.gpu.index for state, _, _ in chosen),
            )
        )

    gpu_plans = tuple(
        GpuPlan(
            index=s.gpu.index,
            total_bytes=s.gpu.total_bytes,
            capacity_bytes=s.capacity,
            initial_bytes=s.initial,
            planned_bytes=s.planned,
            runs=tuple(p.name for p in placements if s.gpu.index in p.gpus),
        )
        for s in states
    )
    return Plan(
        placements=tuple(placements), gpus=gpu_plans, reserve_bytes=reserve_bytes, overhead_bytes=overhead_bytes
    )
