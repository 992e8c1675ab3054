"""Normalization layers: worked examples, torch parity, gradcheck, dtypes, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import purelayers as pl
from purelayers import layers as L
from purelayers.init import constant
from purelayers.params import flatten, unflatten
from purelayers.testing import assert_tree_allclose, gradcheck
from tests.twins import load_from_torch


def _x(*shape, shift=0.0, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) + shift).astype(np.float32)


def _randomize(params, seed=1):
    """Non-trivial affine params so parity also exercises weight and bias."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda a: jnp.asarray(rng.standard_normal(a.shape).astype(np.float32)), params
    )


def _torch_randomize(torch, module, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return module


# -- worked examples -----------------------------------------------------------------


def test_layer_norm_worked_example():
    """[0, 0.002]: mean 0.001, population variance 1e-6, so
    y = [-0.001, 0.001] / sqrt(1e-6 + 1e-5) = [-0.30151, 0.30151]."""
    ln = L.LayerNorm()
    x = jnp.array([[0.0, 0.002]])
    y = ln.apply(ln.init(jax.random.key(0), x.shape), x)
    np.testing.assert_allclose(y, [[-0.30151, 0.30151]], atol=1e-5)


def test_rms_norm_worked_example():
    """arange(9).reshape(3, 3), eps 1e-5: the mean squares of the rows are 5/3, 50/3 and
    149/3, so the rows divide by 1.2910, 4.0825 and 7.0475."""
    rms = L.RMSNorm(eps=1e-5)
    x = jnp.arange(9.0).reshape(3, 3)
    y = rms.apply(rms.init(jax.random.key(0), x.shape), x)
    expected = [[0, 0.7746, 1.5492], [0.7348, 0.9798, 1.2247], [0.8514, 0.9933, 1.1352]]
    np.testing.assert_allclose(y, expected, atol=1e-4)


def test_rms_norm_default_eps_is_float32_machine_epsilon():
    """With eps None, a tiny row [1e-4, 0] has mean square 5e-9, comparable to eps
    1.19e-7: y0 = 1e-4 / sqrt(5e-9 + 1.19e-7) = 0.2838, not 1.414 (eps 0) and not the
    bfloat16 epsilon's 0.0011, also for bfloat16 input."""
    rms = L.RMSNorm()
    x = jnp.array([[1e-4, 0.0]])
    params = rms.init(jax.random.key(0), x.shape)
    expected = 1e-4 / np.sqrt(5e-9 + np.finfo(np.float32).eps)
    np.testing.assert_allclose(rms.apply(params, x)[0, 0], expected, rtol=1e-5)
    y16 = rms.apply(params, x.astype(jnp.bfloat16))
    np.testing.assert_allclose(float(y16[0, 0]), expected, rtol=1e-2)


def test_rms_norm_default_eps_in_float64_is_float64s_as_torch(torch):
    """torch's default eps is the machine epsilon of the computing type: float64's
    2.2e-16 for a float64 input, so the row ``[1e-4, 0]`` becomes ``[1.41421, 0]``
    (``1e-4 / sqrt(5e-9 + 2.2e-16)``), where float32's eps would give 0.2838."""
    x = np.array([[1e-4, 0.0], [3.0, -4.0]])
    want = torch.nn.RMSNorm(2, dtype=torch.float64)(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(want[0, 0], 1e-4 / np.sqrt(5e-9 + np.finfo(np.float64).eps))
    with jax.enable_x64(True):
        rms = L.RMSNorm()
        params = rms.init(jax.random.key(0), x.shape, jnp.float64)
        got = rms.apply(params, jnp.asarray(x))
        assert got.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)


# -- parameters ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "layer, shape, expected",
    [
        (L.LayerNorm(), (2, 3, 4), {"weight": (4,), "bias": (4,)}),
        (L.LayerNorm(normalized_ndim=2), (2, 3, 4), {"weight": (3, 4), "bias": (3, 4)}),
        (L.LayerNorm(bias=False), (2, 4), {"weight": (4,)}),
        (L.LayerNorm(elementwise_affine=False), (2, 4), {}),
        (L.RMSNorm(), (2, 3, 4), {"weight": (4,)}),
        (L.RMSNorm(normalized_ndim=2), (2, 3, 4), {"weight": (3, 4)}),
        (L.RMSNorm(elementwise_affine=False), (2, 4), {}),
    ],
)
def test_param_names_shapes_and_defaults(layer, shape, expected):
    params = layer.init(jax.random.key(0), shape)
    assert {k: tuple(v.shape) for k, v in flatten(params).items()} == expected
    assert list(flatten(params)) == list(expected)
    if "weight" in params:
        np.testing.assert_array_equal(params["weight"], 1.0)
    if "bias" in params:
        np.testing.assert_array_equal(params["bias"], 0.0)


