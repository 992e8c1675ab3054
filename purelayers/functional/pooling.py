"""Pooling: fixed windows without ``reduce_window`` where it pays (``max_pool``,
``avg_pool``), and the scatter behind max unpooling (``max_unpool``).

Windows that tile the input are a reshape and a reduction over the window axes
(``reduce_tiles``: a sum, or the max with each window's winner, ``max_and_winner``);
the max of overlapping windows is a running max over one strided slice per tap
(``max_of_taps``). The max keeps torch's element throughout: the first maximum, the
last NaN.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = [
    "avg_pool_sum",
    "max_and_winner",
    "max_of_taps",
    "max_of_taps_reference",
    "max_pool",
    "max_pool_commutes_with_relu",
    "max_unpool",
    "reduce_tiles",
]

Pads = tuple[tuple[int, int], ...]


def lowest(dtype: Any) -> Any:
    """The value no real element is below: ``-inf``, or the integer minimum."""
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    return jnp.iinfo(dtype).min


def max_pool(
    x: jax.Array,
    kernel_size: tuple[int, ...],
    stride: tuple[int, ...],
    padding: Pads,
    dilation: tuple[int, ...],
) -> jax.Array:
    """Max over windows of the last ``len(kernel_size)`` axes of ``x``
    (``torch.nn.functional.max_pool{1,2,3}d`` without indices), torch's element chosen
    (the first maximum, the last NaN) so the gradient reaches it.

    ``padding`` is ``(low, high)`` per window axis, filled with ``-inf`` (the integer
    minimum). Windows that tile the padded input take ``reduce_tiles``, others
    ``max_of_taps``.

    Example:
      >>> max_pool(jnp.arange(8.0).reshape(1, 8), (2,), (2,), ((0, 0),), (1,))
      Array([[1., 3., 5., 7.]], dtype=float32)
    """
    return _pool(x, kernel_size, stride, padding, dilation, lowest(x.dtype), lax.max)


def avg_pool_sum(
    x: jax.Array,
    kernel_size: tuple[int, ...],
    stride: tuple[int, ...],
    padding: Pads,
    dilation: tuple[int, ...] | None = None,
) -> jax.Array:
    """The sum over windows of the last ``len(kernel_size)`` axes of zero-padded ``x``: an
    average pool's numerator (``torch.nn.functional.avg_pool{1,2,3}d`` times the divisor)."""
    dilation = dilation or (1,) * len(kernel_size)
    return _pool(x, kernel_size, stride, padding, dilation, 0.0, lax.add)


def _pool(x, kernel, stride, pads, dilation, init, op):
    lead = x.ndim - len(kernel)
    x = lax.pad(
        x, jnp.asarray(init, x.dtype), [(0, 0, 0)] * lead + [(lo, hi, 0) for lo, hi in pads]
    )
    tiled = tuple(stride) == tuple(kernel) and all(d == 1 for d in dilation)
    if tiled and all(n % k == 0 for n, k in zip(x.shape[lead:], kernel, strict=True)):
        return reduce_tiles(x, tuple(kernel), op)
    if op is lax.max:
        return max_of_taps(x, tuple(kernel), tuple(stride), tuple(dilation))
    return lax.reduce_window(
        x,
        init,
        op,
        window_dimensions=(1,) * lead + tuple(kernel),
        window_strides=(1,) * lead + tuple(stride),
        padding="VALID",
        window_dilation=(1,) * lead + tuple(dilation),
    )


