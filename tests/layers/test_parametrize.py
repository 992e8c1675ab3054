"""Parametrizations (``WeightNorm``, ``SpectralNorm``): worked examples, torch parity
of every option (outputs and gradients), checkpoints by name, the power iteration's
updates and start against torch's, gradcheck."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L
from purelayers.layers.parametrize import _normalize, _power_method
from purelayers.params import flatten, load_state_dict
from purelayers.testing import assert_matches_torch, gradcheck
from tests.twins import randomize

KEY = jax.random.key(0)
_power = jax.jit(_power_method, static_argnums=(3, 4))


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _abstract(layer, shape):
    return jax.eval_shape(lambda: layer.init(KEY, shape))


def _shapes(tree):
    return {k: tuple(v.shape) for k, v in flatten(tree).items()}


def _sd(module):
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


# -- worked examples -------------------------------------------------------------------


def test_weight_norm_worked_example():
    """v = [[3, 4]] has norm 5; with g = 10 the weight is 10 * [3, 4] / 5 = [6, 8], so
    x = [1, 1] gives 14. init sets g = ||w||: the initial weight is the layer's own."""
    wn = L.WeightNorm(L.Linear(1, bias=False))
    params = {"parametrizations": {"weight": {"original0": jnp.array([[10.0]]),
                                              "original1": jnp.array([[3.0, 4.0]])}}}  # fmt: skip
    y, weight, init, plain = jax.jit(
        lambda p: (wn.apply(p, jnp.ones((1, 2))), wn.weight(p), wn.init(KEY, (1, 2)),
                   L.Linear(1, bias=False).init(KEY, (1, 2))["weight"])
    )(params)  # fmt: skip
    np.testing.assert_allclose(y, [[14.0]], rtol=1e-6)
    np.testing.assert_allclose(weight, [[6.0, 8.0]], rtol=1e-6)
    parts = init["parametrizations"]["weight"]
    np.testing.assert_array_equal(parts["original1"], plain)
    np.testing.assert_allclose(parts["original0"], [[np.linalg.norm(plain)]], rtol=1e-6)


def test_spectral_norm_worked_example():
    """W = diag(3, 1). Eval with u = v = [1, 0]: sigma = u^T W v = 3, weight diag(1, 1/3).
    One training step from u = v = [1, 1] / sqrt(2): u = W v / |W v| = [3, 1] / sqrt(10),
    v = W^T u / |W^T u| = [9, 1] / sqrt(82), sigma = 82 / sqrt(820) = sqrt(8.2)."""
    sn = L.SpectralNorm(L.Linear(2, bias=False))
    params = {"parametrizations": {"weight": {"original": jnp.diag(jnp.array([3.0, 1.0]))}}}
    state = sn.init_state((1, 2))  # no key: normalize(ones)
    buffers = state["parametrizations"]["weight"]["0"]
    np.testing.assert_allclose(buffers["_u"], [0.5**0.5] * 2, rtol=1e-6)
    x = jnp.eye(2)
    e0 = {"_u": jnp.array([1.0, 0.0]), "_v": jnp.array([1.0, 0.0])}

    @jax.jit
    def run(params, state):
        fixed = {"parametrizations": {"weight": {"0": e0}}}
        return sn.apply(params, x, state=state, train=True), sn.apply(params, x, state=fixed)

    (y, new), (y_eval, same) = run(params, state)
    np.testing.assert_allclose(y, np.diag([3.0, 1.0]) / 8.2**0.5, rtol=1e-6)
    new = new["parametrizations"]["weight"]["0"]
    np.testing.assert_allclose(new["_u"], np.array([3.0, 1.0]) / 10**0.5, rtol=1e-6)
    np.testing.assert_allclose(new["_v"], np.array([9.0, 1.0]) / 82**0.5, rtol=1e-6)
    np.testing.assert_allclose(y_eval, np.diag([1.0, 1.0 / 3.0]), rtol=1e-6)
    np.testing.assert_array_equal(same["parametrizations"]["weight"]["0"]["_u"], e0["_u"])


