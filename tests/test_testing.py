"""gradcheck: passes on correct derivatives, and bites on a 1% error."""

import jax
import jax.numpy as jnp
import pytest

import purelayers as pl


@jax.custom_jvp
def wrong_sin(x):
    return jnp.sin(x)


@wrong_sin.defjvp
def _wrong_sin_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return jnp.sin(x), 1.01 * jnp.cos(x) * t  # 1% too large


def test_passes_on_correct_derivatives():
    params = {"w": jnp.array([[0.3, -1.2], [0.8, 0.5]]), "b": jnp.array([0.1, -0.2])}

    def fn(p, x):
        return jnp.tanh(x @ p["w"].T + p["b"][None, :])

    assert pl.testing.gradcheck(fn, params, jnp.array([[1.0, 2.0], [-0.5, 0.3]])) is True


def test_fails_on_a_one_percent_error_naming_the_leaf():
    params = {"layer": {"weight": jnp.array([0.4, -0.7, 1.1])}}

    def fn(p, x):
        return wrong_sin(p["layer"]["weight"]) * x

    with pytest.raises(
        AssertionError, match=r"layer\.weight \(argument 0\).*analytic .* numerical"
    ):
        pl.testing.gradcheck(fn, params, jnp.ones(3))


def test_integer_leaves_pass_through():
    def fn(x, ids):
        return x[ids] ** 2

    assert pl.testing.gradcheck(fn, jnp.array([1.0, 2.0, 3.0]), jnp.array([2, 0]))
