r"""Reshaping: ``Unflatten``, the inverse of ``Flatten`` (``layers/core.py``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from purelayers.layers._checks import LayerError, config_error
from purelayers.layers._spatial import is_int
from purelayers.layers.core import Layer, Params

__all__ = ["Unflatten"]


@dataclasses.dataclass(frozen=True)
class Unflatten(Layer):
    r"""Splits an axis: ``y = x.reshape(x.shape[:dim] + unflattened_size + x.shape[dim + 1:])``.

    Matches ``torch.nn.Unflatten(dim, unflattened_size)``.

    One entry of ``unflattened_size`` may be ``-1``: that axis takes what the others
    leave (``x.shape[dim] / prod(others)``).

    Args:
      dim: the axis to split; negative counts from the end.
      unflattened_size: a non-empty tuple (or list) of non-negative ints, one of which
        may be ``-1``; their product must equal ``x.shape[dim]``.

    Shape:
      input ``(*, S, *)`` with ``S`` at axis ``dim``; output ``(*, *unflattened_size, *)``.

    Parameters: none.

    Example:
      >>> Unflatten(1, (2, -1)).apply({}, jnp.zeros((4, 6))).shape
      (4, 2, 3)
    """

    dim: int
    unflattened_size: tuple[int, ...]

    def __post_init__(self):
        if not is_int(self.dim):
            raise config_error("Unflatten", "dim", "an int", self.dim)
        sizes = self.unflattened_size
        ok = isinstance(sizes, (tuple, list)) and len(sizes) > 0
        ok = ok and all(is_int(s) and s >= -1 for s in sizes)
        if not ok or [int(s) for s in sizes].count(-1) > 1:
            raise config_error(
                "Unflatten",
                "unflattened_size",
                "a non-empty tuple of ints >= 0 with at most one -1",
                sizes,
            )
        object.__setattr__(self, "unflattened_size", tuple(int(s) for s in sizes))

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        x = jnp.asarray(x)
        shape = tuple(x.shape)
        if not -len(shape) <= self.dim < len(shape):
            raise LayerError(
                "Unflatten",
                f"dim={self.dim}",
                f"an axis in [{-len(shape)}, {len(shape) - 1}]",
                f"x.shape == {shape}",
            )
        axis = self.dim % len(shape)
        n, sizes = shape[axis], self.unflattened_size
        known = math.prod(s for s in sizes if s != -1)
        if -1 in sizes and known != 0 and n % known == 0:
            sizes = tuple(n // known if s == -1 else s for s in sizes)
        if -1 in sizes or math.prod(sizes) != n:
            raise LayerError(
                "Unflatten",
                f"input axis {axis} length",
                f"the product of unflattened_size={self.unflattened_size}",
                f"{n} (x.shape == {shape})",
            )
        return x.reshape(shape[:axis] + sizes + shape[axis + 1 :])
