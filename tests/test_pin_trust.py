"""A pin is code: only pins this user's jaxfit wrote, in private folders, are loaded.

The exploit this guards against, as it was reproduced: an ``executable.bin`` made as
``pickle.dumps(P())`` with ``P.__reduce__ = (os.system, ("touch PWNED",))`` beside a ``pin.json``
carrying its size and SHA-256 ran its payload inside the training process, which then trained on.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from jaxfit._probe import jaxfit_trust as trust
from jaxfit.fit.command import PROBE_DIR

pytestmark = pytest.mark.slow  # real compiles and processes

SMALL = ["--example", "mlp-tiny", "--device-memory", "8MiB", "--mem-fraction", "0.5"]
IMPORTS_JAX = "import jax, jax.numpy as jnp; print('ran', float(jnp.ones(2).sum()))"


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _pin(run_cli, tmp_path, *extra: str) -> dict:
    proc = run_cli("fit", *SMALL, *extra, "--json", "fit.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((tmp_path / "fit.json").read_text())


def _load(pin_path: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A process that imports jax with the pin set, as a training process does."""
    env = dict(os.environ, PYTHONPATH=PROBE_DIR, JAXFIT_PIN=pin_path, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-c", IMPORTS_JAX], capture_output=True, text=True, env=env, cwd=cwd)


def test_pins_are_private_and_signed(run_cli, tmp_path, isolated_cache):
    fit = _pin(run_cli, tmp_path)
    pin = Path(fit["pin"]["path"])
    for path in (pin.parent, pin.parent.parent):
        assert (path.stat().st_mode & 0o777) == 0o700, oct(path.stat().st_mode)
    for path in (pin, pin.parent / "executable.bin", isolated_cache / "pin-key"):
        assert (path.stat().st_mode & 0o777) == 0o600, (path, oct(path.stat().st_mode))
    assert json.loads(pin.read_text())["signature"]
    ok = _load(str(pin), tmp_path)
    assert ok.returncode == 0 and "ran 2.0" in ok.stdout, ok.stderr[-2000:]


def test_a_forged_executable_is_refused_before_it_is_unpickled(run_cli, tmp_path):
    fit = _pin(run_cli, tmp_path)
    pin = Path(fit["pin"]["path"])
    marker = tmp_path / "PWNED"
    forged = pickle.dumps(_Payload(str(marker)))
    (pin.parent / "executable.bin").write_bytes(forged)
    data = json.loads(pin.read_text())  # whoever can replace the executable can replace pin.json
    data.update(executable_bytes=len(forged), executable_sha256=hashlib.sha256(forged).hexdigest())
    pin.write_text(json.dumps(data))
    os.chmod(pin, 0o600)
    proc = _load(str(pin), tmp_path)
    assert proc.returncode == 2 and "ran" not in proc.stdout
    assert not marker.exists(), "the forged pin's payload ran"
    assert (
        f"jaxfit: error: JAXFIT_PIN={pin} is not loaded: the pin {pin} was not signed with your pin key" in proc.stderr
    )
    del data["signature"]
    pin.write_text(json.dumps(data))
    unsigned = _load(str(pin), tmp_path)
    assert unsigned.returncode == 2 and "carries no signature" in unsigned.stderr and not marker.exists()


def test_a_pin_others_can_write_is_refused(run_cli, tmp_path):
    pin = Path(_pin(run_cli, tmp_path)["pin"]["path"])
    os.chmod(pin.parent, 0o777)
    proc = _load(str(pin), tmp_path)
    assert proc.returncode == 2 and "can be written by others (mode 777)" in proc.stderr, proc.stderr


@pytest.mark.skipif(os.getuid() != 0, reason="making a folder of another user's needs root")
def test_no_cache_pins_never_go_to_a_folder_of_another_user(run_cli, tmp_path, monkeypatch):
    """--no-cache once wrote into $TMPDIR/jaxfit-pins-<uid> although another user owned it, mode 0777."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    planted = tmp_path / f"jaxfit-pins-{os.getuid()}"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    os.chown(planted, 12345, 12345)
    fit = _pin(run_cli, tmp_path, "--no-cache")
    assert fit["pin"] is None and not list(planted.iterdir())
    assert f"not pinned: {planted}: the folder {planted} belongs to user 12345" in fit["message"], fit["message"]


def test_an_unusable_cache_folder_pins_in_the_private_temporary_folder(run_cli, tmp_path, monkeypatch):
    """A JAXFIT_CACHE_DIR that is a file once left the answer unpinned where --no-cache would pin."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("JAXFIT_CACHE_DIR", str(blocked))
    fit = _pin(run_cli, tmp_path)
    private = tmp_path / "tmp" / f"jaxfit-pins-{os.getuid()}"
    assert fit["pin"] is not None and fit["pin"]["path"].startswith(str(private)), fit["message"]
    assert "cannot hold pins" in fit["message"] and f"pinned in {private}" in fit["message"]
    assert (private.stat().st_mode & 0o777) == 0o700 and (private / "pin-key").exists()
    ok = _load(fit["pin"]["path"], tmp_path)
    assert ok.returncode == 0 and "ran 2.0" in ok.stdout, ok.stderr[-2000:]


def test_a_key_others_can_read_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFIT_PIN_KEY", str(tmp_path / "key"))
    (tmp_path / "key").write_bytes(os.urandom(32))
    os.chmod(tmp_path / "key", 0o644)
    with pytest.raises(trust.UntrustedPin, match="can be read by others"):
        trust.load_key(create=False)


def test_bad_pin_variable_is_one_line(tmp_path):
    proc = _load(str(tmp_path / "nowhere" / "pin.json"), tmp_path)
    assert proc.returncode == 2 and "JAXFIT_PIN=" in proc.stderr and "Traceback" not in proc.stderr
