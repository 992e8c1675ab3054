"""purelayers.sharding: rules to specs and their errors (in this process), and sharded
training, init and checkpoints on 8 host devices (one subprocess, see
tests/sharding_scenarios.py, since the device count is fixed when JAX starts)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy as safetensors_numpy
from jax.sharding import AbstractMesh

import purelayers as pl
import purelayers.sharding as S
from purelayers import layers as L

SCRIPT = Path(__file__).with_name("sharding_scenarios.py")
MESH = AbstractMesh((2, 4), ("data", "model"))


def sds(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


TREE = {
    "blocks": {
        "0": {"fc": {"weight": sds(64, 16), "bias": sds(64)}, "ln1": {"weight": sds(16)}},
        "1": {"fc": {"weight": sds(64, 16), "bias": sds(64)}, "ln1": {"weight": sds(16)}},
    },
    "head": {"weight": sds(10, 16)},
}


# -- rules, in this process -----------------------------------------------------------


def test_first_matching_rule_wins_globs_cross_dots_and_regex_matches_whole_name():
    rules = [
        ("re:blocks\\.1\\..*", S.P()),
        ("*.fc.weight", S.P("model", None)),
        ("*fc.bias", S.P("model")),
    ]
    specs = pl.params.flatten(S.partition_specs(TREE, rules, MESH, default=S.P()))
    assert specs["blocks.0.fc.weight"] == S.P("model", None)
    assert specs["blocks.0.fc.bias"] == S.P("model")
    assert specs["blocks.1.fc.weight"] == S.P()  # the regex rule came first
    assert specs["head.weight"] == S.P()  # the default


def test_named_shardings_wrap_specs_on_the_mesh():
    mesh = S.make_mesh("data=1")
    out = S.named_shardings({"w": jnp.zeros((4, 2))}, [("w", S.P("data"))], mesh)
    assert out["w"] == S.NamedSharding(mesh, S.P("data"))


def test_axis_that_does_not_divide_names_parameter_shape_rule_axis_and_size():
    mesh = AbstractMesh((2, 3), ("data", "model"))
    with pytest.raises(
        ValueError,
        match=r"'blocks\.0\.fc\.weight' with shape \(64, 16\): rule 'blocks\.\*\.fc\.weight' "
        r"-> P\('model', None\) splits axis 0 \(size 64\) over mesh axis 'model' of size 3, "
        r"which does not divide 64\n  use a mesh where the size of mesh axis 'model' divides 64",
    ):
        tree = {"blocks": {"0": {"fc": {"weight": sds(64, 16)}}}}
        S.partition_specs(tree, S.transformer_block("blocks.*"), mesh)


def test_tuple_of_mesh_axes_multiplies_their_sizes():
    with pytest.raises(ValueError, match=r"over mesh axes \('data', 'model'\) of size 8"):
        S.partition_specs({"w": sds(12)}, [("w", S.P(("data", "model")))], MESH)


def test_unmatched_name_without_default_is_an_error():
    with pytest.raises(
        ValueError, match=r"(?s)no rule matches 'head\.weight' with shape \(10, 16\).*default=P\(\)"
    ):
        S.partition_specs(TREE, [("blocks.*", S.P())], MESH)


def test_rules_that_tell_stacked_blocks_apart_are_an_error():
    """A ``Repeat``'s blocks are one array per name, so one spec: a rule naming one block
    (applied to every block, or to none, had it been read from one block's name) raises,
    naming each block's spec; rules every block agrees on split the stack's inner axes."""
    model = L.Sequential({"blocks": L.Repeat(L.Sequential({"fc": L.Linear(8)}), 3)})
    tree = pl.params.abstract(model, (2, 8))
    for rule in ("blocks.1.fc.weight", "blocks.0.fc.weight"):
        with pytest.raises(
            ValueError,
            match=r"sharding: the blocks of the stacked array 'blocks\.\{0\.\.2\}\.fc\.weight' get "
            r"different specs:\n  P\((?:'model',)?\): blocks\.[0-2]\.fc\.weight",
        ):
            S.partition_specs(tree, [(rule, S.P("model")), ("*", S.P())], MESH)
    specs = S.partition_specs(tree, [("blocks.*.fc.weight", S.P("model")), ("*", S.P())], MESH)
    assert specs["blocks"]["fc"]["weight"] == S.P(None, "model")
    assert specs["blocks"]["fc"]["bias"] == S.P(None)


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ([("*", S.P("expert"))], r"names mesh axis 'expert', but the mesh has axes"),
        ([("*", S.P(None, None, "model"))], r"has 3 entries, but the array has 2 axes"),
        ([("*", S.P("model", "model"))], r"uses mesh axis 'model' twice"),
        ([("*", "model")], r"rules\[0\] must be \(pattern: str, PartitionSpec"),
        ([("re:(", S.P())], r"rules\[0\] pattern 're:\('"),
        ("*", r"rules must be a list of \(pattern, spec\) pairs"),
    ],
)
def test_bad_rules_are_named(rules, message):
    with pytest.raises(ValueError, match=message):
        S.partition_specs({"w": sds(8, 8)}, rules, MESH)


def test_fsdp_splits_largest_divisible_axis_and_replicates_small_or_indivisible():
    tree = {"a": sds(8, 64), "b": sds(65, 12), "c": sds(7, 9), "d": sds(4, 4), "e": sds(64, 64)}
    specs = S.partition_specs(tree, S.fsdp("model", min_size=64), MESH)
    assert specs == {
        "a": S.P(None, "model"),
        "b": S.P(None, "model"),  # 65 does not divide by 4, 12 does
        "c": S.P(),  # nothing divides
        "d": S.P(),  # below min_size
        "e": S.P("model"),  # a tie goes to the first axis
    }
    with pytest.raises(ValueError, match="names mesh axis 'fsdp'"):
        S.partition_specs(tree, S.fsdp(), MESH)


def test_megatron_rule_sets():
    assert S.linear_pair("a", "b") == [
        ("a.weight", S.P("model", None)),
        ("a.bias", S.P("model")),
        ("b.weight", S.P(None, "model")),
        ("b.bias", S.P()),
    ]
    assert S.data_parallel() == [("*", S.P())]
    assert S.batch_sharding(S.make_mesh("data=1")).spec == S.P("data")


def test_batch_sharding_splits_the_named_axis():
    mesh = S.make_mesh("data=1")
    assert S.batch_sharding(mesh, axis=1).spec == S.P(None, "data")
    assert S.batch_sharding(mesh, ("data",), axis=2).spec == S.P(None, None, ("data",))
    for bad in (-1, 1.0, True):
        with pytest.raises(ValueError, match="batch_sharding: axis must be an int >= 0"):
            S.batch_sharding(mesh, axis=bad)


def test_transformer_block_rules_cover_every_parameter_of_a_block():
    block = L.TransformerBlock(4)
    params = jax.eval_shape(lambda k: block.init(k, (2, 8, 32)), jax.random.key(0))
    specs = pl.params.flatten(S.partition_specs(params, S.transformer_block(""), MESH))
    nested = S.partition_specs({"blocks": {"3": params}}, S.transformer_block("blocks.*"), MESH)
    assert pl.params.flatten(nested) == {f"blocks.3.{k}": v for k, v in specs.items()}
    assert specs["attn.qkv.weight"] == S.P("model", None)
    assert specs["attn.out.weight"] == S.P(None, "model")
    assert specs["fc.weight"] == S.P("model", None)
    assert specs["proj.weight"] == S.P(None, "model")
    assert specs["proj.bias"] == specs["ln1.weight"] == S.P()


@pytest.mark.parametrize(
    "attn",
    [
        L.Attention.build(32, 4, bias=True),
        L.InProjAttention(4),
        L.InProjAttention(4, add_bias_kv=True),
        L.InProjAttention(4, kdim=16, vdim=8),
    ],
    ids=["attention", "in-proj", "in-proj-bias-kv", "in-proj-kdim"],
)
def test_attention_rules_split_every_attention_class_by_heads(attn):
    """``S.attention`` (and so ``S.transformer_block``, whose ``attn=`` takes any of the
    attention classes) splits each class by heads: every projection weight sharded
    (query/key/value rows, output columns), only ``bias_k``/``bias_v`` and the output
    bias replicated. Before, those names fell through to a ``("*", P())`` catch-all:
    attention replicated, silently."""
    params = jax.eval_shape(lambda k: attn.init(k, (2, 8, 32)), jax.random.key(0))
    rules = [*S.attention("blocks.*.attn"), ("*", S.P())]
    tree = {"blocks": {"0": {"attn": params}}}
    specs = pl.params.flatten(S.partition_specs(tree, rules, MESH))
    specs = {k.removeprefix("blocks.0.attn."): v for k, v in specs.items()}
    replicated = {k for k, v in specs.items() if v == S.P()}
    assert replicated <= {"o_proj.bias", "out_proj.bias", "bias_k", "bias_v"}, specs
    for name, spec in specs.items():
        if name.endswith("weight") and name.startswith(("o_proj", "out_proj")):
            assert spec == S.P(None, "model"), name
        elif name.endswith("weight"):
            assert spec == S.P("model", None), name
    if not isinstance(attn, L.InProjAttention) or attn.kdim is None:
        block = L.TransformerBlock(4, attn=attn)
        params = jax.eval_shape(lambda k: block.init(k, (2, 8, 32)), jax.random.key(0))
        got = S.partition_specs(params, [*S.transformer_block(""), ("*", S.P())], MESH)
        assert {k[5:]: v for k, v in pl.params.flatten(got).items() if k[:5] == "attn."} == specs


def test_make_mesh_parses_axes_and_reports_mistakes():
    mesh = S.make_mesh("data=1, model=1")
    assert dict(mesh.shape) == {"data": 1, "model": 1}
    with pytest.raises(ValueError, match=r"cannot read 'model:4'"):
        S.make_mesh("data=1,model:4")
    with pytest.raises(ValueError, match=r"needs 64 devices, but 1 are available"):
        S.make_mesh({"data": 8, "model": 8})
    with pytest.raises(ValueError, match=r"positive sizes"):
        S.make_mesh({"data": 0})


def test_optimizer_shardings_follow_parameter_names():
    mesh = S.make_mesh("data=1")
    params = {"w": jnp.zeros((4, 2)), "b": jnp.zeros(4)}
    sh = {"w": S.NamedSharding(mesh, S.P("data")), "b": S.NamedSharding(mesh, S.P())}
    import optax

    state = jax.eval_shape(optax.adam(1e-3).init, params)
    out = S.optimizer_shardings(state, sh)
    assert out[0].mu["w"] == sh["w"] and out[0].nu["w"] == sh["w"]
    assert out[0].count == S.NamedSharding(mesh, S.P())


def test_optimizer_shardings_replicate_statistics_their_parameter_spec_does_not_fit():
    """Adafactor keeps factored statistics under a parameter's name but of another
    shape (``v_row`` ``(64,)`` for a ``(64, 16)`` weight, ``(1,)`` placeholders): they
    are replicated where the parameter's spec does not fit them (more entries than
    axes, or an axis the mesh does not divide), and the README's recipe,
    ``jax.jit(opt.init, out_shardings=...)``, runs (before: JAX's incompatible
    sharding error)."""
    import optax

    params = {"w": jnp.zeros((64, 16)), "b": jnp.zeros(64)}
    opt = optax.adafactor(1e-3, min_dim_size_to_factor=8)
    state = jax.eval_shape(opt.init, params)
    mesh = AbstractMesh((4,), ("data",))
    sh = {"w": S.NamedSharding(mesh, S.P("data", None)), "b": S.NamedSharding(mesh, S.P("data"))}
    out = S.optimizer_shardings(state, sh)
    leaves = jax.tree_util.tree_leaves_with_path(state)
    for (path, leaf), got in zip(leaves, jax.tree.leaves(out), strict=True):
        name = jax.tree_util.keystr(path)
        want = S.NamedSharding(mesh, S.P())
        if leaf.shape == (64, 16):
            want = sh["w"]
        elif leaf.shape == (64,) and name.endswith("['b']"):
            want = sh["b"]  # the bias's unfactored statistic: its parameter's shape
        assert got == want, (name, leaf.shape, got)
    assert {leaf.shape for leaf in jax.tree.leaves(state)} >= {(1,), (64,), (16,)}
    one = S.make_mesh("data=1")
    sh = {"w": S.NamedSharding(one, S.P("data", None)), "b": S.NamedSharding(one, S.P("data"))}
    placed = jax.jit(opt.init, out_shardings=S.optimizer_shardings(state, sh))(params)
    assert jax.tree.structure(placed) == jax.tree.structure(state)


# -- q/k/v rows in head-group order ---------------------------------------------------


@pytest.mark.parametrize(("heads", "kv_heads", "groups"), [(4, None, 2), (8, 2, 2), (4, 4, 4)])
def test_group_qkv_puts_matching_heads_in_each_row_block(heads, kv_heads, groups):
    """Rows of head h: q at h*d.., k at (H + j)*d.., v at (H + K + j)*d.. (d = head_dim 3).
    Block g of the grouped rows must hold q heads g*H/G.. and the k, v heads they use."""
    kv = heads if kv_heads is None else kv_heads
    d = 3
    rows = np.arange((heads + 2 * kv) * d)
    grouped = np.asarray(S.group_qkv(rows, heads, kv_heads, groups=groups))
    for g, block in enumerate(np.split(grouped, groups)):
        qh = range(g * heads // groups, (g + 1) * heads // groups)
        kh = range(g * kv // groups, (g + 1) * kv // groups)
        want = [r for h in qh for r in range(h * d, (h + 1) * d)]
        want += [r for h in kh for r in range((heads + h) * d, (heads + h + 1) * d)]
        want += [r for h in kh for r in range((heads + kv + h) * d, (heads + kv + h + 1) * d)]
        assert block.tolist() == want
    w = jnp.asarray(np.random.default_rng(0).normal(size=(len(rows), 5)))
    back = S.ungroup_qkv(
        S.group_qkv(w, heads, kv_heads, groups=groups), heads, kv_heads, groups=groups
    )
    np.testing.assert_array_equal(back, w)


def test_group_rows_for_a_packed_gate_and_up_projection():
    w = np.arange(8)  # [gate 0..3 | up 4..7]
    grouped = np.asarray(S.group_rows(w, [4, 4], groups=2))
    assert grouped.tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    np.testing.assert_array_equal(S.ungroup_rows(grouped, [4, 4], groups=2), w)
    with pytest.raises(
        ValueError, match=r"expected 8 rows \(parts of \[4, 4\]\), got shape \(9,\)"
    ):
        S.group_rows(np.arange(9), [4, 4], groups=2)
    with pytest.raises(ValueError, match=r"a part of 3 rows does not divide by groups=2"):
        S.group_rows(np.arange(6), [3, 3], groups=2)


def test_group_qkv_errors():
    with pytest.raises(ValueError, match=r"num_kv_heads=2 must divide by groups=4"):
        S.group_qkv(np.zeros(8 * 12), 8, 2, groups=4)
    with pytest.raises(ValueError, match=r"13 rows are not \(num_heads \+ 2 \* num_kv_heads\)"):
        S.group_qkv(np.zeros(13), 2, groups=2)


# -- checkpoints in this process (one device) -----------------------------------------


def test_load_sharded_matches_names_and_shapes_like_load_into(tmp_path):
    mesh = S.make_mesh("data=1")
    params = {"a": {"weight": jnp.arange(6.0).reshape(3, 2)}, "n": jnp.ones(4, jnp.bfloat16)}
    path = pl.params.save(tmp_path / "m.safetensors", params)
    sh = S.named_shardings(params, [("*", S.P("data"))], mesh)
    got = S.load_sharded(path, jax.eval_shape(lambda: params), sh)
    np.testing.assert_array_equal(got["a"]["weight"], params["a"]["weight"])
    assert got["n"].dtype == jnp.bfloat16 and got["a"]["weight"].sharding == sh["a"]["weight"]
    bigger = {**params, "extra": jnp.zeros(2)}
    bigger_sh = {**sh, "extra": S.NamedSharding(mesh, S.P())}
    with pytest.raises(KeyError, match=r"missing keys: \['extra'\]; unexpected keys: \[\]"):
        S.load_sharded(path, bigger, bigger_sh)
    kept = S.load_sharded(path, bigger, bigger_sh, strict=False)
    np.testing.assert_array_equal(kept["extra"], np.zeros(2))
    wrong = {**params, "n": jnp.ones(5, jnp.bfloat16)}
    with pytest.raises(ValueError, match=r"shape mismatch for n: expected \(5,\), got \(4,\)"):
        S.load_sharded(path, wrong, sh)
    with pytest.raises(ValueError, match=r"without a sharding: \['n'\]"):
        S.load_sharded(path, params, {"a": sh["a"]})


def test_load_sharded_reports_a_truncated_file(tmp_path):
    mesh = S.make_mesh("data=1")
    params = {"w": jnp.ones((4, 4))}
    path = pl.params.save(tmp_path / "m.safetensors", params)
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    sh = S.named_shardings(params, S.data_parallel(), mesh)
    with pytest.raises(pl.params.CheckpointError, match=r"m\.safetensors: truncated"):
        S.load_sharded(path, params, sh)


# -- 8 host devices, in a subprocess --------------------------------------------------


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    """The script's results, computed once per test run: under xdist the first worker
    to get here runs it and the others read its file (xdist's documented pattern)."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above the per-worker ones
    out = shared / "sharding_scenarios.json"
    with FileLock(str(out) + ".lock"):
        if not out.is_file():
            run = subprocess.run(
                [sys.executable, str(SCRIPT), str(out)],
                capture_output=True, text=True, timeout=900,
            )  # fmt: skip
            if run.returncode:
                pytest.fail(f"scenario script failed:\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}")
        return json.loads(out.read_text())


@pytest.mark.parametrize("name", ["data_parallel", "fsdp", "tensor_parallel"])
def test_ten_sharded_steps_match_one_device(scenarios, name):
    assert scenarios["devices"] == 8
    got = scenarios[name]
    assert got["loss_diff"] < 1e-5, got["losses"]
    assert got["param_diff"] < 1e-5
    assert got["shardings_kept"]
    ref = scenarios["reference_losses"]
    assert ref[-1] < ref[0]  # it trains


def test_time_major_batch_splits_along_its_second_axis(scenarios):
    """``batch_sharding(mesh, axis=1)`` on an LSTM's ``(T, B, I)`` input: each of the 8
    devices holds ``(6, 2, 8)``, and loss and gradients equal one device's."""
    tm = scenarios["time_major"]
    assert tm["x_spec"] == "P(None, 'data')"
    assert tm["x_shard_shape"] == [6, 2, 8]
    assert tm["loss_diff"] < 1e-4
    assert tm["param_diff"] < 1e-5 * max(tm["grad_scale"], 1.0)  # compare()'s name; gradients here


def test_linear_under_explicit_mesh_axes_keeps_the_batch_split(scenarios):
    """Under a mesh of ``Explicit`` axes a ``[16, 4, 8]`` batch split 8 ways stays split
    through two ``Linear``s (``[2, 4, 8]`` a device), and loss and gradients equal one
    device's."""
    ex = scenarios["explicit_axes"]
    assert ex["y_spec"] == "P('data', None, None)"
    assert ex["y_type"] == "float32[16@data,4,8]"
    assert ex["loss_diff"] < 1e-4
    assert ex["param_diff"] < 1e-6 * ex["grad_scale"]  # compare()'s name; gradients here


def test_rule_sets_split_what_they_should(scenarios):
    dp = scenarios["data_parallel"]["specs"]
    assert set(dp.values()) == {"P()"}
    fsdp = scenarios["fsdp"]["specs"]
    assert fsdp["blocks.0.fc.weight"] == "P('fsdp',)"
    assert fsdp["blocks.0.proj.weight"] == "P(None, 'fsdp')"
    assert fsdp["blocks.0.ln1.weight"] == "P()"  # below min_size
    tp = scenarios["tensor_parallel"]["specs"]
    assert tp["blocks.0.attn.qkv.weight"] == tp["blocks.1.attn.qkv.weight"] == "P('model', None)"
    assert tp["blocks.0.fc.bias"] == "P('model',)"
    assert tp["blocks.0.proj.weight"] == "P(None, 'model')"
    assert tp["embed.weight"] == tp["head.weight"] == tp["pos_emb"] == "P()"


def test_tensor_parallel_step_all_reduces_row_parallel_outputs_and_gathers_no_weight(scenarios):
    tp = scenarios["tensor_parallel"]
    ops = [tuple(c) for c in tp["collectives"]]
    # [local batch 8/2, seq 8, embed 32]: the partial sums of attn.out and proj
    assert ops.count(("all-reduce", "f32[4,8,32]")) >= 2, ops
    split = [
        tp["weight_shapes"][k]
        for k, spec in tp["specs"].items()
        if spec != "P()" and k.endswith("weight")
    ]
    assert len(split) == 8  # qkv, out, fc, proj in two blocks
    gathered = [shape for op, shape in ops if op == "all-gather"]
    for a, b in split:  # neither a whole weight nor the stack of every block's copy
        assert not [g for g in gathered if g == f"f32[{a},{b}]" or g.endswith(f",{a},{b}]")], ops


def test_sharded_init_is_born_sharded(scenarios):
    init = scenarios["init"]
    assert init["jit_given_out_shardings"]
    assert init["shardings_equal"]
    assert init["shard_shapes_local"]
    assert {"blocks.0.fc.weight", "blocks.0.attn.qkv.weight", "blocks.0.proj.weight"} <= set(
        init["sharded_names"]
    )
    assert init["max_diff_unsharded_init"] < 1e-7
    local = {f"f32[{','.join(map(str, s))}]" for s in init["local_shapes"].values()}
    whole = {f"f32[{','.join(map(str, init['full_shapes'][k]))}]" for k in init["sharded_names"]}
    # No buffer in the compiled init program has a split array's whole shape.
    assert not (whole - local) & set(init["hlo_shapes"]), init["hlo_shapes"]


def test_sharded_checkpoint_round_trips(scenarios):
    ck = scenarios["checkpoint"]
    for case in ("file_same_mesh", "index_same_mesh", "index_other_mesh"):
        assert ck[case] == {"values_equal": True, "shardings_equal": True}, case
    assert ck["index_files"] > 1
    assert ck["plain_load_equal"]
    assert ck["split_saved"] and not ck["host_copy_kept"]


def test_grouped_qkv_rows_on_devices(scenarios):
    got = scenarios["grouped_qkv"]
    heads, kv, d = got["heads"], got["kv_heads"], got["head_dim"]
    for g, rows in got["rows_per_device"].items():
        g = int(g)
        q = list(range(g * 2 * d, (g + 1) * 2 * d))  # two query heads per device
        k = list(range((heads + g) * d, (heads + g + 1) * d))
        v = list(range((heads + kv + g) * d, (heads + kv + g + 1) * d))
        assert rows == q + k + v


def test_grouped_qkv_order_makes_the_head_split_communication_free(scenarios):
    """With rows in head-group order, attention reads each device's q, k and v heads
    where they are: forward and backward need only the all-reduce after ``out``. In
    torch's order XLA must move q/k/v activations between devices (the same loss)."""
    got = scenarios["grouped_attention"]
    assert got["same_output"] < 1e-5
    assert {op for op, _ in got["grouped"]["collectives"]} == {"all-reduce"}
    assert got["grouped"]["loss"] == pytest.approx(got["torch_order"]["loss"], rel=1e-5)


def test_load_sharded_tied_and_stacked_checkpoints(tmp_path):
    """A tied alias in the file (as torch writes it) and a Repeat's per-block names both
    load onto shardings, into the stacked, untied tree."""
    model = L.Tied(
        L.Sequential(
            {
                "wte": L.Embedding(11, 8),
                "blocks": L.Repeat(L.Sequential(L.Linear(8), L.Tanh()), 3),
                "head": L.Linear(11, bias=False),
            }
        ),
        {"head.weight": "wte.weight"},
    )
    params = model.init(jax.random.key(0), (2, 4))
    path = pl.params.save(tmp_path / "m.safetensors", params, model=model, write_aliases=True)
    assert "head.weight" in pl.params.load(path) and "blocks.2.0.bias" in pl.params.load(path)
    mesh = S.make_mesh("data=1")
    sh = S.named_shardings(params, [("*", S.P())], mesh)
    abstract = jax.eval_shape(lambda: params)
    # The file records its tied names, so it loads with or without the model; the same
    # arrays in a file that does not record them (as torch writes one) need the model.
    for got in (
        S.load_sharded(path, abstract, sh),
        S.load_sharded(path, abstract, sh, model=model),
    ):
        assert isinstance(got["blocks"], pl.params.Stacked)
        jax.tree.map(np.testing.assert_array_equal, got, params)
    bare = tmp_path / "bare.safetensors"
    safetensors_numpy.save_file({k: np.asarray(v) for k, v in pl.params.load(path).items()}, bare)
    with pytest.raises(KeyError, match=r"unexpected keys: \['head\.weight'\]"):
        S.load_sharded(bare, abstract, sh)
    got = S.load_sharded(bare, abstract, sh, model=model)
    jax.tree.map(np.testing.assert_array_equal, got, params)
    ids = jnp.arange(8).reshape(2, 4) % 11
    np.testing.assert_array_equal(model.apply(got, ids), model.apply(params, ids))
    # A file whose alias disagrees with its original loads nothing.
    flat = {k: np.asarray(v) for k, v in pl.params.load(path).items()}
    flat["head.weight"] = flat["head.weight"] + 1.0
    bad = tmp_path / "bad.safetensors"
    pl.params.save(bad, pl.params.unflatten(flat))
    with pytest.raises(ValueError, match=r"'head\.weight' is tied to 'wte\.weight'"):
        S.load_sharded(bad, abstract, sh, model=model)
