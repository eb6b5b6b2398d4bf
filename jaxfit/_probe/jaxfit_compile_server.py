"""The compile server: answers "peak memory of the step at batch B" over a JSON-lines protocol.

This module is self-contained (standard library + jax, Python 3.9+, jax 0.4.30+) because it runs in
two places: in jaxfit's own compile child (:mod:`jaxfit.fit.worker`), and inside a user's training
script, whose environment (``uv run`` in an openpi checkout, say) need not have jaxfit installed.
There the probe's ``sitecustomize`` imports it from the probe folder that jaxfit put on PYTHONPATH.

Protocol (both directions one JSON object per line):

- requests arrive on the file descriptor ``$JAXFIT_REQUEST_FD`` (stdin if unset):
  ``{"op": "compile", "id": n, "batches": [..], "autotune": bool, "threads": k, "keep_untuned": bool}``,
  ``{"op": "pin", "batch": b, "path": file}``, ``{"op": "overhead"}``,
  ``{"op": "time", "batch": b, "warmup": w, "steps": n, "untuned": bool}``, ``{"op": "quit"}``;
- replies leave on ``$JAXFIT_REPLY_FD``: first ``{"op": "ready", "info": {...}}`` (or
  ``{"op": "error", ...}``), then ``{"op": "result", ...}`` per compile and ``{"op": "done"}`` per
  request, ``{"op": "pinned", ...}``, ``{"op": "overhead", ...}`` and ``{"op": "timed", ...}`` (the
  program as training compiles it, run on real arguments in this very process: ``jaxfit tune``'s
  measurement where the program was proven).

Compiles never use JAX's persistent compilation cache (:func:`persistent_cache_off`): a program
served from it can report the wrong aliasing (jax 0.5.3 said ``alias_size_in_bytes = 0`` for a
donated state, docs/guides/facts.md #12), and a probe must not fill a script's own cache with candidate
programs. The executables of the last compiles are kept, so that ``pin`` can hand the very program
that proved an answer to the training process (:mod:`jaxfit_pin`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, TextIO

TRITON_TILING_ERRORS = ("No supported config found for HLO", "Couldn't find output tile sizes")
"""What a deviceless GPU compile says when it finds no Triton tiling for a dot without autotuning."""
NO_AUTOTUNE_RESULTS = "Expect autotune result cache hit for deviceless compilation"
"""What an older XLA's deviceless GPU compile (jax 0.6.2, 0.7.2) says unless autotuning is off."""
OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")
REPLY_FD_ENV = "JAXFIT_REPLY_FD"
REQUEST_FD_ENV = "JAXFIT_REQUEST_FD"
CACHE_PATH_ENV = "JAXFIT_COMPILE_CACHE"
USER_ERRORS = ("ConfigError", "WorkloadError", "CompileError", "DoesNotFitError")
"""jaxfit's errors that are the user's to fix (reported as such by :meth:`Server.load`)."""
EMULATE_GPU_ENV = "JAXFIT_EMULATE_GPU_TOTAL"
"""Tests only: on a CPU, behave as a GPU of this many bytes (a ``bytes_limit`` of the fraction of it,
``limit_sensitive``), so that the GPU flow of a fit (untuned search, autotuned proof) runs on real
CPU compiles. The CPU compiler ignores both the limit and the autotuning level."""
EMULATE_CROWDED_OOM_ENV = "JAXFIT_EMULATE_CROWDED_COMPILE_OOM"
"""Tests only: an autotuned compile that had a smaller batch's compile beside it, at any time,
fails as XLA's out of memory does. What it stands for was seen on an H200: openpi's pi0-FAST at 134
ran out of memory while autotuning beside 133 in one round, and the training process's own
compile of 134 ran 3 steps (benchmarks/JOURNAL.md section 34); the fit now compiles such a batch
again alone (:class:`jaxfit.fit.batch._Rounds`)."""
TUNED_LEVEL = os.environ.get("JAXFIT_AUTOTUNE_LEVEL")
"""Experimental: the ``xla_gpu_autotune_level`` of autotuned compiles (unset: XLA's default, 4, as
the training run itself uses). Levels 1-3 skip buffer re-initialisation and result checking; the
benchmark ``benchmarks/bench_autotune_level.py`` measures whether they change peaks or save time."""
UNTUNED_OPTIONS_ENV = "JAXFIT_UNTUNED_COMPILER_OPTIONS"
"""Experimental: a JSON object of XLA options added to the untuned compiles of a GPU (the search's
guides and ``--rank-untuned``'s programs), e.g. ``{"xla_gpu_enable_triton_gemm": false}`` to
try cuBLAS's heuristics in place of Triton GEMMs at their default tiles (on an H200 the untuned
programs ran 12x slower than the tuned ones). Proofs are never compiled with them."""


