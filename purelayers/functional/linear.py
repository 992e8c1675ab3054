"""Affine and bilinear maps: ``linear``, ``bilinear``, and the bias add they share."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["bilinear", "linear"]


def linear(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None = None,
    *,
    transposed: bool = False,
) -> jax.Array:
    """``y = x @ weight.T + bias`` over the last axis of ``x`` (``torch.nn.functional.linear``).

    Computes in ``x``'s floating dtype (``weight``'s for integer ``x``). Under bfloat16
    or float16 the bias gradient is summed in float32 (see ``add_bias``).

    Args:
      x: ``(..., in_features)``.
      weight: ``(out_features, in_features)``; ``(in_features, out_features)`` with
        ``transposed`` (Hugging Face's GPT-2 ``Conv1D`` layout), computing ``x @ weight``.
      bias: ``(out_features,)`` or ``None``.

    Shape:
      output ``(..., out_features)``.

    Example:
      >>> linear(jnp.ones((2, 3)), jnp.ones((4, 3)), jnp.arange(4.0))
      Array([[3., 4., 5., 6.],
             [3., 4., 5., 6.]], dtype=float32)
    """
    dtype = compute_dtype(x, weight)
    w = weight.astype(dtype)
    y = jnp.asarray(x, dtype) @ (w if transposed else w.T)
    return y if bias is None else add_bias(y, bias, -1)


def bilinear(
    x1: jax.Array, x2: jax.Array, weight: jax.Array, bias: jax.Array | None = None
) -> jax.Array:
    """``y[..., o] = x1[..., :] @ weight[o] @ x2[..., :] + bias[o]``
    (``torch.nn.functional.bilinear``).

    Shape:
      ``x1`` ``(..., in1)``, ``x2`` ``(..., in2)`` with the same leading axes, ``weight``
      ``(out, in1, in2)``; output ``(..., out)``.
    """
    dtype = jnp.result_type(x1, x2)
    y = jnp.einsum("...i,oij,...j->...o", x1.astype(dtype), weight.astype(dtype), x2.astype(dtype))
    return y if bias is None else add_bias(y, bias, -1)


def compute_dtype(x: jax.Array, weight: jax.Array) -> jnp.dtype:
    """``x``'s dtype if floating, else ``weight``'s: the dtype a weighted layer computes in."""
    dtype = jnp.result_type(x)
    return dtype if jnp.issubdtype(dtype, jnp.floating) else weight.dtype


def summed_in_float32(p: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``p``, already shaped to broadcast against ``shape``, broadcast so that its gradient
    (a sum over the broadcast axes) adds in float32: in bfloat16 or float16 ``p`` is
    broadcast in float32 and cast back (values unchanged); wider types pass through."""
    if not jnp.issubdtype(p.dtype, jnp.floating) or jnp.finfo(p.dtype).bits >= 32:
        return p
    return jnp.broadcast_to(p.astype(jnp.float32), shape).astype(p.dtype)


def add_bias(y: jax.Array, bias: jax.Array, axis: int) -> jax.Array:
    """``y + bias`` with a 1-D ``bias`` cast to ``y``'s dtype along ``axis`` of ``y``; its
    gradient sums in float32 (``summed_in_float32``)."""
    axis = axis % y.ndim
    b = bias.astype(y.dtype).reshape((1,) * axis + (-1,) + (1,) * (y.ndim - axis - 1))
    return y + summed_in_float32(b, y.shape)
