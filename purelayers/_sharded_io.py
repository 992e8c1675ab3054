"""Checkpoints of sharded trees: ``save`` gathers (across hosts too), ``load_sharded``
places each device's slice straight from the file. Re-exported by
``purelayers.sharding``."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers import _safetensors_io as _io
from purelayers import params as _params
from purelayers._safetensors_io import CheckpointError

__all__ = ["load_sharded", "save"]


# -- checkpoints ----------------------------------------------------------------------


def save(
    path: str | os.PathLike,
    params: Mapping[str, Any],
    state: Mapping[str, Any] | None = None,
    *,
    metadata: Mapping[str, str] | None = None,
    max_shard_bytes: int | None = None,
    model: Any = None,
    write_aliases: bool = False,
) -> Path:
    """``purelayers.params.save`` for sharded trees, on one host or many.

    On one host every shard is addressable and ``params.save`` already gathers one
    array at a time into host memory while writing. Across hosts each array that this
    process cannot see whole is gathered with
    ``jax.experimental.multihost_utils.process_allgather`` (call ``save`` on every
    process, in the same order), process 0 writes, and all processes wait for it. The
    file is an ordinary (optionally Hugging Face-sharded) checkpoint: torch loads it,
    ``load_sharded`` reads it back onto any mesh.

    ``model`` and ``write_aliases`` are ``params.save``'s (torch order, tied names).

    Returns:
      the path written (the index file of a sharded checkpoint).
    """
    options = dict(
        metadata=metadata, max_shard_bytes=max_shard_bytes, model=model, write_aliases=write_aliases
    )
    leaves = jax.tree.leaves((params, state))
    if all(not isinstance(a, jax.Array) or a.is_fully_addressable for a in leaves):
        return _params.save(path, params, state, **options)
    from jax.experimental import multihost_utils

    def host(a):
        if isinstance(a, jax.Array) and not a.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(a, tiled=True))
        return a

    params, state = jax.tree.map(host, (params, state))
    written = Path(path)
    if jax.process_index() == 0:
        written = _params.save(path, params, state, **options)
    multihost_utils.sync_global_devices(f"purelayers.sharding.save:{os.fspath(path)}")
    if max_shard_bytes is not None and jax.process_index() != 0:
        written = written / _io.INDEX_NAME
    return written


class _Tensor:
    """One tensor of a checkpoint file, read lazily through a memory map."""

    def __init__(self, file: Path, dtype: np.dtype, shape: tuple[int, ...], offset: int):
        self.file, self.dtype, self.shape, self.offset = file, dtype, shape, offset

    def read(self, index: Any, dtype: Any) -> np.ndarray:
        if math.prod(self.shape) == 0:
            whole = np.zeros(self.shape, self.dtype)
        else:
            whole = np.memmap(self.file, self.dtype, "r", self.offset, self.shape)
        part = np.array(whole[() if index is None else index])
        if sys.byteorder == "big":  # files are little-endian
            part = part.byteswap()
        return part.astype(dtype, copy=False)


def _scan_file(file: Path) -> dict[str, _Tensor]:
    """The tensors of one safetensors file from its header alone; a malformed file gets
    the checkpoint reader's own error (which names the file and the problem)."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if size < 8 or n > size - 8 or n > 100_000_000:
                raise ValueError
            header = json.loads(f.read(n).decode("utf-8"))
        out, end = {}, 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = _io.DTYPES[info["dtype"]]
            shape = tuple(int(d) for d in info["shape"])
            begin, stop = (int(o) for o in info["data_offsets"])
            if stop - begin != math.prod(shape) * dtype.itemsize or begin < 0:
                raise ValueError
            end = max(end, stop)
            out[name] = _Tensor(file, dtype, shape, 8 + n + begin)
        if end != size - 8 - n:
            raise ValueError
        return out
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        _io.read_file(file)  # raises the precise CheckpointError
        raise CheckpointError(file, "corrupted: its header could not be read") from None


def _scan(path: str | os.PathLike) -> dict[str, _Tensor]:
    file, sharded = _io.resolve(path)
    if not sharded:
        return _scan_file(file)
    weight_map = _io.read_index(file)
    tensors: dict[str, _Tensor] = {}
    for shard in dict.fromkeys(weight_map.values()):
        shard_file = file.parent / shard
        if not shard_file.is_file():
            raise CheckpointError(file, f"shard {shard_file} named by the index is missing")
        found = _scan_file(shard_file)
        absent = [k for k, s in weight_map.items() if s == shard and k not in found]
        if absent:
            raise CheckpointError(shard_file, f"lacks names the index puts here: {absent}")
        tensors.update({k: t for k, t in found.items() if weight_map.get(k) == shard})
    return {k: tensors[k] for k in weight_map}


