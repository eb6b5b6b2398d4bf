"""Shared fixtures: an isolated cache, a tiny fit question, and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO, error_line  # noqa: F401 - re-exported for fixtures below

# Ray 2.5x turns token authentication on for the Rays it starts. A test process that drives a
# local Ray and later a cluster it started itself (tests/test_ray_cluster.py) must use one mode
# throughout: a driver that learnt a token could not serve its objects to nodes without one
# (OwnerDiedError). The subprocesses the tests start inherit it.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# The tests' compiles skip LLVM's expensive optimisations: XLA's memory analysis comes from buffer
# assignment, before LLVM, so every peak is the same (mlp-tiny and gpt-tiny at batches 8 and 64:
# equal to the byte) and a CPU compile takes about half the time. The subprocesses inherit it; a
# test that sets XLA_FLAGS itself replaces it, and a developer's own XLA_FLAGS are left alone.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own cache folder (children inherit it through the environment)."""
    cache_dir = tmp_path / "jaxfit-cache"
    monkeypatch.setenv("JAXFIT_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION", raising=False)
    return cache_dir


@pytest.fixture
def run_cli(tmp_path):
    """Run ``jaxfit ARGS`` as a user would; returns the CompletedProcess."""

    def run(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "jaxfit.cli", *args],
            capture_output=True,
            text=True,
            cwd=cwd or tmp_path,
            env=dict(os.environ),
            timeout=timeout,
        )

    return run


OLD_JAX = ["jax[cpu]==0.5.0", "jaxtyping==0.2.36", "beartype==0.19.0"]
"""openpi's kind of environment: an old jax (openpi pins 0.5.3) with jaxtyping and beartype, no jaxfit."""


@pytest.fixture(scope="session")
def old_jax_python(tmp_path_factory):
    """The Python of a fresh virtual environment with :data:`OLD_JAX` (skips when it cannot be installed)."""
    venv = tmp_path_factory.mktemp("venv-jax05")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "-q", *OLD_JAX], capture_output=True, text=True)
    if install.returncode != 0:
        pytest.skip(f"cannot install {' '.join(OLD_JAX)} here: {install.stderr.strip()[-300:]}")
    return python
