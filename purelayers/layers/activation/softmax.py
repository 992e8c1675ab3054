"""The softmax family: softmax, log-softmax and softmin along one axis, and
``Softmax2d`` over the channels, as plain functions and as parameter-free layers.

Each normalizes along one axis (max-subtracted, so large inputs do not overflow) and
matches its PyTorch counterpart in value and gradient. A scalar input is normalized as
a length-1 vector along axis 0 or -1, as torch does.

Shape: every layer maps ``(...)`` to the same shape and dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.functional.activation import (
    log_softmax,
    softmax,
    softmin,
)
from purelayers.layers._checks import LayerError, check_int, need_ndim
from purelayers.layers.core import Layer, Params

__all__ = [
    "LogSoftmax",
    "Softmax",
    "Softmax2d",
    "Softmin",
    "log_softmax",
    "softmax",
    "softmin",
]


def _need_axis(layer: str, x: Any, axis: int, name: str = "axis") -> None:
    """``axis`` must be an axis of ``x`` (torch: "Dimension out of range")."""
    ndim = jnp.ndim(x)
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise LayerError(
            layer,
            f"{name} {axis}",
            f"in [{-max(ndim, 1)}, {max(ndim, 1) - 1}] for an input of rank {ndim}",
            f"x.shape == {tuple(jnp.shape(x))}",
        )


def _implicit_axis(ndim: int) -> int:
    """torch's legacy choice for ``dim=None`` (``torch.nn.functional._get_softmax_dim``):
    axis 0 for inputs of rank 0, 1 or 3, axis 1 for every other rank."""
    return 0 if ndim in (0, 1, 3) else 1


@dataclasses.dataclass(frozen=True)
class _AlongAxis(Layer):
    """A parameter-free function along one axis of a floating-point input, as a layer."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        return self.function(x)  # type: ignore[attr-defined]


_SAME: Any = object()  # ``axis`` not given: ``dim`` decides


@dataclasses.dataclass(frozen=True)
class _SoftmaxLike(_AlongAxis):
    """``Softmax`` and ``LogSoftmax``: ``dim`` (torch's name) or its older spelling ``axis``."""

    dim: int | None = -1
    _: dataclasses.KW_ONLY
    axis: int | None = dataclasses.field(default=_SAME, repr=False, compare=False)

    def __post_init__(self):
        name = type(self).__name__
        if self.axis is not _SAME:
            if self.dim != -1 and self.dim != self.axis:
                raise ValueError(
                    f"{name}: dim and axis are one setting; got dim={self.dim} and axis={self.axis}"
                )
            object.__setattr__(self, "dim", self.axis)
        arg = "dim" if self.axis is _SAME else "axis"
        object.__setattr__(self, "axis", self.dim)
        if self.dim is not None:
            check_int(name, arg, self.dim, minimum=-(2**31))

    def function(self, x):
        axis = _implicit_axis(jnp.ndim(x)) if self.dim is None else self.dim
        _need_axis(type(self).__name__, x, axis)
        if jnp.ndim(x) == 0:  # torch takes a scalar along dim 0 or -1
            return self.formula(jnp.reshape(x, (1,)), 0)[0]
        return self.formula(x, axis)


@dataclasses.dataclass(frozen=True)
class Softmax(_SoftmaxLike):
    r"""``y_i = exp(x_i) / sum_j exp(x_j)`` along ``dim``, max-subtracted.

    Matches ``torch.nn.Softmax(dim)``.

    Args:
      dim: the axis to normalize along (``axis=`` is accepted as another spelling), or
        ``None`` for torch's legacy implicit choice (axis 0 for inputs of rank 0, 1 or 3,
        axis 1 otherwise). Default ``-1``, the last axis (torch's default is ``None``).

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> Softmax(dim=1).apply({}, jnp.zeros((2, 4)))[0]
      Array([0.25, 0.25, 0.25, 0.25], dtype=float32)
    """

    formula = staticmethod(softmax)


@dataclasses.dataclass(frozen=True)
class LogSoftmax(_SoftmaxLike):
    r"""``y_i = x_i - log(sum_j exp(x_j))`` along ``dim``.

    Matches ``torch.nn.LogSoftmax(dim)``.

    Args:
      dim: the axis to normalize along (``axis=`` is accepted as another spelling), or
        ``None`` for torch's legacy implicit choice (axis 0 for inputs of rank 0, 1 or 3,
        axis 1 otherwise). Default ``-1``, the last axis (torch's default is ``None``).

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> LogSoftmax(axis=0).apply({}, jnp.zeros(2))
      Array([-0.6931472, -0.6931472], dtype=float32)
    """

    formula = staticmethod(log_softmax)


@dataclasses.dataclass(frozen=True)
class Softmin(_AlongAxis):
    r"""``softmax(-x)`` along ``dim``: ``y_i = exp(-x_i) / sum_j exp(-x_j)``.

    Matches ``torch.nn.Softmin(dim)``. ``dim=None`` follows torch's legacy implicit
    choice exactly (``torch.nn.functional._get_softmax_dim``): axis 0 for inputs of rank
    0, 1 or 3, axis 1 for every other rank. Prefer an explicit ``dim``.

    Args:
      dim: the axis to normalize along, or ``None`` for the implicit choice. Default
        ``None``.

    Shape:
      any floating-point input; output the same shape and dtype.

    Example:
      >>> Softmin().apply({}, jnp.zeros((2, 4))).sum(axis=1)  # rank 2: dim 1
      Array([1., 1.], dtype=float32)
    """

    dim: int | None = None

    def __post_init__(self):
        if self.dim is not None:
            check_int("Softmin", "dim", self.dim, minimum=-(2**31))

    def axis_for(self, ndim: int) -> int:
        """The axis normalized for an input of rank ``ndim``."""
        if self.dim is not None:
            return self.dim
        return _implicit_axis(ndim)

    def function(self, x):
        axis = self.axis_for(jnp.ndim(x))
        _need_axis("Softmin", x, axis, "dim")
        if jnp.ndim(x) == 0:
            return softmin(jnp.reshape(x, (1,)), 0)[0]
        return softmin(x, axis)


@dataclasses.dataclass(frozen=True)
class Softmax2d(_AlongAxis):
    r"""Softmax over the channels at every spatial position: ``softmax(x)`` along axis -3.

    Matches ``torch.nn.Softmax2d``.

    Shape:
      input ``(N, C, H, W)`` or ``(C, H, W)``; output the same shape and dtype.

    Example:
      >>> Softmax2d().apply({}, jnp.zeros((1, 4, 2, 2)))[0, :, 0, 0]
      Array([0.25, 0.25, 0.25, 0.25], dtype=float32)
    """

    def function(self, x):
        need_ndim("Softmax2d", x, (3, 4), "(C, H, W) or (N, C, H, W)")
        return softmax(x, -3)
