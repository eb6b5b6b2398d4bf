"""Untuned compiles one fit lends the next fit of the same step under another limit.

``jaxfit plan`` fits one step on several cards: one fit per card, each under its card's limit,
each starting its untuned search from nothing. Far below a limit XLA does not squeeze the program,
so a batch that needed well under one card's budget needs about the same under another card's,
and a batch far over a smaller card's budget is over a larger card's too. While
:func:`shared_untuned_curves` is open, each fit on a GPU records its untuned compiles and seeds its
own search with those of earlier fits of the same step that are far from its budget
(:func:`seed`). They only guide the untuned search; every answer is still proved by autotuned
compiles on both sides of its boundary, in the fit's own process.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
from collections.abc import Iterator, Mapping
from typing import Any

MARGIN = 0.10
"""How far from a budget (a share of it) a lent point must lie: the search's own trust margin
(:data:`jaxfit.fit.search.TRUST_MARGIN`)."""


@dataclasses.dataclass(frozen=True)
class Curve:
    """One fit's untuned compiles: ``need`` (batch -> bytes needed) under ``budget`` bytes."""

    budget: int
    need: dict[int, int]


_CURVES: contextvars.ContextVar[dict[str, list[Curve]] | None] = contextvars.ContextVar(
    "jaxfit_shared_untuned_curves", default=None
)


@contextlib.contextmanager
def shared_untuned_curves() -> Iterator[None]:
    """While open, fits of the same step lend each other their untuned compiles (this module)."""
    token = _CURVES.set({})
    try:
        yield
    finally:
        _CURVES.reset(token)


def step_key(workload: Mapping[str, Any], device: Mapping[str, Any]) -> str:
    """What makes two fits' curves comparable: the step (the workload as the compile process
    describes it, its mesh included) on the same kind and count of device, under the same jax."""
    return json.dumps(
        {
            "workload": workload,
            "device": [device.get(k) for k in ("platform", "device_kind", "device_count", "jax_version")],
        },
        sort_keys=True,
        default=str,
    )


def seed(key: str, budget: int, margin: float = MARGIN) -> dict[int, float]:
    """Batch -> excess over ``budget`` (``need - budget``) from earlier fits of ``key``: a batch that
    needed ``margin`` or more under both that fit's budget and this one, and a batch that needed
    ``margin`` or more over this budget under a budget no larger (a larger one squeezes less).
    Empty outside :func:`shared_untuned_curves`. The latest fit's value wins for a batch."""
    curves = _CURVES.get()
    if not curves:
        return {}
    lent: dict[int, float] = {}
    for curve in curves.get(key, []):
        for batch, need in curve.need.items():
            roomy = need <= (1 - margin) * min(budget, curve.budget)
            over = need >= (1 + margin) * budget and curve.budget <= budget
            if roomy or over:
                lent[batch] = float(need - budget)
    return lent


def record(key: str, budget: int, need: Mapping[int, int]) -> None:
    """Keep a fit's untuned compiles for later fits of ``key`` (nothing outside
    :func:`shared_untuned_curves`)."""
    curves = _CURVES.get()
    if curves is not None and need:
        curves.setdefault(key, []).append(Curve(budget, dict(need)))
