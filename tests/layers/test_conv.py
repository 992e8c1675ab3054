"""Convolutions: worked example, torch parity (outputs and gradients), gradcheck, errors,
default initialization and checkpoint names."""

from __future__ import annotations

import dataclasses
import importlib
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import purelayers as pl
from purelayers import params as P
from purelayers.layers import (
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
    LayerError,
    Sequential,
)
from purelayers.testing import gradcheck
from tests.twins import load_from_torch

_OWN_ARGS = ("out_channels", "kernel_size", "weight_init", "bias_init")


def torch_twin(torch, layer, in_channels):
    """The ``torch.nn`` module configured as ``layer``, for ``in_channels`` inputs."""
    kwargs = {
        f.name: getattr(layer, f.name)
        for f in dataclasses.fields(layer)
        if f.name not in _OWN_ARGS and f.name != "_"
    }
    cls = getattr(torch.nn, type(layer).__name__)
    return cls(in_channels, layer.out_channels, layer.kernel_size, **kwargs)


def assert_parity(torch, layer, shape, *, seed=0, **apply_kwargs):
    """Weights copied from torch by name (names and order checked); outputs and all
    gradients within 1e-4 relative."""
    torch.manual_seed(seed)
    module = torch_twin(torch, layer, shape[-layer._nd - 1])
    params = load_from_torch(layer, module, shape)
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    pl.testing.assert_matches_torch(
        layer,
        module,
        x,
        params=params,
        apply=lambda p, x: layer.apply(p, x, **apply_kwargs),
        torch_call=lambda m, x: m(x, **apply_kwargs),
        rtol=1e-4,
        atol=1e-5,
    )


def test_worked_example_mnist_shape():
    """floor((28 + 2*1 - 1*(3 - 1) - 1) / 2) + 1 = floor(27 / 2) + 1 = 14."""
    conv = Conv2d(8, 3, stride=2, padding=1)
    params = conv.init(jax.random.key(0), (5, 1, 28, 28))
    assert jax.tree.map(jnp.shape, params) == {"weight": (8, 1, 3, 3), "bias": (8,)}
    y = conv.apply(params, jnp.ones((5, 1, 28, 28)))
    assert y.shape == (5, 8, 14, 14)


def test_worked_example_values():
    """A one-channel 3x3 image of ones, a 2x2 kernel of ones, bias 0.5, zero padding 1,
    stride 2: output size floor((3 + 2 - 2) / 2) + 1 = 2, and the windows cover input
    rows/cols {0} then {1, 2}, so they hold 1, 2, 2 and 4 ones: [[1.5, 2.5], [2.5, 4.5]]."""
    conv = Conv2d(1, 2, stride=2, padding=1)
    params = {"weight": jnp.ones((1, 1, 2, 2)), "bias": jnp.full((1,), 0.5)}
    y = conv.apply(params, jnp.ones((1, 1, 3, 3)))
    np.testing.assert_allclose(y[0, 0], [[1.5, 2.5], [2.5, 4.5]])


CONV_CASES = [
    (Conv1d(4, 3, stride=2, padding=1), (2, 3, 10)),
    (Conv1d(4, 4, padding="same"), (2, 3, 9)),
    (Conv1d(6, 3, padding="valid", dilation=2, groups=3, bias=False), (2, 6, 11)),
    (Conv1d(6, 3, groups=6, padding=2, padding_mode="reflect"), (2, 6, 7)),
    (Conv1d(4, 3, padding=2, padding_mode="circular"), (2, 3, 7)),
    (Conv2d(5, (3, 2), stride=(2, 1), padding=(1, 0)), (2, 3, 9, 8)),
    (Conv2d(5, 3, stride=2, padding=1, dilation=2), (2, 3, 9, 10)),
    (Conv2d(4, (4, 3), padding="same", dilation=(2, 1)), (2, 3, 9, 8)),
    (Conv2d(6, 3, padding="same", padding_mode="reflect", groups=2), (2, 4, 6, 7)),
    (Conv2d(8, 3, groups=4, padding=1, stride=2), (2, 4, 7, 7)),
    (Conv2d(4, 3, padding=(2, 1), padding_mode="replicate", bias=False), (2, 3, 6, 5)),
    (Conv2d(4, 3, padding=(2, 3), padding_mode="circular", stride=(1, 3)), (2, 3, 6, 5)),
    (
        Conv3d(4, (3, 2, 2), stride=(1, 2, 1), padding=(1, 0, 1), dilation=(1, 1, 2)),
        (1, 2, 5, 6, 5),
    ),
    (Conv3d(4, 3, groups=2, padding="same"), (1, 4, 4, 4, 4)),
    (Conv3d(3, 2, groups=3, padding=1, padding_mode="replicate"), (1, 3, 3, 4, 3)),
    # replicate padding wider than the input, which torch (unlike reflect and circular) takes
    (Conv1d(2, 3, padding=3, padding_mode="replicate"), (1, 1, 2)),
    (
        Conv2d(4, 2, stride=2, padding=2, dilation=2, groups=4, padding_mode="replicate"),
        (2, 4, 1, 5),
    ),
]


