"""Activations beyond the registry's table (``tests/registry.py`` and
``tests/catalog/activations.py`` check every one against torch at the kinks and with
gradcheck; the catalog also holds their constructor and shape errors): gradients at kinks
by hand, worked examples, every option against torch at its own kinks, integer inputs,
NaN and infinities, no NaN from unused branches, PReLU at its kink, RReLU's training
draws, errors."""

import dataclasses

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


def test_prelu_takes_torchs_init_argument(torch):
    """``PReLU(num_parameters, init)`` as torch spells it, by keyword or position, starts
    from torch's weight; ``init_value`` (the field's name) still works and equals it."""
    ours = L.PReLU(num_parameters=3, init=0.1)
    assert ours == L.PReLU(3, 0.1) == L.PReLU(3, init_value=0.1)
    weight = ours.init(jax.random.key(0), (2, 3, 4))["weight"]
    np.testing.assert_array_equal(
        weight, torch.nn.PReLU(num_parameters=3, init=0.1).weight.detach()
    )


def test_constructor_errors():
    with pytest.raises(
        ValueError, match="GELU: approximate must be one of 'none', 'tanh', got 'erf'"
    ):
        L.GELU("erf")
    with pytest.raises(ValueError, match=r"Softplus: beta must be nonzero .*, got 0"):
        L.Softplus(beta=0)
    with pytest.raises(
        ValueError, match=r"LeakyReLU: negative_slope must be a finite number, got nan"
    ):
        L.LeakyReLU(float("nan"))


def test_layers_are_hashable_configs():
    assert L.LeakyReLU(0.2) == L.LeakyReLU(0.2) and hash(L.LeakyReLU(0.2)) == hash(L.LeakyReLU(0.2))
    assert L.LeakyReLU(0.2) != L.LeakyReLU(0.3)
    assert L.ReLU().init(jax.random.key(0), (3,)) == {}


# -- the torch-named round: piecewise, gated, softmin, the randomized leaky ReLU -------


