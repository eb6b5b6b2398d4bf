#!/usr/bin/env python3
"""openpi's own TrainConfigs on fake data and random init, and their abstract sizes.

Imported by ``train_fake.py`` (which then runs openpi's own ``scripts/train.py``), and runnable
alone to count each config's parameters, trainable parameters and optimizer state from openpi's
own ``init_train_state`` traced with ``jax.eval_shape`` (nothing is allocated):

    OPENPI_DIR=/tmp/openpi python benchmarks/openpi/fake_configs.py [--json FILE] [CONFIG ...]

What changes, for every config in openpi's registry (``openpi.training.config._CONFIGS_DICT``):

- ``data`` becomes openpi's ``FakeDataConfig()`` (``repo_id="fake"``): openpi's ``FakeDataset`` draws
  random batches from the model's own ``inputs_spec()``. Real data reaches the train step only
  after openpi's model transforms (images resized to 224x224, prompt tokenized and padded to
  ``max_token_len``, state and actions padded to ``action_dim``), i.e. as arrays of exactly those
  shapes and dtypes, so the step compiles to the same program.
- ``weight_loader`` becomes ``NoOpWeightLoader()`` (random init, no download). openpi's train.py
  validates whatever a loader returns against the random init's abstract params with
  ``check_pytree_equality(check_shapes=True, check_dtypes=True)`` and then runs the same jitted init
  with the same output shardings, so a loaded checkpoint has, by construction, the random init's
  structure, shapes and dtypes; XLA compiles on those alone, never on the values.

Nothing else of a config changes (model, freeze filter, optimizer, EMA, batch size, FSDP devices):
the train step is openpi's own.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent

# The configs this harness is checked on (issue 19): full fine-tune, LoRA, pi0-FAST, pi0-FAST LoRA, pi0.5.
CONFIGS = (
    "pi0_libero",
    "pi0_libero_low_mem_finetune",
    "pi0_fast_libero",
    "pi0_fast_libero_low_mem_finetune",
    "pi05_libero",
)


def openpi_dir() -> Path:
    """The (patched) openpi checkout: $OPENPI_DIR, or where an importable ``openpi`` lives."""
    if os.environ.get("OPENPI_DIR"):
        return Path(os.environ["OPENPI_DIR"]).resolve()
    spec = importlib.util.find_spec("openpi")
    if spec is None or not spec.origin:
        sys.exit("fake_configs: error: set OPENPI_DIR to a patched openpi copy (benchmarks/openpi/patch_openpi.py)")
    return Path(spec.origin).resolve().parents[2]


def add_paths() -> Path:
    """Put openpi, openpi-client and the lerobot stand-in on sys.path (spawned workers inherit it)."""
    root = openpi_dir()
    if not (root / "scripts" / "train.py").is_file():
        sys.exit(f"fake_configs: error: {root} is not an openpi checkout (no scripts/train.py)")
    if not (root / ".jaxfit-patches.json").is_file():
        print(f"fake_configs: warning: {root} is not a patched copy (run patch_openpi.py)", file=sys.stderr)
    for path in (HERE / "stubs", root / "packages" / "openpi-client" / "src", root / "src"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    return root


def fake(config: Any) -> Any:
    """The same TrainConfig on openpi's fake data, with no weights to load (random init)."""
    import openpi.training.config as _config
    import openpi.training.weight_loaders as _weight_loaders

    return dataclasses.replace(config, data=_config.FakeDataConfig(), weight_loader=_weight_loaders.NoOpWeightLoader())


