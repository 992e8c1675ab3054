"""``F.moe_experts`` (the dropless top-k dispatch) equals ``F.moe_experts_reference``
(every expert on every token) in values and first derivatives, for both weight
layouts, biases, the clamped SwiGLU and odd sizes; ``F.load_balancing_loss`` equals
transformers' ``load_balancing_loss_func``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from purelayers import functional as F


def _silu_glu(g, u):
    return jax.nn.silu(g) * u


def _case(seed, n, hidden, inter, experts, top_k, fused):
    rng = np.random.default_rng(seed)
    r = lambda *s: jnp.asarray(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    x, logits = r(n, hidden), r(n, experts)
    if fused:  # gpt-oss: (in, out) layout, one interleaved projection, biases
        w_in, w_out = (r(experts, hidden, 2 * inter),), r(experts, inter, hidden)
        extra = dict(b_in=(r(experts, 2 * inter),), b_out=r(experts, hidden), in_out=True)
        extra["act"] = lambda gu: F.clamped_swiglu(gu * 4, 1.702, 7.0)  # reach the clamps
        weights, idx = F.top_k_routing(logits, top_k, softmax_first=False)
    else:
        w_in, w_out = (
            (r(experts, inter, hidden), r(experts, inter, hidden)),
            r(experts, hidden, inter),
        )
        extra = dict(act=_silu_glu)
        weights, idx = F.top_k_routing(logits, top_k)
    return x, weights, idx, w_in, w_out, extra, r(n, hidden)


def _compare(case, tile=None):
    x, weights, idx, w_in, w_out, extra, cot = case

    @jax.jit
    def both(x, weights, w_in, w_out):
        def run(f, **kw):
            def loss(x, weights, w_in, w_out):
                return jnp.sum(f(x, weights, idx, w_in, w_out, **extra, **kw) * cot)

            return jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(x, weights, w_in, w_out)

        y1 = F.moe_experts(x, weights, idx, w_in, w_out, **extra, tile=tile)
        y2 = F.moe_experts_reference(x, weights, idx, w_in, w_out, **extra)
        return y1, y2, run(F.moe_experts, tile=tile), run(F.moe_experts_reference)

    y1, y2, (l1, g1), (l2, g2) = both(x, weights, w_in, w_out)
    np.testing.assert_allclose(y1, y2, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(l1, l2, rtol=1e-4, atol=1e-3)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3)


def test_benchmark_like_shape():
    """The benchmark's layer at a smaller width: 256 tokens, 8 experts, top 2."""
    _compare(_case(0, 256, 32, 48, 8, 2, fused=False))


@pytest.mark.parametrize(
    "n,experts,top_k,fused,tile",
    [(1, 4, 1, False, None), (7, 5, 2, True, None), (13, 3, 3, False, 4), (33, 6, 2, True, 2)],
)
def test_odd_shapes(n, experts, top_k, fused, tile):
    _compare(_case(n, n, 6, 5, experts, top_k, fused), tile)


def test_jvp_equal():
    x, weights, idx, w_in, w_out, extra, _ = _case(3, 9, 6, 5, 4, 2, fused=True)
    tangent = jnp.ones_like(x)
    f1 = lambda x: F.moe_experts(x, weights, idx, w_in, w_out, **extra)  # noqa: E731
    f2 = lambda x: F.moe_experts_reference(x, weights, idx, w_in, w_out, **extra)  # noqa: E731
    both = jax.jit(lambda x: (jax.jvp(f1, (x,), (tangent,))[1], jax.jvp(f2, (x,), (tangent,))[1]))
    a, b = both(x)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_routing_orders():
    """Softmax over every expert then the top k, renormalized, equals the softmax of the
    top-k logits; gpt-oss's order takes the top logits first."""
    logits = jnp.asarray(np.random.default_rng(0).standard_normal((5, 6)), jnp.float32)
    w, i = F.top_k_routing(logits, 2)
    top = jnp.take_along_axis(logits, i, axis=1)
    np.testing.assert_allclose(w, jax.nn.softmax(top, axis=-1), rtol=1e-6)
    w2, i2 = F.top_k_routing(logits, 2, softmax_first=False)
    np.testing.assert_array_equal(i, i2)
    np.testing.assert_allclose(w2, w, rtol=1e-6)
    w3, _ = F.top_k_routing(logits, 2, normalize=False)
    np.testing.assert_allclose(w3, jnp.take_along_axis(jax.nn.softmax(logits), i, 1), rtol=1e-6)


