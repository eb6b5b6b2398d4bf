"""A lean start-up (``fit --script --gpu``, :mod:`jaxfit._probe.jaxfit_lean`): the large outputs of
the jitted calls before the step are traced, not computed, and the estimate is the same."""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FIXTURES, REPO

from jaxfit._probe import jaxfit_lean


def _init(rng):
    return {
        "params": jax.random.normal(rng, (512, 1024)),  # 2 MiB: traced
        "step": jnp.int32(7),  # computed
        "key": jax.random.split(rng)[0],  # computed
    }


def test_a_lean_call_traces_its_large_outputs_and_computes_its_small_ones(monkeypatch):
    monkeypatch.setenv(jaxfit_lean.MIN_BYTES_ENV, str(2**20))
    devices = np.array(jax.devices()[:1])
    mesh = jax.sharding.Mesh(devices, ("data",))
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    jitted = jax.jit(_init, out_shardings={"params": sharded, "step": None, "key": None})
    rng = jax.random.key(3)
    outputs, left_out = jaxfit_lean.call(jitted, jax.jit, (rng,), {}, evaluation=False)
    real = jitted(rng)
    assert left_out == 512 * 1024 * 4
    params = outputs["params"]
    assert jaxfit_lean.is_stand_in(params) and params.shape == (512, 1024) and params.dtype == jnp.float32
    assert params.sharding == sharded  # placed as the call places it
    assert int(outputs["step"]) == 7 and isinstance(outputs["step"], jax.Array)
    assert np.array_equal(jax.random.key_data(outputs["key"]), jax.random.key_data(real["key"]))
    # a call taking a stand-in gets stand-ins back, all of them
    norm = jax.jit(lambda state: (jnp.sum(state["params"] ** 2), state["step"] + 1))
    (total, step), _ = jaxfit_lean.call(norm, jax.jit, (outputs,), {}, evaluation=False)
    assert jaxfit_lean.is_stand_in(total) and jaxfit_lean.is_stand_in(step)


def test_small_outputs_and_evaluations_on_real_arrays_run_as_they_are(monkeypatch):
    rng = jax.random.key(0)
    assert jaxfit_lean.call(jax.jit(_init), jax.jit, (rng,), {}, evaluation=False)[0] is jaxfit_lean.RUN  # < 64 MiB
    monkeypatch.setenv(jaxfit_lean.MIN_BYTES_ENV, "0")
    assert jaxfit_lean.call(jax.jit(_init), jax.jit, (rng,), {}, evaluation=True)[0] is jaxfit_lean.RUN


MINI = [sys.executable, str(FIXTURES / "mini_train.py"), "--steps", "1", "--width", "8192"]
FIT = ["fit", "--script", "--gpu", "rtx-a6000", "--device-memory", "1GiB", "--mem-fraction", "0.1",
       "--min-batch", "512", "--max-batch", "8192", "--multiple-of", "512", "--no-cache"]  # fmt: skip


def _answer(path) -> tuple:
    data = json.loads(path.read_text())
    peaks = [(c["batch_size"], c["peak_bytes"]) for side in ("squeezed", "safe") for c in data[side]["candidates"]]
    return data["batch_size"], data["squeezed_batch_size"], peaks


@pytest.mark.slow
def test_a_lean_start_up_gives_the_estimate_of_a_full_one_and_falls_back_to_one(run_cli, tmp_path, monkeypatch):
    """The script's init (w1 2 MiB, traced; w2 320 KiB, computed) is left out, the step compiled
    from the shapes: the same answers and peaks as the start-up run in full (--no-lean-start). A
    script that computes with its state before its step fails on a stand-in and is started again in
    full, with the same answer."""
    monkeypatch.setenv(jaxfit_lean.MIN_BYTES_ENV, str(2**20))  # the tiny state counts as large
    lean = run_cli(*FIT, "--json", "lean.json", "--", *MINI)
    assert lean.returncode == 0, lean.stderr[-3000:]
    assert "lean start-up: the outputs of init (2.00 MiB) were traced, not computed" in " ".join(lean.stderr.split())
    full = run_cli(*FIT, "--no-lean-start", "--json", "full.json", "--", *MINI)
    assert full.returncode == 0, full.stderr[-3000:]
    assert "lean start-up" not in " ".join(full.stderr.split())
    assert _answer(tmp_path / "lean.json") == _answer(tmp_path / "full.json")

    again = run_cli(*FIT, "--json", "again.json", "--", *MINI, "--norm-before-step")
    assert again.returncode == 0, again.stderr[-3000:]
    said = " ".join(again.stderr.split())
    assert "the script stopped before its step after a lean start-up (the outputs of init traced, not computed)" in said
    assert "TypeError" in said and "starting it again with its start-up run in full" in said
    assert _answer(tmp_path / "again.json") == _answer(tmp_path / "full.json")


