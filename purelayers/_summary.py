"""``purelayers.params.summary``: a table of a model's checkpoint names."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from purelayers._save import _in_model_order
from purelayers._tree import model_aliases, specs
from purelayers.trees import Stacked, merge

__all__ = ["summary"]


def _human_bytes(n: int) -> str:
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"


def summary(model: Any, params: Any = None, state: Any = None) -> str:
    """A table of every checkpoint name with its shape, dtype, count and kind, and totals.

    ``summary(model, params, state=None)`` lists names in the model's (PyTorch's)
    registration order even when the trees came back key-sorted from ``jit`` or optax;
    ``summary(params)`` lists a tree in its own iteration order. ``kind`` is
    ``trainable`` for ``params`` and ``buffer`` for ``state``; the last line totals
    both and their size in memory. A tied name of ``model`` (``layers.Tied``) is listed
    where torch lists it, with kind ``tied to <original>``, and counted once.

    Example:
      >>> model = L.Sequential(L.Linear(8))
      >>> params = model.init(jax.random.key(0), (1, 4))
      >>> print(summary(model, params))
      name      shape   dtype    count  kind
      -------------------------------------------
      0.weight  (8, 4)  float32     32  trainable
      0.bias    (8,)    float32      8  trainable
      -------------------------------------------
      total: 40 trainable parameters in 2 arrays (160 B)
    """
    if params is None and isinstance(model, (Mapping, Stacked)):
        model, params = None, model
    if params is None and state is None:
        raise ValueError(
            "summary: give the params to list: summary(params), or summary(model, params, "
            f"state) for the model's order; got {type(model).__name__} alone"
        )
    for what, tree in (("params", params), ("state", state)):
        bad = [leaf for leaf in jax.tree.leaves(tree) if not hasattr(leaf, "shape")]
        if bad:
            raise ValueError(
                f"summary: {what} must be a tree of arrays (model.init's result), got a leaf "
                f"{bad[0]!r} in {type(tree).__name__} {tree!r:.80}"
            )
    kinds = {name: "trainable" for name in specs(params or {})}
    kinds.update({name: "buffer" for name in specs(state or {})})
    flat = specs(merge(params or {}, state or {}))
    for alias, original in model_aliases(model, "summary").items():
        if original in flat and alias not in flat:
            flat[alias], kinds[alias] = flat[original], f"tied to {original}"
    flat = _in_model_order(model, flat)
    rows = [
        (name, str(tuple(a.shape)), str(a.dtype), math.prod(a.shape)) for name, a in flat.items()
    ]
    n_params = sum(r[3] for r in rows if kinds[r[0]] == "trainable")
    n_buffers = sum(r[3] for r in rows if kinds[r[0]] == "buffer")
    nbytes = sum(
        r[3] * jnp.dtype(r[2]).itemsize
        for r in rows
        if r[0] in kinds and not kinds[r[0]].startswith("tied")
    )
    header = ("name", "shape", "dtype", "count", "kind")
    cells = [header, *[(r[0], r[1], r[2], f"{r[3]:,}", kinds[r[0]]) for r in rows]]
    widths = [max(len(c[i]) for c in cells) for i in range(5)]

    def line(c: tuple[str, ...]) -> str:
        return "  ".join(
            c[i].rjust(widths[i]) if i == 3 else c[i].ljust(widths[i]) for i in range(5)
        ).rstrip()

    body = [line(c) for c in cells[1:]]
    rule = "-" * max(len(b) for b in [line(header), *body])
    total = f"total: {n_params:,} trainable parameters"
    if n_buffers:
        total += f", {n_buffers:,} buffer value{'s' if n_buffers != 1 else ''}"
    arrays = sum(1 for r in rows if not kinds[r[0]].startswith("tied"))
    total += f" in {arrays} arrays ({_human_bytes(nbytes)})"
    return "\n".join([line(header), rule, *body, rule, total])
