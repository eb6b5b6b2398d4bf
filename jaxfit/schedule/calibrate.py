"""``jaxfit calibrate``: measure, once per GPU model and stack, the memory a JAX process holds outside
its XLA pool (CUDA context, cuBLAS/cuDNN workspaces and code: 618 MiB on an H200, docs/guides/facts.md #5).

A scheduler must add it to every co-located run's pool, or three runs at 0.33 overfill an H200.
The measurement starts one compile child on the GPU (fraction 1.0, preallocation off, so its
allocator limit is CUDA's total, which it also records),
runs small fp32 and bf16 matmuls so the math libraries load, and takes nvidia-smi's used memory for
that process minus the pool's bytes. The answer is cached (the answer cache of
:mod:`jaxfit.fit.cache`) under the device identity and jax version, so ``jaxfit schedule`` can use it
at no cost; ``--no-cache`` measures again.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from jaxfit.errors import ConfigError
from jaxfit.fit.answers import device_identity
from jaxfit.fit.cache import AnswerCache, default_cache_path, usable_cache
from jaxfit.fit.compiler import CompileChild
from jaxfit.fit.devices import detect_gpus
from jaxfit.fit.sources import example_source
from jaxfit.schedule import packing
from jaxfit.versions import jax_version as _jax_version

CALIBRATION_FRACTION = 1.0
"""The fraction the measuring child starts under: its allocator limit is then CUDA's total (with
preallocation off the child takes only what it uses; its pool is subtracted from its usage)."""


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The per-process memory outside the pool on this machine's GPU.

    Attributes:
      process_overhead_bytes: nvidia-smi's used memory of the process minus its pool's bytes.
      cuda_total_bytes: The GPU's memory as CUDA reports it (the base of every fraction: the
        allocator limit under fraction 1.0), less than nvidia-smi's total (docs/guides/facts.md #4).
      smi_total_bytes: nvidia-smi's total of the same GPU (None when nvidia-smi lists none).
      process_used_bytes: nvidia-smi's used memory of the measuring process.
      pool_bytes: The XLA pool's bytes in that process.
      device: The device identity (name and memory of the visible GPUs).
      jax_version: The jax it was measured with.
      measured_at: Unix time of the measurement.
      cached: Whether it came from the cache.
    """

    process_overhead_bytes: int
    cuda_total_bytes: int
    smi_total_bytes: int | None
    process_used_bytes: int | None
    pool_bytes: int | None
    device: str
    jax_version: str
    measured_at: float
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data."""
        return dataclasses.asdict(self)

    def cuda_totals(self, gpus: Sequence[packing.GPU]) -> list[packing.GPU]:
        """``gpus`` (nvidia-smi totals) with CUDA's totals: each less nvidia-smi's excess measured here."""
        excess = (self.smi_total_bytes - self.cuda_total_bytes) if self.smi_total_bytes else 0
        return [packing.GPU(g.index, g.total_bytes - max(0, excess)) for g in gpus]


def _key() -> str:
    return f"calibrate-v2|{device_identity()}|jax {_jax_version()}"


def cached_calibration(cache_path: str | None = None) -> Calibration | None:
    """The stored calibration of this device and jax, or None (never starts a child)."""
    path = usable_cache(cache_path or default_cache_path())
    if path is None:
        return None
    store = AnswerCache(path)
    try:
        data = store.get(_key())
    finally:
        store.close()
    return None if data is None else Calibration(**{**data, "cached": True})


def calibrate(*, use_cache: bool = True, cache_path: str | None = None, start_timeout: float = 600.0) -> Calibration:
    """Measure (or read from the cache) the per-process overhead of this machine's GPU.

    Raises:
      ConfigError: no GPU (the overhead is a GPU quantity; give ``process_overhead`` in the queue
        to plan for GPUs elsewhere), or nvidia-smi could not report the process.
    """
    if use_cache:
        found = cached_calibration(cache_path)
        if found is not None:
            return found
    with CompileChild(
        example_source("mlp-tiny"), CALIBRATION_FRACTION, cache_path=None, start_timeout=start_timeout
    ) as child:
        assert child.info is not None
        if not child.info.limit_sensitive:
            raise ConfigError(
                f"calibrate needs a GPU, and JAX here runs on {child.info.platform}; on a machine without "
                "one, set process_overhead in the queue (618MiB was measured on an H200)"
            )
        reply = child.process_overhead()
    if reply.bytes is None:
        raise ConfigError(f"could not measure the per-process overhead: {reply.method}")
    smi = detect_gpus()
    result = Calibration(
        process_overhead_bytes=reply.bytes,
        cuda_total_bytes=int(child.info.bytes_limit or 0),
        smi_total_bytes=smi[0].total_bytes if smi else None,
        process_used_bytes=reply.process_used_bytes,
        pool_bytes=reply.pool_bytes,
        device=device_identity(),
        jax_version=_jax_version(),
        measured_at=time.time(),
    )
    path = usable_cache(cache_path or default_cache_path())
    if path is not None:
        store = AnswerCache(path)
        try:
            store.put(_key(), {k: v for k, v in result.to_dict().items() if k != "cached"})
        finally:
            store.close()
    return result
