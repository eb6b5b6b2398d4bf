#!/usr/bin/env python3
"""Train one of jaxfit's example models: an openpi-style training script.

This is the stand-in for a user's openpi repository (openpi's ``scripts/train.py`` together with
``src/openpi/training/config.py``): named configs chosen on the command line and overridden
field by field, a module-level ``train_step(config, rng, state, batch)`` jitted in :func:`main`
with explicit shardings over a 1-D device mesh, orbax checkpoints with ``--resume`` and
``--overwrite``, and WandB logging whose run id is kept in the checkpoint directory.

Usage::

    python scripts/train.py <config> --exp-name=NAME [--batch-size=N] [--grad-accum-steps=N]
        [--num-train-steps=N] [--overwrite] [--resume] [--wandb-enabled/--no-wandb-enabled] ...
    python scripts/train.py --help                 # lists the configs
    python scripts/train.py debug --help           # lists every field of a config

The WandB mode comes from the environment (``WANDB_MODE=offline`` for no network), as for any
WandB script. Checkpoints go to ``{checkpoint_base_dir}/{config name}/{exp_name}``.

Usage errors (an indivisible batch, an existing checkpoint directory without ``--overwrite`` or
``--resume``, a bad model override) print one line ``error: ...`` to stderr and exit with code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Let ``python scripts/train.py`` import the example models from a clone, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dataclasses
import functools
import os
import shutil
import time
from collections.abc import Sequence
from typing import Any, Literal, NoReturn

import flax.struct
import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
import tyro
from flax import nnx
from jax.sharding import NamedSharding

from jaxfit import examples
from jaxfit.errors import ConfigError
from jaxfit.fit import mesh as meshes

Batch = dict[str, jax.Array]
"""A training batch: the dict of arrays from :func:`jaxfit.examples.synthetic_batch`."""

WANDB_ID_FILE = "wandb_id.txt"
"""File in the checkpoint directory holding the WandB run id, so ``--resume`` continues that run."""


# --------------------------------------------------------------------------------------------
# Config (openpi: src/openpi/training/config.py)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run: the model, the batch, the schedule, checkpointing and logging.

    Attributes:
      name: The config's name (set by the named config; not overridable).
      model: A jaxfit example name (e.g. ``gpt-tiny``) or the path of a YAML model config.
      model_overrides: Model config fields to replace, ``key -> value``. A config that has
        overrides takes one flag per key (``--model-overrides.dtype bfloat16``); one without
        takes pairs (``--model-overrides n_layers 2 dtype bfloat16``).
      exp_name: The experiment name; names the checkpoint directory and the WandB run.
      batch_size: Global batch size: samples per optimizer step, over all devices.
      grad_accum_steps: Micro-batches each step's batch is split into; gradients are
        accumulated over them, so activation memory shrinks while the global batch stays.
      num_train_steps: Optimizer steps to train for (in total, counting resumed steps).
      log_interval: Print and log the loss every this many steps.
      save_interval: Save a checkpoint every this many steps (and always at the end).
      keep_period: Also keep every checkpoint whose step is a multiple of this; ``None`` keeps
        only the latest.
      overwrite: Wipe an existing checkpoint directory and start afresh.
      resume: Continue from the latest checkpoint in an existing checkpoint directory.
      wandb_enabled: Log to WandB (the mode, e.g. offline, comes from ``WANDB_MODE``).
      project_name: The WandB project.
      fsdp_devices: Devices each parameter and optimizer-state array is sharded over (openpi's
        FSDP): the mesh is ``(batch, fsdp)`` = ``(devices / fsdp_devices, fsdp_devices)``, every
        array of at least ``fsdp_min_bytes`` is split along its largest axis that
        ``fsdp_devices`` divides, smaller ones are replicated; 1: data parallel, all replicated.
        The batch is split over every device either way.
      fsdp_min_bytes: Arrays smaller than this stay replicated under FSDP (openpi: 4 MiB).
      remat: Rematerialisation, overriding the model's: ``none``, ``full`` (save nothing),
        ``dots`` (save matrix products) or ``dots_no_batch`` (save those without a batch
        dimension); unset: the model config's.
      precision: The parameters', optimizer state's and compute's dtype, overriding the model's:
        ``float32`` or ``bfloat16``; unset: the model config's.
      seed: Seed of the parameter initialisation and of the synthetic data.
      checkpoint_base_dir: Checkpoints go to ``{checkpoint_base_dir}/{name}/{exp_name}``.
    """

    name: tyro.conf.Suppress[str]
    model: str
    model_overrides: dict[str, str] = dataclasses.field(default_factory=dict)
    exp_name: str = tyro.MISSING
    batch_size: int = 32
    grad_accum_steps: int = 1
    num_train_steps: int = 2_000
    log_interval: int = 100
    save_interval: int = 500
    keep_period: int | None = None
    overwrite: bool = False
    resume: bool = False
    wandb_enabled: bool = True
    project_name: str = "jaxfit"
    fsdp_devices: int = 1
    fsdp_min_bytes: int = meshes.MIN_SHARD_BYTES
    remat: Literal["none", "full", "dots", "dots_no_batch"] | None = None
    precision: Literal["float32", "bfloat16"] | None = None
    seed: int = 42
    checkpoint_base_dir: str = "./checkpoints"

    @property
    def checkpoint_dir(self) -> Path:
        """``{checkpoint_base_dir}/{name}/{exp_name}``, absolute."""
        if not self.exp_name:
            raise ValueError("--exp-name must be set")
        return (Path(self.checkpoint_base_dir) / self.name / self.exp_name).resolve()


