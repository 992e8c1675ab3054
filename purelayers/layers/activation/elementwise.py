"""Activations, as plain functions and as parameter-free layers: the rectifiers
(``ReLU``, ``ReLU6``, ``LeakyReLU``, ``ELU``, ``SELU``, ``CELU``) and the smooth
self-gated ones (``GELU``, ``SiLU``, ``Mish``), beside the base class every
parameter-free activation shares.

Every function matches its PyTorch counterpart in value and gradient, including the
subgradient at the kinks: branches are selected with ``jnp.where`` on a strict
comparison (``jnp.maximum`` would split ties 0.5/0.5), and a branch that could
overflow is fed a safe input so its unused gradient never turns into NaN.

The functions are ``purelayers.functional.activation``'s, re-exported here.

Shape: every activation maps ``(...)`` to the same shape and dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax

from purelayers.functional.activation import (
    celu,
    elu,
    exponential,
    gelu,
    glu,
    hard_sigmoid,
    leaky_relu,
    log_sigmoid,
    log_softmax,
    mish,
    relu,
    relu6,
    selu,
    sigmoid,
    silu,
    softmax,
    softmin,
    softplus,
    softsign,
    tanh,
)
from purelayers.layers._checks import (
    check_choice,
    check_float,
    config_error,
)
from purelayers.layers.activation.softmax import (
    LogSoftmax,
    Softmax,
    Softmax2d,
    Softmin,
)
from purelayers.layers.core import Layer, Params

__all__ = [
    "CELU",
    "ELU",
    "GELU",
    "SELU",
    "LeakyReLU",
    "LogSoftmax",
    "Mish",
    "ReLU",
    "ReLU6",
    "SiLU",
    "Softmax",
    "Softmax2d",
    "Softmin",
    "celu",
    "elu",
    "exponential",
    "gelu",
    "glu",
    "hard_sigmoid",
    "leaky_relu",
    "log_sigmoid",
    "log_softmax",
    "mish",
    "relu",
    "relu6",
    "selu",
    "sigmoid",
    "silu",
    "softmax",
    "softmin",
    "softplus",
    "softsign",
    "tanh",
]


@dataclasses.dataclass(frozen=True)
class _Activation(Layer):
    """A parameter-free elementwise (or axis-wise) function as a layer."""

    # Whether the output's last axis is half the input's (gated activations), so an MLP
    # around it gives its first projection twice the hidden width.
    halves_width: ClassVar[bool] = False

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        return self.function(x)

    def function(self, x: jax.Array) -> jax.Array:
        raise NotImplementedError(f"{type(self).__name__}: a subclass defines function(x)")


@dataclasses.dataclass(frozen=True)
class ReLU(_Activation):
    r"""``y = max(x, 0)``; the gradient at 0 is 0.

    Matches ``torch.nn.ReLU``. Integer inputs stay integers.

    Args:
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      any; output the same shape and dtype.

    Example:
      >>> ReLU().apply({}, jnp.array([-1.0, 0.0, 2.0]))
      Array([0., 0., 2.], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating", "integer")

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def function(self, x):
        return relu(x)


@dataclasses.dataclass(frozen=True)
class ReLU6(_Activation):
    r"""``y = min(max(x, 0), 6)``, MobileNet's activation; the gradient is 0 at both kinks.

    Matches ``torch.nn.ReLU6``. Integer inputs stay integers.

    Args:
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      any; output the same shape and dtype.

    Example:
      >>> ReLU6().apply({}, jnp.array([-1.0, 3.0, 8.0]))
      Array([0., 3., 6.], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating", "integer")

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def function(self, x):
        return relu6(x)


@dataclasses.dataclass(frozen=True)
class LeakyReLU(_Activation):
    r"""``y = x`` if ``x > 0`` else ``negative_slope * x``.

    Matches ``torch.nn.LeakyReLU(negative_slope)``.

    Args:
      negative_slope: the slope for ``x <= 0``. Default ``0.01``.
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> LeakyReLU(0.1).apply({}, jnp.array([-2.0, 3.0]))
      Array([-0.2,  3. ], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    negative_slope: float = 0.01

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def __post_init__(self):
        check_float("LeakyReLU", "negative_slope", self.negative_slope)

    def function(self, x):
        return leaky_relu(x, self.negative_slope)


@dataclasses.dataclass(frozen=True)
class ELU(_Activation):
    r"""``y = x`` if ``x > 0`` else ``alpha * (exp(x) - 1)``.

    Matches ``torch.nn.ELU(alpha)``.

    Args:
      alpha: the negative branch's scale. Default ``1.0``.
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> ELU(2.0).apply({}, jnp.array([-jnp.inf, 1.0]))
      Array([-2.,  1.], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    alpha: float = 1.0

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def __post_init__(self):
        check_float("ELU", "alpha", self.alpha)

    def function(self, x):
        return elu(x, self.alpha)


@dataclasses.dataclass(frozen=True)
class SELU(_Activation):
    r"""``y = scale * (x if x > 0 else alpha * (exp(x) - 1))``, the self-normalizing ELU.

    ``alpha`` and ``scale`` are the fixed constants about ``1.6733`` and ``1.0507``.
    Matches ``torch.nn.SELU``.

    Args:
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> SELU().apply({}, jnp.array([0.0, 2.0])).round(4)
      Array([0.    , 2.1014], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def function(self, x):
        return selu(x)


@dataclasses.dataclass(frozen=True)
class CELU(_Activation):
    r"""Continuously differentiable ELU: ``y = max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``.

    Matches ``torch.nn.CELU(alpha)``. The gradient at 0 is 1 from both sides, as torch's.

    Args:
      alpha: the negative branch's scale, nonzero. Default ``1.0``.
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> CELU(2.0).apply({}, jnp.array([-jnp.inf, 0.0, 1.0]))
      Array([-2.,  0.,  1.], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    alpha: float = 1.0

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def __post_init__(self):
        check_float("CELU", "alpha", self.alpha)
        if self.alpha == 0:
            raise config_error("CELU", "alpha", "nonzero (x is divided by it)", self.alpha)

    def function(self, x):
        return celu(x, self.alpha)


@dataclasses.dataclass(frozen=True)
class GELU(_Activation):
    r"""``y = x * Phi(x)``, ``Phi`` the standard normal CDF (exact, with ``erf``).

    ``approximate="tanh"`` uses ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))``.
    Matches ``torch.nn.GELU(approximate)``.

    Args:
      approximate: ``"none"`` (exact) or ``"tanh"``. Default ``"none"``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> GELU().apply({}, jnp.array([0.0, 10.0]))
      Array([ 0., 10.], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    approximate: str = "none"

    def __post_init__(self):
        check_choice("GELU", "approximate", self.approximate, ("none", "tanh"))

    def function(self, x):
        return gelu(x, self.approximate)


@dataclasses.dataclass(frozen=True)
class SiLU(_Activation):
    r"""``y = x * sigmoid(x)`` (swish).

    Matches ``torch.nn.SiLU``.

    Args:
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> SiLU().apply({}, jnp.array([0.0, 20.0]))
      Array([ 0., 20.], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def function(self, x):
        return silu(x)


@dataclasses.dataclass(frozen=True)
class Mish(_Activation):
    r"""``y = x * tanh(softplus(x))``.

    Matches ``torch.nn.Mish``.

    Args:
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> Mish().apply({}, jnp.array([0.0, 30.0]))
      Array([ 0., 30.], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def function(self, x):
        return mish(x)
