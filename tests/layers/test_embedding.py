"""Embedding: lookup, torch parity, padding_idx, gradients, out-of-range ids."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import purelayers as pl
from purelayers import layers as L
from purelayers.init import constant
from purelayers.params import flatten
from purelayers.testing import gradcheck
from tests.twins import load_from_torch


def test_lookup_worked_example():
    """Row i of a table whose entry (i, j) is 10 i + j: ids [[2, 0], [2, 1]] give
    [[[20, 21], [0, 1]], [[20, 21], [10, 11]]]."""
    emb = L.Embedding(3, 2)
    params = {"weight": jnp.array([[0.0, 1.0], [10.0, 11.0], [20.0, 21.0]])}
    y = emb.apply(params, jnp.array([[2, 0], [2, 1]]))
    np.testing.assert_array_equal(y, [[[20, 21], [0, 1]], [[20, 21], [10, 11]]])


@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (2, 1, 4)])
def test_any_integer_shape_gives_shape_plus_dim(shape):
    emb = L.Embedding(7, 3)
    params = emb.init(jax.random.key(0), shape)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 7, shape), jnp.int32)
    y = emb.apply(params, ids)
    assert y.shape == (*shape, 3)
    assert y.dtype == jnp.float32
    np.testing.assert_array_equal(y, params["weight"][ids])


def test_int8_and_uint_ids():
    emb = L.Embedding(5, 2)
    params = emb.init(jax.random.key(0), (3,))
    for dtype in (jnp.int8, jnp.uint8, jnp.int16):
        ids = jnp.array([4, 0, 2], dtype)
        np.testing.assert_array_equal(emb.apply(params, ids), params["weight"][np.array([4, 0, 2])])


def test_default_init_is_standard_normal_with_padding_row_zero():
    emb = L.Embedding(1000, 64, padding_idx=3)
    w = emb.init(jax.random.key(0), (8,))["weight"]
    assert w.shape == (1000, 64)
    assert list(flatten({"weight": w})) == ["weight"]
    np.testing.assert_array_equal(w[3], 0.0)
    rest = np.delete(np.asarray(w), 3, axis=0)
    assert abs(rest.mean()) < 0.01
    assert abs(rest.std() - 1.0) < 0.01


def test_weight_init_override_keeps_padding_row_zero():
    emb = L.Embedding(4, 2, padding_idx=1, weight_init=constant(0.5))
    w = emb.init(jax.random.key(0), (3,))["weight"]
    np.testing.assert_array_equal(w, [[0.5, 0.5], [0, 0], [0.5, 0.5], [0.5, 0.5]])


def test_negative_padding_idx_is_normalized_as_torch(torch):
    emb = L.Embedding(5, 2, padding_idx=-1)
    assert emb.padding_idx == 4
    assert emb == L.Embedding(5, 2, padding_idx=4)
    assert torch.nn.Embedding(5, 2, padding_idx=-1).padding_idx == 4


def test_takes_ids_and_sequential_infers_with_integer_ids():
    model = L.Sequential(L.Embedding(10, 4), L.Linear(3))
    assert model.takes_ids and L.Embedding(10, 4).takes_ids
    params = model.init(jax.random.key(0), (2, 5))
    assert jax.tree.map(jnp.shape, params) == {
        "0": {"weight": (10, 4)},
        "1": {"weight": (3, 4), "bias": (3,)},
    }
    assert model.apply(params, jnp.zeros((2, 5), jnp.int32)).shape == (2, 5, 3)


@pytest.mark.parametrize("padding_idx", [None, 2, -1])
def test_torch_parity(torch, padding_idx):
    """Outputs and the weight gradient, with repeated ids and the padding id present."""
    emb = L.Embedding(6, 4, padding_idx=padding_idx)
    module = torch.nn.Embedding(6, 4, padding_idx=padding_idx)
    ids = np.array([[2, 5, 2, 0], [5, 5, 1, 2]], np.int64)
    params = load_from_torch(emb, module, ids.shape)
    pl.testing.assert_matches_torch(emb, module, ids, params=params, rtol=1e-4, atol=1e-6)


def test_padding_row_gets_zero_gradient_and_repeats_accumulate():
    """Loss = sum of all outputs: each row's gradient is its count in ids (a row of
    ones per occurrence), except the padding row, whose gradient is zero."""
    emb = L.Embedding(4, 3, padding_idx=1)
    params = emb.init(jax.random.key(0), (5,))
    ids = jnp.array([0, 1, 1, 3, 0, 0])
    grad = jax.grad(lambda p: emb.apply(p, ids).sum())(params)["weight"]
    np.testing.assert_array_equal(grad, np.array([[3.0] * 3, [0] * 3, [0] * 3, [1.0] * 3]))
    # The padding row's value is still looked up as it is (torch does the same).
    params = {"weight": params["weight"].at[1].set(7.0)}
    np.testing.assert_array_equal(emb.apply(params, jnp.array([1]))[0], 7.0)


def test_gradcheck():
    """Without padding_idx: with it, the padding row's zero gradient is by design not
    the derivative (torch's gradcheck disagrees the same way)."""
    emb = L.Embedding(4, 3)
    params = emb.init(jax.random.key(0), (5,))
    assert gradcheck(emb.apply, params, jnp.array([[0, 3, 3], [2, 1, 0]]))


def test_jit_and_vmap():
    emb = L.Embedding(9, 3)
    params = emb.init(jax.random.key(0), (4, 5))
    ids = jnp.asarray(np.random.default_rng(1).integers(0, 9, (4, 5)), jnp.int32)
    eager = emb.apply(params, ids)
    np.testing.assert_array_equal(jax.jit(emb.apply)(params, ids), eager)
    np.testing.assert_array_equal(jax.vmap(emb.apply, in_axes=(None, 0))(params, ids), eager)


def test_bfloat16_table_returns_bfloat16():
    emb = L.Embedding(5, 2)
    params = emb.init(jax.random.key(0), (3,), jnp.bfloat16)
    assert params["weight"].dtype == jnp.bfloat16
    assert emb.apply(params, jnp.array([1, 2])).dtype == jnp.bfloat16


# -- out-of-range ids ------------------------------------------------------------------


@pytest.mark.parametrize("bad", [5, 17, -1])
def test_concrete_out_of_range_id_raises_naming_id_and_size(bad):
    emb = L.Embedding(5, 2)
    params = emb.init(jax.random.key(0), (3,))
    with pytest.raises(
        ValueError,
        match=rf"Embedding: id {bad} at index \(1, 0\) is out of range for a table of 5 "
        r"embeddings \(ids must be in \[0, 5\)\)",
    ):
        emb.apply(params, jnp.array([[0, 1], [bad, 2]]))


def test_numpy_ids_are_checked_too():
    emb = L.Embedding(5, 2)
    params = emb.init(jax.random.key(0), (3,))
    with pytest.raises(ValueError, match=r"Embedding: id 9 at index \(2,\)"):
        emb.apply(params, np.array([0, 1, 9]))


def test_out_of_range_under_jit_fills_nan():
    """Traced ids cannot be checked while tracing: out-of-range rows (negative ones too)
    come out as NaN instead of another row, and the in-range rows are unaffected."""
    emb = L.Embedding(3, 2)
    params = {"weight": jnp.arange(6.0).reshape(3, 2)}
    y = jax.jit(emb.apply)(params, jnp.array([2, 3, -1, 0]))
    np.testing.assert_array_equal(y[0], [4, 5])
    np.testing.assert_array_equal(y[3], [0, 1])
    assert np.isnan(y[1]).all() and np.isnan(y[2]).all()


def test_out_of_range_under_jit_detectable_with_checkify():
    emb = L.Embedding(3, 2)
    params = emb.init(jax.random.key(0), (4,))
    checked = jax.jit(checkify.checkify(emb.apply, errors=checkify.index_checks))
    err, _ = checked(params, jnp.array([0, 2]))
    err.throw()  # in range: no error
    err, _ = checked(params, jnp.array([0, 4]))
    with pytest.raises(
        checkify.JaxRuntimeError, match=r"index 4 is out of bounds for axis 0 with size 3"
    ):
        err.throw()
    err, _ = checked(params, jnp.array([-2, 0]))
    assert "index -2 is out of bounds" in err.get()


# -- errors ---------------------------------------------------------------------------


def test_float_ids_rejected():
    emb = L.Embedding(5, 2)
    params = emb.init(jax.random.key(0), (3,))
    with pytest.raises(
        ValueError, match=r"Embedding: ids dtype expected an integer dtype, got float32"
    ):
        emb.apply(params, jnp.array([0.0, 1.0]))
    with pytest.raises(
        ValueError, match=r"Embedding: ids dtype expected an integer dtype, got bool"
    ):
        emb.apply(params, jnp.array([True, False]))


def test_table_shape_must_match_configuration():
    emb = L.Embedding(5, 2)
    with pytest.raises(
        ValueError, match=r"Embedding: weight shape expected \(5, 2\), got \(4, 2\)"
    ):
        emb.apply({"weight": jnp.zeros((4, 2))}, jnp.array([0]))


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        ((0, 3), {}, r"Embedding: num_embeddings must be a positive integer, got 0"),
        ((4, -1), {}, r"Embedding: embedding_dim must be a positive integer, got -1"),
        ((4, 3), {"padding_idx": 4}, r"Embedding: padding_idx must be in \[-4, 4\), got 4"),
        ((4, 3), {"padding_idx": -5}, r"Embedding: padding_idx must be in \[-4, 4\), got -5"),
        ((4, 3), {"padding_idx": 1.0}, r"Embedding: padding_idx must be in \[-4, 4\), got 1.0"),
    ],
)
def test_config_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        L.Embedding(*args, **kwargs)


