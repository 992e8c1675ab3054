"""Fine-tune a GPT-2 loaded from a Hugging Face folder, save it back, and load the
result into transformers: a byte-level toy.

    python examples/finetune_gpt2.py                  # a small random GPT-2, offline
    python examples/finetune_gpt2.py --model PATH     # any GPT-2 folder (byte-level ids)

The model comes from ``purelayers.models.from_pretrained`` (with no ``--model``,
transformers builds a small GPT-2 with random weights and a 256-token byte vocabulary,
saves it, and it is loaded from there: nothing is downloaded). It trains on the
bundled character corpus (the standard library's docstrings, as UTF-8 bytes) with
optax AdamW in one jitted step, the embedding and the tied ``lm_head`` sharing one
array. ``save_pretrained`` writes ``--out/model``; transformers' ``from_pretrained``
loads that folder and its logits are compared with ours.

A byte-level toy: the ids are UTF-8 bytes, not the folder's tokenizer, so with
``--model`` a pretrained GPT-2 learns nothing it can use. To fine-tune a real model on
text, use ``examples/finetune_chat.py`` (the folder's tokenizer and chat template,
masked labels, checkpoints).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from generate import random_gpt2

from purelayers import models as M


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=None, help="a GPT-2 folder")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--chars", type=int, default=300_000, help="size of the text corpus")
    p.add_argument("--width", type=int, default=128, help="random GPT-2 width")
    p.add_argument("--depth", type=int, default=4, help="random GPT-2 blocks")
    p.add_argument("--heads", type=int, default=4, help="random GPT-2 heads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/finetune_gpt2"))
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    folder = args.model
    if folder is None:
        folder = random_gpt2(Path(tempfile.mkdtemp()), args.width, args.depth, args.heads)
    model, params = M.from_pretrained(folder, dtype=jnp.float32)
    if not isinstance(model, M.GPT2LMHeadModel):
        raise SystemExit(f"{folder} holds a {type(model).__name__}, not a GPT-2")
    vocab = model.config.vocab_size
    train, valid = common.byte_corpus(args.chars, vocab)
    rng = np.random.default_rng(args.seed)

    def batch(source: np.ndarray) -> np.ndarray:
        return common.windows(rng, source, args.batch_size, args.seq_len)

    loss_fn = common.next_token_loss(model.apply)

    optimizer = optax.adamw(args.lr, weight_decay=0.01)

    step = common.optax_step(loss_fn, optimizer)

    evaluate = jax.jit(loss_fn)
    valid_batch = batch(valid)
    initial = float(evaluate(params, valid_batch))
    state = optimizer.init(params)
    bar = common.progress(args.steps, "fine-tune")
    for _ in range(args.steps):
        params, state, loss = step(params, state, batch(train))
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss):.3f}")
    bar.close()
    final = float(evaluate(params, valid_batch))

    saved = M.save_pretrained(args.out / "model", model, params)
    metrics = {"steps": args.steps, "initial_valid_loss": initial, "valid_loss": final}
    metrics["transformers_max_logit_diff"] = compare_with_transformers(
        saved, model, params, valid_batch
    )
    print(json.dumps(metrics))
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def compare_with_transformers(folder: Path, model, params, ids: np.ndarray) -> float:
    """The largest difference between our logits and those of transformers' model
    loaded from the folder we saved."""
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        theirs = hf(torch.tensor(ids[:, :-1], dtype=torch.long)).logits.numpy()
    return float(np.max(np.abs(np.asarray(model.apply(params, ids[:, :-1])) - theirs)))


if __name__ == "__main__":
    main()
