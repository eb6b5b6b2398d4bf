"""GPU models jaxfit can compile for without the card: their target configs, and the limit they see.

XLA compiles for a GPU that is not there from a *target config* (a text proto of
``stream_executor.GpuTargetConfigProto``): jax's ``get_topology_desc(platform="cuda",
target_config=...)`` makes compile-only devices of it, in a process whose backend is the CPU
(jax's CUDA plugin installed: ``pip install "jaxfit[targets]"``). jaxfit writes each model's config
from a handful of public numbers (:data:`MODELS`: the compute capability, the SM count, the clock,
the memory bandwidth, the L2 size, the shared memory; the fields XLA's memory analysis depends
on), or reads one a user captured on a real card (``jaxfit gpus capture``, ``--gpu-spec FILE``).

The memory the compiler sees is the config's ``device_memory_size``: XLA aims its
rematerialisation at ``0.8 x device_memory_size x 0.95`` when no device is there, and at about
``0.95 x`` the allocator's limit on a real card. So a deviceless compile for a card under fraction
``f`` is given ``device_memory_size = f x card memory / 0.8`` (:func:`squeezed_size`): it squeezes
toward the same limit as the card would. A deviceless program is untuned (there is no device to
autotune on), so its answers are **estimates**, never proofs and never pinned; how far they are
from the card's own is measured in the docs' results pages.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from jaxfit._probe.jaxfit_target import MEMORY_FIELD, drop_unknown_fields
from jaxfit.errors import ConfigError

DEVICELESS_AIM = 0.8
"""The share of ``device_memory_size`` a deviceless XLA compile takes as its memory (before its own
0.95 slop): the compiler's limit for a config of ``M`` bytes is ``0.8 x M x 0.95``."""
UNSQUEEZED_FACTOR = 8
"""``device_memory_size`` is this many times the card's limit for the unsqueezed compile: room
enough that XLA rematerialises nothing to fit (:mod:`jaxfit.fit.estimate`)."""


@dataclasses.dataclass(frozen=True)
class GpuModel:
    """A GPU model, by the numbers XLA's memory analysis depends on.

    Attributes:
      key: The name people type (``rtx-a6000``).
      name: The device's own name (what jax's ``device_kind`` says on the card).
      compute_capability: ``(major, minor)``.
      sm_count: Streaming multiprocessors (``core_count``).
      memory_bytes: Memory the driver reports as the card's total (what a fraction is of).
      bandwidth: Memory bandwidth, bytes per second.
      clock_ghz: SM clock.
      l2_bytes: L2 cache size.
      smem_per_block_optin: Shared memory one block may opt in to.
      smem_per_sm: Shared memory per SM.
      fp32_per_sm: FP32 units per SM (``fpus_per_core``).
      threads_per_sm: Resident threads per SM.
      accelerated: Architecture-specific features (``sm_90a``, ``sm_100a``).
      aliases: Other names that mean it.
      source: Where the numbers come from.
    """

    key: str
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    memory_bytes: int
    bandwidth: int
    clock_ghz: float
    l2_bytes: int
    smem_per_block_optin: int
    smem_per_sm: int
    fp32_per_sm: int = 128
    threads_per_sm: int = 1536
    accelerated: bool = False
    aliases: tuple[str, ...] = ()
    source: str = "public specifications"

    def spec_text(self, memory_bytes: int | None = None) -> str:
        """The target config, with ``device_memory_size`` of ``memory_bytes`` (default the card's)."""
        major, minor = self.compute_capability
        size = self.memory_bytes if memory_bytes is None else memory_bytes
        fields = [
            ("threads_per_block_limit", 1024),
            ("threads_per_warp", 32),
            ("shared_memory_per_block", 49152),
            ("shared_memory_per_core", self.smem_per_sm),
            ("threads_per_core_limit", self.threads_per_sm),
            ("core_count", self.sm_count),
            ("fpus_per_core", self.fp32_per_sm),
            ("block_dim_limit_x", 2147483647),
            ("block_dim_limit_y", 65535),
            ("block_dim_limit_z", 65535),
            ("memory_bandwidth", self.bandwidth),
            ("l2_cache_size", self.l2_bytes),
            ("clock_rate_ghz", self.clock_ghz),
            ("device_memory_size", int(size)),
            ("shared_memory_per_block_optin", self.smem_per_block_optin),
            ("registers_per_core_limit", 65536),
            ("registers_per_block_limit", 65536),
            ("thread_dim_limit_x", 1024),
            ("thread_dim_limit_y", 1024),
            ("thread_dim_limit_z", 64),
        ]
        body = "\n".join(f"  {k}: {v}" for k, v in fields)
        extension = "ACCELERATED_FEATURES" if self.accelerated else "NONE"
        return (
            f"gpu_device_info {{\n{body}\n  cuda_compute_capability {{\n    major: {major}\n    minor: {minor}\n"
            f'    feature_extension: {extension}\n  }}\n}}\nplatform_name: "CUDA"\n'
            f'device_description_str: "{self.name}"\n'
        )


