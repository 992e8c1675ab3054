"""Convolutions: ``conv`` (any number of spatial axes, channels first) and its plain
form ``conv_reference``.

On the CPU a 2-d convolution takes one of two faster forms where they pay: patches and
one product for one input channel, and a weight gradient summed over chunks of images
over many output positions. Both are chosen when the program is lowered
(``jax.lax.platform_dependent``), so other platforms run their own convolution.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from purelayers.functional.linear import add_bias

__all__ = ["conv", "conv_reference"]

Pads = tuple[tuple[int, int], ...]


def conv(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None = None,
    *,
    stride: Sequence[int],
    padding: Pads,
    dilation: Sequence[int],
    groups: int = 1,
    lhs_dilation: Sequence[int] | None = None,
) -> jax.Array:
    """Cross-correlation of channels-first ``x`` with ``weight`` (``torch.nn.functional.conv{1,2,3}d``).

    ``out[n, o, i] = bias[o] + sum_{c in group(o)} sum_k weight[o, c, k] * x_pad[n, c, s*i + d*k]``
    with ``s`` the stride and ``d`` the dilation per spatial axis.

    Args:
      x: ``(N, C, *L)``; computes in its floating dtype (``weight``'s for integers).
      weight: ``(O, C / groups, *k)``.
      bias: ``(O,)`` or ``None``.
      stride: one int per spatial axis.
      dilation: one int per spatial axis.
      padding: ``(low, high)`` per spatial axis; negative values crop.
      groups: independent channel groups.
      lhs_dilation: the input's dilation (a transposed convolution's stride), or ``None``.

    Shape:
      output ``(N, O, *L_out)``, ``L_out = (L + low + high - d * (k - 1) - 1) // s + 1``.

    Equal to ``conv_reference`` in value and derivatives; on the CPU a 2-d convolution of
    one input channel and at most 25 taps runs as ``_one_channel_conv``, and one over
    many output positions takes ``_chunked_weight_gradient``.
    """
    dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else weight.dtype
    x, weight = x.astype(dtype), weight.astype(dtype)
    stride, dilation = tuple(stride), tuple(dilation)
    pads = tuple((int(lo), int(hi)) for lo, hi in padding)
    settings = dict(stride=stride, padding=pads, dilation=dilation, groups=groups)
    cpu_form = None
    if groups == 1 and lhs_dilation is None:
        one_channel = x.ndim == 4 and weight.shape[1] == 1
        if one_channel and math.prod(weight.shape[2:]) <= _ONE_CHANNEL_TAPS:
            cpu_form = functools.partial(
                _one_channel_conv, stride=stride, pads=pads, dilation=dilation
            )
        elif (chunk := _weight_gradient_chunk(x, weight, stride, pads, dilation)) is not None:
            cpu_form = functools.partial(
                _chunked_weight_gradient, stride=stride, pads=pads, dilation=dilation, chunk=chunk
            )
    if cpu_form is None:
        y = conv_reference(x, weight, lhs_dilation=lhs_dilation, **settings)
    else:
        y = lax.platform_dependent(
            x, weight, cpu=cpu_form, default=functools.partial(conv_reference, **settings)
        )
    return y if bias is None else add_bias(y, bias, 1)


def conv_reference(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None = None,
    *,
    stride: Sequence[int],
    padding: Pads,
    dilation: Sequence[int],
    groups: int = 1,
    lhs_dilation: Sequence[int] | None = None,
) -> jax.Array:
    """``conv`` as one ``lax.conv_general_dilated`` with XLA's own derivatives."""
    y = lax.conv_general_dilated(
        x,
        weight,
        window_strides=tuple(stride),
        padding=tuple((int(lo), int(hi)) for lo, hi in padding),
        lhs_dilation=None if lhs_dilation is None else tuple(lhs_dilation),
        rhs_dilation=tuple(dilation),
        feature_group_count=groups,
    )
    return y if bias is None else add_bias(y, bias, 1)


def tap_windows(
    kernel: Sequence[int], dilation: Sequence[int], stride: Sequence[int], blocks: Sequence[int]
) -> list[tuple[slice, ...]]:
    """The strided slices of a padded input's spatial axes read by each kernel tap, taps in
    row-major order; ``blocks`` is the number of windows per axis."""
    return [
        tuple(
            slice(t * d, t * d + s * (b - 1) + 1, s)
            for t, d, s, b in zip(taps, dilation, stride, blocks, strict=True)
        )
        for taps in itertools.product(*(range(k) for k in kernel))
    ]


def bilinear_jvp(
    product: Callable, weight_term: Callable, primals: tuple, tangents: tuple
) -> tuple[jax.Array, jax.Array]:
    """The value and tangent of ``product(x, w)``, linear in each of ``x`` and ``w``:
    ``product(dx, w) + weight_term(x, dw)``, ``weight_term`` computing ``product(x, dw)``
    in another form; a symbolic-zero tangent's term is left out."""
    (x, w), (dx, dw) = primals, tangents
    terms = []
    if not isinstance(dx, SymbolicZero):
        terms.append(product(dx, w))
    if not isinstance(dw, SymbolicZero):
        terms.append(weight_term(x, dw))
    return product(x, w), sum(terms[1:], terms[0])


# -- one input channel: patches and one product -------------------------------------------

