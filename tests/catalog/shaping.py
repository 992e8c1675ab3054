"""Registry cases and error-catalog entries: shaping (reshape, padding, shuffles,
resampling, sliding blocks)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from purelayers import layers as L
from purelayers.layers.errors import LayerError
from tests.case import Case


def _t(name, *args, **kwargs):
    return lambda t: getattr(t.nn, name)(*args, **kwargs)


def _pad(name, padding, shape, out, *extra):
    return Case(name, lambda: getattr(L, name)(padding, *extra), shape, out,
                _t(name, padding, *extra))  # fmt: skip


def _up(id_, shape, out, cls="Upsample", **kw):
    return Case(id_, lambda: getattr(L, cls)(**kw), shape, out, _t(cls, **kw))


# fmt: off
CASES = [
    Case("Unflatten", lambda: L.Unflatten(1, (2, -1)), (2, 6), (2, 2, 3),
         _t("Unflatten", 1, (2, -1))),
    _pad("ZeroPad1d", (1, 2), (2, 3, 4), (2, 3, 7)),
    _pad("ZeroPad2d", (1, 0, 2, 1), (1, 2, 3, 4), (1, 2, 6, 5)),
    _pad("ZeroPad3d", (1, 0, 0, 1, 1, 0), (1, 1, 2, 2, 3), (1, 1, 3, 3, 4)),
    _pad("ConstantPad1d", (2, -1), (2, 3, 4), (2, 3, 5), 0.5),
    _pad("ConstantPad2d", (1, 1, 0, 2), (1, 2, 3, 4), (1, 2, 5, 6), -1.0),
    _pad("ConstantPad3d", 1, (1, 1, 2, 2, 2), (1, 1, 4, 4, 4), 2.0),
    _pad("ReflectionPad1d", (2, 1), (2, 3, 4), (2, 3, 7)),
    _pad("ReflectionPad2d", (1, 2, 2, 0), (1, 2, 3, 4), (1, 2, 5, 7)),
    _pad("ReflectionPad3d", (1, 0, 1, 1, 0, 1), (1, 1, 2, 3, 3), (1, 1, 3, 5, 4)),
    _pad("ReplicationPad1d", (3, -1), (2, 3, 4), (2, 3, 6)),
    _pad("ReplicationPad2d", (1, 2, 0, 3), (1, 2, 3, 4), (1, 2, 6, 7)),
    _pad("ReplicationPad3d", (1, 1, 0, 1, 2, 0), (1, 1, 2, 2, 3), (1, 1, 4, 3, 5)),
    _pad("CircularPad1d", (2, 1), (2, 3, 4), (2, 3, 7)),
    _pad("CircularPad2d", (1, -1, 2, 1), (1, 2, 3, 4), (1, 2, 6, 4)),
    _pad("CircularPad3d", (1, 0, 0, 1, 1, 1), (1, 1, 2, 2, 3), (1, 1, 4, 3, 4)),
    Case("PixelShuffle", lambda: L.PixelShuffle(2), (1, 8, 2, 3), (1, 2, 4, 6),
         _t("PixelShuffle", 2)),
    Case("PixelUnshuffle", lambda: L.PixelUnshuffle(2), (1, 2, 4, 6), (1, 8, 2, 3),
         _t("PixelUnshuffle", 2)),
    Case("ChannelShuffle", lambda: L.ChannelShuffle(2), (2, 6, 3), (2, 6, 3),
         _t("ChannelShuffle", 2)),
    # one case per mode; align_corners, size and recompute_scale_factor are compared
    # with torch in tests/layers/test_upsample.py
    _up("Upsample-nearest", (1, 2, 3, 4), (1, 2, 6, 8), scale_factor=2),
    _up("Upsample-nearest-exact", (1, 2, 3, 4), (1, 2, 4, 6), scale_factor=1.5,
        mode="nearest-exact"),
    _up("Upsample-linear", (1, 2, 4), (1, 2, 10), scale_factor=2.5, mode="linear"),
    _up("Upsample-bilinear", (1, 2, 3, 4), (1, 2, 5, 3), size=(5, 3), mode="bilinear"),
    _up("Upsample-bicubic", (1, 2, 3, 4), (1, 2, 4, 6), scale_factor=1.5, mode="bicubic"),
    _up("Upsample-trilinear", (1, 1, 2, 2, 4), (1, 1, 4, 3, 2), scale_factor=(2, 1.5, 0.5),
        mode="trilinear"),
    _up("UpsamplingNearest2d", (1, 2, 3, 4), (1, 2, 6, 8), "UpsamplingNearest2d",
        scale_factor=2),
    _up("UpsamplingBilinear2d", (1, 2, 3, 4), (1, 2, 4, 5), "UpsamplingBilinear2d",
        size=(4, 5)),
    Case("Unfold", lambda: L.Unfold(2, padding=1, stride=2), (1, 2, 3, 4), (1, 8, 6),
         _t("Unfold", 2, padding=1, stride=2)),
    Case("Fold", lambda: L.Fold((3, 4), 2), (1, 8, 6), (1, 2, 3, 4), _t("Fold", (3, 4), 2)),
]
# fmt: on


def _run(layer, shape, dtype=jnp.float32):
    """``layer.apply`` on zeros of ``shape``, traced only (nothing compiles)."""
    return jax.eval_shape(lambda: layer.apply({}, jnp.zeros(shape, dtype)))


_RANK = r"input rank expected "

# fmt: off
ERRORS = [
    ("shaping-constant-pad-value",
     lambda: L.ConstantPad1d(1, -1.0).apply({}, jnp.ones((1, 2), jnp.uint8)), LayerError,
     r"^ConstantPad1d: value expected within uint8's range \[0, 255\] for an input of that "
     r"dtype, got -1\.0\n  as torch refuses it"),
    # -- Unflatten
    ("shaping-unflatten-dim", lambda: L.Unflatten(1.0, (2, 3)), ValueError,
     r"^Unflatten: dim must be an int, got 1\.0$"),
    ("shaping-unflatten-size", lambda: L.Unflatten(1, (-1, -1)), ValueError,
     r"^Unflatten: unflattened_size must be a non-empty tuple of ints >= 0 with at most one "
     r"-1, got \(-1, -1\)$"),
    ("shaping-unflatten-axis", lambda: _run(L.Unflatten(2, (2, 3)), (2, 6)), LayerError,
     r"^Unflatten: dim=2 expected an axis in \[-2, 1\], got x\.shape == \(2, 6\)$"),
    ("shaping-unflatten-product", lambda: _run(L.Unflatten(1, (4, -1)), (2, 6)), LayerError,
     r"^Unflatten: input axis 1 length expected the product of unflattened_size=\(4, -1\), "
     r"got 6 \(x\.shape == \(2, 6\)\)$"),
    # -- padding
    ("shaping-pad-padding", lambda: L.ReflectionPad2d((1, 2)), ValueError,
     r"^ReflectionPad2d: padding must be an int or a tuple of 4 ints \(left, right, top, "
     r"bottom\), got \(1, 2\)$"),
    ("shaping-pad-value", lambda: L.ConstantPad1d(1, "0"), ValueError,
     r"^ConstantPad1d: value must be a number, got '0'$"),
    ("shaping-pad-constant-rank", lambda: _run(L.ConstantPad2d(1, 0.0), (4,)), LayerError,
     r"^ConstantPad2d: " + _RANK + r"at least 2, got 1 \(x\.shape == \(4,\)\)$"),
    ("shaping-pad-rank", lambda: _run(L.ReplicationPad1d(1), (4,)), LayerError,
     r"^ReplicationPad1d: " + _RANK + r"3 \(N, C, L\) or 2 \(unbatched, C, L\), got 1"),
    ("shaping-pad-empty", lambda: _run(L.ReflectionPad1d(1), (2, 0, 4)), LayerError,
     r"^ReflectionPad1d: input axis 1 length expected at least 1 \(only the batch axis may "
     r"be empty, as in torch\), got 0 \(x\.shape == \(2, 0, 4\)\)$"),
    ("shaping-pad-reflect-size", lambda: _run(L.ReflectionPad1d((0, 4)), (1, 2, 4)), LayerError,
     r"^ReflectionPad1d: padding \(0, 4\) of axis 2: each side expected < 4 \(the axis "
     r"length, as torch\), got 4\n  x\.shape == \(1, 2, 4\); reflection cannot reach"),
    ("shaping-pad-cropped", lambda: _run(L.ConstantPad1d((-3, -2), 0.0), (1, 4)), LayerError,
     r"^ConstantPad1d: padding \(-3, -2\) of axis 1: the length left after cropping "
     r"expected >= 0, got -1\n  x\.shape == \(1, 4\)$"),
    ("shaping-pad-wrap", lambda: _run(L.CircularPad1d((-1, 4)), (1, 4)), LayerError,
     r"^CircularPad1d: padding \(-1, 4\) of axis 1: each side expected <= 3 \(the axis "
     r"length after cropping\), got 4\n  x\.shape == \(1, 4\); the padding may wrap"),
    ("shaping-pad-negative-out", lambda: _run(L.ReplicationPad1d((-3, -2)), (1, 4)),
     LayerError, r"^ReplicationPad1d: padding \(-3, -2\) of axis 1: output length expected "
     r">= 0, got -1\n  x\.shape == \(1, 4\)$"),
    ("shaping-pad-all-empty", lambda: _run(L.ReplicationPad1d((-4, 0)), (1, 4)), LayerError,
     r"^ReplicationPad1d: output lengths of the padded axes expected at least one >= 1 "
     r"\(as torch\), got \(0,\)\n  x\.shape == \(1, 4\), padding=\(-4, 0\)$"),
    # -- shuffles
    ("shaping-pixelshuffle-factor", lambda: L.PixelShuffle(0), ValueError,
     r"^PixelShuffle: upscale_factor must be a positive integer, got 0$"),
    ("shaping-pixelunshuffle-factor", lambda: L.PixelUnshuffle(-1), ValueError,
     r"^PixelUnshuffle: downscale_factor must be a positive integer, got -1$"),
    ("shaping-channelshuffle-groups", lambda: L.ChannelShuffle(1.5), ValueError,
     r"^ChannelShuffle: groups must be a positive integer, got 1\.5$"),
    ("shaping-shuffle-rank", lambda: _run(L.ChannelShuffle(2), (1, 6)), LayerError,
     r"^ChannelShuffle: " + _RANK + r"at least 3 \(\(N, C, \*\)\), got 2 \(x\.shape == "
     r"\(1, 6\)\)$"),
    ("shaping-pixelshuffle-channels", lambda: _run(L.PixelShuffle(2), (1, 6, 2, 3)),
     LayerError, r"^PixelShuffle: input channels \(axis -3\) expected a multiple of "
     r"upscale_factor\^2 = 4, got 6 \(x\.shape == \(1, 6, 2, 3\)\)$"),
    ("shaping-pixelunshuffle-axis", lambda: _run(L.PixelUnshuffle(2), (1, 2, 3, 6)),
     LayerError, r"^PixelUnshuffle: input axis -2 length expected a multiple of "
     r"downscale_factor = 2, got 3 \(x\.shape == \(1, 2, 3, 6\)\)$"),
    ("shaping-channelshuffle-channels", lambda: _run(L.ChannelShuffle(4), (1, 6, 2)),
     LayerError, r"^ChannelShuffle: input channels \(axis 1\) expected a multiple of groups "
     r"= 4, got 6 \(x\.shape == \(1, 6, 2\)\)$"),
    # -- Upsample
    ("shaping-upsample-size", lambda: L.Upsample(size=(2, 0)), ValueError,
     r"^Upsample: size must be a positive int or a tuple of positive ints, got \(2, 0\)$"),
    ("shaping-upsample-scale", lambda: L.Upsample(scale_factor=-2.0), ValueError,
     r"^Upsample: scale_factor must be a positive finite number or a tuple of them, got -2\.0$"),
    ("shaping-upsample-both", lambda: L.Upsample(size=3, scale_factor=2), ValueError,
     r"^Upsample: exactly one of size and scale_factor must be given, got both \(size=3, "
     r"scale_factor=2\.0\)$"),
    ("shaping-upsample-neither", lambda: L.UpsamplingNearest2d(), ValueError,
     r"^UpsamplingNearest2d: exactly one of size and scale_factor must be given, got neither"),
    ("shaping-upsample-mode", lambda: L.Upsample(scale_factor=2, mode="cubic"), ValueError,
     r"^Upsample: mode must be one of 'nearest', 'nearest-exact', 'linear', 'bilinear', "
     r"'bicubic', 'trilinear', 'area', got 'cubic'$"),
    ("shaping-upsample-align-type", lambda: L.Upsample(scale_factor=2, mode="linear",
                                                       align_corners=1), ValueError,
     r"^Upsample: align_corners must be None, True or False, got 1$"),
    ("shaping-upsample-align-nearest", lambda: L.Upsample(scale_factor=2, align_corners=False),
     ValueError, r"^Upsample: align_corners must be None for mode='nearest' \(it applies to "
     r"linear, bilinear, bicubic and trilinear\), got False$"),
    ("shaping-upsample-recompute-type", lambda: L.Upsample(scale_factor=2,
                                                           recompute_scale_factor="yes"),
     ValueError, r"^Upsample: recompute_scale_factor must be None, True or False, got 'yes'$"),
    ("shaping-upsample-recompute-size", lambda: L.Upsample(size=4, recompute_scale_factor=True),
     ValueError, r"^Upsample: recompute_scale_factor=True is not meaningful with an explicit "
     r"size; give scale_factor instead$"),
    ("shaping-upsample-rank", lambda: _run(L.Upsample(scale_factor=2, mode="bilinear"),
                                           (1, 2, 4)), LayerError,
     r"^Upsample: input rank for mode='bilinear' expected 4 \(N, C, H, W\), got 3 "
     r"\(x\.shape == \(1, 2, 4\)\)$"),
    ("shaping-upsample-channels", lambda: _run(L.Upsample(scale_factor=2), (1, 0, 3)),
     LayerError, r"^Upsample: input channels \(axis 1\) expected at least 1 \(as torch\), got "
     r"0 \(x\.shape == \(1, 0, 3\)\)$"),
    ("shaping-upsample-per-axis", lambda: _run(L.Upsample(size=(2, 3)), (1, 1, 4)), LayerError,
     r"^Upsample: size=\(2, 3\): one entry per spatial axis, expected 1, got 2 \(x\.shape == "
     r"\(N, C, 4\)\)$"),
    ("shaping-upsample-empty-out", lambda: _run(L.Upsample(scale_factor=0.2), (1, 1, 4)),
     LayerError, r"^Upsample: input and output spatial lengths expected at least 1 each \(as "
     r"torch\), got input \(4,\), output \(0,\)"),
    # -- Unfold / Fold
    ("shaping-unfold-kernel", lambda: L.Unfold(0), ValueError,
     r"^Unfold: kernel_size must be a positive integer or a tuple of 2 such integers, got 0$"),
    ("shaping-fold-padding", lambda: L.Fold(4, 2, padding=-1), ValueError,
     r"^Fold: padding must be an integer >= 0 or a tuple of 2 such integers, got -1$"),
    ("shaping-fold-unreachable", lambda: L.Fold((4, 4), 5), ValueError,
     r"^Fold: output_size must hold at least one sliding block per axis, got \(4, 4\) \(blocks "
     r"per axis \(0, 0\) for kernel_size=\(5, 5\), dilation=\(1, 1\), padding=\(0, 0\), "
     r"stride=\(1, 1\)\)$"),
    ("shaping-fold-output-size", lambda: L.Fold((3, 0), 2), ValueError,
     r"^Fold: output_size must be a positive integer or a tuple of 2 such integers, got "
     r"\(3, 0\)$"),
    ("shaping-unfold-rank", lambda: _run(L.Unfold(2), (1, 1, 2, 3, 4)), LayerError,
     r"^Unfold: " + _RANK + r"4 \(N, C, H, W\) or 3 \(unbatched\), got 5"),
    ("shaping-unfold-empty", lambda: _run(L.Unfold(2), (0, 3, 4)), LayerError,
     r"^Unfold: input axis 0 length expected at least 1 \(only the batch axis may be empty, "
     r"as in torch\), got 0 \(x\.shape == \(0, 3, 4\)\)$"),
    ("shaping-unfold-blocks", lambda: _run(L.Unfold(5), (1, 2, 3, 4)), LayerError,
     r"^Unfold: sliding blocks per spatial axis of the input \(3, 4\) expected at least 1, "
     r"got \(-1, 0\) \(kernel_size=\(5, 5\)"),
    ("shaping-fold-channels", lambda: _run(L.Fold((3, 4), 2), (1, 7, 6)), LayerError,
     r"^Fold: input axis 1 length \(C \* kh \* kw\) expected a multiple of kh \* kw = 4 "
     r"\(kernel_size=\(2, 2\)\), got 7 \(x\.shape == \(1, 7, 6\)\)$"),
    ("shaping-fold-blocks", lambda: _run(L.Fold((3, 4), 2), (1, 8, 5)), LayerError,
     r"^Fold: input axis -1 length \(the number of blocks L\) expected 2 \* 3 = 6 \(the "
     r"blocks that fit output_size=\(3, 4\)\), got 5 \(x\.shape == \(1, 8, 5\)\)$"),
]
# fmt: on
