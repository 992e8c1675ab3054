"""torch's transformer classes (``TransformerEncoderLayer``, ``TransformerDecoderLayer``,
``TransformerEncoder``, ``TransformerDecoder``, ``Transformer``) and the options of
``torch.nn.MultiheadAttention`` that ``InProjAttention`` takes (``kdim``/``vdim``,
``add_bias_kv``, ``add_zero_attn``, attention weights).

The registry (``tests/catalog/transformers.py``) checks each class without masks; here:
hand-derived examples, torch parity with every mask kind in both layouts, gradients with
masks, the attention options, dropout in train mode and the initialization."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L
from purelayers.layers._checks import LayerError
from tests import twins

KEY = jax.random.key(0)
E, H, F = 8, 2, 16
TOL = {"rtol": 1e-4, "atol": 1e-4}


def _load(layer, module, shape):
    """Our params from ``module.state_dict()`` by name (the names, in order, equal)."""
    template = layer.ordered(jax.eval_shape(lambda k: layer.init(k, shape), KEY))
    state_dict = module.state_dict()
    assert list(pl.params.flatten(template)) == list(state_dict)
    return pl.params.load_state_dict(template, state_dict)


def _torch_run(torch, module, *xs, fast=False, **masks):
    """``module``'s output on its regular path (gradients enabled), or with ``fast`` on
    its inference fast path (no gradients: fused kernels, nested tensors)."""
    tensors = [torch.tensor(x) for x in xs]
    kw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in masks.items()}
    with torch.set_grad_enabled(not fast):
        return module(*tensors, **kw).detach().numpy()


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# -- worked examples -------------------------------------------------------------------


def test_zero_projections_leave_the_norms():
    """With every projection and bias zero, both sublayers add nothing: post-norm is two
    LayerNorms, token ``[1, 3]`` (mean 2, variance 1) becomes ``[-1, 1]``; pre-norm is
    the identity."""
    post, pre = (
        L.TransformerEncoderLayer(1, 2, 0.0),
        L.TransformerEncoderLayer(1, 2, 0.0, norm_first=True),
    )
    x = jnp.array([[[1.0, 3.0]], [[-2.0, 0.0]]])  # (S=2, N=1, E=2)

    def zeroed(layer):
        params = layer.init(KEY, x.shape)
        flat = pl.params.flatten(params)
        flat = {
            k: v if ".weight" in k and "norm" in k else jnp.zeros_like(v) for k, v in flat.items()
        }
        return pl.params.unflatten(flat)

    ys = jax.jit(lambda a, b: (post.apply(a, x), pre.apply(b, x)))(zeroed(post), zeroed(pre))
    np.testing.assert_allclose(ys[0], [[[-1.0, 1.0]], [[-1.0, 1.0]]], atol=2e-5)
    np.testing.assert_allclose(ys[1], x)


def test_uniform_attention_over_visible_keys_worked_example():
    """Zero q/k projections give equal scores, so the weights are uniform over the
    visible keys: three keys, the last padded, give ``[1/2, 1/2, 0]``; ``add_zero_attn``
    appends a fourth (visible) key, ``[1/3, 1/3, 0, 1/3]``. Values are the bias ``[1, 2]``
    (the zero key's value is 0), so with an identity ``out_proj`` ``y = 2/3 * [1, 2]``."""
    x = jnp.ones((1, 3, 2))
    mask = jnp.array([True, True, False])[None, None, None, :]
    params = {
        "in_proj_weight": jnp.zeros((6, 2)),
        "in_proj_bias": jnp.array([0.0, 0.0, 0.0, 0.0, 1.0, 2.0]),
        "out_proj": {"weight": jnp.eye(2), "bias": jnp.zeros(2)},
    }

    @jax.jit
    def run(params):
        return {
            z: L.InProjAttention(1, add_zero_attn=z, batch_first=True).apply(
                params, x, mask=~mask, need_weights=True
            )
            for z in (False, True)
        }

    out = run(params)
    np.testing.assert_allclose(out[False][1][0], [[0.5, 0.5, 0.0]] * 3, atol=1e-6)
    np.testing.assert_allclose(out[False][0][0], [[1.0, 2.0]] * 3, atol=1e-6)
    np.testing.assert_allclose(out[True][1][0], [[1 / 3, 1 / 3, 0.0, 1 / 3]] * 3, atol=1e-6)
    np.testing.assert_allclose(out[True][0][0], [[2 / 3, 4 / 3]] * 3, atol=1e-6)


def test_square_subsequent_mask_is_torchs(torch):
    ours = L.Transformer.generate_square_subsequent_mask(4)
    np.testing.assert_array_equal(ours, torch.nn.Transformer.generate_square_subsequent_mask(4))
    assert L.Transformer.generate_square_subsequent_mask(0).shape == (0, 0)


# -- torch parity with masks -----------------------------------------------------------


def _masks(rng, n, s):
    """Masks of every kind for ``s`` keys: key 0 is never masked (no row is empty)."""
    boolean = rng.random((s, s)) < 0.4
    boolean[:, 0] = False
    kpm = np.zeros((n, s), bool)
    kpm[1, -2:] = True
    return {
        "bool": boolean,
        "float": _rand(rng, s, s),
        "heads": _rand(rng, n * H, s, s),
        "kpm": kpm,
        "causal": np.asarray(L.Transformer.generate_square_subsequent_mask(s)),
    }


@pytest.mark.parametrize(("batch_first", "norm_first"), [(False, False), (True, True)])
def test_encoder_of_two_layers_matches_torch_with_each_mask(torch, batch_first, norm_first):
    module = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(
            E, H, F, 0.0, batch_first=batch_first, norm_first=norm_first
        ),
        2,
        norm=torch.nn.LayerNorm(E),
    )
    module = twins.randomize(torch, module).eval()
    layer = L.TransformerEncoderLayer(H, F, 0.0, batch_first=batch_first, norm_first=norm_first)
    ours = L.TransformerEncoder(layer, 2, norm=L.LayerNorm())
    rng = np.random.default_rng(0)
    n, s = 3, 5
    x = _rand(rng, n, s, E) if batch_first else _rand(rng, s, n, E)
    params = _load(ours, module, x.shape)
    m = _masks(rng, n, s)
    calls = {
        "bool": ((x,), {"mask": m["bool"]}),
        "heads": ((x,), {"mask": m["heads"]}),
        "kpm": ((x,), {"src_key_padding_mask": m["kpm"]}),
        "causal": ((x,), {"mask": m["causal"], "is_causal": True}),
        "unbatched": (
            (x[0] if batch_first else x[:, 0],),
            {"mask": m["float"], "src_key_padding_mask": m["kpm"][1]},
        ),
    }
    got = jax.jit(lambda p: {k: ours.apply(p, *a, **kw) for k, (a, kw) in calls.items()})(params)
    for name, (args, kw) in calls.items():
        np.testing.assert_allclose(got[name], _torch_run(torch, module, *args, **kw), **TOL)
        if name in ("heads", "unbatched"):
            continue  # torch's fast path gives NaN with a float mask when batch first
        fast, ours_ = _torch_run(torch, module, *args, fast=True, **kw), np.asarray(got[name])
        if name.startswith("kpm"):  # where nested tensors leave padded positions 0
            keep = ~m["kpm"] if batch_first else ~m["kpm"].T
            fast, ours_ = fast[keep], ours_[keep]
        np.testing.assert_allclose(ours_, fast, err_msg=f"{name} (fast path)", **TOL)


