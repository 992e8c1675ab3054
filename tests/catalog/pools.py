"""Registry cases and error-catalog entries: pools."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from purelayers import layers as L
from purelayers.layers.errors import LayerError
from tests.case import Case

KEY = jax.random.key(0)


def _eval(fn):
    """``fn()`` traced abstractly: shape errors raise, nothing compiles."""
    return lambda: jax.eval_shape(fn)


def _pool_indices(shape: tuple[int, ...], k: int) -> np.ndarray:
    """For pooled ``shape`` ``(N, C, *out)``: one element of each ``k``-window of the
    unpooled input, as flat per-channel indices (what ``MaxPoolNd(k)`` could return)."""
    rng = np.random.default_rng(0)
    out = shape[2:]
    full = tuple(o * k for o in out)
    grids = np.meshgrid(*[np.arange(o) for o in out], indexing="ij")
    flat = np.zeros(shape, np.int64)
    for a, g in enumerate(grids):
        pos = g * k + rng.integers(0, k, shape)
        flat = flat * full[a] + pos
    return flat


def _fractional(nd: int, **kwargs):
    """The torch twin, fed the samples our layer draws from ``KEY`` for its input."""

    def call(module, x):
        ours = (L.FractionalMaxPool2d if nd == 2 else L.FractionalMaxPool3d)(**kwargs)
        import torch  # the reference, imported only where a torch twin runs

        u = np.asarray(ours.samples(KEY, tuple(x.shape)))
        f = torch.nn.functional.fractional_max_pool2d if nd == 2 else (
            torch.nn.functional.fractional_max_pool3d)  # fmt: skip
        return f(x, module.kernel_size, module.output_size, module.output_ratio,
                 module.return_indices, _random_samples=torch.tensor(u, dtype=x.dtype))  # fmt: skip

    return call


CASES: list = [
    Case("MaxPool3d", lambda: L.MaxPool3d(2, ceil_mode=True), (1, 2, 3, 4, 4), (1, 2, 2, 2, 2),
         lambda t: t.nn.MaxPool3d(2, ceil_mode=True)),
    Case("AvgPool3d", lambda: L.AvgPool3d(2, padding=1, count_include_pad=False),
         (1, 2, 3, 4, 4), (1, 2, 2, 3, 3),
         lambda t: t.nn.AvgPool3d(2, padding=1, count_include_pad=False)),
    Case("AvgPool2d-divisor", lambda: L.AvgPool2d(3, 2, 1, divisor_override=5), (2, 3, 6, 6),
         (2, 3, 3, 3), lambda t: t.nn.AvgPool2d(3, 2, 1, divisor_override=5)),
    Case("AdaptiveAvgPool3d", lambda: L.AdaptiveAvgPool3d((2, None, 3)), (1, 2, 3, 4, 5),
         (1, 2, 2, 4, 3), lambda t: t.nn.AdaptiveAvgPool3d((2, None, 3))),
    Case("AdaptiveMaxPool3d", lambda: L.AdaptiveMaxPool3d((2, 3, 2)), (1, 2, 3, 4, 5),
         (1, 2, 2, 3, 2), lambda t: t.nn.AdaptiveMaxPool3d((2, 3, 2))),
    Case("LPPool1d", lambda: L.LPPool1d(1, 3, 2), (2, 3, 8), (2, 3, 3),
         lambda t: t.nn.LPPool1d(1, 3, 2)),
    Case("LPPool2d", lambda: L.LPPool2d(2, 2), (2, 3, 6, 6), (2, 3, 3, 3),
         lambda t: t.nn.LPPool2d(2, 2), rtol=1e-4),
    Case("LPPool3d", lambda: L.LPPool3d(2, 2, ceil_mode=True), (1, 2, 3, 4, 5), (1, 2, 2, 2, 3),
         lambda t: t.nn.LPPool3d(2, 2, ceil_mode=True), rtol=1e-4),
    Case("FractionalMaxPool2d", lambda: L.FractionalMaxPool2d(2, output_size=(3, 4)),
         (2, 3, 6, 7), (2, 3, 3, 4), lambda t: t.nn.FractionalMaxPool2d(2, output_size=(3, 4)),
         kwargs={"key": KEY}, torch_call=_fractional(2, kernel_size=2, output_size=(3, 4))),
    Case("FractionalMaxPool3d", lambda: L.FractionalMaxPool3d(2, output_ratio=0.6),
         (1, 2, 5, 5, 6), (1, 2, 3, 3, 3), lambda t: t.nn.FractionalMaxPool3d(2, output_ratio=0.6),
         kwargs={"key": KEY}, torch_call=_fractional(3, kernel_size=2, output_ratio=0.6)),
    Case("MaxUnpool1d", lambda: L.MaxUnpool1d(2), (2, 3, 4), (2, 3, 8),
         lambda t: t.nn.MaxUnpool1d(2), extra=((2, 3, 4),),
         extra_x=lambda: (_pool_indices((2, 3, 4), 2),)),
    Case("MaxUnpool2d", lambda: L.MaxUnpool2d(2), (2, 3, 3, 3), (2, 3, 6, 6),
         lambda t: t.nn.MaxUnpool2d(2), extra=((2, 3, 3, 3),),
         extra_x=lambda: (_pool_indices((2, 3, 3, 3), 2),)),
    Case("MaxUnpool3d", lambda: L.MaxUnpool3d(2), (1, 2, 2, 2, 3), (1, 2, 4, 4, 6),
         lambda t: t.nn.MaxUnpool3d(2), extra=((1, 2, 2, 2, 3),),
         extra_x=lambda: (_pool_indices((1, 2, 2, 2, 3), 2),)),
]  # fmt: skip

# The indices are integers: the contract keeps the dtype checks to the pooled values.
CASES += [
    Case("MaxPool2d-indices", lambda: L.MaxPool2d(3, 2, 1, return_indices=True), (2, 3, 6, 6),
         (2, 3, 3, 3), lambda t: t.nn.MaxPool2d(3, 2, 1, return_indices=True)),
]  # fmt: skip


def _unpool(x_shape=(1, 1, 2, 2), idx=None, **kwargs):
    x = jnp.zeros(x_shape)
    idx = jnp.zeros(x_shape, jnp.int32) if idx is None else idx
    return _eval(lambda: L.MaxUnpool2d(2).apply({}, x, idx, **kwargs))


def _fmp(x_shape=(1, 1, 5, 5), **kwargs):
    layer = L.FractionalMaxPool2d(2, output_size=kwargs.pop("output_size", 3))
    return _eval(lambda: layer.apply({}, jnp.zeros(x_shape), **kwargs))


ERRORS: list = [
    ("pools-divisor-override", lambda: L.AvgPool3d(2, divisor_override=0), ValueError,
     r"^AvgPool3d: divisor_override must be a nonzero integer or None, got 0$"),
    ("pools-adaptive-return-indices", lambda: L.AdaptiveMaxPool2d(2, return_indices=1),
     ValueError, r"^AdaptiveMaxPool2d: return_indices must be True or False, got 1$"),
    ("pools-lp-norm-type", lambda: L.LPPool2d(0, 2), ValueError,
     r"^LPPool2d: norm_type must be a nonzero finite number, got 0$"),
    ("pools-lp-kernel", lambda: L.LPPool1d(2, 0), ValueError,
     r"^LPPool1d: kernel_size must be a positive integer or a tuple of 1 such integers, got 0$"),
    ("pools-unpool-default-size",
     _eval(lambda: L.MaxUnpool2d(2, padding=2).apply({}, jnp.zeros((1, 1, 1, 1)),
                                                     jnp.zeros((1, 1, 1, 1), jnp.int32))),
     LayerError, r"^MaxUnpool2d: output size per spatial axis expected >= 1, got \(-2, -2\)"),
    ("pools-unpool-size-kind", _unpool(output_size=(1, 1, 5)), LayerError,
     r"^MaxUnpool2d: output_size expected a sequence of 2 or 4 integers, got \(1, 1, 5\)"),
    ("pools-unpool-size-range", _unpool(output_size=(4, 6)), LayerError,
     r"^MaxUnpool2d: output_size\[1\] expected strictly between 2 and 6, got 6\n  the default"),
    ("pools-unpool-indices-dtype", _unpool(idx=jnp.zeros((1, 1, 2, 2))), LayerError,
     r"^MaxUnpool2d: indices dtype expected integer, got float32"),
    ("pools-unpool-indices-shape", _unpool(idx=jnp.zeros((1, 1, 2, 3), jnp.int32)), LayerError,
     r"^MaxUnpool2d: indices shape expected x's shape \(1, 1, 2, 2\), got \(1, 1, 2, 3\)"),
    ("pools-unpool-index-range",
     lambda: L.MaxUnpool2d(2).apply({}, jnp.zeros((1, 1, 2, 2)), jnp.full((1, 1, 2, 2), 16)),
     LayerError, r"^MaxUnpool2d: indices\[0, 0, 0, 0\] expected in \[0, 16\) \(the output's "
     r"\(4, 4\) positions per channel\), got 16\n  as torch's, which raises"),
    ("pools-fractional-one-size", lambda: L.FractionalMaxPool2d(2), ValueError,
     r"^FractionalMaxPool2d: give exactly one of output_size and output_ratio, got "
     r"output_size=None, output_ratio=None$"),
    ("pools-fractional-ratio", lambda: L.FractionalMaxPool3d(2, output_ratio=1.0), ValueError,
     r"^FractionalMaxPool3d: output_ratio must be in \(0, 1\), or a tuple of 3 such numbers, "
     r"got 1.0$"),
    ("pools-fractional-return-indices",
     lambda: L.FractionalMaxPool2d(2, output_size=2, return_indices="no"), ValueError,
     r"^FractionalMaxPool2d: return_indices must be True or False, got 'no'$"),
    ("pools-fractional-too-large", _fmp(output_size=5, key=KEY), LayerError,
     r"^FractionalMaxPool2d: output size along spatial axis 0 expected between 1 and "
     r"L - kernel_size \+ 1 = 4, got 5"),
    ("pools-fractional-key", _fmp(), LayerError,
     r"^FractionalMaxPool2d: draws its windows at random in every mode \(as torch\) and needs "
     r"a PRNG key"),
    ("pools-fractional-samples", _fmp(random_samples=np.zeros((1, 1, 3))), LayerError,
     r"^FractionalMaxPool2d: random_samples shape expected \(1, 1, 2\), got \(1, 1, 3\)"),
]  # fmt: skip
