"""``jaxfit plan --script``: one probed script per device count and FSDP size.

An unmodified script builds its own mesh from the devices it sees (openpi: ``jax.device_count()``
devices, ``--fsdp-devices`` of them sharding the state). So a cell of the what-if table is the same
command run with

- its **devices**: the first N visible GPUs (``CUDA_VISIBLE_DEVICES``), or N host devices
  (``--xla_force_host_platform_device_count``) on a machine without GPUs;
- its **FSDP size**: the script's own flag (``--fsdp-flag``, openpi's ``--fsdp-devices``) set to
  the size, when sizes are asked for; otherwise the command's own value, untouched.

A cell needing more GPUs than this machine shows is not available here: a script runs its own
start-up (openpi initialises its parameters on the devices), which a mocked topology cannot run.

A cell for a GPU model that is not here (``--gpu MODEL``, ``--gpu-spec FILE``) is the command as
``jaxfit fit --script --gpu MODEL`` probes it: its start-up runs on the CPU, on N host devices (one
device: the command as it is), and its step is compiled for N compile-only devices of the model
(:func:`deviceless_environment`), so such cells need no GPU here, whatever the device count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxfit.errors import ConfigError
from jaxfit.fit.command import batch_value, with_batch
from jaxfit.fit.devices import devices_environment, forced_host_devices, gpus_here, host_devices_environment
from jaxfit.fit.mesh import MeshSpec, meshes_for
from jaxfit.fit.sources import ScriptSource

DEFAULT_FSDP_FLAG = "--fsdp-devices"
"""openpi's (and scripts/train.py's) FSDP flag."""


class CellUnavailable(ConfigError):
    """A cell this machine cannot compute (it says why); the table keeps going."""


def default_device_counts() -> tuple[int, ...]:
    """1, 2, 4 and 8 up to the GPUs this machine shows (1 without GPUs)."""
    gpus = max(1, gpus_here())
    return tuple(d for d in (1, 2, 4, 8) if d <= gpus) or (1,)


def device_environment(devices: int) -> dict[str, str]:
    """The variables that make a script see ``devices`` devices (:func:`devices_environment`).

    Raises:
      CellUnavailable: more GPUs than this machine shows.
    """
    try:
        return devices_environment(devices, flag="--devices")
    except ConfigError as e:
        raise CellUnavailable(
            f"{e}; a script runs its own start-up on its devices, so plan {devices} on a machine with {devices} GPUs"
        ) from None


def deviceless_environment(devices: int) -> dict[str, str]:
    """The variables that make a script probed for a GPU model that is not here see ``devices``
    devices: host devices on the CPU (its start-up runs there, ``JAX_PLATFORMS=cpu``, GPUs here or
    not), each standing for a compile-only device of the model. One device, when nothing here
    forces more host devices: none, so the cell is the very question ``jaxfit fit --script --gpu``
    asks (and shares its cached answer).
    """
    if devices == 1 and forced_host_devices() in (None, 1):
        return {}
    return host_devices_environment(devices)


def source_for_mesh(
    source: ScriptSource, mesh: MeshSpec, fsdp_flag: str, set_fsdp: bool, *, deviceless: bool = False
) -> ScriptSource:
    """``source`` on ``mesh``: its devices (:func:`device_environment`; ``deviceless``, for a GPU
    model that is not here: :func:`deviceless_environment`) and, with ``set_fsdp``, its FSDP flag
    set to ``mesh.fsdp``.

    Raises:
      CellUnavailable: the devices are not here.
    """
    env = deviceless_environment(mesh.devices) if deviceless else device_environment(mesh.devices)
    command = source.run_command
    if set_fsdp:
        command = tuple(with_batch(command, fsdp_flag, mesh.fsdp))
    return dataclasses.replace(source.with_command(command, source.batch_size), env=tuple(sorted(env.items())))


def script_meshes(
    source: ScriptSource, device_counts: Sequence[int], fsdp_sizes: Sequence[int] | None, fsdp_flag: str
) -> list[MeshSpec]:
    """The meshes to plan: each device count with each FSDP size that divides it; without sizes,
    the FSDP size of the command itself (``fsdp_flag``'s value, else 1) where it divides the count.

    Raises:
      ConfigError: a bad FSDP flag, no count, or no size that divides any count.
    """

    if not fsdp_flag.startswith("-") or "=" in fsdp_flag or " " in fsdp_flag:
        raise ConfigError(f"--fsdp-flag {fsdp_flag!r} must be a flag name, e.g. --fsdp-flag=--fsdp-devices")
    if not device_counts:
        raise ConfigError("--devices names no device count; give at least one, e.g. --devices 1 2 4")
    if fsdp_sizes is None:
        own = batch_value(source.run_command, fsdp_flag) or 1
        usable = [d for d in device_counts if d % own == 0]
        if device_counts and not usable:
            raise ConfigError(
                f"the command's {fsdp_flag}={own} divides none of --devices {' '.join(map(str, device_counts))}; "
                f"plan device counts that {own} divides"
            )
        return meshes_for(usable or device_counts, [own])
    return meshes_for(device_counts, fsdp_sizes)
