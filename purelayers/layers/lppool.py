r"""Power-average pooling: ``LPPool1d``, ``LPPool2d`` and ``LPPool3d``.

Over each window of ``K`` elements (``K`` the product of ``kernel_size``), torch's
formula::

    m = avg_pool(x ** p)                   # windows of kernel_size, no padding
    y = (sign(m) * relu(|m|) * K) ** (1 / p)

which is ``(sum x^p) ** (1/p)`` over full windows (``p = 1``: the sum; large ``p``:
nearly the max). A ``ceil_mode`` window that hangs past the input averages the elements
it holds, then is scaled by the full ``K``, as torch. Negative ``x`` with a non-integer
``p``, or a negative power sum with an even root, give NaN, as torch. At a window of
zeros the gradient is ``0`` (torch's ``relu`` passes none at 0); in a window whose power
sum is NaN (a negative element with a non-integer ``p``) it is NaN for every element, as
torch's (its ``relu`` passes a NaN on). Inputs are floating point (torch averages
integer inputs with integer division; cast first).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.layers._checks import config_error
from purelayers.layers._spatial import batched, need_nonempty, unbatched
from purelayers.layers.core import Layer, Params
from purelayers.layers.pool import AvgPool1d, AvgPool2d, AvgPool3d

__all__ = ["LPPool1d", "LPPool2d", "LPPool3d"]

_AVG = {1: AvgPool1d, 2: AvgPool2d, 3: AvgPool3d}


@dataclasses.dataclass(frozen=True)
class _LPPoolNd(Layer):
    accepts: ClassVar[tuple[str, ...]] = ("floating",)
    _nd: ClassVar[int] = 2

    norm_type: float
    kernel_size: int | tuple[int, ...]
    stride: int | tuple[int, ...] | None = None
    ceil_mode: bool = False

    def __post_init__(self):
        name = type(self).__name__
        p = self.norm_type
        ok = isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p)
        if not ok or p == 0:
            raise config_error(name, "norm_type", "a nonzero finite number", p)
        try:  # the window settings are AvgPool's, checked there
            avg = self._avg()
        except ValueError as e:
            raise ValueError(str(e).replace(_AVG[self._nd].__name__, name, 1)) from None
        object.__setattr__(self, "kernel_size", avg.kernel_size)
        object.__setattr__(self, "stride", avg.stride)

    def _avg(self) -> Any:
        return _AVG[self._nd](self.kernel_size, self.stride, ceil_mode=self.ceil_mode)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        name = type(self).__name__
        x, added = batched(name, x, self._nd)
        need_nonempty(name, x)
        p = float(self.norm_type)
        m = self._avg()._average(x**p, name)
        # torch's relu, ``0 if a <= 0 else a``: its derivative passes a NaN on (``jax.nn.relu``'s
        # is 0 there), so a window with a NaN power sum has a NaN gradient throughout
        a = jnp.abs(m)
        z = jnp.sign(m) * jnp.where(a <= 0, jnp.zeros_like(a), a) * math.prod(self.kernel_size)
        # the root's derivative at a window of zeros is 0 in forward mode as in reverse
        # (where ``z ** (1/p)``'s own rule gives inf * 0 = NaN); its value stays z ** (1/p)
        safe = jnp.where(z == 0, jnp.ones_like(z), z)
        y = jnp.where(z == 0, jax.lax.stop_gradient(z ** (1.0 / p)), safe ** (1.0 / p))
        return unbatched(y, added)


@dataclasses.dataclass(frozen=True)
class LPPool1d(_LPPoolNd):
    r"""Power-average pooling of sequences: ``y = (sum over each window of x ** p) ** (1 / p)``.

    Matches ``torch.nn.LPPool1d``; ``ceil_mode``'s partial windows and NaN rules are in
    the module docstring.

    Args:
      norm_type: the power ``p``, a nonzero finite number.
      kernel_size: window size, an int.
      stride: window step, as ``kernel_size``. Default ``None`` (``kernel_size``).
      ceil_mode: round the output size up instead of down. Default ``False``.

    Shape:
      input ``(N, C, L)`` or without ``N``; output ``(N, C, L_out)``, per axis
      ``out = floor((L - kernel_size) / stride) + 1``.

    Parameters: none.

    Example:
      >>> LPPool1d(2, 2).apply({}, jnp.array([[[3.0, 4.0, 1.0, 0.0]]])).tolist()
      [[[5.0, 1.0]]]
    """

    _nd: ClassVar[int] = 1


@dataclasses.dataclass(frozen=True)
class LPPool2d(_LPPoolNd):
    r"""Power-average pooling of images: ``y = (sum over each window of x ** p) ** (1 / p)``.

    Matches ``torch.nn.LPPool2d``; ``ceil_mode``'s partial windows and NaN rules are in
    the module docstring.

    Args:
      norm_type: the power ``p``, a nonzero finite number.
      kernel_size: window size, an int or a pair ``(kH, kW)``.
      stride: window step, as ``kernel_size``. Default ``None`` (``kernel_size``).
      ceil_mode: round the output size up instead of down. Default ``False``.

    Shape:
      input ``(N, C, H, W)`` or without ``N``; output ``(N, C, H_out, W_out)``, per axis
      ``out = floor((L - kernel_size) / stride) + 1``.

    Parameters: none.

    Example:
      >>> LPPool2d(1, 2).apply({}, jnp.ones((1, 4, 4))).tolist()  # p = 1: window sums
      [[[4.0, 4.0], [4.0, 4.0]]]
    """

    _nd: ClassVar[int] = 2


@dataclasses.dataclass(frozen=True)
class LPPool3d(_LPPoolNd):
    r"""Power-average pooling of volumes: ``y = (sum over each window of x ** p) ** (1 / p)``.

    Matches ``torch.nn.LPPool3d``; ``ceil_mode``'s partial windows and NaN rules are in
    the module docstring.

    Args:
      norm_type: the power ``p``, a nonzero finite number.
      kernel_size: window size, an int or a triple ``(kD, kH, kW)``.
      stride: window step, as ``kernel_size``. Default ``None`` (``kernel_size``).
      ceil_mode: round the output size up instead of down. Default ``False``.

    Shape:
      input ``(N, C, D, H, W)`` or without ``N``; output ``(N, C, D_out, H_out, W_out)``, per axis
      ``out = floor((L - kernel_size) / stride) + 1``.

    Parameters: none.

    Example:
      >>> LPPool3d(2, (1, 2, 2)).apply({}, jnp.ones((2, 3, 2, 4, 4))).shape
      (2, 3, 2, 2, 2)
    """

    _nd: ClassVar[int] = 3
