r"""Padding of the last 1, 2 or 3 axes: ``ZeroPadNd``, ``ConstantPadNd``,
``ReflectionPadNd``, ``ReplicationPadNd`` and ``CircularPadNd`` for ``N`` = 1, 2, 3.

``padding`` is an int (every side) or a tuple in torch's order, last axis first:
``(left, right)``, ``(left, right, top, bottom)``, ``(left, right, top, bottom, front,
back)``. A negative entry crops that side, as torch does for every mode.

Per padded axis of length ``n`` with sides ``(lo, hi)`` the output has ``n + lo + hi``
entries; what fills the new ones, and what torch refuses (a ``LayerError`` here):

- constant (``ZeroPadNd``, ``ConstantPadNd``): ``value``. Any input of at least ``N``
  axes; the output may be empty, not negative.
- reflection: ``x[1], x[2], ...`` mirrored about the edge (the edge not repeated);
  each side needs ``lo < n`` and ``hi < n``, the output at least one entry. A crop on
  one side does not change what the other side reflects.
- replication: the edge entry repeated; the output at least one entry.
- circular: the entries from the other end (``x[-lo:]`` on the left); crops apply first,
  then each side wraps the cropped axis at most once (``lo, hi <= n + crops``).

The reflection, replication and circular layers take ``(N, C, *spatial)`` or unbatched
``(C, *spatial)`` inputs; reflection and replication need every axis but the batch axis
non-empty, as torch. Gradients are torch's: each output's gradient goes to the entry it
copies (summed where several copy one entry); a cropped entry gets zero.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from purelayers.layers._checks import LayerError, config_error, need_representable
from purelayers.layers._spatial import check_rank, is_int
from purelayers.layers.core import Layer, Params

__all__ = [
    "CircularPad1d",
    "CircularPad2d",
    "CircularPad3d",
    "ConstantPad1d",
    "ConstantPad2d",
    "ConstantPad3d",
    "ReflectionPad1d",
    "ReflectionPad2d",
    "ReflectionPad3d",
    "ReplicationPad1d",
    "ReplicationPad2d",
    "ReplicationPad3d",
    "ZeroPad1d",
    "ZeroPad2d",
    "ZeroPad3d",
]

_SIDES = ("(left, right)", "(left, right, top, bottom)", "(left, right, top, bottom, front, back)")


def _pads(layer: str, padding: Any, nd: int) -> tuple[int, ...]:
    """``padding`` as ``2 * nd`` ints in torch's order (last axis first)."""
    values = (padding,) * (2 * nd) if is_int(padding) else padding
    ok = isinstance(values, (tuple, list)) and len(values) == 2 * nd
    if not (ok and all(is_int(v) for v in values)):
        rule = f"an int or a tuple of {2 * nd} ints {_SIDES[nd - 1]}"
        raise config_error(layer, "padding", rule, padding)
    return tuple(int(v) for v in values)


def _per_axis(pads: tuple[int, ...], nd: int) -> list[tuple[int, int]]:
    """``(lo, hi)`` for each of the last ``nd`` axes, first axis first."""
    return [(pads[2 * i], pads[2 * i + 1]) for i in reversed(range(nd))]


