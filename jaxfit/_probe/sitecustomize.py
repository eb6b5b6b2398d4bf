"""jaxfit's start-up hook for training scripts: the probe of ``fit --script``; the pinned program and
the wandb settings of ``run`` and ``schedule``.

jaxfit runs the command with this folder first on PYTHONPATH, so Python imports this module at
start-up, before the script. It waits for ``jax`` to be imported and wraps ``jax.jit``:

- **probe** (``$JAXFIT_PROBE_STEP_NAME``): when the script first *calls* its jitted train step (the
  function of that name, looked up through ``functools.partial`` as in openpi's
  ``jax.jit(functools.partial(train_step, config), ...)``), the step does not run: the call's real
  arguments are kept, the batch is swapped for abstract arrays of any leading size, and jaxfit's
  compile requests are answered with the script's own jitted object (its shardings and donation
  included). Then the process exits. Without ``--step-name`` (``$JAXFIT_PROBE_STEP_AUTO``) a script
  with no ``train_step`` has its step found by what it does (:mod:`jaxfit_steps`, tracing only): the
  first call that takes a batch and returns the state it was given updated. Functions that return
  no updated state (an evaluation on a few batches before training) run, for at most
  :data:`EVAL_SECONDS`; a probe never trains: a call that would update the state and is not the
  step taken is stopped before it runs, and jaxfit is told what the script called. A probe for a
  GPU that is not here (``$JAXFIT_PROBE_LEAN``) traces, rather than runs, the calls before the step
  that make large outputs (:mod:`jaxfit_lean`);
- **pin** (``$JAXFIT_PIN``): the train step runs the executable the fit proved, or is checked
  against the budget before its first step; any other jitted function that would update the state
  (a train step the pin does not cover) stops the process before it runs (:mod:`jaxfit_pin`);
- **cap** (``$JAXFIT_POOL_BYTES``): at the first call of one of the script's jitted functions, every
  GPU's allocator limit is compared with the pool jaxfit set; a process that does not hold it (a
  pool without a limit, jax on the CPU) stops before that call runs (:mod:`jaxfit_cap`);
- **wandb** (``$JAXFIT_WANDB_CONFIG``): the chosen settings join the config of the script's own
  ``wandb.init``.

It acts only in the process it was started for: the first process of the command that imports
jax claims it (``$JAXFIT_HOOK_OWNER``), and the processes that one starts (data-loader workers,
forked or spawned) leave everything alone, since the protocol's descriptors belong to it alone.
Standard library + jax only, Python 3.9+, jax 0.4.30+: the script's environment need not have
jaxfit. Does nothing unless one of the variables is set, and hands over to any other
``sitecustomize`` on the path.
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
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
STEP_NAME = os.environ.get("JAXFIT_PROBE_STEP_NAME")
STEP_AUTO = os.environ.get("JAXFIT_PROBE_STEP_AUTO") == "1"
PIN = os.environ.get("JAXFIT_PIN")
POOL = os.environ.get("JAXFIT_POOL_BYTES")
MEASURE = os.environ.get("JAXFIT_MEASURE")
STANDBY = os.environ.get("JAXFIT_MEASURE_WAIT")
WANDB_CONFIG = os.environ.get("JAXFIT_WANDB_CONFIG")
HELP_CHECK = os.environ.get("JAXFIT_HELP_CHECK") == "1"
LEAN = os.environ.get("JAXFIT_PROBE_LEAN") == "1"
"""A probe for a GPU that is not here, whose start-up leaves large outputs out (:mod:`jaxfit_lean`)."""
HELP_CHECK_EXIT = 97
"""Exit code of a script run with ``--help`` that did not stop there (jaxfit.fit.command)."""
OWNER_ENV = "JAXFIT_HOOK_OWNER"
LIBRARY_MODULES = ("jax", "jaxlib", "flax", "optax", "orbax", "chex", "equinox", "numpy", "scipy", "ml_dtypes")
"""Packages whose own jitted functions are never the train step (nor watched, nor reported)."""
USER_FUNCTION_WRAPPERS = {"equinox._jit": "fun_wrapped"}
"""Functions that a library jits on behalf of the script's own (module -> the wrapper's name before
the library renames it): equinox's ``filter_jit`` jits ``fun_wrapped``, named after the user's
function, in its own module. They are the script's functions, known by the user's name. (flax's
``nnx.jit`` wrappers carry the user's module and name themselves, through ``functools.update_wrapper``.)"""
GRADIENTS = ("grad", "value_and_grad", "vjp")
"""jax's transforms that a train step calls: in a probe, one called outside any trace means the
script trains without jit (:func:`_guard_gradients`)."""
_lock = threading.Lock()
_seen: "list[str]" = []
_channels: "list[Any]" = []
_owner: "list[int]" = []  # the pid this hook acts in, once claimed
_pool_checked: "list[bool]" = []  # set once the cap has been checked in this process


def _importable() -> None:
    """Make this folder's modules (the compile server, the pin loader) importable."""
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)


