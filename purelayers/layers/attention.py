"""Attention: ``scaled_dot_product_attention``, ``causal_mask``, ``rotary_embedding`` and
``MultiHeadAttention`` (grouped-query, rotary positions, a fixed-shape decoding cache).

Layouts. The functions take PyTorch's layout ``[batch..., heads, seq, head_dim]``.
Internally everything runs in ``[batch, seq, heads, head_dim]``, the layout of
``jax.nn.dot_product_attention``, which is used wherever its semantics fit (float32,
bfloat16 and float16 inputs without attention dropout), so GPUs get its fused kernels.
It always takes the softmax in float32, so float64 inputs (``gradcheck``) and attention
dropout take an explicit, numerically identical softmax path instead.

Masks. A boolean mask is ``True`` where a query may attend a key; a floating-point mask
is added to the scores (``-inf`` forbids). A query row with nothing to attend (every
key masked) gives zeros, as ``torch.nn.functional.scaled_dot_product_attention`` does,
never NaN; its gradients are zero.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.init import Initializer, xavier_uniform, zeros
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
from purelayers.layers.dropout import dropout as _dropout
from purelayers.layers.linear import TORCH_DEFAULT_WEIGHT, linear

__all__ = [
    "MultiHeadAttention",
    "causal_mask",
    "rotary_embedding",
    "scaled_dot_product_attention",
]


def causal_mask(q_len: int, kv_len: int) -> jax.Array:
    """Boolean ``[q_len, kv_len]``, ``True`` where a query may attend a key.

    Queries are aligned to the end of the keys: query ``i`` sits at position
    ``kv_len - q_len + i`` and sees keys ``0 .. kv_len - q_len + i``. This is what
    decoding with a cache needs (new queries after a cached prefix) and equals torch's
    ``is_causal`` when ``q_len == kv_len``. torch aligns to the top-left instead (query
    ``i`` sees keys ``0..i``), which differs when ``q_len != kv_len``.

    Worked example, two new queries after a cached prefix of two keys::

        causal_mask(2, 4) == [[T, T, T, F],
                              [T, T, T, T]]
    """
    check_int("causal_mask", "q_len", q_len, minimum=0)
    check_int("causal_mask", "kv_len", kv_len, minimum=0)
    return _causal(jnp.arange(q_len) + (kv_len - q_len), kv_len)


def _causal(q_pos: jax.Array, kv_len: int) -> jax.Array:
    """``[len(q_pos), kv_len]``: key ``j`` visible to the query at position ``p`` iff ``j <= p``."""
    return jnp.arange(kv_len)[None, :] <= q_pos[:, None]


# -- rotary position embedding ---------------------------------------------------------


def _rope_tables(positions: jax.Array, dim: int, theta: float, dtype: Any):
    """``cos`` and ``sin`` of shape ``positions.shape + (dim,)`` (angles repeated per half)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=dtype) / dim))
    positions = jnp.asarray(positions).astype(dtype)
    angles = positions[..., None] * inv_freq.reshape((1,) * positions.ndim + (-1,))
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def _apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    xf = x.astype(cos.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (xf * cos + rotated * sin).astype(x.dtype)


def _need_even(layer: str, dim: int) -> None:
    if dim % 2:
        raise LayerError(
            layer,
            "rotary embedding needs an even head_dim;",
            "an even number",
            dim,
            "rotate-half pairs entry i with entry i + head_dim / 2",
        )


def rotary_embedding(x: jax.Array, positions: Any, *, theta: float = 10000.0) -> jax.Array:
    r"""Rotary position embedding (RoPE), in the rotate-half convention of Llama and
    Hugging Face ``transformers``.

    With ``d = head_dim``, ``inv_freq[i] = theta ** (-2i / d)`` for ``i < d / 2`` and
    ``angle = position * inv_freq`` repeated over both halves::

        y = x * cos(angle) + rotate_half(x) * sin(angle),
        rotate_half(x) = concat(-x[..., d/2:], x[..., :d/2])

    Angles are computed in float32 (or wider); the output has ``x``'s dtype.

    Args:
      x: ``[..., seq, head_dim]`` (torch's layout, e.g. ``[batch, heads, seq, head_dim]``);
        ``head_dim`` must be even.
      positions: integer (or real) positions, shape ``(seq,)`` or any shape that
        broadcasts against ``x.shape[:-1]`` with as many or fewer axes.
      theta: the frequency base. Default ``10000.0``.
    """
    x = jnp.asarray(x)
    if x.ndim < 2:
        raise LayerError("rotary_embedding", "x rank", "at least 2 ([..., seq, head_dim])", x.ndim)
    _need_even("rotary_embedding", x.shape[-1])
    positions = jnp.asarray(positions)
    if positions.ndim > x.ndim - 1:
        raise LayerError(
            "rotary_embedding", "positions rank", f"at most {x.ndim - 1}", positions.ndim
        )
    cos, sin = _rope_tables(positions, x.shape[-1], theta, promote_float(x.dtype))
    pad = (1,) * (x.ndim - cos.ndim)
    return _apply_rope(x, cos.reshape(pad + cos.shape), sin.reshape(pad + sin.shape))


# -- scaled dot-product attention ------------------------------------------------------


def _large_negative(dtype: Any) -> jax.Array:
    return jnp.asarray(-0.7 * float(jnp.finfo(dtype).max), dtype)


def _to4(m: Any, batch: tuple[int, ...], heads: int, t: int, s: int, name: str, layer: str):
    """A mask or bias broadcastable to ``(*batch, heads, t, s)`` as a 4-D
    ``(B or 1, heads or 1, t or 1, s or 1)`` array."""
    m = jnp.asarray(m)
    if name == "mask" and not (m.dtype == jnp.bool_ or jnp.issubdtype(m.dtype, jnp.floating)):
        raise LayerError(
            layer,
            "mask dtype",
            "bool (True attends) or floating (added to the scores)",
            m.dtype,
            "an integer mask is ambiguous; use mask.astype(bool) for a keep-mask",
        )
    target = (*batch, heads, t, s)
    if m.ndim > len(target) or any(
        d not in (1, want) for d, want in zip(m.shape[::-1], target[::-1], strict=False)
    ):
        raise LayerError(
            layer,
            f"{name} must broadcast to (*batch, heads, q_len, kv_len);",
            target,
            tuple(m.shape),
        )
    m = m.reshape((1,) * (len(target) - m.ndim) + m.shape)
    lead = m.shape[: len(batch)]
    if all(d == 1 for d in lead):
        return m.reshape((1, *m.shape[len(batch) :]))
    m = jnp.broadcast_to(m, (*batch, *m.shape[len(batch) :]))
    return m.reshape((math.prod(batch), *m.shape[len(batch) :]))


def _attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    mask: jax.Array | None,
    bias: jax.Array | None,
    causal: bool,
    scale: float,
    dropout_p: float,
    key: jax.Array | None,
    layer: str,
) -> jax.Array:
    """Attention in ``[B, T, N, H]`` layout; ``k``, ``v`` ``[B, S, K, H]`` with ``N % K == 0``.

    ``mask`` (bool) and ``bias`` (float) are 4-D ``(B|1, N|1, T|1, S|1)`` in torch's score
    layout. ``causal`` aligns queries to the end of the keys.
    """
    t, s = q.shape[1], k.shape[1]
    if bias is not None:
        # -inf entries become masked entries, so a row of them gives zeros, not NaN.
        allowed = bias > -jnp.inf
        bias = jnp.where(allowed, bias, jnp.zeros_like(bias)).astype(promote_float(q.dtype))
        mask = allowed if mask is None else mask & allowed
    native_causal = causal and t == s and mask is None
    if causal and not native_causal:
        c = causal_mask(t, s)[None, None]
        mask = c if mask is None else mask & c
    fused = dropout_p == 0.0 and q.dtype != jnp.float64 and v.shape == k.shape
    if fused:
        out = jax.nn.dot_product_attention(
            q, k, v, bias=bias, mask=mask, scale=scale, is_causal=native_causal
        )
    else:
        out = _attend_explicit(q, k, v, mask, bias, native_causal, scale, dropout_p, key, layer)
    if mask is None:
        return out
    rows = jnp.any(jnp.broadcast_to(mask, (*mask.shape[:3], s)), axis=-1)
    valid = jnp.transpose(rows, (0, 2, 1))[..., None]
    return jnp.where(valid, out, jnp.zeros_like(out))


