"""jaxfit's start-up hook for training scripts: the probe of ``fit --script``, the wandb settings of ``run``.

``jaxfit fit --script -- <command>`` runs the command with this folder first on PYTHONPATH, so
Python imports this module at start-up, before the script. It waits for ``jax`` to be imported,
wraps ``jax.jit``, and when the script first *calls* the jitted function named
``$JAXFIT_PROBE_STEP_NAME`` (the name is looked up through ``functools.partial``, as in openpi's
``jax.jit(functools.partial(train_step, config), ...)``), it does not run the step: it takes the
call's real arguments, swaps the batch for abstract arrays of any leading size, and answers
jaxfit's compile requests with the script's own jitted object (its shardings and donation
included). Then the process exits; no step ever runs.

Standard library + jax only, Python 3.9+, jax 0.4.30+: the script's environment need not have
jaxfit. ``jaxfit run`` uses the same hook with ``$JAXFIT_WANDB_CONFIG`` (a JSON file) to add the
chosen settings to the config of the script's own ``wandb.init``. Does nothing unless one of the two
variables is set, and hands over to any other ``sitecustomize`` on the path.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import threading
from typing import Any, Optional

_HERE = os.path.dirname(os.path.abspath(__file__))
STEP_NAME = os.environ.get("JAXFIT_PROBE_STEP_NAME")
WANDB_CONFIG = os.environ.get("JAXFIT_WANDB_CONFIG")
_lock = threading.Lock()
_seen: "list[str]" = []
_channels: "list[Any]" = []


def _open_channels() -> "tuple[Any, Any]":
    """(requests, replies): the protocol's descriptors, opened once."""
    with _lock:
        if not _channels:
            sys.path.insert(0, _HERE)
            import jaxfit_compile_server as server_mod

            _channels.extend(server_mod.open_channels())
        return _channels[0], _channels[1]


def _report_jit(name: str) -> None:
    """Tell jaxfit which functions the script jits (named in the error when none is the step)."""
    with _lock:
        if name in _seen:
            return
        _seen.append(name)
    replies = _open_channels()[1]
    with _lock:
        replies.write(json.dumps({"op": "jit_seen", "name": name}) + "\n")
        replies.flush()


def _function_name(fun: Any) -> str:
    """The name of a function, looking through ``functools.partial`` and wrappers."""
    for _ in range(16):
        if isinstance(fun, functools.partial):
            fun = fun.func
        elif hasattr(fun, "__wrapped__"):
            fun = fun.__wrapped__
        else:
            break
    return getattr(fun, "__name__", None) or type(fun).__name__


def _leaves(tree: Any) -> list:
    import jax

    return [x for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "shape") and hasattr(x, "dtype")]


def _find_batch_arg(args: tuple, batch_size: Optional[int]) -> "tuple[int, int]":
    """``(index, leading size)`` of the positional argument that holds the batch.

    The batch is the last positional argument whose arrays all share one leading dimension (equal
    to ``batch_size`` when the command line gave it). ``$JAXFIT_PROBE_BATCH_ARG`` overrides.
    """
    forced = os.environ.get("JAXFIT_PROBE_BATCH_ARG")
    if forced is not None:
        index = int(forced)
        leaves = _leaves(args[index])
        if not leaves or any(len(x.shape) == 0 for x in leaves):
            raise ValueError("argument %d of the step holds no batched arrays" % index)
        return index, int(leaves[0].shape[0])
    for index in reversed(range(len(args))):
        leaves = _leaves(args[index])
        if not leaves or any(len(x.shape) == 0 for x in leaves):
            continue
        sizes = {int(x.shape[0]) for x in leaves}
        if len(sizes) == 1 and (batch_size is None or sizes == {batch_size}):
            return index, sizes.pop()
    shapes = [[tuple(x.shape) for x in _leaves(a)][:3] for a in args]
    raise ValueError(
        "no argument of the step has arrays that all lead with the batch size%s; argument shapes: %s; "
        "pass --batch-arg N" % ("" if batch_size is None else " %d" % batch_size, shapes)
    )


