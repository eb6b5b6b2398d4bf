"""Bundled example workloads: GPT, ViT and MLP train steps built from the YAML example configs.

The pieces are usable both abstractly (what jaxfit compiles, nothing allocated) and for real
training with concrete arrays::

    cfg = load_config("gpt-tiny", {"n_layers": "2"})
    graphdef, state = init_state(cfg, jax.random.key(0))         # concrete params + AdamW state
    step = jax.jit(make_train_step(cfg, graphdef, make_optimizer(cfg)), donate_argnums=0)
    state, metrics = step(state, synthetic_batch(cfg, 8, jax.random.key(1)))

    workload = build_workload("gpt-tiny")                         # abstract: for jaxfit
    workload.lower(32).compile().memory_analysis()

The train state is the plain pytree ``(params, opt_state)``: ``params`` is the ``nnx.State`` of the
model's parameters and ``opt_state`` the optax AdamW state of the same dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jaxfit.examples.configs import (
    DEFAULT_EXAMPLE,
    EXAMPLES_PACKAGE,
    GPTConfig,
    MLPConfig,
    ModelConfig,
    ViTConfig,
    example_description,
    list_examples,
    load_config,
    make_config,
    parse_overrides,
)
from jaxfit.examples.training import (
    Batch,
    TrainState,
    TrainStep,
    abstract_state,
    batch_spec,
    build_workload,
    init_state,
    loss_fn,
    make_optimizer,
    make_train_step,
    param_count,
    synthetic_batch,
    workload_from_config,
)

if TYPE_CHECKING:
    from jaxfit.examples.models import GPT, MLP, Block, ViT, build_model

# JAX, flax, optax and the models are imported inside the functions that use them, so that the
# config half of this package (names, loading, validation) imports in milliseconds: jaxfit's
# parent process validates examples and answers from its cache without importing JAX.
_LAZY_MODEL_NAMES = frozenset({"GPT", "MLP", "Block", "ViT", "build_model"})

__all__ = [
    "DEFAULT_EXAMPLE",
    "EXAMPLES_PACKAGE",
    "GPT",
    "MLP",
    "Batch",
    "Block",
    "GPTConfig",
    "MLPConfig",
    "ModelConfig",
    "TrainState",
    "TrainStep",
    "ViT",
    "ViTConfig",
    "abstract_state",
    "batch_spec",
    "build_model",
    "build_workload",
    "example_description",
    "init_state",
    "list_examples",
    "load_config",
    "loss_fn",
    "make_config",
    "make_optimizer",
    "make_train_step",
    "param_count",
    "parse_overrides",
    "synthetic_batch",
    "workload_from_config",
]


def __getattr__(name: str) -> Any:
    """Import the model classes on first use (see the note on lazy imports above)."""
    if name in _LAZY_MODEL_NAMES:
        from jaxfit.examples import models

        return getattr(models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
