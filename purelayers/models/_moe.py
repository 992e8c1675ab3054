"""What the mixture-of-experts causal LMs share: an attention with optional q/k
RMSNorm, a decoder layer whose MLP is a ``MixtureOfExperts`` (or a dense SwiGLU MLP),
a decoder whose layers are a tuple (``model.layers.N``; layers may differ, as
Qwen3-MoE's ``mlp_only_layers``), router logits out, and
``load_balancing_loss``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

import purelayers.functional as F
from purelayers import init as _init
from purelayers.layers import AttentionCore, Embedding, Layer, Linear, MixtureOfExperts, RMSNorm
from purelayers.layers._checks import as_shape, check_int
from purelayers.models._causal import CausalLM, decoder_inputs
from purelayers.models._parts import fold
from purelayers.models.llama import LlamaConfig, LlamaMLP

__all__ = ["load_balancing_loss"]


def load_balancing_loss(
    router_logits: Sequence[jax.Array],
    num_experts: int,
    top_k: int = 2,
    attention_mask: Any = None,
) -> jax.Array:
    """transformers' ``load_balancing_loss_func`` over the router logits
    ``apply(..., output_router_logits=True)`` returns (one ``(batch * seq,
    num_experts)`` array per MoE layer); ``attention_mask`` ``(batch, seq)`` leaves padding
    out. See ``F.load_balancing_loss``.

    Example:
      >>> logits, router = model.apply(params, ids, output_router_logits=True)  # doctest: +SKIP
      >>> aux = M.load_balancing_loss(router, 8, 2)  # doctest: +SKIP
    """
    check_int("load_balancing_loss", "num_experts", num_experts)
    check_int("load_balancing_loss", "top_k", top_k)
    return F.load_balancing_loss(router_logits, num_experts, top_k, attention_mask)


def check_experts(config: LlamaConfig, experts: int, top_k: int) -> None:
    """``num_experts_per_tok`` at most the number of experts; a ``ValueError`` naming
    the field otherwise."""
    name = type(config).__name__
    for field, value in (("num_experts", experts), ("num_experts_per_tok", top_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: {field} must be a positive int, got {value!r}")
    if top_k > experts:
        raise ValueError(
            f"{name}: num_experts_per_tok={top_k} must be at most the number of experts ({experts})"
        )


@dataclasses.dataclass(frozen=True)
class QKNormAttention(Layer):
    """Grouped-query self-attention with ``q_proj``, ``k_proj``, ``v_proj``,
    ``o_proj`` and, when given, an RMSNorm over each head's queries and keys
    (``q_norm``, ``k_norm``, before the rotary embedding), as Qwen3's attention."""

    q_proj: Layer
    k_proj: Layer
    v_proj: Layer
    o_proj: Layer
    core: AttentionCore
    head_dim: int
    q_norm: Layer | None = None
    k_norm: Layer | None = None

    def children(self) -> dict[str, Layer]:
        kids = {k: getattr(self, k) for k in ("q_proj", "k_proj", "v_proj", "o_proj")}
        if self.q_norm is not None:
            kids.update(q_norm=self.q_norm, k_norm=self.k_norm)
        return kids

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        shape = as_shape(shape)
        heads = (*shape[:-1], self.head_dim)
        o_in = (*shape[:-1], self.core.num_heads * self.head_dim)
        shapes = {"q_proj": shape, "k_proj": shape, "v_proj": shape, "o_proj": o_in}
        shapes.update(q_norm=heads, k_norm=heads)
        return {
            name: self.init_child(name, jax.random.fold_in(key, i), shapes[name], dtype)
            for i, name in enumerate(self.children())
        }

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
        return self.core.init_cache(as_shape(shape)[:2], self.head_dim, dtype)

    def _normed(self, name: str, params: Any, a: jax.Array) -> jax.Array:
        if self.q_norm is None:
            return a
        b, t = a.shape[:2]
        h = self.call(name, params, a.reshape(b, t, -1, self.head_dim))
        return h.reshape(b, t, -1)

    def apply(self, params, x, *, mask=None, positions=None, cache=None, key=None, train=False):
        q, k, v = (
            self.call(name, params, x, key=fold(key, i), train=train)
            for i, name in enumerate(("q_proj", "k_proj", "v_proj"))
        )
        q, k = self._normed("q_norm", params, q), self._normed("k_norm", params, k)
        out = self.core.attend(
            q, k, v, mask=mask, positions=positions, cache=cache, key=fold(key, 4), train=train
        )
        out, cache = out if cache is not None else (out, None)
        y = self.call("o_proj", params, out, key=fold(key, 3), train=train)
        return y if cache is None else (y, cache)


