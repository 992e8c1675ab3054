"""Piecewise activations: clamps, thresholds, shrinks, hard swish and the randomized
leaky ReLU, as plain functions and as parameter-free layers.

Each matches its PyTorch counterpart in value and gradient, the kinks included: a
branch is chosen with ``jnp.where`` on the comparison torch's kernel makes, so an input
exactly at a bound takes the branch (and the derivative) torch's backward gives it, and
NaN propagates where torch propagates it. Integer inputs, where torch computes on them
(``Hardtanh``, ``Threshold``), see the bounds truncated towards zero to the input's
dtype, as torch converts its scalars.

Shape: every activation maps ``(...)`` to the same shape (and dtype, except
``Tanhshrink``, which gives integers float32 as torch does).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.functional.activation import (
    hardshrink,
    hardswish,
    hardtanh,
    softshrink,
    tanhshrink,
    threshold,
)
from purelayers.layers._checks import check_float, config_error, need_key, need_representable
from purelayers.layers.activation.elementwise import _Activation
from purelayers.layers.core import Params

__all__ = [
    "Hardshrink",
    "Hardswish",
    "Hardtanh",
    "RReLU",
    "Softshrink",
    "Tanhshrink",
    "Threshold",
    "hardshrink",
    "hardswish",
    "hardtanh",
    "rrelu",
    "softshrink",
    "tanhshrink",
    "threshold",
]


def rrelu(
    x: jax.Array,
    lower: float = 1.0 / 8,
    upper: float = 1.0 / 3,
    *,
    train: bool = False,
    key: jax.Array | None = None,
    layer: str = "rrelu",
) -> jax.Array:
    """``x`` if ``x > 0`` else ``a * x``: in training ``a ~ U(lower, upper)`` per entry,
    drawn from ``key`` (required); otherwise ``a = (lower + upper) / 2``. The gradient
    at 0 is ``a``, as ``torch.nn.functional.rrelu``'s."""
    if not train:
        return jnp.where(x > 0, x, x * ((lower + upper) / 2))
    need_key(layer, key)
    slope = jax.random.uniform(key, jnp.shape(x), jnp.result_type(x), lower, upper)
    return jnp.where(x > 0, x, x * slope)