@pytest.mark.parametrize("layer, shape", CONV_CASES, ids=repr)
def test_conv_parity(torch, layer, shape):
    assert_parity(torch, layer, shape)


TRANSPOSED_CASES = [
    (ConvTranspose1d(4, 3, stride=2, padding=1, output_padding=1), (2, 3, 6)),
    (ConvTranspose1d(6, 3, stride=3, dilation=2, output_padding=1, groups=3), (2, 3, 5)),
    (ConvTranspose1d(4, 2, padding=2, bias=False), (2, 3, 6)),
    (
        ConvTranspose2d(4, (3, 2), stride=(2, 3), padding=(1, 0), output_padding=(1, 2)),
        (2, 3, 4, 4),
    ),
    (ConvTranspose2d(6, 3, dilation=2, stride=2, output_padding=1, groups=2), (2, 4, 4, 3)),
    (ConvTranspose2d(4, 3, groups=4, padding=1), (2, 4, 5, 5)),
    (ConvTranspose3d(3, 2, stride=2, output_padding=1), (1, 2, 3, 3, 2)),
    (ConvTranspose3d(4, 3, groups=2, padding=1, dilation=(1, 2, 1)), (1, 2, 3, 4, 3)),
]


@pytest.mark.parametrize("layer, shape", TRANSPOSED_CASES, ids=repr)
def test_transposed_parity(torch, layer, shape):
    assert_parity(torch, layer, shape)


@pytest.mark.parametrize(
    "layer, shape",
    [
        (Conv1d(4, 3, padding=1), (3, 7)),
        (Conv2d(4, 3, stride=2, padding_mode="reflect", padding=1), (3, 6, 5)),
        (ConvTranspose2d(2, 3, stride=2), (3, 4, 4)),
    ],
    ids=repr,
)
def test_unbatched_input_parity(torch, layer, shape):
    assert_parity(torch, layer, shape)


def test_transposed_output_size_parity(torch):
    layer = ConvTranspose2d(3, 3, stride=3, padding=1)
    for size in [(10, 12), (1, 3, 11, 10)]:
        assert_parity(torch, layer, (1, 2, 4, 4), output_size=size)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    k=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    padding=st.tuples(st.integers(0, 2), st.integers(0, 2)),
    dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    groups=st.sampled_from([1, 2, 3]),
    extra=st.tuples(st.integers(0, 4), st.integers(0, 4)),
    bias=st.booleans(),
)
def test_conv2d_parity_property(torch, k, stride, padding, dilation, groups, extra, bias):
    layer = Conv2d(
        2 * groups, k, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias
    )
    spatial = tuple(d * (k_ - 1) + 1 + e for d, k_, e in zip(dilation, k, extra, strict=True))
    assert_parity(torch, layer, (2, groups, *spatial))


