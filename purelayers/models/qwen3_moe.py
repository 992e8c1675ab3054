"""Qwen3-MoE (``transformers.Qwen3MoeForCausalLM``) under its checkpoint's names and
layouts: Qwen3's attention (q/k RMSNorm per head before the rotary embedding,
``attention_bias``), sparse layers ``mlp`` (router ``gate``, experts
``experts.N.gate_proj/up_proj/down_proj``; a softmax over every expert, the top k of
it, renormalized with ``norm_topk_prob``) where ``decoder_sparse_step`` and
``mlp_only_layers`` make them so, a dense SwiGLU ``mlp`` of ``intermediate_size``
elsewhere."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from purelayers import init as _init
from purelayers.layers import Layer, Linear, MixtureOfExperts, RMSNorm
from purelayers.models._moe import (
    MoeDecoderLayer,
    MoeForCausalLM,
    MoeModel,
    check_experts,
    qkv_attention,
    swiglu_mlp,
)
from purelayers.models.llama import LlamaConfig

__all__ = ["Qwen3MoeConfig", "Qwen3MoeForCausalLM"]


@dataclasses.dataclass(frozen=True)
class Qwen3MoeConfig(LlamaConfig):
    """``transformers.Qwen3MoeConfig``: Llama's fields without ``mlp_bias``, plus
    ``num_experts`` (read from ``num_local_experts`` too, as transformers 5 writes it),
    ``num_experts_per_tok``, ``moe_intermediate_size``, ``norm_topk_prob``,
    ``decoder_sparse_step``, ``mlp_only_layers``, ``output_router_logits``,
    ``router_aux_loss_coef``. Sliding-window layers (``use_sliding_window=True``) are
    refused."""

    model_type: ClassVar[str] = "qwen3_moe"
    not_settings: ClassVar[tuple[str, ...]] = ("mlp_bias",)
    vocab_size: int = 151936
    hidden_size: int = 2048
    intermediate_size: int = 6144
    num_hidden_layers: int = 24
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 4
    max_position_embeddings: int = 32768
    use_sliding_window: bool = False
    sliding_window: int | None = None
    num_experts: int = 128
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001
    bos_token_id: int | None = None
    eos_token_id: Any = None

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> Qwen3MoeConfig:
        config = dict(config)
        if "num_experts" not in config and "num_local_experts" in config:
            config["num_experts"] = config["num_local_experts"]
        return super().from_dict(config)

    def __post_init__(self):
        super().__post_init__()
        check_experts(self, self.num_experts, self.num_experts_per_tok)
        if self.use_sliding_window:
            raise ValueError("Qwen3MoeConfig: use_sliding_window=True is not supported")
        if isinstance(self.decoder_sparse_step, bool) or not (
            isinstance(self.decoder_sparse_step, int) and self.decoder_sparse_step >= 1
        ):
            raise ValueError(
                "Qwen3MoeConfig: decoder_sparse_step must be a positive int, "
                f"got {self.decoder_sparse_step!r}"
            )

    def sparse(self, i: int) -> bool:
        """Whether layer ``i`` is a mixture of experts, as transformers decides."""
        return i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0


@dataclasses.dataclass(frozen=True)
class Qwen3MoeForCausalLM(MoeForCausalLM):
    """``transformers.Qwen3MoeForCausalLM``: ``model`` plus ``lm_head``; ``apply`` as
    ``MixtralForCausalLM``'s."""

    config: Qwen3MoeConfig
    config_class: ClassVar[type] = Qwen3MoeConfig

    def build(self) -> dict[str, Layer]:
        c = self.config
        std = _init.normal(std=c.initializer_range)
        moe = MixtureOfExperts(
            c.num_experts,
            c.num_experts_per_tok,
            c.moe_intermediate_size,
            style="qwen3_moe",
            norm_topk_prob=c.norm_topk_prob,
            weight_init=std,
        )
        attn = qkv_attention(c, qk_norm=True, bias=c.attention_bias)
        norm = RMSNorm(eps=c.rms_norm_eps)
        dense = swiglu_mlp(c, c.intermediate_size)
        layers = tuple(
            MoeDecoderLayer(attn, moe if c.sparse(i) else dense, norm, norm)
            for i in range(c.num_hidden_layers)
        )
        head = Linear(c.vocab_size, bias=False, weight_init=std)
        return {"model": MoeModel(c, layers), "lm_head": head}
