"""Scaled dot-product attention: ``scaled_dot_product_attention`` and ``causal_mask``,
the function every attention layer's core (``attention.py``) computes with.

Layouts. The functions take PyTorch's layout ``[batch..., heads, seq, head_dim]``.
Internally everything runs in ``[batch, seq, heads, head_dim]``, the layout of
``jax.nn.dot_product_attention``, which is used wherever its semantics fit (float32,
bfloat16 and float16 inputs without attention dropout) on every platform but the CPU,
so GPUs get its fused kernels. It always takes the softmax in float32, so float64
inputs (``gradcheck``) and attention dropout take an explicit, numerically identical
softmax path instead, and so does the CPU, where XLA runs that path faster (measured in
``_attend_explicit``) and splits long causal self-attention into two query halves
(``_attend_cpu``). The platform is chosen when the program is lowered
(``jax.lax.platform_dependent``), so one traced function serves CPU and GPU.

Masks. A boolean mask is ``True`` where a query may attend a key; a floating-point mask
is added to the scores (``-inf`` forbids). A query row with nothing to attend (every
key masked) gives zeros, as ``torch.nn.functional.scaled_dot_product_attention`` does,
never NaN; its gradients are zero.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.layers._checks import (
    LayerError,
    as_array,
    check_float,
    check_int,
    need_key,
    promote_float,
)
from purelayers.layers.dropout import dropout as _dropout

__all__ = ["causal_mask", "scaled_dot_product_attention"]


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
    layout. ``causal`` aligns queries to the end of the keys. ``layer`` names the caller
    in error messages.

    The attention itself (``_attend_core``) runs as a jitted function of the arrays,
    ``causal``, ``scale`` and ``dropout_p`` static: JAX traces it, and differentiates its
    trace, once per distinct set of shapes and statics, so the layers of a stack share
    one trace. It traces both platforms' forms (``platform_dependent``) and is most of
    an attention layer's trace: the benchmark transformer's step (four layers) traced in
    0.81 -> 0.55 s, first call 3.44 -> 3.24 s (raw JAX: 0.35 and 3.01 s; fresh processes,
    medians of five), the compiled program unchanged. A traced ``scale`` cannot be a
    static, so that call runs ``_attend_core`` inline.
    """
    if dropout_p > 0.0:
        need_key(layer, key)
    if not isinstance(scale, (int, float, np.number)):
        return _attend_core(q, k, v, mask, bias, key, causal, scale, dropout_p)
    return _attend_jit(q, k, v, mask, bias, key, causal, float(scale), float(dropout_p))


def _attend_core(q, k, v, mask, bias, key, causal, scale, dropout_p):
    """``_attend`` after its checks (``key`` present where ``dropout_p > 0``)."""
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
        # XLA:CPU runs the explicit form faster (see ``_attend_explicit``); elsewhere
        # ``dot_product_attention`` picks the platform's fused kernels.
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
        out = _attend_explicit(q, k, v, mask, bias, native_causal, scale, dropout_p, key)
    if mask is None:
        return out
    rows = jnp.any(jnp.broadcast_to(mask, (*mask.shape[:3], s)), axis=-1)
    valid = jnp.transpose(rows, (0, 2, 1))[..., None]
    return jnp.where(valid, out, jnp.zeros_like(out))


_attend_jit = jax.jit(_attend_core, static_argnums=(6, 7, 8))


# the fewest positions for which the CPU splits causal self-attention into two query
# halves; causal [16, T, 8, 32] forward and backward, one block vs halves: T = 32 1.78 vs
# 2.26 ms, T = 64 5.29 vs 4.77 ms, T = 96 4.16 vs 3.67 ms (2-core AVX-512 AMD EPYC)
_CAUSAL_HALVES_MIN = 64


def _attend_cpu(q, k, v, mask, bias, causal, scale):
    """The CPU's attention: ``_attend_explicit``, for causal self-attention (``causal``
    with as many queries as keys, no mask or bias) of at least ``_CAUSAL_HALVES_MIN``
    positions in two query halves (see ``_attend_explicit``'s ``halves``)."""
    halves = causal and mask is None and bias is None and q.shape[1] >= _CAUSAL_HALVES_MIN
    return _attend_explicit(q, k, v, mask, bias, causal, scale, 0.0, None, halves)