@dataclasses.dataclass(frozen=True)
class MoeDecoderLayer(Layer):
    """``h = x + self_attn(input_layernorm(x))``; ``h + mlp(post_attention_layernorm(h))``
    with the MLP under ``mlp_name`` (Mixtral's ``block_sparse_moe``)."""

    self_attn: Layer
    mlp: Layer
    input_layernorm: Layer
    post_attention_layernorm: Layer
    mlp_name: str = "mlp"

    def children(self) -> dict[str, Layer]:
        return {
            "self_attn": self.self_attn,
            self.mlp_name: self.mlp,
            "input_layernorm": self.input_layernorm,
            "post_attention_layernorm": self.post_attention_layernorm,
        }

    @property
    def sparse(self) -> bool:
        return isinstance(self.mlp, MixtureOfExperts)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        return {
            name: self.init_child(name, jax.random.fold_in(key, i), shape, dtype)
            for i, name in enumerate(self.children())
        }

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
        return self.self_attn.init_cache(shape, dtype)

    def apply(
        self, params, x, *, mask=None, positions=None, cache=None, key=None, train=False,
        output_router_logits=False,
    ):  # fmt: skip
        h = self.call("input_layernorm", params, x)
        a = self.call(
            "self_attn", params, h, mask=mask, positions=positions, cache=cache, key=key,
            train=train,
        )  # fmt: skip
        a, cache = a if cache is not None else (a, None)
        x = x + a
        h = self.call("post_attention_layernorm", params, x)
        router = None
        if self.sparse:
            m, router = self.call(self.mlp_name, params, h, output_router_logits=True)
        else:
            m = self.call(self.mlp_name, params, h, key=fold(key, 3), train=train)
        x = x + m
        out = (x, cache) if cache is not None else (x,)
        return (*out, router) if output_router_logits else (out if cache is not None else x)


def swiglu_mlp(c: LlamaConfig, width: int) -> LlamaMLP:
    std = _init.normal(std=c.initializer_range)
    return LlamaMLP(
        Linear(width, bias=False, weight_init=std),
        Linear(width, bias=False, weight_init=std),
        Linear(c.hidden_size, bias=False, weight_init=std),
    )


def qkv_attention(c: LlamaConfig, *, qk_norm: bool = False, bias: bool = False) -> QKNormAttention:
    std = _init.normal(std=c.initializer_range)
    hd, kv = c.dim_per_head, c.kv_heads

    def linear(width: int, b: bool) -> Linear:
        return Linear(width, bias=b, weight_init=std, bias_init=_init.zeros())

    core = AttentionCore(
        c.num_attention_heads, num_kv_heads=kv, causal=True, dropout=c.attention_dropout,
        rope=c.rope(),
    )  # fmt: skip
    norm = RMSNorm(eps=c.rms_norm_eps) if qk_norm else None
    return QKNormAttention(
        linear(c.num_attention_heads * hd, bias),
        linear(kv * hd, bias),
        linear(kv * hd, bias),
        linear(c.hidden_size, bias),
        core,
        hd,
        norm,
        norm,
    )


