"""The run side of the cap check: a process jaxfit starts for training holds the pool it was given.

Every answer jaxfit gives (a batch, a fraction, runs packed side by side) assumes the fraction is
a hard cap: a process started under ``f`` can hold at most ``f x`` its GPU. What the installed jax
does with the variable was measured (benchmarks/JOURNAL.md section 16, jax 0.11.2 on an H100): the
fraction is a cap in either spelling, with preallocation on or off; under
``XLA_PYTHON_CLIENT_ALLOCATOR=platform`` the allocator has no limit and one process took all 84.6 GB
of the card; with both spellings set, jax started on the CPU without a word. So the launcher names
the pool it expects (``$JAXFIT_POOL_BYTES``: the fraction x the GPU's total as CUDA hands it to
JAX) and, at the first call of one of the script's jitted functions (the backend is up then; no
train step has run), the start-up hook compares every local GPU's allocator limit with it. A
mismatch stops the process with one line (exit :data:`CAP_EXIT`) instead of a run that takes more
than its share, or trains on the CPU.

Standard library + jax only (it runs in the script's environment).
"""

from __future__ import annotations

import os
import sys
from typing import List, NoReturn, Optional, Tuple

POOL_ENV = "JAXFIT_POOL_BYTES"
CAP_EXIT = 76
"""Exit code of a training process whose GPU pool is not the one jaxfit set."""
CAP_MARKER = "is not the memory pool jaxfit set"
"""Words of the check's error line (the scheduler quotes the line; it never retries such a run)."""
TOLERANCE = 0.01
SLACK_BYTES = 64 << 20
"""How far a limit may be from the expected pool: a share of it plus this (on an H100 with jax
0.11.2 they were equal to the byte)."""
GPU_PLATFORMS = ("gpu", "cuda", "rocm")


def _format_bytes(n: float) -> str:
    if n < 1 << 30:
        return "%.1f MiB" % (n / (1 << 20))
    return "%.2f GiB" % (n / (1 << 30))


def _emulated_limit() -> Optional[int]:
    """Tests: on a CPU emulating a GPU (``$JAXFIT_EMULATE_GPU_TOTAL``), the limit the compile
    server's :func:`device_info` gives this process (the fraction it was given, or
    ``$JAXFIT_EMULATE_GPU_POOL``, a jax that ignores it)."""
    if not os.environ.get("JAXFIT_EMULATE_GPU_TOTAL"):
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import jaxfit_compile_server

    limit = jaxfit_compile_server.device_info().get("bytes_limit")
    return int(limit) if limit is not None else None


def pool_limits() -> Tuple[List[Tuple[int, int]], Optional[str]]:
    """Each local GPU's allocator limit as ``(device id, bytes)``, and why there are none when
    there are none (jax on the CPU, an allocator without a limit)."""
    import jax

    devices = jax.local_devices()
    if devices and devices[0].platform == "cpu":
        emulated = _emulated_limit()
        if emulated is not None:
            return [(0, emulated)], None
        return [], (
            "jax started on the CPU, not the GPU jaxfit planned for (both XLA_CLIENT_MEM_FRACTION and "
            "XLA_PYTHON_CLIENT_MEM_FRACTION set? JAX_PLATFORMS=cpu? a jax without CUDA?); unset the "
            "variable jaxfit did not set"
        )
    limits = []
    for device in devices:
        if device.platform not in GPU_PLATFORMS:
            continue
        try:
            stats = device.memory_stats() or {}
        except Exception:  # some backends raise instead of returning None
            stats = {}
        limit = stats.get("bytes_limit")
        if limit is None:
            return [], (
                "GPU %d's allocator has no limit, so the fraction is no cap (XLA_PYTHON_CLIENT_ALLOCATOR=%s); "
                "unset XLA_PYTHON_CLIENT_ALLOCATOR" % (device.id, os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "?"))
            )
        limits.append((device.id, int(limit)))
    return limits, None


def _fraction_set() -> Tuple[str, float]:
    """The fraction variable this process was given, and its value (jax's default 0.75 without one)."""
    for name in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        value = os.environ.get(name)
        if value:
            try:
                return name, float(value)
            except ValueError:
                pass
    return "XLA_PYTHON_CLIENT_MEM_FRACTION", 0.75


def short_of(peak: int, proved_limit: Optional[int], next_batch: int = 0) -> Optional[str]:
    """Why a program of ``peak`` bytes per device cannot run in this process's GPU pool (a pool
    smaller than the peak and the loop's ``next_batch``), or None when it can or no pool can be
    read. ``proved_limit``: the limit the program was proved under, which the advice asks for."""
    limits, _why = pool_limits()
    if not limits:
        return None
    device_id, limit = min(limits, key=lambda pair: pair[1])
    if limit >= peak + next_batch:
        return None
    name, fraction = _fraction_set()
    want = proved_limit or peak
    advice = ""
    if fraction >= 0.05:  # a tiny pool is rounded (2.0 MiB at 1.9e-05 of an H100): no total to read from it
        total = limit / fraction
        advice = "; the proof's %s limit is %s=%.6g on this GPU" % (_format_bytes(want), name, want / total)
    return "GPU %d's pool is %s (%s=%g), smaller than the proven program's peak of %s%s%s" % (
        device_id,
        _format_bytes(limit),
        name,
        fraction,
        _format_bytes(peak),
        " and its next batch of %s" % _format_bytes(next_batch) if next_batch else "",
        advice,
    )


def problem(expected: int) -> Optional[str]:
    """Why this process's GPU pools are not ``expected`` bytes each, or None when they are."""
    limits, why = pool_limits()
    if why is not None:
        return why
    for device_id, limit in limits:
        if abs(limit - expected) > TOLERANCE * expected + SLACK_BYTES:
            return (
                "GPU %d's pool is %s, which %s (%s): this jax did not take the fraction as a fixed pool; unset "
                "XLA_PYTHON_CLIENT_ALLOCATOR and any pool setting in XLA_FLAGS, or use a jax that reads %s"
                % (
                    device_id,
                    _format_bytes(limit),
                    CAP_MARKER,
                    _format_bytes(expected),
                    "XLA_CLIENT_MEM_FRACTION"
                    if os.environ.get("XLA_CLIENT_MEM_FRACTION")
                    else "XLA_PYTHON_CLIENT_MEM_FRACTION",
                )
            )
    return None


def stop(why: str, more: str = "") -> NoReturn:
    """Stop this process before its first step with one line and exit :data:`CAP_EXIT`; a pinned
    run's report (``$JAXFIT_PIN``) says why, for ``jaxfit run`` and ``jaxfit schedule``."""
    if os.environ.get("JAXFIT_PIN"):
        import jaxfit_pin

        jaxfit_pin.write_report(None, {"program_pinned": False, "reason": why, "stopped": True, "stopped_for": "cap"})
    print("jaxfit: error: %s; the run was stopped before its first step%s" % (why, more), file=sys.stderr)
    sys.stderr.flush()
    os._exit(CAP_EXIT)
