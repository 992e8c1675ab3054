"""Activations: torch parity of values and gradients (kinks included), gradcheck, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L
from tests.parity import check_parity

# Inputs on both sides of every kink, the kinks themselves (0, +-3), and softplus's
# linear region (beta * x > threshold).
X = np.array(
    [[-30.0, -4.0, -3.0, -2.5, -1.0, -1e-3, 0.0, 1e-3, 0.5, 2.9, 3.0, 3.5, 10.0, 25.0]],
    np.float32,
)

CASES = {
    "ReLU": (lambda: L.ReLU(), lambda t: t.nn.ReLU()),
    "LeakyReLU": (lambda: L.LeakyReLU(0.2), lambda t: t.nn.LeakyReLU(0.2)),
    "LeakyReLU-default": (lambda: L.LeakyReLU(), lambda t: t.nn.LeakyReLU()),
    "ELU": (lambda: L.ELU(0.7), lambda t: t.nn.ELU(0.7)),
    "SELU": (lambda: L.SELU(), lambda t: t.nn.SELU()),
    "GELU": (lambda: L.GELU(), lambda t: t.nn.GELU()),
    "GELU-tanh": (lambda: L.GELU("tanh"), lambda t: t.nn.GELU(approximate="tanh")),
    "SiLU": (lambda: L.SiLU(), lambda t: t.nn.SiLU()),
    "Sigmoid": (lambda: L.Sigmoid(), lambda t: t.nn.Sigmoid()),
    "Tanh": (lambda: L.Tanh(), lambda t: t.nn.Tanh()),
    "Softplus": (lambda: L.Softplus(), lambda t: t.nn.Softplus()),
    "Softplus-beta": (
        lambda: L.Softplus(beta=2.0, threshold=5.0),
        lambda t: t.nn.Softplus(2.0, 5.0),
    ),
    "Softsign": (lambda: L.Softsign(), lambda t: t.nn.Softsign()),
    "HardSigmoid": (lambda: L.HardSigmoid(), lambda t: t.nn.Hardsigmoid()),
    "Softmax": (lambda: L.Softmax(), lambda t: t.nn.Softmax(dim=-1)),
    "Softmax-axis0": (lambda: L.Softmax(axis=0), lambda t: t.nn.Softmax(dim=0)),
    "LogSoftmax": (lambda: L.LogSoftmax(), lambda t: t.nn.LogSoftmax(dim=-1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_torch_parity_values_and_gradients(torch, name):
    make_ours, make_torch = CASES[name]
    layer, module = make_ours(), make_torch(torch)
    x = np.concatenate([X, -X[:, ::-1] * 0.5], axis=0)
    # atol: torch's float32 tanh-GELU gradient is round-off (1e-6) where the true value is ~0
    check_parity(torch, module, layer.apply, {}, [x], rtol=1e-5, atol=1e-5)


def test_exponential_matches_torch_exp(torch):
    x = np.array([-3.0, 0.0, 1.5], np.float32)
    t = torch.tensor(x, requires_grad=True)
    torch.exp(t).sum().backward()
    np.testing.assert_allclose(L.Exponential().apply({}, x), np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(
        jax.grad(lambda v: L.exponential(v).sum())(x), t.grad.numpy(), rtol=1e-6
    )


def test_kink_gradients_by_hand():
    """At exactly 0 torch takes: relu' = 0, leaky_relu' = slope, elu' = alpha,
    hardsigmoid' = 0 at +-3 and 1/6 inside."""
    g = jax.grad
    assert g(L.relu)(0.0) == 0.0
    assert np.isclose(g(L.leaky_relu)(0.0), 0.01)
    assert np.isclose(g(lambda v: L.elu(v, 0.5))(0.0), 0.5)
    assert g(L.hard_sigmoid)(3.0) == 0.0 and g(L.hard_sigmoid)(-3.0) == 0.0
    assert np.isclose(g(L.hard_sigmoid)(1.0), 1 / 6)


def test_no_nan_gradient_from_unused_branches():
    big = jnp.array([100.0, 1000.0])
    for fn in (L.elu, L.selu, L.softplus, lambda v: L.softplus(v, 2.0, 5.0)):
        grad = jax.grad(lambda v, fn=fn: fn(v).sum())(big)
        assert bool(jnp.all(jnp.isfinite(grad))), fn
    assert bool(jnp.all(jnp.isfinite(jax.grad(lambda v: L.softmax(v).sum())(big))))


@pytest.mark.parametrize("num_parameters", [1, 3])
def test_prelu_torch_parity(torch, num_parameters):
    module = torch.nn.PReLU(num_parameters, init=0.3)
    layer = L.PReLU(num_parameters, init_value=0.3)
    from tests.parity import load_from_torch

    shape = (2, 3, 5)
    params = load_from_torch(layer, module, shape)
    assert np.allclose(params["weight"], 0.3)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    x[0, :, 0] = 0.0  # the kink: gradient w.r.t. x is the slope, w.r.t. weight is 0
    check_parity(torch, module, layer.apply, params, [x])


def test_prelu_init_and_errors():
    p = L.PReLU(4).init(jax.random.key(0), (2, 4, 3))
    assert p["weight"].shape == (4,) and np.allclose(p["weight"], 0.25)
    with pytest.raises(ValueError, match=r"PReLU: input channels \(axis 1\) expected 4, got 3"):
        L.PReLU(4).apply(p, jnp.ones((2, 3, 3)))
    with pytest.raises(ValueError, match="PReLU: num_parameters must be a positive integer, got 0"):
        L.PReLU(0)


SMOOTH = ["ELU", "SELU", "GELU", "GELU-tanh", "SiLU", "Sigmoid", "Tanh", "Softplus", "Softsign",
          "Softmax", "LogSoftmax", "LeakyReLU", "ReLU", "HardSigmoid"]  # fmt: skip


@pytest.mark.parametrize("name", SMOOTH)
def test_gradcheck(name):
    layer = CASES[name][0]()
    # away from the kinks (0 and +-3), where finite differences are meaningful
    x = jnp.array([[-2.2, -0.7, 0.4, 1.3, 2.6], [-1.9, -0.3, 0.6, 0.9, 2.2]])
    assert pl.testing.gradcheck(layer.apply, {}, x)


def test_gradcheck_prelu():
    layer = L.PReLU(3)
    params = layer.init(jax.random.key(0), (2, 3, 2))
    x = jnp.array([[[-1.0, 0.5], [0.3, -0.2], [1.1, -2.0]], [[0.7, -0.4], [-1.5, 0.2], [0.6, 0.9]]])
    assert pl.testing.gradcheck(layer.apply, params, x)


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
