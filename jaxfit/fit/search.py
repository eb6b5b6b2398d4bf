"""Boundary search over compile answers: pure logic, no JAX.

The question "which batches fit?" is asked in *rounds*: each round is a set of batch sizes whose
compiles run concurrently, and a round costs about as much wall time as one compile. So the search
minimises rounds, not compiles. It works on the *excess* of each point, ``peak(x) - budget``
(fits when ``<= 0``), which grows with ``x``; it finds the largest grid point whose excess is
``<= 0`` and proves it by also knowing the next grid point's excess is ``> 0``.

Strategy: probe the small end to learn a slope, predict the boundary by interpolation, then
compile the predicted point *and its neighbour* (one round settles an exact prediction) together
with points that bracket it (a wrong prediction still halves or better the interval). The peak is
not affine near the limit (XLA squeezes the step toward it, docs/guides/facts.md #2), so a prediction only
seeds the search; the answer always comes from compiles on both sides of the boundary.

On a GPU there are two oracles: untuned compiles (cheap, and they overlap) and autotuned ones (the
program that will run; autotuning does not overlap). :func:`search` runs on the cheap one, told to
stop with a few points left in question (``leave_open``, :func:`left_open`), and :func:`prove`
settles the boundary on the expensive one, two points per round, starting where the cheap curve
crosses the budget.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, overload

from jaxfit.errors import ConfigError, ErraticCurveError

Outcome = Literal["boundary", "max", "none", "open"]


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
            raise ConfigError(f"--min-batch ({self.low}) is larger than --max-batch ({self.high}); swap or widen them")
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

    def between(self, lo: int, hi: int) -> range:
        """Grid points strictly between ``lo`` and ``hi``, as a ``range``: nothing is listed, so a grid
        of 10^20 points costs what one of ten does."""
        start = self.up(lo + 1) if lo >= self.first else self.first
        if start <= lo:  # ``up`` clamps to the grid's last point
            start += self.step
        return range(start, max(start, hi), self.step)


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


class Unknown(Sequence[int]):
    """The points of ``points`` (a ``range``) less those in ``skip``, in order, without listing them:
    the length and the i-th point are computed from the few skipped ones."""

    def __init__(self, points: range, skip: Iterable[int]) -> None:
        self.points = points
        self.skip = sorted({x for x in skip if x in points})

    def __len__(self) -> int:
        return len(self.points) - len(self.skip)

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...

    def __getitem__(self, i: int | slice) -> int | Sequence[int]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        index = i
        for x in self.skip:  # ascending: each skipped point at or before the candidate shifts it on
            if self.points.index(x) <= index:
                index += 1
            else:
                break
        return self.points[index]


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
    each end; a plateau that ends in a cliff (docs/guides/facts.md #2) fails this, and the round then spends
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
    interior = Unknown(grid.between(lo, hi), known)
    if len(interior) <= width:
        return list(interior)

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
        if guess in known:
            # Predicted between the largest fit and the next point up: the round starts there, so
            # that an exact prediction (either of the next two failing) still settles in it.
            guess += grid.step
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
        inner = Unknown(grid.between(lo, hi), [*known, *chosen])
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
      outcome: ``boundary`` (proved by both neighbours), ``max`` (the top of the grid fits),
        ``none`` (the bottom of the grid does not fit) or ``open`` (the search was told to stop
        with a few points left between the largest fit, ``answer``, and the smallest failure).
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
    leave_open: int = 0,
) -> SearchResult:
    """Find the largest grid point whose excess is ``<= 0``.

    Args:
      evaluate: Answers one round: points -> excess for each point (``peak - budget``).
      grid: The admissible points.
      width: Points per round (concurrent compiles).
      known: Points already evaluated (e.g. from a cache), which cost no round.
      max_rounds: A guard against a non-monotone oracle that never settles.
      leave_open: Stop (outcome ``open``) once at most this many points lie between a fit and a
        failure: for a cheap search whose answer another oracle will prove anyway.

    Returns:
      The answer with its proof and cost.
    """
    known = dict(known or {})
    rounds = evaluations = 0
    while (points := next_round(grid, known, width)) and rounds < max_rounds:
        b = Bracket.of(known)
        if b.lo is not None and b.hi is not None and len(grid.between(b.lo, b.hi)) <= leave_open:
            return SearchResult(b.lo, "open", rounds, evaluations, known)
        answers = evaluate(points)
        rounds += 1
        evaluations += len(points)
        for x in points:
            known[x] = float(answers[x])
    outcome = settled(grid, known)
    if outcome is None:
        raise _erratic("search", max_rounds, known)
    b = Bracket.of(known)
    answer = None if outcome == "none" else b.lo
    return SearchResult(answer, outcome, rounds, evaluations, known)


def _erratic(what: str, rounds: int, known: Mapping[int, float]) -> ErraticCurveError:
    """One line for a search that did not settle: where it stood, and what to do."""
    fits = sorted(x for x, e in known.items() if e <= 0)
    fails = sorted(x for x, e in known.items() if e > 0)
    stood = (
        f"batches {', '.join(map(str, fits[-3:]))} fit and {', '.join(map(str, fails[:3]))} do not"
        if fits and fails
        else f"{len(known)} batches compiled"
    )
    return ErraticCurveError(
        f"the {what} did not settle in {rounds} rounds: the compiled peak jumps with the batch near this "
        f"limit ({stood}); fit under a larger fraction, narrow --min-batch/--max-batch, or take the untuned "
        "answer with --no-verify"
    )


def settle(
    evaluate: Callable[[list[int]], Mapping[int, float]],
    grid: Grid,
    start: int | None,
    prior: Mapping[int, float],
    slope: float | None,
    width: int = 2,
    max_rounds: int = 32,
    cheap: Mapping[int, float] | None = None,
    budget: float | None = None,
) -> SearchResult:
    """Find the boundary of an expensive curve, starting where a cheap curve put it.

    On a GPU the search runs on untuned compiles (cheap, and they run well side by side) and the
    answer is then proved on autotuned ones (each spends seconds of the whole machine on autotuning,
    so they barely overlap: measured on an H100, four at once took 50.8 s where one took 15.6 s).
    The two curves agree far from the limit and can part near it, in either direction, by a few
    batches (gpt-small: 14 fits untuned, 13 tuned) or by many (ViT-S at fraction 0.05). So this
    compiles the cheap answer and its neighbour first, and from there steps by the cheap curve's
    slope (or the secant of expensive points) towards the expensive boundary, at most ``width``
    expensive compiles per round.

    Args:
      evaluate: The expensive oracle (points -> excess).
      grid: The admissible points.
      start: The cheap search's answer; ``None`` when not even the smallest point fitted it.
      prior: Cheap points trusted as bounds (far enough from the budget that the two curves agree).
        They guide the search; the answer is always proved by expensive points on both sides.
      slope: Excess per unit of batch where the curve is affine (from the cheap curve), or ``None``.
      width: Expensive points per round.
      max_rounds: A guard against an erratic oracle.
      cheap: The whole cheap curve. When the expensive points part from it at the same batches by
        more than :data:`GAP_SHIFT` of ``budget`` (autotuned FSDP programs), the prior keeps only
        the cheap points beyond that gap (:func:`gap_prior`).
      budget: The budget the excesses are measured against (with ``cheap``).

    Returns:
      The result over the expensive points only (``known``), with the rounds spent here.
    """
    known: dict[int, float] = {}
    rounds = evaluations = 0
    cheap_curve = dict(cheap or {})
    if start is None:
        points = [grid.first]
    else:
        points = [x for x in (start, start + grid.step) if grid.first <= x <= grid.last]
    while points:
        if rounds >= max_rounds:
            raise _erratic("autotuned search", max_rounds, known)
        answers = evaluate(points)
        rounds += 1
        evaluations += len(points)
        for x in points:
            known[x] = float(answers[x])
        points = _next_settle_round(grid, known, prior, slope, width, cheap_curve, budget)
    outcome = settled(grid, known)
    assert outcome is not None
    b = Bracket.of(known)
    return SearchResult(None if outcome == "none" else b.lo, outcome, rounds, evaluations, known)


TRUST_MARGIN = 0.10
"""Cheap points this far from the budget (as a share of it) bound the expensive search: far from the
limit XLA does not squeeze, and untuned and tuned peaks agree within a few per cent."""


def trusted_prior(cheap: Mapping[int, float], budget: float, margin: float = TRUST_MARGIN) -> dict[int, float]:
    """The cheap points far enough from the budget to bound the expensive search."""
    return {x: e for x, e in cheap.items() if abs(e) >= margin * budget}


def affine_slope(cheap: Mapping[int, float], budget: float, margin: float = TRUST_MARGIN) -> float | None:
    """Excess per unit of batch where the cheap curve is still affine: the secant of the two largest
    points that fit with room to spare (XLA squeezes only near the limit), else of the two largest
    that fit at all; ``None`` with fewer than two or a slope that is not positive."""
    fits = sorted(x for x, e in cheap.items() if e <= 0)
    roomy = [x for x in fits if cheap[x] <= -margin * budget]
    pair = roomy[-2:] if len(roomy) >= 2 else fits[-2:]
    if len(pair) < 2:
        return None
    a, b = pair
    slope = (cheap[b] - cheap[a]) / (b - a)
    return slope if slope > 0 else None


def left_open(width: int, proof_width: int) -> int:
    """How many points a cheap search of ``width`` a round leaves in question for a proof of
    ``proof_width`` a round (:func:`search`'s ``leave_open``).

    At least ``proof_width - 1``, so that an exact prediction is proved in one expensive round. A
    wide round has more: its last cheap round would compile a few points (openpi's pi0 LoRA at eight
    a round: three, one round of about a minute) to place the cheap boundary exactly, where the
    expensive one differs from it by a batch or two anyway (autotuning picks other kernels); the
    proof starts instead where the cheap curve crosses the budget (:func:`prove`). Replayed on
    eight recorded openpi fits (benchmarks/search_replay.py): at eight a round 22 cheap rounds
    instead of 25 with the same 15 expensive ones; at four, 37 instead of 38, 18 expensive both.
    """
    return max(proof_width - 1, width // 4 + 1)


def prove(
    evaluate: Callable[[list[int]], Mapping[int, float]],
    grid: Grid,
    cheap: SearchResult,
    budget: float,
    width: int = 2,
) -> SearchResult:
    """Prove (or correct) a cheap search's answer on the expensive oracle: :func:`settle` seeded
    with the cheap answer (for an ``open`` one, the point where the cheap curve, interpolated
    across the points in question, crosses the budget), the cheap points far from the budget, and
    the cheap curve's slope."""
    start = cheap.answer
    if cheap.outcome == "open":
        b = Bracket.of(cheap.known)
        assert b.lo is not None and b.hi is not None
        # Where the cheap curve crosses the budget between its last fit and first failure; the
        # largest point in question when it cannot say.
        guess = predict(grid, cheap.known)
        start = b.hi - grid.step if guess is None else min(b.hi - grid.step, max(b.lo, guess))
    elif cheap.outcome == "none":
        start = None
    return settle(
        evaluate,
        grid,
        start,
        prior=trusted_prior(cheap.known, budget),
        slope=affine_slope(cheap.known, budget),
        width=width,
        cheap=cheap.known,
        budget=budget,
    )


GAP_SHIFT = 0.02
"""The share of the budget by which expensive points may differ from cheap ones at the same batches
before the prior is narrowed by the difference (:func:`gap_prior`)."""


def gap_prior(
    known: Mapping[int, float], cheap: Mapping[int, float], budget: float, margin: float = TRUST_MARGIN
) -> dict[int, float] | None:
    """The cheap points still trusted once expensive points have shown how far the two curves part.

    ``gap`` is the median of expensive minus cheap excess at the expensive points (the cheap excess
    interpolated between its neighbours where that batch was not compiled cheaply). A cheap fit is
    trusted only ``margin`` of the budget plus the gap below it (a cheap failure, plus minus the
    gap above it). Autotuned programs under FSDP need far more than untuned ones (pi0 on 80 GiB
    cards at 0.9: 5 to 12 GiB more with 2 devices, 19 GiB more with 4; benchmarks/JOURNAL.md
    sections 10 and 13): with the plain margin a cheap point 7.2 GiB under the budget vouched for a
    batch that needed 12 GiB more than the budget, and kept each round of an H100 fit of pi0 under
    FSDP-4 within a few batches of the last. None when the gap is within :data:`GAP_SHIFT`.
    """
    gaps = [known[x] - c for x in known if math.isfinite(known[x]) and (c := _cheap_at(cheap, x)) is not None]
    if not gaps:
        return None
    gap = statistics.median(gaps)
    if abs(gap) <= GAP_SHIFT * budget:
        return None
    below, above = margin * budget + max(0.0, gap), margin * budget + max(0.0, -gap)
    return {x: e for x, e in cheap.items() if e <= -below or e >= above}


def _cheap_at(cheap: Mapping[int, float], x: int) -> float | None:
    """The cheap excess at ``x``: compiled, or interpolated between the nearest finite cheap points
    on each side; ``None`` outside them."""
    if x in cheap:
        return cheap[x] if math.isfinite(cheap[x]) else None
    below = max((p for p in cheap if p < x and math.isfinite(cheap[p])), default=None)
    above = min((p for p in cheap if p > x and math.isfinite(cheap[p])), default=None)
    if below is None or above is None:
        return None
    return cheap[below] + (cheap[above] - cheap[below]) * (x - below) / (above - below)


SLOPE_STEPS = 3
"""Rounds the expensive search steps by a slope from one side before it brackets instead: a tuned
curve whose slope misleads (flat above the budget, as when autotuning adds a workspace whatever the
batch) would otherwise move the same few batches a round (an H100 fit of mlp-tiny at fraction
0.0016 stepped for 32 rounds)."""


def _next_settle_round(
    grid: Grid,
    known: Mapping[int, float],
    prior: Mapping[int, float],
    slope: float | None,
    width: int,
    cheap: Mapping[int, float] | None = None,
    budget: float | None = None,
) -> list[int]:
    """The expensive points to compile next for :func:`settle`, or ``[]`` once proved."""
    narrowed = gap_prior(known, cheap, budget) if cheap and budget else None
    if narrowed is not None:  # the two curves part: trust only cheap points beyond the gap,
        prior = narrowed  # and step by the expensive points' own secant, not the cheap slope
        slope = None
    merged = {**prior, **known}
    outcome = settled(grid, merged)
    if outcome is not None:
        b = Bracket.of(merged)
        ends: list[int | None] = (
            [grid.first] if outcome == "none" else [grid.last] if outcome == "max" else [b.lo, b.hi]
        )
        # Settled once the ends are expensive points too (then ``known`` alone settles it).
        return [x for x in ends if x is not None and x not in known]
    b = Bracket.of(merged)
    lo = b.lo if b.lo is not None else grid.first - grid.step
    hi = b.hi if b.hi is not None else grid.last + grid.step
    interior = Unknown(grid.between(lo, hi), known)
    if len(interior) <= width:
        return list(interior) or [x for x in (b.lo, b.hi) if x is not None and x not in known][:width]
    fits = sorted(x for x, e in known.items() if e <= 0 and x < hi)
    fails = sorted(x for x, e in known.items() if e > 0 and math.isfinite(e) and x > lo)
    step = _step_slope(known, fits or fails, slope)
    stepped = len(fits or fails) // max(1, width)  # rounds spent stepping from one side
    if step is None or (fits and fails) or not (fits or fails) or stepped >= SLOPE_STEPS:
        # Both sides proved by expensive points, nothing finite to step from (a compile that ran
        # out of memory), no slope to step by, or steps by it that keep missing the boundary:
        # interpolate and split.
        return next_round(grid, merged, width)
    if fails:  # only failures so far: step down from the smallest
        x0 = fails[0]
        guess = grid.down(x0 - known[x0] / step)
        guess = min(guess, x0 - grid.step)
        order = [guess, guess + grid.step, guess - grid.step]
    else:  # only fits so far: step up from the largest
        x0 = fits[-1]
        guess = grid.down(x0 - known[x0] / step)
        guess = max(guess, x0 + grid.step)
        order = [guess, guess + grid.step, guess + 2 * grid.step]
    chosen = [x for x in order if lo < x < hi and x not in known]
    return sorted(chosen[:width]) or next_round(grid, merged, width)


def _step_slope(known: Mapping[int, float], side: list[int], slope: float | None) -> float | None:
    """Excess per unit of batch to step by: the secant of two expensive points on one side of the
    boundary when it is plausible (within 4x of the cheap slope), else the cheap slope."""
    if len(side) >= 2:
        a, b = side[:2] if known[side[0]] > 0 else side[-2:]
        secant = (known[b] - known[a]) / (b - a)
        if secant > 0 and (slope is None or slope / 4 <= secant <= slope * 4):
            return secant
    return slope if slope is not None and slope > 0 else None


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
