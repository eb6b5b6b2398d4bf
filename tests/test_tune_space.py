"""The tune's space and pruning, on synthetic numbers (pure logic)."""

from __future__ import annotations

import ast
import math

import pytest

from jaxfit.errors import ConfigError
from jaxfit.tune.space import (
    example_settings,
    micro_batches,
    parse_axis,
    script_settings,
    upper_bound_samples_per_second,
)


def test_example_settings_cross_remat_and_precision():
    settings = example_settings(["none", "dots", "full"], ["float32", "bfloat16"])
    assert len(settings) == 6
    by_name = {s.name: dict(s.overrides) for s in settings}
    assert by_name["remat=none,precision=float32"] == {"dtype": "float32", "remat": "false"}
    assert by_name["remat=dots,precision=bfloat16"] == {"dtype": "bfloat16", "remat": "true", "remat_policy": "dots"}
    assert by_name["remat=full,precision=float32"]["remat_policy"] == "nothing"
    assert [s.remat for s in settings] == [False, False, True, True, True, True]
    with pytest.raises(ConfigError, match="--remat 'some'"):
        example_settings(["some"], ["float32"])
    with pytest.raises(ConfigError, match="--precision 'fp8'"):
        example_settings(["none"], ["fp8"])


def test_script_axes_are_crossed_into_flags():
    settings = script_settings(["--remat=none,full", "--precision=float32,bfloat16"])
    assert [s.flags for s in settings] == [
        ("--remat=none", "--precision=float32"),
        ("--remat=none", "--precision=bfloat16"),
        ("--remat=full", "--precision=float32"),
        ("--remat=full", "--precision=bfloat16"),
    ]
    assert script_settings([])[0].flags == ()
    assert parse_axis("--model-overrides.remat=false,true") == ("--model-overrides.remat", ["false", "true"])
    for bad in ["remat=none", "--remat", "--remat=", "--remat=,"]:
        with pytest.raises(ConfigError, match="must look like --FLAG=VALUE1,VALUE2"):
            parse_axis(bad)
    with pytest.raises(ConfigError, match="given twice"):
        script_settings(["--a=1,2", "--a=3"])


@pytest.mark.parametrize(
    "global_batch,largest,multiple,most,expected",
    [
        (64, 24, 1, 3, [16, 8, 4]),  # divisors of 64 up to the largest that fits, largest first
        (64, 64, 1, 2, [64, 32]),
        (64, 100, 1, 3, [64, 32, 16]),  # never above the global batch
        (12, 5, 1, 3, [4, 3, 2]),
        (64, 24, 8, 3, [16, 8]),  # multiples of the device count
        (None, 37, 1, 3, [37]),  # no global batch: the largest alone
        (64, 0, 1, 3, []),
    ],
)
def test_micro_batches(global_batch, largest, multiple, most, expected):
    assert micro_batches(global_batch, largest, multiple_of=multiple, most=most) == expected


def test_a_candidate_is_pruned_only_by_a_proof():
    # 64 samples of 1e12 FLOPs per step at a 100 TFLOP/s peak: at most 6400 samples/s.
    assert upper_bound_samples_per_second(64, 1e12, 100e12) == pytest.approx(6400)
    assert math.isinf(upper_bound_samples_per_second(64, None, 100e12))  # FLOPs unknown: never pruned
    assert math.isinf(upper_bound_samples_per_second(64, 1e12, None))  # peak unknown (a CPU): never pruned


def test_peaks_come_from_the_table_or_the_flag():
    from jaxfit.tune.peaks import peak_flops

    assert peak_flops("NVIDIA H100 80GB HBM3", "bfloat16")[0] == pytest.approx(989.4e12)
    assert peak_flops("NVIDIA H200", "float32")[0] == pytest.approx(494.7e12)
    assert peak_flops("cpu", "float32")[0] is None
    assert peak_flops("cpu", "float32", 2.0) == (2e12, "--peak-tflops")


