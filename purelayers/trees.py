"""Params trees and their checkpoint names: ``flatten``, ``unflatten``, ``merge``,
``count``, and ``Stacked``, the params (or state) of ``n`` identical blocks stored as
one tree whose arrays have a leading axis ``n``, so a ``lax.scan`` over the blocks reads
them in place.

``Stacked`` is a pytree node, so ``jit``, ``grad``, ``vmap`` and optax keep it; its
checkpoint names are the per-block names (``0.ln1.weight``, ``1.ln1.weight``, ...),
which ``flatten`` lists and ``fill`` (the loaders' rebuild) collects back into stacks.
``purelayers.params`` re-exports the names most code needs (``pl.params.flatten``,
``pl.params.Stacked``, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "BlockKey",
    "Stacked",
    "count",
    "fill",
    "flatten",
    "merge",
    "take_block",
    "unflatten",
]


class BlockKey(jax.tree_util.GetAttrKey):
    """The key-path entry of a ``Stacked`` node: it stands for every block at once.

    It is a ``jax.tree_util.GetAttrKey`` of the attribute ``tree`` (what
    ``getattr(stacked, "tree")`` gives), so libraries that walk key paths (orbax,
    optax, ``jax.tree_util.keystr``) read it as a plain attribute; ``n`` is the number
    of blocks. ``str()`` is ``"*"``; ``purelayers.sharding`` resolves rules on block
    ``0``'s name and leaves the stacked axis unsplit.
    """

    def __init__(self, n: int):
        super().__init__("tree")
        self.n = n

    def __repr__(self) -> str:
        return f"BlockKey({self.n})"

    def __str__(self) -> str:
        return "*"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BlockKey) and other.n == self.n

    def __hash__(self) -> int:
        return hash(("BlockKey", self.n))


@jax.tree_util.register_pytree_with_keys_class
class Stacked:
    """``n`` blocks' trees stored as one tree of arrays with a leading axis ``n``.

    ``Stacked(tree, n)[i]`` is block ``i``'s tree (slices); ``Stacked(tree, n)["weight"]``
    is the stacked array (leading axis ``n``), and ``keys()``, ``items()``, ``in`` and
    iteration read the stacked entries, as a dict of params reads. ``Repeat`` builds and
    reads these; users meet them as the node under a ``Repeat``'s name.

    Example:
      >>> s = Stacked({"weight": jnp.zeros((3, 4, 2))}, 3)
      >>> list(pl.params.flatten({"blocks": s}))
      ['blocks.0.weight', 'blocks.1.weight', 'blocks.2.weight']
    """

    __slots__ = ("n", "tree")

    def __init__(self, tree: Any, n: int):
        self.tree = tree
        self.n = int(n)

    def tree_flatten_with_keys(self):
        return [(BlockKey(self.n), self.tree)], self.n

    def tree_flatten(self):
        return [self.tree], self.n

    @classmethod
    def tree_unflatten(cls, n: int, children: list[Any]) -> Stacked:
        return cls(children[0], n)

    def __getitem__(self, i: int | str) -> Any:
        if isinstance(i, str):  # the stacked entry: ``params["weight"]`` is ``[n, ...]``
            if not isinstance(self.tree, Mapping) or i not in self.tree:
                raise KeyError(i)
            return self.tree[i]
        if not -self.n <= i < self.n:
            raise IndexError(f"Stacked: block {i} of {self.n}")
        return jax.tree.map(lambda a: take_block(a, (i % self.n,)), self.tree)

    # read as the mapping of its stacked entries, as a dict of params is read
    def keys(self) -> Any:
        return self.tree.keys()

    def values(self) -> Any:
        return self.tree.values()

    def items(self) -> Any:
        return self.tree.items()

    def __contains__(self, name: object) -> bool:
        return isinstance(self.tree, Mapping) and name in self.tree

    def __iter__(self) -> Iterator[str]:
        return iter(self.tree)

    def __len__(self) -> int:
        return len(self.tree)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Stacked) or other.n != self.n:
            return False
        mine, theirs = jax.tree.flatten(self.tree), jax.tree.flatten(other.tree)
        return mine[1] == theirs[1] and all(
            np.array_equal(a, b) for a, b in zip(mine[0], theirs[0], strict=True)
        )

    __hash__ = None  # type: ignore[assignment]  (holds arrays, like a dict)

    def __repr__(self) -> str:
        return f"Stacked({self.tree!r}, n={self.n})"


def take_block(leaf: Any, index: tuple[int, ...]) -> Any:
    """Block ``index`` of a stacked leaf (one entry per enclosing ``Stacked``); shape
    and dtype alone for an abstract leaf; anything without a shape as it is."""
    if not index:
        return leaf
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(leaf.shape[len(index) :], leaf.dtype)
    if isinstance(leaf, jax.sharding.NamedSharding):  # a block's share of a stacked spec
        spec = tuple(leaf.spec)[len(index) :]
        return jax.sharding.NamedSharding(leaf.mesh, jax.sharding.PartitionSpec(*spec))
    if not hasattr(leaf, "shape"):
        return leaf
    return leaf[index]


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def key_name(key: Any) -> str:
    """The name component of one key-path entry: a dict key, a sequence index, an
    attribute (a namedtuple's field) or a flattened index."""
    for attr in ("key", "idx", "name"):  # DictKey, SequenceKey, GetAttrKey, FlattenedIndexKey
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _children(tree: Any) -> list[tuple[str, Any]] | None:
    """``tree``'s named children one level down (a Mapping in its own order, others in
    their pytree order, a namedtuple by field), or None for a leaf."""
    if isinstance(tree, Mapping):
        return [(str(k), v) for k, v in tree.items()]
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return [(str(i), v) for i, v in enumerate(tree)]
    entries, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)
    if len(entries) == 1 and entries[0][0] == ():
        return None
    return [(".".join(key_name(k) for k in path), v) for path, v in entries]