def _hopper(
    key: str, name: str, sm_count: int, memory_bytes: int, bandwidth: int, clock_ghz: float, **kw: Any
) -> GpuModel:
    return GpuModel(
        key, name, (9, 0), sm_count, memory_bytes, bandwidth, clock_ghz, 52428800, 232448, 233472,
        threads_per_sm=2048, accelerated=True, **kw,
    )  # fmt: skip


def _ampere_dc(key: str, name: str, memory_bytes: int, bandwidth: int, **kw: Any) -> GpuModel:
    return GpuModel(
        key, name, (8, 0), 108, memory_bytes, bandwidth, 1.41, 41943040, 166912, 167936,
        fp32_per_sm=64, threads_per_sm=2048, **kw,
    )  # fmt: skip


MODELS: tuple[GpuModel, ...] = (
    GpuModel("rtx-4090", "NVIDIA GeForce RTX 4090", (8, 9), 128, 25757220864, 1008000000000, 2.52, 75497472,
             101376, 102400, aliases=("4090", "rtx4090"), source="public specifications (not checked against a card)"),
    GpuModel("rtx-a6000", "NVIDIA RTX A6000", (8, 6), 84, 51041271808, 768096000000, 1.8, 6291456, 101376, 102400,
             aliases=("a6000",)),
    _ampere_dc("a100-40gb", "NVIDIA A100-SXM4-40GB", 42331013120, 1555200000000, aliases=("a100-sxm-40gb",)),
    _ampere_dc("a100-80gb", "NVIDIA A100-SXM4-80GB", 85100068864, 2039040000000, aliases=("a100", "a100-sxm-80gb")),
    _hopper("h100-pcie", "NVIDIA H100 PCIe", 114, 84942979072, 2039040000000, 1.755),
    _hopper("h100-sxm", "NVIDIA H100 80GB HBM3", 132, 85018542080, 3352320000000, 1.98, aliases=("h100",),
            source="public specifications; memory as CUDA reports it on an H100 80GB HBM3 (81,080 MiB)"),
    _hopper("h200", "NVIDIA H200", 132, 150114140160, 4800000000000, 1.98, aliases=("h200-sxm",),
            source="public specifications; memory as CUDA reports it on an H200 (143,160 MiB)"),
    GpuModel("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell", (12, 0), 188, 103079215104, 1792000000000, 2.6,
             134217728, 101376, 131072, aliases=("rtx6000pro", "rtx-6000-pro")),
    GpuModel("b200", "NVIDIA B200", (10, 0), 148, 191514411008, 7672320000000, 1.965, 132644864, 232448, 233472,
             threads_per_sm=2048, accelerated=True),
)  # fmt: skip
"""The models jaxfit knows, from public numbers (vendor specifications and what CUDA reports for the
devices; the RTX 4090's not checked against a card). ``jaxfit gpus capture`` on a card writes its own."""


