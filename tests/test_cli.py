"""The command line as a user meets it: answers, JSON, and one-line errors for bad input."""

from __future__ import annotations

import json

import pytest
from helpers import FIXTURES, error_line

pytestmark = pytest.mark.slow  # real subprocesses and compiles

SMALL = ["--example", "mlp-tiny", "--device-memory", "8MiB", "--mem-fraction", "0.5", "--max-batch", "4096"]


def test_fit_prints_a_table_and_writes_documented_json(run_cli, tmp_path):
    out = tmp_path / "fit.json"
    proc = run_cli("fit", *SMALL, "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "fits: peak" in proc.stdout and "compile s" in proc.stdout
    assert "round 1 at " in proc.stderr and ": compiling batch" in proc.stderr  # progress goes to stderr
    data = json.loads(out.read_text())
    assert data["mode"] == "batch" and data["mem_fraction"] == 0.5 and data["multiple_of"] == 1
    assert data["budget_bytes"] == 4 << 20 and data["peak_bytes"] <= data["budget_bytes"]
    assert data["compiles"] >= 2 and data["wall_seconds"] > 0
    assert [c["batch_size"] for c in data["candidates"]] == sorted(c["batch_size"] for c in data["candidates"])
    assert not list(tmp_path.glob(".fit.json.*"))  # no temporary file left behind


def test_inverse_from_the_cli(run_cli):
    proc = run_cli("fit", *SMALL, "--batch-size", "100", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("batch 100 needs fraction 0.")


def test_env_fraction_is_the_default(run_cli, monkeypatch, tmp_path):
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.25")
    out = tmp_path / "f.json"
    proc = run_cli("fit", "--example", "mlp-tiny", "--device-memory", "8MiB", "--json", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["mem_fraction"] == 0.25


def test_examples_lists_the_builtin_workloads(run_cli):
    proc = run_cli("examples")
    assert proc.returncode == 0
    for name in ("gpt-tiny (default)", "gpt-small", "vit-small", "mlp"):
        assert name in proc.stdout


def test_version_and_an_unknown_command(run_cli):
    from jaxfit.versions import jaxfit_version

    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout == f"jaxfit {jaxfit_version()}\n"
    report = json.loads(run_cli("version", "--json").stdout)
    assert report["jaxfit"] == jaxfit_version() and report["jax"][0].isdigit() and report["jaxlib"][0].isdigit()
    assert report["backend"] == "cpu" and report["devices"] and report["devices"][0].startswith("cpu:0")
    plain = run_cli("version")
    assert "backend cpu" in plain.stdout
    assert "Traceback" not in plain.stderr  # jax's start-up warnings (a CUDA plugin without a GPU) are one line each
    line = error_line(run_cli("frobnicate"))
    assert line == (
        "jaxfit: error: unknown command 'frobnicate'; the commands are fit, run, tune, plan, gpus, examples, schedule, "
        "calibrate, version (see jaxfit --help)"
    )
    assert "(did you mean 'fit'?)" in error_line(run_cli("fti", "--example", "mlp-tiny"))


def test_help_explains_the_options(run_cli):
    proc = run_cli("fit", "--help")
    assert proc.returncode == 0
    for flag in (
        "--mem-fraction",
        "--batch-size",
        "--headroom",
        "--device-memory",
        "--multiple-of",
        "--no-cache",
        "--json",
        "--entry",
        "--set",
    ):
        assert flag in proc.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--mem-fraction", "1.5"], "--mem-fraction must be in (0, 1]"),
        (["--mem-fraction", "0"], "--mem-fraction must be in (0, 1]"),
        (["--min-batch", "10", "--max-batch", "5"], "--min-batch (10) is larger than --max-batch (5)"),
        (["--multiple-of", "8", "--max-batch", "7"], "no multiple of 8"),
        (["--example", "gpt-huge"], "unknown example 'gpt-huge'"),
        (["--set", "n_layerz=3"], "unknown gpt config key 'n_layerz'"),
        (["--set", "n_layers"], "must look like KEY=VALUE"),
        (["--set", "n_layers=many"], "n_layers"),
        (["--device-memory", "lots"], "cannot read 'lots' as a memory size"),
        (["--headroom", "-5GiB"], "memory size"),
        (["--entry", "not_a_module_anywhere:make"], "cannot import 'not_a_module_anywhere'"),
        (["--entry", "nocolon"], "must look like package.module:function"),
        (["--example", "mlp-tiny", "--entry", "a:b"], "give one of --example, --entry or --script"),
        (["--example", "mlp-tiny", "--device-memory", "256KiB", "--mem-fraction", "0.5"], "not even batch 1 fits"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(run_cli, tmp_path, isolated_cache, args, message):
    out = tmp_path / "result.json"
    proc = run_cli("fit", *args, "--json", str(out))
    assert message in error_line(proc)
    assert not out.exists(), "no JSON for a failed fit"
    if isolated_cache.exists():
        import sqlite3

        with sqlite3.connect(isolated_cache / "cache.sqlite3") as db:
            assert db.execute("SELECT COUNT(*) FROM answers").fetchone()[0] == 0


def test_a_step_that_does_not_compile_is_reported_not_called_too_big(run_cli):
    proc = run_cli("fit", "--entry", "user_workloads:make_bad_shapes", "--device-memory", "8MiB", cwd=FIXTURES)
    line = error_line(proc)
    assert "failed to compile at batch" in line and "other than memory" in line


def test_json_into_a_missing_folder_fails_before_fitting(run_cli, tmp_path):
    proc = run_cli("fit", *SMALL, "--json", str(tmp_path / "no" / "such" / "dir" / "f.json"))
    assert "does not exist" in error_line(proc)
    assert "round 1" not in proc.stderr
