r"""Pooling over the spatial axes of channels-first inputs: ``MaxPool1d/2d/3d``,
``AvgPool1d/2d/3d``, ``AdaptiveAvgPool1d/2d/3d`` and ``AdaptiveMaxPool1d/2d/3d``.

The math is ``purelayers.functional.pooling``. As torch, ``ceil_mode`` drops a window
starting at or past ``L + padding``; a max sends each output's gradient to the element
it selected (the first of equal maxima in row-major order, the last NaN), a mean spreads
it over the window. Indices are flat positions in each channel's unpadded input (``h *
W + w`` in 2-d), ``int64`` under JAX's 64-bit mode, else ``int32``. In a ``Sequential``,
a max pool right after a ``ReLU`` runs first (``F.max_pool_commutes_with_relu``)."""

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
from purelayers.layers.activation.elementwise import ReLU
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
    padding: int | tuple[int, ...] = 0  # ceil_mode: each subclass's field, in torch's place

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
        """Output sizes and the ``(low, high)`` pads (the high one may crop); errors name ``name``."""
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

    def runs_before(self, previous: Layer, x: Any) -> bool:
        """After a ``ReLU``, where ``F.max_pool_commutes_with_relu``: pool first."""
        commutes = F.max_pool_commutes_with_relu(
            getattr(x, "dtype", None), self.padding, self.return_indices
        )
        return type(previous) is ReLU and commutes

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
    r"""Max over sliding windows of sequences: ``y = max over each window of x``.

    Matches ``torch.nn.MaxPool1d``; ``padding`` is ``-inf``.

    Args:
      kernel_size: window size, an int.
      stride: window step, as ``kernel_size``. Default ``None`` (``kernel_size``).
      padding: added on both sides, at most ``kernel_size // 2``. Default ``0``.
      dilation: spacing between window taps. Default ``1``.
      return_indices: also return ``(y, indices)``, ``MaxUnpool1d``'s input. Default ``False``.
      ceil_mode: round the output size up instead of down. Default ``False``.

    Shape:
      input ``(N, C, L)`` or without ``N``; output ``(N, C, L_out)``, per axis
      ``out = floor((L + 2 * padding - dilation * (kernel_size - 1) - 1) / stride) + 1``.

    Parameters: none.

    Example:
      >>> MaxPool1d(2).apply({}, jnp.array([[[1.0, 3, 2, 5, 4]]])).tolist()
      [[[3.0, 5.0]]]
    """

    _nd: ClassVar[int] = 1

    @property
    def accepts(self) -> tuple[str, ...]:  # type: ignore[override]
        # torch's 1-d kernel without indices takes no integers; with them it runs the 2-d one
        return ("floating", "integer") if self.return_indices else ("floating",)


@dataclasses.dataclass(frozen=True)
class MaxPool2d(_MaxPoolNd):
    r"""Max over sliding windows of images: ``y = max over each window of x``.

    Matches ``torch.nn.MaxPool2d``; ``padding`` is ``-inf``.

    Args:
      kernel_size: window size, an int or a pair ``(kH, kW)``.
      stride: window step, as ``kernel_size``. Default ``None`` (``kernel_size``).
      padding: added on both sides, at most ``kernel_size // 2``. Default ``0``.
      dilation: spacing between window taps. Default ``1``.
      return_indices: also return ``(y, indices)``, ``MaxUnpool2d``'s input. Default ``False``.
      ceil_mode: round the output size up instead of down. Default ``False``.

    Shape:
      input ``(N, C, H, W)`` or without ``N``; output ``(N, C, H_out, W_out)``, per axis
      ``out = floor((L + 2 * padding - dilation * (kernel_size - 1) - 1) / stride) + 1``.

    Parameters: none.

    Example:
      >>> y, idx = MaxPool2d(2, return_indices=True).apply({}, jnp.arange(16.0).reshape(1, 4, 4))
      >>> y.tolist(), idx.tolist()
      ([[[5.0, 7.0], [13.0, 15.0]]], [[[5, 7], [13, 15]]])
    """

    _nd: ClassVar[int] = 2


