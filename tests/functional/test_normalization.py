import jax
import pytest

import purelayers.functional as F
from tests.functional._equal import assert_same_function


@pytest.mark.parametrize(
    "shape, axes", [((16, 128, 256), (2,)), ((3, 5, 7), (1, 2)), ((4, 6, 5, 5), (0, 2, 3))]
)
def test_moments_equal_two_passes(shape, axes):
    x = 3 + jax.random.normal(jax.random.key(0), shape)
    assert_same_function(
        lambda x: F.moments(x, axes),
        lambda x: F.moments_reference(x, axes),
        x,
        rtol=1e-4,
        atol=1e-4,
    )
    assert_same_function(
        lambda x: F.layer_norm_moments(x, axes),
        lambda x: F.moments_reference(x, axes)[1:],
        x,
        rtol=1e-4,
        atol=1e-4,
    )
