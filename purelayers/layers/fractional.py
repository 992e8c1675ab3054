r"""Fractional max pooling (Graham, 2014): ``FractionalMaxPool2d`` and
``FractionalMaxPool3d``.

Windows of ``kernel_size`` start at pseudo-random positions, so the output can shrink
the input by a non-integer factor. Per batch element, channel and spatial axis (input
length ``L``, output length ``out``, window ``k``) one sample ``u`` in ``[0, 1)`` gives
torch's window starts::

    alpha = (L - k) / (out - 1)
    start[i] = int((i + u) * alpha) - int(u * alpha)    for i < out - 1
    start[out - 1] = L - k

computed in the input's dtype, as torch. Each output element is the max over its window,
torch's element among ties (the first maximum in row-major order, the last NaN), which
is where its gradient goes.

The samples are drawn from ``key`` (``samples(key, x.shape)``: uniform, shape ``(N, C,
nd)``, ``N = 1`` for an unbatched input), in every mode: torch draws new ones on every
call, in training and evaluation alike, so ``key`` is required and the same key gives
the same output. ``random_samples=`` gives them instead (torch's ``_random_samples``, of
at least ``N`` rows: as torch, the first ``N`` are used, also for an unbatched input);
in 2-d, ``[..., 0]`` is the width's and ``[..., 1]`` the height's sample, as torch; in
3-d, ``[..., 0]``, ``[..., 1]``, ``[..., 2]`` are depth, height, width.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.layers._checks import LayerError
from purelayers.layers._maxindex import max_by_table
from purelayers.layers._spatial import batched, need_nonempty, ntuple, unbatched
from purelayers.layers.core import Layer, Params

__all__ = ["FractionalMaxPool2d", "FractionalMaxPool3d"]


def _starts(u: jax.Array, n: int, out: int, k: int) -> jax.Array:
    """torch's ``generate_intervals``: window starts ``(..., out)`` from samples ``u``."""
    last = jnp.full((*u.shape, 1), n - k, jnp.int32)
    if out == 1:
        return last
    alpha = jnp.asarray(n - k, u.dtype) / jnp.asarray(out - 1, u.dtype)
    i = jnp.arange(out - 1).astype(u.dtype).reshape((1,) * u.ndim + (-1,))
    u = u[..., None]
    seq = ((i + u) * alpha).astype(jnp.int32) - (u * alpha).astype(jnp.int32)
    return jnp.concatenate([seq, last], axis=-1)


@dataclasses.dataclass(frozen=True)
class _FractionalMaxPoolNd(Layer):
    accepts: ClassVar[tuple[str, ...]] = ("floating",)
    _nd: ClassVar[int] = 2

    kernel_size: int | tuple[int, ...]
    output_size: int | tuple[int, ...] | None = None
    output_ratio: float | tuple[float, ...] | None = None
    return_indices: bool = False

    def __post_init__(self):
        name, nd = type(self).__name__, self._nd
        k = ntuple(name, "kernel_size", self.kernel_size, nd, minimum=1)
        object.__setattr__(self, "kernel_size", k)
        if (self.output_size is None) == (self.output_ratio is None):
            raise ValueError(
                f"{name}: give exactly one of output_size and output_ratio, got "
                f"output_size={self.output_size!r}, output_ratio={self.output_ratio!r}"
            )
        if self.output_size is not None:
            size = ntuple(name, "output_size", self.output_size, nd, minimum=1)
            object.__setattr__(self, "output_size", size)
        else:
            r = self.output_ratio
            ratios = tuple(r) if isinstance(r, Sequence) else (r,) * nd

            def fraction(v: Any) -> bool:
                real = isinstance(v, (int, float)) and not isinstance(v, bool)
                return real and 0 < v < 1

            if len(ratios) != nd or not all(map(fraction, ratios)):
                raise ValueError(
                    f"{name}: output_ratio must be in (0, 1), or a tuple of {nd} such numbers, "
                    f"got {r!r}"
                )
            object.__setattr__(self, "output_ratio", tuple(float(v) for v in ratios))

    def samples(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> jax.Array:
        """The uniform samples ``(N, C, nd)`` this layer draws from ``key`` for an input
        of ``shape`` (``N = 1`` when unbatched), as ``apply(..., key=key)`` does."""
        shape = tuple(shape)
        lead = (1, shape[0]) if len(shape) == self._nd + 1 else tuple(shape[:2])
        return jax.random.uniform(key, (*lead, self._nd), dtype)

    def _out(self, spatial: Sequence[int]) -> tuple[int, ...]:
        name = type(self).__name__
        if self.output_size is not None:
            out = self.output_size
        else:
            out = tuple(int(n * r) for n, r in zip(spatial, self.output_ratio, strict=True))
        for axis, (n, o, k) in enumerate(zip(spatial, out, self.kernel_size, strict=True)):
            if o < 1 or o + k - 1 > n:
                raise LayerError(
                    name, f"output size along spatial axis {axis}",
                    f"between 1 and L - kernel_size + 1 = {n - k + 1}", o,
                    f"input length {n}, kernel_size {k}: a window must fit at every start",
                )  # fmt: skip
        return out

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
        random_samples: Any = None,
    ):
        name, nd = type(self).__name__, self._nd
        x, added = batched(name, x, nd)
        need_nonempty(name, x)
        spatial = x.shape[2:]
        out = self._out(spatial)
        if random_samples is None:
            if key is None:
                raise LayerError(
                    name,
                    "draws its windows at random in every mode (as torch) and needs a PRNG "
                    "key; pass key=jax.random.key(seed), or random_samples=",
                    None,
                    None,
                )
            u = self.samples(key, x.shape, x.dtype)
        else:
            u = jnp.asarray(random_samples, x.dtype)
            if u.ndim != 3 or u.shape[0] < x.shape[0] or u.shape[1:] != (x.shape[1], nd):
                raise LayerError(
                    name, "random_samples shape", (*x.shape[:2], nd), u.shape,
                    "one sample in [0, 1) per batch element, channel and spatial axis (more "
                    "rows than the batch are allowed: the first ones are used, as in torch)",
                )  # fmt: skip
            u = u[: x.shape[0]]  # as torch: the first rows, more than the batch allowed
        # torch's 2-d kernel reads the width's sample first; the 3-d one depth first
        order = (1, 0) if nd == 2 else tuple(range(nd))
        strides = [math.prod(spatial[a + 1 :]) for a in range(nd)]
        table = jnp.zeros((*x.shape[:2],) + (1,) * (2 * nd), jnp.int32)
        for a in range(nd):
            starts = _starts(u[..., order[a]], spatial[a], out[a], self.kernel_size[a])
            pos = starts[..., None] + jnp.arange(self.kernel_size[a]).reshape((1, 1, 1, -1))
            shape = [1] * (2 * nd)
            shape[a], shape[nd + a] = out[a], self.kernel_size[a]
            table = table + pos.reshape((*x.shape[:2], *shape)) * strides[a]
        table = table.reshape((*x.shape[:2], *out, math.prod(self.kernel_size)))
        y, idx = max_by_table(x, nd, table)
        if self.return_indices:
            return unbatched(y, added), unbatched(idx, added)
        return unbatched(y, added)