@pytest.mark.parametrize(("batch_first", "norm_first"), [(False, False), (True, True)])
def test_transformer_matches_torch_with_each_mask(torch, batch_first, norm_first):
    module = torch.nn.Transformer(
        E, H, 2, 2, F, 0.0, batch_first=batch_first, norm_first=norm_first
    )
    module = twins.randomize(torch, module).eval()
    ours = L.Transformer(H, 2, 2, F, 0.0, batch_first=batch_first, norm_first=norm_first)
    rng = np.random.default_rng(1)
    n, s, t = 3, 5, 4
    src = _rand(rng, n, s, E) if batch_first else _rand(rng, s, n, E)
    tgt = _rand(rng, n, t, E) if batch_first else _rand(rng, t, n, E)
    params = _load(ours, module, (src.shape, tgt.shape))
    fresh = ours.init(jax.random.key(0), (src.shape, tgt.shape))
    assert list(pl.params.flatten(fresh)) == list(module.state_dict())  # torch's order
    ms, mt = _masks(rng, n, s), _masks(rng, n, t)
    memory_mask = _rand(rng, t, s)
    calls = {
        "bool": {"src_mask": ms["bool"], "tgt_mask": mt["bool"]},
        "float": {"src_mask": ms["float"], "tgt_mask": mt["heads"], "memory_mask": memory_mask},
        "kpm": {
            "src_key_padding_mask": ms["kpm"],
            "tgt_key_padding_mask": mt["kpm"],
            "memory_key_padding_mask": ms["kpm"],
        },
        "causal+kpm": {
            "tgt_mask": mt["causal"],
            "tgt_is_causal": True,
            "tgt_key_padding_mask": mt["kpm"],
        },
    }
    got = jax.jit(lambda p: {k: ours.apply(p, src, tgt, **kw) for k, kw in calls.items()})(params)
    for name, kw in calls.items():
        want = _torch_run(torch, module, src, tgt, **kw)
        np.testing.assert_allclose(got[name], want, err_msg=name, **TOL)