def test_init_overrides():
    ln = L.LayerNorm(weight_init=constant(2.0), bias_init=constant(0.5))
    params = ln.init(jax.random.key(0), (3, 4))
    np.testing.assert_array_equal(params["weight"], 2.0)
    np.testing.assert_array_equal(params["bias"], 0.5)
    rms = L.RMSNorm(weight_init=constant(3.0))
    np.testing.assert_array_equal(rms.init(jax.random.key(0), (3, 4))["weight"], 3.0)


def test_layers_are_hashable_and_compare_by_configuration():
    assert L.LayerNorm(eps=1e-6) == L.LayerNorm(eps=1e-6)
    assert hash(L.RMSNorm()) == hash(L.RMSNorm())
    assert L.LayerNorm() != L.LayerNorm(bias=False)


# -- torch parity --------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, torch_kwargs, shape",
    [
        ({}, {}, (4, 5, 8)),
        ({"eps": 1e-3, "bias": False}, {"eps": 1e-3, "bias": False}, (3, 7)),
        ({"normalized_ndim": 2}, {}, (2, 3, 4, 5)),
        ({"elementwise_affine": False}, {"elementwise_affine": False}, (3, 7)),
    ],
)
def test_layer_norm_torch_parity(torch, kwargs, torch_kwargs, shape):
    ln = L.LayerNorm(**kwargs)
    nd = kwargs.get("normalized_ndim", 1)
    module = _torch_randomize(torch, torch.nn.LayerNorm(shape[-nd:], **torch_kwargs))
    params = load_from_torch(ln, module, shape)
    pl.testing.assert_matches_torch(
        ln, module, _x(*shape, shift=2.0), params=params, rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize(
    "kwargs, torch_kwargs, shape",
    [
        ({}, {}, (4, 5, 8)),
        ({"eps": 1e-5, "normalized_ndim": 2}, {"eps": 1e-5}, (2, 3, 4, 5)),
        ({"elementwise_affine": False}, {"elementwise_affine": False}, (3, 7)),
    ],
)
def test_rms_norm_torch_parity(torch, kwargs, torch_kwargs, shape):
    rms = L.RMSNorm(**kwargs)
    nd = kwargs.get("normalized_ndim", 1)
    module = _torch_randomize(torch, torch.nn.RMSNorm(shape[-nd:], **torch_kwargs))
    params = load_from_torch(rms, module, shape)
    pl.testing.assert_matches_torch(rms, module, _x(*shape), params=params, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["shift 1000", "outlier first", "outlier first, shift"])
def test_layer_norm_stays_accurate_where_one_pass_variance_fails(case):
    """Rows with |mean| >> std: the plain one-pass E[x^2] - E[x]^2 variance loses every
    digit at shift 1000 in float32 (error ~0.4). The shifted one pass subtracts each
    row's first element first; its worst case is that element far from the rest (here
    100 std), and even then (k - mean)^2 / var <= n - 1 keeps it within 2e-4 of the
    float64 reference, like the two-pass form."""
    x = _x(8, 64, shift=1000.0 if "shift" in case else 0.0)
    if "outlier" in case:
        x[:, 0] += 100.0
    ln = L.LayerNorm()
    y = np.asarray(ln.apply(ln.init(jax.random.key(0), x.shape), jnp.asarray(x)))
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref, atol=2e-4)


