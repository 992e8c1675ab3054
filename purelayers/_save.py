"""``purelayers.params.save``: a params (and state) tree written as a safetensors
checkpoint that PyTorch loads, one file or Hugging Face's sharded layout."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from purelayers import _safetensors_io as _io
from purelayers._safetensors_format import CODES
from purelayers._tree import key_data, model_aliases
from purelayers.trees import flatten, merge, unflatten

__all__ = ["save"]


def _in_model_order(model: Any, flat: dict[str, Any]) -> dict[str, Any]:
    """``flat`` in ``model.ordered``'s (torch's) order; names it does not place go last."""
    if model is None:
        return flat
    order = [k for k in flatten(model.ordered(unflatten(flat))) if k in flat]
    placed = set(order)
    return {k: flat[k] for k in [*order, *(k for k in flat if k not in placed)]}


def _is_step_counter(name: str) -> bool:
    return name.rsplit(".", 1)[-1] == "num_batches_tracked"


def _host_array(leaf: Any) -> np.ndarray:
    """``leaf`` on the host. A JAX array split over several devices is assembled from
    its shards into a new array that the caller owns: ``np.asarray`` would keep the
    assembled copy cached on the array for as long as the array lives (a second copy of
    every saved parameter after the save). A one-device array on the CPU is a view of
    its own memory, no copy."""
    if (
        not isinstance(leaf, jax.Array)
        or len(leaf.sharding.device_set) == 1
        or not leaf.is_fully_addressable  # (JAX's error: purelayers.sharding.save gathers)
    ):
        return np.asarray(leaf)
    out = np.empty(leaf.shape, leaf.dtype)
    for shard in leaf.addressable_shards:
        if shard.replica_id == 0:
            out[shard.index] = np.asarray(shard.data)
    return out


def _entry(name: str, leaf: Any) -> _io.Entry:
    """What ``save`` writes for one array; its data is fetched only when written."""
    if isinstance(leaf, jax.ShapeDtypeStruct):
        raise ValueError(
            f"save: {name!r} is a jax.ShapeDtypeStruct (an abstract template holds no "
            "values): save arrays, such as init's or load_into's"
        )
    if type(leaf).__module__.startswith("torch") or not hasattr(leaf, "dtype"):
        host = _io.to_numpy(leaf)
        leaf, fetch = host, lambda: host
    else:
        fetch = lambda: _host_array(leaf)  # noqa: E731 (copied to the host when written)
    try:
        dtype = np.dtype(leaf.dtype)
    except TypeError:
        dtype = None
    if dtype is not None and _is_step_counter(name) and dtype.kind in "iu":
        dtype = np.dtype(np.int64)  # torch's dtype for BatchNorm's counter
    if dtype not in CODES:
        raise ValueError(
            f"save: {name!r} has dtype {leaf.dtype}, which safetensors cannot store; "
            f"use one of {sorted(str(d) for d in CODES)}"
        )
    return _io.Entry(name, dtype, tuple(int(d) for d in np.shape(leaf)), fetch)


def _check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ValueError(f"save: metadata must be a dict of str to str, got {metadata!r}")
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(
                f"save: metadata must map str to str, got {k!r}: {v!r} "
                f"({type(k).__name__} to {type(v).__name__}); convert it, e.g. str(value)"
            )
    for key, use in zip(_io.RESERVED, ("the name order", "the tied names"), strict=True):
        if key in (metadata or {}):
            raise ValueError(f"save: metadata key {key!r} is reserved for {use}")
    # "format": "pt" is what Hugging Face loaders expect of a torch-layout file.
    return {"format": "pt", **(metadata or {})}


def save(
    path: str | os.PathLike,
    params: Any,
    state: Any = None,
    *,
    metadata: Mapping[str, str] | None = None,
    max_shard_bytes: int | None = None,
    model: Any = None,
    write_aliases: bool = False,
) -> Path:
    """Write ``params`` and ``state`` to a safetensors checkpoint that PyTorch loads.

    Both trees are merged under their dotted torch names (``merge``), so
    ``torch_model.load_state_dict(safetensors.torch.load_file(path))`` accepts the file
    unchanged. Dtypes are kept (``bfloat16`` included), except that integer
    ``num_batches_tracked`` counters are written as ``int64``, as torch stores them.

    Any pytree of arrays saves under the names of its key path (``flatten``): an optax
    state's names are ``1.0.mu.model.layers.0.self_attn.q_proj.lora_A.weight`` (a
    ``chain``'s index, a namedtuple's field, then the params' names), and a typed PRNG
    key (``jax.random.key``) is stored as its key data (``load_into`` wraps it back).

    Saving is atomic: each file is written under a temporary name in the same folder,
    fsynced, then renamed over the final name. A failure part-way leaves any earlier
    checkpoint at ``path`` intact and no temporary file behind. The ``safetensors``
    package writes each file from host memory, so a file's arrays (one shard's, with
    ``max_shard_bytes``) are copied to the host together while it is written.

    Args:
      path: the ``.safetensors`` file to write; with ``max_shard_bytes``, the folder to
        write the shards and index into (created if needed).
      params: the params tree.
      state: the buffers tree (running statistics), or ``None``.
      metadata: ``str`` to ``str`` annotations stored in the file's header (read them
        with ``load_metadata``). ``{"format": "pt"}`` is added unless given, as Hugging
        Face loaders expect.
      max_shard_bytes: write a sharded checkpoint in Hugging Face's layout:
        ``model-00001-of-0000K.safetensors`` ... of at most this many tensor bytes each
        (a larger tensor gets a shard of its own), plus ``model.safetensors.index.json``
        (``{"metadata": {"total_size": N}, "weight_map": {name: shard}}``). Shards of an
        earlier save in the folder that the new index does not name are removed.
        Default ``None``: one file.
      model: the layer the trees belong to; ``load`` then lists names in torch's
        ``state_dict`` order even for trees that came back key-sorted from ``jit`` or
        optax. Default ``None``: the trees' own order (torch's for fresh ``init``
        trees). The order is kept in the metadata under ``"purelayers.order"`` (a
        reserved key, hidden from ``load_metadata``): the ``safetensors`` package lays
        out the header itself, by dtype and then name.
      write_aliases: also write each of ``model``'s tied names (``model.aliases()``)
        with its original's values, for torch's strict ``load_state_dict``, which
        expects both names of a tied weight. The file records which names are aliases
        (metadata key ``"purelayers.aliases"``, reserved and hidden from
        ``load_metadata``), so ``load_into`` reads it back without ``model``. Default
        ``False``: the original only, as Hugging Face writes tied weights.

    Returns:
      the path written: the file, or the index file of a sharded checkpoint.

    Raises:
      ValueError: bad ``metadata`` or ``max_shard_bytes``, a leaf of a dtype safetensors
        cannot store, a name both in ``params`` and ``state``, or ``path`` is a folder
        (without ``max_shard_bytes``).
    """
    meta = _check_metadata(metadata)
    flat = flatten(merge(key_data(params), key_data(state)))
    if write_aliases:
        if model is None:
            raise ValueError("save: write_aliases=True needs model= (the layer that ties them)")
        written: dict[str, str] = {}
        for alias, original in model_aliases(model, "save").items():
            if original not in flat:
                raise ValueError(f"save: {original!r}, the original of {alias!r}, is not in params")
            flat[alias] = flat[original]
            written[alias] = original
        meta[_io.ALIASES_KEY] = json.dumps(written, separators=(",", ":"))
    flat = _in_model_order(model, flat)
    entries = [_entry(k, v) for k, v in flat.items()]
    target = Path(path)
    if max_shard_bytes is None:
        if target.is_dir():
            raise ValueError(
                f"save: {target} is a folder; pass a file name such as "
                f"{target / _io.SINGLE_NAME}, or max_shard_bytes= to write a sharded "
                "checkpoint into the folder"
            )
        if not target.parent.is_dir():
            raise FileNotFoundError(f"save: the folder of {target} does not exist")
        _io.write_file(target, entries, meta)
        return target
    if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int):
        raise ValueError(f"save: max_shard_bytes must be a positive int, got {max_shard_bytes!r}")
    if max_shard_bytes <= 0:
        raise ValueError(f"save: max_shard_bytes must be a positive int, got {max_shard_bytes}")
    if target.exists() and not target.is_dir():
        raise ValueError(
            f"save: {target} is a file; a sharded save (max_shard_bytes=) writes a folder"
        )
    return _io.write_sharded(target, entries, meta, max_shard_bytes)
