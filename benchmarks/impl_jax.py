"""The same math written directly in ``jax.numpy`` / ``lax``: the baseline every library is
compared against. It reads the purelayers (PyTorch-named) params tree as is.

Written the way a careful user would without a library: ``x @ W.T + b``,
``lax.conv_general_dilated`` in NCHW/OIHW, ``lax.reduce_window`` max pooling, two-pass
LayerNorm, attention as einsum + masked softmax, and an LSTM whose step computes
``x_t @ W_ih.T + h @ W_hh.T`` inside ``lax.scan``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from benchmarks.harness import JaxModel
from benchmarks.workloads import Workload
from purelayers import params as P


def _row(b: jax.Array, ndim: int, axis: int = -1) -> jax.Array:
    """``b`` reshaped to broadcast along ``axis`` of a rank-``ndim`` array."""
    shape = [1] * ndim
    shape[axis] = b.shape[0]
    return b.reshape(shape)


def linear(p: dict, x: jax.Array) -> jax.Array:
    y = x @ p["weight"].T
    return y + _row(p["bias"], y.ndim)


def conv3x3(p: dict, x: jax.Array) -> jax.Array:
    y = lax.conv_general_dilated(
        x, p["weight"], (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW")
    )
    return y + _row(p["bias"], 4, axis=1)


def maxpool2(x: jax.Array) -> jax.Array:
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


def layer_norm(p: dict, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    c = x - mean
    y = c * lax.rsqrt((c * c).mean(-1, keepdims=True) + eps)
    return y * _row(p["weight"], x.ndim) + _row(p["bias"], x.ndim)


def attention(p: dict, x: jax.Array, heads: int) -> jax.Array:
    b, t, e = x.shape
    hd = e // heads
    q, k, v = jnp.split(linear(p["qkv"], x).reshape(b, t, 3, heads, hd), 3, axis=2)
    out = causal_attention(q[:, :, 0], k[:, :, 0], v[:, :, 0])
    return linear(p["out"], out.reshape(b, t, e))


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal self-attention of ``[B, T, N, H]`` heads: einsums and a masked softmax."""
    t, hd = q.shape[1], q.shape[-1]
    logits = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
    causal = jnp.tril(jnp.ones((t, t), bool))[None, None]
    logits = jnp.where(causal, logits, jnp.finfo(logits.dtype).min)
    return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(logits, axis=-1), v)


def _mlp(p, x):
    for name in ("0", "2"):
        x = jax.nn.relu(linear(p[name], x))
    return linear(p["4"], x)


def _cnn(p, x):
    for name in ("0", "3"):
        x = maxpool2(jax.nn.relu(conv3x3(p[name], x)))
    x = jax.nn.relu(linear(p["7"], x.reshape(x.shape[0], -1)))
    return linear(p["9"], x)


def transformer_forward(norm, attention, linear, gelu):
    """The workload's GPT over its PyTorch-named params tree, from its parts: ``norm``,
    ``attention`` and ``linear`` of ``(params, x)``, ``gelu`` of ``x``."""

    def forward(p, x):
        for i in range(len(p["blocks"])):
            blk = p["blocks"][str(i)]
            x = x + attention(blk["attn"], norm(blk["ln1"], x))
            h = gelu(linear(blk["mlp"]["0"], norm(blk["ln2"], x)))
            x = x + linear(blk["mlp"]["2"], h)
        return linear(p["head"], norm(p["ln_f"], x))

    return forward


def _transformer(heads):
    return transformer_forward(
        layer_norm,
        functools.partial(attention, heads=heads),
        linear,
        functools.partial(jax.nn.gelu, approximate=True),
    )


def _lstm(p, x):
    lp = p["lstm"]
    w_ih, w_hh = lp["weight_ih_l0"], lp["weight_hh_l0"]
    bias = lp["bias_ih_l0"] + lp["bias_hh_l0"]
    hidden = w_hh.shape[1]

    def step(carry, xt):
        h, c = carry
        gates = xt @ w_ih.T + h @ w_hh.T + _row(bias, 2)
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), None

    zeros = jnp.zeros((x.shape[1], hidden), x.dtype)
    (h, _), _ = lax.scan(step, (zeros, zeros), x)
    return linear(p["head"], h)


def forward_fn(w: Workload):
    if w.name == "transformer":
        return _transformer(w.dims["heads"])
    return {"mlp": _mlp, "cnn": _cnn, "lstm": _lstm}[w.name]


def build(w: Workload, flat: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> JaxModel:
    return JaxModel(P.unflatten(dict(flat)), forward_fn(w), x, y)


def build_bf16(w: Workload, flat: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> JaxModel:
    from purelayers.precision import mixed_precision

    return JaxModel(P.unflatten(dict(flat)), mixed_precision(forward_fn(w)), x, y)