def _spawned_worker() -> bool:
    """Whether this process is a ``multiprocessing`` child started by spawn or forkserver."""
    return "--multiprocessing-fork" in sys.argv or any("multiprocessing" in a and "spawn_main" in a for a in sys.argv)


def _claim() -> bool:
    """Whether this process is the one the hook acts in; the first to import jax claims it.

    Children it starts see the claim in their environment (spawned) or in the copied claim
    (forked) and stay inert.
    """
    with _lock:
        if not _owner:
            claimed = os.environ.get(OWNER_ENV)
            if claimed is None and not _spawned_worker():
                os.environ[OWNER_ENV] = str(os.getpid())
                claimed = str(os.getpid())
            _owner.append(int(claimed) if claimed and claimed.isdigit() else -1)
        return _owner[0] == os.getpid()


def _open_channels() -> "tuple[Any, Any]":
    """(requests, replies): the protocol's descriptors, opened once."""
    with _lock:
        if not _channels:
            _importable()
            import jaxfit_compile_server as server_mod

            _channels.extend(server_mod.open_channels())
        return _channels[0], _channels[1]


def _send(message: "dict[str, Any]") -> None:
    replies = _open_channels()[1]
    with _lock:
        replies.write(json.dumps(message) + "\n")
        replies.flush()


def _report_jit(name: str) -> None:
    """Tell jaxfit which functions the script jits (named in the error when none is the step)."""
    with _lock:
        if name in _seen:
            return
        _seen.append(name)
    _send({"op": "jit_seen", "name": name})


def _function_name(fun: Any) -> str:
    """The name of a function, looking through ``functools.partial`` and wrappers."""
    _importable()
    from jaxfit_compile_server import function_name

    return function_name(fun)


def _steps() -> Any:
    """:mod:`jaxfit_steps`: what a jitted function does with its arguments."""
    _importable()
    import jaxfit_steps

    return jaxfit_steps


def _abstract(x: Any, batch: int) -> Any:
    """The abstract array of ``x`` with leading size ``batch``: as jit sees ``x`` (its sharding only
    when ``x`` is committed to it, its weak type), so the program lowers exactly as the real call."""
    import jax

    shape = (batch,) + tuple(x.shape[1:])
    committed = getattr(x, "committed", getattr(x, "_committed", True))
    kwargs: "dict[str, Any]" = {}
    if committed and getattr(x, "sharding", None) is not None:
        kwargs["sharding"] = x.sharding
    if getattr(x, "weak_type", False):
        kwargs["weak_type"] = True
    try:
        return jax.ShapeDtypeStruct(shape, x.dtype, **kwargs)
    except TypeError:  # an old jax without some of these arguments
        return jax.ShapeDtypeStruct(shape, x.dtype)


def _resized(tree: Any, batch: int) -> Any:
    """``tree`` with every array replaced by an abstract one of leading size ``batch``
    (:func:`_rebuilt`)."""
    return _rebuilt(tree, lambda x: _abstract(x, batch))


def _resized_arrays(tree: Any, ids: "frozenset", batch: int) -> Any:
    """``tree`` with the arrays ``ids`` (a batch inside arguments that hold other things too)
    replaced by abstract ones of leading size ``batch`` (:func:`_rebuilt`)."""
    return _rebuilt(tree, lambda x: _abstract(x, batch) if id(x) in ids else x)


def _resized_ids(original: Any, resized: Any, ids: "frozenset") -> list:
    """The arrays of ``resized`` that stand where ``original`` has the arrays ``ids``."""
    import jax

    before = jax.tree_util.tree_leaves(original)
    after = jax.tree_util.tree_leaves(resized)
    return [y for x, y in zip(before, after) if id(x) in ids]


