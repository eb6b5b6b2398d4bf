"""Command lines of training scripts: finding, setting and checking flags (pure logic)."""

from __future__ import annotations

import sys

import pytest

from jaxfit.errors import ConfigError
from jaxfit.fit.command import batch_value, check_batch_flag, check_command, with_batch


@pytest.mark.parametrize(
    "command,flag,value",
    [
        (["train.py", "--batch-size=32"], "--batch-size", 32),
        (["train.py", "--batch-size", "32", "--x"], "--batch-size", 32),
        (["train.py", "--bs=8"], "--batch-size", None),
        (["train.py", "--batch-size-max=8"], "--batch-size", None),  # another flag that starts alike
        (["train.py", "--config.batch_size=16"], "--config.batch_size", 16),
        (["train.py", "--batch-size"], "--batch-size", None),  # no value follows
    ],
)
def test_batch_value(command, flag, value):
    assert batch_value(command, flag) == value


@pytest.mark.parametrize("bad", ["abc", "0", "-4", "3.5"])
def test_batch_value_rejects_a_value_that_is_not_a_positive_integer(bad):
    with pytest.raises(ConfigError, match=f"--batch-size in the command is '{bad}', not a positive integer"):
        batch_value(["train.py", f"--batch-size={bad}"], "--batch-size")


@pytest.mark.parametrize(
    "command,expected",
    [
        (["t.py", "--batch-size=4", "--x"], ["t.py", "--batch-size=64", "--x"]),
        (["t.py", "--batch-size", "4", "--x"], ["t.py", "--batch-size=64", "--x"]),
        (["t.py", "--x"], ["t.py", "--x", "--batch-size=64"]),
        (["t.py", "--batch-size=4", "--batch-size=8"], ["t.py", "--batch-size=64", "--batch-size=64"]),
    ],
)
def test_with_batch_replaces_or_appends(command, expected):
    assert with_batch(command, "--batch-size", 64) == expected
    assert command[0] == "t.py" and "--batch-size=64" not in command  # the input is not changed


def test_check_command():
    assert check_command([sys.executable, "x.py"]) == [sys.executable, "x.py"]
    assert check_command(("python3", "x.py")) == ["python3", "x.py"]
    with pytest.raises(ConfigError, match="no command given after --"):
        check_command([])
    with pytest.raises(ConfigError, match="'no-such-program-jaxfit' is not on PATH"):
        check_command(["no-such-program-jaxfit"])
    with pytest.raises(ConfigError, match="is not an executable file"):
        check_command(["/no/such/dir/python"])


def test_the_fit_layer_imports_nothing_above_it():
    """jaxfit/fit is the core: run, tune, schedule, plan and the CLI build on it, never the reverse."""
    import ast
    from pathlib import Path

    import jaxfit.fit

    above = ("jaxfit.run", "jaxfit.cli", "jaxfit.tune", "jaxfit.schedule", "jaxfit.plan")
    found = []
    for path in Path(jaxfit.fit.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [f"{path.name}: {n}" for n in names if n.startswith(above)]
    assert not found


@pytest.mark.slow
def test_a_script_that_ignores_help_is_stopped_before_it_works(tmp_path):
    """Checking a flag runs ``CMD --help``; a script that parses no flags would train: the start-up
    hook stops it at its first jitted call, and the check says so in one line."""
    marker = tmp_path / "trained"
    script = tmp_path / "noflags.py"
    script.write_text(
        "import jax, jax.numpy as jnp\n"
        "f = jax.jit(lambda x: x + 1)\n"
        "f(jnp.ones(2)).block_until_ready()\n"
        f"open({str(marker)!r}, 'w').write('trained')\n"
    )
    with pytest.raises(ConfigError, match="printed no help and went on to work"):
        check_batch_flag([sys.executable, str(script)], "--batch-size")
    assert not marker.exists()


@pytest.mark.slow
def test_a_script_that_crashes_under_help_is_said_to_crash(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import nosuchmodule_jaxfit\n")
    with pytest.raises(
        ConfigError, match=r"--help` failed \(exit code 1\) before printing a help text: .*nosuchmodule"
    ):
        check_batch_flag([sys.executable, str(script)], "--batch-size")


def test_a_name_the_scripts_help_does_not_list_is_named():
    from jaxfit.fit.command import _unknown_choice

    tyro = "usage: train.py [-h] {debug,pi0_libero,pi05_libero}\n\n  • debug   ...\n"
    assert _unknown_choice(["python", "train.py", "pi0_lbero", "--exp-name=x"], tyro) == (
        "the script has no 'pi0_lbero': its --help lists debug, pi0_libero, pi05_libero; check the name in the command"
    )
    assert _unknown_choice(["uv", "run", "train.py", "pi0_libero"], tyro) is None
    flag_choices = "usage: t.py [-h] [--workers {none,spawn,fork}] [--startup-seconds S]\n"
    assert _unknown_choice(["python", "t.py", "--startup-seconds", "8"], flag_choices) is None
    assert _unknown_choice(["python", "t.py", "x"], flag_choices) is None  # a flag's choices are not names
