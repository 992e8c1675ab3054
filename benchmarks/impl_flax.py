"""Flax linen and Flax NNX versions of the workloads, idiomatic: NHWC convolutions,
``kernel`` stored ``[in, out]``, ``nn.MultiHeadDotProductAttention`` with a causal mask,
``OptimizedLSTMCell`` under ``RNN``. The shared purelayers weights are converted by name
(transposed, and the flatten order of the CNN head permuted from CHW to HWC), and the
converted tree is checked against the library's own init (names and shapes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import JaxModel
from benchmarks.workloads import Workload

# -- weight conversion (PyTorch layout -> Flax layout) ----------------------------------


def dense(flat: dict, name: str) -> dict:
    return {"kernel": flat[f"{name}.weight"].T, "bias": flat[f"{name}.bias"]}


def conv(flat: dict, name: str) -> dict:
    return {"kernel": flat[f"{name}.weight"].transpose(2, 3, 1, 0), "bias": flat[f"{name}.bias"]}


def norm(flat: dict, name: str) -> dict:
    return {"scale": flat[f"{name}.weight"], "bias": flat[f"{name}.bias"]}


def dense_chw_to_hwc(flat: dict, name: str, channels: int) -> dict:
    """A Linear reading a CHW flatten, re-ordered to read an HWC flatten."""
    w = flat[f"{name}.weight"]
    side = round((w.shape[1] // channels) ** 0.5)
    w = w.reshape(w.shape[0], channels, side, side).transpose(0, 2, 3, 1).reshape(w.shape[0], -1)
    return {"kernel": w.T, "bias": flat[f"{name}.bias"]}


def mha(flat: dict, name: str, heads: int) -> dict:
    w, b = flat[f"{name}.qkv.weight"], flat[f"{name}.qkv.bias"]
    e = w.shape[1]
    hd = e // heads
    out = {}
    for i, part in enumerate(("query", "key", "value")):
        rows = slice(i * e, (i + 1) * e)
        out[part] = {"kernel": w[rows].T.reshape(e, heads, hd), "bias": b[rows].reshape(heads, hd)}
    wo = flat[f"{name}.out.weight"]
    out["out"] = {"kernel": wo.T.reshape(heads, hd, e), "bias": flat[f"{name}.out.bias"]}
    return out


def _lstm_parts(flat: dict, name: str):
    w_ih, w_hh = flat[f"{name}.weight_ih_l0"], flat[f"{name}.weight_hh_l0"]
    bias = flat[f"{name}.bias_ih_l0"] + flat[f"{name}.bias_hh_l0"]
    return w_ih, w_hh, bias


def lstm_linen(flat: dict, name: str) -> dict:
    """Per-gate ``i*`` (no bias) and ``h*`` dense layers, torch gate order i, f, g, o."""
    w_ih, w_hh, bias = _lstm_parts(flat, name)
    h = w_hh.shape[1]
    cell = {}
    for j, gate in enumerate("ifgo"):
        rows = slice(j * h, (j + 1) * h)
        cell[f"i{gate}"] = {"kernel": w_ih[rows].T}
        cell[f"h{gate}"] = {"kernel": w_hh[rows].T, "bias": bias[rows]}
    return {"cell": cell}


def lstm_nnx(flat: dict, name: str) -> dict:
    """Packed ``dense_i`` (no bias) and ``dense_h``, torch gate order i, f, g, o."""
    w_ih, w_hh, bias = _lstm_parts(flat, name)
    return {"cell": {"dense_i": {"kernel": w_ih.T}, "dense_h": {"kernel": w_hh.T, "bias": bias}}}


def flax_tree(w: Workload, flat: dict, *, nnx: bool) -> dict:
    """The workload's weights in the tree both Flax APIs use (module names below)."""
    if w.name == "mlp":
        return {f"l{i}": dense(flat, n) for i, n in enumerate(("0", "2", "4"))}
    if w.name == "cnn":
        return {
            "c0": conv(flat, "0"),
            "c1": conv(flat, "3"),
            "l0": dense_chw_to_hwc(flat, "7", w.dims["c2"]),
            "l1": dense(flat, "9"),
        }
    if w.name == "transformer":
        tree = {}
        for i in range(w.dims["layers"]):
            p = f"blocks.{i}"
            tree[f"b{i}"] = {
                "ln1": norm(flat, f"{p}.ln1"),
                "attn": mha(flat, f"{p}.attn", w.dims["heads"]),
                "ln2": norm(flat, f"{p}.ln2"),
                "fc": dense(flat, f"{p}.mlp.0"),
                "proj": dense(flat, f"{p}.mlp.2"),
            }
        if nnx:
            tree = {"blocks": {i: tree[f"b{i}"] for i in range(w.dims["layers"])}}
        tree.update(ln_f=norm(flat, "ln_f"), head=dense(flat, "head"))
        return tree
    if nnx:
        return {"rnn": lstm_nnx(flat, "lstm"), "head": dense(flat, "head")}
    return {**lstm_linen(flat, "lstm"), "head": dense(flat, "head")}


