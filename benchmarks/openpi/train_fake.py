#!/usr/bin/env python3
"""openpi's own scripts/train.py, with every config on fake data and random init.

    OPENPI_DIR=/tmp/openpi python benchmarks/openpi/train_fake.py pi0_libero --exp-name=x [openpi's flags]

Takes exactly openpi's command line (config name, then tyro overrides). Before openpi parses it,
each config in openpi's registry is replaced by a copy with ``data=FakeDataConfig()`` and
``weight_loader=NoOpWeightLoader()`` (``fake_configs.py`` says why neither changes the train step's
memory); then openpi's ``scripts/train.py`` runs as ``__main__``: its ``main``, its ``train_step``,
its data loader, checkpointing and wandb, unchanged. openpi's command line cannot do this itself:
``--data`` and ``--weight-loader`` are typed by each config's default (``LeRobotLiberoDataConfig``,
``CheckpointWeightLoader``), so tyro offers no way to switch their type. With ``OPENPI_CKPT_ROOT``
set, ``CONFIG_from_ckpt`` loads its weights from ``$OPENPI_CKPT_ROOT/CONFIG/params`` with openpi's own
``CheckpointWeightLoader`` instead (``fake_configs.from_checkpoint``, ``make_checkpoint.py``).

With ``OPENPI_MEMORY_LOG=FILE``, each call of openpi's ``training_utils.array_tree_to_info`` (train.py
calls it right after the data loader's first batch and right after ``init_train_state`` and its
``block_until_ready``) appends one JSON line to FILE: which call, seconds since start, the process's
peak host RSS, and each local device's ``memory_stats()`` (``peak_bytes_in_use``, ``bytes_in_use``,
``bytes_limit``; none on the CPU). The second line's device peak is the start-up's peak through
openpi's init. Nothing else changes.
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fake_configs

LABELS = ("after the data loader's first batch", "after init_train_state")


def log_memory(path: str) -> None:
    """Wrap openpi's ``array_tree_to_info`` to append the memory so far to ``path`` (module docstring)."""
    import openpi.training.utils as training_utils

    original = training_utils.array_tree_to_info
    start = time.time()
    calls = []

    def array_tree_to_info(tree):
        import jax

        calls.append(1)
        devices = []
        for d in jax.local_devices():
            stats = d.memory_stats() or {}
            devices.append(
                {"device": str(d), "kind": d.device_kind}
                | {k: stats.get(k) for k in ("peak_bytes_in_use", "bytes_in_use", "bytes_limit", "largest_alloc_size")}
            )
        row = {
            "call": len(calls),
            "after": LABELS[len(calls) - 1] if len(calls) <= len(LABELS) else "later",
            "seconds": round(time.time() - start, 1),
            "host_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "devices": devices,
        }
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
        return original(tree)

    training_utils.array_tree_to_info = array_tree_to_info


def main() -> None:
    root = fake_configs.add_paths()
    fake_configs.register()
    if os.environ.get("OPENPI_MEMORY_LOG"):
        log_memory(os.environ["OPENPI_MEMORY_LOG"])
    script = root / "scripts" / "train.py"
    sys.argv[0] = str(script)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
