"""The training side of a pinned program: run the executable jaxfit proved, or know that it is not.

Near the memory limit XLA does not build the same program twice: GPU autotuning picks kernels by
timing them, so the training process's own compile of the step can need more than the compile that
proved the answer (H100, gpt-small at batch 13 under fraction 0.212: proved 17,579,825,492 B, the
training process's own compile 18,028,917,076 B, over the limit; docs/guides/facts.md #10). So the fit
writes the proving executable to a *pin* (``pin.json`` and ``executable.bin``, :mod:`jaxfit.fit.pin`),
and jaxfit's start-up hook loads it here, in the training process, at the first call of the step:

1. the call's arguments are lowered with the script's own jitted step (tracing only);
2. if that program's fingerprint (the SHA-256 of its StableHLO text), the jax version, ``XLA_FLAGS``
   and the device match the pin's, the pinned executable is loaded and runs every call of that
   shape: **pinned**;
3. otherwise (another batch, a changed config or flag, another jax) the step is compiled here, as
   it would have been, and its peak is checked against the budget the fit proved: over it, the
   process stops before any step runs, with one line saying why and what to do, instead of running
   out of memory later (exit code :data:`GUARD_EXIT`).

The pin must cover the *train step*: every other jitted function of the process stands behind an
:class:`OtherFunction`, and one that would update the state (:mod:`jaxfit_steps`) stops the process
before its call runs (exit :data:`GUARD_EXIT`): a pin of an evaluation step, or of one of two train
steps, would otherwise let the real step train unchecked.

What happened is written as JSON to ``$JAXFIT_PIN_REPORT`` (``program_pinned``,
``pinned_peak_bytes``, ``program_peak_bytes``, ``reason``, ``step_name``, ``step_updates_state``,
``step_calls``, ``other_train_steps``...), which ``jaxfit run`` and ``jaxfit schedule`` report. Standard library + jax only (it runs in the script's environment).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple

PIN_ENV = "JAXFIT_PIN"
REPORT_ENV = "JAXFIT_PIN_REPORT"
GUARD_EXIT = 75
"""Exit code of a training process stopped because its own program does not fit the budget."""
PIN_UNREADABLE_EXIT = 2
"""Exit code of a training process whose ``$JAXFIT_PIN`` cannot be read (it stops at ``import jax``)."""
GUARD_MARKER = "does not fit the budget jaxfit proved"
"""Words of the guard's error line; the scheduler counts a run stopped by it as out of memory."""
MAX_SHAPES = 8
"""Argument shapes of the step that get their own checked program; calls of further shapes go to
the script's jitted step as they would without jaxfit."""


_REPORT: Dict[str, Any] = {
    "path": os.environ.get(REPORT_ENV) or None,
    "step_name": os.environ.get("JAXFIT_PIN_STEP_NAME") or None,
    "step_calls": 0,
    "step_updates_state": None,
    "other_train_steps": [],
}
"""What this process has seen so far, for the report (one process, one report)."""
_REPORT_LOCK = threading.Lock()


def _format_bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return "%.2f %s" % (n / size, unit)
    return "%d B" % n


def _write_json(path: str, data: Dict[str, Any]) -> None:
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else ""


def load_pin(path: str) -> Dict[str, Any]:
    """The pin's metadata (raises OSError or ValueError when it is missing or unreadable)."""
    with open(path) as f:
        pin = json.load(f)
    if not isinstance(pin, dict) or "fingerprint" not in pin:
        raise ValueError("%s is not a jaxfit pin" % path)
    return pin


def _peak(memory: Dict[str, Any]) -> int:
    return (
        int(memory["argument_bytes"])
        + int(memory["output_bytes"])
        - int(memory["alias_bytes"])
        + int(memory["temp_bytes"])
        + int(memory.get("generated_code_bytes") or 0)
    )


def _fraction_here() -> Optional[float]:
    spelled = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION") or os.environ.get("XLA_CLIENT_MEM_FRACTION")
    try:
        return float(spelled) if spelled else None
    except ValueError:
        return None


