import importlib

import jax
import pytest

from tests.functional._equal import assert_same_function

conv = importlib.import_module("purelayers.functional.conv")


def _settings(stride, pads):
    return dict(stride=stride, padding=pads, dilation=(1, 1), groups=1)


@pytest.mark.parametrize(
    "x_shape, w_shape, stride, pads",
    [
        ((8, 1, 28, 28), (4, 1, 3, 3), (1, 1), ((1, 1), (1, 1))),  # the cnn's first, narrower
        ((3, 1, 11, 12), (2, 1, 2, 3), (2, 1), ((0, 1), (2, 0))),  # odd: rows product
        ((32, 3, 14, 14), (4, 3, 3, 3), (1, 1), ((1, 1), (1, 1))),  # the cnn's second: chunks
        ((5, 2, 17, 13), (3, 2, 3, 2), (1, 1), ((1, 0), (0, 2))),  # odd: chunks of one image
    ],
)
def test_conv_equals_reference(x_shape, w_shape, stride, pads):
    """Whichever CPU form ``conv`` takes (patches, per-image or chunked weight gradient),
    values and first derivatives equal ``conv_reference``'s."""
    kx, kw, kb = jax.random.split(jax.random.key(0), 3)
    x, w = jax.random.normal(kx, x_shape), jax.random.normal(kw, w_shape)
    b = jax.random.normal(kb, w_shape[:1])
    kw_ = _settings(stride, pads)
    assert_same_function(
        lambda x, w, b: conv.conv(x, w, b, **kw_),
        lambda x, w, b: conv.conv_reference(x, w, b, **kw_),
        x, w, b, rtol=1e-4, atol=1e-4,
    )  # fmt: skip
