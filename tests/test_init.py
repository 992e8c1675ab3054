"""Initializers: torch's fan convention and statistics, gains, determinism."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl

W = (128, 256)  # fan_in 256, fan_out 128


def draw(init, shape=W, seed=0):
    return np.asarray(init(jax.random.key(seed), shape, jnp.float32))


def test_worked_figures():
    """Kaiming (ReLU): std = sqrt(2)/sqrt(256) = sqrt(2)/16 = 0.0884.
    Xavier: std = sqrt(2/(256 + 128)) = 0.0722 (uniform bound sqrt(6/384) = 0.125)."""
    assert abs(draw(pl.init.kaiming_normal(nonlinearity="relu")).std() - math.sqrt(2) / 16) < 0.002
    xu = draw(pl.init.xavier_uniform())
    assert abs(xu.std() - math.sqrt(2 / 384)) < 0.002 and np.abs(xu).max() <= 0.125
    assert abs(draw(pl.init.xavier_normal()).std() - math.sqrt(2 / 384)) < 0.002
    ku = draw(pl.init.kaiming_uniform(nonlinearity="relu"))
    assert np.abs(ku).max() <= math.sqrt(6 / 256) and abs(ku.std() - math.sqrt(2) / 16) < 0.002
    assert (
        abs(
            draw(pl.init.kaiming_normal(mode="fan_out", nonlinearity="relu")).std()
            - math.sqrt(2 / 128)
        )
        < 0.002
    )
    assert abs(draw(pl.init.lecun_normal()).std() - 1 / 16) < 0.002
    assert abs(draw(pl.init.lecun_uniform()).std() - 1 / 16) < 0.002


def test_fans_and_gains(torch):
    assert pl.init.fans((128, 256)) == (256, 128)
    assert pl.init.fans((16, 8, 3, 3)) == (72, 144)
    for shape in [(5, 7), (4, 3, 2), (6, 2, 3, 5)]:
        expected = torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
        assert pl.init.fans(shape) == expected
    for name in ["linear", "conv2d", "sigmoid", "tanh", "relu", "selu"]:
        assert pl.init.calculate_gain(name) == pytest.approx(torch.nn.init.calculate_gain(name))
    assert pl.init.calculate_gain("leaky_relu", 0.2) == pytest.approx(
        torch.nn.init.calculate_gain("leaky_relu", 0.2)
    )
    with pytest.raises(ValueError, match="fans: shape must have at least 2 axes"):
        pl.init.fans((3,))
    with pytest.raises(ValueError, match="calculate_gain: nonlinearity must be one of"):
        pl.init.calculate_gain("swish")


def test_distribution_families():
    assert not draw(pl.init.zeros()).any()
    assert (draw(pl.init.ones()) == 1).all()
    assert (draw(pl.init.constant(0.3)) == np.float32(0.3)).all()
    u = draw(pl.init.uniform(-2.0, 3.0))
    assert u.min() >= -2 and u.max() <= 3 and abs(u.mean() - 0.5) < 0.05
    n = draw(pl.init.normal(1.0, 0.5))
    assert abs(n.mean() - 1) < 0.01 and abs(n.std() - 0.5) < 0.01
    t = draw(pl.init.trunc_normal(std=0.02, a=-0.04, b=0.04))
    assert np.abs(t).max() <= 0.04 and 0.015 < t.std() < 0.02


def test_orthogonal():
    for shape in [(64, 32), (32, 64), (16, 4, 3)]:
        q = draw(pl.init.orthogonal(gain=2.0), shape).reshape(shape[0], -1)
        small = min(q.shape)
        gram = q.T @ q if q.shape[0] >= q.shape[1] else q @ q.T
        np.testing.assert_allclose(gram, 4.0 * np.eye(small), atol=1e-4)


def test_keys_dtypes_and_equality():
    init = pl.init.kaiming_uniform(a=math.sqrt(5))
    np.testing.assert_array_equal(draw(init, seed=1), draw(init, seed=1))
    assert not np.array_equal(draw(init, seed=1), draw(init, seed=2))
    assert init(jax.random.PRNGKey(0), W).shape == W
    assert init(jax.random.key(0), W, jnp.bfloat16).dtype == jnp.bfloat16
    assert pl.init.normal(std=0.02) == pl.init.normal(std=0.02)
    assert hash(pl.init.normal(std=0.02)) == hash(pl.init.normal(std=0.02))
    assert pl.init.normal(std=0.02) != pl.init.normal(std=0.03)
    assert repr(pl.init.normal(std=0.02)) == "normal(mean=0.0, std=0.02)"
