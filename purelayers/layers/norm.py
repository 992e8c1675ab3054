"""Normalization: ``LayerNorm``, ``RMSNorm``, ``GroupNorm``; ``BatchNorm1d/2d/3d`` and
``SyncBatchNorm`` (defined in ``batchnorm``).

Statistics are computed in at least float32 (float64 stays float64), whatever the input
dtype, and the result is cast back to the input dtype. Variances are population
variances (``purelayers.functional.normalization``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

import purelayers.functional as F
from purelayers.init import Initializer, ones, zeros
from purelayers.layers._checks import LayerError, as_shape, check_int, promote_float
from purelayers.layers._norm_base import (
    _affine_names,
    _affine_params,
    _channel_affine,
    _channel_params,
    _check_channels,
    _check_eps,
    _moments,
    _need_float,
    _width,
)
from purelayers.layers.batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d, SyncBatchNorm
from purelayers.layers.core import Layer, Params

__all__ = [
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "GroupNorm",
    "LayerNorm",
    "RMSNorm",
    "SyncBatchNorm",
]


def _trailing(layer: str, shape: tuple[int, ...], ndim: int) -> tuple[int, ...]:
    """The last ``ndim`` axes of ``shape``, the axes a layer normalizes over."""
    if len(shape) < ndim:
        raise LayerError(
            layer,
            "input rank",
            f"at least normalized_ndim={ndim}",
            f"{len(shape)} (x.shape == {shape})",
        )
    return shape[len(shape) - ndim :]


def _check_trailing(layer: str, x: Any, params: Params, ndim: int) -> tuple[int, ...]:
    """Axes normalized over; with affine params, they must match ``weight``'s shape."""
    _need_float(layer, x)
    shape = tuple(jnp.shape(x))
    got = _trailing(layer, shape, ndim)
    if "weight" in params and got != tuple(params["weight"].shape):
        want = tuple(params["weight"].shape)
        rule = (
            f"the last axis of x must be {want[0]} (the width it was initialized with):"
            if ndim == 1
            else f"the last {ndim} axes of x must be {want} (the shape it was initialized with):"
        )
        raise LayerError(
            layer,
            rule,
            f"x.shape == (..., {', '.join(map(str, want))})",
            f"x.shape == {shape}",
            f"{layer} was initialized with input shape (..., {', '.join(map(str, want))}); "
            "pass init the shape this layer receives",
        )
    return got


def _affine(y: jax.Array, params: Params, ndim: int, weight: bool, bias: bool) -> jax.Array:
    """``y * weight + bias`` with parameters spanning the last ``ndim`` axes of ``y``; the
    flags say which the layer has (a missing one is a ``KeyError``, never skipped)."""
    lead = (1,) * (y.ndim - ndim)
    if weight:
        y = y * params["weight"].astype(y.dtype).reshape(lead + params["weight"].shape)
    if bias:
        y = y + params["bias"].astype(y.dtype).reshape(lead + params["bias"].shape)
    return y


def _trailing_input(layer: str, x: Any, params: Params, ndim: int) -> tuple[jax.Array, tuple]:
    """``x`` in its statistics dtype (at least float32) and the axes to normalize over."""
    _check_trailing(layer, x, params, ndim)
    axes = tuple(range(jnp.ndim(x) - ndim, jnp.ndim(x)))
    return jnp.asarray(x).astype(promote_float(jnp.result_type(x))), axes


