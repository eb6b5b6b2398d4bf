"""A repeated ``fit --script`` answers from the cache without starting the script, unless something
that can change its step changed (real processes and compiles; ``tests/fixtures/cached_train.py``)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FIXTURES

from jaxfit._probe import jaxfit_manifest
from jaxfit.fit.sources import script_environment

pytestmark = pytest.mark.slow  # real subprocesses and compiles

SMALL = ["--device-memory", "64MiB", "--mem-fraction", "0.5", "--max-batch", "64"]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A copy of the script and its model in ``proj/``; ``starts()`` counts the script's starts."""
    folder = tmp_path / "proj"
    folder.mkdir()
    for name in ("cached_train.py", "cached_model.py"):
        shutil.copy(FIXTURES / name, folder / name)
    (tmp_path / "starts.log").touch()  # there before the probe: its appends are not the probe's to remove
    monkeypatch.setenv("CACHED_TRAIN_STARTS", str(tmp_path / "starts.log"))
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    return folder


def _starts(tmp_path: Path) -> int:
    log = tmp_path / "starts.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def _fit(run_cli, tmp_path: Path, project: Path, name: str, *flags: str, extra: tuple[str, ...] = ()) -> dict:
    out = tmp_path / f"{name}.json"
    proc = run_cli(
        "fit",
        "--script",
        *SMALL,
        *extra,
        "--json",
        str(out),
        "--",
        sys.executable,
        "cached_train.py",
        *flags,
        cwd=project,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    fit = json.loads(out.read_text())
    fit["_output"] = proc.stdout + proc.stderr
    return fit


def test_a_repeated_script_fit_answers_from_the_cache_without_starting_the_script(
    tmp_path, run_cli, project, isolated_cache
):
    first = _fit(run_cli, tmp_path, project, "a")
    assert first["cached"] is False and _starts(tmp_path) == 1 and first["pin"]
    second = _fit(run_cli, tmp_path, project, "b")
    assert _starts(tmp_path) == 1  # the script did not start again
    assert second["cached"] is True and "answered from the cache" in second["_output"]
    assert second["batch_size"] == first["batch_size"] and second["peak_bytes"] == first["peak_bytes"]
    assert second["pin"] == first["pin"] and Path(second["pin"]["path"]).is_file()
    assert [p.name for p in (isolated_cache / "pins").iterdir()] == [Path(first["pin"]["path"]).parent.name]
    assert "manifest" not in json.dumps(second["workload"])  # kept with the cached answer, not in the result


@pytest.mark.parametrize("change", ["source", "flag", "xla_flags", "config"])
def test_a_change_that_can_change_the_step_probes_again(tmp_path, run_cli, project, monkeypatch, change):
    flags: tuple[str, ...] = ("--width", "64")
    if change == "config":
        (project / "config.json").write_text(json.dumps({"width": 64}))
    first = _fit(run_cli, tmp_path, project, "a", *flags)
    assert first["cached"] is False and _starts(tmp_path) == 1
    assert _fit(run_cli, tmp_path, project, "same", *flags)["cached"] is True and _starts(tmp_path) == 1
    if change == "source":  # a file the script imported
        model = project / "cached_model.py"
        model.write_text(model.read_text().replace("* 0.1", "* 0.2"))
    elif change == "flag":
        flags = ("--width", "48")
    elif change == "xla_flags":
        monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    else:  # a file the script read from its working folder
        (project / "config.json").write_text(json.dumps({"width": 96}))
    second = _fit(run_cli, tmp_path, project, "b", *flags)
    assert second["cached"] is False and _starts(tmp_path) == 2
    if change in ("source", "config"):  # same question: the new answer and its pin replace the old ones
        assert second["pin"]["path"] == first["pin"]["path"]
        assert "probing the script again" in second["_output"]
        third = _fit(run_cli, tmp_path, project, "c", *flags)
        assert third["cached"] is True and _starts(tmp_path) == 2 and third["pin"] == second["pin"]
    if change == "config":
        assert second["peak_bytes"] != first["peak_bytes"]  # the config changed the step


def test_no_cache_probes_the_script(tmp_path, run_cli, project):
    _fit(run_cli, tmp_path, project, "a")
    again = _fit(run_cli, tmp_path, project, "b", extra=("--no-cache",))
    assert again["cached"] is False and _starts(tmp_path) == 2


def test_the_manifest_notices_a_changed_source_and_a_new_file(tmp_path, monkeypatch):
    """In process: a module's source by hash, a file read from the folder, one that was missing."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(jaxfit_manifest, "_folder", [str(tmp_path) + os.sep])
    monkeypatch.setattr(jaxfit_manifest, "_reads", {})
    (tmp_path / "settings.yaml").write_text("width: 8\n")
    for event in (("open", ("settings.yaml", "r", 0)), ("open", ("absent.yaml", "r", 0)), ("open", ("log", "w", 0))):
        jaxfit_manifest._on_audit(*event)
    manifest = jaxfit_manifest.collect()
    assert manifest is not None and jaxfit_manifest.check(manifest) is None
    files = manifest["files"]
    assert files[str(tmp_path / "absent.yaml")] == ["missing"] and str(tmp_path / "log") not in files
    assert files[jaxfit_manifest.__file__][0] == "sha256" and os.path.realpath(sys.executable) in files
    (tmp_path / "settings.yaml").write_text("width: 9\n")
    assert jaxfit_manifest.check(manifest) == f"{tmp_path / 'settings.yaml'} changed"
    (tmp_path / "settings.yaml").write_text("width: 8\n")
    (tmp_path / "absent.yaml").write_text("")
    assert jaxfit_manifest.check(manifest) == f"{tmp_path / 'absent.yaml'} appeared"


def test_the_key_holds_the_variables_of_xla_and_jax_not_jaxfits():
    env = script_environment(
        {"XLA_FLAGS": "--x", "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "1", "JAXFIT_PIN": "p", "HOME": "/h"}
        | {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5", "PYTHONPATH": "/src", "NVIDIA_VISIBLE_DEVICES": "all"}
    )
    assert env == {
        "CUDA_VISIBLE_DEVICES": "1",
        "JAX_PLATFORMS": "cpu",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "PYTHONPATH": "/src",
        "XLA_FLAGS": "--x",
    }


@pytest.mark.parametrize("damage", ["truncated", "altered"])
def test_a_cached_answer_whose_executable_is_damaged_is_proved_again(tmp_path, run_cli, project, damage):
    pin = _fit(run_cli, tmp_path, project, "a")["pin"]
    executable = Path(pin["path"]).parent / "executable.bin"
    data = executable.read_bytes()
    assert pin["executable_bytes"] == len(data) and pin["executable_sha256"] == hashlib.sha256(data).hexdigest()
    if damage == "truncated":
        executable.write_bytes(data[: len(data) // 2])
    else:  # the same size, one byte changed
        middle = len(data) // 2
        executable.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :])
    again = _fit(run_cli, tmp_path, project, "b")
    assert again["cached"] is False and _starts(tmp_path) == 2 and again["pin"]["path"] == pin["path"]
    assert hashlib.sha256(executable.read_bytes()).hexdigest() == again["pin"]["executable_sha256"]


def test_the_hook_does_not_load_an_altered_executable(tmp_path, run_cli, project):
    """The start-up hook checks the pin's SHA-256 before loading it: an altered program is not run."""
    fit = _fit(run_cli, tmp_path, project, "a")
    executable = Path(fit["pin"]["path"]).parent / "executable.bin"
    data = executable.read_bytes()
    middle = len(data) // 2  # in the executable's payload: without the check it loads
    executable.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :])
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAXFIT_PIN")}
    env.update(fit["env"], JAXFIT_PIN_REPORT=str(tmp_path / "report.json"))
    command = [sys.executable, "cached_train.py", f"--batch-size={fit['batch_size']}"]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=project, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["program_pinned"] is False and "SHA-256" in report["reason"], report
