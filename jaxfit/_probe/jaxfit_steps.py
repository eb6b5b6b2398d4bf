"""What a jitted function does with its arguments: the train step is the one that updates the state.

A probe (and the guard of a pinned run) must tell the script's train step from its other jitted
functions, above all an evaluation step that a trainer calls on a few batches before it trains.
Call counts cannot tell them apart (an evaluation at step 0 calls its step first, and more than
once), so jaxfit looks at what each function *does*, by tracing it (nothing runs):

- a **train step** takes the state next to a batch and returns it updated: some part of its output
  has the structure, shapes and dtypes of a non-batch argument (or of one of that argument's
  top-level parts), and that part holds a floating-point array of rank >= 1 (parameters), so a
  step counter, a loss or a PRNG key alone never counts. Donating that argument
  (``donate_argnums`` or ``donate_argnames``) is the usual sign, but it is neither needed nor
  enough: a donated argument that is not returned is not an update;
- an **evaluation step** takes the state and a batch and returns metrics: nothing of the state
  comes back. It may run during a probe (evaluation is not training);
- anything without a batch next to other arrays (a data transform, an initialiser) is no step.

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


def _signature(tree: Any) -> Any:
    """What must be equal for an output part to be an argument updated: structure, shapes, dtypes."""
    return _server().tree_signature(tree)


def _parts(tree: Any) -> list:
    """``tree`` and its top-level parts (the items of a tuple, list or dict, the fields of a
    dataclass-like pytree are not split: a state is matched whole or by its container's items)."""
    out = [tree]
    if isinstance(tree, (tuple, list)):
        out.extend(tree)
    elif isinstance(tree, dict):
        out.extend(tree.values())
    return out


def _substantial(tree: Any) -> bool:
    """Whether ``tree`` holds a floating-point array of rank >= 1 (parameters, not a counter,
    a loss or a PRNG key)."""
    import jax.numpy as jnp

    for x in leaves(tree):
        try:  # jax's own test: numpy does not count bfloat16 (ml_dtypes) as floating
            floating = bool(jnp.issubdtype(x.dtype, jnp.floating))
        except TypeError:  # extended dtypes (PRNG keys)
            floating = False
        if floating and len(x.shape) >= 1:
            return True
    return False


def _abstract_args(args: tuple) -> list:
    """Each argument as the abstract values jax sees (so Python scalars compare as arrays do)."""
    import jax

    out = []
    for a in args:
        try:
            out.append(jax.eval_shape(lambda x: x, a))
        except Exception:
            out.append(a)
    return out


def updated_argument(args: tuple, out: Any, batch_index: int) -> "Optional[Tuple[int, str]]":
    """``(index, part)`` of the first non-batch argument whose value (``part == ''``) or one of whose
    top-level parts (``part == '[k]'``) comes back in ``out`` (abstract), or None."""
    wanted = {}
    for part in _parts(out):
        if _substantial(part):
            wanted.setdefault(_signature(part), True)
    if not wanted:
        return None
    abstract = _abstract_args(args)
    for i, arg in enumerate(abstract):
        if i == batch_index or not _substantial(arg):
            continue
        if _signature(arg) in wanted:
            return i, ""
        parts = _parts(arg)[1:]
        keys = list(arg.keys()) if isinstance(arg, dict) else list(range(len(parts)))
        for key, part in zip(keys, parts):
            if _substantial(part) and _signature(part) in wanted:
                return i, "[%r]" % (key,)
    return None


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
    ) -> None:
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


def classify(jitted: Any, args: tuple, kwargs: "Dict[str, Any]", donated: "Tuple[int, ...]") -> Kind:
    """What a call ``jitted(*args, **kwargs)`` does, by tracing it (:func:`jax.eval_shape`; nothing
    runs, nothing is allocated). With jaxtyping's run-time checks off while tracing, as when lowering.
    """
    try:
        batch, _ = find_batch_arg(args, None)
    except (ValueError, IndexError):
        return Kind(False, False, None, None, donated, False, "it takes no batch")
    others = [i for i in range(len(args)) if i != batch and leaves(args[i])]
    if not others:
        return Kind(False, False, batch, None, donated, False, "it takes a batch and nothing else (a data transform)")
    import jax

    try:
        with _server().runtime_typechecks_off():
            out = jax.eval_shape(jitted, *args, **kwargs)
    except Exception as e:
        state = [i for i in others if i in donated]
        why = "its output could not be traced (%s)" % type(e).__name__
        if state:
            return Kind(
                True,
                True,
                batch,
                state[0],
                donated,
                False,
                "%s; it donates argument %d next to a batch (argument %d)" % (why, state[0], batch),
            )
        return Kind(True, False, batch, None, donated, False, "%s and it donates no state" % why)
    found = updated_argument(args, out, batch)
    if found is None:
        return Kind(
            True,
            False,
            batch,
            None,
            donated,
            True,
            "it takes a batch (argument %d) and returns none of its other arguments updated" % batch,
        )
    index, part = found
    return Kind(
        True,
        True,
        batch,
        index,
        donated,
        True,
        "it returns argument %d%s updated (same structure, shapes and dtypes)%s and takes a batch (argument %d)"
        % (index, part, ", donated" if index in donated else "", batch),
    )


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