def _own_limit() -> Optional[int]:
    """This process's own memory limit: the pool jaxfit set (``$JAXFIT_POOL_BYTES``), else the
    allocator's limit, else (a CPU) the fraction of the host's memory, as jaxfit budgets a CPU."""
    pool = os.environ.get("JAXFIT_POOL_BYTES")
    if pool and pool.isdigit():
        return int(pool)
    _importable()
    import jaxfit_compile_server as server_mod

    info = server_mod.device_info()
    if info.get("bytes_limit"):
        return int(info["bytes_limit"])
    fraction = _fraction_here()
    if fraction is None or not info.get("host_memory_bytes"):
        return None
    return int(fraction * int(info["host_memory_bytes"]))


def _foreign(pin: Dict[str, Any]) -> Optional[str]:
    """What differs between the question a pin answered and this process (its fraction, device,
    device count, jax), in words; None when nothing does (the step itself changed)."""
    import jax

    device = jax.devices()[0]
    here = _fraction_here()
    found = []
    if here is not None and pin.get("mem_fraction") is not None and abs(float(pin["mem_fraction"]) - here) > 1e-9:
        found.append("fraction %g in the fit, %g here" % (float(pin["mem_fraction"]), here))
    kind = getattr(device, "device_kind", device.platform)
    if pin.get("device_kind") and pin.get("device_kind") != kind:
        found.append("device %s in the fit, %s here" % (pin.get("device_kind"), kind))
    if pin.get("workload"):
        found.append("it was fitted for %r" % pin.get("workload"))
    return "; ".join(found) if len(found) > 1 or (found and not found[0].startswith("it was")) else None


def _mismatch(pin: Dict[str, Any], fingerprint: str) -> Optional[str]:
    """Why the program of this call is not the pinned one, or None when it is."""
    import jax

    device = jax.devices()[0]
    if pin.get("jax_version") != jax.__version__:
        return "jax %s here, %s in the fit" % (jax.__version__, pin.get("jax_version"))
    if pin.get("device_kind") != getattr(device, "device_kind", device.platform):
        return "device %s here, %s in the fit" % (getattr(device, "device_kind", "?"), pin.get("device_kind"))
    if int(pin.get("device_count") or 0) != jax.device_count():
        return "%d devices here, %s in the fit" % (jax.device_count(), pin.get("device_count"))
    if (pin.get("xla_flags") or "") != os.environ.get("XLA_FLAGS", ""):
        return "XLA_FLAGS %r here, %r in the fit" % (os.environ.get("XLA_FLAGS", ""), pin.get("xla_flags") or "")
    if fingerprint != pin.get("fingerprint"):
        return (
            "the step lowers to another program than the one fitted (another batch size, config value or "
            "argument; the fit was at batch %s)" % pin.get("batch_size")
        )
    return None


def _execution_devices(pin: Dict[str, Any]) -> Any:
    """The devices the proven program runs on, in its order (a one-device step of a script that
    sees several devices runs on one): by id among this process's devices; None for a pin that did
    not record them (loaded on every device, as jax does by default)."""
    ids = pin.get("execution_devices")
    if not ids:
        return None
    import jax

    by_id = {d.id: d for d in jax.devices()}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise RuntimeError("the proven program ran on devices %s, which this process does not have" % missing)
    return [by_id[i] for i in ids]


def _check_whole(pin: Dict[str, Any], payload: bytes) -> None:
    """Raise ValueError when the executable is not the one the fit wrote (its size and SHA-256, when
    the pin records them: older pins do not)."""
    size = pin.get("executable_bytes")
    if size is not None and len(payload) != int(size):
        raise ValueError("it has %d bytes, the fit wrote %s" % (len(payload), size))
    digest = pin.get("executable_sha256")
    if digest and hashlib.sha256(payload).hexdigest() != digest:
        raise ValueError("its SHA-256 differs from the one the fit wrote")


def _stop_if_the_pool_is_short(pin: Dict[str, Any], record: Any) -> None:
    """Stop this process (exit ``jaxfit_cap.CAP_EXIT``, one line) before the proven program's first
    step when this process's GPU pool is smaller than that program's peak and the loop's next
    batch (``next_input_bytes``): it would run out of memory in that step, or a step or two later
    when the next batch arrives (pi0.5 at 40, 6.5 MB under its limit). Found on an H100: an 80 GiB card's proof (limit 72.00 GiB) run under 0.9
    of the GPU's 79.18 GiB (71.26 GiB) ran out of memory in pi0-FAST's and pi0.5's first steps. A
    pasted line run on another GPU, or with its fraction edited, would do the same."""
    import jaxfit_cap

    why = _pool_shortage(pin)
    if why is None:
        return
    record(pinned=False, peak=int(pin["peak_bytes"]), reason=why, stopped=True)
    jaxfit_cap.stop(why, " instead of running out of memory in it: run it with that fraction (jaxfit run sets it)")