def _user_arguments(fun: Any, args: tuple, kwargs: dict, server_mod: Any) -> "tuple[tuple, list[str]]":
    """The step's arguments as the user's function takes them, and their names: equinox's
    ``filter_jit`` packs them into dicts (``first``, ``rest``), which are unpacked here, named from
    the user's signature (found in equinox's ``_call`` frame); other steps' arguments as they are."""
    if getattr(fun, "__module__", "") == "equinox._jit" and len(args) == 3:
        try:
            from equinox._jit import hashable_combine

            merged: "dict[str, Any]" = {}
            for part in args[:2]:
                merged.update(part)
            _, static_first, static_rest = args[2]
            first = hashable_combine(merged["first"], static_first)
            rest_args, rest_kwargs = hashable_combine(merged["rest"], static_rest)
            positional = (first,) + tuple(rest_args[:-1])  # equinox adds a None at the end
            view = positional + ((rest_kwargs,) if rest_kwargs else ())
            return view, _equinox_parameter_names(len(positional)) + (["kwargs"] if rest_kwargs else [])
        except Exception:  # another equinox: its packed arguments, as they are
            pass
    return args, server_mod.argument_names(fun, len(args))


def _equinox_parameter_names(count: int) -> "list[str]":
    """The names of the first ``count`` parameters of the function equinox's ``filter_jit`` wraps,
    from the ``jit_wrapper`` of equinox's ``_call`` up the stack (``argN`` where unknown)."""
    names: "list[str]" = []
    try:
        frame = sys._getframe(1)
        for _ in range(24):
            if frame is None:
                break
            wrapper = frame.f_locals.get("jit_wrapper") if frame.f_code.co_name == "_call" else None
            signature = getattr(wrapper, "_signature", None)
            if signature is not None:
                names = list(signature.parameters)[:count]
                break
            frame = frame.f_back
    except Exception:  # names are a nicety
        names = []
    return names + ["arg%d" % i for i in range(len(names), count)]


def _script_batch_size() -> "int | None":
    """The batch size the script's command line gave (``$JAXFIT_PROBE_BATCH_SIZE``), when it did."""
    given = os.environ.get("JAXFIT_PROBE_BATCH_SIZE")
    return int(given) if given and given.isdigit() else None


def _tiled(tree: Any, batch: int) -> Any:
    """``tree`` with every array replaced by one of leading size ``batch`` holding the array's own
    rows, repeated in turn, placed as :func:`_abstract` says: the script's real batch at the size
    a timing runs. Its values matter: an H200 ran scripts/train.py gpt_small's step 1.7-1.9 times
    slower on the script's state with a batch whose tokens were all 0 than with the script's own
    batch (benchmarks/JOURNAL.md section 35). A leaf that cannot be tiled is noise."""
    import jax
    import numpy as np

    _importable()
    import jaxfit_compile_server as server_mod

    def leaf(x: Any) -> Any:
        abstract = _abstract(x, batch)
        try:
            host = np.asarray(x)
            rows = np.full((batch,), host) if host.ndim == 0 else host[np.arange(batch) % host.shape[0]]
            sharding = getattr(abstract, "sharding", None)
            return jax.device_put(rows, sharding) if sharding is not None else jax.device_put(rows)
        except Exception:  # e.g. PRNG keys, or rows not on this host
            return server_mod.real_arguments(abstract)

    return _rebuilt(tree, leaf)


def _rebuilt(tree: Any, leaf: Any) -> Any:
    """``tree`` with every array ``x`` replaced by ``leaf(x)``.

    Containers are rebuilt without calling their constructors where possible (dataclasses are
    copied field by field): a container that type-checks its fields when built (jaxtyping or
    beartype on a dataclass, as openpi's ``Observation``) would reject abstract arrays, while the
    traced step itself sees tracers, which pass those checks.
    """
    import copy
    import dataclasses

    import jax

    def walk(node: Any) -> Any:
        if hasattr(node, "shape") and hasattr(node, "dtype"):
            return leaf(node)
        if isinstance(node, dict):
            out = copy.copy(node)
            for key in node:
                out[key] = walk(node[key])
            return out
        if isinstance(node, list):
            return [walk(x) for x in node]
        if isinstance(node, tuple):
            items = [walk(x) for x in node]
            return type(node)(*items) if hasattr(node, "_fields") else type(node)(items)
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            out = copy.copy(node)
            for field in dataclasses.fields(node):
                if hasattr(node, field.name):
                    object.__setattr__(out, field.name, walk(getattr(node, field.name)))
            return out
        if not jax.tree_util.all_leaves([node]):  # another pytree node: rebuilt by its own unflatten
            return jax.tree_util.tree_map(lambda x: leaf(x) if hasattr(x, "shape") else x, node)
        return node

    return walk(tree)


