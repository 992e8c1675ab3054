"""GPT-2 (``transformers.GPT2LMHeadModel``) under Hugging Face's names and layouts.

Learned positions, pre-norm blocks, the fused ``c_attn`` and every projection in
``Conv1D``'s ``[in, out]`` layout, ``gelu_new`` (tanh GELU), and ``lm_head`` tied to
``transformer.wte``: ``transformer.wte.weight``, ``transformer.wpe.weight``,
``transformer.h.0.ln_1.weight``, ``transformer.h.0.attn.c_attn.weight`` ``[E, 3E]``, ...,
``transformer.ln_f.bias``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers import init as _init
from purelayers.layers import (
    GELU,
    AttentionCore,
    Embedding,
    Layer,
    LayerError,
    LayerNorm,
    Linear,
    ReLU,
    Repeat,
)
from purelayers.layers._checks import as_shape
from purelayers.models._causal import CausalLM, decoder_inputs, drop
from purelayers.models._parts import fold, init_children
from purelayers.models.config import Config

__all__ = ["GPT2Config", "GPT2LMHeadModel"]

_ACTIVATIONS = {
    "gelu_new": GELU(approximate="tanh"),
    "gelu_pytorch_tanh": GELU(approximate="tanh"),
    "gelu": GELU(),
    "relu": ReLU(),
}


@dataclasses.dataclass(frozen=True)
class GPT2Config(Config):
    """``transformers.GPT2Config``'s fields and defaults (the ones the model uses)."""

    model_type: ClassVar[str] = "gpt2"
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    reorder_and_upcast_attn: bool = False
    tie_word_embeddings: bool = True
    bos_token_id: int | None = 50256
    eos_token_id: int | None = 50256
    pad_token_id: int | None = None

    def __post_init__(self):
        super().__post_init__()
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPT2Config: {name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPT2Config: n_embd={self.n_embd} must be divisible by n_head={self.n_head}"
            )
        if self.activation_function not in _ACTIVATIONS:
            raise ValueError(
                f"GPT2Config: activation_function must be one of {sorted(_ACTIVATIONS)}, "
                f"got {self.activation_function!r}"
            )
        if self.scale_attn_by_inverse_layer_idx or self.reorder_and_upcast_attn:
            raise ValueError(
                "GPT2Config: scale_attn_by_inverse_layer_idx and reorder_and_upcast_attn "
                "are not supported"
            )


def _linear(config: GPT2Config, width: int, std: float | None = None) -> Linear:
    """A ``Conv1D``: ``[in, out]`` weight, normal(0, initializer_range) init, zero bias."""
    return Linear(
        width,
        transposed=True,
        weight_init=_init.normal(std=std or config.initializer_range),
        bias_init=_init.zeros(),
    )