@pytest.mark.slow
def test_a_lean_start_up_of_a_sharded_state_gives_the_plan_of_a_full_one(run_cli, tmp_path, monkeypatch):
    """scripts/train.py on two host devices with FSDP 2: its init's outputs come back as stand-ins
    sharded as the init shards them, and the plan's cell for an RTX 4090 x 2 is the full start-up's."""
    monkeypatch.setenv(jaxfit_lean.MIN_BYTES_ENV, "0")
    monkeypatch.setenv(jaxfit_lean.LEAF_BYTES_ENV, "4096")  # gpt-tiny's parameters count as large
    plan = ["plan", "--script", "--gpu", "rtx-4090", "--devices", "2", "--fsdp", "2", "--mem-fraction", "0.0005",
            "--max-batch", "256", "--multiple-of", "16", "--no-cache"]  # fmt: skip
    script = ["--", sys.executable, str(REPO / "scripts" / "train.py"), "debug", "--exp-name=lean", "--overwrite"]
    lean = run_cli(*plan, "--json", "lean.json", *script)
    assert lean.returncode == 0, lean.stderr[-3000:]
    said = " ".join(lean.stderr.split())
    assert "lean start-up: the outputs of init_train_state (984.00 KiB) were traced, not computed" in said
    assert "_synthetic_batch" not in said  # its outputs are all small: it ran
    full = run_cli(*plan, "--no-lean-start", "--json", "full.json", *script)
    assert full.returncode == 0, full.stderr[-3000:]

    def cells(name: str) -> list:
        data = json.loads((tmp_path / name).read_text())
        return [
            (c["devices"], c["fsdp"], c["batch_size"], c["squeezed_batch_size"], c["peak_bytes"]) for c in data["cells"]
        ]

    assert cells("lean.json") == cells("full.json") and cells("lean.json")[0][:2] == (2, 2)


@pytest.mark.slow
def test_a_flax_nnx_model_built_in_nnx_jit_starts_lean_and_one_evaluated_first_falls_back(
    run_cli, tmp_path, monkeypatch
):
    """flax NNX: a model built inside ``nnx.jit`` comes back with stand-ins in its variables, and an
    eager ``nnx.Optimizer`` is made from them; an evaluation before training (its metrics computed
    from stand-ins) fails, and the script starts again in full. The same answer both ways."""
    monkeypatch.setenv(jaxfit_lean.MIN_BYTES_ENV, "0")
    monkeypatch.setenv(jaxfit_lean.LEAF_BYTES_ENV, "4096")  # the two Linear kernels count as large
    fit = ["fit", "--script", "--gpu", "rtx-4090", "--mem-fraction", "0.0002", "--max-batch", "4096", "--no-cache"]
    nnx_script = ["--", sys.executable, str(FIXTURES / "nnx_train.py"), "--create-jitted"]
    lean = run_cli(*fit, "--json", "lean.json", *nnx_script, "--eval-batches", "0")
    assert lean.returncode == 0, lean.stderr[-3000:]
    said = " ".join(lean.stderr.split())
    assert "lean start-up: the outputs of <lambda> (42.00 KiB) were traced, not computed" in said
    assert "starting it again" not in said
    evaluated = run_cli(*fit, "--json", "evaluated.json", *nnx_script, "--eval-batches", "2")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    said = " ".join(evaluated.stderr.split())
    assert "the script stopped before its step after a lean start-up" in said
    assert "starting it again with its start-up run in full" in said
    assert _answer(tmp_path / "lean.json") == _answer(tmp_path / "evaluated.json")