def test_layer_norm_moments_are_shifted_on_the_cpu_two_pass_elsewhere():
    """Lowered for the CPU (``jax.export``, no device needed), LayerNorm's statistics are
    the shifted one pass: each row's first element is sliced off as the shift. Lowered
    for a GPU they are the two-pass form (mean, then mean squared deviation): no slice."""
    ln = L.LayerNorm()
    params = ln.init(jax.random.key(0), (5,))
    x = jnp.ones((2, 3, 5))
    f = jax.jit(jax.grad(lambda p, x: ln.apply(p, x).sum(), argnums=(0, 1)))

    def slices(platform):
        module = jax.export.export(f, platforms=(platform,))(params, x).mlir_module()
        return [line for line in module.splitlines() if "stablehlo.slice" in line]

    assert any("[0:2, 0:3, 0:1]" in line for line in slices("cpu"))
    assert slices("cuda") == []


@pytest.mark.parametrize("form", ["shifted_moments", "two_pass_moments"])
@pytest.mark.parametrize("shift", [0.0, 1000.0])
def test_layer_norm_moment_forms_match_torch(torch, form, shift):
    """Both forms of LayerNorm's statistics (the CPU's shifted one pass, the other
    platforms' two passes; both evaluated here on the CPU) normalize as torch's
    ``F.layer_norm`` does over the last two axes of a [3, 4, 5, 6] input, rows at a
    mean of 0 and of 1000 std: values, and the input gradient for a random cotangent.
    At a mean of 1000 the two-pass mean carries the rounding of a float32 sum of values
    whose spacing is 6e-5, so its rows are within 5e-4 of the float64 result (torch's
    own float32 ``layer_norm`` is 6e-5 off here, and 9e-5 on 768-wide rows, where the
    two passes are 1e-4 off); the shifted pass subtracts each row's first element
    exactly and stays within 2e-4."""
    from purelayers.layers import _norm_base

    moments = getattr(_norm_base, form)
    x, ct = _x(3, 4, 5, 6, shift=shift), _x(3, 4, 5, 6, seed=1)

    def normalize(x):
        _, centered, var = moments(x, (2, 3))
        return centered * jax.lax.rsqrt(var + 1e-5)

    y, vjp = jax.vjp(normalize, jnp.asarray(x))
    (gx,) = vjp(jnp.asarray(ct))
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    ty = torch.nn.functional.layer_norm(tx, (5, 6), eps=1e-5)
    ty.backward(torch.tensor(ct, dtype=torch.float64))
    atol = 5e-4 if form == "two_pass_moments" and shift else 2e-4
    np.testing.assert_allclose(y, ty.detach().numpy(), atol=atol)
    np.testing.assert_allclose(gx, tx.grad.numpy(), atol=10 * atol)


def test_batch_and_group_norm_stay_accurate_at_large_mean():
    """The same shifted statistics in BatchNorm2d (per channel over batch and space,
    also the running mean and variance) and GroupNorm, at a mean of 1000 std."""
    x = _x(4, 6, 5, 5, shift=1000.0)
    x64 = x.astype(np.float64)
    bn = L.BatchNorm2d()
    params, state = bn.init(jax.random.key(0), x.shape), bn.init_state(x.shape)
    y, state = bn.apply(params, jnp.asarray(x), state=state, train=True)
    mean, var = x64.mean((0, 2, 3)), x64.var((0, 2, 3))
    ref = (x64 - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
    np.testing.assert_allclose(np.asarray(y), ref, atol=2e-4)
    np.testing.assert_allclose(np.asarray(state["running_mean"]), 0.1 * mean, rtol=1e-6)
    unbiased = var * x64[:, 0].size / (x64[:, 0].size - 1)
    np.testing.assert_allclose(np.asarray(state["running_var"]), 0.9 + 0.1 * unbiased, rtol=1e-5)
    gn = L.GroupNorm(3)
    y = np.asarray(gn.apply(gn.init(jax.random.key(0), x.shape), jnp.asarray(x)))
    g = x64.reshape(4, 3, -1)
    ref = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(
        x.shape
    )
    np.testing.assert_allclose(y, ref, atol=2e-4)


# -- gradients -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "layer",
    [L.LayerNorm(normalized_ndim=2), L.RMSNorm()],
    ids=["LayerNorm", "RMSNorm"],
)
def test_gradcheck(layer):
    x = jnp.asarray(_x(2, 3, 4))
    params = _randomize(layer.init(jax.random.key(0), x.shape))
    assert gradcheck(layer.apply, params, x)