def test_new_activations_worked_examples():
    """By hand: hardtanh clamps to [-1, 1] with slope 0 at the bounds; hardswish is
    x (x + 3) / 6 inside (-3, 3), slope x / 3 + 1/2 there (1 at 1.5), 0 at -3 and 1 at 3;
    threshold(0.5, -1) replaces 0 and 0.5 itself; softshrink(0.5) moves -2 and 1 by 0.5
    towards 0 and zeroes [-0.5, 0.5]; hardshrink(0.5) zeroes [-0.5, 0.5] only; rrelu's
    eval slope is (0.1 + 0.3) / 2 = 0.2, also at 0; celu(2) at -2 is 2 (e^-1 - 1) with
    slope e^-1, and slope 1 at 0; glu halves [2, 4 | 0, 0] to [2, 4] * sigmoid(0);
    softmin([0, ln 3]) = [1, 1/3] / (4/3); mish'(0) = tanh(ln 2) = 0.6; log-sigmoid(0)
    = -ln 2 with slope 1/2; tanhshrink'(0) = tanh(0)^2 = 0."""
    pw = jnp.array([-2.0, -1.0, 0.5, 1.0, 3.0])
    hs = jnp.array([-4.0, -3.0, 0.0, 1.5, 3.0, 4.0])
    sh = jnp.array([-2.0, -0.5, 0.25, 0.5, 1.0])
    layers = {
        "hardtanh": (L.Hardtanh(), pw),
        "hardswish": (L.Hardswish(), hs),
        "threshold": (L.Threshold(0.5, -1.0), jnp.array([0.0, 0.5, 2.0])),
        "softshrink": (L.Softshrink(), sh),
        "hardshrink": (L.Hardshrink(), sh),
        "rrelu": (L.RReLU(0.1, 0.3), jnp.array([-1.0, 0.0, 2.0])),
        "celu": (L.CELU(2.0), jnp.array([-2.0, 0.0, 1.0])),
        "mish": (L.Mish(), jnp.zeros(1)),
        "logsigmoid": (L.LogSigmoid(), jnp.zeros(1)),
        "tanhshrink": (L.Tanhshrink(), jnp.zeros(1)),
    }

    @jax.jit
    def run():
        out = {}
        for name, (layer, x) in layers.items():
            y, vjp = jax.vjp(lambda v, layer=layer: layer.apply({}, v), x)
            out[name] = (y, vjp(jnp.ones_like(y))[0])
        out["glu"] = L.GLU().apply({}, jnp.array([[2.0, 4.0, 0.0, 0.0]]))
        out["softmin"] = L.Softmin(-1).apply({}, jnp.array([0.0, np.log(3.0)]))
        return out

    out = run()
    e = np.exp(-1.0)
    want = {
        "hardtanh": ([-1, -1, 0.5, 1, 1], [0, 0, 1, 0, 0]),
        "hardswish": ([0, 0, 0, 1.125, 3, 4], [0, 0, 0.5, 1, 1, 1]),
        "threshold": ([-1, -1, 2], [0, 0, 1]),
        "softshrink": ([-1.5, 0, 0, 0, 0.5], [1, 0, 0, 0, 1]),
        "hardshrink": ([-2, 0, 0, 0, 1], [1, 0, 0, 0, 1]),
        "rrelu": ([-0.2, 0, 2], [0.2, 0.2, 1]),
        "celu": ([2 * (e - 1), 0, 1], [e, 1, 1]),
        "mish": ([0], [0.6]),
        "logsigmoid": ([-np.log(2)], [0.5]),
        "tanhshrink": ([0], [0]),
    }
    for name, (y, dy) in want.items():
        np.testing.assert_allclose(out[name][0], y, rtol=1e-6, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(out[name][1], dy, rtol=1e-6, atol=1e-7, err_msg=name)
    np.testing.assert_allclose(out["glu"], [[1.0, 2.0]])
    np.testing.assert_allclose(out["softmin"], [0.75, 0.25], rtol=1e-6)


def _with_kinks(*kinks: float) -> np.ndarray:
    """The kinks themselves, a hair either side, and a few ordinary values."""
    k = np.array(kinks, np.float32)
    rest = np.array([-7.0, -2.2, -0.05, 0.0, 0.8, 4.5], np.float32)
    return np.concatenate([k, k - 1e-3, k + 1e-3, rest]).reshape(2, -1)


def test_options_match_torch_at_their_kinks(torch):
    """Every documented option against torch, outputs and gradients, at its own kinks
    (rrelu in eval mode; softmin's implicit dim at every rank torch distinguishes)."""
    nn = torch.nn
    rng = np.random.default_rng(0)
    cases = [
        (L.Hardtanh(-0.5, 2.0), nn.Hardtanh(-0.5, 2.0), _with_kinks(-0.5, 2.0)),
        (L.ReLU6(), nn.ReLU6(), _with_kinks(0.0, 6.0)),
        (L.Hardswish(), nn.Hardswish(), _with_kinks(-3.0, 3.0)),
        (L.Threshold(-1.0, 3.5), nn.Threshold(-1.0, 3.5), _with_kinks(-1.0, 3.5)),
        (L.Softshrink(0.25), nn.Softshrink(0.25), _with_kinks(-0.25, 0.25)),
        (L.Softshrink(0.0), nn.Softshrink(0.0), _with_kinks(0.0, 1.0)),
        (L.Hardshrink(0.25), nn.Hardshrink(0.25), _with_kinks(-0.25, 0.25)),
        (L.Hardshrink(-1.0), nn.Hardshrink(-1.0), _with_kinks(-1.0, 1.0)),
        (L.CELU(0.5), nn.CELU(0.5), _with_kinks(0.0, -1.0)),
        (L.CELU(-2.0), nn.CELU(-2.0), _with_kinks(0.0, 1.0) / 4),
        (L.RReLU(0.1, 0.3), nn.RReLU(0.1, 0.3), _with_kinks(0.0, -1.0)),
        (L.GLU(0), nn.GLU(0), rng.standard_normal((4, 3)).astype(np.float32)),
        (L.GLU(1), nn.GLU(1), rng.standard_normal((2, 6, 3)).astype(np.float32)),
        (L.Softmin(0), nn.Softmin(0), rng.standard_normal((3, 4)).astype(np.float32)),
        (L.Softmax2d(), nn.Softmax2d(), rng.standard_normal((3, 2, 2)).astype(np.float32)),
    ]
    for shape in [(), (5,), (2, 3), (2, 3, 4), (2, 3, 2, 2)]:  # implicit dim 0, 0, 1, 0, 1
        x = rng.standard_normal(shape).astype(np.float32)
        cases.append((L.Softmin(), nn.Softmin(), x))
        # torch's nn.Softmax() / nn.LogSoftmax(): dim=None, the same implicit choice
        cases.append((L.Softmax(None), nn.Softmax(), x))
        cases.append((L.LogSoftmax(axis=None), nn.LogSoftmax(), x))
    for layer, module, x in cases:
        pl.testing.assert_matches_torch(layer, module, x)


def test_integer_inputs_truncate_the_bounds_as_torch(torch):
    """torch converts a float bound to an integer input's dtype by truncation towards
    zero: hardtanh(-1.5, 0.7) clamps to [-1, 0]; threshold(-0.5, 2.7) is x > 0 else 2."""
    values = np.arange(-3, 4)
    x = jnp.asarray(values, jnp.int32)
    F = torch.nn.functional
    for layer, theirs in [
        (L.Hardtanh(-1.5, 0.7), F.hardtanh(torch.tensor(values), -1.5, 0.7)),
        (L.Threshold(-0.5, 2.7), F.threshold(torch.tensor(values), -0.5, 2.7)),
        (L.Threshold(1.5, -7.0), F.threshold(torch.tensor(values), 1.5, -7.0)),
    ]:
        ours = layer.apply({}, x)
        assert ours.dtype == jnp.int32
        np.testing.assert_array_equal(ours, theirs.numpy())
    ours = L.Tanhshrink().apply({}, x)
    assert ours.dtype == jnp.float32  # torch: float32 too
    np.testing.assert_allclose(ours, F.tanhshrink(torch.tensor(values)).numpy(), rtol=1e-6)


def test_nan_and_infinities_as_torch(torch):
    """NaN propagates and the infinities land where torch's do (hardswish(-inf) and
    mish(-inf) are NaN, as ``-inf * 0``); no gradient turns NaN at large inputs."""
    nn = torch.nn
    pairs = [
        (L.ReLU(), nn.ReLU()),
        (L.Hardtanh(), nn.Hardtanh()),
        (L.Hardswish(), nn.Hardswish()),
        (L.Threshold(0.1, 20.0), nn.Threshold(0.1, 20.0)),
        (L.Softshrink(), nn.Softshrink()),
        (L.Hardshrink(), nn.Hardshrink()),
        (L.Tanhshrink(), nn.Tanhshrink()),
        (L.RReLU(), nn.RReLU()),
        (L.CELU(), nn.CELU()),
        (L.Mish(), nn.Mish()),
        (L.LogSigmoid(), nn.LogSigmoid()),
    ]
    x = np.array([np.nan, np.inf, -np.inf, -1.0, 1.0], np.float32)
    big = jnp.array([-1000.0, 1000.0])

    @jax.jit
    def run(x):
        outs = [layer.apply({}, x) for layer, _ in pairs]
        grads = [jax.grad(lambda v, f=layer: f.apply({}, v).sum())(big) for layer, _ in pairs]
        return outs, grads

    outs, grads = run(x)
    for (layer, module), ours, grad in zip(pairs, outs, grads, strict=True):
        theirs = module.eval()(torch.tensor(x)).numpy()
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, err_msg=type(layer).__name__)
        assert bool(jnp.all(jnp.isfinite(grad))), type(layer).__name__


