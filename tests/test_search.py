"""The search against synthetic peak curves: exact boundaries, fewer rounds than doubling + bisection."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from jaxfit.errors import ConfigError
from jaxfit.search import Bracket, Grid, doubling_bisection, next_round, search, settled

MiB = 1 << 20


def squeezed(b: int) -> float:
    """FACTS.md #2: affine at small batches, a plateau as XLA squeezes toward the limit, then a cliff."""
    if b <= 8:
        return (1323 + 1834 * b) * MiB
    if b <= 13:
        return (15998 + 64 * (b - 8)) * MiB
    return (17200 + 2000 * (b - 14)) * MiB


CURVES: list[tuple[str, Callable[[int], float], float, Grid]] = [
    ("affine", lambda b: 1e9 + 37.3e6 * b, 20e9, Grid(1, 65536)),
    ("affine-multiple-of-8", lambda b: 1e9 + 37.3e6 * b, 20e9, Grid(8, 65536, 8)),
    ("squeezed-plateau", squeezed, 17180 * MiB, Grid(1, 65536)),
    ("steps", lambda b: 1e9 + 5e8 * (b // 10), 4e9, Grid(1, 65536)),
    ("quadratic", lambda b: 1e9 + 1e6 * b * b, 11e9, Grid(1, 65536)),
    ("exactly-at-budget", lambda b: 1000.0 * b, 100_000.0, Grid(1, 65536)),
    ("all-fit", lambda b: 10.0 + b, 1e12, Grid(1, 4096)),
    ("max-bound", lambda b: 1e9 + 1e6 * b, 5e9, Grid(1, 1000)),
    ("nothing-fits", lambda b: 1e12 + b, 1e9, Grid(1, 4096)),
    ("min-bound", lambda b: 1e9 + 1e6 * b, 1.2e9, Grid(100, 4096)),
]


def true_answer(f: Callable[[int], float], budget: float, grid: Grid) -> int | None:
    fitting = [b for b in range(grid.first, grid.last + 1, grid.step) if f(b) <= budget]
    return max(fitting) if fitting else None


@pytest.mark.parametrize("name,f,budget,grid", CURVES, ids=[c[0] for c in CURVES])
@pytest.mark.parametrize("width", [1, 2, 4])
def test_search_finds_exact_boundary_in_fewer_rounds(name, f, budget, grid, width):
    calls: list[list[int]] = []

    def evaluate(points):
        assert 1 <= len(points) <= width, "a round must not exceed its width"
        assert all(p % grid.step == 0 and grid.first <= p <= grid.last for p in points)
        calls.append(points)
        return {p: f(p) - budget for p in points}

    result = search(evaluate, grid, width=width)
    expected = true_answer(f, budget, grid)
    assert result.answer == expected
    assert result.rounds == len(calls)
    if result.outcome == "boundary":
        assert f(result.answer) <= budget < f(result.answer + grid.step)
        assert result.answer + grid.step in result.known, "the failing neighbour must have been compiled"
    elif result.outcome == "max":
        assert result.answer == grid.last
    else:
        assert expected is None and grid.first in result.known
    baseline = doubling_bisection(lambda b: f(b) - budget, grid)
    assert baseline.answer == expected
    if width == 1:
        # One compile per round is the baseline's own setting: never worse, far better on smooth curves.
        assert result.rounds <= baseline.rounds, (result.rounds, baseline.rounds)
    elif baseline.rounds >= 4:
        assert result.rounds < baseline.rounds, (result.rounds, baseline.rounds)


def test_squeezed_curve_settles_in_few_rounds_at_gpu_width():
    grid, budget = Grid(1, 65536), 17180 * MiB
    result = search(lambda ps: {p: squeezed(p) - budget for p in ps}, grid, width=4)
    assert result.answer == 13
    assert result.rounds <= 4  # doubling + bisection needs 8 (FACTS.md #7)
    assert doubling_bisection(lambda b: squeezed(b) - budget, grid).rounds == 8


def test_affine_curve_is_settled_by_the_prediction_round():
    grid = Grid(1, 65536)
    result = search(lambda ps: {p: 1e9 + 37.3e6 * p - 20e9 for p in ps}, grid, width=2)
    assert result.rounds == 2 and result.evaluations == 4


def test_out_of_memory_at_compile_counts_as_not_fitting():
    grid = Grid(1, 4096)
    result = search(lambda ps: {p: (math.inf if p > 300 else p - 300.0) for p in ps}, grid, width=2)
    assert result.answer == 300


def test_known_points_cost_no_round():
    grid = Grid(1, 64)
    f = lambda b: b - 20.0  # noqa: E731
    known = {b: f(b) for b in (20, 21)}
    result = search(lambda ps: pytest.fail("nothing should be compiled"), grid, width=2, known=known)
    assert result.answer == 20 and result.rounds == 0


def test_next_round_is_empty_once_settled():
    grid = Grid(1, 64)
    assert next_round(grid, {5: -1.0, 6: 2.0}, 4) == []
    assert settled(grid, {5: -1.0, 6: 2.0}) == "boundary"
    assert settled(grid, {1: 3.0}) == "none"
    assert settled(grid, {64: -3.0}) == "max"
    assert Bracket.of({5: -1.0, 9: 1.0, 12: -1.0}) == Bracket(5, 9)  # a fit above a failure is ignored


@pytest.mark.parametrize(
    "low,high,step,match",
    [(10, 5, 1, "larger than --max-batch"), (1, 7, 8, "no multiple of 8"), (1, 10, 0, "positive integer")],
)
def test_bad_grids_are_config_errors(low, high, step, match):
    with pytest.raises(ConfigError, match=match):
        Grid(low, high, step)
