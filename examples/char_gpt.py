"""Train a small character-level GPT on Python's own standard-library docstrings.

    python examples/char_gpt.py             # about 3-4 minutes on 2 CPU cores
    python examples/char_gpt.py --steps 50  # a quick look
    python examples/char_gpt.py --rope      # rotary positions instead of a learned table

The text is assembled at run time from the docstrings of ~100 standard-library modules
(nothing is downloaded); the last 10% is held out. The model is a custom composite
layer: token embedding plus learned positions (``pos_emb``; or RoPE inside attention),
a ``Repeat`` of pre-norm ``TransformerBlock``s (one compiled block body, whatever the
depth), a final ``LayerNorm`` and a linear head. It trains with optax AdamW in one
jitted step with donated params and optimizer state, reports the validation
cross-entropy in nats per character next to the unigram baseline, and samples text
through the attention KV cache with one jitted decode step that compiles once.

Outputs in ``--out``: ``metrics.json``, ``sample.txt`` and ``model.safetensors``,
whose names are those of this torch module (``block`` written like the test's
reference: ``ln1``, ``attn.qkv``, ``attn.out``, ``ln2``, ``fc``, ``proj``)::

    class CharGPTTorch(torch.nn.Module):
        def __init__(self, vocab, width, depth, max_len):
            super().__init__()
            self.pos_emb = torch.nn.Parameter(torch.zeros(max_len, width))
            self.embed = torch.nn.Embedding(vocab, width)
            self.blocks = torch.nn.Sequential(*[block(width) for _ in range(depth)])
            self.norm = torch.nn.LayerNorm(width)
            self.head = torch.nn.Linear(width, vocab)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

import purelayers as pl
from purelayers import layers as L


@dataclasses.dataclass(frozen=True)
class CharGPT(L.Layer):
    """Characters in, next-character logits out:
    ``head(norm(blocks(embed(ids) + pos_emb[positions])))``."""

    embed: L.Embedding
    blocks: L.Repeat
    norm: L.LayerNorm
    head: L.Linear
    max_len: int
    learned_positions: bool = True

    def own_names(self) -> tuple[str, ...]:
        return ("pos_emb",)

    @property
    def takes_ids(self) -> bool:
        return True

    @property
    def width(self) -> int:
        return self.embed.embedding_dim

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> L.Params:
        feats = (*shape, self.width)
        params: L.Params = {}
        if self.learned_positions:
            params["pos_emb"] = pl.init.normal(std=0.02)(
                jax.random.fold_in(key, 0), (self.max_len, self.width), dtype
            )
        params["embed"] = self.embed.init(jax.random.fold_in(key, 1), shape, dtype)
        params["blocks"] = self.blocks.init(jax.random.fold_in(key, 2), feats, dtype)
        params["norm"] = self.norm.init(jax.random.fold_in(key, 3), feats, dtype)
        params["head"] = self.head.init(jax.random.fold_in(key, 4), feats, dtype)
        return params

    def init_cache(self, batch: int, dtype: Any = jnp.float32) -> Any:
        """The blocks' decoding caches, room for ``max_len`` characters."""
        return self.blocks.init_cache((batch, self.max_len, self.width), dtype)

    def apply(self, params, ids, *, key=None, train=False, cache=None):
        """``ids`` ``(B, T)`` -> logits ``(B, T, vocab)`` (and the new cache if given)."""
        x = self.call("embed", params, ids)
        if self.learned_positions:
            start = 0 if cache is None else cache["length"][0]
            pos = jax.lax.dynamic_slice_in_dim(params["pos_emb"], start, ids.shape[1])
            x = x + pos[None].astype(x.dtype)
        x = self.call("blocks", params, x, key=key, train=train, cache=cache)
        if cache is not None:
            x, cache = x
        logits = self.call("head", params, self.call("norm", params, x))
        return logits if cache is None else (logits, cache)


def build_model(vocab: int, args: argparse.Namespace) -> CharGPT:
    block = L.TransformerBlock(
        args.heads, dropout=args.dropout, rope=args.rope, causal=True, mlp_ratio=4
    )
    return CharGPT(
        L.Embedding(vocab, args.width),
        L.Repeat(block, args.depth),
        L.LayerNorm(),
        L.Linear(vocab),
        max_len=args.max_len,
        learned_positions=not args.rope,
    )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=1000, help="training steps (default 1000)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64, help="characters per training window")
    p.add_argument("--width", type=int, default=128, help="embedding width")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--depth", type=int, default=4, help="transformer blocks")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--rope", action="store_true", help="rotary positions, no pos_emb table")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--chars", type=int, default=1_000_000, help="size of the text corpus")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--sample-len", type=int, default=300)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/char_gpt"), help="output folder")
    args = p.parse_args(argv)
    args.max_len = max(args.seq_len, 4 + args.sample_len)
    return args


