"""Max pooling with torch's indices: the selected element of every window, by a table of
flat input positions, so the output is a gather and its gradient goes where torch's does.

torch's CPU kernels scan a window in row-major order and keep an element when it is
greater than the running max or NaN (``val > maxval || isnan(val)``), starting from
``-inf`` at the window's first in-bounds element: among equal maxima the first wins,
among NaNs the last. ``select`` applies that rule along a taps axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def index_dtype() -> Any:
    """torch's ``int64`` where JAX has 64-bit integers enabled, else ``int32``."""
    return jax.dtypes.canonicalize_dtype(jnp.int64)


def lowest(dtype: Any) -> Any:
    """The value no real element is below: ``-inf``, or the integer minimum."""
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    return jnp.iinfo(dtype).min


def window_tables(
    axes: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], spatial: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Flat positions ``(*out, K)`` of every window's taps in row-major order, and which
    are inside the input.

    ``axes`` holds, per spatial axis, the taps' positions ``(out, k)``, which are in
    bounds ``(out, k)``, and each window's first in-bounds position ``(out,)``. A tap out
    of bounds gets its window's first in-bounds position: torch's index when no element
    beats ``-inf``.
    """
    strides = np.cumprod((1, *spatial[::-1]))[:-1][::-1]
    nd = len(axes)
    table = np.zeros((), np.int64)
    valid = np.ones((), bool)
    first = np.zeros((), np.int64)
    for a, ((pos, ok, start), stride) in enumerate(zip(axes, strides, strict=True)):
        # axis a's output index goes to slot a, its tap index to slot nd + a
        shape = [1] * (2 * nd)
        shape[a], shape[nd + a] = pos.shape
        table = table + np.clip(pos, 0, None).reshape(shape) * stride
        valid = valid & ok.reshape(shape)
        first = first + start.reshape(shape[:nd] + [1] * nd) * stride
    out = table.shape[:nd]
    return np.where(valid, table, first).reshape((*out, -1)), valid.reshape((*out, -1))


def select(vals: jax.Array) -> jax.Array:
    """Position along the last axis that torch's scan keeps: the last NaN if any, else
    the first maximum."""
    pos = jnp.argmax(vals, axis=-1)
    if jnp.issubdtype(vals.dtype, jnp.inexact):
        nan = jnp.isnan(vals)
        last = vals.shape[-1] - 1 - jnp.argmax(nan[..., ::-1], axis=-1)
        pos = jnp.where(jnp.any(nan, axis=-1), last, pos)
    return pos


def max_by_table(
    x: jax.Array, nd: int, table: Any, valid: Any = None
) -> tuple[jax.Array, jax.Array]:
    """Max over windows of the batched ``x`` ``(N, C, *spatial)`` and torch's flat
    per-channel indices.

    ``table`` holds each window's taps as flat positions into ``prod(spatial)``: static
    ``(*out, K)`` or per channel ``(N, C, *out, K)``; ``valid`` marks taps inside the
    input (the others are never kept unless nothing beats ``-inf``). The output gathers
    the kept element, so the gradient reaches exactly it.
    """
    lead = x.shape[:-nd]
    flat = x.reshape((*lead, math.prod(x.shape[-nd:])))
    per_channel = jnp.ndim(table) == x.ndim + 1
    out = jnp.shape(table)[-nd - 1 : -1]
    if per_channel:
        taps = jnp.take_along_axis(
            flat, table.reshape((*lead, math.prod(table.shape[2:]))), axis=-1
        )
    else:
        taps = jnp.take(flat, jnp.asarray(np.asarray(table).reshape(-1)), axis=-1)
    taps = taps.reshape((*lead, *out, jnp.shape(table)[-1]))
    if valid is not None:
        valid = np.asarray(valid).reshape((1,) * len(lead) + np.shape(valid))
        taps = jnp.where(valid, taps, jnp.asarray(lowest(x.dtype), x.dtype))
    pos = select(taps)[..., None]
    table = jnp.asarray(table)
    if not per_channel:
        table = jnp.broadcast_to(table, (*lead, *table.shape))
    idx = jnp.take_along_axis(table, pos, axis=-1)[..., 0].astype(index_dtype())
    y = jnp.take_along_axis(flat, idx.reshape((*lead, math.prod(out))), axis=-1)
    y = y.reshape(idx.shape)
    if valid is not None and not np.all(np.any(valid, axis=-1)):
        # a window wholly in padding (dilation past a short input): torch's value is
        # -inf (its index points past the input, so nothing here is gathered from it)
        y = jnp.where(np.any(valid, axis=-1), y, jnp.asarray(lowest(x.dtype), x.dtype))
    return y, idx
