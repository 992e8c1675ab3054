"""Composition helpers the model families share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from purelayers.layers import Layer, Params
from purelayers.layers._checks import fold

__all__ = ["fold", "init_children"]


def init_children(layer: Layer, key: jax.Array, shapes: Mapping[str, Any], dtype: Any) -> Params:
    """The params of ``layer``'s children, in ``children()`` order: child ``i`` is
    initialized from ``fold_in(key, i)`` for its input shape ``shapes[name]``; children
    not in ``shapes`` have no parameters."""
    params: Params = {}
    for i, name in enumerate(layer.children()):
        if name in shapes:
            params[name] = layer.init_child(name, jax.random.fold_in(key, i), shapes[name], dtype)
    return params
