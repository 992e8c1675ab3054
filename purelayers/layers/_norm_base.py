"""Shared pieces of the normalization layers: checks, moments and per-channel affine."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

import purelayers.functional as F
from purelayers.init import Initializer, ones, zeros
from purelayers.layers._checks import (
    LayerError,
    broadcast_to_axis,
    check_float,
    is_float,
    need_axis,
    promote_float,
)
from purelayers.layers.core import Layer, Params, State


def _check_eps(layer: str, eps: Any) -> None:
    check_float(layer, "eps", eps, low=0.0, low_open=True)


def _need_float(layer: str, x: Any) -> None:
    if not is_float(x):
        raise LayerError(
            layer,
            "input dtype",
            "a floating dtype",
            jnp.result_type(x),
            "normalization layers take floating-point features; cast with x.astype(jnp.float32)",
        )


def _moments(xf: jax.Array, axes: tuple[int, ...]) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(mean, x - mean, var)`` over ``axes`` (kept): ``F.moments``, the statistics of
    ``BatchNorm``, ``GroupNorm`` and ``InstanceNorm``."""
    return F.moments(xf, axes)


shifted_moments = F.moments
two_pass_moments = F.moments_reference


def _affine_params(
    key: jax.Array,
    shape: tuple[int, ...],
    dtype: Any,
    weight: Initializer | None,
    bias: Initializer | None = None,
) -> Params:
    """``weight`` and ``bias`` of ``shape`` drawn by the given initializers (None: absent)."""
    wkey, bkey = jax.random.split(key)
    params: Params = {}
    if weight is not None:
        params["weight"] = weight(wkey, shape, dtype)
    if bias is not None:
        params["bias"] = bias(bkey, shape, dtype)
    return params


def _channel_affine(y: jax.Array, params: Params, affine: bool, bias: bool = True) -> jax.Array:
    """``y * weight + bias`` with per-channel parameters on axis 1, when ``affine`` (the
    ``bias`` only with ``bias``; a missing one is a ``KeyError``, never skipped)."""
    if affine:
        y = y * broadcast_to_axis(params["weight"].astype(y.dtype), y.ndim, 1)
        if bias:
            y = y + broadcast_to_axis(params["bias"].astype(y.dtype), y.ndim, 1)
    return y


def _channel_params(layer: Any, key: jax.Array, channels: int, dtype: Any) -> Params:
    """Per-channel ``weight`` and ``bias`` of a layer with ``affine``, ``bias`` and
    initializers."""
    if not layer.affine:
        return {}
    w, b = layer.weight_init or ones(), (layer.bias_init or zeros()) if layer.bias else None
    return _affine_params(key, (channels,), dtype, w, b)


def _affine_names(layer: Any) -> tuple[str, ...]:
    """The per-channel parameter names of a layer with ``affine`` and ``bias``."""
    if not layer.affine:
        return ()
    return ("weight", "bias") if layer.bias else ("weight",)


def _check_channels(layer: str, x: Any, channels: int | None, layout: str) -> None:
    """Axis 1 of ``x`` holds the ``channels`` the layer was initialized with."""
    if channels is not None:
        need_axis(
            layer,
            x,
            1,
            channels,
            "channels (axis 1)",
            f"x.shape == {tuple(jnp.shape(x))}; {layer} was initialized for {channels} "
            f"channels, laid out {layout}",
        )


def _width(tree: Any, name: str = "weight") -> int | None:
    return int(tree[name].shape[0]) if tree and name in tree else None


_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


@dataclasses.dataclass(frozen=True)
class _RunningStatsNorm(Layer):
    """Shared by the batch and instance norms (fields ``eps``, ``momentum``, ``affine``,
    ``track_running_stats``, ``bias`` and the initializers on the subclasses): their
    checks, parameter and buffer names, and state tree."""

    def __post_init__(self):
        _check_eps(self._name, self.eps)
        if self.momentum is not None:
            check_float(self._name, "momentum", self.momentum, low=0.0, high=1.0)

    @property
    def _name(self) -> str:
        return type(self).__name__

    def own_names(self) -> tuple[str, ...]:
        return _affine_names(self) + (_BUFFERS if self.track_running_stats else ())

    def _running_state(self, channels: int, dtype: Any) -> State:
        """The state tree for ``channels`` (empty without ``track_running_stats``)."""
        if not self.track_running_stats:
            return {}
        stat = promote_float(dtype)
        return {
            "running_mean": jnp.zeros((channels,), stat),
            "running_var": jnp.ones((channels,), stat),
            "num_batches_tracked": jnp.zeros((), jnp.int32),
        }

    def _need_state(self, state: State | None) -> None:
        """``track_running_stats`` needs the state tree passed in."""
        if self.track_running_stats and not state:
            name = self._name
            raise LayerError(
                name,
                "track_running_stats=True keeps running statistics in a state tree; pass "
                f"state= from {name}.init_state(shape) (or the model's init_state) and use "
                "the returned (y, new_state)",
                None,
                None,
            )
