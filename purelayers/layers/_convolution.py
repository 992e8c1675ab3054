"""The computation behind every convolution layer (``conv.py``): ``conv_nd``, a batched
channels-first cross-correlation on ``lax.conv_general_dilated``, and the forms it takes
on the CPU for a 2-d convolution of one input channel (``_one_channel_conv``) and for
one whose weight gradient YNNPACK runs slowly over many output positions
(``_conv2d_chunked_weight_gradient``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from purelayers.layers._checks import add_bias
from purelayers.layers._lead_products import bilinear_jvp
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
    # (``_one_channel_conv``), and a weight gradient summed over chunks of images where
    # YNNPACK's is slow over many output positions (``_conv2d_chunked_weight_gradient``);
    # the platform's own convolution everywhere else. The choice is made when the
    # program is lowered, for the platform it is lowered for.
    cpu_form = None
    if groups == 1 and lhs_dilation is None:
        one_channel = x.ndim == 4 and weight.shape[1] == 1
        if one_channel and math.prod(weight.shape[2:]) <= _ONE_CHANNEL_TAPS:
            cpu_form = _one_channel_conv
        elif (chunk := _weight_gradient_chunk(x, weight, stride, pads, dilation)) is not None:

            def cpu_form(x, w, stride, pads, dilation):
                return _conv2d_chunked_weight_gradient(x, w, stride, pads, dilation, chunk)

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
# the floating types whose 2-d convolutions and products XLA:CPU gives YNNPACK, where
# the CPU forms below were measured
_YNN_FLOATS = (jnp.float32, jnp.float64)


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
    derivatives are XLA's of those two steps, but for the weight's, one product per
    image where ``_patch_product`` says. XLA:CPU's convolution kernels are slow
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
    rows = weight.reshape(weight.shape[0], -1)
    per_image = blocks[0] * blocks[1] >= _PER_IMAGE_MIN_POSITIONS
    if per_image and x.dtype in _YNN_FLOATS:
        return _patch_product(patches, rows)
    return _patch_rows_product(patches, rows)


def _patch_rows_product(patches: jax.Array, rows: jax.Array) -> jax.Array:
    """``patches`` ``(N, Ho, Wo, T)`` times the weight's ``rows`` ``(O, T)`` as one
    ``[N * Ho * Wo, T]`` matrix -> ``(N, O, Ho, Wo)``. As one matrix, the weight gradient
    contracts one axis: the CNN step 42.3 -> 41.0 ms (Intel Xeon, in-process A/B, 21
    rounds)."""
    y = rows_product(patches, rows, transposed=False)
    return jnp.transpose(y, (0, 3, 1, 2))


def _per_image_product(patches: jax.Array, rows: jax.Array) -> jax.Array:
    """``_patch_rows_product`` as one ``(O, T) x (T, Ho * Wo)`` product per image: the
    weight broadcast over the images, a batched product straight into ``(N, O, Ho,
    Wo)``."""
    n, ho, wo, taps = patches.shape
    batch = jnp.broadcast_to(rows, (n, *rows.shape))
    y = lax.dot_general(batch, patches.reshape(n, ho * wo, taps), (((2,), (2,)), ((0,), (0,))))
    return y.reshape(n, rows.shape[0], ho, wo)


@jax.custom_jvp
def _patch_product(patches: jax.Array, rows: jax.Array) -> jax.Array:
    """``_patch_rows_product`` whose weight gradient is one product per image, summed.

    The value and the patches' derivative are the rows product's; the tangent in the
    weight is ``_per_image_product``, so reverse mode multiplies each image's
    channels-first output gradient ``(O, Ho * Wo)`` by its patches ``(Ho * Wo, T)`` and
    sums the ``(N, O, T)`` products over the images. The rows form's weight gradient
    first copies the output gradient channels-last into ``[N * Ho * Wo, O]`` rows, then
    contracts their leading axis, which XLA:CPU's YNNPACK kernels do not take. The
    weight gradient alone (Intel Xeon, jitted, medians of 21, ``(N, Ho, Wo, O, T)``):
    ``(128, 28, 28, 32, 9)`` (the CNN benchmark's first convolution) 2.73 -> 1.71 ms;
    ``(32, 64, 64, 16, 25)`` 3.29 -> 2.49; ``(512, 8, 8, 32, 9)`` 1.49 -> 0.66; ``(8,
    128, 128, 32, 9)`` 4.00 -> 2.45; ``(256, 14, 14, 64, 9)`` 3.76 -> 0.94; ``(1024, 4,
    4, 16, 9)`` a tie (0.42 / 0.39); ``(64, 2, 2, 32, 9)`` 0.04 -> 0.08, hence at least
    ``_PER_IMAGE_MIN_POSITIONS`` output positions an image. The CNN's training step
    28.05 -> 27.29 ms and 31.62 -> 29.94 ms (two in-process A/Bs, 15 and 21 alternating
    rounds), temporaries unchanged (31.9 MiB), compile time a tie (0.88 / 0.79 s).
    Float32 and float64 only: a narrower type would sum the images' products in that
    type."""
    return _patch_rows_product(patches, rows)


def _patch_product_jvp(primals, tangents):
    return bilinear_jvp(_patch_rows_product, _per_image_product, primals, tangents)


_patch_product.defjvp(_patch_product_jvp, symbolic_zeros=True)
_PER_IMAGE_MIN_POSITIONS = 16  # output positions an image


def _weight_gradient_chunk(
    x: jax.Array, weight: jax.Array, stride: Sequence[int], pads: Pads, dilation: Sequence[int]
) -> int | None:
    """Images per chunk of ``_conv2d_chunked_weight_gradient``, or ``None`` where XLA's
    own weight gradient is kept: a 2-d float32 or float64 convolution (the types
    XLA:CPU gives YNNPACK; its bfloat16 convolutions run on Eigen's kernels, where
    chunks were not measured) of dilation 1 over more than ``_CHUNK_MIN_POSITIONS``
    output positions in all, in chunks of about ``_CHUNK_POSITIONS`` positions (at least
    one image) and at most ``_MAX_CHUNKS`` chunks."""
    if x.ndim != 4 or any(d != 1 for d in dilation):
        return None
    if x.dtype not in _YNN_FLOATS:
        return None
    out = [
        (n + lo + hi - k) // s + 1
        for n, (lo, hi), k, s in zip(x.shape[2:], pads, weight.shape[2:], stride, strict=True)
    ]
    per_image = math.prod(max(o, 0) for o in out)
    images = x.shape[0]
    if per_image == 0 or images * per_image <= _CHUNK_MIN_POSITIONS:
        return None
    chunk = max(1, _CHUNK_POSITIONS // per_image, -(-images // _MAX_CHUNKS))
    return chunk if chunk < images else None


_CHUNK_POSITIONS = 16 * 14 * 14
_CHUNK_MIN_POSITIONS = 2 * _CHUNK_POSITIONS
_MAX_CHUNKS = 8


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4, 5))
def _conv2d_chunked_weight_gradient(
    x: jax.Array,
    weight: jax.Array,
    stride: tuple[int, ...],
    pads: Pads,
    dilation: tuple[int, ...],
    chunk: int,
) -> jax.Array:
    """A 2-d convolution whose weight gradient is summed over chunks of ``chunk`` images.

    ``x`` ``(N, C, H, W)``, ``weight`` ``(O, C, kh, kw)``; the value and the input
    gradient are the 2-d convolution's. Its tangent in the weight is the convolution of
    each chunk of images with the weight tangent, concatenated over the batch, so
    reverse mode's weight gradient is one weight-gradient convolution per chunk, summed.
    XLA:CPU's YNNPACK weight-gradient kernel slows more than linearly with the output
    positions it contracts (images x output rows x output columns); in chunks of about
    3,136 positions it runs 2-4x faster. Weight gradient alone on an Intel Xeon (AVX-512;
    jitted, medians; 3x3 kernels, padding 1, XLA's own against chunks of ``c`` images):
    ``[128, 32, 14, 14]`` with 64 outputs (the CNN benchmark's second convolution) 30-40
    -> 11.6 ms (c = 16; 10.7 with c = 8; 18.6 as the 3-d convolution this replaced);
    ``[64, 128, 14, 14]``, 128 outputs, 57.9 -> 25.7 (c = 16); ``[16, 128, 28, 28]``, 128
    outputs, 74.2 -> 28.6 (c = 4); ``[128, 32, 28, 28]`` 129 -> 32.0 (c = 4); ``[32, 64,
    56, 56]``, 64 outputs, 228 -> 100 (c = 2); stride 2 on ``[32, 64, 56, 56]`` 60.9 ->
    30.9 (c = 8); three input channels, ``[32, 3, 32, 32]``, 5.2 -> 4.5 (c = 8); ``[64,
    256, 7, 7]`` 23.8 against 21.0-22.3, within noise, so a convolution of at most
    ``_CHUNK_MIN_POSITIONS`` positions keeps XLA's. The CNN's training step 45.5-47.4 ->
    35.2 ms (in-process A/B, seven rounds; 8 chunks of 16 images), compile 0.98 -> 1.13
    s, temporaries unchanged (31.9 MiB). Other chunkings of that step, in-process
    against 8 of 16 images at 31.4-33.5 ms: 16 of 8 a tie (33.3 ms) at more compile
    time (1.12 against 1.01 s), hence at most ``_MAX_CHUNKS``; 11 of 12 a tie (31.6); 4
    of 32 34.8; 13 of 10 and 10 of 13 slower (36.0-38.5 and 40.2 ms; alone, the weight
    gradient takes 10.1-11.7 ms for every chunk size from 8 to 16 images, so the cause
    is in the step, not isolated). The forward-mode tangent in the weight is
    the chunked convolution too."""
    return _conv2d(x, weight, stride, pads, dilation)


def _conv2d(x, weight, stride, pads, dilation):
    return lax.conv_general_dilated(
        x, weight, window_strides=stride, padding=pads, rhs_dilation=dilation
    )


def _chunked_conv2d(x, weight, stride, pads, dilation, chunk):
    """``_conv2d`` computed chunk by chunk of ``chunk`` images, concatenated. One
    convolution per chunk (at most ``_MAX_CHUNKS``), unrolled on purpose: each must
    stay its own kernel call, which a ``lax.scan`` or a batched ``vmap`` would merge
    back into one loop or one convolution."""
    parts = [
        _conv2d(x[start : start + chunk], weight, stride, pads, dilation)
        for start in range(0, x.shape[0], chunk)
    ]
    return jnp.concatenate(parts, axis=0)


def _conv2d_chunked_weight_gradient_jvp(stride, pads, dilation, chunk, primals, tangents):
    def conv(x, w):
        return _conv2d(x, w, stride, pads, dilation)

    def chunked(x, w):
        return _chunked_conv2d(x, w, stride, pads, dilation, chunk)

    return bilinear_jvp(conv, chunked, primals, tangents)


_conv2d_chunked_weight_gradient.defjvp(_conv2d_chunked_weight_gradient_jvp, symbolic_zeros=True)
