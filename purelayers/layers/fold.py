r"""Sliding blocks: ``Unfold`` (im2col) and ``Fold`` (col2im, its transpose), over the
two spatial axes of ``(N, C, H, W)`` inputs, in torch's ``(N, C * kh * kw, L)`` layout.

Per spatial axis of length ``n`` the number of blocks is ``floor((n + 2 * padding -
dilation * (kernel_size - 1) - 1) / stride) + 1``, and ``L`` is their product (blocks
row-major). Column ``c * kh * kw + i * kw + j`` of block ``(bh, bw)`` holds the
zero-padded input at ``(bh * sh + i * dh, bw * sw + j * dw)``.

Both run one strided slice (``Unfold``) or one strided scatter-add (``Fold``) per kernel
tap, not per pixel; ``Fold`` sums overlapping blocks, so ``Fold``'s gradient is
``Unfold`` of the output gradient and ``Unfold``'s is ``Fold``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from purelayers.layers._checks import LayerError
from purelayers.layers._spatial import ntuple, tap_windows
from purelayers.layers.core import Layer, Params

__all__ = ["Fold", "Unfold"]


@dataclasses.dataclass(frozen=True)
class _Blocks(Layer):
    """Shared settings and block arithmetic."""

    kernel_size: int | tuple[int, int]
    dilation: int | tuple[int, int] = 1
    padding: int | tuple[int, int] = 0
    stride: int | tuple[int, int] = 1

    def __post_init__(self):
        name = type(self).__name__
        for arg, least in (("kernel_size", 1), ("dilation", 1), ("padding", 0), ("stride", 1)):
            object.__setattr__(self, arg, ntuple(name, arg, getattr(self, arg), 2, minimum=least))

    def _blocks(self, spatial: tuple[int, ...], what: str) -> tuple[int, int]:
        blocks = tuple(
            (n + 2 * p - d * (k - 1) - 1) // s + 1
            for n, k, d, p, s in zip(
                spatial, self.kernel_size, self.dilation, self.padding, self.stride, strict=True
            )
        )
        if min(blocks) < 1:
            raise LayerError(
                type(self).__name__,
                f"sliding blocks per spatial axis of {what} {spatial}",
                "at least 1",
                f"{blocks} (kernel_size={self.kernel_size}, dilation={self.dilation}, "
                f"padding={self.padding}, stride={self.stride})",
            )
        return blocks  # type: ignore[return-value]

    def _windows(self, blocks: tuple[int, int]) -> list[tuple[slice, ...]]:
        """The strided slices of the padded image read by each kernel tap, in order."""
        return tap_windows(self.kernel_size, self.dilation, self.stride, blocks)


def _batched(
    layer: str, x: jax.Array, ranks: tuple[int, int], layout: str
) -> tuple[jax.Array, bool]:
    if x.ndim not in ranks:
        raise LayerError(
            layer,
            "input rank",
            f"{ranks[1]} {layout} or {ranks[0]} (unbatched)",
            f"{x.ndim} (x.shape == {x.shape})",
        )
    added = x.ndim == ranks[0]
    xb = x[None] if added else x
    empty = [a for a in range(1, xb.ndim) if xb.shape[a] == 0]
    if empty:
        raise LayerError(
            layer,
            f"input axis {empty[0] - added} length",
            "at least 1 (only the batch axis may be empty, as in torch)",
            f"0 (x.shape == {x.shape})",
        )
    return xb, added


@dataclasses.dataclass(frozen=True)
class Unfold(_Blocks):
    r"""Extracts sliding blocks as columns (im2col): ``y[n, c * K + t, l] = x[n, c, pos_l[t]]``.

    Block ``l``'s tap ``t`` (row-major in the ``(kh, kw)`` window, ``K = kh * kw``) reads
    ``pos_l[t]`` in the zero-padded image. Matches ``torch.nn.Unfold(kernel_size, dilation,
    padding, stride)``.

    Args:
      kernel_size: the block size, an int or ``(kh, kw)``.
      dilation: spacing between block taps. Default ``1``.
      padding: implicit zeros on both sides of each spatial axis. Default ``0``.
      stride: step between blocks. Default ``1``.

    Shape:
      input ``(N, C, H, W)`` or ``(C, H, W)``; output ``(N, C * kh * kw, L)`` (or
      ``(C * kh * kw, L)``), ``L`` the number of blocks.

    Parameters: none.

    Example:
      >>> Unfold(2).apply({}, jnp.arange(6.0).reshape(1, 2, 3)).tolist()
      [[0.0, 1.0], [1.0, 2.0], [3.0, 4.0], [4.0, 5.0]]
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating", "bool")

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        xb, added = _batched("Unfold", jnp.asarray(x), (3, 4), "(N, C, H, W)")
        n, c = xb.shape[:2]
        blocks = self._blocks(tuple(xb.shape[2:]), "the input")
        pads = [(0, 0, 0)] * 2 + [(p, p, 0) for p in self.padding]
        xp = lax.pad(xb, jnp.zeros((), xb.dtype), pads)
        cols = jnp.stack([xp[(slice(None), slice(None), *w)] for w in self._windows(blocks)], 2)
        y = cols.reshape(n, c * len(self._windows(blocks)), blocks[0] * blocks[1])
        return y[0] if added else y


