"""Cards that are not here: GPU target configs, deviceless compiles on the CPU, estimates.

The slow tests compile for real with jax's CUDA plugin on this CPU machine (``jaxfit[targets]``,
in the test extras): no GPU is used or needed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from helpers import FIXTURES, error_line

from jaxfit.errors import ConfigError
from jaxfit.fit import targets

# A small card keeps the tiny example's boundary in a few rounds: mlp-tiny on 256 MiB at 0.05.
SMALL = [
    "--example",
    "mlp-tiny",
    "--device-memory",
    "256MiB",
    "--mem-fraction",
    "0.05",
    "--multiple-of",
    "16",
    "--no-cache",
]


# -- pure logic -------------------------------------------------------------------------------------
def test_models_are_found_by_the_names_people_type():
    assert targets.find_model("rtx-a6000").name == "NVIDIA RTX A6000"
    assert targets.find_model("A6000") is targets.find_model("rtx_a6000")
    assert targets.find_model("h100").key == "h100-sxm"
    assert targets.find_model("NVIDIA H200").key == "h200"
    with pytest.raises(ConfigError, match=r"--gpu 'gtx-980' is no model jaxfit knows; known: rtx-4090, rtx-a6000"):
        targets.find_model("gtx-980")


def test_a_model_spec_sets_what_the_memory_analysis_depends_on():
    model = targets.find_model("rtx-pro-6000")
    text = model.spec_text(123)
    for field in ("core_count: 188", "memory_bandwidth: 1792000000000", "l2_cache_size: 134217728",
                  "device_memory_size: 123", "major: 12", 'device_description_str: "NVIDIA RTX PRO 6000 Blackwell"'):  # fmt: skip
        assert field in text
    assert targets.set_memory_size(text, 456).count("device_memory_size: 456") == 1
    assert targets.squeezed_size(800) == 1000 and targets.unsqueezed_size(100) == 800


def test_newer_spec_fields_an_older_jaxlib_cannot_read_are_dropped():
    text = (
        "# a comment\ngpu_device_info {\n  core_count: 4\n  collective_memory_granularity: 2097152\n"
        "  scalar_unit_description {\n    rate_infos {\n      key: 4\n    }\n  }\n  device_memory_size: 9\n"
        "  cuda_compute_capability {\n    major: 9\n  }\n}\n"
    )
    kept = targets.drop_unknown_fields(text)
    assert "collective_memory_granularity" not in kept and "rate_infos" not in kept and "comment" not in kept
    assert "core_count: 4" in kept and "device_memory_size: 9" in kept and "major: 9" in kept


def test_fields_older_jaxlibs_lack_are_dropped_only_when_asked():
    from jaxfit._probe.jaxfit_target import OLDER_JAXLIB_FIELDS

    text = "gpu_device_info {\n  thread_dim_limit_x: 1024\n  core_count: 4\n}\ncuda_compute_capability {\n  major: 9\n  feature_extension: ACCELERATED_FEATURES\n}\n"
    assert targets.drop_unknown_fields(text) == text  # jax 0.10.2 and newer read these
    older = targets.drop_unknown_fields(text, OLDER_JAXLIB_FIELDS)
    assert "thread_dim_limit_x" not in older and "feature_extension" not in older
    assert "core_count: 4" in older and "major: 9" in older


UNREADABLE = """
import sys
from jaxfit._probe.jaxfit_target import NoTopology, make_devices
from jaxfit.fit import targets
spec = targets.target_for(targets.find_model("rtx-a6000")).spec
field = sys.argv[1]
spec = spec.replace("gpu_device_info {", "gpu_device_info {\\n  %s: 2097152" % field, 1)
try:
    print("device:", make_devices(spec, 1)[0].device_kind)
except NoTopology as e:
    print("unreadable:", e.unreadable, str(e))
