"""MXFP4 expert weights as gpt-oss publishes them, dequantized on load.

A quantized array ``W`` is stored as ``W_blocks`` (``uint8`` ``(E, rows, G, 16)``: two
FP4 e2m1 values per byte, the low nibble first) and ``W_scales`` (``uint8`` ``(E,
rows, G)``: one E8M0 exponent per 32 values, biased by 127). Value ``j`` of group ``g``
of row ``r`` is ``FP4[nibble] * 2 ** (scale - 127)``; the rows' ``G * 32`` values are
the input axis, so the dense array is ``(E, G * 32, rows)``, as transformers'
``convert_moe_packed_tensors`` makes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from purelayers.errors import CheckpointError

__all__ = ["FP4_VALUES", "Mxfp4Tensor", "dequantize_mxfp4", "unpack_mxfp4"]

# the 16 FP4 e2m1 values by their 4-bit code (sign bit last)
FP4_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    np.float32,
)


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray, dtype: Any = np.float32) -> np.ndarray:
    r"""The dense array of MXFP4 ``blocks`` ``(..., rows, G, B)`` and ``scales`` ``(...,
    rows, G)``: ``w[..., g * 2B + 2j + h, r] = FP4[nibble_h(blocks[..., r, g, j])] *
    2 ** (scales[..., r, g] - 127)`` (``h = 0`` the low nibble), of shape ``(..., G *
    2B, rows)`` in ``dtype``, as transformers' ``convert_moe_packed_tensors``.

    Example:
      >>> blocks = np.array([[[[0x21] * 16]]], np.uint8)  # codes 1 (0.5) and 2 (1.0)
      >>> dequantize_mxfp4(blocks, np.array([[[128]]], np.uint8))[0, :2, 0]
      array([1., 2.], dtype=float32)
    """
    blocks, scales = np.asarray(blocks, np.uint8), np.asarray(scales)
    *lead, rows, groups, width = blocks.shape
    values = np.empty((*lead, rows, groups, 2 * width), np.float32)
    values[..., 0::2] = FP4_VALUES[blocks & 0x0F]
    values[..., 1::2] = FP4_VALUES[blocks >> 4]
    power = np.exp2(scales.astype(np.int32) - 127).astype(np.float32)
    values *= power[..., None]
    dense = values.reshape(*lead, rows, groups * 2 * width)
    return np.swapaxes(dense, -1, -2).astype(dtype)


class Mxfp4Tensor:
    """A checkpoint's MXFP4 array read as its dense form, like a file's tensor: ``shape``,
    ``dtype`` (``bfloat16``, transformers' default; ``read(dtype=...)`` gives any), and
    ``read(index, dtype, out)``, which dequantizes one expert at a time (the packed
    bytes of one expert and its dense float32 copy are all it holds beyond the result)."""

    def __init__(self, name: str, blocks: Any, scales: Any):
        e, rows, groups, width = blocks.shape
        self.name, self.blocks, self.scales = name, blocks, scales
        self.shape = (e, groups * 2 * width, rows)
        self.dtype = np.dtype(ml_dtypes.bfloat16)

    def read(self, index: Any = None, dtype: Any = None, out: np.ndarray | None = None):
        dtype = np.dtype(self.dtype if dtype is None else dtype)
        select = () if index is None else tuple(index)
        first = select[0] if select else slice(None)
        experts = range(self.shape[0])[first]
        rest = select[1:]
        shape = np.broadcast_to(np.False_, self.shape)[select].shape
        if out is None:
            out = np.empty(shape, dtype)
        for i, e in enumerate(experts):
            part = (slice(e, e + 1),)
            dense = dequantize_mxfp4(self.blocks.read(part), self.scales.read(part))[0]
            np.copyto(out[i], dense[rest], casting="unsafe")
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.read(dtype=dtype)


def unpack_mxfp4(tensors: Mapping[str, Any], folder: Path | str = "") -> dict[str, Any]:
    """``tensors`` (a checkpoint's, by name) with each ``X_blocks``/``X_scales`` pair
    replaced by an ``Mxfp4Tensor`` named ``X``; other names unchanged. A block without
    its scales (or the reverse), or scales whose shape is not the blocks' without their
    last axis, is a ``CheckpointError`` naming each."""
    out: dict[str, Any] = {}
    problems = []
    for name, tensor in tensors.items():
        if name.endswith("_scales") and name[: -len("_scales")] + "_blocks" in tensors:
            continue
        if not name.endswith("_blocks"):
            if name.endswith("_scales"):
                problems.append(f"{name} has no {name[: -len('_scales')]}_blocks")
            out[name] = tensor
            continue
        base = name[: -len("_blocks")]
        scales = tensors.get(base + "_scales")
        if scales is None:
            problems.append(f"{name} has no {base}_scales")
        elif len(tensor.shape) != 4 or tuple(scales.shape) != tuple(tensor.shape[:-1]):
            problems.append(
                f"{base}_scales: expected the shape of {name} {tuple(tensor.shape)} without "
                f"its last axis, got {tuple(scales.shape)}"
            )
        else:
            out[base] = Mxfp4Tensor(base, tensor, scales)
    if problems:
        raise CheckpointError(folder, "MXFP4 weights do not pair up: " + "; ".join(problems))
    return out
