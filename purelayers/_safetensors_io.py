"""The safetensors file format and Hugging Face's sharded layout, on numpy arrays.

A safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON
(``{name: {"dtype", "shape", "data_offsets"}, "__metadata__": {str: str}}``, padded
with spaces), then the tensors' bytes, contiguous, little-endian. We write and parse it
here rather than through ``safetensors``' Python bindings because their writing API
differs between releases and their numpy path cannot represent bfloat16; files are
checked against the reference parser (``safetensors.torch``) in the tests.

Writes are atomic: every file is written to a temporary name in its final folder,
flushed, fsynced, then renamed over the final name.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_SHARD_RE = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_MAX_HEADER = 100_000_000  # the reference parser's limit

_CODES: dict[str, Any] = {
    "BOOL": np.bool_,
    "U8": np.uint8,
    "I8": np.int8,
    "U16": np.uint16,
    "I16": np.int16,
    "U32": np.uint32,
    "I32": np.int32,
    "U64": np.uint64,
    "I64": np.int64,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "F32": np.float32,
    "F64": np.float64,
    "C64": np.complex64,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E5M2": ml_dtypes.float8_e5m2,
}
DTYPES: dict[str, np.dtype] = {code: np.dtype(t) for code, t in _CODES.items()}
CODES: dict[np.dtype, str] = {dt: code for code, dt in DTYPES.items()}


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
    """``array`` as contiguous little-endian bytes of ``dtype`` (a flat ``uint8`` view)."""
    array = np.ascontiguousarray(np.asarray(array).astype(dtype, copy=False))
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and sys.byteorder == "big"):
        array = array.byteswap()
    return array.reshape(-1).view(np.uint8)


def _header(entries: Sequence[Entry], metadata: Mapping[str, str] | None) -> tuple[bytes, list]:
    """The padded header and the entries in data order.

    The header lists names in the given (PyTorch) order; the data is laid out by
    decreasing item size, which keeps every tensor aligned to its item size as the
    reference writer does.
    """
    layout = sorted(entries, key=lambda e: -e.dtype.itemsize)
    offsets, start = {}, 0
    for e in layout:
        offsets[e.name] = [start, start + e.nbytes]
        start += e.nbytes
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    for e in entries:
        header[e.name] = {
            "dtype": CODES[e.dtype],
            "shape": list(e.shape),
            "data_offsets": offsets[e.name],
        }
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return raw, layout


def _temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def _write_temp(path: Path, writer: Callable[[Any], None]) -> Path:
    """A fully written, fsynced temporary file next to ``path``; removed on failure."""
    tmp = _temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            writer(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return tmp


def _sync_dir(folder: Path) -> None:
    """Make renames in ``folder`` durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _tensor_writer(entries: Sequence[Entry], metadata: Mapping[str, str] | None):
    header, layout = _header(entries, metadata)

    def write(f) -> None:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        for e in layout:
            data = host_bytes(e.fetch(), e.dtype)
            if data.nbytes != e.nbytes:
                raise ValueError(
                    f"save: {e.name!r} changed while saving: expected {e.nbytes} bytes "
                    f"of {e.dtype} {e.shape}, got {data.nbytes}"
                )
            f.write(data)

    return write


def _commit(pairs: Iterable[tuple[Path, Path]]) -> None:
    """Rename each written temporary file over its final name; drop leftovers on failure."""
    pairs = list(pairs)
    try:
        for tmp, final in pairs:
            os.replace(tmp, final)
    finally:
        for tmp, _ in pairs:
            with contextlib.suppress(OSError):
                os.remove(tmp)


def write_file(path: Path, entries: Sequence[Entry], metadata: Mapping[str, str] | None) -> None:
    """Atomically write one safetensors file."""
    tmp = _write_temp(path, _tensor_writer(entries, metadata))
    _commit([(tmp, path)])
    _sync_dir(path.parent)


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
    text = (json.dumps(index, indent=2) + "\n").encode("utf-8")
    written: list[tuple[Path, Path]] = []
    try:
        for name, shard in zip(names, shards, strict=True):
            written.append(
                (_write_temp(folder / name, _tensor_writer(shard, metadata)), folder / name)
            )
        written.append(
            (_write_temp(folder / INDEX_NAME, lambda f: f.write(text)), folder / INDEX_NAME)
        )
    except BaseException:
        for tmp, _ in written:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        raise
    _commit(written)
    _sync_dir(folder)
    for stale in folder.iterdir():
        if _SHARD_RE.fullmatch(stale.name) and stale.name not in names:
            with contextlib.suppress(OSError):
                stale.unlink()
    return folder / INDEX_NAME


# -- reading ---------------------------------------------------------------------------