@dataclasses.dataclass(frozen=True)
class Hardtanh(_Activation):
    r"""Clamps to ``[min_val, max_val]``: ``y = min(max(x, min_val), max_val)``.

    Matches ``torch.nn.Hardtanh(min_val, max_val)``. The gradient is 1 strictly inside
    the interval and 0 at both bounds and outside, as torch's. Integer inputs stay
    integers, the bounds truncated towards zero. torch's deprecated ``min_value`` /
    ``max_value`` spellings are not accepted.

    Args:
      min_val: the lower bound. Default ``-1.0``.
      max_val: the upper bound, greater than ``min_val``. Default ``1.0``.
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      any; output the same shape and dtype.

    Example:
      >>> Hardtanh().apply({}, jnp.array([-2.0, 0.5, 1.0, 3.0]))
      Array([-1. ,  0.5,  1. ,  1. ], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating", "integer")

    min_val: float = -1.0
    max_val: float = 1.0

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def __post_init__(self):
        check_float("Hardtanh", "min_val", self.min_val)
        check_float("Hardtanh", "max_val", self.max_val)
        if not self.max_val > self.min_val:
            raise config_error(
                "Hardtanh", "max_val", f"greater than min_val ({self.min_val!r})", self.max_val
            )

    def function(self, x):
        for what in ("min_val", "max_val"):
            need_representable("Hardtanh", what, getattr(self, what), x)
        return hardtanh(x, self.min_val, self.max_val)


@dataclasses.dataclass(frozen=True)
class Hardswish(_Activation):
    r"""Hard swish (MobileNetV3): ``y = x * relu6(x + 3) / 6``.

    Matches ``torch.nn.Hardswish``. 0 at and below -3, ``x`` at and above 3,
    ``x (x + 3) / 6`` between; the gradient is torch's at the kinks: 0 at ``x = -3``,
    1 at ``x = 3``.

    Args:
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> Hardswish().apply({}, jnp.array([-4.0, 0.0, 1.5, 3.0]))
      Array([-0.   ,  0.   ,  1.125,  3.   ], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def function(self, x):
        return hardswish(x)


@dataclasses.dataclass(frozen=True)
class Threshold(_Activation):
    r"""``y = x`` if ``x > threshold`` else ``value``.

    Matches ``torch.nn.Threshold(threshold, value)``. At ``x == threshold`` the output
    is ``value`` and the gradient 0, as torch's. Integer inputs stay integers,
    ``threshold`` and ``value`` truncated towards zero.

    Args:
      threshold: the value to threshold at (required, as in torch).
      value: the value replacing every entry not above ``threshold`` (required).
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      any; output the same shape and dtype.

    Example:
      >>> Threshold(0.5, -1.0).apply({}, jnp.array([0.0, 0.5, 2.0]))
      Array([-1., -1.,  2.], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating", "integer")

    threshold: float
    value: float

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def __post_init__(self):
        check_float("Threshold", "threshold", self.threshold)
        check_float("Threshold", "value", self.value)

    def function(self, x):
        return threshold(x, self.threshold, self.value)


@dataclasses.dataclass(frozen=True)
class RReLU(_Activation):
    r"""Randomized leaky ReLU: ``y = x`` if ``x > 0`` else ``a * x``.

    Matches ``torch.nn.RReLU(lower, upper)`` (eval mode exactly; training in
    distribution). In training (``train=True``) each entry draws its own slope
    ``a ~ U(lower, upper)`` from ``key`` (required: a ``LayerError`` says so when it is
    missing, as ``Dropout``'s); in eval mode ``a = (lower + upper) / 2`` everywhere. The
    gradient is the slope used, also at ``x = 0``.

    Args:
      lower: the smallest slope. Default ``1/8``.
      upper: the largest slope, at least ``lower``. Default ``1/3``.
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> RReLU(0.1, 0.3).apply({}, jnp.array([-1.0, 2.0]))
      Array([-0.2,  2. ], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    lower: float = 1.0 / 8
    upper: float = 1.0 / 3

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def __post_init__(self):
        check_float("RReLU", "lower", self.lower)
        check_float("RReLU", "upper", self.upper, low=self.lower)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        return rrelu(x, self.lower, self.upper, train=train, key=key, layer="RReLU")


@dataclasses.dataclass(frozen=True)
class Softshrink(_Activation):
    r"""Soft shrinkage: ``y = x - lambd`` if ``x > lambd``, ``x + lambd`` if ``x < -lambd``, else 0.

    Matches ``torch.nn.Softshrink(lambd)``. The gradient is 0 on ``[-lambd, lambd]``,
    its ends included, as torch's; NaN is kept.

    Args:
      lambd: the half-width of the zero band, at least 0. Default ``0.5``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> Softshrink().apply({}, jnp.array([-2.0, 0.25, 1.0]))
      Array([-1.5,  0. ,  0.5], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    lambd: float = 0.5

    def __post_init__(self):
        check_float("Softshrink", "lambd", self.lambd, low=0.0)

    def function(self, x):
        return softshrink(x, self.lambd)


@dataclasses.dataclass(frozen=True)
class Hardshrink(_Activation):
    r"""Hard shrinkage: ``y = x`` if ``|x| > lambd`` else 0.

    Matches ``torch.nn.Hardshrink(lambd)``. The gradient is 0 on ``[-lambd, lambd]``,
    its ends included, as torch's. A negative ``lambd`` (which torch accepts) leaves
    every entry as it is.

    Args:
      lambd: the half-width of the zero band. Default ``0.5``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> Hardshrink().apply({}, jnp.array([-2.0, 0.5, 0.75]))
      Array([-2.  ,  0.  ,  0.75], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    lambd: float = 0.5

    def __post_init__(self):
        check_float("Hardshrink", "lambd", self.lambd)

    def function(self, x):
        return hardshrink(x, self.lambd)


@dataclasses.dataclass(frozen=True)
class Tanhshrink(_Activation):
    r"""``y = x - tanh(x)``.

    Matches ``torch.nn.Tanhshrink``; integer inputs give float32, as torch's.

    Shape:
      any; output the same shape (float32 for integer inputs).

    Example:
      >>> Tanhshrink().apply({}, jnp.array([0.0, 10.0]))
      Array([0., 9.], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating", "integer")

    def function(self, x):
        return tanhshrink(x)