def test_encoder_layer_gradients_with_masks_match_torch(torch):
    module = twins.randomize(
        torch, torch.nn.TransformerEncoderLayer(E, H, F, 0.0, "gelu", batch_first=True)
    )
    rng = np.random.default_rng(2)
    x = _rand(rng, 2, 4, E)
    m = _masks(rng, 2, 4)
    kw = {"src_mask": m["bool"], "src_key_padding_mask": m["kpm"]}
    pl.testing.assert_matches_torch(
        L.TransformerEncoderLayer(H, F, 0.0, "gelu", batch_first=True), module, x,
        torch_call=lambda mod, x: mod(x, **{k: torch.tensor(v) for k, v in kw.items()}),
        **kw, **TOL,
    )  # fmt: skip


def test_decoder_layer_gradients_with_masks_match_torch(torch):
    module = torch.nn.TransformerDecoderLayer(E, H, F, 0.0, norm_first=True)
    module = twins.randomize(torch, module)
    rng = np.random.default_rng(3)
    tgt, memory = _rand(rng, 4, 2, E), _rand(rng, 5, 2, E)
    kpm = np.array([[False] * 5, [False] * 3 + [True] * 2])
    kw = {
        "tgt_mask": np.asarray(L.Transformer.generate_square_subsequent_mask(4)),
        "memory_mask": _rand(rng, 4, 5),
        "memory_key_padding_mask": kpm,
        "tgt_is_causal": True,
    }
    pl.testing.assert_matches_torch(
        L.TransformerDecoderLayer(H, F, 0.0, norm_first=True), module, tgt, memory,
        torch_call=lambda mod, t, mem: mod(t, mem, **{
            k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}),
        **kw, **TOL,
    )  # fmt: skip


# -- InProjAttention: torch's options --------------------------------------------------

OPTIONS = [
    ({"kdim": 5, "vdim": 3, "add_bias_kv": True}, True, "kpm"),
    ({"add_bias_kv": True, "add_zero_attn": True}, False, "float"),
]


@pytest.mark.parametrize(("options", "average", "mask"), OPTIONS, ids=["kvdim-bias", "zero-attn"])
def test_attention_options_and_weights_match_torch(torch, options, average, mask):
    module = torch.nn.MultiheadAttention(E, H, batch_first=True, **options)
    module = twins.randomize(torch, module)
    layer = L.InProjAttention(H, batch_first=True, **options)
    rng = np.random.default_rng(4)
    q = _rand(rng, 2, 3, E)
    k, v = _rand(rng, 2, 4, options.get("kdim", E)), _rand(rng, 2, 4, options.get("vdim", E))
    if mask == "kpm":
        kpm = np.array([[False, True, False, False], [False, False, True, True]])
        theirs, ours = {"key_padding_mask": kpm}, kpm[:, None, None, :]
    else:
        attn = _rand(rng, 3, 4)
        theirs, ours = {"attn_mask": attn}, attn

    def run(p, q, k, v):
        return layer.apply(
            p, q, context=k, value=v, mask=ours, need_weights=True,
            average_attn_weights=average,
        )  # fmt: skip

    def torch_call(mod, q, k, v):
        kw = {n: torch.tensor(a) for n, a in theirs.items()}
        return mod(q, k, v, average_attn_weights=average, **kw)

    params = pl.testing.assert_matches_torch(
        layer, module, q, k, v, apply=run, torch_call=torch_call, **TOL
    )
    # without weights, the fused path gives the same output (both in one program)
    (y, w), plain = jax.jit(
        lambda p, q, k, v: (run(p, q, k, v), layer.apply(p, q, context=k, value=v, mask=ours))
    )(params, q, k, v)
    s = 4 + options.get("add_bias_kv", False) + options.get("add_zero_attn", False)
    assert w.shape == ((2, 3, s) if average else (2, H, 3, s))
    np.testing.assert_allclose(plain, y, **TOL)