# -- names and shapes (nothing compiles) -------------------------------------------------


def test_names_and_shapes_equal_torchs_for_every_dim_and_layer(torch):
    P = torch.nn.utils.parametrizations
    nn = torch.nn
    cases = [
        *[(L.WeightNorm(L.Linear(4), dim=d), P.weight_norm(nn.Linear(3, 4), dim=d), (2, 3))
          for d in (0, 1, None, -1, -2)],  # torch: -1 is the whole array, as None
        *[(L.WeightNorm(L.Conv2d(3, 2), dim=d), P.weight_norm(nn.Conv2d(2, 3, 2), dim=d),
           (1, 2, 4, 4)) for d in (0, 1, 2, None)],
        (L.WeightNorm(L.Embedding(6, 3)), P.weight_norm(nn.Embedding(6, 3)), (2, 5)),
        (L.WeightNorm(L.LSTM(4), "weight_hh_l0"), P.weight_norm(nn.LSTM(3, 4), "weight_hh_l0"),
         (5, 2, 3)),
        (L.SpectralNorm(L.ConvTranspose2d(3, 2)), P.spectral_norm(nn.ConvTranspose2d(2, 3, 2)),
         (1, 2, 4, 4)),
        (L.SpectralNorm(L.Conv2d(3, 2), dim=1), P.spectral_norm(nn.Conv2d(2, 3, 2), dim=1),
         (1, 2, 4, 4)),
        (L.SpectralNorm(L.Embedding(6, 3)), P.spectral_norm(nn.Embedding(6, 3)), (2, 5)),
        (L.SpectralNorm(L.LayerNorm()), P.spectral_norm(nn.LayerNorm(3)), (2, 3)),
    ]  # fmt: skip
    for layer, module, shape in cases:
        params = layer.ordered(_abstract(layer, shape))
        merged = pl.params.merge(params, layer.init_state(shape))
        assert _shapes(merged) == _sd(module), layer


