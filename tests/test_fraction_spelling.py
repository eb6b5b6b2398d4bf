"""The memory fraction in one spelling: XLA's new XLA_CLIENT_MEM_FRACTION (openxla/xla#16457) next
to the XLA_PYTHON_CLIENT_MEM_FRACTION every jaxlib reads. jaxlib refuses to start a GPU client when
both are set, so a user who exported the new one must not get the old one added by jaxfit."""

from __future__ import annotations

import pytest

from jaxfit.errors import ConfigError
from jaxfit.fit.budget import fraction_variable, overlay_environment, set_fraction
from jaxfit.fit.compiler import child_environment
from jaxfit.fit.options import default_mem_fraction
from jaxfit.fit.pin import run_environment

LEGACY, NEW = "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION"


def _gpu_plugin_options(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict:
    """What the installed jaxlib makes of an environment's fraction when it starts a GPU client
    (its own code, which reads only the environment; no GPU needed)."""
    from jaxlib import xla_client

    generate = getattr(xla_client, "generate_pjrt_gpu_plugin_options", None)
    if generate is None:
        pytest.skip("this jaxlib has no generate_pjrt_gpu_plugin_options")
    with monkeypatch.context() as m:
        for name in (LEGACY, NEW):
            m.delenv(name, raising=False)
            if name in env:
                m.setenv(name, env[name])
        return dict(generate())


def test_a_user_on_the_new_spelling_gets_only_the_new_spelling(monkeypatch):
    monkeypatch.delenv(LEGACY, raising=False)
    monkeypatch.setenv(NEW, "0.6")
    assert default_mem_fraction() == 0.6
    env = child_environment(0.3)
    assert LEGACY not in env and env[NEW] == "0.3"
    assert _gpu_plugin_options(env, monkeypatch)["memory_fraction"] == 0.3
    assert run_environment(None, 0.5) == {NEW: "0.5"}  # the run-with line pasted into that shell


def test_otherwise_the_spelling_every_jaxlib_reads(monkeypatch):
    monkeypatch.delenv(NEW, raising=False)
    monkeypatch.setenv(LEGACY, "0.7")
    assert default_mem_fraction() == 0.7 and fraction_variable() == LEGACY
    env = child_environment(0.25)
    assert NEW not in env and env[LEGACY] == "0.25"
    assert _gpu_plugin_options(env, monkeypatch)["memory_fraction"] == 0.25
    assert set_fraction({NEW: "0.9", LEGACY: "0.8"}, "0.4") == {LEGACY: "0.4"}  # never both


def test_both_spellings_set_is_one_clear_error(monkeypatch):
    monkeypatch.setenv(NEW, "0.6")
    monkeypatch.setenv(LEGACY, "0.6")
    with pytest.raises(ConfigError, match=f"both {NEW} and {LEGACY} are set, which jaxlib refuses"):
        default_mem_fraction()
    with pytest.raises(ValueError, match="specified together"):  # what jaxlib itself says of them
        _gpu_plugin_options({NEW: "0.6", LEGACY: "0.6"}, monkeypatch)


def test_a_run_gets_only_the_fraction_jaxfit_set_whatever_spelling_the_shell_has():
    """jax 0.11.2 given both spellings starts on the CPU (measured on an H100): the fraction jaxfit
    sets for a run replaces the shell's in either spelling."""
    shell = {LEGACY: "0.9", NEW: "0.8", "PATH": "/bin"}
    assert overlay_environment(shell, {LEGACY: "0.3"}) == {LEGACY: "0.3", "PATH": "/bin"}
    assert overlay_environment(shell, {NEW: "0.3", "A": "1"}) == {NEW: "0.3", "PATH": "/bin", "A": "1"}
    assert overlay_environment(shell, {"A": "1"}) == {**shell, "A": "1"}  # no fraction set: the shell's stays
