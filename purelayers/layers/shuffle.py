r"""Rearranging channels and pixels: ``PixelShuffle``, ``PixelUnshuffle`` and
``ChannelShuffle``. Each is one reshape, one transpose and one reshape (no copies of
values beyond the permutation; any dtype), so its gradient is the inverse permutation.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from purelayers.layers._checks import LayerError, check_int
from purelayers.layers.core import Layer, Params

__all__ = ["ChannelShuffle", "PixelShuffle", "PixelUnshuffle"]


def _need_rank(layer: str, x: jax.Array, layout: str) -> None:
    if x.ndim < 3:
        raise LayerError(
            layer, "input rank", f"at least 3 ({layout})", f"{x.ndim} (x.shape == {x.shape})"
        )


@dataclasses.dataclass(frozen=True)
class PixelShuffle(Layer):
    r"""Channels to space: ``y[..., c, h r + i, w r + j] = x[..., c r^2 + i r + j, h, w]``.

    ``(*, C r^2, H, W) -> (*, C, H r, W r)``. Matches
    ``torch.nn.PixelShuffle(upscale_factor)``.

    Args:
      upscale_factor: ``r``, a positive int.

    Shape:
      input ``(*, C * r^2, H, W)`` (any leading axes); output ``(*, C, H * r, W * r)``.

    Parameters: none.

    Example:
      >>> PixelShuffle(2).apply({}, jnp.arange(4.0).reshape(4, 1, 1))[0].tolist()
      [[0.0, 1.0], [2.0, 3.0]]
    """

    upscale_factor: int

    def __post_init__(self):
        check_int("PixelShuffle", "upscale_factor", self.upscale_factor)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        x = jnp.asarray(x)
        _need_rank("PixelShuffle", x, "(*, C * r^2, H, W)")
        r = self.upscale_factor
        *lead, c, h, w = x.shape
        if c % (r * r):
            raise LayerError(
                "PixelShuffle",
                "input channels (axis -3)",
                f"a multiple of upscale_factor^2 = {r * r}",
                f"{c} (x.shape == {x.shape})",
            )
        n = len(lead)
        y = x.reshape(*lead, c // (r * r), r, r, h, w)
        y = jnp.transpose(y, (*range(n), n, n + 3, n + 1, n + 4, n + 2))
        return y.reshape(*lead, c // (r * r), h * r, w * r)


@dataclasses.dataclass(frozen=True)
class PixelUnshuffle(Layer):
    r"""Space to channels: ``y[..., c r^2 + i r + j, h, w] = x[..., c, h r + i, w r + j]``.

    ``(*, C, H r, W r) -> (*, C r^2, H, W)``, the inverse of ``PixelShuffle(r)``. Matches
    ``torch.nn.PixelUnshuffle(downscale_factor)``.

    Args:
      downscale_factor: ``r``, a positive int.

    Shape:
      input ``(*, C, H * r, W * r)`` (any leading axes); output ``(*, C * r^2, H, W)``.
      An empty input comes back unchanged, as torch returns it.

    Parameters: none.

    Example:
      >>> PixelUnshuffle(2).apply({}, jnp.arange(4.0).reshape(1, 2, 2))[:, 0, 0].tolist()
      [0.0, 1.0, 2.0, 3.0]
    """

    downscale_factor: int

    def __post_init__(self):
        check_int("PixelUnshuffle", "downscale_factor", self.downscale_factor)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        x = jnp.asarray(x)
        _need_rank("PixelUnshuffle", x, "(*, C, H * r, W * r)")
        r = self.downscale_factor
        *lead, c, h, w = x.shape
        for axis, n in ((-2, h), (-1, w)):
            if n % r:
                raise LayerError(
                    "PixelUnshuffle",
                    f"input axis {axis} length",
                    f"a multiple of downscale_factor = {r}",
                    f"{n} (x.shape == {x.shape})",
                )
        if x.size == 0:
            return x  # torch returns an empty input as it is, whatever its shape
        k = len(lead)
        y = x.reshape(*lead, c, h // r, r, w // r, r)
        y = jnp.transpose(y, (*range(k), k, k + 2, k + 4, k + 1, k + 3))
        return y.reshape(*lead, c * r * r, h // r, w // r)


@dataclasses.dataclass(frozen=True)
class ChannelShuffle(Layer):
    r"""Interleaves channel groups: ``y[:, i * groups + g] = x[:, g * (C // groups) + i]``.

    Matches ``torch.nn.ChannelShuffle(groups)``.

    Args:
      groups: the number of groups, a positive int dividing the channels.

    Shape:
      input ``(N, C, *)`` (at least 3 axes); output the same shape.

    Parameters: none.

    Example:
      >>> ChannelShuffle(2).apply({}, jnp.arange(6.0).reshape(1, 6, 1))[0, :, 0].tolist()
      [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    """

    groups: int

    def __post_init__(self):
        check_int("ChannelShuffle", "groups", self.groups)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        x = jnp.asarray(x)
        _need_rank("ChannelShuffle", x, "(N, C, *)")
        g, (n, c, *rest) = self.groups, x.shape
        if c % g:
            raise LayerError(
                "ChannelShuffle",
                "input channels (axis 1)",
                f"a multiple of groups = {g}",
                f"{c} (x.shape == {x.shape})",
            )
        y = x.reshape(n, g, c // g, *rest)
        return jnp.swapaxes(y, 1, 2).reshape(x.shape)
