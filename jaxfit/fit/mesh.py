"""Several devices: the ``(batch, fsdp)`` mesh of a step, openpi's way.

A :class:`MeshSpec` says how many devices a step runs on and how many of them shard the parameters
and optimizer state (FSDP); the rest is data parallel. The batch is global and split over every
device (``P(("batch", "fsdp"))``); each array of the state of at least :data:`MIN_SHARD_BYTES` is
sharded along its largest axis that the fsdp size divides, smaller ones are replicated (as openpi's
``fsdp_sharding`` does below 4 MiB). The memory analysis of such a program is per device, so the
budget is per device and the answer a global batch that the device count divides.

The spec is plain data (the parent process never imports JAX); the sharding functions import JAX
and run in the compile child and in ``scripts/train.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from jaxfit.errors import ConfigError
from jaxfit.fit.devices import MAX_DEVICES, detect_gpus

if TYPE_CHECKING:
    import jax

    from jaxfit.fit.workload import Workload

BATCH_AXIS = "batch"
"""The mesh axis of data parallelism."""
FSDP_AXIS = "fsdp"
"""The mesh axis the parameters and optimizer state are sharded over."""
DATA_AXES = (BATCH_AXIS, FSDP_AXIS)
"""The batch is split over both axes: every device gets its own rows."""
MIN_SHARD_BYTES = 4 * 2**20
"""Arrays smaller than this stay replicated under FSDP (openpi: ``min_size_mbytes=4``)."""


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """How many devices a step runs on, and how many of them shard the state.

    Attributes:
      devices: Devices in the mesh (the first ``devices`` of those visible; on a GPU machine with
        fewer, a mocked topology of that many, compiled but never run).
      fsdp: Devices each parameter is sharded over; it must divide ``devices``.
      min_shard_bytes: Arrays smaller than this are replicated.
      allow_mock: On a GPU machine with fewer GPUs than ``devices``, compile for a mocked topology
        (``jaxfit plan``'s what-if cells) instead of refusing (``jaxfit fit``).
    """

    devices: int = 1
    fsdp: int = 1
    min_shard_bytes: int = MIN_SHARD_BYTES
    allow_mock: bool = False

    def validate(self) -> MeshSpec:
        """Check the sizes (one-line :class:`ConfigError` naming the flag); returns ``self``."""
        if self.devices < 1:
            raise ConfigError(f"--devices {self.devices} must be at least 1")
        if self.devices > MAX_DEVICES:
            raise ConfigError(
                f"--devices {self.devices} is more than jaxfit plans ({MAX_DEVICES}: 128 hosts of 8 GPUs); a mocked "
                "topology or host devices that large takes minutes and gigabytes before the first compile"
            )
        if self.fsdp < 1:
            raise ConfigError(f"--fsdp {self.fsdp} must be at least 1")
        if self.devices % self.fsdp:
            raise ConfigError(
                f"--fsdp {self.fsdp} does not divide --devices {self.devices}; use a divisor of {self.devices} "
                f"({', '.join(str(d) for d in divisors(self.devices))})"
            )
        if self.min_shard_bytes < 0:
            raise ConfigError("--fsdp-min-size must not be negative")
        return self

    @property
    def batch(self) -> int:
        """The size of the data-parallel axis."""
        return self.devices // self.fsdp

    @property
    def sharded(self) -> bool:
        """Whether the step runs on more than one device."""
        return self.devices > 1

    def axes(self) -> dict[str, int]:
        """``{"batch": b, "fsdp": f}``, as results report the mesh."""
        return {BATCH_AXIS: self.batch, FSDP_AXIS: self.fsdp}

    def label(self) -> str:
        """A short name: ``1 device``, ``4 devices (data parallel)``, ``4 devices (fsdp 2)``."""
        if self.devices == 1:
            return "1 device"
        return f"{self.devices} devices ({'data parallel' if self.fsdp == 1 else f'fsdp {self.fsdp}'})"


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, smallest first."""
    return [d for d in range(1, n + 1) if n % d == 0]


def make_mesh(spec: MeshSpec, devices: Sequence[Any] | None = None) -> jax.sharding.Mesh:
    """The ``(batch, fsdp)`` mesh over the first ``spec.devices`` devices.

    Raises:
      ConfigError: fewer devices than the spec needs.
    """
    import jax
    import numpy as np

    available = list(jax.devices() if devices is None else devices)
    if len(available) < spec.devices:
        raise ConfigError(f"--devices {spec.devices} needs {spec.devices} devices; this process sees {len(available)}")
    grid = np.array(available[: spec.devices]).reshape(spec.batch, spec.fsdp)
    return jax.sharding.Mesh(grid, (BATCH_AXIS, FSDP_AXIS))


def data_sharding(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
    """The batch's sharding: its leading axis split over every device of the mesh."""
    import jax

    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(DATA_AXES))


def replicated(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
    """A copy on every device."""
    import jax

    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def array_sharding(
    shape: Sequence[int], itemsize: int, mesh: jax.sharding.Mesh, min_bytes: int = MIN_SHARD_BYTES
) -> jax.sharding.NamedSharding:
    """The FSDP sharding of one array (openpi's rule): replicated when fsdp is 1, for scalars and
    vectors, below ``min_bytes``, or when no axis divides; else along its largest axis that the
    fsdp size divides."""
    import jax

    size = mesh.shape[FSDP_AXIS]
    if size == 1 or len(shape) < 2 or math.prod(shape) * itemsize < min_bytes:
        return replicated(mesh)
    for axis in sorted(range(len(shape)), key=lambda i: shape[i], reverse=True):
        if shape[axis] % size == 0:
            spec: list[str | None] = [None] * len(shape)
            spec[axis] = FSDP_AXIS
            return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
    return replicated(mesh)


def fsdp_sharding(tree: Any, mesh: jax.sharding.Mesh, min_bytes: int = MIN_SHARD_BYTES) -> Any:
    """The sharding of every array leaf of ``tree`` (abstract or concrete) by :func:`array_sharding`."""
    import jax

    from jaxfit._probe.jaxfit_compile_server import itemsize

    def leaf(x: Any) -> Any:
        if not hasattr(x, "shape"):
            return replicated(mesh)
        return array_sharding(tuple(x.shape), itemsize(x.dtype), mesh, min_bytes)

    return jax.tree_util.tree_map(leaf, tree)


def _placed(tree: Any, shardings: Any) -> Any:
    """Abstract arrays of ``tree``'s shapes and dtypes, placed with ``shardings`` (same structure)."""
    import jax

    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s) if hasattr(x, "shape") else x,
        tree,
        shardings,
    )


