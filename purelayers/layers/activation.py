"""Activations, as plain functions and as parameter-free layers (plus ``PReLU``).

Every function matches its PyTorch counterpart in value and gradient, including the
subgradient at the kinks: branches are selected with ``jnp.where`` on a strict
comparison (``jnp.maximum`` would split ties 0.5/0.5), and a branch that could
overflow is fed a safe input so its unused gradient never turns into NaN.

Shape: every activation maps ``(...)`` to the same shape and dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.init import Initializer, constant
from purelayers.layers._checks import (
    LayerError,
    as_shape,
    broadcast_to_axis,
    check_choice,
    check_float,
    check_int,
)
from purelayers.layers.core import Layer, Params

__all__ = [
    "ELU",
    "GELU",
    "SELU",
    "Exponential",
    "HardSigmoid",
    "LeakyReLU",
    "LogSoftmax",
    "PReLU",
    "ReLU",
    "ReLU6",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "Softplus",
    "Softsign",
    "SwiGLU",
    "Tanh",
    "elu",
    "exponential",
    "gelu",
    "hard_sigmoid",
    "leaky_relu",
    "log_softmax",
    "prelu",
    "relu",
    "relu6",
    "selu",
    "sigmoid",
    "silu",
    "softmax",
    "softplus",
    "softsign",
    "tanh",
]


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def relu(x: jax.Array) -> jax.Array:
    """``max(x, 0)``; gradient 0 at 0 (``torch.relu``)."""
    return jnp.where(x > 0, x, jnp.zeros_like(x))


def relu6(x: jax.Array) -> jax.Array:
    """``min(max(x, 0), 6)``; gradient 0 at both kinks and NaN kept (``torch.nn.functional.relu6``)."""
    return jnp.where(x >= 6, jnp.full_like(x, 6), jnp.where(x <= 0, jnp.zeros_like(x), x))


def leaky_relu(x: jax.Array, negative_slope: float = 0.01) -> jax.Array:
    """``x`` if ``x > 0`` else ``negative_slope * x``; gradient ``negative_slope`` at 0, as torch."""
    return jnp.where(x > 0, x, x * negative_slope)


def _negative_part(x: jax.Array) -> jax.Array:
    # x where x <= 0, else 0: keeps exp() of the unused branch finite (no 0 * inf NaN)
    # while the gradient at exactly 0 stays 1, as torch's.
    return jnp.where(x > 0, jnp.zeros_like(x), x)


def elu(x: jax.Array, alpha: float = 1.0) -> jax.Array:
    """``x`` if ``x > 0`` else ``alpha * (exp(x) - 1)``; gradient ``alpha`` at 0 (``torch.nn.functional.elu``)."""
    return jnp.where(x > 0, x, alpha * jnp.expm1(_negative_part(x)))


def selu(x: jax.Array) -> jax.Array:
    """``scale * elu(x, alpha)`` with the self-normalizing constants (``torch.selu``)."""
    return _SELU_SCALE * elu(x, _SELU_ALPHA)


def gelu(x: jax.Array, approximate: str = "none") -> jax.Array:
    """``x * Phi(x)``: the exact erf form by default, ``approximate="tanh"`` for the tanh form.

    Note ``jax.nn.gelu`` defaults to the tanh form; torch (and this) to the exact one.
    """
    return jax.nn.gelu(x, approximate=approximate == "tanh")


def silu(x: jax.Array) -> jax.Array:
    """``x * sigmoid(x)`` (``torch.nn.functional.silu``)."""
    return x * jax.nn.sigmoid(x)


def sigmoid(x: jax.Array) -> jax.Array:
    """``1 / (1 + exp(-x))`` (``torch.sigmoid``)."""
    return jax.nn.sigmoid(x)


def tanh(x: jax.Array) -> jax.Array:
    """``torch.tanh``."""
    return jnp.tanh(x)


def softplus(x: jax.Array, beta: float = 1.0, threshold: float = 20.0) -> jax.Array:
    """``log(1 + exp(beta * x)) / beta``, and ``x`` where ``beta * x > threshold``
    (``torch.nn.functional.softplus``). The linear branch's input never reaches ``exp``."""
    linear = x * beta > threshold
    safe = jnp.where(linear, jnp.zeros_like(x), x)
    return jnp.where(linear, x, jnp.log1p(jnp.exp(beta * safe)) / beta)


