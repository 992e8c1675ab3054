"""The checkpoint format's names and dtypes: the file names of Hugging Face's layouts, the
metadata keys this library adds, the dtypes a file holds under the ``safetensors``
package's codes, and one tensor to write (``Entry``)."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from typing import NamedTuple

import ml_dtypes
import numpy as np
import safetensors

__all__ = [
    "ALIASES_KEY",
    "CODES",
    "DTYPES",
    "INDEX_NAME",
    "ORDER_KEY",
    "RESERVED",
    "SHARD_RE",
    "SINGLE_NAME",
    "Entry",
    "host_bytes",
]

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
ORDER_KEY = "purelayers.order"  # metadata: the JSON list of names in their saved order
ALIASES_KEY = "purelayers.aliases"  # metadata: the JSON {alias: original} of tied names written
RESERVED = (ORDER_KEY, ALIASES_KEY)
# Shards of a sharded checkpoint: Hugging Face's names, or (a save into a folder whose
# index names those already) the same with ``.alt`` before the extension, so the new
# shards never replace the ones the current index names (see ``write_sharded``).
SHARD_RE = re.compile(r"model-\d{5}-of-\d{5}(\.alt)?\.safetensors")

# The dtypes checkpoints hold, under the package's own codes ("F32", "BF16", ...).
_STORABLE = (np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64)
_STORABLE += (np.int64, np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64)
_STORABLE += (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e8m0fnu)


def _code(dtype: np.dtype) -> str:
    return safetensors.TensorSpec(dtype=dtype.name, shape=[0], data_ptr=0, data_len=0).dtype


DTYPES: dict[str, np.dtype] = {_code(np.dtype(t)): np.dtype(t) for t in _STORABLE}
CODES: dict[np.dtype, str] = {dt: code for code, dt in DTYPES.items()}


class Entry(NamedTuple):
    """One tensor to write: its name, file dtype and shape, and how to fetch its data."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    fetch: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def host_bytes(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``array`` as a contiguous little-endian host array of ``dtype``."""
    array = np.asarray(array).astype(dtype, order="C", copy=False)  # 0-d stays 0-d
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and sys.byteorder == "big"):
        array = array.byteswap()
    return array