@dataclasses.dataclass(frozen=True)
class LayerNorm(Layer):
    r"""Normalizes over the last axes: ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    ``mean`` and ``var`` (the population variance) are taken over the last
    ``normalized_ndim`` axes, whose sizes (``normalized_shape``) are read from ``init``'s
    ``shape``. Matches ``torch.nn.LayerNorm(x.shape[-normalized_ndim:])``.

    Worked example: the row ``[0, 0.002]`` has mean ``0.001`` and variance ``1e-6``, so
    with ``eps=1e-5`` it becomes ``[-0.001, 0.001] / sqrt(1.1e-5) = [-0.30151, 0.30151]``.

    Args:
      eps: added to the variance inside the square root; must be > 0. Default ``1e-5``.
      elementwise_affine: learn ``weight`` (and ``bias``). Default ``True``.
      bias: learn ``bias`` too (with ``elementwise_affine``). Default ``True``.
      normalized_ndim: how many trailing axes to normalize over. Default ``1``.
      weight_init: initializer for ``weight``. Default ones.
      bias_init: initializer for ``bias``. Default zeros.

    Shape:
      input ``(..., *normalized_shape)``; output the same shape and dtype (statistics in
      float32 or wider).

    Parameters:
      ``weight``: ``normalized_shape``, ones. ``bias``: ``normalized_shape``, zeros.

    Example:
      >>> ln = LayerNorm()
      >>> jax.tree.map(jnp.shape, ln.init(jax.random.key(0), (2, 4)))
      {'bias': (4,), 'weight': (4,)}
    """

    _: dataclasses.KW_ONLY
    eps: float = 1e-5
    elementwise_affine: bool = True
    bias: bool = True
    normalized_ndim: int = 1
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None

    def __post_init__(self):
        _check_eps("LayerNorm", self.eps)
        check_int("LayerNorm", "normalized_ndim", self.normalized_ndim)

    def own_names(self) -> tuple[str, ...]:
        if not self.elementwise_affine:
            return ()
        return ("weight", "bias") if self.bias else ("weight",)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        normalized = _trailing("LayerNorm", as_shape(shape), self.normalized_ndim)
        affine, bias = self.elementwise_affine, self.elementwise_affine and self.bias
        return _affine_params(
            key,
            normalized,
            dtype,
            (self.weight_init or ones()) if affine else None,
            (self.bias_init or zeros()) if bias else None,
        )

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        _check_trailing("LayerNorm", x, params, self.normalized_ndim)
        affine = self.elementwise_affine
        weight = params["weight"] if affine else None
        bias = params["bias"] if affine and self.bias else None
        return F.layer_norm(jnp.asarray(x), self.normalized_ndim, weight, bias, self.eps)


@dataclasses.dataclass(frozen=True)
class RMSNorm(Layer):
    r"""Root-mean-square normalization: ``y = x / sqrt(mean(x**2) + eps) * weight``.

    The mean is over the last ``normalized_ndim`` axes; no centering, no bias. Matches
    ``torch.nn.RMSNorm(x.shape[-normalized_ndim:])``.

    Worked example: ``arange(9).reshape(3, 3)`` with ``eps=1e-5``: the row ``[3, 4, 5]``
    has ``mean(x**2) = 50/3``, so it becomes ``[3, 4, 5] / 4.0825 =
    [0.7348, 0.9798, 1.2247]``; the row ``[0, 1, 2]`` becomes ``[0, 0.7746, 1.5492]``.

    Args:
      eps: added to the mean square inside the square root; must be > 0. Default
        ``None``: the machine epsilon of the computing dtype, as torch (its
        ``opmath`` type): float32's ``1.1920929e-07`` for float32, bfloat16 and
        float16 inputs, float64's ``2.22e-16`` for float64.
      elementwise_affine: learn ``weight``. Default ``True``.
      normalized_ndim: how many trailing axes to normalize over. Default ``1``.
      weight_init: initializer for ``weight``. Default ones.

    Shape:
      input ``(..., *normalized_shape)``; output the same shape and dtype (statistics in
      float32 or wider).

    Parameters:
      ``weight``: ``normalized_shape``, ones.

    Example:
      >>> rms = RMSNorm(eps=1e-5)
      >>> params = rms.init(jax.random.key(0), (3,))
      >>> np.asarray(rms.apply(params, jnp.array([3.0, 4.0, 5.0])), np.float64).round(4).tolist()
      [0.7348, 0.9798, 1.2247]
    """

    _: dataclasses.KW_ONLY
    eps: float | None = None
    elementwise_affine: bool = True
    normalized_ndim: int = 1
    weight_init: Initializer | None = None

    def __post_init__(self):
        if self.eps is not None:
            _check_eps("RMSNorm", self.eps)
        check_int("RMSNorm", "normalized_ndim", self.normalized_ndim)

    def own_names(self) -> tuple[str, ...]:
        return ("weight",) if self.elementwise_affine else ()

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        normalized = _trailing("RMSNorm", as_shape(shape), self.normalized_ndim)
        weight = (self.weight_init or ones()) if self.elementwise_affine else None
        return _affine_params(key, normalized, dtype, weight)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        xf, axes = _trailing_input("RMSNorm", x, params, self.normalized_ndim)
        eps = float(jnp.finfo(xf.dtype).eps) if self.eps is None else self.eps
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=axes, keepdims=True) + eps)
        y = _affine(y, params, self.normalized_ndim, self.elementwise_affine, False)
        return y.astype(jnp.result_type(x))