def softsign(x: jax.Array) -> jax.Array:
    """``x / (1 + |x|)`` (``torch.nn.functional.softsign``)."""
    return x / (1 + jnp.abs(x))


def hard_sigmoid(x: jax.Array) -> jax.Array:
    """``relu6(x + 3) / 6``: 0 below -3, 1 above 3, ``x / 6 + 1/2`` between; gradient 0 at
    exactly -3 and 3, as ``torch.nn.functional.hardsigmoid``."""
    inside = (x > -3) & (x < 3)
    outside = jnp.where(x >= 3, jnp.ones_like(x), jnp.zeros_like(x))
    return jnp.where(inside, x / 6 + 0.5, outside)


def exponential(x: jax.Array) -> jax.Array:
    """``exp(x)`` (``torch.exp``)."""
    return jnp.exp(x)


def softmax(x: jax.Array, axis: int = -1) -> jax.Array:
    """``exp(x) / sum(exp(x))`` along ``axis``, max-subtracted (``torch.softmax``)."""
    return jax.nn.softmax(x, axis=axis)


def log_softmax(x: jax.Array, axis: int = -1) -> jax.Array:
    """``x - logsumexp(x)`` along ``axis`` (``torch.log_softmax``)."""
    return jax.nn.log_softmax(x, axis=axis)


def prelu(x: jax.Array, weight: jax.Array) -> jax.Array:
    """``x`` if ``x > 0`` else ``weight * x``, ``weight`` of shape ``(1,)`` or ``(C,)``
    applied along axis 1 (``torch.nn.functional.prelu``); gradient ``weight`` at 0."""
    if weight.shape[0] == 1:
        slope = weight.reshape(())
    else:
        slope = broadcast_to_axis(weight, jnp.ndim(x), 1 if jnp.ndim(x) >= 2 else 0)
    return jnp.where(x > 0, x, slope.astype(x.dtype) * x)


@dataclasses.dataclass(frozen=True)
class _Activation(Layer):
    """A parameter-free elementwise (or axis-wise) function as a layer."""

    # Whether the output's last axis is half the input's (gated activations), so an MLP
    # around it gives its first projection twice the hidden width.
    halves_width: ClassVar[bool] = False

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        return self.function(x)

    def function(self, x: jax.Array) -> jax.Array:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class ReLU(_Activation):
    """``max(x, 0)``. Matches ``torch.nn.ReLU``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating", "integer")

    def function(self, x):
        return relu(x)


@dataclasses.dataclass(frozen=True)
class ReLU6(_Activation):
    """``min(max(x, 0), 6)``, MobileNet's activation. Matches ``torch.nn.ReLU6``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating", "integer")

    def function(self, x):
        return relu6(x)


@dataclasses.dataclass(frozen=True)
class LeakyReLU(_Activation):
    """``x`` if ``x > 0`` else ``negative_slope * x``. Matches ``torch.nn.LeakyReLU``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    negative_slope: float = 0.01

    def __post_init__(self):
        check_float("LeakyReLU", "negative_slope", self.negative_slope)

    def function(self, x):
        return leaky_relu(x, self.negative_slope)


@dataclasses.dataclass(frozen=True)
class ELU(_Activation):
    """``x`` if ``x > 0`` else ``alpha * (exp(x) - 1)``. Matches ``torch.nn.ELU``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    alpha: float = 1.0

    def __post_init__(self):
        check_float("ELU", "alpha", self.alpha)

    def function(self, x):
        return elu(x, self.alpha)


