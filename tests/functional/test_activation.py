import jax
import jax.numpy as jnp
import numpy as np

import purelayers.functional as F
import purelayers.layers as L


def test_layers_reexport_the_functions():
    assert L.relu is F.relu and L.gelu is F.gelu and L.softmax is F.softmax and L.prelu is F.prelu


def test_prelu_and_softmax():
    x = jnp.array([[-2.0, 1.0], [3.0, -4.0]])
    np.testing.assert_allclose(F.prelu(x, jnp.array([0.5, 0.25])), [[-1.0, 1.0], [3.0, -1.0]])
    np.testing.assert_allclose(F.softmax(x, 0).sum(0), [1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(F.gelu(x, "tanh"), jax.nn.gelu(x, approximate=True))
