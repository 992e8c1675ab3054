"""Checkpoint files through the ``safetensors`` package, and Hugging Face's sharded layout.

The safetensors format itself (header, offsets, alignment, validation) is the
``safetensors`` package's: files are written with ``safetensors.serialize_file`` and read
with ``safetensors.safe_open``. Here we add what a checkpoint needs around it:

- atomic writes: every file is written under a temporary name in its final folder,
  fsynced, then renamed over the final name, and the folder is fsynced;
- the name order: the package lays the header out by dtype, then name, so the names'
  own (PyTorch) order is kept in the metadata under ``ORDER_KEY`` and restored on read;
- errors that name the file: the package's own errors carry no path;
- the sharded layout, ``model-0000i-of-0000K.safetensors`` plus
  ``model.safetensors.index.json``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np
import safetensors

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
ORDER_KEY = "purelayers.order"  # metadata: the JSON list of names in their saved order
_SHARD_RE = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")

# The dtypes checkpoints hold, under the package's own codes ("F32", "BF16", ...).
_STORABLE = (np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64)
_STORABLE += (np.int64, np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.complex64)
_STORABLE += (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)


def _code(dtype: np.dtype) -> str:
    return safetensors.TensorSpec(dtype=dtype.name, shape=[0], data_ptr=0, data_len=0).dtype


DTYPES: dict[str, np.dtype] = {_code(np.dtype(t)): np.dtype(t) for t in _STORABLE}
CODES: dict[np.dtype, str] = {dt: code for code, dt in DTYPES.items()}
# safe_open(framework="numpy") builds these; float8 tensors are decoded from raw bytes.
_NUMPY_READS = {code for code in DTYPES if not code.startswith("F8")}


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read: truncated, corrupted, or not a checkpoint.

    The message starts with the offending path; ``.path`` holds it too.
    """

    def __init__(self, path: str | os.PathLike, problem: str):
        super().__init__(f"{os.fspath(path)}: {problem}")
        self.path = os.fspath(path)


class Entry(NamedTuple):
    """One tensor to write: its name, file dtype and shape, and how to fetch its data."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    fetch: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


# -- writing ---------------------------------------------------------------------------


def host_bytes(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``array`` as a contiguous little-endian host array of ``dtype``."""
    array = np.asarray(array).astype(dtype, order="C", copy=False)  # 0-d stays 0-d
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and sys.byteorder == "big"):
        array = array.byteswap()
    return array


def _serialize(file: Path, entries: Sequence[Entry], metadata: Mapping[str, str] | None):
    """Write one safetensors file with the package's own serializer."""
    arrays = []  # holds every buffer alive while the serializer reads it by address
    for e in entries:
        arrays.append(host_bytes(e.fetch(), e.dtype))
        if arrays[-1].nbytes != e.nbytes:
            raise ValueError(
                f"save: {e.name!r} changed while saving: expected {e.nbytes} bytes "
                f"of {e.dtype} {e.shape}, got {arrays[-1].nbytes}"
            )
    specs = {
        e.name: safetensors.TensorSpec(
            dtype=e.dtype.name, shape=list(e.shape), data_ptr=a.ctypes.data, data_len=a.nbytes
        )
        for e, a in zip(entries, arrays, strict=True)
    }
    order = json.dumps([e.name for e in entries], separators=(",", ":"))
    safetensors.serialize_file(specs, file, metadata={**(metadata or {}), ORDER_KEY: order})


def _write_temp(path: Path, write: Callable[[Path], None]) -> Path:
    """A fully written, fsynced temporary file next to ``path``; removed on failure."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # claim the name
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return tmp


def _sync_dir(folder: Path) -> None:
    """Make renames in ``folder`` durable (POSIX); a no-op where folders cannot be opened."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _commit(pairs: Sequence[tuple[Path, Path]], folder: Path) -> None:
    """Rename each written temporary file over its final name; drop leftovers on failure."""
    try:
        for tmp, final in pairs:
            os.replace(tmp, final)
    finally:
        for tmp, _ in pairs:
            with contextlib.suppress(OSError):
                os.remove(tmp)
    _sync_dir(folder)


