"""The compile server's experimental option for untuned GPU compiles, as pure logic (fast tier)."""

from __future__ import annotations

import pytest

from jaxfit._probe.jaxfit_compile_server import UNTUNED_OPTIONS_ENV, untuned_options


def test_untuned_compiles_take_the_json_options_given(monkeypatch):
    monkeypatch.delenv(UNTUNED_OPTIONS_ENV, raising=False)
    assert untuned_options() == {}
    monkeypatch.setenv(UNTUNED_OPTIONS_ENV, '{"xla_gpu_enable_triton_gemm": false}')
    assert untuned_options() == {"xla_gpu_enable_triton_gemm": False}


@pytest.mark.parametrize("bad", ["nope", "[1, 2]", "3"])
def test_a_value_that_is_not_a_json_object_is_named_in_one_line(monkeypatch, bad):
    monkeypatch.setenv(UNTUNED_OPTIONS_ENV, bad)
    with pytest.raises(ValueError, match=f"{UNTUNED_OPTIONS_ENV} must be a JSON object"):
        untuned_options()
