"""Checkpoint files through the ``safetensors`` package, and Hugging Face's sharded layout.

The safetensors format itself (header, offsets, alignment, validation) is the
``safetensors`` package's: files are written with ``safetensors.serialize_file`` and read
with ``safetensors.safe_open``. Here we add what a checkpoint needs around it:

- atomic writes (``_atomic``): every file is written in a private temporary folder
  next to its final name, fsynced, then renamed over the final name, and the folder
  is fsynced; killed writers' leftovers are removed by the next write;
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
import mmap
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np
import safetensors

from purelayers import _atomic
from purelayers._safetensors_format import (  # the format's names, used here and by callers
    ALIASES_KEY,
    DTYPES,
    INDEX_NAME,
    ORDER_KEY,
    RESERVED,
    SHARD_RE,
    SINGLE_NAME,
    Entry,
    host_bytes,
)
from purelayers.errors import CheckpointError

# -- writing ---------------------------------------------------------------------------


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


def write_file(path: Path, entries: Sequence[Entry], metadata: Mapping[str, str] | None) -> None:
    """Atomically write one safetensors file (``_atomic``: one temporary, removed on
    failure, and removed by the next save when the writer was killed).

    A ``model.safetensors`` written into a folder that holds a sharded checkpoint
    replaces it: once the file is in place, the index and its shards are removed, as
    transformers' ``save_pretrained`` does (readers would otherwise pick one layout or
    the other)."""
    with _atomic.Temporary(path) as tmp:
        _serialize(tmp.file, entries, metadata)
        tmp.finish()
        tmp.commit()
    _atomic.sync_dir(path.parent)
    if path.name == SINGLE_NAME:
        (path.parent / INDEX_NAME).unlink(missing_ok=True)  # first: no index of lost shards
        _remove_shards(path.parent, keep=())


def _remove_shards(folder: Path, keep: Sequence[str]) -> None:
    for stale in folder.iterdir():
        if SHARD_RE.fullmatch(stale.name) and stale.name not in keep:
            with contextlib.suppress(OSError):
                stale.unlink()


def _current_shards(folder: Path) -> set[str]:
    """The shard files the folder's index names now (none without a readable index)."""
    try:
        return set(read_index(folder / INDEX_NAME).values())
    except (OSError, ValueError):
        return set()


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

    The index is the commit: every file is written and fsynced under a temporary name,
    the shards are renamed into place under names the folder's current index does not
    use, and only then is the new index renamed over the old one. A save killed at any
    moment leaves the folder's index naming one complete checkpoint, the old or the new.
    So where the current index names ``model-0000i-of-0000K.safetensors`` already (an
    earlier save of as many shards), the new shards are
    ``model-0000i-of-0000K.alt.safetensors``, and the save after that goes back to the
    plain names. Shards the new index does not name, a ``model.safetensors`` of the
    single-file layout, and the temporaries of killed saves of any shard or of that
    single file are removed.
    Sharded saves into one folder run one at a time (an ``flock`` on the folder), so
    two processes saving it leave one complete checkpoint, the later one's.
    """
    folder.mkdir(parents=True, exist_ok=True)
    shards = split_shards(entries, max_bytes)
    plain = [f"model-{i + 1:05d}-of-{len(shards):05d}" for i in range(len(shards))]
    # One sharded save at a time per folder: two would pick the same free names from
    # the same index and overwrite each other's shards, leaving a mix of the two.
    with _atomic.folder_lock(folder):
        names = [f"{n}.safetensors" for n in plain]
        if _current_shards(folder) & set(names):
            names = [f"{n}.alt.safetensors" for n in plain]
        # the killed saves' temporaries of any shard, and of the single file this replaces
        _atomic.remove_stale(folder / INDEX_NAME, rf"{SHARD_RE.pattern}|{re.escape(SINGLE_NAME)}")
        index = {
            "metadata": {"total_size": sum(e.nbytes for e in entries)},
            "weight_map": {
                e.name: n for n, shard in zip(names, shards, strict=True) for e in shard
            },
        }
        text = json.dumps(index, indent=2) + "\n"
        with _atomic.temporaries([folder / n for n in [*names, INDEX_NAME]]) as tmps:
            for tmp, shard in zip(tmps, shards, strict=False):
                _serialize(tmp.file, shard, metadata)
            tmps[-1].file.write_text(text, encoding="utf-8")
            for tmp in tmps:
                tmp.finish()
            for tmp in tmps[:-1]:
                tmp.commit()
            _atomic.sync_dir(folder)
            tmps[-1].commit()  # the index: from here on the folder holds the new checkpoint
        _atomic.sync_dir(folder)
        _remove_shards(folder, keep=names)
        (folder / SINGLE_NAME).unlink(missing_ok=True)
    return folder / INDEX_NAME


# -- reading ---------------------------------------------------------------------------


def _check_size(path: Path, fd: int | None = None) -> None:
    """The first 8 bytes (the header's length) against the file's size, for a clear
    message on empty, truncated and foreign files before the package parses them
    (read through ``fd``, the file already open, where given)."""
    if fd is None:
        with open(path, "rb") as f:
            _check_size(path, f.fileno())
        return
    size = os.fstat(fd).st_size
    prefix = os.pread(fd, 8, 0)
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


def _open(path: Path, read: Callable[..., Any], held: bool = False) -> Any:
    """``read(f)`` on the file opened with ``safe_open``; every failure names ``path``.
    With ``held``, the file is opened once (a ``Handle``), the package reads that very
    file (through ``/proc/self/fd`` where the system has it), and ``read(f, handle)``
    gets the handle."""
    try:
        handle = Handle(path) if held else None
        _check_size(path, None if handle is None else handle.fd)
        with safetensors.safe_open(handle.path if handle else path, framework="numpy") as f:
            return read(f, handle) if held else read(f)
    except (safetensors.SafetensorError, OSError) as e:
        raise CheckpointError(path, _problem(e)) from e


class Handle:
    """A checkpoint file opened once for reading, closed when the last ``Tensor`` of
    it is gone. Every read of the checkpoint goes through this descriptor, so a save
    that replaces the file meanwhile (a rename over it) changes nothing the reader
    sees: it reads the whole file it opened, old or new, never a mix."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        proc = Path(f"/proc/self/fd/{self.fd}")
        self.path = proc if proc.exists() else path  # (elsewhere: the name, as before)

    def identity(self) -> tuple[int, ...]:
        return _identity(os.fstat(self.fd))

    def __del__(self) -> None:
        fd, self.fd = getattr(self, "fd", -1), -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


_CHUNK_BYTES = 16 << 20  # a read copies at most this much file data between releases


def owned(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialized C-ordered array that nothing else references, 64-byte aligned.

    JAX's CPU client adopts an aligned host buffer instead of copying it
    (``jax.device_put``), so an array filled here becomes a JAX array with no second
    copy; being private, nothing the caller holds can change it afterwards.
    """
    dtype = np.dtype(dtype)
    n = math.prod(shape) * dtype.itemsize
    raw = np.empty(n + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + n].view(dtype).reshape(shape)


def same_values(a: Any, b: Any) -> bool:
    """Whether two checkpoint tensors (``Tensor``s, or anything with their ``read``, or
    arrays) hold equal values, read a block of leading-axis rows at a time (a tied
    name's copy is checked without a full copy of either in memory)."""
    shape = tuple(a.shape)
    if shape != tuple(b.shape):
        return False
    if len(shape) < 1 or not all(hasattr(t, "read") for t in (a, b)):
        read = [t.read() if hasattr(t, "read") else np.asarray(t) for t in (a, b)]
        return bool(np.array_equal(*read, equal_nan=True))
    row = max(1, math.prod(shape[1:]) * max(a.dtype.itemsize, b.dtype.itemsize))
    step = max(1, _CHUNK_BYTES // row)
    for i in range(0, shape[0], step):
        index = (slice(i, min(i + step, shape[0])),)
        if not np.array_equal(a.read(index, dtype=b.dtype), b.read(index), equal_nan=True):
            return False
    return True


class Tensor(NamedTuple):
    """One tensor of a checkpoint file, located by its header; read with ``read``."""

    file: Path
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int  # of its first byte in the file
    identity: tuple[int, ...] = ()  # the file's (device, inode, size, mtime) when scanned
    handle: Handle | None = None  # the file as opened when scanned: reads go through it

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def read(self, index: Any = None, dtype: Any = None, out: np.ndarray | None = None):
        """``self[index]`` as a new array of ``dtype`` (default: the file's), or into ``out``.

        The file is memory-mapped and copied a chunk of rows at a time straight into the
        result, cast on the way (no intermediate array of the file's dtype), with each
        chunk's pages released from this process's memory once copied: reading a
        tensor of N bytes costs the N (or fewer, cast) bytes of the result and at most
        ``_CHUNK_BYTES`` more, whatever its size. The result never shares memory with
        the file. ``index`` is a tuple of slices (a device's shard) or ``None``.
        """
        dtype = np.dtype(self.dtype if dtype is None else dtype)
        select = () if index is None else index
        shape = np.broadcast_to(np.False_, self.shape)[select].shape  # no data touched
        if out is None:
            out = owned(shape, dtype)
        if out.size:
            if self.handle is not None:
                mm = mmap.mmap(self.handle.fd, 0, access=mmap.ACCESS_READ)
            else:
                mm = self._map_by_name()
            try:
                self._copy(mm, select, out)
            finally:
                with contextlib.suppress(BufferError):  # views kept alive by a traceback
                    mm.close()
        return out

    def _map_by_name(self) -> mmap.mmap:
        """The file mapped by its name (a ``Tensor`` made without a handle), refused
        when it is no longer the file its header was read from."""
        try:
            f = open(self.file, "rb")  # noqa: SIM115 (closed by the with below)
        except FileNotFoundError:
            raise CheckpointError(
                self.file,
                "is gone since the checkpoint's header was read (replaced by a save?); "
                "load it again",
            ) from None
        with f:
            if self.identity and _identity(os.fstat(f.fileno())) != self.identity:
                raise CheckpointError(
                    self.file,
                    "changed since its header was read (replaced or rewritten, by a "
                    "save?); load it again",
                )
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def _copy(self, mm: mmap.mmap, select: Any, out: np.ndarray) -> None:
        whole = np.frombuffer(mm, self.dtype.newbyteorder("<"), math.prod(self.shape), self.offset)
        part = whole.reshape(self.shape)[select]
        if part.ndim == 0:
            out[...] = part
            return
        # a row of the selection spans |stride| bytes of the file, whatever it selects
        rows = max(1, _CHUNK_BYTES // max(1, abs(part.strides[0]), part[0].nbytes))
        for i in range(0, len(part), rows):
            np.copyto(out[i : i + rows], part[i : i + rows], casting="unsafe")
            self._release(mm)

    def _release(self, mm: mmap.mmap) -> None:
        """Drop this tensor's mapped pages from the process's resident memory (they stay
        in the page cache); a no-op where ``madvise`` is missing."""
        if not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return
        begin = self.offset // mmap.PAGESIZE * mmap.PAGESIZE
        end = min(len(mm), self.offset + self.nbytes)
        mm.madvise(mmap.MADV_DONTNEED, begin, end - begin)


def to_numpy(value: Any) -> np.ndarray:
    """A host array from numpy, JAX, or torch values (torch is never imported), or a
    checkpoint file's tensor (read). It may share memory with ``value``."""
    if isinstance(value, Tensor):
        return value.read()
    if type(value).__module__.startswith("torch"):
        tensor = value.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            # numpy has no bfloat16: the same bits, read as int16 and viewed as
            # ml_dtypes' bfloat16 (no float32 copy on the way)
            torch = sys.modules[type(tensor).__module__.split(".")[0]]  # loaded: it made it
            return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return tensor.numpy()
    return np.asarray(value)


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _header(handle: Handle) -> tuple[dict[str, Any], int, tuple[int, ...]]:
    """The parsed JSON header of a file the package has already validated, where its
    data starts, and the file's identity."""
    n = int.from_bytes(os.pread(handle.fd, 8, 0), "little")
    header = json.loads(os.pread(handle.fd, n, 8).decode("utf-8"))
    return header, 8 + n, handle.identity()


def _scan_tensors(path: Path, f: Any, handle: Handle) -> tuple[dict[str, Tensor], dict[str, str]]:
    meta = dict(f.metadata() or {})
    names = _ordered(f.offset_keys(), meta)
    meta.pop(ORDER_KEY, None)
    header, start, identity = _header(handle)
    foreign = {n: header[n]["dtype"] for n in names if header[n]["dtype"] not in DTYPES}
    if foreign:
        raise CheckpointError(
            path, f"holds dtypes purelayers cannot represent: {foreign}; known: {sorted(DTYPES)}"
        )
    tensors = {
        n: Tensor(
            path,
            DTYPES[header[n]["dtype"]],
            tuple(int(d) for d in header[n]["shape"]),
            start + int(header[n]["data_offsets"][0]),
            identity,
            handle,
        )
        for n in names
    }
    return tensors, meta


def scan_file(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors (in saved order, unread) and metadata of one safetensors file.

    The header is validated by the ``safetensors`` package (offsets, sizes, coverage of
    the file); ``CheckpointError`` names ``path`` for anything but a well-formed file.
    The file is opened once (``Handle``): the header is read from it and every tensor's
    data too, however long after, whatever a save does to ``path`` meanwhile.
    """
    return _open(Path(path), lambda f, handle: _scan_tensors(Path(path), f, handle), held=True)


def read_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of one safetensors file (only its header is read)."""
    meta = dict(_open(Path(path), lambda f: f.metadata()) or {})
    for key in RESERVED:
        meta.pop(key, None)
    return meta


def aliases(meta: Mapping[str, str]) -> dict[str, str]:
    """The ``{alias: original}`` a file records under ``ALIASES_KEY`` (none if absent or
    not a JSON object of names)."""
    try:
        found = json.loads(meta.get(ALIASES_KEY, "{}"))
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}


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


def _stat(path: Path) -> tuple[int, ...] | None:
    try:
        return _identity(os.stat(path))
    except OSError:
        return None


_RETRIES = 20  # reads of a sharded checkpoint that saves keep replacing, before giving up


def scan_sharded(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Every tensor named by an index (unread), in the index's order, from its shards.

    One consistent checkpoint: the index is held open while its shards are opened
    (each once, ``scan_file``), and if the index at ``path`` is another file by then
    (a save replaced the checkpoint meanwhile; a save never touches the shards the
    current index names), the read starts again, up to ``_RETRIES`` times. A shard
    missing from an index that did not change is a ``CheckpointError`` naming it."""
    for _ in range(_RETRIES):
        found = _scan_sharded_once(path)
        if found is not None:
            return found
    raise CheckpointError(
        path, f"was replaced by a save during each of {_RETRIES} reads of its shards"
    )


def _scan_sharded_once(path: Path) -> tuple[dict[str, Tensor], dict[str, str]] | None:
    """``scan_sharded``'s one try; None when a save replaced the index meanwhile."""
    try:  # the index as it is now: compared with the name's file at the end
        held = Handle(path)
    except FileNotFoundError:  # replaced by a single-file save meanwhile: resolve again
        return None

    def replaced() -> bool:
        return _stat(path) != held.identity()

    weight_map = read_index(path)
    if replaced():
        return None
    by_shard: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        by_shard.setdefault(shard, []).append(name)
    tensors: dict[str, Tensor] = {}
    meta: dict[str, str] = {}
    for shard, names in by_shard.items():
        file = path.parent / shard
        try:
            got, got_meta = scan_file(file)
        except CheckpointError:
            if replaced():
                return None
            if not file.is_file():
                raise CheckpointError(
                    path,
                    f"shard {file} is missing; the index maps {len(names)} names to it "
                    f"(first: {names[0]!r})",
                ) from None
            raise
        absent = [n for n in names if n not in got]
        extra = [n for n in got if weight_map.get(n) != shard]
        if absent or extra:
            if replaced():
                return None
            raise CheckpointError(
                file,
                "does not match the index "
                f"{path.name}: names the index puts here but the shard lacks: {absent}; "
                f"names in the shard the index puts elsewhere or nowhere: {extra}",
            )
        tensors.update(got)
        meta = meta or got_meta
    if replaced():  # a shard opened above may be the next save's: read it all again
        return None
    return {name: tensors[name] for name in weight_map}, meta


def scan(path: str | os.PathLike) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors (unread) and metadata of the checkpoint ``path`` refers to
    (``resolve``): one file, or every shard of an index."""
    file, sharded = resolve(path)
    return scan_sharded(file) if sharded else scan_file(file)


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
