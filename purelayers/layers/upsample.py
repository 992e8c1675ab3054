r"""Resampling of the spatial axes of ``(N, C, *spatial)`` inputs: ``Upsample``,
``UpsamplingNearest2d`` and ``UpsamplingBilinear2d``, with torch's ``F.interpolate``
index and weight formulas.

Output size per spatial axis: ``size``, or ``floor(L * scale_factor)``. Each axis of
length ``L`` resampled to ``O`` uses a source scale ``s``: with ``align_corners=True``,
``(L - 1) / (O - 1)`` (``0`` when ``O == 1``); else ``1 / scale_factor`` where
``scale_factor`` was given (and ``recompute_scale_factor`` is not set), ``L / O``
otherwise. Output index ``i`` then reads, as torch (in float32 arithmetic, float64 for
float64 inputs):

- ``nearest``: ``x[min(floor(i * s), L - 1)]``; ``x[i]`` when ``O == L`` and
  ``x[i // 2]`` when ``O == 2 L``, whatever the scale (torch's shortcuts).
- ``nearest-exact``: ``x[min(floor((i + 0.5) * s), L - 1)]``.
- ``linear`` / ``bilinear`` / ``trilinear`` (per axis): source ``u = s * i`` with
  ``align_corners``, else ``max(s * (i + 0.5) - 0.5, 0)``; ``x[floor(u)]`` and its
  right neighbour (the same entry at the last one) weighted ``1 - t`` and ``t``,
  ``t = u - floor(u)``.
- ``area`` (per axis; torch's ``adaptive_avg_pool``): the mean of
  ``x[floor(i L / O) .. ceil((i + 1) L / O) - 1]``.
- ``bicubic`` (per axis): ``u`` as for linear but not clamped at ``0``; the four
  entries ``floor(u) - 1 .. floor(u) + 2``, each index clamped into ``[0, L - 1]``,
  weighted by Keys' cubic convolution with ``A = -0.75`` at ``t``.

The resampling is separable: one gather per tap and axis, weighted and summed (no
loop over pixels). Weights are constants, so the gradient is the transposed
resampling, torch's interpolation backward (a scatter-add of the weighted output
gradients).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.layers._checks import LayerError, broadcast_to_axis, check_choice, config_error
from purelayers.layers._spatial import is_int
from purelayers.layers.core import Layer, Params

__all__ = ["Upsample", "UpsamplingBilinear2d", "UpsamplingNearest2d"]

_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear", "area")
_RANK = {"linear": 3, "bilinear": 4, "bicubic": 4, "trilinear": 5}
_A = -0.75


def _check_size(layer: str, size: Any) -> Any:
    if size is None:
        return None
    if is_int(size) and size >= 1:
        return int(size)
    if isinstance(size, (tuple, list)) and size and all(is_int(s) and s >= 1 for s in size):
        return tuple(int(s) for s in size)
    raise config_error(layer, "size", "a positive int or a tuple of positive ints", size)


def _check_scale(layer: str, scale: Any) -> Any:
    def ok(v: Any) -> bool:
        real = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
        return real and math.isfinite(v) and v > 0

    if scale is None:
        return None
    if ok(scale):
        return float(scale)
    if isinstance(scale, (tuple, list)) and scale and all(ok(v) for v in scale):
        return tuple(float(v) for v in scale)
    raise config_error(layer, "scale_factor", "a positive finite number or a tuple of them", scale)


def _per_axis(layer: str, arg: str, value: Any, spatial: tuple[int, ...]) -> tuple:
    if not isinstance(value, tuple):
        return (value,) * len(spatial)
    if len(value) != len(spatial):
        raise LayerError(
            layer,
            f"{arg}={value}: one entry per spatial axis,",
            len(spatial),
            f"{len(value)} (x.shape == (N, C, {', '.join(map(str, spatial))}))",
        )
    return value


def _nearest(size: int, out: int, scale: float | None, exact: bool, ft: Any) -> np.ndarray:
    i = np.arange(out)
    if not exact and out == size:
        return i
    if not exact and out == 2 * size:
        return i // 2
    s = ft(1.0 / scale) if scale is not None else ft(size) / ft(out)
    src = (i.astype(ft) + ft(0.5)) * s if exact else i.astype(ft) * s
    return np.minimum(np.floor(src).astype(np.int64), size - 1)


def _source(size: int, out: int, scale: float | None, align: bool, cubic: bool, ft: Any):
    """torch's ``area_pixel_compute_source_index`` for every output index."""
    i = np.arange(out).astype(ft)
    if align:
        s = ft(size - 1) / ft(out - 1) if out > 1 else ft(0)
        return s * i
    s = ft(1.0 / scale) if scale is not None else ft(size) / ft(out)
    src = s * (i + ft(0.5)) - ft(0.5)
    return src if cubic else np.maximum(src, ft(0))


