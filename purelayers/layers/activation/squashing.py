"""Squashing and smooth elementwise activations: ``Sigmoid``, ``Tanh``, ``Softplus``,
``Softsign``, ``LogSigmoid``, ``HardSigmoid`` (also spelled ``Hardsigmoid``) and
``Exponential``, as parameter-free layers over ``purelayers.functional.activation``.

Shape: every one maps ``(...)`` to the same shape and dtype (``Sigmoid`` gives integer
and bool inputs float32, as torch).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from purelayers.functional.activation import (
    exponential,
    hard_sigmoid,
    log_sigmoid,
    sigmoid,
    softplus,
    softsign,
    tanh,
)
from purelayers.layers._checks import check_float, config_error
from purelayers.layers.activation.elementwise import _Activation

__all__ = [
    "Exponential",
    "HardSigmoid",
    "Hardsigmoid",
    "LogSigmoid",
    "Sigmoid",
    "Softplus",
    "Softsign",
    "Tanh",
]


@dataclasses.dataclass(frozen=True)
class Sigmoid(_Activation):
    r"""Logistic sigmoid: ``y = 1 / (1 + exp(-x))``.

    Matches ``torch.nn.Sigmoid``; integer and bool inputs give float32, as torch's.

    Shape:
      any; output the same shape (float32 for integer and bool inputs).

    Example:
      >>> Sigmoid().apply({}, jnp.array([0.0, 100.0]))
      Array([0.5, 1. ], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating", "integer", "bool")

    def function(self, x):
        if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
            x = jnp.asarray(x, jnp.float32)  # as torch: integers and bools give float32
        return sigmoid(x)


@dataclasses.dataclass(frozen=True)
class Tanh(_Activation):
    r"""Hyperbolic tangent: ``y = (exp(x) - exp(-x)) / (exp(x) + exp(-x))``.

    Matches ``torch.nn.Tanh``.

    Shape:
      any; output the same shape (floating point for integer and bool inputs).

    Example:
      >>> Tanh().apply({}, jnp.array([0.0, 100.0]))
      Array([0., 1.], dtype=float32)
    """

    def function(self, x):
        return tanh(x)


@dataclasses.dataclass(frozen=True)
class Softplus(_Activation):
    r"""``y = log(1 + exp(beta * x)) / beta``, and ``y = x`` where ``beta * x > threshold``.

    Matches ``torch.nn.Softplus(beta, threshold)``.

    Args:
      beta: the sharpness, nonzero (negative too, as torch). Default ``1.0``.
      threshold: above ``beta * x > threshold`` the output is ``x``. Default ``20.0``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> Softplus().apply({}, jnp.array([0.0, 30.0]))
      Array([ 0.6931472, 30.       ], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    beta: float = 1.0
    threshold: float = 20.0

    def __post_init__(self):
        check_float("Softplus", "beta", self.beta)  # negative too, as torch
        if self.beta == 0:
            raise config_error("Softplus", "beta", "nonzero (the output is divided by it)", 0.0)
        check_float("Softplus", "threshold", self.threshold)

    def function(self, x):
        return softplus(x, self.beta, self.threshold)


@dataclasses.dataclass(frozen=True)
class Softsign(_Activation):
    r"""``y = x / (1 + |x|)``.

    Matches ``torch.nn.Softsign``.

    Shape:
      any; output the same shape (floating point for integer inputs).

    Example:
      >>> Softsign().apply({}, jnp.array([-1.0, 3.0]))
      Array([-0.5 ,  0.75], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating", "integer")

    def function(self, x):
        return softsign(x)


@dataclasses.dataclass(frozen=True)
class LogSigmoid(_Activation):
    r"""``y = log(1 / (1 + exp(-x))) = -softplus(-x)``, finite for every finite ``x``.

    Matches ``torch.nn.LogSigmoid``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> LogSigmoid().apply({}, jnp.array([-200.0, 0.0]))
      Array([-200.       ,   -0.6931472], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    def function(self, x):
        return log_sigmoid(x)


@dataclasses.dataclass(frozen=True)
class HardSigmoid(_Activation):
    r"""``y = relu6(x + 3) / 6``; the gradient is 0 at -3 and 3.

    Matches ``torch.nn.Hardsigmoid``; also spelled ``Hardsigmoid``, as torch does (one
    class, two names).

    Args:
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> HardSigmoid().apply({}, jnp.array([-4.0, 0.0, 3.0]))
      Array([0. , 0.5, 1. ], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def function(self, x):
        return hard_sigmoid(x)


Hardsigmoid = HardSigmoid


@dataclasses.dataclass(frozen=True)
class Exponential(_Activation):
    r"""``y = exp(x)``.

    torch has no module for it: it is ``torch.exp`` as a layer.

    Shape:
      any; output the same shape (floating point for integer and bool inputs).

    Example:
      >>> Exponential().apply({}, jnp.array([0.0, 1.0]))
      Array([1.       , 2.7182817], dtype=float32)
    """

    def function(self, x):
        return exponential(x)
