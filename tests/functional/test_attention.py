"""``F.dot_product_attention`` (the fast path: on the CPU the explicit form in query
halves, elsewhere ``jax.nn.dot_product_attention``) equals
``F.dot_product_attention_reference`` in values and first derivatives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from purelayers import functional as F
from purelayers.functional.attention import _attend_cpu


def _rand(seed, *shapes, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s).astype(dtype)) for s in shapes]


def _compare(fast, ref, q, k, v, cot, rtol, atol):
    """Values and gradients in q, k, v of ``sum(f(q, k, v) * cot)``, both functions in one
    jitted program."""

    @jax.jit
    def both(q, k, v):
        def run(f):
            return jax.value_and_grad(lambda *a: jnp.sum(f(*a) * cot), argnums=(0, 1, 2))(q, k, v)

        return fast(q, k, v), ref(q, k, v), run(fast), run(ref)

    y1, y2, (l1, g1), (l2, g2) = both(q, k, v)
    np.testing.assert_allclose(y1, y2, rtol=rtol, atol=atol)
    np.testing.assert_allclose(l1, l2, rtol=rtol, atol=atol)
    for a, b in zip(g1, g2, strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def test_benchmark_shape_causal():
    """The transformer benchmark's attention: batch 16, seq 128, 8 heads of 32, causal
    (the CPU runs it in query halves)."""
    q, k, v, cot = _rand(0, *[(16, 128, 8, 32)] * 4)
    _compare(
        lambda *a: F.dot_product_attention(*a, is_causal=True),
        lambda *a: F.dot_product_attention_reference(*a, is_causal=True),
        q, k, v, cot, 2e-5, 2e-5,
    )  # fmt: skip


@pytest.mark.parametrize("t", [1, 3, 65])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_odd_shapes_with_masks(t, kv_heads):
    """Odd lengths, grouped-query heads, a boolean mask with a fully masked row, a bias
    with -inf entries, causal or not (float64)."""
    with jax.enable_x64(True):
        q, k, v, cot = _rand(
            t, (2, t, 4, 8), (2, t, kv_heads, 8), (2, t, kv_heads, 6), (2, t, 4, 6),
            dtype=np.float64,
        )  # fmt: skip
        mask = jnp.asarray(np.random.default_rng(1).random((2, 1, t, t)) > 0.3)
        mask = mask.at[0, 0, 0].set(False)  # one row with nothing to attend
        bias = jnp.where(mask, 0.5, -jnp.inf)[:1]
        for causal in (False, True):
            for kw in ({"mask": mask}, {"bias": bias}, {}):
                _compare(
                    lambda *a, kw=kw, c=causal: F.dot_product_attention(*a, is_causal=c, **kw),
                    lambda *a, kw=kw, c=causal: F.dot_product_attention_reference(
                        *a, is_causal=c, **kw
                    ),
                    q, k, v, cot, 1e-10, 1e-12,
                )  # fmt: skip


@pytest.mark.parametrize("t", [64, 65])
def test_cpu_halves_equal_reference(t):
    """The CPU's form in two query halves, float32, even and odd lengths."""
    q, k, v, cot = _rand(2, (2, t, 4, 8), (2, t, 2, 8), (2, t, 2, 8), (2, t, 4, 8))
    _compare(
        lambda *a: _attend_cpu(*a, None, None, True, 0.3),
        lambda *a: F.dot_product_attention_reference(*a, is_causal=True, scale=0.3),
        q, k, v, cot, 2e-5, 2e-5,
    )  # fmt: skip


def test_other_platforms_form_equals_reference():
    """``jax.nn.dot_product_attention``, what other platforms run, with a mask and a bias."""
    q, k, v, cot = _rand(3, (2, 5, 4, 8), (2, 7, 4, 8), (2, 7, 4, 8), (2, 5, 4, 8))
    mask = jnp.asarray(np.random.default_rng(2).random((2, 4, 5, 7)) > 0.2)
    bias = _rand(4, (1, 1, 5, 7))[0]
    _compare(
        lambda *a: jax.nn.dot_product_attention(*a, mask=mask, bias=bias),
        lambda *a: F.dot_product_attention_reference(*a, mask=mask, bias=bias),
        q, k, v, cot, 2e-5, 2e-5,
    )  # fmt: skip


def test_torch_layout_wrapper_and_weights():
    """``scaled_dot_product_attention`` is ``dot_product_attention`` in torch's layout;
    the reference's weights sum to one per attending row."""
    q, k, v = _rand(5, (2, 4, 3, 8), (2, 4, 6, 8), (2, 4, 6, 8))
    mine = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = lambda a: jnp.swapaxes(a, 1, 2)  # noqa: E731
    out, w = F.dot_product_attention_reference(
        t(q), t(k), t(v), is_causal=True, return_weights=True
    )
    np.testing.assert_allclose(mine, t(out), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