def test_legacy_names_equal_the_old_torch_weight_norm(torch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old = torch.nn.utils.weight_norm(torch.nn.Conv2d(2, 3, 2), dim=None)
        mha = torch.nn.utils.weight_norm(torch.nn.MultiheadAttention(4, 2), "in_proj_weight")
    layer = L.WeightNorm(L.Conv2d(3, 2), dim=None, legacy_names=True)
    assert _shapes(layer.ordered(_abstract(layer, (1, 2, 4, 4)))) == _sd(old)
    layer = L.WeightNorm(L.InProjAttention(2), "in_proj_weight", legacy_names=True)
    assert _shapes(layer.ordered(_abstract(layer, (3, 2, 4)))) == _sd(mha)


# -- torch parity: outputs and gradients w.r.t. input, g, v, original, bias ---------------


def _weight_norm_twin(torch, module, dim):
    return randomize(torch, torch.nn.utils.parametrizations.weight_norm(module, dim=dim))


@pytest.mark.parametrize("dim", [1, None])
def test_weight_norm_linear_matches_torch(dim, torch):
    module = _weight_norm_twin(torch, torch.nn.Linear(5, 4), dim)
    assert_matches_torch(L.WeightNorm(L.Linear(4), dim=dim), module, _x(3, 5))


def test_weight_norm_conv2d_matches_torch(torch):
    module = _weight_norm_twin(torch, torch.nn.Conv2d(2, 3, 2, padding=1), 0)
    assert_matches_torch(L.WeightNorm(L.Conv2d(3, 2, padding=1)), module, _x(1, 2, 3, 3), rtol=1e-4)


def _spectral_twin(torch, module, **kwargs):
    module = torch.nn.utils.parametrizations.spectral_norm(module, **kwargs)
    randomize(torch, module)
    with torch.no_grad():  # unit vectors, as the layer keeps them
        for t in module.buffers():
            t.div_(t.norm())
    return module


def test_spectral_norm_conv_transpose_uses_dim_1_as_torch(torch):
    module = _spectral_twin(torch, torch.nn.ConvTranspose2d(2, 3, 2), n_power_iterations=2)
    layer = L.SpectralNorm(L.ConvTranspose2d(3, 2), n_power_iterations=2)
    assert_matches_torch(layer, module, _x(1, 2, 3, 3), rtol=1e-4)


def test_spectral_norm_conv2d_trains_as_torch(torch):
    """Train mode: the power iteration first, u and v constants of the gradient."""
    module = _spectral_twin(torch, torch.nn.Conv2d(2, 3, 2), n_power_iterations=2)
    layer = L.SpectralNorm(L.Conv2d(3, 2), n_power_iterations=2)
    assert_matches_torch(layer, module, _x(1, 2, 3, 3), train=True, rtol=1e-4)


def test_spectral_norm_of_a_vector_is_normalize_with_torchs_derivative_at_the_floor(torch):
    """A one-axis weight: weight = w / max(||w||, eps), no buffers. At ||w|| = eps
    exactly (w = [3, 4], eps = 5), torch's clamp_min passes the gradient to the norm."""
    sn = L.SpectralNorm(L.LayerNorm(), eps=5.0)
    module = torch.nn.utils.parametrizations.spectral_norm(torch.nn.LayerNorm(2), eps=5.0)
    assert sn.init_state((2, 2)) == {}
    with torch.no_grad():
        module.parametrizations.weight.original.copy_(torch.tensor([3.0, 4.0]))
        module.bias.copy_(torch.tensor([0.5, -0.5]))
    assert_matches_torch(sn, module, _x(3, 2))


# -- checkpoints -------------------------------------------------------------------------


def test_a_torch_state_dict_loads_by_name_and_matches(torch):
    P = torch.nn.utils.parametrizations
    wn_t = randomize(torch, P.weight_norm(torch.nn.Linear(5, 4))).eval()
    sn_t = _spectral_twin(torch, torch.nn.Linear(5, 4)).eval()
    x = _x(3, 5)
    for layer, module in ((L.WeightNorm(L.Linear(4)), wn_t), (L.SpectralNorm(L.Linear(4)), sn_t)):
        sd = module.state_dict()
        template = _abstract(layer, x.shape)
        params = load_state_dict(template, {k: sd[k] for k in flatten(template)})
        state_template = layer.init_state(x.shape)
        state = load_state_dict(state_template, {k: sd[k] for k in flatten(state_template)})
        y = layer.apply(params, x, state=state)[0] if state else layer.apply(params, x)
        np.testing.assert_allclose(y, module(torch.tensor(x)).detach(), rtol=1e-5, atol=1e-6)


# -- the power iteration -----------------------------------------------------------------


def test_training_updates_u_and_v_as_torch_after_1_and_3_steps(torch):
    module = _spectral_twin(torch, torch.nn.Linear(5, 4)).train()
    sn = L.SpectralNorm(L.Linear(4))
    sd = module.state_dict()
    params = load_state_dict(
        _abstract(sn, (3, 5)), {k: sd[k] for k in ("bias", "parametrizations.weight.original")}
    )
    state = sn.init_state((3, 5))
    state = load_state_dict(state, {k: sd[k] for k in flatten(state)})
    step = jax.jit(lambda p, s, x, train: sn.apply(p, x, state=s, train=train), static_argnums=3)
    for i in range(3):
        x = _x(3, 5, seed=i)
        y, state = step(params, state, x, True)
        np.testing.assert_allclose(y, module(torch.tensor(x)).detach(), rtol=1e-5, atol=1e-6)
        if i in (0, 2):
            ours = flatten(state)
            for name, buffer in module.named_buffers():
                np.testing.assert_allclose(ours[name], buffer, rtol=1e-5, atol=1e-6)
    module.eval()
    y, after = step(params, state, _x(3, 5), False)
    np.testing.assert_allclose(y, module(torch.tensor(_x(3, 5))).detach(), rtol=1e-5, atol=1e-6)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), after, state))