"""


@pytest.mark.slow  # needs jax's CUDA plugin (the test extra installs it; the sdist's fast tier has none)
@pytest.mark.parametrize(
    ("field", "expected"),
    [("collective_memory_granularity", "device: NVIDIA RTX A6000"), ("no_field_jaxfit_knows", "unreadable: True")],
)
def test_a_config_this_jaxlib_cannot_parse_is_read_again_without_the_newer_fields(field, expected):
    # jax 0.10.2 cannot parse collective_memory_granularity (a newer jaxlib can): either way devices
    # are made; a field nobody knows stays unreadable.
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", UNREADABLE, field], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1].startswith(expected), proc.stdout


def test_a_spec_file_that_is_not_one_or_has_no_size_is_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ConfigError, match="is not a GPU target config"):
        targets.read_spec(tmp_path / "notes.txt")
    (tmp_path / "nosize.txtpb").write_text("gpu_device_info {\n  cuda_compute_capability {\n    major: 8\n  }\n}\n")
    with pytest.raises(ConfigError, match="gives no device_memory_size; give the card's size with --device-memory"):
        targets.read_spec(tmp_path / "nosize.txtpb")
    assert targets.read_spec(tmp_path / "nosize.txtpb", 1 << 30).memory_bytes == 1 << 30
    with pytest.raises(ConfigError, match="cannot read it"):
        targets.read_spec(tmp_path / "missing.txtpb")


def test_deviceless_compiles_per_round_are_bounded_by_this_hosts_cores(monkeypatch):
    from jaxfit.fit.common import default_width
    from jaxfit.fit.compiler import DeviceInfo

    def info(topology: str) -> DeviceInfo:
        return DeviceInfo("gpu", "NVIDIA RTX A6000", 1, 1 << 30, True, 1 << 34, "0.10.2", topology)

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert default_width(info("real")) == 4  # a real GPU: untuned compiles overlap on its host
    assert default_width(info("target")) == 2  # compiled on these two cores
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert default_width(info("target")) == 4
    assert default_width(info("real")) == 4  # 16 GiB of host memory: no room to widen
    roomy = dataclasses.replace(info("real"), host_memory_bytes=128 << 30)
    assert default_width(roomy) == 8  # a GPU host of 16 cores and 128 GiB: eight at once
    assert default_width(dataclasses.replace(roomy, host_memory_bytes=64 << 30)) == 5  # five compiles of 12 GiB


# -- real deviceless compiles --------------------------------------------------------------------------
DIRECT = """
import json, sys
from jaxfit._probe.jaxfit_compile_server import memory_of, untuned_options
from jaxfit.examples import build_workload
from jaxfit.fit import mesh, targets
model, fraction, memory, batch = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
target = targets.target_for(targets.find_model(model), memory)
mesh.use_target_devices(target.spec_for(targets.squeezed_size(int(fraction * memory))), 1)
workload = mesh.shard_workload(build_workload("mlp-tiny", {}), mesh.MeshSpec())
compiled = workload.lower(batch).compile(compiler_options={"xla_gpu_autotune_level": 0, **untuned_options()})
print(json.dumps(memory_of(compiled)))
"""


def _direct_peak(model: str, batch: int) -> int:
    """The squeezed deviceless compile of mlp-tiny at ``batch``, made here without jaxfit's search."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", DIRECT, model, "0.05", str(256 << 20), str(batch)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    memory = json.loads(proc.stdout.strip().splitlines()[-1])
    return memory["argument_bytes"] + memory["output_bytes"] - memory["alias_bytes"] + memory["temp_bytes"]