def write_file(path: Path, entries: Sequence[Entry], metadata: Mapping[str, str] | None) -> None:
    """Atomically write one safetensors file."""
    tmp = _write_temp(path, lambda f: _serialize(f, entries, metadata))
    _commit([(tmp, path)], path.parent)


def split_shards(entries: Sequence[Entry], max_bytes: int) -> list[list[Entry]]:
    """Consecutive groups of at most ``max_bytes`` tensor bytes (a larger tensor alone)."""
    shards: list[list[Entry]] = [[]]
    size = 0
    for e in entries:
        if shards[-1] and size + e.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return shards


def write_sharded(
    folder: Path, entries: Sequence[Entry], metadata: Mapping[str, str] | None, max_bytes: int
) -> Path:
    """Write ``model-0000i-of-0000K.safetensors`` shards and the index into ``folder``.

    Every file is written and fsynced under a temporary name before any is renamed, so
    a failure while writing leaves an earlier checkpoint in ``folder`` untouched. Shards
    of an earlier save that the new index does not name are removed afterwards.
    """
    folder.mkdir(parents=True, exist_ok=True)
    shards = split_shards(entries, max_bytes)
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    index = {
        "metadata": {"total_size": sum(e.nbytes for e in entries)},
        "weight_map": {e.name: n for n, shard in zip(names, shards, strict=True) for e in shard},
    }
    text = json.dumps(index, indent=2) + "\n"
    written: list[tuple[Path, Path]] = []
    try:
        for name, shard in zip(names, shards, strict=True):
            tmp = _write_temp(folder / name, lambda f, s=shard: _serialize(f, s, metadata))
            written.append((tmp, folder / name))
        tmp = _write_temp(folder / INDEX_NAME, lambda f: f.write_text(text, encoding="utf-8"))
        written.append((tmp, folder / INDEX_NAME))
    except BaseException:
        for tmp, _ in written:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        raise
    _commit(written, folder)
    for stale in folder.iterdir():
        if _SHARD_RE.fullmatch(stale.name) and stale.name not in names:
            with contextlib.suppress(OSError):
                stale.unlink()
    return folder / INDEX_NAME


# -- reading ---------------------------------------------------------------------------


def _check_size(path: Path) -> None:
    """The first 8 bytes (the header's length) against the file's size, for a clear
    message on empty, truncated and foreign files before the package parses them."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(8)
    if size < 8:
        what = "empty" if size == 0 else f"only {size} bytes long"
        raise CheckpointError(
            path, f"not a safetensors file: it is {what} (truncated, or never written)"
        )
    n = int.from_bytes(prefix, "little")
    if n > size - 8:
        hint = ""
        if prefix[:2] == b"PK":
            hint = " It is a zip archive: a torch.save file? Convert it with safetensors.torch.save_file."
        raise CheckpointError(
            path,
            f"not a safetensors file, or truncated: its first 8 bytes give a header of {n} "
            f"bytes, but the file has {size - 8} bytes after them.{hint}",
        )


def _problem(e: BaseException) -> str:
    """What the package's error (or the OS's) says, as a sentence about the file."""
    message = str(e)
    if "not fully covered" in message:
        return (
            "truncated or corrupted: its tensor data does not fill the file as the header "
            f"describes (safetensors: {message})"
        )
    if isinstance(e, OSError):
        return f"cannot be read ({e})"
    return f"corrupted or not a safetensors file (safetensors: {message})"


def _ordered(names: list[str], meta: Mapping[str, str]) -> list[str]:
    """``names`` in the order ``ORDER_KEY`` records, when it lists exactly these names."""
    try:
        order = json.loads(meta.get(ORDER_KEY, "null"))
    except ValueError:
        return names
    if (
        isinstance(order, list)
        and all(isinstance(n, str) for n in order)
        and sorted(order) == sorted(names)
    ):
        return order
    return names


def _open(path: Path, read: Callable[[Any], Any]) -> Any:
    """``read(f)`` on the file opened with ``safe_open``; every failure names ``path``."""
    try:
        _check_size(path)
        with safetensors.safe_open(path, framework="numpy") as f:
            return read(f)
    except (safetensors.SafetensorError, OSError) as e:
        raise CheckpointError(path, _problem(e)) from e


def _read_tensors(path: Path, f: Any) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    meta = dict(f.metadata() or {})
    names = _ordered(f.offset_keys(), meta)
    meta.pop(ORDER_KEY, None)
    codes = {name: f.get_slice(name).get_dtype() for name in names}
    foreign = {n: c for n, c in codes.items() if c not in DTYPES}
    if foreign:
        raise CheckpointError(
            path, f"holds dtypes purelayers cannot represent: {foreign}; known: {sorted(DTYPES)}"
        )
    if all(c in _NUMPY_READS for c in codes.values()):
        return {name: f.get_tensor(name) for name in names}, meta
    raw = dict(safetensors.deserialize(path.read_bytes()))
    arrays = {
        name: np.frombuffer(raw[name]["data"], DTYPES[codes[name]]).reshape(raw[name]["shape"])
        for name in names
    }
    return arrays, meta


def read_file(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The arrays (in saved order) and metadata of one safetensors file.

    Raises ``CheckpointError`` naming ``path`` for anything but a well-formed file.
    """
    return _open(Path(path), lambda f: _read_tensors(Path(path), f))


