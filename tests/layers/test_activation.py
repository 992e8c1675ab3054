"""Activations beyond the registry's table (``tests/registry.py`` checks every one against
torch at the kinks and with gradcheck): gradients at kinks by hand, no NaN from unused
branches, PReLU at its kink, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L


def test_kink_gradients_by_hand():
    """At exactly 0 torch takes: relu' = 0, leaky_relu' = slope, elu' = alpha,
    hardsigmoid' = 0 at +-3 and 1/6 inside."""
    g = jax.grad
    assert g(L.relu)(0.0) == 0.0
    assert np.isclose(g(L.leaky_relu)(0.0), 0.01)
    assert np.isclose(g(lambda v: L.elu(v, 0.5))(0.0), 0.5)
    assert g(L.hard_sigmoid)(3.0) == 0.0 and g(L.hard_sigmoid)(-3.0) == 0.0
    assert np.isclose(g(L.hard_sigmoid)(1.0), 1 / 6)


def test_relu6_worked_example():
    """relu6([-1, 0, 3, 6, 7]) = [0, 0, 3, 6, 6]; its gradient is 1 strictly inside
    (0, 6) and 0 elsewhere, the kinks included (torch's hardtanh backward)."""
    x = jnp.array([-1.0, 0.0, 3.0, 6.0, 7.0])
    np.testing.assert_array_equal(L.ReLU6().apply({}, x), [0.0, 0.0, 3.0, 6.0, 6.0])
    np.testing.assert_array_equal(jax.grad(lambda v: L.relu6(v).sum())(x), [0, 0, 1, 0, 0])


def test_no_nan_gradient_from_unused_branches():
    big = jnp.array([100.0, 1000.0])
    for fn in (L.elu, L.selu, L.softplus, lambda v: L.softplus(v, 2.0, 5.0)):
        grad = jax.grad(lambda v, fn=fn: fn(v).sum())(big)
        assert bool(jnp.all(jnp.isfinite(grad))), fn
    assert bool(jnp.all(jnp.isfinite(jax.grad(lambda v: L.softmax(v).sum())(big))))


def test_prelu_at_the_kink_matches_torch(torch):
    """At ``x = 0`` the input gradient is the slope and the weight gradient is 0."""
    module = torch.nn.PReLU(3, init=0.3)
    layer = L.PReLU(3, init_value=0.3)
    x = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    x[0, :, 0] = 0.0
    params = pl.testing.assert_matches_torch(layer, module, x)
    assert np.allclose(params["weight"], 0.3)


def test_prelu_init_and_errors():
    p = L.PReLU(4).init(jax.random.key(0), (2, 4, 3))
    assert p["weight"].shape == (4,) and np.allclose(p["weight"], 0.25)
    with pytest.raises(ValueError, match=r"PReLU: input channels \(axis 1\) expected 4, got 3"):
        L.PReLU(4).apply(p, jnp.ones((2, 3, 3)))
    with pytest.raises(ValueError, match="PReLU: num_parameters must be a positive integer, got 0"):
        L.PReLU(0)


def test_constructor_errors():
    with pytest.raises(
        ValueError, match="GELU: approximate must be one of 'none', 'tanh', got 'erf'"
    ):
        L.GELU("erf")
    with pytest.raises(ValueError, match=r"Softplus: beta must be > 0, got 0"):
        L.Softplus(beta=0)
    with pytest.raises(
        ValueError, match=r"LeakyReLU: negative_slope must be a finite number, got nan"
    ):
        L.LeakyReLU(float("nan"))


def test_layers_are_hashable_configs():
    assert L.LeakyReLU(0.2) == L.LeakyReLU(0.2) and hash(L.LeakyReLU(0.2)) == hash(L.LeakyReLU(0.2))
    assert L.LeakyReLU(0.2) != L.LeakyReLU(0.3)
    assert L.ReLU().init(jax.random.key(0), (3,)) == {}
