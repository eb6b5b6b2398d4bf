"""Which compile child serves a fit: started under the fit's fraction (or for a GPU that is not
here), checked against that limit, or shared (:func:`shared_compile_process` for ``jaxfit tune``'s
built-in examples and entries, :func:`shared_target_probe` for a script's deviceless estimates and
plans), and released when the fit is done with it."""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import tempfile
from collections.abc import Iterator

from jaxfit._probe.jaxfit_lean import LEAN_ENV
from jaxfit._probe.jaxfit_target import SKIP_CUDA_CHECK_ENV, TARGET_ENV
from jaxfit.errors import ConfigError
from jaxfit.fit import budget as budget_mod
from jaxfit.fit.common import Progress, notify
from jaxfit.fit.compiler import CompileChild, DeviceInfo
from jaxfit.fit.options import FitOptions
from jaxfit.fit.sources import ScriptSource, Source


def start_child(
    source: Source, fraction: float, options: FitOptions, cache_path: str | None, progress: Progress | None = None
) -> tuple[CompileChild, DeviceInfo, int, int, int | None]:
    """The compile child under ``fraction``: ``(child, info, total, limit, gpu_total)`` (``gpu_total``:
    this GPU's own memory, None on a CPU).

    On a GPU its total is read first (:func:`~jaxfit.fit.devices.cuda_total_bytes`: a short JAX
    process, once per jaxfit process), so the child starts once, under ``fraction`` or, with
    ``--device-memory`` (planning for another card), under the fraction of this GPU whose limit
    equals ``fraction x`` that size; and its allocator's limit is checked against that share of
    the total (:func:`_check_cap`). When the total cannot be read, the child is started, measured
    and, for a planned card, restarted (a training script's probe then runs its start-up twice).

    Raises:
      ConfigError: the planned card is larger than this GPU at that fraction; the child's limit is
        not the fraction it was given (a growing pool, a variable the installed jax does not read).
    """
    if options.target is not None:
        return _start_target_child(source, fraction, options, cache_path, progress)
    from jaxfit.fit.devices import cuda_total_bytes

    gpu_total = cuda_total_bytes()
    if gpu_total is not None:
        child_fraction = fraction
        if options.device_memory_bytes:
            child_fraction = budget_mod.planned_fraction(fraction, options.device_memory_bytes, gpu_total)
        child, info = _open_child(source, child_fraction, options, cache_path, progress=progress)
        try:
            limit = int(info.bytes_limit or 0)
            if info.limit_sensitive:
                _check_cap(limit, child_fraction, gpu_total)
                return child, info, options.device_memory_bytes or gpu_total, limit, gpu_total
            total = options.device_memory_bytes or info.host_memory_bytes  # it ran on the CPU after all
            return child, info, total, int(fraction * total), None
        except BaseException as e:
            child.close(polite=isinstance(e, Exception))
            raise
    child, info = _open_child(source, fraction, options, cache_path, progress=progress)
    try:  # start() stops its own child on any error or interrupt; this stops it after
        if info.limit_sensitive and options.device_memory_bytes:
            total = round(int(info.bytes_limit or 0) / fraction)
            child_fraction = budget_mod.planned_fraction(fraction, options.device_memory_bytes, total)
            child.close()
            child, info = _open_child(source, child_fraction, options, cache_path, progress=progress)
            return child, info, options.device_memory_bytes, int(info.bytes_limit or 0), total
        if info.limit_sensitive:
            total = round(int(info.bytes_limit or 0) / fraction)
            return child, info, total, int(info.bytes_limit or 0), total
        total = options.device_memory_bytes or info.host_memory_bytes
        return child, info, total, int(fraction * total), None
    except BaseException as e:
        child.close(polite=isinstance(e, Exception))
        raise


CAP_TOLERANCE = 0.01
"""How far (a share of the expected limit, plus 64 MiB) a compile process's allocator limit may be
from ``fraction x`` the GPU's total: on an H100 with jax 0.11.2 they were equal to the byte
(benchmarks/results/h100/checks)."""


