"""Phi-3 and Phi-4 (``transformers.Phi3ForCausalLM``, ``model_type`` ``phi3``) under
Hugging Face's names and layouts.

Llama's decoder with fused projections: ``self_attn.qkv_proj`` (rows ``[q | k | v]``,
``num_attention_heads * head_dim + 2 * num_key_value_heads * head_dim`` of them) and
``mlp.gate_up_proj`` (rows ``[gate | up]``), no biases; rotary embedding on the first
``partial_rotary_factor`` of each head (Phi-4-mini's 0.75), LongRoPE scaling
(``rope_type="longrope"``, and the ``su``/``yarn`` names older Phi-3 configs give it),
``sliding_window``, and dropout on both residual branches (``resid_pdrop``). Names:
``model.embed_tokens.weight``, ``model.layers.0.self_attn.qkv_proj.weight``,
``model.layers.0.self_attn.o_proj.weight``, ``model.layers.0.mlp.gate_up_proj.weight``,
``model.layers.0.mlp.down_proj.weight``, the two norms, ``model.norm.weight``,
``lm_head.weight``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers import init as _init
from purelayers.functional.attention import apply_rotary, need_even
from purelayers.layers import (
    AttentionCore,
    Embedding,
    Layer,
    Linear,
    Repeat,
    RMSNorm,
    RotaryEmbedding,
)
from purelayers.layers._checks import as_shape, promote_float
from purelayers.models._causal import drop
from purelayers.models._parts import fold
from purelayers.models.llama import (
    LlamaConfig,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)

__all__ = [
    "LongRopeRotaryEmbedding",
    "PartialRotaryEmbedding",
    "Phi3Config",
    "Phi3ForCausalLM",
]


@dataclasses.dataclass(frozen=True)
class PartialRotaryEmbedding(RotaryEmbedding):
    """RoPE on the first ``int(head_dim * partial_rotary_factor)`` features of each head,
    the rest passed through, as transformers' ``apply_rotary_pos_emb`` with a shorter
    ``cos``: ``y = concat(rope(x[..., :r]) * s, x[..., r:])`` where ``s`` is
    ``attention_scaling`` (1 here; a rope scaling's factor on ``cos`` and ``sin``)."""

    partial_rotary_factor: float = 1.0

    @property
    def attention_scaling(self) -> float:
        return 1.0

    def apply(self, params: Any, x: Any, positions: Any = None, **_: Any) -> jax.Array:
        x = jnp.asarray(x)
        t, h = x.shape[1], x.shape[-1]
        r = int(h * self.partial_rotary_factor)
        need_even(type(self).__name__, r)
        positions = jnp.arange(t) if positions is None else jnp.asarray(positions)
        cos, sin = self.tables(positions, r, promote_float(x.dtype))
        if self.attention_scaling != 1.0:
            cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
        lead = (1,) if cos.ndim == 2 else (cos.shape[0],)
        shape = (*lead, t, 1, r)
        y = apply_rotary(x[..., :r], cos.reshape(shape), sin.reshape(shape))
        return y if r == h else jnp.concatenate([y, x[..., r:]], axis=-1)


@dataclasses.dataclass(frozen=True)
class LongRopeRotaryEmbedding(PartialRotaryEmbedding):
    """LongRoPE (``rope_type="longrope"``), as transformers'
    ``_compute_longrope_parameters`` and its ``dynamic_rope_update``:
    ``inv_freq[i] = 1 / (f[i] * theta ** (2i / d))`` with ``f = long_factor`` for a call
    whose largest position ``p`` has ``p + 1 > original_max_position_embeddings``
    (over the whole batch, as transformers' ``torch.max(position_ids)``), else
    ``short_factor``; ``cos`` and ``sin`` are multiplied by ``attention_factor``."""

    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    original_max_position_embeddings: int = 4096
    attention_factor: float = 1.0

    @property
    def attention_scaling(self) -> float:
        return self.attention_factor

    def tables(self, positions: jax.Array, dim: int, dtype: Any) -> tuple[jax.Array, jax.Array]:
        positions = jnp.asarray(positions)
        longest = jnp.max(positions, initial=0) + 1
        base = self.theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
        short = 1.0 / (jnp.asarray(self.short_factor, jnp.float32) * base)
        long = 1.0 / (jnp.asarray(self.long_factor, jnp.float32) * base)
        inv = jnp.where(longest > self.original_max_position_embeddings, long, short)
        return self.tables_at(inv, positions, dtype)


@dataclasses.dataclass(frozen=True)
class Phi3Config(LlamaConfig):
    """``transformers.Phi3Config``'s fields and defaults (the ones the model uses).

    RoPE from ``rope_parameters`` (v5) or ``rope_theta``/``rope_scaling`` (v4; the
    latter wins, as in transformers), with ``partial_rotary_factor`` read there or at
    the top level (Phi-4-mini's config.json). ``rope_type`` ``default`` or ``longrope``
    (``su`` and ``yarn`` are read as ``longrope``, as transformers maps them), whose
    ``short_factor``/``long_factor`` hold ``rotary_dim / 2`` numbers; its
    ``original_max_position_embeddings`` is the top-level field (transformers' Phi-3
    takes that one over the rope dict's), ``factor`` defaults to
    ``max_position_embeddings / original_max_position_embeddings`` and
    ``attention_factor`` to ``sqrt(1 + ln(factor) / ln(original))`` (1 for a factor up
    to 1). ``sliding_window``: keys at most ``sliding_window - 1`` slots before the
    query. No projection has a bias (``attention_bias``/``mlp_bias`` are not settings).
    """

    model_type: ClassVar[str] = "phi3"
    not_settings: ClassVar[tuple[str, ...]] = ("attention_bias", "mlp_bias")
    vocab_size: int = 32064
    hidden_size: int = 3072
    intermediate_size: int = 8192
    max_position_embeddings: int = 4096
    original_max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    resid_pdrop: float = 0.0
    embd_pdrop: float = 0.0
    partial_rotary_factor: float | None = None
    sliding_window: int | None = None
    eos_token_id: Any = 32000
    pad_token_id: int | None = 32000

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` dict; an unset ``partial_rotary_factor`` is left out."""
        out = super().to_dict()
        if out.get("partial_rotary_factor") is None:
            out.pop("partial_rotary_factor", None)
        return out

    def rope(self) -> RotaryEmbedding:
        """The rotary embedding the config describes."""
        name = type(self).__name__
        params = dict(self.rope_scaling or self.rope_parameters or {})
        theta = float(params.get("rope_theta", self.rope_theta))
        fraction = params.get("partial_rotary_factor", self.partial_rotary_factor)
        fraction = 1.0 if fraction is None else float(fraction)
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"{name}: partial_rotary_factor must be in (0, 1], got {fraction}")
        kind = params.get("rope_type", params.get("type", "default"))
        kind = "longrope" if kind in ("su", "yarn") else kind
        if kind == "default":
            if fraction == 1.0:
                return RotaryEmbedding(theta)
            return PartialRotaryEmbedding(theta, partial_rotary_factor=fraction)
        if kind != "longrope":
            raise ValueError(
                f"{name}: rope_type must be 'default' or 'longrope' ('su' and 'yarn' are "
                f"read as 'longrope'), got {kind!r}"
            )
        half = int(self.dim_per_head * fraction) // 2
        factors = {}
        for field in ("short_factor", "long_factor"):
            value = params.get(field)
            if not isinstance(value, (tuple, list)) or len(value) != half:
                raise ValueError(
                    f"{name}: rope {field} must be a list of {half} numbers (rotary dim "
                    f"/ 2), got {value!r}"
                )
            factors[field] = tuple(float(v) for v in value)
        original = int(self.original_max_position_embeddings)
        factor = params.get("factor")
        if factor is None:
            factor = self.max_position_embeddings / original
        attention = params.get("attention_factor")
        if attention is None:
            factor = float(factor)
            attention = (
                1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
            )
        return LongRopeRotaryEmbedding(
            theta,
            partial_rotary_factor=fraction,
            **factors,
            original_max_position_embeddings=original,
            attention_factor=float(attention),
        )

    @property
    def window(self) -> int | None:
        return self.sliding_window


@dataclasses.dataclass(frozen=True)
class Phi3Attention(Layer):
    """``o_proj(core(q, k, v))`` with ``[q | k | v] = qkv_proj(x)`` (``core.num_heads *
    head_dim``, then ``core.kv_heads * head_dim`` twice)."""

    o_proj: Layer  # registered first, as in transformers' Phi3Attention
    qkv_proj: Layer
    core: AttentionCore
    head_dim: int

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        shape = as_shape(shape)
        out = (*shape[:-1], self.core.num_heads * self.head_dim)
        return {
            "o_proj": self.o_proj.init(jax.random.fold_in(key, 0), out, dtype),
            "qkv_proj": self.qkv_proj.init(jax.random.fold_in(key, 1), shape, dtype),
        }

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
        """An empty decoding cache for ``shape = (batch, max_len, embed_dim)``."""
        b, max_len = as_shape(shape)[:2]
        return self.core.init_cache((b, max_len), self.head_dim, dtype)

    def apply(self, params, x, *, mask=None, positions=None, cache=None, key=None, train=False):
        qkv = self.call("qkv_proj", params, x, key=fold(key, 0), train=train)
        nq = self.core.num_heads * self.head_dim
        nk = self.core.kv_heads * self.head_dim
        q, k, v = qkv[..., :nq], qkv[..., nq : nq + nk], qkv[..., nq + nk :]
        out = self.core.attend(
            q, k, v, mask=mask, positions=positions, cache=cache, key=fold(key, 1),
            train=train, layer="Phi3Attention",
        )  # fmt: skip
        out, cache = out if cache is not None else (out, None)
        y = self.call("o_proj", params, out, key=fold(key, 2), train=train)
        return y if cache is None else (y, cache)


@dataclasses.dataclass(frozen=True)
class Phi3MLP(Layer):
    """``down_proj(up * silu(gate))`` with ``[gate | up] = gate_up_proj(x)``."""

    gate_up_proj: Layer
    down_proj: Layer

    def apply(self, params, x, *, key=None, train=False):
        h = self.call("gate_up_proj", params, x, key=fold(key, 0), train=train)
        gate, up = jnp.split(h, 2, axis=-1)
        return self.call("down_proj", params, up * jax.nn.silu(gate), key=fold(key, 1), train=train)


@dataclasses.dataclass(frozen=True)
class Phi3DecoderLayer(LlamaDecoderLayer):
    """Llama's block with dropout (``resid_pdrop``, train mode) on the attention's and
    the MLP's output before each residual sum."""

    resid_pdrop: float = 0.0

    def apply(self, params, x, *, mask=None, positions=None, cache=None, key=None, train=False):
        h = self.call("input_layernorm", params, x)
        a = self.call(
            "self_attn", params, h, mask=mask, positions=positions, cache=cache, key=key,
            train=train,
        )  # fmt: skip
        a, cache = a if cache is not None else (a, None)
        x = x + drop(a, self.resid_pdrop, fold(key, 4), train)
        h = self.call("post_attention_layernorm", params, x)
        m = self.call("mlp", params, h, key=fold(key, 3), train=train)
        x = x + drop(m, self.resid_pdrop, fold(key, 5), train)
        return x if cache is None else (x, cache)


@dataclasses.dataclass(frozen=True)
class Phi3Model(LlamaModel):
    """``transformers.Phi3Model``: ``embed_tokens``, ``layers``, ``norm``."""

    config: Phi3Config

    def __post_init__(self):
        c = self.config
        std = _init.normal(std=c.initializer_range)
        hd, heads, kv = c.dim_per_head, c.num_attention_heads, c.kv_heads
        attn = Phi3Attention(
            Linear(c.hidden_size, bias=False, weight_init=std),
            Linear((heads + 2 * kv) * hd, bias=False, weight_init=std),
            AttentionCore(
                heads, num_kv_heads=kv, causal=True, dropout=c.attention_dropout, rope=c.rope()
            ),
            hd,
        )
        mlp = Phi3MLP(
            Linear(2 * c.intermediate_size, bias=False, weight_init=std),
            Linear(c.hidden_size, bias=False, weight_init=std),
        )
        norm = RMSNorm(eps=c.rms_norm_eps)
        block = Phi3DecoderLayer(attn, mlp, norm, norm, resid_pdrop=float(c.resid_pdrop))
        parts = {
            "embed_tokens": Embedding(
                c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id, weight_init=std
            ),
            "layers": Repeat(block, c.num_hidden_layers),
            "norm": norm,
        }
        object.__setattr__(self, "_parts", parts)


@dataclasses.dataclass(frozen=True)
class Phi3ForCausalLM(LlamaForCausalLM):
    """``transformers.Phi3ForCausalLM`` (Phi-3 and Phi-4 checkpoints): ``model`` plus
    ``lm_head`` (tied with ``tie_word_embeddings=True``), the API of ``CausalLM``.

    Decoding with LongRoPE: a call's positions pick the short or the long factors, so
    the keys in the cache keep the factors of the call that wrote them; at the step
    where the sequence first reaches ``original_max_position_embeddings + 1`` tokens,
    ``generate`` runs the whole sequence again into an empty cache
    (``recompute_cache_at``), as transformers' Phi-3 does.
    """

    config: Phi3Config
    config_class: ClassVar[type] = Phi3Config

    def build(self) -> dict[str, Layer]:
        c = self.config
        head = Linear(c.vocab_size, bias=False, weight_init=_init.normal(std=c.initializer_range))
        return {"model": Phi3Model(c), "lm_head": head}

    @property
    def recompute_cache_at(self) -> int | None:
        """The sequence length at which ``generate`` recomputes the whole sequence
        (LongRoPE's switch to the long factors; ``None`` for other ropes)."""
        if isinstance(self.config.rope(), LongRopeRotaryEmbedding):
            return self.config.original_max_position_embeddings + 1
        return None
