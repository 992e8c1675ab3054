"""Layers of two inputs beyond the registry's table (torch parity with randomized weights
and gradcheck are there): Bilinear, CosineSimilarity, PairwiseDistance. Worked examples,
torch's broadcasting rules, the kinks (clamped norms, equal inputs, ties), init
statistics."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L
from purelayers.layers._checks import LayerError

KEY = jax.random.key(0)


def _vs_torch(torch, layer, module, x1, x2, *, rtol=1e-5, atol=1e-6, params=None):
    """Outputs and the gradients of ``sum(out * g)`` w.r.t. both inputs, against torch."""
    x1, x2 = np.asarray(x1, np.float32), np.asarray(x2, np.float32)
    params = {} if params is None else params
    t1, t2 = (torch.tensor(a, requires_grad=True) for a in (x1, x2))
    out = module(t1, t2)
    g = np.random.default_rng(5).standard_normal(tuple(out.shape)).astype(np.float32)
    (out * torch.tensor(g)).sum().backward()

    def loss(a, b):
        y = layer.apply(params, a, b)
        return jnp.sum(y * g), y

    grad = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))
    (d1, d2), y = grad(jnp.asarray(x1), jnp.asarray(x2))
    np.testing.assert_allclose(y, out.detach().numpy(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(d1, t1.grad.numpy(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(d2, t2.grad.numpy(), rtol=rtol, atol=atol)


# -- Bilinear ---------------------------------------------------------------------------


def test_bilinear_worked_example():
    """W = [[[1, 2], [3, 4]]], b = [0.5], x1 = [1, 2], x2 = [3, -1].

    W x2 = [1*3 + 2*(-1), 3*3 + 4*(-1)] = [1, 5]; y = x1 . (W x2) + b = 1 + 10 + 0.5 = 11.5.
    dy/dx1 = W x2 = [1, 5]; dy/dx2 = W^T x1 = [1 + 6, 2 + 8] = [7, 10];
    dy/dW = x1 x2^T = [[3, -1], [6, -2]]; dy/db = 1.
    """
    params = {"weight": jnp.array([[[1.0, 2.0], [3.0, 4.0]]]), "bias": jnp.array([0.5])}
    bil = L.Bilinear(1)
    x1, x2 = jnp.array([1.0, 2.0]), jnp.array([3.0, -1.0])
    np.testing.assert_allclose(bil.apply(params, x1, x2), [11.5])
    gp, g1, g2 = jax.grad(lambda p, a, b: bil.apply(p, a, b)[0], argnums=(0, 1, 2))(params, x1, x2)
    np.testing.assert_allclose(g1, [1.0, 5.0])
    np.testing.assert_allclose(g2, [7.0, 10.0])
    np.testing.assert_allclose(gp["weight"], [[[3.0, -1.0], [6.0, -2.0]]])
    np.testing.assert_allclose(gp["bias"], [1.0])


def test_bilinear_init_bounds_and_names():
    """torch's init: weight and bias U(-1/sqrt(in1), 1/sqrt(in1)); in1 = 4: bound 0.5."""
    params = L.Bilinear(64).init(jax.random.key(1), ((2, 4), (2, 8)))
    assert list(params) == ["weight", "bias"]
    w, b = np.asarray(params["weight"]), np.asarray(params["bias"])
    assert w.shape == (64, 4, 8) and b.shape == (64,)
    assert np.abs(w).max() <= 0.5 and np.abs(w).max() > 0.49
    assert np.abs(b).max() <= 0.5
    assert abs(w.std() - 0.5 / math.sqrt(3)) < 0.01
    assert list(L.Bilinear(3, bias=False).init(KEY, ((4,), (2,)))) == ["weight"]


@pytest.mark.parametrize(
    ("bias", "s1", "s2"),
    [(False, (2, 3), (2, 4)), (True, (3,), (4,)), (True, (2, 1, 3), (2, 1, 4))],
)
def test_bilinear_parity_leading_axes(torch, bias, s1, s2):
    module = torch.nn.Bilinear(3, 4, 2, bias=bias)
    rng = np.random.default_rng(0)
    x1, x2 = rng.standard_normal(s1), rng.standard_normal(s2)
    params = {k: jnp.asarray(v.detach().numpy()) for k, v in module.state_dict().items()}
    _vs_torch(torch, L.Bilinear(2, bias=bias), module, x1, x2, params=params, rtol=1e-5)


