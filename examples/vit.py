"""Train a small Vision Transformer (ViT) on scikit-learn's bundled 8x8 handwritten digits.

    python examples/vit.py               # test accuracy ~0.97 (chance 0.10), about a minute
    python examples/vit.py --steps 100   # a quick look

Each 8x8 image is cut into 2x2 patches (16 tokens) by a strided ``Conv2d`` (the patch
embedding), a learned class token is put in front, learned position embeddings are
added, and a ``Repeat`` of bidirectional pre-norm ``TransformerBlock``s (one compiled
block body, whatever the depth) mixes the tokens; a ``LayerNorm`` and a ``Linear`` head
read the class token. The model is a composite with two arrays of its own (``cls_token``
and ``pos_emb``, declared in ``own_names``) and its children initialized for it by
``init_children``.

Outputs in ``--out``: ``metrics.json`` (``test_accuracy`` against ``chance``, the
majority-class rate of the test set, plus ``steps`` and ``seconds``) and ``vit.png``
(the test accuracy curve and a grid of test digits titled with their predictions, red
where wrong).
"""

from __future__ import annotations

import dataclasses
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
class ViT(L.Layer):
    """Images ``(B, 1, 8, 8)`` to logits ``(B, classes)``:
    ``head(norm(blocks([cls_token; patches(x)] + pos_emb))[:, 0])``."""

    patches: L.Conv2d
    blocks: L.Repeat
    norm: L.LayerNorm
    head: L.Linear
    width: int
    tokens: int  # patches per image

    def own_names(self) -> tuple[str, ...]:
        return ("cls_token", "pos_emb")

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> L.Params:
        k_cls, k_pos, k_children = jax.random.split(key, 3)
        normal = pl.init.normal(std=0.02)
        own = {
            "cls_token": normal(k_cls, (1, 1, self.width), dtype),
            "pos_emb": normal(k_pos, (1, self.tokens + 1, self.width), dtype),
        }
        return {**own, **self.init_children(k_children, shape, dtype, own)}

    def apply(self, params, x, *, key=None, train=False):
        h = self.call("patches", params, x)  # (B, width, H/p, W/p)
        h = h.reshape(h.shape[0], self.width, -1).transpose(0, 2, 1)  # (B, tokens, width)
        cls = jnp.broadcast_to(params["cls_token"], (h.shape[0], 1, self.width))
        h = jnp.concatenate([cls.astype(h.dtype), h], axis=1) + params["pos_emb"]
        h = self.call("blocks", params, h, key=key, train=train)
        return self.call("head", params, self.call("norm", params, h[:, 0]))


def build_model(args) -> ViT:
    block = L.TransformerBlock(args.heads, causal=False, dropout=args.dropout, mlp_ratio=2)
    return ViT(
        L.Conv2d(args.width, args.patch, stride=args.patch),
        L.Repeat(block, args.depth),
        L.LayerNorm(),
        L.Linear(10),
        width=args.width,
        tokens=(8 // args.patch) ** 2,
    )


def parse_args(argv=None):
    p = common.gallery_parser("vit", __doc__, steps=1500)
    p.add_argument("--width", type=common.positive_int, default=64, help="token width")
    p.add_argument("--depth", type=common.positive_int, default=3, help="transformer blocks")
    p.add_argument("--heads", type=common.positive_int, default=4)
    p.add_argument("--patch", type=int, choices=(1, 2, 4), default=2, help="patch side")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--batch-size", type=common.positive_int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--eval-every", type=common.positive_int, default=100)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    x_tr, y_tr, x_te, y_te = common.digits(seed=args.seed, images=True)
    model = build_model(args)
    key = jax.random.key(args.seed)
    # init under jit: one compile rather than one small program per array
    params = jax.jit(model.init, static_argnums=1)(key, (args.batch_size, *x_tr.shape[1:]))
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, args.lr, min(100, max(1, args.steps // 10)), max(args.steps, 2)
    )
    optimizer = optax.adamw(schedule, weight_decay=0.05)
    opt_state = optimizer.init(params)

    def loss_fn(params, batch):
        x, y, key = batch  # the key drives dropout
        logits = model.apply(params, x, key=key, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    train_step = common.optax_step(loss_fn, optimizer)
    predict = jax.jit(lambda params, x: jnp.argmax(model.apply(params, x), axis=-1))

    rng = np.random.default_rng(args.seed)
    history: dict[str, list[float]] = {"step": [], "test_accuracy": []}
    start = time.perf_counter()
    bar = common.progress(args.steps, "vit")
    batch_indices = common.batches(rng, len(x_tr), args.batch_size)
    for step, idx in zip(range(1, args.steps + 1), batch_indices, strict=False):
        batch = (x_tr[idx], y_tr[idx], jax.random.fold_in(key, step))
        params, opt_state, loss = train_step(params, opt_state, batch)
        if step % args.eval_every == 0 or step == args.steps:
            accuracy = float(np.mean(np.asarray(predict(params, x_te)) == y_te))
            history["step"].append(step)
            history["test_accuracy"].append(accuracy)
            bar.set_postfix(loss=f"{float(loss):.3f}", test_acc=f"{accuracy:.3f}")
        bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start

    predictions = np.asarray(predict(params, x_te))
    metrics = common.write_metrics(
        args.out,
        {
            "test_accuracy": float(np.mean(predictions == y_te)),
            "chance": float(np.bincount(y_te).max() / len(y_te)),
            "parameters": pl.params.count(params),
            "steps": args.steps,
            "seconds": seconds,
        },
    )
    plot(history, x_te[:24, 0], predictions[:24], y_te[:24], args.out / "vit.png")
    print(f"trained {args.steps} steps in {seconds:.1f} s; outputs in {args.out}")
    print(f"test accuracy {metrics['test_accuracy']:.4f} (chance {metrics['chance']:.2f})")
    return metrics


def plot(history: dict, images, predicted, labels, path) -> None:
    """The test-accuracy curve beside test digits titled with the model's predictions."""
    fig, axes = common.figure(
        3, 9, figsize=(9, 3.2), gridspec_kw={"width_ratios": [6, 1, 1, 1, 1, 1, 1, 1, 1]}
    )
    gs = axes[0, 0].get_gridspec()
    for ax in axes[:, 0]:
        ax.remove()
    curve = fig.add_subplot(gs[:, 0])
    curve.plot(history["step"], history["test_accuracy"], marker=".")
    curve.axhline(0.1, color="grey", linestyle="--", label="chance")
    curve.set(xlabel="step", ylabel="test accuracy", ylim=(0, 1), title="ViT on the digits")
    curve.legend(loc="lower right")
    for ax, image, guess, label in zip(
        axes[:, 1:].ravel(), images, predicted, labels, strict=False
    ):
        ax.imshow(image, cmap="gray_r", vmin=0, vmax=1)
        ax.set_title(str(guess), fontsize=9, color="black" if guess == label else "red")
        ax.set_axis_off()
    common.save_figure(fig, path)


if __name__ == "__main__":
    main()
