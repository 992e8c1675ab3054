"""Unflatten, the shuffles, Unfold and Fold: hand-derived layouts, torch parity of the
options, and Fold as Unfold's transpose."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L


def test_unflatten():
    x = jnp.arange(24.0).reshape(2, 12)
    assert L.Unflatten(1, (3, -1)).apply({}, x).shape == (2, 3, 4)
    assert L.Unflatten(-1, [2, 2, 3]).apply({}, x).shape == (2, 2, 2, 3)
    np.testing.assert_array_equal(L.Unflatten(0, (1, 2)).apply({}, x)[0], x)
    # -1 next to a zero cannot be inferred: torch refuses it too
    with pytest.raises(L.LayerError, match=r"expected the product of unflattened_size=\(0, -1\)"):
        jax.eval_shape(lambda: L.Unflatten(1, (0, -1)).apply({}, jnp.zeros((2, 0))))
    with pytest.raises(ValueError, match=r"^Unflatten: unflattened_size must be .* got 3$"):
        L.Unflatten(1, 3)


def test_pixel_shuffle_layout_and_inverse():
    """``y[c, h r + i, w r + j] = x[c r^2 + i r + j, h, w]``: with ``r = 2``, channels
    0..3 of each pixel become its 2 x 2 block, row by row."""
    x = jnp.arange(2 * 4 * 2 * 3, dtype=jnp.float32).reshape(2, 4, 2, 3)
    y = L.PixelShuffle(2).apply({}, x)
    assert y.shape == (2, 1, 4, 6)
    assert y[0, 0, :2, :2].tolist() == [
        [x[0, 0, 0, 0], x[0, 1, 0, 0]],
        [x[0, 2, 0, 0], x[0, 3, 0, 0]],
    ]
    back = L.PixelUnshuffle(2).apply({}, y)
    np.testing.assert_array_equal(back, x)


def test_shuffles_with_more_leading_axes_match_torch(torch):
    x = np.random.default_rng(0).standard_normal((2, 1, 8, 2, 3)).astype(np.float32)
    pl.testing.assert_matches_torch(L.PixelShuffle(2), torch.nn.PixelShuffle(2), x)
    x2 = x.reshape(2, 1, 2, 4, 6)
    pl.testing.assert_matches_torch(L.PixelUnshuffle(2), torch.nn.PixelUnshuffle(2), x2)
    pl.testing.assert_matches_torch(L.ChannelShuffle(3), torch.nn.ChannelShuffle(3),
                                    x.reshape(2, 6, 2, 2, 2)[:, :, :1])  # fmt: skip


def test_channel_shuffle_permutation():
    """6 channels in 3 groups of 2: ``g * 2 + i`` moves to ``i * 3 + g``."""
    x = jnp.arange(6.0).reshape(1, 6, 1)
    assert L.ChannelShuffle(3).apply({}, x)[0, :, 0].tolist() == [0, 2, 4, 1, 3, 5]
    assert L.ChannelShuffle(1).apply({}, x).tolist() == x.tolist()


def test_unfold_worked_example():
    """A 1 x 3 x 3 image ``0..8`` in 2 x 2 blocks, stride 1: 4 blocks, each column the
    block's entries row-major: block (0, 0) is 0, 1, 3, 4."""
    x = jnp.arange(9.0).reshape(1, 1, 3, 3)
    cols = L.Unfold(2).apply({}, x)
    assert cols.shape == (1, 4, 4)
    assert cols[0, :, 0].tolist() == [0, 1, 3, 4]
    assert cols[0, :, 3].tolist() == [4, 5, 7, 8]
    # padded by 1, stride 2: 2 x 2 blocks, the first is the corner with three zeros
    corner = L.Unfold(2, padding=1, stride=2).apply({}, x)[0, :, 0]
    assert corner.tolist() == [0, 0, 0, 0]


def test_fold_sums_overlaps():
    """Folding unfolded ones counts how many blocks cover each pixel: 2 x 2 blocks on a
    3 x 3 image cover the corners once, the edges twice and the centre four times."""
    ones = L.Unfold(2).apply({}, jnp.ones((1, 1, 3, 3)))
    counts = L.Fold(3, 2).apply({}, ones)
    assert counts[0, 0].tolist() == [[1, 2, 1], [2, 4, 2], [1, 2, 1]]


OPTIONS = [
    {"kernel_size": (2, 3), "dilation": (2, 1), "padding": (1, 2), "stride": (2, 1)},
    {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": 1},
]


@pytest.mark.parametrize("kw", OPTIONS)
def test_unfold_and_fold_options_match_torch(kw, torch):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    unfold = L.Unfold(**kw)
    pl.testing.assert_matches_torch(unfold, torch.nn.Unfold(**kw), x)
    cols = np.asarray(jax.eval_shape(lambda: unfold.apply({}, jnp.asarray(x))).shape)
    c = rng.standard_normal(tuple(cols[1:])).astype(np.float32)  # unbatched
    pl.testing.assert_matches_torch(L.Fold((5, 6), **kw), torch.nn.Fold((5, 6), **kw), c)


def test_fold_gradient_is_unfold():
    fold, unfold = (
        L.Fold((4, 5), 2, stride=(1, 2), dilation=(2, 1)),
        L.Unfold(2, stride=(1, 2), dilation=(2, 1)),
    )
    g = jnp.asarray(np.random.default_rng(1).standard_normal((1, 2, 4, 5)), jnp.float32)
    cols = unfold.apply({}, jnp.zeros((1, 2, 4, 5)))
    _, vjp = jax.vjp(lambda c: fold.apply({}, c), cols)
    np.testing.assert_array_equal(vjp(g)[0], unfold.apply({}, g))


def test_bool_blocks_as_torch(torch):
    x = np.random.default_rng(0).random((1, 2, 3, 3)) > 0.5
    ours = L.Unfold(2).apply({}, jnp.asarray(x))
    assert ours.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(ours), torch.nn.Unfold(2)(torch.tensor(x)).numpy())


def test_fold_refuses_a_block_count_it_cannot_reach():
    fold = L.Fold((3, 4), 2, stride=2)  # 1 x 2 blocks
    with pytest.raises(L.LayerError, match=r"expected 1 \* 2 = 2 \(the blocks that fit"):
        jax.eval_shape(lambda: fold.apply({}, jnp.zeros((1, 8, 6))))
    assert fold == L.Fold(output_size=(3, 4), kernel_size=(2, 2), stride=(2, 2))
