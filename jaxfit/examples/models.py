"""The example models, written with flax nnx: a GPT-style decoder LM, a ViT and an MLP classifier.

Parameters and compute use the config's ``dtype`` (``float32`` or ``bfloat16``); models return
logits in that dtype and the loss (see :mod:`jaxfit.examples`) upcasts them to float32.
"""

from __future__ import annotations

import itertools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxfit.examples.configs import GPTConfig, MLPConfig, ModelConfig, ViTConfig

# flax >= 0.12 wants lists of submodules wrapped in nnx.List; older releases take plain lists.
_ModuleList: Any = getattr(nnx, "List", list)

_EMBED_INIT = nnx.initializers.normal(stddev=0.02)


def _dtype(name: str) -> jnp.dtype:
    """The jax dtype named by a config's ``dtype`` field."""
    return jnp.dtype(name)


class Block(nnx.Module):
    """A pre-LayerNorm transformer block: multi-head self-attention, then a 4x GELU MLP.

    Attention uses ``jax.nn.dot_product_attention`` with the XLA implementation (it materialises
    the ``[B, heads, T, T]`` scores, like a plain einsum implementation would).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        causal: bool,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ) -> None:
        """Create the block.

        Args:
          d_model: Width of the residual stream (divisible by ``n_heads``).
          n_heads: Number of attention heads.
          causal: Mask attention to earlier positions (decoder) or not (encoder).
          dtype: Parameter and compute dtype.
          rngs: Random streams for initialisation.
        """
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.causal = causal
        kw: dict[str, Any] = {"dtype": dtype, "param_dtype": dtype, "rngs": rngs}
        self.ln1 = nnx.LayerNorm(d_model, epsilon=1e-5, **kw)
        self.qkv = nnx.Linear(d_model, 3 * d_model, **kw)
        self.proj = nnx.Linear(d_model, d_model, **kw)
        self.ln2 = nnx.LayerNorm(d_model, epsilon=1e-5, **kw)
        self.fc1 = nnx.Linear(d_model, 4 * d_model, **kw)
        self.fc2 = nnx.Linear(4 * d_model, d_model, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        """Apply the block to ``x`` of shape ``[batch, tokens, d_model]``."""
        batch, tokens, d_model = x.shape
        head_dim = d_model // self.n_heads
        qkv = self.qkv(self.ln1(x)).reshape(batch, tokens, 3, self.n_heads, head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # each [B, T, heads, head_dim]
        attn = jax.nn.dot_product_attention(q, k, v, is_causal=self.causal, implementation="xla")
        x = x + self.proj(attn.reshape(batch, tokens, d_model))
        return x + self.fc2(jax.nn.gelu(self.fc1(self.ln2(x))))


REMAT_POLICIES = {
    "nothing": "nothing_saveable",
    "dots": "dots_saveable",
    "dots_no_batch": "dots_with_no_batch_dims_saveable",
}
"""``remat_policy`` -> the ``jax.checkpoint_policies`` member: save nothing (recompute the whole
block), save the outputs of matrix products, or only those without a batch dimension."""


def _run_blocks(blocks: Any, x: jax.Array, remat: bool, policy: str = "nothing") -> jax.Array:
    """Apply ``blocks`` in order; with ``remat``, recompute each block's activations on backward.

    The rematerialised path is functional: the block is split into its graph and state, and
    ``jax.checkpoint`` (its ``policy``, :data:`REMAT_POLICIES`) wraps ``merge(graph, state)(x)``;
    with ``nothing`` only the block's input is saved for the backward pass.
    """
    saveable = getattr(jax.checkpoint_policies, REMAT_POLICIES[policy])
    for block in blocks:
        if remat:
            graphdef, state = nnx.split(block)

            def apply(state: Any, x: jax.Array, graphdef: Any = graphdef) -> jax.Array:
                return nnx.merge(graphdef, state)(x)

            x = jax.checkpoint(apply, policy=saveable)(state, x)
        else:
            x = block(x)
    return x


class GPT(nnx.Module):
    """A GPT-style causal decoder language model.

    Token embedding plus a learned positional embedding, ``n_layers`` pre-LayerNorm causal
    transformer blocks, a final LayerNorm and an untied projection to the vocabulary.
    """

    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs) -> None:
        """Create the model.

        Args:
          cfg: Sizes, dtype and remat setting.
          rngs: Random streams for initialisation.
        """
        dtype = _dtype(cfg.dtype)
        self.remat = cfg.remat
        self.remat_policy = cfg.remat_policy
        self.seq_len = cfg.seq_len
        self.tok_emb = nnx.Embed(
            cfg.vocab_size,
            cfg.d_model,
            dtype=dtype,
            param_dtype=dtype,
            embedding_init=_EMBED_INIT,
            rngs=rngs,
        )
        self.pos_emb = nnx.Param(_EMBED_INIT(rngs.params(), (cfg.seq_len, cfg.d_model), dtype))
        self.blocks = _ModuleList(
            [Block(cfg.d_model, cfg.n_heads, causal=True, dtype=dtype, rngs=rngs) for _ in range(cfg.n_layers)]
        )
        self.ln_f = nnx.LayerNorm(cfg.d_model, epsilon=1e-5, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.head = nnx.Linear(cfg.d_model, cfg.vocab_size, use_bias=False, dtype=dtype, param_dtype=dtype, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Logits ``[batch, T, vocab_size]`` for int tokens ``[batch, T]`` with ``T <= seq_len``."""
        tokens_len = tokens.shape[-1]
        if tokens_len > self.seq_len:
            raise ValueError(f"{tokens_len} tokens exceed the model's seq_len={self.seq_len}")
        x = self.tok_emb(tokens) + self.pos_emb[:tokens_len]
        x = _run_blocks(self.blocks, x, self.remat, self.remat_policy)
        return self.head(self.ln_f(x))


