"""OLMo 2 (``transformers.Olmo2ForCausalLM``) under Hugging Face's names and layouts.

Llama's attention and SwiGLU MLP with post-norms: each sublayer's output is normalized
before the residual add (``post_attention_layernorm``, ``post_feedforward_layernorm``;
no input norms), and an RMSNorm over the whole query and key projections
(``self_attn.q_norm.weight`` ``(heads * head_dim,)``, ``self_attn.k_norm.weight``
``(kv_heads * head_dim,)``) before the rotary embedding.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from purelayers.models import _dense
from purelayers.models.llama import LlamaConfig

__all__ = ["Olmo2Config", "Olmo2ForCausalLM"]


@dataclasses.dataclass(frozen=True)
class Olmo2Config(LlamaConfig):
    """``transformers.Olmo2Config``: Llama's fields but ``mlp_bias`` (no MLP biases),
    with OLMo 2's defaults."""

    model_type: ClassVar[str] = "olmo2"
    not_settings: ClassVar[tuple[str, ...]] = ("mlp_bias",)
    vocab_size: int = 50304
    rms_norm_eps: float = 1e-5
    pad_token_id: int | None = 1
    bos_token_id: int | None = None
    eos_token_id: Any = 50279


@dataclasses.dataclass(frozen=True)
class Olmo2ForCausalLM(_dense.DenseCausalLM):
    """``transformers.Olmo2ForCausalLM``: ``model`` plus ``lm_head``. ``apply`` as
    ``LlamaForCausalLM``'s."""

    config: Olmo2Config
    config_class: ClassVar[type] = Olmo2Config

    def backbone(self) -> _dense.DecoderModel:
        c = self.config
        n = c.num_hidden_layers
        return _dense.dense_backbone(
            c,
            windows=[None] * n,
            ropes=[c.rope()] * n,
            qkv_bias=c.attention_bias,
            o_bias=c.attention_bias,
            qk_norm="width",
            norms=("post_attention_layernorm", "post_feedforward_layernorm"),
            post_norms=True,
        )