def _same_derivatives(ours, xla, args, check) -> np.ndarray:
    """``check`` that ``ours`` and ``xla`` agree on ``args`` ``(x, w, b)``: the value,
    reverse-mode gradients (all three together and ``x``, ``w`` alone) against a fixed
    output cotangent, and forward-mode tangents, all in one compiled program. Returns
    that cotangent."""
    x, w, b = args
    shape = jax.eval_shape(xla, *args).shape
    ct = np.cos(np.arange(math.prod(shape))).reshape(shape)
    tangents = (np.sin(np.arange(x.size)).reshape(x.shape), np.cos(w), np.sin(b))

    @jax.jit
    def derivatives(args, ct, tangents):
        def of(fn):
            grads = [
                jax.grad(lambda *a: jnp.sum(fn(*a) * ct), argnums)(*args)
                for argnums in ((0, 1, 2), (0,), (1,))
            ]
            return fn(*args), grads, jax.jvp(fn, args, tangents)

        return of(ours), of(xla)

    (y1, g1, (v1, t1)), (y2, g2, (v2, t2)) = derivatives(args, ct, tangents)
    check(y1, y2)
    for a, c in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        check(a, c)
    check(v1, v2)
    check(t1, t2)
    return ct


@pytest.mark.parametrize(
    "kernel, stride, pads, dilation, per_image",
    [
        ((3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), True),  # 11 x 12 outputs an image
        ((5, 5), (2, 1), ((2, 0), (1, 3)), (1, 2), True),  # 5 x 8
        ((1, 4), (3, 2), ((-1, 2), (0, -1)), (2, 1), True),  # 4 x 4; negative pads crop
        ((3, 3), (3, 3), ((0, 0), (0, 0)), (1, 1), False),  # 3 x 4
    ],
)
def test_one_channel_patches_equal_xla_convolution(kernel, stride, pads, dilation, per_image):
    """One input channel and at most 25 taps take the patches path (``_one_channel_conv``):
    the same outputs, reverse-mode gradients (input, weight, bias, together and one at a
    time) and forward-mode tangents as ``lax.conv_general_dilated``; 36 taps stay on
    XLA's convolution. With at least 16 output positions an image the weight gradient
    is one ``(O, positions) x (positions, taps)`` product per image, summed
    (``_patch_product``): the backward pass holds a ``[3, 4, taps]`` product; with 12
    (the last case) the rows product's transpose, none."""
    conv = importlib.import_module("purelayers.functional.conv")

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 1, 11, 12))
    w = rng.standard_normal((4, 1, *kernel))
    b = rng.standard_normal(4)

    def ours(x, w, b):
        kw = dict(stride=stride, padding=pads, dilation=dilation, groups=1)
        return conv.conv(x, w, b, **kw)

    def xla(x, w, b):
        y = jax.lax.conv_general_dilated(x, w, stride, pads, rhs_dilation=dilation)
        return y + b[None, :, None, None]

    def check(a, c):
        np.testing.assert_allclose(a, c, rtol=1e-12, atol=1e-12)

    with jax.enable_x64(True):
        assert "dot_general" in str(jax.make_jaxpr(ours)(x, w, b))
        ct = _same_derivatives(ours, xla, (x, w, b), check)
        backward = str(jax.make_jaxpr(jax.grad(lambda w: jnp.sum(ours(x, w, b) * ct)))(w))
        taps = math.prod(kernel)
        assert (f"f64[3,4,{taps}] = dot_general" in backward) == per_image, backward
        big = rng.standard_normal((4, 1, 6, 6))
        assert "conv_general_dilated" in str(jax.make_jaxpr(ours)(x, big, b))
        assert "platform_index" not in str(jax.make_jaxpr(ours)(x, big, b))


def test_per_image_weight_gradient_is_for_float32_and_float64():
    """The one-channel patches' weight gradient is summed over images
    (``_patch_product``) in float32 and float64 only: in bfloat16 the sum of the images'
    products would round in bfloat16, so it keeps the rows product's one contraction."""
    conv = importlib.import_module("purelayers.functional.conv")

    def backward(dtype):
        x, w = jnp.ones((3, 1, 11, 12), dtype), jnp.ones((4, 1, 3, 3), dtype)

        def loss(w):
            y = conv.conv(
                x, w, None, stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1
            )
            return jnp.sum(y.astype(jnp.float32))

        return str(jax.make_jaxpr(jax.grad(loss))(w))

    assert "f32[3,4,9] = dot_general" in backward(jnp.float32)
    text = backward(jnp.bfloat16)
    assert "dot_general" in text and "[3,4,9] = dot_general" not in text, text


