r"""The partial inverse of max pooling: ``MaxUnpool1d``, ``MaxUnpool2d`` and
``MaxUnpool3d``.

``apply(params, x, indices, output_size=None)`` scatters each element of ``x`` into a
zero output at its flat per-channel position ``indices`` (as ``MaxPoolNd(...,
return_indices=True)`` returns them); every other output element is zero. The gradient
with respect to ``x`` gathers the output's gradient at ``indices``, as torch's.

Per spatial axis the output size is ``(L - 1) * stride - 2 * padding + kernel_size``,
unless ``output_size`` (``nd`` ints, or ``nd + 2`` with the batch and channel axes,
which are ignored) gives it: each must lie strictly between that default minus and plus
``stride``, torch's check (a pool with ``ceil_mode`` or a remainder loses up to
``stride - 1`` elements an explicit size restores).

Where two indices of a channel coincide, the later one (in row-major order of ``x``)
is written, as torch's CPU kernel; its gradient reaches both, as torch's. An index
outside ``[0, prod(output size))`` is a ``LayerError`` naming it, as torch raises at run
time; traced indices (under ``jit``), not known when the error could be raised, make
the whole output NaN instead of being dropped.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

import purelayers.functional as F
from purelayers.layers._checks import LayerError, need_known_in_range
from purelayers.layers._spatial import batched, is_int, need_nonempty, ntuple, unbatched
from purelayers.layers.core import Layer, Params

__all__ = ["MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d"]


@dataclasses.dataclass(frozen=True)
class _MaxUnpoolNd(Layer):
    accepts: ClassVar[tuple[str, ...]] = ("floating",)
    _nd: ClassVar[int] = 2

    kernel_size: int | tuple[int, ...]
    stride: int | tuple[int, ...] | None = None
    padding: int | tuple[int, ...] = 0

    def __post_init__(self):
        name, nd = type(self).__name__, self._nd
        k = ntuple(name, "kernel_size", self.kernel_size, nd, minimum=1)
        object.__setattr__(self, "kernel_size", k)
        stride = k if self.stride is None else self.stride
        object.__setattr__(self, "stride", ntuple(name, "stride", stride, nd, minimum=1))
        object.__setattr__(self, "padding", ntuple(name, "padding", self.padding, nd, minimum=0))

    def _sizes(self, spatial: Sequence[int], output_size: Any) -> tuple[int, ...]:
        name, nd = type(self).__name__, self._nd
        default = tuple(
            (n - 1) * s - 2 * p + k
            for n, k, s, p in zip(spatial, self.kernel_size, self.stride, self.padding, strict=True)
        )
        if output_size is None:
            if min(default) < 1:
                raise LayerError(
                    name, "output size per spatial axis", ">= 1", default,
                    f"(L - 1) * stride - 2 * padding + kernel_size for L = {tuple(spatial)}",
                )  # fmt: skip
            return default
        size = tuple(output_size) if isinstance(output_size, Sequence) else None
        if size is None or len(size) not in (nd, nd + 2) or not all(map(is_int, size)):
            raise LayerError(
                name, "output_size", f"a sequence of {nd} or {nd + 2} integers", output_size
            )
        size = tuple(int(v) for v in size[-nd:])
        for d, (want, got, s) in enumerate(zip(default, size, self.stride, strict=True)):
            if not want - s < got < want + s:
                raise LayerError(
                    name, f"output_size[{d}]", f"strictly between {want - s} and {want + s}", got,
                    f"the default size is {default}; an explicit one may differ from it by "
                    "less than stride (torch's rule)",
                )  # fmt: skip
        return size

    def apply(
        self,
        params: Params,
        x: Any,
        indices: Any,
        output_size: Sequence[int] | None = None,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        name, nd = type(self).__name__, self._nd
        x, added = batched(name, x, nd)
        indices = jnp.asarray(indices)
        if not jnp.issubdtype(indices.dtype, jnp.integer):
            raise LayerError(name, "indices dtype", "integer", indices.dtype)
        if indices.shape != (x.shape[1:] if added else x.shape):
            raise LayerError(
                name, "indices shape", f"x's shape {x.shape[1:] if added else x.shape}",
                indices.shape,
            )  # fmt: skip
        traced = isinstance(indices, jax.core.Tracer)
        need_nonempty(name, x)
        size = self._sizes(x.shape[2:], output_size)
        lead, n, total = x.shape[:2], math.prod(x.shape[2:]), math.prod(size)
        need_known_in_range(  # known values (also a concrete array inside jit)
            name,
            "indices",
            indices,
            0,
            total - 1,
            f"in [0, {total}) (the output's {size} positions per channel)",
            "as torch's, which raises on an invalid max index",
        )
        indices = indices[None] if added else indices
        flat = F.max_unpool(x.reshape((*lead, n)), indices.reshape((*lead, n)), total)
        y = flat.reshape((*lead, *size))
        if traced and jnp.issubdtype(y.dtype, jnp.inexact):
            out_of_range = (indices < 0) | (indices >= total)
            y = jnp.where(out_of_range.any(), jnp.nan, y)  # not known when traced: NaN, no drop
        return unbatched(y, added)


@dataclasses.dataclass(frozen=True)
class MaxUnpool1d(_MaxUnpoolNd):
    r"""Scatters into zeros: ``y.flat[indices[n, c, i]] = x[n, c, i]`` per channel, ``0`` elsewhere.

    The partial inverse of ``MaxPool1d(..., return_indices=True)``; ``apply(params, x,
    indices, output_size=None)``. Matches ``torch.nn.MaxUnpool1d``.

    Args:
      kernel_size: the pool's window size, an int.
      stride: the pool's step, as ``kernel_size``. Default ``None`` (``kernel_size``).
      padding: the pool's padding. Default ``0``.

    Shape:
      ``x`` ``(N, C, L)`` or without ``N``, floating point; ``indices`` integers of the
      same shape; output ``(N, C, L_out)``, per axis ``(L - 1) * stride - 2 * padding +
      kernel_size`` unless ``output_size`` gives it (within ``stride`` of that).

    Parameters: none.

    Example:
      >>> y, idx = L.MaxPool1d(2, return_indices=True).apply({}, jnp.array([[[1.0, 3, 4, 2]]]))
      >>> MaxUnpool1d(2).apply({}, y, idx).tolist()
      [[[0.0, 3.0, 4.0, 0.0]]]
    """

    _nd: ClassVar[int] = 1


@dataclasses.dataclass(frozen=True)
class MaxUnpool2d(_MaxUnpoolNd):
    r"""Scatters into zeros: ``y.flat[indices[n, c, i]] = x[n, c, i]`` per channel, ``0`` elsewhere.

    The partial inverse of ``MaxPool2d(..., return_indices=True)``; ``apply(params, x,
    indices, output_size=None)``. Matches ``torch.nn.MaxUnpool2d``.

    Args:
      kernel_size: the pool's window size, an int or a pair ``(kH, kW)``.
      stride: the pool's step, as ``kernel_size``. Default ``None`` (``kernel_size``).
      padding: the pool's padding. Default ``0``.

    Shape:
      ``x`` ``(N, C, H, W)`` or without ``N``, floating point; ``indices`` integers of the
      same shape; output ``(N, C, H_out, W_out)``, per axis ``(L - 1) * stride - 2 * padding +
      kernel_size`` unless ``output_size`` gives it (within ``stride`` of that).

    Parameters: none.

    Example:
      >>> x = jnp.arange(16.0).reshape(1, 1, 4, 4)
      >>> y, idx = L.MaxPool2d(2, return_indices=True).apply({}, x)
      >>> MaxUnpool2d(2).apply({}, y, idx)[0, 0, 1::2].tolist()  # rows 0 and 2 are zeros
      [[0.0, 5.0, 0.0, 7.0], [0.0, 13.0, 0.0, 15.0]]
    """

    _nd: ClassVar[int] = 2


@dataclasses.dataclass(frozen=True)
class MaxUnpool3d(_MaxUnpoolNd):
    r"""Scatters into zeros: ``y.flat[indices[n, c, i]] = x[n, c, i]`` per channel, ``0`` elsewhere.

    The partial inverse of ``MaxPool3d(..., return_indices=True)``; ``apply(params, x,
    indices, output_size=None)``. Matches ``torch.nn.MaxUnpool3d``.

    Args:
      kernel_size: the pool's window size, an int or a triple ``(kD, kH, kW)``.
      stride: the pool's step, as ``kernel_size``. Default ``None`` (``kernel_size``).
      padding: the pool's padding. Default ``0``.

    Shape:
      ``x`` ``(N, C, D, H, W)`` or without ``N``, floating point; ``indices`` integers of the
      same shape; output ``(N, C, D_out, H_out, W_out)``, per axis ``(L - 1) * stride - 2 * padding +
      kernel_size`` unless ``output_size`` gives it (within ``stride`` of that).

    Parameters: none.

    Example:
      >>> y, idx = L.MaxPool3d(2, return_indices=True).apply({}, jnp.ones((1, 2, 4, 4, 5)))
      >>> MaxUnpool3d(2).apply({}, y, idx, output_size=(4, 4, 5)).shape
      (1, 2, 4, 4, 5)
    """

    _nd: ClassVar[int] = 3
