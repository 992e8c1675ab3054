"""Helpers the checkpoint code shares over params trees (``purelayers.trees`` holds the
trees' public API)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.trees import fill, flatten

__all__ = ["dtype_of", "is_key", "key_data", "model_aliases", "specs", "wrap_keys"]


def dtype_of(like: Any) -> Any:
    """The dtype of an array or of a ``jax.ShapeDtypeStruct``."""
    return like.dtype if isinstance(like, jax.ShapeDtypeStruct) else jnp.result_type(like)


def specs(tree: Any) -> dict[str, jax.ShapeDtypeStruct]:
    """The flat names of ``tree`` with each block's shape and dtype (nothing sliced)."""
    return flatten(fill(tree, lambda _, a, __: jax.ShapeDtypeStruct(np.shape(a), dtype_of(a))))


def model_aliases(model: Any, who: str) -> dict[str, str]:
    """``model``'s tied names (``{alias: original}``); none without a model."""
    if model is None:
        return {}
    if not callable(getattr(model, "aliases", None)):
        raise ValueError(f"{who}: model must be a purelayers Layer, got {model!r}")
    return model.aliases()


def is_key(leaf: Any) -> bool:
    """Whether ``leaf`` is a typed PRNG key array (``jax.random.key``), or its shape
    and dtype."""
    dtype = getattr(leaf, "dtype", None)
    try:
        return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    except TypeError:  # a torch dtype
        return False


def _key_data(leaf: Any) -> Any:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return jax.eval_shape(jax.random.key_data, leaf)
    return jax.random.key_data(leaf)


def key_data(tree: Any) -> Any:
    """``tree`` with each typed PRNG key leaf replaced by its key data (``uint32``
    with the impl's trailing axis), the form a checkpoint stores."""
    if not any(is_key(a) for a in jax.tree.leaves(tree)):
        return tree
    return fill(tree, lambda _, a, __: _key_data(a) if is_key(a) else a)  # (order kept)


def _impl(leaf: Any) -> Any:
    if isinstance(leaf, jax.Array):
        return jax.random.key_impl(leaf)
    found = []
    jax.eval_shape(lambda k: found.append(jax.random.key_impl(k)) or 0, leaf)
    return found[0]


def wrap_keys(tree: Any, like: Any) -> Any:
    """``tree`` (loaded from ``key_data(like)``) with the leaves that are typed keys in
    ``like`` wrapped back into typed keys of ``like``'s impls."""
    if tree is None or not any(is_key(a) for a in jax.tree.leaves(like)):
        return tree
    templates: list[Any] = []  # like's leaves, in the order fill visits tree's
    fill(like, lambda _, t, __: templates.append(t))
    it = iter(templates)

    def wrap(a: Any) -> Any:
        t = next(it)
        return jax.random.wrap_key_data(a, impl=_impl(t)) if is_key(t) else a

    return fill(tree, lambda _, a, __: wrap(a))