def test_one_channel_patches_are_the_cpu_choice_only():
    """The patches form is chosen where the program is lowered for the CPU; lowered for
    a GPU (no device needed: ``jax.export``) the same function is the convolution."""
    conv = importlib.import_module("purelayers.functional.conv")

    x, w = jnp.ones((2, 1, 9, 9)), jnp.ones((4, 1, 3, 3))

    def f(x, w):
        return conv.conv(
            x, w, None, stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1
        )

    def lowered(platform):
        return jax.export.export(jax.jit(f), platforms=(platform,))(x, w).mlir_module()

    cpu, cuda = lowered("cpu"), lowered("cuda")
    assert "stablehlo.convolution" not in cpu and "stablehlo.dot_general" in cpu
    assert "stablehlo.convolution" in cuda and "stablehlo.dot_general" not in cuda


@pytest.mark.parametrize(
    "kernel, pads, stride, chunks",
    [
        ((3, 3), ((1, 1), (1, 1)), (1, 1), {4: 7, 2: 1}),
        ((2, 3), ((0, 1), (2, 0)), (1, 1), {4: 7, 2: 1}),
        ((3, 1), ((-1, 3), (1, 1)), (1, 1), {4: 7, 2: 1}),
        ((3, 3), ((1, 1), (1, 1)), (2, 1), {8: 3, 6: 1}),
    ],
)
def test_chunked_weight_gradient_equals_xla_convolution(kernel, pads, stride, chunks):
    """30 images of 28 x 28 with 17 input channels take the weight gradient summed over
    chunks of images (``_conv2d_chunked_weight_gradient``): the same outputs,
    reverse-mode gradients (input, weight, bias, together and one at a time) and
    forward-mode tangents as ``lax.conv_general_dilated``. With 784 output positions an
    image, ``3136 // 784 = 4`` images a chunk (7 of four, one of two); with 840,
    ``3136 // 840 = 3``, raised to 4 by the cap of 8 chunks (``ceil(30 / 8)``); with
    stride 2 on the rows, 392 an image, ``3136 // 392 = 8`` (3 of eight, one of six).
    Dilation 2, or 6,272 output positions or fewer (4 images), keep XLA's convolution."""
    conv = importlib.import_module("purelayers.functional.conv")

    rng = np.random.default_rng(1)
    x = rng.standard_normal((30, 17, 28, 28))
    w = rng.standard_normal((6, 17, *kernel))
    b = rng.standard_normal(6)

    def ours(x, w, b, dilation=(1, 1)):
        return conv.conv(x, w, b, stride=stride, padding=pads, dilation=dilation, groups=1)

    def xla(x, w, b):
        y = jax.lax.conv_general_dilated(x, w, stride, pads)
        return y + b[None, :, None, None]

    def check(a, c):
        np.testing.assert_allclose(a, c, rtol=1e-11, atol=1e-11)

    def chosen(*args, **kw):
        return "platform_index" in str(jax.make_jaxpr(lambda *a: ours(*a, **kw))(*args))

    with jax.enable_x64(True):
        _same_derivatives(ours, xla, (x, w, b), check)
        backward = str(jax.make_jaxpr(jax.grad(lambda w: jnp.sum(ours(x, w, b))))(w))
        # one weight-gradient convolution per chunk, over the chunk's slice of the input
        found = re.findall(r"f64\[(\d+),17,28,28\] = slice", backward)
        assert {int(n): found.count(n) for n in set(found)} == chunks, backward
        assert chosen(x, w, b)
        assert not chosen(x, w, b, dilation=(2, 2))
        assert not chosen(x[:4], w, b)