def _attend_explicit(q, k, v, mask, bias, causal, scale, dropout_p, key, layer):
    b, t, n, h = q.shape
    s, kh = k.shape[1], k.shape[2]
    g = n // kh
    ft = promote_float(q.dtype)

    def grouped(m):  # (B|1, N|1, T|1, S|1) -> (B|1, K|1, G|1, T|1, S|1)
        if m.shape[1] == 1:
            return m.reshape(m.shape[0], 1, 1, *m.shape[2:])
        return m.reshape(m.shape[0], kh, g, *m.shape[2:])

    qg = q.reshape(b, t, kh, g, h)
    logits = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=ft)
    logits = logits * jnp.asarray(scale, ft)
    if bias is not None:
        logits = logits + grouped(bias).astype(ft)
    if causal:
        c = causal_mask(t, s)[None, None]
        mask = c if mask is None else mask & c
    if mask is not None:
        logits = jnp.where(grouped(mask), logits, _large_negative(ft))
    probs = jax.nn.softmax(logits, axis=-1)
    if dropout_p > 0.0:
        need_key(layer, key)
        probs = _dropout(probs, dropout_p, key, layer=layer)
    out = jnp.einsum("bkgts,bskh->btkgh", probs.astype(v.dtype), v)
    return out.reshape(b, t, n, v.shape[-1])


