"""Train a DCGAN on scikit-learn's bundled 8x8 handwritten digits, BatchNorm in both nets.

    python examples/gan.py               # about two minutes on 2 CPU cores
    python examples/gan.py --steps 300   # a quick look

The generator (``Linear Unflatten BatchNorm2d ReLU ConvTranspose2d(stride 2) BatchNorm2d
ReLU Conv2d Sigmoid``) turns a Gaussian code into an 8x8 image; the discriminator
(``Conv2d LeakyReLU Conv2d(stride 2) BatchNorm2d LeakyReLU Flatten Linear``) scores real
against generated images. Both are ``Sequential``s whose BatchNorm running statistics live
in ``state`` trees: one jitted step threads both states (and both params and optimizer
states) through a discriminator update and a generator update with the non-saturating
loss; optax only ever sees params. Samples are drawn in eval mode, from the running
statistics.

Did it learn? A small MLP classifier, trained here on the real training digits, scores
``--samples`` generated digits: ``confident_fraction`` is the share it classifies with
probability above 0.9 and ``classes`` how many of the ten digits those confident samples
cover. The same figures for the untrained generator (``untrained_*``) and for real test
digits (``real_*``) bracket them: a default run reaches about 0.6 confident covering all
ten digits, against 0.02 (one digit) untrained and 0.87 for real digits. Outputs in
``--out``: ``metrics.json`` and ``gan.png`` (the generated samples the classifier is
surest of, a column per digit).
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from purelayers import layers as L


def build_generator(width: int) -> L.Sequential:
    return L.Sequential(
        L.Linear(2 * width * 16, bias=False), L.Unflatten(1, (2 * width, 4, 4)),
        L.BatchNorm2d(), L.ReLU(),
        L.ConvTranspose2d(width, 4, stride=2, padding=1, bias=False),  # 4x4 -> 8x8
        L.BatchNorm2d(), L.ReLU(),
        L.Conv2d(1, 3, padding=1), L.Sigmoid(),
    )  # fmt: skip


def build_discriminator(width: int) -> L.Sequential:
    return L.Sequential(
        L.Conv2d(width, 3, padding=1), L.LeakyReLU(0.2),
        L.Conv2d(2 * width, 4, stride=2, padding=1, bias=False),  # 8x8 -> 4x4
        L.BatchNorm2d(), L.LeakyReLU(0.2),
        L.Flatten(), L.Linear(1),
    )  # fmt: skip


def parse_args(argv=None):
    p = common.gallery_parser("gan", __doc__, steps=3000)
    p.add_argument("--width", type=common.positive_int, default=32, help="base channels")
    p.add_argument("--latent", type=common.positive_int, default=16, help="code dimensions")
    p.add_argument("--batch-size", type=common.positive_int, default=64)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--samples", type=common.positive_int, default=1000, help="samples scored")
    p.add_argument("--classifier-steps", type=common.positive_int, default=400)
    return p.parse_args(argv)


def train_classifier(x_tr, y_tr, x_te, y_te, steps: int, seed: int):
    """An MLP on the flattened real digits: ``(probabilities(images), test accuracy)``."""
    net = L.Sequential(L.Flatten(), L.Linear(128), L.ReLU(), L.Linear(10))
    params = jax.jit(net.init, static_argnums=1)(jax.random.key(seed), (64, *x_tr.shape[1:]))

    def loss(params, batch):
        x, y = batch
        return optax.softmax_cross_entropy_with_integer_labels(net.apply(params, x), y).mean()

    optimizer = optax.adam(3e-3)
    step, opt_state = common.optax_step(loss, optimizer), optimizer.init(params)
    batch_indices = common.batches(np.random.default_rng(seed), len(x_tr), 64)
    for _, idx in zip(range(steps), batch_indices, strict=False):
        params, opt_state, _ = step(params, opt_state, (x_tr[idx], y_tr[idx]))
    probabilities = jax.jit(lambda x: jax.nn.softmax(net.apply(params, x)))
    accuracy = float(np.mean(np.argmax(probabilities(x_te), -1) == y_te))
    return probabilities, accuracy


def score(probabilities, images) -> tuple[float, int]:
    """Share of images classified with probability > 0.9, and the classes they cover."""
    p = np.asarray(probabilities(images))
    confident = p.max(axis=-1) > 0.9
    return float(confident.mean()), len(np.unique(p.argmax(-1)[confident]))


def main(argv=None) -> dict:
    args = parse_args(argv)
    x_tr, y_tr, x_te, y_te = common.digits(seed=args.seed, images=True)
    gen, disc = build_generator(args.width), build_discriminator(args.width)
    key = jax.random.key(args.seed)
    z_shape, x_shape = (args.batch_size, args.latent), (args.batch_size, *x_tr.shape[1:])
    g_params = jax.jit(gen.init, static_argnums=1)(jax.random.fold_in(key, 0), z_shape)
    d_params = jax.jit(disc.init, static_argnums=1)(jax.random.fold_in(key, 1), x_shape)
    g_state, d_state = gen.init_state(z_shape), disc.init_state(x_shape)
    # eval mode: the generator normalizes with its running statistics
    sample = jax.jit(lambda params, state, z: gen.apply(params, z, state=state)[0])
    z = jax.random.normal(jax.random.key(args.seed + 1), (args.samples, args.latent))
    before = sample(g_params, g_state, z)  # the untrained generator's samples
    optimizer = optax.adam(args.lr, b1=0.5)
    g_opt, d_opt = optimizer.init(g_params), optimizer.init(d_params)

    def d_loss(d_params, d_state, real, fake):
        real_logits, d_state = disc.apply(d_params, real, state=d_state, train=True)
        fake_logits, d_state = disc.apply(d_params, fake, state=d_state, train=True)
        loss = jax.nn.softplus(-real_logits).mean() + jax.nn.softplus(fake_logits).mean()
        return loss, d_state

    def g_loss(g_params, g_state, d_params, d_state, z):
        fake, g_state = gen.apply(g_params, z, state=g_state, train=True)
        logits, d_state = disc.apply(d_params, fake, state=d_state, train=True)
        return jax.nn.softplus(-logits).mean(), (g_state, d_state)  # non-saturating

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2, 3, 4, 5))
    def train_step(g_params, g_state, d_params, d_state, g_opt, d_opt, real, key):
        z_d, z_g = jax.random.normal(key, (2, *z_shape))
        fake, g_state = gen.apply(g_params, z_d, state=g_state, train=True)
        (dl, d_state), grads = jax.value_and_grad(d_loss, has_aux=True)(
            d_params, d_state, real, jax.lax.stop_gradient(fake)
        )
        updates, d_opt = optimizer.update(grads, d_opt, d_params)
        d_params = optax.apply_updates(d_params, updates)
        (gl, (g_state, d_state)), grads = jax.value_and_grad(g_loss, has_aux=True)(
            g_params, g_state, d_params, d_state, z_g
        )
        updates, g_opt = optimizer.update(grads, g_opt, g_params)
        g_params = optax.apply_updates(g_params, updates)
        return g_params, g_state, d_params, d_state, g_opt, d_opt, dl, gl

    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    bar = common.progress(args.steps, "gan")
    batch_indices = common.batches(rng, len(x_tr), args.batch_size)
    for step, idx in zip(range(1, args.steps + 1), batch_indices, strict=False):
        g_params, g_state, d_params, d_state, g_opt, d_opt, dl, gl = train_step(
            g_params, g_state, d_params, d_state, g_opt, d_opt, x_tr[idx],
            jax.random.fold_in(key, step),
        )  # fmt: skip
        if step % 100 == 0 or step == args.steps:
            bar.set_postfix(d_loss=f"{float(dl):.3f}", g_loss=f"{float(gl):.3f}")
        bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start

    images = sample(g_params, g_state, z)
    probabilities, accuracy = train_classifier(
        x_tr, y_tr, x_te, y_te, args.classifier_steps, args.seed
    )
    confident, classes = score(probabilities, images)
    untrained_confident, untrained_classes = score(probabilities, before)
    real_confident, real_classes = score(probabilities, x_te)
    metrics = common.write_metrics(
        args.out,
        {
            "confident_fraction": confident,
            "classes": classes,
            "untrained_confident_fraction": untrained_confident,
            "untrained_classes": untrained_classes,
            "real_confident_fraction": real_confident,
            "real_classes": real_classes,
            "classifier_test_accuracy": accuracy,
            "steps": args.steps,
            "seconds": seconds,
        },
    )
    plot_samples(np.asarray(images), np.asarray(probabilities(images)), metrics, args.out)
    print(f"trained {args.steps} steps in {seconds:.1f} s; outputs in {args.out}")
    print(
        f"samples classified with p > 0.9: {confident:.2f} covering {classes} digits "
        f"(untrained generator {untrained_confident:.2f}, {untrained_classes}; "
        f"real test digits {real_confident:.2f}, {real_classes})"
    )
    return metrics


def plot_samples(images, probabilities, metrics: dict, out: Path) -> None:
    """Up to 4 confident samples per digit (a column each), the least confident after."""
    label, confidence = probabilities.argmax(-1), probabilities.max(-1)
    rows = min(4, len(images))
    columns = []
    for digit in range(10):
        idx = np.flatnonzero(label == digit)
        columns.append(idx[np.argsort(-confidence[idx])][:rows])
    rest = np.argsort(confidence)
    chosen = [np.concatenate([c, rest[: rows - len(c)]]) if len(c) < rows else c for c in columns]
    grid = images[np.stack(chosen, axis=1).ravel()][:, 0]
    grid = np.pad(grid, ((0, 0), (1, 1), (1, 1)))  # a blank pixel between digits
    title = (
        f"DCGAN samples, the most confident per classified digit; of all: "
        f"{metrics['confident_fraction']:.0%} confident, "
        f"{metrics['classes']}/10 digits (untrained "
        f"{metrics['untrained_confident_fraction']:.0%})"
    )
    common.image_grid(grid, rows, out / "gan.png", title)


if __name__ == "__main__":
    main()
