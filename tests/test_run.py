"""fit --script and run, with real subprocesses: the probe, the launch, wandb offline, signals, bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from helpers import FIXTURES, REPO, error_line
from wandb_offline import wandb_run

import jaxfit

pytestmark = pytest.mark.slow  # real subprocesses and compiles

TRAIN = str(REPO / "scripts" / "train.py")
SMALL = ["--device-memory", "64MiB", "--mem-fraction", "0.5"]


def test_probing_train_py_gives_the_peaks_of_the_api_fit(tmp_path, monkeypatch):
    options = jaxfit.FitOptions(mem_fraction=0.5, device_memory_bytes=64 << 20, max_batch=1 << 14)
    monkeypatch.chdir(tmp_path)
    probed = jaxfit.fit_batch(
        jaxfit.fit.sources.script_source(
            [sys.executable, TRAIN, "debug", "--exp-name=probe", f"--checkpoint-base-dir={tmp_path / 'ck'}"]
        ),
        options,
    )
    monkeypatch.chdir(FIXTURES)
    api = jaxfit.fit_batch(jaxfit.entry_source("train_entry:make_debug_workload"), options)
    assert probed.batch_size == api.batch_size
    assert {c.batch_size: c.peak_bytes for c in probed.candidates} == {
        c.batch_size: c.peak_bytes for c in api.candidates
    }
    assert probed.workload["name"] == "train_step"
    assert probed.workload["description"]["script_batch_size"] == 8  # the debug config's own batch


def test_the_probe_never_runs_a_step(run_cli):
    proc = run_cli(
        "fit",
        "--script",
        *SMALL,
        "--json",
        "out.json",
        "--",
        sys.executable,
        str(FIXTURES / "mini_train.py"),
        "--batch-size",
        "8",
    )
    assert proc.returncode == 0, proc.stderr
    assert "step 0" not in proc.stdout + proc.stderr and "trained" not in proc.stdout + proc.stderr
    assert "fits: peak" in proc.stdout


def test_run_trains_at_the_fitted_settings_and_logs_them_to_wandb(tmp_path, run_cli, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    checkpoints = tmp_path / "ck"
    proc = run_cli(
        "run",
        *SMALL,
        "--max-batch",
        "64",
        "--wandb-mode",
        "offline",
        f"--probe-arg=--checkpoint-base-dir={tmp_path / 'probe'}",
        "--",
        sys.executable,
        TRAIN,
        "debug",
        "--exp-name=r1",
        f"--checkpoint-base-dir={checkpoints}",
        "--num-train-steps=6",
        "--log-interval=3",
        "--save-interval=3",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.5" in proc.stdout
    assert "batch_size=64" in proc.stdout  # the fitted batch (capped by --max-batch), injected
    assert "done: 6 steps" in proc.stdout
    assert (checkpoints / "debug" / "r1" / "6").is_dir()
    _, config, history = wandb_run(tmp_path)
    assert config["batch_size"] == 64
    assert config["jaxfit"]["mem_fraction"] == 0.5 and config["jaxfit"]["batch_size"] == 64
    assert config["jaxfit"]["fitted"] is True and config["jaxfit"]["predicted_peak_bytes"] > 0
    assert config["jaxfit"]["candidates"]
    assert history


def test_run_with_given_settings_resumes_from_the_checkpoint(tmp_path, run_cli):
    base = [
        sys.executable,
        TRAIN,
        "debug",
        "--exp-name=r2",
        f"--checkpoint-base-dir={tmp_path}",
        "--no-wandb-enabled",
        "--log-interval=2",
        "--save-interval=4",
    ]
    first = run_cli("run", "--batch-size", "8", "--mem-fraction", "0.3", "--", *base, "--num-train-steps=4")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.3" in first.stdout and "batch_size=8" in first.stdout
    second = run_cli(
        "run", "--batch-size", "8", "--mem-fraction", "0.3", "--", *base, "--num-train-steps=8", "--resume"
    )
    assert second.returncode == 0, second.stderr[-2000:]
    assert "step 5/8" in second.stdout and "step 1/8" not in second.stdout
    assert "done: 8 steps" in second.stdout


def test_a_run_whose_jax_does_not_take_the_fraction_is_stopped_before_its_first_step(tmp_path, run_cli, monkeypatch):
    """On a GPU, jaxfit run tells the start-up hook the pool it expects (fraction x the GPU's total)
    and the run compares its allocator's limit with it before any step: here an emulated 8 GiB GPU
    whose jax takes 0.75 whatever the variable says (a growing pool, an unread spelling)."""
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_TOTAL", str(8 << 30))
    command = [sys.executable, TRAIN, "debug", "--exp-name=cap", f"--checkpoint-base-dir={tmp_path}"]
    command += ["--no-wandb-enabled", "--num-train-steps=2", "--log-interval=1", "--overwrite"]
    held = run_cli("run", "--batch-size", "8", "--mem-fraction", "0.3", "--", *command)
    assert held.returncode == 0 and "done: 2 steps" in held.stdout, held.stderr[-2000:]
    monkeypatch.setenv("JAXFIT_EMULATE_GPU_POOL", "0.75")
    refused = run_cli("run", "--batch-size", "8", "--mem-fraction", "0.3", "--", *command)
    assert refused.returncode == 76, refused.stderr[-2000:]
    assert (
        "jaxfit: error: GPU 0's pool is 6.00 GiB, which is not the memory pool jaxfit set (2.40 GiB)" in refused.stderr
    )
    assert "step 1/2" not in refused.stdout


def test_run_keeps_a_global_batch_by_accumulating_micro_batches_that_fit(tmp_path, run_cli):
    """--global-batch 32 with micro-batches of at most 8 (--max-batch): the script trains at
    --batch-size=32 --grad-accum-steps=4, and that accumulated step was compiled to prove it fits."""
    proc = run_cli(
        "run",
        *SMALL,
        "--max-batch",
        "8",
        "--global-batch",
        "32",
        "--json",
        "plan.json",
        f"--probe-arg=--checkpoint-base-dir={tmp_path / 'probe'}",
        "--probe-arg=--overwrite",  # probed twice
        "--",
        sys.executable,
        TRAIN,
        "debug",
        "--exp-name=g1",
        f"--checkpoint-base-dir={tmp_path / 'ck'}",
        "--no-wandb-enabled",
        "--num-train-steps=2",
        "--log-interval=1",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["command"][-2:] == ["--batch-size=32", "--grad-accum-steps=4"]
    assert plan["batch_size"] == 32 and plan["settings"]["grad_accum_steps"] == 4
    fit = plan["fit"]
    assert fit["batch_size"] == 32 and fit["multiple_of"] == 4 and fit["peak_bytes"] <= fit["budget_bytes"]
    assert [c["batch_size"] for c in fit["candidates"]] == [32]  # the accumulated step itself
    assert "batch 32 as 4 x 8" in proc.stderr
    assert "batch_size=32" in proc.stdout and "grad_accum_steps=4" in proc.stdout and "done: 2 steps" in proc.stdout


def test_run_returns_the_exit_code_of_the_command(run_cli):
    proc = run_cli(
        "run",
        "--batch-size",
        "8",
        "--mem-fraction",
        "0.3",
        "--",
        sys.executable,
        TRAIN,
        "debug",
        "--exp-name=x",
        "--grad-accum-steps=3",
    )
    assert proc.returncode == 2 and "error:" in proc.stderr


@pytest.mark.parametrize("sig,code,said", [(signal.SIGTERM, 7, "got SIGTERM"), (signal.SIGINT, 8, "got SIGINT")])
def test_run_forwards_signals_and_leaves_nothing_running(tmp_path, sig, code, said):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jaxfit.cli",
            "run",
            "--batch-size",
            "4",
            "--mem-fraction",
            "0.2",
            "--quiet",
            "--",
            sys.executable,
            str(FIXTURES / "sleeper.py"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    line = proc.stdout.readline()
    assert line.strip() == "ready batch=4", line + proc.stderr.read()
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == code and said in out
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "sleeper.py" not in ps


def test_fit_script_timeout_says_what_to_raise_and_kills_the_script(run_cli):
    """--probe-timeout 3: the script, still in its start-up (nothing jitted), is stopped at once when
    the time is up (it cannot read a request to quit: asking first waited another 10 s), and the
    error says to wait longer."""
    marker = "jaxfit_probe_timeout_marker"
    started = time.monotonic()
    proc = run_cli(
        "fit",
        "--script",
        "--probe-timeout",
        "3",
        "--",
        sys.executable,
        "-c",
        f"import time; {marker} = 1; time.sleep(120)",
        "--batch-size=1",  # carried: no --help check (the script parses no flags)
    )
    took = time.monotonic() - started
    line = error_line(proc)
    assert "timed out after 3 s" in line and "raise --probe-timeout (now 3 s)" in line
    assert took < 10, f"{took:.1f} s for a 3 s --probe-timeout"
    time.sleep(0.5)
    assert marker not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["run", "--", "no-such-command-jaxfit"], "command not found: 'no-such-command-jaxfit'"),
        (["run", "--mem-fraction", "0.3"], "no command given after --"),
        (
            [
                "run",
                "--batch-size",
                "8",
                "--mem-fraction",
                "0.3",
                "--",
                sys.executable,
                str(FIXTURES / "other_flag.py"),
            ],
            "--help does not mention --batch-size",
        ),
        (
            [
                "fit",
                "--script",
                "--step-name",
                "not_the_step",
                *SMALL,
                "--",
                sys.executable,
                str(FIXTURES / "mini_train.py"),
            ],
            "jitted functions it called (times, what they do): init (1), train_step (1, train step)",
        ),
        (
            ["fit", "--script", *SMALL, "--", sys.executable, str(FIXTURES / "mini_train.py"), "--fail-before-step"],
            "the script exited (code 1)",
        ),
        (
            [
                "run",
                "--global-batch",
                "30",
                "--batch-size",
                "8",
                "--mem-fraction",
                "0.3",
                "--",
                sys.executable,
                TRAIN,
                "debug",
                "--exp-name=x",
            ],
            "--global-batch 30 is not a multiple of --batch-size 8",
        ),
        (
            [
                "run",
                "--global-batch",
                "16",
                "--batch-size",
                "8",
                "--mem-fraction",
                "0.3",
                "--",
                sys.executable,
                str(FIXTURES / "mini_train.py"),
            ],
            "--help does not mention --grad-accum-steps; --global-batch needs",
        ),
    ],
)
def test_run_and_probe_bad_input(run_cli, args, message):
    proc = run_cli(*args)
    assert message in error_line(proc)


def test_probe_failure_shows_the_scripts_output(run_cli):
    proc = run_cli(
        "fit", "--script", *SMALL, "--", sys.executable, str(FIXTURES / "mini_train.py"), "--fail-before-step"
    )
    assert "loading data failed: no such file" in proc.stderr


def test_batch_must_divide_by_the_device_count(run_cli, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    proc = run_cli(
        "run", "--batch-size", "7", "--mem-fraction", "0.3", "--", sys.executable, TRAIN, "debug", "--exp-name=x"
    )
    assert "does not divide by the 2 visible devices" in error_line(proc)


def test_fit_wandb_logs_the_candidates_offline(tmp_path, run_cli, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    proc = run_cli(
        "fit", "--example", "mlp-tiny", "--device-memory", "8MiB", "--wandb", "--wandb-mode", "offline", "--quiet"
    )
    assert proc.returncode == 0, proc.stderr
    _, config, history = wandb_run(tmp_path)
    assert config["jaxfit"]["mode"] == "batch" and config["jaxfit"]["mem_fraction"] == 0.45
    (row,) = [row for row in history if "candidates/_type" in row]
    assert row["candidates/_type"] == "table-file" and row["candidates/ncols"] == 12
    (table_file,) = (tmp_path / "wandb").glob("offline-run-*/files/" + row["candidates/path"])
    table = json.loads(table_file.read_text())
    assert len(table["data"]) == row["candidates/nrows"] >= 4
    assert "peak_bytes" in table["columns"] and "fits" in table["columns"]


def test_probe_works_in_an_old_jax_environment_without_jaxfit(tmp_path, run_cli, old_jax_python):
    """openpi pins old jax (0.5) in its own environment: the probe must need neither jaxfit nor new jax."""
    python = old_jax_python
    assert subprocess.run([python, "-c", "import jaxfit"], capture_output=True, cwd=tmp_path).returncode != 0
    proc = run_cli(
        "fit",
        "--script",
        *SMALL,
        "--json",
        "old.json",
        "--",
        python,
        str(FIXTURES / "mini_train.py"),
        "--batch-size",
        "8",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "old.json").read_text())
    assert result["device"]["jax_version"] == "0.5.0"
    assert result["outcome"] == "boundary" and result["workload"]["name"] == "train_step"
