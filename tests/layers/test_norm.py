"""Normalization layers: worked examples, torch parity, gradcheck, dtypes, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from purelayers import layers as L
from purelayers.init import constant
from purelayers.params import flatten
from purelayers.testing import gradcheck
from tests.parity import check_parity, load_from_torch

RNG = np.random.default_rng(0)


def _x(*shape, shift=0.0):
    return (RNG.standard_normal(shape) + shift).astype(np.float32)


def _randomize(params, seed=1):
    """Non-trivial affine params so parity also exercises weight and bias."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda a: jnp.asarray(rng.standard_normal(a.shape).astype(np.float32)), params
    )


def _torch_randomize(torch, module, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return module


# -- worked examples -----------------------------------------------------------------


def test_layer_norm_worked_example():
    """[0, 0.002]: mean 0.001, population variance 1e-6, so
    y = [-0.001, 0.001] / sqrt(1e-6 + 1e-5) = [-0.30151, 0.30151]."""
    ln = L.LayerNorm()
    x = jnp.array([[0.0, 0.002]])
    y = ln.apply(ln.init(jax.random.key(0), x.shape), x)
    np.testing.assert_allclose(y, [[-0.30151, 0.30151]], atol=1e-5)


def test_rms_norm_worked_example():
    """arange(9).reshape(3, 3), eps 1e-5: the mean squares of the rows are 5/3, 50/3 and
    149/3, so the rows divide by 1.2910, 4.0825 and 7.0475."""
    rms = L.RMSNorm(eps=1e-5)
    x = jnp.arange(9.0).reshape(3, 3)
    y = rms.apply(rms.init(jax.random.key(0), x.shape), x)
    expected = [[0, 0.7746, 1.5492], [0.7348, 0.9798, 1.2247], [0.8514, 0.9933, 1.1352]]
    np.testing.assert_allclose(y, expected, atol=1e-4)


def test_rms_norm_default_eps_is_float32_machine_epsilon():
    """With eps None, a tiny row [1e-4, 0] has mean square 5e-9, comparable to eps
    1.19e-7: y0 = 1e-4 / sqrt(5e-9 + 1.19e-7) = 0.2838, not 1.414 (eps 0) and not the
    bfloat16 epsilon's 0.0011, also for bfloat16 input."""
    rms = L.RMSNorm()
    x = jnp.array([[1e-4, 0.0]])
    params = rms.init(jax.random.key(0), x.shape)
    expected = 1e-4 / np.sqrt(5e-9 + np.finfo(np.float32).eps)
    np.testing.assert_allclose(rms.apply(params, x)[0, 0], expected, rtol=1e-5)
    y16 = rms.apply(params, x.astype(jnp.bfloat16))
    np.testing.assert_allclose(float(y16[0, 0]), expected, rtol=1e-2)


# -- parameters ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "layer, shape, expected",
    [
        (L.LayerNorm(), (2, 3, 4), {"weight": (4,), "bias": (4,)}),
        (L.LayerNorm(normalized_ndim=2), (2, 3, 4), {"weight": (3, 4), "bias": (3, 4)}),
        (L.LayerNorm(bias=False), (2, 4), {"weight": (4,)}),
        (L.LayerNorm(elementwise_affine=False), (2, 4), {}),
        (L.RMSNorm(), (2, 3, 4), {"weight": (4,)}),
        (L.RMSNorm(normalized_ndim=2), (2, 3, 4), {"weight": (3, 4)}),
        (L.RMSNorm(elementwise_affine=False), (2, 4), {}),
    ],
)
def test_param_names_shapes_and_defaults(layer, shape, expected):
    params = layer.init(jax.random.key(0), shape)
    assert {k: tuple(v.shape) for k, v in flatten(params).items()} == expected
    assert list(flatten(params)) == list(expected)
    if "weight" in params:
        np.testing.assert_array_equal(params["weight"], 1.0)
    if "bias" in params:
        np.testing.assert_array_equal(params["bias"], 0.0)


def test_init_overrides():
    ln = L.LayerNorm(weight_init=constant(2.0), bias_init=constant(0.5))
    params = ln.init(jax.random.key(0), (3, 4))
    np.testing.assert_array_equal(params["weight"], 2.0)
    np.testing.assert_array_equal(params["bias"], 0.5)
    rms = L.RMSNorm(weight_init=constant(3.0))
    np.testing.assert_array_equal(rms.init(jax.random.key(0), (3, 4))["weight"], 3.0)


def test_layers_are_hashable_and_compare_by_configuration():
    assert L.LayerNorm(eps=1e-6) == L.LayerNorm(eps=1e-6)
    assert hash(L.RMSNorm()) == hash(L.RMSNorm())
    assert L.LayerNorm() != L.LayerNorm(bias=False)


