"""Pretrained models whose params trees are Hugging Face and torchvision checkpoints:
the dotted names equal the keys of the reference library's ``model.safetensors`` (or
``state_dict()``), with its layouts, so files load by name with no conversion.

``from_pretrained(folder)`` returns ``(model, params)``; ``save_pretrained(folder,
model, params)`` writes a folder transformers loads; ``generate`` decodes causal LMs
with one jitted prefill and one jitted decode step over a fixed-shape cache.
"""

from purelayers.models._hub import from_pretrained, save_pretrained
from purelayers.models._moe import load_balancing_loss
from purelayers.models.bert import BertConfig, BertModel
from purelayers.models.config import Config, Frozen
from purelayers.models.decoding import generate
from purelayers.models.gpt2 import GPT2Config, GPT2LMHeadModel
from purelayers.models.llama import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from purelayers.models.mixtral import MixtralConfig, MixtralForCausalLM
from purelayers.models.qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM
from purelayers.models.resnet import BasicBlock, Bottleneck, ResNet, resnet18, resnet34, resnet50
from purelayers.models.vit import ViTConfig, ViTModel

__all__ = [
    "BasicBlock",
    "BertConfig",
    "BertModel",
    "Bottleneck",
    "Config",
    "Frozen",
    "GPT2Config",
    "GPT2LMHeadModel",
    "LlamaConfig",
    "LlamaForCausalLM",
    "MistralConfig",
    "MistralForCausalLM",
    "MixtralConfig",
    "MixtralForCausalLM",
    "Qwen2Config",
    "Qwen2ForCausalLM",
    "Qwen3MoeConfig",
    "Qwen3MoeForCausalLM",
    "ResNet",
    "ViTConfig",
    "ViTModel",
    "from_pretrained",
    "generate",
    "load_balancing_loss",
    "resnet18",
    "resnet34",
    "resnet50",
    "save_pretrained",
]
