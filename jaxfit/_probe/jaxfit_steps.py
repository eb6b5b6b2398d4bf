"""What a jitted function does with its arguments: the train step is the one that updates the state.

A probe (and the guard of a pinned run) must tell the script's train step from its other jitted
functions, above all an evaluation step that a trainer calls on a few batches before it trains.
Call counts cannot tell them apart (an evaluation at step 0 calls its step first, and more than
once), so jaxfit looks at what each function *does*, by tracing it (nothing runs):

- a **train step** takes the state next to a batch and returns it updated, judged leaf by leaf
  (the flattened arrays, wherever they sit in the argument and output trees, so a library's
  wrapper nesting them a level deeper changes nothing): outputs *computed* by the step (not an
  input handed back unchanged) have the shapes and dtypes of floating-point arrays of rank >= 1
  among its non-batch arguments (parameters), at least two of them or the only one there is. A
  step counter, a loss or a PRNG key alone never counts, nor does an evaluation that hands its
  model back untouched (flax NNX returns every graph node's state from every jitted call).
  Donating an argument (``donate_argnums`` or ``donate_argnames``) is the usual sign, but it is
  neither needed nor enough: a donated argument that is not returned is not an update;
- an **evaluation step** takes the state and a batch and returns metrics: nothing of the state
  comes back. It may run during a probe (evaluation is not training);
- anything without a batch next to other arrays (a data transform, an initialiser) is no step.

The batch is a positional argument whose arrays all lead with one size (openpi's, this
repository's); where the batch shares an argument with the state (equinox's ``filter_jit`` packs
every argument into one), it is the arrays at the end of the flattened arguments that share one
leading size and are not returned updated.

Standard library + jax only, Python 3.9+: it runs in the script's own environment.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

BATCH_ARG_ENV = "JAXFIT_PROBE_BATCH_ARG"


def leaves(tree: Any) -> list:
    """The array leaves (anything with a shape and a dtype) of ``tree``."""
    import jax

    return [x for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "shape") and hasattr(x, "dtype")]


def find_batch_arg(args: tuple, batch_size: Optional[int]) -> "Tuple[int, int]":
    """``(index, leading size)`` of the positional argument that holds the batch.

    The batch is the last positional argument whose arrays all share one leading dimension (equal
    to ``batch_size`` when the command line gave it). ``$JAXFIT_PROBE_BATCH_ARG`` overrides.

    Raises:
      ValueError: no argument looks like a batch.
    """
    forced = os.environ.get(BATCH_ARG_ENV)
    if forced is not None:
        index = int(forced)
        found = leaves(args[index]) if index < len(args) else []
        if not found or any(len(x.shape) == 0 for x in found):
            raise ValueError("argument %d of the step holds no batched arrays" % index)
        return index, int(found[0].shape[0])
    for index in reversed(range(len(args))):
        found = leaves(args[index])
        if not found or any(len(x.shape) == 0 for x in found):
            continue
        sizes = {int(x.shape[0]) for x in found}
        if len(sizes) == 1 and (batch_size is None or sizes == {batch_size}):
            return index, sizes.pop()
    shapes = [[tuple(x.shape) for x in leaves(a)][:3] for a in args]
    raise ValueError(
        "no argument of the step has arrays that all lead with the batch size%s; argument shapes: %s; "
        "pass --batch-arg N" % ("" if batch_size is None else " %d" % batch_size, shapes)
    )


def _server() -> Any:
    """:mod:`jaxfit_compile_server`: on sys.path in the script's process, a package in jaxfit's."""
    try:
        import jaxfit_compile_server as server_mod
    except ImportError:
        from jaxfit._probe import jaxfit_compile_server as server_mod
    return server_mod


def donated_positions(fun: Any, jit_kwargs: "Dict[str, Any]") -> "Tuple[int, ...]":
    """The positional arguments ``jax.jit(fun, **jit_kwargs)`` donates, from ``donate_argnums``
    and ``donate_argnames`` both (names are mapped to positions through ``fun``'s signature, as
    jax does; ``functools.partial`` arguments are skipped)."""
    positions = set()
    nums = jit_kwargs.get("donate_argnums")
    if nums is not None:
        positions.update((nums,) if isinstance(nums, int) else tuple(nums))
    names = jit_kwargs.get("donate_argnames")
    if names is not None:
        names = (names,) if isinstance(names, str) else tuple(names)
        params = _server().positional_parameters(fun)
        positions.update(i for i, name in enumerate(params) if name in names)
    return tuple(sorted(positions))


def _floating(x: Any) -> bool:
    """Whether ``x`` is a floating-point array of rank >= 1 (parameters, not a counter, a loss or a
    PRNG key)."""
    import jax.numpy as jnp

    try:  # jax's own test: numpy does not count bfloat16 (ml_dtypes) as floating
        floating = bool(jnp.issubdtype(x.dtype, jnp.floating))
    except TypeError:  # extended dtypes (PRNG keys)
        floating = False
    return floating and len(x.shape) >= 1


def _signature_of(x: Any) -> "Tuple[Tuple[int, ...], str]":
    return tuple(int(d) for d in x.shape), str(x.dtype)


def computed_outputs(jitted: Any, args: tuple, kwargs: "Dict[str, Any]") -> "list":
    """The output arrays a call computes, as abstract values: tracing only (nothing runs). An output
    that is one of the inputs handed back unchanged is left out (it updates nothing), where this jax
    can tell (``jit(...).trace``, jax 0.4.36 and newer); elsewhere every output counts."""
    import jax

    with _server().runtime_typechecks_off():
        trace = getattr(jitted, "trace", None)
        if trace is not None:
            try:
                closed = trace(*args, **kwargs).jaxpr
                inner = closed.jaxpr
                invars = set(inner.invars)
                out = []
                for var, aval in zip(inner.outvars, closed.out_avals):
                    try:
                        handed_back = var in invars
                    except TypeError:  # a literal: a constant, computed from nothing
                        handed_back = True
                    if not handed_back and hasattr(aval, "shape"):
                        out.append(aval)
                return out
            except AttributeError:  # a wrapper whose trace is not jax's
                pass
        return leaves(jax.eval_shape(jitted, *args, **kwargs))


class Selection:
    """Which arrays of a call are its batch.

    Attributes:
      ids: ``id()`` of each batch array among the call's arguments.
      size: Their leading size (the batch size the script called with).
      index: The positional argument that is the batch, when one is; None when the batch arrays
        sit inside arguments that hold other things too.
      count: How many arrays the batch has.
    """

    def __init__(self, ids: "frozenset", size: int, index: Optional[int], count: int) -> None:
        self.ids = ids
        self.size = size
        self.index = index
        self.count = count

    def where(self) -> str:
        """In words, for messages."""
        if self.index is not None:
            return "argument %d" % self.index
        return "%d array%s of leading size %d" % (self.count, "" if self.count == 1 else "s", self.size)


def find_batch(
    args: tuple, kwargs: "Dict[str, Any]", batch_size: Optional[int], updated: "frozenset" = frozenset()
) -> Selection:
    """The batch of a call: the positional argument whose arrays all lead with the batch size
    (:func:`find_batch_arg`), else (no argument holds the batch alone) the arrays at the end of the
    flattened arguments that share one leading size, stopping at one that comes back updated
    (``updated``: their ids) or leads with another size. ``batch_size``: the size the command line gave, when it did.

    Raises:
      ValueError: no arrays look like a batch.
    """
    import jax

    try:
        index, size = find_batch_arg(args, batch_size)
        found = leaves(args[index])
        return Selection(frozenset(id(x) for x in found), size, index, len(found))
    except ValueError as e:
        error = e
    if os.environ.get(BATCH_ARG_ENV) is not None:
        raise error
    run: "list" = []
    for x in reversed(
        [x for x in jax.tree_util.tree_leaves((args, kwargs)) if hasattr(x, "shape") and hasattr(x, "dtype")]
    ):
        if len(x.shape) == 0:
            continue
        if id(x) in updated or (run and int(x.shape[0]) != int(run[0].shape[0])):
            break
        run.append(x)
    if run and (batch_size is None or int(run[0].shape[0]) == batch_size):
        return Selection(frozenset(id(x) for x in run), int(run[0].shape[0]), None, len(run))
    raise error


def updated_arrays(
    args: tuple, kwargs: "Dict[str, Any]", computed: "list", batch_ids: "frozenset" = frozenset()
) -> "list":
    """The input arrays that ``computed`` (abstract outputs) replace: floating-point arrays of rank
    >= 1 (not of the batch, ``batch_ids``) with an output of their shape and dtype, each output
    standing for one input."""
    import collections

    import jax

    wanted = collections.Counter(_signature_of(x) for x in computed if _floating(x))
    out = []
    for x in jax.tree_util.tree_leaves((args, kwargs)):
        if hasattr(x, "shape") and hasattr(x, "dtype") and _floating(x) and id(x) not in batch_ids:
            key = _signature_of(x)
            if wanted[key] > 0:
                wanted[key] -= 1
                out.append(x)
    return out


def _positions(args: tuple, ids: "frozenset") -> "list":
    """The positional arguments holding any of the arrays ``ids``."""
    return [i for i, a in enumerate(args) if any(id(x) in ids for x in leaves(a))]


class Kind:
    """What one call of a jitted function does (see the module docstring).

    Attributes:
      step_like: It takes a batch next to other arrays.
      updates_state: It returns a non-batch argument updated (a train step).
      batch_arg: Which positional argument is the batch (None when not step-like).
      state_arg: Which positional argument comes back updated (None when none does).
      donated: The positional arguments it donates.
      traced: Whether its output was traced (False: tracing failed and donation alone decided).
      why: In words, for messages.
      updated_positions: Where the arrays it returns updated sit among the call's flattened
        arguments (``jax.tree_util.tree_leaves((args, kwargs))``): the same for every call of one
        signature.
    """

    def __init__(
        self,
        step_like: bool,
        updates_state: bool,
        batch_arg: Optional[int],
        state_arg: Optional[int],
        donated: "Tuple[int, ...]",
        traced: bool,
        why: str,
        updated_positions: "Tuple[int, ...]" = (),
    ) -> None:
        self.updated_positions = updated_positions
        self.step_like = step_like
        self.updates_state = updates_state
        self.batch_arg = batch_arg
        self.state_arg = state_arg
        self.donated = donated
        self.traced = traced
        self.why = why

    @property
    def label(self) -> str:
        """``train step``, ``evaluation`` or ``no step``."""
        if self.updates_state:
            return "train step"
        return "evaluation" if self.step_like else "no step"

    def to_dict(self) -> "Dict[str, Any]":
        return {
            "step_like": self.step_like,
            "updates_state": self.updates_state,
            "batch_arg": self.batch_arg,
            "state_arg": self.state_arg,
            "donated": list(self.donated),
            "traced": self.traced,
            "why": self.why,
            "kind": self.label,
        }


def classify(
    jitted: Any,
    args: tuple,
    kwargs: "Dict[str, Any]",
    donated: "Tuple[int, ...]",
    batch_size: Optional[int] = None,
) -> Kind:
    """What a call ``jitted(*args, **kwargs)`` does, by tracing it (nothing runs, nothing is
    allocated). With jaxtyping's run-time checks off while tracing, as when lowering.
    ``batch_size``: the batch size the command line gave, when it did.
    """
    try:
        computed = computed_outputs(jitted, args, kwargs)
        traced = True
    except Exception as e:
        computed, traced, failure = [], False, type(e).__name__
    updated = updated_arrays(args, kwargs, computed)
    try:
        batch = find_batch(args, kwargs, batch_size, frozenset(id(x) for x in updated))
    except (ValueError, IndexError):
        return Kind(False, False, None, None, donated, traced, "it takes no batch")
    import jax

    others = [
        x
        for x in jax.tree_util.tree_leaves((args, kwargs))
        if hasattr(x, "shape") and hasattr(x, "dtype") and id(x) not in batch.ids
    ]
    if not others:
        return Kind(
            False, False, batch.index, None, donated, traced, "it takes a batch and nothing else (a data transform)"
        )
    if not traced:
        state = [i for i in range(len(args)) if i != batch.index and i in donated and leaves(args[i])]
        why = "its output could not be traced (%s)" % failure
        if state:
            return Kind(
                True,
                True,
                batch.index,
                state[0],
                donated,
                False,
                "%s; it donates argument %d next to a batch (%s)" % (why, state[0], batch.where()),
            )
        return Kind(True, False, batch.index, None, donated, False, "%s and it donates no state" % why)
    updated = updated_arrays(args, kwargs, computed, batch.ids)
    parameters = [x for x in others if _floating(x)]
    if not updated or (len(updated) < 2 and len(parameters) > 1):
        return Kind(
            True,
            False,
            batch.index,
            None,
            donated,
            True,
            "it takes a batch (%s) and returns none of its other arguments updated" % batch.where(),
        )
    updated_ids = frozenset(id(x) for x in updated)
    flat = jax.tree_util.tree_leaves((args, kwargs))
    positions = _positions(args, updated_ids)
    state_arg = positions[0] if positions else None
    where = "argument %s" % ", ".join(str(i) for i in positions) if positions else "its keyword arguments"
    return Kind(
        True,
        True,
        batch.index,
        state_arg,
        donated,
        True,
        "it returns %d of the %d arrays of %s updated (computed, same shapes and dtypes)%s and takes a batch (%s)"
        % (
            len(updated),
            len(parameters),
            where,
            ", donated" if state_arg in donated else "",
            batch.where(),
        ),
        tuple(i for i, x in enumerate(flat) if id(x) in updated_ids),
    )


def arrays_at(args: tuple, kwargs: "Dict[str, Any]", positions: "Tuple[int, ...]") -> "frozenset":
    """``id()`` of the arrays at ``positions`` among the call's flattened arguments (:attr:`Kind.updated_positions`)."""
    import jax

    flat = jax.tree_util.tree_leaves((args, kwargs))
    return frozenset(id(flat[i]) for i in positions if i < len(flat))


def call_signature(args: tuple, kwargs: "Dict[str, Any]") -> Any:
    """A hashable key of a call's shapes and dtypes (its structure included)."""
    import jax

    flat, tree = jax.tree_util.tree_flatten((args, kwargs))
    return tree, tuple((tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x).__name__))) for x in flat)


def is_traced(args: tuple, kwargs: "Dict[str, Any]") -> bool:
    """Whether a call happens inside a trace (its arguments are tracers): a nested jit, not a step."""
    import jax

    tracer = getattr(jax.core, "Tracer", None)
    return tracer is not None and any(isinstance(x, tracer) for x in jax.tree_util.tree_leaves((args, kwargs)))


def names_of(calls: "Dict[str, int]", kinds: "Dict[str, str]", limit: int = 12) -> str:
    """``name (N, evaluation), ...``: the functions called, most called first."""
    ordered = sorted(calls.items(), key=lambda kv: -kv[1])[:limit]
    return ", ".join(
        "%s (%d%s)" % (name, count, ", %s" % kinds[name] if name in kinds else "") for name, count in ordered
    )
