"""The computation behind every convolution layer (``conv.py``): ``conv_nd``, a batched
channels-first cross-correlation on ``lax.conv_general_dilated``, and the form it takes
instead on the CPU for a 2-d convolution of one input channel (``_one_channel_conv``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from purelayers.layers._checks import add_bias
from purelayers.layers._spatial import tap_windows

Pads = tuple[tuple[int, int], ...]


def conv_nd(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None,
    *,
    stride: Sequence[int],
    padding: Pads,
    dilation: Sequence[int],
    groups: int,
    lhs_dilation: Sequence[int] | None = None,
) -> jax.Array:
    """Cross-correlation of batched channels-first ``x`` with ``weight [out, in/groups, *k]``.

    Computes in ``x``'s floating dtype; ``padding`` is ``(low, high)`` per spatial axis
    (negative values crop).
    """
    dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else weight.dtype
    x, weight = x.astype(dtype), weight.astype(dtype)
    pads = tuple((int(lo), int(hi)) for lo, hi in padding)

    def convolution(x, weight):
        return lax.conv_general_dilated(
            x,
            weight,
            window_strides=tuple(stride),
            padding=pads,
            lhs_dilation=None if lhs_dilation is None else tuple(lhs_dilation),
            rhs_dilation=tuple(dilation),
            feature_group_count=groups,
        )

    one_channel = x.ndim == 4 and groups == 1 and weight.shape[1] == 1
    if one_channel and lhs_dilation is None and math.prod(weight.shape[2:]) <= _ONE_CHANNEL_TAPS:
        # patches on the CPU, whose convolution kernels are slow with one input channel
        # (``_one_channel_conv``); the platform's own convolution everywhere else. The
        # choice is made when the program is lowered, for the platform it is lowered for.
        y = lax.platform_dependent(
            x,
            weight,
            cpu=lambda x, w: _one_channel_conv(x, w, tuple(stride), pads, tuple(dilation)),
            default=convolution,
        )
    else:
        y = convolution(x, weight)
    if bias is not None:
        y = add_bias(y, bias, 1)
    return y


_ONE_CHANNEL_TAPS = 25  # kernels up to 5x5


def _one_channel_conv(
    x: jax.Array,
    weight: jax.Array,
    stride: tuple[int, int],
    pads: Pads,
    dilation: tuple[int, int],
) -> jax.Array:
    """A 2-d convolution of one input channel as patches and one product: ``x`` ``(N,
    1, H, W)``, ``weight`` ``(O, 1, kh, kw)`` -> ``(N, O, Ho, Wo)``.

    The ``kh * kw`` shifted (strided, dilated) views of the padded input stacked last
    are ``(N, Ho, Wo, kh * kw)`` patches, multiplied by the ``(kh * kw, O)`` weight;
    derivatives are XLA's of those two steps. XLA:CPU's convolution kernels are slow
    with one input channel: the CNN benchmark's first convolution (``[128, 1, 28, 28]``,
    3x3, 32 outputs) forward 5.5 -> 3.0 ms, weight gradient a tie (2.3 ms), the
    training step 73.7 -> 68.4 ms (Intel Xeon, AVX-512; in-process A/B) and 42.4 ->
    40.4 ms on an AMD Zen 5; a 5x5 kernel with 16 outputs forward 4.3 -> 2.7 ms, weight
    gradient 1.9 -> 2.5 ms. With three input channels (27 taps) patches lose (a tie to
    2.6x slower), hence one channel and at most 25 taps. CPU only (``conv_nd``): the
    measurements are XLA:CPU's, and GPU convolution libraries handle one channel
    themselves."""
    kernel = weight.shape[2:]
    xp = lax.pad(x[:, 0], jnp.zeros((), x.dtype), [(0, 0, 0), (*pads[0], 0), (*pads[1], 0)])
    blocks = [
        (size - d * (k - 1) - 1) // s + 1
        for size, k, d, s in zip(xp.shape[1:], kernel, dilation, stride, strict=True)
    ]
    taps = [xp[(slice(None), *w)] for w in tap_windows(kernel, dilation, stride, blocks)]
    patches = jnp.stack(taps, axis=-1)  # (N, Ho, Wo, kh * kw)
    y = lax.dot_general(patches, weight.reshape(weight.shape[0], -1), (((3,), (1,)), ((), ())))
    return jnp.transpose(y, (0, 3, 1, 2))
