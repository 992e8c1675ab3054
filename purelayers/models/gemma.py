"""Gemma 2 and Gemma 3's text model (``transformers.Gemma2ForCausalLM``,
``Gemma3ForCausalLM``) under Hugging Face's names and layouts.

Gemma's ``(1 + weight)`` RMSNorms (float32, zeros at init) before and after each
sublayer (``input_layernorm``, ``post_attention_layernorm``,
``pre_feedforward_layernorm``, ``post_feedforward_layernorm``), embeddings multiplied
by ``sqrt(hidden_size)`` (rounded to the embedding's dtype, as transformers' buffer
is), scores scaled by ``query_pre_attn_scalar ** -0.5``, a GELU-tanh gated MLP, a
head tied to the embedding, and layers alternating sliding-window and full attention
(``layer_types``). Gemma 2 soft-caps the attention scores
(``attn_logit_softcapping``) and the logits (``final_logit_softcapping``); Gemma 3
normalizes each head's queries and keys (``self_attn.q_norm``/``k_norm``), gives its
sliding layers their own rope base (``rope_local_base_freq``, or
``rope_parameters["sliding_attention"]``) and caps no attention score.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from purelayers.layers import RotaryEmbedding
from purelayers.models import _dense
from purelayers.models.llama import LlamaConfig

__all__ = ["Gemma2Config", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3TextConfig"]


@dataclasses.dataclass(frozen=True)
class Gemma2Config(LlamaConfig):
    """``transformers.Gemma2Config``'s fields and defaults. ``layer_types`` defaults to
    sliding-window attention on even layers (``0, 2, ...``), full on odd ones;
    ``hidden_activation`` is the MLP's (``gelu_pytorch_tanh``; a ``hidden_act`` in the
    file is ignored, as transformers' Gemma 2 does). ``use_bidirectional_attention`` is
    not supported."""

    model_type: ClassVar[str] = "gemma2"
    not_settings: ClassVar[tuple[str, ...]] = ("hidden_act", "mlp_bias")
    vocab_size: int = 256000
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 26
    num_attention_heads: int = 8
    num_key_value_heads: int | None = 4
    head_dim: int | None = 256
    hidden_activation: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 8192
    pad_token_id: int | None = 0
    eos_token_id: Any = 1
    bos_token_id: int | None = 2
    tie_word_embeddings: bool = True
    query_pre_attn_scalar: float = 256
    sliding_window: int | None = 4096
    layer_types: tuple[str, ...] | None = None
    final_logit_softcapping: float | None = 30.0
    attn_logit_softcapping: float | None = 50.0
    use_bidirectional_attention: bool | None = None

    def __post_init__(self):
        super().__post_init__()
        name = type(self).__name__
        _dense.activation(name, "hidden_activation", self.hidden_activation)
        if self.use_bidirectional_attention:
            raise ValueError(f"{name}: use_bidirectional_attention=True is not supported")
        self.types()
        if "sliding_attention" in self.types() and (
            isinstance(self.sliding_window, bool)
            or not isinstance(self.sliding_window, int)
            or self.sliding_window < 1
        ):
            raise ValueError(
                f"{name}: sliding_window must be a positive int for sliding_attention layers, "
                f"got {self.sliding_window!r}"
            )
        for field in ("final_logit_softcapping", "attn_logit_softcapping"):
            cap = getattr(self, field)
            if cap is not None and (isinstance(cap, bool) or not cap > 0):
                raise ValueError(f"{name}: {field} must be None or > 0, got {cap!r}")

    def default_types(self) -> list[str]:
        every = 2
        return [
            "sliding_attention" if (i + 1) % every else "full_attention"
            for i in range(self.num_hidden_layers)
        ]

    def types(self) -> tuple[str, ...]:
        """The attention of each layer, ``"full_attention"`` or ``"sliding_attention"``."""
        given = self.default_types() if self.layer_types is None else self.layer_types
        return _dense.check_layer_types(type(self).__name__, given, self.num_hidden_layers)

    def windows(self) -> tuple[int | None, ...]:
        return tuple(
            self.sliding_window if t == "sliding_attention" else None for t in self.types()
        )

    def ropes(self) -> list[RotaryEmbedding]:
        return [self.rope()] * self.num_hidden_layers


@dataclasses.dataclass(frozen=True)
class Gemma3TextConfig(Gemma2Config):
    """``transformers.Gemma3TextConfig``: Gemma 2's fields with Gemma 3's defaults (no
    soft-capping; ``attn_logit_softcapping`` is read but not applied, as transformers'
    Gemma 3 does). ``layer_types`` defaults to full attention on every
    ``sliding_window_pattern``-th layer (6), sliding elsewhere. RoPE per layer type:
    v5's ``rope_parameters = {"full_attention": {...}, "sliding_attention": {...}}``, or
    as v4 wrote it ``rope_theta`` (and ``rope_scaling``) for full-attention layers and
    ``rope_local_base_freq`` (default rope) for sliding ones."""

    model_type: ClassVar[str] = "gemma3_text"
    vocab_size: int = 262208
    max_position_embeddings: int = 131072
    rope_theta: float = 1_000_000.0
    rope_local_base_freq: float = 10_000.0
    sliding_window_pattern: int = 6
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    use_bidirectional_attention: bool | None = False

    def default_types(self) -> list[str]:
        every = self.sliding_window_pattern
        return [
            "sliding_attention" if (i + 1) % every else "full_attention"
            for i in range(self.num_hidden_layers)
        ]

    def rope_settings(self, layer_type: str) -> dict[str, Any]:
        """The flat rope dict of ``layer_type``'s layers."""
        nested = dict(self.rope_parameters or {})
        if nested:
            if set(nested) - set(_dense.LAYER_TYPES):
                raise ValueError(
                    f"{type(self).__name__}: rope_parameters must be keyed by layer type "
                    f"('full_attention', 'sliding_attention'), got keys {sorted(nested)}"
                )
            if nested.get(layer_type) is not None:
                return dict(nested[layer_type])
        if layer_type == "sliding_attention":
            return {"rope_type": "default", "rope_theta": self.rope_local_base_freq}
        return {"rope_theta": self.rope_theta, **dict(self.rope_scaling or {})}

    def rope(self, layer_type: str = "full_attention") -> RotaryEmbedding:
        """The rotary embedding of ``layer_type``'s layers."""
        flat = self.rope_settings(layer_type)
        flat.setdefault("rope_theta", self.rope_theta)
        try:
            probe = LlamaConfig(
                rope_parameters=flat, max_position_embeddings=self.max_position_embeddings
            )
            return probe.rope()
        except ValueError as e:
            message = str(e).removeprefix("LlamaConfig: ")
            raise ValueError(
                f"{type(self).__name__}: rope_parameters[{layer_type!r}]: {message}"
            ) from None

    def ropes(self) -> list[RotaryEmbedding]:
        ropes = {t: self.rope(t) for t in _dense.LAYER_TYPES}
        return [ropes[t] for t in self.types()]


