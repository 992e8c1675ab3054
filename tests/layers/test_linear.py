"""Linear beyond the registry's table (torch parity and gradcheck are there): worked
example, leading axes, init statistics, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L


def test_worked_example():
    """W = [[1, 2], [3, 4], [5, 6]], b = [0.5, -0.5, 1], x = [[1, 1]].

    y = x W^T + b = [1+2, 3+4, 5+6] + b = [3.5, 6.5, 12].
    With upstream gradient ones (1x3): dW = ones^T x = 3x2 ones, db = [1, 1, 1],
    dx = ones W = [1+3+5, 2+4+6] = [9, 12].
    """
    params = {"weight": jnp.array([[1.0, 2], [3, 4], [5, 6]]), "bias": jnp.array([0.5, -0.5, 1])}
    x = jnp.array([[1.0, 1.0]])
    lin = L.Linear(3)
    np.testing.assert_allclose(lin.apply(params, x), [[3.5, 6.5, 12.0]])
    gp, gx = jax.grad(lambda p, x: lin.apply(p, x).sum(), argnums=(0, 1))(params, x)
    np.testing.assert_allclose(gp["weight"], np.ones((3, 2)))
    np.testing.assert_allclose(gp["bias"], [1.0, 1.0, 1.0])
    np.testing.assert_allclose(gx, [[9.0, 12.0]])


def test_shapes_and_leading_axes():
    lin = L.Linear(5)
    params = lin.init(jax.random.key(0), (2, 3, 4))
    assert jax.tree.map(jnp.shape, params) == {"weight": (5, 4), "bias": (5,)}
    assert list(params) == ["weight", "bias"]
    assert lin.apply(params, jnp.ones((2, 3, 4))).shape == (2, 3, 5)
    assert lin.apply(params, jnp.ones((4,))).shape == (5,)
    no_bias = L.Linear(5, bias=False).init(jax.random.key(0), (4,))
    assert list(no_bias) == ["weight"]


@pytest.mark.parametrize("lead", [(0,), (0, 3), (2, 0), (2, 0, 3)])
def test_empty_leading_axes(lead):
    """An empty batch gives an empty output of the right shape, and zero gradients."""
    lin = L.Linear(5)
    params = lin.init(jax.random.key(0), (4,))
    x = jnp.ones((*lead, 4))
    assert lin.apply(params, x).shape == (*lead, 5)
    grads = jax.grad(lambda p: lin.apply(p, x).sum())(params)
    assert not grads["weight"].any() and not grads["bias"].any()


@pytest.mark.parametrize("transposed", [False, True])
def test_functional_linear_matches_torch(torch, transposed):
    """``F.linear`` gives torch's ``F.linear`` on a 4-d input: values, input and weight
    gradients, and the forward-mode tangent in the input."""
    import purelayers.functional as F

    rng = np.random.default_rng(3)
    x, ct, dx = (
        rng.standard_normal(s, dtype=np.float32) for s in [(2, 3, 4, 5), (2, 3, 4, 6), (2, 3, 4, 5)]
    )
    w_torch = rng.standard_normal((6, 5), dtype=np.float32)  # torch's [out, in]
    w = w_torch.T.copy() if transposed else w_torch

    tx, tw = (torch.tensor(a, requires_grad=True) for a in (x, w_torch))
    ty = torch.nn.functional.linear(tx, tw)
    ty.backward(torch.tensor(ct))
    _, t_tangent = torch.func.jvp(
        lambda x: torch.nn.functional.linear(x, torch.tensor(w_torch)),
        (torch.tensor(x),),
        (torch.tensor(dx),),
    )
    tgw = tw.grad.numpy().T if transposed else tw.grad.numpy()
    expected = (ty.detach().numpy(), tx.grad.numpy(), tgw, t_tangent.numpy())
    for form in (F.linear,):
        y, vjp = jax.vjp(lambda x, w, f=form: f(x, w, transposed=transposed), x, w)
        _, tangent = jax.jvp(lambda x, f=form: f(x, w, transposed=transposed), (x,), (dx,))
        for got, want in zip((y, *vjp(ct), tangent), expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_under_shard_map_the_product_keeps_jax_sharding_types():
    """Inside ``shard_map`` (a one-device mesh here) values carry JAX's varying manual
    axes, which ``Linear``'s product passes through: its value and gradients on a 3-d
    input equal those outside."""
    from jax.sharding import PartitionSpec as P

    lin = L.Linear(6)
    params = lin.init(jax.random.key(0), (4, 3, 5))
    x = jax.random.normal(jax.random.key(1), (4, 3, 5))
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))

    def value_and_grads(p, x):
        return jax.value_and_grad(lambda p, x: jnp.sum(jnp.tanh(lin.apply(p, x))), (0, 1))(p, x)

    def body(p, x):
        value, grads = value_and_grads(p, x)
        return jax.lax.psum(value, "data"), grads  # p's gradient JAX sums itself

    specs = (P(), P("data"))
    sharded = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=(P(), (P(), P("data"))))
    got, want = jax.jit(sharded)(params, x), value_and_grads(params, x)
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)


def test_checkpoint_policies_see_the_product(capsys):
    """``jax.checkpoint_policies.dots_with_no_batch_dims_saveable`` keeps the product
    of a 3-d input that the backward pass needs (the first ``Linear``'s ``[2, 3, 8]``,
    GELU's input; the last one's output only feeds the sum), as for a 2-d input: the
    forward is ``dot_general``, which the policy names."""
    from jax.ad_checkpoint import print_saved_residuals

    m = L.Sequential(L.Linear(8), L.GELU(), L.Linear(4))
    params = m.init(jax.random.key(0), (2, 3, 5))
    x = jnp.ones((2, 3, 5))
    policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    f = jax.checkpoint(lambda p, x: jnp.sum(m.apply(p, x)), policy=policy)
    print_saved_residuals(f, params, x)
    saved = capsys.readouterr().out.splitlines()
    outputs = [line.split(" from ")[0] for line in saved if "argument" not in line]
    assert outputs == ["f32[2,3,8] output of dot_general"], saved


def test_default_init_statistics():
    """torch's default: U(-1/sqrt(256), 1/sqrt(256)); std = (1/16) / sqrt(3) = 0.0361."""
    params = L.Linear(128).init(jax.random.key(1), (1, 256))
    w, b = np.asarray(params["weight"]), np.asarray(params["bias"])
    assert np.abs(w).max() <= 1 / 16 and np.abs(b).max() <= 1 / 16
    assert abs(w.std() - 1 / 16 / np.sqrt(3)) < 0.001
    assert abs(w.mean()) < 0.001


