"""Composition (second round): named Sequential, weight tying (Tied), stacked blocks
(Repeat), the attention variants over one core, and Linear(transposed=True), each against
torch with every torch parameter and buffer randomized (default inits hide mapping
mistakes: zeros biases, ones norm weights)."""

import copy
import json
from collections import OrderedDict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L
from purelayers import params as P
from tests import twins
from tests.composites import Residual
from tests.twins import load_from_torch

TOL = {"rtol": 1e-4, "atol": 1e-4}


def _randomize(torch, module, seed=0):
    """Every parameter N(0, 0.5^2); BatchNorm buffers random too (positive variances)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            torch.nn.init.normal_(p, std=0.5)
        for name, b in module.named_buffers():
            if name.endswith("running_mean"):
                b.normal_(std=0.5)
            elif name.endswith("running_var"):
                b.uniform_(0.5, 1.5)
            elif name.endswith("num_batches_tracked"):
                b.fill_(3)
    return module


def _rand(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _load_split(params_t, state_t, sd):
    """params and state filled by name from one torch state_dict (strict on each part)."""
    pick = lambda t: {k: sd[k] for k in P.flatten(t)}  # noqa: E731
    return P.load_state_dict(params_t, pick(params_t)), P.load_state_dict(state_t, pick(state_t))


def _assert_buffers_equal(state, module):
    sd = module.state_dict()
    flat = P.flatten(state)
    assert list(flat) == [k for k in sd if k in flat]
    for name, value in flat.items():
        np.testing.assert_allclose(np.asarray(value), sd[name].numpy(), **TOL, err_msg=name)


# -- 1. named Sequential --------------------------------------------------------------------


def test_named_sequential_cnn_matches_torch(torch):
    nn = torch.nn
    names = ("conv", "bn", "relu", "pool", "flat", "fc")
    tm = nn.Sequential(
        OrderedDict(
            zip(
                names,
                [
                    nn.Conv2d(3, 4, 3, padding=1),
                    nn.BatchNorm2d(4),
                    nn.ReLU(),
                    nn.MaxPool2d(2),
                    nn.Flatten(),
                    nn.Linear(4 * 3 * 3, 5),
                ],
                strict=True,
            )
        )
    )
    _randomize(torch, tm)
    layers = [L.Conv2d(4, 3, padding=1), L.BatchNorm2d(), L.ReLU(), L.MaxPool2d(2)]
    model = L.Sequential(dict(zip(names, [*layers, L.Flatten(), L.Linear(5)], strict=True)))
    assert model["bn"] == L.BatchNorm2d() and model[5] == L.Linear(5)
    shape = (4, 3, 6, 6)
    params_t, state_t = model.init(jax.random.key(0), shape), model.init_state(shape)
    assert list(P.flatten(P.merge(params_t, state_t))) == list(tm.state_dict())
    assert "bn.num_batches_tracked" in P.flatten(state_t)
    params, state = _load_split(params_t, state_t, tm.state_dict())
    x = _rand(0, *shape)

    # eval mode: running statistics, outputs and gradients (input + every parameter)
    tm_eval = copy.deepcopy(tm).eval()
    evaluate = jax.jit(lambda p, x: model.apply(p, x, state=state)[0])
    pl.testing.assert_matches_torch(model, tm_eval, x, params=params, apply=evaluate, **TOL)

    # train mode: batch statistics; the updated buffers after one step equal torch's
    tm_train = copy.deepcopy(tm).train()
    step = jax.jit(lambda p, x: model.apply(p, x, state=state, train=True))
    pl.testing.assert_matches_torch(
        model, tm_train, x, params=params, apply=lambda p, x: step(p, x)[0], train=True, **TOL
    )
    _, new_state = step(params, jnp.asarray(x))  # one torch forward above: one update
    assert int(P.flatten(new_state)["bn.num_batches_tracked"]) == 4
    _assert_buffers_equal(model.ordered(new_state), tm_train)  # jit sorts dict keys


# -- 2. tying ---------------------------------------------------------------------------------

V, E, B, T = 11, 8, 2, 5


def _tied_lm():
    body = {
        "wte": L.Embedding(V, E),
        "block": L.TransformerBlock(2),
        "lm_head": L.Linear(V, bias=False),
    }
    return L.Tied(L.Sequential(body), {"lm_head.weight": "wte.weight"})


def _torch_tied_lm(torch, seed=0):
    nn = torch.nn

    class TiedLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, E)
            self.block = twins.block(torch, E, 2)
            self.lm_head = nn.Linear(E, V, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, ids):
            return self.lm_head(self.block(self.wte(ids)))

    return _randomize(torch, TiedLM(), seed)


def _ids(seed=0):
    return np.random.default_rng(seed).integers(0, V, (B, T)).astype(np.int32)


def _loss(model, cot):
    return lambda p, ids: jnp.sum(model.apply(p, ids) * cot)


def test_tied_lm_matches_torch_and_loads_with_or_without_alias(torch):
    tm, lm = _torch_tied_lm(torch), _tied_lm()
    sd = tm.state_dict()
    assert "wte.weight" in sd and "lm_head.weight" in sd
    assert lm.aliases() == {"lm_head.weight": "wte.weight"}
    outer = L.Sequential({"lm": lm})
    assert outer.aliases() == {"lm.lm_head.weight": "lm.wte.weight"}
    template = lm.init(jax.random.key(0), (B, T))
    assert list(P.flatten(template)) == [k for k in sd if k != "lm_head.weight"]
    assert len(jax.tree.leaves(template)) == len(sd) - 1  # one leaf for the tied array

    params = P.load_state_dict(template, sd, model=lm)  # strict, alias present
    without = P.load_state_dict(template, {k: v for k, v in sd.items() if k != "lm_head.weight"})
    alias_only = {k: v for k, v in sd.items() if k != "wte.weight"}
    from_alias = P.load_state_dict(template, alias_only, model=lm)
    for other in (without, from_alias):
        jax.tree.map(np.testing.assert_array_equal, other, params)
    np.testing.assert_array_equal(params["wte"]["weight"], sd["wte.weight"].numpy())

    # logits, and gradients: wte.weight's is the sum over both uses (torch's .grad of the
    # shared Parameter); named_parameters() lists the tied weight once, as our tree does
    assert "lm_head.weight" not in dict(tm.named_parameters())
    pl.testing.assert_matches_torch(lm, tm, _ids(), params=params, apply=jax.jit(lm.apply), **TOL)

    # one optax adam step equals one torch Adam step: the tied array moves once
    optax = pytest.importorskip("optax")
    cot = _rand(1, B, T, V)
    opt = optax.adam(1e-2)

    @jax.jit  # the gradient and the step in one program
    def adam_step(params, ids):
        grads = jax.grad(_loss(lm, cot))(params, ids)
        updates, _ = opt.update(grads, opt.init(params), params)
        return optax.apply_updates(params, updates)

    stepped = adam_step(params, jnp.asarray(_ids()))
    tm.zero_grad(set_to_none=True)
    (tm(torch.tensor(_ids(), dtype=torch.long)) * torch.tensor(cot)).sum().backward()
    torch.optim.Adam(tm.parameters(), lr=1e-2).step()
    after, t_grads = tm.state_dict(), {k: p.grad.numpy() for k, p in tm.named_parameters()}
    # Adam divides by |g|: entries whose gradient is rounding noise (the key bias, which
    # softmax ignores) move by +-lr in either; compare where the gradient is real.
    for name, value in P.flatten(stepped).items():
        real = np.abs(t_grads[name]) > 1e-3
        assert name != "wte.weight" or real.all()
        np.testing.assert_allclose(
            np.asarray(value)[real], after[name].numpy()[real], **TOL, err_msg=name
        )
    np.testing.assert_array_equal(after["lm_head.weight"], after["wte.weight"])

    table = P.summary(lm, params)
    row = next(r for r in table.splitlines() if r.startswith("lm_head.weight"))
    assert row.rstrip().endswith("tied to wte.weight"), table
    assert row.split()[1:3] == ["(11,", "8)"], row


def test_tied_save_and_load_files(torch, tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    tm, lm = _torch_tied_lm(torch, seed=1), _tied_lm()
    template = lm.init(jax.random.key(0), (B, T))
    params = P.load_state_dict(template, tm.state_dict(), model=lm)

    plain = P.save(tmp_path / "plain.safetensors", params, model=lm)
    assert list(P.load(plain)) == list(P.flatten(params))  # the original only, as HF
    assert "lm_head.weight" not in P.load(plain)
    back = P.load_into(plain, template, model=lm)
    jax.tree.map(np.testing.assert_array_equal, back, params)

    full = P.save(tmp_path / "full.safetensors", params, model=lm, write_aliases=True)
    flat = safetensors_torch.load_file(full)
    assert set(flat) == set(tm.state_dict())
    np.testing.assert_array_equal(flat["lm_head.weight"], flat["wte.weight"])
    jax.tree.map(np.testing.assert_array_equal, P.load_into(full, template, model=lm), params)
    # The file records which names are aliases, so it reads back without the model too,
    # sharded or not; the record stays out of the user's metadata.
    jax.tree.map(np.testing.assert_array_equal, P.load_into(full, template), params)
    assert P.load_metadata(full) == {"format": "pt"}
    shards = P.save(tmp_path / "shards", params, model=lm, write_aliases=True, max_shard_bytes=256)
    assert "lm_head.weight" in P.load(shards)
    jax.tree.map(np.testing.assert_array_equal, P.load_into(shards, template), params)
    twin = _torch_tied_lm(torch, seed=2)  # other weights, then the file's
    twin.load_state_dict(flat, strict=True)
    assert twin.lm_head.weight is twin.wte.weight
    ids = _ids(3)
    with torch.no_grad():
        want = twin(torch.tensor(ids, dtype=torch.long)).numpy()
    np.testing.assert_allclose(jax.jit(lm.apply)(params, ids), want, **TOL)


def test_tied_alias_that_differs_from_its_original_is_an_error(torch, tmp_path):
    lm = _tied_lm()
    template = lm.init(jax.random.key(0), (B, T))
    before = {k: np.asarray(v).copy() for k, v in P.flatten(template).items()}
    flat = {k: np.asarray(v) + 1.0 for k, v in P.flatten(template).items()}
    flat["lm_head.weight"] = flat["wte.weight"] + 1.0
    pattern = r"'lm_head\.weight'.*'wte\.weight'.*nothing was loaded"
    with pytest.raises(ValueError, match=pattern):
        P.load_state_dict(template, flat, model=lm)
    for name, value in P.flatten(template).items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "bad.safetensors"
    safetensors_numpy.save_file(flat, str(path))
    with pytest.raises(ValueError, match=pattern):
        P.load_into(path, template, model=lm)
    # A file that records the alias (as ``save(..., write_aliases=True)`` writes it) is
    # checked the same way without the model.
    recorded = tmp_path / "recorded.safetensors"
    meta = {"purelayers.aliases": json.dumps({"lm_head.weight": "wte.weight"})}
    safetensors_numpy.save_file(flat, str(recorded), metadata=meta)
    with pytest.raises(ValueError, match=pattern):
        P.load_into(recorded, template)
    with pytest.raises(KeyError, match=r"unexpected keys: \['lm_head\.weight'\]"):
        P.load_into(path, template)  # nothing tells the file's alias from a stray name


def test_a_tied_alias_holding_nans_equal_to_its_original_loads(tmp_path):
    """A diverged run's checkpoint (a NaN in the tied embedding), saved with its alias:
    the alias holds the original's very values, NaN included, so it loads from a file
    (one-piece and sharded) and from a state dict, as torch's strict load takes it
    (before: refused as two different values, since NaN != NaN)."""
    lm = _tied_lm()
    template = lm.init(jax.random.key(0), (B, T))
    weight = np.asarray(template["wte"]["weight"]).copy()
    weight[1, 2] = np.nan
    params = {**template, "wte": {"weight": jnp.asarray(weight)}}
    for path in (
        P.save(tmp_path / "nan.safetensors", params, model=lm, write_aliases=True),
        P.save(tmp_path / "shards", params, model=lm, write_aliases=True, max_shard_bytes=256),
    ):
        back = P.load_into(path, template, model=lm)
        np.testing.assert_array_equal(back["wte"]["weight"], weight)
    flat = {k: np.asarray(v) for k, v in P.flatten(params).items()}
    back = P.load_state_dict(template, {**flat, "lm_head.weight": weight.copy()}, model=lm)
    np.testing.assert_array_equal(back["wte"]["weight"], weight)
    weight[1, 3] = np.nan  # a NaN where the original has a number: still different
    with pytest.raises(ValueError, match=r"'lm_head\.weight'.*'wte\.weight'"):
        P.load_state_dict(template, {**flat, "lm_head.weight": weight}, model=lm)


# -- 3. Repeat ---------------------------------------------------------------------------------


def _param_bytes(tree):
    return sum(a.nbytes for a in jax.tree.leaves(tree))


def test_repeat_decode_step_does_not_copy_the_weights():
    model = L.Repeat(L.TransformerBlock(4), 8)
    params = model.init(jax.random.key(0), (1, 1, 128))
    assert isinstance(params, P.Stacked) and params.n == 8
    assert params.tree["ln1"]["weight"].shape == (8, 128)
    x, cache = jnp.ones((1, 1, 128)), model.init_cache((1, 64, 128))
    step = jax.jit(lambda p, x, c: model.apply(p, x, cache=c))
    temp = step.lower(params, x, cache).compile().memory_analysis().temp_size_in_bytes
    weights = _param_bytes(params)
    assert temp < weights / 4, f"decode step temp {temp} B vs params {weights} B"


def _llama_block(e=16):
    attn = L.Attention.build(
        e, 4, num_kv_heads=2, causal=True, rope=L.RotaryEmbedding(), bias=False
    )
    return L.TransformerBlock(
        attn=attn, norm=L.RMSNorm(eps=1e-6), activation=L.SwiGLU(), hidden_dim=24, bias=False
    )


def _decode(apply, params, x, cache, chunks):
    outs, start = [], 0
    for n in chunks:
        y, cache = apply(params, x[:, start : start + n], cache)
        outs.append(y)
        start += n
    return jnp.concatenate(outs, axis=1), cache


def test_repeat_equals_unrolled_sequential_prefill_and_decode():
    block, n, shape = _llama_block(), 3, (2, 6, 16)
    rep = L.Repeat(block, n)
    params = rep.init(jax.random.key(1), shape)
    flat = P.flatten(params)
    assert list(flat)[:2] == ["0.ln1.weight", "0.attn.q_proj.weight"]
    unrolled = P.unflatten(flat)
    seq = L.Sequential(*[block] * n)
    assert list(P.flatten(seq.init(jax.random.key(1), shape))) == list(flat)
    jax.tree.map(np.testing.assert_array_equal, rep.stack(unrolled), params)
    x = jnp.asarray(_rand(2, *shape))
    full = jax.jit(rep.apply)(params, x)
    np.testing.assert_allclose(full, jax.jit(seq.apply)(unrolled, x), rtol=1e-5, atol=1e-5)

    def unrolled_step(p, x, caches):
        new = []
        for i in range(n):
            x, c = block.apply(p[str(i)], x, cache=caches[i])
            new.append(c)
        return x, new

    rep_step = jax.jit(lambda p, x, c: rep.apply(p, x, cache=c))
    ours, cache = _decode(rep_step, params, x, rep.init_cache((2, 8, 16)), [3, 1, 1, 1])
    one = block.init_cache((2, 8, 16))
    theirs, _ = _decode(jax.jit(unrolled_step), unrolled, x, [one] * n, [3, 1, 1, 1])
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours, full, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(cache["length"], [6] * n)


def test_repeat_unstack_gives_each_block_its_slice_in_block_order():
    """Twelve blocks: ``unstack`` (one compiled copy) lists ``"0"`` .. ``"11"`` in block
    order, not the sorted order a compiled function's dict comes back in (``"10"`` before
    ``"2"``), each holding its slice of the stacked arrays; the cache likewise."""
    block, n, shape = _llama_block(), 12, (2, 6, 16)
    rep = L.Repeat(block, n)
    params = rep.init(jax.random.key(3), shape)
    blocks = rep.unstack(params)
    assert list(blocks) == [str(i) for i in range(n)]
    assert set(P.flatten(blocks)) == set(P.flatten(params))
    for i in (0, 2, 10, 11):
        jax.tree.map(
            lambda a, b, i=i: np.testing.assert_array_equal(a, b[i]),
            blocks[str(i)],
            rep._blocks(params, "params"),
        )
    caches = rep.unstack_cache(rep.init_cache((2, 8, 16)))
    assert list(caches) == [str(i) for i in range(n)]


def test_repeat_loads_torch_sequential_of_blocks(torch):
    tm = _randomize(torch, torch.nn.Sequential(*[twins.block(torch, 8, 2) for _ in range(3)]))
    rep = L.Repeat(L.TransformerBlock(2), 3)
    params = load_from_torch(rep, tm, (2, 5, 8))  # asserts names and order equal torch's
    assert list(P.flatten(params))[12] == "1.ln1.weight"
    pl.testing.assert_matches_torch(
        rep, tm, _rand(4, 2, 5, 8), params=params, apply=jax.jit(rep.apply), **TOL
    )


def test_repeat_with_buffers_matches_torch_in_train_mode(torch):
    nn = torch.nn
    tm = _randomize(
        torch, nn.Sequential(*[nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6)) for _ in range(3)])
    )
    rep = L.Repeat(L.Sequential(L.Linear(6), L.BatchNorm1d()), 3)
    shape = (8, 6)
    params_t, state_t = rep.init(jax.random.key(0), shape), rep.init_state(shape)
    assert isinstance(state_t, P.Stacked)
    assert list(P.flatten(P.merge(params_t, state_t))) == list(tm.state_dict())
    assert "0.1.running_mean" in P.flatten(state_t)
    params, state = _load_split(params_t, state_t, tm.state_dict())
    x = _rand(5, *shape)
    tm.train()
    step = jax.jit(lambda p, x: rep.apply(p, x, state=state, train=True))
    pl.testing.assert_matches_torch(
        rep, tm, x, params=params, apply=lambda p, x: step(p, x)[0], train=True, **TOL
    )
    _, new_state = step(params, jnp.asarray(x))
    assert isinstance(new_state, P.Stacked)
    _assert_buffers_equal(rep.ordered(new_state), tm)  # jit sorts dict keys
    np.testing.assert_array_equal(new_state.tree["1"]["num_batches_tracked"], [4, 4, 4])
    # eval mode uses the running statistics (both updated once by the train step)
    tm.eval()
    with torch.no_grad():
        want = tm(torch.tensor(x)).numpy()
    np.testing.assert_allclose(rep.apply(params, x, state=new_state)[0], want, **TOL)


def test_repeat_remat_equals_plain_with_cache_and_grad():
    block, shape = _llama_block(), (2, 6, 16)
    plain, remat = L.Repeat(block, 3), L.Repeat(block, 3, remat=True)
    params = plain.init(jax.random.key(3), shape)
    x, cot = jnp.asarray(_rand(6, *shape)), jnp.asarray(_rand(7, *shape))
    cache0 = plain.init_cache((2, 8, 16))
    assert jax.tree.map(jnp.shape, remat.init_cache((2, 8, 16))) == jax.tree.map(jnp.shape, cache0)

    def loss(model):
        def f(p, x):
            y, c = model.apply(p, x[:, :4], cache=cache0)
            y2, _ = model.apply(p, x[:, 4:], cache=c)
            return jnp.sum(jnp.concatenate([y, y2], axis=1) * cot)

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))

    (v0, g0), (v1, g1) = loss(plain)(params, x), loss(remat)(params, x)
    np.testing.assert_allclose(v1, v0, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    full = jax.jit(jax.grad(lambda p: jnp.sum(plain.apply(p, x) * cot)))(params)
    for a, b in zip(jax.tree.leaves(g0[0]), jax.tree.leaves(full), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


# -- 4. attention variants vs torch's scaled_dot_product_attention ------------------------------

AE, AH, AKV, AT = 16, 4, 2, 5


def _torch_attention(torch, kind, hd, theta):
    """GQA + RoPE causal attention written in torch with our names: ``fused`` (``qkv``,
    ``out``), ``separate`` (``q_proj``/``k_proj``/``v_proj`` with bias, ``o_proj``
    without) or ``inproj`` (``in_proj_weight``/``in_proj_bias``, ``out_proj``)."""
    nn, F = torch.nn, torch.nn.functional
    h, kv = AH, AKV
    rows = (h + 2 * kv) * hd

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            if kind == "fused":
                self.qkv, self.out = nn.Linear(AE, rows), nn.Linear(h * hd, AE)
            elif kind == "inproj":
                self.in_proj_weight = nn.Parameter(torch.empty(rows, AE))
                self.in_proj_bias = nn.Parameter(torch.empty(rows))
                self.out_proj = nn.Linear(h * hd, AE)
            else:
                self.q_proj = nn.Linear(AE, h * hd)
                self.k_proj = nn.Linear(AE, kv * hd)
                self.v_proj = nn.Linear(AE, kv * hd)
                self.o_proj = nn.Linear(h * hd, AE, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            if kind == "separate":
                q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            else:
                qkv = (
                    self.qkv(x)
                    if kind == "fused"
                    else x @ self.in_proj_weight.T + self.in_proj_bias
                )
                q, k, v = qkv.split([h * hd, kv * hd, kv * hd], -1)
            q = twins.rotate_half(torch, q.reshape(b, t, h, hd).transpose(1, 2), theta)
            k = twins.rotate_half(torch, k.reshape(b, t, kv, hd).transpose(1, 2), theta)
            v = v.reshape(b, t, kv, hd).transpose(1, 2)
            k, v = k.repeat_interleave(h // kv, 1), v.repeat_interleave(h // kv, 1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            a = a.transpose(1, 2).reshape(b, t, h * hd)
            return getattr(self, {"fused": "out", "inproj": "out_proj"}.get(kind, "o_proj"))(a)

    return _randomize(torch, Attn())


def _variants():
    rope = L.RotaryEmbedding(500.0)
    return {
        "fused": L.MultiHeadAttention(AH, num_kv_heads=AKV, causal=True, rope=True),
        "separate": L.Attention.build(
            AE, AH, num_kv_heads=AKV, head_dim=6, bias=True, out_bias=False, causal=True, rope=rope
        ),
        "inproj": L.InProjAttention(AH, num_kv_heads=AKV, causal=True, rope=rope, batch_first=True),
    }


@pytest.mark.parametrize("kind", ["fused", "separate", "inproj"])
def test_attention_gqa_rope_matches_torch_sdpa(torch, kind):
    layer = _variants()[kind]
    hd = 6 if kind == "separate" else AE // AH
    tm = _torch_attention(torch, kind, hd, 10000.0 if kind == "fused" else 500.0)
    params = load_from_torch(layer, tm, (2, AT, AE))
    if kind == "separate":
        assert "o_proj.bias" not in P.flatten(params)
        assert params["q_proj"]["weight"].shape == (AH * 6, AE)
    assert len(P.flatten(params)) == len(dict(tm.named_parameters()))
    pl.testing.assert_matches_torch(
        layer, tm, _rand(8, 2, AT, AE), params=params, apply=jax.jit(layer.apply), **TOL
    )


def test_attention_build_takes_rope_true_as_multi_head_attention_does():
    """``Attention.build(..., rope=True)`` is ``RotaryEmbedding()`` (theta 10000), as
    ``MultiHeadAttention(rope=True)``; ``False`` is none (before: ``True`` was refused)."""
    built = L.Attention.build(AE, AH, causal=True, rope=True)
    assert built.core.rope == L.RotaryEmbedding() == L.RotaryEmbedding(10000.0)
    assert L.Attention.build(AE, AH, rope=False).core.rope is None
    assert built == L.Attention.build(AE, AH, causal=True, rope=L.RotaryEmbedding())


def test_inproj_attention_loads_torch_multihead_attention_by_name(torch):
    mha = _randomize(torch, torch.nn.MultiheadAttention(AE, AH, batch_first=True))
    layer = L.InProjAttention(AH, causal=True, batch_first=True)
    params = load_from_torch(layer, mha, (2, AT, AE))  # torch's names, no renaming
    assert list(P.flatten(params))[:2] == ["in_proj_weight", "in_proj_bias"]
    forbid = torch.triu(torch.ones(AT, AT, dtype=torch.bool), 1)  # torch: True = masked

    def torch_fn(m, x):
        return m(x, x, x, attn_mask=forbid, need_weights=False)[0]

    pl.testing.assert_matches_torch(
        layer,
        mha,
        _rand(9, 2, AT, AE),
        params=params,
        apply=jax.jit(layer.apply),
        torch_call=torch_fn,
        **TOL,
    )


@pytest.mark.parametrize("kind", ["fused", "separate", "inproj"])
def test_attention_token_by_token_decode_equals_full_causal_forward(kind):
    layer = _variants()[kind]
    b, t = 2, 6
    params = layer.init(jax.random.key(5), (b, t, AE))
    params = jax.tree.map(lambda a: a + 0.3 * jax.random.normal(jax.random.key(6), a.shape), params)
    x = jnp.asarray(_rand(11, b, t, AE))
    full = jax.jit(layer.apply)(params, x)
    step = jax.jit(lambda p, x, c: layer.apply(p, x, cache=c))
    out, cache = _decode(step, params, x, layer.init_cache((b, 8, AE)), [1] * t)
    np.testing.assert_allclose(out, full, rtol=1e-5, atol=1e-5)
    assert int(cache["length"]) == t
    assert cache["keys"].shape[2] == AKV


# -- 5. Linear(transposed=True) -----------------------------------------------------------------


def test_transposed_linear_matches_torch_linear(torch):
    lin = _randomize(torch, torch.nn.Linear(4, 5))
    layer = L.Linear(5, transposed=True)
    template = layer.init(jax.random.key(0), (3, 4))
    assert template["weight"].shape == (4, 5) and template["bias"].shape == (5,)
    params = {
        "weight": jnp.asarray(lin.weight.detach().numpy().T),
        "bias": jnp.asarray(lin.bias.detach().numpy()),
    }
    x, cot = _rand(12, 3, 4), _rand(13, 3, 5)
    xt = torch.tensor(x, requires_grad=True)
    out = lin(xt)
    np.testing.assert_allclose(layer.apply(params, x), out.detach().numpy(), rtol=1e-5, atol=1e-5)
    (out * torch.tensor(cot)).sum().backward()
    gp, gx = jax.grad(lambda p, x: jnp.sum(layer.apply(p, x) * cot), (0, 1))(params, jnp.asarray(x))
    np.testing.assert_allclose(gp["weight"], lin.weight.grad.numpy().T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gp["bias"], lin.bias.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-5, atol=1e-5)


# -- 6. bad inputs --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a.b", ""])
def test_sequential_rejects_bad_child_names(name):
    msg = f"Sequential: child names must be non-empty strings without '.', got {name!r}"
    with pytest.raises(ValueError, match=msg.replace(".", r"\.").replace("(", r"\(")):
        L.Sequential({name: L.ReLU()})
    with pytest.raises(ValueError, match="child names must be non-empty strings"):
        L.Sequential([("ok", L.ReLU()), (name, L.Tanh())])


def test_sequential_rejects_duplicate_names():
    with pytest.raises(ValueError, match="Sequential: two children are named 'x'"):
        L.Sequential([("x", L.ReLU()), ("x", L.Tanh())])


def test_two_aliases_of_one_original_must_agree_where_the_original_is_absent(tmp_path):
    """``b.weight`` and ``c.weight`` both tied to ``a.weight``; a checkpoint holding the
    two aliases but not the original fills it from them only where they hold one value
    (before: the last alias won silently)."""
    seq = L.Sequential({k: L.Linear(4, bias=False) for k in "abc"})
    tied = L.Tied(seq, {"b.weight": "a.weight", "c.weight": "a.weight"})
    template = tied.init(jax.random.key(0), (2, 4))
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    got = P.load_state_dict(template, {"b.weight": w, "c.weight": w}, model=tied)
    np.testing.assert_array_equal(got["a"]["weight"], w)
    pattern = r"'c\.weight' and 'b\.weight' are both tied to 'a\.weight' but .* nothing was loaded"
    with pytest.raises(ValueError, match=pattern):
        P.load_state_dict(template, {"b.weight": w, "c.weight": w + 1}, model=tied)
    path = tmp_path / "two.safetensors"
    P.save(path, {"b": {"weight": w}, "c": {"weight": w + 1}})
    with pytest.raises(ValueError, match=pattern):
        P.load_into(path, template, model=tied)


def test_tied_construction_errors():
    three = L.Sequential({"a": L.Linear(4), "b": L.Linear(4), "c": L.Linear(4)})
    lm = _tied_lm().layer
    cases = [
        (lm, {"x.weight": "wte.weight"}, r"Tied: alias 'x\.weight' names no array of Sequential"),
        (lm, {"lm_head.weight": "wte.nope"}, r"Tied: original 'wte\.nope' names no array"),
        (lm, {"lm_head.bias": "wte.weight"}, r"alias 'lm_head\.bias' names no array"),
        (lm, {"wte.weight": "wte.weight"}, r"'wte\.weight' is tied to itself"),
        (three, {"a.weight": "b.weight", "b.weight": "c.weight"}, "both an alias and an original"),
    ]
    for layer, aliases, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            L.Tied(layer, aliases)


def test_cache_keeps_its_dtype_when_values_are_wider_than_keys():
    attn = L.Attention(L.Linear(8), L.Linear(8), L.Linear(4), L.Linear(16), L.AttentionCore(2))
    cache = attn.init_cache((1, 4, 16), jnp.bfloat16)
    assert cache["keys"].shape == (1, 4, 2, 4) and cache["values"].shape == (1, 4, 2, 2)
    assert cache["keys"].dtype == cache["values"].dtype == jnp.bfloat16


def test_ids_pass_through_parameter_free_layers_before_an_embedding(torch):
    """``Sequential(Identity(), Embedding(5, 3))`` (as torch builds it) initializes
    from a shape: the first layer with arrays decides that the input is ids."""
    model = L.Sequential(L.Identity(), L.Dropout(0.1), L.Embedding(5, 3), L.Linear(2))
    assert model.takes_ids and not L.Sequential(L.Identity(), L.Linear(2)).takes_ids
    params = model.init(jax.random.key(0), (2, 4))
    assert {k: v.shape for k, v in P.flatten(params).items()} == {
        "2.weight": (5, 3), "3.weight": (2, 3), "3.bias": (2,)
    }  # fmt: skip
    assert model.init_state((2, 4)) == {}
    twin = torch.nn.Sequential(
        torch.nn.Identity(), torch.nn.Dropout(0.1), torch.nn.Embedding(5, 3), torch.nn.Linear(3, 2)
    ).eval()
    params = P.load_state_dict(params, twin.state_dict())
    ids = np.array([[0, 4, 2, 1], [3, 3, 0, 4]])
    want = twin(torch.tensor(ids)).detach().numpy()
    np.testing.assert_allclose(np.asarray(model.apply(params, ids)), want, rtol=1e-6, atol=1e-6)


def test_a_custom_layers_plain_value_error_and_init_errors_name_the_path():
    """A layer of the user's own raising a plain ``ValueError`` (its shape check) deep
    in containers gets the path, as the library's ``LayerError``s do; and a custom
    layer's ``init_child`` puts its field in an init error's path."""

    class Scale(L.Layer):
        def apply(self, params, x, *, key=None, train=False):
            if x.shape[-1] != 4:
                raise ValueError(f"Scale: input last axis expected 4, got {x.shape[-1]}")
            return 2 * x

    model = L.Sequential({"blk": L.Sequential({"inner": L.Sequential({"s": Scale()})})})
    with pytest.raises(
        L.LayerError,
        match=r"^Sequential\[blk\.inner\.s\] Scale: input last axis expected 4, got 5$",
    ):
        model.apply({}, jnp.zeros((2, 5)))
    assert model.apply({}, jnp.ones((2, 4))).sum() == 16
    body = L.Sequential(L.Linear(4), L.Softmax(axis=5))
    outer = L.Sequential({"b": L.Sequential({"c": Residual(L.LayerNorm(), body)})})
    with pytest.raises(L.LayerError, match=r"^Sequential\[b\.c\.body\.1\] Softmax: axis 5"):
        outer.init(jax.random.key(0), (2, 3))
