"""``scripts/train.py``, the openpi-style training script, run as a user would: real subprocesses on
the CPU, WandB offline (no network)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from wandb_offline import wandb_run

pytestmark = pytest.mark.slow  # real subprocesses and compiles

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "train.py"

STEP_LINE = re.compile(r"^step (\d+)/(\d+) loss (\d+\.\d+) samples/s (\d+\.\d+)$", re.MULTILINE)
DONE_LINE = re.compile(r"^done: (\d+) steps, final loss (\d+\.\d+)$", re.MULTILINE)


def train(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python scripts/train.py ARGS`` in ``tmp_path`` with WandB offline under ``tmp_path``."""
    environment = dict(os.environ)
    environment.update(
        {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true", "JAX_PLATFORMS": "cpu"}
    )
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=environment,
        timeout=180,
    )


def progress(stdout: str) -> list[tuple[int, float]]:
    """``(step, loss)`` of every progress line."""
    return [(int(m[1]), float(m[3])) for m in STEP_LINE.finditer(stdout)]


def final_loss(stdout: str) -> float:
    """The loss of the ``done:`` line (which must be there)."""
    match = DONE_LINE.search(stdout)
    assert match, stdout
    return float(match[2])


def checkpoint_steps(checkpoint_dir: Path) -> list[int]:
    """The steps of the finished orbax checkpoints in a checkpoint directory."""
    return sorted(
        int(p.name)
        for p in checkpoint_dir.iterdir()
        if p.is_dir() and p.name.isdigit() and (p / "_CHECKPOINT_METADATA").exists()
    )


def test_debug_trains_checkpoints_and_logs_to_offline_wandb(tmp_path: Path) -> None:
    result = train(tmp_path, "debug", "--exp-name=t1", f"--checkpoint-base-dir={tmp_path / 'ck'}")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=unset" in out and "batch_size=8 " in out
    steps = progress(out)
    assert [s for s, _ in steps] == [1, 5, 10, 15, 20, 25, 30]
    assert final_loss(out) < steps[0][1] - 1.0, out

    checkpoint_dir = tmp_path / "ck" / "debug" / "t1"
    assert checkpoint_steps(checkpoint_dir) == [30]
    run_id = (checkpoint_dir / "wandb_id.txt").read_text().strip()

    # What offline WandB put on disk: wandb 0.31 writes no files/config.yaml offline; the config
    # and history are records of <WANDB_DIR>/wandb/offline-run-<time>-<id>/run-<id>.wandb.
    logged_id, config, history = wandb_run(tmp_path)
    assert logged_id == run_id
    assert config["batch_size"] == 8 and config["exp_name"] == "t1" and config["name"] == "debug"
    assert config["model_overrides"]["d_model"] == "64"
    assert [row["step"] for row in history] == [1, 5, 10, 15, 20, 25, 30]
    assert history[-1]["loss"] < history[0]["loss"]
    assert all(row["samples_per_second"] > 0 for row in history)
    config_yaml = next((tmp_path / "wandb").glob("offline-run-*/files/config.yaml"), None)
    if config_yaml is not None:  # older wandb versions also write it offline
        assert "batch_size" in config_yaml.read_text()


def test_resume_continues_from_the_saved_step_and_wandb_run(tmp_path: Path) -> None:
    base = f"--checkpoint-base-dir={tmp_path / 'ck'}"
    first = train(tmp_path, "debug", "--exp-name=r", base, "--num-train-steps=10")
    assert first.returncode == 0, first.stderr
    checkpoint_dir = tmp_path / "ck" / "debug" / "r"
    assert checkpoint_steps(checkpoint_dir) == [10]

    second = train(tmp_path, "debug", "--exp-name=r", base, "--num-train-steps=20", "--resume")
    assert second.returncode == 0, second.stderr
    assert "resuming from step 10" in second.stdout
    steps = progress(second.stdout)
    assert [s for s, _ in steps] == [11, 15, 20]
    # Continued, not restarted: the first resumed step is far below the untrained loss...
    assert steps[0][1] < progress(first.stdout)[0][1] - 1.0
    # ...and the loss keeps going down.
    assert final_loss(second.stdout) < final_loss(first.stdout)
    assert checkpoint_steps(checkpoint_dir) == [20]

    # Both runs logged to the same WandB run id (one offline run directory each).
    run_id = (checkpoint_dir / "wandb_id.txt").read_text().strip()
    run_dirs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 2 and all(d.name.endswith(f"-{run_id}") for d in run_dirs)


def test_existing_checkpoint_dir_needs_overwrite_or_resume(tmp_path: Path) -> None:
    checkpoint_dir = tmp_path / "ck" / "debug" / "x"
    checkpoint_dir.mkdir(parents=True)
    (checkpoint_dir / "stale.txt").write_text("from an earlier run")
    base = ["debug", "--exp-name=x", f"--checkpoint-base-dir={tmp_path / 'ck'}", "--no-wandb-enabled"]

    refused = train(tmp_path, *base)
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1, refused.stderr
    assert "already exists" in refused.stderr and "--overwrite" in refused.stderr
    assert "Traceback" not in refused.stderr + refused.stdout
    assert (checkpoint_dir / "stale.txt").exists()

    overwritten = train(tmp_path, *base, "--overwrite", "--num-train-steps=5")
    assert overwritten.returncode == 0, overwritten.stderr
    assert not (checkpoint_dir / "stale.txt").exists()
    assert checkpoint_steps(checkpoint_dir) == [5]


def test_grad_accum_must_divide_the_batch(tmp_path: Path) -> None:
    result = train(
        tmp_path,
        "debug",
        "--exp-name=g",
        "--batch-size=6",
        "--grad-accum-steps=4",
        f"--checkpoint-base-dir={tmp_path / 'ck'}",
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "--grad-accum-steps=4" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "ck").exists()


def test_grad_accum_trains(tmp_path: Path) -> None:
    result = train(
        tmp_path,
        "debug",
        "--exp-name=g",
        "--batch-size=8",
        "--grad-accum-steps=2",
        f"--checkpoint-base-dir={tmp_path / 'ck'}",
        "--no-wandb-enabled",
        env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.42"},
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # A wrapper's injected values are visible.
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.42" in out
    assert "batch_size=8 grad_accum_steps=2 micro_batch=4" in out
    steps = progress(out)
    assert steps[-1][0] == 30
    assert final_loss(out) < steps[0][1] - 1.0, out
    assert checkpoint_steps(tmp_path / "ck" / "debug" / "g") == [30]
    assert not (tmp_path / "wandb").exists()  # --no-wandb-enabled: wandb.init(mode="disabled")


@pytest.mark.parametrize("args", [["--help"], ["debug", "--help"]])
def test_help_lists_configs_and_fields(tmp_path: Path, args: list[str]) -> None:
    result = train(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    if args == ["--help"]:
        for name in ("debug", "debug_vit", "gpt_small", "gpt_small_bf16_remat", "vit_small", "gpt_medium_bf16_remat"):
            assert name in result.stdout
    else:
        for flag in (
            "--exp-name",
            "--batch-size",
            "--grad-accum-steps",
            "--num-train-steps",
            "--overwrite",
            "--resume",
            "--no-wandb-enabled",
        ):
            assert flag in result.stdout
