"""Pooling, second part: indices of the max pools, ``divisor_override``, ``LPPoolNd``,
``FractionalMaxPoolNd`` and ``MaxUnpoolNd``: worked examples, torch parity (outputs,
indices and gradients; ties, NaNs and zeros), the random windows' key, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L
from purelayers.layers import LayerError


def _twin(torch, name, *args, **kwargs):
    return getattr(torch.nn, name)(*args, **kwargs)


def _parity(torch, layer, module, *inputs, torch_call=None, **kwargs):
    pl.testing.assert_matches_torch(
        layer, module, *inputs, params={}, apply=lambda p, *xs: layer.apply(p, *xs, **kwargs),
        torch_call=torch_call, rtol=1e-4, atol=1e-5,
    )  # fmt: skip


def _nan_parity(torch, layer, module, x, torch_call=None, **kwargs):
    """Outputs (NaN where torch's are), indices and input gradients of ``sum(y)``: the
    gradient shows which element each window kept."""

    @jax.jit
    def ours(v):
        grad = jax.grad(lambda v: jnp.sum(jax.tree.leaves(layer.apply({}, v, **kwargs))[0]))(v)
        return jax.tree.leaves(layer.apply({}, v, **kwargs)), grad

    got, grad = ours(jnp.asarray(x))
    xt = torch.tensor(x, requires_grad=True)
    out = torch_call(module, xt) if torch_call else module(xt)
    out = out if isinstance(out, tuple) else (out,)
    out[0].sum().backward()
    for ours_leaf, theirs in zip(got, out, strict=True):
        np.testing.assert_allclose(np.asarray(ours_leaf), theirs.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), xt.grad.numpy(), rtol=1e-6)


# -- worked examples ------------------------------------------------------------------


def test_worked_examples():
    """MaxPool1d(3, 2, padding=1, return_indices=True) on [1, 5, 2, 5, 0]: windows
    [pad, 1, 5], [5, 2, 5], [5, 0, pad] -> 5 at index 1, 5 at 1 (the first of the tie),
    5 at 3. AvgPool2d(2, divisor_override=3) on ones(4, 4): each window sums to 4 ->
    4/3. LPPool1d(2, 2) on [3, 4, 1, 0]: sqrt(9 + 16) = 5, sqrt(1 + 0) = 1; LPPool1d(1, 2)
    on [-3, 1]: -2 (the sign kept). FractionalMaxPool2d((1, 2), output_size=(2, 4)) on
    a 2 x 7 ramp with u = 0.9 for the width: alpha = (7 - 2) / 3, starts int((i + 0.9) *
    alpha) - int(0.9 * alpha) = 0, 2, 3 and the last L - k = 5, so each window's right
    element (start + 1) wins: 1, 3, 4, 6 in row 0; the height's starts are 0, 1.
    MaxUnpool1d(2) puts [3, 4] at indices [1, 2] of four zeros."""

    @jax.jit
    def examples():
        pool = L.FractionalMaxPool2d((1, 2), output_size=(2, 4), return_indices=True)
        u = jnp.array([[[0.9, 0.5]]])
        return (
            L.MaxPool1d(3, 2, 1, return_indices=True).apply({}, jnp.array([[[1.0, 5, 2, 5, 0]]])),
            L.AvgPool2d(2, divisor_override=3).apply({}, jnp.ones((1, 1, 4, 4))),
            L.LPPool1d(2, 2).apply({}, jnp.array([[[3.0, 4, 1, 0]]])),
            L.LPPool1d(1, 2).apply({}, jnp.array([[[-3.0, 1]]])),
            pool.apply({}, jnp.arange(14.0).reshape(1, 1, 2, 7), random_samples=u),
            L.MaxUnpool1d(2).apply({}, jnp.array([[[3.0, 4]]]), jnp.array([[[1, 2]]])),
        )

    (y, idx), avg, lp2, lp1, (fy, fidx), unpooled = examples()
    np.testing.assert_array_equal(y, [[[5, 5, 5]]])
    np.testing.assert_array_equal(idx, [[[1, 1, 3]]])
    np.testing.assert_allclose(avg, np.full((1, 1, 2, 2), 4 / 3), rtol=1e-6)
    np.testing.assert_allclose(lp2, [[[5, 1]]])
    np.testing.assert_allclose(lp1, [[[-2]]])
    np.testing.assert_array_equal(fidx, [[[[1, 3, 4, 6], [8, 10, 11, 13]]]])
    np.testing.assert_array_equal(fy, fidx.astype(jnp.float32))
    np.testing.assert_array_equal(unpooled, [[[0, 3, 4, 0]]])


def test_index_dtype_follows_x64():
    layer = L.MaxPool2d(2, return_indices=True)
    assert jax.eval_shape(layer.apply, {}, jnp.ones((1, 1, 4, 4)))[1].dtype == jnp.int32
    with jax.enable_x64(True):
        assert jax.eval_shape(layer.apply, {}, jnp.ones((1, 1, 4, 4)))[1].dtype == jnp.int64


# -- max pools: indices, ties, NaN ----------------------------------------------------

INDEXED = [
    (L.MaxPool1d(3, 2, 1, dilation=2, ceil_mode=True, return_indices=True), (2, 2, 9)),
    (L.MaxPool2d((3, 2), (2, 1), (1, 1), ceil_mode=True, return_indices=True), (2, 2, 7, 5)),
    (L.MaxPool2d(2, return_indices=True), (3, 4, 6)),
    (L.MaxPool3d(2, 1, 1, dilation=(1, 2, 1), return_indices=True), (1, 2, 4, 5, 3)),
    (L.AdaptiveMaxPool1d(3, return_indices=True), (2, 2, 7)),
    (L.AdaptiveMaxPool2d((3, None), return_indices=True), (2, 2, 7, 5)),
    (L.AdaptiveMaxPool3d((2, 3, 2), return_indices=True), (1, 2, 3, 5, 4)),
]


def _module(torch, layer):
    name = type(layer).__name__
    if name.startswith("Adaptive"):
        return _twin(torch, name, layer.output_size, return_indices=True)
    kw = {k: getattr(layer, k) for k in ("stride", "padding", "dilation", "ceil_mode")}
    return _twin(torch, name, layer.kernel_size, return_indices=True, **kw)


@pytest.mark.parametrize("layer, shape", INDEXED, ids=repr)
def test_indices_values_and_gradients_match_torch(torch, layer, shape):
    """Few distinct values, so windows hold ties: torch keeps the first maximum."""
    x = np.random.default_rng(0).integers(0, 3, shape).astype(np.float32)
    _parity(torch, layer, _module(torch, layer), x)


@pytest.mark.parametrize("layer, shape", [INDEXED[1], INDEXED[5]], ids=repr)
def test_nan_windows_keep_the_last_nan_as_torch(torch, layer, shape):
    x = np.random.default_rng(1).integers(0, 3, shape).astype(np.float32)
    x[..., 0, 0], x[..., 0, 1], x[..., 2, 1] = np.nan, np.nan, np.nan
    _nan_parity(torch, layer, _module(torch, layer), x)


@pytest.mark.parametrize("nd", [1, 2])
def test_a_window_wholly_in_padding_is_minus_inf_with_indices_too(torch, nd):
    """``MaxPool(2, stride=2, padding=1, dilation=2)`` over a length-1 axis: the one
    window's taps (-1 and 1) are both padding, and torch's value is -inf with or without
    ``return_indices`` (its index there points past the input, so only the value is
    compared; before, ours was NaN with indices, from a gather past the input)."""
    x = np.full((1, 1, 1), 0.7, np.float32) if nd == 1 else np.arange(6.0, dtype=np.float32)
    x = x.reshape(1, 1, 1, 6) if nd == 2 else x
    args = dict(kernel_size=2, stride=2, padding=1, dilation=2)
    for indices in (False, True):
        module = getattr(torch.nn, f"MaxPool{nd}d")(**args, return_indices=indices)
        want = module(torch.from_numpy(x))
        want = (want[0] if indices else want).numpy()
        got = getattr(L, f"MaxPool{nd}d")(**args, return_indices=indices).apply({}, x)
        np.testing.assert_array_equal(np.asarray(got[0] if indices else got), want)
        assert np.isneginf(want).any()


@pytest.mark.parametrize(
    "layer", [L.MaxPool2d(3, 1, 1), L.MaxPool2d(2, 2, dilation=2), L.AdaptiveMaxPool2d(2)], ids=repr
)
def test_max_without_indices_sends_a_nan_windows_gradient_where_torch_does(torch, layer):
    x = np.arange(1 * 1 * 5 * 6, dtype=np.float32).reshape(1, 1, 5, 6)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = x[0, 0, 3, 4] = np.nan
    name = type(layer).__name__
    kw = {} if name.startswith("Adaptive") else {"stride": layer.stride, "dilation": layer.dilation,
                                                  "padding": layer.padding}  # fmt: skip
    first = layer.output_size if name.startswith("Adaptive") else layer.kernel_size
    _nan_parity(torch, layer, _twin(torch, name, first, **kw), x)


def test_padded_windows_of_minus_infinity_index_their_first_element(torch):
    layer = L.MaxPool2d((1, 3), (1, 2), (0, 1), ceil_mode=True, return_indices=True)
    x = np.full((1, 1, 1, 4), -np.inf, np.float32)
    _nan_parity(torch, layer, _module(torch, layer), x)


def test_integer_inputs_with_indices_as_torch(torch):
    """torch's 1-d max pool takes integers only with ``return_indices`` (its 2-d kernel)."""
    x = np.random.default_rng(0).integers(-5, 5, (1, 2, 7))
    y, idx = L.MaxPool1d(3, 2, return_indices=True).apply({}, jnp.asarray(x, jnp.int32))
    ty, ti = torch.nn.MaxPool1d(3, 2, return_indices=True)(torch.tensor(x))
    np.testing.assert_array_equal(y, ty.numpy())
    np.testing.assert_array_equal(idx, ti.numpy())
    with pytest.raises(LayerError, match=r"^MaxPool1d: input dtype expected floating point"):
        L.MaxPool1d(3).apply({}, jnp.asarray(x, jnp.int32))


# -- divisor_override and the 3-d windows -----------------------------------------------


@pytest.mark.parametrize(
    "layer, shape",
    [
        (L.AvgPool2d(3, 2, 1, ceil_mode=True, divisor_override=-3), (2, 2, 6, 7)),
        (
            L.AvgPool3d((2, 3, 2), (1, 2, 2), (1, 1, 0), ceil_mode=True, divisor_override=4),
            (1, 2, 4, 5, 5),
        ),
        (L.AvgPool3d(2, 1, 1, count_include_pad=False), (1, 2, 3, 4, 3)),
        (L.MaxPool3d((2, 3, 1), (2, 1, 1), (1, 1, 0), ceil_mode=True), (1, 2, 5, 4, 3)),
    ],
    ids=repr,
)
def test_3d_and_divisor_override_match_torch(torch, layer, shape):
    kw = {k: getattr(layer, k) for k in ("stride", "padding", "ceil_mode")}
    for k in ("count_include_pad", "divisor_override", "dilation"):
        if hasattr(layer, k):
            kw[k] = getattr(layer, k)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    _parity(torch, layer, _twin(torch, type(layer).__name__, layer.kernel_size, **kw), x)


# -- LPPool -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layer",
    [L.LPPool2d(2, 2, ceil_mode=True), L.LPPool2d(1, (2, 3), 1), L.LPPool1d(2.5, 2)],
    ids=repr,
)
def test_lppool_with_zeros_and_negatives_matches_torch(torch, layer):
    """A window of zeros (the power average's kink: gradient 0, as torch's relu), windows
    of negatives (sign kept for p = 1)."""
    rng = np.random.default_rng(0)
    shape = (2, 2, 5) if layer._nd == 1 else (2, 2, 5, 5)
    x = rng.standard_normal(shape).astype(np.float32)
    x[..., :2] = 0.0
    if layer.norm_type == 2.5:
        x = np.abs(x)
    # torch's LPPool1d scales by kernel_size itself: an int there
    k = layer.kernel_size[0] if layer._nd == 1 else layer.kernel_size
    module = _twin(torch, type(layer).__name__, layer.norm_type, k, layer.stride, layer.ceil_mode)
    _parity(torch, layer, module, x)