def read_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of one safetensors file (only its header is read)."""
    meta = dict(_open(Path(path), lambda f: f.metadata()) or {})
    meta.pop(ORDER_KEY, None)
    return meta


def read_index(path: Path) -> dict[str, str]:
    """The validated ``weight_map`` (name -> shard file name) of an index file."""
    try:
        index = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(path, f"not a valid sharded-checkpoint index: not JSON ({e})") from e
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise CheckpointError(
            path,
            'not a valid sharded-checkpoint index: expected {"metadata": {...}, '
            '"weight_map": {name: shard file name}}',
        )
    for shard in set(weight_map.values()):
        parts = Path(shard).parts
        if not parts or Path(shard).is_absolute() or ".." in parts:
            raise CheckpointError(
                path, f"the weight map names shard {shard!r}, which is not a file in its folder"
            )
    return weight_map


def read_sharded(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every array named by an index, in the index's order, from its shards."""
    weight_map = read_index(path)
    by_shard: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        by_shard.setdefault(shard, []).append(name)
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, str] = {}
    for shard, names in by_shard.items():
        file = path.parent / shard
        if not file.is_file():
            raise CheckpointError(
                path,
                f"shard {file} is missing; the index maps {len(names)} names to it "
                f"(first: {names[0]!r})",
            )
        got, got_meta = read_file(file)
        absent = [n for n in names if n not in got]
        extra = [n for n in got if weight_map.get(n) != shard]
        if absent or extra:
            raise CheckpointError(
                file,
                "does not match the index "
                f"{path.name}: names the index puts here but the shard lacks: {absent}; "
                f"names in the shard the index puts elsewhere or nowhere: {extra}",
            )
        arrays.update(got)
        meta = meta or got_meta
    return {name: arrays[name] for name in weight_map}, meta


def resolve(path: str | os.PathLike) -> tuple[Path, bool]:
    """The checkpoint file ``path`` refers to, and whether it is a sharded index.

    ``path`` is a ``.safetensors`` file, an index ``.json`` file, or a folder holding
    ``model.safetensors.index.json``, ``model.safetensors``, or exactly one of
    ``*.safetensors.index.json`` / ``*.safetensors``.
    """
    p = Path(path)
    if p.is_dir():
        for candidate, sharded in ((p / INDEX_NAME, True), (p / SINGLE_NAME, False)):
            if candidate.is_file():
                return candidate, sharded
        for pattern, sharded in (("*.safetensors.index.json", True), ("*.safetensors", False)):
            found = sorted(p.glob(pattern))
            if len(found) == 1:
                return found[0], sharded
        raise CheckpointError(
            p,
            f"the folder holds no single checkpoint: expected {INDEX_NAME} or {SINGLE_NAME}, "
            f"found {sorted(f.name for f in p.iterdir())[:10]}",
        )
    if not p.exists():
        raise FileNotFoundError(f"no checkpoint at {p}: the file does not exist")
    return p, p.name.endswith(".json")