def check_like(reference, tree, what: str) -> None:
    """``tree`` has exactly ``reference``'s names and shapes."""

    def shapes(t):
        leaves = jax.tree_util.tree_flatten_with_path(t, is_leaf=lambda a: hasattr(a, "shape"))[0]
        return {jax.tree_util.keystr(k): tuple(a.shape) for k, a in leaves}

    ref, got = shapes(reference), shapes(tree)
    if ref != got:
        diff = sorted(set(ref.items()) ^ set(got.items()))
        raise ValueError(f"{what}: converted weights do not match the model: {diff}")


def to_nhwc(w: Workload, x: np.ndarray) -> np.ndarray:
    return x.transpose(0, 2, 3, 1) if w.name == "cnn" else x


# -- linen --------------------------------------------------------------------------


def _linen_module(w: Workload):
    import flax.linen as nn

    classes = w.classes

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Dense(w.dims["hidden"], name="l0")(x))
            x = nn.relu(nn.Dense(w.dims["hidden"], name="l1")(x))
            return nn.Dense(classes, name="l2")(x)

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            for i, ch in enumerate((w.dims["c1"], w.dims["c2"])):
                x = nn.relu(nn.Conv(ch, (3, 3), padding=1, name=f"c{i}")(x))
                x = nn.max_pool(x, (2, 2), strides=(2, 2))
            x = nn.relu(nn.Dense(w.dims["hidden"], name="l0")(x.reshape(x.shape[0], -1)))
            return nn.Dense(classes, name="l1")(x)

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, mask):
            d = x.shape[-1]
            attn = nn.MultiHeadDotProductAttention(num_heads=w.dims["heads"], name="attn")
            x = x + attn(nn.LayerNorm(epsilon=1e-5, name="ln1")(x), mask=mask)
            h = nn.Dense(4 * d, name="fc")(nn.LayerNorm(epsilon=1e-5, name="ln2")(x))
            return x + nn.Dense(d, name="proj")(nn.gelu(h, approximate=True))

    class GPT(nn.Module):
        @nn.compact
        def __call__(self, x):
            mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
            for i in range(w.dims["layers"]):
                x = Block(name=f"b{i}")(x, mask)
            return nn.Dense(classes, name="head")(nn.LayerNorm(epsilon=1e-5, name="ln_f")(x))

    class LSTM(nn.Module):
        @nn.compact
        def __call__(self, x):
            cell = nn.OptimizedLSTMCell(w.dims["hidden"], name="cell")
            out = nn.RNN(cell, time_major=True)(x)
            return nn.Dense(classes, name="head")(out[-1])

    return {"mlp": MLP, "cnn": CNN, "transformer": GPT, "lstm": LSTM}[w.name]()


def build_linen(w: Workload, flat: dict, x: np.ndarray, y: np.ndarray) -> JaxModel:
    module = _linen_module(w)
    x = to_nhwc(w, x)
    variables = {"params": flax_tree(w, flat, nnx=False)}
    check_like(jax.eval_shape(module.init, jax.random.key(0), x), variables, "flax linen")
    return JaxModel(variables, module.apply, x, y)