def _serve(
    jitted: Any, fun: Any, args: tuple, kwargs: dict, found: str, kind: Any, jit_kwargs: "dict[str, Any]"
) -> None:
    """Answer jaxfit's compile requests for this step, then end the process."""
    global _serving
    _serving = True
    _importable()
    import jaxfit_compile_server as server_mod
    import jaxfit_target

    requests, replies = _open_channels()
    try:
        target = jaxfit_target.load()  # a GPU that is not here: the step is exported and compiled for it
        if target is not None:
            from jaxfit_pin import _static_arguments

            try:
                count = jaxfit_target.device_count((args, kwargs))
                compiled_for = {"devices": jaxfit_target.make_devices(target["spec"], count)}
            except jaxfit_target.NoTopology as e:
                hint = (
                    "its jaxlib cannot read the card's target config"
                    if e.unreadable
                    else "install jax's CUDA plugin there (pip install 'jax[cuda13]' or 'jax[cuda12]', matching its jax)"
                )
                raise RuntimeError(
                    "cannot compile for a GPU that is not here in the script's environment (%s): %s" % (e, hint)
                ) from None
            static = _static_arguments(fun, jit_kwargs)
        steps = _steps()
        selection = steps.find_batch(
            args, kwargs, _script_batch_size(), steps.arrays_at(args, kwargs, getattr(kind, "updated_positions", ()))
        )
        index, seen_batch, ids = selection.index, selection.size, selection.ids

        def resized(batch: int) -> "tuple[tuple, dict]":
            if index is not None:
                call_args = list(args)
                call_args[index] = _resized(args[index], batch)
                return tuple(call_args), kwargs
            return _resized_arrays((args, kwargs), ids, batch)

        def lower(batch: int) -> Any:
            call_args, call_kwargs = resized(batch)
            if target is not None:
                return jaxfit_target.lower_for(
                    jitted, call_args, call_kwargs, compiled_for["devices"], donated, static, _rebuilt
                )
            return jitted.lower(*call_args, **call_kwargs)

        description = {
            "script": sys.argv,
            "step_name": _function_name(fun),
            "batch_arg": index,
            "batch_arrays": selection.count,
            "script_batch_size": seen_batch,
            "step_found": found,
            "step_kind": kind.to_dict(),
            "called": dict(_calls),
            "called_kinds": dict(_kinds),
        }
        description["manifest"] = __import__("jaxfit_manifest").collect()  # the files it ran (a cached repeat)
        mesh = server_mod.mesh_of(args)
        if mesh:  # the script's own mesh: the batch is split over its devices
            description["mesh"] = mesh
        _, names = _user_arguments(fun, args, kwargs, server_mod)

        def components(batch: int) -> list:
            call_args, call_kwargs = resized(batch)
            if index is not None:
                return server_mod.describe_arguments(call_args, names, index)
            new_ids = frozenset(id(x) for x in _resized_ids((args, kwargs), (call_args, call_kwargs), ids))
            view, _ = _user_arguments(fun, call_args, call_kwargs, server_mod)
            return server_mod.describe_arguments(view, names, None, batch_ids=new_ids)

        def retarget(other: "dict[str, Any]") -> "dict[str, Any]":
            # another card (or the same card's other memory size), from the same start-up
            compiled_for["devices"] = jaxfit_target.make_devices(other["spec"], count)
            return jaxfit_target.info_fields(other, count)

        donated = tuple(getattr(kind, "donated", ()) or ())
        # The script's own arguments, live: a timing (``jaxfit tune --measure inline``) runs the
        # proven program on them (the state the script built, the script's batch tiled to the
        # program's size) and donates the state, so each timing starts from the state the last one left.
        # Lowering keeps the arguments of the script's call (only their shapes count).
        live = {"args": list(args)}

        def concrete(batch: int) -> tuple:
            call_args = list(live["args"])
            call_args[index] = _tiled(args[index], batch)
            return tuple(call_args)

        def keep(final: "list") -> None:
            live["args"] = [args[index] if i == index else a for i, a in enumerate(final)]

        server = server_mod.Server(
            lower,
            replies,
            {"name": _function_name(fun), "description": description},
            cache_path=os.environ.get(server_mod.CACHE_PATH_ENV) or None,
            components=components,
            # a step called with keyword arguments, or whose batch shares its arguments with the state
            # (equinox), is not run here (the compiled call takes them apart); its timing says so and a
            # fresh process measures it
            concrete=None if kwargs or index is None or target is not None else concrete,
            donated=donated,
            keep_arguments=keep,
            retarget=retarget if target is not None else None,
        )
        if target is not None:  # what the compiler sees: the card's limit, as a GPU's
            server.info.update(jaxfit_target.info_fields(target, count))
    except Exception as e:
        server_mod.send_error(replies, "user", "WorkloadError", "the script's step %r: %s" % (_function_name(fun), e))
        os._exit(3)
    server.ready()
    try:
        server.serve(requests)
    finally:
        replies.flush()
        os._exit(0)  # never run the step, nor anything after it