def test_the_start_is_torchs_fifteen_plus_n_iterations_from_normalized_draws(torch):
    """torch's constructor normalizes two normal draws and runs 15 iterations, and its
    training-mode check runs n more: replaying its draws, our iteration gives its
    buffers. ``init_state(params=, key=)`` does the same from draws of ``key``."""
    F = torch.nn.functional
    torch.manual_seed(3)
    linear = torch.nn.Linear(5, 4)
    rng = torch.random.get_rng_state()
    module = torch.nn.utils.parametrizations.spectral_norm(linear, n_power_iterations=3)
    torch.random.set_rng_state(rng)
    u0 = F.normalize(torch.empty(4).normal_(0, 1), dim=0).numpy()
    v0 = F.normalize(torch.empty(5).normal_(0, 1), dim=0).numpy()
    w = module.parametrizations.weight.original.detach().numpy()
    u, v = _power(jnp.asarray(w), jnp.asarray(u0), jnp.asarray(v0), 18, 1e-12)
    np.testing.assert_allclose(u, module.parametrizations.weight[0]._u, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v, module.parametrizations.weight[0]._v, rtol=1e-5, atol=1e-6)

    sn = L.SpectralNorm(L.Linear(4), n_power_iterations=3)
    original = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    params = {
        "bias": np.zeros(4, np.float32),
        "parametrizations": {"weight": {"original": original}},
    }
    state = sn.init_state((2, 5), params=params, key=jax.random.key(1))
    again = sn.init_state((2, 5), params=params, key=jax.random.key(1))
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), state, again))
    b = state["parametrizations"]["weight"]["0"]
    sigma = float(b["_u"] @ original @ b["_v"])
    np.testing.assert_allclose(sigma, np.linalg.svd(original, compute_uv=False)[0], rtol=1e-3)

    @jax.jit
    def draws(key):
        ku, kv = jax.random.split(key)
        return _normalize(jax.random.normal(ku, (4,)), 1e-12), _normalize(
            jax.random.normal(kv, (5,)), 1e-12
        )

    start = draws(jax.random.key(1))
    drawn = sn.init_state((2, 5), key=jax.random.key(1))["parametrizations"]["weight"]["0"]
    np.testing.assert_allclose(drawn["_u"], start[0], rtol=1e-6)
    np.testing.assert_allclose(drawn["_v"], start[1], rtol=1e-6)
    expected = _power(jnp.asarray(original), *start, 18, 1e-12)
    np.testing.assert_allclose(b["_u"], expected[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b["_v"], expected[1], rtol=1e-5, atol=1e-6)


def test_spectral_norm_threads_its_state_through_a_sequential():
    model = L.Sequential(L.SpectralNorm(L.Linear(3)), L.ReLU())
    params, state = model.init(KEY, (2, 4)), model.init_state((2, 4))
    assert list(flatten(state)) == [
        "0.parametrizations.weight.0._u",
        "0.parametrizations.weight.0._v",
    ]
    y, new = model.apply(params, jnp.ones((2, 4)), state=state, train=True)
    assert y.shape == (2, 3)
    assert not np.allclose(new["0"]["parametrizations"]["weight"]["0"]["_u"],
                           state["0"]["parametrizations"]["weight"]["0"]["_u"])  # fmt: skip


# -- gradcheck -----------------------------------------------------------------------------


def test_gradcheck_weight_norm_over_the_whole_conv_weight_and_spectral_eval_on_conv():
    rng = np.random.default_rng(0)
    wn = L.WeightNorm(L.Conv1d(2, 2), dim=None)
    sn = L.SpectralNorm(L.ConvTranspose1d(2, 2))
    x = rng.standard_normal((1, 2, 3))
    p_wn = jax.tree.map(lambda a: rng.standard_normal(a.shape), _abstract(wn, x.shape))
    p_sn = jax.tree.map(lambda a: rng.standard_normal(a.shape), _abstract(sn, x.shape))
    s_sn = sn.init_state(x.shape, params=p_sn, key=KEY)

    def both(p_wn, p_sn, s_sn, x):
        return wn.apply(p_wn, x), sn.apply(p_sn, x, state=s_sn)[0]

    assert gradcheck(both, p_wn, p_sn, s_sn, x)