@dataclasses.dataclass(frozen=True)
class _PadNd(Layer):
    """Shared checks and padding of every pad layer."""

    _nd: ClassVar[int] = 1
    _mode: ClassVar[str] = "constant"

    padding: int | tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "padding", _pads(type(self).__name__, self.padding, self._nd))

    @property
    def _value(self) -> float:
        return 0.0

    def _check(self, shape: tuple[int, ...]) -> None:
        name, nd = type(self).__name__, self._nd
        if self._mode == "constant":
            if len(shape) < nd:
                raise LayerError(
                    name, "input rank", f"at least {nd}", f"{len(shape)} (x.shape == {shape})"
                )
        else:
            check_rank(name, shape, nd)
        if self._mode in ("reflect", "replicate"):
            first = 1 if len(shape) == nd + 2 else 0
            empty = [a for a, n in enumerate(shape) if a >= first and n == 0]
            if empty:
                raise LayerError(
                    name,
                    f"input axis {empty[0]} length",
                    "at least 1 (only the batch axis may be empty, as in torch)",
                    f"0 (x.shape == {shape})",
                )
        outs = [
            self._check_axis(name, len(shape) - nd + i, n, lo, hi, shape)
            for i, (n, (lo, hi)) in enumerate(
                zip(shape[-nd:], _per_axis(self.padding, nd), strict=True)
            )
        ]
        if self._mode in ("reflect", "replicate") and not any(outs):
            raise LayerError(
                name, "output lengths of the padded axes", "at least one >= 1 (as torch)",
                tuple(outs), f"x.shape == {shape}, padding={self.padding}",
            )  # fmt: skip

    def _check_axis(self, name: str, axis: int, n: int, lo: int, hi: int, shape) -> int:
        """The padded length of axis ``axis``; a ``LayerError`` where torch refuses it."""
        where = f"padding ({lo}, {hi}) of axis {axis}"
        out, kept = n + lo + hi, n + min(lo, 0) + min(hi, 0)
        if self._mode == "reflect" and max(lo, hi) >= n:
            raise LayerError(
                name, f"{where}: each side", f"< {n} (the axis length, as torch)", max(lo, hi),
                f"x.shape == {shape}; reflection cannot reach past the other edge",
            )  # fmt: skip
        if self._mode in ("constant", "circular") and kept < 0:
            raise LayerError(
                name, f"{where}: the length left after cropping", ">= 0", kept,
                f"x.shape == {shape}",
            )  # fmt: skip
        if self._mode == "circular" and max(lo, hi) > kept:
            raise LayerError(
                name, f"{where}: each side", f"<= {kept} (the axis length after cropping)",
                max(lo, hi), f"x.shape == {shape}; the padding may wrap around at most once",
            )  # fmt: skip
        if out < 0:
            raise LayerError(name, f"{where}: output length", ">= 0", out, f"x.shape == {shape}")
        return out

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        x = jnp.asarray(x)
        self._check(tuple(x.shape))
        need_representable(type(self).__name__, "value", self._value, x)
        return _pad(x, _per_axis(self.padding, self._nd), self._mode, self._value)


def _pad(x: jax.Array, pads: list[tuple[int, int]], mode: str, value: Any = 0) -> jax.Array:
    """``x`` with its last ``len(pads)`` axes padded (negative sides cropped) in ``mode``
    (``"constant"``, ``"reflect"``, ``"replicate"``, ``"circular"``), as torch's ``F.pad``."""
    lead = [(0, 0)] * (x.ndim - len(pads))
    if mode == "constant":
        fill = jnp.asarray(value).astype(x.dtype)
        return lax.pad(x, fill, [(lo, hi, 0) for lo, hi in lead + pads])
    grow = lead + [(max(lo, 0), max(hi, 0)) for lo, hi in pads]
    crop = [(min(lo, 0), min(hi, 0), 0) for lo, hi in lead + pads]
    zero = jnp.zeros((), x.dtype)
    if mode == "circular":  # torch crops first, then wraps the cropped axis
        return jnp.pad(lax.pad(x, zero, crop), grow, mode="wrap")
    grown = jnp.pad(x, grow, mode="reflect" if mode == "reflect" else "edge")
    return lax.pad(grown, zero, crop)


@dataclasses.dataclass(frozen=True)
class _ConstantPadNd(_PadNd):
    value: float

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.value, (int, float, np.integer, np.floating)):
            raise config_error(type(self).__name__, "value", "a number", self.value)

    @property
    def _value(self) -> float:
        return self.value


_ANY = ("floating", "integer", "bool", "complex")
_NUMERIC = ("floating", "integer")


@dataclasses.dataclass(frozen=True)
class ZeroPad1d(_PadNd):
    r"""Pads the last axis with zeros: ``y[..., left + i] = x[..., i]``, ``0`` elsewhere.

    Matches ``torch.nn.ZeroPad1d(padding)``.

    Args:
      padding: an int, or ``(left, right)``; negative entries crop.

    Shape:
      input ``(..., W)`` (at least one axis); output ``(..., W + left + right)``.

    Parameters: none.

    Example:
      >>> ZeroPad1d((1, 2)).apply({}, jnp.ones((1, 2))).tolist()
      [[0.0, 1.0, 1.0, 0.0, 0.0]]
    """

    _nd: ClassVar[int] = 1
    accepts: ClassVar[tuple[str, ...]] = _ANY