_ONE_CHANNEL_TAPS = 25  # kernels up to 5x5
# the floating types whose 2-d convolutions and products XLA:CPU gives YNNPACK, where the
# CPU forms were measured
_YNN_FLOATS = (jnp.float32, jnp.float64)
_PER_IMAGE_MIN_POSITIONS = 16  # output positions an image


def _one_channel_conv(
    x: jax.Array, weight: jax.Array, *, stride: tuple, pads: Pads, dilation: tuple
) -> jax.Array:
    """A 2-d convolution of one input channel as patches and one product: ``x`` ``(N, 1,
    H, W)``, ``weight`` ``(O, 1, kh, kw)`` -> ``(N, O, Ho, Wo)``; about 7% off the cnn
    benchmark's training step (XLA:CPU's convolution kernels are slow with one channel).

    The ``kh * kw`` shifted views of the padded input stacked last are ``(N, Ho, Wo,
    kh * kw)`` patches, multiplied by the ``(kh * kw, O)`` weight."""
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
    ``[N * Ho * Wo, T]`` matrix -> ``(N, O, Ho, Wo)``."""
    n, ho, wo, taps = patches.shape
    y = patches.reshape(n * ho * wo, taps) @ rows.T
    return jnp.transpose(y.reshape(n, ho, wo, rows.shape[0]), (0, 3, 1, 2))


def _per_image_product(patches: jax.Array, rows: jax.Array) -> jax.Array:
    """``_patch_rows_product`` as one ``(O, T) x (T, Ho * Wo)`` product per image."""
    n, ho, wo, taps = patches.shape
    batch = jnp.broadcast_to(rows, (n, *rows.shape))
    y = lax.dot_general(batch, patches.reshape(n, ho * wo, taps), (((2,), (2,)), ((0,), (0,))))
    return y.reshape(n, rows.shape[0], ho, wo)


@jax.custom_jvp
def _patch_product(patches: jax.Array, rows: jax.Array) -> jax.Array:
    """``_patch_rows_product`` whose weight gradient is one product per image, summed (the
    rows form first copies the output gradient channels-last); up to about 5% off the cnn
    benchmark's training step. Float32 and float64 only: a narrower type would sum the
    images' products in that type."""
    return _patch_rows_product(patches, rows)


def _patch_product_jvp(primals, tangents):
    return bilinear_jvp(_patch_rows_product, _per_image_product, primals, tangents)


_patch_product.defjvp(_patch_product_jvp, symbolic_zeros=True)


# -- many output positions: the weight gradient in chunks of images ------------------------

_CHUNK_POSITIONS = 16 * 14 * 14
_CHUNK_MIN_POSITIONS = 2 * _CHUNK_POSITIONS
_MAX_CHUNKS = 8


def _weight_gradient_chunk(
    x: jax.Array, weight: jax.Array, stride: Sequence[int], pads: Pads, dilation: Sequence[int]
) -> int | None:
    """Images per chunk of ``_chunked_weight_gradient``, or ``None`` where XLA's own weight
    gradient is kept: a 2-d float32 or float64 convolution of dilation 1 over more than
    ``_CHUNK_MIN_POSITIONS`` output positions in all, in chunks of about
    ``_CHUNK_POSITIONS`` positions (at least one image) and at most ``_MAX_CHUNKS``."""
    if x.ndim != 4 or any(d != 1 for d in dilation) or x.dtype not in _YNN_FLOATS:
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


def _conv2d(x, weight, stride, pads, dilation):
    return lax.conv_general_dilated(
        x, weight, window_strides=stride, padding=pads, rhs_dilation=dilation
    )


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4, 5))
def _chunked_weight_gradient_form(x, weight, stride, pads, dilation, chunk):
    return _conv2d(x, weight, stride, pads, dilation)


def _chunked_weight_gradient(
    x: jax.Array, weight: jax.Array, *, stride: tuple, pads: Pads, dilation: tuple, chunk: int
) -> jax.Array:
    """A 2-d convolution whose weight gradient is summed over chunks of ``chunk`` images
    (XLA:CPU's weight-gradient kernel slows more than linearly with the positions it
    contracts); about 25% off the cnn benchmark's training step.

    The value and input gradient are the convolution's; the tangent in the weight is the
    convolution of each chunk with the weight tangent, concatenated over the batch."""
    return _chunked_weight_gradient_form(x, weight, stride, pads, dilation, chunk)


def _chunked_conv2d(x, weight, stride, pads, dilation, chunk):
    """``_conv2d`` chunk by chunk of ``chunk`` images, concatenated; unrolled on purpose so
    that each chunk stays its own kernel call."""
    parts = [
        _conv2d(x[start : start + chunk], weight, stride, pads, dilation)
        for start in range(0, x.shape[0], chunk)
    ]
    return jnp.concatenate(parts, axis=0)


def _chunked_weight_gradient_jvp(stride, pads, dilation, chunk, primals, tangents):
    def full(x, w):
        return _conv2d(x, w, stride, pads, dilation)

    def chunked(x, w):
        return _chunked_conv2d(x, w, stride, pads, dilation, chunk)

    return bilinear_jvp(full, chunked, primals, tangents)


_chunked_weight_gradient_form.defjvp(_chunked_weight_gradient_jvp, symbolic_zeros=True)