TARGET_DEVICES: list[Any] = []
"""The compile-only devices of a GPU compiled for without it (:mod:`jaxfit.fit.targets`), set by the
compile child before it builds a workload: every workload is then placed on them, one device too."""


def use_target_devices(spec_text: str, count: int) -> list[Any]:
    """Make ``count`` compile-only devices of the GPU of ``spec_text`` (a target config) the ones
    workloads are placed on, in this process (its backend the CPU). Returns them.

    Raises:
      ConfigError: jax here has no CUDA plugin, or the config is not one this jaxlib reads.
    """
    from jaxfit._probe.jaxfit_target import NoTopology, make_devices

    try:
        TARGET_DEVICES[:] = make_devices(spec_text, count)
    except NoTopology as e:
        if e.unreadable:
            raise ConfigError(
                f"this jaxlib cannot read the GPU target config ({e}); capture one with this jax"
            ) from None
        raise ConfigError(
            f"cannot compile for a GPU that is not here: {e}; install jax's CUDA plugin for this jax "
            '(pip install "jaxfit[targets]")'
        ) from None
    return TARGET_DEVICES


def shard_workload(workload: Workload, spec: MeshSpec) -> Workload:
    """``workload`` on the mesh of ``spec``: its batch argument split over every device, its other
    arguments sharded FSDP-style, each output that has the structure of an argument placed like
    it (so a donated state is updated in place) and the rest replicated.

    Raises:
      ConfigError: the workload already sets its own shardings, or too few devices.
    """
    import jax

    if not spec.sharded and not TARGET_DEVICES:
        return workload
    if workload.in_shardings is not None or workload.out_shardings is not None:
        raise ConfigError(
            f"the workload {workload.name!r} sets its own shardings; drop --devices/--fsdp "
            "(jaxfit fits it on the mesh it gives)"
        )
    mesh = make_mesh(spec, TARGET_DEVICES or None)
    batches = data_sharding(mesh)

    def abstract_args(batch_size: int) -> tuple[Any, ...]:
        args = list(workload.abstract_args(batch_size))
        index = workload.batch_argnum % len(args)
        for i, arg in enumerate(args):
            if i == index:
                args[i] = _placed(arg, jax.tree_util.tree_map(lambda _: batches, arg))
            else:
                args[i] = _placed(arg, fsdp_sharding(arg, mesh, spec.min_shard_bytes))
        return tuple(args)

    probe_args = abstract_args(spec.devices)
    outputs = jax.eval_shape(workload.step_fn, *probe_args)
    arg_shardings = [jax.tree_util.tree_map(lambda x: getattr(x, "sharding", None), a) for a in probe_args]
    arg_structures = [jax.tree_util.tree_structure(a) for a in probe_args]

    def place_output(out: Any) -> Any:
        structure: Any = jax.tree_util.tree_structure(out)
        for i, known in enumerate(arg_structures):
            if i != workload.batch_argnum % len(probe_args) and known == structure:
                return arg_shardings[i]
        return jax.tree_util.tree_map(lambda _: replicated(mesh), out)

    if isinstance(outputs, tuple):
        out_shardings: Any = tuple(place_output(o) for o in outputs)
    else:
        out_shardings = place_output(outputs)
    description = dict(workload.description, mesh=spec.axes())
    # The input shardings travel on the abstract arguments themselves (jit takes them from there).
    return dataclasses.replace(
        workload, abstract_args=abstract_args, out_shardings=out_shardings, description=description
    )


