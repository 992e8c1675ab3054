"""Sharded-training scenarios for tests/test_sharding.py, run as a script in a fresh
process with 8 host devices (XLA_FLAGS must be set before JAX creates its backends).

    python tests/sharding_scenarios.py OUT.json

Writes one JSON object with a section per scenario; the test asserts on it.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import json
import re
import sys
import tempfile
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from sharded_gpt import gpt_rules, local_model, make_train_step

import purelayers as pl
import purelayers.sharding as S

VOCAB, DIM, LAYERS, HEADS, SEQ, BATCH, STEPS = 16, 32, 2, 4, 8, 8, 10
SHAPE = (BATCH, SEQ)
MODEL = local_model(VOCAB, DIM, LAYERS, HEADS, SEQ)
# SGD with momentum: Adam's g / sqrt(v) would amplify float32 rounding in near-zero
# gradients, hiding what is compared (the sharded computation) behind the optimizer.
OPT = optax.sgd(0.1, momentum=0.9)


def batches():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (STEPS, BATCH, SEQ + 1)).astype(np.int32)
    return [(b[:, :-1], b[:, 1:]) for b in ids]


def train(mesh, rules, batch_axes):
    """Ten optimizer steps from the same initial params, compiled for ``mesh``."""
    params = MODEL.init(jax.random.key(0), SHAPE)
    param_sh = S.named_shardings(params, rules, mesh)
    params = jax.device_put(params, param_sh)
    opt_sh = S.optimizer_shardings(jax.eval_shape(OPT.init, params), param_sh)
    opt_state = jax.jit(OPT.init, out_shardings=opt_sh)(params)
    batch_sh = S.NamedSharding(mesh, S.P(batch_axes))
    step = make_train_step(MODEL, OPT, param_sh, opt_sh, batch_sh)
    compiled = None
    losses = []
    for x, y in batches():
        x, y = jax.device_put(x, batch_sh), jax.device_put(y, batch_sh)
        if compiled is None:
            compiled = step.lower(params, opt_state, x, y).compile()
        params, opt_state, loss = compiled(params, opt_state, x, y)
        losses.append(float(loss))
    hlo = compiled.as_text()
    specs = {k: str(v.spec) for k, v in pl.params.flatten(param_sh).items()}
    kept = all(
        a.sharding == s
        for a, s in zip(jax.tree.leaves(params), jax.tree.leaves(param_sh), strict=True)
    )
    return params, losses, hlo, specs, kept


def collectives(hlo: str) -> list[list[str]]:
    """``[op, result shape]`` of every collective in a compiled module."""
    pattern = (
        r"= (\S+) (all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(?:-start)?\("
    )
    return [[op, shape.split("{")[0]] for shape, op in re.findall(pattern, hlo)]


def compare(ref, got):
    ref_params, ref_losses = ref
    params, losses = got
    diffs = jax.tree.map(
        lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))), ref_params, params
    )
    return {
        "loss_diff": float(np.max(np.abs(np.array(ref_losses) - np.array(losses)))),
        "param_diff": max(jax.tree.leaves(diffs)),
        "losses": losses,
    }


def scenario_training(out):
    one = S.make_mesh("data=1")
    ref_params, ref_losses, _, _, _ = train(one, S.data_parallel(), "data")
    out["reference_losses"] = ref_losses
    setups = {
        "data_parallel": (S.make_mesh("data=8"), S.data_parallel(), "data"),
        "fsdp": (S.make_mesh("data=2,fsdp=4"), S.fsdp("fsdp", min_size=256), ("data", "fsdp")),
        "tensor_parallel": (S.make_mesh("data=2,model=4"), gpt_rules("model"), "data"),
    }
    for name, (mesh, rules, axes) in setups.items():
        params, losses, hlo, specs, kept = train(mesh, rules, axes)
        out[name] = {
            **compare((ref_params, ref_losses), (params, losses)),
            "specs": specs,
            "shardings_kept": kept,
            "collectives": collectives(hlo),
        }
        if name == "tensor_parallel":
            out[name]["weight_shapes"] = {
                k: list(v.shape) for k, v in pl.params.flatten(params).items()
            }
            out["tp_params"] = params


def scenario_init(out):
    mesh = S.make_mesh("data=2,model=4")
    with mock.patch.object(S.jax, "jit", wraps=jax.jit) as spy:
        init, shardings = S.sharded_init_fn(MODEL, SHAPE, mesh, gpt_rules())
    jit_kwargs = spy.call_args.kwargs
    key = jax.random.key(0)
    compiled = init.lower(key).compile()
    hlo = compiled.as_text()
    params = compiled(key)
    # One entry per stored array (a Repeat's stacked blocks are one array each), named
    # as the sharding rules see it (block 0's name for a stack).
    want, flat, plain = (
        {
            ".".join(S._key_name(k) for k in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
        }
        for tree in (shardings, params, jax.jit(lambda k: MODEL.init(k, SHAPE))(key))
    )
    out["init"] = {
        "jit_given_out_shardings": jit_kwargs.get("out_shardings") is shardings,
        "shardings_equal": all(flat[k].sharding == want[k] for k in want),
        "shard_shapes_local": all(
            all(
                s.data.shape == want[k].shard_shape(flat[k].shape)
                for s in flat[k].addressable_shards
            )
            for k in want
        ),
        "sharded_names": sorted(k for k, s in want.items() if not s.is_fully_replicated),
        "max_diff_unsharded_init": max(
            float(np.max(np.abs(np.asarray(flat[k]) - np.asarray(plain[k])))) for k in plain
        ),
        "hlo_shapes": sorted(set(re.findall(r"f32\[[\d,]*\]", hlo))),
        "full_shapes": {k: list(v.shape) for k, v in flat.items()},
        "local_shapes": {k: list(want[k].shard_shape(v.shape)) for k, v in flat.items()},
    }


def scenario_checkpoint(out):
    params = out.pop("tp_params")
    param_sh = jax.tree.map(lambda a: a.sharding, params)
    abstract = jax.eval_shape(lambda k: MODEL.init(k, SHAPE), jax.random.key(0))
    fsdp_sh = S.named_shardings(abstract, S.fsdp("fsdp", min_size=256), S.make_mesh("fsdp=8"))
    result = {}
    params = jax.tree.map(lambda a: a + 0, params)  # fresh arrays: no host copy cached yet
    with tempfile.TemporaryDirectory() as tmp:
        single = S.save(Path(tmp) / "model.safetensors", params)
        folder = S.save(Path(tmp) / "sharded", params, max_shard_bytes=8192)
        n_files = len(list((Path(tmp) / "sharded").glob("model-*.safetensors")))
        # Saving assembles each split array on the host for its file only: no gathered
        # copy stays cached on the array (``np.asarray`` of a split array would keep one
        # in its private ``_npy_value`` for the array's lifetime).
        split = jax.device_put(
            jnp.arange(64 * 8.0).reshape(64, 8),
            jax.sharding.NamedSharding(S.make_mesh("x=8"), jax.sharding.PartitionSpec("x")),
        )
        S.save(Path(tmp) / "split.safetensors", {"w": split})
        result["host_copy_kept"] = getattr(split, "_npy_value", None) is not None
        saved = pl.params.load(Path(tmp) / "split.safetensors")["w"]
        result["split_saved"] = bool(np.array_equal(saved, np.arange(512.0).reshape(64, 8)))
        for label, path, target in (
            ("file_same_mesh", single, param_sh),
            ("index_same_mesh", folder, param_sh),
            ("index_other_mesh", folder, fsdp_sh),
        ):
            got = S.load_sharded(path, abstract, target)
            result[label] = {
                "values_equal": all(
                    bool(jnp.array_equal(a, b))
                    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(got), strict=True)
                ),
                "shardings_equal": all(
                    a.sharding == s
                    for a, s in zip(jax.tree.leaves(got), jax.tree.leaves(target), strict=True)
                ),
            }
        result["index_files"] = n_files
        plain = pl.params.load(single)
        result["plain_load_equal"] = all(
            bool(jnp.array_equal(plain[k], v)) for k, v in pl.params.flatten(params).items()
        )
    out["checkpoint"] = result


def scenario_grouped_qkv(out):
    mesh = S.make_mesh("model=4")
    heads, kv_heads, hd, embed = 8, 4, 2, 4
    rows = (heads + 2 * kv_heads) * hd
    w = jnp.arange(rows * embed, dtype=jnp.float32).reshape(rows, embed)
    grouped = S.group_qkv(w, heads, kv_heads, groups=4)
    placed = jax.device_put(grouped, S.NamedSharding(mesh, S.P("model", None)))
    shards = {}
    for s in placed.addressable_shards:
        first_rows = np.asarray(s.data)[:, 0] // embed
        shards[str(s.index[0].start // s.data.shape[0])] = first_rows.astype(int).tolist()
    out["grouped_qkv"] = {
        "rows_per_device": shards,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": hd,
    }


def grouped_attention(params, x, heads, kv_heads, groups):
    """Causal self-attention reading ``qkv`` rows in head-group order (``group_qkv``):
    the computation a layer needs for a communication-free Megatron split."""
    b, t, e = x.shape
    hd = e // heads
    y = x @ params["qkv"]["weight"].T + params["qkv"]["bias"]
    y = y.reshape(b, t, groups, -1)  # one group per device: a split axis stays split
    hq, hk = heads // groups * hd, kv_heads // groups * hd
    q = y[..., :hq].reshape(b, t, heads, hd)
    k = y[..., hq : hq + hk].reshape(b, t, kv_heads, hd)
    v = y[..., hq + hk :].reshape(b, t, kv_heads, hd)
    o = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return o.reshape(b, t, e) @ params["out"]["weight"].T + params["out"]["bias"]


def scenario_grouped_attention(out):
    heads, kv_heads, groups = 8, 4, 4
    mesh = S.make_mesh(f"model={groups}")
    mha = pl.layers.MultiHeadAttention(heads, num_kv_heads=kv_heads, causal=True)
    x = jax.random.normal(jax.random.key(1), (2, 8, 32))
    torch_order = mha.init(jax.random.key(0), x.shape)
    grouped = {
        "qkv": {
            k: S.group_qkv(v, heads, kv_heads, groups=groups) for k, v in torch_order["qkv"].items()
        },
        "out": torch_order["out"],
    }
    sh = S.named_shardings(grouped, S.attention(""), mesh)

    def loss_grouped(p, x):
        return jnp.sum(grouped_attention(p, x, heads, kv_heads, groups) ** 2)

    def loss_torch(p, x):
        return jnp.sum(mha.apply(p, x) ** 2)

    result = {}
    for name, fn, p in (
        ("grouped", loss_grouped, grouped),
        ("torch_order", loss_torch, torch_order),
    ):
        p = jax.device_put(p, sh)
        step = jax.jit(jax.value_and_grad(fn), out_shardings=(S.NamedSharding(mesh, S.P()), sh))
        compiled = step.lower(p, x).compile()
        loss, _ = compiled(p, x)
        result[name] = {"loss": float(loss), "collectives": collectives(compiled.as_text())}
    result["same_output"] = float(
        jnp.max(
            jnp.abs(
                grouped_attention(grouped, x, heads, kv_heads, groups) - mha.apply(torch_order, x)
            )
        )
    )
    out["grouped_attention"] = result


def scenario_time_major(out):
    """An LSTM over time-major ``(T, B, I)`` sequences, its batch (axis 1) split over 8
    devices with ``batch_sharding(..., axis=1)``: loss and gradients against one device."""
    import purelayers.layers as L

    lstm, shape = L.LSTM(16), (6, 16, 8)
    params = lstm.init(jax.random.key(1), shape)
    x = jax.random.normal(jax.random.key(2), shape)

    def loss(p, x):
        out, _ = lstm.apply(p, x)
        return jnp.sum(out[-1] ** 2) + jnp.sum(out)

    grad = jax.jit(jax.value_and_grad(loss))
    ref_loss, ref_grads = grad(params, x)
    mesh = S.make_mesh("data=8")
    xs = jax.device_put(x, S.batch_sharding(mesh, "data", axis=1))
    ps = jax.device_put(params, S.NamedSharding(mesh, S.P()))
    got_loss, grads = grad(ps, xs)
    out["time_major"] = {
        "x_spec": str(xs.sharding.spec),
        "x_shard_shape": list(xs.addressable_shards[0].data.shape),
        **compare((ref_grads, [float(ref_loss)]), (grads, [float(got_loss)])),
        "grad_scale": max(float(np.max(np.abs(np.asarray(a)))) for a in jax.tree.leaves(ref_grads)),
    }


def scenario_explicit_axes(out):
    """``Linear``s on ``[16, 4, 8]`` inputs, their batch split over a mesh of 8
    ``Explicit`` axes (``jax.make_mesh``'s default): the output keeps the split, and
    loss and gradients equal one device's (JAX asks the weight gradient's contraction
    over the split batch for its output sharding)."""
    import purelayers.layers as L

    model = L.Sequential(L.Linear(12), L.GELU(), L.Linear(8, transposed=True))
    params = model.init(jax.random.key(3), (16, 4, 8))
    x = jax.random.normal(jax.random.key(4), (16, 4, 8))

    def loss(p, x):
        return jnp.sum(jnp.tanh(model.apply(p, x)))

    ref_loss, ref_grads = jax.jit(jax.value_and_grad(loss))(params, x)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, S.NamedSharding(mesh, S.P("data")))
        y = jax.jit(model.apply)(params, xs)
        got_loss, grads = jax.jit(jax.value_and_grad(loss))(params, xs)
    out["explicit_axes"] = {
        "y_spec": str(y.sharding.spec),
        "y_type": str(jax.typeof(y)),
        **compare((ref_grads, [float(ref_loss)]), (grads, [float(got_loss)])),
        "grad_scale": max(float(np.max(np.abs(np.asarray(a)))) for a in jax.tree.leaves(ref_grads)),
    }


def main(path: str) -> None:
    out: dict = {"devices": jax.device_count()}
    scenario_training(out)
    scenario_init(out)
    scenario_checkpoint(out)
    scenario_grouped_qkv(out)
    scenario_grouped_attention(out)
    scenario_time_major(out)
    scenario_explicit_axes(out)
    Path(path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