def test_lppool_nan_where_torch_has_nan(torch):
    """An odd p over negative sums: the root of a negative number is NaN on both sides."""
    x = np.array([[[-3.0, 1.0, 0.0, 0.0, 2.0, 1.0]]], np.float32)
    _nan_parity(torch, L.LPPool1d(3, 2), torch.nn.LPPool1d(3, 2), x)


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_lppool_nan_power_sum_gives_the_whole_window_a_nan_gradient_as_torch(torch, nd):
    """p = 1.5 over a window holding a negative element: its power sum is NaN, and torch's
    relu passes that NaN on to every element of the window, the non-negative ones too;
    the other windows keep finite gradients."""
    x = np.abs(np.random.default_rng(nd).standard_normal((1, 2) + (4,) * nd))
    x[(0, 0) + (0,) * nd] = -1.0  # the first window of channel 0 only
    layer, module = getattr(L, f"LPPool{nd}d")(1.5, 2), getattr(torch.nn, f"LPPool{nd}d")(1.5, 2)
    _nan_parity(torch, layer, module, x)
    grad = jax.grad(lambda v: jnp.sum(layer.apply({}, v)))(jnp.asarray(x))
    window = (0, 0) + (slice(0, 2),) * nd
    assert np.isnan(np.asarray(grad)[window]).all()
    assert np.isnan(np.asarray(grad)).sum() == 2**nd


