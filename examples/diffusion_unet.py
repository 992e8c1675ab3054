"""Train a DDPM with a small UNet on scikit-learn's 8x8 handwritten digits.

    python examples/diffusion_unet.py             # about three minutes on 2 CPU cores
    python examples/diffusion_unet.py --steps 300 # a quick look

The UNet is written as composites, its names those of diffusers' ``UNet2DModel``
blocks: a sinusoidal embedding of the step through an MLP (``TimeEmbedding``),
``ResBlock``s (GroupNorm, SiLU, 3x3 convolutions, the time embedding added between
them, a 1x1 ``conv_shortcut`` where the channels change), one self-attention block
over the 4x4 positions at the lowest resolution, a strided convolution down and a
nearest upsampling and convolution up, with the down path's outputs concatenated into
the up path (skips). It trains on the noise-prediction loss over a cosine schedule of
``--diffusion-steps`` steps (images scaled to [-1, 1]) and samples with DDPM's
ancestral sampler.

The figure: a logistic regression trained on the real training digits judges the
samples: the mean of its top class probability, the fraction it classifies with
probability above 0.9 and the number of classes among those (coverage), against the
same figures for the real test digits and for the noise sampling starts from
(clipped to [0, 1]). A default run: samples mean top probability 0.90, 0.70 of them
confident, all ten classes; real test digits 0.88, 0.70, ten; noise 0.55, 0.03, one.

Sampler: three forms are timed on every run: one jitted UNet call, a Python loop
over one jitted sampler step, and the whole sampler in one ``jax.jit`` with a
``lax.fori_loop``; the faster sampler makes the samples (see ``main`` for what was
measured). Outputs in ``--out``: ``metrics.json`` and ``samples.png`` (a grid).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from diffusion import (
    compiled_sampler,
    cosine_schedule,
    ddpm_loss,
    ddpm_step,
    generative_parser,
    run_metrics,
    time_embedding,
    time_samplers,
    train,
)

from purelayers import layers as L


@dataclasses.dataclass(frozen=True)
class ResBlock(L.Layer):
    """``shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x))) + time_emb_proj(silu(temb)))))``
    for ``x`` ``(B, C, H, W)`` and ``temb`` ``(B, D)`` (diffusers' ``ResnetBlock2D``)."""

    norm1: L.Layer
    conv1: L.Layer
    time_emb_proj: L.Layer
    norm2: L.Layer
    conv2: L.Layer
    conv_shortcut: L.Layer = L.Identity()

    def apply(self, params, x, temb, *, key=None, train=False):
        h = self.call("conv1", params, jax.nn.silu(self.call("norm1", params, x)))
        h = h + self.call("time_emb_proj", params, jax.nn.silu(temb))[:, :, None, None]
        h = self.call("conv2", params, jax.nn.silu(self.call("norm2", params, h)))
        return self.call("conv_shortcut", params, x) + h


def res_block(channels: int, shortcut: bool, groups: int = 8) -> ResBlock:
    return ResBlock(
        L.GroupNorm(groups),
        L.Conv2d(channels, 3, padding=1),
        L.Linear(channels),
        L.GroupNorm(groups),
        L.Conv2d(channels, 3, padding=1),
        L.Conv2d(channels, 1) if shortcut else L.Identity(),
    )


@dataclasses.dataclass(frozen=True)
class AttentionBlock(L.Layer):
    """``x + attn(norm(x))`` with every spatial position a token: self-attention over
    the ``H * W`` positions of ``(B, C, H, W)``."""

    norm: L.Layer = L.GroupNorm(8)
    attn: L.Layer = L.MultiHeadAttention(4)

    def apply(self, params, x, *, key=None, train=False):
        b, c, h, w = x.shape
        tokens = self.call("norm", params, x).reshape(b, c, h * w).transpose(0, 2, 1)
        y = self.call("attn", params, tokens)
        return x + y.transpose(0, 2, 1).reshape(b, c, h, w)


@dataclasses.dataclass(frozen=True)
class UNet(L.Layer):
    """``eps(x, t)`` for ``(B, C, H, W)`` images at steps ``t`` ``(B,)``: one level down,
    attention in the middle, one level up, with skips."""

    time_embedding: L.Layer
    conv_in: L.Layer
    down: tuple[L.Layer, ...]  # a block at full resolution, then one at half
    downsample: L.Layer
    mid: tuple[L.Layer, ...]  # ResBlock, AttentionBlock, ResBlock
    up: tuple[L.Layer, ...]  # a block at half resolution, then one at full
    upsample: L.Layer
    norm_out: L.Layer
    conv_out: L.Layer

    def apply(self, params, x, t, *, key=None, train=False):
        temb = self.call("time_embedding", params, t)
        h = self.call("conv_in", params, x)
        full = self.call("down.0", params, h, temb)
        half = self.call("down.1", params, self.call("downsample", params, full), temb)
        h = self.call("mid.0", params, half, temb)
        h = self.call("mid.2", params, self.call("mid.1", params, h), temb)
        h = self.call("up.0", params, jnp.concatenate([h, half], axis=1), temb)
        h = self.call("upsample", params, h)
        h = self.call("up.1", params, jnp.concatenate([h, full], axis=1), temb)
        return self.call("conv_out", params, jax.nn.silu(self.call("norm_out", params, h)))


def build_unet(width: int = 32, channels: int = 1) -> UNet:
    return UNet(
        time_embedding=time_embedding(4 * width),
        conv_in=L.Conv2d(width, 3, padding=1),
        down=(res_block(width, False), res_block(2 * width, True)),
        downsample=L.Conv2d(width, 3, stride=2, padding=1),
        mid=(res_block(2 * width, False), AttentionBlock(), res_block(2 * width, False)),
        up=(res_block(2 * width, True), res_block(width, True)),
        upsample=L.Sequential(L.Upsample(scale_factor=2), L.Conv2d(2 * width, 3, padding=1)),
        norm_out=L.GroupNorm(8),
        conv_out=L.Conv2d(channels, 3, padding=1),
    )


def judge(classifier, images: np.ndarray, confident: float = 0.9) -> dict:
    """A digits classifier's verdict on ``(N, 8, 8)`` images in [0, 1]: the mean top
    probability, the fraction above ``confident`` and how many classes those cover."""
    probs = classifier.predict_proba(images.reshape(len(images), -1))
    top = probs.max(1)
    sure = top > confident
    return {
        "mean_max_prob": float(top.mean()),
        "confident_fraction": float(sure.mean()),
        "classes_covered": len(np.unique(probs.argmax(1)[sure])),
    }


def parse_args(argv=None):
    p = generative_parser("diffusion_unet", __doc__, 1500, 32, 128, 100)
    p.add_argument(
        "--diffusion-steps", type=common.positive_int, default=100, help="noise levels T"
    )
    return p.parse_args(argv)


def main(argv=None) -> dict:
    from sklearn.linear_model import LogisticRegression

    args = parse_args(argv)
    start = time.perf_counter()
    T = args.diffusion_steps
    x_tr, y_tr, x_te, _ = common.digits(seed=args.seed, images=True)
    data = 2 * x_tr - 1  # [-1, 1]
    model = build_unet(args.width)
    key, k_noise, k_sample = jax.random.split(jax.random.key(args.seed, impl="rbg"), 3)
    params = model.init(key, ((args.batch_size, 1, 8, 8), (args.batch_size,)))
    sched = cosine_schedule(T)
    rng = np.random.default_rng(args.seed)
    params, loss = train(
        ddpm_loss(model, sched, T),
        params,
        args,
        lambda s: (data[rng.integers(0, len(data), args.batch_size)], jax.random.fold_in(key, s)),
        "diffusion_unet",
    )
    train_seconds = time.perf_counter() - start

    # Three forms are timed on every run and the faster sampler makes the samples.
    # Measured on a default run (2 CPU cores shared with other jobs, width 32, 100
    # digits): one jitted UNet call 37.8 ms, a Python loop over the jitted step 42.1 ms
    # a step, the fori_loop 1134 ms a step (27x): inside XLA:CPU's while loop the
    # channels-first convolutions are not rewritten to the channels-last form its fast
    # kernels take and run as naive loops, so the Python loop is chosen.
    # The forms are timed over at most 10 steps: a UNet's fori_loop step takes a
    # second or more on XLA:CPU (see the note below), a whole run of it minutes.
    step = ddpm_step(model, sched, T)
    timed = min(T, 10)
    samplers = compiled_sampler(step, timed)
    noise = jax.random.normal(k_noise, (args.samples, 1, 8, 8))
    net = jax.jit(model.apply)
    t_all = jnp.zeros((args.samples,), jnp.float32)
    timing = time_samplers(
        samplers, lambda: net(params, noise, t_all), timed, params, noise, k_sample
    )
    if timed < T:
        samplers = compiled_sampler(step, T)
    x = samplers[timing["chosen"]](params, noise, k_sample)
    generated = np.clip((np.asarray(x)[:, 0] + 1) / 2, 0, 1)

    classifier = LogisticRegression(max_iter=2000).fit(x_tr.reshape(len(x_tr), -1), y_tr)
    n = min(args.samples, len(x_te))
    metrics = {
        "generated": judge(classifier, generated),
        "real_test": judge(classifier, x_te[:n, 0]),
        "noise": judge(classifier, np.clip((np.asarray(noise)[:n, 0] + 1) / 2, 0, 1)),
    }
    metrics = run_metrics(metrics, loss, timing, args, train_seconds, start)
    rows = max(1, min(10, int(np.sqrt(args.samples))))
    common.image_grid(generated, rows, args.out / "samples.png", f"DDPM samples, {T} steps")
    for name in ("generated", "real_test", "noise"):
        m = metrics[name]
        print(
            f"{name:>9}: mean max-prob {m['mean_max_prob']:.3f}, confident "
            f"{m['confident_fraction']:.2f}, classes {m['classes_covered']}"
        )
    print(
        f"sampler ms/step: fused {timing['fused_ms_per_step']:.2f}, "
        f"loop {timing['loop_ms_per_step']:.2f}, one UNet call {timing['net_call_ms']:.2f}; "
        f"chose {timing['chosen']}; {metrics['seconds']:.1f} s, outputs in {args.out}"
    )
    return metrics


if __name__ == "__main__":
    main()