@dataclasses.dataclass(frozen=True)
class GroupNorm(Layer):
    r"""Normalizes groups of channels: ``y = (x - mean) / sqrt(var + eps) * weight + bias``.

    The channels (axis 1) are split into ``num_groups`` consecutive groups; ``mean`` and
    ``var`` (population variance) are taken per sample over each group's channels and all
    spatial positions. ``weight`` and ``bias`` are per channel. Matches
    ``torch.nn.GroupNorm(num_groups, x.shape[1])``; ``num_groups=1`` normalizes each
    sample over everything, ``num_groups=C`` is instance normalization.

    Args:
      num_groups: how many groups to split the channels into; must divide them.
      eps: added to the variance inside the square root; must be > 0. Default ``1e-5``.
      affine: learn per-channel ``weight`` and ``bias``. Default ``True``.
      bias: learn ``bias`` too (with ``affine``); ``False`` leaves it out, as
        ``torch.nn.GroupNorm(..., bias=False)``. Default ``True``.
      weight_init: initializer for ``weight``. Default ones.
      bias_init: initializer for ``bias``. Default zeros.

    Shape:
      input ``(N, C, *)``; output the same shape and dtype (statistics in float32 or
      wider).

    Parameters:
      ``weight``: ``(C,)``, ones. ``bias``: ``(C,)``, zeros.

    Example:
      >>> gn = GroupNorm(2, bias=False)
      >>> jax.tree.map(jnp.shape, gn.init(jax.random.key(0), (2, 4, 3)))
      {'weight': (4,)}
    """

    num_groups: int
    _: dataclasses.KW_ONLY
    eps: float = 1e-5
    affine: bool = True
    bias: bool = True
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None

    def __post_init__(self):
        check_int("GroupNorm", "num_groups", self.num_groups)
        _check_eps("GroupNorm", self.eps)

    def _check(self, shape: tuple[int, ...]) -> int:
        if len(shape) < 2:
            raise LayerError("GroupNorm", "input rank", "at least 2 (N, C, *)", len(shape))
        if shape[1] % self.num_groups:
            raise LayerError(
                "GroupNorm",
                f"channels (axis 1) must divide into num_groups={self.num_groups}:",
                f"a multiple of {self.num_groups}",
                f"{shape[1]} (x.shape == {shape})",
                "choose num_groups among the divisors of the channel count",
            )
        return shape[1]

    def own_names(self) -> tuple[str, ...]:
        return _affine_names(self)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        return _channel_params(self, key, self._check(as_shape(shape)), dtype)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        _need_float("GroupNorm", x)
        shape = tuple(jnp.shape(x))
        self._check(shape)
        _check_channels("GroupNorm", x, _width(params), "(N, C, *)")
        xf = jnp.asarray(x).astype(promote_float(jnp.result_type(x)))
        grouped = xf.reshape(shape[0], self.num_groups, math.prod(shape[1:]) // self.num_groups)
        _, centered, var = _moments(grouped, (2,))
        y = (centered * jax.lax.rsqrt(var + self.eps)).reshape(shape)
        return _channel_affine(y, params, self.affine, self.bias).astype(jnp.result_type(x))
