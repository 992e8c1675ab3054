"""Fixed-window pooling without ``reduce_window`` (``pool.py``'s ``MaxPoolNd`` and
``AvgPoolNd``): windows that tile the input as a reshape and a reduction over the window
axes (``reduce_tiles``: a sum, or the max with each window's winner,
``max_and_winner``), and the max of overlapping windows as a running max over one
strided slice per tap (``max_of_taps``). The max keeps torch's element throughout: the
first maximum, the last NaN (the rule ``_maxindex.select`` applies for indices).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from purelayers.layers._maxindex import lowest

__all__ = ["max_and_winner", "max_of_taps", "reduce_tiles"]


@functools.partial(jax.jit, static_argnums=(1, 2))
def reduce_tiles(x: jax.Array, kernel: tuple[int, ...], op: Any) -> jax.Array:
    """Pooling of exactly padded ``x`` whose windows tile it (stride == kernel_size, no
    dilation): a reshape to ``(..., out_1, k_1, out_2, k_2, ...)`` and a reduction over
    the window axes, with no ``reduce_window``.

    The max is ``_max`` over the window's taps, so its gradient goes through
    elementwise selects instead of JAX's ``select_and_scatter_add`` (and no reduction
    over strided axes): on the CPU benchmark's CNN this took the pooling kernels from
    ~170 ms to ~35 ms of the step (``jax.profiler`` trace). On the CPU, over more than
    16 channels, the max's reduction runs channels-last (``_channels_last``). Jitted so
    that un-jitted (eager) calls run it as one compiled program rather than op by op;
    under an outer ``jit`` it is inlined."""
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
    convolution's output) is freed once the forward has pooled it, and a ReLU that
    ``Sequential`` applies after the pool (``pool._MaxPoolNd._runs_before``) takes its mask
    from the saved max. The elementwise chain that XLA would otherwise fuse into the
    backward pass keeps ``x`` alive through it (measured on the CPU benchmark's CNN:
    temporaries 42.6 -> 31.9 MiB with the ReLU after the pool)."""
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
    results moved back. XLA:CPU's convolutions (YNNPACK) work channels-last, so in a CNN
    the pool's input is channels-last in memory, the moves cancel against XLA's own
    layout copies, and the reduction reads whole rows of channels instead of strided
    elements. Measured on the CPU (2-core AMD EPYC, in-process interleaved A/Bs): the
    CNN benchmark's step 47.6 / 48.0 -> 44.0 / 44.9 ms and 52.0 -> 47.0 ms
    (temporaries unchanged at 31.9 MiB); the same network with ``BatchNorm2d`` after
    each convolution 115 / 122 -> 110 / 106 ms; conv/ReLU/pool/conv stacks at 56x56 and
    28x28 with 24-64 channels, ties. A pool alone on an NCHW array pays the moves as real
    copies: forward and backward of ``MaxPool2d(2)`` on ``[128, 32, 28, 28]`` 4.6 ->
    2.6 ms and on ``[128, 64, 14, 14]`` 2.5 -> 1.3 ms, but on ``[64, 24, 56, 56]`` 4.0 ->
    5.0 ms. CPU only (``max_and_winner``), over more than 16 channels
    (``reduce_tiles``): with fewer the moves cost more (three channels: 1.3 -> 3.0 ms).
    Moving the derivative's routing channels-last too (the whole pool between two
    moves) measured 55.9 -> 48.5 ms, but chosen per platform it left each tap's
    gradient in its own buffer (77 MiB of temporaries), so only the reduction moves."""
    value, winner = _stacked_max(moved(jnp.moveaxis(x, 1, -1)))
    return jnp.moveaxis(value, -1, 1), jnp.moveaxis(winner, -1, 1)


@max_and_winner.defjvp
def max_and_winner_jvp(taps, moved, primals, tangents):
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
    keep this chain rather than ``max_and_winner``, whose stacked taps are several
    times the input: ``MaxPool2d(3, 2, padding=1)`` on ``[32, 64, 112, 112]`` forward 57
    -> 293 ms with it (CPU).
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
