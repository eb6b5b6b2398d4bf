"""Which rows of a script tuned inline run again in a fresh process (pure logic, no compile)."""

from __future__ import annotations

import dataclasses

from jaxfit.tune.confirm import CALIBRATION_MARGIN, MORE_AT_MOST, Calibration, settings_fastest


@dataclasses.dataclass
class _Row:
    setting: str
    micro_batch: int
    samples_per_second: float | None


# the probe rates of the H200 tune of scripts/train.py gpt_small (benchmarks/README.md section 27)
NONE_8 = _Row("--remat=none", 8, 138.9)
NONE_4 = _Row("--remat=none", 4, 101.3)
FULL_16 = _Row("--remat=full", 16, 142.9)


def test_each_settings_fastest_probe_row_runs_fresh_not_only_the_fastest_of_all():
    """Probe rates of different settings come from different probes: on the H200 remat full's
    142.9 ranked above remat none's 138.9, yet fresh processes gave 195.5 and about 260. Each
    setting's fastest goes to a fresh process, so remat none is measured there too."""
    assert settings_fastest([NONE_4, FULL_16, NONE_8]) == [FULL_16, NONE_8]
    assert settings_fastest([]) == []


def test_a_setting_calibrated_by_its_fastest_row_ranks_its_other_rows():
    calibration = Calibration()
    calibration.record("--remat=none", 138.9, 260.0)
    calibration.record("--remat=full", 142.9, 195.5)
    calibration.record("--remat=none", 101.3, 50.0)  # only a setting's first row calibrates it
    assert calibration.ratios["--remat=none"] == 260.0 / 138.9
    # remat none 4 x 16 scales to about 190: far below the 260 measured fresh, so it cannot win
    assert calibration.more([NONE_4], best_fresh=260.0) == []
    assert "cannot win" in calibration.note(NONE_4) and "x1.87" in calibration.note(NONE_4)
    # within the margin of the best fresh rate, it runs fresh
    close = 260.0 * (1 - CALIBRATION_MARGIN / 2) / calibration.ratios["--remat=none"]
    row = _Row("--remat=none", 2, close)
    assert calibration.more([NONE_4, row], best_fresh=260.0) == [row]


def test_more_rows_run_fresh_highest_scaled_rate_first_and_at_most_a_few():
    calibration = Calibration()
    calibration.record("a", 100.0, 100.0)
    rows = [_Row("a", m, 100.0 + m) for m in range(1, 8)]
    chosen = calibration.more(rows, best_fresh=100.0)
    assert [r.micro_batch for r in chosen] == [7, 6, 5][:MORE_AT_MOST]


def test_a_setting_without_a_fresh_rate_calibrates_nothing():
    """A fresh run that failed (out of memory, a crash) gives no calibration: its other probe rows
    are not run fresh on a guess, and their note says why."""
    calibration = Calibration()
    calibration.record("b", 120.0, None)
    lone = _Row("b", 4, 120.0)
    assert calibration.scaled(lone) is None and calibration.more([lone], best_fresh=0.0) == []
    assert "no fresh rate" in calibration.note(lone)