def _walk(tree: Any, prefix: str = "", index: tuple[int, ...] = ()) -> Iterator[tuple[str, Any]]:
    if isinstance(tree, Stacked):
        for i in range(tree.n):
            yield from _walk(tree.tree, _join(prefix, str(i)), (*index, i))
        return
    if tree is None:
        return
    children = _children(tree)
    if children is None:
        yield prefix, take_block(tree, index)
        return
    for k, v in children:
        if not k or "." in k:
            raise ValueError(
                f"flatten: key {k!r} under {prefix or 'the root'!r} cannot be a checkpoint "
                "name component (empty or containing '.')"
            )
        yield from _walk(v, _join(prefix, k), index)


def flatten(tree: Any) -> dict[str, Any]:
    """``{"dotted.name": array}`` in the tree's iteration order.

    A freshly initialized tree iterates in registration order, so this lists names
    exactly as PyTorch's ``state_dict()`` does. Lists and tuples are numbered,
    namedtuples (optax's states) named by field, other pytree nodes by their key-path
    entries; ``None`` and empty nodes hold no names. A
    ``Stacked`` node (``Repeat``'s blocks) lists each block's names in turn,
    ``0.ln1.weight``, ``0.ln1.bias``, ..., ``1.ln1.weight``, with that block's slice.

    Example:
      >>> w, b, v = jnp.ones((3, 2)), jnp.zeros(3), jnp.ones((1, 3))
      >>> {k: a.shape for k, a in flatten({"0": {"weight": w, "bias": b}, "2": {"weight": v}}).items()}
      {'0.weight': (3, 2), '0.bias': (3,), '2.weight': (1, 3)}
    """
    return dict(_walk(tree))


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The nested tree of a flat ``{"dotted.name": array}`` dict (inverse of ``flatten``
    for trees of dicts; block names come back as plain ``"0"``, ``"1"``, ... groups, and
    ``fill`` into a template restores its stacks)."""
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
    return sum(int(np.prod(jnp.shape(leaf))) for leaf in jax.tree.leaves(tree))


def _is_group(v: Any) -> bool:
    return isinstance(v, (Mapping, Stacked))


def merge(params: Any, state: Any = None) -> Any:
    """One tree holding ``params`` and ``state`` (buffers) under their torch names.

    At every level a module's parameters come first, then its buffers, then its
    children, as in PyTorch's ``state_dict()``. Stacked blocks merge block-wise.
    Numbered children (a ``Sequential``'s) come in index order, so a child with buffers
    and no parameters (``BatchNorm1d(affine=False)``) takes its place among them; named
    children come in ``params``' order, then those only ``state`` has
    (``model.ordered(merge(params, state))`` restores a model's own order).
    """
    if not state:
        return dict(params) if isinstance(params, Mapping) else params
    if not params:
        return dict(state) if isinstance(state, Mapping) else state
    if isinstance(params, Stacked) or isinstance(state, Stacked):
        if not (isinstance(params, Stacked) and isinstance(state, Stacked)) or (
            params.n != state.n
        ):
            raise ValueError("merge: stacked params and state must both be Stacked, of one n")
        return Stacked(merge(params.tree, state.tree), params.n)
    out: dict[str, Any] = {}
    for tree in (params, state):
        for k, v in tree.items():
            if not _is_group(v):
                if k in out:
                    raise ValueError(f"merge: {k!r} is both a parameter and a buffer")
                out[k] = v
    children = [*params, *(k for k in state if k not in params)]
    if all(k.isdecimal() for k in children):  # numbered children: torch's index order
        children.sort(key=int)
    for k in children:
        p, s = params.get(k), state.get(k)
        if _is_group(p) or _is_group(s):
            out[k] = merge(p or {}, s or {})
    return out


Get = Callable[[tuple[str, ...], Any, tuple[int, ...]], Any]


def fill(template: Any, get: Get) -> Any:
    """A tree shaped like ``template`` whose leaves are ``get(names, leaf, lead)``.

    ``names`` are the checkpoint names the leaf holds: one for a plain leaf; for a leaf
    under ``Stacked`` nodes, one per block in C order of the stacked axes ``lead``
    (``(n,)`` under one ``Repeat``), so ``get`` can stack the blocks' arrays into it.
    """

    def go(tree: Any, prefixes: tuple[str, ...], lead: tuple[int, ...]) -> Any:
        if isinstance(tree, Stacked):
            inner = tuple(_join(p, str(i)) for p in prefixes for i in range(tree.n))
            return Stacked(go(tree.tree, inner, (*lead, tree.n)), tree.n)
        if isinstance(tree, Mapping):  # rebuilt in its own order (jax's would sort it)
            return {
                k: go(v, tuple(_join(p, str(k)) for p in prefixes), lead) for k, v in tree.items()
            }
        if tree is None:
            return None
        # any other node (list, tuple, namedtuple, a registered class): its children one
        # level down, put back with its own treedef
        entries, treedef = jax.tree_util.tree_flatten_with_path(
            tree, is_leaf=lambda x: x is not tree
        )
        if len(entries) == 1 and entries[0][0] == ():
            return get(prefixes, tree, lead)
        return treedef.unflatten(
            [go(v, tuple(_join(p, key_name(k[0])) for p in prefixes), lead) for k, v in entries]
        )

    return go(template, ("",), ())


# flax.serialization learns Stacked when (and if) it is imported
from purelayers import _interop  # noqa: E402

_interop.install(Stacked)
