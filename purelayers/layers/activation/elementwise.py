"""Activations, as plain functions and as parameter-free layers.

Every function matches its PyTorch counterpart in value and gradient, including the
subgradient at the kinks: branches are selected with ``jnp.where`` on a strict
comparison (``jnp.maximum`` would split ties 0.5/0.5), and a branch that could
overflow is fed a safe input so its unused gradient never turns into NaN.

The functions are ``purelayers.functional.activation``'s, re-exported here.

Shape: every activation maps ``(...)`` to the same shape and dtype, except the gated
ones (``SwiGLU``, ``GLU``), which halve an axis.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

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
    LayerError,
    check_choice,
    check_float,
    check_int,
    config_error,
)
from purelayers.layers.activation.softmax import (
    LogSoftmax,
    Softmax,
    Softmax2d,
    Softmin,
    _need_axis,
)
from purelayers.layers.core import Layer, Params

__all__ = [
    "CELU",
    "ELU",
    "GELU",
    "GLU",
    "SELU",
    "Exponential",
    "HardSigmoid",
    "Hardsigmoid",
    "LeakyReLU",
    "LogSigmoid",
    "LogSoftmax",
    "Mish",
    "ReLU",
    "ReLU6",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "Softmax2d",
    "Softmin",
    "Softplus",
    "Softsign",
    "SwiGLU",
    "Tanh",
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
    """``max(x, 0)``. Matches ``torch.nn.ReLU``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating", "integer")

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def function(self, x):
        return relu(x)


@dataclasses.dataclass(frozen=True)
class ReLU6(_Activation):
    """``min(max(x, 0), 6)``, MobileNet's activation; gradient 0 at both kinks. Integer
    inputs stay integers. torch's ``inplace`` is accepted and changes nothing
    (``apply`` is pure).
    Matches ``torch.nn.ReLU6``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating", "integer")

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def function(self, x):
        return relu6(x)


@dataclasses.dataclass(frozen=True)
class LeakyReLU(_Activation):
    """``x`` if ``x > 0`` else ``negative_slope * x``. Matches ``torch.nn.LeakyReLU``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    negative_slope: float = 0.01

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def __post_init__(self):
        check_float("LeakyReLU", "negative_slope", self.negative_slope)

    def function(self, x):
        return leaky_relu(x, self.negative_slope)


@dataclasses.dataclass(frozen=True)
class ELU(_Activation):
    """``x`` if ``x > 0`` else ``alpha * (exp(x) - 1)``. Matches ``torch.nn.ELU``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    alpha: float = 1.0

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def __post_init__(self):
        check_float("ELU", "alpha", self.alpha)

    def function(self, x):
        return elu(x, self.alpha)


@dataclasses.dataclass(frozen=True)
class SELU(_Activation):
    """Scaled ELU with the self-normalizing constants. Matches ``torch.nn.SELU``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def function(self, x):
        return selu(x)


@dataclasses.dataclass(frozen=True)
class CELU(_Activation):
    r"""Continuously differentiable ELU: ``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``.

    The gradient at 0 is 1 from both sides, as torch's. torch's ``inplace`` is accepted
    and changes nothing (``apply`` is pure).

    Args:
      alpha: the negative branch's scale, nonzero. Default ``1.0``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Matches ``torch.nn.CELU(alpha)``.

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
    """``x * Phi(x)``, exact (erf) by default or ``approximate="tanh"``. Matches ``torch.nn.GELU``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    approximate: str = "none"

    def __post_init__(self):
        check_choice("GELU", "approximate", self.approximate, ("none", "tanh"))

    def function(self, x):
        return gelu(x, self.approximate)


@dataclasses.dataclass(frozen=True)
class SiLU(_Activation):
    """``x * sigmoid(x)`` (swish). Matches ``torch.nn.SiLU``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def function(self, x):
        return silu(x)


@dataclasses.dataclass(frozen=True)
class SwiGLU(_Activation):
    """Gated SiLU over the last axis: ``silu(gate) * up`` with ``gate, up = split(x, 2)``
    (gate first), the activation of Llama's MLP with its gate and up projections
    packed into one matrix. Halves the last axis (``halves_width``).

    Shape:
      input ``(..., 2 * D)``; output ``(..., D)``.
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    halves_width: ClassVar[bool] = True

    def function(self, x):
        if jnp.shape(x)[-1] % 2:
            raise LayerError("SwiGLU", "input last axis", "an even width", jnp.shape(x)[-1])
        gate, up = jnp.split(x, 2, axis=-1)
        return silu(gate) * up