@dataclasses.dataclass(frozen=True)
class GPT2Attention(Layer):
    """``c_attn`` (fused q, k, v, ``[E, 3E]``), causal attention, ``c_proj``."""

    c_attn: Layer
    c_proj: Layer
    core: AttentionCore

    def children(self) -> dict[str, Layer]:
        return {"c_attn": self.c_attn, "c_proj": self.c_proj}

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        return {
            "c_attn": self.c_attn.init(jax.random.fold_in(key, 0), shape, dtype),
            "c_proj": self.c_proj.init(jax.random.fold_in(key, 1), shape, dtype),
        }

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
        b, max_len, e = shape
        return self.core.init_cache((b, max_len), e // self.core.num_heads, dtype)

    def apply(self, params, x, *, mask=None, positions=None, cache=None, key=None, train=False):
        # the projections get keys of their own (a LoRA adapter's dropout draws from them)
        qkv = self.call("c_attn", params, x, key=fold(key, 101), train=train)
        q, k, v = jnp.split(qkv, 3, axis=-1)
        out = self.core.attend(
            q, k, v, mask=mask, cache=cache, key=key, train=train, layer="GPT2Attention"
        )
        out, cache = out if cache is not None else (out, None)
        y = self.call("c_proj", params, out, key=fold(key, 102), train=train)
        return y if cache is None else (y, cache)


@dataclasses.dataclass(frozen=True)
class GPT2Block(Layer):
    """``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``, with residual dropout."""

    ln_1: Layer
    attn: GPT2Attention
    ln_2: Layer
    mlp: Layer
    resid_pdrop: float = 0.0

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        return init_children(self, key, dict.fromkeys(self.children(), shape), dtype)

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
        return self.attn.init_cache(shape, dtype)

    def apply(self, params, x, *, mask=None, positions=None, cache=None, key=None, train=False):
        keys = [None] * 3 if key is None else list(jax.random.split(key, 3))
        h = self.call("ln_1", params, x)
        a = self.call("attn", params, h, mask=mask, cache=cache, key=keys[0], train=train)
        a, cache = a if cache is not None else (a, None)
        x = x + drop(a, self.resid_pdrop, keys[1], train)
        m = self.call("mlp", params, self.call("ln_2", params, x), key=fold(key, 3), train=train)
        x = x + drop(m, self.resid_pdrop, keys[2], train)
        return x if cache is None else (x, cache)


@dataclasses.dataclass(frozen=True)
class GPT2MLP(Layer):
    """``c_proj(act(c_fc(x)))``."""

    c_fc: Layer
    act: Layer
    c_proj: Layer

    def children(self) -> dict[str, Layer]:
        return {"c_fc": self.c_fc, "c_proj": self.c_proj}

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        fc = self.c_fc.init(jax.random.fold_in(key, 0), shape, dtype)
        hidden = (*as_shape(shape)[:-1], jnp.shape(fc["weight"])[1])
        return {"c_fc": fc, "c_proj": self.c_proj.init(jax.random.fold_in(key, 1), hidden, dtype)}

    def apply(self, params, x, *, key=None, train=False):
        h = self.call("c_fc", params, x, key=fold(key, 0), train=train)
        return self.call("c_proj", params, self.act.apply({}, h), key=fold(key, 1), train=train)


@dataclasses.dataclass(frozen=True)
class GPT2Model(Layer):
    """``transformers.GPT2Model``: ``wte``, ``wpe``, blocks ``h``, ``ln_f``."""

    config: GPT2Config

    def __post_init__(self):
        c = self.config
        std = c.initializer_range
        eps = c.layer_norm_epsilon
        block = GPT2Block(
            LayerNorm(eps=eps),
            GPT2Attention(
                _linear(c, 3 * c.n_embd),
                _linear(c, c.n_embd, std / math.sqrt(2 * c.n_layer)),
                AttentionCore(
                    c.n_head,
                    causal=True,
                    dropout=c.attn_pdrop,
                    scale=None if c.scale_attn_weights else 1.0,
                ),
            ),
            LayerNorm(eps=eps),
            GPT2MLP(
                _linear(c, c.n_inner or 4 * c.n_embd),
                _ACTIVATIONS[c.activation_function],
                _linear(c, c.n_embd, std / math.sqrt(2 * c.n_layer)),
            ),
            c.resid_pdrop,
        )
        parts = {
            "wte": Embedding(c.vocab_size, c.n_embd, weight_init=_init.normal(std=std)),
            "wpe": Embedding(c.n_positions, c.n_embd, weight_init=_init.normal(std=std)),
            "h": Repeat(block, c.n_layer),
            "ln_f": LayerNorm(eps=eps),
        }
        object.__setattr__(self, "_parts", parts)

    def children(self) -> dict[str, Layer]:
        return dict(self._parts)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        b, t = as_shape(shape)[:2]
        hidden = (b, t, self.config.n_embd)
        return {
            name: child.init(jax.random.fold_in(key, i), (b, t) if i < 2 else hidden, dtype)
            for i, (name, child) in enumerate(self._parts.items())
        }

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> Any:
        b, max_len = shape
        if max_len > self.config.n_positions:
            raise LayerError(
                "GPT2Model",
                "init_cache max_len at most n_positions",
                self.config.n_positions,
                max_len,
            )
        return self._parts["h"].init_cache((b, max_len, self.config.n_embd), dtype)

    def apply(
        self,
        params,
        input_ids,
        *,
        attention_mask=None,
        position_ids=None,
        cache=None,
        key=None,
        train=False,
    ):
        ids, positions, mask = decoder_inputs(
            "GPT2Model", input_ids, attention_mask, position_ids, cache
        )
        keys = [None, None] if key is None else list(jax.random.split(key))
        h = self.call("wte", params, ids) + self.call("wpe", params, positions)
        h = drop(h, self.config.embd_pdrop, keys[0], train)
        out = self.call("h", params, h, mask=mask, cache=cache, key=keys[1], train=train)
        h, cache = out if cache is not None else (out, None)
        h = self.call("ln_f", params, h)
        return h if cache is None else (h, cache)


@dataclasses.dataclass(frozen=True)
class GPT2LMHeadModel(CausalLM):
    """``transformers.GPT2LMHeadModel``: ``transformer`` plus ``lm_head`` (tied to
    ``transformer.wte.weight`` unless ``tie_word_embeddings=False``).

    ``init(key, (batch, seq))``; ``apply(params, input_ids, *, attention_mask=None,
    position_ids=None, cache=None, key=None, train=False)`` returns logits ``(batch,
    seq, vocab_size)`` (see ``CausalLM``).
    """

    config: GPT2Config
    config_class: ClassVar[type] = GPT2Config
    base_model_prefix: ClassVar[str] = "transformer"
    embedding_name: ClassVar[str] = "wte.weight"
    ignore_on_load: ClassVar[tuple[str, ...]] = (r"\.attn\.bias$", r"\.attn\.masked_bias$")

    def build(self) -> dict[str, Layer]:
        c = self.config
        head = Linear(c.vocab_size, bias=False, weight_init=_init.normal(std=c.initializer_range))
        return {"transformer": GPT2Model(c), "lm_head": head}

    @property
    def hidden_size(self) -> int:
        return self.config.n_embd
