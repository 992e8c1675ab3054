r"""Attention: scaled dot-product attention, its causal mask and rotary positions.

``scaled_dot_product_attention`` takes torch's layout ``[batch..., heads, seq, head_dim]``;
``dot_product_attention`` takes JAX's ``[batch, seq, heads, head_dim]`` with masks already
broadcast to 4-D (what the attention layers call). Both compute::

    out = softmax(q @ k^T * scale + bias, masked) @ v

A boolean mask is ``True`` where a query may attend a key; a floating-point mask is added
to the scores (``-inf`` forbids). A query row with nothing to attend gives zeros (never
NaN) and zero gradients.

``dot_product_attention`` has one fast path beside ``dot_product_attention_reference``:
on the CPU an explicit form that splits long causal self-attention into two query halves,
elsewhere ``jax.nn.dot_product_attention`` (the platform's fused kernels); the platform is
chosen when the program is lowered. ``tests/functional/test_attention.py`` shows both
equal to the reference in values and gradients.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "causal_mask",
    "dot_product_attention",
    "dot_product_attention_reference",
    "rotary_embedding",
    "scaled_dot_product_attention",
]


def _error(*args: Any) -> Exception:
    # the layers' error type; imported on use, since purelayers.layers imports this module
    from purelayers.layers._checks import LayerError

    return LayerError(*args)


def causal_mask(q_len: int, kv_len: int) -> jax.Array:
    """Boolean ``[q_len, kv_len]``, ``True`` where a query may attend a key.

    Queries are aligned to the end of the keys: query ``i`` sits at position
    ``kv_len - q_len + i`` and sees keys ``0 .. kv_len - q_len + i``. This is what
    decoding with a cache needs (new queries after a cached prefix) and equals torch's
    ``is_causal`` when ``q_len == kv_len``; torch aligns to the top-left instead.

    Example, two new queries after a cached prefix of two keys::

        causal_mask(2, 4) == [[T, T, T, F],
                              [T, T, T, T]]
    """
    from purelayers.layers._checks import check_int

    check_int("causal_mask", "q_len", q_len, minimum=0)
    check_int("causal_mask", "kv_len", kv_len, minimum=0)
    return causal_from(jnp.arange(q_len) + (kv_len - q_len), kv_len)


def causal_from(q_pos: jax.Array, kv_len: int) -> jax.Array:
    """``[len(q_pos), kv_len]``: key ``j`` visible to the query at position ``p`` iff ``j <= p``."""
    return jnp.arange(kv_len)[None, :] <= q_pos[:, None]


def _large_negative(dtype: Any) -> jax.Array:
    return jnp.asarray(-0.7 * float(jnp.finfo(dtype).max), dtype)


def _float(dtype: Any) -> Any:
    return jnp.promote_types(dtype, jnp.float32)


def mask4(m: Any, batch: tuple[int, ...], heads: int, t: int, s: int, name: str, layer: str):
    """A mask or bias broadcastable to ``(*batch, heads, t, s)`` as a 4-D
    ``(B or 1, heads or 1, t or 1, s or 1)`` array; ``layer`` names the caller in errors."""
    m = jnp.asarray(m)
    if name == "mask" and not (m.dtype == jnp.bool_ or jnp.issubdtype(m.dtype, jnp.floating)):
        raise _error(
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
        raise _error(
            layer, f"{name} must broadcast to (*batch, heads, q_len, kv_len);", target, m.shape
        )
    m = m.reshape((1,) * (len(target) - m.ndim) + m.shape)
    if all(d == 1 for d in m.shape[: len(batch)]):
        return m.reshape((1, *m.shape[len(batch) :]))
    m = jnp.broadcast_to(m, (*batch, *m.shape[len(batch) :]))
    return m.reshape((math.prod(batch), *m.shape[len(batch) :]))


# -- the reference ---------------------------------------------------------------------


def dot_product_attention_reference(
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
    return_weights: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    r"""``softmax(q k^T * scale + bias, masked) v``, written out.

    Args:
      q: ``[B, T, N, H]``.
      k: ``[B, S, K, H]`` with ``N % K == 0`` (query head ``i`` uses kv head
        ``i // (N / K)``).
      v: ``[B, S, K, Hv]``.
      mask: boolean, ``True`` where a query may attend, 4-D ``(B|1, N|1, T|1, S|1)``.
      bias: floating point, 4-D like ``mask``, added to the scores (``-inf`` forbids).
      is_causal: also apply ``causal_mask(T, S)`` (end-aligned).
      scale: multiplies the scores. Default ``1 / sqrt(H)``.
      dropout_p: dropout on the weights (needs ``key``).
      return_weights: also return the weights ``[B, N, T, S]`` (after dropout).

    Returns:
      ``[B, T, N, Hv]`` in ``q``'s dtype (and the weights).
    """
    _b, t, n, h = q.shape
    s, kh = k.shape[1], k.shape[2]
    ft = _float(q.dtype)
    scale = (1.0 / math.sqrt(h) if h else 1.0) if scale is None else scale
    kr = jnp.repeat(k, n // kh, axis=2)
    vr = jnp.repeat(v, n // kh, axis=2)
    logits = jnp.einsum("btnh,bsnh->bnts", q, kr, preferred_element_type=ft) * scale
    allowed = mask
    if bias is not None:
        ok = bias > -jnp.inf
        logits = logits + jnp.where(ok, bias, jnp.zeros_like(bias)).astype(ft)
        allowed = ok if allowed is None else allowed & ok
    if is_causal:
        c = causal_mask(t, s)[None, None]
        allowed = c if allowed is None else allowed & c
    if allowed is not None:
        allowed = jnp.broadcast_to(allowed, logits.shape)
        logits = jnp.where(allowed, logits, _large_negative(ft))
    probs = jax.nn.softmax(logits, axis=-1)
    if allowed is not None:
        probs = jnp.where(jnp.any(allowed, axis=-1, keepdims=True), probs, 0.0)
    if dropout_p > 0.0:
        from purelayers.layers.dropout import dropout

        probs = dropout(probs, dropout_p, key, layer="dot_product_attention")
    probs = probs.astype(q.dtype)
    out = jnp.einsum("bnts,bsnh->btnh", probs, vr.astype(q.dtype))
    return (out, probs) if return_weights else out


# -- the fast path -----------------------------------------------------------------------


def dot_product_attention(
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
    layer: str = "dot_product_attention",
) -> jax.Array:
    """``dot_product_attention_reference``'s values (same arguments, no weights), faster.

    On the CPU an explicit form splits causal self-attention of at least
    ``CAUSAL_HALVES_MIN`` positions into two query halves (the first half never scores
    the second half's keys), which takes about 5% off the transformer benchmark's
    training step; on other platforms ``jax.nn.dot_product_attention`` runs where its
    semantics fit (no dropout, not float64). The function is jitted with ``is_causal``,
    ``scale`` and ``dropout_p`` static, so the layers of a stack share one trace.
    ``layer`` names the caller in error messages.
    """
    if dropout_p > 0.0 and key is None:
        from purelayers.layers._checks import need_key

        need_key(layer, key)
    h = q.shape[-1]
    scale = (1.0 / math.sqrt(h) if h else 1.0) if scale is None else scale
    if not isinstance(scale, (int, float, np.number)):  # traced: cannot be a static
        return _attend_core(q, k, v, mask, bias, key, is_causal, scale, dropout_p)
    return _attend_jit(q, k, v, mask, bias, key, is_causal, float(scale), float(dropout_p))


def _attend_core(q, k, v, mask, bias, key, causal, scale, dropout_p):
    t, s = q.shape[1], k.shape[1]
    if bias is not None:  # -inf entries become masked ones, so such a row gives zeros
        allowed = bias > -jnp.inf
        bias = jnp.where(allowed, bias, jnp.zeros_like(bias)).astype(_float(q.dtype))
        mask = allowed if mask is None else mask & allowed
    native_causal = causal and t == s and mask is None
    if causal and not native_causal:
        c = causal_mask(t, s)[None, None]
        mask = c if mask is None else mask & c
    if dropout_p == 0.0 and q.dtype != jnp.float64 and v.shape == k.shape:
        out = jax.lax.platform_dependent(
            q,
            k,
            v,
            cpu=lambda q, k, v: _attend_cpu(q, k, v, mask, bias, native_causal, scale),
            default=lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, bias=bias, mask=mask, scale=scale, is_causal=native_causal
            ),
        )
    else:
        out = dot_product_attention_reference(
            q, k, v, mask=mask, bias=bias, is_causal=native_causal, scale=scale,
            dropout_p=dropout_p, key=key,
        )  # fmt: skip
    if mask is None:
        return out
    rows = jnp.any(jnp.broadcast_to(mask, (*mask.shape[:3], s)), axis=-1)
    return jnp.where(jnp.transpose(rows, (0, 2, 1))[..., None], out, jnp.zeros_like(out))


_attend_jit = jax.jit(_attend_core, static_argnums=(6, 7, 8))

# the fewest positions for which the CPU splits causal self-attention into query halves
CAUSAL_HALVES_MIN = 64


def _attend_cpu(q, k, v, mask, bias, causal, scale):
    """The reference, or for causal self-attention of at least ``CAUSAL_HALVES_MIN``
    positions (no mask or bias) two query halves: the first half attends the first half
    of the keys only, so a quarter of the scores is never computed."""
    t = q.shape[1]
    ref = dot_product_attention_reference
    if not (causal and mask is None and bias is None and t >= CAUSAL_HALVES_MIN):
        return ref(q, k, v, mask=mask, bias=bias, is_causal=causal, scale=scale)
    m = t // 2
    first = ref(q[:, :m], k[:, :m], v[:, :m], is_causal=True, scale=scale)
    return jnp.concatenate([first, ref(q[:, m:], k, v, is_causal=True, scale=scale)], axis=1)


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
        ``kv_heads`` (query head ``i`` uses kv head ``i // (heads // kv_heads)``).
      v: ``[batch..., kv_heads, kv_len, v_dim]``.
      mask: broadcastable to ``[batch..., heads, q_len, kv_len]``. Boolean: ``True``
        where a query may attend (torch's boolean ``attn_mask``). Floating point: added
        to the scores. Default ``None``.
      bias: floating point, broadcastable like ``mask``, added to the scores.
      is_causal: also apply ``causal_mask(q_len, kv_len)``. Default ``False``.
      scale: multiplies ``q @ k^T``. Default ``1 / sqrt(head_dim)``.
      dropout_p: attention-weight dropout probability (needs ``key``). Default ``0.0``.
      key: PRNG key for dropout.

    Returns:
      ``[batch..., heads, q_len, v_dim]`` in the inputs' dtype (scores and softmax in at
      least float32).

    Example:
      >>> q = jnp.ones((2, 4, 5, 8))
      >>> scaled_dot_product_attention(q, q, q, is_causal=True).shape
      (2, 4, 5, 8)
    """
    from purelayers.layers._checks import as_array, check_float

    name = "scaled_dot_product_attention"
    q, k, v = as_array(q), as_array(k), as_array(v)
    _check_qkv(q, k, v, name)
    check_float(name, "dropout_p", dropout_p, low=0.0, high=1.0)
    dtype = jnp.result_type(q, k, v)
    batch = q.shape[:-3]
    n, t, _h = q.shape[-3:]
    s = k.shape[-2]

    def to_bthd(a):
        return jnp.swapaxes(a.reshape(math.prod(batch), *a.shape[-3:]), 1, 2).astype(dtype)

    b4 = None if bias is None else mask4(bias, batch, n, t, s, "bias", name)
    m4 = None if mask is None else mask4(mask, batch, n, t, s, "mask", name)
    if m4 is not None and not jnp.issubdtype(m4.dtype, jnp.bool_):
        b4, m4 = (m4 if b4 is None else m4 + b4), None
    out = dot_product_attention(
        to_bthd(q), to_bthd(k), to_bthd(v), mask=m4, bias=b4, is_causal=is_causal,
        scale=scale, dropout_p=dropout_p, key=key, layer=name,
    )  # fmt: skip
    return jnp.swapaxes(out, 1, 2).reshape(*batch, n, t, v.shape[-1])


def _check_qkv(q, k, v, name):
    shapes = f"q.shape == {q.shape}, k.shape == {k.shape}, v.shape == {v.shape}"
    if q.ndim < 3 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise _error(
            name,
            "q, k and v must have the same rank, at least 3 ([batch..., heads, seq, dim]);",
            None,
            None,
            shapes,
        )
    if q.shape[:-3] != k.shape[:-3] or k.shape[:-1] != v.shape[:-1]:
        raise _error(
            name,
            "batch axes must agree, and k and v must match except in their last axis;",
            None,
            None,
            shapes,
        )
    if q.shape[-1] != k.shape[-1]:
        raise _error(name, "k head_dim (last axis)", q.shape[-1], k.shape[-1])
    if q.shape[-3] % k.shape[-3]:
        raise _error(
            name,
            f"q's {q.shape[-3]} heads must be a multiple of k's heads;",
            f"a divisor of {q.shape[-3]}",
            k.shape[-3],
        )


# -- rotary positions ----------------------------------------------------------------------


def need_even(layer: str, dim: int) -> None:
    """Rotate-half pairs entry ``i`` with ``i + dim / 2``: ``dim`` must be even."""
    if dim % 2:
        raise _error(
            layer,
            "rotary embedding needs an even head_dim;",
            "an even number",
            dim,
            "rotate-half pairs entry i with entry i + head_dim / 2",
        )


def rotary_tables(inv_freq: jax.Array, positions: Any, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """``cos`` and ``sin`` of ``positions * inv_freq``, both halves: ``positions.shape +
    (2 * len(inv_freq),)``."""
    inv = inv_freq.astype(dtype)
    positions = jnp.asarray(positions).astype(dtype)
    angles = positions[..., None] * inv.reshape((1,) * positions.ndim + (-1,))
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """``x * cos + rotate_half(x) * sin`` (``cos``, ``sin`` broadcast against ``x``), in
    ``cos``'s dtype, returned in ``x``'s."""
    xf = x.astype(cos.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (xf * cos + rotated * sin).astype(x.dtype)


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
        raise _error("rotary_embedding", "x rank", "at least 2 ([..., seq, head_dim])", x.ndim)
    need_even("rotary_embedding", x.shape[-1])
    positions = jnp.asarray(positions)
    if positions.ndim > x.ndim - 1:
        raise _error("rotary_embedding", "positions rank", f"at most {x.ndim - 1}", positions.ndim)
    d, dtype = x.shape[-1], _float(x.dtype)
    inv = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=dtype) / d))
    cos, sin = rotary_tables(inv, positions, dtype)
    pad = (1,) * (x.ndim - cos.ndim)
    return apply_rotary(x, cos.reshape(pad + cos.shape), sin.reshape(pad + sin.shape))
