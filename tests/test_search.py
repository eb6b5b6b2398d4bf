"""The search against synthetic peak curves: exact boundaries, fewer rounds than doubling + bisection."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest

from jaxfit.errors import ConfigError
from jaxfit.fit.search import (
    Bracket,
    Grid,
    affine_slope,
    doubling_bisection,
    left_open,
    next_round,
    prove,
    search,
    settled,
    trusted_prior,
)

MiB = 1 << 20


def squeezed(b: int) -> float:
    """docs/guides/facts.md #2: affine at small batches, a plateau as XLA squeezes toward the limit, then a cliff."""
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
    assert result.rounds <= 4  # doubling + bisection needs 8 (docs/guides/facts.md #7)
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


# -- the two-phase GPU search: cheap (untuned) curve, then proof on the expensive (tuned) one --------

GiB = 1 << 30


def _vit_like_tuned(b: int) -> float:
    return (0.3 + 0.0693 * b) * GiB


def _vit_like_untuned(b: int) -> float:
    """ViT-S at fraction 0.05 on the H200: untuned, XLA squeezes a plateau up to batch 157."""
    if b <= 157:
        return min(_vit_like_tuned(b), 6.5 * GiB + 0.003 * GiB * b)
    return 7.2 * GiB + 0.07 * GiB * (b - 157)


def _gpt_fp32_tuned(b: int) -> float:
    """gpt-small fp32 at 0.12 on the H200, tuned: squeezed up to 13, then a cliff."""
    return squeezed(b) if b <= 13 else (18300 + 1250 * (b - 14)) * MiB


def _fsdp4_untuned(b: int) -> float:
    """pi0 under FSDP-4 on an H100, untuned (global batch; 80 GiB card at 0.9): 53.04 GiB at 512,
    63.55 at 680, squeezed to 65.68 at 864, then a cliff (75.61 at 868)."""
    affine = 53.04 + 0.0626 * (b - 512)
    return (min(affine, 63.55 + 0.0116 * (b - 680)) if b <= 864 else affine + 0.4) * GiB


def _fsdp4_tuned(b: int) -> float:
    """The same, autotuned: 84.82 GiB at 864 (19 GiB above untuned), less far apart lower down."""
    return (53.04 + 0.0626 * (b - 512) + 12 + 0.008 * b) * GiB


TWO_PHASE: list[tuple[str, Callable[[int], float], Callable[[int], float], float, Grid, int]] = [
    # name, untuned, tuned, budget, grid, most autotuned rounds allowed
    ("curves-agree", lambda b: 1e9 + 2.1e8 * b, lambda b: 1e9 + 2.1e8 * b + 47e3, 5.728e9, Grid(1, 65536), 1),
    ("tuned-one-below", squeezed, _gpt_fp32_tuned, 17180 * MiB, Grid(1, 65536), 1),
    ("tuned-far-below", _vit_like_untuned, _vit_like_tuned, 7 * GiB, Grid(1, 65536), 3),
    ("tuned-above", lambda b: 1e9 + 1e8 * b, lambda b: 1e9 + 0.97e8 * b, 10e9, Grid(1, 65536), 2),
    ("tuned-above-multiple-of-8", lambda b: 1e9 + 1e7 * b, lambda b: 1e9 + 0.9e7 * b, 10e9, Grid(8, 65536, 8), 3),
    ("only-untuned-fits", lambda b: 0.95e9 + 1e6 * b, lambda b: 1.2e9 + 1e6 * b, 1e9, Grid(1, 4096), 2),
    ("max-bound", lambda b: 1e9 + 1e6 * b, lambda b: 1e9 + 1.01e6 * b, 5e9, Grid(1, 1000), 1),
    ("nothing-fits", lambda b: 1e12 + b, lambda b: 1e12 + b, 1e9, Grid(1, 4096), 1),
    # Autotuned far above untuned, everywhere (FSDP): 6 autotuned rounds before the prior learnt the gap.
    ("fsdp-tuned-far-above", _fsdp4_untuned, _fsdp4_tuned, 72 * GiB, Grid(512, 1024, 4), 2),
    ("fsdp-tuned-below-the-window", _fsdp4_untuned, _fsdp4_tuned, 72 * GiB, Grid(600, 1024, 4), 2),
]


def _two_phase(untuned, tuned, budget, grid, width=4, proof_width=2):
    rounds: list[tuple[str, list[int]]] = []

    def oracle(kind, f, w):
        def evaluate(points):
            assert 1 <= len(points) <= w and len(set(points)) == len(points)
            assert all(p % grid.step == 0 and grid.first <= p <= grid.last for p in points)
            rounds.append((kind, points))
            return {p: f(p) - budget for p in points}

        return evaluate

    cheap = search(oracle("untuned", untuned, width), grid, width=width, leave_open=left_open(width, proof_width))
    proved = prove(oracle("tuned", tuned, proof_width), grid, cheap, budget, width=proof_width)
    return cheap, proved, rounds


