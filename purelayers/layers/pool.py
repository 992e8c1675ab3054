r"""Pooling over the spatial axes of channels-first inputs: ``MaxPool1d/2d/3d``,
``AvgPool1d/2d/3d``, ``AdaptiveAvgPool1d/2d/3d`` and ``AdaptiveMaxPool1d/2d/3d``.

Fixed-window pools whose windows tile the input (``stride == kernel_size``, no
dilation, the common ``MaxPool2d(2)``) run as a reshape and, for the max, one variadic
reduction over the stacked window taps that also yields each window's winning tap (its
derivative reads the winners, not the input), or a sum over the window axes; other max
pools as a running max over one strided slice per
window tap (JAX's ``reduce_window`` max sends the gradient of a NaN window elsewhere than
torch), other average pools on ``lax.reduce_window``. The math is ``purelayers.functional.pooling``. The variants only fix the number of spatial axes. None has parameters. Input ``(N, C, *L)`` or unbatched ``(C, *L)``.

Window pools (``MaxPoolNd``, ``AvgPoolNd``), as torch:

Args:
  kernel_size: window size, an int or one int per spatial axis.
  stride: window step; ``None`` (the default) means ``kernel_size``.
  padding: implicit padding on both sides, at most ``kernel_size // 2`` per axis (as
    torch). ``MaxPool`` pads with ``-inf``, ``AvgPool`` with zeros. Default ``0``.
  dilation (``MaxPool`` only): spacing between window taps. Default ``1``.
  ceil_mode: round the output size up instead of down, adding windows that hang over
    the high edge; as in torch, a window that would start inside the right padding
    (at or past the last input element) is dropped. Default ``False``.
  count_include_pad (``AvgPool`` only): count the explicit ``padding`` in the divisor.
    The part of a ``ceil_mode`` window that hangs past the padding is never counted
    (torch's rule). Default ``True``.
  divisor_override (``AvgPool2d``/``AvgPool3d`` only): a nonzero integer dividing every
    window's sum instead of its count. Default ``None``.
  return_indices (``MaxPool`` only): also return the indices of the selected elements,
    ``(y, indices)`` (see below). Default ``False``.

Per spatial axis the output size is ``floor_or_ceil((L + 2 * padding - dilation *
(kernel_size - 1) - 1) / stride) + 1``, minus one when ``ceil_mode``'s last window would
start at or past ``L + padding``.

Gradients match torch: ``MaxPool`` sends each output's gradient to the one element it
selected, as torch's CPU kernel: among equal maxima in a window the first in row-major
order, among NaNs the last. ``AvgPool`` spreads it evenly over the window's counted
elements.

Indices (``return_indices=True``, on the max pools): per output element, the flat
position of the selected element within its channel's unpadded input (``h * W + w`` in
2-d, ``(d * H + h) * W + w`` in 3-d), as torch returns for ``MaxUnpoolNd``; a window
holding only ``-inf`` (or padding) gives its first in-bounds element. The dtype is
``int64`` where JAX's 64-bit mode is on, else ``int32`` (torch: always ``int64``).

Adaptive pools (``AdaptiveAvgPoolNd``, ``AdaptiveMaxPoolNd``) take ``output_size`` (an
int, or one int or ``None`` per spatial axis, ``None`` keeping that axis) and reduce
output cell ``i`` of an axis of length ``L`` over ``[floor(i * L / out),
ceil((i + 1) * L / out))``, torch's windows, for any sizes (not only divisors). Both are
separable, so each axis is pooled in turn with one gather; the max keeps torch's
element (first maximum, last NaN) for its gradient. ``AdaptiveMaxPoolNd`` also takes
``return_indices`` (default ``False``), with indices as above.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import purelayers.functional as F
from purelayers.layers._checks import LayerError
from purelayers.layers._maxindex import lowest as _lowest
from purelayers.layers._maxindex import max_by_table, select, window_tables
from purelayers.layers._spatial import batched, is_int, need_nonempty, ntuple, unbatched
from purelayers.layers.core import Layer, Params

__all__ = [
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
]


def _output_size(layer: str, n: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """torch's ``pooling_output_shape``: ceil mode never starts a window past ``n + p``."""
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    if ceil and (out - 1) * s >= n + p:
        out -= 1
    if out < 1:
        raise LayerError(
            layer,
            "output size per spatial axis",
            ">= 1",
            out,
            f"an input axis of length {n} is too short for kernel_size={k} "
            f"(dilation {d}, padding {p})",
        )
    return out