def _pool_shortage(pin: Dict[str, Any]) -> Optional[str]:
    """Why this process's GPU pool cannot hold the proven program of ``pin`` and the loop's next
    batch (:func:`jaxfit_cap.short_of`), or None (also when the check itself fails: it never
    breaks the training)."""
    _importable()
    import jaxfit_cap

    try:
        return jaxfit_cap.short_of(
            int(pin["peak_bytes"]),
            pin.get("limit_bytes") or pin.get("budget_bytes"),
            int(pin.get("next_input_bytes") or 0),
        )
    except Exception:
        return None


class PinnedStep:
    """Stands in for the script's jitted train step (see the module docstring).

    Args:
      jitted: The script's ``jax.jit`` object.
      pin_path: The pin's ``pin.json``.
      report_path: Where to write what happened (None: nowhere).
      fun: The function that was jitted (to read its donation and say what it does).
      jit_kwargs: The arguments ``jax.jit`` was given (``donate_argnums``, ``donate_argnames``).
    """

    def __init__(
        self,
        jitted: Any,
        pin_path: str,
        report_path: Optional[str],
        fun: Any = None,
        jit_kwargs: Optional[Dict[str, Any]] = None,
    ) -> None:
        self._jitted = jitted
        self._donated = _steps().donated_positions(fun, jit_kwargs or {}) if fun is not None else ()
        self._static_positions, self._static_names = _static_arguments(fun, jit_kwargs or {})
        self._pin_path = pin_path
        self._report_path = report_path
        self._programs: List[Tuple[Any, Any]] = []  # (signature, compiled)
        self._decisions: List[Dict[str, Any]] = []
        self._lowered: Any = None  # the last call's lowering (its argument and output trees)
        self._lock = threading.Lock()
        try:
            self._pin: Optional[Dict[str, Any]] = load_pin(pin_path)
            self._pin_error: Optional[str] = None
            _REPORT["step_name"] = self._pin.get("step_name") or _REPORT["step_name"]
        except (OSError, ValueError) as e:
            self._pin, self._pin_error = None, "cannot read the pin %s: %s" % (pin_path, e)
        _stand_in(self, jitted)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jitted, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import jax

        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        if any(isinstance(x, jax.core.Tracer) for x in leaves):  # called inside another traced function
            return self._jitted(*args, **kwargs)
        with _REPORT_LOCK:
            _REPORT["step_calls"] += 1
            calls = _REPORT["step_calls"]
        if calls == 2 and self._decisions:  # the loop calls it again: the report says so
            self._write_report()
        signature = (
            tree,
            tuple((tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x).__name__))) for x in leaves),
        )
        compiled = self._program(signature, args, kwargs)
        if compiled is None:
            return self._jitted(*args, **kwargs)
        args, kwargs = _dynamic(args, kwargs, (self._static_positions, self._static_names))
        return compiled(*args, **kwargs)

    def _program(self, signature: Any, args: tuple, kwargs: dict) -> Any:
        with self._lock:
            for known, compiled in self._programs:
                if known == signature:
                    return compiled
            if len(self._programs) >= MAX_SHAPES:
                return None
            compiled = self._decide(args, kwargs)
            self._programs.append((signature, compiled))
            return compiled

    def load_other(self, pin_path: str) -> Optional[str]:
        """Run the program of another pin from now on, in place of the pinned program of the last
        call's arguments (``jaxfit tune`` times several proven programs in one process,
        :mod:`jaxfit_measure`): None when it is loaded; else why not (nothing changes). It must
        have been proven for this jax, device, device count and ``XLA_FLAGS``, take the same
        arguments (shapes, dtypes, shardings, donation) and give the same outputs, and fit this
        process's pool; its fingerprint is another program's by design."""
        with self._lock:
            current = self._programs[-1] if self._programs else None
            if current is None or current[1] is None or self._lowered is None:
                return "no proven program runs here to stand in for"
            if not self._decisions or not self._decisions[-1]["program_pinned"]:
                return "the step here runs its own compile, not a proven program"
            try:
                pin = load_pin(pin_path)
                reason = _mismatch(pin, str(pin.get("fingerprint")))
                if reason is not None:
                    return reason
                short = _pool_shortage(pin)
                if short is not None:
                    return short
                compiled = _load_executable(pin, pin_path, self._lowered)
                if interface(compiled) != interface(current[1]):
                    return "it takes other arguments or gives other outputs than the program running here"
            except Exception as e:  # a foreign or damaged pin: say so, keep the running program
                return "it could not be loaded (%s: %s)" % (type(e).__name__, _first_line(e))
            self._programs[-1] = (current[0], compiled)
            self._decisions.append(
                {
                    "program_pinned": True,
                    "program_peak_bytes": int(pin["peak_bytes"]),
                    "reason": None,
                    "stopped": False,
                    "pin": pin_path,
                }
            )
        self._write_report()
        print(
            "jaxfit: the train step now runs another proven program (peak %s, batch %s): %s"
            % (_format_bytes(pin["peak_bytes"]), pin.get("batch_size"), pin_path),
            file=sys.stderr,
            flush=True,
        )
        return None

    def _decide(self, args: tuple, kwargs: dict) -> Any:
        """Load the pinned program for this call, or compile and check the step's own."""
        _importable()
        import jaxfit_compile_server as server_mod

        if _REPORT["step_updates_state"] is None:
            try:
                _REPORT["step_updates_state"] = (
                    _steps().classify(self._jitted, args, kwargs, self._donated).updates_state
                )
            except Exception:  # never break the training over the report
                pass
        try:
            with server_mod.runtime_typechecks_off():
                lowered = self._jitted.lower(*args, **kwargs)
        except Exception as e:  # never break the training over jaxfit's check: run the step as it is
            self._record(
                pinned=False,
                peak=None,
                reason="the step could not be lowered for the check (%s: %s)" % (type(e).__name__, _first_line(e)),
            )
            print(
                "jaxfit: the train step runs unchecked: it could not be lowered (%s)" % type(e).__name__,
                file=sys.stderr,
                flush=True,
            )
            return None
        self._lowered = lowered
        pin = self._pin
        reason = self._pin_error
        if pin is not None:
            reason = _mismatch(pin, server_mod.program_fingerprint(lowered))
        if pin is not None and reason is None:
            try:
                compiled = _load_executable(pin, self._pin_path, lowered)
            except Exception as e:  # a truncated or foreign file: compile as usual, checked
                reason = "the pinned executable could not be loaded (%s: %s)" % (type(e).__name__, _first_line(e))
            else:
                _stop_if_the_pool_is_short(pin, self._record)
                self._record(pinned=True, peak=int(pin["peak_bytes"]), reason=None)
                print(
                    "jaxfit: the train step runs the program jaxfit proved (peak %s of a %s budget, batch %s)"
                    % (_format_bytes(pin["peak_bytes"]), _format_bytes(pin.get("budget_bytes")), pin.get("batch_size")),
                    file=sys.stderr,
                    flush=True,
                )
                return compiled
        with server_mod.persistent_cache_off():  # a cache-served program can misreport its aliasing
            compiled = lowered.compile()
        peak = _peak(server_mod.memory_of(compiled))
        budget = int(pin["budget_bytes"]) if pin and pin.get("budget_bytes") else None
        own = _own_limit()
        if pin is not None and own is not None and (budget is None or own < budget):
            budget = own  # a pin made for another question guards nothing beyond this process's own pool
        foreign = _foreign(pin) if pin is not None else None
        if foreign:
            reason = "%s; JAXFIT_PIN is a pin made for another question (%s)" % (reason, foreign)
        self._record(pinned=False, peak=peak, reason=reason, stopped=budget is not None and peak > budget)
        if pin is not None and budget is not None and peak > budget:
            print(
                "jaxfit: error: the train step compiled in this process needs %s, which %s of %s (fraction %s); "
                "it was stopped before its first step instead of running out of memory. It is not the proven "
                "program: %s. Run the batch and settings jaxfit chose (the fit was at batch %s), or fit again "
                "with this command and environment"
                % (
                    _format_bytes(peak),
                    GUARD_MARKER,
                    _format_bytes(budget),
                    pin.get("mem_fraction"),
                    reason,
                    pin.get("batch_size"),
                ),
                file=sys.stderr,
                flush=True,
            )
            sys.stderr.flush()
            os._exit(GUARD_EXIT)
        print(
            "jaxfit: the train step is not the program jaxfit proved (%s); its own compile needs %s%s"
            % (reason, _format_bytes(peak), " of a %s budget: it fits" % _format_bytes(budget) if budget else ""),
            file=sys.stderr,
            flush=True,
        )
        return compiled

    def _record(self, *, pinned: bool, peak: Optional[int], reason: Optional[str], stopped: bool = False) -> None:
        self._decisions.append(
            {"program_pinned": pinned, "program_peak_bytes": peak, "reason": reason, "stopped": stopped}
        )
        self._write_report()

    def _write_report(self) -> None:
        pin = self._pin or {}
        loaded = any(d["program_pinned"] for d in self._decisions)
        updates = _REPORT["step_updates_state"]
        reason = next((d["reason"] for d in self._decisions if d["reason"]), None)
        if loaded and updates is False:
            reason = (
                "the pinned function %r returns no updated state: it is not the train step (an evaluation step?); "
                "fit again with --step-name <the train step>" % pin.get("step_name")
            )
        write_report(
            self._report_path,
            {
                # the state-updating step ran the proven program (any other state-updating function is stopped
                # before it runs, see OtherFunction, so this step is the training loop's)
                "program_pinned": loaded and updates is not False,
                "pinned_peak_bytes": pin.get("peak_bytes"),
                "program_peak_bytes": self._decisions[0]["program_peak_bytes"] if self._decisions else None,
                "budget_bytes": pin.get("budget_bytes"),
                "reason": reason,
                "stopped": any(d["stopped"] for d in self._decisions),
                "pin": self._pin_path,
                "shapes": self._decisions,
            },
        )