@pytest.mark.parametrize("masked", [False, True])
def test_load_balancing_loss_equals_transformers(torch, transformers, masked):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    rng = np.random.default_rng(4)
    logits = [rng.standard_normal((2 * 5, 6)).astype(np.float32) for _ in range(3)]
    mask = np.ones((2, 5), np.int64)
    mask[1, :2] = 0
    mask = mask if masked else None
    want = load_balancing_loss_func(
        tuple(torch.tensor(a) for a in logits), 6, 2, None if mask is None else torch.tensor(mask)
    )
    got = F.load_balancing_loss([jnp.asarray(a) for a in logits], 6, 2, mask)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)


def test_errors_name_the_argument():
    import purelayers.layers as L
    from purelayers.models.mixtral import MixtralConfig
    from purelayers.models.qwen3_moe import Qwen3MoeConfig

    x = jnp.zeros((3, 4))
    w, i = jnp.zeros((3, 2)), jnp.zeros((3, 2), jnp.int32)
    with pytest.raises(ValueError, match=r"moe_experts: x must be \(tokens, hidden\)"):
        F.moe_experts(x[0], w, i, (jnp.zeros((2, 5, 4)),), jnp.zeros((2, 4, 5)), act=jax.nn.silu)
    with pytest.raises(ValueError, match="moe_experts: every weight must lead with num_experts"):
        F.moe_experts(x, w, i, (jnp.zeros((3, 5, 4)),), jnp.zeros((2, 4, 5)), act=jax.nn.silu)
    with pytest.raises(ValueError, match="MixtureOfExperts: top_k must be at most num_experts=2"):
        L.MixtureOfExperts(2, 3, 4)
    with pytest.raises(ValueError, match="MixtureOfExperts: style must be one of"):
        L.MixtureOfExperts(2, 1, 4, style="switch")
    with pytest.raises(L.LayerError, match="MixtureOfExperts: input rank"):
        L.MixtureOfExperts(2, 1, 4).init(jax.random.key(0), ())
    with pytest.raises(ValueError, match="MixtralConfig: num_experts must be a positive int"):
        MixtralConfig(num_local_experts=0)
    with pytest.raises(ValueError, match="MixtralConfig: num_experts_per_tok=3 must be at most"):
        MixtralConfig(num_local_experts=2, num_experts_per_tok=3)
    with pytest.raises(ValueError, match="MixtralConfig: router_jitter_noise must be 0"):
        MixtralConfig(router_jitter_noise=0.1)
    with pytest.raises(ValueError, match="Qwen3MoeConfig: use_sliding_window=True"):
        Qwen3MoeConfig(use_sliding_window=True)
    with pytest.raises(ValueError, match="Qwen3MoeConfig: decoder_sparse_step must be"):
        Qwen3MoeConfig(decoder_sparse_step=0)
    with pytest.raises(ValueError, match=r"MixtureOfExperts.*num_experts"):
        L.MixtureOfExperts(0, 1, 4)
    from purelayers import models as M

    with pytest.raises(ValueError, match=r"load_balancing_loss.*num_experts"):
        M.load_balancing_loss([], 0, 1)
    with pytest.raises(ValueError, match=r"load_balancing_loss.*top_k"):
        M.load_balancing_loss([], 2, 0)
    tiny = M.MixtralForCausalLM(
        MixtralConfig(vocab_size=8, hidden_size=8, intermediate_size=4, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, num_local_experts=2)
    )  # fmt: skip
    with pytest.raises(ValueError, match="logits_to_keep"):
        tiny.apply(
            tiny.init(jax.random.key(0), (1, 2)), jnp.zeros((1, 2), jnp.int32), logits_to_keep=-1
        )
