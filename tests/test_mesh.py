"""Fits on a mesh: data-parallel and FSDP steps on several host devices, their per-device peaks,
answers that split over the devices, scripts/train.py with --fsdp-devices, and bad meshes."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import FIXTURES, REPO, error_line

import jaxfit
from jaxfit.errors import ConfigError
from jaxfit.fit.mesh import MeshSpec, divisors

TRAIN = str(REPO / "scripts" / "train.py")
HOST_DEVICES = "--xla_force_host_platform_device_count=4"


# ---- pure logic (fast) ----------------------------------------------------------------------


def test_mesh_spec_axes_and_labels():
    assert MeshSpec(4, 2).axes() == {"batch": 2, "fsdp": 2}
    assert MeshSpec(4, 1).label() == "4 devices (data parallel)"
    assert MeshSpec(8, 8).label() == "8 devices (fsdp 8)"
    assert MeshSpec().label() == "1 device" and not MeshSpec().sharded
    assert divisors(12) == [1, 2, 3, 4, 6, 12]


@pytest.mark.parametrize(
    "spec,message",
    [
        (MeshSpec(4, 3), "--fsdp 3 does not divide --devices 4; use a divisor of 4 (1, 2, 4)"),
        (MeshSpec(0, 1), "--devices 0 must be at least 1"),
        (MeshSpec(2, 0), "--fsdp 0 must be at least 1"),
    ],
)
def test_bad_meshes_say_what_to_use(spec, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        spec.validate()


# ---- real compiles on 4 host devices ----------------------------------------------------------


def _fit_json(run_cli, tmp_path, *args: str, cwd=None) -> dict:
    out = tmp_path / f"fit-{len(list(tmp_path.glob('fit-*.json')))}.json"
    proc = run_cli("fit", *args, "--json", str(out), "--quiet", "--no-cache", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def _part(result: dict, name: str) -> dict:
    return next(c for c in result["breakdown"] if c["name"] == name)


@pytest.mark.slow
def test_fsdp_divides_the_state_per_device_and_data_parallel_does_not(run_cli, tmp_path):
    # An MLP of 1024-wide layers: its matrices are 4 MiB or more (sharded), its head (4.0 MB) and
    # vectors are smaller (replicated), as openpi's rule has it.
    common = ("--example", "mlp", "--set", "hidden_dim=1024", "--batch-size", "16", "--device-memory", "8GiB")
    one = _fit_json(run_cli, tmp_path, *common)
    dp = _fit_json(run_cli, tmp_path, *common, "--devices", "4")
    fsdp = _fit_json(run_cli, tmp_path, *common, "--devices", "4", "--fsdp", "4")

    assert (one["device_count"], one["mesh"]) == (1, {})
    assert (dp["device_count"], dp["mesh"]) == (4, {"batch": 4, "fsdp": 1})
    assert (fsdp["device_count"], fsdp["mesh"]) == (4, {"batch": 1, "fsdp": 4})
    assert fsdp["device"]["topology"] == "host"
    params = {name: _part(r, "state.params") for name, r in (("one", one), ("dp", dp), ("fsdp", fsdp))}
    whole = params["one"]["bytes"]
    # Data parallel: every device holds every parameter; the batch is split four ways.
    assert params["dp"]["bytes"] == params["dp"]["whole_bytes"] == whole
    assert _part(dp, "batch")["bytes"] * 4 == _part(one, "batch")["bytes"]
    # FSDP 4: the large matrices are split four ways, the head and the vectors stay whole.
    head = (1024 * 1000 + 1000) * 4
    assert params["fsdp"]["whole_bytes"] == whole
    assert params["fsdp"]["bytes"] == pytest.approx((whole - head) / 4 + head, rel=0.01)
    opt = _part(fsdp, "state.opt_state")
    assert opt["bytes"] == pytest.approx((opt["whole_bytes"] - 2 * head) / 4 + 2 * head, rel=0.01)
    # The compiled per-device peak falls with FSDP (on the CPU, data parallel's all-reduce
    # buffers make it higher than one device's: the compiler's numbers, not a rule of thumb).
    assert fsdp["peak_bytes"] < 0.6 * min(one["peak_bytes"], dp["peak_bytes"])
    assert sum(c["bytes"] for c in fsdp["breakdown"]) == fsdp["peak_bytes"]


@pytest.mark.slow
def test_the_answer_splits_over_the_devices(run_cli, tmp_path):
    result = _fit_json(
        run_cli, tmp_path, "--example", "mlp-tiny", "--devices", "4", "--fsdp", "2", "--max-batch", "30",
        "--device-memory", "1GiB",
    )  # fmt: skip
    assert result["batch_size"] == 28 and result["multiple_of"] == 4 and result["outcome"] == "max"
    assert all(c["batch_size"] % 4 == 0 for c in result["candidates"])


@pytest.mark.slow
def test_an_entry_workload_is_sharded_like_an_example(run_cli, tmp_path):
    result = _fit_json(
        run_cli, tmp_path, "--entry", "user_workloads:make_workload", "--devices", "2", "--fsdp", "2",
        "--fsdp-min-size", "1", "--batch-size", "8", "--device-memory", "1GiB", cwd=FIXTURES,
    )  # fmt: skip
    assert result["mesh"] == {"batch": 1, "fsdp": 2}
    w = _part(result, "state.w")
    assert w["bytes"] * 2 == w["whole_bytes"] == 256 * 256 * 4


@pytest.mark.slow
def test_a_script_is_fitted_on_its_own_fsdp_mesh(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", HOST_DEVICES)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    results = {}
    for fsdp in ("1", "2"):
        out = tmp_path / f"script-{fsdp}.json"
        proc = run_cli(
            "fit", "--script", "--batch-size", "8", "--no-cache", "--quiet", "--json", str(out), "--",
            sys.executable, TRAIN, "debug", "--exp-name=m", "--overwrite", f"--fsdp-devices={fsdp}",
            "--fsdp-min-bytes=1", f"--checkpoint-base-dir={tmp_path / 'ck'}",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        results[fsdp] = json.loads(out.read_text())
    assert results["1"]["mesh"] == {"batch": 4, "fsdp": 1} and results["2"]["mesh"] == {"batch": 2, "fsdp": 2}
    assert results["2"]["device_count"] == 4
    dp, fsdp2 = _part(results["1"], "state.params"), _part(results["2"], "state.params")
    assert dp["bytes"] == dp["whole_bytes"] == fsdp2["whole_bytes"]
    assert fsdp2["whole_bytes"] / 2 <= fsdp2["bytes"] < 0.6 * fsdp2["whole_bytes"]
    assert results["2"]["peak_bytes"] < results["1"]["peak_bytes"]


@pytest.mark.slow
def test_train_script_trains_and_resumes_with_fsdp(tmp_path):
    import os
    import subprocess

    env = dict(os.environ, XLA_FLAGS=HOST_DEVICES, WANDB_MODE="disabled")
    base = [sys.executable, TRAIN, "debug", "--exp-name=fsdp", "--fsdp-devices=2", "--fsdp-min-bytes=1",
            f"--checkpoint-base-dir={tmp_path}", "--log-interval=1", "--save-interval=2", "--no-wandb-enabled"]  # fmt: skip
    first = subprocess.run([*base, "--num-train-steps=2"], capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "devices=4 (cpu) fsdp_devices=2" in first.stdout
    again = subprocess.run(
        [*base, "--num-train-steps=4", "--resume"], capture_output=True, text=True, env=env, timeout=300
    )
    assert again.returncode == 0, again.stderr
    assert "resuming from step 2" in again.stdout and "step 4/4" in again.stdout
    bad = subprocess.run([*base, "--fsdp-devices=3", "--overwrite"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: --fsdp-devices=3 does not divide the 4 devices; use one of 1, 2, 4"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,message",
    [
        (["--devices", "4", "--fsdp", "3"], "--fsdp 3 does not divide --devices 4; use a divisor of 4"),
        (["--devices", "0"], "--devices 0 must be at least 1"),
        (
            ["--devices", "2", "--script", "--", sys.executable, TRAIN],
            "--devices/--fsdp apply to --example and --entry",
        ),
        (
            ["--example", "mlp-tiny", "--devices", "4", "--batch-size", "6"],
            "--batch-size 6 does not split over the 4 devices of the mesh; use a multiple of 4",
        ),
        (
            ["--example", "mlp-tiny", "--devices", "4", "--max-batch", "3"],
            "no multiple of 4 lies in [1, 3]; raise --max-batch to 4",
        ),
    ],
)
def test_bad_meshes_are_one_line(run_cli, args, message):
    assert message in error_line(run_cli("fit", *args))


def test_mesh_spec_is_public():
    assert jaxfit.MeshSpec is MeshSpec
    assert jaxfit.example_source("mlp-tiny", mesh=MeshSpec(2, 2)).mesh == MeshSpec(2, 2)
