"""A run sees only the devices it is given (openpi #327: JAX preallocates on every GPU it sees, so a
one-GPU run on a several-GPU host took memory on all of them). On a machine without GPUs the same
rule gives host devices, which these tests check with real runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import FIXTURES, error_line

from jaxfit.fit.devices import devices_environment

MINI = str(FIXTURES / "mini_train.py")


def _run(args: list[str], host_devices: int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={host_devices}")
    return subprocess.run(
        [sys.executable, "-m", "jaxfit.cli", "run", *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.slow
def test_run_with_gpus_sees_only_that_many_devices(tmp_path):
    command = ["--batch-size", "8", "--mem-fraction", "0.5", "--", sys.executable, MINI, "--steps", "1"]
    everything = _run(command, host_devices=4)
    assert everything.returncode == 0, everything.stderr
    assert "devices: 4" in everything.stdout
    one = _run(["--gpus", "1", *command], host_devices=4)
    assert one.returncode == 0, one.stderr
    assert "devices: 1" in one.stdout and "trained" in one.stdout
    two = _run(["--gpus", "2", "--dry-run", *command], host_devices=4)
    assert two.returncode == 0, two.stderr
    assert "--xla_force_host_platform_device_count=2" in two.stdout  # the environment it would run with


@pytest.mark.slow
def test_run_with_gpus_fits_on_those_devices_too(tmp_path):
    """The fit's probe sees the same devices as the run: the batch is split over the 2 given."""
    proc = _run(
        ["--gpus", "2", "--mem-fraction", "0.5", "--max-batch", "64", "--", sys.executable, MINI, "--steps", "1"],
        host_devices=4,
    )
    assert proc.returncode == 0, proc.stderr
    assert "devices: 2" in proc.stdout
    # a one-device step of a script that sees 2 devices: its pinned program is loaded on the one
    # device it was compiled for (loaded on both, it failed: "Expected ... 2 shards, got [1, 1, 1, 1]")
    assert "ran the proven program" in proc.stderr, proc.stderr


def test_bad_gpu_counts_are_one_line_errors():
    proc = _run(["--gpus", "0", "--batch-size", "8", "--mem-fraction", "0.5", "--", sys.executable, MINI], 2)
    assert proc.returncode == 2 and error_line(proc) == "jaxfit: error: --gpus 0 must be at least 1"


def test_devices_environment_on_a_machine_without_gpus(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=8")
    env = devices_environment(3)
    assert env["XLA_FLAGS"].split() == ["--xla_cpu_enable_fast_math=false", "--xla_force_host_platform_device_count=3"]
