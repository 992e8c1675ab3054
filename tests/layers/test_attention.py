"""Attention: scaled_dot_product_attention, causal_mask, rotary_embedding, MultiHeadAttention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from purelayers import params as P
from purelayers.functional.attention import dot_product_attention_reference
from purelayers.layers import Lambda, MultiHeadAttention, causal_mask, rotary_embedding
from purelayers.layers import scaled_dot_product_attention as sdpa
from purelayers.testing import assert_matches_torch, gradcheck


def _attend_explicit(q, k, v, mask, bias, causal, scale, dropout_p, key):
    """The written-out attention (``F.dot_product_attention_reference``) positionally."""
    return dot_product_attention_reference(
        q, k, v, mask=mask, bias=bias, is_causal=causal, scale=scale, dropout_p=dropout_p, key=key
    )


RTOL = ATOL = 1e-5


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _torch_function(torch, fn):
    """``fn`` as a parameter-free ``torch.nn.Module``, for ``assert_matches_torch``."""

    class TorchFunction(torch.nn.Module):
        def forward(self, *xs):
            return fn(*xs)

    return TorchFunction()


# -- causal_mask -------------------------------------------------------------------------


def test_causal_mask_worked_example():
    """Two new queries after a cached prefix of two keys: query 0 sits at position 2 and
    sees keys 0..2, query 1 at position 3 sees all four."""
    T, F = True, False
    np.testing.assert_array_equal(causal_mask(2, 4), [[T, T, T, F], [T, T, T, T]])
    np.testing.assert_array_equal(causal_mask(3, 3), np.tril(np.ones((3, 3), bool)))


def test_causal_mask_rejects_negative_lengths():
    with pytest.raises(ValueError, match="causal_mask: q_len must be an integer >= 0, got -1"):
        causal_mask(-1, 3)


# -- scaled_dot_product_attention parity -------------------------------------------------


@pytest.mark.parametrize("case", ["bool", "float", "causal", "scale", "gqa", "bias"])
def test_sdpa_matches_torch(torch, case):
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    kv_heads = 2 if case == "gqa" else 4
    q, k, v = _rand(rng, 2, 4, 3, 8), _rand(rng, 2, kv_heads, 5, 8), _rand(rng, 2, kv_heads, 5, 6)
    t_kw, j_kw, extra = {}, {}, []
    if case == "bool":
        m = rng.random((2, 1, 3, 5)) > 0.4
        m[..., 0] = True
        t_kw["attn_mask"], j_kw["mask"] = torch.tensor(m), m
    if case in ("float", "bias"):
        extra = [_rand(rng, 3, 5)]
    if case == "causal":
        k, v = k[:, :, :3], v[:, :, :3]
        t_kw["is_causal"], j_kw["is_causal"] = True, True
    if case == "scale":
        t_kw["scale"], j_kw["scale"] = 0.3, 0.3
    if case == "gqa":
        t_kw["enable_gqa"] = True

    def t_fn(q, k, v, *m):
        return F.scaled_dot_product_attention(q, k, v, *m, **t_kw)

    def j_fn(params, q, k, v, *m):  # the float mask or bias is an input, differentiated
        kw = dict(j_kw)
        if m:
            kw["bias" if case == "bias" else "mask"] = m[0]
        return sdpa(q, k, v, **kw)

    assert_matches_torch(
        Lambda(sdpa),  # names the JAX side in messages; `apply` runs it
        _torch_function(torch, t_fn),
        q,
        k,
        v,
        *extra,
        params={},
        apply=j_fn,
        rtol=RTOL,
        atol=ATOL,
    )


def test_sdpa_unbatched_and_several_batch_axes(torch):
    F = torch.nn.functional
    rng = np.random.default_rng(1)
    q, k, v = _rand(rng, 2, 3, 2, 3, 4), _rand(rng, 2, 3, 2, 5, 4), _rand(rng, 2, 3, 2, 5, 4)
    want = F.scaled_dot_product_attention(*map(torch.tensor, (q, k, v))).numpy()
    np.testing.assert_allclose(sdpa(q, k, v), want, rtol=RTOL, atol=ATOL)
    want = F.scaled_dot_product_attention(*(torch.tensor(a[0, 0]) for a in (q, k, v))).numpy()
    np.testing.assert_allclose(sdpa(q[0, 0], k[0, 0], v[0, 0]), want, rtol=RTOL, atol=ATOL)


def test_is_causal_is_end_aligned_unlike_torch(torch):
    """With 2 queries and 4 keys torch's is_causal lets query 0 see key 0 only (top-left);
    ours lets it see keys 0..2 (the queries are the last two positions)."""
    F = torch.nn.functional
    rng = np.random.default_rng(2)
    q, k, v = _rand(rng, 1, 1, 2, 4), _rand(rng, 1, 1, 4, 4), _rand(rng, 1, 1, 4, 4)
    ours = sdpa(q, k, v, is_causal=True)
    ts = [torch.tensor(a) for a in (q, k, v)]
    end = F.scaled_dot_product_attention(*ts, attn_mask=torch.tensor(np.asarray(causal_mask(2, 4))))
    top_left = F.scaled_dot_product_attention(*ts, is_causal=True)
    np.testing.assert_allclose(ours, end.numpy(), rtol=RTOL, atol=ATOL)
    assert not np.allclose(ours, top_left.numpy(), atol=1e-3)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_rows_give_zeros_like_torch(torch, kind):
    F = torch.nn.functional
    rng = np.random.default_rng(3)
    q, k, v = _rand(rng, 1, 2, 3, 4), _rand(rng, 1, 2, 5, 4), _rand(rng, 1, 2, 5, 4)
    allowed = np.ones((3, 5), bool)
    allowed[1] = False
    m = allowed if kind == "bool" else np.where(allowed, 0.0, -np.inf).astype(np.float32)
    want = F.scaled_dot_product_attention(*map(torch.tensor, (q, k, v)), attn_mask=torch.tensor(m))

    def loss(q, k, v):
        out = sdpa(q, k, v, mask=m)
        return jnp.sum(out**2), out

    grads, out = jax.jit(jax.grad(loss, (0, 1, 2), has_aux=True))(q, k, v)  # one program
    np.testing.assert_allclose(out, want.numpy(), rtol=RTOL, atol=ATOL)
    assert np.all(np.asarray(out)[:, :, 1] == 0)
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)
    # float64 takes the explicit softmax path: same answer there.
    with jax.enable_x64(True):
        out64 = jax.jit(lambda *a: sdpa(*a, mask=m))(*(a.astype(np.float64) for a in (q, k, v)))
        np.testing.assert_allclose(out64, want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["one-kv-head-per-head", "grouped"])
def test_explicit_path_equals_fused_path(kv_heads):
    """The two implementations ``_attend`` picks between by platform (the explicit one on
    the CPU, also for dropout and float64; ``jax.nn.dot_product_attention`` elsewhere)
    agree in value and in every gradient, with a bias, a mask, causal or not, with one
    key/value head per query head (``[B, N, T, S]`` scores, written-out softmax
    derivative) and with grouped-query heads."""
    rng = np.random.default_rng(4)
    q, k, v = _rand(rng, 2, 3, 4, 5), _rand(rng, 2, 6, kv_heads, 5), _rand(rng, 2, 6, kv_heads, 5)
    mask = jnp.asarray(rng.random((2, 4, 3, 6)) > 0.3)
    bias = jnp.asarray(_rand(rng, 1, 1, 3, 6))
    cot = jnp.asarray(_rand(rng, 2, 3, 4, 5))

    def both(q, k, v, bias):
        out = []
        for causal in (False, True):
            # jax's own is_causal is top-left aligned; ours (end-aligned) as an explicit mask:
            full = mask & causal_mask(3, 6)[None, None] if causal else mask
            for attend in (
                lambda *a, full=full: jax.nn.dot_product_attention(*a[:3], bias=a[3], mask=full),
                lambda *a, causal=causal: _attend_explicit(
                    *a[:3], mask, a[3], causal, 1 / np.sqrt(5), 0.0, None
                ),
            ):
                value, grads = jax.value_and_grad(
                    lambda *a, attend=attend: jnp.sum(attend(*a) * cot), argnums=(0, 1, 2, 3)
                )(q, k, v, bias)
                out.append((attend(q, k, v, bias), value, grads))
        return out

    results = jax.jit(both)(q, k, v, bias)
    for fused, mine in (results[:2], results[2:]):
        np.testing.assert_allclose(mine[0], fused[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mine[1], fused[1], rtol=1e-5, atol=1e-5)
        for g_mine, g_fused in zip(mine[2], fused[2], strict=True):
            np.testing.assert_allclose(g_mine, g_fused, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("t", "kv_heads"), [(64, 4), (71, 2)], ids=["even-one-kv-head-per-head", "odd-grouped"]
)
def test_causal_halves_equal_one_block(t, kv_heads):
    """Causal self-attention of at least ``_CAUSAL_HALVES_MIN`` positions runs on the CPU
    as two query halves (the first half never scores the second half's keys): the same
    values and gradients as one block of scores with the causal mask, for an even and an
    odd length and with grouped-query heads (float64, to the last bits of the softmax
    sums' order)."""
    from purelayers.functional.attention import CAUSAL_HALVES_MIN as _CAUSAL_HALVES_MIN
    from purelayers.functional.attention import _attend_cpu

    assert t >= _CAUSAL_HALVES_MIN
    rng = np.random.default_rng(5)
    shapes = [(2, t, 4, 8), (2, t, kv_heads, 8), (2, t, kv_heads, 8), (2, t, 4, 8)]
    q, k, v, cot = (_rand(rng, *shape).astype(np.float64) for shape in shapes)

    def run(attend, q, k, v):
        return jax.value_and_grad(lambda *a: jnp.sum(attend(*a) * cot), argnums=(0, 1, 2))(q, k, v)

    @jax.jit  # both in one compiled program
    def both(q, k, v):
        return (
            run(lambda *a: _attend_cpu(*a, None, None, True, 0.3), q, k, v),
            run(lambda *a: _attend_explicit(*a, None, None, True, 0.3, 0.0, None), q, k, v),
        )

    with jax.enable_x64(True):
        halves = jax.make_jaxpr(lambda *a: _attend_cpu(*a, None, None, True, 0.3))(q, k, v)
        assert str(halves).count("exp") == 2  # two softmaxes: two blocks
        (v1, g1), (v2, g2) = both(q, k, v)
        np.testing.assert_allclose(v1, v2, rtol=1e-12)
        for a, b in zip(g1, g2, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_long_causal_sdpa_matches_torch(torch):
    """``is_causal`` self-attention long enough for the CPU's two query halves, against
    torch's ``scaled_dot_product_attention`` in value and in every gradient."""
    F = torch.nn.functional
    rng = np.random.default_rng(6)
    q, k, v = (_rand(rng, 2, 4, 80, 8) for _ in range(3))
    assert_matches_torch(
        Lambda(sdpa),
        _torch_function(
            torch, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        ),
        q,
        k,
        v,
        params={},
        apply=lambda params, q, k, v: sdpa(q, k, v, is_causal=True),
        rtol=RTOL,
        atol=ATOL,
    )


def test_dropout_needs_key_and_is_reproducible():
    rng = np.random.default_rng(5)
    q, k, v = _rand(rng, 1, 2, 4, 4), _rand(rng, 1, 2, 4, 4), _rand(rng, 1, 2, 4, 4)
    with pytest.raises(ValueError, match="needs a PRNG key"):
        sdpa(q, k, v, dropout_p=0.5)
    key = jax.random.key(0)
    a, b = sdpa(q, k, v, dropout_p=0.5, key=key), sdpa(q, k, v, dropout_p=0.5, key=key)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, sdpa(q, k, v))
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\], got 1.5"):
        sdpa(q, k, v, dropout_p=1.5)
    # p = 1, accepted as torch: every attention weight dropped, the output zero
    assert not np.asarray(sdpa(q, k, v, dropout_p=1.0, key=key)).any()


def test_traced_scale_equals_static_scale():
    """A ``scale`` that is a traced value (not a static of the jitted attention) runs the
    same attention inline: equal outputs and gradients."""
    rng = np.random.default_rng(6)
    q, k, v = _rand(rng, 2, 2, 3, 4), _rand(rng, 2, 2, 5, 4), _rand(rng, 2, 2, 5, 4)

    def loss(scale, q):
        return jnp.sum(sdpa(q, k, v, is_causal=True, scale=scale) ** 2)

    static = jax.value_and_grad(lambda q: loss(0.3, q))(q)
    traced = jax.jit(jax.value_and_grad(loss, argnums=1))(jnp.float32(0.3), q)
    for a, b in zip(static, traced, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_causal_halves_are_the_cpu_choice_only():
    """Long causal self-attention runs in two query halves where the program is lowered
    for the CPU (four products and a concatenation), and as ``dot_product_attention``
    where it is lowered for a GPU (two products; no device needed: ``jax.export``),
    through the jitted attention core."""
    q = jnp.ones((1, 2, 64, 8))
    f = jax.jit(lambda q: sdpa(q, q, q, is_causal=True))

    def lowered(platform):
        return jax.export.export(f, platforms=(platform,))(q).mlir_module()

    cpu, cuda = lowered("cpu"), lowered("cuda")
    assert cpu.count("stablehlo.dot_general") == 4 and "stablehlo.concatenate" in cpu
    assert cuda.count("stablehlo.dot_general") == 2 and "stablehlo.concatenate" not in cuda


def test_attention_layers_of_a_stack_share_one_trace():
    """Three attention layers of the same shapes call one jitted attention with one traced
    program (the same jaxpr object), so a stack traces, and differentiates, attention
    once; a changed static (``causal``) gets its own."""

    def attention_calls(layers, x):
        params = [m.init(jax.random.key(i), x.shape) for i, m in enumerate(layers)]

        def f(params, x):
            for m, p in zip(layers, params, strict=True):
                x = m.apply(p, x)
            return x

        jaxpr = jax.make_jaxpr(f)(params, x)
        return [e.params["jaxpr"] for e in jaxpr.eqns if e.params.get("name") == "_attend_core"]

    x = jnp.ones((2, 5, 8))
    calls = attention_calls([MultiHeadAttention(2, causal=True) for _ in range(3)], x)
    assert len(calls) == 3 and calls[0] is calls[1] is calls[2]
    mixed = attention_calls([MultiHeadAttention(2, causal=c) for c in (True, False)], x)
    assert len(mixed) == 2 and mixed[0] is not mixed[1]


def test_sdpa_shape_errors():
    q, k = jnp.zeros((1, 4, 3, 8)), jnp.zeros((1, 3, 5, 8))
    with pytest.raises(ValueError, match="q's 4 heads must be a multiple of k's heads"):
        sdpa(q, k, k)
    with pytest.raises(ValueError, match="k head_dim \\(last axis\\) expected 8, got 6"):
        sdpa(q, jnp.zeros((1, 4, 5, 6)), jnp.zeros((1, 4, 5, 6)))
    with pytest.raises(
        ValueError, match=r"mask must broadcast to .*expected \(1, 4, 3, 5\), got \(3, 4\)"
    ):
        sdpa(q, jnp.zeros((1, 4, 5, 8)), jnp.zeros((1, 4, 5, 8)), mask=jnp.ones((3, 4), bool))


def _reference_attention(q, k, v, allowed):
    """numpy: softmax over the allowed keys of each row, zeros where none is allowed."""
    scores = np.einsum("...td,...sd->...ts", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(allowed, scores, -np.inf)
    out = np.zeros(q.shape[:-1] + v.shape[-1:])
    for idx in np.ndindex(*scores.shape[:-1]):
        row = scores[idx]
        if np.isfinite(row).any():
            w = np.exp(row - row[np.isfinite(row)].max())
            out[idx] = (w / w.sum()) @ v[idx[:-1]]
    return out


@settings(max_examples=10, deadline=None)
@given(
    t=st.integers(1, 3),
    s=st.integers(1, 4),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
    density=st.floats(0.0, 1.0),
)
def test_property_random_masks(t, s, causal, seed, density):
    rng = np.random.default_rng(seed)
    q, k, v = _rand(rng, 2, t, 3), _rand(rng, 2, s, 3), _rand(rng, 2, s, 2)
    mask = rng.random((2, t, s)) < density
    allowed = mask & np.asarray(causal_mask(t, s)) if causal else mask
    run = jax.jit(sdpa, static_argnames="is_causal")  # one program per example
    out = np.asarray(run(q, k, v, mask=mask, is_causal=causal))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, _reference_attention(q, k, v, allowed), rtol=1e-4, atol=1e-5)


# -- rotary_embedding --------------------------------------------------------------------


def _rope_reference(x, positions, theta):
    """Rotate-half RoPE written out entry by entry: the pair (i, i + d/2) rotates by
    position * theta^(-2i/d)."""
    d = x.shape[-1]
    out = np.empty_like(x, dtype=np.float64)
    for idx in np.ndindex(*x.shape[:-1]):
        pos = positions[idx[-1]]
        for i in range(d // 2):
            a = pos * theta ** (-2 * i / d)
            x1, x2 = x[idx][i], x[idx][i + d // 2]
            out[idx][i] = x1 * np.cos(a) - x2 * np.sin(a)
            out[idx][i + d // 2] = x2 * np.cos(a) + x1 * np.sin(a)
    return out


def test_rotary_embedding_matches_reference():
    rng = np.random.default_rng(6)
    x = _rand(rng, 2, 3, 5, 6)
    positions = np.array([0, 1, 2, 7, 100])
    for theta in (10000.0, 500.0):
        np.testing.assert_allclose(
            rotary_embedding(x, positions, theta=theta),
            _rope_reference(x, positions, theta),
            rtol=1e-5,
            atol=1e-5,
        )
    np.testing.assert_allclose(rotary_embedding(x, np.zeros(5, np.int32)), x)


def test_rotary_embedding_preserves_relative_dot_products():
    """RoPE makes <rope(q, m), rope(k, n)> depend on m - n only."""
    rng = np.random.default_rng(7)
    q, k = _rand(rng, 1, 8), _rand(rng, 1, 8)
    dot = [
        float(jnp.sum(rotary_embedding(q, [m]) * rotary_embedding(k, [m - 3]))) for m in (3, 10, 50)
    ]
    np.testing.assert_allclose(dot, dot[0], rtol=1e-4)


def test_rotary_embedding_odd_head_dim_error():
    with pytest.raises(
        ValueError, match="rotary_embedding: rotary embedding needs an even head_dim"
    ):
        rotary_embedding(jnp.zeros((2, 3, 5)), jnp.arange(3))


# -- MultiHeadAttention ------------------------------------------------------------------


def _from_torch_mha(layer, mha, shape):
    template = layer.init(jax.random.key(0), shape)
    renamed = P.rename(mha.state_dict(), P.TORCH_MHA_TO_PURELAYERS)
    assert list(renamed) == list(P.flatten(template))
    return P.load_state_dict(template, renamed)


def _named_like_ours(torch, mha):
    """``mha`` with its parameters listed under our names (``TORCH_MHA_TO_PURELAYERS``),
    so ``assert_matches_torch`` pairs torch's gradients with ours by name; their
    gradients are cleared first. ``torch_call`` runs ``m.mha``."""

    class NamedLikeOurs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def named_parameters(self, *args, **kwargs):
            named = dict(self.mha.named_parameters(*args, **kwargs))
            return iter(P.rename(named, P.TORCH_MHA_TO_PURELAYERS).items())

    mha.zero_grad(set_to_none=True)
    return NamedLikeOurs()


@pytest.mark.parametrize(("bias", "causal"), [(True, False), (False, True)])
def test_mha_matches_torch(torch, bias, causal):
    mha = torch.nn.MultiheadAttention(8, 2, bias=bias, batch_first=True)
    layer = MultiHeadAttention(2, bias=bias, causal=causal)
    params = _from_torch_mha(layer, mha, (2, 5, 8))
    x = _rand(np.random.default_rng(8), 2, 5, 8)
    # torch MHA's boolean attn_mask is True where attention is *not* allowed.
    t_mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1) if causal else None
    assert_matches_torch(
        layer,
        _named_like_ours(torch, mha),
        x,
        params=params,
        torch_call=lambda m, x: m.mha(x, x, x, attn_mask=t_mask, need_weights=False)[0],
        rtol=1e-5,
        atol=1e-5,
    )


def test_mha_cross_attention_and_masks_match_torch(torch):
    mha = torch.nn.MultiheadAttention(8, 4, batch_first=True)
    layer = MultiHeadAttention(4)
    params = _from_torch_mha(layer, mha, (2, 3, 8))
    rng = np.random.default_rng(9)
    x, c = _rand(rng, 2, 3, 8), _rand(rng, 2, 6, 8)
    pad = np.zeros((2, 6), bool)
    pad[0, 4:] = True
    assert_matches_torch(
        layer,
        _named_like_ours(torch, mha),
        x,
        c,
        params=params,
        apply=lambda p, x, c: layer.apply(p, x, context=c, mask=~pad[:, None, None, :]),
        torch_call=lambda m, x, c: m.mha(
            x, c, c, key_padding_mask=torch.tensor(pad), need_weights=False
        )[0],
        rtol=1e-5,
        atol=1e-5,
    )
    fm = _rand(rng, 3, 6)
    assert_matches_torch(
        layer,
        _named_like_ours(torch, mha),
        x,
        c,
        params=params,
        apply=lambda p, x, c: layer.apply(p, x, context=c, mask=fm),
        torch_call=lambda m, x, c: m.mha(x, c, c, attn_mask=torch.tensor(fm), need_weights=False)[
            0
        ],
        rtol=1e-5,
        atol=1e-5,
    )


def test_mha_params_names_shapes_and_init():
    layer = MultiHeadAttention(4, num_kv_heads=2)
    params = layer.init(jax.random.key(0), (2, 5, 16))
    shapes = {k: v.shape for k, v in P.flatten(params).items()}
    assert shapes == {
        "qkv.weight": ((4 + 2 * 2) * 4, 16),
        "qkv.bias": (32,),
        "out.weight": (16, 16),
        "out.bias": (16,),
    }
    assert list(shapes) == ["qkv.weight", "qkv.bias", "out.weight", "out.bias"]
    # torch's init: xavier-uniform in_proj over the packed matrix, zero biases.
    assert np.abs(params["qkv"]["weight"]).max() <= np.sqrt(6 / (16 + 32))
    assert not np.any(params["qkv"]["bias"]) and not np.any(params["out"]["bias"])
    assert np.abs(params["out"]["weight"]).max() <= 1 / 4
    assert list(P.flatten(layer.ordered(jax.jit(lambda p: p)(params)))) == list(shapes)


def test_mha_gradcheck():
    layer = MultiHeadAttention(2, num_kv_heads=1, causal=True, rope=True)
    params = layer.init(jax.random.key(1), (1, 3, 4))
    x = jax.random.normal(jax.random.key(2), (1, 3, 4))
    assert gradcheck(layer.apply, params, x)


def test_mha_unbatched_matches_batched():
    layer = MultiHeadAttention(2, causal=True)
    params = layer.init(jax.random.key(0), (4, 8))
    x = jax.random.normal(jax.random.key(1), (4, 8))
    np.testing.assert_allclose(layer.apply(params, x), layer.apply(params, x[None])[0], atol=1e-6)


def test_mha_dropout_train_only_and_needs_key():
    layer = MultiHeadAttention(2, dropout=0.5)
    params = layer.init(jax.random.key(0), (1, 4, 8))
    x = jax.random.normal(jax.random.key(1), (1, 4, 8))
    np.testing.assert_array_equal(
        layer.apply(params, x), layer.apply(params, x, key=jax.random.key(2))
    )
    with pytest.raises(ValueError, match="MultiHeadAttention: train=True draws random numbers"):
        layer.apply(params, x, train=True)
    y = layer.apply(params, x, train=True, key=jax.random.key(2))
    assert not np.allclose(y, layer.apply(params, x))


def test_mha_errors():
    with pytest.raises(
        ValueError, match="MultiHeadAttention: num_kv_heads must be a divisor of num_heads=4, got 3"
    ):
        MultiHeadAttention(4, num_kv_heads=3)
    with pytest.raises(
        ValueError, match="MultiHeadAttention: num_heads must be a positive integer, got 0"
    ):
        MultiHeadAttention(0)
    layer = MultiHeadAttention(3)
    with pytest.raises(ValueError, match=r"embed_dim 10 .* must be divisible by num_heads 3"):
        layer.init(jax.random.key(0), (2, 4, 10))
    with pytest.raises(ValueError, match=r"embed_dim 8 .* must be divisible by num_heads 3"):
        layer.apply(MultiHeadAttention(2).init(jax.random.key(0), (1, 8)), jnp.zeros((2, 4, 8)))
    params = MultiHeadAttention(2).init(jax.random.key(0), (2, 4, 6))
    with pytest.raises(
        ValueError, match=r"MultiHeadAttention\[qkv\] Linear: input last axis expected 6, got 4"
    ):
        MultiHeadAttention(2).apply(params, jnp.zeros((2, 4, 4)))
    with pytest.raises(ValueError, match=r"context= .* works without rope"):
        MultiHeadAttention(2, rope=True).apply(
            MultiHeadAttention(2).init(jax.random.key(0), (1, 8)),
            jnp.zeros((2, 4, 8)),
            context=jnp.zeros((2, 3, 8)),
        )
    with pytest.raises(ValueError, match="rotary embedding needs an even head_dim"):
        MultiHeadAttention(2, rope=True).init(jax.random.key(0), (2, 4, 6))


# -- decoding with the cache -------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        dict(num_heads=2),
        dict(num_heads=4, num_kv_heads=2),
        dict(num_heads=2, rope=True, num_kv_heads=1),
    ],
)
def test_cached_decoding_equals_full_causal_forward(config):
    layer = MultiHeadAttention(causal=True, **config)
    b, t, e = 2, 7, 8
    params = layer.init(jax.random.key(0), (b, t, e))
    x = jax.random.normal(jax.random.key(1), (b, t, e))
    full = layer.apply(params, x)
    step = jax.jit(lambda p, x, c: layer.apply(p, x, cache=c))
    for chunks in ([1] * t, [2, 2, 2, 1]):
        cache, outs, start = layer.init_cache((b, 10, e)), [], 0
        for n in chunks:
            y, cache = step(params, x[:, start : start + n], cache)
            outs.append(y)
            start += n
        np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, rtol=1e-5, atol=1e-5)
        assert int(cache["length"]) == t and cache["length"].dtype == jnp.int32


def test_jitted_decode_step_compiles_once():
    layer = MultiHeadAttention(2, causal=True, rope=True)
    params = layer.init(jax.random.key(0), (1, 1, 8))
    traces = []

    @jax.jit
    def step(params, x, cache):
        traces.append(1)
        return layer.apply(params, x, cache=cache)

    cache = layer.init_cache((1, 6, 8))
    for i in range(6):
        _, cache = step(params, jnp.full((1, 1, 8), float(i)), cache)
    assert len(traces) == 1
    assert int(cache["length"]) == 6


def test_cache_errors():
    layer = MultiHeadAttention(2, causal=True)
    params = layer.init(jax.random.key(0), (1, 1, 8))
    with pytest.raises(
        ValueError, match=r"init_cache shape expected \(batch, max_len, embed_dim\)"
    ):
        layer.init_cache((1, 8))
    with pytest.raises(ValueError, match="cache keys/values shape"):
        layer.apply(params, jnp.zeros((2, 1, 8)), cache=layer.init_cache((1, 4, 8)))


def test_a_full_cache_raises_eagerly_and_gives_nan_under_jit():
    """Positions past ``max_len`` would overwrite earlier ones (a dynamic update slice
    clamps its start): eagerly an error, traced (where the cached length is not known)
    a NaN output, never the wrong numbers; within the cache the output is finite."""
    layer = MultiHeadAttention(2, causal=True)
    params = layer.init(jax.random.key(0), (1, 3, 8))
    x = jax.random.normal(jax.random.key(1), (1, 3, 8))
    _, cache = layer.apply(params, x, cache=layer.init_cache((1, 4, 8)))
    with pytest.raises(ValueError, match=r"cached length plus new positions at most max_len"):
        layer.apply(params, x[:, :2], cache=cache)
    step = jax.jit(lambda p, x, c: layer.apply(p, x, cache=c))
    y, _ = step(params, x[:, :1], cache)
    assert np.isfinite(np.asarray(y)).all()
    y, full = step(params, x[:, :2], cache)
    assert np.isnan(np.asarray(y)).all() and int(full["length"]) == 5


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_cached_decoding_with_a_key_mask(kind):
    """A mask over the cache's max_len keys combines with the cache's causal mask."""
    layer = MultiHeadAttention(2, causal=True)
    params = layer.init(jax.random.key(0), (1, 4, 8))
    x = jax.random.normal(jax.random.key(1), (1, 4, 8))
    keep = jnp.array([True, False, True, True, True, True])[None, None, None, :]
    mask = keep if kind == "bool" else jnp.where(keep, 0.0, -jnp.inf)
    full = layer.apply(params, x, mask=mask[..., :4])
    cache, outs = layer.init_cache((1, 6, 8)), []
    for i in range(4):
        y, cache = layer.apply(params, x[:, i : i + 1], cache=cache, mask=mask)
        outs.append(y)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, rtol=1e-5, atol=1e-5)