# -- dtypes and transformations ------------------------------------------------------


@pytest.mark.parametrize(
    "layer, dtype",
    [
        (L.LayerNorm(), jnp.bfloat16),
        (L.LayerNorm(normalized_ndim=2), jnp.bfloat16),
        (L.RMSNorm(), jnp.bfloat16),
        (L.LayerNorm(), jnp.float16),
    ],
    ids=["LayerNorm-bf16", "LayerNorm2d-bf16", "RMSNorm-bf16", "LayerNorm-f16"],
)
def test_low_precision_returns_input_dtype_close_to_float32(layer, dtype):
    x = jnp.asarray(_x(4, 3, 16, shift=1.0))
    params = _randomize(layer.init(jax.random.key(0), x.shape))
    y32 = layer.apply(params, x)
    y = layer.apply(params, x.astype(dtype))
    assert y.dtype == dtype
    tol = 3e-2 if dtype == jnp.bfloat16 else 5e-3
    np.testing.assert_allclose(np.asarray(y, np.float32), y32, rtol=tol, atol=tol)


# -- errors --------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [L.LayerNorm, L.RMSNorm])
@pytest.mark.parametrize("eps", [0.0, -1e-5, float("nan")])
def test_eps_must_be_positive(cls, eps):
    with pytest.raises(ValueError, match=rf"{cls.__name__}: eps must be > 0, got"):
        cls(eps=eps)


@pytest.mark.parametrize("cls", [L.LayerNorm, L.RMSNorm])
def test_normalized_ndim_must_be_positive(cls):
    with pytest.raises(ValueError, match=rf"{cls.__name__}: normalized_ndim must be a positive"):
        cls(normalized_ndim=0)


@pytest.mark.parametrize("cls", [L.LayerNorm, L.RMSNorm])
def test_wrong_width_names_layer_expected_and_got(cls):
    layer = cls()
    params = layer.init(jax.random.key(0), (8, 768))
    with pytest.raises(
        ValueError,
        match=rf"{cls.__name__}: the last axis of x must be 768 \(the width it was "
        r"initialized with\): expected x.shape == \(..., 768\), got x.shape == \(8, 512\)",
    ):
        layer.apply(params, jnp.zeros((8, 512)))


def test_wrong_width_inside_sequential_names_path():
    model = L.Sequential(L.Linear(16), L.LayerNorm())
    params = model.init(jax.random.key(0), (2, 8))
    params["1"] = L.LayerNorm().init(jax.random.key(0), (2, 12))
    with pytest.raises(ValueError, match=r"Sequential\[1\] LayerNorm: the last axis of x"):
        model.apply(params, jnp.zeros((2, 8)))


def test_wrong_normalized_shape_names_both_axes():
    ln = L.LayerNorm(normalized_ndim=2)
    params = ln.init(jax.random.key(0), (2, 3, 4))
    with pytest.raises(
        ValueError,
        match=r"LayerNorm: the last 2 axes of x must be \(3, 4\) \(the shape it was initialized "
        r"with\): expected x.shape == \(..., 3, 4\), got x.shape == \(2, 4, 3\)",
    ):
        ln.apply(params, jnp.zeros((2, 4, 3)))


def test_rank_too_small():
    ln = L.LayerNorm(normalized_ndim=3)
    with pytest.raises(ValueError, match=r"LayerNorm: input rank expected at least "):
        ln.init(jax.random.key(0), (4, 5))


def test_integer_input_rejected():
    ln = L.LayerNorm(elementwise_affine=False)
    with pytest.raises(ValueError, match=r"LayerNorm: input dtype expected a floating dtype"):
        ln.apply({}, jnp.arange(6).reshape(2, 3))


# -- GroupNorm -----------------------------------------------------------------------


def test_group_norm_worked_example():
    """One sample, 4 channels of one value each, 2 groups: [1, 3 | 10, 10]. Group 0 has
    mean 2 and variance 1, so it becomes [-1, 1] / sqrt(1 + eps); group 1 has variance 0
    and becomes [0, 0]."""
    gn = L.GroupNorm(2)
    x = jnp.array([1.0, 3.0, 10.0, 10.0]).reshape(1, 4, 1)
    y = gn.apply(gn.init(jax.random.key(0), x.shape), x)
    np.testing.assert_allclose(y.ravel(), [-1 / np.sqrt(1 + 1e-5), 1 / np.sqrt(1 + 1e-5), 0, 0])