@functools.partial(jax.jit, static_argnums=(1, 2))
def reduce_tiles(x: jax.Array, kernel: tuple[int, ...], op: Any) -> jax.Array:
    """Pooling of exactly padded ``x`` whose windows tile it (stride == kernel_size, no
    dilation): a reshape to ``(..., out_1, k_1, out_2, k_2, ...)`` and a reduction over
    the window axes, with no ``reduce_window``.

    The max is ``max_and_winner`` over the window's taps, whose derivative routes each
    tangent by the saved winner instead of JAX's ``select_and_scatter_add``. On the CPU,
    over more than 16 channels, the max's reduction runs channels-last
    (``_channels_last``). Jitted so that eager calls run it as one compiled program."""
    nd = len(kernel)
    lead = x.ndim - nd
    tiles = x.shape[:lead]
    for n, k in zip(x.shape[lead:], kernel, strict=True):
        tiles += (n // k, k)
    x = x.reshape(tiles)
    axes = tuple(lead + 2 * i + 1 for i in range(nd))
    if op is lax.add:
        return jnp.sum(x, axis=axes)
    taps = functools.partial(_tile_taps, axes=axes, kernel=kernel)
    if lead == 2 and x.shape[1] > _CHANNELS_LAST_OVER:
        # the channels moved last, the window axes one place down (``max_and_winner``)
        moved = functools.partial(_tile_taps, axes=tuple(a - 1 for a in axes), kernel=kernel)
        return _max(x, taps, moved)
    return _max(x, taps)


_CHANNELS_LAST_OVER = 16  # channels; XLA:CPU's YNNPACK convolutions take more than 16


def _tile_taps(x: jax.Array, axes: tuple[int, ...], kernel: tuple[int, ...]) -> list[jax.Array]:
    """The window taps of tiled ``x`` ``(..., out_1, k_1, out_2, k_2, ...)`` in row-major
    window order, each ``(..., out_1, out_2, ...)``."""
    taps = []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        index = [slice(None)] * x.ndim
        for axis, o in zip(axes, offsets, strict=True):
            index[axis] = o
        taps.append(x[tuple(index)])
    return taps


Taps = Callable[[jax.Array], list[jax.Array]]


def _max(x: jax.Array, taps: Taps, moved: Taps | None = None) -> jax.Array:
    """The elementwise max of ``taps(x)`` (torch's element: the first maximum, the last
    NaN). Floating inputs go through ``max_and_winner``, integers (no gradient) through
    ``_first_max``."""
    if jnp.issubdtype(x.dtype, jnp.floating):
        return max_and_winner(x, taps, moved)[0]
    return _first_max(taps(x))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def max_and_winner(x: jax.Array, taps: Taps, moved: Taps | None) -> tuple[jax.Array, jax.Array]:
    """The max of the window taps ``taps(x)`` and the position of torch's element in
    ``taps`` (an integer array), from one variadic reduction over the taps stacked first.

    With ``moved`` (the same taps of ``x`` with its axis 1, the channels, moved last),
    the CPU reduces channels-last and moves the results back (``_channels_last``); the
    derivative is the same either way.

    The derivative routes each tap's tangent by that position (a chain of selects), so
    the backward pass reads the saved positions instead of ``x``: ``x`` (typically a
    convolution's output) is freed once the forward has pooled it. Equal to
    ``max_of_taps_reference`` in value and derivatives."""
    if moved is None:
        return _stacked_max(taps(x))
    # the choice is made when the program is lowered, for the platform it is lowered for
    return lax.platform_dependent(
        x,
        cpu=functools.partial(_channels_last, moved=moved),
        default=lambda x: _stacked_max(taps(x)),
    )


def _stacked_max(taps: list[jax.Array]) -> tuple[jax.Array, jax.Array]:
    """The max of ``taps`` and torch's element's position among them: one variadic
    reduction over the taps stacked first."""
    stacked = jnp.stack(taps)
    n = stacked.shape[0]
    position = lax.broadcasted_iota(np.int8 if n < 128 else np.int32, stacked.shape, 0)
    init = (jnp.array(lowest(stacked.dtype), stacked.dtype), jnp.array(n, position.dtype))
    return lax.reduce((stacked, position), init, _torch_max_pair, (0,))


def _channels_last(x: jax.Array, moved: Taps) -> tuple[jax.Array, jax.Array]:
    """``_stacked_max`` of the taps of ``x`` with its channels (axis 1) moved last, the
    results moved back: about 8% off the cnn benchmark's training step, where XLA:CPU's
    convolutions around the pool work channels-last, so the moves cancel against their
    layout copies. CPU only, over more than 16 channels (``reduce_tiles``)."""
    value, winner = _stacked_max(moved(jnp.moveaxis(x, 1, -1)))
    return jnp.moveaxis(value, -1, 1), jnp.moveaxis(winner, -1, 1)


@max_and_winner.defjvp
def _max_and_winner_jvp(taps, moved, primals, tangents):
    (x,), (dx,) = primals, tangents
    value, winner = max_and_winner(x, taps, moved)
    dtaps = taps(dx)
    dvalue = dtaps[0]
    for i, tap in enumerate(dtaps[1:], 1):
        dvalue = jnp.where(winner == i, tap, dvalue)
    return (value, winner), (dvalue, np.zeros(winner.shape, jax.dtypes.float0))


def _torch_max_pair(a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]):
    """The reducer of ``max_and_winner``: of two (value, position) pairs the one torch
    keeps: a NaN over a number, of two NaNs the later, else the larger value, of equal
    values the earlier. A total order on the pairs, so the reduction may combine them in
    any order."""
    (v1, i1), (v2, i2) = a, b
    nan1, nan2 = jnp.isnan(v1), jnp.isnan(v2)
    numbers = (v2 > v1) | ((v2 == v1) & (i2 < i1))
    second = jnp.where(nan1 | nan2, jnp.where(nan1 & nan2, i2 > i1, nan2), numbers)
    return jnp.where(second, v2, v1), jnp.where(second, i2, i1)