@pytest.mark.parametrize("name,untuned,tuned,budget,grid,max_tuned_rounds", TWO_PHASE, ids=[c[0] for c in TWO_PHASE])
def test_tuned_proof_finds_the_tuned_boundary(name, untuned, tuned, budget, grid, max_tuned_rounds):
    _, proved, rounds = _two_phase(untuned, tuned, budget, grid)
    assert proved.answer == true_answer(tuned, budget, grid)
    tuned_rounds = [points for kind, points in rounds if kind == "tuned"]
    assert proved.rounds == len(tuned_rounds) <= max_tuned_rounds
    # The proof stands on tuned points alone, on both sides of the answer.
    if proved.outcome == "boundary":
        assert tuned(proved.answer) <= budget < tuned(proved.answer + grid.step)
        assert {proved.answer, proved.answer + grid.step} <= set(proved.known)
    elif proved.outcome == "none":
        assert grid.first in proved.known and tuned(grid.first) > budget
    else:
        assert grid.last in proved.known and tuned(grid.last) <= budget


def test_tuned_proof_of_a_right_untuned_answer_is_one_round_of_two():
    cheap, proved, rounds = _two_phase(lambda b: 1e9 + 2.1e8 * b, lambda b: 1e9 + 2.1e8 * b, 5.728e9, Grid(1, 65536))
    assert [r for r in rounds if r[0] == "tuned"] == [("tuned", [cheap.answer, cheap.answer + 1])]
    assert proved.answer == cheap.answer == 22


def test_tuned_proof_survives_a_pocket_in_the_tuned_curve():
    """A non-monotone tuned curve (the MLP on the H100): the answer is still a proved boundary."""

    def tuned(b):
        return 1e9 + 1e6 * b + (3e8 if 250 <= b <= 260 else 0)

    _, proved, _ = _two_phase(lambda b: 1e9 + 1e6 * b, tuned, 1.3e9, Grid(1, 4096))
    assert tuned(proved.answer) <= 1.3e9 < tuned(proved.answer + 1)


def test_slope_comes_from_points_with_room_and_prior_from_far_points():
    cheap = {1: -90.0, 2: -80.0, 4: -60.0, 8: -5.0, 9: 1.0, 30: 50.0}
    assert affine_slope(cheap, 100.0) == pytest.approx(10.0)  # 2 and 4, not 8 (squeezed, near the limit)
    assert trusted_prior(cheap, 100.0) == {1: -90.0, 2: -80.0, 4: -60.0, 30: 50.0}
    assert affine_slope({1: -5.0, 2: -4.0}, 100.0) == pytest.approx(1.0)  # no roomy pair: the largest fits
    assert affine_slope({1: -5.0}, 100.0) is None


def test_a_cheap_search_left_open_stops_with_one_point_in_question():
    calls = []

    def evaluate(points):
        calls.append(points)
        return {p: squeezed(p) - 18000 * MiB for p in points}

    result = search(evaluate, Grid(1, 65536), width=4, leave_open=1)
    full = search(lambda ps: {p: squeezed(p) - 18000 * MiB for p in ps}, Grid(1, 65536), width=4)
    assert result.outcome == "open" and result.rounds == full.rounds - 1
    b = Bracket.of(result.known)
    assert len(Grid(1, 65536).between(b.lo, b.hi)) == 1 and result.answer == b.lo


def test_a_prediction_on_the_largest_fit_starts_the_round_just_above_it():
    """pi0.5 on an H100 (2026-12-07): autotuned 39 fits by 0.16 GiB, 45 fails by 1.61 GiB, and the
    chord puts the boundary between 39 and 40. The round is 40 and 41, which settles it if either
    fails; it used to be 40 and a split point (43), and 41 took another round of two autotuned
    compiles (about 80 s for openpi)."""
    known = {38: -0.49 * GiB, 39: -0.16 * GiB, 45: 1.61 * GiB, 46: 1.86 * GiB}
    assert next_round(Grid(1, 65536), known, 2) == [40, 41]
    # A whole search gains the round too: the plateau's chord predicts its own largest fit (8).
    full = search(lambda ps: {p: squeezed(p) - 17180 * MiB for p in ps}, Grid(1, 65536), width=4)
    assert (full.answer, full.rounds) == (13, 3)