def untuned_options() -> Dict[str, Any]:
    """The options of :data:`UNTUNED_OPTIONS_ENV` (empty when unset); a bad value stops the server
    with a one-line error naming the variable."""
    text = os.environ.get(UNTUNED_OPTIONS_ENV, "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ValueError("%s must be a JSON object of XLA options, got %r" % (UNTUNED_OPTIONS_ENV, text[:80]))
    return value


def is_out_of_memory(message: str) -> bool:
    """Whether an exception text is XLA's out-of-memory error (docs/guides/facts.md #8)."""
    return any(marker in message for marker in OOM_MARKERS)


def host_memory_bytes() -> int:
    """Physical memory available to this process: the machine's RAM or a smaller cgroup limit."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
            if text.isdigit():
                total = min(total, int(text))
        except OSError:
            pass
    return total


KEPT_EXECUTABLES = 8
"""Compiled programs a server keeps for ``pin`` (the latest compile of each batch, most recent first)."""
KEPT_UNTUNED = 16
"""Untuned programs a server keeps when a compile request asks it to (``keep_untuned``: ``jaxfit
tune`` times them to rank micro-batches before it proves any)."""


def set_persistent_cache(enabled: bool) -> Optional[bool]:
    """Turn JAX's persistent compilation cache on or off for this process; returns the old setting.

    JAX decides once per process whether the cache is used, so the decision is reset too
    (``jax.experimental.compilation_cache.compilation_cache.reset_cache``, jax 0.4.26+; without it,
    the flag alone works while nothing has compiled yet). ``None``: this jax has no such cache.
    """
    import jax

    try:
        was = bool(getattr(jax.config, "jax_enable_compilation_cache"))  # noqa: B009 - not every jax has it
    except AttributeError:
        return None
    if was != enabled:
        jax.config.update("jax_enable_compilation_cache", enabled)
        try:
            from jax.experimental.compilation_cache import compilation_cache as cc

            cc.reset_cache()
        except Exception:
            pass
    return was


@contextlib.contextmanager
def persistent_cache_off() -> Iterator[None]:
    """Compile without JAX's persistent compilation cache (no read, no write), then restore it.
    One thread at a time: the setting is the process's."""
    was = set_persistent_cache(False)
    try:
        yield
    finally:
        if was:
            set_persistent_cache(True)


@contextlib.contextmanager
def runtime_typechecks_off() -> Iterator[None]:
    """Lower with jaxtyping's run-time checks off (restored after), where the script uses jaxtyping.

    ``Lowered`` objects describe their arguments by rebuilding the argument pytrees with
    ``ArgInfo`` leaves (jax 0.5's ``make_args_info``); a container that type-checks its fields when
    built (openpi's ``TrainState``: jaxtyping with beartype) rejects them, so the step could not be
    lowered at all. The checks add no operations to the program: its fingerprint is unchanged.
    """
    jaxtyping = sys.modules.get("jaxtyping")
    config = getattr(jaxtyping, "config", None)
    was = getattr(config, "jaxtyping_disable", None)
    if config is None or was is None:
        yield
        return
    config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        config.update("jaxtyping_disable", was)


def function_name(fun: Any) -> str:
    """The name of a function, looking through ``functools.partial`` and wrappers: what a jitted
    step is known by (``jax.jit(functools.partial(train_step, config))`` is ``train_step``)."""
    import functools

    for _ in range(16):
        if isinstance(fun, functools.partial):
            fun = fun.func
        elif hasattr(fun, "__wrapped__"):
            fun = fun.__wrapped__
        else:
            break
    return getattr(fun, "__name__", None) or type(fun).__name__


def itemsize(dtype: Any) -> int:
    """Bytes per element of ``dtype`` (extended dtypes, PRNG keys, have their own ``itemsize``)."""
    import numpy as np

    size = getattr(dtype, "itemsize", None)
    return size if isinstance(size, int) else np.dtype(dtype).itemsize


def tree_bytes(tree: Any, per_device: bool = False, only: Optional[Callable[[Any], bool]] = None) -> int:
    """Bytes of the array leaves of ``tree`` (abstract or concrete).

    ``per_device``: what one device holds: a leaf sharded over a mesh counts its shard
    (``sharding.shard_shape``), any other leaf its whole size. ``only``: count the leaves it
    accepts, not all.
    """
    import jax

    total = 0
    for x in jax.tree_util.tree_leaves(tree):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")) or (only is not None and not only(x)):
            continue
        shape = tuple(x.shape)
        sharding = getattr(x, "sharding", None) if per_device else None
        try:
            if sharding is not None:
                shape = tuple(sharding.shard_shape(shape))
        except Exception:  # a sharding without shard_shape: count the whole array
            pass
        size = 1
        for d in shape:
            size *= int(d)
        total += size * itemsize(x.dtype)
    return total


def mesh_of(tree: Any) -> "Dict[str, int]":
    """``{axis: size}`` of the largest device mesh any leaf of ``tree`` is sharded over (``{}``:
    none, e.g. arrays on one device)."""
    import jax

    best: "Dict[str, int]" = {}
    best_size = 1
    for x in jax.tree_util.tree_leaves(tree):
        mesh = getattr(getattr(x, "sharding", None), "mesh", None)
        shape = getattr(mesh, "shape", None)
        if not shape:
            continue
        axes = {str(k): int(v) for k, v in dict(shape).items()}
        size = 1
        for v in axes.values():
            size *= v
        if size > best_size:
            best, best_size = axes, size
    return best


def _children(node: Any) -> "Optional[list[tuple[str, Any]]]":
    """The named top-level children of a container (dict keys, dataclass or namedtuple fields,
    tuple and list indices), or None for a leaf or another pytree node."""
    import dataclasses

    if isinstance(node, dict):
        return [(str(k), v) for k, v in node.items()]
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return [(f.name, getattr(node, f.name)) for f in dataclasses.fields(node) if hasattr(node, f.name)]
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return [(str(f), getattr(node, f)) for f in node._fields]
    if isinstance(node, (tuple, list)):
        return [(str(i), v) for i, v in enumerate(node)]
    return None


def describe_arguments(
    args: "tuple[Any, ...]",
    names: "list[str]",
    batch_index: Optional[int],
    field_names: "Optional[Dict[str, list[str]]]" = None,
    batch_ids: "frozenset" = frozenset(),
) -> "list[list[Any]]":
    """``[[component, bytes, whole_bytes], ...]``: the step's arguments by name, the batch as
    ``batch``, and the state's top-level fields (``state.params``, ``state.opt_state``...) so a
    breakdown can tell parameters from optimizer state. ``bytes`` is what one device holds (the
    memory analysis is per device), ``whole_bytes`` the unsharded size (what each device would hold
    replicated). ``field_names`` names the fields of tuple arguments. ``batch_ids``: the batch's
    arrays (``id()``), where they sit inside arguments that hold other things too."""
    out: "list[list[Any]]" = []
    if batch_ids:
        batch = lambda x: id(x) in batch_ids  # noqa: E731
        out.append(["batch", tree_bytes(args, True, batch), tree_bytes(args, False, batch)])
        others = lambda x: id(x) not in batch_ids  # noqa: E731
        for i, arg in enumerate(args):
            name = names[i] if i < len(names) else "arg%d" % i
            for field, value in _children(arg) or [("", arg)]:
                size = tree_bytes(value, False, others)
                if size:
                    label = "%s.%s" % (name, field) if field else name
                    out.append([label, tree_bytes(value, True, others), size])
        return out
    for i, arg in enumerate(args):
        name = names[i] if i < len(names) else "arg%d" % i
        if i == batch_index:
            out.append(["batch", tree_bytes(arg, per_device=True), tree_bytes(arg)])
            continue
        children = _children(arg)
        if children is None or tree_bytes(arg) == 0:
            out.append([name, tree_bytes(arg, per_device=True), tree_bytes(arg)])
            continue
        labels = (field_names or {}).get(name)
        for k, (field, value) in enumerate(children):
            size = tree_bytes(value)
            if size:
                label = labels[k] if labels and k < len(labels) else field
                out.append(["%s.%s" % (name, label), tree_bytes(value, per_device=True), size])
    return out


def positional_parameters(fun: Any) -> "list[str]":
    """The names of the positional parameters ``fun`` takes when called (those a
    ``functools.partial`` binds are skipped; wrappers are looked through)."""
    import functools
    import inspect

    bound = 0
    for _ in range(16):
        if isinstance(fun, functools.partial):
            bound += len(fun.args)
            fun = fun.func
        elif hasattr(fun, "__wrapped__"):
            fun = fun.__wrapped__
        else:
            break
    try:
        params = [
            p.name
            for p in inspect.signature(fun).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    return params[bound:]


def argument_names(fun: Any, count: int) -> "list[str]":
    """The names of the first ``count`` positional parameters ``fun`` takes when called, ``argN``
    where they are not known."""
    names = positional_parameters(fun)[:count]
    return names + ["arg%d" % i for i in range(len(names), count)]


def program_fingerprint(lowered: Any) -> str:
    """The identity of a lowered program: the SHA-256 of its StableHLO text.

    The same jitted function on the same shapes, dtypes, shardings and donation lowers to the same
    text in any process; a changed config value, flag of the step or jax version changes it.
    """
    return hashlib.sha256(lowered.as_text().encode()).hexdigest()


def memory_of(compiled: Any) -> Dict[str, Any]:
    """XLA's memory analysis (and FLOPs where given) of a compiled step, as a plain dict."""
    ma = compiled.memory_analysis()
    if ma is None:
        import jax

        raise RuntimeError(
            "jax %s gives no memory analysis for this compiled program; to compile for a GPU that is not here "
            "the script needs jax 0.6.2 or newer (0.5.3 gives none)" % jax.__version__
        )
    flops = None
    try:
        cost = compiled.cost_analysis()
        if isinstance(cost, list):  # older jax returned one dict per device
            cost = cost[0] if cost else None
        if cost and "flops" in cost:
            flops = float(cost["flops"])
    except Exception:  # cost analysis is a nicety; some backends raise
        flops = None
    return {
        "argument_bytes": int(ma.argument_size_in_bytes),
        "output_bytes": int(ma.output_size_in_bytes),
        "alias_bytes": int(ma.alias_size_in_bytes),
        "temp_bytes": int(ma.temp_size_in_bytes),
        "generated_code_bytes": int(getattr(ma, "generated_code_size_in_bytes", 0) or 0),
        "flops": flops,
    }


class JsonStore:
    """A table of JSON values in SQLite, keyed by string; safe across threads and processes.

    Each write is one transaction: a crash leaves the previous state, never half a row.
    """

    def __init__(self, path: str, table: str) -> None:
        if not table.isidentifier():
            raise ValueError("bad table name %r" % table)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._table = table
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=30, check_same_thread=False)
        with self._lock, self._db:
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS %s (key TEXT PRIMARY KEY, value TEXT NOT NULL, "
                "created REAL NOT NULL)" % table
            )

    def get(self, key: str) -> Optional[Dict[str, Any]]:
        """The value stored under ``key``, or ``None``."""
        with self._lock:
            row = self._db.execute("SELECT value FROM %s WHERE key = ?" % self._table, (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, value: Dict[str, Any]) -> None:
        """Store one value (replacing any under the same key)."""
        with self._lock, self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO %s (key, value, created) VALUES (?, ?, ?)" % self._table,
                (key, json.dumps(value), time.time()),
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()


class CompileCache(JsonStore):
    """Memory analyses of single compiles, keyed by program fingerprint and compile context."""

    def __init__(self, path: str) -> None:
        super().__init__(path, "compiles")


def device_info() -> Dict[str, Any]:
    """The first device, its allocator limit under this process's fraction, and versions."""
    import jax

    device = jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # some backends raise instead of returning None
        stats = None
    platform = device.platform
    bytes_limit = int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None
    # The GPU compiler squeezes the step toward the allocator limit; the CPU one ignores it.
    limit_sensitive = platform in ("gpu", "cuda", "rocm")
    emulated = os.environ.get(EMULATE_GPU_ENV)
    if emulated and platform == "cpu":
        spelled = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION") or os.environ.get("XLA_CLIENT_MEM_FRACTION")
        # (tests: $JAXFIT_EMULATE_GPU_POOL, the share a jax that ignores the variable would take)
        fraction = float(os.environ.get("JAXFIT_EMULATE_GPU_POOL") or spelled or 0.75)
        bytes_limit, limit_sensitive = int(int(emulated) * fraction), True
    return {
        # the most the process held on the device so far: when a probe's server starts, its start-up's peak
        "start_peak_bytes": int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None,
        "platform": platform,
        "device_kind": getattr(device, "device_kind", platform),
        "device_count": jax.device_count(),
        "bytes_limit": bytes_limit,
        "limit_sensitive": limit_sensitive,
        "host_memory_bytes": host_memory_bytes(),
        "jax_version": jax.__version__,
        "python": sys.version.split()[0],
    }


def open_channels() -> "tuple[TextIO, TextIO]":
    """(requests, replies) from the file descriptors named in the environment."""
    reply_fd = int(os.environ[REPLY_FD_ENV])
    request_fd = os.environ.get(REQUEST_FD_ENV)
    requests = os.fdopen(int(request_fd), "r") if request_fd else sys.stdin
    return requests, os.fdopen(reply_fd, "w", buffering=1)


class Server:
    """Compiles one step at the batch sizes it is asked for.

    Args:
      lower: ``batch_size -> jax.stages.Lowered`` for the step.
      replies: Where replies are written.
      workload: ``{"name": ..., "description": {...}}`` reported in the ready message.
      cache_path: The SQLite compile cache, or ``None``.
      components: ``batch_size -> [[component, bytes], ...]``: the step's arguments by name
        (:func:`describe_arguments`), sent with every compile for the memory breakdown.
      concrete: ``batch_size -> args``: real arguments of the step at that batch, to time the
        program (``time``); None where the step cannot be run here.
      donated: The positions of the arguments the step donates (they are fed back from its outputs
        between timed calls, as a training loop does).
      keep_arguments: Called after a timing with the arguments its last call left (the donated
        ones fed back): where ``concrete`` hands out arguments that live on (a script's own state,
        which the timed calls donated), the next timing starts from these.
    """

    def __init__(
        self,
        lower: Callable[[int], Any],
        replies: TextIO,
        workload: Dict[str, Any],
        cache_path: Optional[str] = None,
        components: "Optional[Callable[[int], list]]" = None,
        concrete: "Optional[Callable[[int], tuple]]" = None,
        donated: "tuple" = (),
        loader: "Optional[Callable[[str], Dict[str, Any]]]" = None,
        keep_arguments: "Optional[Callable[[list], None]]" = None,
        retarget: "Optional[Callable[[Dict[str, Any]], Dict[str, Any]]]" = None,
    ) -> None:
        self.loader = loader
        self.retargeter = retarget
        self.keep_arguments = keep_arguments
        self.lower = lower
        self.components = components
        self.concrete = concrete
        self.donated = tuple(donated)
        self.replies = replies
        self.workload = workload
        self.info = device_info()
        set_persistent_cache(False)  # this process only compiles (and never trains): for good
        self.cache = CompileCache(cache_path) if cache_path else None
        self._reply_lock = threading.Lock()
        self._lower_lock = threading.Lock()  # tracing is cheap and not guaranteed thread-safe
        # batch -> (fingerprint, compiled, memory) of the latest compile with the options training uses
        self._kept: "collections.OrderedDict[int, tuple]" = collections.OrderedDict()
        # batch -> compiled, of untuned compiles whose request asked to keep them (to be timed)
        self._untuned: "collections.OrderedDict[int, Any]" = collections.OrderedDict()
        self._kept_lock = threading.Lock()

    def send(self, message: Dict[str, Any]) -> None:
        with self._reply_lock:
            self.replies.write(json.dumps(message) + "\n")
            self.replies.flush()

    def ready(self) -> None:
        self.send({"op": "ready", "info": dict(self.info, workload=self.workload)})

    def load(self, source: str) -> None:
        """Serve another workload from now on (``jaxfit tune``'s next setting in the same process):
        ``loader(source)`` gives its ``lower``, ``workload``, ``components``, ``concrete`` and
        ``donated``; the programs kept for the last one go. Replies ``ready`` as a start does, or
        ``error`` (the old workload is served still)."""
        if self.loader is None:
            send_error(self.replies, "internal", "RuntimeError", "this process serves one workload only")
            return
        try:
            parts = self.loader(source)
        except Exception as e:
            user = type(e).__name__ in USER_ERRORS
            send_error(
                self.replies,
                "user" if user else "internal",
                type(e).__name__,
                str(e) if user else "%s: %s" % (type(e).__name__, e),
            )
            return
        with self._kept_lock:
            self._kept.clear()
            self._untuned.clear()
        self.lower, self.workload = parts["lower"], parts["workload"]
        self.components, self.concrete = parts.get("components"), parts.get("concrete")
        self.donated = tuple(parts.get("donated") or ())
        self.ready()

    def _cache_key(self, fingerprint: str, options: Dict[str, Any]) -> str:
        parts = {
            "fingerprint": fingerprint,
            "limit": self.info["bytes_limit"] if self.info["limit_sensitive"] else None,
            "jax": self.info["jax_version"],
            "device": self.info["device_kind"],
            "devices": self.info["device_count"],
            "options": options,
            "compiler_memory": self.info.get("compiler_memory"),  # a deviceless compile's device_memory_size
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def lower_one(self, batch: int) -> "tuple[Any, str, float]":
        """``(lowered, fingerprint, seconds)`` of the step at ``batch``: tracing, on the calling thread.

        A probe lowers on the thread of the script's parked call: libraries keep the context of a
        call in thread-local state (flax's NNX update context), which other threads do not see."""
        start = time.perf_counter()
        with self._lower_lock, runtime_typechecks_off():
            lowered = self.lower(batch)
            fingerprint = program_fingerprint(lowered)
        return lowered, fingerprint, time.perf_counter() - start

    def compile_one(
        self,
        batch: int,
        autotune: bool,
        keep_untuned: bool = False,
        beside: "Sequence[int]" = (),
        lowered_as: "Any" = None,
    ) -> Dict[str, Any]:
        """Lower and compile at ``batch``; never raises (errors are answers). ``keep_untuned``: an
        untuned compile is made (never answered from the cache) and its program kept to be timed
        (``time_step(..., untuned=True)``). ``beside``: the batches compiled at the same time.
        ``lowered_as``: what :meth:`lower_one` gave for ``batch`` on another thread (or the
        exception it raised), so that only the compile runs here."""
        start = time.perf_counter()
        try:
            if lowered_as is None:
                lowered_as = self.lower_one(batch)
            if isinstance(lowered_as, BaseException):
                raise lowered_as
            lowered, fingerprint, lower_seconds = lowered_as
            start -= lower_seconds
            options: Dict[str, Any] = {}
            if self.info["limit_sensitive"] and not autotune:
                options["xla_gpu_autotune_level"] = 0  # ~3x faster compiles (docs/guides/facts.md #6)
                options.update(untuned_options())
            elif self.info["limit_sensitive"] and TUNED_LEVEL:
                options["xla_gpu_autotune_level"] = int(TUNED_LEVEL)  # an experiment; see below
            key = self._cache_key(fingerprint, options)
            keep = keep_untuned and bool(options)
            memory = self.cache.get(key) if self.cache is not None and not keep else None
            cached = memory is not None
            if memory is None:
                compiled = self._compile(batch, lowered, options, beside)
                memory = memory_of(compiled)
                if not options:  # the program as training compiles it: keep it for ``pin``
                    self._keep(batch, fingerprint, compiled, memory)
                elif keep:
                    with self._kept_lock:
                        self._untuned.pop(batch, None)
                        self._untuned[batch] = compiled
                        while len(self._untuned) > KEPT_UNTUNED:
                            self._untuned.popitem(last=False)
                if self.cache is not None:
                    self.cache.put(key, memory)
            reply = {
                "batch": batch,
                "ok": True,
                "memory": memory,
                "cached": cached,
                "compile_s": time.perf_counter() - start,
                "lower_s": lower_seconds,
                "fingerprint": fingerprint,
            }
            if self.components is not None:
                try:
                    reply["components"] = self.components(batch)
                except Exception:  # a nicety: the breakdown is left out, the compile stands
                    pass
            return reply
        except Exception as e:  # an answer, not a crash: the parent decides what it means
            message = "%s: %s" % (type(e).__name__, e)
            if os.environ.get("JAXFIT_DEBUG"):
                traceback.print_exc()
            return {
                "batch": batch,
                "ok": False,
                "oom": is_out_of_memory(message),
                "error": message,
                "traceback": traceback.format_exc(limit=8),
                "compile_s": time.perf_counter() - start,
            }

    def _compile(self, batch: int, lowered: Any, options: Dict[str, Any], beside: "Sequence[int]") -> Any:
        """``lowered`` compiled with ``options``; ``beside``: the batches compiled at the same time
        (for :data:`EMULATE_CROWDED_OOM_ENV`)."""
        if not options and os.environ.get(EMULATE_CROWDED_OOM_ENV) and any(b < batch for b in beside):
            raise RuntimeError(
                "RESOURCE_EXHAUSTED: Out of memory while autotuning beside the compile of batch %d "
                "(emulated: $%s)" % (min(beside), EMULATE_CROWDED_OOM_ENV)
            )
        tried = dict(options)
        while True:
            try:
                return lowered.compile(compiler_options=tried) if tried else lowered.compile()
            except Exception as e:
                # Deviceless (a GPU that is not here): XLA may find no Triton tiling for some dots
                # without autotuning ("No supported config found", "Couldn't find output tile sizes"):
                # such a dot goes to cuBLAS instead, as autotuning would have let it. An older XLA
                # (jax 0.6, 0.7) asks for autotuning results it cannot have unless autotuning is off.
                text = str(e)
                if self.info.get("topology") != "target":
                    raise
                if NO_AUTOTUNE_RESULTS in text and tried.get("xla_gpu_autotune_level") != 0:
                    tried["xla_gpu_autotune_level"] = 0
                elif (
                    any(m in text for m in TRITON_TILING_ERRORS)
                    and tried.get("xla_gpu_enable_triton_gemm") is not False
                ):
                    tried["xla_gpu_enable_triton_gemm"] = False
                else:
                    raise

    def _keep(self, batch: int, fingerprint: str, compiled: Any, memory: Dict[str, Any]) -> None:
        with self._kept_lock:
            self._kept.pop(batch, None)
            self._kept[batch] = (fingerprint, compiled, memory)
            while len(self._kept) > KEPT_EXECUTABLES:
                self._kept.popitem(last=False)

    def _training_program(self, batch: int) -> "tuple[tuple, bool]":
        """``((fingerprint, compiled, memory), recompiled)``: the program kept from the compile at
        ``batch`` with the options training uses, or, when there is none (its analysis came from
        jaxfit's cache, or it was dropped), that batch compiled now."""
        with self._kept_lock:
            kept = self._kept.get(batch)
        if kept is not None:
            return kept, False
        lowered, fingerprint, _ = self.lower_one(batch)
        compiled = lowered.compile()
        return (fingerprint, compiled, memory_of(compiled)), True

    def pin(self, batch: int, path: str) -> Dict[str, Any]:
        """Write the program compiled at ``batch`` (as training compiles it) to ``path``.

        The program kept from the compile that answered is written as it is; when there is none
        (its analysis came from jaxfit's cache), the batch is compiled now and the reply says so
        (``recompiled``), with the memory of the program written, which the caller compares.
        Never raises: a failure is an answer (``ok: false`` and why).
        """
        start = time.perf_counter()
        try:
            (fingerprint, compiled, memory), recompiled = self._training_program(batch)
            from jax.experimental import serialize_executable

            payload = serialize_executable.serialize(compiled)[0]
            try:  # the devices it runs on, in order: loading it on all of them would fail to run
                devices = [int(d.id) for d in compiled.runtime_executable().local_devices()]
            except Exception:
                devices = None
            tmp = "%s.%d.tmp" % (path, os.getpid())
            with open(tmp, "wb") as f:
                f.write(payload)
            os.replace(tmp, path)
            return {
                "op": "pinned",
                "ok": True,
                "batch": batch,
                "fingerprint": fingerprint,
                "memory": memory,
                "recompiled": recompiled,
                "bytes": len(payload),
                "execution_devices": devices,
                "xla_flags": os.environ.get("XLA_FLAGS", ""),
                "seconds": time.perf_counter() - start,
            }
        except Exception as e:  # e.g. a backend that cannot serialise, a full disk
            return {"op": "pinned", "ok": False, "batch": batch, "error": "%s: %s" % (type(e).__name__, e)}

    def retarget(self, target: Dict[str, Any]) -> None:
        """Compile for another GPU that is not here from now on (``{"name", "spec", "limit"}``, as
        ``JAXFIT_TARGET`` gives one): ``retarget(target)`` switches the devices the step is lowered
        for and gives the server's new device fields. Replies ``ready`` as a start does, or ``error``
        (the old target is served still). A script's start-up is not run again."""
        if self.retargeter is None:
            send_error(self.replies, "internal", "RuntimeError", "this process compiles for one target only")
            return
        try:
            fields = self.retargeter(target)
        except Exception as e:
            send_error(self.replies, "user", "ConfigError", "cannot compile for %s: %s" % (target.get("name"), e))
            return
        self.info.update(fields)
        self.ready()

    def compile_many(self, request: Dict[str, Any]) -> None:
        """Compile a round of batches side by side, replying with each result as it comes.

        Each batch is traced here, on the serving thread (the script's parked call, in a probe),
        and handed to the pool as soon as it is traced: its compile runs while the next batch is
        traced (tracing openpi's step takes 2-4 s a batch; traced all first, eight batches waited
        about 20 s before the first compile began)."""
        batches = [int(b) for b in request["batches"]]
        threads = max(1, int(request.get("threads") or len(batches)))
        autotune = bool(request.get("autotune", True))
        keep = bool(request.get("keep_untuned"))
        with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
            futures = []
            for b in batches:
                try:
                    lowered: Any = self.lower_one(b)
                except Exception as e:  # answered as the compile's error, in order
                    lowered = e
                beside = [x for x in batches if x != b] if threads > 1 else []
                futures.append(pool.submit(self.compile_one, b, autotune, keep, beside, lowered))
            for future in concurrent.futures.as_completed(futures):
                self.send(dict(op="result", id=request.get("id"), **future.result()))
        self.send({"op": "done", "id": request.get("id")})

    def process_overhead(self) -> Dict[str, Any]:
        """Device memory this process holds outside the XLA pool (CUDA context, libraries).

        Measured as the process's used memory according to nvidia-smi minus the pool's bytes,
        after small matmuls have loaded the math libraries (docs/guides/facts.md #5).
        """
        if not self.info["limit_sensitive"]:
            return {"op": "overhead", "bytes": 0, "method": "none: not a GPU"}
        import jax
        import jax.numpy as jnp

        for dtype in (jnp.float32, jnp.bfloat16):
            x = jnp.ones((256, 256), dtype)
            jax.block_until_ready(jax.jit(lambda a: a @ a)(x))
        stats = jax.devices()[0].memory_stats() or {}
        pool = int(stats.get("pool_bytes", stats.get("bytes_reserved", stats.get("bytes_in_use", 0))))
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError) as e:
            return {"op": "overhead", "bytes": None, "method": "nvidia-smi unavailable: %s" % e}
        for line in out.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == 2 and fields[0] == str(os.getpid()) and fields[1].isdigit():
                used = int(fields[1]) << 20
                return {
                    "op": "overhead",
                    "bytes": max(0, used - pool),
                    "method": "nvidia-smi minus pool",
                    "process_used_bytes": used,
                    "pool_bytes": pool,
                }
        return {"op": "overhead", "bytes": None, "method": "this process is not in nvidia-smi's list"}

    def time_step(
        self,
        batch: int,
        warmup: int,
        steps: int,
        give_up: "Optional[Sequence[float]]" = None,
        untuned: bool = False,
    ) -> Dict[str, Any]:
        """Run the program compiled at ``batch`` as training compiles it (compiling it if it was not
        kept) on real arguments, ``warmup`` calls untimed and ``steps`` timed, each waited for; the
        donated arguments are fed back from the outputs, as a training loop does. With ``give_up``
        ``(look, seconds per sample)``: stop after ``look`` timed calls that took more than that
        times ``batch`` each on average (``stopped_early``). ``untuned``: the untuned program kept
        from a compile that asked for it instead (never compiled here). Never raises."""
        start = time.perf_counter()
        try:
            if self.concrete is None:
                raise RuntimeError("this process cannot run the step (no real arguments)")
            if untuned:
                with self._kept_lock:
                    compiled = self._untuned.get(batch)
                if compiled is None:
                    raise RuntimeError("no untuned program of batch %d is kept" % batch)
            else:
                (_, compiled, _), _ = self._training_program(batch)
            concrete = self.concrete
            times, first, stopped, args = _run_steps(
                compiled,
                list(concrete(batch)),
                self.donated,
                warmup,
                steps,
                give_up=None if give_up is None else (int(give_up[0]), float(give_up[1]) * batch),
                refill=lambda: list(concrete(batch)),
            )
            variants = None
            if TIME_VARIANTS:
                variants, args = _time_variants(compiled, args, self.donated, warmup, steps)
            if self.keep_arguments is not None:
                self.keep_arguments(args)
            reply = {
                "op": "timed",
                "ok": True,
                "batch": batch,
                "step_seconds": times,
                "first_call_seconds": first,
                "stopped_early": stopped,
                "seconds": time.perf_counter() - start,
            }
            if variants is not None:
                reply["variants"] = variants
            return reply
        except Exception as e:
            return {
                "op": "timed",
                "ok": False,
                "batch": batch,
                "error": "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0][:300] if str(e).strip() else ""),
                "oom": is_out_of_memory(str(e)),
            }

    def serve(self, requests: TextIO) -> None:
        """Answer requests until ``quit`` or the end of the request stream."""
        for line in requests:
            if not line.strip():
                continue
            request = json.loads(line)
            op = request.get("op")
            if op == "compile":
                self.compile_many(request)
            elif op == "pin":
                self.send(self.pin(int(request["batch"]), str(request["path"])))
            elif op == "overhead":
                self.send(self.process_overhead())
            elif op == "time":
                self.send(
                    self.time_step(
                        int(request["batch"]),
                        int(request["warmup"]),
                        int(request["steps"]),
                        request.get("give_up"),
                        bool(request.get("untuned")),
                    )
                )
            elif op == "load":
                self.load(str(request["source"]))
            elif op == "retarget":
                self.retarget(dict(request["target"]))
            elif op == "quit":
                return
            else:
                self.send({"op": "error", "kind": "protocol", "message": "unknown op %r" % (op,)})


def _run_steps(
    program: Any,
    args: "list",
    donated: "tuple",
    warmup: int,
    steps: int,
    give_up: "Optional[tuple[int, float]]" = None,
    refill: "Optional[Callable[[], list]]" = None,
) -> "tuple[list[float], Optional[float], bool, list]":
    """Call ``program`` ``warmup`` times untimed and ``steps`` times timed, each waited for, feeding
    the donated arguments back from the outputs as a training loop does (``refill()``: fresh
    arguments where the step returns no state in the donated one's place; without it, an error).
    ``give_up`` ``(look, seconds)``: stop after ``look`` timed calls that took more than
    ``seconds`` each on average. Returns the timed seconds, the first call's seconds, whether it
    stopped early, and the arguments the last call left."""
    import jax

    times: "list[float]" = []
    first = None
    stopped = False
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        out = program(*args)
        jax.block_until_ready(out)
        elapsed = time.perf_counter() - t0
        if i == 0:
            first = elapsed
        if i >= warmup:
            times.append(elapsed)
            if give_up is not None and len(times) == give_up[0] < steps:
                stopped = sum(times) / len(times) > give_up[1]
                if stopped:
                    break
        fed = _fed_back(args, out, donated)
        if fed is None:
            if refill is None:
                raise RuntimeError("the step returns no state in the donated one's place")
            del out
            args = refill()
        else:
            args = fed
    return times, first, stopped, args


TIME_VARIANTS = [v for v in os.environ.get("JAXFIT_TIME_VARIANTS", "").split(",") if v.strip()]
"""Diagnostics only (benchmarks/probe_speed.py): after a timing, time the same program again in
these ways, each reported under ``variants`` (its step seconds, or its error): ``again``, the
same once more; ``reload``, the program serialized and loaded again, as a pinned process loads it;
``thread``, run from a new thread; ``copy`` and ``host``, on the arguments' values in new buffers
(copied on the device, or put from the host); ``zeros``, with every integer leaf of the
arguments not donated (a batch's tokens) 0; ``noise``, on noise of the arguments' shapes in place of every
argument (the state too; last, it may not fit beside the state)."""


def _time_variants(
    compiled: Any, args: "list", donated: "tuple", warmup: int, steps: int
) -> "tuple[Dict[str, Any], list]":
    """:data:`TIME_VARIANTS` of ``compiled``: each one's step seconds (or its error), and the
    arguments the last one left (the state fed on from ``args``, as the timing feeds it)."""
    import jax

    current = {"args": list(args)}

    def loop(program: Any) -> "list[float]":
        times, _first, _stopped, current["args"] = _run_steps(program, current["args"], donated, warmup, steps)
        return times

    results: Dict[str, Any] = {}
    for name in TIME_VARIANTS:
        key = name if name not in results else "%s-%d" % (name, len(results))  # a variant asked twice
        try:
            if name == "reload":
                from jax.experimental import serialize_executable

                payload, in_tree, out_tree = serialize_executable.serialize(compiled)
                results[key] = loop(serialize_executable.deserialize_and_load(payload, in_tree, out_tree))
            elif name == "thread":
                box: Dict[str, Any] = {}

                def run(box: Dict[str, Any] = box) -> None:
                    try:
                        box["times"] = loop(compiled)
                    except Exception as e:  # reported below
                        box["error"] = "%s: %s" % (type(e).__name__, str(e)[:200])

                worker = threading.Thread(target=run)
                worker.start()
                worker.join()
                results[key] = box.get("times", box.get("error"))
            elif name == "again":
                results[key] = loop(compiled)
            elif name in ("copy", "host"):  # the same values in new buffers: copied on the device, or from the host
                import numpy as np

                def fresh(x: Any, name: str = name) -> Any:
                    if not isinstance(x, jax.Array) or jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                        return x
                    return x.copy() if name == "copy" else jax.device_put(np.asarray(x), x.sharding)

                current["args"] = jax.tree_util.tree_map(fresh, list(current["args"]))
                results[key] = loop(compiled)
            elif name == "zeros":  # the integer leaves of what is not donated (the batch's tokens) all 0
                kept = current["args"]
                current["args"] = [
                    a
                    if i in donated
                    else jax.tree_util.tree_map(
                        lambda x: (
                            jax.numpy.zeros_like(x)
                            if isinstance(x, jax.Array) and jax.numpy.issubdtype(x.dtype, jax.numpy.integer)
                            else x
                        ),
                        a,
                    )
                    for i, a in enumerate(kept)
                ]
                try:
                    results[key] = loop(compiled)
                finally:  # the batch as it was, the state as the loop left it
                    current["args"] = [a if i in donated else kept[i] for i, a in enumerate(current["args"])]
            elif name == "noise":  # every argument noise (the state too): last, it may not fit beside the state
                abstract = jax.tree_util.tree_map(
                    lambda x: (
                        jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) if isinstance(x, jax.Array) else x
                    ),
                    list(current["args"]),
                )
                kept, current["args"] = current["args"], list(real_arguments(abstract, seed=1))
                try:
                    results[key] = loop(compiled)
                finally:
                    current["args"] = kept
            else:
                results[key] = "unknown variant"
        except Exception as e:
            results[key] = "%s: %s" % (
                type(e).__name__,
                str(e).strip().splitlines()[0][:200] if str(e).strip() else "",
            )
    return results, current["args"]


def tree_signature(tree: Any) -> Any:
    """What must be equal for a step's output (or part of one) to be an argument updated: the
    structure, and the shape and dtype of each leaf (hashable)."""
    import jax

    flat, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, tuple((tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x).__name__))) for x in flat)