def _resized(tree: Any, batch: int) -> Any:
    """``tree`` with every array replaced by an abstract one of leading size ``batch``."""
    import jax

    def leaf(x: Any) -> Any:
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            return x
        shape = (batch,) + tuple(x.shape[1:])
        sharding = getattr(x, "sharding", None)
        try:
            return jax.ShapeDtypeStruct(shape, x.dtype, sharding=sharding)
        except TypeError:
            return jax.ShapeDtypeStruct(shape, x.dtype)

    return jax.tree_util.tree_map(leaf, tree)


def _serve(jitted: Any, fun: Any, args: tuple, kwargs: dict) -> None:
    """Answer jaxfit's compile requests for this step, then end the process."""
    sys.path.insert(0, _HERE)
    import jaxfit_compile_server as server_mod

    requests, replies = _open_channels()
    try:
        given = os.environ.get("JAXFIT_PROBE_BATCH_SIZE")
        index, seen_batch = _find_batch_arg(args, int(given) if given else None)

        def lower(batch: int) -> Any:
            call_args = list(args)
            call_args[index] = _resized(args[index], batch)
            return jitted.lower(*call_args, **kwargs)

        description = {"script": sys.argv, "step_name": _function_name(fun), "batch_arg": index,
                       "script_batch_size": seen_batch}
        server = server_mod.Server(lower, replies, {"name": _function_name(fun), "description": description},
                                   cache_path=os.environ.get(server_mod.CACHE_PATH_ENV) or None)
    except Exception as e:
        server_mod.send_error(replies, "user", "WorkloadError", "the script's step %r: %s" % (_function_name(fun), e))
        os._exit(3)
    server.ready()
    try:
        server.serve(requests)
    finally:
        replies.flush()
        os._exit(0)  # never run the step, nor anything after it


class _Intercepted:
    """Stands in for the jitted step: its first call serves compiles instead of running."""

    def __init__(self, jitted: Any, fun: Any) -> None:
        self._jitted = jitted
        self._fun = fun
        functools.update_wrapper(self, jitted, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _serve(self._jitted, self._fun, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jitted, name)


def _patch_jax(jax_module: Any) -> None:
    """Wrap ``jax.jit`` so that the step named ``$JAXFIT_PROBE_STEP_NAME`` is intercepted."""
    original = jax_module.jit

    @functools.wraps(original)
    def jit(fun: Any = None, *args: Any, **kwargs: Any) -> Any:
        if fun is None:  # jax.jit(static_argnums=...) used as a decorator factory
            return lambda f: jit(f, *args, **kwargs)
        jitted = original(fun, *args, **kwargs)
        name = _function_name(fun)
        _report_jit(name)
        return _Intercepted(jitted, fun) if name == STEP_NAME else jitted

    jax_module.jit = jit


def _patch_wandb(wandb_module: Any) -> None:
    """Wrap ``wandb.init`` so the run's config also holds jaxfit's settings (key ``jaxfit``).

    wandb's own route, ``WANDB_CONFIG_PATHS``, makes ``wandb.init`` raise in wandb 0.31 (its
    settings model rejects the string), so jaxfit adds the settings right after ``init`` instead.
    """
    original = wandb_module.init
    with open(WANDB_CONFIG) as f:
        settings = json.load(f)

    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> Any:
        run = original(*args, **kwargs)
        try:
            run.config.update({"jaxfit": settings}, allow_val_change=True)
        except Exception as e:  # never break the user's training over bookkeeping
            print("jaxfit: could not add its settings to the wandb config: %s" % e, file=sys.stderr)
        return run

    wandb_module.init = init


class _ImportHook(importlib.abc.MetaPathFinder):
    """Patches a module right after it is imported, before the script uses it."""

    def __init__(self, patches: "dict[str, Any]") -> None:
        self.patches = dict(patches)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        patch = self.patches.pop(name, None)
        if patch is None:
            return None
        if not self.patches:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def _chain_next_sitecustomize() -> None:
    """Run the sitecustomize this one shadows, if the environment has one."""
    others = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None and spec.origin != __file__:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _install() -> None:
    patches = {}
    if STEP_NAME:
        patches["jax"] = _patch_jax
    if WANDB_CONFIG:
        patches["wandb"] = _patch_wandb
    for name in [n for n in patches if n in sys.modules]:
        patches.pop(name)(sys.modules[name])
    if patches:
        sys.meta_path.insert(0, _ImportHook(patches))


_install()
_chain_next_sitecustomize()