_calls: "dict[str, int]" = {}
"""How often the script called each watched jitted function (before the step was taken)."""
_kinds: "dict[str, str]" = {}
"""What each called function does (``train step``, ``evaluation``, ``no step``), by tracing."""
_serving = False
"""Set once the step is taken: every later call is part of compiling it."""
_original_jit: "list[Any]" = []
"""jax's own ``jit``, once the probe has wrapped it (a lean start-up compiles with it)."""
_NOT_LEAN = object()
_evaluating_since: "list[float]" = []
"""When the script first called an evaluation-like function (a batch in, no state updated)."""
EVAL_SECONDS = float(os.environ.get("JAXFIT_PROBE_EVAL_SECONDS") or 600)
"""How long a probed script may evaluate before its first train step (evaluation is not training,
so it runs, but a probe must not wait for a whole validation pass)."""


def _fail(message: str) -> None:
    """Tell jaxfit why the probe stops, and stop the script."""
    _importable()
    import jaxfit_compile_server as server_mod

    server_mod.send_error(_open_channels()[1], "user", "WorkloadError", message)
    os._exit(3)


def _called() -> str:
    return _steps().names_of(_calls, _kinds)


def _stop_training(name: str, why: str) -> None:
    """The script is about to train and no step was taken: stop it before that call runs, and tell
    jaxfit what it called."""
    if STEP_AUTO:
        wanted = "it jitted %r, the train step's default name, but called %r first" % (STEP_NAME, name)
    else:
        wanted = "it never called the jitted function named %r before" % STEP_NAME
    _fail(
        "the script was about to train with %r (a train step: %s) and %s, so the probe stopped it before that "
        "call ran; jitted functions it called (times, what they do): %s; pass --step-name %s to fit it"
        % (name, why, wanted, _called(), name)
    )


def _evaluating(name: str) -> None:
    """Bound the time a probed script spends evaluating before it trains."""
    import time

    now = time.monotonic()
    if not _evaluating_since:
        _evaluating_since.append(now)
        return
    if now - _evaluating_since[0] > EVAL_SECONDS:
        _fail(
            "the script evaluated for over %.0f s (%r, which returns no updated state) without calling a "
            "function that updates its state; jitted functions it called (times, what they do): %s; turn its "
            "evaluation off for the probe (e.g. --probe-arg=--eval-steps=0) or name the train step with "
            "--step-name" % (EVAL_SECONDS, name, _called())
        )


