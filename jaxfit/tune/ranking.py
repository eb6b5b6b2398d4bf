"""Which micro-batches a tune proves, ranked on untuned programs first (pure logic).

On a GPU a tune's search for each setting's largest micro-batch compiles every divisor of the
global batch untuned, in one round, each as the step accumulated to the global batch (one
workload whose batch size is the micro-batch: its micro-batches come stacked,
``ExampleSource.stacked_to``). Those programs exist in the compile process, so they are also run
there, a few steps each (:attr:`jaxfit.fit.FitOptions.rank_steps`): a rate for every micro-batch
of every setting before any of them is proved. Proofs (an autotuned compile of the accumulated
program as training runs it, about 20 s each for gpt-small on an H100) then go in the order of
those rates, and a candidate whose untuned rate is more than the margin below that of the best
candidate proved to fit is not proved at all: successive halving whose first, cheap rung is the
untuned program. An untuned rate ranks; it is never reported as a candidate's speed (autotuning
changes kernels, so it is only close to the measured one).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping
from typing import Any


def untuned_rates(timings: Iterable[Mapping[str, Any]], global_batch: int) -> dict[int, float]:
    """``{micro-batch: samples per second}`` of the untuned timings that ran
    (:attr:`jaxfit.fit.FitResult.untuned_timings`, each a step of the whole ``global_batch``); a
    timing that failed gives no rate."""
    rates = {}
    for t in timings:
        steps = t.get("step_seconds") or []
        if t.get("ok") and steps and statistics.median(steps) > 0:
            rates[int(t["batch"])] = global_batch / statistics.median(steps)
    return rates


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A micro-batch of a setting that may be proved, with its untuned rate (None: not timed)."""

    setting: str
    micro_batch: int
    untuned_rate: float | None


def proof_order(candidates: Iterable[Candidate]) -> list[Candidate]:
    """The order proofs go in: the timed candidates fastest first, then those without a rate,
    largest micro-batch first (a failed timing is no evidence of slowness: they are proved)."""
    timed = sorted((c for c in candidates if c.untuned_rate is not None), key=lambda c: -(c.untuned_rate or 0))
    untimed = [c for c in candidates if c.untuned_rate is None]
    return timed + sorted(untimed, key=lambda c: -c.micro_batch)


@dataclasses.dataclass
class Rung:
    """The cheap rung of the halving: the best untuned rate among the candidates proved to fit so
    far is the reference; a candidate more than ``margin`` below it is left out."""

    margin: float
    reference: Candidate | None = None

    def left_out(self, candidate: Candidate) -> bool:
        """Whether ``candidate`` is too slow untuned to be proved."""
        if candidate.untuned_rate is None or self.reference is None or self.reference.untuned_rate is None:
            return False
        return candidate.untuned_rate < (1 - self.margin) * self.reference.untuned_rate

    def proved(self, candidate: Candidate) -> None:
        """``candidate`` was proved to fit: the first of them with a rate becomes the reference (in
        :func:`proof_order` it has the highest rate of those that fit)."""
        if self.reference is None and candidate.untuned_rate is not None:
            self.reference = candidate

    def why(self, candidate: Candidate) -> str:
        """The note of a candidate left out."""
        ref = self.reference
        assert ref is not None and ref.untuned_rate is not None and candidate.untuned_rate is not None
        return (
            f"untuned it ran at {candidate.untuned_rate:.1f} samples/s, more than {self.margin:.0%} below "
            f"{ref.setting} at micro-batch {ref.micro_batch} ({ref.untuned_rate:.1f}): not proved"
        )
