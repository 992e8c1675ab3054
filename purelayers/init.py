"""Initializers with PyTorch's fan convention.

Every public name except ``calculate_gain`` and ``fans`` is a factory returning an
initializer ``fn(key, shape, dtype=jnp.float32) -> Array``, as in
``jax.nn.initializers``. Weights are laid out as PyTorch lays them out,
``[out, in, *receptive_field]``, so ``fan_in = in * prod(receptive_field)`` and
``fan_out = out * prod(receptive_field)``.

Initializers are frozen and compare by configuration, so a layer holding one stays
hashable and ``Linear(8, weight_init=normal(std=0.02)) == Linear(8, weight_init=normal(std=0.02))``.

Worked figures for a ``[128, 256]`` weight (``fan_in = 256``, ``fan_out = 128``)::

    kaiming_normal(nonlinearity="relu")   std = sqrt(2) / 16      = 0.0884
    xavier_uniform()                      std = sqrt(2 / 384)     = 0.0722
    Linear's default (kaiming_uniform(a=sqrt(5)))  U(-1/16, 1/16), std 0.0361
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "Initializer",
    "calculate_gain",
    "constant",
    "fans",
    "kaiming_normal",
    "kaiming_uniform",
    "lecun_normal",
    "lecun_uniform",
    "normal",
    "ones",
    "orthogonal",
    "trunc_normal",
    "uniform",
    "xavier_normal",
    "xavier_uniform",
    "zeros",
]


@dataclasses.dataclass(frozen=True)
class Initializer:
    """A configured initializer: ``init(key, shape, dtype=jnp.float32) -> Array``."""

    name: str
    draw: Callable[..., jax.Array] = dataclasses.field(repr=False)
    options: tuple[tuple[str, Any], ...] = ()

    def __call__(self, key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
        shape = tuple(int(d) for d in shape)
        if 0 in shape:  # nothing to draw (torch's init functions leave it as it is)
            return jnp.zeros(shape, dtype)
        # Half-width floats are drawn in float32 and rounded once, as torch fills a
        # bfloat16 tensor: drawn in bfloat16, a normal takes ~128 distinct values, and a
        # truncated normal's far bounds (+-2 at std 0.02: 100 std) clamp samples to them.
        wide = jnp.float32 if jnp.dtype(dtype) in _HALF else dtype
        return self.draw(key, shape, wide, **dict(self.options)).astype(dtype)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.options)
        return f"{self.name}({args})"


_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _make(name: str, draw: Callable[..., jax.Array], **options: Any) -> Initializer:
    return Initializer(name, draw, tuple(options.items()))


def _real(name: str, **values: Any) -> None:
    """Each of ``values`` must be a real number (a Python or NumPy int or float)."""
    for arg, value in values.items():
        ok = isinstance(value, (int, float, np.integer, np.floating))
        if not ok or isinstance(value, bool) or math.isnan(value):
            raise ValueError(f"{name}: {arg} must be a real number, got {value!r}")


def fans(shape: Sequence[int]) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a weight laid out ``[out, in, *receptive_field]``.

    As ``torch.nn.init._calculate_fan_in_and_fan_out``: needs at least two axes.
    """
    shape = tuple(shape)
    if len(shape) < 2:
        raise ValueError(
            f"fans: shape must have at least 2 axes ([out, in, *kernel]), got {shape!r}"
        )
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