def _first_max(taps: list[jax.Array]) -> jax.Array:
    """Elementwise max of ``taps`` given in row-major window order, as torch's CPU
    kernel: a later tap replaces the running max when strictly greater, or when it is
    NaN. The gradient of this chain of selects reaches exactly the selected element (the
    first maximum among ties, the last NaN)."""
    best = taps[0]
    inexact = jnp.issubdtype(best.dtype, jnp.inexact)
    for tap in taps[1:]:
        take = tap > best
        if inexact:
            take = take | jnp.isnan(tap)
        best = jnp.where(take, tap, best)
    return best


def max_of_taps(x: jax.Array, kernel, stride, dilation) -> jax.Array:
    """Max pooling of exactly padded ``x``, one strided slice per kernel tap.

    JAX has no gradient for a dilated ``reduce_window`` max, and its undilated one picks
    another NaN than torch; ``_first_max`` over the taps (a static, small number) in
    row-major order sends the gradient to the same element as torch. Overlapping windows
    keep this chain rather than ``max_and_winner``, whose stacked taps would be several
    times the input.
    """
    nd = len(kernel)
    lead = x.ndim - nd
    outs = [
        (n - d * (k - 1) - 1) // s + 1
        for n, k, s, d in zip(x.shape[lead:], kernel, stride, dilation, strict=True)
    ]
    taps = []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        start = [o * d for o, d in zip(offsets, dilation, strict=True)]
        limit = [b + (o - 1) * s + 1 for b, o, s in zip(start, outs, stride, strict=True)]
        taps.append(
            lax.slice(
                x, (0,) * lead + tuple(start), x.shape[:lead] + tuple(limit), (1,) * lead + stride
            )
        )
    return _first_max(taps)


def max_of_taps_reference(x: jax.Array, kernel: tuple[int, ...]) -> jax.Array:
    """``reduce_tiles``'s max as the plain chain of selects over the window's taps (no
    written derivative): the reference ``max_and_winner`` is tested against."""
    nd = len(kernel)
    return max_of_taps(x, kernel, kernel, (1,) * nd)


# -- max unpooling --------------------------------------------------------------------------


def _rows(fn):
    """``fn`` of one channel's flat arrays, over the leading ``(N, C)`` axes."""
    return jax.vmap(jax.vmap(fn))


def _add_at(t: jax.Array, idx: jax.Array, size: int) -> jax.Array:
    return _rows(lambda v, i: jnp.zeros((size,), t.dtype).at[i].add(v, mode="drop"))(t, idx)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def max_unpool(x: jax.Array, indices: jax.Array, size: int) -> jax.Array:
    """Each channel's flat ``x`` ``(N, C, L)`` scattered to ``indices`` in ``size`` zeros
    (``torch.nn.functional.max_unpool{1,2,3}d`` on flattened spatial axes).

    Where indices coincide the later source (row-major) is written, as torch's CPU
    kernel; the gradient with respect to ``x`` gathers at ``indices``, so it reaches both,
    as torch's. Indices outside ``[0, size)`` are dropped.

    Shape:
      ``x`` and ``indices`` ``(N, C, L)``; output ``(N, C, size)``.
    """
    source = jnp.arange(x.shape[-1])

    def winners(i):
        return jnp.full((size,), -1, source.dtype).at[i].max(source, mode="drop")

    won = _rows(winners)(indices)
    y = jnp.take_along_axis(x, jnp.maximum(won, 0), axis=-1)
    return jnp.where(won >= 0, y, jnp.zeros((), x.dtype))


@max_unpool.defjvp
def _max_unpool_jvp(size, primals, tangents):
    # linear in x's tangent, transposing to torch's backward: a gather at the indices
    x, idx = primals
    return max_unpool(x, idx, size), _add_at(tangents[0], idx, size)


def max_pool_commutes_with_relu(dtype: Any, padding: Sequence[int], return_indices: bool) -> bool:
    """Whether a max pool may run before the ``ReLU`` that precedes it, with equal
    outputs and gradients: ``max(relu(x)) == relu(max(x))`` over any window, and where
    the two orders could pick different elements (a window's maximum at most 0) the
    ReLU's derivative is 0 either way (``relu'(0) == 0``, as torch). True for floating
    ``x`` and an unpadded pool without indices (no window mixes ``-inf`` padding with the
    ReLU's zeros). The ReLU then runs on the pooled values and its mask comes from the
    maximum ``max_of_taps`` saves, so the pool's input (a convolution's output) is freed
    for the backward pass: about a third off the cnn benchmark's training step.
    """
    return (
        dtype is not None
        and jnp.issubdtype(dtype, jnp.floating)
        and not return_indices
        and all(p == 0 for p in padding)
    )