class ViT(nnx.Module):
    """A vision transformer classifier.

    Non-overlapping patches are flattened and linearly embedded, a learned class token is
    prepended, a learned positional embedding added, then ``n_layers`` pre-LayerNorm
    (non-causal) transformer blocks, a final LayerNorm and a linear head on the class token.
    """

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs) -> None:
        """Create the model.

        Args:
          cfg: Sizes, dtype and remat setting.
          rngs: Random streams for initialisation.
        """
        dtype = _dtype(cfg.dtype)
        self.remat = cfg.remat
        self.remat_policy = cfg.remat_policy
        self.patch_size = cfg.patch_size
        num_patches = (cfg.image_size // cfg.patch_size) ** 2
        patch_dim = cfg.patch_size * cfg.patch_size * cfg.channels
        self.patch_embed = nnx.Linear(patch_dim, cfg.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.cls_token = nnx.Param(jnp.zeros((1, 1, cfg.d_model), dtype))
        self.pos_emb = nnx.Param(_EMBED_INIT(rngs.params(), (num_patches + 1, cfg.d_model), dtype))
        self.blocks = _ModuleList(
            [Block(cfg.d_model, cfg.n_heads, causal=False, dtype=dtype, rngs=rngs) for _ in range(cfg.n_layers)]
        )
        self.ln_f = nnx.LayerNorm(cfg.d_model, epsilon=1e-6, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.head = nnx.Linear(cfg.d_model, cfg.num_classes, dtype=dtype, param_dtype=dtype, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        """Logits ``[batch, num_classes]`` for images ``[batch, H, W, C]``."""
        batch, height, width, channels = images.shape
        p = self.patch_size
        patches = images.reshape(batch, height // p, p, width // p, p, channels)
        patches = patches.transpose(0, 1, 3, 2, 4, 5).reshape(batch, (height // p) * (width // p), p * p * channels)
        x = self.patch_embed(patches)
        cls = jnp.broadcast_to(self.cls_token[...], (batch, 1, x.shape[-1])).astype(x.dtype)
        x = jnp.concatenate([cls, x], axis=1) + self.pos_emb[...]
        x = _run_blocks(self.blocks, x, self.remat, self.remat_policy)
        return self.head(self.ln_f(x[:, 0]))


class MLP(nnx.Module):
    """An MLP classifier: ``n_layers`` GELU hidden layers of ``hidden_dim``, then a linear head."""

    def __init__(self, cfg: MLPConfig, *, rngs: nnx.Rngs) -> None:
        """Create the model.

        Args:
          cfg: Sizes and dtype.
          rngs: Random streams for initialisation.
        """
        dtype = _dtype(cfg.dtype)
        widths = [cfg.input_dim] + [cfg.hidden_dim] * cfg.n_layers
        self.layers = _ModuleList(
            [
                nnx.Linear(d_in, d_out, dtype=dtype, param_dtype=dtype, rngs=rngs)
                for d_in, d_out in itertools.pairwise(widths)
            ]
        )
        self.head = nnx.Linear(cfg.hidden_dim, cfg.num_classes, dtype=dtype, param_dtype=dtype, rngs=rngs)

    def __call__(self, inputs: jax.Array) -> jax.Array:
        """Logits ``[batch, num_classes]`` for inputs ``[batch, input_dim]``."""
        x = inputs
        for layer in self.layers:
            x = jax.nn.gelu(layer(x))
        return self.head(x)


def build_model(cfg: ModelConfig, rngs: nnx.Rngs) -> GPT | ViT | MLP:
    """Instantiate the model of ``cfg``'s family (allocates parameters; wrap in ``nnx.eval_shape``
    to get abstract ones)."""
    if isinstance(cfg, GPTConfig):
        return GPT(cfg, rngs=rngs)
    if isinstance(cfg, ViTConfig):
        return ViT(cfg, rngs=rngs)
    if isinstance(cfg, MLPConfig):
        return MLP(cfg, rngs=rngs)
    raise TypeError(f"not a model config: {type(cfg).__name__}")
