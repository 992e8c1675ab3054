"""The computation behind every convolution layer (``conv.py``): ``conv_nd``, a batched
channels-first cross-correlation on ``lax.conv_general_dilated``, and the forms it takes
on the CPU for a 2-d convolution of one input channel (``_one_channel_conv``) and for
one whose weight gradient YNNPACK runs slowly (``_conv2d_3d_weight_gradient``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from purelayers.layers._checks import add_bias
from purelayers.layers._spatial import tap_windows
from purelayers.layers.linear import rows_product

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

    # On the CPU, two forms replace XLA's convolution: patches and one product for a 2-d
    # convolution of one input channel, whose convolution kernels are slow there
    # (``_one_channel_conv``), and a 3-d weight gradient where YNNPACK's 2-d one is slow
    # (``_conv2d_3d_weight_gradient``); the platform's own convolution everywhere else.
    # The choice is made when the program is lowered, for the platform it is lowered for.
    cpu_form = None
    if groups == 1 and lhs_dilation is None:
        one_channel = x.ndim == 4 and weight.shape[1] == 1
        if one_channel and math.prod(weight.shape[2:]) <= _ONE_CHANNEL_TAPS:
            cpu_form = _one_channel_conv
        elif _slow_weight_gradient(x, weight, stride, pads, dilation):
            cpu_form = _conv2d_3d_weight_gradient
    if cpu_form is None:
        y = convolution(x, weight)
    else:
        y = lax.platform_dependent(
            x,
            weight,
            cpu=lambda x, w: cpu_form(x, w, tuple(stride), pads, tuple(dilation)),
            default=convolution,
        )
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
    # as one [N * Ho * Wo, kh * kw] matrix, so the weight gradient contracts one axis:
    # the CNN step 42.3 -> 41.0 ms (Intel Xeon, in-process A/B, 21 rounds)
    y = rows_product(patches, weight.reshape(weight.shape[0], -1), transposed=False)
    return jnp.transpose(y, (0, 3, 1, 2))


def _slow_weight_gradient(
    x: jax.Array, weight: jax.Array, stride: Sequence[int], pads: Pads, dilation: Sequence[int]
) -> bool:
    """Whether this convolution is one whose weight gradient XLA:CPU's YNNPACK kernel
    runs slowly and a 3-d convolution faster (``_conv2d_3d_weight_gradient``): 2-d,
    stride and dilation 1, more than 16 and at most 128 input channels, at least 12,544
    output positions over the batch (64 images of 14 x 14), and more than 16 images or
    output channels (fewer on both sides, XLA:CPU runs its own kernel already)."""
    if x.ndim != 4 or any(s != 1 for s in stride) or any(d != 1 for d in dilation):
        return False
    out = [
        n + lo + hi - k + 1
        for n, (lo, hi), k in zip(x.shape[2:], pads, weight.shape[2:], strict=True)
    ]
    positions = x.shape[0] * math.prod(max(o, 0) for o in out)
    return (
        _YNN_MIN_FEATURES < x.shape[1] <= _SLOW_MAX_CHANNELS
        and positions >= _SLOW_MIN_POSITIONS
        and max(x.shape[0], weight.shape[0]) > _YNN_MIN_FEATURES
    )


_YNN_MIN_FEATURES = 16  # YNNPACK takes convolutions with more features than this
_SLOW_MAX_CHANNELS = 128
_SLOW_MIN_POSITIONS = 64 * 14 * 14


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4))
def _conv2d_3d_weight_gradient(
    x: jax.Array,
    weight: jax.Array,
    stride: tuple[int, ...],
    pads: Pads,
    dilation: tuple[int, ...],
) -> jax.Array:
    """A 2-d convolution whose weight gradient is taken as a 3-d one over a depth of one.

    ``x`` ``(N, C, H, W)``, ``weight`` ``(O, C, kh, kw)``; the value and the input
    gradient are the 2-d convolution's. Its tangent in the weight is the same
    convolution with a trailing depth axis of size one, so reverse mode's weight
    gradient is a 3-d convolution, which XLA:CPU runs with its own (Eigen) kernels
    instead of YNNPACK's 2-d weight-gradient kernel. Weight gradient alone on an Intel
    Xeon (AVX-512; jitted, medians): ``[128, 32, 14, 14]``, 3x3, 64 outputs (the CNN
    benchmark's second convolution) 26-30 -> 17.5 ms; ``[128, 32, 28, 28]`` 117 -> 73
    ms; ``[32, 64, 56, 56]``, 64 outputs 199 -> 131 ms; the CNN's training step 45.1 ->
    39.4 ms (in-process A/B, three alternations); ``resnet18``'s training step at batch
    32 on 112 x 112 images (its first stage's convolutions qualify) 1064-1088 -> 986-992
    ms. Outside ``_slow_weight_gradient``'s rule YNNPACK's kernel wins: stride 2 3.6
    against 17.2 ms, 3 input channels 11.8 against 19.3, 16 input channels 7.3 against
    7.9, 6,272 positions 3.3 against 4.0 (32 channels), 15.4 against 19.7 (128 channels)
    and 11.9 against 19.3 (128 x 7 x 7, 128 channels), 3,136 positions with 256 channels
    20.2 against 26.1; inside it, with 12,544 positions, ``[16, 64, 28, 28]`` 22.0 ->
    15.4 ms, ``[64, 64, 14, 14]`` 24.3 -> 15.6, ``[64, 128, 14, 14]`` 48.3 -> 39.5,
    ``[16, 128, 28, 28]`` 44.1 -> 38.7. The forward-mode tangent in the weight is the
    3-d convolution too (slower than the 2-d one, 14 against 8 ms)."""
    return _conv2d(x, weight, stride, pads, dilation)


def _conv2d(x, weight, stride, pads, dilation):
    return lax.conv_general_dilated(
        x, weight, window_strides=stride, padding=pads, rhs_dilation=dilation
    )


def _conv2d_as_3d(x, weight, stride, pads, dilation):
    """``_conv2d`` computed as a 3-d convolution over a trailing depth of one."""
    y = lax.conv_general_dilated(
        x[..., None],
        weight[..., None],
        window_strides=(*stride, 1),
        padding=(*pads, (0, 0)),
        rhs_dilation=(*dilation, 1),
    )
    return y[..., 0]


def _conv2d_3d_weight_gradient_jvp(stride, pads, dilation, primals, tangents):
    (x, weight), (dx, dw) = primals, tangents
    terms = []
    if not isinstance(dx, SymbolicZero):
        terms.append(_conv2d(dx, weight, stride, pads, dilation))
    if not isinstance(dw, SymbolicZero):
        terms.append(_conv2d_as_3d(x, dw, stride, pads, dilation))
    return _conv2d(x, weight, stride, pads, dilation), sum(terms[1:], terms[0])


_conv2d_3d_weight_gradient.defjvp(_conv2d_3d_weight_gradient_jvp, symbolic_zeros=True)
