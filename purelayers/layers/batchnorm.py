"""Batch normalization: ``BatchNorm1d/2d/3d`` and ``SyncBatchNorm`` (exported by ``norm``).

Statistics in at least float32, as the other norms (see ``_norm_base``).
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
    config_error,
    promote_float,
)
from purelayers.layers._norm_base import (
    _channel_affine,
    _channel_params,
    _check_channels,
    _moments,
    _need_float,
    _RunningStatsNorm,
    _width,
)
from purelayers.layers.core import Params, State

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"]


@dataclasses.dataclass(frozen=True)
class _BatchNorm(_RunningStatsNorm):
    """Shared implementation of BatchNorm1d/2d/3d (documented on BatchNorm2d)."""

    _ranks: ClassVar[tuple[int, ...]] = ()
    _layout: ClassVar[str] = ""

    _: dataclasses.KW_ONLY
    eps: float = 1e-5
    momentum: float | None = 0.1
    affine: bool = True
    track_running_stats: bool = True
    bias: bool = True
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None

    def _channels(self, shape: tuple[int, ...]) -> int:
        if not self._ranks and len(shape) < 2:
            raise LayerError(
                self._name,
                "input rank",
                f"at least 2 {self._layout}",
                f"{len(shape)} (x.shape == {shape})",
            )
        if self._ranks and len(shape) not in self._ranks:
            ranks = " or ".join(map(str, self._ranks))
            raise LayerError(
                self._name,
                "input rank",
                f"{ranks} {self._layout}",
                f"{len(shape)} (x.shape == {shape})",
            )
        return shape[1]

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        return _channel_params(self, key, self._channels(as_shape(shape)), dtype)

    def init_state(self, shape: Any, dtype: Any = jnp.float32) -> State:
        channels = self._channels(as_shape(shape))
        return self._running_state(channels, dtype)

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
        state: State | None = None,
    ):
        name = self._name
        _need_float(name, x)
        shape = tuple(jnp.shape(x))
        self._channels(shape)
        _check_channels(name, x, _width(params), self._layout)
        self._need_state(state)
        if state:
            _check_channels(name, x, _width(state, "running_mean"), self._layout)
        xf = jnp.asarray(x).astype(promote_float(jnp.result_type(x)))
        axes = (0, *range(2, xf.ndim))
        if train or not self.track_running_stats:
            mean, centered, var, n = self._batch_stats(xf, axes, train)
            if train and self.track_running_stats:
                state = self._update(state, mean, var, n, shape)
        else:
            mean = broadcast_to_axis(state["running_mean"].astype(xf.dtype), xf.ndim, 1)
            var = broadcast_to_axis(state["running_var"].astype(xf.dtype), xf.ndim, 1)
            centered = xf - mean
        y = centered * jax.lax.rsqrt(var + self.eps)
        y = _channel_affine(y, params, self.affine, self.bias)
        y = y.astype(jnp.result_type(x))
        return y if state is None else (y, state)

    def _batch_stats(self, xf: jax.Array, axes: tuple[int, ...], train: bool) -> tuple:
        """``(mean, x - mean, var, n)``: the batch's statistics per channel and the number
        of values ``n`` behind each."""
        del train
        shape = xf.shape
        return (*_moments(xf, axes), math.prod(shape) // max(shape[1], 1))

    def _update(self, state: State, mean, var, n: int, shape: tuple[int, ...]) -> State:
        """The running statistics after one training batch (no gradient flows in)."""
        if math.prod(shape) == 0 and (shape[0] == 0 or n == 0):
            # an empty batch (or empty spatial axes, no values per channel): torch counts
            # it and leaves the statistics as they are
            return {**state, "num_batches_tracked": state["num_batches_tracked"] + 1}
        if n < 2:
            raise LayerError(
                self._name,
                "training needs more than 1 value per channel for the batch variance:",
                "N * (spatial size) > 1",
                f"x.shape == {shape}",
            )
        mean, var = jax.lax.stop_gradient((mean.reshape(-1), var.reshape(-1)))
        count = state["num_batches_tracked"] + 1
        # momentum=None: torch's cumulative average, weight 1 / (batches seen so far)
        m = 1.0 / count.astype(mean.dtype) if self.momentum is None else self.momentum
        rm, rv = state["running_mean"], state["running_var"]
        new_mean = (1 - m) * rm.astype(mean.dtype) + m * mean
        new_var = (1 - m) * rv.astype(var.dtype) + m * var * (n / (n - 1))
        return {
            "running_mean": new_mean.astype(rm.dtype),
            "running_var": new_var.astype(rv.dtype),
            "num_batches_tracked": count.astype(state["num_batches_tracked"].dtype),
        }


@dataclasses.dataclass(frozen=True)
class BatchNorm1d(_BatchNorm):
    r"""Batch normalization per channel: ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    ``mean`` and ``var`` over ``N`` (and ``L``): the batch's in training or without
    ``track_running_stats``, the running averages otherwise (updated as ``BatchNorm2d``
    describes). Matches ``torch.nn.BatchNorm1d(C)``.

    Args:
      eps: added to the variance inside the square root; must be > 0. Default ``1e-5``.
      momentum: weight of the new batch in the running averages, in ``[0, 1]``, or None
        for a cumulative average. Default ``0.1``.
      affine: learn per-channel ``weight`` and ``bias``. Default ``True``.
      track_running_stats: keep running statistics (state) for evaluation; if False there
        is no state and batch statistics are used in both modes. Default ``True``.
      bias: learn ``bias`` too (with ``affine``). Default ``True``.
      weight_init: initializer for ``weight``. Default ones.
      bias_init: initializer for ``bias``. Default zeros.

    Shape:
      input ``(N, C)`` or ``(N, C, L)``; output the same shape and dtype.

    Parameters:
      ``weight``: ``(C,)``, ones. ``bias``: ``(C,)``, zeros.

    Buffers:
      ``running_mean``: ``(C,)``, zeros. ``running_var``: ``(C,)``, ones.
      ``num_batches_tracked``: int32 scalar, 0 (from ``init_state``).

    Example:
      >>> bn = BatchNorm1d()
      >>> x = jax.random.normal(jax.random.key(1), (8, 4))
      >>> params, state = bn.init(jax.random.key(0), x.shape), bn.init_state(x.shape)
      >>> y, state = bn.apply(params, x, state=state, train=True)
      >>> int(state["num_batches_tracked"]), y.shape
      (1, (8, 4))
    """

    _ranks: ClassVar[tuple[int, ...]] = (2, 3)
    _layout: ClassVar[str] = "(N, C) or (N, C, L)"


@dataclasses.dataclass(frozen=True)
class BatchNorm2d(_BatchNorm):
    r"""Batch normalization per channel: ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    ``mean`` and ``var`` over ``N, H, W``: the batch's (population variance) when
    ``train=True`` or when ``track_running_stats=False``, the running averages otherwise.
    Matches ``torch.nn.BatchNorm2d(x.shape[1])`` in the same mode.

    With ``track_running_stats`` (the default) the buffers live in a separate state tree
    from ``init_state(shape)``, and ``apply(params, x, state=state, train=...)`` returns
    ``(y, new_state)``. A training step updates them as torch does::

        running_mean = (1 - m) * running_mean + m * batch_mean
        running_var  = (1 - m) * running_var  + m * batch_var * n / (n - 1)   # unbiased
        num_batches_tracked += 1

    with ``n`` the number of values per channel and ``m = momentum``, or
    ``m = 1 / num_batches_tracked`` (a cumulative average) when ``momentum`` is None.
    Evaluation (``train=False``) normalizes with the running statistics and returns the
    state unchanged. No gradient flows into the buffers.

    Args:
      eps: added to the variance inside the square root; must be > 0. Default ``1e-5``.
      momentum: weight of the new batch in the running averages, in ``[0, 1]``, or None
        for a cumulative average. Default ``0.1``.
      affine: learn per-channel ``weight`` and ``bias``. Default ``True``.
      track_running_stats: keep running statistics (state) for evaluation. If False
        there is no state and batch statistics are used in both modes. Default ``True``.
      bias: learn ``bias`` too (with ``affine``); ``False`` leaves it out, as torch's
        ``bias=False``. Default ``True``.
      weight_init: initializer for ``weight``. Default ones.
      bias_init: initializer for ``bias``. Default zeros.

    Shape:
      input ``(N, C, H, W)``; output the same shape and dtype (statistics in float32 or
      wider).

    Parameters:
      ``weight``: ``(C,)``, ones. ``bias``: ``(C,)``, zeros.

    Buffers:
      ``running_mean``: ``(C,)``, zeros. ``running_var``: ``(C,)``, ones (both float32,
      or wider for wider inputs). ``num_batches_tracked``: int32 scalar, 0 (torch's is
      int64; JAX holds int32 unless x64 is enabled, and checkpoints convert).

    Example:
      >>> bn = BatchNorm2d()
      >>> x = jax.random.normal(jax.random.key(1), (8, 3, 5, 5))
      >>> params, state = bn.init(jax.random.key(0), x.shape), bn.init_state(x.shape)
      >>> y, state = bn.apply(params, x, state=state, train=True)   # a training step
      >>> y, _ = bn.apply(params, x, state=state)                    # evaluation
      >>> y.shape, state["running_var"].shape
      ((8, 3, 5, 5), (3,))
    """

    _ranks: ClassVar[tuple[int, ...]] = (4,)
    _layout: ClassVar[str] = "(N, C, H, W)"


@dataclasses.dataclass(frozen=True)
class BatchNorm3d(_BatchNorm):
    r"""Batch normalization per channel: ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    ``mean`` and ``var`` over ``N, D, H, W``: the batch's in training or without
    ``track_running_stats``, the running averages otherwise (updated as ``BatchNorm2d``
    describes). Matches ``torch.nn.BatchNorm3d(C)``.

    Args:
      eps: added to the variance inside the square root; must be > 0. Default ``1e-5``.
      momentum: weight of the new batch in the running averages, in ``[0, 1]``, or None
        for a cumulative average. Default ``0.1``.
      affine: learn per-channel ``weight`` and ``bias``. Default ``True``.
      track_running_stats: keep running statistics (state) for evaluation; if False there
        is no state and batch statistics are used in both modes. Default ``True``.
      bias: learn ``bias`` too (with ``affine``). Default ``True``.
      weight_init: initializer for ``weight``. Default ones.
      bias_init: initializer for ``bias``. Default zeros.

    Shape:
      input ``(N, C, D, H, W)``; output the same shape and dtype.

    Parameters:
      ``weight``: ``(C,)``, ones. ``bias``: ``(C,)``, zeros.

    Buffers:
      ``running_mean``: ``(C,)``, zeros. ``running_var``: ``(C,)``, ones.
      ``num_batches_tracked``: int32 scalar, 0 (from ``init_state``).

    Example:
      >>> bn = BatchNorm3d(track_running_stats=False)
      >>> x = jnp.ones((2, 3, 2, 2, 2))
      >>> bn.apply(bn.init(jax.random.key(0), x.shape), x).shape
      (2, 3, 2, 2, 2)
    """

    _ranks: ClassVar[tuple[int, ...]] = (5,)
    _layout: ClassVar[str] = "(N, C, D, H, W)"


@dataclasses.dataclass(frozen=True)
class SyncBatchNorm(_BatchNorm):
    r"""Batch normalization across shards: ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    In training the per-channel batch ``mean`` and ``var`` are taken over the inputs of
    all the shards of ``axis_name``: a ``jax.vmap(..., axis_name=...)`` axis or a
    ``shard_map`` mesh axis (several names: all of them). Per channel::

        mean = pmean(mean_shard(x))
        var  = pmean(mean_shard((x - mean) ** 2))        # population variance
        n    = (values per channel in a shard) * axis_size(axis_name)

    and the running variance takes ``var * n / (n - 1)``, the unbiased variance of the
    whole batch. So ``S`` shards of equal batches give what one ``BatchNorm`` gives on
    their concatenation: outputs, new running statistics and gradients. As torch, the
    statistics are synchronized only in training: with ``track_running_stats=False`` and
    ``train=False`` each shard normalizes with its own batch. With ``axis_name=None``
    (the default) it is ``BatchNorm`` exactly. Matches ``torch.nn.SyncBatchNorm(C)`` run
    by every process of a group.

    Args:
      eps: added to the variance inside the square root; must be > 0. Default ``1e-5``.
      momentum: weight of the new batch in the running averages, in ``[0, 1]``, or None
        for a cumulative average. Default ``0.1``.
      affine: learn per-channel ``weight`` and ``bias``. Default ``True``.
      track_running_stats: keep running statistics (state) for evaluation. Default ``True``.
      bias: learn ``bias`` too (with ``affine``). Default ``True``.
      weight_init: initializer for ``weight``. Default ones.
      bias_init: initializer for ``bias``. Default zeros.
      axis_name: the named axis (or a tuple of them) to reduce the statistics over, in
        place of torch's ``process_group``. Default ``None``: this shard alone.

    Shape:
      input ``(N, C, *)``, rank >= 2; output the same shape and dtype.

    Parameters:
      ``weight``: ``(C,)``, ones. ``bias``: ``(C,)``, zeros.

    Buffers:
      ``running_mean``: ``(C,)``, zeros. ``running_var``: ``(C,)``, ones.
      ``num_batches_tracked``: int32 scalar, 0 (from ``init_state``).

    Example:
      >>> bn = SyncBatchNorm(axis_name="shard")
      >>> x = jax.random.normal(jax.random.key(1), (2, 4, 3))   # 2 shards of (4, 3)
      >>> params, state = bn.init(jax.random.key(0), x[0].shape), bn.init_state(x[0].shape)
      >>> run = lambda x: bn.apply(params, x, state=state, train=True)
      >>> y, new = jax.vmap(run, axis_name="shard")(x)
      >>> y.shape, new["running_mean"].shape   # one running mean per shard, all equal
      ((2, 4, 3), (2, 3))
    """

    _ranks: ClassVar[tuple[int, ...]] = ()
    _layout: ClassVar[str] = "(N, C, *)"

    axis_name: str | tuple[str, ...] | None = None

    def __post_init__(self):
        super().__post_init__()
        names = self.axis_name if isinstance(self.axis_name, tuple) else (self.axis_name,)
        if self.axis_name is not None and not (
            names and all(isinstance(n, str) and n for n in names)
        ):
            raise config_error(
                "SyncBatchNorm",
                "axis_name",
                "None, an axis name or a tuple of them",
                self.axis_name,
            )

    def _batch_stats(self, xf: jax.Array, axes: tuple[int, ...], train: bool) -> tuple:
        if self.axis_name is None or not train:
            return super()._batch_stats(xf, axes, train)
        mean = jax.lax.pmean(jnp.mean(xf, axis=axes, keepdims=True), self.axis_name)
        centered = xf - mean
        var = jax.lax.pmean(jnp.mean(centered * centered, axis=axes, keepdims=True), self.axis_name)
        n = math.prod(xf.shape) // max(xf.shape[1], 1) * jax.lax.axis_size(self.axis_name)
        return mean, centered, var, n