def test_lppool_errors_name_the_layer():
    with pytest.raises(LayerError, match=r"^LPPool2d: output size per spatial axis expected >= 1"):
        L.LPPool2d(2, 4).apply({}, jnp.ones((1, 1, 3, 5)))
    with pytest.raises(ValueError, match=r"^LPPool3d: stride must be a positive integer"):
        L.LPPool3d(2, 2, stride=0)
    with pytest.raises(ValueError, match=r"^LPPool1d: norm_type must be a nonzero finite number"):
        L.LPPool1d(float("inf"), 2)


# -- FractionalMaxPool --------------------------------------------------------------------


def _frac_call(torch, layer, u):
    fn = getattr(torch.nn.functional, f"fractional_max_pool{layer._nd}d")

    def call(module, x):
        return fn(x, layer.kernel_size, layer.output_size, layer.output_ratio,
                  layer.return_indices, _random_samples=torch.tensor(u))  # fmt: skip

    return call


@pytest.mark.parametrize(
    "layer, shape",
    [
        (L.FractionalMaxPool2d(2, output_size=(4, 3), return_indices=True), (2, 3, 9, 7)),
        (L.FractionalMaxPool2d((3, 2), output_ratio=(0.5, 0.7), return_indices=True), (2, 2, 9, 8)),
        (
            L.FractionalMaxPool3d((2, 1, 2), output_size=(3, 4, 2), return_indices=True),
            (1, 2, 6, 5, 4),
        ),
    ],
    ids=repr,
)
def test_fractional_matches_torch_given_its_samples(torch, layer, shape):
    """Ties included: each window keeps torch's element, its gradient goes there."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, shape).astype(np.float32)
    u = rng.random((shape[0], shape[1], layer._nd)).astype(np.float32)
    module = _twin(torch, type(layer).__name__, layer.kernel_size, output_size=layer.output_size,
                   output_ratio=layer.output_ratio, return_indices=True)  # fmt: skip
    _parity(torch, layer, module, x, torch_call=_frac_call(torch, layer, u), random_samples=u)


@pytest.mark.parametrize("nd, shape", [(2, (3, 7, 6)), (3, (4, 7, 7, 7)), (3, (2, 4, 7, 7, 7))])
def test_fractional_random_samples_of_more_rows_than_the_batch_use_the_first(torch, nd, shape):
    """torch takes ``_random_samples`` of at least the batch's rows (one for an unbatched
    input) and reads the first ones; fewer rows than the batch are an error."""
    layer = getattr(L, f"FractionalMaxPool{nd}d")(2, output_size=3, return_indices=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    u = rng.random((3, shape[-nd - 1], nd)).astype(np.float32)
    module = _twin(torch, type(layer).__name__, 2, output_size=3, return_indices=True)
    _parity(torch, layer, module, x, torch_call=_frac_call(torch, layer, u), random_samples=u)
    with pytest.raises(
        LayerError, match=r"random_samples shape expected \(2, 4, 3\), got \(1, 4, 3\)"
    ):
        L.FractionalMaxPool3d(2, output_size=3).apply(
            {}, np.ones((2, 4, 7, 7, 7)), random_samples=np.zeros((1, 4, 3))
        )


def test_fractional_key_draws_the_windows_in_every_mode():
    layer = L.FractionalMaxPool2d(2, output_size=4, return_indices=True)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 9, 9)), jnp.float32)

    @jax.jit
    def run(k1, k2):
        same = layer.apply({}, x, key=k1)
        return same, layer.apply({}, x, key=k1, train=True), layer.apply({}, x, key=k2)

    (y, i), (y_train, i_train), (_, i_other) = run(jax.random.key(0), jax.random.key(1))
    np.testing.assert_array_equal(y, y_train)
    np.testing.assert_array_equal(i, i_train)
    assert not np.array_equal(i, i_other)
    u = layer.samples(jax.random.key(0), x.shape)
    assert u.shape == (2, 3, 2)
    assert layer.samples(jax.random.key(0), (3, 9, 9)).shape == (1, 3, 2)
    given = jax.jit(lambda u: layer.apply({}, x, random_samples=u))(u)
    np.testing.assert_array_equal(given[1], i)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: L.FractionalMaxPool2d(0, output_size=2), r"kernel_size must be a positive"),
        (lambda: L.FractionalMaxPool2d(2, output_size=(2, 0)), r"output_size must be a positive"),
        (lambda: L.FractionalMaxPool2d(2, output_size=2, output_ratio=0.5),
         r"give exactly one of output_size and output_ratio"),
        (lambda: L.FractionalMaxPool2d(2, output_ratio=(0.5,)), r"output_ratio must be in \(0, 1\)"),
        (lambda: L.FractionalMaxPool3d(2, output_ratio=0.0), r"output_ratio must be in \(0, 1\)"),
        (lambda: L.MaxUnpool2d(0), r"^MaxUnpool2d: kernel_size must be a positive"),
        (lambda: L.MaxUnpool1d(2, stride=0), r"^MaxUnpool1d: stride must be a positive"),
        (lambda: L.MaxUnpool3d(2, padding=-1), r"^MaxUnpool3d: padding must be an integer >= 0"),
        (lambda: L.MaxPool3d(2, padding=2), r"^MaxPool3d: padding must be at most half"),
        (lambda: L.MaxPool3d(2, return_indices=None), r"return_indices must be True or False"),
        (lambda: L.AvgPool2d(2, divisor_override=1.5), r"divisor_override must be a nonzero"),
    ],
)  # fmt: skip
def test_config_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_avg_pool1d_and_adaptive_avg_take_no_extra_options():
    with pytest.raises(TypeError):
        L.AvgPool1d(2, divisor_override=2)
    with pytest.raises(TypeError):
        L.AdaptiveAvgPool2d(2, return_indices=True)


# -- MaxUnpool --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "nd, shape, k, s, p, size",
    [
        (1, (2, 2, 9), 3, 2, 1, None),
        (2, (2, 2, 7, 6), 2, 2, 0, (7, 6)),  # output_size restores the dropped row
        (2, (1, 2, 6, 6), 3, 1, 1, None),  # overlapping windows: repeated indices
        (3, (1, 2, 4, 5, 4), 2, 2, 0, (1, 2, 5, 5, 4)),  # with the (N, C) axes
    ],
)
def test_unpool_after_pool_matches_torch(torch, nd, shape, k, s, p, size):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    pooled, idx = getattr(torch.nn, f"MaxPool{nd}d")(k, s, p, return_indices=True)(torch.tensor(x))
    layer = getattr(L, f"MaxUnpool{nd}d")(k, s, p)
    module = _twin(torch, f"MaxUnpool{nd}d", k, s, p)
    _parity(torch, layer, module, pooled.numpy(), idx.numpy(),
            torch_call=lambda m, v, i: m(v, i, output_size=size), output_size=size)  # fmt: skip


def test_unpool_repeated_indices_as_torch(torch):
    """The later write wins; the gradient reaches every source (torch's gather)."""
    v = np.array([[[1.0, 2.0, 3.0, 4.0]], [[5.0, 6.0, 7.0, 8.0]]], np.float32)
    idx = np.array([[[1, 1, 0, 1]], [[3, 2, 3, 2]]])
    _parity(torch, L.MaxUnpool1d(2), torch.nn.MaxUnpool1d(2), v, idx)
    y = L.MaxUnpool1d(2).apply({}, v[0], idx[0])  # unbatched
    np.testing.assert_array_equal(y, [[3, 4, 0, 0, 0, 0, 0, 0]])


def test_unpool_indices_outside_the_output_raise_or_give_nan():
    """torch raises on an index outside the output: so does a call with concrete
    indices, naming the first; traced, where the values are not known, the output is
    NaN (never a silently dropped value). Indices for a larger ``output_size`` too."""
    x, bad = jnp.array([[[1.0, 2.0, 3.0]]]), jnp.array([[[2, 5, 6]]])
    with pytest.raises(LayerError, match=r"^MaxUnpool1d: indices\[0, 0, 2\] expected in \[0, 6\)"):
        L.MaxUnpool1d(2).apply({}, x, bad)
    assert np.isnan(np.asarray(jax.jit(L.MaxUnpool1d(2).apply)({}, x, bad))).all()
    y, idx = L.MaxPool2d(2, return_indices=True).apply({}, jnp.arange(16.0).reshape(1, 1, 4, 4))
    with pytest.raises(LayerError, match=r"expected in \[0, 9\) \(the output's \(3, 3\)"):
        L.MaxUnpool2d(2).apply({}, y, idx, (3, 3))
    # Concrete indices inside a jitted function (closed over, as a loss holds them) are
    # checked as eagerly, and good ones unpool, values and gradient.
    unpool = jax.jit(jax.value_and_grad(lambda y: L.MaxUnpool2d(2).apply({}, y, idx).sum()))
    total, grad = unpool(y)
    assert float(total) == float(y.sum()) and np.array_equal(np.asarray(grad), np.ones(y.shape))
    with pytest.raises(LayerError, match=r"^MaxUnpool1d: indices\[0, 0, 2\] expected"):
        jax.jit(lambda x: L.MaxUnpool1d(2).apply({}, x, bad))(x)


def test_unpool_shape_errors():
    """As torch: an empty batch unpools to an empty batch; empty channels, integer
    values and float indices are refused."""
    layer = L.MaxUnpool2d(2)
    empty = jax.eval_shape(layer.apply, {}, jnp.ones((0, 1, 2, 2)), jnp.zeros((0, 1, 2, 2), int))
    assert empty.shape == (0, 1, 4, 4)
    with pytest.raises(LayerError, match=r"^MaxUnpool2d: input dtype expected floating point"):
        layer.apply({}, jnp.ones((1, 1, 2, 2), int), jnp.zeros((1, 1, 2, 2), int))
    with pytest.raises(LayerError, match=r"^MaxUnpool2d: input rank expected 4"):
        layer.apply({}, jnp.ones((2, 2)), jnp.zeros((2, 2), jnp.int32))
    with pytest.raises(LayerError, match=r"^MaxUnpool2d: input axis 1 length expected at least 1"):
        layer.apply({}, jnp.ones((1, 0, 2, 2)), jnp.zeros((1, 0, 2, 2), jnp.int32))
    with pytest.raises(LayerError, match=r"output_size\[0\] expected strictly between 2 and 6"):
        layer.apply({}, jnp.ones((1, 1, 2, 2)), jnp.zeros((1, 1, 2, 2), jnp.int32), (2, 4))