@pytest.mark.parametrize(
    "groups, shape, affine",
    [(3, (2, 6, 4, 4), True), (6, (2, 6, 3, 3), True), (1, (3, 4, 5), False)],
)
def test_group_norm_torch_parity(torch, groups, shape, affine):
    gn = L.GroupNorm(groups, affine=affine)
    module = _torch_randomize(torch, torch.nn.GroupNorm(groups, shape[1], affine=affine))
    params = load_from_torch(gn, module, shape)
    pl.testing.assert_matches_torch(
        gn, module, _x(*shape, shift=1.0), params=params, rtol=1e-4, atol=1e-5
    )


@settings(max_examples=6, deadline=None)
@given(
    n=st.integers(1, 3),
    groups=st.integers(1, 4),
    per_group=st.integers(1, 3),
    spatial=st.lists(st.integers(1, 4), min_size=0, max_size=2),
    seed=st.integers(0, 2**16),
)
def test_group_norm_matches_reference_over_shapes(n, groups, per_group, spatial, seed):
    """Against a float64 NumPy reference; each group holds at least 4 values (in a group
    of 2 close values float32 rounding is magnified up to 1/sqrt(eps) times)."""
    shape = (n, groups * per_group, *spatial)
    if per_group * int(np.prod(spatial)) < 4:
        shape = (*shape, 4)
    x = _x(*shape, shift=1.0, seed=seed)
    y = jax.jit(L.GroupNorm(groups, affine=False).apply)({}, x)  # one program per shape
    g = x.astype(np.float64).reshape(n, groups, -1)
    ref = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref.reshape(shape), atol=1e-4)


def test_group_norm_params():
    params = L.GroupNorm(2).init(jax.random.key(0), (2, 6, 3))
    assert {k: v.shape for k, v in params.items()} == {"weight": (6,), "bias": (6,)}
    assert L.GroupNorm(2, affine=False).init(jax.random.key(0), (2, 6, 3)) == {}


def test_group_norm_channels_must_divide():
    gn = L.GroupNorm(4)
    with pytest.raises(
        ValueError,
        match=r"GroupNorm: channels \(axis 1\) must divide into num_groups=4: expected a "
        r"multiple of 4, got 6 \(x.shape == \(2, 6, 3\)\)",
    ):
        gn.init(jax.random.key(0), (2, 6, 3))
    with pytest.raises(ValueError, match=r"GroupNorm: channels \(axis 1\) must divide"):
        L.GroupNorm(4, affine=False).apply({}, jnp.zeros((2, 6, 3)))


def test_group_norm_channel_count_must_match_params():
    gn = L.GroupNorm(2)
    params = gn.init(jax.random.key(0), (2, 6, 3))
    with pytest.raises(ValueError, match=r"GroupNorm: input channels \(axis 1\) expected 6, got 4"):
        gn.apply(params, jnp.zeros((2, 4, 3)))


def test_group_norm_config_errors():
    with pytest.raises(ValueError, match=r"GroupNorm: num_groups must be a positive integer"):
        L.GroupNorm(0)
    with pytest.raises(ValueError, match=r"GroupNorm: eps must be > 0, got 0"):
        L.GroupNorm(2, eps=0)


# -- BatchNorm -----------------------------------------------------------------------


def _buffers(torch, module):
    names = dict(module.named_buffers())
    return unflatten({k: v for k, v in module.state_dict().items() if k in names})


BATCH_NORMS = [
    (L.BatchNorm1d, "BatchNorm1d", (8, 4)),
    (L.BatchNorm1d, "BatchNorm1d", (4, 3, 5)),
    (L.BatchNorm2d, "BatchNorm2d", (4, 3, 5, 5)),
    (L.BatchNorm3d, "BatchNorm3d", (2, 3, 3, 3, 3)),
]