def test_rrelu_trains_with_a_random_slope_per_entry():
    """Slopes drawn in [lower, upper] (mean near the midpoint 0.2 over 2048 draws), the
    same key gives the same output and another a different one, the gradient is the
    slope drawn (at 0 too), positive entries pass; eval mode ignores the key."""
    layer = L.RReLU(0.1, 0.3)
    x = jnp.repeat(jnp.array([[-1.0], [0.0], [2.0]]), 2048, axis=1)

    @jax.jit
    def run(k1, k2):
        def f(v, k):
            return layer.apply({}, v, train=True, key=k)

        grad = jax.grad(lambda v: f(v, k1).sum())(x)
        return f(x, k1), f(x, k1), f(x, k2), grad, layer.apply({}, x, key=k1)

    y, again, other, grad, evaluated = run(jax.random.key(0), jax.random.key(1))
    slopes = -np.asarray(y[0])
    assert slopes.min() >= 0.1 and slopes.max() <= 0.3
    assert abs(slopes.mean() - 0.2) < 0.01
    assert slopes.std() > 0.04  # uniform on a width of 0.2: std 0.058
    np.testing.assert_array_equal(y, again)
    assert not np.array_equal(y[0], other[0])
    np.testing.assert_array_equal(grad[0], slopes)
    assert np.all((grad[1] >= 0.1) & (grad[1] <= 0.3)) and np.all(y[1] == 0)
    np.testing.assert_array_equal(y[2], 2.0)
    np.testing.assert_array_equal(grad[2], 1.0)
    np.testing.assert_allclose(evaluated[0], -0.2, rtol=1e-6)


