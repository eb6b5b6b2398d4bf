"""A workload: a train step, its abstract arguments as a function of batch size, and how it is jitted.

JAX is imported lazily, so that importing jaxfit (and answering from the cache) stays fast.

jaxfit never runs a workload. It lowers and compiles it with abstract arguments
(``jax.ShapeDtypeStruct`` pytrees) at candidate batch sizes and reads XLA's memory analysis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

AbstractArgsFn = Callable[[int], tuple[Any, ...]]


@dataclasses.dataclass(frozen=True)
class Workload:
    """A training step that jaxfit can compile at any batch size.

    Attributes:
      name: A short human-readable name (shown in tables, logs and the cache).
      step_fn: The un-jitted step function, e.g. ``train_step(state, batch) -> (state, metrics)``.
      abstract_args: ``batch_size -> args``: the positional arguments of ``step_fn`` as pytrees of
        ``jax.ShapeDtypeStruct`` (or concrete arrays) for that batch size.
      donate_argnums: Arguments donated to the step (the train state, usually), as in ``jax.jit``.
      in_shardings: Passed to ``jax.jit`` when not ``None``.
      out_shardings: Passed to ``jax.jit`` when not ``None``.
      static_argnums: Passed to ``jax.jit``.
      description: Free-form facts about the workload (its config, parameter count...), reported
        with the result. Must be JSON-serialisable. ``field_names`` (``{argument: [names]}``) names
        the fields of a tuple argument in the memory breakdown (``{"state": ["params", "opt_state"]}``).
      batch_argnum: Which positional argument is the batch (default the last).
    """

    name: str
    step_fn: Callable[..., Any]
    abstract_args: AbstractArgsFn
    donate_argnums: tuple[int, ...] = ()
    in_shardings: Any = None
    out_shardings: Any = None
    static_argnums: tuple[int, ...] = ()
    description: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    batch_argnum: int = -1

    def jitted(self) -> Any:
        """The step wrapped in ``jax.jit`` with this workload's donation and shardings."""
        import jax

        kwargs: dict[str, Any] = {"donate_argnums": self.donate_argnums}
        if self.static_argnums:
            kwargs["static_argnums"] = self.static_argnums
        if self.in_shardings is not None:
            kwargs["in_shardings"] = self.in_shardings
        if self.out_shardings is not None:
            kwargs["out_shardings"] = self.out_shardings
        return jax.jit(self.step_fn, **kwargs)

    def lower(self, batch_size: int) -> Any:
        """Lower (trace) the step at ``batch_size`` without compiling or running it."""
        return self.jitted().lower(*self.abstract_args(batch_size))


def from_state(
    name: str,
    step_fn: Callable[[Any, Any], Any],
    state: Any,
    batch_spec: Callable[[int], Any],
    *,
    donate_state: bool = True,
    description: Mapping[str, Any] | None = None,
) -> Workload:
    """Build the common ``step(state, batch)`` workload.

    Args:
      name: A short name.
      step_fn: ``step(state, batch) -> (new_state, metrics)``.
      state: The train state as a pytree of ``jax.ShapeDtypeStruct`` (``jax.eval_shape`` of the
        initialiser gives it without allocating anything).
      batch_spec: ``batch_size -> batch`` pytree of ``jax.ShapeDtypeStruct``.
      donate_state: Donate the state to the step, as real training loops do; the compiled peak
        then counts the state once, not twice.
      description: Facts reported with the result.

    Returns:
      The workload.
    """
    return Workload(
        name=name,
        step_fn=step_fn,
        abstract_args=lambda batch_size: (state, batch_spec(batch_size)),
        donate_argnums=(0,) if donate_state else (),
        description=dict(description or {}),
    )


def abstractify(tree: Any) -> Any:
    """Replace every array leaf of ``tree`` by its ``jax.ShapeDtypeStruct`` (shardings kept)."""
    import jax

    def leaf(x: Any) -> Any:
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            sharding = getattr(x, "sharding", None)
            try:
                return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
            except TypeError:  # very old jax without the sharding argument
                return jax.ShapeDtypeStruct(x.shape, x.dtype)
        return x

    return jax.tree_util.tree_map(leaf, tree)


def count_bytes(tree: Any) -> int:
    """Total bytes of the array leaves of ``tree`` (abstract or concrete)."""
    from jaxfit._probe.jaxfit_compile_server import tree_bytes

    return tree_bytes(tree)
