r"""Reshaping: ``Flatten`` and its inverse ``Unflatten``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from purelayers.layers._checks import LayerError, check_int, config_error
from purelayers.layers._spatial import is_int
from purelayers.layers.core import Layer, Params

__all__ = ["Flatten", "Unflatten"]


@dataclasses.dataclass(frozen=True)
class Flatten(Layer):
    r"""Merges axes ``start_dim..end_dim`` (inclusive) into one: ``y = x.reshape(*pre, -1, *post)``.

    Matches ``torch.nn.Flatten(start_dim, end_dim)``; the inverse is ``Unflatten``.

    Args:
      start_dim: the first axis to merge; negative counts from the end. Default ``1``.
      end_dim: the last axis to merge; negative counts from the end. Default ``-1``.

    Shape:
      input ``(*pre, S_start, ..., S_end, *post)``; output ``(*pre, S_start * ... *
      S_end, *post)``: ``(N, C, H, W)`` gives ``(N, C * H * W)`` with the defaults.

    Parameters: none.

    Example:
      >>> Flatten().apply({}, jnp.zeros((2, 3, 4, 5))).shape
      (2, 60)
    """

    start_dim: int = 1
    end_dim: int = -1

    def __post_init__(self):
        check_int("Flatten", "start_dim", self.start_dim, minimum=-(2**31))
        check_int("Flatten", "end_dim", self.end_dim, minimum=-(2**31))

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        ndim = max(jnp.ndim(x), 1)
        start, end = self.start_dim, self.end_dim
        start, end = start + ndim if start < 0 else start, end + ndim if end < 0 else end
        if not (0 <= start < ndim and 0 <= end < ndim and start <= end):
            raise LayerError(
                "Flatten",
                f"start_dim={self.start_dim} and end_dim={self.end_dim} must name axes of "
                f"x.shape == {tuple(jnp.shape(x))} with start_dim <= end_dim",
                None,
                None,
            )
        shape = tuple(jnp.shape(x))
        if not shape:
            return jnp.reshape(x, (1,))
        merged = 1
        for d in shape[start : end + 1]:
            merged *= d
        return jnp.reshape(x, (*shape[:start], merged, *shape[end + 1 :]))


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