@pytest.mark.parametrize("cls, torch_name, shape", BATCH_NORMS)
def test_batch_norm_names_and_order_match_torch_state_dict(torch, cls, torch_name, shape):
    from purelayers.params import merge

    bn = cls()
    params, state = bn.init(jax.random.key(0), shape), bn.init_state(shape)
    module = getattr(torch.nn, torch_name)(shape[1])
    merged = bn.ordered(jax.jit(merge)(params, state))  # key-sorted by jit, then re-ordered
    assert list(flatten(merged)) == list(module.state_dict())
    assert list(params) == ["weight", "bias"]
    assert state["num_batches_tracked"].dtype == jnp.int32
    assert state["num_batches_tracked"].shape == ()
    np.testing.assert_array_equal(state["running_mean"], 0.0)
    np.testing.assert_array_equal(state["running_var"], 1.0)


@pytest.mark.parametrize(
    "cls, torch_name, shape, momentum",
    [
        (L.BatchNorm1d, "BatchNorm1d", (8, 4), 0.1),
        (L.BatchNorm1d, "BatchNorm1d", (8, 4), None),
        (L.BatchNorm1d, "BatchNorm1d", (4, 3, 5), 0.5),
        (L.BatchNorm2d, "BatchNorm2d", (4, 3, 5, 5), 0.1),
        (L.BatchNorm3d, "BatchNorm3d", (2, 3, 3, 3, 3), 0.1),
    ],
)
def test_batch_norm_three_train_steps_then_eval_match_torch(
    torch, cls, torch_name, shape, momentum
):
    """Each training step: outputs and gradients from batch statistics, then running
    statistics and num_batches_tracked equal torch's buffers by name; then eval mode."""
    bn = cls(momentum=momentum)
    module = _torch_randomize(torch, getattr(torch.nn, torch_name)(shape[1], momentum=momentum))
    params = load_from_torch(bn, module, shape)
    state = bn.init_state(shape)
    step = jax.jit(lambda p, x, s: bn.apply(p, x, state=s, train=True))
    for i in range(3):
        x = _x(*shape, shift=float(i), seed=i)
        module.zero_grad()
        pl.testing.assert_matches_torch(
            bn,
            module,
            x,
            params=params,
            apply=lambda p, x, s=state: bn.apply(p, x, state=s, train=True)[0],
            train=True,
            rtol=1e-4,
            atol=1e-5,
        )
        _, state = step(params, jnp.asarray(x), state)
        assert_tree_allclose(state, _buffers(torch, module), rtol=1e-5, atol=1e-6)
        assert int(state["num_batches_tracked"]) == i + 1
    module.zero_grad()
    x = _x(*shape, shift=0.5, seed=3)
    pl.testing.assert_matches_torch(
        bn,
        module,
        x,
        params=params,
        apply=lambda p, x: bn.apply(p, x, state=state)[0],
        rtol=1e-4,
    )
    _, same = bn.apply(params, jnp.asarray(x), state=state)
    assert_tree_allclose(same, state, rtol=0, atol=0)


def test_batch_norm_running_var_is_unbiased_worked_example():
    """Channel values [1, 3] (n = 2): batch mean 2, biased variance 1 used to normalize
    (y = [-1, 1] / sqrt(1 + eps)), unbiased variance 2 enters the running average:
    running_var = 0.9 * 1 + 0.1 * 2 = 1.1, running_mean = 0.1 * 2 = 0.2."""
    bn = L.BatchNorm1d()
    x = jnp.array([[1.0], [3.0]])
    y, state = bn.apply(
        bn.init(jax.random.key(0), x.shape), x, state=bn.init_state(x.shape), train=True
    )
    np.testing.assert_allclose(
        y.ravel(), [-1 / np.sqrt(1 + 1e-5), 1 / np.sqrt(1 + 1e-5)], rtol=1e-6
    )
    np.testing.assert_allclose(state["running_var"], [1.1], rtol=1e-6)
    np.testing.assert_allclose(state["running_mean"], [0.2], rtol=1e-6)


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_without_running_stats_matches_torch_in_both_modes(torch, affine):
    bn = L.BatchNorm2d(track_running_stats=False, affine=affine)
    shape = (3, 2, 4, 4)
    assert bn.init_state(shape) == {}
    module = torch.nn.BatchNorm2d(2, track_running_stats=False, affine=affine)
    if affine:
        _torch_randomize(torch, module)
    params = load_from_torch(bn, module, shape)
    x = _x(*shape, shift=1.0)
    for train in (True, False):
        module.zero_grad()
        fn = lambda p, x, train=train: bn.apply(p, x, train=train)  # noqa: E731
        pl.testing.assert_matches_torch(
            bn,
            module,
            x,
            params=params,
            apply=fn,
            train=train,
            rtol=1e-4,
            atol=1e-5,
        )
    _, state = bn.apply(params, jnp.asarray(x), state={}, train=True)
    assert state == {}


