"""Dropouts: inverted scaling, whole channels, alpha dropout's moments, keyed
randomness, eval identity, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from purelayers import layers as L
from purelayers.layers import LayerError


def test_eval_mode_and_zero_p_are_identity():
    x = jnp.arange(12.0).reshape(3, 4)
    assert L.Dropout(0.3).apply({}, x) is x
    assert L.Dropout(0.3).apply({}, x, key=jax.random.key(0)) is x
    np.testing.assert_array_equal(L.Dropout(0.0).apply({}, x, train=True, key=jax.random.key(0)), x)


def test_train_mode_statistics():
    """Each entry is kept with probability 1 - p and scaled by 1 / (1 - p), so the
    mean of many entries stays 1 for an input of ones."""
    x = jnp.ones((400, 500))
    y = np.asarray(L.Dropout(0.25).apply({}, x, train=True, key=jax.random.key(3)))
    assert set(np.unique(y)) == {0.0, np.float32(1 / 0.75)}
    assert abs((y == 0).mean() - 0.25) < 0.01
    assert abs(y.mean() - 1.0) < 0.01


def test_same_key_same_mask_and_gradient_masked():
    layer = L.Dropout(0.5)
    x = jnp.ones((64,))
    k = jax.random.key(5)
    a = layer.apply({}, x, train=True, key=k)
    np.testing.assert_array_equal(a, layer.apply({}, x, train=True, key=k))
    g = jax.grad(lambda v: layer.apply({}, v, train=True, key=k).sum())(x)
    np.testing.assert_array_equal(np.asarray(g), np.where(np.asarray(a) == 0, 0.0, 2.0))
    assert jax.jit(layer.apply, static_argnames="train")({}, x, train=True, key=k).shape == (64,)


def test_errors():
    for bad in (1.5, -0.1):
        with pytest.raises(ValueError, match=rf"Dropout: p must be in \[0, 1\], got {bad}"):
            L.Dropout(bad)
    with pytest.raises(
        ValueError, match="Dropout: train=True draws random numbers and needs a PRNG key"
    ):
        L.Dropout(0.1).apply({}, jnp.ones(3), train=True)


# -- p = 1, channel dropout, alpha dropout -------------------------------------------

ALL = [L.Dropout, L.Dropout1d, L.Dropout2d, L.Dropout3d, L.AlphaDropout, L.FeatureAlphaDropout]


@pytest.mark.filterwarnings("ignore:dropout2d. Received a 3D input")
def test_p_one_gives_torchs_x_times_zero_and_a_zero_gradient(torch):
    x = np.array([[[-2.0, 0.5, 3.0], [1.0, -1.0, 4.0]]], np.float32)  # (N, C, L)
    k = jax.random.key(0)
    for cls in ALL:
        layer, x = cls(1.0), x[..., None] if cls is L.Dropout3d else x  # (C, D, H, W)
        y = np.asarray(layer.apply({}, jnp.asarray(x), train=True, key=k))
        theirs = getattr(torch.nn, cls.__name__)(1.0).train()(torch.tensor(x)).numpy()
        np.testing.assert_array_equal(y, theirs)
        assert np.array_equal(np.signbit(y), np.signbit(theirs)), cls.__name__  # -0.0 too
        g = jax.grad(lambda v, layer=layer: layer.apply({}, v, train=True, key=k).sum())(x)
        np.testing.assert_array_equal(np.asarray(g), 0.0)


@pytest.mark.parametrize(
    "cls, shape, channels",
    [
        (L.Dropout1d, (50, 40, 3), 2),
        (L.Dropout1d, (400, 3), 1),  # unbatched (C, L)
        (L.Dropout2d, (50, 40, 2, 2), 2),
        (L.Dropout2d, (50, 40, 3), 2),  # torch 2.13 reads 3-d as (N, C, L)
        (L.Dropout3d, (50, 40, 1, 2, 2), 2),
        (L.Dropout3d, (400, 1, 2, 2), 1),  # unbatched (C, D, H, W)
    ],
)
def test_channel_dropout_zeroes_whole_channels_at_rate_p(cls, shape, channels):
    y = np.asarray(cls(0.25).apply({}, jnp.ones(shape), train=True, key=jax.random.key(1)))
    per_channel = y.reshape(*shape[:channels], -1)
    assert set(np.unique(y)) == {0.0, np.float32(1 / 0.75)}
    assert (per_channel == per_channel[..., :1]).all(), "one draw per channel"
    assert abs((per_channel[..., 0] == 0).mean() - 0.25) < 0.03
    again = cls(0.25).apply({}, jnp.ones(shape), train=True, key=jax.random.key(1))
    np.testing.assert_array_equal(y, again)


def test_channel_dropout_ranks_are_torchs():
    x = jnp.ones((2, 3))
    assert L.Dropout2d().apply({}, jnp.ones((2, 3, 4))).shape == (2, 3, 4)
    for layer, bad in [(L.Dropout1d(), (4,)), (L.Dropout2d(), (2, 3)), (L.Dropout3d(), (2, 3, 4))]:
        with pytest.raises(LayerError, match=rf"^{type(layer).__name__}: input rank expected"):
            layer.apply({}, jnp.ones(bad))  # eval mode too, as torch checks first
    with pytest.raises(LayerError, match=r"^Dropout2d: train=True draws random numbers"):
        L.Dropout2d().apply({}, jnp.ones((2, 3, 2, 2)), train=True)
    assert L.FeatureAlphaDropout().apply({}, jnp.ones(3)) is not None  # eval: no rank rule
    assert L.AlphaDropout().apply({}, x) is x


def test_alpha_dropout_worked_example_matches_torchs_two_values(torch):
    """p = 0.5: a = 1 / sqrt((alpha'^2 / 2 + 1) / 2) = 0.88642, so zeros become
    a * alpha' * p = +0.77921 where kept and a * alpha' * (p - 1) = -0.77921 where dropped."""
    y = np.asarray(
        L.AlphaDropout(0.5).apply({}, jnp.zeros(4000), train=True, key=jax.random.key(2))
    )
    np.testing.assert_allclose(np.unique(y), [-0.77921, 0.77921], rtol=1e-4)
    theirs = torch.nn.AlphaDropout(0.5).train()(torch.zeros(4000)).numpy()
    np.testing.assert_allclose(np.unique(theirs), np.unique(y), rtol=1e-6)
    ones = np.asarray(L.AlphaDropout(0.5).apply({}, jnp.ones(8), train=True, key=jax.random.key(2)))
    kept = y[:8] > 0
    np.testing.assert_allclose(ones[kept], 0.88642 + 0.77921, rtol=1e-4)  # a * x + a alpha' p
    g = jax.grad(
        lambda v: L.AlphaDropout(0.5).apply({}, v, train=True, key=jax.random.key(2)).sum()
    )
    np.testing.assert_allclose(np.asarray(g(jnp.ones(8))), np.where(kept, 0.88642, 0.0), rtol=1e-4)


@pytest.mark.parametrize(
    "cls, shape", [(L.AlphaDropout, (400, 500)), (L.FeatureAlphaDropout, (2000, 50, 2))]
)
def test_alpha_dropouts_keep_zero_mean_unit_variance(cls, shape):
    """On standard normal input (a SELU network's fixed point) the output keeps mean 0
    and variance 1; the drop rate is p, per channel for the feature variant."""
    x = jax.random.normal(jax.random.key(3), shape)
    y = np.asarray(cls(0.2).apply({}, x, train=True, key=jax.random.key(4)))
    assert abs(y.mean()) < 0.01 and abs(y.var() - 1.0) < 0.02
    a = 1 / np.sqrt((1.7580993408473766**2 * 0.2 + 1) * 0.8)
    dropped = y == np.float32(a * 1.7580993408473766 * (0.2 - 1))
    assert abs(dropped.mean() - 0.2) < 0.01
    if cls is L.FeatureAlphaDropout:
        assert (dropped == dropped[..., :1]).all(), "one draw per channel"
    np.testing.assert_array_equal(y, cls(0.2).apply({}, x, train=True, key=jax.random.key(4)))


@pytest.mark.parametrize("dtype", ["int32", "bool", "complex64"])
def test_non_float_inputs_in_train_mode_as_torch(torch, dtype):
    """torch's dropouts cannot scale integer, bool or complex inputs in train mode and
    raise; at p=0 and p=1 (and in eval mode) they pass them through in their dtype."""
    x = np.ones((2, 3, 4), dtype)
    key = jax.random.key(0)
    for ours, theirs in (
        (L.Dropout, torch.nn.Dropout),
        (L.Dropout1d, torch.nn.Dropout1d),
        (L.AlphaDropout, torch.nn.AlphaDropout),
    ):
        with pytest.raises(RuntimeError, match=r"can't be cast|not implemented for 'Complex"):
            theirs(0.5).train()(torch.tensor(x))
        with pytest.raises(
            L.LayerError, match=rf"input dtype in train mode expected floating point, got {dtype}"
        ):
            ours(0.5).apply({}, x, train=True, key=key)
        for p in (0.0, 1.0):
            want = theirs(p).train()(torch.tensor(x)).numpy()
            got = ours(p).apply({}, x, train=True, key=key)
            assert got.dtype == want.dtype, (ours, p)
            np.testing.assert_array_equal(np.asarray(got), want)
        assert ours(0.5).apply({}, x).dtype == x.dtype
