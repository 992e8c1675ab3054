"""Haiku versions of the workloads, idiomatic: ``hk.transform``, NHWC ``hk.Conv2D``,
``hk.MultiHeadAttention``, ``hk.LSTM`` under ``hk.dynamic_unroll``. Weights are converted
by name: ``w`` is ``[in, out]``; ``hk.LSTM`` is one linear layer over ``[x, h]`` with gate
order i, g, f, o and a built-in ``+1`` on the forget gate, so its bias is shifted by -1.
The converted tree is checked against Haiku's own init.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import JaxModel
from benchmarks.impl_flax import check_like, dense_chw_to_hwc, to_nhwc
from benchmarks.workloads import Workload


def _lin(flat, name):
    return {"w": flat[f"{name}.weight"].T, "b": flat[f"{name}.bias"]}


def _norm(flat, name):
    return {"scale": flat[f"{name}.weight"], "offset": flat[f"{name}.bias"]}


def _tree(w: Workload, flat: dict) -> dict:
    if w.name == "mlp":
        return {f"l{i}": _lin(flat, n) for i, n in enumerate(("0", "2", "4"))}
    if w.name == "cnn":
        hwc = dense_chw_to_hwc(flat, "7", w.dims["c2"])
        return {
            "c0": {"w": flat["0.weight"].transpose(2, 3, 1, 0), "b": flat["0.bias"]},
            "c1": {"w": flat["3.weight"].transpose(2, 3, 1, 0), "b": flat["3.bias"]},
            "l0": {"w": hwc["kernel"], "b": hwc["bias"]},
            "l1": _lin(flat, "9"),
        }
    if w.name == "transformer":
        tree = {}
        for i in range(w.dims["layers"]):
            p = f"blocks.{i}"
            wq, bq = flat[f"{p}.attn.qkv.weight"], flat[f"{p}.attn.qkv.bias"]
            e = wq.shape[1]
            for j, part in enumerate(("query", "key", "value")):
                rows = slice(j * e, (j + 1) * e)
                tree[f"b{i}_attn/{part}"] = {"w": wq[rows].T, "b": bq[rows]}
            tree[f"b{i}_attn/linear"] = _lin(flat, f"{p}.attn.out")
            tree[f"b{i}_ln1"] = _norm(flat, f"{p}.ln1")
            tree[f"b{i}_ln2"] = _norm(flat, f"{p}.ln2")
            tree[f"b{i}_fc"] = _lin(flat, f"{p}.mlp.0")
            tree[f"b{i}_proj"] = _lin(flat, f"{p}.mlp.2")
        tree["ln_f"] = _norm(flat, "ln_f")
        tree["head"] = _lin(flat, "head")
        return tree
    w_ih, w_hh = flat["lstm.weight_ih_l0"], flat["lstm.weight_hh_l0"]
    bias = flat["lstm.bias_ih_l0"] + flat["lstm.bias_hh_l0"]
    h = w_hh.shape[1]
    i, f, g, o = (slice(k * h, (k + 1) * h) for k in range(4))
    order = np.r_[i, g, f, o]
    weight = np.concatenate([w_ih, w_hh], axis=1)[order]
    bias = bias[order].copy()
    bias[2 * h : 3 * h] -= 1.0
    return {"lstm/linear": {"w": weight.T, "b": bias}, "head": _lin(flat, "head")}


def _forward_fn(w: Workload):
    import haiku as hk

    def mlp(x):
        x = jax.nn.relu(hk.Linear(w.dims["hidden"], name="l0")(x))
        x = jax.nn.relu(hk.Linear(w.dims["hidden"], name="l1")(x))
        return hk.Linear(w.classes, name="l2")(x)

    def cnn(x):
        for i, ch in enumerate((w.dims["c1"], w.dims["c2"])):
            x = jax.nn.relu(hk.Conv2D(ch, 3, padding=((1, 1), (1, 1)), name=f"c{i}")(x))
            x = hk.max_pool(x, window_shape=(1, 2, 2, 1), strides=(1, 2, 2, 1), padding="VALID")
        x = jax.nn.relu(hk.Linear(w.dims["hidden"], name="l0")(x.reshape(x.shape[0], -1)))
        return hk.Linear(w.classes, name="l1")(x)

    def ln(name):
        return hk.LayerNorm(axis=-1, create_scale=True, create_offset=True, eps=1e-5, name=name)

    def gpt(x):
        _, t, d = x.shape
        heads = w.dims["heads"]
        mask = jnp.tril(jnp.ones((1, 1, t, t), bool))
        for i in range(w.dims["layers"]):
            attn = hk.MultiHeadAttention(
                heads, d // heads, w_init=hk.initializers.VarianceScaling(1.0), name=f"b{i}_attn"
            )
            h = ln(f"b{i}_ln1")(x)
            x = x + attn(h, h, h, mask=mask)
            h = hk.Linear(4 * d, name=f"b{i}_fc")(ln(f"b{i}_ln2")(x))
            x = x + hk.Linear(d, name=f"b{i}_proj")(jax.nn.gelu(h, approximate=True))
        return hk.Linear(w.classes, name="head")(ln("ln_f")(x))

    def lstm(x):
        core = hk.LSTM(w.dims["hidden"], name="lstm")
        out, _ = hk.dynamic_unroll(core, x, core.initial_state(x.shape[1]), time_major=True)
        return hk.Linear(w.classes, name="head")(out[-1])

    return {"mlp": mlp, "cnn": cnn, "transformer": gpt, "lstm": lstm}[w.name]


def build(w: Workload, flat: dict, x: np.ndarray, y: np.ndarray) -> JaxModel:
    import haiku as hk

    model = hk.without_apply_rng(hk.transform(_forward_fn(w)))
    x = to_nhwc(w, x)
    params = _tree(w, flat)
    check_like(jax.eval_shape(model.init, jax.random.key(0), x), params, "haiku")
    return JaxModel(params, model.apply, x, y)
