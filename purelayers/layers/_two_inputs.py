"""``init`` for layers of two inputs, which takes both inputs' shapes:
``init(key, (x1.shape, x2.shape))``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from purelayers.layers._checks import as_shape


def two_shapes(layer: str, shapes: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(x1.shape, x2.shape)`` from ``init``'s ``shapes``: a pair of shapes or of example
    arrays; else ``ValueError`` naming ``layer`` and saying what to pass."""
    pair = isinstance(shapes, (tuple, list)) and len(shapes) == 2
    pair = pair and not any(isinstance(s, int) for s in shapes)
    if not pair:
        raise ValueError(
            f"{layer}.init: shape must be the two inputs' shapes, (x1.shape, x2.shape), "
            f"got {shapes!r}"
        )
    try:
        return as_shape(shapes[0]), as_shape(shapes[1])
    except ValueError as e:
        raise ValueError(f"{layer}.{e}") from None


def pair_init(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Marks an ``init`` that takes two shapes: ``Layer``'s one-shape check is skipped
    (``two_shapes`` checks the pair)."""
    fn.unchecked = fn  # type: ignore[attr-defined]
    fn.two_inputs = True  # type: ignore[attr-defined]  (the params check reads both)
    return fn