# The debug models: gpt-tiny / vit-tiny shrunk until a few dozen steps take seconds on a CPU.
# Every key listed is overridable on the command line (e.g. ``--model-overrides.dtype bfloat16``):
# tyro turns a non-empty dict default into one flag per key.
_DEBUG_GPT = {
    "n_layers": "1",
    "d_model": "64",
    "n_heads": "2",
    "seq_len": "32",
    "vocab_size": "256",
    "dtype": "float32",
    "remat": "false",
    "learning_rate": "3e-3",
}
_DEBUG_VIT = {
    "image_size": "16",
    "patch_size": "4",
    "d_model": "64",
    "n_layers": "1",
    "n_heads": "2",
    "dtype": "float32",
    "remat": "false",
    "learning_rate": "1e-3",
}

_CONFIGS = [
    TrainConfig(
        name="debug",
        model="gpt-tiny",
        model_overrides=_DEBUG_GPT,
        batch_size=8,
        num_train_steps=30,
        log_interval=5,
        save_interval=10,
    ),
    TrainConfig(
        name="debug_vit",
        model="vit-tiny",
        model_overrides=_DEBUG_VIT,
        batch_size=8,
        num_train_steps=30,
        log_interval=5,
        save_interval=10,
    ),
    TrainConfig(
        name="gpt_small",
        model="gpt-small",
        batch_size=32,
        num_train_steps=2_000,
        log_interval=50,
        save_interval=500,
    ),
    TrainConfig(
        name="gpt_small_bf16_remat",
        model="gpt-small",
        model_overrides={"dtype": "bfloat16", "remat": "true"},
        batch_size=32,
        num_train_steps=2_000,
        log_interval=50,
        save_interval=500,
    ),
    TrainConfig(
        name="vit_small",
        model="vit-small",
        batch_size=128,
        num_train_steps=2_000,
        log_interval=50,
        save_interval=500,
    ),
    TrainConfig(
        name="gpt_medium_bf16_remat",
        model="gpt-medium-bf16-remat",
        batch_size=16,
        num_train_steps=2_000,
        log_interval=50,
        save_interval=500,
    ),
]

if len({config.name for config in _CONFIGS}) != len(_CONFIGS):  # pragma: no cover - programming error
    raise ValueError("config names must be unique")

_CONFIGS_DICT = {config.name: config for config in _CONFIGS}


def _describe(config: TrainConfig) -> str:
    """The one-line help of a named config: its model, overrides, batch and steps."""
    overrides = ",".join(f"{key}={value}" for key, value in config.model_overrides.items())
    model = f"{config.model}[{overrides}]" if overrides else config.model
    return f"{model}, batch {config.batch_size}, {config.num_train_steps} steps"


def cli(args: Sequence[str] | None = None) -> TrainConfig:
    """Parse the command line: a named config, then overrides of its fields (openpi's ``cli``)."""
    return tyro.extras.overridable_config_cli(
        {name: (_describe(config), config) for name, config in _CONFIGS_DICT.items()},
        args=args,
    )