def scaled_dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    key: jax.Array | None = None,
) -> jax.Array:
    r"""``softmax(q @ k^T * scale + bias, masked) @ v``, per head.

    Matches ``torch.nn.functional.scaled_dot_product_attention`` (with ``enable_gqa=True``
    when ``k`` has fewer heads), except for ``is_causal`` when ``q_len != kv_len``: here
    queries are aligned to the *end* of the keys (``causal_mask``), torch aligns them to
    the start. A query row that may attend nothing gives zeros, as in torch.

    Args:
      q: ``[batch..., heads, q_len, head_dim]``.
      k: ``[batch..., kv_heads, kv_len, head_dim]``; ``heads`` must be a multiple of
        ``kv_heads`` (grouped-query attention: query head ``i`` uses kv head
        ``i // (heads // kv_heads)``, torch's ``repeat_interleave``).
      v: ``[batch..., kv_heads, kv_len, v_dim]``.
      mask: broadcastable to ``[batch..., heads, q_len, kv_len]``. Boolean: ``True``
        where a query may attend. Floating point: added to the scores (torch's float
        ``attn_mask``). Default ``None``.
      bias: floating point, broadcastable like ``mask``, added to the scores. Default
        ``None``.
      is_causal: also apply ``causal_mask(q_len, kv_len)``. Default ``False``.
      scale: multiplies ``q @ k^T``. Default ``1 / sqrt(head_dim)``.
      dropout_p: attention-weight dropout probability (needs ``key``). Default ``0.0``.
      key: PRNG key for dropout.

    Returns:
      ``[batch..., heads, q_len, v_dim]`` in ``q``'s dtype (scores and softmax in at
      least float32).
    """
    name = "scaled_dot_product_attention"
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    _check_qkv(q, k, v, name)
    check_float(name, "dropout_p", dropout_p, low=0.0, high=1.0, high_open=True)
    dtype = jnp.result_type(q, k, v)
    batch = q.shape[:-3]
    n, t, h = q.shape[-3:]
    s = k.shape[-2]
    bsz = math.prod(batch)

    def to_bthd(a):
        return jnp.swapaxes(a.reshape(bsz, *a.shape[-3:]), 1, 2).astype(dtype)

    bias4 = None if bias is None else _to4(bias, batch, n, t, s, "bias", name)
    mask4 = None if mask is None else _to4(mask, batch, n, t, s, "mask", name)
    if mask4 is not None and not jnp.issubdtype(mask4.dtype, jnp.bool_):
        bias4 = mask4 if bias4 is None else mask4 + bias4
        mask4 = None
    out = _attend(
        to_bthd(q),
        to_bthd(k),
        to_bthd(v),
        mask=mask4,
        bias=bias4,
        causal=is_causal,
        scale=1.0 / math.sqrt(h) if scale is None else scale,
        dropout_p=dropout_p,
        key=key,
        layer=name,
    )
    return jnp.swapaxes(out, 1, 2).reshape(*batch, n, t, v.shape[-1])