@dataclasses.dataclass(frozen=True)
class Gemma2ForCausalLM(_dense.DenseCausalLM):
    """``transformers.Gemma2ForCausalLM``: ``model`` plus ``lm_head`` (tied by default);
    ``apply`` as ``LlamaForCausalLM``'s, the logits soft-capped by
    ``final_logit_softcapping``."""

    config: Gemma2Config
    config_class: ClassVar[type] = Gemma2Config

    def backbone(self) -> _dense.DecoderModel:
        c = self.config
        gemma3 = isinstance(c, Gemma3TextConfig)
        return _dense.dense_backbone(
            c,
            windows=c.windows(),
            ropes=c.ropes(),
            qkv_bias=c.attention_bias,
            o_bias=c.attention_bias,
            qk_norm="head" if gemma3 else None,
            norms=(
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            ),
            post_norms=True,
            gemma=True,
            act=c.hidden_activation,
            scale=float(c.query_pre_attn_scalar) ** -0.5,
            softcap=None if gemma3 else c.attn_logit_softcapping,
            embed_scale=c.hidden_size**0.5,
        )


@dataclasses.dataclass(frozen=True)
class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """``transformers.Gemma3ForCausalLM`` (model type ``gemma3_text``)."""

    config: Gemma3TextConfig
    config_class: ClassVar[type] = Gemma3TextConfig
