"""Rotary position embedding (RoPE) in the rotate-half convention of Llama and Hugging
Face ``transformers``: the function ``rotary_embedding`` and the parameter-free layer
``RotaryEmbedding`` that an ``AttentionCore`` applies to queries and keys (subclasses
change the frequencies, as rope-scaling schemes do).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.layers._checks import LayerError, check_float, promote_float
from purelayers.layers.core import Layer, Params

__all__ = ["RotaryEmbedding", "rotary_embedding"]


def _apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    xf = x.astype(cos.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (xf * cos + rotated * sin).astype(x.dtype)


def _need_even(layer: str, dim: int) -> None:
    if dim % 2:
        raise LayerError(
            layer,
            "rotary embedding needs an even head_dim;",
            "an even number",
            dim,
            "rotate-half pairs entry i with entry i + head_dim / 2",
        )


def rotary_embedding(x: jax.Array, positions: Any, *, theta: float = 10000.0) -> jax.Array:
    r"""Rotary position embedding (RoPE), in the rotate-half convention of Llama and
    Hugging Face ``transformers``.

    With ``d = head_dim``, ``inv_freq[i] = theta ** (-2i / d)`` for ``i < d / 2`` and
    ``angle = position * inv_freq`` repeated over both halves::

        y = x * cos(angle) + rotate_half(x) * sin(angle),
        rotate_half(x) = concat(-x[..., d/2:], x[..., :d/2])

    Angles are computed in float32 (or wider); the output has ``x``'s dtype.

    Args:
      x: ``[..., seq, head_dim]`` (torch's layout, e.g. ``[batch, heads, seq, head_dim]``);
        ``head_dim`` must be even.
      positions: integer (or real) positions, shape ``(seq,)`` or any shape that
        broadcasts against ``x.shape[:-1]`` with as many or fewer axes.
      theta: the frequency base. Default ``10000.0``.
    """
    x = jnp.asarray(x)
    if x.ndim < 2:
        raise LayerError("rotary_embedding", "x rank", "at least 2 ([..., seq, head_dim])", x.ndim)
    _need_even("rotary_embedding", x.shape[-1])
    positions = jnp.asarray(positions)
    if positions.ndim > x.ndim - 1:
        raise LayerError(
            "rotary_embedding", "positions rank", f"at most {x.ndim - 1}", positions.ndim
        )
    cos, sin = RotaryEmbedding(theta).tables(positions, x.shape[-1], promote_float(x.dtype))
    pad = (1,) * (x.ndim - cos.ndim)
    return _apply_rope(x, cos.reshape(pad + cos.shape), sin.reshape(pad + sin.shape))


@dataclasses.dataclass(frozen=True)
class RotaryEmbedding(Layer):
    r"""Rotary position embedding (rotate-half, as Llama and ``transformers``), a
    parameter-free part of an ``AttentionCore``: ``inv_freq[i] = theta ** (-2i / d)``,
    ``angle = position * inv_freq``, ``y = x cos(angle) + rotate_half(x) sin(angle)``
    (see ``rotary_embedding``). Subclasses change the frequencies (``inv_freq``), as
    rope-scaling schemes do.

    Args:
      theta: the frequency base. Default ``10000.0``.

    Shape:
      ``apply(params, x, positions)``: ``x`` ``(batch, seq, heads, head_dim)``,
      ``positions`` ``(seq,)`` or ``(batch, seq)``; output like ``x``.
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    theta: float = 10000.0

    def __post_init__(self):
        check_float("RotaryEmbedding", "theta", self.theta, low=0.0, low_open=True)

    def inv_freq(self, dim: int, dtype: Any) -> jax.Array:
        """``(dim / 2,)`` angular frequencies."""
        return 1.0 / (self.theta ** (jnp.arange(0, dim, 2, dtype=dtype) / dim))

    def tables(self, positions: jax.Array, dim: int, dtype: Any) -> tuple[jax.Array, jax.Array]:
        """``cos`` and ``sin`` of shape ``positions.shape + (dim,)``."""
        return self.tables_at(self.inv_freq(dim, dtype), positions, dtype)

    @staticmethod
    def tables_at(inv: jax.Array, positions: Any, dtype: Any) -> tuple[jax.Array, jax.Array]:
        """``cos`` and ``sin`` of ``positions * inv`` (both halves), for subclasses whose
        frequencies depend on the positions."""
        inv = inv.astype(dtype)
        positions = jnp.asarray(positions).astype(dtype)
        angles = positions[..., None] * inv.reshape((1,) * positions.ndim + (-1,))
        angles = jnp.concatenate([angles, angles], axis=-1)
        return jnp.cos(angles), jnp.sin(angles)

    def apply(self, params: Params, x: Any, positions: Any = None, **_: Any) -> jax.Array:
        x = jnp.asarray(x)
        t, h = x.shape[1], x.shape[-1]
        _need_even("RotaryEmbedding", h)
        positions = jnp.arange(t) if positions is None else jnp.asarray(positions)
        cos, sin = self.tables(positions, h, promote_float(x.dtype))
        lead = (1,) if cos.ndim == 2 else (cos.shape[0],)
        shape = (*lead, t, 1, h)
        return _apply_rope(x, cos.reshape(shape), sin.reshape(shape))
