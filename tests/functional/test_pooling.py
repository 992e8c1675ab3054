import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers.functional as F
from tests.functional._equal import assert_same_function


@pytest.mark.parametrize(
    "shape, kernel",
    [((4, 32, 28, 28), (2, 2)), ((2, 3, 6, 9), (2, 3)), ((2, 20, 4, 4, 4), (2, 2, 2))],
)
def test_tiled_max_equals_the_select_chain(shape, kernel):
    """``reduce_tiles``'s max (``max_and_winner``, channels-last over 16 channels on the
    CPU) equals the plain chain of selects, values and derivatives; ties included."""
    x = jnp.round(jax.random.normal(jax.random.key(0), shape) * 2)  # many ties
    assert_same_function(
        lambda x: F.reduce_tiles(x, kernel, jax.lax.max),
        lambda x: F.max_of_taps_reference(x, kernel),
        x,
    )


def test_max_pool_keeps_torchs_nan():
    x = jnp.array([[1.0, jnp.nan, 3.0, jnp.nan]])
    y = F.max_pool(x, (4,), (4,), ((0, 0),), (1,))
    assert np.isnan(y).all()


def test_max_unpool_scatters_and_gathers():
    x = jnp.arange(1.0, 4.0).reshape(1, 1, 3)
    idx = jnp.array([[[0, 2, 2]]])
    np.testing.assert_array_equal(F.max_unpool(x, idx, 4), [[[1.0, 0.0, 3.0, 0.0]]])
    g = jax.grad(lambda x: F.max_unpool(x, idx, 4).sum())(x)
    np.testing.assert_array_equal(g, [[[1.0, 1.0, 1.0]]])
