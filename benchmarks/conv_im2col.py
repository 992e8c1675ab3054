"""Conv2d training step on the CPU: XLA's convolution vs patches + one matrix product.

Times a jitted forward + backward (gradients for weight, bias and input) of a 3x3,
padding 1 convolution on the two layers of the CNN workload, median of ``--repeats``
runs after a warm-up, and reports how far the im2col gradients are from XLA's
(max abs difference over max abs value). A third variant builds the patches from
shifted slices instead of ``conv_general_dilated_patches``::

    python -m benchmarks.conv_im2col --repeats 20
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from purelayers.functional.conv import Pads
from purelayers.functional.conv import conv as conv_nd


def im2col(
    x: jax.Array,
    weight: jax.Array,
    *,
    stride: Sequence[int],
    padding: Pads,
    dilation: Sequence[int],
    groups: int,
    lhs_dilation: Sequence[int] | None = None,
) -> jax.Array:
    """The same cross-correlation as patch extraction plus one ``dot_general``.

    ``conv_general_dilated_patches`` orders each patch's features channel-major,
    ``(c, *k)``, which is the flattening of ``weight``'s ``[in/groups, *k]`` rows.
    """
    out, k = weight.shape[0], weight.shape[2:]
    patches = lax.conv_general_dilated_patches(
        x,
        tuple(k),
        tuple(stride),
        tuple(padding),
        lhs_dilation=None if lhs_dilation is None else tuple(lhs_dilation),
        rhs_dilation=tuple(dilation),
        precision=lax.Precision.HIGHEST,
    )
    n, spatial = x.shape[0], patches.shape[2:]
    patches = patches.reshape(n, groups, -1, *spatial)
    rows = weight.reshape(groups, out // groups, -1)
    y = lax.dot_general(rows, patches, (((2,), (2,)), ((0,), (1,))))  # [g, out/g, n, *S]
    return jnp.moveaxis(y, 2, 0).reshape(n, out, *spatial)


def slices_conv(x, w, b):
    """im2col with the patches built from k*k shifted slices instead of a conv."""
    n, c, h, wd = x.shape
    xp = jnp.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    taps = [xp[:, :, i : i + h, j : j + wd] for i in range(3) for j in range(3)]
    patches = jnp.stack(taps, axis=2).reshape(n, c * 9, h, wd)
    y = jnp.einsum("of,nfhw->nohw", w.reshape(w.shape[0], -1), patches)
    return y + b.reshape(1, -1, 1, 1)


SHAPES = {
    "conv1 [128,1,28,28] -> 32": ((128, 1, 28, 28), 32),
    "conv2 [128,32,14,14] -> 64": ((128, 32, 14, 14), 64),
}
SETTINGS = dict(stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1)


def xla_conv(x, w, b):
    return conv_nd(x, w, b, **SETTINGS)


def im2col_conv(x, w, b):
    return im2col(x, w, **SETTINGS) + b.reshape(1, -1, 1, 1)


def step(conv):
    def loss(w, b, x):
        return jnp.sum(jnp.square(conv(x, w, b)))

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def median_seconds(fn, args, repeats):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(f"backend {jax.default_backend()}, jax {jax.__version__}, repeats {args.repeats}")
    rng = np.random.default_rng(0)
    for name, (shape, cout) in SHAPES.items():
        x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
        w = jnp.asarray(rng.standard_normal((cout, shape[1], 3, 3)) * 0.1, jnp.float32)
        b = jnp.zeros((cout,), jnp.float32)
        ref, mine, sliced = step(xla_conv), step(im2col_conv), step(slices_conv)
        grads_ref, grads_mine = ref(w, b, x)[1], mine(w, b, x)[1]
        diff = max(
            float(jnp.max(jnp.abs(u - v)) / jnp.max(jnp.abs(u)))
            for u, v in zip(grads_ref, grads_mine, strict=True)
        )
        t_ref = median_seconds(ref, (w, b, x), args.repeats)
        t_mine = median_seconds(mine, (w, b, x), args.repeats)
        t_sliced = median_seconds(sliced, (w, b, x), args.repeats)
        print(
            f"{name}: lax.conv_general_dilated {t_ref * 1e3:.1f} ms, "
            f"im2col {t_mine * 1e3:.1f} ms (speed-up {t_ref / t_mine:.2f}x), "
            f"im2col from slices {t_sliced * 1e3:.1f} ms (speed-up {t_ref / t_sliced:.2f}x), "
            f"max rel grad diff {diff:.1e}"
        )


if __name__ == "__main__":
    main()