def test_a_settings_micro_batches_stop_once_the_rate_falls():
    """Measured largest first, a setting's micro-batches stop at the first one slower than the one
    before it (the numbers of the H100's remat=full rows: 16 x 4, 8 x 8, 4 x 16)."""
    from jaxfit.tune.model import Row
    from jaxfit.tune.prove import _past_the_peak

    def row(micro: int, rate: float | None, where: str = "compile process") -> Row:
        r = Row("s", micro, 64 // micro, 64, status="measured", measured_in=where)
        r.samples_per_second = rate
        return r

    a, b, c = row(16, 180.7), row(8, 188.3), row(4, 173.3)
    assert _past_the_peak([]) is None
    assert _past_the_peak([a]) is None  # one measured: nothing to compare
    assert _past_the_peak([a, b]) is None  # faster than the one before: go on down
    assert _past_the_peak([a, b, c]) is c  # slower: the smaller ones are not tried
    failed = Row("s", 32, 2, 64, status="does not fit")
    assert _past_the_peak([failed, b, c]) is c and _past_the_peak([failed, b]) is None


def test_the_flops_of_a_step_come_from_the_search_s_untuned_compile_before_the_proof_s():
    """An autotuned program's cost analysis misses what runs in library calls (H100, vit-small remat
    full at 128: 2.0 GFLOPs per sample against 30.5 untuned): the search's count wins, also for a
    row without accumulation; the proof's own count is used only where the search has none."""
    from types import SimpleNamespace

    from jaxfit.tune.prove import _flops_per_step

    def fit(**flops):
        return SimpleNamespace(candidates=[SimpleNamespace(batch_size=int(b[1:]), flops=f) for b, f in flops.items()])

    search = fit(b64=1.95e12, b32=0.98e12)
    assert _flops_per_step(64, 1, fit(b64=2.6e11), search) == 1.95e12  # not the autotuned 2.6e11
    assert _flops_per_step(32, 4, fit(b128=1e12), search) == 0.98e12 * 4  # one micro-batch, times the steps
    assert _flops_per_step(128, 1, fit(b128=2.6e11), search) == 2.6e11  # the search has no 128: the proof's
    assert _flops_per_step(16, 8, fit(), search) == 1.95e12 / 64 * 128  # per sample of the widest, times G


def test_a_remat_setting_names_its_twin_without_remat_and_others_have_none():
    from jaxfit.tune.space import plain_twin

    by_name = {s.name: s for s in example_settings(["none", "full", "dots"], ["bfloat16"])}
    assert plain_twin(by_name["remat=full,precision=bfloat16"]) == "remat=none,precision=bfloat16"
    assert plain_twin(by_name["remat=dots,precision=bfloat16"]) == "remat=none,precision=bfloat16"
    assert plain_twin(by_name["remat=none,precision=bfloat16"]) is None
    # a script's --remat flag (scripts/train.py's) is read; its other flags are kept as they are
    scripts = {s.name: s for s in script_settings(["--remat=none,full,dots", "--precision=bfloat16"])}
    assert plain_twin(scripts["--remat=full --precision=bfloat16"]) == "--remat=none --precision=bfloat16"
    assert plain_twin(scripts["--remat=dots --precision=bfloat16"]) == "--remat=none --precision=bfloat16"
    assert plain_twin(scripts["--remat=none --precision=bfloat16"]) is None
    assert all(plain_twin(s) is None for s in script_settings(["--remat-policy=a,b", "--layers=1,2"]))


def test_a_shared_compile_cache_lives_for_its_block_and_leaves_a_users_own_alone(monkeypatch):
    """jaxfit.fit.jax_cache: a temporary $JAX_COMPILATION_CACHE_DIR for the block, removed after;
    a cache the user set is kept as it is (no folder of jaxfit's)."""
    import os

    from jaxfit.fit.jax_cache import shared_compile_cache

    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    with shared_compile_cache() as shared:
        assert shared.folder and os.environ["JAX_COMPILATION_CACHE_DIR"] == shared.folder
        assert os.path.isdir(shared.folder) and shared.entries() == 0
        open(os.path.join(shared.folder, "program"), "w").close()
        assert shared.entries() == 1
    assert "JAX_COMPILATION_CACHE_DIR" not in os.environ and not os.path.exists(shared.folder)
    with shared_compile_cache(enabled=False) as shared:
        assert shared.folder is None and shared.entries() is None
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/users/own")
    with shared_compile_cache() as shared:
        assert shared.folder is None and os.environ["JAX_COMPILATION_CACHE_DIR"] == "/users/own"
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == "/users/own"


def _train_py_configs() -> dict[str, dict[str, ast.expr]]:
    """scripts/train.py's configs, read from its source (name -> its keyword arguments)."""
    from helpers import REPO

    tree = ast.parse((REPO / "scripts" / "train.py").read_text())
    configs = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "TrainConfig":
            kwargs = {k.arg: k.value for k in node.keywords}
            configs[ast.literal_eval(kwargs["name"])] = kwargs
    return configs


def test_the_examples_train_py_trains_are_its_configs_without_overrides():
    from jaxfit.tune.model import EXAMPLE_SCRIPT_CONFIGS

    configs = _train_py_configs()
    for example, config in EXAMPLE_SCRIPT_CONFIGS.items():
        assert config in configs, config
        assert ast.literal_eval(configs[config]["model"]) == example
        assert "model_overrides" not in configs[config], f"{config} changes {example}: not the example as tuned"


def test_an_example_tune_trains_with_jaxfit_run_of_train_py_or_names_its_settings():
    from jaxfit.fit.sources import ExampleSource
    from jaxfit.tune.model import Target

    full_bf16, none_f32 = (
        example_settings(["full"], ["bfloat16"])[0],
        example_settings(["none"], ["float32"])[0],
    )
    dots = example_settings(["dots"], ["float32"])[0]
    small = Target(example=ExampleSource("gpt-small"))
    assert small.train_command(full_bf16, 8, 4, 0.45) == [
        "jaxfit", "run", "--mem-fraction=0.45", "--batch-size=8", "--global-batch=32",
        "--", "python", "scripts/train.py", "gpt_small", "--exp-name=tuned", "--remat=full", "--precision=bfloat16",
    ]  # fmt: skip
    assert small.train_command(none_f32, 16, 1, 0.3)[2:5] == ["--mem-fraction=0.3", "--batch-size=16", "--"]
    assert "--remat=dots" in small.train_command(dots, 2, 1, 0.5)
    assert "--remat=none" in small.train_command(none_f32, 2, 1, 0.5)
    # no script trains gpt-tiny, nor gpt-small changed by the user's own --set: the settings are the answer
    assert Target(example=ExampleSource("gpt-tiny")).train_command(none_f32, 2, 1, 0.5) is None
    changed = Target(example=ExampleSource("gpt-small", (("n_layers", "2"),)))
    assert changed.train_command(none_f32, 2, 1, 0.5) is None
