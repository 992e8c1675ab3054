"""A tiny causal LM folder with a real tokenizer, for the fine-tuning tests: a random
transformers Qwen2 (or Llama) model and a byte-level BPE tokenizer trained with the
``tokenizers`` package on the source of a few standard-library modules, with a ChatML
chat template. Built in about a second, offline."""

from __future__ import annotations

import inspect
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train_tokenizer(vocab_size: int = 384):
    """A ``PreTrainedTokenizerFast`` (byte-level BPE, ChatML template)."""
    import json
    import string
    import textwrap

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = [inspect.getsource(m) for m in (json, string, textwrap)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def chat_folder(path: Path, *, model_type: str = "qwen2", hidden: int = 32, layers: int = 2):
    """Write a random model and its tokenizer to ``path``; returns ``path``."""
    import torch
    import transformers

    tokenizer = train_tokenizer()
    settings = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    if model_type == "qwen2":
        config = transformers.Qwen2Config(**settings)
        cls = transformers.Qwen2ForCausalLM
    else:
        config = transformers.LlamaConfig(**settings)
        cls = transformers.LlamaForCausalLM
    torch.manual_seed(0)
    model = cls(config).eval()
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