_GAINS = {
    "linear": 1.0,
    "identity": 1.0,
    "conv1d": 1.0,
    "conv2d": 1.0,
    "conv3d": 1.0,
    "conv_transpose1d": 1.0,
    "conv_transpose2d": 1.0,
    "conv_transpose3d": 1.0,
    "sigmoid": 1.0,
    "tanh": 5.0 / 3,
    "relu": math.sqrt(2.0),
    "selu": 3.0 / 4,
}


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for ``nonlinearity``, as ``torch.nn.init.calculate_gain``.

    ``leaky_relu`` takes its negative slope as ``param`` (default 0.01):
    ``sqrt(2 / (1 + param**2))``.
    """
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        if isinstance(slope, bool) or not isinstance(slope, (int, float)):
            raise ValueError(f"calculate_gain: param must be a number, got {param!r}")
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity not in _GAINS:
        choices = ", ".join(repr(k) for k in [*_GAINS, "leaky_relu"])
        raise ValueError(
            f"calculate_gain: nonlinearity must be one of {choices}, got {nonlinearity!r}"
        )
    return _GAINS[nonlinearity]


def _fan(shape: tuple[int, ...], mode: str) -> int:
    fan_in, fan_out = fans(shape)
    return fan_in if mode == "fan_in" else fan_out


def _constant(key, shape, dtype, *, value):
    del key
    return jnp.full(shape, value, dtype)


def _uniform(key, shape, dtype, *, a, b):
    return jax.random.uniform(key, shape, dtype, minval=a, maxval=b)


def _normal(key, shape, dtype, *, mean, std):
    return mean + std * jax.random.normal(key, shape, dtype)


def _trunc_normal(key, shape, dtype, *, mean, std, a, b):
    lower, upper = (a - mean) / std, (b - mean) / std
    return mean + std * jax.random.truncated_normal(key, lower, upper, shape, dtype)


def _orthogonal(key, shape, dtype, *, gain):
    if len(shape) < 2:
        raise ValueError(f"orthogonal: shape must have at least 2 axes, got {shape!r}")
    rows, cols = shape[0], math.prod(shape[1:])
    wide = jnp.promote_types(jnp.float32, dtype)  # float64's QR for float64 weights
    flat = jax.random.normal(key, (max(rows, cols), min(rows, cols)), wide)
    q, r = jnp.linalg.qr(flat)
    q = q * jnp.sign(jnp.diagonal(r))[None, :]
    if rows < cols:
        q = q.T
    return (gain * q).reshape(shape).astype(dtype)


def zeros() -> Initializer:
    """All zeros (``torch.nn.init.zeros_``)."""
    return _make("zeros", _constant, value=0.0)


def ones() -> Initializer:
    """All ones (``torch.nn.init.ones_``)."""
    return _make("ones", _constant, value=1.0)


def constant(value: float) -> Initializer:
    """Every entry ``value`` (``torch.nn.init.constant_``)."""
    _real("constant", value=value)
    return _make("constant", _constant, value=value)


def uniform(a: float = 0.0, b: float = 1.0) -> Initializer:
    """``U(a, b)`` (``torch.nn.init.uniform_``; ``a == b`` fills with ``a``)."""
    _real("uniform", a=a, b=b)
    if not a <= b:
        raise ValueError(f"uniform: a must be <= b, got a={a!r}, b={b!r}")
    return _make("uniform", _uniform, a=a, b=b)


def normal(mean: float = 0.0, std: float = 1.0) -> Initializer:
    """``N(mean, std**2)`` (``torch.nn.init.normal_``)."""
    _real("normal", mean=mean, std=std)
    if not std >= 0:
        raise ValueError(f"normal: std must be >= 0, got {std!r}")
    return _make("normal", _normal, mean=mean, std=std)


def trunc_normal(
    mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0
) -> Initializer:
    """``N(mean, std**2)`` redrawn outside ``[a, b]`` (absolute bounds, as
    ``torch.nn.init.trunc_normal_``)."""
    _real("trunc_normal", mean=mean, std=std, a=a, b=b)
    if not std > 0:
        raise ValueError(f"trunc_normal: std must be > 0, got {std!r}")
    if not a < b:
        raise ValueError(f"trunc_normal: a must be < b, got a={a!r}, b={b!r}")
    return _make("trunc_normal", _trunc_normal, mean=mean, std=std, a=a, b=b)


def _scaled_uniform(key, shape, dtype, *, scale, mode):
    bound = math.sqrt(3.0) * scale / math.sqrt(_fan(shape, mode))
    return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)


def _scaled_normal(key, shape, dtype, *, scale, mode):
    return scale / math.sqrt(_fan(shape, mode)) * jax.random.normal(key, shape, dtype)


def _xavier_uniform(key, shape, dtype, *, gain):
    fan_in, fan_out = fans(shape)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)


def _xavier_normal(key, shape, dtype, *, gain):
    fan_in, fan_out = fans(shape)
    return gain * math.sqrt(2.0 / (fan_in + fan_out)) * jax.random.normal(key, shape, dtype)


def _check_mode(name: str, mode: str) -> None:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"{name}: mode must be 'fan_in' or 'fan_out', got {mode!r}")


def xavier_uniform(gain: float = 1.0) -> Initializer:
    """``U(-b, b)`` with ``b = gain * sqrt(6 / (fan_in + fan_out))``
    (``torch.nn.init.xavier_uniform_``)."""
    _real("xavier_uniform", gain=gain)
    return _make("xavier_uniform", _xavier_uniform, gain=gain)


def xavier_normal(gain: float = 1.0) -> Initializer:
    """``N(0, std**2)`` with ``std = gain * sqrt(2 / (fan_in + fan_out))``
    (``torch.nn.init.xavier_normal_``)."""
    _real("xavier_normal", gain=gain)
    return _make("xavier_normal", _xavier_normal, gain=gain)


def kaiming_uniform(
    a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"
) -> Initializer:
    """``U(-b, b)`` with ``b = gain * sqrt(3 / fan)``, ``gain = calculate_gain(nonlinearity, a)``
    (``torch.nn.init.kaiming_uniform_``). ``a=sqrt(5)`` is torch's Linear/Conv default."""
    _check_mode("kaiming_uniform", mode)
    gain = calculate_gain(nonlinearity, a)
    return _make("kaiming_uniform", _scaled_uniform, scale=gain, mode=mode)


def kaiming_normal(
    a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"
) -> Initializer:
    """``N(0, std**2)`` with ``std = gain / sqrt(fan)`` (``torch.nn.init.kaiming_normal_``)."""
    _check_mode("kaiming_normal", mode)
    gain = calculate_gain(nonlinearity, a)
    return _make("kaiming_normal", _scaled_normal, scale=gain, mode=mode)


def lecun_uniform() -> Initializer:
    """``U(-b, b)`` with ``b = sqrt(3 / fan_in)``: variance ``1 / fan_in``."""
    return _make("lecun_uniform", _scaled_uniform, scale=1.0, mode="fan_in")


# Standard deviation of a unit normal truncated to [-2, 2]; dividing by it restores
# variance 1 / fan_in after truncation (as jax.nn.initializers.lecun_normal).
_TRUNC_STD = 0.87962566103423978


def _lecun_normal(key, shape, dtype):
    std = 1.0 / math.sqrt(_fan(shape, "fan_in")) / _TRUNC_STD
    return std * jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)


def lecun_normal() -> Initializer:
    """Truncated normal (at two standard deviations) with variance ``1 / fan_in``,
    as ``jax.nn.initializers.lecun_normal``; the SELU initialization."""
    return _make("lecun_normal", _lecun_normal)


def orthogonal(gain: float = 1.0) -> Initializer:
    """A (semi-)orthogonal matrix over ``[shape[0], prod(shape[1:])]`` scaled by ``gain``
    (``torch.nn.init.orthogonal_``)."""
    _real("orthogonal", gain=gain)
    return _make("orthogonal", _orthogonal, gain=gain)