@dataclasses.dataclass(frozen=True)
class MaxPool3d(_MaxPoolNd):
    r"""Max over sliding windows of volumes: ``y = max over each window of x``.

    Matches ``torch.nn.MaxPool3d``; ``padding`` is ``-inf``.

    Args:
      kernel_size: window size, an int or a triple ``(kD, kH, kW)``.
      stride: window step, as ``kernel_size``. Default ``None`` (``kernel_size``).
      padding: added on both sides, at most ``kernel_size // 2``. Default ``0``.
      dilation: spacing between window taps. Default ``1``.
      return_indices: also return ``(y, indices)``, ``MaxUnpool3d``'s input. Default ``False``.
      ceil_mode: round the output size up instead of down. Default ``False``.

    Shape:
      input ``(N, C, D, H, W)`` or without ``N``; output ``(N, C, D_out, H_out, W_out)``, per axis
      ``out = floor((L + 2 * padding - dilation * (kernel_size - 1) - 1) / stride) + 1``.

    Parameters: none.

    Example:
      >>> MaxPool3d(2, stride=1).apply({}, jnp.zeros((2, 3, 4, 5, 6))).shape
      (2, 3, 3, 4, 5)
    """

    _nd: ClassVar[int] = 3


@dataclasses.dataclass(frozen=True)
class AvgPool1d(_AvgPoolNd):
    r"""Mean over sliding windows of sequences: ``y = sum over each window of x / count``.

    Matches ``torch.nn.AvgPool1d``; ``padding`` is zeros.

    Args:
      kernel_size: window size, an int.
      stride: window step, as ``kernel_size``. Default ``None`` (``kernel_size``).
      padding: zeros added on both sides, at most ``kernel_size // 2``. Default ``0``.
      ceil_mode: round the output size up instead of down. Default ``False``.
      count_include_pad: count ``padding`` in the divisor (never the part of a
        ``ceil_mode`` window past the padding). Default ``True``.

    Shape:
      input ``(N, C, L)`` or without ``N``; output ``(N, C, L_out)``, per axis
      ``out = floor((L + 2 * padding - kernel_size) / stride) + 1``.

    Parameters: none.

    Example:
      >>> x = jnp.array([[[1.0, 2, 3, 4]]])  # padded: [0, 1, 2, 3, 4, 0]
      >>> AvgPool1d(3, stride=2, padding=1).apply({}, x).tolist()
      [[[1.0, 3.0]]]
      >>> AvgPool1d(3, stride=2, padding=1, ceil_mode=True).apply({}, x).tolist()  # [4, 0] / 2
      [[[1.0, 3.0, 2.0]]]
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
    r"""Mean over sliding windows of images: ``y = sum over each window of x / count``.

    Matches ``torch.nn.AvgPool2d``; ``padding`` is zeros.

    Args:
      kernel_size: window size, an int or a pair ``(kH, kW)``.
      stride: window step, as ``kernel_size``. Default ``None`` (``kernel_size``).
      padding: zeros added on both sides, at most ``kernel_size // 2``. Default ``0``.
      ceil_mode: round the output size up instead of down. Default ``False``.
      count_include_pad: count ``padding`` in the divisor (never the part of a
        ``ceil_mode`` window past the padding). Default ``True``.
      divisor_override: a nonzero int dividing each window's sum instead. Default ``None``.

    Shape:
      input ``(N, C, H, W)`` or without ``N``; output ``(N, C, H_out, W_out)``, per axis
      ``out = floor((L + 2 * padding - kernel_size) / stride) + 1``.

    Parameters: none.

    Example:
      >>> AvgPool2d(2, divisor_override=1).apply({}, jnp.ones((1, 4, 4))).tolist()  # window sums
      [[[4.0, 4.0], [4.0, 4.0]]]
    """

    _nd: ClassVar[int] = 2


@dataclasses.dataclass(frozen=True)
class AvgPool3d(_AvgPoolDivNd):
    r"""Mean over sliding windows of volumes: ``y = sum over each window of x / count``.

    Matches ``torch.nn.AvgPool3d``; ``padding`` is zeros.

    Args:
      kernel_size: window size, an int or a triple ``(kD, kH, kW)``.
      stride: window step, as ``kernel_size``. Default ``None`` (``kernel_size``).
      padding: zeros added on both sides, at most ``kernel_size // 2``. Default ``0``.
      ceil_mode: round the output size up instead of down. Default ``False``.
      count_include_pad: count ``padding`` in the divisor (never the part of a
        ``ceil_mode`` window past the padding). Default ``True``.
      divisor_override: a nonzero int dividing each window's sum instead. Default ``None``.

    Shape:
      input ``(N, C, D, H, W)`` or without ``N``; output ``(N, C, D_out, H_out, W_out)``, per axis
      ``out = floor((L + 2 * padding - kernel_size) / stride) + 1``.

    Parameters: none.

    Example:
      >>> AvgPool3d((1, 2, 2)).apply({}, jnp.ones((2, 3, 4, 4, 4))).shape
      (2, 3, 4, 2, 2)
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
    r"""Mean over adaptive windows: ``y[i] = mean(x[i * L // out : ceil((i + 1) * L / out)])``.

    Per spatial axis, for any sizes. Matches ``torch.nn.AdaptiveAvgPool1d``.

    Args:
      output_size: an int, or one int or ``None`` (keep the axis) per spatial axis.

    Shape:
      input ``(N, C, L)`` or without ``N``; output ``(N, C, output_size)``.

    Parameters: none.

    Example:
      >>> AdaptiveAvgPool1d(2).apply({}, jnp.array([[[1.0, 2, 3, 4, 5]]])).tolist()
      [[[2.0, 4.0]]]
    """

    _nd: ClassVar[int] = 1


