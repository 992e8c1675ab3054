"""An eager ``init`` (a concrete key, outside any trace) as one compiled program.

Op by op, every random draw of an ``init`` compiles a program of its own (a ``Linear``
alone is a handful); as one program, a layer, shape and dtype compile once. The tree
keeps its order: JAX's dict nodes sort their keys, and a params tree lists its names as
torch does.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from purelayers._tree import Stacked
from purelayers.layers._fit import identity

__all__ = ["as_dicts", "init_program", "static_call"]


class _Static:
    """A layer as a static ``jit`` argument, hashed and compared by ``identity``: a model
    and its copy with replaced children (``lora.wrap``) compare equal as configurations
    but build different trees."""

    __slots__ = ("key", "layer")

    def __init__(self, layer: Any):
        self.layer, self.key = layer, (type(layer), identity(layer))

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and self.key == other.key


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def static_call(layer: Any, key: Any, shape: Any, args: tuple, kwargs: dict) -> Any:
    """``(layer, shape, args, kwargs)`` as static arguments for an eager ``init`` (a
    concrete key, outside any trace); None where ``init`` is traced already or an
    argument is not hashable."""
    if not isinstance(key, jax.Array) or isinstance(key, jax.core.Tracer):
        return None
    static = (_Static(layer), _frozen(shape), _frozen(args), tuple(sorted(kwargs.items())))
    try:
        hash(static)
    except TypeError:
        return None
    return static


@jax.tree_util.register_pytree_node_class
class _InOrder:
    """A dict as a pytree node that keeps its keys' order (JAX's dict nodes sort them,
    and a params tree lists its names in torch's order)."""

    __slots__ = ("keys", "values")

    def __init__(self, keys: tuple, values: list):
        self.keys, self.values = keys, values

    def tree_flatten(self) -> tuple[list, tuple]:
        return list(self.values), self.keys

    @classmethod
    def tree_unflatten(cls, keys: tuple, values: list) -> _InOrder:
        return cls(keys, values)


def _in_order(tree: Any) -> Any:
    if isinstance(tree, dict):
        return _InOrder(tuple(tree), [_in_order(v) for v in tree.values()])
    if isinstance(tree, Stacked):
        return Stacked(_in_order(tree.tree), tree.n)
    return tree


def as_dicts(tree: Any) -> Any:
    if isinstance(tree, _InOrder):
        return {k: as_dicts(v) for k, v in zip(tree.keys, tree.values, strict=True)}
    if isinstance(tree, Stacked):
        return Stacked(as_dicts(tree.tree), tree.n)
    return tree


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 4, 5))
def init_program(raw, static, shape, key, args, kwargs):
    """An eager ``init`` as one compiled program, rather than one per random draw
    (``Linear`` alone is a handful): one compilation per layer, shape and dtype; the
    tree keeps its order."""
    return _in_order(raw(static.layer, key, shape, *args, **dict(kwargs)))
