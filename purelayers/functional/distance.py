"""Distances and similarities: ``pairwise_distance``, ``cosine_similarity`` and the
p-norm ``vector_norm`` with torch's derivative (at 0 and at ties)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

__all__ = ["cosine_similarity", "pairwise_distance", "vector_norm"]


def pairwise_distance(
    x1: jax.Array, x2: jax.Array, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False
) -> jax.Array:
    """``||x1 - x2 + eps||_p`` over the last axis (``torch.nn.functional.pairwise_distance``);
    ``x1`` and ``x2`` of one shape ``(..., D)``, output ``(...)`` (``(..., 1)`` with ``keepdim``).

    Example:
      >>> pairwise_distance(jnp.array([[3.0, 4.0]]), jnp.zeros((1, 2)), eps=0.0)
      Array([5.], dtype=float32)
    """
    d = x1 - x2 + jnp.asarray(eps, x1.dtype)
    y = vector_norm(d, float(p))
    return y[..., None] if keepdim else y


def cosine_similarity(x1: jax.Array, x2: jax.Array, dim: int = 1, eps: float = 1e-8) -> jax.Array:
    """``sum((x1 / max(|x1|, eps)) * (x2 / max(|x2|, eps)), dim)``
    (``torch.nn.functional.cosine_similarity``, torch 2.x's formula): the clamp acts on
    the value only, the derivative flows through the norm (0 where the norm is 0).
    ``x1`` and ``x2`` of one shape; output that shape without axis ``dim``."""

    def clamped(x):
        n = _norm2(x, dim)
        return n + jax.lax.stop_gradient(jnp.maximum(n, eps) - n)

    return jnp.sum((x1 / clamped(x1)) * (x2 / clamped(x2)), axis=dim)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _norm2(x: jax.Array, axis: int) -> jax.Array:
    """The 2-norm along ``axis`` (kept), whose derivative is 0 where the norm is 0 (torch's)."""
    return jnp.sqrt(jnp.sum(x * x, axis=axis, keepdims=True))


@_norm2.defjvp
def _norm2_jvp(axis, primals, tangents):
    (x,), (t,) = primals, tangents
    n = _norm2(x, axis)
    safe = jnp.where(n == 0, 1, n)
    return n, jnp.where(n == 0, 0, jnp.sum(x * t, axis=axis, keepdims=True) / safe)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def vector_norm(d: jax.Array, p: float) -> jax.Array:
    """torch's ``norm(d, p, dim=-1)``, derivative included (its masks at 0 and ties): ``p`` 0 counts nonzeros, +-inf is the max / min
    of ``|d|``, otherwise ``(sum |d|^p)^(1/p)``."""
    a = jnp.abs(d)
    if p == 0:
        return jnp.sum((a != 0).astype(d.dtype), axis=-1)
    if p == math.inf:
        return jnp.max(a, axis=-1)
    if p == -math.inf:
        return jnp.min(a, axis=-1)
    if p == 1:
        return jnp.sum(a, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=-1))
    return jnp.sum(a**p, axis=-1) ** (1 / p)


@vector_norm.defjvp
def _vector_norm_jvp(p, primals, tangents):
    (d,), (t,) = primals, tangents
    n = vector_norm(d, p)
    return n, jnp.sum(_vector_norm_coefficient(d, n[..., None], p) * t, axis=-1)


def _vector_norm_coefficient(d: jax.Array, n: jax.Array, p: float) -> jax.Array:
    """``d norm / d d``, as torch's ``norm_backward`` writes it (its masks included)."""
    s, a = jnp.sign(d), jnp.abs(d)
    if p == 0:
        return jnp.zeros_like(d)
    if p == 1:
        return s
    if math.isinf(p):
        tie = (a == n).astype(d.dtype)
        return s * tie / jnp.sum(tie, axis=-1, keepdims=True)
    if p < 1:
        scaled = jnp.where(d == 0, 0, s * jnp.where(d == 0, 1, a) ** (p - 1))
        return scaled * n ** (1 - p)
    safe = jnp.where(n == 0, 1, n)
    scale = jnp.where(n == 0, 0, 1 / safe ** (p - 1))
    return (d * a ** (p - 2) if p >= 2 else s * a ** (p - 1)) * scale
