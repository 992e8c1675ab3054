"""Parameter trees and their checkpoint names.

A params (or state) tree is a nested ``dict`` of arrays. Its dotted flattening is the
checkpoint name and equals the PyTorch ``state_dict`` key of the equivalent
``torch.nn`` model: ``{"0": {"weight": w}}`` is ``"0.weight"``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np

__all__ = [
    "count",
    "flatten",
    "load_state_dict",
    "merge",
    "summary",
    "unflatten",
]


def _walk(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(tree, Mapping):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = ((str(i), v) for i, v in enumerate(tree))
    else:
        if tree is not None:
            yield prefix, tree
        return
    for k, v in items:
        k = str(k)
        if not k or "." in k:
            raise ValueError(
                f"flatten: key {k!r} under {prefix or 'the root'!r} cannot be a checkpoint "
                "name component (empty or containing '.')"
            )
        yield from _walk(v, f"{prefix}.{k}" if prefix else k)


def flatten(tree: Any) -> dict[str, Any]:
    """``{"dotted.name": array}`` in the tree's iteration order.

    A freshly initialized tree iterates in registration order, so this lists names
    exactly as PyTorch's ``state_dict()`` does. Lists and tuples are numbered.

    Example:
      >>> flatten({"0": {"weight": w, "bias": b}, "2": {"weight": v}})
      {'0.weight': w, '0.bias': b, '2.weight': v}
    """
    return dict(_walk(tree))


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The nested tree of a flat ``{"dotted.name": array}`` dict (inverse of ``flatten``)."""
    tree: dict[str, Any] = {}
    for name, value in flat.items():
        parts = name.split(".")
        if not all(parts):
            raise ValueError(f"unflatten: {name!r} has an empty name component")
        node = tree
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(
                    f"unflatten: {name!r} needs {'.'.join(parts[: i + 1])!r} to be a group, "
                    "but it is an array"
                )
            node = child
        if parts[-1] in node:
            raise ValueError(f"unflatten: {name!r} is both an array and a group of arrays")
        node[parts[-1]] = value
    return tree


def count(tree: Any) -> int:
    """Total number of scalars in every array of ``tree``."""
    return sum(math.prod(jnp.shape(leaf)) for _, leaf in _walk(tree))


def merge(params: Any, state: Any = None) -> dict[str, Any]:
    """One tree holding ``params`` and ``state`` (buffers) under their torch names.

    At every level a module's parameters come first, then its buffers, then its
    children, as in PyTorch's ``state_dict()``.
    """
    if not state:
        return dict(params)
    if not params:
        return dict(state)
    out: dict[str, Any] = {}
    for tree in (params, state):
        for k, v in tree.items():
            if not isinstance(v, Mapping):
                if k in out:
                    raise ValueError(f"merge: {k!r} is both a parameter and a buffer")
                out[k] = v
    for k in [*params, *(k for k in state if k not in params)]:
        p, s = params.get(k), state.get(k)
        if isinstance(p, Mapping) or isinstance(s, Mapping):
            out[k] = merge(p or {}, s or {})
    return out


# -- loading by name ------------------------------------------------------------------


def _to_numpy(value: Any) -> np.ndarray:
    """A host array from numpy, JAX, or torch values (torch is never imported)."""
    if type(value).__module__.startswith("torch"):
        tensor = value.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            # numpy has no bfloat16: widen exactly to float32, then narrow exactly back.
            return tensor.float().numpy().astype(ml_dtypes.bfloat16)
        return tensor.numpy()
    return np.asarray(value)


def load_state_dict(template: Any, flat: Mapping[str, Any], *, strict: bool = True) -> Any:
    """A new tree shaped like ``template`` with arrays taken from ``flat`` by name.

    ``flat`` maps dotted names (``"0.weight"``) to numpy arrays, JAX arrays or torch
    tensors, e.g. a torch ``state_dict()``. Values are cast to the template's dtypes.
    Every check runs before anything is converted, and ``template`` is never changed:

    - ``strict=True``: names in the template but not in ``flat`` (missing) and names in
      ``flat`` but not in the template (unexpected) raise one ``KeyError`` naming all.
    - ``strict=False``: only the names both share are loaded; the rest keep the
      template's values.
    - A shape mismatch raises one ``ValueError`` naming each key, expected and got.
    """
    names = flatten(template)
    missing = [k for k in names if k not in flat]
    unexpected = [k for k in flat if k not in names]
    if strict and (missing or unexpected):
        raise KeyError(
            "load_state_dict: the checkpoint does not match the model by name; "
            f"missing keys: {missing}; unexpected keys: {unexpected}"
        )
    mismatched = [
        f"{k}: expected {tuple(jnp.shape(names[k]))}, got {tuple(np.shape(flat[k]))}"
        for k in names
        if k in flat and tuple(np.shape(flat[k])) != tuple(jnp.shape(names[k]))
    ]
    if mismatched:
        raise ValueError("load_state_dict: shape mismatch for " + "; ".join(mismatched))
    loaded = {
        k: jnp.asarray(_to_numpy(flat[k]), dtype=jnp.result_type(names[k]))
        for k in names
        if k in flat
    }
    return _rebuild(template, loaded, "")


def _rebuild(tree: Any, loaded: Mapping[str, Any], prefix: str) -> Any:
    if isinstance(tree, Mapping):
        return {
            k: _rebuild(v, loaded, f"{prefix}.{k}" if prefix else str(k)) for k, v in tree.items()
        }
    if isinstance(tree, (list, tuple)):
        return type(tree)(
            _rebuild(v, loaded, f"{prefix}.{i}" if prefix else str(i)) for i, v in enumerate(tree)
        )
    return loaded.get(prefix, tree)


# -- summary --------------------------------------------------------------------------


def summary(model: Any, params: Any = None, state: Any = None) -> str:
    """A table of every checkpoint name with its shape, dtype, count and kind, and totals.

    ``summary(model, params, state=None)`` lists names in the model's (PyTorch's)
    registration order even when the trees came back key-sorted from ``jit`` or optax;
    ``summary(params)`` lists a tree in its own iteration order.
    """
    if params is None and isinstance(model, Mapping):
        model, params = None, model
    kinds = {name: "param" for name in flatten(params or {})}
    kinds.update({name: "buffer" for name in flatten(state or {})})
    tree = merge(params or {}, state or {})
    if model is not None:
        tree = model.ordered(tree)
    rows = [
        (
            name,
            str(tuple(jnp.shape(a))),
            str(jnp.result_type(a)),
            math.prod(jnp.shape(a)),
            kinds[name],
        )
        for name, a in flatten(tree).items()
    ]
    n_params = sum(r[3] for r in rows if r[4] == "param")
    n_buffers = sum(r[3] for r in rows if r[4] == "buffer")
    header = ("name", "shape", "dtype", "count", "kind")
    cells = [header, *[(r[0], r[1], r[2], f"{r[3]:,}", r[4]) for r in rows]]
    widths = [max(len(c[i]) for c in cells) for i in range(5)]

    def line(c: tuple[str, ...]) -> str:
        return "  ".join(
            c[i].rjust(widths[i]) if i == 3 else c[i].ljust(widths[i]) for i in range(5)
        ).rstrip()

    rule = "-" * len(line(header))
    total = f"total: {n_params:,} trainable parameters"
    if n_buffers:
        total += f", {n_buffers:,} buffer values"
    total += f" in {len(rows)} arrays"
    return "\n".join([line(header), rule, *(line(c) for c in cells[1:]), rule, total])
