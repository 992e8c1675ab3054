"""Initializers: torch's fan convention and statistics, gains, determinism."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L

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


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_width_weights_are_float32_draws_rounded_once(torch, dtype):
    """torch fills a bfloat16 tensor from float32 draws; drawn in bfloat16 itself, a
    normal takes about 128 distinct values and a truncated normal's bound of -2 at
    std 0.02 (100 std) catches the samples the narrow type rounds past it. Ours: the
    float32 draw with the same key, rounded once."""
    key, shape = jax.random.key(3), (256, 512)
    init = pl.init.trunc_normal(std=0.02)
    w = init(key, shape, dtype)
    assert w.dtype == dtype
    np.testing.assert_array_equal(np.asarray(w), np.asarray(init(key, shape).astype(dtype)))
    w32 = np.asarray(w, np.float32)
    assert abs(float(w32.std()) - 0.02) < 5e-4 and float(np.abs(w32).max()) < 0.15
    t = torch.empty(shape, dtype=getattr(torch, jnp.dtype(dtype).name))
    torch.nn.init.normal_(t, std=0.02)
    ours = np.asarray(pl.init.normal(std=0.02)(key, shape, dtype), np.float32)
    # about as many distinct values as torch's (bfloat16 ~2.6k, float16 ~13k), not 128
    assert len(np.unique(ours)) > 0.8 * len(np.unique(t.float().numpy()))
    linear = pl.params.flatten(L.Linear(512).init(key, (2, 256), dtype))["weight"]
    assert len(np.unique(np.asarray(linear, np.float32))) > 1000


def test_orthogonal_in_float64_is_float64_accurate(torch):
    with jax.enable_x64(True):
        w = np.asarray(pl.init.orthogonal(gain=2.0)(jax.random.key(0), (6, 3, 2), jnp.float64))
    assert w.dtype == np.float64
    flat = w.reshape(6, 6)
    np.testing.assert_allclose(flat @ flat.T, 4 * np.eye(6), atol=1e-13)


def test_factory_arguments_are_checked_when_built():
    """Every number a factory takes is checked when it is built (not at ``init``, as a
    bare ``TypeError`` naming neither the layer nor the argument); ``uniform(a, a)``
    fills with ``a``, as torch's ``uniform_``."""
    for make, arg in (
        (lambda: pl.init.xavier_uniform(gain="x"), "gain"),
        (lambda: pl.init.xavier_normal(gain=None), "gain"),
        (lambda: pl.init.constant("abc"), "value"),
        (lambda: pl.init.normal(mean=float("nan")), "mean"),
        (lambda: pl.init.orthogonal(gain=[1.0]), "gain"),
    ):
        with pytest.raises(ValueError, match=rf": {arg} must be a real number, got "):
            make()
    same = pl.init.uniform(1.5, 1.5)(jax.random.key(0), (3, 2))
    np.testing.assert_array_equal(np.asarray(same), np.full((3, 2), 1.5, np.float32))