def _area(size: int, out: int, ft: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """torch's ``area`` mode, ``adaptive_avg_pool``: output ``i`` averages the inputs
    ``floor(i L / O) .. ceil((i + 1) L / O) - 1``; as taps, the ``j``-th input of each
    window (clamped, weight 0 past the window's end) weighted by one over its length."""
    i = np.arange(out)
    start, end = (i * size) // out, -((-(i + 1) * size) // out)
    length = end - start
    taps = []
    for j in range(int(length.max())):
        weight = np.where(j < length, ft(1) / length.astype(ft), ft(0)).astype(ft)
        taps.append((np.minimum(start + j, size - 1), weight))
    return taps


def _taps(mode: str, size: int, out: int, scale: float | None, align: bool, ft: Any):
    """``[(indices, weights or None), ...]``: the gathers of one axis."""
    if mode in ("nearest", "nearest-exact"):
        return [(_nearest(size, out, scale, mode == "nearest-exact", ft), None)]
    if mode == "area":
        return _area(size, out, ft)
    if mode != "bicubic":
        src = _source(size, out, scale, align, False, ft)
        i0 = src.astype(np.int64)
        i1 = np.where(i0 < size - 1, i0 + 1, i0)
        t = np.clip(src - i0.astype(ft), ft(0), ft(1))
        return [(i0, ft(1) - t), (i1, t)]
    src = _source(size, out, scale, align, True, ft)
    base = np.minimum(np.floor(src).astype(np.int64), size - 1)
    t = np.clip(src - base.astype(ft), ft(0), ft(1))
    a = ft(_A)

    def near(v):  # |v| <= 1
        return ((a + ft(2)) * v - (a + ft(3))) * v * v + ft(1)

    def far(v):  # 1 < |v| < 2
        return ((a * v - ft(5) * a) * v + ft(8) * a) * v - ft(4) * a

    weights = [far(t + ft(1)), near(t), near(ft(1) - t), far(ft(2) - t)]
    return [(np.clip(base + j - 1, 0, size - 1), w) for j, w in enumerate(weights)]


@dataclasses.dataclass(frozen=True)
class _Interpolate(Layer):
    """Shared checks, output sizes and resampling."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    size: int | tuple[int, ...] | None = None
    scale_factor: float | tuple[float, ...] | None = None

    @property
    def _mode(self) -> str:
        return self.mode  # type: ignore[attr-defined]

    @property
    def _align(self) -> bool:
        return bool(self.align_corners)  # type: ignore[attr-defined]

    @property
    def _recompute(self) -> bool:
        return bool(getattr(self, "recompute_scale_factor", None))

    def _check_config(self) -> None:
        name = type(self).__name__
        object.__setattr__(self, "size", _check_size(name, self.size))
        object.__setattr__(self, "scale_factor", _check_scale(name, self.scale_factor))
        if (self.size is None) == (self.scale_factor is None):
            given = "both" if self.size is not None else "neither"
            raise ValueError(
                f"{name}: exactly one of size and scale_factor must be given, got {given} "
                f"(size={self.size!r}, scale_factor={self.scale_factor!r})"
            )

    def _sizes(self, x: jax.Array) -> tuple[tuple[int, ...], tuple[float | None, ...]]:
        """Output sizes, and the scales the source index uses (None: size ratio)."""
        name, spatial = type(self).__name__, tuple(x.shape[2:])
        if self.size is not None:
            outs = _per_axis(name, "size", self.size, spatial)
            scales = (None,) * len(spatial)
        else:
            given = _per_axis(name, "scale_factor", self.scale_factor, spatial)
            outs = tuple(math.floor(float(n) * f) for n, f in zip(spatial, given, strict=True))
            scales = (None,) * len(spatial) if self._recompute else given
        if min(spatial) < 1 or min(outs) < 1:
            raise LayerError(
                name,
                "input and output spatial lengths",
                "at least 1 each (as torch)",
                f"input {spatial}, output {outs} (x.shape == {tuple(x.shape)})",
            )
        return outs, scales

    def _check_input(self, x: jax.Array) -> None:
        name, mode = type(self).__name__, self._mode
        want = (_RANK[mode],) if mode in _RANK else (3, 4, 5)
        if x.ndim not in want:
            axes = {3: "(N, C, L)", 4: "(N, C, H, W)", 5: "(N, C, D, H, W)"}
            raise LayerError(
                name,
                f"input rank for mode={mode!r}",
                " or ".join(f"{n} {axes[n]}" for n in want),
                f"{x.ndim} (x.shape == {tuple(x.shape)})",
            )
        if x.shape[1] == 0:
            raise LayerError(
                name,
                "input channels (axis 1)",
                "at least 1 (as torch)",
                f"0 (x.shape == {x.shape})",
            )

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        x = jnp.asarray(x)
        self._check_input(x)
        outs, scales = self._sizes(x)
        ft = np.float64 if x.dtype == jnp.float64 else np.float32
        for i, (n, o, s) in enumerate(zip(x.shape[2:], outs, scales, strict=True)):
            axis = 2 + i
            y = None
            for idx, w in _taps(self._mode, n, o, s, self._align, ft):
                part = jnp.take(x, jnp.asarray(idx, jnp.int32), axis=axis)
                if w is not None:
                    part = part * broadcast_to_axis(jnp.asarray(w, x.dtype), x.ndim, axis)
                y = part if y is None else y + part
            x = y
        return x


@dataclasses.dataclass(frozen=True)
class Upsample(_Interpolate):
    r"""Resamples the spatial axes: ``y[i] = sum_t w_t(i) * x[src_t(i)]`` per axis.

    The source indices ``src_t`` and weights ``w_t`` are the ``mode``'s (this module's
    docstring gives each). Matches ``torch.nn.Upsample(size, scale_factor, mode,
    align_corners, recompute_scale_factor)``.

    Args:
      size: the output spatial size, an int (every axis) or one int per axis.
      scale_factor: the multiplier, a number or one per axis; the output is
        ``floor(L * scale_factor)``. Exactly one of ``size`` and ``scale_factor``.
      mode: ``"nearest"`` (default), ``"nearest-exact"``, ``"linear"`` (3-D input),
        ``"bilinear"`` and ``"bicubic"`` (4-D), ``"trilinear"`` (5-D), ``"area"``
        (torch's ``adaptive_avg_pool`` to the output size); the nearest and area modes
        take 3-D to 5-D inputs.
      align_corners: for the interpolating modes, map the corner entries onto each
        other (``True``) or the corners of the pixel areas (``False``, the default
        ``None``). Must be ``None`` for the nearest and area modes.
      recompute_scale_factor: with ``scale_factor``, index by the ratio of the sizes
        ``L / O`` instead of ``1 / scale_factor``. Default ``None`` (off).

    Shape:
      input ``(N, C, *spatial)``; output ``(N, C, *out)``, same dtype (floating point;
      torch refuses integer inputs too).

    Parameters: none.

    Example:
      >>> up = Upsample(scale_factor=2, mode="linear", align_corners=True)
      >>> up.apply({}, jnp.array([[[0.0, 3.0]]])).tolist()
      [[[0.0, 1.0, 2.0, 3.0]]]
    """

    mode: str = "nearest"
    align_corners: bool | None = None
    recompute_scale_factor: bool | None = None

    def __post_init__(self):
        self._check_config()
        check_choice("Upsample", "mode", self.mode, _MODES)
        if self.align_corners is not None and not isinstance(self.align_corners, bool):
            raise config_error(
                "Upsample", "align_corners", "None, True or False", self.align_corners
            )
        if self.align_corners is not None and (
            self.mode.startswith("nearest") or self.mode == "area"
        ):
            raise ValueError(
                f"Upsample: align_corners must be None for mode={self.mode!r} (it applies to "
                f"linear, bilinear, bicubic and trilinear), got {self.align_corners!r}"
            )
        recompute = self.recompute_scale_factor
        if recompute is not None and not isinstance(recompute, bool):
            raise config_error(
                "Upsample", "recompute_scale_factor", "None, True or False", recompute
            )
        if recompute and self.size is not None:
            raise ValueError(
                "Upsample: recompute_scale_factor=True is not meaningful with an explicit size; "
                "give scale_factor instead"
            )


@dataclasses.dataclass(frozen=True)
class UpsamplingNearest2d(_Interpolate):
    r"""Nearest-neighbour resampling: ``y[i] = x[min(floor(i * s), L - 1)]`` per axis.

    ``s`` is ``1 / scale_factor``, or ``L / O`` for a ``size``: ``Upsample(size,
    scale_factor, mode="nearest")``. Matches
    ``torch.nn.UpsamplingNearest2d(size, scale_factor)``.

    Args:
      size: the output spatial size, an int or one per axis.
      scale_factor: the multiplier, a number or one per axis. Exactly one of the two.

    Shape:
      input ``(N, C, H, W)`` (3-D and 5-D inputs resample too, as torch);
      output ``(N, C, H_out, W_out)``.

    Parameters: none.

    Example:
      >>> UpsamplingNearest2d(scale_factor=2).apply({}, jnp.ones((1, 1, 2, 3))).shape
      (1, 1, 4, 6)
    """

    def __post_init__(self):
        self._check_config()

    @property
    def _mode(self) -> str:
        return "nearest"

    @property
    def _align(self) -> bool:
        return False


@dataclasses.dataclass(frozen=True)
class UpsamplingBilinear2d(_Interpolate):
    r"""Bilinear resampling, corners aligned: ``y[i] = (1 - t) x[floor(u)] + t x[floor(u) + 1]``.

    Per axis ``u = i * (L - 1) / (O - 1)``, ``t = u - floor(u)``: ``Upsample(size,
    scale_factor, mode="bilinear", align_corners=True)``. Matches
    ``torch.nn.UpsamplingBilinear2d(size, scale_factor)``.

    Args:
      size: the output spatial size, an int or ``(H_out, W_out)``.
      scale_factor: the multiplier, a number or one per axis. Exactly one of the two.

    Shape:
      input ``(N, C, H, W)``; output ``(N, C, H_out, W_out)``.

    Parameters: none.

    Example:
      >>> up = UpsamplingBilinear2d(size=(1, 3))
      >>> up.apply({}, jnp.array([[[[0.0, 4.0]]]])).tolist()
      [[[[0.0, 2.0, 4.0]]]]
    """

    def __post_init__(self):
        self._check_config()

    @property
    def _mode(self) -> str:
        return "bilinear"

    @property
    def _align(self) -> bool:
        return True
