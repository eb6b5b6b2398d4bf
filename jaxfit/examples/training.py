"""The example workloads' training pieces: train state, optimizer, synthetic batches, loss, the
train step and the :class:`~jaxfit.Workload` of a config (re-exported by :mod:`jaxfit.examples`).

JAX, flax, optax and the models are imported inside the functions that use them, so that the
config half of the package imports in milliseconds.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from jaxfit.errors import ConfigError
from jaxfit.examples.configs import DEFAULT_EXAMPLE, GPTConfig, MLPConfig, ModelConfig, ViTConfig, load_config
from jaxfit.fit.workload import Workload, from_state

if TYPE_CHECKING:
    import jax
    import optax
    from flax import nnx


TrainState = tuple[Any, Any]
"""``(params, opt_state)``: an ``nnx.State`` of parameters and the optax state."""

Batch = dict[str, Any]
TrainStep = Callable[[TrainState, Batch], tuple[TrainState, dict[str, "jax.Array"]]]


def _as_key(rng: int | jax.Array) -> jax.Array:
    """A ``jax.random`` key from a seed, or the key itself."""
    import jax

    if isinstance(rng, numbers.Integral):
        return jax.random.key(int(rng))
    assert not isinstance(rng, int)
    return rng


def make_optimizer(cfg: ModelConfig) -> optax.GradientTransformation:
    """AdamW with ``cfg.learning_rate`` and ``cfg.weight_decay`` (decay on matrices only).

    The moments take the parameters' dtype, so a bfloat16 model has a bfloat16 optimizer state.
    """
    import jax
    import optax

    return optax.adamw(
        learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        mask=lambda params: jax.tree_util.tree_map(lambda p: p.ndim >= 2, params),
    )


def _split_params(model: nnx.Module) -> tuple[nnx.GraphDef[Any], nnx.State]:
    """``(graphdef, params)`` of a model whose state is all ``nnx.Param``."""
    import jax
    from flax import nnx

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)  # type: ignore[misc]
    if jax.tree_util.tree_leaves(rest):
        raise TypeError("example models must hold only nnx.Param state")
    return graphdef, params


def init_state(
    cfg: ModelConfig, rng: int | jax.Array, tx: optax.GradientTransformation | None = None
) -> tuple[nnx.GraphDef[Any], TrainState]:
    """Initialise a model and its optimizer state with concrete arrays.

    Args:
      cfg: The model config.
      rng: A seed or a ``jax.random`` key for the parameter initialisers.
      tx: The optimizer (default :func:`make_optimizer`).

    Returns:
      ``(graphdef, (params, opt_state))``; ``graphdef`` rebuilds the model with ``nnx.merge``.
    """
    import jax
    from flax import nnx

    from jaxfit.examples.models import build_model

    tx = make_optimizer(cfg) if tx is None else tx
    graphdef, _ = abstract_state(cfg, tx)

    @jax.jit
    def init(key: jax.Array) -> TrainState:
        # One compiled initialiser, rather than an eagerly dispatched op per parameter.
        _, params = _split_params(build_model(cfg, nnx.Rngs(params=key)))
        return params, tx.init(params)

    return graphdef, init(_as_key(rng))


def abstract_state(
    cfg: ModelConfig, tx: optax.GradientTransformation | None = None
) -> tuple[nnx.GraphDef[Any], TrainState]:
    """Like :func:`init_state` but every leaf is a ``jax.ShapeDtypeStruct``: nothing is allocated.

    Args:
      cfg: The model config.
      tx: The optimizer (default :func:`make_optimizer`).

    Returns:
      ``(graphdef, (params, opt_state))`` with abstract leaves.
    """
    import jax
    from flax import nnx

    from jaxfit.examples.models import build_model

    tx = make_optimizer(cfg) if tx is None else tx
    model = nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(params=0)))
    graphdef, params = _split_params(model)
    return graphdef, (params, jax.eval_shape(tx.init, params))


def param_count(params: Any) -> int:
    """Number of scalars in a pytree of (abstract or concrete) arrays."""
    import jax

    return sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(params))


def batch_spec(cfg: ModelConfig, batch_size: int) -> Batch:
    """The abstract training batch of ``batch_size`` samples.

    * GPT: ``{"tokens": int32[B, seq_len + 1]}`` (inputs are ``tokens[:, :-1]``, targets
      ``tokens[:, 1:]``).
    * ViT: ``{"images": dtype[B, image_size, image_size, channels], "labels": int32[B]}``.
    * MLP: ``{"inputs": dtype[B, input_dim], "labels": int32[B]}``.
    """
    import jax
    import jax.numpy as jnp

    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    labels = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
    if isinstance(cfg, GPTConfig):
        return {"tokens": jax.ShapeDtypeStruct((batch_size, cfg.seq_len + 1), jnp.int32)}
    if isinstance(cfg, ViTConfig):
        shape = (batch_size, cfg.image_size, cfg.image_size, cfg.channels)
        return {"images": jax.ShapeDtypeStruct(shape, jnp.dtype(cfg.dtype)), "labels": labels}
    if isinstance(cfg, MLPConfig):
        return {"inputs": jax.ShapeDtypeStruct((batch_size, cfg.input_dim), jnp.dtype(cfg.dtype)), "labels": labels}
    raise TypeError(f"not a model config: {type(cfg).__name__}")


def synthetic_batch(cfg: ModelConfig, batch_size: int, rng: int | jax.Array) -> Batch:
    """A concrete batch matching :func:`batch_spec`, with structure a model can learn.

    * GPT: each row counts up by one from a random start (modulo ``vocab_size``), so the next
      token is predictable from the current one.
    * ViT and MLP: random labels; each input is a fixed pattern of its class plus uniform noise.

    Args:
      cfg: The model config.
      batch_size: Samples in the batch.
      rng: A seed or a ``jax.random`` key.
    """
    return _jitted_synthetic_batch()(cfg, batch_size, _as_key(rng))


@functools.cache
def _jitted_synthetic_batch() -> Callable[[ModelConfig, int, jax.Array], Batch]:
    """:func:`_synthetic_batch` under ``jax.jit`` (compiled once per config and batch size)."""
    import jax

    return jax.jit(_synthetic_batch, static_argnums=(0, 1))


def _synthetic_batch(cfg: ModelConfig, batch_size: int, key: jax.Array) -> Batch:
    """The body of :func:`synthetic_batch`, traced under ``jax.jit``."""
    import jax
    import jax.numpy as jnp

    spec = batch_spec(cfg, batch_size)
    if isinstance(cfg, GPTConfig):
        start = jax.random.randint(key, (batch_size, 1), 0, cfg.vocab_size, jnp.int32)
        offsets = jnp.arange(cfg.seq_len + 1, dtype=jnp.int32)[None, :]
        return {"tokens": (start + offsets) % cfg.vocab_size}

    label_key, noise_key = jax.random.split(key)
    input_name = "images" if isinstance(cfg, ViTConfig) else "inputs"
    input_spec = spec[input_name]
    labels = jax.random.randint(label_key, (batch_size,), 0, cfg.num_classes, jnp.int32)
    # A fixed per-class pattern: a cosine over the flattened input, its frequency and phase set by
    # the class (cheap to compile, unlike per-class random prototypes).
    feature = jnp.arange(math.prod(input_spec.shape[1:]), dtype=jnp.float32)
    label = labels.astype(jnp.float32)[:, None]
    prototypes = jnp.cos(feature[None, :] * (0.37 * (label + 1.0)) + 1.3 * label)
    prototypes = prototypes.reshape(input_spec.shape)
    noise = jax.random.uniform(noise_key, input_spec.shape, jnp.float32, -1.0, 1.0)
    inputs = (prototypes + 0.5 * noise).astype(input_spec.dtype)
    return {input_name: inputs, "labels": labels}


def loss_fn(cfg: ModelConfig, model: nnx.Module, batch: Batch) -> jax.Array:
    """Mean cross-entropy of ``model`` on ``batch``, computed in float32.

    Next-token prediction for GPT; classification for ViT and MLP.
    """
    import jax.numpy as jnp
    import optax

    if isinstance(cfg, GPTConfig):
        tokens = batch["tokens"]
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
    elif isinstance(cfg, ViTConfig):
        inputs, targets = batch["images"], batch["labels"]
    elif isinstance(cfg, MLPConfig):
        inputs, targets = batch["inputs"], batch["labels"]
    else:
        raise TypeError(f"not a model config: {type(cfg).__name__}")
    logits = model(inputs).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def make_train_step(
    cfg: ModelConfig, graphdef: nnx.GraphDef[Any], tx: optax.GradientTransformation, *, stacked: bool = False
) -> TrainStep:
    """The pure (un-jitted) train step ``(state, batch) -> (new_state, {"loss": loss})``.

    Args:
      cfg: The model config (selects the loss and batch format).
      graphdef: The model graph from :func:`init_state` or :func:`abstract_state`.
      tx: The optimizer whose state is in ``state``.
      stacked: The batch comes as micro-batches stacked on a leading axis (``[steps, micro, ...]``,
        :func:`stacked_batch_spec`), gradients summed over them as with ``grad_accum_steps``: every
        accumulation of one global batch is then one workload whose batch size is the micro-batch
        (``jaxfit tune`` ranks micro-batches on these programs; training runs the flat batch).

    Returns:
      The step function; jit it with ``donate_argnums=0`` to update the state in place.
    """
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    steps = cfg.grad_accum_steps

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        params, opt_state = state

        def loss_of(params: nnx.State, micro: Batch) -> jax.Array:
            return loss_fn(cfg, nnx.merge(graphdef, params), micro)

        def accumulated(micro_batches: Batch) -> tuple[jax.Array, Any]:
            """Mean loss and gradients over the leading axis, summed in float32 (one live at a time)."""
            count = jax.tree_util.tree_leaves(micro_batches)[0].shape[0]

            def accumulate(carry: Any, micro: Batch) -> tuple[Any, None]:
                loss_sum, grad_sum = carry
                loss, grads = jax.value_and_grad(loss_of)(params, micro)
                grad_sum = jax.tree_util.tree_map(lambda t, g: t + g.astype(jnp.float32), grad_sum, grads)
                return (loss_sum + loss, grad_sum), None

            zeros = jax.tree_util.tree_map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
            (loss_sum, grad_sum), _ = jax.lax.scan(accumulate, (jnp.zeros((), jnp.float32), zeros), micro_batches)
            return loss_sum / count, jax.tree_util.tree_map(lambda g, p: (g / count).astype(p.dtype), grad_sum, params)

        count = jax.tree_util.tree_leaves(batch)[0].shape[0] if stacked else steps
        if stacked and count == 1:  # one micro-batch: the plain step, as training runs it
            loss, grads = jax.value_and_grad(loss_of)(params, jax.tree_util.tree_map(lambda x: x[0], batch))
        elif stacked:
            loss, grads = accumulated(batch)
        elif steps == 1:
            loss, grads = jax.value_and_grad(loss_of)(params, batch)
        else:  # the batch as ``steps`` micro-batches
            loss, grads = accumulated(
                jax.tree_util.tree_map(
                    lambda x: jnp.moveaxis(x.reshape(x.shape[0] // steps, steps, *x.shape[1:]), 1, 0), batch
                )
            )
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return (params, opt_state), {"loss": loss}

    return train_step


def stacked_batch_spec(cfg: ModelConfig, micro_batch: int, global_batch: int) -> Batch:
    """:func:`batch_spec` of ``micro_batch`` with a leading axis of ``global_batch / micro_batch``:
    the batch of a step made with ``stacked=True`` (:func:`make_train_step`).

    Raises:
      ConfigError: ``micro_batch`` does not divide ``global_batch``.
    """
    import jax

    if micro_batch < 1 or global_batch % micro_batch:
        raise ConfigError(
            f"micro-batch {micro_batch} does not divide the global batch {global_batch}; pick one of its divisors"
        )
    return jax.tree_util.tree_map(
        lambda s: jax.ShapeDtypeStruct((global_batch // micro_batch, *s.shape), s.dtype),
        batch_spec(cfg, micro_batch),
    )


def workload_from_config(
    cfg: ModelConfig,
    name: str,
    *,
    example: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    stacked_to: int | None = None,
) -> Workload:
    """The abstract train-step :class:`~jaxfit.fit.workload.Workload` of a config (nothing allocated).

    Args:
      cfg: The model config.
      name: The workload's name.
      example: The example it came from (reported in the description).
      overrides: The overrides applied to the example (reported in the description).
      stacked_to: A global batch: the workload's batch size is then a micro-batch of it, the
        step's batch its micro-batches stacked (``make_train_step(stacked=True)``), so that every
        accumulation of that global batch is this one workload (``jaxfit tune``'s ranking).
    """
    tx = make_optimizer(cfg)
    graphdef, state = abstract_state(cfg, tx)
    description: dict[str, Any] = {
        "example": example if example is not None else name,
        "family": cfg.family,
        "config": dataclasses.asdict(cfg),
        "param_count": param_count(state[0]),
        "field_names": {"state": ["params", "opt_state"]},
    }
    if overrides:
        description["overrides"] = {str(k): str(v) for k, v in overrides.items()}
    if stacked_to is not None:
        if cfg.grad_accum_steps != 1:
            raise ConfigError("a stacked workload accumulates to its global batch; leave grad_accum_steps at 1")
        description["stacked_to"] = stacked_to
        total = stacked_to
        return from_state(
            f"{name}[micro-batches of {stacked_to}]",
            make_train_step(cfg, graphdef, tx, stacked=True),
            state,
            lambda micro: stacked_batch_spec(cfg, micro, total),
            donate_state=True,
            description=description,
        )
    return from_state(
        name,
        make_train_step(cfg, graphdef, tx),
        state,
        lambda batch_size: batch_spec(cfg, batch_size),
        donate_state=True,
        description=description,
    )


def build_workload(
    name: str = DEFAULT_EXAMPLE, overrides: Mapping[str, Any] | None = None, stacked_to: int | None = None
) -> Workload:
    """The abstract train-step workload of an example config, with overrides applied.

    Args:
      name: An example name (see :func:`list_examples`) or a path to a YAML config file.
      overrides: ``key -> value`` (strings from ``--set key=value`` are parsed).
      stacked_to: See :func:`workload_from_config`.

    Returns:
      A workload whose name is the example name, followed by ``[key=value,...]`` when overridden.

    Raises:
      jaxfit.errors.ConfigError: A bad example name, override or config file.
    """
    cfg = load_config(name, overrides)
    example = name.strip()
    if example.endswith((".yaml", ".yml")) or "/" in example or "\\" in example:
        example = example.replace("\\", "/").rsplit("/", 1)[-1].rsplit(".", 1)[0]
    label = example
    if overrides:
        label += "[" + ",".join(f"{k}={v}" for k, v in overrides.items()) + "]"
    return workload_from_config(cfg, label, example=example, overrides=overrides, stacked_to=stacked_to)
