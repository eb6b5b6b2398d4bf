"""Trainers as they are written today, unmodified: flax NNX's ``nnx.jit`` (graph mode, flax's
default, and with ``NNX_GRAPH_UPDATES=false``), equinox's ``filter_jit``, a trainer that saves a
real orbax checkpoint before its first step, and one that never jits its step.

Each fixture appends a line to ``$FIXTURE_STEPS_FILE`` per train step that ran: a probe must
never let one run. Real subprocesses, real flax/equinox/orbax compiles on the CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import jax
import jax.numpy as jnp
import pytest
from helpers import FIXTURES, error_line

pytestmark = pytest.mark.slow  # real subprocesses and compiles

FIT = ["--device-memory", "64MiB", "--mem-fraction", "0.1", "--max-batch", "65536"]


def _module(name: str):
    """A fixture script, imported as a module (its ``main`` not run)."""
    spec = importlib.util.spec_from_file_location(f"fixture_{name}", FIXTURES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _peak(compiled) -> int:
    m = compiled.memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes


def _steps_file(tmp_path, monkeypatch):
    """The fixtures' count of train steps that ran, made before the probe (a file the probe did not
    create is no leftover of its)."""
    steps = tmp_path / "steps.txt"
    steps.write_text("")
    monkeypatch.setenv("FIXTURE_STEPS_FILE", str(steps))
    return steps


def _fit(run_cli, tmp_path, script: str, *flags: str, name: str = "fit.json") -> dict:
    proc = run_cli("fit", "--script", *FIT, "--json", name, "--", sys.executable, str(FIXTURES / script), *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fit = json.loads((tmp_path / name).read_text())
    fit["_stderr"] = proc.stderr
    return fit


def _candidate_peak(fit: dict, batch: int) -> int:
    return next(c["peak_bytes"] for c in fit["candidates"] if c["batch_size"] == batch)


@pytest.mark.parametrize("graph_updates", ["true", "false"])
def test_an_nnx_trainer_is_proved_pinned_and_cached_without_training_in_the_probe(
    tmp_path, run_cli, monkeypatch, graph_updates
):
    """flax's default (graph mode) once failed every compile: the step was lowered again on a compile
    thread, where flax's thread-local update context is not; with graph updates off its train step
    was labelled an evaluation (the updated state sits a level deeper in nnx's output)."""
    monkeypatch.setenv("NNX_GRAPH_UPDATES", graph_updates)
    steps = _steps_file(tmp_path, monkeypatch)
    fit = _fit(run_cli, tmp_path, "nnx_train.py", "--width", "64")
    assert steps.read_text() == "", "a train step ran inside the probe"
    assert fit["step_name"] == "train_step" and fit["outcome"] == "boundary"
    kind = fit["workload"]["description"]["step_kind"]
    assert kind["updates_state"] is True and kind["kind"] == "train step", kind
    assert "looks like an evaluation" not in fit["message"]

    # the answer is the step's own compile, to the byte, on both sides
    nnx_train = _module("nnx_train")
    from flax import nnx

    model = nnx_train.MLP(32, 64, 10, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, nnx_train.optax.adamw(1e-3), wrt=nnx.Param)
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))
    model.train()
    for batch in (fit["batch_size"], fit["batch_size"] + 1):
        data = {"x": jax.ShapeDtypeStruct((batch, 32), jnp.float32), "y": jax.ShapeDtypeStruct((batch,), jnp.int32)}
        step = nnx.jit(nnx_train.train_step.__wrapped__, graph_updates=graph_updates == "true")
        direct = _peak(step.lower(model, optimizer, metrics, data).compile())
        assert direct == _candidate_peak(fit, batch), (batch, direct)

    again = run_cli("fit", "--script", *FIT, "--", sys.executable, str(FIXTURES / "nnx_train.py"), "--width", "64")
    assert again.returncode == 0 and "answered from the cache" in again.stderr, again.stderr[-2000:]

    run = run_cli(
        "run", *FIT, "--wandb-mode", "disabled", "--json", "run.json", "--", sys.executable,
        str(FIXTURES / "nnx_train.py"), "--width", "64", "--steps", "3",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["program_pinned"] is True and report["run"]["program_pinned"] is True
    assert report["run"]["step_calls"] == 3 and steps.read_text().count("step") == 3


def test_the_graph_updates_switch_is_part_of_the_cache_key(tmp_path, run_cli, monkeypatch):
    """An answer fitted with NNX_GRAPH_UPDATES=false is another program's: never served without it."""
    from jaxfit.fit.sources import script_environment

    assert script_environment({"NNX_GRAPH_UPDATES": "false", "FLAX_X": "1", "EQX_ON_ERROR": "nan", "HOME": "/h"}) == {
        "NNX_GRAPH_UPDATES": "false",
        "FLAX_X": "1",
        "EQX_ON_ERROR": "nan",
    }


def test_an_equinox_trainer_is_seen_through_filter_jit(tmp_path, run_cli, monkeypatch):
    """equinox's filter_jit calls jax.jit inside equinox, which the probe once skipped as a library:
    it trained the whole script, then said the script jitted no function."""
    steps = _steps_file(tmp_path, monkeypatch)
    fit = _fit(run_cli, tmp_path, "eqx_train.py", "--width", "64", "--steps", "50")
    assert steps.read_text() == "", "a train step ran inside the probe"
    assert fit["step_name"] == "make_step" and fit["outcome"] == "boundary"
    assert fit["workload"]["description"]["step_kind"]["kind"] == "train step"
    names = {c["name"] for c in fit["breakdown"]}
    assert {"batch", "model.layers", "opt_state.0"} <= names, names
    categories = {c["name"]: c["category"] for c in fit["breakdown"]}
    assert categories["model.layers"] == "parameters" and categories["opt_state.0"] == "optimizer state"

    eqx_train = _module("eqx_train")
    import equinox as eqx

    model = eqx.nn.MLP(in_size=16, out_size=1, width_size=64, depth=2, key=jax.random.key(0))
    opt_state = eqx_train.optim.init(eqx.filter(model, eqx.is_array))
    for batch in (fit["batch_size"], fit["batch_size"] + 1):
        x, y = jnp.zeros((batch, 16)), jnp.zeros((batch, 1))  # equinox takes what is not an array as static
        lowered = eqx.filter_jit(eqx_train.make_step.__wrapped__).lower(model, opt_state, x, y)
        assert _peak(lowered.lowered.compile()) == _candidate_peak(fit, batch), batch

    # --step-name is the user's name, not the library's wrapper
    named = run_cli(
        "fit", "--script", *FIT, "--step-name", "make_step", "--no-cache", "--", sys.executable,
        str(FIXTURES / "eqx_train.py"), "--width", "64",
    )  # fmt: skip
    assert named.returncode == 0 and f"batch {fit['batch_size']} fits" in named.stdout, named.stderr[-2000:]

    run = run_cli(
        "run", *FIT, "--wandb-mode", "disabled", "--json", "run.json", "--", sys.executable,
        str(FIXTURES / "eqx_train.py"), "--width", "64", "--steps", "7",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["run"]["program_pinned"] is True and report["run"]["step_calls"] == 7
    assert steps.read_text().count("step") == 7


@pytest.mark.parametrize("through", ["jax", "nnx"])
def test_a_step_that_is_not_jitted_is_stopped_at_its_first_gradient(tmp_path, run_cli, monkeypatch, through):
    steps = _steps_file(tmp_path, monkeypatch)
    proc = run_cli(
        "fit", "--script", *FIT, "--", sys.executable, str(FIXTURES / "unjitted_train.py"), "--through", through
    )
    line = error_line(proc)
    assert "takes a gradient (jax.value_and_grad) outside any jitted function, in main (unjitted_train.py:" in line
    assert "jit the step (jax.jit, flax's nnx.jit or equinox's filter_jit)" in line
    assert steps.read_text() == "" and "step 0 loss" not in proc.stdout + proc.stderr


def test_a_checkpoint_saved_before_the_first_step_goes_with_its_array_data(tmp_path, run_cli, monkeypatch):
    """orbax writes its arrays from C++ (tensorstore): the clean-up once removed only what Python
    wrote, the real run restored the half-deleted step-0 checkpoint and crashed."""
    steps = _steps_file(tmp_path, monkeypatch)
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    (outputs / "notes.txt").write_text("mine\n")
    work = outputs / "work"
    fit = _fit(run_cli, tmp_path, "orbax_first_train.py", f"--workdir={work}")
    assert steps.read_text() == ""
    assert not work.exists(), sorted(str(p) for p in work.rglob("*"))
    assert sorted(p.name for p in outputs.iterdir()) == ["notes.txt"]
    assert "removed what the probe's start-up created: outputs/work" in fit["message"], fit["message"]

    run = run_cli(
        "run", *FIT, "--wandb-mode", "disabled", "--json", "run.json", "--", sys.executable,
        str(FIXTURES / "orbax_first_train.py"), f"--workdir={work}",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "saved checkpoint 0" in run.stdout and "restored" not in run.stdout
    assert json.loads((tmp_path / "run.json").read_text())["run"]["program_pinned"] is True


def test_a_folder_written_after_the_probe_or_held_open_stays():
    """The whole-folder removal is for what nothing else touches: a file changed after the probes
    ended, or a file another live process holds open, keeps the folder (cleaned entry by entry)."""
    import subprocess
    import tempfile
    import time

    from jaxfit.fit import leftovers

    with tempfile.TemporaryDirectory() as root:
        folder = os.path.join(root, "ck")
        os.makedirs(os.path.join(folder, "state"))
        with open(os.path.join(folder, "state", "data"), "wb") as f:
            f.write(b"x" * 100)
        ended = time.time() + 60
        assert leftovers._whole(folder, ended)
        assert not leftovers._whole(folder, time.time() - 60)  # written after the probes ended
        holder = subprocess.Popen(
            [sys.executable, "-c", f"f = open({os.path.join(folder, 'state', 'data')!r}); import time; time.sleep(30)"]
        )
        try:
            deadline = time.time() + 10
            while not leftovers._open_by_others(folder) and time.time() < deadline:
                time.sleep(0.1)
            assert not leftovers._whole(folder, ended)
        finally:
            holder.kill()
            holder.wait()
        assert leftovers._whole(folder, ended)


def test_advice_names_the_flags_the_command_carries(tmp_path, run_cli):
    from jaxfit.fit.leftovers import redirect_advice

    script = str(FIXTURES / "eval_first_train.py")
    line = error_line(run_cli("fit", "--script", *FIT, "--", sys.executable, script, "--config.batch_size=2"))
    assert "the command carries --config.batch_size: pass --batch-flag=--config.batch_size" in line
    assert "put --batch-size=N" not in line
    kept = [str(tmp_path / "w" / "0" / "state")]
    assert redirect_advice(["python", "t.py", f"--config.workdir={tmp_path / 'w'}"], kept) == (
        "and point its outputs elsewhere while probing: --probe-arg=--config.workdir=/tmp/jaxfit-probe"
    )
    assert redirect_advice(["python", "t.py", "--out", str(tmp_path / "w")], kept).endswith(
        "--probe-arg=--out=/tmp/jaxfit-probe"
    )
    assert "--checkpoint-base-dir" not in redirect_advice(["python", "t.py", "--steps=3"], kept)


def test_a_tf_data_trainer_answers_from_the_cache_again(tmp_path, run_cli, monkeypatch):
    """TensorFlow's autograph writes the functions it converts into /tmp/__autograph_generated_file*.py
    modules: the manifest once recorded one as a source of the script, the clean-up removed it, and
    every repeat probed the script again ("... is gone")."""
    steps = _steps_file(tmp_path, monkeypatch)
    fit = _fit(run_cli, tmp_path, "tfdata_train.py")
    assert steps.read_text() == ""
    assert "__autograph_generated_file" in fit["message"], fit["message"]  # made by the probe, taken away
    again = run_cli("fit", "--script", *FIT, "--", sys.executable, str(FIXTURES / "tfdata_train.py"))
    assert again.returncode == 0 and "answered from the cache" in again.stderr, again.stderr[-2000:]
    assert f"batch {fit['batch_size']} fits" in again.stdout
