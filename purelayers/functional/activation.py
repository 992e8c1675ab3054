"""Activations as array functions (``torch.nn.functional``'s): each matches its PyTorch
counterpart in value and gradient, including the subgradient at the kinks: branches
are selected with ``jnp.where`` on a strict comparison (``jnp.maximum`` would split ties
0.5/0.5), and a branch that could overflow is fed a safe input so its unused gradient
never turns into NaN.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from purelayers.functional.linear import summed_in_float32

__all__ = [
    "celu",
    "elu",
    "exponential",
    "gelu",
    "glu",
    "hard_sigmoid",
    "hardshrink",
    "hardswish",
    "hardtanh",
    "leaky_relu",
    "log_sigmoid",
    "log_softmax",
    "mish",
    "prelu",
    "relu",
    "relu6",
    "selu",
    "sigmoid",
    "silu",
    "softmax",
    "softmin",
    "softplus",
    "softshrink",
    "softsign",
    "tanh",
    "tanhshrink",
    "threshold",
]


def _along(v: jax.Array, ndim: int, axis: int) -> jax.Array:
    """A 1-D ``v`` shaped to broadcast along ``axis`` of an ``ndim``-D array."""
    return v.reshape((1,) * axis + (-1,) + (1,) * (ndim - axis - 1))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def relu(x: jax.Array) -> jax.Array:
    """``max(x, 0)``; gradient 0 at 0 and NaN kept (``torch.relu``). ``jax.nn.relu``: the
    same compiled program as a hand-written JAX model's."""
    return jax.nn.relu(x)


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


def celu(x: jax.Array, alpha: float = 1.0) -> jax.Array:
    """``x`` if ``x > 0`` else ``alpha * (exp(x / alpha) - 1)``; gradient 1 at 0
    (``torch.nn.functional.celu``)."""
    return jnp.where(x > 0, x, alpha * jnp.expm1(_negative_part(x) / alpha))


def selu(x: jax.Array) -> jax.Array:
    """``scale * elu(x, alpha)`` with the self-normalizing constants (``torch.selu``)."""
    return _SELU_SCALE * elu(x, _SELU_ALPHA)


def gelu(x: jax.Array, approximate: str = "none") -> jax.Array:
    """``x * Phi(x)``: the exact erf form by default, ``approximate="tanh"`` for
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (``torch.nn.functional.gelu``).

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


def mish(x: jax.Array) -> jax.Array:
    """``x * tanh(softplus(x))`` (``torch.nn.functional.mish``)."""
    return x * jnp.tanh(jax.nn.softplus(x))


def log_sigmoid(x: jax.Array) -> jax.Array:
    """``log(sigmoid(x)) = -softplus(-x)``, without overflow (``torch.nn.functional.logsigmoid``)."""
    return jax.nn.log_sigmoid(x)


def hard_sigmoid(x: jax.Array) -> jax.Array:
    """``relu6(x + 3) / 6``: 0 below -3, 1 above 3, ``x / 6 + 1/2`` between; gradient 0 at
    exactly -3 and 3, as ``torch.nn.functional.hardsigmoid``."""
    inside = (x > -3) & (x < 3)
    outside = jnp.where(x >= 3, jnp.ones_like(x), jnp.zeros_like(x))
    return jnp.where(inside, x / 6 + 0.5, outside)


def exponential(x: jax.Array) -> jax.Array:
    """``exp(x)`` (``torch.exp``)."""
    return jnp.exp(x)


def glu(x: jax.Array, axis: int = -1) -> jax.Array:
    """``a * sigmoid(b)`` with ``a, b`` the two halves of ``x`` along ``axis`` (``a``
    first), which must have even length (``torch.nn.functional.glu``)."""
    a, b = jnp.split(x, 2, axis=axis)
    return a * jax.nn.sigmoid(b)


def _scalar(x: Any, value: float) -> float | int:
    """``value`` as torch converts a scalar for ``x``: truncated for integer inputs."""
    return int(value) if jnp.issubdtype(jnp.result_type(x), jnp.integer) else value


def hardtanh(x: jax.Array, min_val: float = -1.0, max_val: float = 1.0) -> jax.Array:
    """``min(max(x, min_val), max_val)``; gradient 1 strictly inside, 0 at both bounds and
    outside, NaN kept (``torch.nn.functional.hardtanh``)."""
    lo, hi = _scalar(x, min_val), _scalar(x, max_val)
    return jnp.where(x >= hi, jnp.full_like(x, hi), jnp.where(x <= lo, jnp.full_like(x, lo), x))


def hardswish(x: jax.Array) -> jax.Array:
    """``x * relu6(x + 3) / 6``; gradient 0 at -3 and 1 at 3, as
    ``torch.nn.functional.hardswish``."""
    return jnp.where(x <= -3, x * 0, jnp.where(x >= 3, x, x * (x + 3) / 6))


def threshold(x: jax.Array, threshold: float, value: float) -> jax.Array:
    """``x`` if ``x > threshold`` else ``value``; gradient 0 at ``x == threshold``
    (``torch.nn.functional.threshold``)."""
    return jnp.where(x <= _scalar(x, threshold), jnp.full_like(x, _scalar(x, value)), x)


def softshrink(x: jax.Array, lambd: float = 0.5) -> jax.Array:
    """``x - lambd`` above ``lambd``, ``x + lambd`` below ``-lambd``, 0 between (NaN
    kept); gradient 0 at ``+-lambd`` (``torch.nn.functional.softshrink``)."""
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, x * 0))


def hardshrink(x: jax.Array, lambd: float = 0.5) -> jax.Array:
    """``x`` if ``|x| > lambd`` else 0; gradient 0 at ``+-lambd``
    (``torch.nn.functional.hardshrink``)."""
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros_like(x), x)


def tanhshrink(x: jax.Array) -> jax.Array:
    """``x - tanh(x)`` (``torch.nn.functional.tanhshrink``); integers give float32."""
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        x = jnp.asarray(x, jnp.float32)
    return x - jnp.tanh(x)


def prelu(x: jax.Array, weight: jax.Array) -> jax.Array:
    """``x`` if ``x > 0`` else ``weight * x``, ``weight`` of shape ``(1,)`` or ``(C,)``
    applied along axis 1 (``torch.nn.functional.prelu``); gradient ``weight`` at 0."""
    if weight.shape[0] == 1:
        slope = weight.reshape(())
    else:
        slope = _along(weight, jnp.ndim(x), 1 if jnp.ndim(x) >= 2 else 0)
    # its gradient, a sum over every broadcast element, adds in float32 under bfloat16
    slope = summed_in_float32(slope.astype(x.dtype), jnp.shape(x))
    return jnp.where(x > 0, x, slope * x)


def softmax(x: jax.Array, axis: int = -1) -> jax.Array:
    """``exp(x) / sum(exp(x))`` along ``axis``, max-subtracted (``torch.softmax``)."""
    return jax.nn.softmax(x, axis=axis)


def log_softmax(x: jax.Array, axis: int = -1) -> jax.Array:
    """``x - logsumexp(x)`` along ``axis`` (``torch.log_softmax``)."""
    return jax.nn.log_softmax(x, axis=axis)


def softmin(x: jax.Array, axis: int = -1) -> jax.Array:
    """``softmax(-x)`` along ``axis`` (``torch.nn.functional.softmin``)."""
    return jax.nn.softmax(-x, axis=axis)
