"""Equinox versions of the workloads, idiomatic: modules act on one example and the batch
is ``jax.vmap``-ed; ``eqx.nn.Linear``/``Conv2d`` keep PyTorch's weight layouts, so the
shared weights go in almost unchanged (``Conv2d`` bias ``(C, 1, 1)``; ``LSTMCell`` has one
bias, ``bias_ih + bias_hh``). Trained through ``eqx.partition``/``eqx.combine``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import JaxModel
from benchmarks.workloads import Workload


def _set(module, **arrays):
    """``module`` with the named array fields replaced."""
    import equinox as eqx

    names = tuple(arrays)
    return eqx.tree_at(
        lambda m: tuple(getattr(m, n) for n in names),
        module,
        tuple(_array(arrays[n]) for n in names),
    )


def _array(value):
    return jnp.asarray(value) if isinstance(value, np.ndarray) else value


def _linear(flat, name, key):
    import equinox as eqx

    w, b = flat[f"{name}.weight"], flat[f"{name}.bias"]
    return _set(eqx.nn.Linear(w.shape[1], w.shape[0], key=key), weight=w, bias=b)


def _conv(flat, name, key):
    import equinox as eqx

    w, b = flat[f"{name}.weight"], flat[f"{name}.bias"]
    conv = eqx.nn.Conv2d(w.shape[1], w.shape[0], 3, padding=1, key=key)
    return _set(conv, weight=w, bias=b.reshape(-1, 1, 1))


def _norm(flat, name):
    import equinox as eqx

    w = flat[f"{name}.weight"]
    return _set(eqx.nn.LayerNorm(w.shape[0], eps=1e-5), weight=w, bias=flat[f"{name}.bias"])


def _mha(flat, name, heads, key):
    import equinox as eqx

    w, b = flat[f"{name}.qkv.weight"], flat[f"{name}.qkv.bias"]
    e = w.shape[1]
    mha = eqx.nn.MultiheadAttention(
        heads,
        e,
        use_query_bias=True,
        use_key_bias=True,
        use_value_bias=True,
        use_output_bias=True,
        key=key,
    )
    projections = {}
    for i, part in enumerate(("query_proj", "key_proj", "value_proj")):
        rows = slice(i * e, (i + 1) * e)
        projections[part] = _set(getattr(mha, part), weight=w[rows], bias=b[rows])
    wo, bo = flat[f"{name}.out.weight"], flat[f"{name}.out.bias"]
    projections["output_proj"] = _set(mha.output_proj, weight=wo, bias=bo)
    return _set(mha, **projections)


def _models(w: Workload, flat: dict):
    import equinox as eqx

    keys = iter(jax.random.split(jax.random.key(0), 64))

    class MLP(eqx.Module):
        layers: tuple

        def __call__(self, x):
            for layer in self.layers[:-1]:
                x = jax.nn.relu(layer(x))
            return self.layers[-1](x)

    class CNN(eqx.Module):
        convs: tuple
        pool: eqx.nn.MaxPool2d
        fc: tuple

        def __call__(self, x):
            for conv in self.convs:
                x = self.pool(jax.nn.relu(conv(x)))
            return self.fc[1](jax.nn.relu(self.fc[0](x.reshape(-1))))

    class Block(eqx.Module):
        ln1: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        ln2: eqx.nn.LayerNorm
        fc: eqx.nn.Linear
        proj: eqx.nn.Linear

        def __call__(self, x, mask):
            h = jax.vmap(self.ln1)(x)
            x = x + self.attn(h, h, h, mask=mask)
            h = jax.nn.gelu(jax.vmap(self.fc)(jax.vmap(self.ln2)(x)), approximate=True)
            return x + jax.vmap(self.proj)(h)

    class GPT(eqx.Module):
        blocks: tuple
        ln_f: eqx.nn.LayerNorm
        head: eqx.nn.Linear

        def __call__(self, x):
            t = x.shape[0]
            mask = jnp.tril(jnp.ones((t, t), bool))
            for blk in self.blocks:
                x = blk(x, mask)
            return jax.vmap(self.head)(jax.vmap(self.ln_f)(x))

    class LSTM(eqx.Module):
        cell: eqx.nn.LSTMCell
        head: eqx.nn.Linear

        def __call__(self, xs):  # one sequence (T, I)
            zeros = jnp.zeros((self.cell.hidden_size,), xs.dtype)

            def step(carry, xt):
                return self.cell(xt, carry), None

            (h, _), _ = jax.lax.scan(step, (zeros, zeros), xs)
            return self.head(h)

    if w.name == "mlp":
        return MLP(tuple(_linear(flat, n, next(keys)) for n in ("0", "2", "4")))
    if w.name == "cnn":
        return CNN(
            (_conv(flat, "0", next(keys)), _conv(flat, "3", next(keys))),
            eqx.nn.MaxPool2d(2, 2),
            (_linear(flat, "7", next(keys)), _linear(flat, "9", next(keys))),
        )
    if w.name == "transformer":
        blocks = []
        for i in range(w.dims["layers"]):
            p = f"blocks.{i}"
            blocks.append(
                Block(
                    _norm(flat, f"{p}.ln1"),
                    _mha(flat, f"{p}.attn", w.dims["heads"], next(keys)),
                    _norm(flat, f"{p}.ln2"),
                    _linear(flat, f"{p}.mlp.0", next(keys)),
                    _linear(flat, f"{p}.mlp.2", next(keys)),
                )
            )
        return GPT(tuple(blocks), _norm(flat, "ln_f"), _linear(flat, "head", next(keys)))
    w_ih, w_hh = flat["lstm.weight_ih_l0"], flat["lstm.weight_hh_l0"]
    bias = flat["lstm.bias_ih_l0"] + flat["lstm.bias_hh_l0"]
    cell = eqx.nn.LSTMCell(w_ih.shape[1], w_hh.shape[1], key=next(keys))
    cell = _set(cell, weight_ih=w_ih, weight_hh=w_hh, bias=bias)
    return LSTM(cell, _linear(flat, "head", next(keys)))


def build(w: Workload, flat: dict, x: np.ndarray, y: np.ndarray) -> JaxModel:
    import equinox as eqx

    model = _models(w, flat)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    # the LSTM is vmapped over the batch axis of time-major input
    in_axis = 1 if w.name == "lstm" else 0

    def forward(params, x):
        return jax.vmap(eqx.combine(params, static), in_axes=in_axis)(x)

    return JaxModel(params, forward, x, y)
