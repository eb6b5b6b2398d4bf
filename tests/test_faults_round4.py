"""Faults, bad input and trust, round four: each case as it was reported, with what jaxfit says now.

(The pins-as-code cases are in ``tests/test_pin_trust.py``, the unwritable cache in ``tests/test_pin.py``.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import FIXTURES, REPO, error_line, processes_with

from jaxfit.errors import ConfigError
from jaxfit.fit.command import PROBE_DIR
from jaxfit.fit.devices import PLATFORM_PLUGINS
from jaxfit.run.accumulation import accumulation_choices, divisors, next_accumulation
from jaxfit.schedule.queue_file import load_queue, parse_queue

TRAIN = str(REPO / "scripts" / "train.py")
MINI = str(FIXTURES / "mini_train.py")
TRAPS_SIGTERM = (
    "import argparse, signal, time\n"
    "argparse.ArgumentParser().add_argument('--batch-size'); p = argparse.ArgumentParser()\n"
    "p.add_argument('--batch-size'); p.parse_args()\n"
    "signal.signal(signal.SIGTERM, lambda *a: print('writing a last checkpoint', flush=True))\n"
    "print('training', flush=True)\n"
    "while True: time.sleep(0.1)\n"
)


# -- pure logic -------------------------------------------------------------------------------------
def test_divisors_are_found_up_to_the_square_root():
    start = time.perf_counter()
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert accumulation_choices(2**31 - 1, 8) == [2**31 - 1]  # a prime: one sample a micro-batch
    assert next_accumulation(64, 4) == 8 and next_accumulation(7, 7) is None
    assert len(divisors(2**31 - 2)) > 1
    assert time.perf_counter() - start < 2.0  # counting to the global batch took seconds at 10^8


def test_a_yaml_key_given_twice_is_refused_with_its_line(tmp_path):
    queue = tmp_path / "q.yaml"
    queue.write_text("experiments:\n  - name: a\n    command: [python, x.py]\n    name: b\n")
    with pytest.raises(ConfigError, match=r"line 4: 'name' is given twice \(first on line 2\); keep one of them"):
        load_queue(queue)


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("CUDA_VISIBLE_DEVICES", "3", "env CUDA_VISIBLE_DEVICES is the scheduler's to set: the plan places each run"),
        ("XLA_PYTHON_CLIENT_PREALLOCATE", "false", "env XLA_PYTHON_CLIENT_PREALLOCATE is the scheduler's to set"),
        ("JAX_PLATFORMS", "cuda", "env JAX_PLATFORMS is the scheduler's to set"),
        ("JAXFIT_PIN", "/tmp/x/pin.json", "env JAXFIT_PIN is the scheduler's to set: jaxfit's own"),
    ],
)
def test_a_queue_env_may_not_undo_what_the_scheduler_sets(key, value, message):
    with pytest.raises(ConfigError, match=message):
        parse_queue({"experiments": [{"name": "a", "command": ["python", "x.py"], "env": {key: value}}]}, "q.yaml")


@pytest.mark.slow
def test_a_queue_pythonpath_goes_after_the_hook(tmp_path, run_cli):
    """A queue's PYTHONPATH once replaced the start-up hook's folder: no pin, no guard, no pool check."""
    seen = tmp_path / "pythonpath.txt"
    code = f"import os; open({str(seen)!r}, 'w').write(os.environ['PYTHONPATH'])"
    (tmp_path / "q.yaml").write_text(
        "gpus: 1\ndevice_memory: 1GiB\nreserve: 0\nprocess_overhead: 0\nexperiments:\n"
        f"  - name: a\n    command: [{sys.executable!r}, -c, {code!r}]\n    batch: 8\n    fraction: 0.1\n"
        "    env: {PYTHONPATH: /elsewhere}\n"
    )
    proc = run_cli("schedule", "q.yaml", "--quiet", timeout=200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert seen.read_text().split(os.pathsep)[:2] == [PROBE_DIR, "/elsewhere"]


@pytest.mark.parametrize(
    "value,where",
    [(99999999999999999999, "batch"), (99999999999999999999, "global_batch")],
)
def test_a_queue_batch_beyond_any_device_is_refused(value, where):
    entry = {"name": "a", "command": ["python", "x.py"], "fraction": 0.1, where: value}
    with pytest.raises(ConfigError, match=f"{where}={value} is beyond any batch a device can hold"):
        parse_queue({"experiments": [entry]}, "q.yaml")


# -- the command line (real processes) ---------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "args,message",
    [
        (["run", "--global-batch", "99999999999999999999", "--", sys.executable, TRAIN, "debug", "--exp-name=x"],
         "--global-batch 99999999999999999999 is beyond any batch a device can hold; use at most 2147483647"),
        (["tune", "--global-batch", "99999999999999999999"], "--global-batch 99999999999999999999 is beyond any batch"),
        (["tune", "--example", "mlp-tiny", "--remat", "full"], "this example has no rematerialisation"),
        (["tune", "--script", "--axis=--remat=none,full", "--", sys.executable, TRAIN, "debug", "--exp-name=t", "--remat=dots"],
         "the command carries --remat=dots and --axis varies --remat; drop --remat=dots from the command"),
        (["run", "--batch-flag", "--bs;touch X", "--", sys.executable, MINI],
         "--batch-flag '--bs;touch X' must be a flag name (dashes, letters, digits, '_', '.', '-'), e.g. --batch-flag=--bs"),
        (["plan", "--example", "gpt-tiny", "--card", "24GB=24GiB"],
         "--card 24GB is one of the default cards; pass --no-default-cards"),
        (["plan", "--example", "gpt-tiny", "--markdown", "no-such-folder/hw.md"], "--markdown no-such-folder/hw.md:"),
        (["fit", "--example", "mlp-tiny", "--mem-fraction", "1e-12"],
         "--mem-fraction 1e-12 of"),
    ],
)  # fmt: skip
def test_each_reported_input_gets_one_line_that_says_what_to_do(run_cli, args, message):
    line = error_line(run_cli(*args, timeout=120))
    assert message in line, line
    assert "raise --mem-fraction" in line if "1e-12" in message else True
    assert "--headroom 0 B" not in line


@pytest.mark.slow
def test_a_folder_for_a_json_file_is_told_a_json_name(run_cli, tmp_path):
    folder = tmp_path / "out.x3Yz"
    folder.mkdir()
    line = error_line(run_cli("calibrate", "--json", str(folder)))
    assert f"give a file name such as {folder / 'out.json'}" in line


@pytest.mark.slow
def has_distribution(name: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def test_jax_platforms_naming_a_missing_plugin_is_one_line(run_cli, monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    line = error_line(run_cli("fit", "--example", "mlp-tiny"))
    assert "AssertionError" not in line
    if not any(has_distribution(name) for name in PLATFORM_PLUGINS["cuda"]):
        assert "JAX_PLATFORMS=cuda asks for cuda, but no jax plugin for it is installed here" in line
    else:  # the test extras install jax's CUDA plugin (for --gpu): it cannot start on a machine without a GPU
        assert line.startswith("jaxfit: error: JAX_PLATFORMS=cuda asks for a platform jax cannot start here")
        assert "unset JAX_PLATFORMS" in line


@pytest.mark.slow
def test_a_probe_that_times_out_while_starting_up_is_told_to_wait_longer(run_cli, tmp_path):
    slow = tmp_path / "slow.py"
    slow.write_text("import argparse, time\nargparse.ArgumentParser().parse_known_args()\ntime.sleep(60)\nimport jax\n")
    line = error_line(
        run_cli("fit", "--script", "--probe-timeout", "3", "--", sys.executable, str(slow), "--batch-size=8")
    )
    assert "nothing was jitted yet, so the script was still starting up: raise --probe-timeout (now 3 s)" in line
    assert "--step-name" not in line


@pytest.mark.slow
def test_run_gives_a_command_that_traps_sigterm_its_grace_then_kills_it(tmp_path):
    script = tmp_path / "traps.py"
    script.write_text(TRAPS_SIGTERM)
    marker = f"JAXFIT_TEST_GRACE={tmp_path.name}"
    env = dict(os.environ, JAXFIT_TEST_GRACE=tmp_path.name)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxfit.cli", "run", "--mem-fraction", "0.1", "--batch-size", "1", "--grace", "2",
         "--", sys.executable, str(script)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not [p for p in processes_with(marker) if p != str(proc.pid)]:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 137, err[-2000:]
    assert "writing a last checkpoint" in out and "had not ended 2 s after the signal; killed" in err
    time.sleep(0.5)
    assert not processes_with(marker)


@pytest.mark.slow
def test_the_training_process_dies_with_a_killed_jaxfit(tmp_path):
    """Under `timeout -k 5 8 jaxfit run ...` jaxfit was SIGKILLed and the trainer lived on, PPID 1."""
    script = tmp_path / "traps.py"
    script.write_text(TRAPS_SIGTERM)
    marker = f"JAXFIT_TEST_ORPHAN={tmp_path.name}"
    env = dict(os.environ, JAXFIT_TEST_ORPHAN=tmp_path.name)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxfit.cli", "run", "--mem-fraction", "0.1", "--batch-size", "1", "--", sys.executable,
         str(script)],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not [p for p in processes_with(marker) if p != str(proc.pid)]:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_with(marker), "the training process outlived jaxfit"


@pytest.mark.slow
def test_a_pin_made_for_another_question_is_named_and_checked_against_this_process(run_cli, tmp_path):
    """A gpt-tiny pin used by another script under a far smaller fraction once said "it fits" (the
    pin's budget), where the script's own pin stopped the same batch."""
    fit = run_cli(
        "fit", "--example", "mlp-tiny", "--device-memory", "64MiB", "--mem-fraction", "0.5", "--json", "f.json"
    )
    assert fit.returncode == 0, fit.stderr[-2000:]
    pin = json.loads((tmp_path / "f.json").read_text())["pin"]["path"]
    env = dict(
        os.environ,
        PYTHONPATH=PROBE_DIR,
        JAXFIT_PIN=pin,
        JAX_PLATFORMS="cpu",
        XLA_PYTHON_CLIENT_MEM_FRACTION="0.000001",
    )
    proc = subprocess.run(
        [sys.executable, MINI, "--batch-size", "64", "--steps", "1"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 75, (proc.returncode, proc.stderr[-2000:])
    assert "JAXFIT_PIN is a pin made for another question (fraction 0.5 in the fit, 1e-06 here" in proc.stderr
    assert "it fits" not in proc.stderr


@pytest.mark.slow
def test_run_json_carries_the_environment_that_loads_the_pin(run_cli, tmp_path):
    proc = run_cli(
        "run", "--device-memory", "64MiB", "--mem-fraction", "0.5", "--max-batch", "64", "--dry-run", "--json",
        "plan.json", "--", sys.executable, MINI, "--steps", "1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["pin"] and plan["env"]["JAXFIT_PIN"] == plan["pin"]["path"] and plan["env"]["PYTHONPATH"] == PROBE_DIR
