"""Train an MLP on scikit-learn's bundled handwritten digits (no download).

    python examples/digits_mlp.py            # under a minute on 2 CPU cores, test accuracy ~0.97

1,797 real 8x8 scans of handwritten digits ship inside scikit-learn; a fixed, stratified
split holds out a quarter for testing. The model is ``Linear(256) ReLU Dropout Linear(10)``
trained with optax Adam in one jitted step (params and optimizer state donated). At the end
it prints ``test accuracy: 0.9xxx``, saves a safetensors checkpoint that
``torch.nn.Sequential(Linear(64, 256), ReLU(), Dropout(0.1), Linear(256, 10))`` loads with
``load_state_dict``, and plots the loss and accuracy curves.
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


def build_model(hidden: int, dropout: float) -> L.Sequential:
    return L.Sequential(L.Linear(hidden), L.ReLU(), L.Dropout(dropout), L.Linear(10))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--epochs", type=int, default=40, help="passes over the training set (default 40)"
    )
    p.add_argument(
        "--steps", type=int, default=None, help="stop after this many steps (overrides --epochs)"
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out", type=Path, default=Path("runs/digits_mlp"), help="checkpoint, curves, metrics"
    )
    p.add_argument("--no-plot", action="store_true", help="skip the matplotlib figure")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    x_tr, y_tr, x_te, y_te = common.digits(seed=args.seed)
    model = build_model(args.hidden, args.dropout)
    key = jax.random.key(args.seed)
    params = model.init(key, (args.batch_size, x_tr.shape[1]))
    optimizer = optax.adam(args.lr)
    opt_state = optimizer.init(params)

    def loss_fn(params, x, y, key):
        logits = model.apply(params, x, train=True, key=key)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, opt_state, x, y, key):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, key)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def accuracy(params, x, y):
        return jnp.mean(jnp.argmax(model.apply(params, x), axis=-1) == y)

    steps_per_epoch = len(x_tr) // args.batch_size
    total = args.steps if args.steps is not None else args.epochs * steps_per_epoch
    rng = np.random.default_rng(args.seed)
    history: dict[str, list[float]] = {"step": [], "loss": [], "test_accuracy": []}
    start = time.perf_counter()
    bar = common.progress(total, "digits_mlp")
    batch_indices = common.batches(rng, len(x_tr), args.batch_size)
    for step, idx in zip(range(1, total + 1), batch_indices, strict=False):
        params, opt_state, loss = train_step(
            params, opt_state, x_tr[idx], y_tr[idx], jax.random.fold_in(key, step)
        )
        if step % steps_per_epoch == 0 or step == total:
            history["step"].append(step)
            history["loss"].append(float(loss))
            history["test_accuracy"].append(float(accuracy(params, x_te, y_te)))
            rate = step * args.batch_size / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{float(loss):.4f}", ex_per_s=f"{rate:,.0f}")
        bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start
    test_accuracy = float(accuracy(params, x_te, y_te))

    args.out.mkdir(parents=True, exist_ok=True)
    pl.params.save(args.out / "model.safetensors", params, model=model)
    metrics = {
        "test_accuracy": test_accuracy,
        "steps": total,
        "seconds": seconds,
        "history": history,
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    if not args.no_plot:
        common.plot_curves(history, args.out / "curves.png")
    print(pl.params.summary(model, params))
    print(f"trained {total} steps in {seconds:.1f} s; outputs in {args.out}")
    print(f"test accuracy: {test_accuracy:.4f}")
    return metrics


if __name__ == "__main__":
    main()