class _Watched:
    """Stands in for a jitted function in the probed script: counts its calls, and takes it as the
    step when it is the named one or (without ``--step-name``) when it is the first call that would
    update the state (:mod:`jaxfit_steps`). A call that would update the state is never run."""

    def __init__(self, jitted: Any, fun: Any, jit_kwargs: "dict[str, Any]") -> None:
        self._jitted = jitted
        self._fun = fun
        self._name = _function_name(fun)
        self._donated = _steps().donated_positions(fun, jit_kwargs)
        self._jit_kwargs = jit_kwargs
        self._kinds: "dict[Any, Any]" = {}  # call signature -> Kind
        functools.update_wrapper(self, jitted, updated=())

    def _classify(self, args: tuple, kwargs: dict) -> Any:
        steps = _steps()
        key = steps.call_signature(args, kwargs)
        kind = self._kinds.get(key)
        if kind is None:
            kind = steps.classify(self._jitted, args, kwargs, self._donated, _script_batch_size())
            if len(self._kinds) < 8:
                self._kinds[key] = kind
        if kind.step_like and (self._name not in _kinds or kind.updates_state):
            _kinds[self._name] = kind.label
        return kind

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not _claim() or _serving or _steps().is_traced(args, kwargs):  # a call inside a trace is no step
            return self._jitted(*args, **kwargs)
        with _lock:
            count = _calls[self._name] = _calls.get(self._name, 0) + 1
        kind = self._classify(args, kwargs)
        if count & (count - 1) == 0:  # 1, 2, 4, 8...: enough for the error message
            _send({"op": "jit_called", "name": self._name, "count": count, "kind": _kinds.get(self._name)})
        if self._name == STEP_NAME:
            _serve(self._jitted, self._fun, args, kwargs, "named %r" % STEP_NAME, kind, self._jit_kwargs)
        if kind.updates_state:
            named_pending = STEP_NAME in _seen  # the named step is jitted, and comes later
            if STEP_AUTO and not named_pending:
                _serve(self._jitted, self._fun, args, kwargs, "found: %s" % kind.why, kind, self._jit_kwargs)
            _stop_training(self._name, kind.why)
        if kind.step_like:
            _evaluating(self._name)
        if LEAN and _original_jit:
            outputs = self._lean_call(args, kwargs, kind.step_like)
            if outputs is not _NOT_LEAN:
                return outputs
        return self._jitted(*args, **kwargs)

    def _lean_call(self, args: tuple, kwargs: dict, evaluation: bool) -> Any:
        """In a lean start-up (:mod:`jaxfit_lean`), the call's outputs with its large ones left out
        (their stand-ins); else :data:`_NOT_LEAN`."""
        _importable()
        import jaxfit_lean

        outputs, left_out = jaxfit_lean.call(self._jitted, _original_jit[0], args, kwargs, evaluation)
        if outputs is jaxfit_lean.RUN:
            return _NOT_LEAN
        _send({"op": "lean", "name": self._name, "bytes": left_out})
        return outputs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jitted, name)


def _library_function(fun: Any) -> bool:
    module = getattr(fun, "__module__", None) or ""
    for _ in range(16):  # look through functools.partial for the function's own module
        if isinstance(fun, functools.partial):
            fun = fun.func
            module = getattr(fun, "__module__", None) or module
        else:
            break
    if module in USER_FUNCTION_WRAPPERS and getattr(fun, "__name__", "") != USER_FUNCTION_WRAPPERS[module]:
        return False  # a library's jit of a user's function (equinox's filter_jit)
    return module.split(".")[0] in LIBRARY_MODULES


def _patch_jax(jax_module: Any) -> None:
    """Wrap ``jax.jit``: in the probe every jitted function of the script is watched (:class:`_Watched`);
    with a pin, the step is replaced by :class:`jaxfit_pin.PinnedStep`; when ``jaxfit tune``
    measures, it is timed by :class:`jaxfit_measure.MeasuredStep`."""
    if not _claim():
        return  # a worker of the probed or trained process: leave jax alone
    _importable()
    run_step = os.environ.get("JAXFIT_PIN_STEP_NAME") or os.environ.get("JAXFIT_MEASURE_STEP_NAME")
    if PIN:
        import jaxfit_pin

        try:  # a readable pin.json keeps the guard (its budget), even when its executable is damaged
            pin_data = jaxfit_pin.load_pin(PIN)
            pin_step = pin_data.get("step_name")
            run_step = run_step or pin_step
            _refuse_untrusted(pin_data, PIN, jaxfit_pin.PIN_UNREADABLE_EXIT)
        except (OSError, ValueError) as e:  # no pin, no budget: the guard cannot be kept, so stop
            print(
                "jaxfit: error: JAXFIT_PIN=%s cannot be read (%s: %s), so the train step could run unchecked; "
                "fit again for a new pin (jaxfit keeps the newest ones), or run without JAXFIT_PIN"
                % (PIN, type(e).__name__, str(e).splitlines()[0][:200] if str(e) else ""),
                file=sys.stderr,
            )
            sys.stderr.flush()
            os._exit(jaxfit_pin.PIN_UNREADABLE_EXIT)

    if STEP_NAME:
        _guard_gradients(jax_module)

    def choose(jitted: Any, fun: Any, kwargs: "dict[str, Any]") -> Any:
        name = _function_name(fun)
        if STEP_NAME:
            _report_jit(name)
            return _Watched(jitted, fun, kwargs)
        if not run_step:
            return jitted
        if name != run_step:
            if PIN or STANDBY:  # a train step that is not the pinned one must not train unchecked
                import jaxfit_pin

                return jaxfit_pin.OtherFunction(jitted, fun, kwargs, run_step, _claim)
            return jitted
        if STANDBY and MEASURE:  # started before its program was proven: told at its first step call
            import jaxfit_measure

            return jaxfit_measure.Standby(
                jitted, STANDBY, lambda: _run_step(jitted, fun, kwargs, os.environ.get("JAXFIT_PIN"))
            )
        return _run_step(jitted, fun, kwargs, PIN)

    _replace_jit(jax_module, choose)


