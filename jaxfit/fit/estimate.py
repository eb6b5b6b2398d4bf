"""Estimates for a GPU that is not here: two deviceless searches, and the answer kept on the safe side.

A deviceless compile (:mod:`jaxfit.fit.targets`) is untuned: the card's own compile autotunes,
and near the limit the two programs differ. Measured on an H200 (the issue's GPT step at fraction
0.3), the deviceless peaks ran 3.3-3.7 % below the card's own, and at the rematerialisation cliff
the untuned program squeezed under the limit (batch 40: 39.55 GB of 45.03) where the autotuned one
could not (46.54 GB): an estimate that is optimistic exactly at the cliff is the out-of-memory crash
again. So :func:`fit_for_gpu` runs two searches:

- **squeezed**: the compiler sees the card's limit, and rematerialises to fit it, as the card would;
  its answer is how far XLA *might* go on the card;
- **safe** (the answer): the compiler has room to spare (nothing rematerialised to fit), and the
  budget keeps a margin for autotuning (:data:`AUTOTUNE_MARGIN` of the limit); a batch counts only
  when its plain program fits with that margin.

The safe answer is what to plan with; batches between the two exist only through
rematerialisation, said so. A proof is ``jaxfit fit`` on the card itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxfit.errors import DoesNotFitError
from jaxfit.fit.common import Progress
from jaxfit.fit.options import FitOptions
from jaxfit.fit.results import FitResult
from jaxfit.fit.sources import Source
from jaxfit.fit.targets import Target

AUTOTUNE_MARGIN = 0.12
"""The share of the card's limit the safe answer keeps free for what autotuning adds. The card's own
autotuned programs ran 3.3-3.7 % above the deviceless ones for a GPT step on an H200, but 11 %
above them for openpi's pi0 LoRA on an H200 at 141 GB, where 5 % answered 304 and the card proved
285. 12 % is the smallest margin that keeps the six recorded estimates with a proof at or under it
(``benchmarks/safe_margin.py``; the H200's then 280)."""


@dataclasses.dataclass(frozen=True)
class GpuEstimate:
    """What fits a GPU that is not here.

    Attributes:
      target: The card.
      safe: The answer to plan with: the plain (unsqueezed) program fits with the margin.
      squeezed: The search where the compiler squeezes toward the card's limit; None when not run.
      margin: The share of the limit kept free in ``safe``.
    """

    target: Target
    safe: FitResult | None
    squeezed: FitResult | None
    margin: float

    @property
    def batch_size(self) -> int | None:
        return self.safe.batch_size if self.safe is not None else None

    @property
    def squeezed_batch_size(self) -> int | None:
        return self.squeezed.batch_size if self.squeezed is not None else None

    def summary(self) -> str:
        """One line for people."""
        card = self.target.name
        if self.safe is None and self.squeezed is None:
            return f"estimate for {card}: not even the smallest batch fits"
        squeezed = self.squeezed_batch_size
        if self.safe is None:
            return (
                f"estimate for {card}: no batch fits without rematerialisation and a {self.margin:.0%} margin; "
                f"up to {squeezed} only if XLA rematerialises as much on the card (deviceless compiles are untuned)"
            )
        line = (
            f"estimate for {card}: batch {self.safe.batch_size} (its plain program fits with a {self.margin:.0%} "
            "margin for autotuning)"
        )
        if squeezed is not None and squeezed > self.safe.batch_size:
            line += (
                f"; batches up to {squeezed} fit only through rematerialisation, which the card's own autotuned "
                "compile may not manage"
            )
        return line + ". An estimate of an untuned program: jaxfit fit on the card proves and pins"

    def to_dict(self) -> dict[str, Any]:
        return {
            "estimate": True,
            "target": self.target.to_dict(),
            "batch_size": self.batch_size,
            "squeezed_batch_size": self.squeezed_batch_size,
            "margin": self.margin,
            "summary": self.summary(),
            "safe": self.safe.to_dict() if self.safe is not None else None,
            "squeezed": self.squeezed.to_dict() if self.squeezed is not None else None,
        }


def fit_for_gpu(
    source: Source,
    target: Target,
    options: FitOptions = FitOptions(),
    progress: Progress | None = None,
    margin: float = AUTOTUNE_MARGIN,
) -> GpuEstimate:
    """The largest batch of ``source`` that fits ``target`` under ``options.mem_fraction``, estimated
    deviceless (module docstring): the safe answer and the squeezed one. A script starts once: its
    probe compiles for both memory sizes (:func:`jaxfit.fit.children.shared_target_probe`).

    Raises:
      ConfigError, CompileError, WorkloadError, WorkerError: as :func:`jaxfit.fit_batch`.
    """
    from jaxfit.fit.children import shared_target_probe

    with shared_target_probe():  # a script starts once for both searches
        return _fit_for_gpu(source, target, options, progress, margin)


def _fit_for_gpu(
    source: Source, target: Target, options: FitOptions, progress: Progress | None, margin: float
) -> GpuEstimate:
    from jaxfit.fit.batch import fit_batch

    fraction = options.resolved_fraction()
    limit = int(fraction * (options.device_memory_bytes or target.memory_bytes))
    base = dataclasses.replace(options, target=target, pin=False)
    try:
        squeezed: FitResult | None = fit_batch(source, dataclasses.replace(base, squeeze=True), progress=progress)
    except DoesNotFitError:
        squeezed = None
    if squeezed is None:
        return GpuEstimate(target, None, None, margin)
    plain = dataclasses.replace(
        base,
        squeeze=False,
        headroom_bytes=options.headroom_bytes + int(margin * limit),
        max_batch=max(options.min_batch, squeezed.batch_size),  # the plain program needs no less
    )
    try:
        safe: FitResult | None = fit_batch(source, plain, progress=progress)
    except DoesNotFitError:
        safe = None
    return GpuEstimate(target, safe, squeezed, margin)