@dataclasses.dataclass(frozen=True)
class FractionalMaxPool2d(_FractionalMaxPoolNd):
    r"""Fractional max pooling of images: ``y[i] = max(x[start[i] : start[i] + k])`` per axis.

    Matches ``torch.nn.FractionalMaxPool2d``; the window starts come from one uniform draw
    per sample, channel and axis (``apply(..., key=)`` or ``random_samples=``; see
    the module docstring).

    Args:
      kernel_size: window size ``k``, an int or a pair ``(kH, kW)``.
      output_size: the output's spatial size, an int or one per axis. Default ``None``.
      output_ratio: the output's size as a fraction in ``(0, 1)`` of the input's, one or one
        per axis (``int(L * ratio)``). Default ``None``; give exactly one of the two.
      return_indices: also return ``(y, indices)``, each selected element's flat position
        in its channel, ``MaxUnpool2d``'s input. Default ``False``.

    Shape:
      input ``(N, C, H, W)`` or without ``N``, floating point; output ``(N, C, *out)``, with
      ``out + k - 1 <= L`` per axis.

    Parameters: none.

    Example:
      >>> pool = FractionalMaxPool2d(2, output_size=3)
      >>> run = jax.jit(lambda x, key: pool.apply({}, x, key=key))
      >>> run(jnp.ones((1, 1, 5, 5)), jax.random.key(0)).shape
      (1, 1, 3, 3)
    """

    _nd: ClassVar[int] = 2


@dataclasses.dataclass(frozen=True)
class FractionalMaxPool3d(_FractionalMaxPoolNd):
    r"""Fractional max pooling of volumes: ``y[i] = max(x[start[i] : start[i] + k])`` per axis.

    Matches ``torch.nn.FractionalMaxPool3d``; the window starts come from one uniform draw
    per sample, channel and axis (``apply(..., key=)`` or ``random_samples=``; see
    the module docstring).

    Args:
      kernel_size: window size ``k``, an int or a triple ``(kD, kH, kW)``.
      output_size: the output's spatial size, an int or one per axis. Default ``None``.
      output_ratio: the output's size as a fraction in ``(0, 1)`` of the input's, one or one
        per axis (``int(L * ratio)``). Default ``None``; give exactly one of the two.
      return_indices: also return ``(y, indices)``, each selected element's flat position
        in its channel, ``MaxUnpool3d``'s input. Default ``False``.

    Shape:
      input ``(N, C, D, H, W)`` or without ``N``, floating point; output ``(N, C, *out)``, with
      ``out + k - 1 <= L`` per axis.

    Parameters: none.

    Example:
      >>> pool = FractionalMaxPool3d(2, output_ratio=0.5)
      >>> pool.apply({}, jnp.ones((1, 2, 4, 6, 8)), key=jax.random.key(0)).shape
      (1, 2, 2, 3, 4)
    """

    _nd: ClassVar[int] = 3