def _load_executable(pin: Dict[str, Any], pin_path: str, lowered: Any) -> Any:
    """The executable of ``pin`` (beside ``pin_path``), whole, loaded on its devices with the
    argument and output trees of ``lowered`` (raises when it is missing, changed or foreign)."""
    _importable()
    import jaxfit_compile_server as server_mod
    import jaxfit_trust
    from jax.experimental import serialize_executable

    folder = os.path.dirname(os.path.abspath(pin_path))
    with open(os.path.join(folder, pin.get("executable", "executable.bin")), "rb") as f:
        payload = f.read()
    _check_whole(pin, payload)
    jaxfit_trust.verify(pin, pin_path, payload)  # these very bytes are this user's jaxfit's, or nothing loads
    devices = _execution_devices(pin)
    if devices is not None and not _takes_execution_devices(serialize_executable.deserialize_and_load):
        devices = _default_placement(devices)
    with server_mod.runtime_typechecks_off():  # it rebuilds the argument pytrees too
        if devices is None:
            return serialize_executable.deserialize_and_load(payload, lowered.in_tree, lowered.out_tree)
        return serialize_executable.deserialize_and_load(
            payload, lowered.in_tree, lowered.out_tree, execution_devices=devices
        )


def _takes_execution_devices(load: Any) -> bool:
    """Whether this jax's ``deserialize_and_load`` places a program on given devices (jax 0.5.3's
    does not: it loads where the program was compiled for, by device id)."""
    import inspect

    try:
        return "execution_devices" in inspect.signature(load).parameters
    except (TypeError, ValueError):
        return False


