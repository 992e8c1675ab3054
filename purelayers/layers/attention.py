"""The attention core: the parameter-free layers ``AttentionCore`` (heads, grouped-query
heads, rotary positions, masks, a fixed-shape decoding cache) and ``RotaryEmbedding``,
which every attention layer's projections (``multihead.py``) wrap. The math is in
``purelayers.functional.attention``, whose ``scaled_dot_product_attention``,
``causal_mask`` and ``rotary_embedding`` are exported here too.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.functional.attention import (
    apply_rotary,
    causal_from,
    causal_mask,
    dot_product_attention,
    dot_product_attention_reference,
    mask4,
    need_even,
    rotary_embedding,
    rotary_tables,
    scaled_dot_product_attention,
)
from purelayers.layers._checks import (
    LayerError,
    as_shape,
    check_float,
    check_int,
    config_error,
    need_key,
    promote_float,
)
from purelayers.layers.core import Layer, Params

__all__ = [
    "AttentionCore",
    "RotaryEmbedding",
    "causal_mask",
    "rotary_embedding",
    "scaled_dot_product_attention",
]


@dataclasses.dataclass(frozen=True)
class RotaryEmbedding(Layer):
    r"""Rotary position embedding (rotate-half, as Llama and ``transformers``), a
    parameter-free part of an ``AttentionCore``: ``inv_freq[i] = theta ** (-2i / d)``,
    ``angle = position * inv_freq``, ``y = x cos(angle) + rotate_half(x) sin(angle)``
    (see ``rotary_embedding``). Subclasses change the frequencies (``inv_freq``), as
    rope-scaling schemes do.

    Args:
      theta: the frequency base. Default ``10000.0``.

    Shape:
      ``apply(params, x, positions)``: ``x`` ``(batch, seq, heads, head_dim)``,
      ``positions`` ``(seq,)`` or ``(batch, seq)``; output like ``x``.

    Example:
      >>> rope = RotaryEmbedding(10000.0)
      >>> rope.apply({}, jnp.ones((1, 3, 2, 4)), jnp.arange(3)).shape
      (1, 3, 2, 4)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    theta: float = 10000.0

    def __post_init__(self):
        check_float("RotaryEmbedding", "theta", self.theta, low=0.0, low_open=True)

    def inv_freq(self, dim: int, dtype: Any) -> jax.Array:
        """``(dim / 2,)`` angular frequencies."""
        return 1.0 / (self.theta ** (jnp.arange(0, dim, 2, dtype=dtype) / dim))

    def tables(self, positions: jax.Array, dim: int, dtype: Any) -> tuple[jax.Array, jax.Array]:
        """``cos`` and ``sin`` of shape ``positions.shape + (dim,)``."""
        return self.tables_at(self.inv_freq(dim, dtype), positions, dtype)

    @staticmethod
    def tables_at(inv: jax.Array, positions: Any, dtype: Any) -> tuple[jax.Array, jax.Array]:
        """``cos`` and ``sin`` of ``positions * inv`` (both halves), for subclasses whose
        frequencies depend on the positions."""
        return rotary_tables(inv, positions, dtype)

    def apply(self, params: Params, x: Any, positions: Any = None, **_: Any) -> jax.Array:
        x = jnp.asarray(x)
        t, h = x.shape[1], x.shape[-1]
        need_even("RotaryEmbedding", h)
        positions = jnp.arange(t) if positions is None else jnp.asarray(positions)
        cos, sin = self.tables(positions, h, promote_float(x.dtype))
        lead = (1,) if cos.ndim == 2 else (cos.shape[0],)
        shape = (*lead, t, 1, h)
        return apply_rotary(x, cos.reshape(shape), sin.reshape(shape))


# -- the attention core ----------------------------------------------------------------


def need_cache_room(layer: str, used: int, new: int, max_len: int) -> None:
    """``new`` positions after ``used`` cached ones must fit a cache of ``max_len``
    (a write past it would land on earlier positions: ``dynamic_update_slice`` clamps)."""
    if used + new > max_len:
        raise LayerError(
            layer,
            "cached length plus new positions at most max_len",
            max_len,
            f"{used} + {new} = {used + new}",
            "the cache is full; make a longer one with init_cache",
        )


