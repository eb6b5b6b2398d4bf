"""Workload sources: what they are, how they travel to the compile child, what identifies them."""

from __future__ import annotations

import hashlib
import sys

import pytest

import jaxfit
from jaxfit.errors import ConfigError
from jaxfit.fit.sources import ExampleSource, ScriptSource, from_json, to_json


def test_sources_travel_as_json_and_come_back_equal(tmp_path):
    sources = [
        jaxfit.example_source("gpt-tiny", {"n_layers": "2"}),
        jaxfit.entry_source("pkg.mod:make", str(tmp_path)),
        jaxfit.script_source([sys.executable, "train.py", "--batch-size=8"], probe_args=["--out=/tmp/x"]),
    ]
    for source in sources:
        assert from_json(to_json(source)) == source
    with pytest.raises(ConfigError, match="not a workload source"):
        from_json('{"kind": "nope"}')


def test_an_examples_identity_covers_its_config_and_the_example_code():
    identity = jaxfit.example_source("gpt-tiny").identity()
    assert identity["code"] != hashlib.sha256().hexdigest()  # the example files were read
    assert identity != jaxfit.example_source("gpt-tiny", {"n_layers": "2"}).identity()


def test_a_script_source_keeps_its_probe_arguments_when_its_command_changes():
    source = jaxfit.script_source([sys.executable, "train.py"], probe_args=["--ckpt=/tmp/p"])
    assert isinstance(source, ScriptSource) and source.identity()["command"] == source.command
    changed = source.with_command([sys.executable, "train.py", "--batch-size=32"], 32)
    assert changed.command == (sys.executable, "train.py", "--batch-size=32", "--ckpt=/tmp/p")
    assert changed.run_command == (sys.executable, "train.py", "--batch-size=32") and changed.batch_size == 32


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: jaxfit.entry_source("no_colon"), "must look like package.module:function"),
        (lambda: jaxfit.script_source([sys.executable, "t.py"], step_name="not a name"), "is not a Python function"),
        (lambda: jaxfit.script_source([sys.executable, "t.py"], batch_flag="bs"), "--batch-flag 'bs' must be a flag"),
        (lambda: jaxfit.script_source([sys.executable, "t.py"], accum_flag="--a=2"), "--accum-flag '--a=2' must be"),
        (lambda: jaxfit.example_source("no-such-example"), "no-such-example"),
    ],
)
def test_bad_sources_are_refused_in_one_line(make, message):
    with pytest.raises(ConfigError, match=message) as info:
        make()
    assert "\n" not in str(info.value)


def test_the_public_api_is_curated():
    import jaxfit.fit.search

    assert jaxfit.fit.search.Grid  # a module stays a module (no function shadows it)
    assert jaxfit.__version__ and "search" not in jaxfit.__all__
    assert isinstance(jaxfit.example_source("gpt-tiny"), ExampleSource)