def windows(ids: np.ndarray, length: int, count: int) -> np.ndarray:
    """``count`` evenly spaced windows of ``length + 1`` characters (inputs and targets)."""
    starts = np.linspace(0, len(ids) - length - 1, count).astype(np.int64)
    return np.stack([ids[s : s + length + 1] for s in starts])


def main(argv=None) -> dict:
    args = parse_args(argv)
    text = common.stdlib_text(args.chars)
    vocab = common.CharVocab(text)
    ids = vocab.encode(text)
    split = int(len(ids) * 0.9)
    train_ids, valid_ids = ids[:split], ids[split:]
    baseline = common.unigram_loss(train_ids, valid_ids, len(vocab))
    count = min(64, max(1, (len(valid_ids) - 1) // (args.seq_len + 1)))
    valid = windows(valid_ids, args.seq_len, count)

    model = build_model(len(vocab), args)
    key = jax.random.key(args.seed)
    params = model.init(key, (args.batch_size, args.seq_len))
    warmup = min(100, max(1, args.steps // 10))
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, warmup, max(args.steps, warmup + 1))
    optimizer = optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=args.weight_decay)
    )
    opt_state = optimizer.init(params)

    def loss_fn(params, batch, key, train):
        logits = model.apply(params, batch[:, :-1], key=key, train=train)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, opt_state, batch, key):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, key, True)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    evaluate = jax.jit(lambda params, batch: loss_fn(params, batch, None, False))
    initial_loss = float(evaluate(params, valid))

    rng = np.random.default_rng(args.seed)
    history: dict[str, list[float]] = {"step": [], "train_loss": [], "valid_loss": []}
    start = time.perf_counter()
    bar = common.progress(args.steps, "char_gpt")
    running = None
    for step in range(1, args.steps + 1):
        starts = rng.integers(0, len(train_ids) - args.seq_len - 1, args.batch_size)
        batch = np.stack([train_ids[s : s + args.seq_len + 1] for s in starts])
        params, opt_state, loss = train_step(
            params, opt_state, batch, jax.random.fold_in(key, step)
        )
        if step % 10 == 0 or step == args.steps:
            loss = float(loss)
            running = loss if running is None else 0.9 * running + 0.1 * loss
            bar.set_postfix(loss=f"{running:.3f}")
        if step % args.eval_every == 0 or step == args.steps:
            history["step"].append(step)
            history["train_loss"].append(running)
            history["valid_loss"].append(float(evaluate(params, valid)))
        bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start
    valid_loss = history["valid_loss"][-1]

    prompt = vocab.encode("The ")
    sample = vocab.decode(generate(model, params, prompt, args.sample_len, args.temperature, key))
    metrics = {
        "valid_loss": valid_loss,
        "initial_valid_loss": initial_loss,
        "unigram_loss": baseline,
        "steps": args.steps,
        "seconds": seconds,
        "vocab": len(vocab),
        "train_chars": len(train_ids),
        "valid_chars": len(valid_ids),
        "parameters": pl.params.count(params),
        "history": history,
    }
    common.finish_text_run(args.out, model, params, metrics, sample, len(text))
    return metrics


def generate(model: CharGPT, params, prompt: np.ndarray, length: int, temperature, key):
    """``prompt`` followed by ``length`` sampled characters.

    Every character, prompt included, goes through the same jitted decode step: one
    token in, the KV cache updated in place of fixed shape, so it compiles once.
    """

    @jax.jit
    def decode_step(params, token, cache, key):
        logits, cache = model.apply(params, token[None, None], cache=cache)
        nxt = jax.random.categorical(key, logits[0, -1] / temperature)
        return nxt.astype(jnp.int32), cache

    cache = model.init_cache(1)
    out = list(prompt)
    token = jnp.int32(prompt[0])
    for i in range(len(prompt) + length - 1):
        token, cache = decode_step(params, token, cache, jax.random.fold_in(key, i))
        if i + 1 < len(prompt):
            token = jnp.int32(prompt[i + 1])
        else:
            out.append(int(token))
    return np.asarray(out)


if __name__ == "__main__":
    main()
