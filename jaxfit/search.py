"""Boundary search over compile answers: pure logic, no JAX.

The question "which batches fit?" is asked in *rounds*: each round is a set of batch sizes whose
compiles run concurrently, and a round costs about as much wall time as one compile. So the search
minimises rounds, not compiles. It works on the *excess* of each point, ``peak(x) - budget``
(fits when ``<= 0``), which grows with ``x``; it finds the largest grid point whose excess is
``<= 0`` and proves it by also knowing the next grid point's excess is ``> 0``.

Strategy: probe the small end to learn a slope, predict the boundary by interpolation, then
compile the predicted point *and its neighbour* (one round settles an exact prediction) together
with points that bracket it (a wrong prediction still halves or better the interval). The peak is
not affine near the limit (XLA squeezes the step toward it, FACTS.md #2), so a prediction only
seeds the search; the answer always comes from compiles on both sides of the boundary.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Literal

from jaxfit.errors import ConfigError

Outcome = Literal["boundary", "max", "none"]


@dataclasses.dataclass(frozen=True)
class Grid:
    """The admissible points: multiples of ``step`` in ``[low, high]``."""

    low: int
    high: int
    step: int = 1

    def __post_init__(self) -> None:
        if self.step < 1:
            raise ConfigError(f"--multiple-of must be a positive integer, got {self.step}")
        if self.low > self.high:
            raise ConfigError(
                f"--min-batch ({self.low}) is larger than --max-batch ({self.high}); swap or widen them"
            )
        if self.first > self.last:
            raise ConfigError(
                f"no multiple of {self.step} lies in [{self.low}, {self.high}]; "
                "change --multiple-of or the batch bounds"
            )

    @property
    def first(self) -> int:
        """The smallest admissible point."""
        return -(-self.low // self.step) * self.step

    @property
    def last(self) -> int:
        """The largest admissible point."""
        return (self.high // self.step) * self.step

    def down(self, x: float) -> int:
        """The largest grid point ``<= x`` (clamped to the grid)."""
        return min(self.last, max(self.first, math.floor(x / self.step) * self.step))

    def up(self, x: float) -> int:
        """The smallest grid point ``>= x`` (clamped to the grid)."""
        return min(self.last, max(self.first, math.ceil(x / self.step) * self.step))

    def between(self, lo: int, hi: int) -> list[int]:
        """Grid points strictly between ``lo`` and ``hi``."""
        start = self.up(lo + 1) if lo >= self.first else self.first
        return [x for x in range(start, hi, self.step) if lo < x < hi]


@dataclasses.dataclass(frozen=True)
class Bracket:
    """What the known points say: the largest fit below the smallest failure."""

    lo: int | None  # largest known fitting point below ``hi``
    hi: int | None  # smallest known failing point

    @classmethod
    def of(cls, known: Mapping[int, float]) -> Bracket:
        """The bracket of ``known`` (point -> excess; ``<= 0`` fits)."""
        fails = [x for x, e in known.items() if e > 0]
        hi = min(fails) if fails else None
        fits = [x for x, e in known.items() if e <= 0 and (hi is None or x < hi)]
        return cls(max(fits) if fits else None, hi)


def settled(grid: Grid, known: Mapping[int, float]) -> Outcome | None:
    """The outcome if ``known`` already answers the question, else ``None``.

    ``boundary``: the answer ``lo`` fits and ``lo + step`` does not; ``max``: the largest grid
    point fits; ``none``: the smallest grid point does not fit.
    """
    b = Bracket.of(known)
    if b.hi is not None and b.hi <= grid.first:
        return "none"
    if b.lo is not None and b.hi is None and b.lo >= grid.last:
        return "max"
    if b.lo is not None and b.hi is not None and b.hi - b.lo <= grid.step:
        return "boundary"
    return None


def _interpolate(x0: int, e0: float, x1: int, e1: float) -> float | None:
    """Where the line through (x0, e0), (x1, e1) crosses zero; None if it never does ahead."""
    if x1 == x0 or not (math.isfinite(e0) and math.isfinite(e1)):
        return None
    slope = (e1 - e0) / (x1 - x0)
    if slope <= 0:
        return None
    return x0 - e0 / slope


def predict(grid: Grid, known: Mapping[int, float]) -> int | None:
    """The grid point predicted to be the last that fits, from the points nearest the boundary."""
    b = Bracket.of(known)
    finite = sorted((x, e) for x, e in known.items() if math.isfinite(e))
    if b.lo is not None and b.hi is not None and math.isfinite(known[b.hi]):
        x = _interpolate(b.lo, known[b.lo], b.hi, known[b.hi])
    else:
        # Extrapolate from the two known points nearest the boundary on the fitting side
        # (or the two smallest failures when nothing fits yet).
        side = [(x, e) for x, e in finite if (e <= 0) == (b.lo is not None)]
        if b.lo is not None:
            side = [(x, e) for x, e in side if x <= b.lo][-2:]
        else:
            side = side[:2]
        x = _interpolate(*side[0], *side[1]) if len(side) == 2 else None
    if x is None:
        return None
    return grid.down(x)


def _slope(p: tuple[int, float], q: tuple[int, float]) -> float:
    return (q[1] - p[1]) / (q[0] - p[0])


def _locally_affine(known: Mapping[int, float], b: Bracket) -> bool:
    """Whether the curve looks straight enough around the bracket to trust a prediction.

    Before any failure, the last two fitting slopes must agree within 2x. Once the
    boundary is bracketed, the chord across it must agree (within 2x) with the slopes just inside
    each end; a plateau that ends in a cliff (FACTS.md #2) fails this, and the round then spends
    its points on splitting the interval instead of on the guess's neighbour.
    """
    finite = sorted((x, e) for x, e in known.items() if math.isfinite(e))
    if b.lo is not None and b.hi is None:
        # Nothing failed yet: trust the extrapolation unless the curve is visibly flattening.
        fits = [p for p in finite if p[0] <= b.lo][-3:]
        if len(fits) < 3:
            return True
        early, late = _slope(fits[0], fits[1]), _slope(fits[1], fits[2])
        return early / 2 <= late <= early * 2
    if b.lo is None or b.hi is None or not math.isfinite(known[b.hi]):
        return False
    chord = _slope((b.lo, known[b.lo]), (b.hi, known[b.hi]))
    below = [p for p in finite if p[0] <= b.lo][-2:]
    above = [p for p in finite if p[0] >= b.hi][:2]
    for side in (below, above):
        if len(side) == 2:
            local = _slope(*side)
            if not (chord / 2 <= local <= chord * 2):
                return False
    return True


def next_round(grid: Grid, known: Mapping[int, float], width: int) -> list[int]:
    """The points to compile next (at most ``width``, at least one), or ``[]`` when settled.

    Args:
      grid: The admissible points.
      known: Point -> excess (``peak - budget``; ``inf`` when the compile itself ran out of memory).
      width: How many compiles run concurrently in one round.
    """
    if settled(grid, known) is not None:
        return []
    width = max(1, width)
    b = Bracket.of(known)
    if not known:
        # Seed: the smallest point (does anything fit at all?) and geometric steps above it.
        seeds, x = [grid.first], grid.first
        while len(seeds) < width and x < grid.last:
            x = grid.up(max(2 * x, x + grid.step))
            seeds.append(x)
        return sorted(set(seeds))

    lo = b.lo if b.lo is not None else grid.first - grid.step  # virtual point below the grid
    hi = b.hi if b.hi is not None else grid.last + grid.step  # virtual point above the grid
    interior = [x for x in grid.between(lo, hi) if x not in known]
    if len(interior) <= width:
        return interior

    guess = predict(grid, known)
    trusted = _locally_affine(known, b)
    if guess is not None and b.lo is not None and b.hi is not None and (width == 1 or not trusted):
        # An untrusted guess, or one alone in its round, must still cut the interval well:
        # keep it in the middle half.
        quarter = (b.hi - b.lo) / 4
        guess = min(grid.down(b.hi - quarter), max(grid.up(b.lo + quarter), guess))
    if guess is not None and b.lo is not None and b.hi is None and not trusted:
        # A flattening curve extrapolates far; reach no further than doubling would.
        guess = min(guess, grid.up(2 * b.lo))
    chosen: list[int] = []

    def take(x: int | None) -> None:
        if x is not None and lo < x < hi and x not in known and x not in chosen and len(chosen) < width:
            chosen.append(x)

    if guess is not None:
        take(guess)
        if trusted:
            take(guess + grid.step)  # the neighbour: an exact prediction settles in this round
    if b.hi is None:
        # No failure seen yet: reach upward geometrically from the guess (or from lo), because
        # squeezing near the limit makes the peak flatter than an affine extrapolation expects.
        base = max(guess or lo, lo, grid.first)
        factor = 1.5 if guess is not None else 2.0
        while len(chosen) < width:
            x = grid.up(base * factor)
            if x >= hi or (x in chosen and x == grid.last):
                take(grid.last)
                break
            take(x)
            factor *= 1.5
    if b.lo is None:
        take(grid.first)
    # Fill the rest by splitting the open interval evenly (a k-ary search).
    spots = width - len(chosen)
    if spots > 0:
        inner = [x for x in interior if x not in chosen]
        for i in range(1, spots + 1):
            if inner:
                take(inner[min(len(inner) - 1, (i * len(inner)) // (spots + 1))])
    if not chosen:
        chosen.append(interior[len(interior) // 2])
    return sorted(chosen)


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """The answer of :func:`search`.

    Attributes:
      answer: The largest grid point that fits (``None`` when nothing fits).
      outcome: ``boundary`` (proved by both neighbours), ``max`` (the top of the grid fits) or
        ``none`` (the bottom of the grid does not fit).
      rounds: Number of concurrent compile rounds.
      evaluations: Number of points evaluated.
      known: Every point evaluated and its excess.
    """

    answer: int | None
    outcome: Outcome
    rounds: int
    evaluations: int
    known: dict[int, float]


def search(
    evaluate: Callable[[list[int]], Mapping[int, float]],
    grid: Grid,
    width: int = 2,
    known: Mapping[int, float] | None = None,
    max_rounds: int = 64,
) -> SearchResult:
    """Find the largest grid point whose excess is ``<= 0``.

    Args:
      evaluate: Answers one round: points -> excess for each point (``peak - budget``).
      grid: The admissible points.
      width: Points per round (concurrent compiles).
      known: Points already evaluated (e.g. from a cache), which cost no round.
      max_rounds: A guard against a non-monotone oracle that never settles.

    Returns:
      The answer with its proof and cost.
    """
    known = dict(known or {})
    rounds = evaluations = 0
    while (points := next_round(grid, known, width)) and rounds < max_rounds:
        answers = evaluate(points)
        rounds += 1
        evaluations += len(points)
        for x in points:
            known[x] = float(answers[x])
    outcome = settled(grid, known)
    if outcome is None:
        raise RuntimeError(f"search did not settle in {max_rounds} rounds; the peak curve is erratic")
    b = Bracket.of(known)
    answer = None if outcome == "none" else b.lo
    return SearchResult(answer, outcome, rounds, evaluations, known)


def doubling_bisection(evaluate: Callable[[int], float], grid: Grid) -> SearchResult:
    """The trial-style baseline (Lightning's ``BatchSizeFinder``): double until failure, then bisect.

    One point per round. Used to compare round counts, and by the GPU benchmark's trial search.
    """
    known: dict[int, float] = {}
    rounds = 0

    def probe(x: int) -> bool:
        nonlocal rounds
        rounds += 1
        known[x] = float(evaluate(x))
        return known[x] <= 0

    x = grid.first
    if not probe(x):
        return SearchResult(None, "none", rounds, rounds, known)
    lo, hi = x, None
    while hi is None:
        if lo >= grid.last:
            return SearchResult(lo, "max", rounds, rounds, known)
        x = grid.up(2 * lo) if grid.up(2 * lo) > lo else lo + grid.step
        if probe(x):
            lo = x
        else:
            hi = x
    while hi - lo > grid.step:
        mid = grid.down((lo + hi) / 2)
        if mid <= lo:
            mid = lo + grid.step
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return SearchResult(lo, "boundary", rounds, rounds, known)
