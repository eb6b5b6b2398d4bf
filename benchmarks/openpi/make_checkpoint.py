#!/usr/bin/env python3
"""A checkpoint of an openpi config's parameters: their real shapes, random values, openpi's format.

    JAX_PLATFORMS=cpu OPENPI_DIR=/tmp/openpi python3 benchmarks/openpi/make_checkpoint.py CONFIG \
        [--root /tmp/openpi-params] [--dtype bfloat16|float32|model] [--with-lora]

Writes ``ROOT/CONFIG/params`` (``fake_configs.checkpoint_params``), the folder openpi's
``CheckpointWeightLoader(params_path)`` reads through ``openpi.models.model.restore_params``: an orbax
PyTree checkpoint whose item is ``{"params": <pure dict of arrays>}``, as openpi's released
``gs://openpi-assets/checkpoints/<model>/params`` and its own training checkpoints' ``params`` item
are (issue 42, item 4: that bucket cannot be reached from here or from the GPU machines).

- Shapes: openpi's own ``config.model.create`` traced with ``jax.eval_shape``: every parameter of
  the model, nothing allocated on a device (run it with ``JAX_PLATFORMS=cpu``).
- Which: all but the LoRA parameters (``.*lora.*``), as a base checkpoint (``pi0_base``) that a LoRA
  config fine-tunes from holds them; openpi's loader takes those from the random init
  (``missing_regex=".*lora.*"``). ``--with-lora``: all of them.
- Dtypes: ``--dtype bfloat16`` (default), ``float32``, or ``model`` (the model's own, float32). The
  released checkpoints' on-disk dtype is not known here; it does not change what reaches the GPU:
  ``CheckpointWeightLoader`` casts each loaded array on the host to the random init's dtype (frozen
  parameters bfloat16, trained ones float32) before openpi's ``init`` takes them.
- Values: normal, standard deviation 0.02, drawn with numpy on the host (a seed per array), written
  from jax arrays on the CPU backend, as openpi writes its own.

Prints the count, bytes and seconds; exits 1 if openpi's ``restore_params`` does not read back every
array's shape and dtype (``--no-check`` skips that read).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
import os
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fake_configs

LORA = re.compile(".*lora.*")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--root", default=os.environ.get("OPENPI_CKPT_ROOT", "/tmp/openpi-params"))
    parser.add_argument("--dtype", choices=("bfloat16", "float32", "model"), default="bfloat16")
    parser.add_argument("--with-lora", action="store_true", help="also write the LoRA parameters")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--no-check", action="store_true", help="skip reading it back with restore_params")
    args = parser.parse_args()

    start = time.time()
    fake_configs.add_paths()
    fake_configs.register()
    import flax.nnx as nnx
    import flax.traverse_util as traverse_util
    import jax
    import jax.numpy as jnp
    import numpy as np
    import openpi.models.model as _model
    import openpi.training.config as _config
    import orbax.checkpoint as ocp

    config = _config.get_config(args.config)
    shapes = jax.eval_shape(lambda key: nnx.state(config.model.create(key)).to_pure_dict(), jax.random.key(0))
    flat = traverse_util.flatten_dict(shapes, sep="/")
    kept = {k: v for k, v in flat.items() if args.with_lora or not LORA.fullmatch(k)}
    dropped = len(flat) - len(kept)

    def dtype_of(sds: jax.ShapeDtypeStruct) -> np.dtype:
        return np.dtype(sds.dtype) if args.dtype == "model" else np.dtype(jnp.dtype(args.dtype))

    seeds = np.random.SeedSequence(args.seed).spawn(len(kept))

    def draw(item: tuple[int, tuple[str, jax.ShapeDtypeStruct]]) -> tuple[str, np.ndarray]:
        i, (key, sds) = item
        rng = np.random.default_rng(seeds[i])
        out = np.empty(sds.shape, dtype=dtype_of(sds))
        view = out.reshape(-1)
        chunk = 1 << 24
        for lo in range(0, view.size, chunk):
            hi = min(view.size, lo + chunk)
            view[lo:hi] = (rng.standard_normal(hi - lo, dtype=np.float32) * np.float32(0.02)).astype(out.dtype)
        return key, out

    with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:  # numpy's generators release the GIL
        arrays = dict(pool.map(draw, enumerate(kept.items())))
    drawn = time.time()
    params = traverse_util.unflatten_dict({k: jnp.asarray(v) for k, v in arrays.items()}, sep="/")
    del arrays
    count = sum(math.prod(v.shape) for v in kept.values())
    nbytes = sum(math.prod(v.shape) * dtype_of(v).itemsize for v in kept.values())

    path = fake_configs.checkpoint_params(args.root, args.config).resolve()
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with ocp.PyTreeCheckpointer() as checkpointer:
        checkpointer.save(path, args=ocp.args.PyTreeSave({"params": params}))
    written = time.time()
    print(
        f"make_checkpoint {args.config}: {len(kept)} arrays, {count:,} params, {nbytes / 2**30:.2f} GiB "
        f"({args.dtype}; {dropped} LoRA arrays {'kept' if args.with_lora else 'left out'}) -> {path}; "
        f"drawn in {drawn - start:.0f} s, written in {written - drawn:.0f} s",
        flush=True,
    )
    del params
    if args.no_check:
        return
    restored = traverse_util.flatten_dict(_model.restore_params(path, restore_type=np.ndarray), sep="/")
    bad = [
        k
        for k, sds in kept.items()
        if k not in restored or restored[k].shape != sds.shape or restored[k].dtype != dtype_of(sds)
    ]
    extra = sorted(set(restored) - set(kept))
    if bad or extra:
        sys.exit(
            f"make_checkpoint: error: restore_params read back {len(bad)} wrong arrays ({bad[:3]}), {len(extra)} extra"
        )
    print(
        f"make_checkpoint {args.config}: restore_params read back all {len(kept)} arrays ({time.time() - written:.0f} s)"
    )


if __name__ == "__main__":
    main()