@dataclasses.dataclass(frozen=True)
class GLU(_Activation):
    r"""Gated linear unit: ``a * sigmoid(b)``, ``a`` and ``b`` the first and second halves
    of ``x`` along ``dim``.

    Args:
      dim: the axis to halve; its length must be even. Default ``-1``.

    Shape:
      input with ``2 * D`` entries on ``dim``; output the same with ``D`` there.

    Matches ``torch.nn.GLU(dim)``.

    Example:
      >>> GLU().apply({}, jnp.array([[2.0, 4.0, 0.0, 0.0]]))
      Array([[1., 2.]], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    dim: int = -1

    def __post_init__(self):
        check_int("GLU", "dim", self.dim, minimum=-(2**31))

    @property
    def halves_width(self) -> bool:  # type: ignore[override]
        """Whether the halved axis is the last one (an MLP around it then doubles its
        first projection)."""
        return self.dim == -1

    def function(self, x):
        _need_axis("GLU", x, self.dim, "dim")
        shape = tuple(jnp.shape(x))
        if not shape or shape[self.dim] % 2:
            raise LayerError(
                "GLU",
                f"input dim {self.dim}",
                "an even length (GLU halves it)",
                shape[self.dim] if shape else "a scalar",
                f"x.shape == {shape}",
            )
        return glu(x, self.dim)


@dataclasses.dataclass(frozen=True)
class Sigmoid(_Activation):
    """Logistic sigmoid. Matches ``torch.nn.Sigmoid``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating", "integer", "bool")

    def function(self, x):
        if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
            x = jnp.asarray(x, jnp.float32)  # as torch: integers and bools give float32
        return sigmoid(x)


@dataclasses.dataclass(frozen=True)
class Tanh(_Activation):
    """Hyperbolic tangent. Matches ``torch.nn.Tanh``."""

    def function(self, x):
        return tanh(x)


@dataclasses.dataclass(frozen=True)
class Softplus(_Activation):
    """``log(1 + exp(beta * x)) / beta``, linear above ``threshold``. Matches ``torch.nn.Softplus``."""

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
    """``x / (1 + |x|)``. Matches ``torch.nn.Softsign``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating", "integer")

    def function(self, x):
        return softsign(x)


@dataclasses.dataclass(frozen=True)
class Mish(_Activation):
    r"""``x * tanh(softplus(x))``. torch's ``inplace`` is accepted and changes nothing
    (``apply`` is pure).

    Shape:
      any floating-point input; output the same shape and dtype.

    Matches ``torch.nn.Mish()``.

    Example:
      >>> Mish().apply({}, jnp.array([0.0, 30.0]))
      Array([ 0., 30.], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def function(self, x):
        return mish(x)


@dataclasses.dataclass(frozen=True)
class LogSigmoid(_Activation):
    r"""``log(1 / (1 + exp(-x))) = -softplus(-x)``, finite for every finite ``x``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Matches ``torch.nn.LogSigmoid()``.

    Example:
      >>> LogSigmoid().apply({}, jnp.array([-200.0, 0.0]))
      Array([-200.       ,   -0.6931472], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    def function(self, x):
        return log_sigmoid(x)


@dataclasses.dataclass(frozen=True)
class HardSigmoid(_Activation):
    """``relu6(x + 3) / 6``; gradient 0 at -3 and 3. Also spelled ``Hardsigmoid``, as
    torch does (one class, two names). torch's ``inplace`` is accepted and changes
    nothing (``apply`` is pure). Matches ``torch.nn.Hardsigmoid``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def function(self, x):
        return hard_sigmoid(x)


Hardsigmoid = HardSigmoid


@dataclasses.dataclass(frozen=True)
class Exponential(_Activation):
    """``exp(x)`` (``torch.exp`` as a layer; torch has no module for it)."""

    def function(self, x):
        return exponential(x)
