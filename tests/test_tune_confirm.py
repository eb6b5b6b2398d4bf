"""Which rows of a script tuned inline run again in a fresh process (pure logic, no compile)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from jaxfit.tune.confirm import CALIBRATION_MARGIN, MORE_AT_MOST, Calibration, fastest_first


@dataclasses.dataclass
class _Row:
    setting: str
    micro_batch: int
    samples_per_second: float | None
    global_batch: int = 64

    @property
    def accum_steps(self) -> int:
        return self.global_batch // self.micro_batch


# the probe rates of the H200 tune of scripts/train.py gpt_small (benchmarks/JOURNAL.md section 27)
NONE_8 = _Row("--remat=none", 8, 138.9)  # fresh: 260.3
NONE_4 = _Row("--remat=none", 4, 101.3)  # fresh: 223.8
FULL_16 = _Row("--remat=full", 16, 142.9)  # fresh: 195.5


def _calibrated() -> Calibration:
    calibration = Calibration()
    calibration.record(NONE_8, 138.9, 260.3)
    calibration.record(FULL_16, 142.9, 195.5)
    return calibration


def test_the_fastest_probe_row_runs_fresh_first_and_calibrates_the_settings_without_their_own():
    """One fresh process to start (since the probe times on the script's own batch its rates are
    within 3 % of fresh ones, benchmarks/JOURNAL.md section 35). Even with section 27's probe
    rates, 16-55 % low by a share that differed per setting, the rule still measures the winner:
    remat full's 142.9 ranks first and runs fresh (195.5), and remat none's 8 x 8, estimated by
    remat full's extra seconds per micro-step (its 8 micro-steps: about 291), may beat it, so it
    runs fresh too (260.3 there), as does 4 x 16 (16 micro-steps: estimated higher still)."""
    assert fastest_first([NONE_4, FULL_16, NONE_8]) == [FULL_16]
    assert fastest_first([]) == [] and fastest_first([_Row("a", 8, None)]) == []
    calibration = Calibration()
    calibration.record(FULL_16, 142.9, 195.5)
    estimate = calibration.estimate(NONE_8)
    assert estimate is not None and 280 < estimate < 300
    assert calibration.more([NONE_4, NONE_8], best_fresh=195.5) == [NONE_4, NONE_8]  # 4 x 16: 16 micro-steps
    assert "the first fresh row's calibration" in calibration.note(NONE_4)


def test_a_row_with_more_micro_steps_is_estimated_by_the_extra_time_per_micro_step():
    """On the H200 the probe's excess was per micro-step (22-31 ms), so remat none's ratio at 8
    micro-steps (x1.87) understates 4 x 16 (fresh 223.8, x2.21): 101.3 x 1.87 is 189.8, far below
    the 260.3 to beat, and the ratio alone would leave it. Its per-micro-step estimate (probe step
    0.632 s less 16 x 26.9 ms: about 317) is the higher, so it runs fresh."""
    calibration = _calibrated()
    calibration.record(NONE_4, 101.3, 50.0)  # only a setting's first row calibrates it
    assert calibration.settings["--remat=none"].ratio == pytest.approx(260.3 / 138.9)
    assert calibration.settings["--remat=none"].extra_per_micro_step == pytest.approx(0.02686, abs=1e-4)
    estimate = calibration.estimate(NONE_4)
    assert estimate is not None and 300 < estimate < 330 and estimate > 101.3 * 260.3 / 138.9
    assert calibration.more([NONE_4], best_fresh=260.3) == [NONE_4]


def test_a_row_with_fewer_micro_steps_is_estimated_by_the_ratio():
    """remat full calibrated at 16 x 4 (x1.37, 30 ms a micro-step): 32 x 2 is estimated by the
    higher of 1.37 x its probe rate and its probe step less 2 x 30 ms, here the ratio. Below the
    margin of the best fresh rate it cannot win, and its note says what it was estimated at."""
    calibration = _calibrated()
    row = _Row("--remat=full", 32, 130.0)
    ratio = calibration.settings["--remat=full"].ratio
    assert calibration.estimate(row) == pytest.approx(130.0 * ratio)
    assert calibration.more([row], best_fresh=260.3) == []
    assert "cannot win" in calibration.note(row) and f"{130.0 * ratio:.1f}" in calibration.note(row)
    close = _Row("--remat=full", 32, 260.3 * (1 - CALIBRATION_MARGIN / 2) / ratio)
    assert calibration.more([row, close], best_fresh=260.3) == [close]


def test_more_rows_run_fresh_highest_estimate_first_and_at_most_a_few():
    calibration = Calibration()
    calibration.record(_Row("a", 8, 100.0, global_batch=8), 100.0, 100.0)
    rows = [_Row("a", 8, 100.0 + m, global_batch=8) for m in range(1, 8)]
    chosen = calibration.more(rows, best_fresh=100.0)
    assert [r.samples_per_second for r in chosen] == [107.0, 106.0, 105.0][:MORE_AT_MOST]


def test_an_excess_that_is_the_whole_probe_step_runs_the_row_fresh():
    calibration = Calibration()
    calibration.record(_Row("a", 8, 10.0), 10.0, 100.0)  # 5.76 s of its 6.4 s step is excess
    assert calibration.estimate(_Row("a", 1, 5.0)) == math.inf


def test_a_fresh_run_that_failed_calibrates_nothing():
    """A fresh run that failed (out of memory, a crash) gives no calibration: the other probe rows
    are not run fresh on a guess, and their note says why."""
    calibration = Calibration()
    lone = _Row("b", 4, 120.0)
    calibration.record(lone, 120.0, None)
    assert calibration.estimate(lone) is None and calibration.more([lone], best_fresh=0.0) == []
    assert "no row has a fresh rate" in calibration.note(lone)
