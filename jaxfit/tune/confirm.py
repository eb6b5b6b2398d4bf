"""Which rows of a script tuned with ``--measure inline`` run again in a fresh process (pure logic).

A script's inline timing runs the proven program in the script's probe, one probe process per
setting (a script's flag changes its program, so each setting starts its own). On an H200
(benchmarks/README.md section 27) those probe rates were 16-27 % below what the same program gave
in a fresh process of the script, by a share that differed from one probe to the next: remat none
at 8 x 8 timed 138.9 samples/s in its probe and remat full at 16 x 4 142.9 in its own, while fresh
processes gave about 260 and 195.5. Ranked on probe rates, the tune named the slower one.

So probe rates compare only within their probe (one setting). The rule:

1. each setting's fastest probe row runs in a fresh process (one per setting, fastest first); its
   fresh rate over its probe rate is that setting's calibration;
2. the other probe rows, each scaled by its setting's calibration, run in a fresh process while
   the scaled rate is within :data:`CALIBRATION_MARGIN` of the best fresh rate so far (at most
   :data:`MORE_AT_MOST` of them, highest scaled rate first);
3. the winner is always a fresh-process rate; the rows left say what they were calibrated to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

CALIBRATION_MARGIN = 0.03
"""A probe row scaled by its setting's calibration runs fresh unless this share below the best fresh rate."""

MORE_AT_MOST = 3
"""Of the probe rows that are not their setting's fastest, at most this many run in a fresh process."""


class ProbeRow(Protocol):
    """What the rule reads of a tune row (:class:`jaxfit.tune.model.Row`)."""

    setting: str
    micro_batch: int
    samples_per_second: float | None


R = TypeVar("R", bound=ProbeRow)


def settings_fastest(rows: Iterable[R]) -> list[R]:
    """Step 1: each setting's fastest probe row, the fastest first."""
    best: dict[str, R] = {}
    for row in rows:
        current = best.get(row.setting)
        if current is None or (row.samples_per_second or 0) > (current.samples_per_second or 0):
            best[row.setting] = row
    return sorted(best.values(), key=lambda r: -(r.samples_per_second or 0))


@dataclasses.dataclass
class Calibration:
    """Each setting's fresh-process rate over its probe rate, from step 1."""

    ratios: dict[str, float] = dataclasses.field(default_factory=dict)

    def record(self, setting: str, probe_rate: float | None, fresh_rate: float | None) -> None:
        """A setting's first row measured in both places (a failed fresh run calibrates nothing)."""
        if probe_rate and fresh_rate and setting not in self.ratios:
            self.ratios[setting] = fresh_rate / probe_rate

    def scaled(self, row: ProbeRow) -> float | None:
        """``row``'s probe rate scaled by its setting's calibration (None: no calibration)."""
        ratio = self.ratios.get(row.setting)
        return None if ratio is None or not row.samples_per_second else row.samples_per_second * ratio

    def more(self, rows: Sequence[R], best_fresh: float) -> list[R]:
        """Step 2: of ``rows`` (probe rows not yet measured fresh), those that may beat
        ``best_fresh`` once scaled, highest scaled rate first, at most :data:`MORE_AT_MOST`."""
        scaled = [(s, r) for r in rows if (s := self.scaled(r)) is not None]
        scaled.sort(key=lambda pair: -pair[0])
        return [r for s, r in scaled if s >= best_fresh * (1 - CALIBRATION_MARGIN)][:MORE_AT_MOST]

    def note(self, row: ProbeRow) -> str:
        """The note of a probe row that was not measured fresh."""
        rate = row.samples_per_second or 0.0
        scaled = self.scaled(row)
        if scaled is None:
            return f"the step alone, timed in the probe only ({rate:.1f} samples/s; its setting has no fresh rate)"
        ratio = self.ratios[row.setting]
        return (
            f"the step alone, timed in the probe only: {rate:.1f} samples/s, about {scaled:.1f} in a fresh "
            f"process by its setting's calibration (x{ratio:.2f}): cannot win"
        )