# -- torch parity --------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, torch_kwargs, shape",
    [
        ({}, {}, (4, 5, 8)),
        ({"eps": 1e-3}, {"eps": 1e-3}, (3, 6)),
        ({"normalized_ndim": 2}, {}, (2, 3, 4, 5)),
        ({"bias": False}, {"bias": False}, (3, 7)),
        ({"elementwise_affine": False}, {"elementwise_affine": False}, (3, 7)),
    ],
)
def test_layer_norm_torch_parity(torch, kwargs, torch_kwargs, shape):
    ln = L.LayerNorm(**kwargs)
    nd = kwargs.get("normalized_ndim", 1)
    module = _torch_randomize(torch, torch.nn.LayerNorm(shape[-nd:], **torch_kwargs))
    params = load_from_torch(ln, module, shape)
    check_parity(torch, module, ln.apply, params, [_x(*shape, shift=2.0)], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, torch_kwargs, shape",
    [
        ({}, {}, (4, 5, 8)),
        ({"eps": 1e-5}, {"eps": 1e-5}, (3, 6)),
        ({"normalized_ndim": 2}, {}, (2, 3, 4, 5)),
        ({"elementwise_affine": False}, {"elementwise_affine": False}, (3, 7)),
    ],
)
def test_rms_norm_torch_parity(torch, kwargs, torch_kwargs, shape):
    rms = L.RMSNorm(**kwargs)
    nd = kwargs.get("normalized_ndim", 1)
    module = _torch_randomize(torch, torch.nn.RMSNorm(shape[-nd:], **torch_kwargs))
    params = load_from_torch(rms, module, shape)
    check_parity(torch, module, rms.apply, params, [_x(*shape)], rtol=1e-4, atol=1e-5)


def test_layer_norm_large_mean_stays_accurate():
    """Rows with |mean| >> std: a one-pass E[x^2] - E[x]^2 variance loses every digit at
    shift 1000 in float32 (error ~0.4); the two-pass form stays within 2e-4."""
    x = _x(8, 64, shift=1000.0)
    ln = L.LayerNorm()
    y = np.asarray(ln.apply(ln.init(jax.random.key(0), x.shape), jnp.asarray(x)))
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref, atol=2e-4)


# -- gradients -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "layer",
    [L.LayerNorm(), L.LayerNorm(normalized_ndim=2), L.RMSNorm(), L.RMSNorm(eps=1e-5)],
    ids=["ln", "ln2d", "rms", "rms-eps"],
)
def test_gradcheck(layer):
    x = jnp.asarray(_x(2, 3, 4))
    params = _randomize(layer.init(jax.random.key(0), x.shape))
    assert gradcheck(layer.apply, params, x)


# -- dtypes and transformations ------------------------------------------------------


@pytest.mark.parametrize(
    "layer", [L.LayerNorm(), L.RMSNorm(), L.LayerNorm(normalized_ndim=2)], ids=repr
)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_returns_input_dtype_close_to_float32(layer, dtype):
    x = jnp.asarray(_x(4, 3, 16, shift=1.0))
    params = _randomize(layer.init(jax.random.key(0), x.shape))
    y32 = layer.apply(params, x)
    y = layer.apply(params, x.astype(dtype))
    assert y.dtype == dtype
    tol = 3e-2 if dtype == jnp.bfloat16 else 5e-3
    np.testing.assert_allclose(np.asarray(y, np.float32), y32, rtol=tol, atol=tol)


@pytest.mark.parametrize("layer", [L.LayerNorm(), L.RMSNorm()], ids=repr)
def test_jit_and_vmap_equal_eager(layer):
    x = jnp.asarray(_x(3, 5, 8))
    params = _randomize(layer.init(jax.random.key(0), x.shape))
    eager = layer.apply(params, x)
    np.testing.assert_allclose(jax.jit(layer.apply)(params, x), eager, rtol=1e-6, atol=1e-6)
    vmapped = jax.vmap(layer.apply, in_axes=(None, 0))(params, x)
    np.testing.assert_allclose(vmapped, eager, rtol=1e-6, atol=1e-6)


# -- errors --------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [L.LayerNorm, L.RMSNorm])
@pytest.mark.parametrize("eps", [0.0, -1e-5, float("nan")])
def test_eps_must_be_positive(cls, eps):
    with pytest.raises(ValueError, match=rf"{cls.__name__}: eps must be > 0, got"):
        cls(eps=eps)


@pytest.mark.parametrize("cls", [L.LayerNorm, L.RMSNorm])
def test_normalized_ndim_must_be_positive(cls):
    with pytest.raises(ValueError, match=rf"{cls.__name__}: normalized_ndim must be a positive"):
        cls(normalized_ndim=0)


@pytest.mark.parametrize("cls", [L.LayerNorm, L.RMSNorm])
def test_wrong_width_names_layer_expected_and_got(cls):
    layer = cls()
    params = layer.init(jax.random.key(0), (8, 768))
    with pytest.raises(
        ValueError,
        match=rf"{cls.__name__}: the last 1 axes of x \(the normalized shape it was "
        r"initialized with\): expected x.shape == \(..., 768\), got x.shape == \(8, 512\)",
    ):
        layer.apply(params, jnp.zeros((8, 512)))


def test_wrong_width_inside_sequential_names_path():
    model = L.Sequential(L.Linear(16), L.LayerNorm())
    params = model.init(jax.random.key(0), (2, 8))
    params["1"] = L.LayerNorm().init(jax.random.key(0), (2, 12))
    with pytest.raises(ValueError, match=r"Sequential\[1\] LayerNorm: the last 1 axes"):
        model.apply(params, jnp.zeros((2, 8)))


def test_rank_too_small():
    ln = L.LayerNorm(normalized_ndim=3)
    with pytest.raises(ValueError, match=r"LayerNorm: input rank expected at least "):
        ln.init(jax.random.key(0), (4, 5))


def test_integer_input_rejected():
    ln = L.LayerNorm(elementwise_affine=False)
    with pytest.raises(ValueError, match=r"LayerNorm: input dtype expected a floating dtype"):
        ln.apply({}, jnp.arange(6).reshape(2, 3))
