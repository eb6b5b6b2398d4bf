"""The step jaxfit proves is the train step: the function that returns the state it is given updated.

A trainer that evaluates on a few batches before it trains (``tests/fixtures/eval_first_train.py``:
absl flags with an ml_collections config, a jitted ``_evaluate`` without donation, then ``_update``
donating its state through ``donate_argnames``) once had its evaluation step proven: an answer
several times too large, and a run that claimed the pin while the train step ran unchecked.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
import pytest
from helpers import FIXTURES, error_line

from jaxfit._probe import jaxfit_steps

SCRIPT = str(FIXTURES / "eval_first_train.py")
SMALL = ["--device-memory", "64MiB", "--mem-fraction", "0.5", "--max-batch", "4096"]
FLAG = "--batch-flag=--config.batch_size"


# -- what a function does (pure: tracing only) ------------------------------------------------------
def _params():
    return {"w": jnp.ones((4, 8)), "b": jnp.zeros((8,))}


def _batch(n=3):
    return jnp.ones((n, 4)), jnp.zeros((n,), jnp.int32)


def _loss(params, batch):
    x, _ = batch
    return jnp.mean((x @ params["w"] + params["b"]) ** 2)


def _train(state, batch):
    params, opt_state = state
    grads = jax.grad(_loss)(params, batch)
    updates, opt_state = optax.sgd(0.1).update(grads, opt_state)
    return (optax.apply_updates(params, updates), opt_state), {"loss": _loss(params, batch)}


def _eval(state, batch):
    return {"loss": _loss(state[0], batch), "acc": jnp.float32(1.0)}


def _state():
    params = _params()
    return params, optax.sgd(0.1).init(params)


def _kind(fun, *args, **jit_kwargs):
    return jaxfit_steps.classify(jax.jit(fun, **jit_kwargs), args, {}, jaxfit_steps.donated_positions(fun, jit_kwargs))


def test_a_function_returning_its_state_updated_is_the_train_step():
    kind = _kind(_train, _state(), _batch())
    assert kind.updates_state and kind.state_arg == 0 and kind.batch_arg == 1 and kind.label == "train step"


def test_a_state_held_in_bfloat16_is_a_train_state():
    """numpy does not count bfloat16 as floating: a model held in bfloat16 (a built-in example with
    dtype=bfloat16) was taken for no train step, and its pinned runs said "not the train step"."""
    state = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _state())
    kind = _kind(_train, state, _batch())
    assert kind.updates_state and kind.label == "train step"


def test_an_evaluation_returning_metrics_is_no_train_step_even_when_called_first():
    kind = _kind(_eval, _state(), _batch())
    assert kind.step_like and not kind.updates_state and kind.label == "evaluation"


def test_params_and_optimizer_state_as_separate_arguments_are_found():
    def step(params, opt_state, batch):
        (params, opt_state), metrics = _train((params, opt_state), batch)
        return params, opt_state, metrics["loss"]

    assert _kind(step, *_state(), _batch()).updates_state


def test_a_state_tuple_returned_as_separate_outputs_is_found():
    def step(state, batch):
        (params, opt_state), metrics = _train(state, batch)
        return params, opt_state, metrics

    kind = _kind(step, _state(), _batch())
    assert kind.updates_state and kind.state_arg == 0 and "arrays of argument 0 updated" in kind.why


def test_a_returned_key_counter_or_loss_alone_is_no_state_update():
    def eval_with_key(key, params, step, batch):  # returns the key and the counter, not the params
        return jax.random.split(key)[0], step + 1, _loss(params, batch)

    kind = _kind(eval_with_key, jax.random.PRNGKey(0), _params(), jnp.int32(0), _batch())
    assert kind.step_like and not kind.updates_state


def test_a_data_transform_or_an_initialiser_is_no_step():
    assert not _kind(lambda batch: (batch[0] * 2, batch[1]), _batch()).step_like
    assert not _kind(lambda key: _params(), jax.random.PRNGKey(0)).step_like


def test_donate_argnames_are_read_through_a_partial():
    def update(config, state, batch):
        return _train(state, batch)

    fun = functools.partial(update, None)
    assert jaxfit_steps.donated_positions(fun, {"donate_argnames": "state"}) == (0,)
    assert jaxfit_steps.donated_positions(fun, {"donate_argnames": ("batch",), "donate_argnums": 0}) == (0, 1)
    kind = _kind(fun, _state(), _batch(), donate_argnames="state")
    assert kind.updates_state and kind.donated == (0,) and "donated" in kind.why


def test_a_donated_argument_that_is_not_returned_is_no_update():
    kind = _kind(_eval, _state(), _batch(), donate_argnums=(0,))
    assert kind.donated == (0,) and not kind.updates_state


# -- the probe and the pinned run on a trainer that evaluates first (real subprocesses) -------------
def _fit(run_cli, tmp_path: Path, *args: str, flags: tuple[str, ...] = ()) -> dict:
    proc = run_cli("fit", "--script", *SMALL, FLAG, *args, "--json", "fit.json", "--", sys.executable, SCRIPT, *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fit = json.loads((tmp_path / "fit.json").read_text())
    fit["_printed"] = proc.stdout.replace("\n", " ")
    return fit


@pytest.mark.slow
def test_the_train_step_is_proven_not_the_evaluation_that_runs_first(tmp_path, run_cli):
    found = _fit(run_cli, tmp_path)
    assert found["step_name"] == "_update" and found["step"]["chosen"] == "found"
    assert found["step"]["updates_state"] is True
    assert found["step"]["called"] == {"_evaluate": 3, "_update": 1}
    assert found["step"]["called_kinds"] == {"_evaluate": "evaluation", "_update": "train step"}
    assert found["pin"]["step_name"] == "_update"
    assert "proved: step '_update' (found: it returns " in found["_printed"]
    assert "arrays of argument 0 updated" in found["_printed"]
    assert "# loads the proven program of '_update'" in found["_printed"]
    named = _fit(run_cli, tmp_path, "--step-name", "_update")  # named after other calls: no refusal
    no_eval = _fit(run_cli, tmp_path, flags=("--config.eval_steps=0",))
    assert found["batch_size"] == named["batch_size"] == no_eval["batch_size"]
    assert found["peak_bytes"] == named["peak_bytes"] == no_eval["peak_bytes"]
    evaluation = _fit(run_cli, tmp_path, "--step-name", "_evaluate")  # what the old probe proved
    assert evaluation["batch_size"] > 2 * found["batch_size"] and evaluation["step"]["updates_state"] is False


@pytest.mark.slow
def test_run_pins_the_train_step_with_data_workers(tmp_path, run_cli):
    proc = run_cli("run", *SMALL, FLAG, "--json", "run.json", "--", sys.executable, SCRIPT, "--config.workers=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["program_pinned"] is True and run["pin"]["step_name"] == "_update"
    outcome = run["run"]
    assert outcome["pinned_step"] == "_update" and outcome["step_updates_state"] is True
    assert outcome["step_calls"] == 2 and outcome["step_repeated"] is True
    assert "the train step '_update' ran the proven program" in proc.stderr.replace("\n", " ")


@pytest.mark.slow
def test_a_run_whose_train_step_is_not_the_pinned_one_stops_before_it_trains(tmp_path, run_cli):
    proc = run_cli(
        "run",
        *SMALL,
        FLAG,
        "--step-name",
        "_evaluate",
        "--json",
        "run.json",
        "--",
        sys.executable,
        SCRIPT,
        f"--config.workdir={tmp_path / 'work'}",
    )
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert "step 0 loss" not in proc.stdout + proc.stderr  # stopped before _update ran
    run = json.loads((tmp_path / "run.json").read_text())
    outcome = run["run"]
    assert run["program_pinned"] is False and outcome["stopped"] and outcome["stopped_for"] == "step"
    assert outcome["other_train_steps"] == ["_update"] and outcome["step_updates_state"] is False
    assert "the training loop calls '_update', which updates the train state" in outcome["reason"]


@pytest.mark.slow
def test_a_script_that_only_evaluates_gets_one_line_naming_its_functions(tmp_path, run_cli):
    proc = run_cli("fit", "--script", *SMALL, FLAG, "--", sys.executable, SCRIPT, "--config.num_steps=0")
    line = error_line(proc)
    assert "the script exited (code 0)" in line
    assert "_evaluate (2, evaluation)" in line  # counts are reported at 1, 2, 4...
    assert "none of them updates the state it is given" in line


@pytest.mark.slow
def test_evaluation_before_training_is_bounded_in_time(tmp_path, run_cli, monkeypatch):
    monkeypatch.setenv("JAXFIT_PROBE_EVAL_SECONDS", "0")
    proc = run_cli("fit", "--script", *SMALL, FLAG, "--", sys.executable, SCRIPT, "--config.eval_steps=50")
    line = error_line(proc)
    assert "the script evaluated for over 0 s ('_evaluate', which returns no updated state)" in line
    assert "--probe-arg" in line and "_evaluate (2, evaluation)" in line