def get_config(config_name: str) -> TrainConfig:
    """The named config ``config_name`` (raises ``ValueError`` for an unknown name)."""
    if config_name not in _CONFIGS_DICT:
        raise ValueError(f"config {config_name!r} not found; available: {', '.join(_CONFIGS_DICT)}")
    return _CONFIGS_DICT[config_name]


def model_config(config: TrainConfig) -> examples.ModelConfig:
    """The model config of a run: the example (or YAML file) with ``model_overrides`` applied.

    Raises:
      jaxfit.errors.ConfigError: An unknown example, a bad override or an impossible shape.
    """
    overrides = dict(config.model_overrides)
    if config.remat is not None:
        overrides["remat"] = "false" if config.remat == "none" else "true"
        if config.remat != "none":
            overrides["remat_policy"] = "nothing" if config.remat == "full" else config.remat
    if config.precision is not None:
        overrides["dtype"] = config.precision
    return examples.load_config(config.model, overrides)


# --------------------------------------------------------------------------------------------
# Train state and step (openpi: src/openpi/training/utils.py, scripts/train.py)
# --------------------------------------------------------------------------------------------


@flax.struct.dataclass
class TrainState:
    """Everything a step updates: the step counter, the parameters and the optimizer state.

    Attributes:
      step: Optimizer steps taken so far (an int32 scalar).
      params: The model parameters (an ``nnx.State``).
      opt_state: The optax AdamW state of ``params``.
    """

    step: jax.Array
    params: nnx.State
    opt_state: optax.OptState

    def to_checkpoint(self) -> dict[str, Any]:
        """The pytree saved to (and restored from) a checkpoint."""
        return {"step": self.step, "params": self.params, "opt_state": self.opt_state}

    @classmethod
    def from_checkpoint(cls, tree: dict[str, Any]) -> TrainState:
        """The inverse of :meth:`to_checkpoint`."""
        return cls(step=tree["step"], params=tree["params"], opt_state=tree["opt_state"])


def init_train_state(config: TrainConfig, rng: jax.Array) -> TrainState:
    """A freshly initialised train state at step 0 (parameters from ``rng``)."""
    _, (params, opt_state) = examples.init_state(model_config(config), rng)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state)


def abstract_train_state(config: TrainConfig, shardings: Any = None) -> TrainState:
    """The train state's shapes and dtypes, each leaf placed with its sharding in ``shardings`` (a
    tree like the state, or one sharding for all; ``None``: unplaced): nothing allocated."""
    _, (params, opt_state) = examples.abstract_state(model_config(config))
    state = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params, opt_state=opt_state)
    if shardings is None:
        return state
    if isinstance(shardings, jax.sharding.Sharding):
        shardings = jax.tree.map(lambda _: shardings, state)
    return jax.tree.map(lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s), state, shardings)


def state_shardings(config: TrainConfig, mesh: jax.sharding.Mesh) -> TrainState:
    """Where each array of the train state lives (openpi's ``fsdp_sharding``): split along the
    fsdp axis, or replicated when small (:func:`jaxfit.fit.mesh.fsdp_sharding`)."""
    return meshes.fsdp_sharding(abstract_train_state(config), mesh, config.fsdp_min_bytes)


