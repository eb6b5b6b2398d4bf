"""Memory per component: what a step's peak is made of (``jaxfit fit --breakdown``).

The peak is ``argument + output - alias + temp`` (docs/guides/facts.md #1). The arguments are known
exactly from their shapes, by name: the parameters, the optimizer state, other state (an EMA copy,
a step counter, a random key) and the batch. What the peak holds beyond its arguments (the
gradients, the activations, the workspace, and outputs that do not reuse a donated input) is exact
as a total, but XLA does not say how it splits: the gradients are estimated as one copy of the
parameters, the rest is activations and workspace. The entries add up to the peak.

On a mesh the analysis is per device, and so is every entry: an argument counts the shard one
device holds, and ``whole_bytes`` says what it would hold replicated (what FSDP divides).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from jaxfit.fit.memory import MemoryReport

Category = Literal["parameters", "optimizer state", "other state", "batch", "gradients", "activations and workspace"]

PARAMETER_NAMES = frozenset({"params", "parameters", "weights", "variables", "model"})
"""Top-level state fields that hold the trained parameters (``model``: an NNX or equinox model
passed to the step whole)."""
OPTIMIZER_NAMES = frozenset({"opt_state", "optimizer_state", "optimizer", "opt"})
"""Top-level state fields that hold the optimizer state."""


@dataclasses.dataclass(frozen=True)
class Component:
    """One part of the peak.

    Attributes:
      name: What it is (``state.params``, ``batch``, ``gradients``...).
      category: Which of the categories of :data:`Category` it counts under.
      bytes: Its bytes.
      exact: Whether the bytes are exact (argument shapes; the total beyond the arguments) or an
        estimate (the split of that total into gradients and the rest).
      whole_bytes: For an argument, its unsharded size (equal to ``bytes`` on one device or when
        replicated); ``None`` for what lies beyond the arguments.
    """

    name: str
    category: Category
    bytes: int
    exact: bool
    whole_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _category(name: str) -> Category:
    if name == "batch":
        return "batch"
    for part in reversed(name.split(".")):  # the innermost known name decides: model.layers, state.params
        if part in PARAMETER_NAMES:
            return "parameters"
        if part in OPTIMIZER_NAMES:
            return "optimizer state"
    return "other state"


def breakdown(memory: MemoryReport, arguments: Sequence[tuple[str, int] | tuple[str, int, int]]) -> list[Component]:
    """The peak of ``memory`` by component, from the named argument sizes of the same compile
    (``(name, bytes)`` or ``(name, bytes on one device, unsharded bytes)``).

    Returns:
      The components, adding up to ``memory.peak_bytes``; empty when the arguments are unknown
      (a compile served from the cache of jaxfit 0.2) or do not match the analysis. An argument
      the step never reads (``del rng``) is not in the compiled program (jax prunes it): when the
      names count exactly one such argument too many, it is left out.
    """
    named = [(a[0], a[1], a[2] if len(a) > 2 else a[1]) for a in arguments]
    extra = sum(b for _, b, _ in named) - memory.argument_bytes
    if extra > 0:
        unused = [i for i, (_, b, _) in enumerate(named) if b == extra]
        if unused:
            del named[unused[-1]]
    if not named or sum(b for _, b, _ in named) != memory.argument_bytes:
        return []
    parts = [Component(name, _category(name), size, True, whole) for name, size, whole in named]
    beyond = memory.peak_bytes - memory.argument_bytes
    params = sum(c.bytes for c in parts if c.category == "parameters")
    gradients = min(params, max(0, beyond))
    parts.append(Component("gradients (estimate: one copy of the parameters)", "gradients", gradients, False))
    parts.append(
        Component(
            "activations, workspace, outputs (the rest of the peak)",
            "activations and workspace",
            beyond - gradients,
            False,
        )
    )
    return parts


def by_category(parts: Sequence[Component]) -> dict[str, int]:
    """Bytes per category, in the order of :data:`Category`."""
    out: dict[str, int] = {}
    for c in parts:
        out[c.category] = out.get(c.category, 0) + c.bytes
    return out
