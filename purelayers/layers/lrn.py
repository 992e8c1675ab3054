"""Local response normalization across channels: ``LocalResponseNorm``, ``CrossMapLRN2d``."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.layers._checks import (
    LayerError,
    check_float,
    check_int,
    need_width,
    promote_float,
)
from purelayers.layers.core import Layer, Params

__all__ = ["CrossMapLRN2d", "LocalResponseNorm"]


def _channel_window_sum(sq: jax.Array, before: int, after: int) -> jax.Array:
    """Per position, the sum of ``sq`` over channels ``c - before .. c + after`` (axis 1),
    zeros outside."""
    window = (1, before + after + 1) + (1,) * (sq.ndim - 2)
    padding = ((0, 0), (before, after)) + ((0, 0),) * (sq.ndim - 2)
    return jax.lax.reduce_window(sq, 0.0, jax.lax.add, window, (1,) * sq.ndim, padding)


@dataclasses.dataclass(frozen=True)
class _LRN(Layer):
    """Shared arguments and checks of the two cross-channel normalizations."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)
    _ranks: ClassVar[str] = ""

    size: int
    alpha: float = 1e-4
    beta: float = 0.75
    k: float = 1.0

    def __post_init__(self):
        name = type(self).__name__
        check_int(name, "size", self.size)
        for arg in ("alpha", "beta", "k"):
            check_float(name, arg, getattr(self, arg))

    def _check_rank(self, x: Any, ok: bool) -> None:
        if not ok:
            raise LayerError(
                type(self).__name__,
                "input rank",
                self._ranks,
                f"{jnp.ndim(x)} (x.shape == {tuple(jnp.shape(x))})",
            )

    def _normalize(self, x: Any, total: jax.Array) -> jax.Array:
        """``x / (k + alpha / size * total) ** beta`` in at least float32."""
        xf = jnp.asarray(x).astype(total.dtype)
        return (xf / (self.k + self.alpha / self.size * total) ** self.beta).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class LocalResponseNorm(_LRN):
    r"""Normalizes across channels: ``y[n, c] = x[n, c] / (k + alpha / size * s[n, c]) ** beta``.

    ``s[n, c] = sum(x[n, c'] ** 2)`` with ``c'`` over ``c - size // 2 .. c + (size - 1) //
    2`` (channels outside count as zeros, and the sum is always divided by ``size``).
    Matches ``torch.nn.LocalResponseNorm(size, alpha, beta, k)``.

    Worked example: ``size=2, alpha=1, beta=1, k=1`` on channels ``[1, 2, 3]`` (one
    position): the windows are ``[c-1, c]``, with squares summing to ``1, 5, 13``, so
    ``y = [1 / 1.5, 2 / 3.5, 3 / 7.5] = [0.6667, 0.5714, 0.4]``.

    Args:
      size: how many channels the window spans; a positive integer.
      alpha: multiplicative factor. Default ``1e-4``.
      beta: exponent. Default ``0.75``.
      k: additive factor. Default ``1.0``.

    Shape:
      input ``(N, C, *)`` with at least one axis after ``C``; output the same shape and
      dtype.

    Parameters: none.

    Example:
      >>> lrn = LocalResponseNorm(2, alpha=1.0, beta=1.0)
      >>> y = lrn.apply({}, jnp.array([1.0, 2.0, 3.0]).reshape(1, 3, 1))
      >>> [round(float(v), 4) for v in y[0, :, 0]]
      [0.6667, 0.5714, 0.4]
    """

    _ranks: ClassVar[str] = "at least 3 (N, C, *)"

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        self._check_rank(x, jnp.ndim(x) >= 3)
        xf = jnp.asarray(x).astype(promote_float(jnp.result_type(x)))
        return self._normalize(
            x, _channel_window_sum(xf * xf, self.size // 2, (self.size - 1) // 2)
        )


@dataclasses.dataclass(frozen=True)
class CrossMapLRN2d(_LRN):
    r"""torch's legacy cross-channel normalization: ``y = x * (k + alpha / size * s) ** -beta``.

    ``s[n, c]`` sums ``x[n, c'] ** 2`` over the channels torch's ``CrossMapLRN2d`` sums,
    reproduced exactly: with ``p = int((size - 1) / 2 + 1)``, the window ``c - p + 1 .. c +
    p - 1`` (inside the channels) and, for every ``c >= p``, channel 0 too (torch's running
    sum never takes it back out). Matches ``torch.nn.CrossMapLRN2d(size, alpha, beta, k)``'s
    output. Gradients are the derivatives of that output; torch's hand-written backward
    assumes a plain window, which differs from them once ``C > size // 2``.

    Worked example: ``size=3`` (``p = 2``) over channels ``[1, 1, 1, 1]`` sums ``2, 3,
    4, 3`` squares: channel 2's window is ``1 .. 3`` plus channel 0, channel 3's is
    ``2 .. 3`` plus channel 0.

    Args:
      size: the window size; a positive integer.
      alpha: multiplicative factor. Default ``1e-4``.
      beta: exponent. Default ``0.75``.
      k: additive factor. Default ``1``.

    Shape:
      input ``(N, C, H, W)``; output the same shape and dtype.

    Parameters: none.

    Example:
      >>> lrn = CrossMapLRN2d(3, alpha=3.0, beta=1.0, k=0.0)
      >>> 1 / lrn.apply({}, jnp.ones((1, 4, 1, 1)))[0, :, 0, 0]
      Array([2., 3., 4., 3.], dtype=float32)
    """

    _ranks: ClassVar[str] = "4 (N, C, H, W)"

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        self._check_rank(x, jnp.ndim(x) == 4)
        need_width(
            "CrossMapLRN2d",
            "channels (axis 1)",
            jnp.shape(x)[1],
            "torch's legacy loop reads channel 0",
        )
        xf = jnp.asarray(x).astype(promote_float(jnp.result_type(x)))
        sq = xf * xf
        p = int((self.size - 1) / 2 + 1)
        total = _channel_window_sum(sq, p - 1, p - 1)
        late = (jnp.arange(sq.shape[1]) >= p).reshape(1, -1, 1, 1)
        total = total + jnp.where(late, sq[:, :1], 0.0)
        return self._normalize(x, total)