def _split_micro_batches(batch: Batch, num_micro_batches: int) -> Batch:
    """Reshape every ``[B, ...]`` leaf into ``[num_micro_batches, B // num_micro_batches, ...]``.

    Micro-batch ``i`` takes rows ``i, i + n, i + 2n, ...``: a batch sharded over devices on its
    leading axis gives every micro-batch an equal share of each device's rows, so the split moves
    no data between devices. The leading size is read from the arrays, not from the config, so
    the step traces for any batch size that is a multiple of ``num_micro_batches``.

    Raises:
      ValueError: A leading size that is not a multiple of ``num_micro_batches``.
    """
    sizes = {x.shape[0] for x in jax.tree.leaves(batch)}
    if any(size % num_micro_batches for size in sizes):
        raise ValueError(
            f"a batch of {sorted(sizes)} samples does not split into {num_micro_batches} "
            "equal micro-batches; use a batch size that is a multiple of grad_accum_steps"
        )

    def split(x: jax.Array) -> jax.Array:
        rows = x.reshape(x.shape[0] // num_micro_batches, num_micro_batches, *x.shape[1:])
        return jnp.moveaxis(rows, 1, 0)

    return jax.tree.map(split, batch)


def train_step(
    config: TrainConfig, rng: jax.Array, state: TrainState, batch: Batch
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step on the global batch of ``config.batch_size`` samples.

    With ``config.grad_accum_steps > 1`` the batch is split into that many micro-batches, whose
    gradients are summed in float32 by ``jax.lax.scan`` and averaged before the single optimizer
    update: the result is the step on the whole batch, while only one micro-batch's activations
    are live at a time.

    Args:
      config: The run's config (bound with ``functools.partial`` before jitting).
      rng: The training key. Kept for openpi's signature (openpi feeds it to the model's noise);
        the example models have no stochastic layers such as dropout, so it is unused.
      state: The train state (donated by the jitted step).
      batch: The global batch, sharded over the mesh's batch axis.

    Returns:
      ``(new_state, info)`` with ``info`` holding the scalars ``loss`` (the mean over the batch)
      and ``grad_norm``.
    """
    del rng  # Deterministic models: nothing to sample.
    model_cfg = model_config(config)
    model_def, _ = examples.abstract_state(model_cfg)
    tx = examples.make_optimizer(model_cfg)

    def loss_of(params: nnx.State, micro_batch: Batch) -> jax.Array:
        return examples.loss_fn(model_cfg, nnx.merge(model_def, params), micro_batch)

    grad_fn = jax.value_and_grad(loss_of)
    num_micro = config.grad_accum_steps
    if num_micro == 1:
        loss, grads = grad_fn(state.params, batch)
    else:

        def accumulate(
            carry: tuple[jax.Array, nnx.State], micro_batch: Batch
        ) -> tuple[tuple[jax.Array, nnx.State], None]:
            loss_sum, grad_sum = carry
            loss, grads = grad_fn(state.params, micro_batch)
            grad_sum = jax.tree.map(lambda total, g: total + g.astype(jnp.float32), grad_sum, grads)
            return (loss_sum + loss, grad_sum), None

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
        (loss_sum, grad_sum), _ = jax.lax.scan(
            accumulate,
            (jnp.zeros((), jnp.float32), zeros),
            _split_micro_batches(batch, num_micro),
        )
        # Equal micro-batches: the mean of their means is the mean over the whole batch.
        loss = loss_sum / num_micro
        grads = jax.tree.map(lambda g, p: (g / num_micro).astype(p.dtype), grad_sum, state.params)

    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, {"loss": loss, "grad_norm": optax.global_norm(grads)}


# --------------------------------------------------------------------------------------------
# Checkpoints and WandB (openpi: src/openpi/training/checkpoints.py, scripts/train.py)
# --------------------------------------------------------------------------------------------


class UsageError(Exception):
    """A problem with the command line or the checkpoint directory; its message is one line."""


def initialize_checkpoint_dir(config: TrainConfig) -> tuple[ocp.CheckpointManager, bool]:
    """Prepare the checkpoint directory and open its checkpoint manager.

    An existing directory is wiped with ``--overwrite`` or resumed with ``--resume``; without
    either it is an error. ``--resume`` of a directory without checkpoints starts afresh.

    Returns:
      ``(manager, resuming)``.

    Raises:
      UsageError: The directory exists and neither ``--overwrite`` nor ``--resume`` was given.
    """
    checkpoint_dir = config.checkpoint_dir
    resuming = False
    if checkpoint_dir.exists():
        if config.overwrite:
            shutil.rmtree(checkpoint_dir)
            print(f"wiped checkpoint directory {checkpoint_dir}", flush=True)
        elif config.resume:
            resuming = True
        else:
            raise UsageError(
                f"checkpoint directory {checkpoint_dir} already exists; pass --overwrite to wipe "
                "it or --resume to continue from it"
            )
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    manager = ocp.CheckpointManager(
        checkpoint_dir,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=1,
            keep_period=config.keep_period,
            save_interval_steps=config.save_interval,
            create=False,
        ),
    )
    if resuming and manager.latest_step() is None:
        print(f"no checkpoint in {checkpoint_dir} yet; starting from step 0", flush=True)
        resuming = False
    return manager, resuming


def save_state(manager: ocp.CheckpointManager, state: TrainState) -> None:
    """Save ``state`` (parameters, optimizer state and step) as the checkpoint of its step."""
    step = int(jax.device_get(state.step))
    manager.save(step, args=ocp.args.StandardSave(state.to_checkpoint()), force=True)


def restore_state(manager: ocp.CheckpointManager, abstract: TrainState) -> TrainState:
    """Restore the latest checkpoint into the shapes, dtypes and shardings of ``abstract``."""
    step = manager.latest_step()
    restored = manager.restore(step, args=ocp.args.StandardRestore(abstract.to_checkpoint()))
    return TrainState.from_checkpoint(restored)


class _NoTracking:
    """Stands in for the ``wandb`` module when ``--no-wandb-enabled``: wandb is not even imported."""

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass

    def finish(self) -> None:
        pass


def init_wandb(config: TrainConfig, *, resuming: bool) -> Any:
    """Start (or, when resuming, continue) the WandB run; its id lives in the checkpoint dir.

    The mode (online, offline) comes from the environment, e.g. ``WANDB_MODE=offline``. A run
    that the environment disables (``WANDB_MODE=disabled``) leaves no ``wandb_id.txt``: there is
    no run for a later ``--resume`` to continue.

    Returns:
      The ``wandb`` module, or a stand-in with ``log`` and ``finish`` when tracking is off.
    """
    if not config.wandb_enabled:
        return _NoTracking()
    import wandb

    id_file = config.checkpoint_dir / WANDB_ID_FILE
    if resuming and id_file.exists():
        run_id = id_file.read_text(encoding="utf-8").strip()
        wandb.init(
            id=run_id,
            resume="must",
            project=config.project_name,
            name=config.exp_name,
            config=dataclasses.asdict(config),
        )
    else:
        run = wandb.init(
            project=config.project_name,
            name=config.exp_name,
            config=dataclasses.asdict(config),
            resume=None,
        )
        if run.settings.mode != "disabled":
            id_file.write_text(run.id, encoding="utf-8")
    return wandb


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def validate(config: TrainConfig) -> examples.ModelConfig:
    """Check the config against the devices; returns the model config.

    Raises:
      UsageError: A non-positive size, a batch that does not split over the devices and the
        micro-batches, an ``fsdp_devices`` that does not divide the devices or a bad model config.
    """
    for field in ("batch_size", "grad_accum_steps", "num_train_steps", "log_interval", "save_interval"):
        if getattr(config, field) < 1:
            raise UsageError(f"--{field.replace('_', '-')}={getattr(config, field)} must be 1 or more")
    if config.keep_period is not None and config.keep_period < 1:
        raise UsageError(f"--keep-period={config.keep_period} must be 1 or more (or None)")
    if not config.exp_name or Path(config.exp_name).name != config.exp_name:
        raise UsageError(f"--exp-name={config.exp_name!r} must be a non-empty name without path separators")
    if config.overwrite and config.resume:
        raise UsageError("--overwrite and --resume contradict each other; pass one of them")
    devices = jax.device_count()
    if config.fsdp_devices < 1 or devices % config.fsdp_devices:
        choices = ", ".join(str(d) for d in meshes.divisors(devices))
        raise UsageError(
            f"--fsdp-devices={config.fsdp_devices} does not divide the {devices} devices; use one of {choices}"
        )
    if config.fsdp_min_bytes < 0:
        raise UsageError(f"--fsdp-min-bytes={config.fsdp_min_bytes} must not be negative")
    accum = config.grad_accum_steps
    if config.batch_size % devices:
        raise UsageError(
            f"--batch-size={config.batch_size} is not divisible by the {devices} devices; use a multiple of {devices}"
        )
    if config.batch_size % accum:
        raise UsageError(
            f"--batch-size={config.batch_size} is not divisible by --grad-accum-steps={accum}; "
            f"use a multiple of {accum}"
        )
    if (config.batch_size // accum) % devices:
        raise UsageError(
            f"the micro-batch of {config.batch_size // accum} samples (--batch-size="
            f"{config.batch_size} / --grad-accum-steps={accum}) does not split over the "
            f"{devices} devices; use a --batch-size that is a multiple of {devices * accum}"
        )
    try:
        return model_config(config)
    except ConfigError as err:
        raise UsageError(str(err)) from None


def fail(message: str) -> NoReturn:
    """Print ``error: message`` (one line) to stderr and exit with code 2."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def main(config: TrainConfig) -> None:
    """Train ``config``: initialise or restore the state, then step, log and checkpoint."""
    try:
        model_cfg = validate(config)
        checkpoint_manager, resuming = initialize_checkpoint_dir(config)
    except UsageError as err:
        fail(str(err))

    print(
        "XLA_PYTHON_CLIENT_MEM_FRACTION=" + os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "unset"),
        flush=True,
    )
    print(
        f"batch_size={config.batch_size} grad_accum_steps={config.grad_accum_steps} "
        f"micro_batch={config.batch_size // config.grad_accum_steps} "
        f"devices={jax.device_count()} ({jax.default_backend()}) fsdp_devices={config.fsdp_devices}",
        flush=True,
    )
    print(f"config {config.name}: model {config.model} -> {model_cfg}", flush=True)
    print(f"checkpoint_dir={config.checkpoint_dir}", flush=True)

    rng = jax.random.key(config.seed)
    train_rng, init_rng, data_rng = jax.random.split(rng, 3)

    # openpi's (batch, fsdp) mesh: the batch split over every device, the state over the fsdp axis.
    mesh = meshes.make_mesh(meshes.MeshSpec(jax.device_count(), config.fsdp_devices))
    data_sharding = meshes.data_sharding(mesh)
    replicated: NamedSharding = meshes.replicated(mesh)
    state_sharding = state_shardings(config, mesh)

    if resuming:
        state = restore_state(checkpoint_manager, abstract_train_state(config, state_sharding))
    else:  # initialised in place: no device ever holds more than its shard
        state = jax.jit(functools.partial(init_train_state, config), out_shardings=state_sharding)(init_rng)
    start_step = int(jax.device_get(state.step))
    if start_step > config.num_train_steps:
        fail(
            f"the checkpoint is at step {start_step}, past --num-train-steps="
            f"{config.num_train_steps}; raise --num-train-steps or pass --overwrite"
        )
    if resuming:
        print(f"resuming from step {start_step}", flush=True)

    wandb = init_wandb(config, resuming=resuming)

    ptrain_step = jax.jit(
        functools.partial(train_step, config),
        in_shardings=(replicated, state_sharding, data_sharding),
        out_shardings=(state_sharding, replicated),
        donate_argnums=(1,),
    )

    def next_batch(step: int) -> Batch:
        """The batch of step ``step`` (deterministic, so a resumed run sees the same data)."""
        batch = examples.synthetic_batch(model_cfg, config.batch_size, jax.random.fold_in(data_rng, step))
        return jax.device_put(batch, data_sharding)

    infos: list[dict[str, jax.Array]] = []
    last_loss: float | None = None
    interval_start = time.perf_counter()
    interval_steps = 0
    for step in range(start_step + 1, config.num_train_steps + 1):
        state, info = ptrain_step(train_rng, state, next_batch(step))
        infos.append(info)
        interval_steps += 1
        # Log the first step of the run (openpi logs step 0) and every log_interval-th step. The
        # loss is the mean over the steps since the last line; samples/s is their wall-clock
        # throughput, checkpointing included (the first line's includes the compilation).
        if step % config.log_interval == 0 or step == start_step + 1:
            means = {
                key: float(value)
                for key, value in jax.device_get(jax.tree.map(lambda *xs: jnp.mean(jnp.stack(xs)), *infos)).items()
            }
            elapsed = time.perf_counter() - interval_start
            samples_per_second = interval_steps * config.batch_size / max(elapsed, 1e-9)
            print(
                f"step {step}/{config.num_train_steps} loss {means['loss']:.3f} samples/s {samples_per_second:.1f}",
                flush=True,
            )
            wandb.log({**means, "step": step, "samples_per_second": samples_per_second}, step=step)
            infos, interval_steps = [], 0
            interval_start = time.perf_counter()
        if step % config.save_interval == 0 or step == config.num_train_steps:
            save_state(checkpoint_manager, state)
        if step == config.num_train_steps:
            last_loss = float(jax.device_get(info["loss"]))

    checkpoint_manager.wait_until_finished()
    checkpoint_manager.close()
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:  # GPU: what the run really used, against its limit
        print(
            f"memory: peak_bytes_in_use={stats['peak_bytes_in_use']} bytes_limit={stats.get('bytes_limit')}", flush=True
        )
    wandb.finish()
    if last_loss is None:
        print(
            f"done: {config.num_train_steps} steps, already reached by the checkpoint; nothing to train",
            flush=True,
        )
    else:
        print(f"done: {config.num_train_steps} steps, final loss {last_loss:.3f}", flush=True)


if __name__ == "__main__":
    main(cli())
