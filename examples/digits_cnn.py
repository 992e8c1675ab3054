"""Train a small CNN with BatchNorm on scikit-learn's bundled handwritten digits.

    python examples/digits_cnn.py            # test accuracy ~0.99 on 2 CPU cores

The 8x8 one-channel images go through two ``Conv2d BatchNorm2d ReLU MaxPool2d`` stages
and an MLP head. BatchNorm's running statistics live in a ``state`` tree that the jitted
step threads alongside params (all three donated); optax only ever sees params. The
checkpoint holds both under torch's names (``num_batches_tracked`` as int64), so the
equivalent ``torch.nn.Sequential`` (see ``torch_equivalent``) loads it with
``load_state_dict(strict=True)``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

import purelayers as pl
from purelayers import layers as L


def build_model(width: int = 32) -> L.Sequential:
    return L.Sequential(
        L.Conv2d(width, 3, padding=1), L.BatchNorm2d(), L.ReLU(), L.MaxPool2d(2),
        L.Conv2d(2 * width, 3, padding=1), L.BatchNorm2d(), L.ReLU(), L.MaxPool2d(2),
        L.Flatten(), L.Linear(128), L.ReLU(), L.Dropout(0.2), L.Linear(10),
    )  # fmt: skip


def torch_equivalent(torch, width: int = 32):
    """The same network in torch: its state_dict names equal our checkpoint's."""
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(2 * width * 4, 128), nn.ReLU(),
        nn.Dropout(0.2), nn.Linear(128, 10),
    )  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--epochs", type=int, default=15, help="passes over the training set")
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--width", type=int, default=32, help="channels of the first conv")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/digits_cnn"))
    p.add_argument("--no-plot", action="store_true", help="skip the matplotlib figure")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    x_tr, y_tr, x_te, y_te = common.digits(seed=args.seed, images=True)
    model = build_model(args.width)
    key = jax.random.key(args.seed)
    shape = (args.batch_size, *x_tr.shape[1:])
    params, state = model.init(key, shape), model.init_state(shape)
    optimizer = optax.adam(args.lr)
    opt_state = optimizer.init(params)

    def loss_fn(params, state, x, y, key):
        logits, state = model.apply(params, x, state=state, train=True, key=key)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), state

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def train_step(params, state, opt_state, x, y, key):
        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state, x, y, key)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state, loss

    @jax.jit
    def accuracy(params, state, x, y):
        logits, _ = model.apply(params, x, state=state)  # eval: running statistics
        return jnp.mean(jnp.argmax(logits, axis=-1) == y)

    steps_per_epoch = len(x_tr) // args.batch_size
    total = args.steps if args.steps is not None else args.epochs * steps_per_epoch
    rng = np.random.default_rng(args.seed)
    history: dict[str, list[float]] = {"step": [], "loss": [], "test_accuracy": []}
    start = time.perf_counter()
    bar = common.progress(total, "digits_cnn")
    batch_indices = common.batches(rng, len(x_tr), args.batch_size)
    for step, idx in zip(range(1, total + 1), batch_indices, strict=False):
        params, state, opt_state, loss = train_step(
            params, state, opt_state, x_tr[idx], y_tr[idx], jax.random.fold_in(key, step)
        )
        if step % steps_per_epoch == 0 or step == total:
            history["step"].append(step)
            history["loss"].append(float(loss))
            history["test_accuracy"].append(float(accuracy(params, state, x_te, y_te)))
            rate = step * args.batch_size / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{float(loss):.4f}", img_per_s=f"{rate:,.0f}")
        bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start
    test_accuracy = float(accuracy(params, state, x_te, y_te))

    args.out.mkdir(parents=True, exist_ok=True)
    pl.params.save(args.out / "model.safetensors", params, state, model=model)
    metrics = {
        "test_accuracy": test_accuracy,
        "steps": total,
        "seconds": seconds,
        "history": history,
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    if not args.no_plot:
        common.plot_curves(history, args.out / "curves.png")
    print(pl.params.summary(model, params, state))
    print(f"trained {total} steps in {seconds:.1f} s; outputs in {args.out}")
    print(f"test accuracy: {test_accuracy:.4f}")
    return metrics


if __name__ == "__main__":
    main()
