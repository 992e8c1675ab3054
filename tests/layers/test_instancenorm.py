"""The second round's norms: instance norms and the local response norms (worked
examples, training against torch: outputs, gradients, running statistics; unbatched
inputs; torch's legacy window), SyncBatchNorm across shards, and torch's bias switch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L
from purelayers.params import flatten, unflatten
from purelayers.testing import assert_tree_allclose, gradcheck
from tests.twins import load_from_torch, randomize


def _x(*shape, shift=0.0, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) + shift).astype(np.float32)


def test_instance_norm_worked_example():
    """The channel [[0, 2], [4, 6]]: mean 3, population variance 5, so it becomes
    [-3, -1, 1, 3] / sqrt(5 + 1e-5); the other channel [1, 1, 1, 1] becomes zeros."""
    norm = L.InstanceNorm2d()
    x = jnp.array([[[[0.0, 2.0], [4.0, 6.0]], [[1.0, 1.0], [1.0, 1.0]]]])
    y = norm.apply(norm.init(jax.random.key(0), x.shape), x)
    expected = np.array([-3.0, -1.0, 1.0, 3.0]) / np.sqrt(5.00001)
    np.testing.assert_allclose(y[0, 0].ravel(), expected, rtol=1e-6)
    np.testing.assert_allclose(y[0, 1], 0.0, atol=1e-6)


def _randomize_params(params, seed=1):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda a: jnp.asarray(rng.standard_normal(a.shape), a.dtype), params)


def _buffers(module):
    names = dict(module.named_buffers())
    return unflatten({k: v for k, v in module.state_dict().items() if k in names})


@pytest.mark.parametrize(
    "cls, shape, kwargs",
    [
        ("InstanceNorm1d", (3, 5), {"affine": True}),  # unbatched (C, L)
        ("InstanceNorm2d", (2, 3, 3, 4), {"momentum": None}),
        ("InstanceNorm3d", (2, 3, 2, 2, 3), {"affine": True, "bias": False, "momentum": 0.5}),
    ],
)
def test_instance_norm_with_running_stats_trains_then_evaluates_as_torch(torch, cls, shape, kwargs):
    """Three training steps (outputs and gradients from instance statistics; running
    statistics the batch average of each instance's mean and unbiased variance;
    ``num_batches_tracked`` left at 0, as torch), then eval with the running statistics."""
    norm = getattr(L, cls)(track_running_stats=True, **kwargs)
    module = randomize(torch, getattr(torch.nn, cls)(3, track_running_stats=True, **kwargs))
    params = load_from_torch(norm, module, shape)
    state = jax.tree.map(jnp.asarray, _buffers(module))  # the twin's randomized buffers
    state["num_batches_tracked"] = state["num_batches_tracked"].astype(jnp.int32)
    step = jax.jit(lambda p, x, s: norm.apply(p, x, state=s, train=True))
    for i in range(3):
        x = _x(*shape, shift=float(i), seed=i)
        module.zero_grad()
        pl.testing.assert_matches_torch(
            norm,
            module,
            x,
            params=params,
            apply=lambda p, x, s=state: norm.apply(p, x, state=s, train=True)[0],
            train=True,
            rtol=1e-4,
            atol=1e-5,
        )
        _, state = step(params, jnp.asarray(x), state)
        assert_tree_allclose(state, _buffers(module), rtol=1e-5, atol=1e-6)
    assert int(state["num_batches_tracked"]) == 0
    module.zero_grad()
    x = _x(*shape, shift=0.5, seed=3)
    pl.testing.assert_matches_torch(
        norm, module, x, params=params, apply=lambda p, x: norm.apply(p, x, state=state)[0],
        rtol=1e-4,
    )  # fmt: skip


def test_unbatched_input_is_one_sample_and_channels_are_free_without_params():
    """``(C, L)`` is normalized as the batch ``(1, C, L)``; with neither affine params nor
    running statistics any channel count goes (torch only warns)."""
    norm = L.InstanceNorm1d()
    x = jnp.asarray(_x(3, 5))
    params = norm.init(jax.random.key(0), (2, 4, 5))
    np.testing.assert_allclose(norm.apply(params, x), norm.apply(params, x[None])[0], rtol=1e-6)
    assert norm.apply({}, jnp.ones((2, 6, 5))).shape == (2, 6, 5)


def test_instance_norm_bias_false_names_match_torch(torch):
    norm = L.InstanceNorm2d(affine=True, bias=False, track_running_stats=True)
    merged = pl.params.merge(
        norm.init(jax.random.key(0), (2, 3, 4, 4)), norm.init_state((2, 3, 4, 4))
    )
    module = torch.nn.InstanceNorm2d(3, affine=True, bias=False, track_running_stats=True)
    assert list(pl.params.flatten(norm.ordered(merged))) == list(module.state_dict())


def test_instance_norm_gradcheck_in_train_mode():
    norm = L.InstanceNorm1d(affine=True, track_running_stats=True)
    params = jax.tree.map(lambda a: a + 0.3, norm.init(jax.random.key(0), (2, 2, 3)))
    state = norm.init_state((2, 2, 3))
    x = jnp.asarray(_x(2, 2, 3))
    assert gradcheck(lambda p, v: norm.apply(p, v, state=state, train=True)[0], params, x)


# -- local response norms ------------------------------------------------------------


def test_local_response_norm_worked_example():
    """size 2, alpha 1, beta 1, k 1 on channels [1, 2, 3]: windows [c - 1, c] sum the
    squares to 1, 5, 13, so y = [1 / 1.5, 2 / 3.5, 3 / 7.5]."""
    lrn = L.LocalResponseNorm(2, alpha=1.0, beta=1.0)
    y = lrn.apply({}, jnp.array([1.0, 2.0, 3.0]).reshape(1, 3, 1))
    np.testing.assert_allclose(y[0, :, 0], [1 / 1.5, 2 / 3.5, 3 / 7.5], rtol=1e-6)


@pytest.mark.parametrize("size, shape", [(2, (2, 5, 3)), (4, (1, 6, 2, 1, 3))])
def test_local_response_norm_matches_torch_on_3d_and_5d(torch, size, shape):
    x = _x(*shape)
    module = torch.nn.LocalResponseNorm(size, alpha=0.7, beta=0.6, k=1.3)
    pl.testing.assert_matches_torch(
        L.LocalResponseNorm(size, alpha=0.7, beta=0.6, k=1.3), module, x, rtol=1e-4
    )


def test_cross_map_lrn_worked_example():
    """size 3 (p = 2) on four unit channels: channel 2 sums channels 1..3 and channel 0,
    channel 3 sums 2..3 and channel 0, so with alpha = size, beta 1, k 0 the outputs are
    the reciprocals of 2, 3, 4, 3."""
    lrn = L.CrossMapLRN2d(3, alpha=3.0, beta=1.0, k=0.0)
    y = lrn.apply({}, jnp.ones((1, 4, 1, 1)))
    np.testing.assert_allclose(1 / y[0, :, 0, 0], [2.0, 3.0, 4.0, 3.0], rtol=1e-6)


def test_cross_map_lrn_forward_is_torchs_and_its_gradient_the_true_derivative(torch):
    """Over 7 channels torch's legacy forward sums a window plus channel 0; ours gives
    the same outputs for every size. Its hand-written backward is not that forward's
    derivative (torch's own gradcheck fails); ours passes gradcheck in float64."""
    x = _x(2, 7, 2, 3)
    for size in (1, 2, 3, 4, 5):
        ours = L.CrossMapLRN2d(size, alpha=0.7, beta=0.8, k=1.1).apply({}, jnp.asarray(x))
        theirs = torch.nn.CrossMapLRN2d(size, 0.7, 0.8, 1.1)(torch.tensor(x)).numpy()
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    x64 = np.random.default_rng(1).standard_normal((1, 5, 2, 1))
    module = torch.nn.CrossMapLRN2d(3, 0.5, 0.75, 1.0)
    xt = torch.tensor(x64, requires_grad=True)
    assert not torch.autograd.gradcheck(module, (xt,), raise_exception=False)
    layer = L.CrossMapLRN2d(3, alpha=0.5)
    assert gradcheck(lambda v: layer.apply({}, v), x64)


# -- SyncBatchNorm and bias=False ------------------------------------------------------


def test_sync_batch_norm_over_two_shards_is_one_batch_norm_of_the_whole_batch():
    """vmap over 2 shards with axis_name: outputs, new running statistics (the unbiased
    variance of all 8 samples) and gradients equal BatchNorm1d's on the concatenation."""
    sync, whole = L.SyncBatchNorm(axis_name="shard", momentum=0.3), L.BatchNorm1d(momentum=0.3)
    x = jnp.asarray(_x(2, 4, 3, 2, shift=1.0))
    params = _randomize_params(whole.init(jax.random.key(0), (8, 3, 2)))
    state = whole.init_state((8, 3, 2))
    cot = jnp.asarray(_x(2, 4, 3, 2, seed=5))

    def sharded(p, x):
        run = lambda x: sync.apply(p, x, state=state, train=True)  # noqa: E731
        y, new = jax.vmap(run, axis_name="shard")(x)
        return jnp.sum(y * cot), (y, new)

    def one(p, x):
        y, new = whole.apply(p, x.reshape(8, 3, 2), state=state, train=True)
        return jnp.sum(y.reshape(2, 4, 3, 2) * cot), (y, new)

    (ga, (ya, new_a)), (gb, (yb, new_b)) = jax.jit(
        lambda p, x: (
            jax.grad(sharded, (0, 1), has_aux=True)(p, x),
            jax.grad(one, (0, 1), has_aux=True)(p, x),
        )
    )(params, x)
    assert_tree_allclose(ya.reshape(8, 3, 2), yb, rtol=1e-5, atol=1e-5)
    assert_tree_allclose(jax.tree.map(lambda a: a[0], new_a), new_b, rtol=1e-6, atol=1e-6)
    assert_tree_allclose(jax.tree.map(lambda a: a[1], new_a), new_b, rtol=1e-6, atol=1e-6)
    assert_tree_allclose(ga, gb, rtol=1e-4, atol=1e-5)


def test_sync_batch_norm_without_axis_is_batch_norm_and_evaluates_shards_apart(torch):
    """axis_name=None trains as BatchNorm2d; as torch, statistics are synchronized only
    in training, so without running statistics eval mode normalizes each shard alone."""
    x = jnp.asarray(_x(4, 3, 2, 2, shift=0.5))
    plain, bn = L.SyncBatchNorm(), L.BatchNorm2d()
    params, state = bn.init(jax.random.key(0), x.shape), bn.init_state(x.shape)
    a = plain.apply(params, x, state=state, train=True)
    assert_tree_allclose(a, bn.apply(params, x, state=state, train=True), rtol=0, atol=0)
    free = L.SyncBatchNorm(axis_name="s", track_running_stats=False)
    shards = x.reshape(2, 2, 3, 2, 2)
    y = jax.vmap(lambda v: free.apply(params, v), axis_name="s")(shards)
    alone = L.BatchNorm2d(track_running_stats=False).apply(params, shards[1])
    assert_tree_allclose(y[1], alone, rtol=1e-6, atol=1e-6)
    module = torch.nn.SyncBatchNorm(3).train()
    pl.testing.assert_matches_torch(
        L.SyncBatchNorm(), module, np.asarray(x), apply=lambda p, v: plain.apply(p, v, state=state, train=True)[0],
        train=True, rtol=1e-4,
    )  # fmt: skip


@pytest.mark.parametrize(
    "layer, torch_make, shape",
    [
        (L.BatchNorm1d(bias=False), lambda t: t.nn.BatchNorm1d(3, bias=False), (4, 3, 5)),
        (L.BatchNorm3d(bias=False), lambda t: t.nn.BatchNorm3d(3, bias=False), (2, 3, 2, 2, 2)),
        (L.SyncBatchNorm(bias=False), lambda t: t.nn.SyncBatchNorm(3, bias=False), (4, 3)),
    ],
)
def test_bias_false_drops_the_bias_as_torch(torch, layer, torch_make, shape):
    module = randomize(torch, torch_make(torch))
    merged = pl.params.merge(layer.init(jax.random.key(0), shape), layer.init_state(shape))
    assert list(flatten(layer.ordered(merged))) == list(module.state_dict())
    pl.testing.assert_matches_torch(layer, module, _x(*shape), rtol=1e-4)
