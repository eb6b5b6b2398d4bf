"""The package as users get it: the built wheel holds every module of the source tree and the data
the README's examples need (a non-editable install once lacked ``jaxfit.plan``)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow  # builds a wheel in a subprocess


def test_the_wheel_holds_every_module_and_the_example_files(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("jaxfit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    source = {str(p.relative_to(REPO)) for p in (REPO / "jaxfit").rglob("*.py") if "__pycache__" not in p.parts}
    assert source and source <= names, sorted(source - names)
    assert "jaxfit/py.typed" in names
    configs = {f"jaxfit/configs/{p.name}" for p in (REPO / "configs").glob("*.yaml")}
    assert {"jaxfit/configs/queue-debug.yaml", "jaxfit/configs/gpt-tiny.yaml"} <= configs <= names
    assert "jaxfit/scripts/train.py" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "benchmarks/", "docs/")) for n in names)


def test_examples_copy_writes_a_script_and_queues_that_run_from_there(tmp_path, run_cli):
    """What a pip user has instead of a clone: the files written from the package are the repository's."""
    proc = run_cli("examples", "--copy", "starter")
    assert proc.returncode == 0, proc.stderr
    for relative in ("scripts/train.py", "configs/queue-debug.yaml", "configs/queue-96gb.yaml"):
        assert (tmp_path / "starter" / relative).read_bytes() == (REPO / relative).read_bytes()
    again = run_cli("examples", "--copy", "starter")
    assert again.returncode == 2 and "already exist" in again.stderr and "--overwrite" in again.stderr
    help_text = subprocess.run(
        [sys.executable, str(tmp_path / "starter" / "scripts" / "train.py"), "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert help_text.returncode == 0 and "debug" in help_text.stdout, help_text.stderr[-2000:]
