"""Gradient accumulation: keep a global batch (samples per optimizer step) with micro-batches that fit.

The convention is that of openpi-style scripts and ``scripts/train.py``: ``--batch-size`` is the
global batch and ``--grad-accum-steps`` splits it into that many micro-batches. Accumulation adds a
gradient buffer, so a micro-batch that fits alone need not fit accumulated: the accumulated step
is compiled to prove it (:func:`fit_accumulated`), the compiler decides, not the arithmetic.
Used by ``jaxfit run --global-batch`` and by ``global_batch`` in a schedule's queue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxfit.errors import ConfigError, DoesNotFitError, JaxfitError
from jaxfit.fit import FitOptions, FitResult, fit_batch, fit_fraction
from jaxfit.fit.command import batch_value, with_batch
from jaxfit.fit.common import Progress
from jaxfit.fit.sources import DEFAULT_ACCUM_FLAG, DEFAULT_BATCH_FLAG, ScriptSource

BATCH_FLAG = DEFAULT_BATCH_FLAG
"""The batch flag: samples per optimizer step (the global batch)."""
ACCUM_FLAG = DEFAULT_ACCUM_FLAG
"""The accumulation flag: how many micro-batches one step's batch is split into (as scripts/train.py)."""
MAX_TRIES = 4
"""Accumulation choices compiled, fewest steps first, before giving up."""


def accumulation_choices(global_batch: int, micro_limit: int) -> list[int]:
    """Accumulation steps ``a`` that split ``global_batch`` evenly into micro-batches of at most
    ``micro_limit`` samples, fewest steps first (empty when ``micro_limit < 1``)."""
    if micro_limit < 1:
        return []
    return [a for a in divisors(global_batch) if global_batch // a <= micro_limit]


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending, found up to its square root: 46,341 trials for the largest
    batch jaxfit takes (:data:`jaxfit.fit.options.BATCH_LIMIT`), where counting up to ``n`` took
    seconds at 10^8 and never ended at 10^20."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def next_accumulation(global_batch: int, steps: int) -> int | None:
    """The next larger accumulation that divides ``global_batch`` (a smaller micro-batch), or None."""
    return next((a for a in divisors(global_batch) if a > steps), None)


def with_steps(
    command: Sequence[str], batch: int, steps: int, batch_flag: str = BATCH_FLAG, accum_flag: str = ACCUM_FLAG
) -> tuple[str, ...]:
    """``command`` with ``batch_flag=batch`` and, when accumulating or already set, ``accum_flag=steps``."""
    out = with_batch(list(command), batch_flag, batch)
    if steps > 1 or batch_value(out, accum_flag) is not None:
        out = with_batch(out, accum_flag, steps)
    return tuple(out)


def accumulated_command(
    command: Sequence[str], global_batch: int, steps: int, batch_flag: str = BATCH_FLAG, accum_flag: str = ACCUM_FLAG
) -> list[str]:
    """``command`` with ``batch_flag=global_batch`` and ``accum_flag=steps``, even for 1."""
    return with_batch(list(with_steps(command, global_batch, steps, batch_flag, accum_flag)), accum_flag, steps)


def fit_accumulated(
    source: ScriptSource,
    global_batch: int,
    options: FitOptions,
    *,
    fraction: float | None,
    micro_limit: int,
    progress: Progress | None = None,
    label: str = "",
    hint: str = "raise the fraction",
) -> tuple[int, FitResult]:
    """The fewest accumulation steps under which ``global_batch`` compiles and fits.

    With a ``fraction`` the step at ``batch=global --grad-accum-steps=a`` is compiled under it
    (``a`` from :func:`accumulation_choices`, fewest first, at most :data:`MAX_TRIES`, until one
    fits); without, the smallest fraction that holds the first choice is fitted.

    Args:
      source: A script source (:func:`jaxfit.fit.sources.script_source`); its command is probed with
        the batch flag set to ``global_batch`` and the accumulation flag to ``a``.
      global_batch: Samples per optimizer step.
      options: Fit options (bounds are replaced: only ``global_batch`` is compiled).
      fraction: The fraction to fit under, or ``None`` to find the smallest.
      micro_limit: The largest micro-batch to split into (the given or fitted batch).
      progress: Fit progress events.
      label: Prefix of the progress notes (an experiment's name).
      hint: How to fix it, ending the error when nothing fits.

    Raises:
      ConfigError: no accumulation choice fits (the message names those tried).
    """
    last: JaxfitError | None = None
    tried: list[str] = []
    for steps in accumulation_choices(global_batch, micro_limit)[:MAX_TRIES]:
        tried.append(f"{steps} x {global_batch // steps}")
        command = accumulated_command(source.run_command, global_batch, steps, source.batch_flag, source.accum_flag)
        accumulated = source.with_command(command, global_batch)
        if progress is not None:
            progress("note", {"text": f"{label}global batch {global_batch} as {steps} x {global_batch // steps}"})
        if fraction is None:
            return steps, fit_fraction(accumulated, global_batch, options, progress=progress)
        exact = dataclasses.replace(
            options, mem_fraction=fraction, min_batch=global_batch, max_batch=global_batch, multiple_of=steps
        )
        try:
            return steps, fit_batch(accumulated, exact, progress=progress)
        except DoesNotFitError as err:
            last = err
    raise ConfigError(
        f"global batch {global_batch} does not fit under fraction {fraction:.2f} accumulated as "
        f"{' or '.join(tried) or 'micro-batches that fit'} (steps x micro-batch)"
        + (f": {str(last).split(';')[0]}" if last else "")
        + f"; {hint}"
    )
