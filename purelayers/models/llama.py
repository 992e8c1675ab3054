"""Llama, Mistral and Qwen2 (``transformers.LlamaForCausalLM``, ``MistralForCausalLM``,
``Qwen2ForCausalLM``) under Hugging Face's names and layouts.

RMSNorm (float32 statistics), rotate-half RoPE at ``rope_theta`` (and the ``linear``,
``dynamic``, ``llama3`` and ``yarn`` rope scalings), grouped-query attention with any ``head_dim``, a SwiGLU MLP
(``gate_proj``, ``up_proj``, ``down_proj``), ``attention_bias``/``mlp_bias``, a tied or
untied ``lm_head``; Qwen2's q/k/v biases; Mistral's ``sliding_window``. Names:
``model.embed_tokens.weight``, ``model.layers.0.self_attn.q_proj.weight``, ...,
``model.layers.0.mlp.gate_proj.weight``, ``model.layers.0.input_layernorm.weight``,
``model.layers.0.post_attention_layernorm.weight``, ``model.norm.weight``,
``lm_head.weight``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers import init as _init
from purelayers.layers import (
    Attention,
    AttentionCore,
    Embedding,
    Layer,
    Linear,
    Repeat,
    RMSNorm,
    RotaryEmbedding,
)
from purelayers.layers._checks import as_shape
from purelayers.models._causal import CausalLM, decoder_inputs
from purelayers.models._parts import fold, init_children
from purelayers.models.config import Config

__all__ = [
    "DynamicNTKRotaryEmbedding",
    "LinearRotaryEmbedding",
    "Llama3RotaryEmbedding",
    "LlamaConfig",
    "LlamaForCausalLM",
    "MistralConfig",
    "MistralForCausalLM",
    "Qwen2Config",
    "Qwen2ForCausalLM",
    "YarnRotaryEmbedding",
    "yarn_rope",
]


@dataclasses.dataclass(frozen=True)
class Llama3RotaryEmbedding(RotaryEmbedding):
    """RoPE with Llama 3.1's frequency scaling (``rope_type="llama3"``): wavelengths
    longer than ``original_max_position_embeddings / low_freq_factor`` are divided by
    ``factor``, shorter than ``... / high_freq_factor`` kept, and the band between
    interpolated smoothly, as transformers' ``_compute_llama3_parameters``."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def inv_freq(self, dim: int, dtype: Any) -> jax.Array:
        inv = super().inv_freq(dim, jnp.float32)
        old = self.original_max_position_embeddings
        low_wavelen = old / self.low_freq_factor
        high_wavelen = old / self.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = jnp.where(wavelen > low_wavelen, inv / self.factor, inv)
        smooth = (old / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return jnp.where(medium, smoothed, scaled).astype(dtype)


@dataclasses.dataclass(frozen=True)
class LinearRotaryEmbedding(RotaryEmbedding):
    """RoPE with linear position interpolation (``rope_type="linear"``): every frequency
    divided by ``factor``, so position ``p`` turns as ``p / factor`` did, as
    transformers' ``_compute_linear_scaling_rope_parameters``."""

    factor: float = 1.0

    def inv_freq(self, dim: int, dtype: Any) -> jax.Array:
        return (super().inv_freq(dim, jnp.float32) / self.factor).astype(dtype)


@dataclasses.dataclass(frozen=True)
class DynamicNTKRotaryEmbedding(RotaryEmbedding):
    """RoPE with dynamic NTK scaling (``rope_type="dynamic"``), as transformers'
    ``_compute_dynamic_ntk_parameters``: for a call whose largest position ``p`` reaches
    past ``max_position_embeddings`` (``L = p + 1 > max``), the base becomes ``theta *
    (factor * L / max - (factor - 1)) ** (d / (d - 2))``; within ``max`` it is
    ``theta``. The frequencies follow each call's positions, as transformers' follow a
    sequence that grows (prompt, then decoding); transformers' module also keeps grown
    frequencies for a later, shorter call that still reaches past ``max``, which a call
    here does not remember."""

    factor: float = 1.0
    max_position_embeddings: int = 2048

    def tables(self, positions: jax.Array, dim: int, dtype: Any) -> tuple[jax.Array, jax.Array]:
        positions = jnp.asarray(positions)
        longest = jnp.max(positions, initial=0) + 1
        top = float(self.max_position_embeddings)
        length = jnp.maximum(longest, self.max_position_embeddings).astype(jnp.float32)
        base = self.theta * ((self.factor * length / top) - (self.factor - 1)) ** (dim / (dim - 2))
        inv = 1.0 / (base ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
        return self.tables_at(inv, positions, dtype)


@dataclasses.dataclass(frozen=True)
class YarnRotaryEmbedding(RotaryEmbedding):
    r"""RoPE with YaRN scaling (``rope_type="yarn"``), as transformers'
    ``_compute_yarn_parameters``: ``inv_freq = interp * (1 - e) + extrap * e`` with
    ``extrap[i] = theta ** (-2i / d)``, ``interp = extrap / factor`` and ``e = 1 -
    clip((i - low) / (high - low), 0, 1)``, ``low``/``high`` the dimensions where a
    wavelength turns ``beta_fast``/``beta_slow`` times over
    ``original_max_position_embeddings`` (``floor``/``ceil`` with ``truncate``, clamped
    to ``[0, d - 1]``); ``cos`` and ``sin`` are multiplied by ``attention_scaling``:
    ``attention_factor`` if given, else ``0.1 * ln(factor) + 1`` (1 for a factor up to
    1), or with ``mscale`` and ``mscale_all_dim`` the ratio of that form at each.
    """

    factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None

    @property
    def attention_scaling(self) -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)

        def get(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if self.mscale and self.mscale_all_dim:
            return float(get(self.factor, self.mscale) / get(self.factor, self.mscale_all_dim))
        return get(self.factor)

    def inv_freq(self, dim: int, dtype: Any) -> jax.Array:
        old, theta = self.original_max_position_embeddings, self.theta

        def turns(rotations: float) -> float:
            return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        low, high = turns(self.beta_fast), turns(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # as transformers: no division by zero
        ramp = jnp.clip((jnp.arange(dim // 2, dtype=jnp.float32) - low) / (high - low), 0, 1)
        extrapolated = 1.0 - ramp
        base = theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
        inv = (1.0 / (self.factor * base)) * ramp + (1.0 / base) * extrapolated
        return inv.astype(dtype)

    def tables(self, positions: jax.Array, dim: int, dtype: Any) -> tuple[jax.Array, jax.Array]:
        cos, sin = super().tables(positions, dim, dtype)
        s = self.attention_scaling
        return (cos * s).astype(cos.dtype), (sin * s).astype(sin.dtype)


def yarn_rope(theta: float, params: Mapping[str, Any], max_position_embeddings: int):
    """The ``YarnRotaryEmbedding`` a ``rope_parameters`` (or v4 ``rope_scaling``) dict of
    ``rope_type="yarn"`` describes, with transformers' defaults: ``factor`` ``None`` is
    ``max_position_embeddings / original_max_position_embeddings`` (itself
    ``max_position_embeddings`` where absent), ``beta_fast``/``beta_slow`` 32/1 where
    absent or 0, ``truncate`` ``True``."""
    old = int(params.get("original_max_position_embeddings") or max_position_embeddings)
    factor = params.get("factor")
    factor = max_position_embeddings / old if factor is None else float(factor)

    def opt(name: str) -> float | None:
        value = params.get(name)
        return None if value is None else float(value)

    return YarnRotaryEmbedding(
        theta,
        factor=factor,
        original_max_position_embeddings=old,
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        truncate=bool(params.get("truncate", True)),
        attention_factor=opt("attention_factor"),
        mscale=opt("mscale"),
        mscale_all_dim=opt("mscale_all_dim"),
    )


@dataclasses.dataclass(frozen=True)
class LlamaConfig(Config):
    """``transformers.LlamaConfig``'s fields and defaults (the ones the model uses).

    RoPE comes from transformers v5's ``rope_parameters`` (``{"rope_type": "default" |
    "linear" | "dynamic" | "llama3", "rope_theta": ..., ...}``) or, as v4 wrote it, ``rope_theta`` and
    ``rope_scaling``.
    """

    model_type: ClassVar[str] = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None
    rope_parameters: Mapping[str, Any] | None = None
    attention_bias: bool = False
    attention_dropout: float = 0.0
    mlp_bias: bool = False
    bos_token_id: int | None = 1
    eos_token_id: Any = 2
    pad_token_id: int | None = None

    def __post_init__(self):
        super().__post_init__()
        name = type(self).__name__
        fields = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
        fields += ("num_attention_heads",)
        optional = ("num_key_value_heads", "head_dim")  # None: from the other settings
        for field in fields + optional:
            value = getattr(self, field)
            if field in optional and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: {field} must be a positive int, got {value!r}")
        pad = self.pad_token_id
        if pad is not None and (
            isinstance(pad, bool)
            or not isinstance(pad, int)
            or not -self.vocab_size <= pad < self.vocab_size
        ):
            raise ValueError(
                f"{name}: pad_token_id must be None or an int in [-vocab_size, vocab_size) "
                f"= [-{self.vocab_size}, {self.vocab_size}) (the embedding's padding row, as "
                f"transformers' nn.Embedding takes it), got {pad!r}"
            )
        if self.hidden_act != "silu":
            raise ValueError(f"{name}: hidden_act must be 'silu', got {self.hidden_act!r}")
        heads, kv = self.num_attention_heads, self.kv_heads
        if heads % kv:
            raise ValueError(
                f"{name}: num_key_value_heads={kv} must divide num_attention_heads={heads}"
            )
        if self.head_dim is None and self.hidden_size % heads:
            raise ValueError(
                f"{name}: hidden_size={self.hidden_size} must be divisible by "
                f"num_attention_heads={heads} when head_dim is not given"
            )
        self.rope()  # validates the rope settings

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` dict; an unset ``head_dim`` is left out, as transformers
        writes it (its Qwen2 attention takes a ``head_dim`` of ``null`` as given)."""
        out = super().to_dict()
        if out.get("head_dim") is None:
            out.pop("head_dim", None)
        return out

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def rope(self) -> RotaryEmbedding:
        """The rotary embedding the config describes."""
        params = dict(self.rope_parameters or {})
        if not params:
            params = {"rope_theta": self.rope_theta, **dict(self.rope_scaling or {})}
        kind = params.get("rope_type", params.get("type", "default"))
        theta = float(params.get("rope_theta", self.rope_theta))
        if kind == "default":
            return RotaryEmbedding(theta)
        if kind == "llama3":
            return Llama3RotaryEmbedding(
                theta,
                factor=float(params["factor"]),
                low_freq_factor=float(params["low_freq_factor"]),
                high_freq_factor=float(params["high_freq_factor"]),
                original_max_position_embeddings=int(params["original_max_position_embeddings"]),
            )
        if kind == "linear":
            return LinearRotaryEmbedding(theta, factor=float(params["factor"]))
        if kind == "dynamic":
            return DynamicNTKRotaryEmbedding(
                theta,
                factor=float(params["factor"]),
                max_position_embeddings=int(self.max_position_embeddings),
            )
        if kind == "yarn":
            return yarn_rope(theta, params, int(self.max_position_embeddings))
        raise ValueError(
            f"{type(self).__name__}: rope_type must be 'default', 'linear', 'dynamic', "
            f"'llama3' or 'yarn', got {kind!r}"
        )

    @property
    def window(self) -> int | None:
        return None


@dataclasses.dataclass(frozen=True)
class MistralConfig(LlamaConfig):
    """``transformers.MistralConfig``: Llama's fields but ``attention_bias`` and
    ``mlp_bias`` (no projection has a bias), ``sliding_window`` (keys at most
    ``sliding_window - 1`` slots before the query; ``None``: full attention)."""

    model_type: ClassVar[str] = "mistral"
    not_settings: ClassVar[tuple[str, ...]] = ("attention_bias", "mlp_bias")  # no biases
    intermediate_size: int = 14336
    num_key_value_heads: int | None = 8
    max_position_embeddings: int = 131072
    sliding_window: int | None = 4096

    @property
    def window(self) -> int | None:
        return self.sliding_window


@dataclasses.dataclass(frozen=True)
class Qwen2Config(LlamaConfig):
    """``transformers.Qwen2Config``: Llama's fields but ``attention_bias`` and ``mlp_bias``
    (q/k/v projections carry biases, the others none). Sliding-window layers as
    transformers reads them: with ``use_sliding_window``, ``sliding_window`` on the
    layers ``layer_types`` marks ``"sliding_attention"`` (by default those from
    ``max_window_layers`` on)."""

    model_type: ClassVar[str] = "qwen2"
    # biases on q/k/v always, on o_proj and the MLP never
    not_settings: ClassVar[tuple[str, ...]] = ("attention_bias", "mlp_bias")
    vocab_size: int = 151936
    intermediate_size: int = 22016
    max_position_embeddings: int = 32768
    use_sliding_window: bool = False
    sliding_window: int | None = 4096
    max_window_layers: int = 28
    layer_types: tuple[str, ...] | None = None
    bos_token_id: int | None = None
    eos_token_id: Any = None

    def __post_init__(self):
        super().__post_init__()
        from purelayers.models import _dense

        _dense.check_qwen_window(self)


@dataclasses.dataclass(frozen=True)
class LlamaMLP(Layer):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))``."""

    gate_proj: Layer
    up_proj: Layer
    down_proj: Layer

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        shape = as_shape(shape)
        gate = self.gate_proj.init(jax.random.fold_in(key, 0), shape, dtype)
        hidden = (*shape[:-1], jnp.shape(gate["weight"])[0])
        return {
            "gate_proj": gate,
            "up_proj": self.up_proj.init(jax.random.fold_in(key, 1), shape, dtype),
            "down_proj": self.down_proj.init(jax.random.fold_in(key, 2), hidden, dtype),
        }

    def apply(self, params, x, *, key=None, train=False):
        def proj(name, i, a):  # each its own key (a LoRA adapter's dropout draws from it)
            return self.call(name, params, a, key=fold(key, i), train=train)

        gate = jax.nn.silu(proj("gate_proj", 0, x))
        return proj("down_proj", 2, gate * proj("up_proj", 1, x))


@dataclasses.dataclass(frozen=True)
class LlamaDecoderLayer(Layer):
    """``h = x + self_attn(input_layernorm(x))``; ``h + mlp(post_attention_layernorm(h))``."""

    self_attn: Attention
    mlp: LlamaMLP
    input_layernorm: Layer
    post_attention_layernorm: Layer

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        return init_children(self, key, dict.fromkeys(self.children(), shape), dtype)

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
        return self.self_attn.init_cache(shape, dtype)

    def apply(self, params, x, *, mask=None, positions=None, cache=None, key=None, train=False):
        h = self.call("input_layernorm", params, x)
        a = self.call(
            "self_attn",
            params,
            h,
            mask=mask,
            positions=positions,
            cache=cache,
            key=key,
            train=train,
        )
        a, cache = a if cache is not None else (a, None)
        x = x + a
        h = self.call("post_attention_layernorm", params, x)
        x = x + self.call("mlp", params, h, key=fold(key, 3), train=train)
        return x if cache is None else (x, cache)


@dataclasses.dataclass(frozen=True)
class LlamaModel(Layer):
    """``transformers.LlamaModel``: ``embed_tokens``, ``layers``, ``norm``."""

    config: LlamaConfig
    qkv_bias: bool = False

    def __post_init__(self):
        c = self.config
        std = _init.normal(std=c.initializer_range)

        def linear(width: int, bias: bool) -> Linear:
            return Linear(width, bias=bias, weight_init=std, bias_init=_init.zeros())

        hd, kv = c.dim_per_head, c.kv_heads
        qkv_bias = self.qkv_bias or c.attention_bias
        attn = Attention(
            linear(c.num_attention_heads * hd, qkv_bias),
            linear(kv * hd, qkv_bias),
            linear(kv * hd, qkv_bias),
            linear(c.hidden_size, c.attention_bias),
            AttentionCore(
                c.num_attention_heads,
                num_kv_heads=kv,
                causal=True,
                dropout=c.attention_dropout,
                rope=c.rope(),
            ),
        )
        mlp = LlamaMLP(
            linear(c.intermediate_size, c.mlp_bias),
            linear(c.intermediate_size, c.mlp_bias),
            linear(c.hidden_size, c.mlp_bias),
        )
        norm = RMSNorm(eps=c.rms_norm_eps)
        parts = {
            # transformers' ``nn.Embedding(vocab, hidden, config.pad_token_id)``: that row
            # starts at zero and gets no gradient
            "embed_tokens": Embedding(
                c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id, weight_init=std
            ),
            "layers": Repeat(LlamaDecoderLayer(attn, mlp, norm, norm), c.num_hidden_layers),
            "norm": norm,
        }
        object.__setattr__(self, "_parts", parts)

    def children(self) -> dict[str, Layer]:
        return dict(self._parts)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        b, t = as_shape(shape)[:2]
        hidden = (b, t, self.config.hidden_size)
        return {
            name: child.init(jax.random.fold_in(key, i), (b, t) if i == 0 else hidden, dtype)
            for i, (name, child) in enumerate(self._parts.items())
        }

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> Any:
        b, max_len = as_shape(shape)
        return self._parts["layers"].init_cache((b, max_len, self.config.hidden_size), dtype)

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
        name = type(self.config).__name__.replace("Config", "Model")
        ids, positions, mask = decoder_inputs(
            name, input_ids, attention_mask, position_ids, cache, self.config.window
        )
        h = self.call("embed_tokens", params, ids)
        out = self.call(
            "layers",
            params,
            h,
            mask=mask,
            positions=positions,
            cache=cache,
            key=key,
            train=train,
        )
        h, cache = out if cache is not None else (out, None)
        h = self.call("norm", params, h)
        return h if cache is None else (h, cache)


@dataclasses.dataclass(frozen=True)
class LlamaForCausalLM(CausalLM):
    """``transformers.LlamaForCausalLM``: ``model`` plus ``lm_head`` (tied to
    ``model.embed_tokens.weight`` with ``tie_word_embeddings=True``).

    ``init(key, (batch, seq))``; ``apply(params, input_ids, *, attention_mask=None,
    position_ids=None, cache=None, key=None, train=False)`` returns logits ``(batch,
    seq, vocab_size)`` (see ``CausalLM``).
    """

    config: LlamaConfig
    config_class: ClassVar[type] = LlamaConfig
    base_model_prefix: ClassVar[str] = "model"
    embedding_name: ClassVar[str] = "embed_tokens.weight"
    ignore_on_load: ClassVar[tuple[str, ...]] = (r"\.rotary_emb\.inv_freq$",)
    qkv_bias: ClassVar[bool] = False

    def build(self) -> dict[str, Layer]:
        c = self.config
        head = Linear(c.vocab_size, bias=False, weight_init=_init.normal(std=c.initializer_range))
        return {"model": LlamaModel(c, self.qkv_bias), "lm_head": head}

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size


@dataclasses.dataclass(frozen=True)
class MistralForCausalLM(LlamaForCausalLM):
    """``transformers.MistralForCausalLM``: Llama with a sliding attention window."""

    config: MistralConfig
    config_class: ClassVar[type] = MistralConfig


@dataclasses.dataclass(frozen=True)
class Qwen2ForCausalLM(LlamaForCausalLM):
    """``transformers.Qwen2ForCausalLM``: Llama with biases on q/k/v."""

    config: Qwen2Config
    config_class: ClassVar[type] = Qwen2Config
    qkv_bias: ClassVar[bool] = True

    def build(self) -> dict[str, Layer]:
        """Llama's parts, or with sliding-window layers a decoder whose blocks each
        have their window (``purelayers.models._dense``), under the same names."""
        parts = super().build()
        c = self.config
        if c.use_sliding_window:
            from purelayers.models import _dense

            windows = _dense.qwen_windows(c)
            ropes = [c.rope()] * len(windows)
            parts["model"] = _dense.dense_backbone(c, windows=windows, ropes=ropes, qkv_bias=True)
        return parts