def test_hardsigmoid_is_one_class_and_glu_halves_its_dim():
    assert L.Hardsigmoid is L.HardSigmoid
    assert {"Hardsigmoid", "HardSigmoid"} <= set(L.__all__)
    assert L.GLU().halves_width and not L.GLU(1).halves_width
    y = jax.eval_shape(lambda: L.GLU(1).apply({}, jnp.zeros((2, 6, 3))))
    assert y.shape == (2, 3, 3)
    assert L.Softmin() != L.Softmin(1) and hash(L.Threshold(0.1, 2.0)) == hash(
        L.Threshold(0.1, 2.0)
    )


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_derivative_is_torchs(torch, approximate):
    """GELU's derivative: float64 gradients equal torch's GELU backward over [-10, 10]
    (kinks of nothing, but both tails and 0), second derivatives and forward mode equal
    JAX's derivative of the formula itself."""
    from purelayers.layers.activation import gelu

    def formula(v):
        return jax.nn.gelu(v, approximate=approximate == "tanh")

    def ours(v):
        return gelu(v, approximate)

    @jax.jit  # every derivative in one compiled program
    def derivatives(x):
        return (
            jax.vmap(jax.grad(ours))(x),
            jax.vmap(jax.grad(jax.grad(ours)))(x),
            jax.vmap(jax.grad(jax.grad(formula)))(x),
            jax.vmap(jax.jacfwd(ours))(x),
        )

    with jax.enable_x64(True):
        x = np.linspace(-10.0, 10.0, 2001, dtype=np.float64)
        first, second, second_of_formula, forward = derivatives(x)
        xt = torch.tensor(x, requires_grad=True)
        torch.nn.functional.gelu(xt, approximate=approximate).sum().backward()
        np.testing.assert_allclose(first, xt.grad.numpy(), rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(second, second_of_formula, atol=1e-12)
        np.testing.assert_allclose(forward, first, rtol=1e-12, atol=1e-13)


_INPLACE = (
    "ReLU ReLU6 LeakyReLU ELU CELU SELU Hardtanh Hardswish Hardsigmoid SiLU Mish Threshold "
    "RReLU Dropout Dropout1d Dropout2d Dropout3d AlphaDropout FeatureAlphaDropout"
).split()


@pytest.mark.parametrize("name", _INPLACE)
def test_torchs_inplace_flag_is_accepted_where_torch_has_it(torch, name):
    """Every layer whose torch twin takes ``inplace`` takes it too, in torch's position
    (after the other arguments, so ``LeakyReLU(0.2, True)`` reads as torch's), and it
    changes nothing: ``apply`` returns a new array and leaves its input alone, in eval
    mode and, for the dropouts, in train mode with the same key. A non-bool is refused."""
    import inspect

    theirs = [p for p in inspect.signature(getattr(torch.nn, name).__init__).parameters]
    ours = [f.name for f in dataclasses.fields(getattr(L, name))]
    assert ours == theirs[1 : len(ours) + 1] and "inplace" in ours
    args = {"Threshold": (0.1, 20.0)}.get(name, ())
    plain, flagged = getattr(L, name)(*args), getattr(L, name)(*args, inplace=True)
    shape = {"Dropout1d": (2, 3, 4), "Dropout3d": (2, 3, 4, 5, 2)}.get(name, (2, 3, 4, 5))
    x = jnp.asarray(np.random.default_rng(0).normal(size=shape), jnp.float32)
    before = np.asarray(x).copy()
    key = jax.random.key(0)
    for train in (False, True):
        kw = {"train": True, "key": key} if train else {}
        np.testing.assert_array_equal(flagged.apply({}, x, **kw), plain.apply({}, x, **kw))
    np.testing.assert_array_equal(x, before)
    with pytest.raises(ValueError, match=r"^\w+: inplace must be True or False, got 1$"):
        getattr(L, name)(*args, inplace=1)
