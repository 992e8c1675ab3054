"""Qwen3 (``transformers.Qwen3ForCausalLM``) under Hugging Face's names and layouts.

Llama's block (RMSNorm pre-norms, rotate-half RoPE and its scalings, grouped-query
attention, a SwiGLU MLP without biases) with an RMSNorm over each head's queries and keys
before the rotary embedding (``self_attn.q_norm.weight``, ``self_attn.k_norm.weight``,
``(head_dim,)``), ``attention_bias`` on all four projections, and sliding-window layers
(``use_sliding_window``, ``sliding_window``, ``max_window_layers``, ``layer_types``) as
transformers reads them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from purelayers.models import _dense
from purelayers.models.llama import LlamaConfig

__all__ = ["Qwen3Config", "Qwen3ForCausalLM"]


@dataclasses.dataclass(frozen=True)
class Qwen3Config(LlamaConfig):
    """``transformers.Qwen3Config``: Llama's fields but ``mlp_bias`` (the MLP has no
    biases), plus ``use_sliding_window``, ``sliding_window``, ``max_window_layers`` and
    ``layer_types`` (``"full_attention"``/``"sliding_attention"`` per layer; by default
    sliding from layer ``max_window_layers`` on when ``use_sliding_window``)."""

    model_type: ClassVar[str] = "qwen3"
    not_settings: ClassVar[tuple[str, ...]] = ("mlp_bias",)
    vocab_size: int = 151936
    intermediate_size: int = 22016
    head_dim: int | None = 128
    max_position_embeddings: int = 32768
    use_sliding_window: bool = False
    sliding_window: int | None = 4096
    max_window_layers: int = 28
    layer_types: tuple[str, ...] | None = None
    bos_token_id: int | None = None
    eos_token_id: Any = None

    def __post_init__(self):
        super().__post_init__()
        _dense.check_qwen_window(self)


@dataclasses.dataclass(frozen=True)
class Qwen3ForCausalLM(_dense.DenseCausalLM):
    """``transformers.Qwen3ForCausalLM``: ``model`` (``embed_tokens``, ``layers``,
    ``norm``) plus ``lm_head`` (tied with ``tie_word_embeddings``). ``apply`` as
    ``LlamaForCausalLM``'s."""

    config: Qwen3Config
    config_class: ClassVar[type] = Qwen3Config

    def backbone(self) -> _dense.DecoderModel:
        c = self.config
        windows = _dense.qwen_windows(c)
        rope = c.rope()
        return _dense.dense_backbone(
            c,
            windows=windows,
            ropes=[rope] * len(windows),
            qkv_bias=c.attention_bias,
            o_bias=c.attention_bias,
            qk_norm="head",
        )