def load_sharded(
    path: str | os.PathLike,
    params: Any,
    shardings: Any,
    state: Any = None,
    state_shardings: Any = None,
    *,
    strict: bool = True,
    model: Any = None,
) -> Any:
    """A checkpoint loaded by name straight onto ``shardings``.

    Each array is built with ``jax.make_array_from_callback``: every device reads only
    its own slice of the file through a memory map, so no process or device holds an
    unsharded copy of a split array. ``params`` (and ``state``) are templates: trees
    of arrays or of ``jax.ShapeDtypeStruct`` (``jax.eval_shape(model.init, ...)``), whose
    names, shapes and dtypes the checkpoint must match; ``shardings`` are matching
    trees of ``Sharding``s (``named_shardings``). ``path`` is anything
    ``purelayers.params.load`` accepts, a single file or a sharded index.

    Matching follows ``params.load_into``: with ``strict``, one ``KeyError`` names every
    missing and unexpected key; shape mismatches are one ``ValueError`` naming each;
    values are cast to the template's dtype. With ``strict=False``, names missing from
    the file keep the template's value (placed on its sharding), which needs a
    concrete template array there. ``model`` gives the tied names (``params.load_into``).
    A ``Repeat``'s stacked blocks are read block by block into their stacked arrays.

    Returns:
      ``params``; ``(params, state)`` when ``state`` is given.
    """
    who = f"load_sharded({os.fspath(path)!r})"
    names = _params._specs(params)
    placement: dict[str, Any] = {}  # every name of a stacked leaf maps to its sharding

    def place(block_names: tuple[str, ...], sharding: Any, _: Any) -> Any:
        placement.update(dict.fromkeys(block_names, sharding))
        return sharding

    _params.fill(shardings, place)
    if state is not None:
        names.update(_params._specs(state))
        _params.fill(state_shardings, place)
    if set(placement) != set(names):
        raise ValueError(
            f"{who}: the shardings do not match the templates by name; without a sharding: "
            f"{[k for k in names if k not in placement]}; without a template array: "
            f"{[k for k in placement if k not in names]}"
        )
    tensors = _scan(path)

    def equal(a: str, b: str) -> bool:
        dtype = tensors[b].dtype
        return bool(np.array_equal(tensors[a].read(None, dtype), tensors[b].read(None, dtype)))

    source, keys = _params._match(
        names, tensors, strict=strict, who=who, aliases=_params._aliases(model, who), equal=equal
    )
    templates = [params] if state is None else [params, state]
    is_abstract = {}
    for tree in templates:
        is_abstract.update(
            _params.flatten(
                _params.fill(tree, lambda _, a, __: isinstance(a, jax.ShapeDtypeStruct))
            )
        )
    abstract = [k for k in keys.missing_keys if is_abstract[k]]
    if abstract:
        raise KeyError(f"{who}: missing keys with no template value to keep: {abstract}")

    def get(block_names: tuple[str, ...], leaf: Any, lead: tuple[int, ...]) -> Any:
        sharding = placement[block_names[0]]
        dtype = jax.dtypes.canonicalize_dtype(_params._dtype(leaf))
        if not any(n in source for n in block_names):
            return jax.device_put(jnp.asarray(leaf, dtype), sharding)
        blocks = [tensors[source[n]] if n in source else None for n in block_names]

        def read(index: Any) -> np.ndarray:
            index = tuple(index) if index is not None else (slice(None),) * len(np.shape(leaf))
            if not lead:
                return blocks[0].read(index, dtype)
            picked = np.arange(len(blocks)).reshape(lead)[index[: len(lead)]]
            rest = index[len(lead) :]
            parts = [
                blocks[i].read(rest, dtype)
                if blocks[i] is not None
                else np.asarray(
                    np.asarray(leaf).reshape(-1, *np.shape(leaf)[len(lead) :])[i][rest], dtype
                )
                for i in picked.reshape(-1)
            ]
            return np.stack(parts).reshape(picked.shape + parts[0].shape)

        return jax.make_array_from_callback(np.shape(leaf), sharding, read, dtype=dtype)

    if state is None:
        return _params.fill(params, get)
    return _params.fill(params, get), _params.fill(state, get)
