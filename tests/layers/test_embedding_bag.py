"""EmbeddingBag beyond the registry's table: worked example, torch parity of every mode
and input form (padding, per-sample weights, max_norm, empty bags, ties for the
maximum), gradient scaling by frequency, offsets under jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from purelayers import layers as L
from purelayers.layers._checks import LayerError

KEY = jax.random.key(0)
# row i of the table is (10 i, 10 i + 1)
TABLE = np.array([[10.0 * i, 10.0 * i + 1] for i in range(6)], np.float32)


def test_worked_example():
    """ids [1, 2, 4, 5, 4, 3] with offsets [0, 2, 2]: bags [1, 2], [] and [4, 5, 4, 3].

    sum: [10 + 20, 11 + 21] = [30, 32]; [0, 0]; [40 + 50 + 40 + 30, ...] = [160, 164].
    mean: [15, 16]; [0, 0]; [40, 41]. max: [20, 21]; [0, 0]; [50, 51].
    With padding_idx=4 the 4s leave the last bag: sum [80, 82], mean [40, 41], max [50, 51].
    """
    ids, offsets = np.array([1, 2, 4, 5, 4, 3]), np.array([0, 2, 2])
    params = {"weight": jnp.asarray(TABLE)}
    want = {
        "sum": [[30, 32], [0, 0], [160, 164]],
        "mean": [[15, 16], [0, 0], [40, 41]],
        "max": [[20, 21], [0, 0], [50, 51]],
    }
    padded = {"sum": [80, 82], "mean": [40, 41], "max": [50, 51]}
    for mode, y in want.items():
        np.testing.assert_allclose(L.EmbeddingBag(6, 2, mode=mode).apply(params, ids, offsets), y)
        bag = L.EmbeddingBag(6, 2, mode=mode, padding_idx=4)
        np.testing.assert_allclose(bag.apply(params, ids, offsets)[2], padded[mode])


def _torch_bag(torch, weight, ids, offsets, psw, **kw):
    w = torch.tensor(weight, requires_grad=True)
    p = None if psw is None else torch.tensor(psw, requires_grad=True)
    off = None if offsets is None else torch.tensor(offsets)
    y = torch.nn.functional.embedding_bag(torch.tensor(ids), w, off, per_sample_weights=p, **kw)
    g = np.random.default_rng(3).standard_normal(tuple(y.shape)).astype(np.float32)
    (y * torch.tensor(g)).sum().backward()
    return y.detach().numpy(), g, w.grad.numpy(), None if p is None else p.grad.numpy()


def _ours(bag, weight, ids, offsets, psw, g):
    def loss(w, p):
        y = bag.apply({"weight": w}, ids, offsets, p)
        return jnp.sum(y * g), y

    (dw, dp), y = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(jnp.asarray(weight), psw)
    return np.asarray(y), np.asarray(dw), dp


# ids with ties for the maximum (rows 0 and 1 equal), padding (0), a bag of padding only
# and an empty bag (1-d forms)
_W = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
_W[1] = _W[2]
_IDS2 = np.array([[1, 2, 3], [0, 0, 0], [4, 1, 0], [5, 5, 2]])
_IDS1 = np.array([1, 2, 3, 0, 0, 4, 2, 1, 5, 5])
FORMS = {
    "2d": (_IDS2, None, False),
    "offsets": (_IDS1, np.array([0, 3, 3, 5, 8]), False),
    "last-offset": (_IDS1, np.array([0, 3, 3, 5, 8, 10]), True),
}
MODES = [("sum", None), ("sum", "psw"), ("mean", None), ("max", None)]


# every form and mode with padding; without it, the fixed-length form
PARITY = [(f, m, 0) for f in FORMS for m in range(4)] + [("2d", m, None) for m in (0, 3)]


@pytest.mark.parametrize(("form", "mode", "padding_idx"), PARITY,
                         ids=[f"{f}-{m}-pad{p}" for f, m, p in PARITY])  # fmt: skip
def test_parity_with_torch(torch, form, mode, padding_idx):
    ids, offsets, last = FORMS[form]
    mode, weights = MODES[mode]
    psw = None
    if weights:
        psw = np.random.default_rng(1).standard_normal(ids.shape).astype(np.float32)
    kw = dict(mode=mode, include_last_offset=last, padding_idx=padding_idx)
    y_t, g, dw_t, dp_t = _torch_bag(torch, _W, ids, offsets, psw, **kw)
    y, dw, dp = _ours(L.EmbeddingBag(6, 3, **kw), _W, ids, offsets, psw, g)
    np.testing.assert_allclose(y, y_t, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dw, dw_t, rtol=1e-6, atol=1e-6)
    if psw is not None:
        np.testing.assert_allclose(dp, dp_t, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["sum", "max"])
def test_max_norm_as_torch(torch, mode):
    """Rows above max_norm are rescaled to it in the output (torch: in the weight); the
    gradient is that of the plain lookup, as torch's; ``renorm`` gives torch's weight."""
    weight = _W * np.array([[3.0], [0.1], [0.1], [2.0], [1.0], [4.0]], np.float32)
    y_t, g, dw_t, _ = _torch_bag(torch, weight, _IDS2, None, None, mode=mode, max_norm=1.0)
    bag = L.EmbeddingBag(6, 3, mode=mode, max_norm=1.0)
    y, dw, _ = _ours(bag, weight, _IDS2, None, None, g)
    np.testing.assert_allclose(y, y_t, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dw, dw_t, rtol=1e-6, atol=1e-6)
    w_t = torch.tensor(weight)
    torch.nn.functional.embedding_bag(torch.tensor(_IDS2), w_t, mode=mode, max_norm=1.0)
    renormed = bag.renorm({"weight": jnp.asarray(weight)}, _IDS2)["weight"]
    np.testing.assert_allclose(renormed, w_t.numpy(), rtol=1e-6)


def test_scale_grad_by_freq():
    """Each row's gradient is divided by its id's count in the input, as
    ``torch.nn.Embedding(scale_grad_by_freq=True)`` does: ids [[1, 1, 2], [1, 3, 3]]
    (counts 3, 1, 2) with upstream ones give rows 1, 2, 3 the gradients 3/3, 1/1, 2/2.
    (torch 2.13's CPU EmbeddingBag gives 1, 1/3, 2/3 here: it divides the k-th distinct
    id's gradient by the count of the k-th smallest id.) In mean mode the per-bag
    1/3 factors come first: row 1 gets (2/3 + 1/3) / 3."""
    ids = np.array([[1, 1, 2], [1, 3, 3]])
    for mode, want in [("sum", [0, 1, 1, 1, 0]), ("mean", [0, 1 / 3, 1 / 3, 1 / 3, 0])]:
        bag = L.EmbeddingBag(5, 1, mode=mode, scale_grad_by_freq=True)
        dw = jax.grad(lambda w, bag=bag: bag.apply({"weight": w}, ids).sum())(jnp.ones((5, 1)))
        np.testing.assert_allclose(dw[:, 0], want, rtol=1e-6)


def test_scale_grad_by_freq_matches_torch_where_its_kernel_agrees(torch):
    """Ids that all occur equally often (here twice): torch's kernel divides by the
    right count, and both agree, forward and reverse mode alike."""
    ids = np.array([[1, 2, 3], [3, 2, 1]])
    y_t, g, dw_t, _ = _torch_bag(torch, _W, ids, None, None, mode="sum", scale_grad_by_freq=True)
    bag = L.EmbeddingBag(6, 3, mode="sum", scale_grad_by_freq=True)
    y, dw, _ = _ours(bag, _W, ids, None, None, g)
    np.testing.assert_allclose(y, y_t, rtol=1e-6)
    np.testing.assert_allclose(dw, dw_t, rtol=1e-6)
    tangent = np.random.default_rng(4).standard_normal(_W.shape).astype(np.float32)
    _, jvp = jax.jvp(lambda w: bag.apply({"weight": w}, ids), (jnp.asarray(_W),), (tangent,))
    np.testing.assert_allclose(np.sum(np.asarray(jvp) * g), np.sum(dw * tangent), rtol=1e-5)


def test_offsets_under_jit_compile_once_and_nan_when_broken():
    bag = L.EmbeddingBag(6, 2, mode="sum")
    params = {"weight": jnp.asarray(TABLE)}
    ids = jnp.array([1, 2, 4, 5, 4, 3])
    traces = []

    @jax.jit
    def run(offsets):
        traces.append(1)
        return bag.apply(params, ids, offsets)

    np.testing.assert_allclose(
        run(jnp.array([0, 2, 2])), bag.apply(params, ids, np.array([0, 2, 2]))
    )
    np.testing.assert_allclose(run(jnp.array([0, 1, 5]))[0], TABLE[1])
    assert len(traces) == 1
    for broken in ([1, 2, 2], [0, 3, 2], [0, 2, 7]):  # torch raises for each
        assert np.isnan(np.asarray(run(jnp.array(broken)))).all()
    with pytest.raises(LayerError, match=r"offsets\[0\] expected 0"):
        bag.apply(params, ids, np.array([1, 2, 2]))


def test_init_ids_and_empty_inputs(torch):
    bag = L.EmbeddingBag(50, 40, padding_idx=-1)
    assert bag.padding_idx == 49
    w = np.asarray(bag.init(KEY, (3, 2))["weight"])
    assert not w[49].any() and abs(w[:49].std() - 1.0) < 0.05
    params = {"weight": jnp.ones((50, 40))}
    with pytest.raises(LayerError, match=r"id 50 at index \(0, 1\) is out of range"):
        bag.apply(params, np.array([[1, 50]]))
    nan = jax.jit(bag.apply)(params, jnp.array([[1, 50], [1, 2]]))
    assert np.isnan(np.asarray(nan[0])).all() and np.isfinite(np.asarray(nan[1])).all()
    # an empty batch gives (0, D), as torch; an empty 1-d input gives empty bags of zeros
    assert bag.apply(params, np.zeros((0, 3), np.int32)).shape == (0, 40)
    assert tuple(torch.nn.EmbeddingBag(50, 40)(torch.zeros(0, 3, dtype=torch.long)).shape) == (
        0,
        40,
    )
    y = bag.apply(params, np.zeros(0, np.int32), np.array([0, 0]))
    assert y.shape == (2, 40) and not np.asarray(y).any()
