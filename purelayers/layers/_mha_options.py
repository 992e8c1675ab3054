"""The options of ``torch.nn.MultiheadAttention`` that ``InProjAttention`` adds around
its ``AttentionCore``: keys appended to every sequence (``add_bias_kv``,
``add_zero_attn``) and attention computed with its probabilities (``need_weights``)."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from purelayers.layers._checks import need_key, promote_float
from purelayers.layers._sdpa import _to4, causal_mask
from purelayers.layers.attention import AttentionCore
from purelayers.layers.core import Params
from purelayers.layers.dropout import dropout as _dropout


def append_kv(layer: Any, params: Params, k: jax.Array, v: jax.Array, mask: Any):
    """``bias_k``/``bias_v`` and a zero key and value appended, as torch does; the
    mask gains a visible column for each."""
    extra = int(layer.add_bias_kv) + int(layer.add_zero_attn)
    if not extra:
        return k, v, mask
    b = k.shape[0]
    ks, vs = [k], [v]
    if layer.add_bias_kv:
        ks.append(jnp.broadcast_to(params["bias_k"][0], (b, 1, k.shape[-1])).astype(k.dtype))
        vs.append(jnp.broadcast_to(params["bias_v"][0], (b, 1, v.shape[-1])).astype(v.dtype))
    if layer.add_zero_attn:
        ks.append(jnp.zeros((b, 1, k.shape[-1]), k.dtype))
        vs.append(jnp.zeros((b, 1, v.shape[-1]), v.dtype))
    if mask is not None:
        m = jnp.asarray(mask)
        s = k.shape[1]
        if m.ndim == 0 or m.shape[-1] == 1:  # else the core names a misfit
            m = jnp.broadcast_to(m, (*m.shape[:-1], s) if m.ndim else (s,))
        fill = jnp.ones if m.dtype == jnp.bool_ else jnp.zeros
        if m.shape[-1] == s:
            mask = jnp.concatenate([m, fill((*m.shape[:-1], extra), m.dtype)], axis=-1)
    return jnp.concatenate(ks, axis=1), jnp.concatenate(vs, axis=1), mask


def attend_with_weights(core: AttentionCore, q, k, v, mask, positions, key, train, layer):
    """``core``'s attention computed explicitly, with the probabilities it used:
    ``(out, weights)``, weights ``(batch, H, q_len, kv_len)`` after dropout."""
    h, kh = core.num_heads, core.kv_heads
    (b, t, _), s = q.shape, k.shape[1]
    hd = q.shape[-1] // h
    qh = q.reshape(b, t, h, hd)
    kh4 = jnp.repeat(k.reshape(b, s, kh, hd), h // kh, axis=2)
    vh = jnp.repeat(v.reshape(b, s, kh, v.shape[-1] // kh), h // kh, axis=2)
    if core.rope is not None:
        pos = jnp.arange(t) if positions is None else jnp.asarray(positions)
        qh, kh4 = core.rope.apply({}, qh, pos), core.rope.apply({}, kh4, pos)
    ft = promote_float(q.dtype)
    scale = (1.0 / math.sqrt(hd) if hd else 1.0) if core.scale is None else core.scale
    logits = jnp.einsum("bthd,bshd->bhts", qh, kh4, preferred_element_type=ft) * scale
    allowed = causal_mask(t, s)[None, None] if core.causal else None
    if mask is not None:
        m = _to4(mask, (b,), h, t, s, "mask", layer)
        if m.dtype != jnp.bool_:
            ok = m > -jnp.inf
            logits = logits + jnp.where(ok, m, jnp.zeros_like(m)).astype(ft)
            m = ok
        allowed = m if allowed is None else allowed & m
    if allowed is not None:
        allowed = jnp.broadcast_to(allowed, logits.shape)
        logits = jnp.where(allowed, logits, jnp.asarray(-0.7 * float(jnp.finfo(ft).max), ft))
    probs = jax.nn.softmax(logits, axis=-1)
    if allowed is not None:
        probs = jnp.where(jnp.any(allowed, axis=-1, keepdims=True), probs, jnp.zeros_like(probs))
    p = core.dropout if train else 0.0
    if p > 0.0:
        need_key(layer, key)
        probs = _dropout(probs, p, key, layer=layer)
    probs = probs.astype(q.dtype)
    out = jnp.einsum("bhts,bshd->bthd", probs, vh.astype(q.dtype))
    return out.reshape(b, t, h * vh.shape[-1]), probs