def test_a_wide_round_leaves_a_few_points_open_and_the_proof_starts_where_the_curve_crosses():
    """Eight a round leave three points in question (a last cheap round would compile only those);
    the proof's first pair is where the cheap curve crosses the budget, not the largest point in
    question, so a right prediction is proved in one expensive round."""
    grid = Grid(1, 65536)
    f = lambda b: 1e9 + 3e9 * math.sqrt(b)  # noqa: E731  (flattening, as XLA squeezes toward the limit)
    budget = f(75) + 0.4 * (f(76) - f(75))
    assert left_open(8, 2) == 3 and left_open(4, 2) == 2 and left_open(2, 2) == 1
    cheap, proved, rounds = _two_phase(f, f, budget, grid, width=8)
    b = Bracket.of(cheap.known)
    assert cheap.outcome == "open" and 1 < len(grid.between(b.lo, b.hi)) <= 3
    assert b.hi - 1 != 75  # the largest point in question is not the answer: the old start missed it
    assert [points for kind, points in rounds if kind == "tuned"] == [[75, 76]]
    assert proved.answer == 75


def test_tuned_proof_when_the_tuned_compile_itself_runs_out_of_memory():
    """A tuned compile that fails outright (excess inf) gives no slope to step by: bracket instead."""
    budget = 10e9

    def tuned(b):
        return math.inf if b >= 85 else 1e9 + 1.2e8 * b

    cheap, proved, rounds = _two_phase(lambda b: 1e9 + 1e8 * b, tuned, budget, Grid(1, 65536))
    assert cheap.answer == 90
    assert proved.answer == true_answer(tuned, budget, Grid(1, 65536)) == 75
    assert all(len(points) <= 2 for kind, points in rounds if kind == "tuned")


def test_a_grid_of_a_trillion_points_is_searched_without_listing_it():
    """``--max-batch 99999999999999999999`` once grew a round's candidate list to 21 GB: the search
    and its proof now work on ranges (an absurd bound is refused by the options, this is the rest)."""
    grid = Grid(1, 10**12)
    budget = 1e9 + 1e3 * 123_456_789
    f = lambda b: 1e9 + 1e3 * b  # noqa: E731
    cheap = search(lambda ps: {p: f(p) - budget for p in ps}, grid, width=4, leave_open=1)
    proved = prove(lambda ps: {p: f(p) + 1.0 - budget for p in ps}, grid, cheap, budget, width=2)
    assert proved.answer == 123_456_788 and proved.rounds < 20
    assert len(grid.between(0, 10**12 + 1)) == 10**12


def test_unknown_points_skip_the_known_ones_in_order():
    from jaxfit.fit.search import Unknown

    points = Unknown(range(3, 30, 3), [6, 12, 13, 27])
    assert list(points) == [3, 9, 15, 18, 21, 24] and len(points) == 6
    assert points[0] == 3 and points[1] == 9 and points[-1] == 24 and points[2:4] == [15, 18]
    with pytest.raises(IndexError):
        points[6]


def test_a_tuned_curve_whose_slope_misleads_is_bisected_after_three_steps():
    """The tuned peak is flat above the budget down to a few samples (a workspace that autotuning
    adds whatever the batch) while the untuned slope is steep: stepping down by excess / slope
    moves 100 batches a round. After three such steps the proof brackets instead, so it settles in
    logarithmic rounds (an H100 fit of mlp-tiny at fraction 0.0016 stepped for 32 rounds and gave up)."""

    def tuned(b):
        return 1e9 if b <= 5 else 2e9

    _, proved, rounds = _two_phase(lambda b: 1e6 * b, tuned, 1.9e9, Grid(1, 4096))
    assert proved.answer == 5
    assert len([r for r in rounds if r[0] == "tuned"]) <= 16  # 28 when it only stepped


def test_a_search_that_cannot_settle_is_one_line_that_says_what_to_do():
    from jaxfit.errors import ErraticCurveError

    def evaluate(points):
        return {p: p - 1000.0 for p in points}

    with pytest.raises(
        ErraticCurveError, match=r"the search did not settle in 1 rounds: the compiled peak jumps"
    ) as info:
        search(evaluate, Grid(1, 4096), width=2, max_rounds=1)
    assert "\n" not in str(info.value) and "--no-verify" in str(info.value)


FSDP4_UNTUNED_GIB = [(512, 53.04), (680, 63.55), (848, 64.78), (856, 65.23), (864, 65.68), (868, 75.61),
                     (876, 76.15), (884, 76.67), (888, 76.96), (1024, 79.0)]  # fmt: skip
"""openpi's pi0 under FSDP-4 on 4 H100s (80 GiB card at 0.9), untuned compiles measured
(benchmarks/results/h100x4/openpi/call2): global batch, peak GiB per GPU."""