@dataclasses.dataclass(frozen=True)
class _PoolNd(Layer):
    """Shared configuration and windowing of ``MaxPoolNd`` and ``AvgPoolNd``."""

    _nd: ClassVar[int] = 2

    kernel_size: int | tuple[int, ...]
    stride: int | tuple[int, ...] | None = None
    padding: int | tuple[int, ...] = 0
    # ``ceil_mode`` is each subclass's field, where torch puts it among the positional
    # arguments (after ``dilation`` and ``return_indices`` in a max pool).

    def __post_init__(self):
        name, nd = type(self).__name__, self._nd
        k = ntuple(name, "kernel_size", self.kernel_size, nd, minimum=1)
        object.__setattr__(self, "kernel_size", k)
        stride = k if self.stride is None else self.stride
        object.__setattr__(self, "stride", ntuple(name, "stride", stride, nd, minimum=1))
        p = ntuple(name, "padding", self.padding, nd, minimum=0)
        object.__setattr__(self, "padding", p)
        if hasattr(self, "dilation"):
            d = ntuple(name, "dilation", self.dilation, nd, minimum=1)
            object.__setattr__(self, "dilation", d)
        if any(p_ > k_ // 2 for p_, k_ in zip(p, k, strict=True)):
            half = tuple(k_ // 2 for k_ in k)
            raise ValueError(
                f"{name}: padding must be at most half of kernel_size (kernel_size // 2 = "
                f"{half}), got {self.padding}"
            )

    @property
    def _dilation(self) -> tuple[int, ...]:
        return getattr(self, "dilation", (1,) * self._nd)

    def _windows(
        self, x: jax.Array, name: str | None = None
    ) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
        """Output sizes and the ``(low, high)`` pads (the high one may crop) giving them;
        errors name ``name`` (default: this layer's class)."""
        name, nd = name or type(self).__name__, self._nd
        outs, pads = [], []
        for n, k, s, p, d in zip(
            x.shape[-nd:], self.kernel_size, self.stride, self.padding, self._dilation, strict=True
        ):
            out = _output_size(name, n, k, s, p, d, self.ceil_mode)
            outs.append(out)
            pads.append((p, (out - 1) * s + d * (k - 1) + 1 - n - p))
        return tuple(outs), tuple(pads)

    def _reduce(self, x: jax.Array, pads, init: Any, op: Any) -> jax.Array:
        """The windows' max (``op`` ``lax.max``) or sum (``lax.add``)."""
        settings = (self.kernel_size, self.stride, pads, self._dilation)
        return F.max_pool(x, *settings) if op is lax.max else F.avg_pool_sum(x, *settings)


@dataclasses.dataclass(frozen=True)
class _MaxPoolNd(_PoolNd):
    accepts: ClassVar[tuple[str, ...]] = ("floating", "integer")
    dilation: int | tuple[int, ...] = 1
    return_indices: bool = False
    ceil_mode: bool = False

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        x, added = batched(type(self).__name__, x, self._nd)
        need_nonempty(type(self).__name__, x)
        outs, pads = self._windows(x)
        if not self.return_indices:
            return unbatched(self._reduce(x, pads, _lowest(x.dtype), lax.max), added)
        axes = []
        for n, k, s, p, d, out in zip(
            x.shape[2:], self.kernel_size, self.stride, self.padding, self._dilation, outs,
            strict=True,
        ):  # fmt: skip
            starts = np.arange(out) * s - p
            pos = starts[:, None] + np.arange(k)[None, :] * d
            first = starts + d * -(starts // d)  # torch: step a negative start by dilation
            axes.append((pos, (pos >= 0) & (pos < n), np.where(starts < 0, first, starts)))
        y, idx = max_by_table(x, self._nd, *window_tables(axes, x.shape[2:]))
        return unbatched(y, added), unbatched(idx, added)


@dataclasses.dataclass(frozen=True)
class _AvgPoolNd(_PoolNd):
    accepts: ClassVar[tuple[str, ...]] = ("floating",)  # torch's divides integers
    ceil_mode: bool = False
    count_include_pad: bool = True

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        x, added = batched(type(self).__name__, x, self._nd)
        need_nonempty(type(self).__name__, x)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(jnp.result_type(float))
        return unbatched(self._average(x), added)

    def _average(self, x: jax.Array, name: str | None = None) -> jax.Array:
        """The pooled means of the batched floating-point ``x``; errors name ``name``."""
        outs, pads = self._windows(x, name)
        total = self._reduce(x, pads, 0.0, lax.add)
        if getattr(self, "divisor_override", None) is not None:
            return total / jnp.asarray(self.divisor_override, x.dtype)
        divisor = np.ones((), np.float64)
        for n, k, s, p, out in zip(
            x.shape[2:], self.kernel_size, self.stride, self.padding, outs, strict=True
        ):
            divisor = np.multiply.outer(divisor, self._counts(n, k, s, p, out))
        return total / jnp.asarray(divisor.reshape((1, 1, *outs)), x.dtype)

    def _counts(self, n: int, k: int, s: int, p: int, out: int) -> np.ndarray:
        """Per-window divisor along one axis, as torch: the window clipped to ``n + p``,
        then (without ``count_include_pad``) to the input itself."""
        starts = np.arange(out) * s - p
        ends = np.minimum(starts + k, n + p)
        if self.count_include_pad:
            return ends - starts
        return np.minimum(ends, n) - np.maximum(starts, 0)


@dataclasses.dataclass(frozen=True)
class MaxPool1d(_MaxPoolNd):
    """Max over windows of sequences ``(N, C, L)``. Matches ``torch.nn.MaxPool1d``.

    Arguments, output size and gradient: see the module docstring
    (``purelayers.layers.pool``). ``MaxPool1d(2)`` on ``[[[1, 3, 2, 5, 4]]]`` gives
    ``[[[3, 5]]]`` (the trailing 4 falls outside every window); with ``ceil_mode=True``,
    ``[[[3, 5, 4]]]``.
    """

    _nd: ClassVar[int] = 1

    @property
    def accepts(self) -> tuple[str, ...]:  # type: ignore[override]
        # torch's 1-d kernel without indices takes no integers; with them it runs the 2-d one
        return ("floating", "integer") if self.return_indices else ("floating",)


@dataclasses.dataclass(frozen=True)
class MaxPool2d(_MaxPoolNd):
    """Max over windows of images ``(N, C, H, W)``. Matches ``torch.nn.MaxPool2d``.

    Arguments, output size, indices and gradient: see the module docstring
    (``purelayers.layers.pool``). ``MaxPool2d(2)`` halves ``H`` and ``W`` (rounding down).

    Example:
      >>> y, idx = MaxPool2d(2, return_indices=True).apply({}, jnp.arange(16.0).reshape(1, 4, 4))
      >>> y.tolist(), idx.tolist()
      ([[[5.0, 7.0], [13.0, 15.0]]], [[[5, 7], [13, 15]]])
    """

    _nd: ClassVar[int] = 2


@dataclasses.dataclass(frozen=True)
class MaxPool3d(_MaxPoolNd):
    """Max over windows of volumes ``(N, C, D, H, W)``. Matches ``torch.nn.MaxPool3d``.

    Arguments, output size, indices and gradient: see the module docstring
    (``purelayers.layers.pool``).
    """

    _nd: ClassVar[int] = 3


@dataclasses.dataclass(frozen=True)
class AvgPool1d(_AvgPoolNd):
    """Mean over windows of sequences ``(N, C, L)``. Matches ``torch.nn.AvgPool1d``.

    Arguments and divisor rules: see the module docstring (``purelayers.layers.pool``).
    ``AvgPool1d(3, stride=2, padding=1)`` on ``[[[1, 2, 3, 4]]]`` averages the windows
    ``[0, 1, 2]`` and ``[2, 3, 4]`` (the zeros are padding): ``[[[1, 3]]]``. With
    ``ceil_mode=True`` a third window ``[4, 0]`` starts at the last element and stops at
    the end of the padding, so its divisor is 2: ``[[[1, 3, 2]]]``.
    """

    _nd: ClassVar[int] = 1


@dataclasses.dataclass(frozen=True)
class _AvgPoolDivNd(_AvgPoolNd):
    divisor_override: int | None = None

    def __post_init__(self):
        super().__post_init__()
        d = self.divisor_override
        if d is not None and (not is_int(d) or d == 0):
            raise ValueError(
                f"{type(self).__name__}: divisor_override must be a nonzero integer or None, "
                f"got {d!r}"
            )


@dataclasses.dataclass(frozen=True)
class AvgPool2d(_AvgPoolDivNd):
    """Mean over windows of images ``(N, C, H, W)``. Matches ``torch.nn.AvgPool2d``.

    Arguments and divisor rules: see the module docstring (``purelayers.layers.pool``).
    ``AvgPool2d(2, divisor_override=1)`` sums each 2 x 2 window.
    """

    _nd: ClassVar[int] = 2


@dataclasses.dataclass(frozen=True)
class AvgPool3d(_AvgPoolDivNd):
    """Mean over windows of volumes ``(N, C, D, H, W)``. Matches ``torch.nn.AvgPool3d``.

    Arguments and divisor rules: see the module docstring (``purelayers.layers.pool``).
    """

    _nd: ClassVar[int] = 3


def _adaptive_windows(n: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """Gather indices ``[out, width]`` of torch's adaptive windows along an axis of
    length ``n``, and which of them are real (windows may differ in width)."""
    i = np.arange(out)
    starts = (i * n) // out
    ends = -((-(i + 1) * n) // out)
    width = int((ends - starts).max())
    idx = starts[:, None] + np.arange(width)[None, :]
    valid = idx < ends[:, None]
    return np.minimum(idx, n - 1), valid


def _adaptive_axis(x: jax.Array, axis: int, out: int, mode: str) -> jax.Array:
    n = x.shape[axis]
    if n == out:
        return x
    idx, valid = _adaptive_windows(n, out)
    width = idx.shape[1]
    g = jnp.take(x, jnp.asarray(idx.reshape(-1)), axis=axis)
    g = g.reshape((*x.shape[:axis], out, width, *x.shape[axis + 1 :]))
    tail = (1,) * (x.ndim - axis - 1)
    mask = jnp.asarray(valid.reshape((1,) * axis + (out, width) + tail))
    if mode == "avg":
        counts = valid.sum(axis=1).reshape((1,) * axis + (out,) + tail)
        return jnp.sum(jnp.where(mask, g, 0), axis=axis + 1) / jnp.asarray(counts, x.dtype)
    g = jnp.where(mask, g, jnp.asarray(_lowest(x.dtype), x.dtype))
    # torch's element (first maximum, last NaN; per axis in turn it is the row-major
    # one), so the gradient goes where torch sends it, not split among ties
    kept = jnp.expand_dims(select(jnp.moveaxis(g, axis + 1, -1)), axis + 1)
    return jnp.squeeze(jnp.take_along_axis(g, kept, axis=axis + 1), axis=axis + 1)


@dataclasses.dataclass(frozen=True)
class _AdaptivePoolNd(Layer):
    accepts: ClassVar[tuple[str, ...]] = ("floating",)
    _nd: ClassVar[int] = 2
    _mode: ClassVar[str] = "avg"

    output_size: int | tuple[int | None, ...] | None

    def __post_init__(self):
        name, nd = type(self).__name__, self._nd
        size = (
            (self.output_size,) * nd
            if not isinstance(self.output_size, Sequence)
            else self.output_size
        )
        ok = len(size) == nd and all(s is None or (is_int(s) and s >= 1) for s in size)
        if not ok:
            raise ValueError(
                f"{name}: output_size must be a positive integer or a tuple of {nd} positive "
                f"integers or None, got {self.output_size!r}"
            )
        object.__setattr__(self, "output_size", tuple(size))

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        x, added = batched(type(self).__name__, x, self._nd)
        if self._mode == "max" or self._nd == 3:  # torch's 3-d mean refuses empty channels
            need_nonempty(type(self).__name__, x)
        elif not (self._nd == 2 and self.output_size == (1, 1)):
            # torch's adaptive mean takes empty channels; its (1, 1) case is a plain mean
            # that takes empty axes too (NaN, as torch)
            need_nonempty(type(self).__name__, x, 2)
        if self._mode == "avg" and not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(jnp.result_type(float))
        for axis in reversed(range(2, x.ndim)):
            out = self.output_size[axis - 2]
            x = _adaptive_axis(x, axis, x.shape[axis] if out is None else out, self._mode)
        return unbatched(x, added)


@dataclasses.dataclass(frozen=True)
class _AdaptiveMaxPoolNd(_AdaptivePoolNd):
    _mode: ClassVar[str] = "max"

    return_indices: bool = False  # checked with every bool field (``Layer``)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        if not self.return_indices:
            return super().apply(params, x, key=key, train=train)
        x, added = batched(type(self).__name__, x, self._nd)
        need_nonempty(type(self).__name__, x)
        axes = []
        for n, out in zip(x.shape[2:], self.output_size, strict=True):
            idx, valid = _adaptive_windows(n, n if out is None else out)
            axes.append((idx, valid, idx[:, 0]))
        y, indices = max_by_table(x, self._nd, *window_tables(axes, x.shape[2:]))
        return unbatched(y, added), unbatched(indices, added)


@dataclasses.dataclass(frozen=True)
class AdaptiveAvgPool1d(_AdaptivePoolNd):
    """Mean over ``output_size`` adaptive windows of ``(N, C, L)``. Matches
    ``torch.nn.AdaptiveAvgPool1d``. Windows: see the module docstring."""

    _nd: ClassVar[int] = 1


@dataclasses.dataclass(frozen=True)
class AdaptiveAvgPool2d(_AdaptivePoolNd):
    """Mean over adaptive windows of ``(N, C, H, W)`` to ``output_size``. Matches
    ``torch.nn.AdaptiveAvgPool2d``; ``AdaptiveAvgPool2d(1)`` is global average pooling,
    ``(N, C, H, W)`` to ``(N, C, 1, 1)``. Windows: see the module docstring."""

    _nd: ClassVar[int] = 2


@dataclasses.dataclass(frozen=True)
class AdaptiveAvgPool3d(_AdaptivePoolNd):
    """Mean over adaptive windows of ``(N, C, D, H, W)`` to ``output_size``. Matches
    ``torch.nn.AdaptiveAvgPool3d``. Windows: see the module docstring."""

    _nd: ClassVar[int] = 3


@dataclasses.dataclass(frozen=True)
class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd):
    """Max over ``output_size`` adaptive windows of ``(N, C, L)``. Matches
    ``torch.nn.AdaptiveMaxPool1d``. Windows and indices: see the module docstring."""

    _nd: ClassVar[int] = 1


@dataclasses.dataclass(frozen=True)
class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    """Max over adaptive windows of ``(N, C, H, W)`` to ``output_size``. Matches
    ``torch.nn.AdaptiveMaxPool2d``. Windows and indices: see the module docstring."""

    _nd: ClassVar[int] = 2


@dataclasses.dataclass(frozen=True)
class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd):
    """Max over adaptive windows of ``(N, C, D, H, W)`` to ``output_size``. Matches
    ``torch.nn.AdaptiveMaxPool3d``. Windows and indices: see the module docstring."""

    _nd: ClassVar[int] = 3