def test_weight_gradient_chunks():
    """Images per chunk (``_weight_gradient_chunk``), 3 x 3 kernels with padding 1:
    about 3,136 output positions a chunk (``16 * 14 * 14``), at least one image, at
    most 8 chunks, and none over 6,272 positions or fewer.

    - ``[128, 32, 14, 14]``: 196 positions an image, ``3136 // 196 = 16`` images, 8 chunks.
    - ``[16, 128, 28, 28]``: 784 an image, ``3136 // 784 = 4`` images, 4 chunks.
    - ``[32, 64, 56, 56]``: 3,136 an image, one image would be 32 chunks; 8 chunks of 4.
    - ``[64, 256, 7, 7]``: 3,136 positions in all, kept whole (``None``).
    - ``[8, 1, 100, 100]``, stride 2: 2,500 an image, one image; 8 chunks would be the
      whole batch, so ``1``.
    - dilation 2, or bfloat16: ``None``."""
    from purelayers.functional.conv import _weight_gradient_chunk as chunk

    def of(shape, stride=(1, 1), dilation=(1, 1), dtype=jnp.float32):
        x, w = jnp.zeros(shape, dtype), jnp.zeros((8, shape[1], 3, 3), dtype)
        return chunk(x, w, stride, ((1, 1), (1, 1)), dilation)

    assert of((128, 32, 14, 14)) == 16
    assert of((16, 128, 28, 28)) == 4
    assert of((32, 64, 56, 56)) == 4
    assert of((64, 256, 7, 7)) is None
    assert of((8, 1, 100, 100), stride=(2, 2)) == 1
    assert of((128, 32, 14, 14), dilation=(2, 2)) is None
    assert of((128, 32, 14, 14), dtype=jnp.bfloat16) is None