def test_batch_norm_without_affine_matches_torch(torch):
    bn = L.BatchNorm1d(affine=False)
    module = torch.nn.BatchNorm1d(4, affine=False)
    shape = (6, 4, 3)
    params, state = load_from_torch(bn, module, shape), bn.init_state(shape)
    assert params == {}
    assert list(flatten(bn.ordered(state))) == list(module.state_dict())
    x = _x(*shape)
    pl.testing.assert_matches_torch(
        bn,
        module,
        x,
        params={},
        apply=lambda p, x: bn.apply(p, x, state=state, train=True)[0],
        train=True,
    )
    _, state = bn.apply(params, jnp.asarray(x), state=state, train=True)
    assert_tree_allclose(state, _buffers(torch, module))


def test_sequential_threads_batch_norm_state_under_jit(torch):
    """Linear -> BatchNorm1d -> ReLU -> Linear: the state tree holds only "1", a jitted
    training forward updates it as torch's buffers, eval reads it."""
    from purelayers.params import merge

    model = L.Sequential(L.Linear(5), L.BatchNorm1d(), L.ReLU(), L.Linear(2))
    tmodel = torch.nn.Sequential(
        torch.nn.Linear(3, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(), torch.nn.Linear(5, 2)
    )
    shape = (6, 3)
    params, state = load_from_torch(model, tmodel, shape), model.init_state(shape)
    assert list(state) == ["1"]
    assert list(flatten(model.ordered(merge(params, state)))) == list(tmodel.state_dict())
    fwd = jax.jit(model.apply, static_argnames="train")
    for i in range(2):
        x = _x(*shape, shift=float(i), seed=i)
        y, state = fwd(params, jnp.asarray(x), state=state, train=True)
        np.testing.assert_allclose(y, tmodel(torch.tensor(x)).detach(), rtol=1e-4, atol=1e-5)
        assert_tree_allclose(state, _buffers(torch, tmodel), rtol=1e-5, atol=1e-6)
    tmodel.eval()
    x = _x(*shape)
    y, _ = fwd(params, jnp.asarray(x), state=state)
    np.testing.assert_allclose(y, tmodel(torch.tensor(x)).detach(), rtol=1e-4, atol=1e-5)


def test_optax_loop_with_batch_norm_state():
    """A jitted optax step where the optimizer sees only params and the state is threaded
    through: the loss decreases and num_batches_tracked counts the steps."""
    import optax

    model = L.Sequential(L.Linear(16), L.BatchNorm1d(), L.ReLU(), L.Linear(3))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((64, 4)).astype(np.float32))
    labels = jnp.asarray((x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0.5))
    params, state = model.init(jax.random.key(0), x.shape), model.init_state(x.shape)
    opt = optax.sgd(0.1, momentum=0.9)
    opt_state = opt.init(params)

    def loss_fn(p, s):
        logits, s = model.apply(p, x, state=s, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), s

    @jax.jit
    def step(p, s, o):
        (loss, s), g = jax.value_and_grad(loss_fn, has_aux=True)(p, s)
        updates, o = opt.update(g, o, p)
        return optax.apply_updates(p, updates), s, o, loss

    losses = []
    for _ in range(20):
        params, state, opt_state, loss = step(params, state, opt_state)
        losses.append(float(loss))
    assert losses[-1] < 0.7 * losses[0]
    assert int(state["1"]["num_batches_tracked"]) == 20