@dataclasses.dataclass(frozen=True)
class AdaptiveAvgPool2d(_AdaptivePoolNd):
    r"""Mean over adaptive windows: ``y[i] = mean(x[i * L // out : ceil((i + 1) * L / out)])``.

    Per spatial axis, for any sizes. Matches ``torch.nn.AdaptiveAvgPool2d``.

    Args:
      output_size: an int, or one int or ``None`` (keep the axis) per spatial axis.

    Shape:
      input ``(N, C, H, W)`` or without ``N``; output ``(N, C, *output_size)``.

    Parameters: none.

    Example:
      >>> AdaptiveAvgPool2d(1).apply({}, jnp.ones((2, 3, 5, 7))).shape  # global average pooling
      (2, 3, 1, 1)
    """

    _nd: ClassVar[int] = 2


@dataclasses.dataclass(frozen=True)
class AdaptiveAvgPool3d(_AdaptivePoolNd):
    r"""Mean over adaptive windows: ``y[i] = mean(x[i * L // out : ceil((i + 1) * L / out)])``.

    Per spatial axis, for any sizes. Matches ``torch.nn.AdaptiveAvgPool3d``.

    Args:
      output_size: an int, or one int or ``None`` (keep the axis) per spatial axis.

    Shape:
      input ``(N, C, D, H, W)`` or without ``N``; output ``(N, C, *output_size)``.

    Parameters: none.

    Example:
      >>> AdaptiveAvgPool3d((None, 2, 3)).apply({}, jnp.ones((2, 3, 4, 5, 6))).shape
      (2, 3, 4, 2, 3)
    """

    _nd: ClassVar[int] = 3


@dataclasses.dataclass(frozen=True)
class AdaptiveMaxPool1d(_AdaptiveMaxPoolNd):
    r"""Max over adaptive windows: ``y[i] = max(x[i * L // out : ceil((i + 1) * L / out)])``.

    Per spatial axis, for any sizes. Matches ``torch.nn.AdaptiveMaxPool1d``.

    Args:
      output_size: an int, or one int or ``None`` (keep the axis) per spatial axis.
      return_indices: also return ``(y, indices)``. Default ``False``.

    Shape:
      input ``(N, C, L)`` or without ``N``; output ``(N, C, output_size)``.

    Parameters: none.

    Example:
      >>> AdaptiveMaxPool1d(2).apply({}, jnp.array([[[1.0, 5, 3, 4, 2]]])).tolist()
      [[[5.0, 4.0]]]
    """

    _nd: ClassVar[int] = 1


@dataclasses.dataclass(frozen=True)
class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    r"""Max over adaptive windows: ``y[i] = max(x[i * L // out : ceil((i + 1) * L / out)])``.

    Per spatial axis, for any sizes. Matches ``torch.nn.AdaptiveMaxPool2d``.

    Args:
      output_size: an int, or one int or ``None`` (keep the axis) per spatial axis.
      return_indices: also return ``(y, indices)``. Default ``False``.

    Shape:
      input ``(N, C, H, W)`` or without ``N``; output ``(N, C, *output_size)``.

    Parameters: none.

    Example:
      >>> y, idx = AdaptiveMaxPool2d(1, return_indices=True).apply({}, jnp.ones((1, 2, 3)))
      >>> y.tolist(), idx.tolist()
      ([[[1.0]]], [[[0]]])
    """

    _nd: ClassVar[int] = 2


@dataclasses.dataclass(frozen=True)
class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd):
    r"""Max over adaptive windows: ``y[i] = max(x[i * L // out : ceil((i + 1) * L / out)])``.

    Per spatial axis, for any sizes. Matches ``torch.nn.AdaptiveMaxPool3d``.

    Args:
      output_size: an int, or one int or ``None`` (keep the axis) per spatial axis.
      return_indices: also return ``(y, indices)``. Default ``False``.

    Shape:
      input ``(N, C, D, H, W)`` or without ``N``; output ``(N, C, *output_size)``.

    Parameters: none.

    Example:
      >>> AdaptiveMaxPool3d(2).apply({}, jnp.ones((2, 3, 4, 5, 6))).shape
      (2, 3, 2, 2, 2)
    """

    _nd: ClassVar[int] = 3