def _guard_gradients(jax_module: Any) -> None:
    """In a probe, a gradient taken outside any trace (``jax.grad``, ``jax.value_and_grad`` or
    ``jax.vjp`` called on concrete arrays, directly or through flax's and equinox's own) means the
    script trains without jit: it is stopped there, before that step runs, with one line saying to
    jit it. Inside a jitted function the arguments are tracers, and nothing changes."""

    def transform_guard(original: Any, name: str) -> Any:
        @functools.wraps(original)
        def transform(fun: Any, *args: Any, **kwargs: Any) -> Any:
            inner = original(fun, *args, **kwargs)

            @functools.wraps(inner)
            def guarded(*call_args: Any, **call_kwargs: Any) -> Any:
                _check_gradient(name, call_args, call_kwargs)
                return inner(*call_args, **call_kwargs)

            return guarded

        return transform

    def vjp_guard(original: Any) -> Any:
        @functools.wraps(original)
        def vjp(fun: Any, *primals: Any, **kwargs: Any) -> Any:
            _check_gradient("vjp", primals, {})
            return original(fun, *primals, **kwargs)

        return vjp

    for name in GRADIENTS:
        original = getattr(jax_module, name, None)
        if original is not None:
            setattr(jax_module, name, vjp_guard(original) if name == "vjp" else transform_guard(original, name))


def _check_gradient(name: str, args: tuple, kwargs: dict) -> None:
    """Stop a probed script that takes a gradient of concrete arrays (:func:`_guard_gradients`)."""
    if _serving or not _claim() or _steps().is_traced(args, kwargs):
        return
    import jax

    if not any(hasattr(x, "shape") for x in jax.tree_util.tree_leaves((args, kwargs))):
        return  # a gradient of Python numbers: no training state
    _fail(
        "the script takes a gradient (jax.%s) outside any jitted function, in %s: its train step is not jitted, "
        "and jaxfit fits a jitted train step without running it; jit the step (jax.jit, flax's nnx.jit or "
        "equinox's filter_jit) and fit again. The probe stopped the script before that step ran" % (name, _caller())
    )


def _caller() -> str:
    """The script's own function (or file and line) that called into jax, from the stack."""
    import traceback

    skip = tuple(os.sep + m + os.sep for m in LIBRARY_MODULES) + (_HERE,)
    for frame in reversed(traceback.extract_stack()[:-3]):
        if not any(part in frame.filename for part in skip):
            where = "%s:%d" % (os.path.basename(frame.filename), frame.lineno)
            return "%s (%s)" % (frame.name, where) if frame.name != "<module>" else where
    return "the script"


def _refuse_untrusted(pin: "dict[str, Any]", path: str, code: int) -> None:
    """Stop the process, before anything is unpickled, when ``JAXFIT_PIN`` names a pin that is not
    this user's own (:mod:`jaxfit_trust`): a pin is code run in this process."""
    import jaxfit_trust

    why = jaxfit_trust.problem(pin, path)
    if why is None:
        return
    print(
        "jaxfit: error: JAXFIT_PIN=%s is not loaded: %s. A pin is a program run in this process: use only pins "
        "your own jaxfit wrote into your own cache (fit again for one), or run without JAXFIT_PIN" % (path, why),
        file=sys.stderr,
    )
    sys.stderr.flush()
    os._exit(code)


def _run_step(jitted: Any, fun: Any, kwargs: "dict[str, Any]", pin: "str | None") -> Any:
    """The train step as the process runs it: the program of ``pin`` (else its own compile), timed
    when ``jaxfit tune`` measures (``$JAXFIT_MEASURE``)."""
    step = jitted
    if pin:
        import jaxfit_pin

        step = jaxfit_pin.PinnedStep(jitted, pin, os.environ.get(jaxfit_pin.REPORT_ENV), fun, kwargs)
    if os.environ.get("JAXFIT_MEASURE"):
        import jaxfit_measure

        warmup, steps = jaxfit_measure.plan() or (1, 1)
        step = jaxfit_measure.MeasuredStep(
            step,
            warmup,
            steps,
            os.environ.get(jaxfit_measure.REPORT_ENV),
            jaxfit_measure.give_up(),
            jaxfit_measure.input_steps(),
            jaxfit_measure.programs(),
            jaxfit_measure.drop_margin(),
            jaxfit_measure.deadline(),
        )
    return step