def test_chunked_weight_gradient_is_the_cpu_choice_only():
    """Lowered for the CPU, the training gradient of the CNN benchmark's second
    convolution's shape holds ten convolutions (forward, input gradient and one weight
    gradient for each of 8 chunks of 16 images); lowered for a GPU (``jax.export``, no
    device needed) three."""
    conv = importlib.import_module("purelayers.functional.conv")

    x, w = jnp.ones((128, 32, 14, 14)), jnp.ones((8, 32, 3, 3))

    def loss(x, w):
        y = conv.conv(
            x, w, None, stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1
        )
        return jnp.sum(y * y)

    def lowered(platform):
        f = jax.jit(jax.grad(loss, (0, 1)))
        return jax.export.export(f, platforms=(platform,))(x, w).mlir_module()

    def convolutions(text):
        return [line for line in text.splitlines() if "stablehlo.convolution" in line]

    cpu, cuda = convolutions(lowered("cpu")), convolutions(lowered("cuda"))
    assert len(cpu) == 10, cpu
    assert sum("tensor<16x32x14x14xf32>" in line for line in cpu) == 8, cpu
    assert len(cuda) == 3, cuda


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    k=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    groups=st.sampled_from([1, 2]),
    size=st.tuples(st.integers(1, 5), st.integers(1, 5)),
    data=st.data(),
)
def test_conv_transpose2d_parity_property(torch, k, stride, dilation, groups, size, data):
    output_padding = tuple(
        data.draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation, strict=True)
    )
    # Padding up to d * (k - 1), and small enough that every output axis keeps >= 1 entry.
    padding = tuple(
        data.draw(st.integers(0, min(d * (k_ - 1), ((n - 1) * s + d * (k_ - 1) + op) // 2)))
        for n, s, d, k_, op in zip(size, stride, dilation, k, output_padding, strict=True)
    )
    layer = ConvTranspose2d(
        3 * groups,
        k,
        stride=stride,
        padding=padding,
        output_padding=output_padding,
        dilation=dilation,
        groups=groups,
    )
    assert_parity(torch, layer, (2, 2 * groups, *size))


@pytest.mark.parametrize(
    "layer, shape",
    [
        (Conv1d(2, 3, stride=2, padding=1, padding_mode="reflect"), (1, 2, 6)),
        (Conv2d(2, 2, padding="same", groups=2), (1, 2, 3, 4)),
        (Conv3d(2, 2, padding=1, padding_mode="circular"), (1, 1, 2, 3, 2)),
        (ConvTranspose1d(2, 3, stride=2, output_padding=1), (1, 2, 3)),
        (ConvTranspose2d(2, 2, stride=2, padding=1, groups=2, dilation=2), (1, 2, 3, 2)),
        (ConvTranspose3d(1, 2, stride=(2, 1, 1)), (1, 2, 2, 2, 1)),
    ],
    ids=repr,
)
def test_gradcheck(layer, shape):
    params = layer.init(jax.random.key(1), shape)
    x = jax.random.normal(jax.random.key(2), shape)
    assert gradcheck(layer.apply, params, x)


def test_jit_and_vmap_match_eager():
    layer = Conv2d(4, 3, padding=1, padding_mode="replicate")
    params = layer.init(jax.random.key(0), (2, 3, 6, 6))
    x = jax.random.normal(jax.random.key(1), (2, 3, 6, 6))
    eager = layer.apply(params, x)
    np.testing.assert_allclose(jax.jit(layer.apply)(params, x), eager, rtol=1e-6, atol=1e-6)
    per_example = jax.vmap(layer.apply, in_axes=(None, 0))(params, x)
    np.testing.assert_allclose(per_example, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "layer, cin, bound_fan_in",
    [
        (Conv2d(64, 5), 32, 32 * 25),
        (Conv1d(128, 7, groups=4), 64, 16 * 7),
        (ConvTranspose2d(48, 4, groups=2), 64, 24 * 16),
    ],
    ids=repr,
)
def test_default_init_matches_torch_formula(torch, layer, cin, bound_fan_in):
    """kaiming_uniform(a=sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)): std = bound/sqrt(3).
    For transposed convs fan_in comes from weight axis 1 (out/groups) as in torch."""
    shape = (1, cin, *(9,) * layer._nd)
    params = layer.init(jax.random.key(0), shape)
    bound = 1 / math.sqrt(bound_fan_in)
    w, b = np.asarray(params["weight"]), np.asarray(params["bias"])
    module = torch_twin(torch, layer, cin)
    assert w.shape == tuple(module.weight.shape)
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.03 * bound / math.sqrt(3)
    torch_std = float(module.weight.detach().std())
    assert abs(w.std() - torch_std) < 0.05 * torch_std
    assert float(module.weight.detach().abs().max()) <= bound


def test_init_overrides():
    from purelayers import init

    layer = Conv2d(3, 2, weight_init=init.constant(0.5), bias_init=init.zeros())
    params = layer.init(jax.random.key(0), (1, 2, 4, 4))
    np.testing.assert_array_equal(params["weight"], np.full((3, 2, 2, 2), 0.5))
    np.testing.assert_array_equal(params["bias"], np.zeros(3))


def test_names_and_order_match_state_dict(torch):
    model = Sequential(Conv2d(4, 3), Conv2d(2, 1, bias=False), ConvTranspose2d(3, 2))
    params = model.init(jax.random.key(0), (1, 3, 8, 8))
    tm = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.Conv2d(4, 2, 1, bias=False),
        torch.nn.ConvTranspose2d(2, 3, 2),
    )
    ours = {k: tuple(v.shape) for k, v in P.flatten(params).items()}
    assert ours == {k: tuple(v.shape) for k, v in tm.state_dict().items()}
    assert list(ours) == list(tm.state_dict())
    # Our checkpoint loads into torch unchanged.
    tm.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in P.flatten(params).items()})