def _fed_back(args: "list", out: Any, donated: "tuple") -> "Optional[list]":
    """The next call's arguments: each donated argument replaced by the output (or top-level part of
    the output) with its structure, shapes and dtypes, as a training loop passes the new state on;
    None when a donated argument has no such output."""
    parts = list(out) if isinstance(out, (tuple, list)) else [out]
    nxt = list(args)
    for i in donated:
        match = next((p for p in parts if tree_signature(p) == tree_signature(args[i])), None)
        if match is None:
            return None
        nxt[i] = match
    return nxt


NOISE_BLOCK = 1 << 20
"""Elements of noise drawn for :func:`real_arguments`, repeated to fill larger leaves."""


def real_arguments(abstract: Any, seed: int = 0) -> Any:
    """Arrays for a pytree of ``jax.ShapeDtypeStruct``: normal noise for floating point, zeros for
    integers and booleans, a key for PRNG keys, each placed with the struct's sharding when it has
    one; concrete leaves are kept. What a step is timed on (its speed does not depend on the values)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    key = jax.random.key(seed)
    rng = np.random.default_rng(seed)
    # One block of noise, repeated to fill each leaf: drawing every element (gpt-small's state and
    # Adam moments: ~400 M) took 9 s a timing on a CPU host, where the step's time does not depend
    # on the values.
    noise = rng.standard_normal(NOISE_BLOCK, dtype=np.float32)
    leaves, treedef = jax.tree_util.tree_flatten(abstract)
    out = []
    for n, leaf in enumerate(leaves):
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            out.append(leaf)
            continue
        dtype = leaf.dtype
        # Made on the host and placed whole, one after another: no device temporaries between
        # them in the pool the step then runs in.
        value: Any
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            value = jax.random.split(jax.random.fold_in(key, n), max(1, int(np.prod(leaf.shape))))
            value = value.reshape(leaf.shape) if leaf.shape else value[0]
        elif jnp.issubdtype(dtype, jnp.floating):
            size = int(np.prod(leaf.shape))
            start = (n * 7919) % NOISE_BLOCK  # leaves start at different places of the block
            value = np.resize(np.roll(noise, -start), size).reshape(leaf.shape).astype(dtype, copy=False)
        else:
            value = np.zeros(leaf.shape, dtype)
        sharding = getattr(leaf, "sharding", None)
        out.append(jax.device_put(value, sharding) if sharding is not None else jax.device_put(value))
    return jax.tree_util.tree_unflatten(treedef, out)


def send_error(replies: TextIO, kind: str, error_class: str, message: str) -> None:
    """Report a failure to start (no workload, no step found...)."""
    replies.write(
        json.dumps(
            {
                "op": "error",
                "kind": kind,
                "error_class": error_class,
                "message": message,
                "traceback": traceback.format_exc(limit=8),
            }
        )
        + "\n"
    )
    replies.flush()