def _attend_explicit(q, k, v, mask, bias, causal, scale, dropout_p, key, halves=False):
    """Scores, masks, softmax and the weighted sum written out: float64, attention
    dropout, and the CPU. ``q``, ``k``, ``v`` are moved to heads-major ``[B, N, T, H]``
    first, so both products are plain batched matrix products; without grouped-query
    heads the scores are one product into torch's ``[B, N, T, S]`` layout (grouped:
    ``[B, K, G, T, S]``), and the softmax's derivative is written out (``_softmax``).

    Measured on 2-core AVX-512 CPUs, jitted, causal ``[16, 128, 8, 32]``: forward and
    backward 6.3-6.7 ms this way (AMD Zen 5) against 9.5-9.9 ms for
    ``jax.nn.dot_product_attention`` (whose derivative XLA:CPU fuses with the score
    product's transpose into one slow kernel), 7.0-7.3 ms with ``jax.nn.softmax``, and
    10.7 ms with the grouped layout for ungrouped heads. Heads-major operands against
    einsums over ``[B, T, N, H]`` (Intel Xeon): forward alone 7.3-18.5 -> 5.2-5.7 ms,
    forward and backward a tie (11.9 ms); the benchmark transformer's forward 108 -> 89
    ms and its training step 330 -> 324 ms; a decode step (one query, 96 cached keys,
    12 heads of 64) 1.02 -> 0.60 ms at batch 8; grouped decoding (32 heads on 8, 256
    cached keys) a tie, 0.70-0.74 ms.

    ``halves`` (causal self-attention without mask, bias or dropout): the first half of
    the queries is scored against the first half of the keys only, the second half
    against all, so the quarter of the ``[T, S]`` scores that the mask would zero is
    never computed (products, softmax, forward and backward); same values up to the
    order of the softmax sums. Causal ``[16, 128, 8, 32]`` forward and backward, jitted,
    interleaved medians on a 2-core AVX-512 AMD EPYC, two runs: 16.8-19.9 -> 12.3-16.3
    ms; ``[4, 512, 12, 64]``: 156-169 -> 121-127 ms (four quarters: 114 ms, at twice the
    compile time of halves). The benchmark transformer's training step 489 -> 462 ms
    (minimum 423 -> 391 ms), its compile unchanged (1.72 vs 1.71 s): both halves share
    the heads-major transposes."""
    b, t, n, h = q.shape
    kh = k.shape[2]
    g = n // kh
    ft = promote_float(q.dtype)
    # heads-major operands: every product below is a plain batched matrix product
    k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # (B, K, S, H)
    if g == 1:
        qg, scores, mix = jnp.swapaxes(q, 1, 2), "bnth,bnsh->bnts", "bnts,bnsh->bnth"

        def grouped(m):
            return m

    else:
        qg = jnp.transpose(q.reshape(b, t, kh, g, h), (0, 2, 3, 1, 4))  # (B, K, G, T, H)
        scores, mix = "bkgth,bksh->bkgts", "bkgts,bksh->bkgth"

        def grouped(m):  # (B|1, N|1, T|1, S|1) -> (B|1, K|1, G|1, T|1, S|1)
            if m.shape[1] == 1:
                return m.reshape(m.shape[0], 1, 1, *m.shape[2:])
            return m.reshape(m.shape[0], kh, g, *m.shape[2:])

    def weigh(qg, k, v, mask, bias):  # heads-major queries, keys, values -> outputs
        logits = jnp.einsum(scores, qg, k, preferred_element_type=ft)
        logits = logits * jnp.asarray(scale, ft)
        if bias is not None:
            logits = logits + grouped(bias).astype(ft)
        if causal:
            c = causal_mask(qg.shape[-2], k.shape[-2])[None, None]
            mask = c if mask is None else mask & c
        if mask is not None:
            logits = jnp.where(grouped(mask), logits, _large_negative(ft))
        probs = _softmax(logits)
        if dropout_p > 0.0:
            probs = _dropout(probs, dropout_p, key)
        return jnp.einsum(mix, probs.astype(v.dtype), v)  # (B, N, T, H) or (B, K, G, T, H)

    if halves:  # causal self-attention, no mask, bias or dropout: see ``_CAUSAL_HALVES_MIN``
        m = t // 2
        first = weigh(qg[..., :m, :], k[..., :m, :], v[..., :m, :], None, None)
        out = jnp.concatenate([first, weigh(qg[..., m:, :], k, v, None, None)], axis=-2)
    else:
        out = weigh(qg, k, v, mask, bias)
    out = jnp.moveaxis(out, -2, 1)
    return out.reshape(b, t, n, v.shape[-1])


@jax.custom_jvp
def _softmax(x: jax.Array) -> jax.Array:
    """``jax.nn.softmax`` over the last axis, with its derivative ``y * (dx - sum(y *
    dx))`` as the only rule: XLA:CPU runs the attention backward about 10% faster than
    through ``jax.nn.softmax``'s own (see ``_attend_explicit``)."""
    return jax.nn.softmax(x, axis=-1)


@_softmax.defjvp
def _softmax_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    y = _softmax(x)
    return y, y * (dx - jnp.sum(y * dx, axis=-1, keepdims=True))


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
    q, k, v = as_array(q), as_array(k), as_array(v)
    _check_qkv(q, k, v, name)
    check_float(name, "dropout_p", dropout_p, low=0.0, high=1.0)
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