def _replace_jit(jax_module: Any, choose: Any) -> None:
    """Wrap ``jax.jit`` so that each of the script's own jitted functions (not a library's) is what
    ``choose(jitted, fun, jit_kwargs)`` returns; ``jax.jit(static_argnums=...)`` as a decorator
    factory too."""
    original = jax_module.jit
    _original_jit[:] = [original]

    @functools.wraps(original)
    def jit(fun: Any = None, *args: Any, **kwargs: Any) -> Any:
        if fun is None:  # jax.jit(static_argnums=...) used as a decorator factory
            return lambda f: jit(f, *args, **kwargs)
        jitted = original(fun, *args, **kwargs)
        if _library_function(fun) or not _claim():  # a forked child shares the patched jax
            return jitted
        chosen = choose(jitted, fun, kwargs)
        return _CapChecked(chosen) if POOL and not _pool_checked else chosen

    jax_module.jit = jit


class _CapChecked:
    """Stands in for one of the script's jitted functions until the first call of any of them has
    checked the GPU pool against ``$JAXFIT_POOL_BYTES`` (:mod:`jaxfit_cap`); then it only passes on."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        try:
            functools.update_wrapper(self, inner, updated=())
        except (AttributeError, TypeError):
            pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not _pool_checked and _claim() and not _steps().is_traced(args, kwargs):
            _check_pool()
        return self._inner(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _check_pool() -> None:
    """Stop this process (exit :data:`jaxfit_cap.CAP_EXIT`) when its GPU pool is not the one jaxfit
    set, before the call that checks it runs."""
    with _lock:
        if _pool_checked:
            return
        _pool_checked.append(True)
    _importable()
    import jaxfit_cap

    try:
        why = jaxfit_cap.problem(int(POOL or 0))
    except Exception as e:  # never break the training over a check that cannot be made
        print("jaxfit: the GPU pool could not be checked (%s: %s)" % (type(e).__name__, e), file=sys.stderr)
        return
    if why is not None:
        jaxfit_cap.stop(why)


def _patch_jax_for_help(jax_module: Any) -> None:
    """``CMD --help`` (jaxfit checking the script's flags): a script that prints its help stops before
    any jitted call; one that parses no flags goes on to work, and is stopped at its first jitted
    call (exit :data:`HELP_CHECK_EXIT`), so that checking a flag never trains."""

    def choose(jitted: Any, fun: Any, kwargs: "dict[str, Any]") -> Any:
        @functools.wraps(fun)
        def guarded(*call_args: Any, **call_kwargs: Any) -> Any:
            if _claim() and not _steps().is_traced(call_args, call_kwargs):
                print("jaxfit: the script did not stop at --help; stopped at its first jitted call", file=sys.stderr)
                sys.stderr.flush()
                os._exit(HELP_CHECK_EXIT)
            return jitted(*call_args, **call_kwargs)

        return guarded

    _replace_jit(jax_module, choose)


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
        if not _claim():
            return run
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
        if not self.patches and self in sys.meta_path:
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
    if os.environ.get("JAXFIT_PROBE_WRITES"):  # a probe: record what the script creates (jaxfit_writes)
        _importable()
        import jaxfit_writes

        jaxfit_writes.install(os.environ["JAXFIT_PROBE_WRITES"])
    if STEP_NAME:  # a probe: note the working folder's files the script reads (jaxfit_manifest)
        _importable()
        import jaxfit_manifest

        jaxfit_manifest.watch_reads()
    patches = {}
    if HELP_CHECK:
        patches["jax"] = _patch_jax_for_help
    elif STEP_NAME or PIN or MEASURE or POOL:
        patches["jax"] = _patch_jax
    if WANDB_CONFIG:
        patches["wandb"] = _patch_wandb
    for name in [n for n in patches if n in sys.modules]:
        patches.pop(name)(sys.modules[name])
    if patches:
        sys.meta_path.insert(0, _ImportHook(patches))


_install()
_chain_next_sitecustomize()
