"""LoRA fine-tuning of a causal LM's attention projections, saved as a PEFT adapter: a
byte-level toy.

    python examples/lora_finetune.py                  # a small random GPT-2, offline
    python examples/lora_finetune.py --model PATH     # a GPT-2, Llama, Mistral or Qwen2 folder

The model comes from ``purelayers.models.from_pretrained`` (with no ``--model``,
transformers builds a small GPT-2 with random weights and a 256-token byte vocabulary,
saves it, and it is loaded from there: nothing is downloaded). ``lora.wrap`` puts a
rank-``--r`` adapter on the attention projections (GPT-2's ``attn.c_attn`` and
``attn.c_proj``; Llama's ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``), and optax Adam
trains those adapters alone on the bundled character corpus (the standard library's
docstrings, as UTF-8 bytes) in one jitted step: ``lora.trainable`` labels the leaves,
``optax.multi_transform`` keeps the base weights fixed and holds moments for the
adapters only. The run prints the trainable and total parameter counts and the loss
curve, plots it (``--out/loss.png``), and writes ``--out/adapter``, which
``peft.PeftModel.from_pretrained(transformers_model, path)`` loads.

A byte-level toy: the ids are UTF-8 bytes reduced modulo the vocabulary, not the
folder's tokenizer, so with ``--model`` a pretrained model learns nothing it can use.
To fine-tune a real model on text, use ``examples/finetune_chat.py`` (the folder's
tokenizer and chat template, masked labels, checkpoints).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from generate import random_gpt2

import purelayers as pl
from purelayers import lora
from purelayers import models as M

# The attention projections of each family, as PEFT's target_modules.
ATTENTION = {
    "gpt2": ("attn.c_attn", "attn.c_proj"),
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj"),
}
ATTENTION["mistral"] = ATTENTION["qwen2"] = ATTENTION["llama"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=None, help="a Hugging Face model folder")
    p.add_argument("--targets", nargs="+", default=None, help="target_modules (default: attention)")
    p.add_argument("--r", type=int, default=8)
    p.add_argument("--lora-alpha", type=float, default=16)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--chars", type=int, default=300_000, help="size of the text corpus")
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--width", type=int, default=128, help="random GPT-2 width")
    p.add_argument("--depth", type=int, default=4, help="random GPT-2 blocks")
    p.add_argument("--heads", type=int, default=4, help="random GPT-2 heads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/lora_finetune"))
    return p.parse_args(argv)


def state_bytes(tree) -> int:
    """Bytes of the arrays in an optimizer state (abstract or real)."""
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))


def plot_loss(history: dict, path: Path) -> None:
    """Training and validation loss against the step, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(history["step"], history["loss"], label="training batch")
    ax.plot(history["eval_step"], history["valid_loss"], "o-", label="validation")
    ax.set(xlabel="step", ylabel="loss (nats/byte)", title="LoRA fine-tuning")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(args: argparse.Namespace):
    """Train; returns ``(metrics, lmodel, params)``."""
    folder = args.model
    if folder is None:
        folder = random_gpt2(Path(tempfile.mkdtemp()), args.width, args.depth, args.heads)
    model, base = M.from_pretrained(folder, dtype=jnp.float32)
    targets = tuple(args.targets or ATTENTION[model.config.model_type])
    lmodel = lora.wrap(model, targets, r=args.r, lora_alpha=args.lora_alpha)
    params = lora.init(lmodel, jax.random.key(args.seed), base)

    mask = lora.trainable(params)
    optimizer = optax.multi_transform({True: optax.adam(args.lr), False: optax.set_to_zero()}, mask)
    state = optimizer.init(params)
    leaves = zip(jax.tree.leaves(params), jax.tree.leaves(mask), strict=True)
    trainable = sum(a.size for a, m in leaves if m)
    total = pl.params.count(params)
    full_adam = state_bytes(jax.eval_shape(optax.adam(args.lr).init, params))

    vocab = model.config.vocab_size
    train, valid = common.byte_corpus(args.chars, vocab)
    rng = np.random.default_rng(args.seed)

    def batch(source: np.ndarray) -> np.ndarray:
        return common.windows(rng, source, args.batch_size, args.seq_len)

    loss_fn = common.next_token_loss(lmodel.apply)

    step = common.optax_step(loss_fn, optimizer)

    evaluate = jax.jit(loss_fn)
    valid_batch = batch(valid)
    history = {"step": [], "loss": [], "eval_step": [0], "valid_loss": []}
    history["valid_loss"].append(float(evaluate(params, valid_batch)))
    start = time.perf_counter()
    bar = common.progress(args.steps, "lora")
    for i in range(1, args.steps + 1):
        params, state, loss = step(params, state, batch(train))
        history["step"].append(i)
        history["loss"].append(float(loss))
        if i % args.eval_every == 0 or i == args.steps:
            history["eval_step"].append(i)
            history["valid_loss"].append(float(evaluate(params, valid_batch)))
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss):.3f}")
    bar.close()
    seconds = time.perf_counter() - start

    args.out.mkdir(parents=True, exist_ok=True)
    adapter = lora.save_adapter(args.out / "adapter", lmodel, params)
    plot_loss(history, args.out / "loss.png")
    metrics = {
        "model": str(folder),
        "target_modules": list(targets),
        "r": args.r,
        "lora_alpha": args.lora_alpha,
        "steps": args.steps,
        "seconds": round(seconds, 2),
        "trainable_params": int(trainable),
        "total_params": int(total),
        "optimizer_state_bytes": state_bytes(state),
        "full_adam_state_bytes": full_adam,
        "initial_valid_loss": history["valid_loss"][0],
        "valid_loss": history["valid_loss"][-1],
        "loss_curve": history,
        "adapter": str(adapter),
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    return metrics, lmodel, params


def main(argv=None) -> dict:
    metrics, _, _ = run(parse_args(argv))
    t, n = metrics["trainable_params"], metrics["total_params"]
    print(f"LoRA on {metrics['target_modules']} of {metrics['model']}")
    print(f"trainable params: {t:,} of {n:,} ({100 * t / n:.2f}%)")
    print(
        f"optimizer state: {metrics['optimizer_state_bytes']:,} bytes "
        f"(full-model adam: {metrics['full_adam_state_bytes']:,})"
    )
    curve = metrics["loss_curve"]
    print("validation loss: " + " -> ".join(f"{v:.3f}" for v in curve["valid_loss"]))
    print(f"trained {metrics['steps']} steps in {metrics['seconds']:.1f} s")
    print(f"adapter (PEFT format): {metrics['adapter']}")
    return metrics


if __name__ == "__main__":
    main()