# -- max_norm, norm_type, scale_grad_by_freq -------------------------------------------


def _torch_lookup(torch, weight, ids, **kw):
    w = torch.tensor(weight, requires_grad=True)
    y = torch.nn.functional.embedding(torch.tensor(ids), w, **kw)
    g = np.random.default_rng(3).standard_normal(tuple(y.shape)).astype(np.float32)
    (y * torch.tensor(g)).sum().backward()
    return y.detach().numpy(), g, w.grad.numpy(), w.detach().numpy()


def _ours(emb, weight, ids, g):
    def loss(w):
        y = emb.apply({"weight": w}, ids)
        return jnp.sum(y * g), y

    dw, y = jax.jit(jax.grad(loss, has_aux=True))(jnp.asarray(weight))
    return np.asarray(y), np.asarray(dw)


def test_max_norm_worked_example():
    """Row [3, 4] has 2-norm 5 > max_norm 1: it comes out as [3, 4] / (5 + 1e-7) =
    [0.6, 0.8]; row [0.3, 0.4] (norm 0.5) is unchanged; with norm_type=1 the first has
    norm 7: [3/7, 4/7]. The gradient is the plain lookup's (torch rescales outside
    autograd): ones for each looked-up row, not 1/5. params are not changed;
    ``renorm`` gives the table torch's in-place rescaling leaves."""
    params = {"weight": jnp.array([[3.0, 4.0], [0.3, 0.4], [6.0, 8.0]])}
    ids = jnp.array([0, 1])
    emb = L.Embedding(3, 2, max_norm=1.0)
    np.testing.assert_allclose(emb.apply(params, ids), [[0.6, 0.8], [0.3, 0.4]], rtol=1e-6)
    l1 = L.Embedding(3, 2, max_norm=1.0, norm_type=1)
    np.testing.assert_allclose(l1.apply(params, ids)[0], [3 / 7, 4 / 7], rtol=1e-6)
    dw = jax.grad(lambda p: emb.apply(p, ids).sum())(params)["weight"]
    np.testing.assert_allclose(dw, [[1, 1], [1, 1], [0, 0]])
    renormed = emb.renorm(params, ids)["weight"]
    np.testing.assert_allclose(renormed, [[0.6, 0.8], [0.3, 0.4], [6.0, 8.0]], rtol=1e-6)
    assert L.Embedding(3, 2).renorm(params, ids) == params


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf"), 3.0])
def test_max_norm_matches_torch(torch, norm_type):
    """Outputs, gradients and the weight torch leaves (``renorm``), repeated ids and a
    padding row included; rows on both sides of max_norm."""
    weight = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    weight[4] *= 0.1
    ids = np.array([[1, 4, 1], [0, 5, 2]])
    kw = dict(max_norm=0.8, norm_type=norm_type, padding_idx=2)
    y_t, g, dw_t, w_t = _torch_lookup(torch, weight, ids, **kw)
    emb = L.Embedding(6, 3, **kw)
    y, dw = _ours(emb, weight, ids, g)
    np.testing.assert_allclose(y, y_t, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dw, dw_t, rtol=1e-6)
    np.testing.assert_allclose(emb.renorm({"weight": jnp.asarray(weight)}, ids)["weight"], w_t,
                               rtol=1e-6)  # fmt: skip


