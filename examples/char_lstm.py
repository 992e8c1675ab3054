"""Train a character-level LSTM language model on Python's own standard-library docstrings.

    python examples/char_lstm.py             # about 5 minutes on 2 CPU cores
    python examples/char_lstm.py --steps 50  # a quick look

The text is assembled at run time from the docstrings of ~100 standard-library modules
(nothing is downloaded); the last 10% is held out. The model is
``Embedding -> LSTM -> Linear`` over characters, trained with optax Adam (gradient
clipping at 1) in one jitted step whose params and optimizer state are donated. It
reports the validation cross-entropy in nats per character next to the unigram
baseline (the training text's character frequencies), which a model that learns
anything about sequences must beat clearly, then samples some text. Outputs in ``--out``:
``metrics.json``, ``sample.txt`` and ``model.safetensors``, whose names are those of the
torch module ``CharLSTMTorch`` sketched below, so ``load_state_dict`` accepts it::

    class CharLSTMTorch(torch.nn.Module):
        def __init__(self, vocab, embed, hidden, layers):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, embed)
            self.rnn = torch.nn.LSTM(embed, hidden, layers, batch_first=True)
            self.head = torch.nn.Linear(hidden, vocab)
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
class CharLSTM(L.Layer):
    """Characters in, next-character logits out: ``head(rnn(embed(ids)))``."""

    embed: L.Embedding
    rnn: L.LSTM
    head: L.Linear

    @property
    def takes_ids(self) -> bool:
        return True

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> L.Params:
        batch, steps = shape
        embed = self.embed.embedding_dim
        hidden = self.rnn.hidden_size
        return {
            "embed": self.embed.init(jax.random.fold_in(key, 0), shape, dtype),
            "rnn": self.rnn.init(jax.random.fold_in(key, 1), (batch, steps, embed), dtype),
            "head": self.head.init(jax.random.fold_in(key, 2), (batch, steps, hidden), dtype),
        }

    def apply(self, params, ids, hx=None, *, key=None, train=False):
        """``ids`` ``(B, T)`` -> ``(logits (B, T, vocab), (h, c))``."""
        x = self.call("embed", params, ids)
        key = None if key is None else jax.random.fold_in(key, 1)
        y, state = self.call("rnn", params, x, hx, key=key, train=train)
        return self.call("head", params, y), state


def build_model(vocab: int, embed: int, hidden: int, layers: int, dropout: float) -> CharLSTM:
    return CharLSTM(
        L.Embedding(vocab, embed),
        L.LSTM(hidden, num_layers=layers, batch_first=True, dropout=dropout if layers > 1 else 0),
        L.Linear(vocab),
    )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=1500, help="training steps (default 1500)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=64, help="characters per training window")
    p.add_argument("--embed", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--dropout", type=float, default=0.0, help="between LSTM layers")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--chars", type=int, default=1_000_000, help="size of the text corpus")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--sample-len", type=int, default=400)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/char_lstm"), help="output folder")
    return p.parse_args(argv)


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
    valid = windows(valid_ids, 256, min(64, max(1, (len(valid_ids) - 1) // 257)))

    model = build_model(len(vocab), args.embed, args.hidden, args.layers, args.dropout)
    key = jax.random.key(args.seed)
    params = model.init(key, (args.batch_size, args.seq_len))
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(args.lr))
    opt_state = optimizer.init(params)

    def loss_fn(params, batch, key, train):
        logits, _ = model.apply(params, batch[:, :-1], key=key, train=train)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, opt_state, batch, key):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, key, True)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    evaluate = jax.jit(lambda params, batch: loss_fn(params, batch, None, False))

    rng = np.random.default_rng(args.seed)
    history: dict[str, list[float]] = {"step": [], "train_loss": [], "valid_loss": []}
    start = time.perf_counter()
    bar = common.progress(args.steps, "char_lstm")
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

    sample = vocab.decode(
        generate(model, params, vocab.encode("The "), args.sample_len, args.temperature, key)
    )
    metrics = {
        "valid_loss": valid_loss,
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


def generate(model: CharLSTM, params, prompt: np.ndarray, length: int, temperature, key):
    """``prompt`` followed by ``length`` sampled characters (one jitted scan)."""

    @jax.jit
    def run(params, prompt, key):
        logits, state = model.apply(params, prompt[None])

        def step(carry, k):
            logits, state = carry
            nxt = jax.random.categorical(k, logits / temperature)
            logits, state = model.apply(params, nxt[:, None], state)
            return (logits[:, -1], state), nxt[0]

        keys = jax.random.split(key, length)
        _, out = jax.lax.scan(step, (logits[:, -1], state), keys)
        return out

    return np.concatenate([prompt, np.asarray(run(params, jnp.asarray(prompt), key))])


if __name__ == "__main__":
    main()
