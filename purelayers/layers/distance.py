"""Similarities and distances of two inputs: ``CosineSimilarity``, ``PairwiseDistance``.

Both broadcast their inputs against each other, as torch does (``x1`` ``(N, D)`` with
``x2`` ``(1, D)`` or ``(D,)``), take both shapes in ``init`` (``init(key, (x1.shape,
x2.shape))``, which returns ``{}``) and apply as ``apply(params, x1, x2)``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import purelayers.functional as F
from purelayers.layers._checks import LayerError, check_float, check_int, config_error
from purelayers.layers._two_inputs import pair_init, two_shapes
from purelayers.layers.core import Layer, Params

__all__ = ["CosineSimilarity", "PairwiseDistance"]


def _broadcast(layer: str, x1: Any, x2: Any, floating_only: bool) -> tuple[jax.Array, jax.Array]:
    """Both inputs broadcast to their common shape (torch's rule, explicitly) in their
    common floating dtype (float32 for integers, where ``floating_only`` is False)."""
    s1, s2 = tuple(jnp.shape(x1)), tuple(jnp.shape(x2))
    try:
        shape = np.broadcast_shapes(s1, s2)
    except ValueError:
        raise LayerError(
            layer,
            "input shapes",
            "shapes that broadcast (equal, or 1, axis by axis from the last)",
            f"x1.shape == {s1}, x2.shape == {s2}",
        ) from None
    dtype = jnp.result_type(x1, x2)
    if not jnp.issubdtype(dtype, jnp.floating):
        if floating_only or dtype == jnp.bool_ or jnp.issubdtype(dtype, jnp.complexfloating):
            raise LayerError(
                layer,
                "inputs' common dtype",
                "floating point" if floating_only else "floating point or integer",
                f"{dtype} (x1 {jnp.result_type(x1)}, x2 {jnp.result_type(x2)})",
                "as torch refuses it; cast first (x.astype(jnp.float32))",
            )
        dtype = jnp.float32
    return tuple(jnp.broadcast_to(jnp.asarray(x, dtype), shape) for x in (x1, x2))


_pnorm = F.vector_norm  # (embedding's max_norm import)


@dataclasses.dataclass(frozen=True)
class CosineSimilarity(Layer):
    r"""Cosine similarity along ``dim``: ``sum(x1 / max(|x1|, eps) * x2 / max(|x2|, eps), dim)``.

    Matches ``torch.nn.CosineSimilarity(dim, eps)`` (torch 2.x's formula): each input is
    divided by its own 2-norm along ``dim``, clamped below at ``eps``, so the result
    stays in ``[-1, 1]``, and an input whose norm is below ``eps`` gives a similarity
    scaled down by ``norm / eps``. As in torch, the clamp acts on the value only: the
    derivative flows through the norm as if it were not clamped (and is 0 where the
    norm is 0).

    ``x1`` and ``x2`` broadcast against each other (torch's rule); ``init`` takes both
    shapes, ``init(key, (x1.shape, x2.shape))``, and returns ``{}``.

    Args:
      dim: the axis of the vectors, in the broadcast shape. Default ``1``.
      eps: the smallest norm divided by. Default ``1e-8``.

    Shape:
      ``x1``, ``x2`` broadcasting to ``S``; output ``S`` without axis ``dim``. Floating
      point (or one floating and one integer input, as torch).

    Parameters: none.

    Example:
      >>> cos = CosineSimilarity()
      >>> cos.apply({}, jnp.array([[2.0, 0.0], [0.0, 3.0]]), jnp.array([[1.0, 0.0]]))
      Array([1., 0.], dtype=float32)
    """

    dim: int = 1
    eps: float = 1e-8

    def __post_init__(self):
        check_int("CosineSimilarity", "dim", self.dim, minimum=-(2**31))
        check_float("CosineSimilarity", "eps", self.eps, low=0.0)

    @pair_init
    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        """No parameters; ``shape`` is the two inputs' shapes, ``(x1.shape, x2.shape)``."""
        two_shapes("CosineSimilarity", shape)
        return {}

    def apply(
        self, params: Params, x1: Any, x2: Any, *, key: jax.Array | None = None, train: bool = False
    ) -> jax.Array:
        x1, x2 = _broadcast("CosineSimilarity", x1, x2, floating_only=True)
        scalar = x1.ndim == 0
        if scalar:  # torch wraps dims of a scalar as of a vector
            x1, x2 = x1.reshape(1), x2.reshape(1)
        if not -x1.ndim <= self.dim < x1.ndim:
            raise LayerError(
                "CosineSimilarity",
                f"dim={self.dim}",
                f"an axis of the broadcast shape, in [-{x1.ndim}, {x1.ndim})",
                f"shape {x1.shape}",
            )
        y = F.cosine_similarity(x1, x2, self.dim % x1.ndim, self.eps)
        return y.reshape(()) if scalar else y


@dataclasses.dataclass(frozen=True)
class PairwiseDistance(Layer):
    r"""The ``p``-norm distance over the last axis: ``||x1 - x2 + eps||_p``.

    Matches ``torch.nn.PairwiseDistance(p, eps, keepdim)``: ``eps`` is added to every
    component of the difference (so equal inputs are ``D**(1/p) * eps`` apart, and the
    derivative there is defined). ``p`` is any real or infinite: ``0`` counts nonzero
    components, ``inf`` / ``-inf`` take the largest / smallest ``|component|`` (the
    derivative shared equally among ties, as torch), otherwise ``(sum |d|^p)^(1/p)``;
    derivatives at zero components and zero norms are torch's.

    ``x1`` and ``x2`` broadcast against each other (torch's rule); ``init`` takes both
    shapes, ``init(key, (x1.shape, x2.shape))``, and returns ``{}``.

    Args:
      p: the norm's order. Default ``2.0``.
      eps: added to the difference. Default ``1e-6``.
      keepdim: keep the reduced last axis with length 1. Default ``False``.

    Shape:
      ``x1``, ``x2`` broadcasting to ``(*, D)``; output ``(*)`` (``(*, 1)`` with
      ``keepdim``). Scalar inputs give a scalar. Integer inputs compute in float32.

    Parameters: none.

    Example:
      >>> dist = PairwiseDistance(eps=0.0)
      >>> dist.apply({}, jnp.array([[3.0, 4.0], [1.0, 1.0]]), jnp.zeros(2))
      Array([5.       , 1.4142135], dtype=float32)
    """

    p: float = 2.0
    eps: float = 1e-6
    keepdim: bool = False

    def __post_init__(self):
        p = self.p
        if isinstance(p, bool) or not isinstance(p, (int, float, np.floating, np.integer)):
            raise config_error("PairwiseDistance", "p", "a real number or +-inf", p)
        if math.isnan(p):
            raise config_error("PairwiseDistance", "p", "a real number or +-inf", p)
        check_float("PairwiseDistance", "eps", self.eps)

    @pair_init
    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        """No parameters; ``shape`` is the two inputs' shapes, ``(x1.shape, x2.shape)``."""
        two_shapes("PairwiseDistance", shape)
        return {}

    def apply(
        self, params: Params, x1: Any, x2: Any, *, key: jax.Array | None = None, train: bool = False
    ) -> jax.Array:
        x1, x2 = _broadcast("PairwiseDistance", x1, x2, floating_only=False)
        if x1.ndim == 0:
            return F.pairwise_distance(x1.reshape(1), x2.reshape(1), self.p, self.eps).reshape(())
        return F.pairwise_distance(x1, x2, self.p, self.eps, self.keepdim)