def test_scale_grad_by_freq_matches_torch(torch):
    """ids [[1, 1, 2], [1, 3, 3]] (counts 3, 1, 2): each row's gradient is divided by its
    count; with max_norm too; forward mode is the transpose of reverse mode."""
    weight = np.random.default_rng(1).standard_normal((5, 2)).astype(np.float32)
    ids = np.array([[1, 1, 2], [1, 3, 3]])
    for kw in (dict(scale_grad_by_freq=True), dict(scale_grad_by_freq=True, max_norm=0.5)):
        y_t, g, dw_t, _ = _torch_lookup(torch, weight, ids, **kw)
        emb = L.Embedding(5, 2, **kw)
        y, dw = _ours(emb, weight, ids, g)
        np.testing.assert_allclose(y, y_t, rtol=1e-6)
        np.testing.assert_allclose(dw, dw_t, rtol=1e-6)
    ones = jax.grad(lambda w: emb.apply({"weight": w}, ids).sum())(jnp.ones((5, 2)))
    np.testing.assert_allclose(ones[:, 0], [0, 1, 1, 1, 0])
    t = np.random.default_rng(2).standard_normal(weight.shape).astype(np.float32)
    _, jvp = jax.jvp(lambda w: emb.apply({"weight": w}, ids), (jnp.asarray(weight),), (t,))
    np.testing.assert_allclose(np.sum(np.asarray(jvp) * g), np.sum(dw * t), rtol=1e-5)


def test_new_options_keep_the_default_and_are_checked():
    assert L.Embedding(4, 2) == L.Embedding(4, 2, max_norm=None, scale_grad_by_freq=False)
    with pytest.raises(ValueError, match=r"Embedding: max_norm must be >= 0, got -1"):
        L.Embedding(4, 2, max_norm=-1)
    with pytest.raises(ValueError, match=r"Embedding: norm_type must be a real number or \+-inf"):
        L.Embedding(4, 2, norm_type="l2")
    with pytest.raises(ValueError, match=r"Embedding: scale_grad_by_freq must be True or False"):
        L.Embedding(4, 2, scale_grad_by_freq="yes")