def test_the_measured_fsdp4_proof_of_pi0_takes_five_autotuned_rounds_not_seven():
    """Replayed from the measured curves (autotuned: 712: 68.58, 728: 69.02, 732: 69.19, then a
    cliff, 736: 74.53, 748: 75.46, 848: 83.57 GiB): the proof used to trust the untuned 848 (7.22
    GiB under the budget) and so stepped 864, 852, 860, 848 before it left the untuned answer's
    neighbourhood, 7 rounds of one to two minutes each on the GPU. Once the first round shows the
    19 GiB gap, neither the untuned points near the budget nor the untuned slope guide it."""

    def untuned(b):
        for (x0, y0), (x1, y1) in itertools.pairwise(FSDP4_UNTUNED_GIB):
            if x0 <= b <= x1:
                return (y0 + (y1 - y0) * (b - x0) / (x1 - x0)) * GiB
        raise AssertionError(b)

    def tuned(b):
        if b <= 732:
            return (68.58 + (b - 712) * 0.0305) * GiB
        if b <= 752:
            return (74.53 + (b - 736) * 0.067) * GiB
        return (75.6 + (b - 752) * 0.083) * GiB

    cheap, proved, rounds = _two_phase(untuned, tuned, 72 * GiB, Grid(512, 1024, 4))
    assert (cheap.answer, proved.answer) == (864, 732)
    assert len([r for r in rounds if r[0] == "tuned"]) <= 5


FSDP2_FRACTION_PEAKS_GIB = {5: 16.33, 10: 14.26, 16: 12.97, 17: 13.53, 21: 12.80, 22: 12.83, 26: 13.71, 30: 11.81,
                            42: 13.71, 55: 13.86, 100: 12.80}  # fmt: skip
"""gpt-small bf16 remat, batch 64, FSDP over two H100s: the autotuned peak under each fraction
(hundredths of 79.18 GiB) measured by the fraction search (benchmarks/results/h100x4/ray/call2)."""


def _replay_fraction(peak_gib, estimate: int, lowest: int = 1):
    from jaxfit.fit.fraction import search_fraction

    total = 79.18 * GiB
    compiled: dict[int, int] = {}
    rounds: list[list[int]] = []

    def evaluate(xs):
        rounds.append(sorted(-x for x in xs))
        out = {}
        for x in xs:
            compiled[-x] = int(peak_gib(-x) * GiB)
            out[x] = compiled[-x] - total * -x / 100
        return out

    found = search_fraction(evaluate, lambda: dict(compiled), estimate, lowest, int(total), 0)
    return -found.answer, rounds


def test_the_fraction_search_aims_where_the_peaks_say_instead_of_bisecting():
    """The untuned whole-device compile said 0.10; the autotuned peak under 0.10 was 14.26 GiB, which
    is 0.18 of the GPU. Aimed there, the search settles in 3 rounds after the first; bisecting
    between 0.16 and 1.00 it had spent 5 and was not done (the points not measured on the GPU are
    taken as 13.6 GiB, what the measured ones near them peaked at)."""
    answer, rounds = _replay_fraction(lambda u: FSDP2_FRACTION_PEAKS_GIB.get(u, 13.6), estimate=10)
    assert answer == 18  # 17: 13.53 GiB > 13.46; 18: 13.6 <= 14.25
    assert len(rounds) <= 3 and rounds[1] == [18, 19, 20]


def test_the_aimed_fraction_search_still_finds_the_smallest_fraction_of_a_smooth_curve():
    for peak in (lambda u: 20.0, lambda u: 20.0 + 0.05 * u, lambda u: 30.0 - 0.1 * u):
        answer, _ = _replay_fraction(peak, estimate=10)
        fits = [u for u in range(1, 101) if peak(u) <= 79.18 * u / 100]
        assert answer == min(fits)


def test_a_rounds_fraction_children_run_as_many_at_once_as_the_gpu_holds() -> None:
    """A fraction fit starts a script once per fraction tried. Three openpi LoRA start-ups (18.5 GiB
    each) fit an 80 GiB H100 together, not a 24 GiB card; three pools preallocated at 0.4, 0.5 and
    0.6 of a GPU do not fit it together either."""
    from jaxfit.fit.fraction import side_by_side

    gib = 1 << 30
    assert side_by_side([int(18.5 * gib)] * 3, 80 * gib) == 3
    assert side_by_side([int(18.5 * gib)] * 3, 24 * gib) == 1
    assert side_by_side([int(0.4 * 80 * gib), int(0.5 * 80 * gib), int(0.6 * 80 * gib)], 80 * gib) == 1
    assert side_by_side([int(0.3 * 80 * gib), int(0.3 * 80 * gib), int(0.6 * 80 * gib)], 80 * gib) == 2
    assert side_by_side([0, 0, 0], 80 * gib) == 3  # nothing known of the start-up: as before
    assert side_by_side([5 * gib] * 3, None) == 3  # a CPU: no GPU to share
    assert side_by_side([100 * gib], 80 * gib) == 1  # one always runs
