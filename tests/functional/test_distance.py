import jax
import jax.numpy as jnp
import pytest

import purelayers.functional as F
from tests.functional._equal import assert_same_function


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, 0.5])
def test_vector_norm_equals_the_formula_away_from_zero(p):
    """The written-out derivative (torch's, masks at 0 and ties) equals JAX's of the
    formula where neither applies."""
    d = 0.5 + jax.random.uniform(jax.random.key(0), (8, 7))
    assert_same_function(
        lambda d: F.vector_norm(d, p), lambda d: jnp.sum(jnp.abs(d) ** p, -1) ** (1 / p), d
    )


def test_cosine_similarity_derivative_is_zero_at_a_zero_vector():
    g = jax.grad(lambda x: F.cosine_similarity(x, jnp.ones((1, 3)), 1).sum())(jnp.zeros((1, 3)))
    assert not jnp.isnan(g).any()
    assert_same_function(
        lambda a, b: F.pairwise_distance(a, b), lambda a, b: jnp.linalg.norm(a - b + 1e-6, axis=-1),
        jnp.ones((4, 3)), jnp.zeros((4, 3)),
    )  # fmt: skip