# -- NNX ----------------------------------------------------------------------------


def _nnx_module(w: Workload):
    from flax import nnx

    rngs = nnx.Rngs(0)
    classes = w.classes

    class MLP(nnx.Module):
        def __init__(self):
            h = w.dims["hidden"]
            self.l0 = nnx.Linear(w.x_shape[-1], h, rngs=rngs)
            self.l1 = nnx.Linear(h, h, rngs=rngs)
            self.l2 = nnx.Linear(h, classes, rngs=rngs)

        def __call__(self, x):
            return self.l2(nnx.relu(self.l1(nnx.relu(self.l0(x)))))

    class CNN(nnx.Module):
        def __init__(self):
            c1, c2 = w.dims["c1"], w.dims["c2"]
            side = w.x_shape[-1] // 4
            self.c0 = nnx.Conv(w.x_shape[1], c1, (3, 3), padding=1, rngs=rngs)
            self.c1 = nnx.Conv(c1, c2, (3, 3), padding=1, rngs=rngs)
            self.l0 = nnx.Linear(c2 * side * side, w.dims["hidden"], rngs=rngs)
            self.l1 = nnx.Linear(w.dims["hidden"], classes, rngs=rngs)

        def __call__(self, x):
            for c in (self.c0, self.c1):
                x = nnx.max_pool(nnx.relu(c(x)), (2, 2), strides=(2, 2))
            return self.l1(nnx.relu(self.l0(x.reshape(x.shape[0], -1))))

    d = w.x_shape[-1]

    class Block(nnx.Module):
        def __init__(self):
            self.ln1 = nnx.LayerNorm(d, epsilon=1e-5, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(w.dims["heads"], d, decode=False, rngs=rngs)
            self.ln2 = nnx.LayerNorm(d, epsilon=1e-5, rngs=rngs)
            self.fc = nnx.Linear(d, 4 * d, rngs=rngs)
            self.proj = nnx.Linear(4 * d, d, rngs=rngs)

        def __call__(self, x, mask):
            x = x + self.attn(self.ln1(x), mask=mask)
            return x + self.proj(nnx.gelu(self.fc(self.ln2(x)), approximate=True))

    class GPT(nnx.Module):
        def __init__(self):
            self.blocks = nnx.List([Block() for _ in range(w.dims["layers"])])
            self.ln_f = nnx.LayerNorm(d, epsilon=1e-5, rngs=rngs)
            self.head = nnx.Linear(d, classes, rngs=rngs)

        def __call__(self, x):
            mask = nnx.make_causal_mask(jnp.ones(x.shape[:2]))
            for blk in self.blocks:
                x = blk(x, mask)
            return self.head(self.ln_f(x))

    class LSTM(nnx.Module):
        def __init__(self):
            h = w.dims["hidden"]
            cell = nnx.OptimizedLSTMCell(w.x_shape[-1], h, rngs=rngs)
            self.rnn = nnx.RNN(cell, time_major=True, rngs=False)
            self.head = nnx.Linear(h, classes, rngs=rngs)

        def __call__(self, x):
            zeros = jnp.zeros((x.shape[1], w.dims["hidden"]), x.dtype)
            return self.head(self.rnn(x, initial_carry=(zeros, zeros))[-1])

    return {"mlp": MLP, "cnn": CNN, "transformer": GPT, "lstm": LSTM}[w.name]()


def build_nnx(w: Workload, flat: dict, x: np.ndarray, y: np.ndarray) -> JaxModel:
    from flax import nnx

    graphdef, params, rest = nnx.split(_nnx_module(w), nnx.Param, ...)
    tree = flax_tree(w, flat, nnx=True)
    check_like(nnx.to_pure_dict(params), tree, "flax nnx")
    nnx.replace_by_pure_dict(params, jax.tree.map(jnp.asarray, tree))

    def forward(params, x):
        return nnx.merge(graphdef, params, rest)(x)

    return JaxModel(params, forward, to_nhwc(w, x), y)
