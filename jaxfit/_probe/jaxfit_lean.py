"""A lean start-up for a probe that compiles for a GPU that is not here (``fit --script --gpu``).

Such a probe runs the script on the CPU only to reach its train step, and compiling the step for
the card needs the shapes, dtypes and placement of the step's arguments, not their values. A
script's state is usually made by a jitted init: openpi's ``init_train_state`` builds pi0's
3.3B-parameter state in float32 on the CPU, 26 GiB of host memory for a LoRA config and 50 GiB for
a full fine-tune, where the step's compile needs a few.

With ``$JAXFIT_PROBE_LEAN`` set to 1, a jitted function the script calls before its step whose
outputs total at least :data:`MIN_BYTES` does not run. Its large outputs (:data:`LEAF_BYTES` each
or more) come back as ``jax.ShapeDtypeStruct`` stand-ins with the shape, dtype and sharding the
call gives them (``jax.eval_shape``: traced, nothing computed), and its small ones (a step counter,
a PRNG key) are computed for real by the same program with the large outputs left out, where XLA
drops whatever only they need. A call that takes a stand-in gets stand-ins back for all its
outputs. The step itself is compiled from the shapes (the probe never runs it).

A script that computes with its state before its first step (moves it with ``jax.device_put``,
takes a norm of its parameters and prints it) fails on a stand-in; jaxfit then starts it once more
without this (:meth:`jaxfit.fit.compiler.CompileChild.start`) and says why.

Standard library + jax only, Python 3.9+: it runs in the script's environment.
"""

import os
from typing import Any, Callable, Tuple

LEAN_ENV = "JAXFIT_PROBE_LEAN"
MIN_BYTES_ENV = "JAXFIT_PROBE_LEAN_MIN_BYTES"
LEAF_BYTES_ENV = "JAXFIT_PROBE_LEAN_LEAF_BYTES"
MIN_BYTES = 64 * 2**20
"""A call whose outputs total less runs as it is: it costs little memory, and its values may matter."""
LEAF_BYTES = 2**20
"""An output this large or larger comes back as a stand-in; a smaller one is computed."""

RUN = object()
"""What :func:`call` returns for a call that runs as it is."""


def _bytes_setting(name: str, default: int) -> int:
    given = os.environ.get(name, "")
    return int(given) if given.isdigit() else default


def min_bytes() -> int:
    """The outputs a call must make, in bytes, to be left out (``$JAXFIT_PROBE_LEAN_MIN_BYTES`` or
    :data:`MIN_BYTES`)."""
    return _bytes_setting(MIN_BYTES_ENV, MIN_BYTES)


def leaf_bytes() -> int:
    """The size from which an output is left out (``$JAXFIT_PROBE_LEAN_LEAF_BYTES`` or :data:`LEAF_BYTES`)."""
    return _bytes_setting(LEAF_BYTES_ENV, LEAF_BYTES)


def is_stand_in(x: Any) -> bool:
    """Whether ``x`` is an abstract array (a stand-in this module handed back, or any other)."""
    import jax

    return isinstance(x, jax.ShapeDtypeStruct)


def _nbytes(x: Any) -> int:
    try:
        from jaxfit_compile_server import tree_bytes
    except ImportError:  # imported as jaxfit._probe.jaxfit_lean (jaxfit's own tests)
        from jaxfit._probe.jaxfit_compile_server import tree_bytes

    return tree_bytes([x])


def call(
    jitted: Any, original_jit: Callable[..., Any], args: tuple, kwargs: dict, evaluation: bool
) -> "Tuple[Any, int]":
    """``(outputs, bytes left out)`` of ``jitted(*args, **kwargs)`` in a lean start-up, or
    ``(RUN, 0)`` when the call is to run as it is: its outputs are small and its arguments concrete,
    or it is an ``evaluation`` (a batch in, no state updated) on concrete arguments.

    ``original_jit``: jax's own ``jit`` (the probe wraps ``jax.jit``), which compiles the call's
    small outputs.
    """
    import jax

    flat_in, in_tree = jax.tree_util.tree_flatten((args, kwargs))
    abstract_in = any(is_stand_in(x) for x in flat_in)
    if evaluation and not abstract_in:
        return RUN, 0
    try:
        shapes = jax.eval_shape(jitted, *args, **kwargs)
    except Exception:  # not traceable here: the call runs, and says for itself what is wrong
        return RUN, 0
    flat_out, out_tree = jax.tree_util.tree_flatten(shapes)
    sizes = [_nbytes(x) if hasattr(x, "shape") and hasattr(x, "dtype") else 0 for x in flat_out]
    if not abstract_in and sum(sizes) < min_bytes():
        return RUN, 0
    keep = [] if abstract_in else [i for i, size in enumerate(sizes) if size < leaf_bytes()]
    if len(keep) == len(flat_out):  # nothing large to leave out
        return RUN, 0
    outputs = list(flat_out)
    if keep:
        try:
            values = _computed(jitted, original_jit, flat_in, in_tree, keep)
        except Exception:  # the small outputs alone cannot be made: the call runs in full
            return RUN, 0
        for i, value in zip(keep, values):
            outputs[i] = value
    kept = set(keep)
    left_out = sum(size for i, size in enumerate(sizes) if i not in kept)
    return jax.tree_util.tree_unflatten(out_tree, outputs), left_out


def _computed(
    jitted: Any, original_jit: Callable[..., Any], flat_in: list, in_tree: Any, keep: "list[int]"
) -> "list[Any]":
    """The outputs ``keep`` (positions among the call's flattened outputs) of ``jitted`` on the
    call's arguments ``flat_in``, computed by a program that returns only those: the arrays among
    the arguments go in as arguments, anything else (Python numbers, static values) as it is."""
    import jax
    import numpy as np

    dynamic = [i for i, x in enumerate(flat_in) if isinstance(x, (jax.Array, np.ndarray))]

    def small_outputs(*values: Any) -> "list[Any]":
        leaves = list(flat_in)
        for i, value in zip(dynamic, values):
            leaves[i] = value
        call_args, call_kwargs = jax.tree_util.tree_unflatten(in_tree, leaves)
        outputs = jax.tree_util.tree_leaves(jitted(*call_args, **call_kwargs))
        return [outputs[i] for i in keep]

    return list(original_jit(small_outputs)(*[flat_in[i] for i in dynamic]))
