"""Checkpoints of sharded trees: ``save`` gathers (across hosts too), ``load_sharded``
places each device's slice straight from the file. Re-exported by
``purelayers.sharding``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers import _safetensors_io as _io
from purelayers import params as _params

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

    On one host every shard is addressable and ``params.save`` assembles each array
    from its shards while writing the file that holds it (a file's arrays are on the
    host together while it is written; ``max_shard_bytes`` bounds that). Across hosts
    each array that this process cannot see whole is gathered with
    ``jax.experimental.multihost_utils.process_allgather`` (call ``save`` on every
    process, in the same order) before anything is written, so each process holds the
    gathered arrays while process 0 writes, and all processes wait for it. The
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


def load_sharded(
    path: str | os.PathLike,
    params: Any,
    shardings: Any,
    state: Any = None,
    state_shardings: Any = None,
    *,
    strict: bool = True,
    model: Any = None,
    tensors: dict[str, Any] | None = None,
) -> Any:
    """A checkpoint loaded by name straight onto ``shardings``.

    Each array is built with ``jax.make_array_from_callback``: every device reads only
    its own slice of the file through a memory map, so no process or device holds an
    unsharded copy of a split array. ``params`` (and ``state``) are templates: trees
    of arrays or of ``jax.ShapeDtypeStruct`` (``purelayers.params.abstract(model, shape)``), whose
    names, shapes and dtypes the checkpoint must match; ``shardings`` are matching
    trees of ``Sharding``s (``named_shardings``). ``path`` is anything
    ``purelayers.params.load`` accepts, a single file or a sharded index.

    Matching follows ``params.load_into``: with ``strict``, one ``KeyError`` names every
    missing and unexpected key; shape mismatches are one ``ValueError`` naming each;
    values are cast to the template's dtype. With ``strict=False``, names missing from
    the file keep the template's value (placed on its sharding), which needs a
    concrete template array there. ``model`` gives the tied names, as does a file
    written with ``write_aliases=True`` (``params.load_into``).
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
    recorded: dict[str, str] = {}  # tied names the file records (save's write_aliases)
    if tensors is None:  # (given: a file's tensors already matched to other names)
        tensors, meta = _io.scan(path)
        recorded = _io.aliases(meta)

    def equal(a: str, b: str) -> bool:
        return _io.same_values(tensors[a], tensors[b])

    source, keys = _params._match(
        names,
        tensors,
        strict=strict,
        who=who,
        aliases={**recorded, **_params._aliases(model, who)},
        equal=equal,
    )
    templates = [params] if state is None else [params, state]
    _params._refuse_abstract_missing(templates, keys.missing_keys, who)

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
            block_shape = np.broadcast_to(np.False_, np.shape(leaf)[len(lead) :])[rest].shape
            out = _io.owned(picked.shape + block_shape, dtype)
            flat_out = out.reshape(-1, *block_shape)
            for j, i in enumerate(picked.reshape(-1)):
                if blocks[i] is not None:
                    blocks[i].read(rest, dtype, flat_out[j, ...])
                else:  # strict=False: this block keeps the template's value
                    kept = np.asarray(leaf).reshape(-1, *np.shape(leaf)[len(lead) :])[i][rest]
                    np.copyto(flat_out[j, ...], kept, casting="unsafe")
            return out

        return jax.make_array_from_callback(np.shape(leaf), sharding, read, dtype=dtype)

    if state is None:
        return _params.fill(params, get)
    return _params.fill(params, get), _params.fill(state, get)