def _check_cap(limit: int, fraction: float, total: int) -> None:
    """That the compile process's allocator limit is the fraction of the GPU it was given: every
    answer jaxfit gives assumes the fraction is a hard cap.

    Raises:
      ConfigError: it is not (a pool that grows, an allocator without a limit, a spelling of the
        fraction the installed jax does not read).
    """
    expected = fraction * total
    if abs(limit - expected) <= CAP_TOLERANCE * expected + (64 << 20):
        return
    fmt = budget_mod.format_bytes
    raise ConfigError(
        f"the compile process's GPU memory limit is {fmt(limit)}, not {fraction:.6g} of this GPU's {fmt(total)} "
        f"({fmt(round(expected))}): this jax did not take {budget_mod.fraction_variable()} as a fixed pool, so no fraction is a "
        "cap here; unset XLA_PYTHON_CLIENT_ALLOCATOR and any pool-growth setting in XLA_FLAGS"
    )


_SHARED: contextvars.ContextVar[dict[tuple, CompileChild] | None] = contextvars.ContextVar(
    "jaxfit_shared_compile_processes", default=None
)


_PREALLOCATE: contextvars.ContextVar[bool] = contextvars.ContextVar("jaxfit_shared_preallocate", default=False)


@contextlib.contextmanager
def shared_compile_process(*, preallocate: bool = False) -> Iterator[None]:
    """While open, the fits of built-in examples and ``--entry`` workloads under the same fraction
    (and mesh) share one compile process, which switches workloads, instead of starting one each:
    ``jaxfit tune``'s settings and accumulation proofs (a start is JAX's and CUDA's, seconds each
    on a GPU). Scripts are always probed in their own process. Every shared process is stopped at
    the end.

    ``preallocate``: the shared processes, and the probes of scripts started meanwhile, take their
    whole pool at start, as a training process does, because they will run what they prove
    (``jaxfit tune --measure inline``; a script's probe grew its pool until 2026-11-28, and on an
    H200 could not hold a program of 7.73 GiB proved under 9.87 GiB that a fresh process of the
    script ran: benchmarks/JOURNAL.md section 27). A pool that
    grows is a set of regions, and one large temporary buffer cannot span two: on H100s a compile
    process twice ran out of memory running gpt-small at 4 x 16 (5.15 GiB proved of 5.59 GiB), a
    program a fresh training process runs (benchmarks/JOURNAL.md section 15)."""
    pool: dict[tuple, CompileChild] = {}
    token = _SHARED.set(pool)
    allocating = _PREALLOCATE.set(preallocate)
    try:
        yield
    finally:
        _PREALLOCATE.reset(allocating)
        _SHARED.reset(token)
        for child in pool.values():
            child.close()


_TARGET_PROBES: contextvars.ContextVar[dict[str, CompileChild] | None] = contextvars.ContextVar(
    "jaxfit_shared_target_probes", default=None
)


@contextlib.contextmanager
def shared_target_probe() -> Iterator[None]:
    """While open, the deviceless fits of one script share its probe: the script starts once and
    the probe compiles for each card and memory size in turn (an estimate's squeezed and safe
    searches, every GPU model of ``jaxfit plan --script --gpu``), where each used to start the
    script again. Opened again inside, it shares the outer one's probes; each is stopped at the end."""
    if _TARGET_PROBES.get() is not None:
        yield
        return
    pool: dict[str, CompileChild] = {}
    token = _TARGET_PROBES.set(pool)
    try:
        yield
    finally:
        _TARGET_PROBES.reset(token)
        for child in pool.values():
            child.close()