def test_init_is_keyed_and_overridable():
    lin = L.Linear(8)
    a, b = lin.init(jax.random.key(0), (3,)), lin.init(jax.random.key(0), (3,))
    c = lin.init(jax.random.key(1), (3,))
    assert jnp.array_equal(a["weight"], b["weight"])
    assert not jnp.array_equal(a["weight"], c["weight"])
    legacy = lin.init(jax.random.PRNGKey(0), (3,))
    assert legacy["weight"].shape == (8, 3)
    custom = L.Linear(8, weight_init=pl.init.zeros(), bias_init=pl.init.ones()).init(
        jax.random.key(0), (3,)
    )
    assert not custom["weight"].any() and bool((custom["bias"] == 1).all())


def test_dtype_follows_input():
    lin = L.Linear(4)
    params = lin.init(jax.random.key(0), (2, 3), jnp.bfloat16)
    assert params["weight"].dtype == jnp.bfloat16
    assert lin.apply(params, jnp.ones((2, 3), jnp.bfloat16)).dtype == jnp.bfloat16


def test_errors():
    with pytest.raises(ValueError, match=r"Linear: out_features must be a positive integer, got 0"):
        L.Linear(0)
    with pytest.raises(
        ValueError, match=r"Linear: out_features must be a positive integer, got 2.5"
    ):
        L.Linear(2.5)
    lin = L.Linear(3)
    params = lin.init(jax.random.key(0), (2, 4))
    with pytest.raises(ValueError, match=r"Linear: input last axis expected 4, got 5"):
        lin.apply(params, jnp.ones((2, 5)))
    with pytest.raises(ValueError, match=r"Linear: input last axis expected 4, got 5"):
        jax.jit(lin.apply)(params, jnp.ones((2, 5)))
    with pytest.raises(ValueError, match=r"Linear: input rank expected at least 1"):
        lin.init(jax.random.key(0), ())
