"""Upsample and the fixed-mode upsampling layers: hand-derived indices and weights,
torch parity (outputs and the interpolation backward) at integer and fractional scales,
up and down, every mode and both ``align_corners``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L


def _row(layer, values):
    x = jnp.asarray(values, jnp.float32)[None, None]
    return np.asarray(layer.apply({}, x))[0, 0].tolist()


def test_nearest_indices_follow_torchs_scale_rule():
    """``L = 5``, ``scale_factor=1.3``: ``O = floor(6.5) = 6``. With the given scale the
    source is ``floor(i / 1.3)`` = 0, 0, 1, 2, 3, 3; recomputed from the sizes it is
    ``floor(i * 5 / 6)`` = 0, 0, 1, 2, 3, 4. ``O == 2 L`` takes ``i // 2`` whatever the
    scale (``scale_factor=2.1`` on 3 entries: 0, 0, 1, 1, 2, 2)."""
    x = [0.0, 1.0, 2.0, 3.0, 4.0]
    assert _row(L.Upsample(scale_factor=1.3), x) == [0, 0, 1, 2, 3, 3]
    assert _row(L.Upsample(scale_factor=1.3, recompute_scale_factor=True), x) == [0, 0, 1, 2, 3, 4]
    assert _row(L.Upsample(size=6), x) == [0, 0, 1, 2, 3, 4]
    assert _row(L.Upsample(scale_factor=2.1), x[:3]) == [0, 0, 1, 1, 2, 2]
    # nearest-exact: floor((i + 0.5) * 5 / 3) = floor(0.83, 2.5, 4.17) = 0, 2, 4
    assert _row(L.Upsample(size=3, mode="nearest-exact"), x) == [0, 2, 4]


def test_linear_weights():
    """``[0, 4]`` doubled: without aligned corners the sources are ``0.5 (i + 0.5) - 0.5``
    = -0.25 (clamped to 0), 0.25, 0.75, 1.25 (the last entry, its neighbour itself):
    0, 1, 3, 4. With aligned corners, ``i (2 - 1) / (4 - 1)``: 0, 4/3, 8/3, 4."""
    assert _row(L.Upsample(scale_factor=2, mode="linear"), [0.0, 4.0]) == [0, 1, 3, 4]
    ours = _row(L.Upsample(size=4, mode="linear", align_corners=True), [0.0, 4.0])
    np.testing.assert_allclose(ours, [0, 4 / 3, 8 / 3, 4], rtol=1e-6)


def test_bicubic_weights():
    """At ``t = 0.5`` Keys' weights with ``A = -0.75`` are -0.09375, 0.59375, 0.59375,
    -0.09375 (they sum to 1, so a constant stays constant). Downsampling ``[0, 0, 8, 0]``
    by 2 samples at sources 0.5 and 2.5: taps 0, 0, 1, 2 (clamped at the left edge) give
    ``8 * -0.09375 = -0.75``; taps 1, 2, 3, 3 (clamped at the right) ``8 * 0.59375``."""
    ours = _row(L.Upsample(scale_factor=0.5, mode="bicubic"), [[0.0, 0.0, 8.0, 0.0]] * 2)
    np.testing.assert_allclose(ours, [[-0.75, 4.75]], rtol=1e-6)
    flat = L.Upsample(scale_factor=1.7, mode="bicubic").apply({}, jnp.full((1, 1, 3, 3), 2.0))
    np.testing.assert_allclose(np.asarray(flat), 2.0, rtol=1e-6)


SETTINGS = [
    ("nearest", None, {"scale_factor": 0.6}, 4),
    ("nearest", None, {"size": (7, 2)}, 4),
    ("nearest-exact", None, {"scale_factor": (2, 0.7)}, 4),
    ("linear", False, {"scale_factor": 0.4}, 3),
    ("linear", True, {"scale_factor": 1.6}, 3),
    ("bilinear", False, {"scale_factor": (0.5, 2.5)}, 4),
    ("bilinear", True, {"size": (2, 7)}, 4),
    ("bilinear", False, {"scale_factor": 1.7, "recompute_scale_factor": True}, 4),
    ("bicubic", False, {"scale_factor": 0.6}, 4),
    ("bicubic", True, {"scale_factor": 2}, 4),
    ("bicubic", False, {"size": (3, 9)}, 4),
    ("trilinear", False, {"scale_factor": (1.5, 0.5, 2)}, 5),
    ("trilinear", True, {"scale_factor": 0.7}, 5),
    ("area", None, {"size": (3, 2)}, 4),  # windows of uneven and overlapping lengths
    ("area", None, {"scale_factor": 1.6}, 3),
    ("area", None, {"size": (2, 3, 4)}, 5),
]


@pytest.mark.parametrize(("mode", "align", "kw", "rank"), SETTINGS)
def test_matches_torch_up_and_down(mode, align, kw, rank, torch):
    shape = (1, 2, 4, 5, 3)[:rank] if rank < 5 else (1, 1, 3, 4, 5)
    x = np.random.default_rng(rank).standard_normal(shape).astype(np.float32)
    pl.testing.assert_matches_torch(
        L.Upsample(mode=mode, align_corners=align, **kw),
        torch.nn.Upsample(mode=mode, align_corners=align, **kw),
        x,
    )


def test_fixed_mode_layers_equal_upsample():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 2, 3, 4)), jnp.float32)
    near = L.UpsamplingNearest2d(size=(5, 7)).apply({}, x)
    np.testing.assert_array_equal(near, L.Upsample(size=(5, 7)).apply({}, x))
    bil = L.UpsamplingBilinear2d(scale_factor=1.5).apply({}, x)
    want = L.Upsample(scale_factor=1.5, mode="bilinear", align_corners=True).apply({}, x)
    np.testing.assert_array_equal(bil, want)


def test_integer_inputs_are_refused_as_torch():
    with pytest.raises(L.LayerError, match=r"input dtype expected floating point, got int32"):
        L.Upsample(scale_factor=2).apply({}, jnp.ones((1, 1, 3), jnp.int32))


def test_configuration():
    up = L.Upsample(size=[3, 4], scale_factor=None, mode="bilinear")
    assert up.size == (3, 4) and up == L.Upsample(size=(3, 4), mode="bilinear")
    assert L.Upsample(scale_factor=2).scale_factor == 2.0
    with pytest.raises(ValueError, match=r"^Upsample: align_corners must be None for mode="):
        L.Upsample(scale_factor=2, mode="nearest-exact", align_corners=True)
    with pytest.raises(ValueError, match=r"^Upsample: align_corners must be None for mode='area'"):
        L.Upsample(scale_factor=2, mode="area", align_corners=False)
    with pytest.raises(L.LayerError, match=r"input rank for mode='nearest' expected 3"):
        jax.eval_shape(lambda: L.Upsample(scale_factor=2).apply({}, jnp.zeros((2, 3))))
