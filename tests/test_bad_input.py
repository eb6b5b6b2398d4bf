"""Bad input is one line ``jaxfit: error: ...``, exit code 2, no traceback, before any compile."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import FIXTURES, REPO, error_line

pytestmark = pytest.mark.slow  # real subprocesses and compiles

SHAPED = str(FIXTURES / "shaped_train.py")
TRAIN = str(REPO / "scripts" / "train.py")


@pytest.mark.parametrize(
    "args,message",
    [
        (["fit", "--width", "0"], "--width 0 must be at least 1"),
        (["fit", "--example", "mlp-tiny", "--devices", "100000"], "--devices 100000 is more than jaxfit plans (1024"),
        (["plan", "--devices", "1", "100000"], "--devices 100000 is more than jaxfit plans (1024"),
        (["fit", "--example", ""], "--example '' names no example; see `jaxfit examples`"),
        (["plan", "--example", " "], "--example ' ' names no example"),
        (
            ["run", "--batch-size", "0", "--mem-fraction", "0.5", "--", sys.executable, SHAPED],
            "--batch-size 0 must be at least 1",
        ),
        (["run", "--gpus", "0", "--batch-size", "8", "--", sys.executable, SHAPED], "--gpus 0 must be at least 1"),
        (["fit", "--width", "-3"], "--width -3 must be at least 1"),
        (["fit", "--script", "--probe-timeout", "-1", "--", sys.executable, SHAPED], "--probe-timeout -1 must be more"),
        (["fit", "--example", "mlp-tiny", "--device-memory", "1KiB"], "more than the whole device (1.00 KiB)"),
        (["fit", "--mem-fraction", "abc"], "--mem-fraction"),
        (
            ["fit", "--example", "mlp-tiny", "--max-batch", "99999999999999999999"],
            "--max-batch 99999999999999999999 is beyond any batch a device can hold; use at most 2147483647",
        ),
        (["fit", "--no-such-flag"], "Unrecognized options: --no-such-flag; see jaxfit fit --help"),
        (["nosuch"], "unknown command 'nosuch'; the commands are fit, run, tune, plan, gpus, examples"),
        (
            [
                "run",
                "--global-batch",
                "0",
                "--mem-fraction",
                "0.3",
                "--",
                sys.executable,
                TRAIN,
                "debug",
                "--exp-name=x",
            ],
            "--global-batch 0 must be at least 1",
        ),
        (
            [
                "run",
                "--batch-flag=--bs",
                "--batch-size",
                "8",
                "--mem-fraction",
                "0.3",
                "--",
                sys.executable,
                str(FIXTURES / "mini_train.py"),
            ],
            "does not mention --bs; check the spelling of --bs",
        ),
        (["fit", "--batch-flag=bs", "--script", "--", sys.executable, SHAPED], "--batch-flag 'bs' must be a flag name"),
        (
            ["fit", "--json", "missing-folder/fit.json"],
            "--json missing-folder/fit.json: folder missing-folder does not",
        ),
        (  # Ray retries an address where nothing listens for minutes; jaxfit says so before any fit
            [
                "schedule",
                str(REPO / "configs" / "queue-debug.yaml"),
                "--backend",
                "ray",
                "--ray-address",
                "127.0.0.1:1",
                "--gpus",
                "1",
                "--device-memory",
                "8GiB",
            ],
            "cannot connect to the Ray cluster at '127.0.0.1:1': nothing answers there",
        ),
        (
            ["schedule", str(REPO / "configs" / "queue-debug.yaml"), "--plan-on-cluster", "--dry-run"],
            "--plan-on-cluster plans on a node of a Ray cluster; add --backend ray --ray-address ADDRESS",
        ),
    ],
)
def test_bad_input_is_one_line(run_cli, args, message):
    assert message in error_line(run_cli(*args))


def test_a_parsing_error_is_one_line_not_a_box(run_cli):
    proc = run_cli("fit", "--mem-fraction", "abc")
    assert "╭" not in proc.stderr and "│" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_json_to_a_path_that_cannot_be_written_fails_before_the_fit(tmp_path, run_cli):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    proc = run_cli("fit", "--json", str(blocker / "fit.json"))
    assert "is not writable" in error_line(proc) or "does not exist" in error_line(proc)
    assert "round" not in proc.stderr  # nothing was compiled


def test_calibrate_help_reads_cache_no_cache(run_cli):
    proc = run_cli("calibrate", "--help")
    assert proc.returncode == 0 and "--no-cache" in proc.stdout and "--no-no-cache" not in proc.stdout


def test_a_batch_flag_the_help_does_not_list_is_taken_when_the_command_carries_it(tmp_path, run_cli):
    """absl/ml_collections scripts take --config.batch_size without listing it in --help."""
    script = tmp_path / "absl_like.py"
    script.write_text(
        "import sys\nif '--help' in sys.argv: print('flags: --config'); sys.exit(0)\nprint('args', sys.argv[1:])\n"
    )
    proc = run_cli(
        "run",
        "--batch-flag",
        "--config.batch_size",
        "--batch-size",
        "16",
        "--mem-fraction",
        "0.3",
        "--dry-run",
        "--",
        sys.executable,
        str(script),
        "--config.batch_size=8",
    )
    assert proc.returncode == 0, proc.stderr
    assert "--config.batch_size=16" in proc.stdout and "--config.batch_size=8" not in proc.stdout
    line = error_line(
        run_cli(
            "run",
            "--batch-flag",
            "--config.batch_size",
            "--batch-size",
            "16",
            "--mem-fraction",
            "0.3",
            "--",
            sys.executable,
            str(script),
        )
    )
    assert "put --config.batch_size=N in the command" in line


def test_global_batch_uses_the_scripts_own_accumulation_flag(tmp_path, run_cli):
    script = tmp_path / "accum.py"
    script.write_text(
        "import sys\nif '--help' in sys.argv: print('--batch-size --accum'); sys.exit(0)\nprint('args', sys.argv[1:])\n"
    )
    proc = run_cli(
        "run",
        "--accum-flag",
        "--accum",
        "--global-batch",
        "32",
        "--batch-size",
        "8",
        "--mem-fraction",
        "0.3",
        "--dry-run",
        "--",
        sys.executable,
        str(script),
    )
    assert proc.returncode == 0, proc.stderr
    assert "--batch-size=32 --accum=4" in proc.stdout
    assert "name the script's own flag with --accum-flag" in error_line(
        run_cli(
            "run",
            "--global-batch",
            "32",
            "--batch-size",
            "8",
            "--mem-fraction",
            "0.3",
            "--",
            sys.executable,
            str(script),
        )
    )


def _absl_like(tmp_path):
    """A script whose flags are absl/ml_collections style: no --batch-size, and --help lists only --config."""
    script = tmp_path / "absl_like.py"
    script.write_text(
        "import sys\nif '--help' in sys.argv: print('flags: --config'); sys.exit(0)\nprint('args', sys.argv[1:])\n"
    )
    return str(script)


def test_fit_refuses_a_batch_flag_the_script_does_not_take_as_run_does(tmp_path, run_cli):
    """fit --script printed a `run with:` line carrying a flag the script rejects; run refused it."""
    mini = str(FIXTURES / "mini_train.py")
    for command in (
        ["fit", "--script", "--batch-flag=--bs", "--mem-fraction", "0.3"],
        ["fit", "--script", "--batch-flag=--bs", "--batch-size", "8"],
        ["run", "--batch-flag=--bs", "--mem-fraction", "0.3"],
    ):
        proc = run_cli(*command, "--", sys.executable, mini)
        assert "the command's --help does not mention --bs; check the spelling of --bs" in error_line(proc)
        assert "round" not in proc.stderr and "run with:" not in proc.stdout  # refused before probing


def test_fit_refuses_a_script_without_batch_size_unless_given_its_batch_flag(tmp_path, run_cli):
    absl = _absl_like(tmp_path)
    for command in (["fit", "--script"], ["run", "--mem-fraction", "0.3"]):
        proc = run_cli(*command, "--", sys.executable, absl)
        line = error_line(proc)
        assert "does not mention --batch-size; pass --batch-flag=<its batch flag>" in line
        assert "run with:" not in proc.stdout


@pytest.mark.slow
def test_json_that_cannot_be_written_comes_after_the_answer(tmp_path):
    """A disk that takes no more (RLIMIT_FSIZE: writes past 4 KiB fail as on a full disk): the answer
    is printed, then one error line, exit 2, and no half-written file is left."""
    import resource

    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "jaxfit.cli", "fit", "--example", "mlp-tiny", "--max-batch", "64", "--no-cache",
         "--json", str(out)],
        capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "batch 64 fits" in proc.stdout
    assert error_line(proc) == f"jaxfit: error: --json {out}: cannot write it (File too large)"
    assert list(tmp_path.iterdir()) == []