@pytest.mark.parametrize("train", [True, False])
def test_batch_norm_gradcheck(train):
    bn = L.BatchNorm2d()
    shape = (3, 2, 2, 2)
    params = _randomize(bn.init(jax.random.key(0), shape))
    state = bn.init_state(shape)
    state = {**state, "running_mean": jnp.array([0.5, -0.2]), "running_var": jnp.array([2.0, 0.7])}
    x = jnp.asarray(_x(*shape))
    assert gradcheck(lambda p, x: bn.apply(p, x, state=state, train=train)[0], params, x)


def test_group_norm_gradcheck():
    gn = L.GroupNorm(2)
    x = jnp.asarray(_x(2, 4, 3))
    assert gradcheck(gn.apply, _randomize(gn.init(jax.random.key(0), x.shape)), x)


@pytest.mark.parametrize(
    "dtype, train", [(jnp.bfloat16, True), (jnp.bfloat16, False), (jnp.float16, True)]
)
def test_batch_and_group_norm_low_precision(train, dtype):
    x = jnp.asarray(_x(4, 4, 3, 3, shift=1.0))
    gn = L.GroupNorm(2)
    gparams = _randomize(gn.init(jax.random.key(0), x.shape))
    bn = L.BatchNorm2d()
    bparams = _randomize(bn.init(jax.random.key(0), x.shape))
    state = bn.init_state(x.shape)
    tol = 3e-2 if dtype == jnp.bfloat16 else 5e-3
    y32, s32 = bn.apply(bparams, x, state=state, train=train)
    y, s = bn.apply(bparams, x.astype(dtype), state=state, train=train)
    assert y.dtype == dtype
    assert s["running_mean"].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(y, np.float32), y32, rtol=tol, atol=tol)
    np.testing.assert_allclose(s["running_var"], s32["running_var"], rtol=tol, atol=tol)
    y = gn.apply(gparams, x.astype(dtype))
    assert y.dtype == dtype
    np.testing.assert_allclose(np.asarray(y, np.float32), gn.apply(gparams, x), rtol=tol, atol=tol)


def test_batch_norm_needs_state():
    bn = L.BatchNorm2d()
    params = bn.init(jax.random.key(0), (2, 3, 4, 4))
    for train in (True, False):
        with pytest.raises(
            ValueError,
            match=r"BatchNorm2d: track_running_stats=True keeps running statistics in a state "
            r"tree; pass state= from BatchNorm2d.init_state\(shape\)",
        ):
            bn.apply(params, jnp.zeros((2, 3, 4, 4)), train=train)


def test_sequential_without_state_names_the_batch_norm():
    model = L.Sequential(L.Linear(4), L.BatchNorm1d())
    params = model.init(jax.random.key(0), (3, 2))
    with pytest.raises(ValueError, match=r"Sequential\[1\] BatchNorm1d: .* pass state="):
        model.apply(params, jnp.zeros((3, 2)), train=True)


def test_batch_norm_shape_errors():
    bn = L.BatchNorm1d()
    with pytest.raises(
        ValueError,
        match=r"BatchNorm1d: input rank expected 2 or 3 \(N, C\) or \(N, C, L\), got 4 "
        r"\(x.shape == \(2, 3, 4, 5\)\)",
    ):
        bn.init(jax.random.key(0), (2, 3, 4, 5))
    params, state = bn.init(jax.random.key(0), (4, 3)), bn.init_state((4, 3))
    with pytest.raises(
        ValueError, match=r"BatchNorm1d: input channels \(axis 1\) expected 3, got 5"
    ):
        bn.apply(params, jnp.zeros((4, 5)), state=state)
    with pytest.raises(
        ValueError, match=r"BatchNorm1d: training needs more than 1 value per channel"
    ):
        bn.apply(params, jnp.zeros((1, 3)), state=state, train=True)
    with pytest.raises(
        ValueError, match=r"BatchNorm2d: input rank expected 4 \(N, C, H, W\), got 3"
    ):
        L.BatchNorm2d().init_state((2, 3, 4))


def test_batch_norm_config_errors():
    with pytest.raises(ValueError, match=r"BatchNorm2d: momentum must be in \[0, 1\], got 1.5"):
        L.BatchNorm2d(momentum=1.5)
    with pytest.raises(ValueError, match=r"BatchNorm3d: eps must be > 0, got -1"):
        L.BatchNorm3d(eps=-1)
