"""Instance normalization: ``InstanceNorm1d``, ``InstanceNorm2d``, ``InstanceNorm3d``.

Each sample's channels are normalized over their own spatial positions. Statistics in at
least float32, as the other norms (see ``_norm_base``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.init import Initializer
from purelayers.layers._checks import (
    LayerError,
    as_shape,
    broadcast_to_axis,
    need_axis,
    promote_float,
)
from purelayers.layers._norm_base import (
    _channel_affine,
    _channel_params,
    _moments,
    _need_float,
    _RunningStatsNorm,
    _width,
)
from purelayers.layers.core import Params, State

__all__ = ["InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"]


@dataclasses.dataclass(frozen=True)
class _InstanceNorm(_RunningStatsNorm):
    """Shared implementation of InstanceNorm1d/2d/3d (documented on InstanceNorm2d)."""

    _spatial: ClassVar[int] = 0
    _layout: ClassVar[str] = ""

    _: dataclasses.KW_ONLY
    eps: float = 1e-5
    momentum: float | None = 0.1
    affine: bool = False
    track_running_stats: bool = False
    bias: bool = True
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None

    def _channel_axis(self, shape: tuple[int, ...]) -> int:
        """0 for an unbatched input ``(C, *spatial)``, 1 for a batch ``(N, C, *spatial)``."""
        if len(shape) not in (self._spatial + 1, self._spatial + 2):
            raise LayerError(
                self._name,
                "input rank",
                f"{self._spatial + 1} or {self._spatial + 2} {self._layout}",
                f"{len(shape)} (x.shape == {shape})",
            )
        return len(shape) - self._spatial - 1

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        shape = as_shape(shape)
        return _channel_params(self, key, shape[self._channel_axis(shape)], dtype)

    def init_state(self, shape: Any, dtype: Any = jnp.float32) -> State:
        shape = as_shape(shape)
        channels = shape[self._channel_axis(shape)]
        return self._running_state(channels, dtype)

    def _check(self, x: Any, params: Params, state: State | None) -> int:
        name = self._name
        _need_float(name, x)
        shape = tuple(jnp.shape(x))
        axis = self._channel_axis(shape)
        for tree, entry in ((params, "weight"), (state, "running_mean")):
            width = _width(tree, entry)
            if width is not None:
                need_axis(
                    name,
                    x,
                    axis,
                    width,
                    f"channels (axis {axis})",
                    f"x.shape == {shape}; {name} was initialized for {width} channels, "
                    f"laid out {self._layout}",
                )
        if self.affine and axis == 1 and shape[0] == 0:
            raise LayerError(
                name,
                "affine=True needs at least one sample (torch fails on an empty batch too):",
                "N >= 1",
                f"x.shape == {shape}",
            )
        self._need_state(state)
        return axis

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
        state: State | None = None,
    ):
        unbatched = self._check(x, params, state) == 0
        xf = jnp.asarray(x).astype(promote_float(jnp.result_type(x)))
        xf = xf[None] if unbatched else xf
        axes = tuple(range(2, xf.ndim))
        if train or not self.track_running_stats:
            n = math.prod(xf.shape[2:])
            if n == 1:
                raise LayerError(
                    self._name,
                    "instance statistics need more than 1 spatial element per channel:",
                    "spatial size > 1",
                    f"x.shape == {tuple(jnp.shape(x))}",
                )
            mean, centered, var = _moments(xf, axes)
            if train and self.track_running_stats:
                state = self._update(state, mean, var, n)
        else:
            mean = broadcast_to_axis(state["running_mean"].astype(xf.dtype), xf.ndim, 1)
            var = broadcast_to_axis(state["running_var"].astype(xf.dtype), xf.ndim, 1)
            centered = xf - mean
        y = _channel_affine(
            centered * jax.lax.rsqrt(var + self.eps), params, self.affine, self.bias
        )
        y = (y[0] if unbatched else y).astype(jnp.result_type(x))
        return y if state is None else (y, state)

    def _update(self, state: State, mean, var, n: int) -> State:
        """Running statistics after one training batch: each instance's mean and unbiased
        variance, averaged over the batch (no gradient flows in)."""
        m = 0.0 if self.momentum is None else self.momentum
        batch, channels = mean.shape[0], state["running_mean"].shape[0]
        if n == 0:  # torch: no values per instance, the statistics unchanged
            return state
        # (an empty batch averages nothing: NaN statistics, as torch's)
        shape = (batch, channels)
        mean, var = jax.lax.stop_gradient((mean.reshape(shape), var.reshape(shape)))
        rm, rv = state["running_mean"], state["running_var"]
        new_mean = (1 - m) * rm.astype(mean.dtype) + m * jnp.mean(mean, axis=0)
        new_var = (1 - m) * rv.astype(var.dtype) + m * jnp.mean(var, axis=0) * (n / (n - 1))
        return {
            **state,
            "running_mean": new_mean.astype(rm.dtype),
            "running_var": new_var.astype(rv.dtype),
        }


@dataclasses.dataclass(frozen=True)
class InstanceNorm1d(_InstanceNorm):
    r"""Instance normalization: ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    ``mean`` and ``var`` of each sample's channel over ``L`` (the running averages in
    evaluation with ``track_running_stats``, updated as ``InstanceNorm2d`` describes).
    Matches ``torch.nn.InstanceNorm1d(C)``; a 2-d input is one unbatched ``(C, L)``.

    Args:
      eps: added to the variance inside the square root; must be > 0. Default ``1e-5``.
      momentum: weight of the new batch in the running averages, in ``[0, 1]``, or None
        (no update). Default ``0.1``.
      affine: learn per-channel ``weight`` and ``bias``. Default ``False``.
      track_running_stats: keep running statistics (state) for evaluation. Default
        ``False``: no state, instance statistics in both modes.
      bias: learn ``bias`` too (with ``affine``). Default ``True``.
      weight_init: initializer for ``weight``. Default ones.
      bias_init: initializer for ``bias``. Default zeros.

    Shape:
      input ``(N, C, L)`` or ``(C, L)``; output the same shape and dtype.

    Parameters:
      ``weight``: ``(C,)``, ones. ``bias``: ``(C,)``, zeros (with ``affine``).

    Buffers:
      ``running_mean``: ``(C,)``, zeros. ``running_var``: ``(C,)``, ones.
      ``num_batches_tracked``: int32 scalar, 0 (with ``track_running_stats``).

    Example:
      >>> norm = InstanceNorm1d()
      >>> x = jnp.array([[[0.0, 2.0], [1.0, 1.0]]])    # (N, C, L) = (1, 2, 2)
      >>> norm.apply(norm.init(jax.random.key(0), x.shape), x)[0, 0].round(3)
      Array([-1.,  1.], dtype=float32)
    """

    _spatial: ClassVar[int] = 1
    _layout: ClassVar[str] = "(N, C, L) or (C, L)"


@dataclasses.dataclass(frozen=True)
class InstanceNorm2d(_InstanceNorm):
    r"""Instance normalization: ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    ``mean`` and ``var`` (the population variance) of each sample's channel over ``H, W``
    (each channel on its own) when ``train=True`` or
    ``track_running_stats=False``, and the running averages otherwise. Matches
    ``torch.nn.InstanceNorm2d(x.shape[1])`` in the same mode. A 3-d input is one
    unbatched sample ``(C, H, W)``, as in torch.

    With ``track_running_stats`` the buffers live in a state tree from
    ``init_state(shape)`` and ``apply(params, x, state=state, train=...)`` returns
    ``(y, new_state)``. A training step updates them as torch does, with the batch's
    average of the per-instance statistics::

        running_mean = (1 - momentum) * running_mean + momentum * mean_N(mean)
        running_var  = (1 - momentum) * running_var  + momentum * mean_N(var) * n / (n - 1)

    with ``n`` the spatial size; ``num_batches_tracked`` stays 0 and ``momentum=None``
    leaves the statistics unchanged, as torch (which passes ``0.0``).

    Worked example: the channel ``[[0, 2], [4, 6]]`` has mean 3 and variance 5, so with
    ``eps=1e-5`` it becomes ``[-3, -1, 1, 3] / sqrt(5.00001) = [-1.3416, -0.4472, ...]``.

    Args:
      eps: added to the variance inside the square root; must be > 0. Default ``1e-5``.
      momentum: weight of the new batch in the running averages, in ``[0, 1]``, or None
        (no update). Default ``0.1``.
      affine: learn per-channel ``weight`` and ``bias``. Default ``False``.
      track_running_stats: keep running statistics (state) for evaluation. Default
        ``False``: no state, instance statistics in both modes.
      bias: learn ``bias`` too (with ``affine``). Default ``True``.
      weight_init: initializer for ``weight``. Default ones.
      bias_init: initializer for ``bias``. Default zeros.

    Shape:
      input ``(N, C, H, W)`` or ``(C, H, W)``; output the same shape and dtype.

    Parameters:
      ``weight``: ``(C,)``, ones. ``bias``: ``(C,)``, zeros (with ``affine``).

    Buffers:
      ``running_mean``: ``(C,)``, zeros. ``running_var``: ``(C,)``, ones.
      ``num_batches_tracked``: int32 scalar, 0 (with ``track_running_stats``).

    Example:
      >>> norm = InstanceNorm2d(affine=True, track_running_stats=True)
      >>> x = jax.random.normal(jax.random.key(1), (2, 3, 4, 4))
      >>> params, state = norm.init(jax.random.key(0), x.shape), norm.init_state(x.shape)
      >>> y, state = norm.apply(params, x, state=state, train=True)
      >>> sorted(state)
      ['num_batches_tracked', 'running_mean', 'running_var']
    """

    _spatial: ClassVar[int] = 2
    _layout: ClassVar[str] = "(N, C, H, W) or (C, H, W)"


@dataclasses.dataclass(frozen=True)
class InstanceNorm3d(_InstanceNorm):
    r"""Instance normalization: ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    ``mean`` and ``var`` of each sample's channel over ``D, H, W`` (the running averages in
    evaluation with ``track_running_stats``, updated as ``InstanceNorm2d`` describes).
    Matches ``torch.nn.InstanceNorm3d(C)``; a 4-d input is one unbatched ``(C, D, H, W)``.

    Args:
      eps: added to the variance inside the square root; must be > 0. Default ``1e-5``.
      momentum: weight of the new batch in the running averages, in ``[0, 1]``, or None
        (no update). Default ``0.1``.
      affine: learn per-channel ``weight`` and ``bias``. Default ``False``.
      track_running_stats: keep running statistics (state) for evaluation. Default
        ``False``: no state, instance statistics in both modes.
      bias: learn ``bias`` too (with ``affine``). Default ``True``.
      weight_init: initializer for ``weight``. Default ones.
      bias_init: initializer for ``bias``. Default zeros.

    Shape:
      input ``(N, C, D, H, W)`` or ``(C, D, H, W)``; output the same shape and dtype.

    Parameters:
      ``weight``: ``(C,)``, ones. ``bias``: ``(C,)``, zeros (with ``affine``).

    Buffers:
      ``running_mean``: ``(C,)``, zeros. ``running_var``: ``(C,)``, ones.
      ``num_batches_tracked``: int32 scalar, 0 (with ``track_running_stats``).

    Example:
      >>> norm = InstanceNorm3d(affine=True)
      >>> x = jnp.ones((2, 3, 2, 2, 2))
      >>> jax.tree.map(jnp.shape, norm.init(jax.random.key(0), x.shape))
      {'bias': (3,), 'weight': (3,)}
    """

    _spatial: ClassVar[int] = 3
    _layout: ClassVar[str] = "(N, C, D, H, W) or (C, D, H, W)"
