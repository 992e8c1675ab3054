"""Greedy decoding speed: ``purelayers.models.generate`` against transformers'
PyTorch ``generate``, on the same random GPT-2 (or Mixtral), in one run.

    python -m benchmarks.generate            # GPT-2-small shape: 12 layers, width 768
    python -m benchmarks.generate --smoke    # tiny shapes, so the harness never rots
    python -m benchmarks.generate --model mixtral   # a small Mixtral: 8 experts, top 2

For each batch size: prompt ``--prompt-len`` random ids, ``--new-tokens`` new ones,
greedy, no eos. Reported per implementation: time to first token (prompt prefill
plus the first token, median over ``--repeats`` steady calls), decode tokens per
second per row over the remaining tokens (median), and, for purelayers, the first
call's compile time (the prefill and the decode step, compiled once). The two
implementations must produce the same tokens (checked).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import numpy as np

import purelayers as pl
from purelayers import models as M


def build(width: int, depth: int, heads: int, vocab: int, positions: int):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=vocab,
        n_positions=positions,
        n_embd=width,
        n_layer=depth,
        n_head=heads,
        bos_token_id=None,
        eos_token_id=None,
    )
    hf = transformers.GPT2LMHeadModel(config).eval()
    model = M.GPT2LMHeadModel(M.GPT2Config.from_dict(config.to_dict()))
    params = pl.params.load_state_dict(
        pl.params.abstract(model, (1, 1)), hf.state_dict(), model=model
    )
    return hf, model, params


def build_mixtral(width: int, depth: int, heads: int, vocab: int, experts: int, folder: str):
    """A random Mixtral (``width`` hidden, ``2 * width`` per expert, ``experts`` experts,
    top 2, ``heads // 2`` kv heads), saved by transformers and loaded here by name."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        vocab_size=vocab,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=depth,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        num_local_experts=experts,
        num_experts_per_tok=2,
        max_position_embeddings=1024,
        sliding_window=None,
        bos_token_id=None,
        eos_token_id=None,
    )
    hf = transformers.MixtralForCausalLM(config).eval()
    hf.save_pretrained(folder)
    model, params = M.from_pretrained(folder)
    return hf, model, params


CONFIG_KEYS = ("model", "width", "depth", "heads", "vocab", "experts", "prompt_len")
CONFIG_KEYS += ("new_tokens", "repeats")


class _Clock:
    """A streamer that records when the first generated token arrives."""

    def __init__(self):
        self.start = time.perf_counter()
        self.first = None
        self.calls = 0

    def put(self, ids) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:
            self.first = time.perf_counter() - self.start

    def end(self) -> None:
        pass


def time_purelayers(model, params, ids, new: int, repeats: int) -> dict:
    start = time.perf_counter()
    out = jax.block_until_ready(M.generate(model, params, ids, max_new_tokens=new))
    first_call = time.perf_counter() - start
    ttft, rates = [], []
    for _ in range(repeats):
        clock = _Clock()
        jax.block_until_ready(M.generate(model, params, ids, max_new_tokens=new, streamer=clock))
        total = time.perf_counter() - clock.start
        ttft.append(clock.first)
        rates.append((new - 1) / (total - clock.first))
    return {
        "tokens": np.asarray(out),
        "first_call_s": first_call,
        "ttft_s": statistics.median(ttft),
        "tokens_per_s": statistics.median(rates),
    }


def time_transformers(hf, ids, new: int, repeats: int) -> dict:
    import torch

    x = torch.tensor(ids, dtype=torch.long)
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        start = time.perf_counter()
        out = hf.generate(x, **kwargs)
        first_call = time.perf_counter() - start
        ttft, rates = [], []
        for _ in range(repeats):
            clock = _Clock()
            hf.generate(x, streamer=clock, **kwargs)
            total = time.perf_counter() - clock.start
            ttft.append(clock.first)
            rates.append((new - 1) / (total - clock.first))
    return {
        "tokens": out.numpy(),
        "first_call_s": first_call,
        "ttft_s": statistics.median(ttft),
        "tokens_per_s": statistics.median(rates),
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", choices=["gpt2", "mixtral"], default="gpt2")
    p.add_argument("--experts", type=int, default=8, help="mixtral's experts")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--depth", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one repeat")
    p.add_argument("--json", type=str, default=None, help="also write results here")
    args = p.parse_args(argv)
    sizes = {"gpt2": (768, 12, 12, 50257), "mixtral": (512, 4, 8, 32000)}[args.model]
    for name, size in zip(("width", "depth", "heads", "vocab"), sizes, strict=True):
        if getattr(args, name) is None:  # the model's default shape unless given
            setattr(args, name, size)
    if args.smoke:
        args.width, args.depth, args.heads, args.vocab = 32, 2, 2, 64
        args.prompt_len, args.new_tokens, args.repeats, args.batch_sizes = 4, 4, 1, [1]
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.model == "mixtral":
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            hf, model, params = build_mixtral(
                args.width, args.depth, args.heads, args.vocab, args.experts, folder
            )
    else:
        hf, model, params = build(args.width, args.depth, args.heads, args.vocab, 1024)
    rows = []
    for b in args.batch_sizes:
        ids = (
            np.random.default_rng(b).integers(0, args.vocab, (b, args.prompt_len)).astype(np.int32)
        )
        ours = time_purelayers(model, params, ids, args.new_tokens, args.repeats)
        theirs = time_transformers(hf, ids, args.new_tokens, args.repeats)
        same = bool(np.array_equal(ours.pop("tokens"), theirs.pop("tokens")))
        rows.append({"batch": b, "purelayers": ours, "transformers": theirs, "same_tokens": same})
    result = {
        "config": {k: getattr(args, k) for k in CONFIG_KEYS},
        "rows": rows,
        "devices": [str(d) for d in jax.devices()],
    }
    print(
        "| batch | impl | first call s | time to first token s | decode tokens/s per row | same tokens |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        for impl in ("purelayers", "transformers"):
            m = r[impl]
            print(
                f"| {r['batch']} | {impl} | {m['first_call_s']:.2f} | {m['ttft_s']:.3f} | "
                f"{m['tokens_per_s']:.1f} | {r['same_tokens']} |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
