#!/usr/bin/env python3
"""openpi's own scripts/train.py, with every config on fake data and random init.

    OPENPI_DIR=/tmp/openpi python benchmarks/openpi/train_fake.py pi0_libero --exp-name=x [openpi's flags]

Takes exactly openpi's command line (config name, then tyro overrides). Before openpi parses it,
each config in openpi's registry is replaced by a copy with ``data=FakeDataConfig()`` and
``weight_loader=NoOpWeightLoader()`` (``fake_configs.py`` says why neither changes the train step's
memory); then openpi's ``scripts/train.py`` runs as ``__main__``: its ``main``, its ``train_step``,
its data loader, checkpointing and wandb, unchanged. openpi's command line cannot do this itself:
``--data`` and ``--weight-loader`` are typed by each config's default (``LeRobotLiberoDataConfig``,
``CheckpointWeightLoader``), so tyro offers no way to switch their type.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fake_configs


def main() -> None:
    root = fake_configs.add_paths()
    fake_configs.register()
    script = root / "scripts" / "train.py"
    sys.argv[0] = str(script)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
