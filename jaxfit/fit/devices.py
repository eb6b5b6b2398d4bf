"""The GPUs a child process would see, read without initialising JAX (nvidia-smi, environment)."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import subprocess

from jaxfit._probe.jaxfit_compile_server import EMULATE_GPU_ENV
from jaxfit.fit.budget import set_fraction

MAX_DEVICES = 1024
"""The most devices a mesh may have: 128 hosts of 8 GPUs (``--devices 100000`` made a compile child
that printed nothing for 2 minutes and grew past 6.4 GB)."""


@dataclasses.dataclass(frozen=True)
class GPU:
    """One GPU (to fit for, or to pack runs onto).

    Attributes:
      index: The device index (as in ``CUDA_VISIBLE_DEVICES``).
      total_bytes: The device's total memory as CUDA reports it (the base of every fraction).
      used_bytes: Memory in use on it when it was read (nvidia-smi), by any process.
    """

    index: int
    total_bytes: int
    used_bytes: int = 0


def gpu_table(query: str, *, units: bool = True) -> str | None:
    """``nvidia-smi --query-gpu=QUERY`` as CSV lines (without header; without units unless
    ``units``), or None when there is no nvidia-smi or it fails. All GPUs, visible or not."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader" + ("" if units else ",nounits")],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def detect_gpus() -> list[GPU]:
    """The visible GPUs as ``nvidia-smi`` reports them (index: position among the visible ones).

    Respects ``CUDA_VISIBLE_DEVICES`` (numeric indices or UUID prefixes; empty or ``-1``: none).
    Without ``nvidia-smi``, or when it fails: none.
    """
    out = gpu_table("index,uuid,memory.total,memory.used", units=False)
    if out is None:
        return []
    physical: list[tuple[str, str, int, int]] = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            physical.append((parts[0], parts[1], int(float(parts[2])) << 20, int(float(parts[3])) << 20))  # MiB
        except ValueError:
            continue
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        chosen = physical
    else:
        chosen = []
        for item in (v.strip() for v in visible.split(",")):
            if not item or item == "-1":
                break  # CUDA stops at the first invalid entry
            match = [p for p in physical if p[0] == item or (item.startswith("GPU-") and p[1].startswith(item))]
            if not match:
                break
            chosen.append(match[0])
    return [GPU(index=i, total_bytes=total, used_bytes=used) for i, (_, _, total, used) in enumerate(chosen)]


def gpus_here() -> int:
    """The GPUs a process started from here would see (0 without them, or with ``JAX_PLATFORMS=cpu``)."""
    if "cpu" in os.environ.get("JAX_PLATFORMS", "").split(","):
        return 0
    return len(detect_gpus())


def devices_environment(count: int, *, least_used: bool = False, flag: str = "--gpus") -> dict[str, str]:
    """The variables that make a process see ``count`` devices and no other: ``count`` of the
    visible GPUs (the first ones, or with ``least_used`` those with the least memory in use, so a
    run does not land beside another), or on a machine without GPUs ``count`` host devices
    (``--xla_force_host_platform_device_count``, other XLA flags kept). JAX preallocates on every
    GPU it sees: a one-GPU run on a four-GPU host must see one (openpi #327).

    Raises:
      ConfigError: ``count`` below 1, or more GPUs than are visible (naming ``flag``).
    """
    from jaxfit.errors import ConfigError

    if count < 1:
        raise ConfigError(f"{flag} {count} must be at least 1")
    if count > MAX_DEVICES:
        raise ConfigError(f"{flag} {count} is more than jaxfit plans ({MAX_DEVICES}: 128 hosts of 8 GPUs)")
    gpus = [] if "cpu" in os.environ.get("JAX_PLATFORMS", "").split(",") else detect_gpus()
    if gpus:
        if count > len(gpus):
            raise ConfigError(f"{flag} {count}: this machine shows {len(gpus)} GPUs; use {len(gpus)} or fewer")
        order = sorted(gpus, key=lambda g: (g.used_bytes, g.index)) if least_used else gpus
        positions = sorted(g.index for g in order[:count])
        return {"CUDA_VISIBLE_DEVICES": ",".join(visible_entry(i) for i in positions)}
    return host_devices_environment(count)


HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"
"""The XLA flag that gives a CPU process that many host devices."""