@dataclasses.dataclass(frozen=True)
class ZeroPad2d(_PadNd):
    r"""Pads the last two axes with zeros: ``y[..., left + i] = x[..., i]``, ``0`` elsewhere.

    Matches ``torch.nn.ZeroPad2d(padding)``.

    Args:
      padding: an int, or ``(left, right, top, bottom)``; negative entries crop.

    Shape:
      input ``(..., H, W)``; output ``(..., H + top + bottom, W + left + right)``.

    Parameters: none.

    Example:
      >>> ZeroPad2d((1, 0, 0, 1)).apply({}, jnp.ones((1, 1))).tolist()
      [[0.0, 1.0], [0.0, 0.0]]
    """

    _nd: ClassVar[int] = 2
    accepts: ClassVar[tuple[str, ...]] = _ANY


@dataclasses.dataclass(frozen=True)
class ZeroPad3d(_PadNd):
    r"""Pads the last three axes with zeros: ``y[..., left + i] = x[..., i]``, ``0`` elsewhere.

    Matches ``torch.nn.ZeroPad3d(padding)``.

    Args:
      padding: an int, or ``(left, right, top, bottom, front, back)``; negative entries
        crop.

    Shape:
      input ``(..., D, H, W)``; output ``(..., D + front + back, H + top + bottom,
      W + left + right)``.

    Parameters: none.

    Example:
      >>> ZeroPad3d(1).apply({}, jnp.ones((2, 1, 1, 1))).shape
      (2, 3, 3, 3)
    """

    _nd: ClassVar[int] = 3
    accepts: ClassVar[tuple[str, ...]] = _ANY


@dataclasses.dataclass(frozen=True)
class ConstantPad1d(_ConstantPadNd):
    r"""Pads the last axis with ``value``: ``y[..., left + i] = x[..., i]``, else ``value``.

    Matches ``torch.nn.ConstantPad1d(padding, value)``.

    Args:
      padding: an int, or ``(left, right)``; negative entries crop.
      value: the fill, cast to the input's dtype (``1.7`` fills an integer input with
        ``1``, as torch).

    Shape:
      input ``(..., W)``; output ``(..., W + left + right)``.

    Parameters: none.

    Example:
      >>> ConstantPad1d((-1, 1), 7.0).apply({}, jnp.array([1.0, 2.0])).tolist()
      [2.0, 7.0]
    """

    _nd: ClassVar[int] = 1
    accepts: ClassVar[tuple[str, ...]] = _ANY


@dataclasses.dataclass(frozen=True)
class ConstantPad2d(_ConstantPadNd):
    r"""Pads the last two axes with ``value``: ``y[..., left + i] = x[..., i]``, else ``value``.

    Matches ``torch.nn.ConstantPad2d(padding, value)``.

    Args:
      padding: an int, or ``(left, right, top, bottom)``; negative entries crop.
      value: the fill, cast to the input's dtype.

    Shape:
      input ``(..., H, W)``; output ``(..., H + top + bottom, W + left + right)``.

    Parameters: none.

    Example:
      >>> ConstantPad2d((0, 1, 0, 0), 3.0).apply({}, jnp.ones((1, 1))).tolist()
      [[1.0, 3.0]]
    """

    _nd: ClassVar[int] = 2
    accepts: ClassVar[tuple[str, ...]] = _ANY


@dataclasses.dataclass(frozen=True)
class ConstantPad3d(_ConstantPadNd):
    r"""Pads the last three axes with ``value``: ``y[..., left + i] = x[..., i]``, else ``value``.

    Matches ``torch.nn.ConstantPad3d(padding, value)``.

    Args:
      padding: an int, or ``(left, right, top, bottom, front, back)``; negative entries
        crop.
      value: the fill, cast to the input's dtype.

    Shape:
      input ``(..., D, H, W)``; output ``(..., D + front + back, H + top + bottom,
      W + left + right)``.

    Parameters: none.

    Example:
      >>> ConstantPad3d((1, 0, 0, 0, 0, 0), -1.0).apply({}, jnp.ones((1, 1, 1))).tolist()
      [[[-1.0, 1.0]]]
    """

    _nd: ClassVar[int] = 3
    accepts: ClassVar[tuple[str, ...]] = _ANY


