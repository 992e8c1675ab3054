"""gpt-oss (``transformers.GptOssForCausalLM``) under its checkpoint's names and
layouts: grouped-query attention with q/k/v/o biases and attention sinks
(``self_attn.sinks``, one learned logit per head that joins each softmax's
denominator), sliding-window and full layers as ``layer_types`` says, YaRN rope, and
a mixture-of-experts MLP (``mlp.router`` with a bias; fused experts
``mlp.experts.gate_up_proj``, ``gate_up_proj_bias``, ``down_proj``, ``down_proj_bias``;
the clamped SwiGLU). Published MXFP4 expert weights (``*_blocks``, ``*_scales``) are
dequantized on load (``purelayers.models._mxfp4``). Names:
``model.layers.0.self_attn.sinks``, ``model.layers.0.mlp.router.weight``,
``model.layers.0.mlp.experts.gate_up_proj``, ..., as Mixtral's otherwise.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers import init as _init
from purelayers.functional.attention import causal_mask, mask4
from purelayers.layers import AttentionCore, Layer, Linear, MixtureOfExperts, RMSNorm
from purelayers.layers._checks import as_shape
from purelayers.models._causal import drop
from purelayers.models._dense import check_layer_types
from purelayers.models._moe import MoeDecoderLayer, MoeForCausalLM, MoeModel, check_experts
from purelayers.models._mxfp4 import unpack_mxfp4
from purelayers.models._parts import fold
from purelayers.models.llama import LlamaConfig, yarn_rope

__all__ = ["GptOssConfig", "GptOssForCausalLM", "SinkAttention"]

# transformers' GptOssConfig default rope (rope_parameters None)
DEFAULT_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


@dataclasses.dataclass(frozen=True)
class GptOssConfig(LlamaConfig):
    """``transformers.GptOssConfig``: Llama's fields without ``mlp_bias``, plus
    ``num_local_experts`` (read from ``num_experts`` too), ``num_experts_per_tok``,
    ``sliding_window``, ``layer_types`` (default: sliding on even layers, full on odd,
    as transformers), ``swiglu_alpha``, ``swiglu_limit``, ``output_router_logits``,
    ``router_aux_loss_coef`` and ``quantization_config`` (only ``quant_method="mxfp4"``:
    the expert weights are dequantized on load; a saved folder holds them dense, so
    ``to_dict`` leaves it out). RoPE: ``default`` or ``yarn`` (transformers' default).
    """

    model_type: ClassVar[str] = "gpt_oss"
    not_settings: ClassVar[tuple[str, ...]] = ("mlp_bias",)
    vocab_size: int = 201088
    hidden_size: int = 2880
    intermediate_size: int = 2880
    num_hidden_layers: int = 36
    num_attention_heads: int = 64
    num_key_value_heads: int | None = 8
    head_dim: int | None = 64
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-5
    rope_theta: float = 150000.0
    attention_bias: bool = True
    bos_token_id: int | None = None
    eos_token_id: Any = None
    num_local_experts: int = 128
    num_experts_per_tok: int = 4
    sliding_window: int | None = 128
    layer_types: tuple[str, ...] | None = None
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001
    quantization_config: Mapping[str, Any] | None = None

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> GptOssConfig:
        config = dict(config)
        if "num_local_experts" not in config and "num_experts" in config:
            config["num_local_experts"] = config["num_experts"]
        return super().from_dict(config)

    def __post_init__(self):
        super().__post_init__()
        name = type(self).__name__
        check_experts(self, self.num_local_experts, self.num_experts_per_tok)
        if self.layer_types is not None:
            check_layer_types(name, self.layer_types, self.num_hidden_layers)
        w = self.sliding_window
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ValueError(f"{name}: sliding_window must be None or a positive int, got {w!r}")
        q = self.quantization_config
        if q is not None and (not isinstance(q, Mapping) or q.get("quant_method") != "mxfp4"):
            got = q.get("quant_method") if isinstance(q, Mapping) else q
            raise ValueError(
                f"{name}: quantization_config's quant_method must be 'mxfp4' (the published "
                f"expert weights), got {got!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` dict, without ``quantization_config`` (params are dense)."""
        out = super().to_dict()
        out.pop("quantization_config", None)
        return out

    def rope(self) -> Any:
        """The rotary embedding: ``yarn`` (the default) or ``default``; other rope types
        are refused naming the field."""
        params = dict(self.rope_parameters or {})
        if not params:
            params = {"rope_theta": self.rope_theta, **dict(self.rope_scaling or DEFAULT_ROPE)}
        kind = params.get("rope_type", params.get("type", "default"))
        theta = float(params.get("rope_theta", self.rope_theta))
        if kind == "yarn":
            return yarn_rope(theta, params, self.max_position_embeddings)
        if kind == "default":
            return super().rope()
        raise ValueError(
            f"{type(self).__name__}: rope_type must be 'yarn' or 'default', got {kind!r}"
        )

    @property
    def types(self) -> tuple[str, ...]:
        if self.layer_types is not None:
            return tuple(self.layer_types)
        n = self.num_hidden_layers
        return tuple("sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n))

    def layer_window(self, i: int) -> int | None:
        """Layer ``i``'s window: ``sliding_window`` on sliding layers, ``None`` else."""
        return self.sliding_window if self.types[i] == "sliding_attention" else None


@dataclasses.dataclass(frozen=True)
class SinkAttention(Layer):
    r"""Grouped-query self-attention with attention sinks, as transformers' gpt-oss
    ``eager_attention_forward``: per head ``h``, the scores ``s = q k^T * scale`` (masked
    keys at the float32 minimum) and the head's sink logit ``sinks[h]`` share one
    softmax, whose sink column is then dropped::

        p = softmax([s, sinks[h]])[..., :-1];  y = o_proj(p v)

    so a head may put part of its weight nowhere. ``q_proj``, ``k_proj``, ``v_proj``,
    ``o_proj`` as Llama's (with biases here); ``core`` holds the heads, rope and cache.

    Parameters:
      ``sinks`` ``(num_heads,)``, then the projections'.
    """

    q_proj: Layer
    k_proj: Layer
    v_proj: Layer
    o_proj: Layer
    _: dataclasses.KW_ONLY
    core: AttentionCore = dataclasses.field(default_factory=lambda: AttentionCore(1))
    head_dim: int = 1
    sink_init: Any = None

    def own_names(self) -> tuple[str, ...]:
        return ("sinks",)

    def children(self) -> dict[str, Layer]:
        return {k: getattr(self, k) for k in ("q_proj", "k_proj", "v_proj", "o_proj")}

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        shape = as_shape(shape)
        o_in = (*shape[:-1], self.core.num_heads * self.head_dim)
        init = self.sink_init or _init.normal(std=0.02)
        out = {"sinks": init(jax.random.fold_in(key, 4), (self.core.num_heads,), dtype)}
        for i, name in enumerate(self.children()):
            k = jax.random.fold_in(key, i)
            out[name] = self.init_child(name, k, o_in if name == "o_proj" else shape, dtype)
        return out

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
        return self.core.init_cache(as_shape(shape)[:2], self.head_dim, dtype)

    def apply(self, params, x, *, mask=None, positions=None, cache=None, key=None, train=False):
        def proj(name, i, a):
            return self.call(name, params, a, key=fold(key, i), train=train)

        core, layer = self.core, "SinkAttention"
        h, kh, hd = core.num_heads, core.kv_heads, self.head_dim
        q, k, v = proj("q_proj", 0, x), proj("k_proj", 1, x), proj("v_proj", 2, x)
        b, t = q.shape[:2]
        q, k, v = q.reshape(b, t, h, hd), k.reshape(b, t, kh, hd), v.reshape(b, t, kh, hd)
        offset = jnp.zeros((), jnp.int32) if cache is None else cache["length"]
        pos = offset + jnp.arange(t) if positions is None else jnp.asarray(positions)
        q, k = core.rope.apply({}, q, pos), core.rope.apply({}, k, pos)
        if cache is None:
            visible = causal_mask(t, t)[None, None]
        else:
            k, v, cache, visible = core._write_cache(cache, k, v, offset, layer)
        s = k.shape[1]
        m = visible if mask is None else visible & mask4(mask, (b,), h, t, s, "mask", layer)
        g = h // kh
        scale = core.scale if core.scale is not None else 1.0 / math.sqrt(hd)
        scores = jnp.einsum("btkgd,bskd->bkgts", q.reshape(b, t, kh, g, hd), k.astype(q.dtype))
        m = jnp.broadcast_to(m, (b, h, t, s)).reshape(b, kh, g, t, s)
        scores = jnp.where(m, scores * scale, jnp.finfo(scores.dtype).min)
        sinks = params["sinks"].astype(scores.dtype).reshape(1, kh, g, 1, 1)
        logits = jnp.concatenate([scores, jnp.broadcast_to(sinks, (b, kh, g, t, 1))], -1)
        probs = jax.nn.softmax(logits, axis=-1)[..., :-1]
        probs = drop(probs, core.dropout, fold(key, 5), train).astype(v.dtype)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v).reshape(b, t, h * hd)
        y = proj("o_proj", 3, out)
        return y if cache is None else (y, cache)


@dataclasses.dataclass(frozen=True)
class GptOssModel(MoeModel):
    """``transformers.GptOssModel``: ``embed_tokens``, ``layers.N``, ``norm``; layer
    ``i`` attends within ``config.layer_window(i)``."""

    def window(self, i: int) -> int | None:
        return self.config.layer_window(i)


@dataclasses.dataclass(frozen=True)
class GptOssForCausalLM(MoeForCausalLM):
    """``transformers.GptOssForCausalLM``: ``model`` plus ``lm_head``; ``apply`` as
    ``MixtralForCausalLM``'s (``output_router_logits=True`` adds the router logits,
    the router's bias included). ``from_pretrained`` dequantizes a folder's MXFP4
    expert weights (``checkpoint_tensors``)."""

    config: GptOssConfig
    config_class: ClassVar[type] = GptOssConfig

    def build(self) -> dict[str, Layer]:
        c = self.config
        std = _init.normal(std=c.initializer_range)
        hd, kv, heads = c.dim_per_head, c.kv_heads, c.num_attention_heads

        def linear(width: int) -> Linear:
            return Linear(width, bias=c.attention_bias, weight_init=std, bias_init=_init.zeros())

        core = AttentionCore(
            heads, num_kv_heads=kv, causal=True, dropout=c.attention_dropout, rope=c.rope()
        )
        attn = SinkAttention(
            linear(heads * hd), linear(kv * hd), linear(kv * hd), linear(c.hidden_size),
            core=core, head_dim=hd, sink_init=std,
        )  # fmt: skip
        moe = MixtureOfExperts(
            c.num_local_experts, c.num_experts_per_tok, c.intermediate_size, style="gpt_oss",
            alpha=c.swiglu_alpha, limit=c.swiglu_limit, weight_init=std,
        )  # fmt: skip
        norm = RMSNorm(eps=c.rms_norm_eps)
        layer = MoeDecoderLayer(attn, moe, norm, norm)
        head = Linear(c.vocab_size, bias=False, weight_init=std)
        model = GptOssModel(c, (layer,) * c.num_hidden_layers)
        return {"model": model, "lm_head": head}

    def checkpoint_tensors(
        self, tensors: Mapping[str, Any], folder: Path | str = ""
    ) -> dict[str, Any]:
        """A folder's tensors by the model's names: MXFP4 pairs (``X_blocks``,
        ``X_scales``) read as their dense ``X`` (dequantized when read, one at a time,
        into the requested dtype), the others as they are."""
        return unpack_mxfp4(tensors, folder)