def forced_host_devices() -> int | None:
    """The host device count ``$XLA_FLAGS`` forces here, if it forces one."""
    match = re.search(re.escape(HOST_DEVICES_FLAG) + r"=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(match.group(1)) if match else None


def host_devices_environment(count: int) -> dict[str, str]:
    """The variables that give a child ``count`` CPU host devices, the other ``XLA_FLAGS`` kept."""
    flags = re.sub(re.escape(HOST_DEVICES_FLAG) + r"=\d+", "", os.environ.get("XLA_FLAGS", "")).split()
    return {"XLA_FLAGS": " ".join([*flags, f"{HOST_DEVICES_FLAG}={count}"]), "JAX_PLATFORMS": "cpu"}


def visible_entry(position: int) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` entry of the visible GPU at ``position`` (the position itself
    when the variable is unset or shorter): what a child process is given to see that one GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        items = [v.strip() for v in visible.split(",") if v.strip()]
        if position < len(items):
            return items[position]
    return str(position)


def visible_device_count() -> int:
    """Devices a child would see: CPU devices forced through XLA_FLAGS, the visible GPUs
    (:func:`detect_gpus`; CUDA_VISIBLE_DEVICES counted as given when nvidia-smi is missing), else 1."""
    forced = forced_host_devices()
    has_smi = shutil.which("nvidia-smi") is not None
    if forced is not None and ("cpu" in os.environ.get("JAX_PLATFORMS", "").split(",") or not has_smi):
        return max(1, forced)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not has_smi:
        return max(1, len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"]))
    if visible is None and "cpu" in os.environ.get("JAX_PLATFORMS", "").split(","):
        return 1
    return max(1, len(detect_gpus()))


def cuda_total_bytes(timeout: float = 120.0) -> int | None:
    """The memory of the first visible GPU as JAX's allocator counts it (``bytes_limit`` under
    fraction 1), which is what every fraction is a share of: less than nvidia-smi's total (an H100
    80GB: 81,080 MiB against 81,559). Read in a short child process (this one keeps JAX unstarted);
    None without a GPU or when it cannot be read; read once per process and set of visible GPUs.
    (Tests: ``$JAXFIT_EMULATE_GPU_TOTAL``, the GPU that compile children emulate on a CPU.)"""
    emulated = os.environ.get(EMULATE_GPU_ENV)
    if emulated:
        return int(emulated)
    if gpus_here() == 0:
        return None
    return _read_cuda_total(os.environ.get("CUDA_VISIBLE_DEVICES"), timeout)


@functools.lru_cache(maxsize=8)
def _read_cuda_total(visible: str | None, timeout: float) -> int | None:
    """:func:`cuda_total_bytes` for the GPUs ``visible`` names, read once per process."""
    import json
    import sys

    code = (
        "import jax, json; d = jax.devices()[0]; "
        "print(json.dumps({'platform': d.platform, 'limit': (d.memory_stats() or {}).get('bytes_limit')}))"
    )
    env = set_fraction(dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"), "1.0")
    env.pop("XLA_PYTHON_CLIENT_ALLOCATOR", None)
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    return int(data["limit"]) if data.get("platform") == "gpu" and data.get("limit") else None


PLATFORM_PLUGINS = {
    "cuda": ("jax-cuda13-plugin", "jax-cuda12-plugin", "jaxlib-cuda"),
    "gpu": ("jax-cuda13-plugin", "jax-cuda12-plugin", "jax-rocm-plugin", "jax-rocm7-plugin", "jaxlib-cuda"),
    "rocm": ("jax-rocm-plugin", "jax-rocm7-plugin", "jax-rocm60-plugin"),
    "tpu": ("libtpu", "libtpu-nightly"),
}
"""The distributions that give jax each platform ``JAX_PLATFORMS`` can name."""


def check_platforms(env: dict[str, str] | None = None) -> None:
    """Refuse a ``JAX_PLATFORMS`` naming a platform no installed jax plugin provides (jax fails
    there with an empty ``AssertionError``), in one line.

    Raises:
      ConfigError: the platform and what to install or unset.
    """
    import importlib.metadata

    from jaxfit.errors import ConfigError

    spelled = (env if env is not None else os.environ).get("JAX_PLATFORMS", "")
    for platform in (p.strip().lower() for p in spelled.split(",") if p.strip()):
        plugins = PLATFORM_PLUGINS.get(platform)
        if not plugins:
            continue
        installed = []
        for name in plugins:
            try:
                importlib.metadata.version(name)
                installed.append(name)
            except importlib.metadata.PackageNotFoundError:
                pass
        if not installed:
            hint = {"tpu": "pip install 'jax[tpu]'", "rocm": "jax's ROCm plugin"}.get(
                platform, "pip install 'jax[cuda13]'"
            )
            raise ConfigError(
                f"JAX_PLATFORMS={spelled} asks for {platform}, but no jax plugin for it is installed here "
                f"({hint}); unset JAX_PLATFORMS (or set it to cpu) to compile on the CPU"
            )