def test_bilinear_batch_axes_must_match_as_torch(torch):
    module = torch.nn.Bilinear(3, 4, 2)
    with pytest.raises(RuntimeError, match="batch dimensions do not match"):
        module(torch.zeros(2, 3), torch.zeros(1, 4))
    bil = L.Bilinear(2)
    params = bil.init(KEY, ((2, 3), (2, 4)))
    with pytest.raises(LayerError, match=r"x2 leading \(batch\) axes expected x1's \(2,\)"):
        bil.apply(params, jnp.zeros((2, 3)), jnp.zeros((1, 4)))
    with pytest.raises(LayerError, match=r"x1 last axis \(in1_features\) expected 3, got 5"):
        bil.apply(params, jnp.zeros((2, 5)), jnp.zeros((2, 4)))
    with pytest.raises(LayerError, match=r"x1 last axis \(in1_features\) expected at least 1"):
        bil.init(KEY, ((2, 0), (2, 4)))  # torch: "in1_features must be > 0"


def test_bilinear_bfloat16_and_empty_batch():
    bil = L.Bilinear(2)
    params = bil.init(KEY, ((2, 3), (2, 4)), jnp.bfloat16)
    y = bil.apply(params, jnp.ones((2, 3), jnp.bfloat16), jnp.ones((2, 4), jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    assert bil.apply(params, jnp.ones((0, 3)), jnp.ones((0, 4))).shape == (0, 2)


# -- CosineSimilarity ---------------------------------------------------------------------


def test_cosine_worked_example():
    """x1 = [[2, 0], [0, 3], [1, 1]], x2 = [1, 0] (broadcast): cosines 1, 0, 1/sqrt(2)."""
    y = L.CosineSimilarity().apply({}, jnp.array([[2.0, 0], [0, 3], [1, 1]]), jnp.array([[1.0, 0]]))
    np.testing.assert_allclose(y, [1.0, 0.0, 1 / math.sqrt(2)], rtol=1e-6)


def test_cosine_clamps_each_norm_as_torch(torch):
    """torch divides each input by max(|x|, eps): |x1| = 1e-9 < eps = 1e-8 and |x2| =
    sqrt(10) * 1e-9, so y = (x1 . x2) / eps^2 = 3e-18 / 1e-16 = 0.03 (a clamp of the
    product of the norms would give 3e-10). The clamp changes the value only: the
    derivative flows through the norm unclamped (torch clamps in place under no_grad)."""
    x1, x2 = np.array([[1e-9, 0.0]]), np.array([[3e-9, 1e-9]])
    cos, module = L.CosineSimilarity(), torch.nn.CosineSimilarity()
    np.testing.assert_allclose(cos.apply({}, x1.astype(np.float32), x2.astype(np.float32)), [0.03])
    _vs_torch(torch, cos, module, x1, x2, rtol=1e-4)
    # a zero input (norm 0: its derivative is 0), parallel inputs, one just above eps
    _vs_torch(torch, cos, module, [[0.0, 0.0], [1.0, 2.0]], [[1.0, 2.0], [2.0, 4.0]], rtol=1e-4)
    # (gradients near 4e7 that cancel to 0 in the first component: round-off of 1)
    _vs_torch(torch, cos, module, [[2e-8, 0.0]], [[1.0, 3.0]], rtol=1e-4, atol=2.0)


@pytest.mark.parametrize(
    ("dim", "s1", "s2"), [(-1, (2, 1, 3), (4, 3)), (0, (3, 2), (3, 1)), (1, (2, 3), (3,))]
)
def test_cosine_broadcasts_as_torch(torch, dim, s1, s2):
    rng = np.random.default_rng(1)
    x1, x2 = rng.standard_normal(s1), rng.standard_normal(s2)
    cos, module = L.CosineSimilarity(dim=dim), torch.nn.CosineSimilarity(dim=dim)
    _vs_torch(torch, cos, module, x1, x2, rtol=1e-4, atol=1e-6)


def test_cosine_scalars_and_dims_as_torch(torch):
    y = L.CosineSimilarity(dim=0).apply({}, jnp.asarray(2.0), jnp.asarray(-3.0))
    assert y.shape == () and float(y) == -1.0
    assert (
        tuple(torch.nn.CosineSimilarity(dim=0)(torch.tensor(2.0), torch.tensor(-3.0)).shape) == ()
    )
    with pytest.raises(LayerError, match=r"dim=2 expected an axis of the broadcast shape"):
        L.CosineSimilarity(dim=2).apply({}, jnp.zeros((2, 3)), jnp.zeros((2, 3)))
    # one integer input computes in the other's floating dtype, as torch
    y = L.CosineSimilarity().apply({}, jnp.array([[1, 0]]), jnp.array([[1.0, 1.0]]))
    np.testing.assert_allclose(y, [1 / math.sqrt(2)], rtol=1e-6)


# -- PairwiseDistance ---------------------------------------------------------------------


def test_pairwise_worked_example():
    """||[3, 4] - 0 + 0||_2 = 5; ||x - x + eps||_2 = sqrt(D) eps (D = 2: 1.414e-6); the
    1-norm of [1, -2] is 3, the inf-norm 2."""
    d = L.PairwiseDistance(eps=0.0)
    np.testing.assert_allclose(d.apply({}, jnp.array([[3.0, 4.0]]), jnp.zeros((1, 2))), [5.0])
    same = L.PairwiseDistance().apply({}, jnp.ones((1, 2)), jnp.ones((1, 2)))
    np.testing.assert_allclose(same, [math.sqrt(2) * 1e-6], rtol=1e-4)
    x, z = jnp.array([[1.0, -2.0]]), jnp.zeros((1, 2))
    np.testing.assert_allclose(L.PairwiseDistance(p=1, eps=0.0).apply({}, x, z), [3.0])
    np.testing.assert_allclose(L.PairwiseDistance(p=math.inf, eps=0.0).apply({}, x, z), [2.0])


# Rows hit every kink: equal inputs (a zero difference without eps), a zero component,
# a tie for the largest and the smallest |component|.
_X1 = np.array([[1.0, 2.0, 3.0], [0.0, 1.0, -1.0], [2.0, -2.0, 0.5], [1.0, 1.0, 1.0]])
_X2 = np.array([[1.0, 2.0, 3.0], [1.0, 0.0, -1.0], [0.0, 0.0, 0.0], [0.5, 1.5, 1.0]])


# p, eps: without eps the equal inputs' difference is exactly 0
KINK_CASES = [(2.0, 0.0), (2.0, 1e-6), (1.0, 0.0), (math.inf, 0.0), (-math.inf, 1e-6),
              (3.0, 0.0), (1.5, 1e-6), (0.5, 0.0), (-1.0, 1e-6), (0.0, 0.0)]  # fmt: skip


@pytest.mark.parametrize(("p", "eps"), KINK_CASES)
def test_pairwise_kinks_as_torch(torch, p, eps):
    layer, module = L.PairwiseDistance(p=p, eps=eps), torch.nn.PairwiseDistance(p=p, eps=eps)
    if p == 0:  # torch's 0-"norm" counts nonzeros; it has no gradient to compare
        y = layer.apply({}, _X1.astype(np.float32), _X2.astype(np.float32))
        ref = module(torch.tensor(_X1, dtype=torch.float32), torch.tensor(_X2, dtype=torch.float32))
        np.testing.assert_array_equal(y, ref.numpy())
        g = jax.grad(lambda a: layer.apply({}, a, jnp.asarray(_X2)).sum())(jnp.asarray(_X1))
        assert not np.asarray(g).any()
        return
    _vs_torch(torch, layer, module, _X1, _X2, rtol=1e-4, atol=1e-5)


def test_pairwise_broadcasting_keepdim_and_scalars(torch):
    rng = np.random.default_rng(2)
    x1, x2 = rng.standard_normal((3,)), rng.standard_normal((2, 3))
    for keepdim in (False, True):
        layer = L.PairwiseDistance(keepdim=keepdim)
        module = torch.nn.PairwiseDistance(keepdim=keepdim)
        _vs_torch(torch, layer, module, x1, x2, rtol=1e-5)
        _vs_torch(torch, layer, module, rng.standard_normal((2, 1, 3)), x2, rtol=1e-5)
        y = layer.apply({}, jnp.asarray(1.0), jnp.asarray(3.0))
        assert y.shape == () and abs(float(y) - 2.0) < 1e-5  # torch: a scalar either way
    # integers compute in float32, as torch's difference plus eps does
    y = L.PairwiseDistance().apply({}, jnp.array([[0, 3]]), jnp.array([[4, 0]]))
    assert y.dtype == jnp.float32 and abs(float(y[0]) - 5.0) < 1e-5
    with pytest.raises(
        LayerError, match=r"inputs' common dtype expected floating point or integer"
    ):
        L.PairwiseDistance().apply({}, jnp.array([[True]]), jnp.array([[False]]))


def test_distances_jit_vmap_and_no_params():
    for layer in (L.CosineSimilarity(), L.PairwiseDistance()):
        assert layer.init(KEY, ((2, 3), (1, 3))) == {}
        x1, x2 = jnp.arange(6.0).reshape(2, 3), jnp.ones((1, 3))
        eager = layer.apply({}, x1, x2)
        pl.testing.assert_tree_allclose(jax.jit(layer.apply)({}, x1, x2), eager)
        batched = jax.vmap(layer.apply, in_axes=(None, 0, None))({}, x1[:, None], x2)
        pl.testing.assert_tree_allclose(batched[:, 0], eager)