def _check_qkv(q, k, v, name):
    if q.ndim < 3 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise LayerError(
            name,
            "q, k and v must have the same rank, at least 3 ([batch..., heads, seq, dim]);",
            None,
            None,
            f"q.shape == {q.shape}, k.shape == {k.shape}, v.shape == {v.shape}",
        )
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-1] != v.shape[:-1]:
        raise LayerError(
            name,
            "batch axes must agree, and k and v must match except in their last axis;",
            None,
            None,
            f"q.shape == {q.shape}, k.shape == {k.shape}, v.shape == {v.shape}",
        )
    if q.shape[-1] != k.shape[-1]:
        raise LayerError(name, "k head_dim (last axis)", q.shape[-1], k.shape[-1])
    if q.shape[-3] % k.shape[-3]:
        raise LayerError(
            name,
            f"q's {q.shape[-3]} heads must be a multiple of k's heads;",
            f"a divisor of {q.shape[-3]}",
            k.shape[-3],
        )


# -- multi-head attention --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MultiHeadAttention(Layer):
    r"""Multi-head attention with packed projections, grouped-query heads, rotary
    positions and a decoding cache. Matches ``torch.nn.MultiheadAttention(E, num_heads,
    batch_first=True)`` for self- and cross-attention, its ``state_dict`` renamed by
    ``purelayers.params.rename(sd, purelayers.params.TORCH_MHA_TO_PURELAYERS)``.

    ``embed_dim`` ``E`` is read from the last axis of ``init``'s ``shape`` and must divide
    by ``num_heads``; ``head_dim = E / num_heads``. With ``H = num_heads`` and
    ``K = num_kv_heads``::

        q, k, v = split(x @ qkv.weight.T + qkv.bias, [H * head_dim, K * head_dim, K * head_dim])
        y = concat_heads(softmax(q k^T / sqrt(head_dim) + masks) v) @ out.weight.T + out.bias

    Cross-attention: ``apply(params, x, context=c)`` takes queries from ``x`` (the first
    ``H * head_dim`` rows of ``qkv.weight``) and keys and values from ``c`` (the other
    rows), with the *same* parameter names, exactly as torch packs ``in_proj_weight`` for
    cross-attention when ``kdim == vdim == embed_dim``. So one name map serves both:
    ``{"in_proj_weight": "qkv.weight", "in_proj_bias": "qkv.bias", "out_proj.weight":
    "out.weight", "out_proj.bias": "out.bias"}`` (``params.TORCH_MHA_TO_PURELAYERS``;
    ``params.PURELAYERS_TO_TORCH_MHA`` goes back). ``c`` must have
    ``E`` features too; torch's separate ``q/k/v_proj_weight`` (``kdim != E``) have no
    equivalent here.

    Args:
      num_heads: query heads ``H``.
      num_kv_heads: key/value heads ``K``, a divisor of ``H``; ``1`` is multi-query
        attention. Default ``None``: ``H`` (torch's layout, where the name map applies).
      bias: learn ``qkv.bias`` and ``out.bias``. Default ``True``.
      causal: each position attends to itself and earlier ones (``causal_mask``).
        Default ``False``.
      dropout: attention-weight dropout in train mode (needs ``key``). Default ``0.0``.
      rope: rotate queries and keys by their positions (``rotary_embedding``);
        self-attention only. Default ``False``.
      rope_theta: RoPE frequency base. Default ``10000.0``.
      weight_init / bias_init: override ``qkv.weight`` / both biases' initializers.

    Masks (``apply``'s ``mask``): broadcastable to ``(batch, H, q_len, kv_len)``;
    boolean ``True`` = may attend (the *opposite* of torch MHA's boolean ``attn_mask``),
    or floating point added to the scores. torch's ``key_padding_mask`` ``kpm`` (True =
    padding) is ``mask=~kpm[:, None, None, :]``.

    Decoding: ``cache = mha.init_cache((batch, max_len, E))`` is a fixed-shape tree
    ``{"keys": (batch, max_len, K, head_dim), "values": (...), "length": int32 scalar}``;
    ``apply(params, x, cache=cache)`` writes ``x``'s keys and values at
    ``length .. length + seq - 1`` (``lax.dynamic_update_slice``), lets the new queries
    attend the cached prefix (causally if ``causal``: ``causal_mask``'s end-aligned
    offsets), and returns ``(y, new_cache)``. Shapes never change, so a jitted decode
    step compiles once. Writing past ``max_len`` is not detected (the write is clamped
    by ``dynamic_update_slice``); size the cache for the whole sequence.

    Shape:
      ``x``: ``(batch, seq, E)`` or ``(seq, E)``; ``context``: ``(batch, kv_seq, E)``;
      output like ``x``.

    Parameters:
      ``qkv.weight``: ``((H + 2K) * head_dim, E)``, xavier-uniform (torch's
      ``in_proj_weight`` init). ``qkv.bias``: ``((H + 2K) * head_dim,)``, zeros.
      ``out.weight``: ``(E, E)``, ``U(-1/sqrt(E), 1/sqrt(E))``. ``out.bias``: ``(E,)``,
      zeros.
    """

    _own_order: ClassVar[tuple[str, ...]] = ("qkv", "out")

    num_heads: int
    _: dataclasses.KW_ONLY
    num_kv_heads: int | None = None
    bias: bool = True
    causal: bool = False
    dropout: float = 0.0
    rope: bool = False
    rope_theta: float = 10000.0
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None

    def __post_init__(self):
        name = "MultiHeadAttention"
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
        check_float(name, "dropout", self.dropout, low=0.0, high=1.0, high_open=True)
        check_float(name, "rope_theta", self.rope_theta, low=0.0, low_open=True)

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    def head_dim(self, embed_dim: int) -> int:
        """``embed_dim // num_heads``; a ``ValueError`` naming both if it does not divide."""
        if embed_dim % self.num_heads:
            divisors = [d for d in range(1, embed_dim + 1) if embed_dim % d == 0]
            raise LayerError(
                "MultiHeadAttention",
                f"embed_dim {embed_dim} (the last axis of x) must be divisible by "
                f"num_heads {self.num_heads}",
                None,
                None,
                f"choose num_heads among {divisors}",
            )
        hd = embed_dim // self.num_heads
        if self.rope:
            _need_even("MultiHeadAttention", hd)
        return hd

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        shape = as_shape(shape)
        if not shape:
            raise LayerError("MultiHeadAttention", "input rank", "2 or 3", "0 (a scalar)")
        e = shape[-1]
        hd = self.head_dim(e)
        rows = (self.num_heads + 2 * self.kv_heads) * hd
        keys = [jax.random.fold_in(key, i) for i in range(4)]
        b_init = self.bias_init or zeros()
        qkv = {"weight": (self.weight_init or xavier_uniform())(keys[0], (rows, e), dtype)}
        out = {"weight": TORCH_DEFAULT_WEIGHT(keys[2], (e, e), dtype)}
        if self.bias:
            qkv["bias"] = b_init(keys[1], (rows,), dtype)
            out["bias"] = b_init(keys[3], (e,), dtype)
        return {"qkv": qkv, "out": out}

    def ordered(self, tree: dict[str, Any]) -> dict[str, Any]:
        return {
            name: {k: tree[name][k] for k in ("weight", "bias") if k in tree[name]}
            for name in self._own_order
            if name in tree
        }

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
        """An empty decoding cache for ``shape = (batch, max_len, embed_dim)``."""
        shape = as_shape(shape)
        if len(shape) != 3:
            raise LayerError(
                "MultiHeadAttention", "init_cache shape", "(batch, max_len, embed_dim)", shape
            )
        b, max_len, e = shape
        kv = jnp.zeros((b, max_len, self.kv_heads, self.head_dim(e)), dtype)
        return {"keys": kv, "values": kv, "length": jnp.zeros((), jnp.int32)}

    def _project(self, params: Params, name: str, x: jax.Array, rows: slice | None = None):
        p = params[name]
        if rows is not None:
            p = {k: v[rows] for k, v in p.items()}
        try:
            return linear(p, x, layer="Linear")
        except LayerError as e:
            raise e.within("MultiHeadAttention", name) from None

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
        cache: dict[str, jax.Array] | None = None,
        context: Any = None,
    ):
        x = jnp.asarray(x)
        if x.ndim not in (2, 3):
            raise LayerError(
                "MultiHeadAttention", "input rank", "2 or 3 ((seq, E) or (batch, seq, E))", x.ndim
            )
        if x.ndim == 2:
            c = None if context is None else jnp.asarray(context)[None]
            m = None if mask is None else jnp.asarray(mask)
            res = self.apply(params, x[None], mask=m, key=key, train=train, cache=cache, context=c)
            return (res[0][0], res[1]) if cache is not None else res[0]
        e = x.shape[-1]
        hd = self.head_dim(e)
        h, kh = self.num_heads, self.kv_heads
        b, t = x.shape[:2]
        if context is None:
            qkv = self._project(params, "qkv", x)
            q, kv = qkv[..., : h * hd], qkv[..., h * hd :]
        else:
            if self.rope or cache is not None:
                raise LayerError(
                    "MultiHeadAttention",
                    "context= (cross-attention) works without rope and without cache",
                    None,
                    None,
                )
            context = jnp.asarray(context)
            q = self._project(params, "qkv", x, slice(0, h * hd))
            kv = self._project(params, "qkv", context, slice(h * hd, None))
        s = kv.shape[1]
        q = q.reshape(b, t, h, hd)
        k = kv[..., : kh * hd].reshape(b, s, kh, hd)
        v = kv[..., kh * hd :].reshape(b, s, kh, hd)
        offset = jnp.zeros((), jnp.int32) if cache is None else cache["length"]
        if self.rope:
            cos, sin = _rope_tables(
                offset + jnp.arange(t), hd, self.rope_theta, promote_float(q.dtype)
            )
            cos, sin = cos[None, :, None, :], sin[None, :, None, :]
            q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        causal = self.causal
        extra = None
        if cache is not None:
            k, v, cache, extra = self._write_cache(cache, k, v, offset, b, t, e)
            s, causal = k.shape[1], False
        mask4 = None
        if mask is not None:
            mask4 = _to4(mask, (b,), h, t, s, "mask", "MultiHeadAttention")
        if extra is not None and mask4 is None:
            mask4 = extra
        elif extra is not None:  # a float mask forbids with -inf
            forbidden = jnp.asarray(False if mask4.dtype == jnp.bool_ else -jnp.inf, mask4.dtype)
            mask4 = jnp.where(extra, mask4, forbidden)
        bias4 = None
        if mask4 is not None and mask4.dtype != jnp.bool_:
            mask4, bias4 = None, mask4
        p = self.dropout if train else 0.0
        if p > 0.0:
            need_key("MultiHeadAttention", key)
        out = _attend(
            q,
            k.astype(q.dtype),
            v.astype(q.dtype),
            mask=mask4,
            bias=bias4,
            causal=causal,
            scale=1.0 / math.sqrt(hd),
            dropout_p=p,
            key=key,
            layer="MultiHeadAttention",
        )
        y = self._project(params, "out", out.reshape(b, t, h * hd))
        return y if cache is None else (y, cache)

    def _write_cache(self, cache, k, v, offset, b, t, e):
        keys, values = cache["keys"], cache["values"]
        want = (b, keys.shape[1], self.kv_heads, e // self.num_heads)
        if keys.shape != want or values.shape != want:
            raise LayerError(
                "MultiHeadAttention",
                "cache keys/values shape",
                want,
                (keys.shape, values.shape),
                "make it with init_cache((batch, max_len, embed_dim))",
            )
        if t > keys.shape[1]:
            raise LayerError(
                "MultiHeadAttention", "sequence length at most max_len", keys.shape[1], t
            )
        zero = jnp.zeros((), jnp.int32)
        at = (zero, offset, zero, zero)
        keys = jax.lax.dynamic_update_slice(keys, k.astype(keys.dtype), at)
        values = jax.lax.dynamic_update_slice(values, v.astype(values.dtype), at)
        q_pos = offset + jnp.arange(t)
        if self.causal:
            visible = _causal(q_pos, keys.shape[1])
        else:
            visible = jnp.broadcast_to(
                jnp.arange(keys.shape[1])[None, :] < offset + t, (t, keys.shape[1])
            )
        new = {"keys": keys, "values": values, "length": (offset + t).astype(jnp.int32)}
        return keys, values, new, visible[None, None]