@dataclasses.dataclass(frozen=True)
class MoeModel(Layer):
    """A decoder: ``embed_tokens``, ``layers`` (a tuple, ``layers.N``), ``norm``."""

    config: Any
    layers: tuple[Layer, ...]

    def __post_init__(self):
        c = self.config
        std = _init.normal(std=c.initializer_range)
        object.__setattr__(
            self,
            "_embed",
            Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id, weight_init=std),
        )

    def children(self) -> dict[str, Layer]:
        kids = super().children()
        return {"embed_tokens": self._embed, "layers": kids["layers"], "norm": self._norm}

    @property
    def _norm(self) -> Layer:
        return RMSNorm(eps=self.config.rms_norm_eps)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        b, t = as_shape(shape)[:2]
        hidden = (b, t, self.config.hidden_size)
        return {
            "embed_tokens": self._embed.init(jax.random.fold_in(key, 0), (b, t), dtype),
            "layers": {
                str(i): layer.init(jax.random.fold_in(jax.random.fold_in(key, 1), i), hidden, dtype)
                for i, layer in enumerate(self.layers)
            },
            "norm": self._norm.init(jax.random.fold_in(key, 2), hidden, dtype),
        }

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> Any:
        b, max_len = as_shape(shape)
        hidden = (b, max_len, self.config.hidden_size)
        # every array its own buffer (the core's keys and values may be one), so that
        # ``generate`` can donate them
        return {
            str(i): jax.tree.map(jnp.copy, layer.init_cache(hidden, dtype))
            for i, layer in enumerate(self.layers)
        }

    def window(self, i: int) -> int | None:
        return self.config.window

    def apply(
        self, params, input_ids, *, attention_mask=None, position_ids=None, cache=None,
        key=None, train=False, output_router_logits=False,
    ):  # fmt: skip
        name = type(self.config).__name__.replace("Config", "Model")
        windows = {self.window(i) for i in range(len(self.layers))}
        masks = {}
        for w in windows:
            ids, positions, masks[w] = decoder_inputs(
                name, input_ids, attention_mask, position_ids, cache, w
            )
        h = self.call("embed_tokens", params, ids)
        routers, new_cache = [], {}
        for i, layer in enumerate(self.layers):
            out = self.call(
                f"layers.{i}", params, h, mask=masks[self.window(i)], positions=positions,
                cache=None if cache is None else cache[str(i)], key=fold(key, i), train=train,
                output_router_logits=True,
            )  # fmt: skip
            h = out[0]
            if cache is not None:
                new_cache[str(i)] = out[1]
            if layer.sparse:
                routers.append(out[-1])
        h = self.call("norm", params, h)
        out = (h, new_cache) if cache is not None else (h,)
        if output_router_logits:
            return (*out, tuple(routers))
        return out if cache is not None else h


@dataclasses.dataclass(frozen=True)
class MoeForCausalLM(CausalLM):
    """Base of the mixture-of-experts causal LMs: ``CausalLM``'s ``apply`` plus
    ``output_router_logits=True``, which returns ``(logits, router_logits)`` (with a
    cache, ``(logits, cache, router_logits)``): one ``(batch * seq, num_experts)`` array
    per MoE layer, as transformers' ``router_logits``."""

    base_model_prefix: ClassVar[str] = "model"
    embedding_name: ClassVar[str] = "embed_tokens.weight"
    ignore_on_load: ClassVar[tuple[str, ...]] = (r"\.rotary_emb\.inv_freq$",)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def apply(
        self,
        params: dict[str, Any],
        input_ids: Any,
        *,
        attention_mask: Any = None,
        position_ids: Any = None,
        cache: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
        logits_to_keep: int = 0,
        output_router_logits: bool = False,
    ):
        """Logits (see ``CausalLM.apply``); with ``output_router_logits``, also the
        router logits, last."""
        check_int(type(self).__name__, "logits_to_keep", logits_to_keep, minimum=0)
        out = self.call(
            self.base_model_prefix, params, input_ids, attention_mask=attention_mask,
            position_ids=position_ids, cache=cache, key=key, train=train,
            output_router_logits=output_router_logits,
        )  # fmt: skip
        out = out if isinstance(out, tuple) else (out,)
        h = out[0]
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        if self.tied:
            weight = params[self.base_model_prefix]
            for part in self.embedding_name.split("."):
                weight = weight[part]
            head = params.get("lm_head", {}) if isinstance(params, dict) else {}
            params = {"lm_head": {**head, "weight": weight}}
        head_key = None if key is None else jax.random.split(key)[1]
        logits = self.call("lm_head", params, h, key=head_key, train=train)
        rest = out[1:]
        return (logits, *rest) if rest else logits