def _parse_header(path: Path, prefix: bytes, size: int) -> tuple[dict, int]:
    """The decoded JSON header and the byte offset where tensor data starts."""
    if size < 8:
        what = "empty" if size == 0 else f"only {size} bytes long"
        raise CheckpointError(
            path, f"not a safetensors file: it is {what} (truncated, or never written)"
        )
    n = int.from_bytes(prefix[:8], "little")
    if n > size - 8 or n > _MAX_HEADER:
        hint = ""
        if prefix[:2] == b"PK":
            hint = " It is a zip archive: a torch.save file? Convert it with safetensors.torch.save_file."
        raise CheckpointError(
            path,
            f"not a safetensors file, or truncated: its first 8 bytes give a header of {n} "
            f"bytes, but the file has {size - 8} bytes after them.{hint}",
        )
    try:
        header = json.loads(prefix[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(
            path, f"corrupted or not a safetensors file: the header is not valid JSON ({e})"
        ) from e
    if not isinstance(header, dict):
        raise CheckpointError(path, "corrupted: the header is not a JSON object")
    return header, 8 + n


def _read_header(f, path: Path) -> tuple[dict, int, int]:
    """The decoded header of the open file ``f``, where its data starts, and its size."""
    size = os.fstat(f.fileno()).st_size
    prefix = f.read(8)
    n = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
    if 0 < n <= min(size - 8, _MAX_HEADER):
        prefix += f.read(n)
    header, start = _parse_header(path, prefix, size)
    return header, start, size


def _metadata(path: Path, header: dict) -> dict[str, str]:
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise CheckpointError(path, "corrupted: __metadata__ is not a map of strings to strings")
    return meta


class TensorInfo(NamedTuple):
    """Where one tensor lies in a safetensors file: ``offset`` is from the file's start."""

    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def _tensor_info(path: Path, name: str, info: Any, start: int) -> TensorInfo:
    def bad(why: str) -> CheckpointError:
        return CheckpointError(path, f"corrupted: the header entry for {name!r} {why}")

    if not isinstance(info, dict):
        raise bad("is not a JSON object")
    dtype = DTYPES.get(info.get("dtype"))  # type: ignore[arg-type]
    if dtype is None:
        raise bad(f"has dtype {info.get('dtype')!r}, not one of {sorted(DTYPES)}")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise bad(f"has shape {shape!r}, not a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise bad(f"has data_offsets {offsets!r}, not [begin, end] with 0 <= begin <= end")
    nbytes = math.prod(shape) * dtype.itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise bad(
            f"spans {offsets[1] - offsets[0]} bytes, but {info['dtype']} {tuple(shape)} "
            f"takes {nbytes}"
        )
    return TensorInfo(dtype, tuple(shape), start + offsets[0], nbytes)


def _check_layout(path: Path, infos: Mapping[str, TensorInfo], start: int, size: int) -> None:
    """The tensors must tile the data section exactly, as the reference parser demands."""
    end = start
    for name, info in sorted(infos.items(), key=lambda kv: (kv[1].offset, kv[1].nbytes)):
        if info.offset != end:
            raise CheckpointError(
                path,
                f"corrupted: {name!r} starts at data byte {info.offset - start}, but the "
                f"previous tensor ends at {end - start} (tensors must be contiguous)",
            )
        end += info.nbytes
    if end > size:
        raise CheckpointError(
            path,
            f"truncated: the header describes {end - start} bytes of tensor data, but the "
            f"file holds {size - start}",
        )
    if end < size:
        raise CheckpointError(
            path, f"corrupted: {size - end} unexpected bytes after the last tensor"
        )


def _scan(f, path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    header, start, size = _read_header(f, path)
    meta = _metadata(path, header)
    infos = {
        name: _tensor_info(path, name, info, start)
        for name, info in header.items()
        if name != "__metadata__"
    }
    _check_layout(path, infos, start, size)
    return infos, meta


def scan_file(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Every tensor's dtype, shape and place in one safetensors file, and its metadata.

    Reads only the header, but checks it against the file's size, so a truncated or
    corrupted file raises ``CheckpointError`` naming ``path`` here already.
    """
    with open(path, "rb") as f:
        return _scan(f, path)


def read_file(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The arrays (in header order) and metadata of one safetensors file, validated.

    Raises ``CheckpointError`` naming ``path`` for anything but a well-formed file.
    """
    arrays = {}
    with open(path, "rb") as f:
        infos, meta = _scan(f, path)
        for name, info in infos.items():
            a = np.empty(info.shape, info.dtype)
            f.seek(info.offset)
            if f.readinto(a.reshape(-1).view(np.uint8)) != info.nbytes:
                raise CheckpointError(path, f"truncated while reading {name!r}")
            arrays[name] = a.byteswap() if sys.byteorder == "big" else a
    return arrays, meta


def read_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of one safetensors file (only its header is read)."""
    return scan_file(path)[1]


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
