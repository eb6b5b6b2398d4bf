"""Tests of the bundled example models, configs and workloads (CPU; only tiny models compile)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from jaxfit import examples
from jaxfit.errors import ConfigError
from jaxfit.examples import configs as configs_module
from jaxfit.fit.workload import Workload

pytestmark = pytest.mark.slow  # real subprocesses and compiles

TINY = ["gpt-tiny", "vit-tiny", "mlp-tiny"]
LARGE = ["gpt-small", "gpt-medium-bf16-remat", "vit-small", "mlp"]
# A GPT small enough to train and compile twice in a few seconds.
MINI_GPT = {"n_layers": "1", "seq_len": "32", "d_model": "64", "vocab_size": "256"}


def _memory(workload: Workload, batch_size: int) -> Any:
    stats = workload.lower(batch_size).compile().memory_analysis()
    assert stats is not None
    return stats


def _param_bytes(cfg: examples.ModelConfig) -> int:
    _, (params, _) = examples.abstract_state(cfg)
    return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(params))


def test_list_examples_has_bundled_configs() -> None:
    names = examples.list_examples()
    assert names == sorted(names)
    assert set(TINY + LARGE) <= set(names)
    assert examples.DEFAULT_EXAMPLE == "gpt-tiny" and examples.DEFAULT_EXAMPLE in names
    for name in names:
        description = examples.example_description(name)
        assert description and "\n" not in description


@pytest.mark.parametrize("name", TINY)
def test_tiny_workload_compiles_and_memory_grows_with_batch(name: str) -> None:
    workload = examples.build_workload(name)
    cfg = examples.load_config(name)
    count = workload.description["param_count"]
    assert workload.donate_argnums == (0,)
    small, large = _memory(workload, 1), _memory(workload, 8)
    # float32 params + AdamW mu + nu are all arguments of the step.
    assert cfg.dtype == "float32"
    assert small.argument_size_in_bytes >= 3 * 4 * count
    assert large.argument_size_in_bytes > small.argument_size_in_bytes  # the batch grew
    assert (
        large.temp_size_in_bytes + large.argument_size_in_bytes
        > small.temp_size_in_bytes + small.argument_size_in_bytes
    )
    assert large.temp_size_in_bytes > small.temp_size_in_bytes


@pytest.mark.parametrize("name", TINY + LARGE)
def test_abstract_state_allocates_nothing(name: str) -> None:
    cfg = examples.load_config(name)
    _, state = examples.abstract_state(cfg)
    leaves = jax.tree_util.tree_leaves(state)
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    batch = examples.batch_spec(cfg, 2)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(batch))


def test_param_count_matches_concrete_init() -> None:
    cfg = examples.load_config("gpt-tiny", MINI_GPT)
    _, (params, opt_state) = examples.init_state(cfg, 0)
    _, (abstract_params, abstract_opt) = examples.abstract_state(cfg)
    assert examples.param_count(params) == examples.param_count(abstract_params)
    shapes = jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), (params, opt_state))
    abstract_shapes = jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), (abstract_params, abstract_opt))
    assert shapes == abstract_shapes
    d, v, t = 64, 256, 32
    block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    assert examples.param_count(params) == v * d + t * d + block + 2 * d + d * v


@pytest.mark.parametrize(
    ("name", "overrides", "ratio"),
    [
        ("gpt-tiny", {**MINI_GPT, "learning_rate": "3e-3"}, 0.75),
        ("vit-tiny", {"n_layers": "1", "d_model": "64", "learning_rate": "1e-3"}, 0.75),
        ("mlp-tiny", {"learning_rate": "1e-3"}, 0.75),
    ],
)
def test_real_training_reduces_loss(name: str, overrides: dict[str, str], ratio: float) -> None:
    cfg = examples.load_config(name, overrides)
    tx = examples.make_optimizer(cfg)
    graphdef, state = examples.init_state(cfg, jax.random.key(0), tx)
    step = jax.jit(examples.make_train_step(cfg, graphdef, tx), donate_argnums=0)
    losses = []
    for i in range(20):
        batch = examples.synthetic_batch(cfg, 8, jax.random.key(100 + i))
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert all(jnp.isfinite(jnp.asarray(losses)))
    assert sum(losses[-3:]) / 3 < ratio * losses[0], losses


@pytest.mark.parametrize("name", TINY)
def test_synthetic_batch_matches_batch_spec(name: str) -> None:
    cfg = examples.load_config(name)
    spec = examples.batch_spec(cfg, 3)
    batch = examples.synthetic_batch(cfg, 3, 7)
    as_spec = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), batch)
    assert as_spec == spec


@pytest.mark.parametrize(
    ("name", "overrides", "expected"),
    [
        ("no-such-example", None, "available examples: "),
        ("", None, "empty"),
        ("gpt-tiny", {"d_modle": "128"}, "valid keys: d_model, n_layers"),
        ("gpt-tiny", {"family": "vit"}, "unknown gpt config key 'family'"),
        ("mlp-tiny", {"remat": "true"}, "valid keys: input_dim"),
        ("gpt-tiny", {"d_model": "big"}, "not an integer"),
        ("gpt-tiny", {"n_layers": "2.5"}, "not an integer"),
        ("gpt-tiny", {"learning_rate": "fast"}, "not a number"),
        ("gpt-tiny", {"learning_rate": "nan"}, "not a number"),
        ("gpt-tiny", {"remat": "maybe"}, "not a boolean"),
        ("gpt-tiny", {"dtype": "float16"}, "use one of: float32, bfloat16"),
        ("gpt-tiny", {"n_layers": "0"}, "must be a positive integer"),
        ("vit-tiny", {"patch_size": "-4"}, "must be a positive integer"),
        ("mlp-tiny", {"hidden_dim": "0"}, "must be a positive integer"),
        ("gpt-tiny", {"learning_rate": "0"}, "must be a positive number"),
        ("gpt-tiny", {"weight_decay": "-0.1"}, "must be zero or more"),
        ("gpt-tiny", {"d_model": "250"}, "d_model=250 is not divisible by n_heads=4"),
        ("vit-tiny", {"image_size": "30"}, "image_size=30 is not divisible by patch_size=4"),
        ("/no/such/dir/config.yaml", None, "cannot read config file"),
    ],
)
def test_load_config_rejects_bad_input(name: str, overrides: dict[str, str] | None, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        examples.load_config(name, overrides)
    message = str(info.value)
    assert expected in message
    assert message and "\n" not in message


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("family: gpt\nd_model: [1, 2\n", "malformed YAML (line"),
        ("family: gpt\n\td_model: 3\n", "malformed YAML"),
        ("- family\n- gpt\n", "expected a mapping"),
        ("", "expected a mapping"),
        ("description: a queue file\njobs: []\n", "no 'family' key"),
        ("family: rnn\n", "unknown family 'rnn'; use one of: gpt, mlp, vit"),
        ("family: gpt\nwidth: 3\n", "unknown gpt config key 'width'"),
        ("family: gpt\nd_model: 3.5\n", "not an integer"),
        ("family: gpt\nremat: 2\n", "not a boolean"),
        ("family: gpt\nn_heads:\n", "has no value"),
        ("family: mlp\ndtype: 32\n", "not supported"),
    ],
)
def test_load_config_rejects_bad_files(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        examples.load_config(str(path))
    message = str(info.value)
    assert expected in message
    assert "\n" not in message and str(path) in message


def test_load_config_reads_a_yaml_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("family: vit\ndescription: mine\nimage_size: 64\npatch_size: 8\n")
    cfg = examples.load_config(str(path), {"n_layers": "1"})
    assert isinstance(cfg, examples.ViTConfig)
    assert (cfg.image_size, cfg.patch_size, cfg.n_layers) == (64, 8, 1)
    assert cfg.d_model == examples.ViTConfig().d_model  # defaults fill the rest
    workload = examples.build_workload(str(path))
    assert workload.name == "mine" and workload.description["example"] == "mine"


def test_examples_package_skips_non_examples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "fake_configs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "alpha.yaml").write_text("family: mlp\ndescription: one\nn_layers: 1\n")
    (package / "queue.yaml").write_text("jobs:\n  - example: alpha\n")
    (package / "broken.yaml").write_text("family: [\n")
    (package / "notes.txt").write_text("family: gpt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(configs_module, "EXAMPLES_PACKAGE", "fake_configs")
    assert examples.list_examples() == ["alpha"]
    assert examples.load_config("alpha").n_layers == 1
    with pytest.raises(ConfigError, match="no 'family' key"):
        examples.load_config("queue")
    with pytest.raises(ConfigError, match="malformed YAML"):
        examples.load_config("broken")
    with pytest.raises(ConfigError, match=r"available examples: alpha$"):
        examples.load_config("notes")


def test_override_changes_config() -> None:
    base = examples.load_config("gpt-tiny")
    cfg = examples.load_config(
        "gpt-tiny", {"d_model": "128", "remat": "yes", "learning_rate": "1e-3", "dtype": "bfloat16"}
    )
    assert isinstance(cfg, examples.GPTConfig)
    assert (cfg.d_model, cfg.remat, cfg.learning_rate, cfg.dtype) == (128, True, 1e-3, "bfloat16")
    assert cfg.n_layers == base.n_layers and cfg.vocab_size == base.vocab_size
    assert base.d_model != 128
    # Native (non-string) values are accepted too, as from Python callers.
    assert examples.load_config("gpt-tiny", {"n_layers": 2}).n_layers == 2


def test_parse_overrides() -> None:
    assert examples.parse_overrides(["d_model=512", " remat = true "]) == {
        "d_model": "512",
        "remat": "true",
    }
    with pytest.raises(ConfigError, match="must look like KEY=VALUE"):
        examples.parse_overrides(["d_model"])


def test_config_dataclasses_validate_directly() -> None:
    assert examples.GPTConfig().d_model > 0
    with pytest.raises(ConfigError, match="not divisible"):
        examples.GPTConfig(d_model=10, n_heads=3)
    with pytest.raises(ConfigError, match="is not of type int"):
        examples.MLPConfig(n_layers=True)  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        examples.MLPConfig().n_layers = 2  # type: ignore[misc]


def test_bfloat16_gives_bf16_params_and_optimizer_state() -> None:
    cfg = examples.load_config("gpt-tiny", {"dtype": "bfloat16"})
    _, (params, opt_state) = examples.abstract_state(cfg)
    assert {x.dtype for x in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    float_opt = [x for x in jax.tree_util.tree_leaves(opt_state) if x.ndim > 0]
    assert float_opt and {x.dtype for x in float_opt} == {jnp.dtype(jnp.bfloat16)}
    # Concrete init and one step keep the dtype (small model).
    small = examples.load_config("gpt-tiny", {**MINI_GPT, "dtype": "bfloat16"})
    graphdef, state = examples.init_state(small, 0)
    step = jax.jit(examples.make_train_step(small, graphdef, examples.make_optimizer(small)))
    new_state, metrics = step(state, examples.synthetic_batch(small, 2, 0))
    assert metrics["loss"].dtype == jnp.float32 and jnp.isfinite(metrics["loss"])
    assert {x.dtype for x in jax.tree_util.tree_leaves(new_state[0])} == {jnp.dtype(jnp.bfloat16)}


def test_remat_compiles_and_does_not_raise_temp() -> None:
    small = {"n_layers": "2", "seq_len": "64", "vocab_size": "512"}
    plain = examples.build_workload("gpt-tiny", {**small, "remat": "false"})
    remat = examples.build_workload("gpt-tiny", {**small, "remat": "true"})
    plain_lowered, remat_lowered = plain.lower(4), remat.lower(4)
    # Remat is really applied: each block's forward is recomputed behind an optimization barrier.
    assert "optimization_barrier" not in plain_lowered.as_text()
    assert remat_lowered.as_text().count("optimization_barrier") >= 2
    plain_temp = plain_lowered.compile().memory_analysis().temp_size_in_bytes
    remat_temp = remat_lowered.compile().memory_analysis().temp_size_in_bytes
    if jax.default_backend() == "cpu":
        # XLA:CPU drops the optimization barriers before CSE, which merges the recomputation back
        # into the forward pass: the temp stays within a few percent of the plain step's.
        assert remat_temp <= plain_temp * 1.05
    else:
        assert remat_temp < plain_temp


@pytest.mark.parametrize("name", LARGE)
def test_large_examples_lower_at_batch_one(name: str) -> None:
    workload = examples.build_workload(name)
    lowered = workload.lower(1)
    assert lowered.as_text()
    json.dumps(dict(workload.description))  # JSON-serialisable for reports and the cache


def test_gpt_small_param_count() -> None:
    workload = examples.build_workload("gpt-small")
    assert 100_000_000 <= workload.description["param_count"] <= 135_000_000


def test_workload_description_and_name() -> None:
    workload = examples.build_workload("gpt-tiny", {"d_model": "128"})
    description = dict(workload.description)
    assert workload.name == "gpt-tiny[d_model=128]"
    assert description["example"] == "gpt-tiny" and description["family"] == "gpt"
    assert description["config"]["d_model"] == 128
    assert description["overrides"] == {"d_model": "128"}
    cfg = examples.load_config("gpt-tiny", {"d_model": "128"})
    assert description["param_count"] * 4 == _param_bytes(cfg)
    json.dumps(description)


def test_config_half_imports_without_jax() -> None:
    # jaxfit's parent process validates examples without importing JAX (it compiles in a child).
    code = (
        "import sys\n"
        "from jaxfit.examples import DEFAULT_EXAMPLE, example_description, list_examples, load_config\n"
        "load_config(DEFAULT_EXAMPLE, {'n_layers': '2'}); list_examples(); example_description('mlp')\n"
        "heavy = sorted(m for m in ('jax', 'flax', 'optax') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_examples_are_found_in_the_checkout_when_jaxfit_is_not_installed(monkeypatch):
    """Run from a source tree on PYTHONPATH (a GPU machine with only the checkout), there is no
    ``jaxfit.configs`` package: the checkout's ``configs/`` folder holds the examples. A schedule's
    calibration died there with a traceback (ModuleNotFoundError) before this."""
    from jaxfit.examples import configs

    installed = configs.list_examples()
    monkeypatch.setattr(configs, "EXAMPLES_PACKAGE", "jaxfit.not_installed_configs")
    assert configs.list_examples() == installed and "mlp-tiny" in installed
    assert type(configs.load_config("mlp-tiny")).__name__ == "MLPConfig"


def test_a_stacked_step_is_the_accumulated_step_on_the_same_samples() -> None:
    """``jaxfit tune`` ranks micro-batches on steps whose micro-batches come stacked (one workload
    for every accumulation of a global batch): the same loss and update as the step training runs,
    which splits the flat batch itself, and a batch spec of the stacked shape."""
    cfg = examples.load_config("gpt-tiny", MINI_GPT)
    accumulated = dataclasses.replace(cfg, grad_accum_steps=4)
    tx = examples.make_optimizer(cfg)
    graphdef, state = examples.init_state(cfg, jax.random.key(0), tx)
    flat = examples.synthetic_batch(cfg, 8, jax.random.key(1))
    # the flat step's micro-batch k takes samples k, k + 4 (moveaxis of a [2, 4, ...] reshape)
    stacked = jax.tree_util.tree_map(lambda x: jnp.moveaxis(x.reshape(2, 4, *x.shape[1:]), 1, 0), flat)
    spec = examples.training.stacked_batch_spec(cfg, 2, 8)
    assert jax.tree_util.tree_map(lambda s: s.shape, spec) == jax.tree_util.tree_map(lambda x: x.shape, stacked)
    want = jax.jit(examples.make_train_step(accumulated, graphdef, tx))(state, flat)
    got = jax.jit(examples.make_train_step(cfg, graphdef, tx, stacked=True))(state, stacked)
    assert jnp.allclose(want[1]["loss"], got[1]["loss"], rtol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(want[0]), jax.tree_util.tree_leaves(got[0]), strict=True):
        assert jnp.allclose(a, b, rtol=1e-5, atol=1e-7)
    # one micro-batch stacked is the plain step
    one = jax.tree_util.tree_map(lambda x: x[None], flat)
    plain = jax.jit(examples.make_train_step(cfg, graphdef, tx))(state, flat)
    single = jax.jit(examples.make_train_step(cfg, graphdef, tx, stacked=True))(state, one)
    assert jnp.allclose(plain[1]["loss"], single[1]["loss"], rtol=1e-6)
    with pytest.raises(ConfigError, match="micro-batch 3 does not divide the global batch 8"):
        examples.training.stacked_batch_spec(cfg, 3, 8)
