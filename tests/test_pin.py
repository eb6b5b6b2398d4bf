"""The proven program runs: pins, the start-up hook that loads them, and its guard (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO, error_line

import jaxfit
from jaxfit.run.launch import execute, plan_run

pytestmark = pytest.mark.slow  # real subprocesses and compiles

TRAIN = str(REPO / "scripts" / "train.py")
SHAPED = str(FIXTURES / "shaped_train.py")
SMALL = ["--device-memory", "64MiB", "--mem-fraction", "0.5"]


def _fit_json(run_cli, tmp_path: Path, *command: str, extra: tuple[str, ...] = ()) -> dict:
    proc = run_cli("fit", "--script", *SMALL, *extra, "--json", "fit.json", "--", *command)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / "fit.json").read_text())


def _run_by_hand(
    tmp_path: Path, fit: dict, command: list[str], **extra_env: str
) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``command`` in a shell of one's own with the environment the fit printed (``env``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXFIT_PIN")}
    env.update(fit["env"])
    env["PYTHONPATH"] = fit["env"]["PYTHONPATH"] + os.pathsep + os.environ.get("PYTHONPATH", "")
    env["JAXFIT_PIN_REPORT"] = str(tmp_path / "report.json")
    env.update(extra_env)
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    report = json.loads((tmp_path / "report.json").read_text()) if (tmp_path / "report.json").exists() else {}
    return proc, report


def test_run_on_train_py_loads_the_pinned_program(tmp_path, run_cli, monkeypatch):
    """The training child of ``jaxfit run`` runs the executable the fit proved (nothing recompiled)."""
    proc = run_cli(
        "run",
        *SMALL,
        "--max-batch",
        "48",
        "--json",
        "plan.json",
        "--wandb-mode",
        "disabled",
        "--",
        sys.executable,
        TRAIN,
        "debug",
        "--exp-name=pin",
        f"--checkpoint-base-dir={tmp_path / 'ck'}",
        "--num-train-steps=3",
        "--log-interval=1",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["program_pinned"] is True and plan["run"]["program_pinned"] is True
    assert plan["pinned_peak_bytes"] == plan["fit"]["peak_bytes"] == plan["run"]["program_peak_bytes"]
    assert plan["pin"]["batch_size"] == plan["batch_size"] == 48
    assert "runs the program jaxfit proved" in proc.stderr and "done: 3 steps" in proc.stdout
    assert "the train step 'train_step' ran the proven program" in proc.stderr.replace("\n", " ")
    assert plan["pinned_step"] == "train_step" and plan["pinned_step_repeated"] is True


def test_the_fit_prints_the_environment_that_reproduces_the_proven_program(tmp_path, run_cli):
    """Manual use: the ``env`` of ``--json`` (and the "run with:" line) load the pin in one's own shell."""
    command = [sys.executable, SHAPED, "--steps", "2"]
    fit = _fit_json(run_cli, tmp_path, *command, extra=("--max-batch", "64"))
    assert fit["pin"] and fit["pin_note"] is None
    # the key that signed the pin, named because this test's cache is not the default one
    assert set(fit["env"]) == {"XLA_PYTHON_CLIENT_MEM_FRACTION", "PYTHONPATH", "JAXFIT_PIN", "JAXFIT_PIN_KEY"}
    proc, report = _run_by_hand(tmp_path, fit, [*command, f"--batch-size={fit['batch_size']}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["program_pinned"] is True and report["pinned_peak_bytes"] == fit["peak_bytes"]
    printed = run_cli("fit", "--script", *SMALL, "--max-batch", "64", "--", *command).stdout.replace("\n", "")
    run_with = printed.split("run with: ")[1]
    assert run_with.startswith("XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 PYTHONPATH=") and "JAXFIT_PIN=" in run_with
    assert f"shaped_train.py --steps 2 --batch-size={fit['batch_size']}" in run_with


@pytest.mark.parametrize("change", ["xla_flags", "batch"])
def test_a_changed_flag_or_batch_is_reported_not_pinned(tmp_path, run_cli, change):
    command = [sys.executable, SHAPED, "--steps", "2"]
    fit = _fit_json(run_cli, tmp_path, *command, extra=("--max-batch", "64"))
    batch = fit["batch_size"] if change == "xla_flags" else fit["batch_size"] // 2
    extra = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"} if change == "xla_flags" else {}
    proc, report = _run_by_hand(tmp_path, fit, [*command, f"--batch-size={batch}"], **extra)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["program_pinned"] is False and report["stopped"] is False
    assert ("XLA_FLAGS" if change == "xla_flags" else "another program") in report["reason"]
    assert report["program_peak_bytes"] <= report["budget_bytes"]
    assert "is not the program jaxfit proved" in proc.stderr and "step 1" in proc.stdout


def test_the_guard_stops_a_recompiled_step_that_does_not_fit_before_its_first_step(tmp_path, run_cli):
    command = [sys.executable, SHAPED, "--steps", "2"]
    fit = _fit_json(run_cli, tmp_path, *command)
    proc, report = _run_by_hand(tmp_path, fit, [*command, f"--batch-size={fit['batch_size'] * 4}"])
    assert proc.returncode == 75
    lines = [line for line in proc.stderr.splitlines() if line.startswith("jaxfit: error:")]
    assert len(lines) == 1 and "does not fit the budget jaxfit proved" in lines[0], proc.stderr[-2000:]
    assert "step 0" not in proc.stdout and "Traceback" not in proc.stderr
    assert report["stopped"] is True and report["program_peak_bytes"] > report["budget_bytes"]


def test_run_reports_the_guard_stop(tmp_path, monkeypatch):
    """``jaxfit run`` (API): a step whose own program does not fit is stopped and said so."""
    monkeypatch.chdir(tmp_path)
    options = jaxfit.FitOptions(mem_fraction=0.5, device_memory_bytes=64 << 20, max_batch=64)
    plan = plan_run(jaxfit.fit.sources.script_source([sys.executable, SHAPED, "--steps", "2"]), options)
    assert plan.pin is not None
    bigger = [*plan.command[:-1], "--batch-size=60000"]  # the user edited the batch after the fit
    outcome = execute(type(plan)(bigger, plan.env, plan.mem_fraction, 60000, plan.settings, plan.fit))
    assert outcome.exit_code == 75 and outcome.stopped and not outcome.program_pinned
    assert "stopped before its first step" in outcome.summary()


def test_a_damaged_pin_runs_the_step_checked_not_pinned(tmp_path, run_cli):
    command = [sys.executable, SHAPED, "--steps", "2"]
    fit = _fit_json(run_cli, tmp_path, *command, extra=("--max-batch", "64"))
    executable = Path(fit["pin"]["path"]).parent / "executable.bin"
    executable.write_bytes(executable.read_bytes()[:100])
    proc, report = _run_by_hand(tmp_path, fit, [*command, f"--batch-size={fit['batch_size']}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["program_pinned"] is False and "could not be loaded" in report["reason"]


def test_an_unwritable_cache_folder_answers_pinned_in_the_private_temporary_folder(tmp_path, run_cli, monkeypatch):
    """It once answered unpinned ("cannot write to .../pins") where --no-cache would pin."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("JAXFIT_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    proc = run_cli("fit", "--example", "mlp-tiny", "--device-memory", "8MiB", "--json", "fit.json")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    fit = json.loads((tmp_path / "fit.json").read_text())
    private = tmp_path / f"jaxfit-pins-{os.getuid()}"
    assert fit["pin"]["path"].startswith(str(private)) and f"pinned in {private}" in fit["pin_note"]
    assert len([line for line in proc.stderr.splitlines() if "cache" in line and "warning" in line]) == 1


def test_a_corrupt_cache_file_is_moved_aside_with_one_warning(tmp_path, run_cli, isolated_cache):
    isolated_cache.mkdir(parents=True)
    (isolated_cache / "cache.sqlite3").write_bytes(b"this is not a database" * 100)
    proc = run_cli("fit", "--example", "mlp-tiny", "--device-memory", "8MiB", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "fits" in proc.stdout
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "moved it aside" in warnings[0]
    assert list(isolated_cache.glob("cache.sqlite3.corrupt-*"))
    again = run_cli("fit", "--example", "mlp-tiny", "--device-memory", "8MiB", "--quiet")
    assert again.returncode == 0 and "warning" not in again.stderr


def test_a_cached_answer_keeps_its_pin_and_a_pruned_pin_is_made_again(tmp_path, run_cli, isolated_cache):
    first = run_cli("fit", "--example", "mlp-tiny", "--device-memory", "8MiB", "--json", "a.json")
    assert first.returncode == 0, first.stderr
    pin = json.loads((tmp_path / "a.json").read_text())["pin"]
    second = run_cli("fit", "--example", "mlp-tiny", "--device-memory", "8MiB", "--json", "b.json")
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["cached"] is True and b["pin"] == pin
    for f in Path(pin["path"]).parent.iterdir():
        f.unlink()
    third = run_cli("fit", "--example", "mlp-tiny", "--device-memory", "8MiB", "--json", "c.json")
    c = json.loads((tmp_path / "c.json").read_text())
    assert second.returncode == third.returncode == 0
    assert c["cached"] is False and Path(c["pin"]["path"]).is_file() and c["batch_size"] == b["batch_size"]


def test_pins_are_pruned_least_recently_used_first(tmp_path, monkeypatch):
    from jaxfit.fit import pin as pin_mod

    root = tmp_path / "pins"
    for i in range(5):
        folder = root / f"p{i}"
        folder.mkdir(parents=True)
        (folder / "executable.bin").write_bytes(b"x" * 1000)
        (folder / "pin.json").write_text("{}")
        os.utime(folder / "pin.json", (1000 + i, 1000 + i))
    (root / "half-written").mkdir()
    os.utime(root / "half-written", (0, 0))
    monkeypatch.setattr(pin_mod, "MAX_PINS", 3)
    pin_mod.prune(root)
    assert sorted(p.name for p in root.iterdir()) == ["p2", "p3", "p4"]
    monkeypatch.setattr(pin_mod, "MAX_TOTAL_BYTES", 1500)
    pin_mod.prune(root, keep=root / "p2")
    assert sorted(p.name for p in root.iterdir()) == ["p2", "p4"]


def test_fit_fraction_pins_the_program_of_its_answer(tmp_path, run_cli):
    proc = run_cli("fit", "--example", "mlp-tiny", "--device-memory", "8MiB", "--batch-size", "64", "--json", "f.json")
    assert proc.returncode == 0, proc.stderr
    fit = json.loads((tmp_path / "f.json").read_text())
    assert fit["mode"] == "fraction" and fit["pin"]["batch_size"] == 64
    assert fit["pin"]["peak_bytes"] == fit["peak_bytes"] and fit["env"]["JAXFIT_PIN"] == fit["pin"]["path"]
    assert [c["autotuned"] for c in fit["candidates"]] == [False]  # a CPU compile is not autotuned


def test_run_with_nothing_fitted_says_not_pinned(tmp_path, run_cli):
    error = error_line(
        run_cli(
            "run", "--batch-size", "8", "--mem-fraction", "0.3", "--json", "x/plan.json", "--", sys.executable, SHAPED
        )
    )
    assert "--json x/plan.json" in error
    proc = run_cli(
        "run",
        "--batch-size",
        "8",
        "--mem-fraction",
        "0.3",
        "--json",
        "plan.json",
        "--",
        sys.executable,
        SHAPED,
        "--steps",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["program_pinned"] is False and plan["run"]["reason"] == "nothing was fitted"


@pytest.mark.parametrize("damage", ["garbage", "missing", "folder"])
def test_a_pin_that_cannot_be_read_stops_the_script_in_one_line(tmp_path, damage):
    """A broken JAXFIT_PIN was ignored without a word, and the budget guard with it (a batch needing
    more than the budget ran): now the script stops at ``import jax`` with one line, exit code 2."""
    pin = tmp_path / "pin" / "pin.json"
    if damage == "garbage":
        pin.parent.mkdir()
        pin.write_text('{"fingerprint": ')
    elif damage == "folder":
        pin.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(REPO / "jaxfit" / "_probe"), JAXFIT_PIN=str(pin))
    proc = subprocess.run(
        [sys.executable, str(FIXTURES / "mini_train.py"), "--steps", "1"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 2 and "trained" not in proc.stdout, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("jaxfit: error:")]
    assert len(lines) == 1 and f"JAXFIT_PIN={pin} cannot be read" in lines[0] and "Traceback" not in proc.stderr


def test_a_pin_written_without_the_cache_survives_a_script_run_in_the_temp_folder():
    """With --no-cache the pin lives in the temp folder; a script whose working folder is that same
    folder must not have it removed as something its start-up created (it was, and the run then
    compiled its own program)."""
    import tempfile

    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "CUDA_VISIBLE_DEVICES")}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "jaxfit.cli", "run", "--mem-fraction", "0.5", "--max-batch", "32", "--no-cache", "--",
         sys.executable, str(FIXTURES / "mini_train.py"), "--steps", "1"],
        capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "ran the proven program" in proc.stderr, proc.stderr


def test_run_dry_run_prints_a_line_that_runs_the_proven_program(tmp_path):
    """The dry run says the program is pinned: the line it prints, pasted into a shell, loads it."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "CUDA_VISIBLE_DEVICES")}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    mini = str(FIXTURES / "mini_train.py")
    proc = subprocess.run(
        [sys.executable, "-m", "jaxfit.cli", "run", "--dry-run", "--mem-fraction", "0.5", "--max-batch", "32",
         "--quiet", "--", sys.executable, mini, "--steps", "1"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stderr.split())  # the console wraps long lines
    assert "the proven program is pinned" in said
    # --max-batch 32 fits: the line says it is the top of what was tried, not the largest that fits
    assert "batch 32 (fitted: --max-batch, larger batches were not tried" in said
    line = proc.stdout.strip().splitlines()[-1]
    assert "JAXFIT_PIN=" in line and line.endswith("--batch-size=32")
    pasted = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert pasted.returncode == 0, pasted.stderr
    assert "the train step runs the program jaxfit proved" in pasted.stderr
