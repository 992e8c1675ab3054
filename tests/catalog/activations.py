"""Registry cases and error-catalog entries: activations."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from purelayers import layers as L
from purelayers.layers.errors import LayerError
from tests.case import KINKS, Case, act

# KINKS (0 and +-3) and a row on these layers' own kinks: Hardtanh's +-1, the shrinks'
# +-0.5, Threshold's 0.1 (its case's threshold), ReLU6's 6.
_OWN = np.array(
    [-1.0, 1.0, -0.5, 0.5, 0.1, -0.1, 0.45, -0.55, 6.0, -6.0, 2.0, -2.0, 0.0, 1.5], np.float32
)
OWN_KINKS = np.concatenate([KINKS, _OWN[None]])


def _act(name, make, torch_make, **kw) -> Case:
    """``tests.case.act``, with parity on ``OWN_KINKS``."""
    return dataclasses.replace(act(name, make, torch_make, **kw), x=lambda: OWN_KINKS)


def _traced(fn):
    """``fn`` run under ``jax.eval_shape``: errors raised while tracing, nothing compiled."""
    return lambda: jax.eval_shape(fn)


_KEYLESS = r"^RReLU: train=True draws random numbers and needs a PRNG key; pass key="

# fmt: off
CASES: list = [
    _act("Hardtanh", L.Hardtanh, "Hardtanh", errors=[
        ("activations-hardtanh-min", lambda: L.Hardtanh(float("-inf")), ValueError,
         r"^Hardtanh: min_val must be a finite number, got -inf$"),
        ("activations-hardtanh-max", lambda: L.Hardtanh(max_val="1"), ValueError,
         r"^Hardtanh: max_val must be a finite number, got '1'$"),
        ("activations-hardtanh-unsigned",
         lambda: L.Hardtanh().apply({}, jnp.array([0, 5, 200], jnp.uint8)), LayerError,
         r"^Hardtanh: min_val expected within uint8's range \[0, 255\] for an input of that "
         r"dtype, got -1\.0\n  as torch refuses it"),
        ("activations-hardtanh-order", lambda: L.Hardtanh(1.0, 1.0), ValueError,
         r"^Hardtanh: max_val must be greater than min_val \(1\.0\), got 1\.0$"),
    ]),
    _act("Hardswish", L.Hardswish, "Hardswish"),
    _act("Mish", L.Mish, "Mish"),
    _act("LogSigmoid", L.LogSigmoid, "LogSigmoid"),
    _act("CELU", L.CELU, "CELU", errors=[
        ("activations-celu-alpha", lambda: L.CELU(float("nan")), ValueError,
         r"^CELU: alpha must be a finite number, got nan$"),
        ("activations-celu-alpha-zero", lambda: L.CELU(0.0), ValueError,
         r"^CELU: alpha must be nonzero \(x is divided by it\), got 0\.0$"),
    ]),
    _act("Softmin", L.Softmin, "Softmin", errors=[  # dim=None: the implicit dim
        ("activations-softmin-dim", lambda: L.Softmin("0"), ValueError,
         r"^Softmin: dim must be an integer >= -2147483648, got '0'$"),
        ("activations-softmin-dim-range", _traced(lambda: L.Softmin(1).apply({}, jnp.zeros(()))),
         LayerError, r"^Softmin: dim 1 expected in \[-1, 0\] for an input of rank 0"),
    ]),
    _act("Threshold", lambda: L.Threshold(0.1, 20.0), lambda t: t.nn.Threshold(0.1, 20.0), errors=[
        ("activations-threshold-threshold", lambda: L.Threshold(float("nan"), 0.0), ValueError,
         r"^Threshold: threshold must be a finite number, got nan$"),
        ("activations-threshold-value", lambda: L.Threshold(0.0, None), ValueError,
         r"^Threshold: value must be a finite number, got None$"),
    ]),
    _act("RReLU", L.RReLU, "RReLU", errors=[  # eval mode
        ("activations-rrelu-lower", lambda: L.RReLU(True), ValueError,
         r"^RReLU: lower must be a finite number, got True$"),
        ("activations-rrelu-order", lambda: L.RReLU(0.5, 0.1), ValueError,
         r"^RReLU: upper must be >= 0\.5, got 0\.1$"),
        ("activations-rrelu-key", _traced(lambda: L.RReLU().apply({}, jnp.zeros(3), train=True)),
         LayerError, _KEYLESS),
    ]),
    _act("Tanhshrink", L.Tanhshrink, "Tanhshrink"),
    _act("Softshrink", L.Softshrink, "Softshrink", errors=[
        ("activations-softshrink-lambd", lambda: L.Softshrink(-1.0), ValueError,
         r"^Softshrink: lambd must be >= 0, got -1\.0$"),
    ]),
    _act("Hardshrink", L.Hardshrink, "Hardshrink", errors=[
        ("activations-hardshrink-lambd", lambda: L.Hardshrink(float("inf")), ValueError,
         r"^Hardshrink: lambd must be a finite number, got inf$"),
    ]),
    Case("GLU", L.GLU, (2, 3, 4), (2, 3, 2), lambda t: t.nn.GLU(), gradcheck=(2, 6), errors=(
        ("activations-glu-dim", lambda: L.GLU(1.0), ValueError,
         r"^GLU: dim must be an integer >= -2147483648, got 1\.0$"),
        ("activations-glu-odd", _traced(lambda: L.GLU().apply({}, jnp.zeros((2, 3)))), LayerError,
         r"^GLU: input dim -1 expected an even length \(GLU halves it\), got 3\n"
         r"  x\.shape == \(2, 3\)$"),
        ("activations-glu-dim-range", _traced(lambda: L.GLU(2).apply({}, jnp.zeros((2, 4)))),
         LayerError, r"^GLU: dim 2 expected in \[-2, 1\] for an input of rank 2, got x\.shape == "
         r"\(2, 4\)$"),
    )),
    Case("Softmax2d", L.Softmax2d, (2, 3, 4, 5), (2, 3, 4, 5), lambda t: t.nn.Softmax2d(),
         gradcheck=(1, 3, 2, 2), errors=(
        ("activations-softmax2d-rank", _traced(lambda: L.Softmax2d().apply({}, jnp.zeros((2, 3)))),
         LayerError, r"^Softmax2d: input rank expected 3 or 4 \(\(C, H, W\) or \(N, C, H, W\)\), "
         r"got 2 \(x\.shape == \(2, 3\)\)$"),
    )),
]
# fmt: on