class HostFakeDataset:
    """openpi's ``FakeDataset`` with its samples drawn by numpy, on the host.

    openpi's own draws each sample with ``jax.random`` **in the data-loader workers, on the GPU**
    (its ``_worker_init_fn`` sets the platform allocator): each worker then holds a CUDA context and
    its arrays outside the training process's pool (up to 4.8 GiB more on an H100 in a LoRA run),
    which a real dataset's workers, handing numpy arrays to the loader, need not. This one draws the
    same shapes, dtypes and ranges (uniform in [-1, 1] for float32, integers in [0, 2048) for int32,
    zeros otherwise) with numpy, so the step, which sees only shapes and dtypes, is the same, and the
    GPU holds what training with a real dataset holds. ``OPENPI_FAKE_DATA=openpi`` keeps openpi's own.
    """

    def __init__(self, model_config: Any, num_samples: int) -> None:
        self._num_samples = num_samples
        self._observation_spec, self._action_spec = model_config.inputs_spec()

    def __getitem__(self, index: Any) -> dict:
        import jax
        import numpy as np

        rng = np.random.default_rng(int(index))

        def make_from_spec(spec: Any) -> Any:
            shape = spec.shape[1:]  # without the batch dimension
            if spec.dtype == np.float32:
                return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
            if spec.dtype == np.int32:
                return rng.integers(0, 2048, size=shape, dtype=np.int32)
            return np.zeros(shape, dtype=spec.dtype)

        observation = jax.tree.map(make_from_spec, self._observation_spec)
        action = jax.tree.map(make_from_spec, self._action_spec)
        return {**observation.to_dict(), "actions": action}

    def __len__(self) -> int:
        return self._num_samples


CKPT_SUFFIX = "_from_ckpt"
"""``CONFIG_from_ckpt``: CONFIG on fake data with its weights loaded from a local checkpoint by openpi's
own ``CheckpointWeightLoader`` (registered only while ``OPENPI_CKPT_ROOT`` is set; issue 42, item 4)."""


def checkpoint_params(root: str | Path, name: str) -> Path:
    """Where ``make_checkpoint.py`` writes config ``name``'s params and ``name_from_ckpt`` reads them."""
    return Path(root) / name / "params"


def from_checkpoint(config: Any, params_path: str | Path) -> Any:
    """The fake-data copy of ``config`` that loads its weights from ``params_path`` (openpi's params
    format, as ``openpi.models.model.restore_params`` reads it) with openpi's ``CheckpointWeightLoader``,
    as openpi's own fine-tuning configs load ``gs://openpi-assets/checkpoints/pi0_base/params``: the
    loaded arrays are cast on the host to the random init's dtypes (frozen params bfloat16), the LoRA
    params the checkpoint lacks come from the random init, and openpi's jitted ``init`` takes the loaded
    ones as a donated argument in place of creating them."""
    import openpi.training.weight_loaders as _weight_loaders

    return dataclasses.replace(
        fake(config),
        name=config.name + CKPT_SUFFIX,
        weight_loader=_weight_loaders.CheckpointWeightLoader(str(params_path)),
    )


def register() -> list[str]:
    """Replace every config in openpi's registry by its fake-data, random-init copy (same name), and
    (unless ``OPENPI_FAKE_DATA=openpi``) openpi's fake dataset by :class:`HostFakeDataset`. With
    ``OPENPI_CKPT_ROOT`` set, also register ``NAME_from_ckpt`` (:func:`from_checkpoint`) for each of
    :data:`CONFIGS` and ``debug``, reading ``$OPENPI_CKPT_ROOT/NAME/params``."""
    import openpi.training.config as _config
    import openpi.training.data_loader as _data_loader

    names = list(_config._CONFIGS_DICT)
    for name in names:
        original = _config._CONFIGS_DICT[name]
        _config._CONFIGS_DICT[name] = fake(original)
        root = os.environ.get("OPENPI_CKPT_ROOT")
        if root and name in (*CONFIGS, "debug"):
            _config._CONFIGS_DICT[name + CKPT_SUFFIX] = from_checkpoint(original, checkpoint_params(root, name))
    if os.environ.get("OPENPI_FAKE_DATA", "host") != "openpi":
        original = _data_loader.create_torch_dataset

        def create_torch_dataset(data_config: Any, action_horizon: int, model_config: Any) -> Any:
            if data_config.repo_id == "fake":
                return HostFakeDataset(model_config, num_samples=1024)
            return original(data_config, action_horizon, model_config)

        _data_loader.create_torch_dataset = create_torch_dataset
    return names