@dataclasses.dataclass(frozen=True)
class Target:
    """A GPU compiled for without it.

    Attributes:
      name: The device's name (``device_kind`` on the card).
      key: The model's key, or the spec file's path.
      spec: The target config text, its ``device_memory_size`` the card's.
      memory_bytes: The card's memory (what a fraction is of).
      source: Where the config comes from.
    """

    name: str
    key: str
    spec: str
    memory_bytes: int
    source: str

    def spec_for(self, memory_bytes: int) -> str:
        """The config with ``device_memory_size`` set to ``memory_bytes``."""
        return set_memory_size(self.spec, memory_bytes)

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "key": self.key, "memory_bytes": self.memory_bytes, "source": self.source}


def _normal(text: str) -> str:
    return re.sub(r"[\s_]+", "-", text.strip().lower())


def find_model(name: str) -> GpuModel:
    """The model called ``name`` (its key or an alias, any case, ``_`` or ``-``).

    Raises:
      ConfigError: no such model, with the known ones.
    """
    wanted = _normal(name)
    for model in MODELS:
        if wanted == model.key or wanted in model.aliases or wanted == _normal(model.name):
            return model
    raise ConfigError(
        f"--gpu {name!r} is no model jaxfit knows; known: {', '.join(m.key for m in MODELS)} "
        "(jaxfit gpus list); for another card give --gpu-spec FILE (jaxfit gpus capture writes one on the card)"
    )


def target_for(model: GpuModel, memory_bytes: int | None = None) -> Target:
    """A model as a :class:`Target` (``memory_bytes``: another size of it, from ``--device-memory``)."""
    memory = model.memory_bytes if memory_bytes is None else memory_bytes
    return Target(model.name, model.key, model.spec_text(memory), memory, model.source)


SPEC_FIELD_MEMORY = MEMORY_FIELD
SPEC_FIELD_NAME = re.compile(r'device_description_str:\s*"([^"]*)"')


def read_spec(path: str | Path, memory_bytes: int | None = None) -> Target:
    """A target config file (``jaxfit gpus capture``'s, or XLA's own) as a :class:`Target`.

    Raises:
      ConfigError: missing, not a GPU target config, or with no memory size (give ``--device-memory``).
    """
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--gpu-spec {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    if "gpu_device_info" not in text or "cuda_compute_capability" not in text:
        raise ConfigError(
            f"--gpu-spec {path} is not a GPU target config (a GpuTargetConfigProto text proto with gpu_device_info "
            "and cuda_compute_capability); jaxfit gpus capture writes one on the card"
        )
    text = drop_unknown_fields(text)
    found = SPEC_FIELD_MEMORY.search(text)
    memory = memory_bytes if memory_bytes is not None else (int(found.group(1)) if found else 0)
    if memory <= 0:
        raise ConfigError(f"--gpu-spec {path} gives no device_memory_size; give the card's size with --device-memory")
    name = SPEC_FIELD_NAME.search(text)
    label = name.group(1) if name else Path(path).stem
    return Target(label, str(path), set_memory_size(text, memory), memory, f"the target config {path}")


def set_memory_size(text: str, memory_bytes: int) -> str:
    """``text`` with its ``device_memory_size`` (added to ``gpu_device_info`` when missing)."""
    if SPEC_FIELD_MEMORY.search(text):
        return SPEC_FIELD_MEMORY.sub(f"device_memory_size: {int(memory_bytes)}", text, count=1)
    return text.replace("gpu_device_info {", f"gpu_device_info {{\n  device_memory_size: {int(memory_bytes)}", 1)


def squeezed_size(limit_bytes: int) -> int:
    """The ``device_memory_size`` whose deviceless compile squeezes toward ``limit_bytes``, as the card does."""
    return int(limit_bytes / DEVICELESS_AIM)


def unsqueezed_size(limit_bytes: int) -> int:
    """A ``device_memory_size`` with room enough that nothing is rematerialised to fit ``limit_bytes``."""
    return int(limit_bytes * UNSQUEEZED_FACTOR)
