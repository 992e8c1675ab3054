import jax
import jax.numpy as jnp
import numpy as np

import purelayers.functional as F


def test_linear_is_the_formula_and_sums_a_bfloat16_bias_gradient_in_float32():
    x = jax.random.normal(jax.random.key(0), (2, 3, 5))
    w, b = jnp.ones((4, 5)), jnp.arange(4.0)
    np.testing.assert_allclose(F.linear(x, w, b), x @ w.T + b[None, None], rtol=1e-6)
    np.testing.assert_allclose(F.linear(x, w.T, transposed=True), x @ w.T, rtol=1e-6)
    xb = jnp.ones((64, 128, 4), jnp.bfloat16)
    g = jax.grad(lambda b: jnp.sum(F.linear(xb, jnp.ones((4, 4), jnp.bfloat16), b)))
    assert float(g(jnp.zeros(4, jnp.bfloat16))[0]) == 64 * 128


def test_bilinear_is_the_formula():
    x1, x2 = jnp.ones((2, 3)), jnp.ones((2, 4))
    w = jnp.ones((5, 3, 4))
    np.testing.assert_allclose(F.bilinear(x1, x2, w, jnp.ones(5)), jnp.full((2, 5), 13.0))
