"""Helpers the checkpoint code shares over params trees (``purelayers.trees`` holds the
trees' public API)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.trees import fill, flatten

__all__ = ["dtype_of", "model_aliases", "specs"]


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
