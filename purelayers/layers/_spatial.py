"""Helpers shared by the convolution and pooling families: per-axis settings and the
optional batch axis of channels-first inputs ``(N, C, *spatial)`` / ``(C, *spatial)``."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.functional.conv import tap_windows  # noqa: F401 (fold's import)
from purelayers.layers._checks import LayerError, as_array, config_error

_LAYOUTS = {1: "(N, C, L)", 2: "(N, C, H, W)", 3: "(N, C, D, H, W)"}


def layout(nd: int) -> str:
    """The batched layout's axis names, ``"(N, C, H, W)"`` for ``nd = 2``."""
    return _LAYOUTS[nd]


def is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def ntuple(layer: str, arg: str, value: Any, nd: int, *, minimum: int) -> tuple[int, ...]:
    """``value`` (an int, or a sequence of ``nd`` ints) as a tuple of ``nd`` ints, each at
    least ``minimum``; a ``ValueError`` naming ``arg`` and the value otherwise."""
    values = (value,) * nd if is_int(value) else value
    ok = isinstance(values, (tuple, list)) and len(values) == nd
    ok = ok and all(is_int(v) and v >= minimum for v in values)
    if not ok:
        rule = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise config_error(layer, arg, f"{rule} or a tuple of {nd} such integers", value)
    return tuple(int(v) for v in values)


def check_rank(layer: str, shape: tuple[int, ...], nd: int) -> None:
    """Channels-first input with or without the batch axis."""
    if len(shape) not in (nd + 1, nd + 2):
        raise LayerError(
            layer,
            "input rank",
            f"{nd + 2} {layout(nd)} or {nd + 1} (unbatched, {layout(nd)[1:-1].replace('N, ', '')})",
            f"{len(shape)} (x.shape == {shape})",
        )


def batched(layer: str, x: Any, nd: int) -> tuple[jax.Array, bool]:
    """``x`` with a batch axis, and whether one was added (to drop it again)."""
    check_rank(layer, tuple(jnp.shape(x)), nd)
    if jnp.ndim(x) == nd + 1:
        return jnp.expand_dims(x, 0), True
    return as_array(x), False


def need_nonempty(layer: str, x: jax.Array, first: int = 1, why: str = "") -> None:
    """Axes ``first:`` of the batched ``x`` must be non-empty (torch refuses them empty:
    only the batch axis may have length 0)."""
    empty = [i for i, d in enumerate(x.shape) if i >= first and d == 0]
    if empty:
        raise LayerError(
            layer,
            f"input axis {empty[0]} length",
            "at least 1"
            + (f" ({why})" if why else " (only the batch axis may be empty, as in torch)"),
            f"0 (x.shape == {tuple(x.shape)})",
        )


def unbatched(y: jax.Array, added: bool) -> jax.Array:
    return y[0] if added else y
