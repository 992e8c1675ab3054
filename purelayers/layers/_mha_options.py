"""The option of ``torch.nn.MultiheadAttention`` that ``InProjAttention`` adds around
its ``AttentionCore``: keys appended to every sequence (``add_bias_kv``,
``add_zero_attn``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from purelayers.layers.core import Params


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