def test_torch_defaults_sequence_first_and_boolean_masks_match_torch(torch):
    """``InProjAttention(H, dropout)`` is ``MultiheadAttention(E, H, dropout)``: inputs
    ``(L, N, E)``, a boolean ``attn_mask`` and ``key_padding_mask`` ``True`` where
    attention is not allowed, weights averaged over heads (float64)."""
    module = twins.randomize(torch, torch.nn.MultiheadAttention(E, H, 0.0)).double()
    layer = L.InProjAttention(H, 0.0)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((5, 3, E))
    attn = rng.random((5, 5)) > 0.7
    attn[:, 0] = False
    kpm = np.zeros((3, 5), bool)
    kpm[1, -2:] = True
    y, w = module(*[torch.tensor(x)] * 3, attn_mask=torch.tensor(attn),
                  key_padding_mask=torch.tensor(kpm))  # fmt: skip
    with jax.enable_x64(True):
        params = jax.tree.map(jnp.asarray, pl.params.unflatten(
            {k: v.detach().numpy() for k, v in module.state_dict().items()}
        ))  # fmt: skip
        got, got_w = layer.apply(
            params, jnp.asarray(x), mask=attn, key_padding_mask=kpm, need_weights=True
        )
    np.testing.assert_allclose(got, y.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_w, w.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_separate_projections_are_torchs_layout():
    layer = L.InProjAttention(H, kdim=5, vdim=3)
    shapes = jax.tree.map(jnp.shape, jax.eval_shape(lambda: layer.init(KEY, (2, 3, E))))
    assert shapes["q_proj_weight"] == (E, E)
    assert shapes["k_proj_weight"] == (E, 5) and shapes["v_proj_weight"] == (E, 3)
    assert shapes["in_proj_bias"] == (3 * E,)
    # kdim == vdim == E is the packed layout, as in torch
    packed = L.InProjAttention(H, kdim=E, vdim=E).init(KEY, (2, 3, E))
    assert list(pl.params.flatten(packed))[:2] == ["in_proj_weight", "in_proj_bias"]
    with pytest.raises(LayerError, match=r"\[k_proj_weight\]: input last axis expected 5, got 8"):
        jax.eval_shape(lambda: layer.apply(layer.init(KEY, (2, 3, E)), jnp.ones((2, 3, E))))


# -- train mode -------------------------------------------------------------------------


def test_attention_dropout_zeroes_weights_and_scales_the_rest():
    """In train mode each weight is dropped with probability ``p`` and the kept ones are
    scaled by ``1 / (1 - p)``, drawn from the key; eval mode is deterministic."""
    layer = L.InProjAttention(1, dropout=0.5, batch_first=True)
    x = jnp.asarray(_rand(np.random.default_rng(5), 4, 16, 4))
    params = layer.init(KEY, x.shape)

    @jax.jit
    def run(k1, k2):
        def go(**kw):
            return layer.apply(params, x, need_weights=True, **kw)[1]

        return go(), go(train=True, key=k1), go(train=True, key=k1), go(train=True, key=k2)

    w, a, b, c = run(jax.random.key(1), jax.random.key(2))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    dropped = np.asarray(a) == 0
    assert 0.42 < dropped.mean() < 0.58
    np.testing.assert_allclose(np.asarray(a)[~dropped], 2 * np.asarray(w)[~dropped], rtol=1e-5)


def test_encoder_layer_dropout_is_reproducible_from_the_key():
    layer = L.TransformerEncoderLayer(H, F, 0.5)
    x = jnp.asarray(_rand(np.random.default_rng(6), 3, 2, E))
    params = layer.init(KEY, x.shape)

    @jax.jit
    def run(k1, k2):
        def go(**kw):
            return layer.apply(params, x, **kw)

        return go(), go(train=True, key=k1), go(train=True, key=k2)

    y, a, c = run(jax.random.key(1), jax.random.key(2))
    np.testing.assert_array_equal(a, run(jax.random.key(1), jax.random.key(3))[1])
    assert not np.allclose(a, c) and not np.allclose(a, y)
    with pytest.raises(LayerError, match=r"train=True draws random numbers and needs a PRNG key"):
        jax.eval_shape(lambda: layer.apply(params, x, train=True))


# -- initialization and names ----------------------------------------------------------


def test_initialization_follows_torch():
    """``TransformerEncoder`` copies one layer (as torch's deep copies: equal weights);
    ``Transformer`` re-draws every weight of two or more axes xavier-uniform, so its
    copies differ. ``init`` takes the src shape or both shapes."""
    enc = L.TransformerEncoder(L.TransformerEncoderLayer(H, F), 2)
    model = L.Transformer(H, 2, 1, F)
    p_enc, p_model = jax.jit(lambda k: (enc.init(k, (5, 3, E)), model.init(k, (5, 3, E))))(KEY)
    flat = pl.params.flatten(p_enc)
    np.testing.assert_array_equal(flat["layers.0.linear1.weight"], flat["layers.1.linear1.weight"])
    flat = pl.params.flatten(p_model)
    w0, w1 = flat["encoder.layers.0.linear1.weight"], flat["encoder.layers.1.linear1.weight"]
    assert not np.allclose(w0, w1)
    bound = np.sqrt(6 / (F + E))  # xavier-uniform for (F, E)
    assert np.abs(w0).max() <= bound and np.abs(w0).max() > 0.8 * bound
    np.testing.assert_array_equal(flat["decoder.norm.weight"], np.ones(E))
    pair = jax.eval_shape(lambda: model.init(KEY, ((5, 3, E), (4, 3, E))))
    assert jax.tree.map(jnp.shape, pair) == jax.tree.map(jnp.shape, p_model)


def test_an_activation_layer_with_params_is_named_as_torch(torch):
    ours = L.TransformerEncoderLayer(H, F, activation=L.PReLU())
    theirs = torch.nn.TransformerEncoderLayer(E, H, F, activation=torch.nn.PReLU())
    template = ours.ordered(jax.eval_shape(lambda: ours.init(KEY, (3, 2, E))))
    assert list(pl.params.flatten(template)) == list(theirs.state_dict())
    fn = L.TransformerEncoderLayer(H, F, activation=jax.nn.silu)  # a plain function
    assert "activation" not in jax.eval_shape(lambda: fn.init(KEY, (3, 2, E)))


def test_gradcheck_of_the_stacks():
    """``pl.testing.gradcheck`` (float64, every parameter and both inputs) of a
    ``Transformer`` of one encoder and one decoder layer, at a width of 4, with a float
    source mask: its ``TransformerEncoder`` and ``TransformerDecoder`` with their final
    norms."""
    rng = np.random.default_rng(0)
    src, tgt = rng.standard_normal((3, 1, 4)), rng.standard_normal((2, 1, 4))
    mask = np.array([[0.0, -1.0, 0.5], [0.0, 0.0, -np.inf], [0.25, 0.0, 0.0]])
    model = L.Transformer(nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                          dim_feedforward=4, dropout=0.0)  # fmt: skip
    kids = model.children()
    assert isinstance(kids["encoder"], L.TransformerEncoder)
    assert isinstance(kids["decoder"], L.TransformerDecoder)
    template = jax.eval_shape(lambda k: model.init(k, src.shape, jnp.float32), jax.random.key(0))
    params = jax.tree.map(lambda a: 0.5 * rng.standard_normal(a.shape), template)
    assert pl.testing.gradcheck(
        lambda p, s, t: model.apply(p, s, t, src_mask=mask), params, src, tgt
    )