def test_layers_are_hashable_and_normalized():
    assert Conv2d(4, 3) == Conv2d(4, (3, 3)) == Conv2d(4, [3, 3])
    assert hash(Conv2d(4, 3, stride=[2, 2])) == hash(Conv2d(4, 3, stride=2))
    assert Conv1d(4, 3) != Conv2d(4, 3)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Conv2d(0, 3), r"Conv2d: out_channels must be a positive integer, got 0"),
        (lambda: Conv2d(4, 0), r"Conv2d: kernel_size must be a positive integer or a tuple of 2"),
        (lambda: Conv2d(4, (3, 3, 3)), r"kernel_size must be .* tuple of 2 .*got \(3, 3, 3\)"),
        (lambda: Conv1d(4, 3, stride=0), r"Conv1d: stride must be a positive integer .*got 0"),
        (lambda: Conv2d(4, 3, dilation=(1, 0)), r"dilation must be .*got \(1, 0\)"),
        (lambda: Conv2d(4, 3, padding=-1), r"padding must be an integer >= 0 .*got -1"),
        (lambda: Conv2d(4, 3, padding="full"), r"padding must be 'valid', 'same'.*got 'full'"),
        (lambda: Conv2d(4, 3, padding="same", stride=2), r"padding='same' needs stride 1"),
        (lambda: Conv2d(6, 3, groups=4), r"out_channels must be divisible by groups, got "),
        (lambda: Conv2d(4, 3, groups=0), r"groups must be a positive integer, got 0"),
        (lambda: Conv2d(4, 3, padding_mode="mirror"), r"padding_mode must be one of 'zeros'"),
        (lambda: Conv2d(4, 3, bias=1), r"bias must be True or False, got 1"),
        (
            lambda: ConvTranspose2d(4, 3, stride=2, output_padding=2),
            r"ConvTranspose2d: output_padding must be smaller than either stride or dilation",
        ),
        (lambda: ConvTranspose1d(4, 3, padding=-2), r"padding must be an integer >= 0"),
    ],
)
def test_config_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_in_channels_not_divisible_by_groups():
    with pytest.raises(
        LayerError,
        match=r"Conv2d: input channels must be divisible by groups=4; expected a multiple "
        r"of 4, got 6",
    ):
        Conv2d(8, 3, groups=4).init(jax.random.key(0), (1, 6, 5, 5))


def test_shape_errors_name_layer_axis_expected_got():
    conv = Conv2d(4, 3)
    params = conv.init(jax.random.key(0), (1, 3, 8, 8))
    with pytest.raises(LayerError, match=r"Conv2d: input channels \(axis 1\) expected 3, got 5"):
        conv.apply(params, jnp.ones((1, 5, 8, 8)))
    with pytest.raises(LayerError, match=r"Conv2d: input rank expected 4 \(N, C, H, W\) or 3"):
        conv.apply(params, jnp.ones((8, 8)))
    with pytest.raises(LayerError, match=r"must hold the dilated kernel; expected >= \(3, 3\)"):
        conv.apply(params, jnp.ones((1, 3, 2, 8)))
    model = Sequential(Conv2d(4, 3), Conv2d(2, 3))
    mp = model.init(jax.random.key(0), (1, 3, 8, 8))
    mp["1"] = Conv2d(2, 3).init(jax.random.key(0), (1, 5, 6, 6))
    with pytest.raises(LayerError, match=r"Sequential\[1\] Conv2d: input channels"):
        model.apply(mp, jnp.ones((1, 3, 8, 8)))


def test_padding_mode_errors():
    conv = Conv1d(2, 3, padding=3, padding_mode="reflect")
    params = conv.init(jax.random.key(0), (1, 1, 3))
    with pytest.raises(LayerError, match=r"padding_mode='reflect' needs each padding smaller"):
        conv.apply(params, jnp.ones((1, 1, 3)))
    circ = Conv1d(2, 3, padding=3, padding_mode="circular")
    with pytest.raises(LayerError, match=r"padding_mode='circular' needs each padding at most"):
        circ.apply(circ.init(jax.random.key(0), (1, 1, 2)), jnp.ones((1, 1, 2)))


def test_transposed_errors():
    up = ConvTranspose2d(2, 3, stride=2)
    params = up.init(jax.random.key(0), (1, 4, 3, 3))
    with pytest.raises(LayerError, match=r"ConvTranspose2d: input channels \(axis 1\) expected 4"):
        up.apply(params, jnp.ones((1, 3, 3, 3)))
    with pytest.raises(LayerError, match=r"output_size must be reachable .* \[7, 8\], got"):
        up.apply(params, jnp.ones((1, 4, 3, 3)), output_size=(9, 7))
    tiny = ConvTranspose1d(1, 1, padding=1)
    with pytest.raises(
        LayerError, match=r"output size per spatial axis expected >= 1, got \(-1,\)"
    ):
        tiny.apply(tiny.init(jax.random.key(0), (1, 1, 1)), jnp.ones((1, 1, 1)))
