"""Dropout."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from purelayers.layers._checks import check_float, need_key
from purelayers.layers.core import Layer, Params

__all__ = ["Dropout", "dropout"]


def dropout(x: jax.Array, p: float, key: jax.Array, *, layer: str = "dropout") -> jax.Array:
    """Inverted dropout: zero each entry with probability ``p`` and scale the rest by
    ``1 / (1 - p)``, so the expectation is unchanged. ``key`` is required."""
    if p == 0.0:
        return x
    need_key(layer, key)
    keep = jax.random.bernoulli(key, 1.0 - p, jnp.shape(x))
    return jnp.where(keep, x / (1.0 - p), jnp.zeros_like(x))


@dataclasses.dataclass(frozen=True)
class Dropout(Layer):
    """Randomly zeroes entries in training. Matches ``torch.nn.Dropout`` in distribution.

    In train mode (``train=True``) each entry is kept with probability ``1 - p`` and
    scaled by ``1 / (1 - p)``, drawn from ``key`` (required: a ``ValueError`` says so
    when it is missing). In eval mode, or at ``p = 0``, it is the identity.

    Args:
      p: probability of zeroing an entry, in ``[0, 1)``. Default ``0.5``.

    Shape:
      any; output the same shape and dtype.
    """

    p: float = 0.5

    def __post_init__(self):
        check_float("Dropout", "p", self.p, low=0.0, high=1.0, high_open=True)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        if not train:
            return x
        return dropout(x, self.p, key, layer="Dropout")
