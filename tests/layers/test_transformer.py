"""TransformerBlock (GPT-2 and Llama styles) and Repeat."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L
from purelayers import params as P
from purelayers.layers import Remat, Repeat, Sequential, TransformerBlock
from tests import twins
from tests.registry import CASES

BY_ID = {c.id: c for c in CASES}

TWELVE = [
    "ln1.weight",
    "ln1.bias",
    "attn.qkv.weight",
    "attn.qkv.bias",
    "attn.out.weight",
    "attn.out.bias",
    "ln2.weight",
    "ln2.bias",
    "fc.weight",
    "fc.bias",
    "proj.weight",
    "proj.bias",
]


def test_twelve_names_in_order_and_872_scalars():
    block = TransformerBlock(2)
    params = block.init(jax.random.key(0), (3, 5, 8))
    assert list(P.flatten(params)) == TWELVE
    assert P.count(params) == 872
    assert list(P.flatten(block.ordered(jax.jit(lambda p: p)(params)))) == TWELVE


def test_gpt_block_with_tanh_gelu_matches_torch(torch):
    """GPT-2's own activation (the registry's block uses the exact GELU)."""
    module = twins.randomize(torch, twins.block(torch, 8, 2, act="gelu_tanh"))
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    pl.testing.assert_matches_torch(
        TransformerBlock(2, activation="gelu_tanh"), module, x, rtol=1e-4, atol=1e-5
    )


def test_activation_with_parameters_is_the_child_act(torch):
    """An activation with parameters (``PReLU``) is the block's child ``act``: its weight
    is ``act.weight``, between ``fc`` and ``proj`` as torch registers it, it trains, and
    the other parts keep the weights they have with a parameter-free activation."""
    block = TransformerBlock(2, activation=L.PReLU())
    params = block.init(jax.random.key(0), (3, 5, 8))
    assert list(P.flatten(params)) == [*TWELVE[:10], "act.weight", *TWELVE[10:]]
    plain = TransformerBlock(2, activation="relu").init(jax.random.key(0), (3, 5, 8))
    jax.tree.map(np.testing.assert_array_equal, P.flatten(plain), {
        k: v for k, v in P.flatten(params).items() if k != "act.weight"
    })  # fmt: skip
    module = twins.randomize(torch, twins.block(torch, 8, 2, act="prelu"))
    assert list(module.state_dict()) == list(P.flatten(params))
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    pl.testing.assert_matches_torch(block, module, x, rtol=1e-4, atol=1e-5)
    _, acts = pl.capture(block.apply, "act")(params, x)
    assert acts["act"].shape == (2, 5, 32)


def test_llama_constructor_is_the_registry_block():
    """``TransformerBlock.llama`` is the registry's Llama block (checked against torch
    there), with six names."""
    block = TransformerBlock.llama(4, num_kv_heads=2, hidden_dim=24)
    # (mlp_ratio is unused where hidden_dim is given)
    assert block == dataclasses.replace(BY_ID["TransformerBlock-llama"].make(), mlp_ratio=8 / 3)
    names = P.flatten(jax.eval_shape(lambda k: block.init(k, (2, 5, 16)), jax.random.key(0)))
    assert sorted(names) == sorted(
        ["ln1.weight", "attn.qkv.weight", "attn.out.weight", "ln2.weight", "fc.weight",
         "proj.weight"]
    )  # fmt: skip


@pytest.mark.parametrize("llama", [False, True])
def test_block_cached_decoding_equals_full_forward(llama):
    block = TransformerBlock.llama(4, num_kv_heads=2) if llama else TransformerBlock(2)
    b, t, e = 2, 6, 16
    params = block.init(jax.random.key(0), (b, t, e))
    x = jax.random.normal(jax.random.key(1), (b, t, e))
    full = jax.jit(block.apply)(params, x)
    step = jax.jit(lambda p, x, c: block.apply(p, x, cache=c))
    for chunks in ([1] * t, [2, 2, 2]):
        cache, outs, start = block.init_cache((b, 8, e)), [], 0
        for n in chunks:
            y, cache = step(params, x[:, start : start + n], cache)
            outs.append(y)
            start += n
        np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, rtol=1e-5, atol=1e-5)


def test_block_dropout_only_in_train_mode_with_key():
    block = TransformerBlock(2, dropout=0.3)
    params = block.init(jax.random.key(0), (1, 4, 8))
    x = jax.random.normal(jax.random.key(1), (1, 4, 8))
    np.testing.assert_array_equal(block.apply(params, x), TransformerBlock(2).apply(params, x))
    with pytest.raises(ValueError, match="TransformerBlock: train=True draws random numbers"):
        block.apply(params, x, train=True)
    key = jax.random.key(2)
    y = block.apply(params, x, train=True, key=key)
    np.testing.assert_array_equal(y, block.apply(params, x, train=True, key=key))
    assert not np.allclose(y, block.apply(params, x))


def test_block_errors():
    with pytest.raises(ValueError, match="TransformerBlock: activation must be one of 'gelu'"):
        TransformerBlock(2, activation="swish")
    with pytest.raises(
        ValueError, match="TransformerBlock: num_kv_heads must be a divisor of num_heads=4, got 3"
    ):
        TransformerBlock(4, num_kv_heads=3)
    with pytest.raises(
        ValueError,
        match=r"TransformerBlock\[attn\] MultiHeadAttention: embed_dim 10 .* divisible by num_heads 4",
    ):
        TransformerBlock(4).init(jax.random.key(0), (2, 3, 10))
    params = TransformerBlock(2).init(jax.random.key(0), (2, 3, 8))
    with pytest.raises(ValueError, match=r"TransformerBlock\[ln1\] LayerNorm"):
        TransformerBlock(2).apply(params, jnp.zeros((2, 3, 6)))


# -- Repeat ------------------------------------------------------------------------------


def test_repeat_equals_unrolled_sequential():
    """Same init, outputs (eval and train with a key) and gradients (with ``remat``) as
    the unrolled ``Sequential``: one compiled program."""
    block = TransformerBlock(2, dropout=0.1)
    rep, seq = Repeat(block, 2), Sequential(block, block)
    x = jax.random.normal(jax.random.key(1), (2, 4, 8))
    key = jax.random.key(3)

    def loss(m):
        return lambda p: jnp.sum(m.apply(p, x) ** 2)

    @jax.jit
    def program(init_key):
        params, unrolled = rep.init(init_key, x.shape), seq.init(init_key, x.shape)
        return (
            params,
            unrolled,
            (rep.apply(params, x), seq.apply(unrolled, x)),
            (
                rep.apply(params, x, train=True, key=key),
                seq.apply(unrolled, x, train=True, key=key),
            ),
            (jax.grad(loss(Repeat(block, 2, remat=True)))(params), jax.grad(loss(seq))(unrolled)),
        )

    params, unrolled, *pairs = program(jax.random.key(0))
    params, unrolled = rep.ordered(params), seq.ordered(unrolled)
    # Stacked storage, per-block names: flattened, both are the same checkpoint.
    assert isinstance(params, P.Stacked) and params.tree["ln1"]["weight"].shape == (2, 8)
    assert list(P.flatten(params)) == list(P.flatten(unrolled))
    jax.tree.map(np.testing.assert_array_equal, P.flatten(params), P.flatten(unrolled))
    assert list(P.flatten(params))[:2] == ["0.ln1.weight", "0.ln1.bias"]
    assert list(P.flatten(params))[-1] == "1.proj.bias"
    (y_rep, y_seq), (t_rep, t_seq), (g_rep, g_seq) = pairs
    np.testing.assert_allclose(y_rep, y_seq, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t_rep, t_seq, rtol=1e-5, atol=1e-6)
    assert not np.allclose(t_rep, y_rep)  # dropout did act in train mode
    pl.testing.assert_tree_allclose(g_rep, seq.ordered(g_seq), rtol=1e-4, atol=1e-6)


def test_repeat_cached_decoding():
    block = TransformerBlock.llama(2, num_kv_heads=1)
    rep = Repeat(block, 2)
    params = rep.init(jax.random.key(0), (1, 5, 8))
    x = jax.random.normal(jax.random.key(1), (1, 5, 8))
    full = rep.apply(params, x)
    traces = []

    @jax.jit
    def step(p, x, c):
        traces.append(1)
        return rep.apply(p, x, cache=c)

    cache, outs = rep.init_cache((1, 5, 8)), []
    for i in range(5):
        y, cache = step(params, x[:, i : i + 1], cache)
        outs.append(y)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, rtol=1e-5, atol=1e-5)
    assert len(traces) == 1
    np.testing.assert_array_equal(cache["length"], [5, 5])


def test_repeat_cache_overflow_raises_before_its_scan():
    """Inside ``Repeat``'s scan the cached lengths are traced; ``Repeat`` checks them
    first where they are known: an eager call past ``max_len`` raises, and under ``jit``
    the output is NaN (the attention's rule), within the cache it is finite."""
    stack = Repeat(TransformerBlock(2), 2)
    params = stack.init(jax.random.key(0), (1, 3, 8))
    x = jax.random.normal(jax.random.key(1), (1, 3, 8))
    _, cache = stack.apply(params, x, cache=stack.init_cache((1, 4, 8)))
    with pytest.raises(ValueError, match=r"^Repeat: cached length plus new positions at most "):
        stack.apply(params, x, cache=cache)
    step = jax.jit(lambda p, v, c: stack.apply(p, v, cache=c))
    assert np.isnan(np.asarray(step(params, x, cache)[0])).all()
    assert np.isfinite(np.asarray(step(params, x[:, :1], cache)[0])).all()


def test_repeat_errors():
    with pytest.raises(ValueError, match="Repeat: n must be a positive integer, got 0"):
        Repeat(TransformerBlock(2), 0)
    rep = Repeat(TransformerBlock(2), 2)
    params = rep.init(jax.random.key(0), (1, 3, 8))
    # Per-block trees run as an unrolled loop (never stacked): the same outputs, and
    # the same cache, as the scan over the stacked tree; the wrong block names are named.
    blocks = rep.unstack(params)
    assert sorted(blocks) == ["0", "1"]
    x = jax.random.normal(jax.random.key(1), (1, 3, 8))
    cache = rep.init_cache((1, 4, 8))
    stacked = rep.stack(blocks)

    @jax.jit  # every run in one program
    def runs(params, blocks, stacked, x, cache):
        return (
            (rep.apply(blocks, x), rep.apply(params, x), rep.apply(stacked, x)),
            rep.apply(blocks, x, cache=cache),
            rep.apply(params, x, cache=cache),
            rep.apply(blocks, x, cache=rep.unstack_cache(cache)),  # per-block caches
        )

    (u, s, restacked), (y1, c1), (y2, c2), (y3, c3) = runs(params, blocks, stacked, x, cache)
    np.testing.assert_allclose(u, s, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(restacked, s)
    np.testing.assert_allclose(y1, y2, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(c1["keys"], c2["keys"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y3, y2, rtol=1e-6, atol=1e-6)
    for i in range(2):
        np.testing.assert_allclose(c3[str(i)]["values"], c2["values"][i], rtol=1e-6, atol=1e-6)
    with pytest.raises(
        ValueError, match=r"Repeat: per-block params expected \['0', '1'\], got \['0'\]"
    ):
        rep.apply({"0": blocks["0"]}, x)
    with pytest.raises(
        ValueError, match=r"(?s)Repeat: params must be the Stacked tree .*Repeat\.stack"
    ):
        rep.apply({"a": blocks["0"]}, jnp.zeros((1, 3, 8)))
    with pytest.raises(ValueError, match=r"Repeat: params blocks expected 3, got 2"):
        Repeat(TransformerBlock(2), 3).apply(params, jnp.zeros((1, 3, 8)))
    with pytest.raises(ValueError, match=r"Repeat\[\*\.ln1\] LayerNorm"):
        rep.apply(params, jnp.zeros((1, 3, 6)))


# -- Remat -------------------------------------------------------------------------------


def _peak_temp_bytes(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_remat_block_same_names_outputs_and_gradients():
    """``Remat(block)`` has ``block``'s parameter names and gives the same outputs and
    gradients (dropout included, same key); its backward pass recomputes the block
    (a ``checkpoint`` in the gradient's jaxpr, none without ``Remat``)."""
    block = TransformerBlock(2, dropout=0.1)
    plain = Sequential(*[block] * 2)
    remat = Sequential(*[Remat(block)] * 2)
    params = plain.ordered(jax.jit(plain.init, static_argnums=1)(jax.random.key(0), (2, 6, 8)))
    abstract = jax.eval_shape(lambda k: remat.init(k, (2, 6, 8)), jax.random.key(0))
    assert list(P.flatten(remat.ordered(abstract))) == list(P.flatten(params))
    assert list(remat.ordered(dict(sorted(params.items())))) == list(params)
    x = jax.random.normal(jax.random.key(1), (2, 6, 8))
    key = jax.random.key(3)

    def loss(model):
        return lambda p: jnp.sum(model.apply(p, x, train=True, key=key) ** 2)

    @jax.jit
    def program(params):
        return [(loss(m)(params), jax.grad(loss(m))(params)) for m in (remat, plain)]

    (l_remat, g_remat), (l_plain, g_plain) = program(params)
    np.testing.assert_array_equal(l_remat, l_plain)
    pl.testing.assert_tree_allclose(g_remat, g_plain, rtol=1e-4, atol=1e-4)

    def checkpoints(model):
        eqns = jax.make_jaxpr(jax.grad(loss(model)))(params).eqns
        return sum(e.primitive.name.startswith(("remat", "checkpoint")) for e in eqns)

    assert (checkpoints(remat), checkpoints(plain)) == (2, 0)


def test_repeat_remat_lowers_peak_memory():
    """XLA's buffer assignment for the training step of 4 blocks at sequence 256: with
    ``remat`` the scan keeps one block's internals at a time."""
    block = TransformerBlock(2)
    x = jax.ShapeDtypeStruct((2, 256, 16), jnp.float32)
    params = jax.eval_shape(lambda: Repeat(block, 4).init(jax.random.key(0), x.shape))

    def grad(model):
        return jax.grad(lambda p, x: jnp.mean(model.apply(p, x) ** 2))

    plain = _peak_temp_bytes(grad(Repeat(block, 4)), params, x)
    remat = _peak_temp_bytes(grad(Repeat(block, 4, remat=True)), params, x)
    assert remat < 0.6 * plain


def test_remat_passes_state_and_policy_through():
    """A stateful layer inside ``Remat`` threads its state as outside it; a policy that
    saves the matrix products is accepted and changes nothing numerically."""
    bn = L.BatchNorm1d()
    wrapped = Remat(bn, remat_policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    x = jax.random.normal(jax.random.key(0), (4, 3))
    params, state = bn.init(jax.random.key(0), x.shape), bn.init_state(x.shape)
    assert wrapped.init_state(x.shape).keys() == state.keys()
    want = bn.apply(params, x, state=state, train=True)
    got = wrapped.apply(params, x, state=state, train=True)
    jax.tree.map(np.testing.assert_array_equal, got, want)


def test_remat_keeps_python_keyword_arguments_static():
    """Keyword arguments that are Python values (``need_weights``, ``average_attn_weights``)
    reach the layer as they are, not traced through ``jax.checkpoint``: the same outputs
    and gradients as without ``Remat``."""
    attn = L.InProjAttention(2, batch_first=True)
    x = jax.random.normal(jax.random.key(1), (2, 3, 8))
    params = attn.init(jax.random.key(0), x.shape)
    kw = dict(need_weights=True, average_attn_weights=False)
    want = attn.apply(params, x, **kw)
    got = Remat(attn).apply(params, x, **kw)
    jax.tree.map(np.testing.assert_array_equal, got, want)
    assert got[1].shape == (2, 2, 3, 3)
    grads = [
        jax.grad(lambda p, f=f: f(p, x, **kw)[0].sum())(params)
        for f in (attn.apply, Remat(attn).apply)
    ]
    jax.tree.map(np.testing.assert_allclose, *grads)


def test_remat_errors():
    with pytest.raises(ValueError, match="Remat: layer must be a Layer, got 3"):
        Remat(3)
    with pytest.raises(ValueError, match=r"Remat: remat_policy must be a jax\.checkpoint_policies"):
        Remat(L.ReLU(), remat_policy="dots")
    with pytest.raises(
        ValueError, match=r"Repeat: remat_policy must be a jax\.checkpoint_policies"
    ):
        Repeat(L.ReLU(), 2, remat=True, remat_policy=1)