def _default_placement(devices: Any) -> Any:
    """None when ``devices`` are where an older jax loads the program anyway (the first devices, in
    order, as the fit compiled it); otherwise a RuntimeError: this jax cannot place it elsewhere."""
    import jax

    if [d.id for d in devices] == [d.id for d in jax.devices()[: len(devices)]]:
        return None
    raise RuntimeError(
        "the proven program runs on devices %s, and jax %s cannot load a program on devices other than "
        "the first ones" % ([d.id for d in devices], jax.__version__)
    )


def interface(compiled: Any) -> str:
    """What a compiled program takes and gives: each argument's shape, dtype, sharding and
    donation, each output's shape, dtype and sharding (two programs of one interface can stand in
    for each other in a training loop)."""
    import jax

    args = [str(a) for a in jax.tree_util.tree_leaves(compiled.args_info)]
    outs = [
        "%s %s %s" % (tuple(o.shape), o.dtype, getattr(o, "sharding", None))
        for o in jax.tree_util.tree_leaves(compiled.out_info)
    ]
    shardings = str(jax.tree_util.tree_leaves(compiled.input_shardings))
    return json.dumps([args, outs, shardings])


def _stand_in(wrapper: Any, jitted: Any) -> None:
    """Make ``wrapper`` look like the jitted function it stands in for (name, docs, ``__wrapped__``)."""
    try:
        import functools

        functools.update_wrapper(wrapper, jitted, updated=())
    except (AttributeError, TypeError):
        pass