@dataclasses.dataclass(frozen=True)
class ReflectionPad1d(_PadNd):
    r"""Pads the last axis by reflection: ``x[-i] = x[i]``, ``x[n - 1 + i] = x[n - 1 - i]``.

    Matches ``torch.nn.ReflectionPad1d(padding)``.

    ``[a, b, c]`` padded by ``(2, 1)`` is ``[c, b, a, b, c, b]``.

    Args:
      padding: an int, or ``(left, right)``; each side below the axis length; negative
        entries crop.

    Shape:
      input ``(N, C, W)`` or ``(C, W)``; output ``(N, C, W + left + right)``.

    Parameters: none.

    Example:
      >>> ReflectionPad1d((2, 1)).apply({}, jnp.array([[1.0, 2.0, 3.0]])).tolist()
      [[3.0, 2.0, 1.0, 2.0, 3.0, 2.0]]
    """

    _nd: ClassVar[int] = 1
    _mode: ClassVar[str] = "reflect"
    accepts: ClassVar[tuple[str, ...]] = _NUMERIC


@dataclasses.dataclass(frozen=True)
class ReflectionPad2d(_PadNd):
    r"""Pads the last two axes by reflection: ``x[-i] = x[i]``, ``x[n - 1 + i] = x[n - 1 - i]``.

    Matches ``torch.nn.ReflectionPad2d(padding)``.

    Args:
      padding: an int, or ``(left, right, top, bottom)``; each side below its axis's
        length; negative entries crop.

    Shape:
      input ``(N, C, H, W)`` or ``(C, H, W)``; output ``(N, C, H + top + bottom,
      W + left + right)``.

    Parameters: none.

    Example:
      >>> ReflectionPad2d((1, 0, 0, 0)).apply({}, jnp.array([[[1.0, 2.0]]])).tolist()
      [[[2.0, 1.0, 2.0]]]
    """

    _nd: ClassVar[int] = 2
    _mode: ClassVar[str] = "reflect"
    accepts: ClassVar[tuple[str, ...]] = _NUMERIC


@dataclasses.dataclass(frozen=True)
class ReflectionPad3d(_PadNd):
    r"""Pads the last three axes by reflection: ``x[-i] = x[i]``, ``x[n - 1 + i] = x[n - 1 - i]``.

    Matches ``torch.nn.ReflectionPad3d(padding)``.

    Args:
      padding: an int, or ``(left, right, top, bottom, front, back)``; each side below
        its axis's length; negative entries crop.

    Shape:
      input ``(N, C, D, H, W)`` or ``(C, D, H, W)``; output ``(N, C, D + front + back,
      H + top + bottom, W + left + right)``.

    Parameters: none.

    Example:
      >>> ReflectionPad3d(1).apply({}, jnp.ones((1, 2, 2, 2))).shape
      (1, 4, 4, 4)
    """

    _nd: ClassVar[int] = 3
    _mode: ClassVar[str] = "reflect"
    accepts: ClassVar[tuple[str, ...]] = _NUMERIC


@dataclasses.dataclass(frozen=True)
class ReplicationPad1d(_PadNd):
    r"""Pads the last axis by replication: ``x[-i] = x[0]``, ``x[n - 1 + i] = x[n - 1]``.

    Matches ``torch.nn.ReplicationPad1d(padding)``.

    Args:
      padding: an int, or ``(left, right)``; negative entries crop.

    Shape:
      input ``(N, C, W)`` or ``(C, W)``; output ``(N, C, W + left + right)``.

    Parameters: none.

    Example:
      >>> ReplicationPad1d((1, 2)).apply({}, jnp.array([[1.0, 2.0]])).tolist()
      [[1.0, 1.0, 2.0, 2.0, 2.0]]
    """

    _nd: ClassVar[int] = 1
    _mode: ClassVar[str] = "replicate"
    accepts: ClassVar[tuple[str, ...]] = _NUMERIC


@dataclasses.dataclass(frozen=True)
class ReplicationPad2d(_PadNd):
    r"""Pads the last two axes by replication: ``x[-i] = x[0]``, ``x[n - 1 + i] = x[n - 1]``.

    Matches ``torch.nn.ReplicationPad2d(padding)``.

    Args:
      padding: an int, or ``(left, right, top, bottom)``; negative entries crop.

    Shape:
      input ``(N, C, H, W)`` or ``(C, H, W)``; output ``(N, C, H + top + bottom,
      W + left + right)``.

    Parameters: none.

    Example:
      >>> ReplicationPad2d((0, 0, 1, 0)).apply({}, jnp.array([[[1.0, 2.0]]])).tolist()
      [[[1.0, 2.0], [1.0, 2.0]]]
    """

    _nd: ClassVar[int] = 2
    _mode: ClassVar[str] = "replicate"
    accepts: ClassVar[tuple[str, ...]] = _NUMERIC


