"""Mixtral (``transformers.MixtralForCausalLM``) under its checkpoint's names and
layouts: Mistral's attention (no biases, ``sliding_window``), each layer's MLP a sparse
mixture of experts ``block_sparse_moe`` (router ``gate``, experts
``experts.N.w1/w2/w3``, a softmax over the top-k router logits). Names:
``model.layers.0.block_sparse_moe.gate.weight``,
``model.layers.0.block_sparse_moe.experts.0.w1.weight``, ..., as Mistral's otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from purelayers import init as _init
from purelayers.layers import Layer, Linear, MixtureOfExperts, RMSNorm
from purelayers.models._moe import (
    MoeDecoderLayer,
    MoeForCausalLM,
    MoeModel,
    check_experts,
    qkv_attention,
)
from purelayers.models.llama import MistralConfig

__all__ = ["MixtralConfig", "MixtralForCausalLM"]


@dataclasses.dataclass(frozen=True)
class MixtralConfig(MistralConfig):
    """``transformers.MixtralConfig``: Mistral's fields plus ``num_local_experts``,
    ``num_experts_per_tok``, ``output_router_logits``, ``router_aux_loss_coef`` and
    ``router_jitter_noise`` (only 0: the training-time jitter is not applied)."""

    model_type: ClassVar[str] = "mixtral"
    num_key_value_heads: int | None = 8
    max_position_embeddings: int = 4096 * 32
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1e6
    sliding_window: int | None = None
    num_experts_per_tok: int = 2
    num_local_experts: int = 8
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001
    router_jitter_noise: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        check_experts(self, self.num_local_experts, self.num_experts_per_tok)
        if self.router_jitter_noise:
            raise ValueError(
                f"MixtralConfig: router_jitter_noise must be 0 (the jitter is not "
                f"implemented), got {self.router_jitter_noise!r}"
            )


@dataclasses.dataclass(frozen=True)
class MixtralForCausalLM(MoeForCausalLM):
    """``transformers.MixtralForCausalLM``: ``model`` plus ``lm_head``.
    ``apply(params, input_ids, *, attention_mask=None, position_ids=None, cache=None,
    key=None, train=False, logits_to_keep=0, output_router_logits=False)``."""

    config: MixtralConfig
    config_class: ClassVar[type] = MixtralConfig

    def build(self) -> dict[str, Layer]:
        c = self.config
        std = _init.normal(std=c.initializer_range)
        moe = MixtureOfExperts(
            c.num_local_experts, c.num_experts_per_tok, c.intermediate_size, weight_init=std
        )
        norm = RMSNorm(eps=c.rms_norm_eps)
        layer = MoeDecoderLayer(qkv_attention(c), moe, norm, norm, "block_sparse_moe")
        head = Linear(c.vocab_size, bias=False, weight_init=std)
        return {"model": MoeModel(c, (layer,) * c.num_hidden_layers), "lm_head": head}