def _importable() -> None:
    """Make this folder's modules (the compile server, :mod:`jaxfit_steps`) importable."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)


def _steps() -> Any:
    """:mod:`jaxfit_steps`: what a jitted call does with its arguments."""
    _importable()
    import jaxfit_steps

    return jaxfit_steps


def _static_arguments(fun: Any, jit_kwargs: Dict[str, Any]) -> "Tuple[frozenset, frozenset]":
    """``(positions, names)`` of the arguments ``jax.jit(fun, **jit_kwargs)`` takes as static
    (``static_argnums``, ``static_argnames``, each mapped to the other through ``fun``'s
    signature, as jax does): a compiled program is called without them (equinox's ``filter_jit``
    passes its static part as argument 2)."""
    nums = jit_kwargs.get("static_argnums")
    nums = () if nums is None else ((nums,) if isinstance(nums, int) else tuple(nums))
    names = jit_kwargs.get("static_argnames")
    names = () if names is None else ((names,) if isinstance(names, str) else tuple(names))
    params: "List[str]" = []
    if fun is not None:
        _importable()
        import jaxfit_compile_server as server_mod

        params = server_mod.positional_parameters(fun)
    positions = {n if n >= 0 else len(params) + n for n in nums}
    positions.update(i for i, name in enumerate(params) if name in names)
    all_names = set(names) | {params[i] for i in positions if 0 <= i < len(params)}
    return frozenset(positions), frozenset(all_names)


def _dynamic(
    args: tuple, kwargs: Dict[str, Any], static: "Tuple[frozenset, frozenset]"
) -> "Tuple[tuple, Dict[str, Any]]":
    """A call's arguments without its static ones (:func:`_static_arguments`): what a compiled program takes."""
    positions, names = static
    if not positions and not names:
        return args, kwargs
    return tuple(a for i, a in enumerate(args) if i not in positions), {
        k: v for k, v in kwargs.items() if k not in names
    }


def write_report(path: Optional[str], fields: Dict[str, Any]) -> None:
    """Merge ``fields`` and what the process has seen (the step's name, calls, what it does, other
    train steps) into the report at ``path`` (None: nowhere)."""
    with _REPORT_LOCK:
        _REPORT.update(fields)
        if path:
            _REPORT["path"] = path
        path = _REPORT["path"]
        report = {k: v for k, v in _REPORT.items() if k != "path"}
    report["step_repeated"] = report["step_calls"] >= 2
    if not path:
        return
    with _REPORT_LOCK:
        if not _FINAL_REPORT:  # written again as the process ends: the calls counted to the end
            _FINAL_REPORT.append(True)
            atexit.register(write_report, None, {})
    try:
        _write_json(path, report)
    except OSError as e:
        print("jaxfit: cannot write %s: %s" % (path, e), file=sys.stderr, flush=True)


_FINAL_REPORT: List[bool] = []
"""Set once the report is to be written again at exit (:func:`write_report`)."""

WATCHED_CALLS = 8
"""Calls of another jitted function watched before it is left alone (it showed it is no train step)."""


