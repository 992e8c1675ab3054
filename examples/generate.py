"""Generate text with a causal LM loaded from a Hugging Face folder or Hub id.

    python examples/generate.py                        # a small random GPT-2, offline
    python examples/generate.py --model PATH --prompt "def fib(n):" --max-new-tokens 64
    python examples/generate.py --model microsoft/Phi-4-mini-instruct --prompt "Hi!"

``--model`` is a folder with ``config.json`` and ``model.safetensors`` (any model type
``from_pretrained`` reads: GPT-2, Llama, Mistral, Qwen2, Phi-3, ...), or a Hub id
(through ``huggingface_hub``'s cache; ``HF_HUB_OFFLINE=1`` reads only the cache). Its
tokenizer is the folder's own, through transformers' ``AutoTokenizer`` (no torch
needed); where the tokenizer has a chat template, the prompt is sent as one user
message through it (``--chat``/``--no-chat`` to force either way). With no folder, transformers builds a small GPT-2 with random weights, saves it with
``save_pretrained`` and it is loaded back from there (nothing is downloaded); its
"tokenizer" is bytes. Tokens stream behind a progress bar; the run prints the time of
the first call (compiling the prefill and decode step) and the tokens per second after.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from purelayers import models as M


def random_gpt2(folder: Path, width: int, depth: int, heads: int) -> Path:
    """A GPT-2 with random weights and a 256-token byte vocabulary, saved by transformers."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=256,
        n_positions=512,
        n_embd=width,
        n_layer=depth,
        n_head=heads,
        bos_token_id=None,
        eos_token_id=None,
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


class Bytes:
    """Text as UTF-8 bytes: the tokenizer of the random model."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


def tokenizer_for(source: str | Path):
    """The folder's (or Hub id's) own tokenizer where it has one, else bytes."""
    folder = Path(source)
    files = ("tokenizer.json", "tokenizer_config.json")
    if folder.is_dir() and not any((folder / f).is_file() for f in files):
        return Bytes()
    import transformers

    return transformers.AutoTokenizer.from_pretrained(source)


def prompt_ids(tok, prompt: str, chat: bool | None) -> tuple[list[int], bool]:
    """The prompt's ids and whether the chat template made them: as one user message
    through the tokenizer's chat template when ``chat`` (``None``: where it has one),
    else the plain text (with the tokenizer's own special tokens)."""
    has_template = bool(getattr(tok, "chat_template", None))
    if chat and not has_template:
        raise SystemExit("--chat: this tokenizer has no chat template")
    if chat is None:
        chat = has_template
    if not chat:
        return list(tok.encode(prompt)), False
    text = tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    return list(tok(text, add_special_tokens=False)["input_ids"]), True


class Progress:
    """A transformers-style streamer that advances a tqdm bar per generated token."""

    def __init__(self, total: int, disable: bool | None):
        self.bar = common.progress(total, "generate", disable)
        self.started = False

    def put(self, ids) -> None:
        if self.started:
            self.bar.update(1)
        self.started = True

    def end(self) -> None:
        self.bar.close()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="a Hugging Face model folder or Hub id")
    p.add_argument("--prompt", default="The quick brown fox")
    chat = p.add_mutually_exclusive_group()
    chat.add_argument(
        "--chat", dest="chat", action="store_true", default=None, help="use the chat template"
    )
    chat.add_argument("--no-chat", dest="chat", action="store_false", help="plain text prompt")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--sample", action="store_true", help="sample (else greedy)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--width", type=int, default=128, help="random GPT-2 width")
    p.add_argument("--depth", type=int, default=4, help="random GPT-2 blocks")
    p.add_argument("--heads", type=int, default=4, help="random GPT-2 heads")
    p.add_argument("--out", type=Path, default=Path("runs/generate"))
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    folder = args.model
    if folder is None:
        folder = random_gpt2(Path(tempfile.mkdtemp()), args.width, args.depth, args.heads)
    model, params = M.from_pretrained(folder)
    tok = tokenizer_for(folder)
    if isinstance(tok, Bytes):
        prompt, chat = tok.encode(args.prompt), False
    else:
        prompt, chat = prompt_ids(tok, args.prompt, args.chat)
    ids = np.array([prompt], np.int32)
    options = dict(max_new_tokens=args.max_new_tokens)
    if args.sample:
        options.update(
            do_sample=True,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            key=jax.random.key(args.seed),
        )
    start = time.perf_counter()
    out = M.generate(model, params, ids, **options, streamer=Progress(args.max_new_tokens, None))
    first = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(M.generate(model, params, ids, **options))
    seconds = time.perf_counter() - start
    new = out.shape[1] - ids.shape[1]
    new_ids = [int(i) for i in np.asarray(out[0, ids.shape[1] :])]
    text = (
        tok.decode(new_ids)
        if isinstance(tok, Bytes)
        else tok.decode(new_ids, skip_special_tokens=True)
    )
    metrics = {
        "model": str(folder),
        "model_type": type(model.config).model_type,
        "chat": chat,
        "prompt_ids": prompt,
        "new_ids": new_ids,
        "new_tokens": int(new),
        "first_call_seconds": round(first, 3),
        "tokens_per_second": round(new / seconds, 1),
    }
    print(repr(text if chat else args.prompt + text))
    print(json.dumps(metrics))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


if __name__ == "__main__":
    main()