@dataclasses.dataclass(frozen=True)
class SELU(_Activation):
    """Scaled ELU with the self-normalizing constants. Matches ``torch.nn.SELU``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    def function(self, x):
        return selu(x)


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
class Sigmoid(_Activation):
    """Logistic sigmoid. Matches ``torch.nn.Sigmoid``."""

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
        check_float("Softplus", "beta", self.beta, low=0.0, low_open=True)
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
class HardSigmoid(_Activation):
    """``relu6(x + 3) / 6``. Matches ``torch.nn.Hardsigmoid``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    def function(self, x):
        return hard_sigmoid(x)


@dataclasses.dataclass(frozen=True)
class Exponential(_Activation):
    """``exp(x)`` (``torch.exp`` as a layer; torch has no module for it)."""

    def function(self, x):
        return exponential(x)


def _need_axis(layer: str, x: Any, axis: int) -> None:
    """``axis`` must be an axis of ``x`` (torch: "Dimension out of range")."""
    ndim = jnp.ndim(x)
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise LayerError(
            layer,
            f"axis {axis}",
            f"in [{-max(ndim, 1)}, {max(ndim, 1) - 1}] for an input of rank {ndim}",
            f"x.shape == {tuple(jnp.shape(x))}",
        )


@dataclasses.dataclass(frozen=True)
class Softmax(_Activation):
    """Softmax along ``axis``. Matches ``torch.nn.Softmax(dim=axis)``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    axis: int = -1

    def __post_init__(self):
        check_int("Softmax", "axis", self.axis, minimum=-(2**31))

    def function(self, x):
        _need_axis(type(self).__name__, x, self.axis)
        if jnp.ndim(x) == 0:  # torch takes a scalar along dim 0 or -1
            return softmax(jnp.reshape(x, (1,)), 0)[0]
        return softmax(x, self.axis)


@dataclasses.dataclass(frozen=True)
class LogSoftmax(_Activation):
    """Log-softmax along ``axis``. Matches ``torch.nn.LogSoftmax(dim=axis)``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    axis: int = -1

    def __post_init__(self):
        check_int("LogSoftmax", "axis", self.axis, minimum=-(2**31))

    def function(self, x):
        _need_axis(type(self).__name__, x, self.axis)
        if jnp.ndim(x) == 0:
            return log_softmax(jnp.reshape(x, (1,)), 0)[0]
        return log_softmax(x, self.axis)


@dataclasses.dataclass(frozen=True)
class PReLU(Layer):
    """``x`` if ``x > 0`` else ``weight * x`` with a learned slope. Matches ``torch.nn.PReLU``.

    Args:
      num_parameters: 1 (one slope shared by all channels) or the channel count ``C``.
        Default ``1``.
      init_value: the initial slope (torch's ``init``). Default ``0.25``.
      weight_init: overrides ``init_value`` with any initializer.

    Shape:
      input ``(N, C, ...)`` (channels on axis 1, as torch) or any shape when
      ``num_parameters == 1``; output the same.

    Parameters:
      ``weight``: ``(num_parameters,)``, filled with ``init_value``.
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    num_parameters: int = 1
    init_value: float = 0.25
    _: dataclasses.KW_ONLY
    weight_init: Initializer | None = None

    def __post_init__(self):
        check_int("PReLU", "num_parameters", self.num_parameters)
        check_float("PReLU", "init_value", self.init_value)

    def own_names(self) -> tuple[str, ...]:
        return ("weight",)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        self._check(as_shape(shape))
        w_init = self.weight_init or constant(self.init_value)
        return {"weight": w_init(key, (self.num_parameters,), dtype)}

    def _check(self, shape: tuple[int, ...]) -> None:
        if self.num_parameters == 1:
            return
        channels = shape[1] if len(shape) >= 2 else (shape[0] if shape else None)
        if channels != self.num_parameters:
            raise LayerError(
                "PReLU",
                "input channels (axis 1)",
                self.num_parameters,
                channels,
                f"x.shape == {shape}; PReLU(num_parameters={self.num_parameters}) learns one "
                "slope per channel on axis 1",
            )

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        self._check(tuple(jnp.shape(x)))
        return prelu(x, params["weight"])