def load_train_script(root: Path) -> ModuleType:
    """openpi's scripts/train.py as a module (its ``__main__`` block does not run)."""
    spec = importlib.util.spec_from_file_location("openpi_train_script", root / "scripts" / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _count(tree: Any) -> tuple[int, int]:
    import jax

    leaves = [x for x in jax.tree.leaves(tree) if hasattr(x, "shape")]
    return sum(math.prod(x.shape) for x in leaves), sum(math.prod(x.shape) * x.dtype.itemsize for x in leaves)


def trace_step(config: Any, train: ModuleType, state: Any, batch_size: int = 1) -> dict[str, Any]:
    """Trace openpi's own train_step (jax.eval_shape: nothing compiled or allocated) with run-time type checks on.

    The abstract batch is the model's ``inputs_spec``, which is what openpi's FakeDataset draws from.
    The step must return a state of the same structure, shapes and dtypes as the one it was given.
    """
    import functools

    import jax

    start = time.time()
    batch = config.model.inputs_spec(batch_size=batch_size)
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
    new_state, info = jax.eval_shape(functools.partial(train.train_step, config), rng, state, batch)
    same = jax.tree.structure(new_state) == jax.tree.structure(state) and all(
        a.shape == b.shape and a.dtype == b.dtype for a, b in zip(jax.tree.leaves(new_state), jax.tree.leaves(state))
    )
    if not same:
        raise SystemExit(f"fake_configs: error: {config.name}: train_step's new state differs from its input state")
    return {
        "step_traced_batch": batch_size,
        "step_info": sorted(info),
        "step_trace_seconds": round(time.time() - start, 1),
    }


def abstract_sizes(name: str, train: ModuleType, *, step: bool = False) -> dict[str, Any]:
    """Parameter and optimizer-state counts from openpi's own init_train_state, traced only.

    ``init_train_state(..., resume=True)`` returns right after ``jax.eval_shape(init, rng)``, before any
    weight loading or allocation: the abstract train state exactly as openpi builds it.
    """
    import jax
    import openpi.training.config as _config
    import openpi.training.sharding as _sharding

    config = _config.get_config(name)
    start = time.time()
    mesh = _sharding.make_mesh(config.fsdp_devices)
    state, _ = train.init_train_state(config, jax.random.key(0), mesh, resume=True)
    params, params_bytes = _count(state.params)
    trainable, trainable_bytes = _count(state.params.filter(config.trainable_filter))
    opt, opt_bytes = _count(state.opt_state)
    ema, ema_bytes = _count(state.ema_params) if state.ema_params is not None else (0, 0)
    observation, actions = config.model.inputs_spec(batch_size=1)
    inputs = {
        "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path): f"{leaf.shape}@{leaf.dtype}"
        for path, leaf in jax.tree_util.tree_flatten_with_path((observation, actions))[0]
    }
    row = {
        "config": name,
        "model": type(config.model).__name__,
        "batch_size": config.batch_size,
        "ema_decay": config.ema_decay,
        "params": params,
        "params_bytes": params_bytes,
        "trainable_params": trainable,
        "trainable_bytes": trainable_bytes,
        "opt_state_elements": opt,
        "opt_state_bytes": opt_bytes,
        "ema_params": ema,
        "ema_bytes": ema_bytes,
        "data": type(config.data).__name__,
        "weight_loader": type(config.weight_loader).__name__,
        "inputs_per_sample": inputs,
        "seconds": round(time.time() - start, 1),
    }
    if step:
        row.update(trace_step(config, train, state))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description="Abstract sizes of openpi's configs on fake data, random init.")
    parser.add_argument(
        "configs", nargs="*", default=list(CONFIGS), help=f"config names (default: {' '.join(CONFIGS)})"
    )
    parser.add_argument("--json", type=Path, help="write the rows here as a JSON list")
    parser.add_argument(
        "--step", action="store_true", help="also trace openpi's train_step at batch 1 (eval_shape, type checks on)"
    )
    args = parser.parse_args()
    root = add_paths()
    register()
    train = load_train_script(root)
    rows = []
    for name in args.configs:
        row = abstract_sizes(name, train, step=args.step)
        rows.append(row)
        print(
            f"{name}: {row['params']:,} params ({row['params_bytes'] / 2**30:.2f} GiB), "
            f"{row['trainable_params']:,} trainable, optimizer state {row['opt_state_elements']:,} elements "
            f"({row['opt_state_bytes'] / 2**30:.2f} GiB), EMA {row['ema_params']:,} "
            f"[{row['data']}, {row['weight_loader']}; {row['seconds']} s]"
            + (f"; train_step traced at batch 1 ({row['step_trace_seconds']} s)" if args.step else ""),
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
