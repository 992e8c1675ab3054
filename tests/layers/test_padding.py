"""Padding layers: worked examples, negative padding, torch parity of every mode and rank
(outputs and gradients), dtypes, and the inputs torch refuses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L

MODES = ("ZeroPad", "ConstantPad", "ReflectionPad", "ReplicationPad", "CircularPad")


def _make(lib, mode, nd, padding):
    cls = getattr(lib, f"{mode}{nd}d")
    return cls(padding, 0.5) if mode == "ConstantPad" else cls(padding)


def test_worked_examples():
    """``[0, 1, 2, 3]`` padded by ``(2, 1)``: the fill, the mirror about each edge (edge
    not repeated), the edge repeated, the other end; then negative sides crop."""
    x = jnp.arange(4.0)[None]
    expect = {
        L.ConstantPad1d((2, 1), 9.0): [9, 9, 0, 1, 2, 3, 9],
        L.ReflectionPad1d((2, 1)): [2, 1, 0, 1, 2, 3, 2],
        L.ReplicationPad1d((2, 1)): [0, 0, 0, 1, 2, 3, 3],
        L.CircularPad1d((2, 1)): [2, 3, 0, 1, 2, 3, 0],
        # reflection reflects the whole axis, then crops: x[2], x[3], then x[2], x[1], x[0]
        L.ReflectionPad1d((-2, 3)): [2, 3, 2, 1, 0],
        # circular crops first, then wraps what is left ([0, 1, 2])
        L.CircularPad1d((2, -1)): [1, 2, 0, 1, 2],
        L.ReplicationPad1d((-4, 2)): [3, 3],
        L.ZeroPad1d((-1, -1)): [1, 2],
    }
    for layer, want in expect.items():
        np.testing.assert_array_equal(np.asarray(layer.apply({}, x))[0], want, str(layer))


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_every_mode_matches_torch_with_negative_padding(nd, torch):
    """Outputs and gradients (a cropped entry gets none; copied entries sum) against torch,
    each side of every axis padded or cropped."""
    rng = np.random.default_rng(nd)
    pads = (2, -1, -1, 1, 1, -1)[: 2 * nd]
    x = rng.standard_normal((2, 2, *(4,) * nd)).astype(np.float32)
    for mode in MODES:
        pl.testing.assert_matches_torch(
            _make(L, mode, nd, pads), _make(torch.nn, mode, nd, pads), x
        )


def test_unbatched_and_extra_leading_axes(torch):
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    for layer, module in [
        (L.ReflectionPad2d(1), torch.nn.ReflectionPad2d(1)),  # (C, H, W)
        (L.ZeroPad1d((1, 0)), torch.nn.ZeroPad1d((1, 0))),  # any leading axes
        (L.CircularPad1d(2), torch.nn.CircularPad1d(2)),
    ]:
        np.testing.assert_array_equal(np.asarray(layer.apply({}, x)), module(torch.tensor(x)))


def test_integer_and_bool_fills_cast_as_torch(torch):
    ints = np.arange(4).reshape(1, 4)
    for value in (1.7, -1.7):
        ours = L.ConstantPad1d(1, value).apply({}, jnp.asarray(ints, jnp.int32))
        theirs = torch.nn.ConstantPad1d(1, value)(torch.tensor(ints))
        np.testing.assert_array_equal(np.asarray(ours), theirs.numpy())
    flags = np.array([[True, False]])
    ours = L.ConstantPad1d(1, 0.5).apply({}, jnp.asarray(flags))
    assert ours.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(ours), [[True, True, False, True]])
    ours = L.ReflectionPad1d(1).apply({}, jnp.asarray(ints, jnp.int32))
    np.testing.assert_array_equal(np.asarray(ours), [[1, 0, 1, 2, 3, 2]])


# shapes and paddings torch refuses: ours raises LayerError while tracing
REFUSED = [
    ("ReflectionPad", 1, (4, 0), (1, 3, 4)),  # a side as long as the axis
    ("ReflectionPad", 1, 1, (2, 3, 0)),  # an empty padded axis
    ("ReplicationPad", 2, 1, (2, 0, 3, 4)),  # an empty channel axis
    ("ReplicationPad", 2, (0, 0, -3, -1), (1, 1, 3, 4)),  # a negative output length
    ("ReflectionPad", 1, (-2, -2), (1, 1, 4)),  # every padded axis empty
    ("CircularPad", 1, 5, (1, 2, 4)),  # wraps around more than once
    ("CircularPad", 2, 1, (2, 2)),  # rank
    ("ConstantPad", 2, (0, 0, -4, 1), (1, 3, 4)),  # crops past the axis
    ("ConstantPad", 3, 1, (3, 4)),  # fewer axes than padded ones
]


@pytest.mark.parametrize(("mode", "nd", "padding", "shape"), REFUSED)
def test_what_torch_refuses_is_a_layer_error(mode, nd, padding, shape, torch):
    with pytest.raises((RuntimeError, ValueError, NotImplementedError)):
        _make(torch.nn, mode, nd, padding)(torch.zeros(shape))
    layer = _make(L, mode, nd, padding)
    with pytest.raises(L.LayerError, match=f"^{mode}{nd}d: "):
        jax.eval_shape(lambda: layer.apply({}, jnp.zeros(shape)))


def test_circular_wraps_at_most_the_cropped_length():
    """``(-1, 3)`` on 3 entries would wrap 3 of the 2 left: torch then reads entries it has
    not written yet (it raises or returns unset memory); ours refuses."""
    layer = L.CircularPad1d((-1, 3))
    with pytest.raises(L.LayerError, match=r"each side expected <= 2 \(the axis length after"):
        jax.eval_shape(lambda: layer.apply({}, jnp.zeros((1, 2, 3))))


def test_empty_outputs_torch_allows():
    """A constant or circular pad may crop an axis to nothing; reflection and replication
    may too, while another padded axis keeps entries."""
    x = jnp.zeros((1, 1, 3, 4))
    for layer in (L.ZeroPad2d((-2, -2, 0, 0)), L.CircularPad2d((-4, 0, 0, 0)),
                  L.ReflectionPad2d((0, 0, -4, 1)), L.ReplicationPad2d((1, 1, -3, 0))):  # fmt: skip
        out = jax.eval_shape(lambda layer=layer: layer.apply({}, x))
        assert 0 in out.shape, layer


def test_configuration():
    assert L.ZeroPad2d(1).padding == (1, 1, 1, 1)
    assert L.ReflectionPad1d([1, 2]) == L.ReflectionPad1d((1, 2))
    assert hash(L.ConstantPad3d(1, 0.5)) == hash(L.ConstantPad3d((1,) * 6, 0.5))
    with pytest.raises(ValueError, match=r"^ZeroPad3d: padding must be an int or a tuple of 6"):
        L.ZeroPad3d((1, 1))
    with pytest.raises(ValueError, match=r"^CircularPad1d: padding must be .* got 1\.5$"):
        L.CircularPad1d(1.5)
