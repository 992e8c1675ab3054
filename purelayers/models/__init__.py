"""Pretrained models whose params trees are Hugging Face and torchvision checkpoints:
the dotted names equal the keys of the reference library's ``model.safetensors`` (or
``state_dict()``), with its layouts, so files load by name with no conversion.

``from_pretrained(folder)`` returns ``(model, params)``; ``save_pretrained(folder,
model, params)`` writes a folder transformers loads; ``generate`` decodes causal LMs
with one jitted prefill and one jitted decode step over a fixed-shape cache;
``causal_lm_loss`` and ``sft_batch`` (prompt/response pairs through a chat template into
masked batches) train them.
"""

from purelayers.models._hub import from_pretrained, name_or_path, save_pretrained
from purelayers.models._moe import load_balancing_loss
from purelayers.models.bert import BertConfig, BertModel
from purelayers.models.bert_heads import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from purelayers.models.clip import CLIPConfig, CLIPModel
from purelayers.models.config import Config, Frozen
from purelayers.models.decoding import generate
from purelayers.models.distilbert import (
    DistilBertConfig,
    DistilBertForSequenceClassification,
    DistilBertModel,
)
from purelayers.models.gemma import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
)
from purelayers.models.gpt2 import GPT2Config, GPT2LMHeadModel
from purelayers.models.gpt_oss import GptOssConfig, GptOssForCausalLM
from purelayers.models.llama import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from purelayers.models.mixtral import MixtralConfig, MixtralForCausalLM
from purelayers.models.modernbert import (
    ModernBertConfig,
    ModernBertForSequenceClassification,
    ModernBertModel,
)
from purelayers.models.olmo2 import Olmo2Config, Olmo2ForCausalLM
from purelayers.models.phi3 import Phi3Config, Phi3ForCausalLM
from purelayers.models.qwen3 import Qwen3Config, Qwen3ForCausalLM
from purelayers.models.qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM
from purelayers.models.resnet import BasicBlock, Bottleneck, ResNet, resnet18, resnet34, resnet50
from purelayers.models.roberta import (
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaForSequenceClassification,
    RobertaModel,
)
from purelayers.models.seq_cls import (
    LlamaForSequenceClassification,
    LlamaSeqClsConfig,
    Qwen2ForSequenceClassification,
    Qwen2SeqClsConfig,
)
from purelayers.models.sft import IGNORE_INDEX, causal_lm_loss, encode_chat, sft_batch
from purelayers.models.siglip import SiglipConfig, SiglipModel
from purelayers.models.t5 import T5Config, T5ForConditionalGeneration
from purelayers.models.vit import ViTConfig, ViTModel
from purelayers.models.vit_heads import ViTForImageClassification
from purelayers.models.whisper import WhisperConfig, WhisperForConditionalGeneration, WhisperModel

__all__ = [
    "IGNORE_INDEX",
    "BasicBlock",
    "BertConfig",
    "BertForMaskedLM",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
    "Bottleneck",
    "CLIPConfig",
    "CLIPModel",
    "Config",
    "DistilBertConfig",
    "DistilBertForSequenceClassification",
    "DistilBertModel",
    "Frozen",
    "GPT2Config",
    "GPT2LMHeadModel",
    "Gemma2Config",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Gemma3TextConfig",
    "GptOssConfig",
    "GptOssForCausalLM",
    "LlamaConfig",
    "LlamaForCausalLM",
    "LlamaForSequenceClassification",
    "LlamaSeqClsConfig",
    "MistralConfig",
    "MistralForCausalLM",
    "MixtralConfig",
    "MixtralForCausalLM",
    "ModernBertConfig",
    "ModernBertForSequenceClassification",
    "ModernBertModel",
    "Olmo2Config",
    "Olmo2ForCausalLM",
    "Phi3Config",
    "Phi3ForCausalLM",
    "Qwen2Config",
    "Qwen2ForCausalLM",
    "Qwen2ForSequenceClassification",
    "Qwen2SeqClsConfig",
    "Qwen3Config",
    "Qwen3ForCausalLM",
    "Qwen3MoeConfig",
    "Qwen3MoeForCausalLM",
    "ResNet",
    "RobertaConfig",
    "RobertaForMaskedLM",
    "RobertaForSequenceClassification",
    "RobertaModel",
    "SiglipConfig",
    "SiglipModel",
    "T5Config",
    "T5ForConditionalGeneration",
    "ViTConfig",
    "ViTForImageClassification",
    "ViTModel",
    "WhisperConfig",
    "WhisperForConditionalGeneration",
    "WhisperModel",
    "causal_lm_loss",
    "encode_chat",
    "from_pretrained",
    "generate",
    "load_balancing_loss",
    "name_or_path",
    "resnet18",
    "resnet34",
    "resnet50",
    "save_pretrained",
    "sft_batch",
]