@pytest.mark.slow
def test_two_gpu_models_give_different_repeatable_peaks_equal_to_a_direct_compile(run_cli, tmp_path):
    # Multiples of 256 from 2048: the boundary (5888 on an RTX A6000) in a few rounds.
    coarse = [
        *SMALL[: SMALL.index("--multiple-of")],
        "--multiple-of",
        "256",
        "--min-batch",
        "2048",
        "--max-batch",
        "8192",
    ]
    peaks = {}
    for model in ("rtx-a6000", "h100-sxm"):
        proc = run_cli("fit", *coarse, "--no-cache", "--gpu", model, "--json", f"{model}.json", timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        estimate = json.loads((tmp_path / f"{model}.json").read_text())
        assert estimate["estimate"] is True and estimate["target"]["name"] == targets.find_model(model).name
        squeezed = estimate["squeezed"]
        assert squeezed["device"]["topology"] == "target" and squeezed["pin"] is None
        assert estimate["batch_size"] <= estimate["squeezed_batch_size"]
        assert "An estimate of an untuned program" in proc.stdout.replace("\n", " ")
        answer = squeezed["batch_size"]
        assert 2048 < answer < 8192, answer  # a boundary inside the window, not its end
        peaks[model] = next(c["peak_bytes"] for c in squeezed["candidates"] if c["batch_size"] == answer)
        assert peaks[model] == _direct_peak(model, answer), model
    assert peaks["rtx-a6000"] != peaks["h100-sxm"]
    # Repeatable: a new process compiles the A6000's answer to the same peak.
    answer = json.loads((tmp_path / "rtx-a6000.json").read_text())["squeezed_batch_size"]
    window = ["--min-batch", str(answer), "--max-batch", str(answer)]
    again = run_cli("fit", *SMALL[: SMALL.index("--multiple-of")], *window, "--no-cache", "--gpu", "rtx-a6000",
                    "--json", "again.json", timeout=600)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    second = json.loads((tmp_path / "again.json").read_text())["squeezed"]
    assert [c["peak_bytes"] for c in second["candidates"] if c["batch_size"] == answer] == [peaks["rtx-a6000"]]


SCRIPT_DIRECT = """
import functools, importlib.util, json, sys
import jax, jax.numpy as jnp
from jaxfit._probe.jaxfit_compile_server import memory_of, untuned_options
from jaxfit.fit import mesh, targets
path, model, limit, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
spec = importlib.util.spec_from_file_location("mini_train", path)
mini = sys.modules["mini_train"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mini)
target = targets.target_for(targets.find_model(model), 64 << 20)
device = mesh.use_target_devices(target.spec_for(targets.squeezed_size(limit)), 1)[0]
placed = jax.sharding.SingleDeviceSharding(device)
on = lambda t: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=placed), t)
config = mini.Config(16, 256, 1)
state = jax.eval_shape(functools.partial(mini.init, config), jax.random.key(0))
rng = jax.eval_shape(lambda: jax.random.key(1))
data = (jax.ShapeDtypeStruct((batch, 64), jnp.float32), jax.ShapeDtypeStruct((batch,), jnp.int32))
step = jax.jit(functools.partial(mini.train_step, config), donate_argnums=(1,))
compiled = step.lower(on(rng), on(state), on(data)).compile(
    compiler_options={"xla_gpu_autotune_level": 0, **untuned_options()}
)
print(json.dumps(memory_of(compiled)))
"""


@pytest.mark.slow
def test_a_script_is_estimated_for_a_gpu_that_is_not_here_as_a_direct_compile_of_its_step(run_cli, tmp_path):
    """``fit --script --gpu``: the script runs on the CPU to its first step, which is exported for
    CUDA and compiled for the card's compile-only devices; its peak at the answer equals a direct
    ``jax.jit`` compile of the same step for those devices, made here without the script."""
    mini = str(FIXTURES / "mini_train.py")
    proc = run_cli(
        "fit", "--script", "--gpu", "rtx-a6000", "--device-memory", "64MiB", "--mem-fraction", "0.1",
        "--min-batch", "512", "--max-batch", "8192", "--multiple-of", "512", "--no-cache", "--json", "s.json",
        "--", sys.executable, mini, "--steps", "1",
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    estimate = json.loads((tmp_path / "s.json").read_text())
    assert estimate["estimate"] is True and estimate["squeezed"]["pin"] is None
    squeezed = estimate["squeezed"]
    assert squeezed["device"]["topology"] == "target" and squeezed["device"]["device_kind"] == "NVIDIA RTX A6000"
    assert "trained" not in proc.stdout + proc.stderr  # the probe never ran a step
    answer = squeezed["batch_size"]
    assert 512 <= answer < 8192, answer  # a boundary inside the range, not its end
    peak = next(c["peak_bytes"] for c in squeezed["candidates"] if c["batch_size"] == answer)
    direct = subprocess.run(
        [sys.executable, "-c", SCRIPT_DIRECT, mini, "rtx-a6000", str(int(0.1 * (64 << 20))), str(answer)],
        capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300,
    )  # fmt: skip
    assert direct.returncode == 0, direct.stderr[-2000:]
    memory = json.loads(direct.stdout.strip().splitlines()[-1])
    assert peak == memory["argument_bytes"] + memory["output_bytes"] - memory["alias_bytes"] + memory["temp_bytes"]


@pytest.mark.slow
def test_plan_for_gpu_models_writes_its_table_json_and_markdown(run_cli, tmp_path):
    proc = run_cli(
        "plan", "--example", "mlp-tiny", "--gpu", "rtx-a6000", "--mem-fraction", "0.00025", "--devices", "1",
        "--multiple-of", "16", "--no-cache", "--json", "plan.json", "--markdown", "hw.md", "--quiet", timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    (cell,) = plan["cells"]
    assert cell["card"] == "rtx-a6000" and cell["status"] == "estimate" and cell["batch_size"] > 0
    assert cell["squeezed_batch_size"] >= cell["batch_size"]
    assert "(est.)" in proc.stdout
    page = (tmp_path / "hw.md").read_text()
    assert "**Estimates for GPU models that were not here**" in page and "rtx-a6000" in page


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,message",
    [
        (["fit", "--gpu", "gtx-980"], "--gpu 'gtx-980' is no model jaxfit knows"),
        (["fit", "--gpu", "h100", "--gpu-spec", "x.txtpb"], "give --gpu MODEL or --gpu-spec FILE, not both"),
        (["fit", "--gpu-spec", "notes.txt"], "--gpu-spec notes.txt is not a GPU target config"),
        (["fit", "--gpu", "h100", "--device-memory", "lots"], "cannot read 'lots' as a memory size"),
        (["fit", "--gpu", "h100", "--batch-size", "8"], "--gpu estimates the largest batch"),
        (["plan", "--gpu", "gtx-980"], "--gpu 'gtx-980' is no model jaxfit knows"),
        (["gpus", "capture"], "capture needs a GPU, and JAX here runs on cpu"),
    ],
)
def test_bad_gpu_input_is_one_line(run_cli, tmp_path, args, message):
    (tmp_path / "notes.txt").write_text("not a spec")
    assert message in error_line(run_cli(*args))