@dataclasses.dataclass(frozen=True)
class ReplicationPad3d(_PadNd):
    r"""Pads the last three axes by replication: ``x[-i] = x[0]``, ``x[n - 1 + i] = x[n - 1]``.

    Matches ``torch.nn.ReplicationPad3d(padding)``.

    Args:
      padding: an int, or ``(left, right, top, bottom, front, back)``; negative entries
        crop.

    Shape:
      input ``(N, C, D, H, W)`` or ``(C, D, H, W)``; output ``(N, C, D + front + back,
      H + top + bottom, W + left + right)``.

    Parameters: none.

    Example:
      >>> ReplicationPad3d(2).apply({}, jnp.ones((1, 1, 1, 1))).shape
      (1, 5, 5, 5)
    """

    _nd: ClassVar[int] = 3
    _mode: ClassVar[str] = "replicate"
    accepts: ClassVar[tuple[str, ...]] = _NUMERIC


@dataclasses.dataclass(frozen=True)
class CircularPad1d(_PadNd):
    r"""Pads the last axis circularly: ``x[-i] = x[n - i]``, ``x[n - 1 + i] = x[i - 1]``.

    Matches ``torch.nn.CircularPad1d(padding)``.

    ``[a, b, c]`` padded by ``(2, 1)`` is ``[b, c, a, b, c, a]``.

    Args:
      padding: an int, or ``(left, right)``; each side at most the (cropped) axis
        length; negative entries crop first.

    Shape:
      input ``(N, C, W)`` or ``(C, W)``; output ``(N, C, W + left + right)``.

    Parameters: none.

    Example:
      >>> CircularPad1d((2, 1)).apply({}, jnp.array([[1.0, 2.0, 3.0]])).tolist()
      [[2.0, 3.0, 1.0, 2.0, 3.0, 1.0]]
    """

    _nd: ClassVar[int] = 1
    _mode: ClassVar[str] = "circular"
    accepts: ClassVar[tuple[str, ...]] = _ANY


@dataclasses.dataclass(frozen=True)
class CircularPad2d(_PadNd):
    r"""Pads the last two axes circularly: ``x[-i] = x[n - i]``, ``x[n - 1 + i] = x[i - 1]``.

    Matches ``torch.nn.CircularPad2d(padding)``.

    Args:
      padding: an int, or ``(left, right, top, bottom)``; each side at most its
        (cropped) axis's length; negative entries crop first.

    Shape:
      input ``(N, C, H, W)`` or ``(C, H, W)``; output ``(N, C, H + top + bottom,
      W + left + right)``.

    Parameters: none.

    Example:
      >>> CircularPad2d((0, 1, 1, 0)).apply({}, jnp.array([[[1.0, 2.0]]])).tolist()
      [[[1.0, 2.0, 1.0], [1.0, 2.0, 1.0]]]
    """

    _nd: ClassVar[int] = 2
    _mode: ClassVar[str] = "circular"
    accepts: ClassVar[tuple[str, ...]] = _ANY


@dataclasses.dataclass(frozen=True)
class CircularPad3d(_PadNd):
    r"""Pads the last three axes circularly: ``x[-i] = x[n - i]``, ``x[n - 1 + i] = x[i - 1]``.

    Matches ``torch.nn.CircularPad3d(padding)``.

    Args:
      padding: an int, or ``(left, right, top, bottom, front, back)``; each side at most
        its (cropped) axis's length; negative entries crop first.

    Shape:
      input ``(N, C, D, H, W)`` or ``(C, D, H, W)``; output ``(N, C, D + front + back,
      H + top + bottom, W + left + right)``.

    Parameters: none.

    Example:
      >>> CircularPad3d(1).apply({}, jnp.ones((1, 1, 1, 1))).shape
      (1, 3, 3, 3)
    """

    _nd: ClassVar[int] = 3
    _mode: ClassVar[str] = "circular"
    accepts: ClassVar[tuple[str, ...]] = _ANY