class OtherFunction:
    """Stands in for every other jitted function of a pinned training process: a function that
    takes a batch and returns the state updated (:mod:`jaxfit_steps`) is a program the pin does not
    cover, so before its first call runs it is compiled and checked against the proven budget: it
    runs its checked program when it fits (an evaluation in training mode updates BatchNorm
    statistics), and the process is stopped (exit :data:`GUARD_EXIT`) when it does not. Left alone
    after it has shown it updates nothing."""

    def __init__(self, jitted: Any, fun: Any, jit_kwargs: Dict[str, Any], pinned_name: str, owner: Any) -> None:
        self._jitted = jitted
        self._fun = fun
        self._pinned_name = pinned_name
        self._owner = owner  # () -> whether this process is the one the hook acts in
        self._donated = _steps().donated_positions(fun, jit_kwargs)
        self._static = _static_arguments(fun, jit_kwargs)
        self._checked_programs: Dict[Any, Any] = {}  # call signature -> its own compile, checked
        self._watched = 0
        _stand_in(self, jitted)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._jitted, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        steps = _steps()
        if self._checked_programs and self._owner() and not steps.is_traced(args, kwargs):
            compiled = self._checked_programs.get(steps.call_signature(args, kwargs))
            if compiled is not None:  # a state-updating call checked against the budget: its program
                call_args, call_kwargs = _dynamic(args, kwargs, self._static)
                return compiled(*call_args, **call_kwargs)
        if self._watched >= WATCHED_CALLS:
            return self._jitted(*args, **kwargs)
        if not self._owner() or steps.is_traced(args, kwargs):
            return self._jitted(*args, **kwargs)
        self._watched += 1
        try:
            kind = steps.classify(self._jitted, args, kwargs, self._donated)
        except Exception:  # never break the training over the check
            self._watched = WATCHED_CALLS
            return self._jitted(*args, **kwargs)
        if kind.step_like:
            self._watched = WATCHED_CALLS  # classified: an evaluation is left alone from now on
        if kind.updates_state:
            compiled = self._checked(args, kwargs, kind)
            if compiled is not None:
                if len(self._checked_programs) < MAX_SHAPES:
                    self._checked_programs[steps.call_signature(args, kwargs)] = compiled
                call_args, call_kwargs = _dynamic(args, kwargs, self._static)
                return compiled(*call_args, **call_kwargs)
        return self._jitted(*args, **kwargs)

    def _checked(self, args: tuple, kwargs: dict, kind: Any) -> Any:
        """This call updates the state, and it is not the proven program: its own compile, when it
        fits the proven budget (an evaluation in training mode updating BatchNorm statistics, a
        second optimizer's step); else the process is stopped before the call runs."""
        from jaxfit_compile_server import function_name, memory_of, persistent_cache_off, runtime_typechecks_off

        name = function_name(self._fun)
        try:
            budget = int(load_pin(os.environ.get(PIN_ENV, "")).get("budget_bytes") or 0) or None
        except (OSError, ValueError):
            budget = None
        try:
            with runtime_typechecks_off():
                lowered = self._jitted.lower(*args, **kwargs)
            with persistent_cache_off():
                compiled = lowered.compile()
            peak: Optional[int] = _peak(memory_of(compiled))
        except Exception as e:  # cannot be checked: stopped, as an unproven train step
            compiled, peak = None, None
            why = "it could not be compiled for the check (%s: %s)" % (type(e).__name__, _first_line(e))
        with _REPORT_LOCK:
            _REPORT["other_train_steps"] = _REPORT["other_train_steps"] + [name]
        if compiled is not None and peak is not None and (budget is None or peak <= budget):
            print(
                "jaxfit: %r also updates the train state (%s); it is not the program jaxfit proved, and its own "
                "compile needs %s%s, so it runs"
                % (name, kind.why, _format_bytes(peak), " of the %s budget" % _format_bytes(budget) if budget else ""),
                file=sys.stderr,
                flush=True,
            )
            write_report(None, {})
            return compiled
        if peak is not None:
            why = "its own compile needs %s, more than the %s budget" % (_format_bytes(peak), _format_bytes(budget))
        reason = (
            "the training loop calls %r, which updates the train state (%s), and %s; the program jaxfit proved is %r's"
            % (
                name,
                kind.why,
                why,
                self._pinned_name,
            )
        )
        write_report(None, {"program_pinned": False, "reason": reason, "stopped": True, "stopped_for": "step"})
        print(
            "jaxfit: error: %s; it was stopped before that call ran instead of running out of memory. If %r is the "
            "train step, fit it with --step-name %s (jaxfit run takes the same flag)" % (reason, name, name),
            file=sys.stderr,
            flush=True,
        )
        sys.stderr.flush()
        os._exit(GUARD_EXIT)
