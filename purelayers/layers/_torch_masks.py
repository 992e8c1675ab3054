"""torch's attention masks and sequence layouts, as the transformer layers read them.

A boolean ``attn_mask`` is ``True`` where attention is *not* allowed, a floating-point
one is added to the scores; a key padding mask is ``True`` at padding. Both become one
additive mask for ``InProjAttention``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from purelayers.layers._checks import LayerError


def batch_first_layout(layer: str, x: Any, batch_first: bool) -> jax.Array:
    """``x`` as ``(N, S, E)`` (or the unbatched ``(S, E)``)."""
    x = jnp.asarray(x)
    if x.ndim not in (2, 3):
        layout = "(N, S, E)" if batch_first else "(S, N, E)"
        raise LayerError(layer, "input rank", f"2 or 3 ((S, E) or {layout})", x.ndim)
    return x if batch_first or x.ndim == 2 else jnp.swapaxes(x, 0, 1)


def restore_layout(y: jax.Array, batch_first: bool) -> jax.Array:
    return y if batch_first or y.ndim == 2 else jnp.swapaxes(y, 0, 1)


def _additive(layer: str, name: str, m: Any, dtype: Any, shapes: list[tuple[int, ...]]):
    """torch's mask ``m`` as a float array added to the scores (``-inf`` where a boolean
    ``m`` is True); its shape must be one of ``shapes``."""
    m = jnp.asarray(m)
    kind_ok = m.dtype == jnp.bool_ or jnp.issubdtype(m.dtype, jnp.floating)
    if not (kind_ok and tuple(m.shape) in shapes):
        raise LayerError(
            layer,
            f"{name} (bool, True where not allowed, or float, added to the scores)",
            " or ".join(f"{s} bool or float" for s in shapes),
            f"{tuple(m.shape)} {m.dtype}",
        )
    if m.dtype == jnp.bool_:
        return jnp.where(m, jnp.asarray(-jnp.inf, dtype), jnp.asarray(0.0, dtype))
    return m


def square_mask(q_len: int, kv_len: int, dtype: Any = jnp.float32) -> jax.Array:
    """torch's causal mask: ``-inf`` above the diagonal (query ``i`` sees keys ``0..i``)."""
    above = jnp.arange(kv_len)[None, :] > jnp.arange(q_len)[:, None]
    return jnp.where(above, jnp.asarray(-jnp.inf, dtype), jnp.asarray(0.0, dtype))


def torch_mask(
    layer: str,
    names: tuple[str, str, str],
    x: jax.Array,
    kv_len: int,
    nhead: int,
    attn_mask: Any,
    kpm: Any,
    is_causal: bool,
) -> jax.Array | None:
    """torch's ``attn_mask`` and key padding mask for queries ``x`` (batch first) as one
    additive mask broadcastable to ``(N, nhead, L, S)``; ``is_causal`` as torch's hint."""
    mask_name, kpm_name, causal_name = names
    batched, q_len = x.ndim == 3, x.shape[-2]
    n = x.shape[0] if batched else 1
    dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32
    if is_causal:
        if attn_mask is None:
            raise LayerError(
                layer,
                f"{causal_name}=True is a hint that {mask_name} is the causal mask and needs "
                f"{mask_name}, as torch's",
                None,
                None,
                f"pass {mask_name}=Transformer.generate_square_subsequent_mask({q_len})",
            )
        if kpm is None:  # torch then attends causally and leaves the mask unread
            attn_mask = square_mask(q_len, kv_len, dtype)
    total = None
    if attn_mask is not None:
        heads = (n * nhead if batched else nhead, q_len, kv_len)
        m = _additive(layer, mask_name, attn_mask, dtype, [(q_len, kv_len), heads])
        total = m.reshape((1, 1, q_len, kv_len) if m.ndim == 2 else (n, nhead, q_len, kv_len))
    if kpm is not None:
        k = _additive(layer, kpm_name, kpm, dtype, [(n, kv_len) if batched else (kv_len,)])
        k = k.reshape(n, 1, 1, kv_len)
        total = k if total is None else total + k
    return total