@dataclasses.dataclass(frozen=True)
class AttentionCore(Layer):
    r"""Multi-head scaled dot-product attention over projected inputs, with no
    parameters of its own: heads, grouped-query heads, rotary positions, masks and a
    fixed-shape decoding cache. Every attention layer (``MultiHeadAttention``'s fused
    ``qkv``, ``Attention``'s ``q_proj``/``k_proj``/``v_proj``/``o_proj``,
    ``InProjAttention``'s torch ``in_proj_weight``) is its projections around this.

    ``q`` ``(batch, q_len, H * head_dim)``, ``k`` ``(batch, kv_len, K * head_dim)``,
    ``v`` ``(batch, kv_len, K * v_dim)`` are split into heads (``H = num_heads``,
    ``K = num_kv_heads``; query head ``i`` uses kv head ``i // (H / K)``), rotated by
    ``rope`` at their positions, and combined as
    ``softmax(q k^T * scale + masks) v`` (``scaled_dot_product_attention``); the heads
    are concatenated back to ``(batch, q_len, H * v_dim)``.

    Args:
      num_heads: query heads ``H``.
      num_kv_heads: key/value heads ``K``, a divisor of ``H``. Default ``None``: ``H``.
      causal: a query attends keys at its position and before (end-aligned,
        ``causal_mask``). Default ``False``.
      dropout: attention-weight dropout in train mode (needs ``key``). Default ``0.0``.
      rope: a ``RotaryEmbedding`` applied to queries and keys, or ``None``. Default
        ``None``.
      scale: multiplies ``q k^T``. Default ``None``: ``1 / sqrt(head_dim)``.

    Masks (``mask=``): broadcastable to ``(batch, H, q_len, kv_len)``; boolean ``True``
    where a query may attend, or floating point added to the scores.

    Positions (``positions=``): ``(q_len,)`` or ``(batch, q_len)`` integer positions for
    ``rope`` (per-row positions of a left-padded batch). Default: ``arange(q_len)``
    after the cache's length.

    Decoding: ``init_cache((batch, max_len), head_dim)`` is ``{"keys": (batch, max_len,
    K, head_dim), "values": (batch, max_len, K, v_dim), "length": int32 scalar}``;
    with ``cache=``, the new keys and values are written at ``length`` (``lax.
    dynamic_update_slice``), the queries attend the cached prefix, and ``apply`` returns
    ``(y, new_cache)``; shapes never change, so a jitted decode step compiles once.

    Shape:
      ``q`` ``(batch, seq, H * head_dim)``, ``k`` and ``v`` ``(batch, kv_seq, K *
      head_dim)``; output ``(batch, seq, H * head_dim)``.

    Parameters: none.

    Example:
      >>> core = AttentionCore(4, num_kv_heads=2, causal=True)
      >>> q, kv = jnp.ones((2, 5, 32)), jnp.ones((2, 5, 16))
      >>> core.apply({}, q, kv, kv).shape
      (2, 5, 32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    num_heads: int
    _: dataclasses.KW_ONLY
    num_kv_heads: int | None = None
    causal: bool = False
    dropout: float = 0.0
    rope: RotaryEmbedding | None = None
    scale: float | None = None

    def __post_init__(self):
        name = "AttentionCore"
        check_int(name, "num_heads", self.num_heads)
        if self.num_kv_heads is not None:
            check_int(name, "num_kv_heads", self.num_kv_heads)
            if self.num_heads % self.num_kv_heads:
                raise config_error(
                    name,
                    "num_kv_heads",
                    f"a divisor of num_heads={self.num_heads}",
                    self.num_kv_heads,
                )
        check_float(name, "dropout", self.dropout, low=0.0, high=1.0)
        if self.rope is not None and not isinstance(self.rope, RotaryEmbedding):
            raise config_error(name, "rope", "a RotaryEmbedding or None", self.rope)
        if self.scale is not None:
            check_float(name, "scale", self.scale, low=0.0, low_open=True)

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    def init_cache(
        self, shape: Any, head_dim: int, dtype: Any = jnp.float32, *, v_dim: int | None = None
    ) -> dict[str, jax.Array]:
        """An empty cache for ``shape = (batch, max_len)``."""
        b, max_len = as_shape(shape)
        k = jnp.zeros((b, max_len, self.kv_heads, head_dim), dtype)
        v = k if v_dim in (None, head_dim) else jnp.zeros((b, max_len, self.kv_heads, v_dim), dtype)
        return {"keys": k, "values": v, "length": jnp.zeros((), jnp.int32)}

    def apply(self, params: Params, q: Any, k: Any = None, v: Any = None, **kwargs: Any):
        """``attend(q, k, v, **kwargs)``; ``k`` and ``v`` default to ``q``."""
        k = q if k is None else k
        return self.attend(q, k, v if v is not None else k, **kwargs)

    def _split(self, a: jax.Array, heads: int, what: str, layer: str) -> jax.Array:
        if a.ndim != 3 or a.shape[-1] % heads:
            raise LayerError(
                layer,
                f"{what} must be (batch, seq, heads * head_dim) with {heads} heads;",
                f"a last axis divisible by {heads}",
                tuple(a.shape),
            )
        return a.reshape(*a.shape[:2], heads, a.shape[-1] // heads)

    def attend(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        mask: Any = None,
        positions: Any = None,
        cache: dict[str, jax.Array] | None = None,
        key: jax.Array | None = None,
        train: bool = False,
        layer: str = "AttentionCore",
        weights: bool = False,
    ):
        """The attention of projected ``q``, ``k``, ``v`` (see the class docstring);
        ``layer`` names the owner in error messages. With ``weights`` (no cache):
        ``(out, weights)``, weights ``(batch, H, q_len, kv_len)`` after dropout."""
        q, k, v = (jnp.asarray(a) for a in (q, k, v))
        h, kh = self.num_heads, self.kv_heads
        q = self._split(q, h, "q", layer)
        k, v = self._split(k, kh, "k", layer), self._split(v, kh, "v", layer)
        b, t, _, hd = q.shape
        if k.shape[-1] != hd or k.shape[:2] != v.shape[:2] or k.shape[0] != b:
            raise LayerError(
                layer,
                "q, k and v must agree in batch, k and v in length, q and k in head_dim;",
                None,
                None,
                f"heads of q {q.shape}, k {k.shape}, v {v.shape}",
            )
        offset = jnp.zeros((), jnp.int32) if cache is None else cache["length"]
        if self.rope is not None:
            if k.shape[1] != t:
                raise LayerError(
                    layer, "rope needs self-attention (kv_len == q_len);", t, k.shape[1]
                )
            pos = offset + jnp.arange(t) if positions is None else jnp.asarray(positions)
            try:
                q, k = self.rope.apply({}, q, pos), self.rope.apply({}, k, pos)
            except LayerError as e:
                raise LayerError(layer, e.what, e.expected, e.got, e.hint) from None
        causal, visible, s = self.causal, None, k.shape[1]
        if cache is not None:
            k, v, cache, visible = self._write_cache(cache, k, v, offset, layer)
            s, causal = k.shape[1], False
        m4 = None if mask is None else mask4(mask, (b,), h, t, s, "mask", layer)
        if visible is not None:
            if m4 is None:
                m4 = visible
            else:  # a float mask forbids with -inf
                off = False if m4.dtype == jnp.bool_ else -jnp.inf
                m4 = jnp.where(visible, m4, jnp.asarray(off, m4.dtype))
        bias4 = None
        if m4 is not None and m4.dtype != jnp.bool_:
            m4, bias4 = None, m4
        p = self.dropout if train else 0.0
        if p > 0.0:
            need_key(layer, key)
        scale = (1.0 / math.sqrt(hd) if hd else 1.0) if self.scale is None else self.scale
        k, v = k.astype(q.dtype), v.astype(q.dtype)
        opts = dict(mask=m4, bias=bias4, is_causal=causal, scale=scale, dropout_p=p, key=key)
        if weights:  # written out, with the weights it used
            out, probs = dot_product_attention_reference(q, k, v, **opts, return_weights=True)
            return out.reshape(b, t, h * v.shape[-1]), probs
        out = dot_product_attention(q, k, v, **opts, layer=layer)
        out = out.reshape(b, t, h * v.shape[-1])
        if cache is None:
            return out
        # Past max_len the write above would land on earlier positions (a dynamic update
        # slice clamps its start); traced, that cannot raise, so the output is NaN.
        return jnp.where(cache["length"] <= k.shape[1], out, jnp.nan).astype(out.dtype), cache

    def _write_cache(self, cache, k, v, offset, layer):
        keys, values = cache["keys"], cache["values"]
        b, t = k.shape[:2]
        want_k = (b, keys.shape[1], *k.shape[2:])
        want_v = (b, keys.shape[1], *v.shape[2:])
        if keys.shape != want_k or values.shape != want_v:
            raise LayerError(
                layer,
                "cache keys/values shape",
                want_k if want_k == want_v else (want_k, want_v),
                (keys.shape, values.shape),
                "make it with init_cache((batch, max_len, embed_dim))",
            )
        if t > keys.shape[1]:
            raise LayerError(layer, "sequence length at most max_len", keys.shape[1], t)
        if not isinstance(offset, jax.core.Tracer):
            need_cache_room(layer, int(offset), t, keys.shape[1])
        zero = jnp.zeros((), jnp.int32)
        at = (zero, offset, zero, zero)
        keys = jax.lax.dynamic_update_slice(keys, k.astype(keys.dtype), at)
        values = jax.lax.dynamic_update_slice(values, v.astype(values.dtype), at)
        if self.causal:
            visible = causal_from(offset + jnp.arange(t), keys.shape[1])
        else:
            visible = jnp.broadcast_to(
                jnp.arange(keys.shape[1])[None, :] < offset + t, (t, keys.shape[1])
            )
        new = {"keys": keys, "values": values, "length": (offset + t).astype(jnp.int32)}
        return keys, values, new, visible[None, None]


# -- torch's attention masks and layouts, as the transformer layers read them ----------
#
# A boolean attn_mask is True where attention is not allowed, a floating-point one is
# added to the scores; a key padding mask is True at padding. Both become one additive
# mask.


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