Topology = Literal["real", "host", "mock", "target"]
"""Where a mesh's devices come from: ``real`` devices of this machine, ``host`` CPU devices made
with ``--xla_force_host_platform_device_count``, or a ``mock`` GPU topology (compiled, never run)."""

HOST_COUNT_FLAG = "--xla_force_host_platform_device_count"
MOCK_FLAGS = "--xla_gpu_shard_autotuning=false"
"""Without it a sharded compile for a mocked topology hung for over 150 s on an H100 (jax 0.11.2);
MaxText's GPU ahead-of-time path sets it too (docs/guides/facts.md #13)."""


def prepare_devices(count: int, allow_mock: bool = True) -> Topology:
    """Make ``count`` devices visible to this process before JAX starts its backend.

    On a machine without GPUs: ``count`` CPU devices (``XLA_FLAGS``). On a GPU machine with at
    least ``count`` visible GPUs: nothing to do. With fewer: a mocked topology of ``count`` GPUs
    (``jax_mock_gpu_topology``, ``jax_cuda_visible_devices=0``), whose programs compile against
    the real first GPU's memory limit and cannot run; without ``allow_mock``, a one-line error.

    Raises:
      ConfigError: fewer GPUs than ``count`` and no ``allow_mock``.
    """
    import os
    import re

    if count <= 1:
        return "real"
    flags = os.environ.get("XLA_FLAGS", "")
    cpu_only = "cpu" in os.environ.get("JAX_PLATFORMS", "").split(",")
    gpus = 0 if cpu_only else len(detect_gpus())
    if gpus == 0:
        match = re.search(HOST_COUNT_FLAG + r"=(\d+)", flags)
        if match is None or int(match.group(1)) < count:
            flags = re.sub(HOST_COUNT_FLAG + r"=\d+", "", flags)
            os.environ["XLA_FLAGS"] = f"{flags} {HOST_COUNT_FLAG}={count}".strip()
        return "host"
    if gpus >= count:
        return "real"
    if not allow_mock:
        raise ConfigError(
            f"--devices {count} needs {count} GPUs and this process sees {gpus}; use --devices {gpus} or fewer, "
            f"or plan for {count} with jaxfit plan --devices {count} (compiled for a mocked topology)"
        )
    import jax

    os.environ["XLA_FLAGS"] = f"{flags} {MOCK_FLAGS}".strip()
    jax.config.update("jax_mock_gpu_topology", f"1x{count}x1")
    jax.config.update("jax_cuda_visible_devices", "0")
    return "mock"


def meshes_for(device_counts: Sequence[int], fsdp_sizes: Sequence[int] | None) -> list[MeshSpec]:
    """Every ``(devices, fsdp)`` to plan: for each device count, the given FSDP sizes that divide
    it (default: 1 and the count itself).

    Raises:
      ConfigError: no count, a count or FSDP size below 1, an empty list of FSDP sizes, or FSDP
        sizes none of which divide some count.
    """
    if not device_counts:
        raise ConfigError("--devices names no device count; give at least one, e.g. --devices 1 2 4")
    for devices in device_counts:
        if devices < 1:
            raise ConfigError(f"--devices {devices} must be at least 1")
    if fsdp_sizes is not None:
        if not fsdp_sizes:
            raise ConfigError(
                "--fsdp names no size; give at least one that divides a device count, e.g. --fsdp 1 "
                f"{max(device_counts)}, or leave --fsdp out for 1 and each count"
            )
        for fsdp in fsdp_sizes:
            if fsdp < 1:
                raise ConfigError(f"--fsdp {fsdp} must be at least 1 (1: data parallel, no sharding)")
    out: list[MeshSpec] = []
    for devices in device_counts:
        sizes = sorted({1, devices}) if fsdp_sizes is None else [f for f in fsdp_sizes if devices % f == 0]
        if not sizes:
            raise ConfigError(
                f"no --fsdp size of {list(fsdp_sizes or [])} divides {devices} devices; add 1 or a divisor of "
                f"{devices} ({', '.join(str(d) for d in divisors(devices))})"
            )
        for fsdp in sizes:
            spec = MeshSpec(devices, fsdp).validate()
            if spec not in out:
                out.append(spec)
    return out
