"""Dropout: inverted scaling, keyed randomness, eval identity, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from purelayers import layers as L


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
    for bad in (1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=rf"Dropout: p must be in \[0, 1\), got {bad}"):
            L.Dropout(bad)
    with pytest.raises(
        ValueError, match="Dropout: train=True draws random numbers and needs a PRNG key"
    ):
        L.Dropout(0.1).apply({}, jnp.ones(3), train=True)
