"""Which rows of a script tuned with ``--measure inline`` run again in a fresh process (pure logic).

A script's inline timing runs each proven program in a probe of the script, a process of its own
per proof (a script's flags, its accumulation among them, make its program, so each setting and
each accumulation starts one). On an H200 (benchmarks/JOURNAL.md section 27) those probe rates
were 16-55 % below what the same program gave in a fresh process of the script, by a share that
differed from row to row: remat none at 8 x 8 timed 138.9 samples/s in its probe and remat full at
16 x 4 142.9 in its own, while fresh processes gave about 260 and 195.5. Ranked on probe rates,
the tune named the slower one.

The excess was 22-31 ms per micro-step in all four rows measured, so a single ratio understates
the rows with more micro-steps than the row it came from (remat none: x1.87 at 8 micro-steps,
x2.21 at 16). So probe rates are not ranked across settings, and a row is estimated with the
calibration that favours it.

The cause was found later (benchmarks/JOURNAL.md section 35): the probe timed the script's state on
a batch whose tokens were all 0, on which the step ran 1.7-1.9x slower. A probe now times on the
script's own batch, and its rates came within 3 % of fresh processes in both settings measured
(+1.5 to +2.8 %). So the rule now starts from one fresh process, not one per setting, and keeps
the calibration as a safeguard:

1. the fastest probe row of all runs in a fresh process, which calibrates its setting twice (its
   fresh rate over its probe rate, and its extra seconds per micro-step in the probe) and every
   setting without a calibration of its own;
2. each other probe row's fresh rate is estimated the higher of the two ways (its probe rate
   times the ratio; its probe step less the extra seconds times its micro-steps), and it runs in
   a fresh process when that is within :data:`CALIBRATION_MARGIN` of the best fresh rate so far
   (at most :data:`MORE_AT_MOST` of them, the highest estimate first); a row run so calibrates
   its own setting when it is the setting's first;
3. the winner is always a fresh-process rate; the rows left say what they were estimated at.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

CALIBRATION_MARGIN = 0.03
"""A probe row scaled by its setting's calibration runs fresh unless this share below the best fresh rate."""

MORE_AT_MOST = 3
"""Of the probe rows after the fastest, at most this many run in a fresh process."""


class ProbeRow(Protocol):
    """What the rule reads of a tune row (:class:`jaxfit.tune.model.Row`)."""

    setting: str
    micro_batch: int
    accum_steps: int
    global_batch: int
    samples_per_second: float | None


R = TypeVar("R", bound=ProbeRow)


def fastest_first(rows: Iterable[R]) -> list[R]:
    """Step 1: the fastest probe row of all, as a list (empty without one)."""
    timed = [r for r in rows if r.samples_per_second]
    return [max(timed, key=lambda r: r.samples_per_second or 0)] if timed else []


@dataclasses.dataclass(frozen=True)
class _Setting:
    ratio: float  # fresh rate / probe rate
    extra_per_micro_step: float  # seconds the probe's step took beyond the fresh one's, per micro-step


@dataclasses.dataclass
class Calibration:
    """Each setting's probe-to-fresh calibration, from its first row measured in both (step 1)."""

    settings: dict[str, _Setting] = dataclasses.field(default_factory=dict)

    def record(self, row: ProbeRow, probe_rate: float | None, fresh_rate: float | None) -> None:
        """``row`` (its setting's first) gave ``probe_rate`` in the probe and ``fresh_rate`` in a
        fresh process (a failed fresh run calibrates nothing)."""
        if not probe_rate or not fresh_rate or row.setting in self.settings:
            return
        extra = (row.global_batch / probe_rate - row.global_batch / fresh_rate) / max(1, row.accum_steps)
        self.settings[row.setting] = _Setting(fresh_rate / probe_rate, extra)

    def estimate(self, row: ProbeRow) -> float | None:
        """``row``'s fresh rate estimated from its probe rate, the higher of the ratio's and the
        per-micro-step estimate, by its setting's calibration or else the first one recorded
        (None: no calibration at all; inf: the per-micro-step excess is all of its probe step)."""
        calibrated = self.settings.get(row.setting) or next(iter(self.settings.values()), None)
        if calibrated is None or not row.samples_per_second:
            return None
        by_ratio = row.samples_per_second * calibrated.ratio
        step = row.global_batch / row.samples_per_second - calibrated.extra_per_micro_step * max(1, row.accum_steps)
        return max(by_ratio, row.global_batch / step) if step > 0 else math.inf

    def more(self, rows: Sequence[R], best_fresh: float) -> list[R]:
        """Step 2: of ``rows`` (probe rows not yet measured fresh), those that may beat
        ``best_fresh`` by their estimate, the highest first, at most :data:`MORE_AT_MOST`."""
        estimated = [(e, r) for r in rows if (e := self.estimate(r)) is not None]
        estimated.sort(key=lambda pair: -pair[0])
        return [r for e, r in estimated if e >= best_fresh * (1 - CALIBRATION_MARGIN)][:MORE_AT_MOST]

    def note(self, row: ProbeRow) -> str:
        """The note of a probe row that was not measured fresh."""
        rate = row.samples_per_second or 0.0
        estimate = self.estimate(row)
        if estimate is None:
            return f"the step alone, timed in the probe only ({rate:.1f} samples/s; no row has a fresh rate)"
        whose = "its setting's" if row.setting in self.settings else "the first fresh row's"
        return (
            f"the step alone, timed in the probe only: {rate:.1f} samples/s, at most about {estimate:.1f} in a "
            f"fresh process by {whose} calibration: cannot win"
        )