def _start_target_child(
    source: Source, fraction: float, options: FitOptions, cache_path: str | None, progress: Progress | None = None
) -> tuple[CompileChild, DeviceInfo, int, int, int | None]:
    """The compile child of a GPU compiled for without it (``options.target``), on the CPU: its
    limit ``fraction x`` the card's memory (or ``--device-memory``), the ``device_memory_size`` the
    compiler sees that limit squeezed toward (or, ``squeeze`` off, room to spare). Inside
    :func:`shared_target_probe`, a script's probe already started is switched to this card."""
    from jaxfit.fit import targets

    target = options.target
    assert target is not None
    total = options.device_memory_bytes or target.memory_bytes
    limit = int(fraction * total)
    size = targets.squeezed_size(limit) if options.squeeze else targets.unsqueezed_size(limit)
    entry = {"name": target.name, "spec": target.spec_for(size), "limit": limit}
    pool = _TARGET_PROBES.get() if isinstance(source, ScriptSource) else None
    key = json.dumps([repr(source), cache_path, options.start_timeout])
    if pool is not None and key in pool:
        shared = pool.pop(key)
        if shared.running:
            info = shared.retarget(entry)  # stops the child when it fails
            pool[key] = shared
            notify(progress, "note", text=f"compiling for {target.name} in the probe already started (no new start-up)")
            return shared, info, total, limit, None
        shared.close()  # it ended: what its start-up wrote is still taken away, then a new probe starts
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="jaxfit-target-", delete=False) as f:
        json.dump(entry, f)
    try:
        child, info = _open_child(
            source, fraction, options, cache_path, extra=_target_environment(f.name, options), progress=progress
        )
    finally:
        os.unlink(f.name)
    if child.lean_calls:
        left_out = ", ".join(f"{name} ({budget_mod.format_bytes(n)})" for name, n in sorted(child.lean_calls.items()))
        notify(
            progress,
            "note",
            text=f"lean start-up: the outputs of {left_out} were traced, not computed (--no-lean-start computes them)",
        )
    if pool is not None:
        pool[key] = child
    return child, info, total, limit, None


def _target_environment(target_file: str, options: FitOptions) -> dict[str, str]:
    """The environment of a probe for a GPU that is not here: the card's file, jax on the CPU, and a
    lean start-up unless ``--no-lean-start`` (:mod:`jaxfit._probe.jaxfit_lean`), and jax's CUDA plugin
    allowed to start without a GPU driver (:data:`jaxfit._probe.jaxfit_target.SKIP_CUDA_CHECK_ENV`)."""
    extra = {TARGET_ENV: target_file, "JAX_PLATFORMS": "cpu", SKIP_CUDA_CHECK_ENV: "1"}
    if options.lean_start:
        extra[LEAN_ENV] = "1"
    return extra


def _open_child(
    source: Source,
    fraction: float,
    options: FitOptions,
    cache_path: str | None,
    extra: dict[str, str] | None = None,
    progress: Progress | None = None,
) -> tuple[CompileChild, DeviceInfo]:
    """A started compile child for ``source`` under ``fraction``: inside
    :func:`shared_compile_process`, the one already serving that fraction and mesh, switched to
    ``source``; else a new one."""
    pool = _SHARED.get()
    key = (
        fraction,
        cache_path,
        options.start_timeout,
        getattr(source, "mesh", None),
        tuple(sorted((extra or {}).items())),
    )
    if pool is not None and not isinstance(source, ScriptSource):
        shared = pool.get(key)
        if shared is not None and shared.running:
            return shared, shared.load(source)
        pool.pop(key, None)
    pooled = pool is not None and not isinstance(source, ScriptSource)
    child = CompileChild(
        source,
        fraction,
        cache_path=cache_path,
        start_timeout=options.start_timeout,
        # a script's probe, its own process, times there too (tune --script --measure inline)
        preallocate=pool is not None and _PREALLOCATE.get(),
        extra_env=extra,
        on_note=lambda text: notify(progress, "note", text=text),
    )
    info = child.start()
    if pool is not None and pooled:
        pool[key] = child
    return child, info


def release(child: CompileChild) -> None:
    """Done with ``child``: stopped, unless a :func:`shared_compile_process` or
    :func:`shared_target_probe` keeps it."""
    kept = [*(_SHARED.get() or {}).values(), *(_TARGET_PROBES.get() or {}).values()]
    if not any(child is shared for shared in kept):
        child.close()