@dataclasses.dataclass(frozen=True, init=False)
class Fold(_Blocks):
    r"""Sums block columns into an image (col2im): ``y[n, c, pos_l[t]] += x[n, c * K + t, l]``.

    Block ``l``'s tap ``t`` (row-major in the ``(kh, kw)`` window, ``K = kh * kw``) lands at
    ``pos_l[t]`` in the padded image; overlapping entries add up, the transpose of
    ``Unfold``. Matches ``torch.nn.Fold(output_size, kernel_size, dilation, padding,
    stride)``.

    Args:
      output_size: the image size ``(H, W)``, or an int for both.
      kernel_size: the block size, an int or ``(kh, kw)``.
      dilation: spacing between block taps. Default ``1``.
      padding: implicit zeros on both sides (dropped from the sum). Default ``0``.
      stride: step between blocks. Default ``1``.

    Shape:
      input ``(N, C * kh * kw, L)`` or ``(C * kh * kw, L)``, ``L`` the number of blocks
      that fit ``output_size``; output ``(N, C, H, W)`` (or ``(C, H, W)``).

    Parameters: none.

    Example:
      >>> Fold((1, 3), (1, 2)).apply({}, jnp.ones((2, 2))).tolist()
      [[[1.0, 2.0, 1.0]]]
    """

    output_size: int | tuple[int, int] = dataclasses.field(kw_only=True)

    def __init__(
        self,
        output_size: int | tuple[int, int],
        kernel_size: int | tuple[int, int],
        dilation: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        stride: int | tuple[int, int] = 1,
    ):
        for name, value in (
            ("output_size", output_size), ("kernel_size", kernel_size), ("dilation", dilation),
            ("padding", padding), ("stride", stride),
        ):  # fmt: skip
            object.__setattr__(self, name, value)
        self.__post_init__()

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    def __post_init__(self):
        super().__post_init__()
        out = ntuple("Fold", "output_size", self.output_size, 2, minimum=1)
        object.__setattr__(self, "output_size", out)
        reach = [
            (n + 2 * p - d * (k - 1) - 1) // s + 1
            for n, k, d, p, s in zip(
                out, self.kernel_size, self.dilation, self.padding, self.stride, strict=True
            )
        ]
        if min(reach) < 1:
            raise ValueError(
                f"Fold: output_size must hold at least one sliding block per axis, got {out} "
                f"(blocks per axis {tuple(reach)} for kernel_size={self.kernel_size}, "
                f"dilation={self.dilation}, padding={self.padding}, stride={self.stride})"
            )

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        xb, added = _batched("Fold", jnp.asarray(x), (2, 3), "(N, C * kh * kw, L)")
        n, ck, length = xb.shape
        taps = self.kernel_size[0] * self.kernel_size[1]
        if ck % taps:
            raise LayerError(
                "Fold",
                "input axis 1 length (C * kh * kw)",
                f"a multiple of kh * kw = {taps} (kernel_size={self.kernel_size})",
                f"{ck} (x.shape == {tuple(x.shape)})",
            )
        blocks = self._blocks(self.output_size, "output_size")
        if length != blocks[0] * blocks[1]:
            raise LayerError(
                "Fold",
                "input axis -1 length (the number of blocks L)",
                f"{blocks[0]} * {blocks[1]} = {blocks[0] * blocks[1]} (the blocks that fit "
                f"output_size={self.output_size})",
                f"{length} (x.shape == {tuple(x.shape)})",
            )
        cols = xb.reshape(n, ck // taps, taps, *blocks)
        size = [o + 2 * p for o, p in zip(self.output_size, self.padding, strict=True)]
        y = jnp.zeros((n, ck // taps, *size), xb.dtype)
        for t, w in enumerate(self._windows(blocks)):
            y = y.at[(slice(None), slice(None), *w)].add(cols[:, :, t])
        (ph, pw), (h, w) = self.padding, self.output_size
        y = y[:, :, ph : ph + h, pw : pw + w]
        return y[0] if added else y
