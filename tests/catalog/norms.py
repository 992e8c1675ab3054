"""Registry cases and error-catalog entries: norms."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from purelayers import layers as L
from purelayers.layers.errors import LayerError
from tests.case import Case

KEY = jax.random.key(0)


def _run(layer, shape, x_shape=None, *, train=False, state=True, key=None):
    """``init`` (and ``init_state``) for ``shape``, then ``apply`` to ones of ``x_shape``,
    traced only (nothing compiles)."""

    def go():
        x = jnp.ones(shape if x_shape is None else x_shape)
        kwargs = {"train": train, "key": key}
        if state:
            kwargs["state"] = layer.init_state(shape)
        return layer.apply(layer.init(KEY, shape), x, **kwargs)

    return jax.eval_shape(go)


CASES = [
    Case("InstanceNorm1d", lambda: L.InstanceNorm1d(), (2, 3, 5), (2, 3, 5),
         lambda t: t.nn.InstanceNorm1d(3), rtol=1e-4),
    Case("InstanceNorm2d", lambda: L.InstanceNorm2d(), (2, 3, 4, 4), (2, 3, 4, 4),
         lambda t: t.nn.InstanceNorm2d(3), rtol=1e-4, gradcheck=(1, 2, 3, 3)),
    Case("InstanceNorm3d", lambda: L.InstanceNorm3d(), (2, 3, 2, 3, 3), (2, 3, 2, 3, 3),
         lambda t: t.nn.InstanceNorm3d(3), rtol=1e-4, gradcheck=(1, 2, 2, 2, 2)),
    Case("InstanceNorm2d-affine-stats",
         lambda: L.InstanceNorm2d(affine=True, track_running_stats=True), (2, 3, 4, 4),
         (2, 3, 4, 4), lambda t: t.nn.InstanceNorm2d(3, affine=True, track_running_stats=True),
         rtol=1e-4, gradcheck=(1, 3, 2, 2)),
    Case("LocalResponseNorm", lambda: L.LocalResponseNorm(3, alpha=0.5, k=1.5), (2, 5, 3, 3),
         (2, 5, 3, 3), lambda t: t.nn.LocalResponseNorm(3, alpha=0.5, k=1.5), rtol=1e-4,
         gradcheck=(1, 4, 2, 2)),
    # torch's hand-written backward is its forward's derivative only while C <= size // 2
    # (tests/layers/test_norm.py checks our derivative of its wider forward)
    Case("CrossMapLRN2d", lambda: L.CrossMapLRN2d(5, alpha=0.5), (2, 2, 3, 3), (2, 2, 3, 3),
         lambda t: t.nn.CrossMapLRN2d(5, alpha=0.5), rtol=1e-4, gradcheck=(1, 2, 2, 2)),
    Case("SyncBatchNorm", lambda: L.SyncBatchNorm(), (4, 3, 2, 2), (4, 3, 2, 2),
         lambda t: t.nn.SyncBatchNorm(3), rtol=1e-4, gradcheck=(2, 3, 2)),
    Case("BatchNorm2d-nobias", lambda: L.BatchNorm2d(bias=False), (4, 3, 2, 2), (4, 3, 2, 2),
         lambda t: t.nn.BatchNorm2d(3, bias=False), rtol=1e-4, gradcheck=(2, 3, 2, 2)),
    Case("GroupNorm-nobias", lambda: L.GroupNorm(2, bias=False), (2, 4, 3), (2, 4, 3),
         lambda t: t.nn.GroupNorm(2, 4, bias=False), rtol=1e-4),
    # dropouts: the registry checks eval mode (the identity); train mode is in
    # tests/layers/test_dropout.py
    Case("Dropout1d", lambda: L.Dropout1d(0.3), (2, 3, 4), (2, 3, 4),
         lambda t: t.nn.Dropout1d(0.3)),
    Case("Dropout2d", lambda: L.Dropout2d(0.3), (2, 3, 2, 2), (2, 3, 2, 2),
         lambda t: t.nn.Dropout2d(0.3)),
    Case("Dropout3d", lambda: L.Dropout3d(0.3), (2, 3, 2, 1, 2), (2, 3, 2, 1, 2),
         lambda t: t.nn.Dropout3d(0.3)),
    Case("AlphaDropout", lambda: L.AlphaDropout(0.2), (4, 5), (4, 5),
         lambda t: t.nn.AlphaDropout(0.2)),
    Case("FeatureAlphaDropout", lambda: L.FeatureAlphaDropout(0.2), (2, 3, 4), (2, 3, 4),
         lambda t: t.nn.FeatureAlphaDropout(0.2)),
]  # fmt: skip

ERRORS = [
    # -- instance norm ------------------------------------------------------------------
    ("norms-instancenorm-eps", lambda: L.InstanceNorm1d(eps=0.0), ValueError,
     r"^InstanceNorm1d: eps must be > 0, got 0\.0$"),
    ("norms-instancenorm-momentum", lambda: L.InstanceNorm2d(momentum=-0.1), ValueError,
     r"^InstanceNorm2d: momentum must be in \[0, 1\], got -0\.1$"),
    ("norms-instancenorm-rank", lambda: L.InstanceNorm2d().init(KEY, (2, 3)), LayerError,
     r"^InstanceNorm2d: input rank expected 3 or 4 \(N, C, H, W\) or \(C, H, W\), got 2 "
     r"\(x\.shape == \(2, 3\)\)$"),
    ("norms-instancenorm-channels",
     lambda: _run(L.InstanceNorm1d(affine=True), (2, 3, 5), (2, 4, 5), state=False), LayerError,
     r"^InstanceNorm1d: input channels \(axis 1\) expected 3, got 4\n  x\.shape == \(2, 4, 5\); "
     r"InstanceNorm1d was initialized for 3 channels"),
    ("norms-instancenorm-int",
     lambda: jax.eval_shape(lambda: L.InstanceNorm1d().apply({}, jnp.ones((2, 3, 5), jnp.int32))),
     LayerError, r"^InstanceNorm1d: input dtype expected a floating dtype, got int32"),
    ("norms-instancenorm-empty-affine",
     lambda: _run(L.InstanceNorm1d(affine=True), (0, 3, 5), state=False), LayerError,
     r"^InstanceNorm1d: affine=True needs at least one sample \(torch fails on an empty batch "
     r"too\): expected N >= 1, got x\.shape == \(0, 3, 5\)$"),
    ("norms-instancenorm-missing-state",
     lambda: _run(L.InstanceNorm1d(track_running_stats=True), (2, 3, 5), state=False),
     LayerError, r"^InstanceNorm1d: track_running_stats=True keeps running statistics in a "
     r"state tree; pass state= from InstanceNorm1d\.init_state\(shape\)"),
    ("norms-instancenorm-one-element", lambda: _run(L.InstanceNorm1d(), (2, 3, 1), state=False),
     LayerError, r"^InstanceNorm1d: instance statistics need more than 1 spatial element per "
     r"channel: expected spatial size > 1, got x\.shape == \(2, 3, 1\)$"),
    # -- local response norms --------------------------------------------------------------
    ("norms-lrn-size", lambda: L.LocalResponseNorm(0), ValueError,
     r"^LocalResponseNorm: size must be a positive integer, got 0$"),
    ("norms-lrn-alpha", lambda: L.CrossMapLRN2d(3, alpha=float("inf")), ValueError,
     r"^CrossMapLRN2d: alpha must be a finite number, got inf$"),
    ("norms-lrn-rank", lambda: _run(L.LocalResponseNorm(2), (2, 3), state=False), LayerError,
     r"^LocalResponseNorm: input rank expected at least 3 \(N, C, \*\), got 2 "
     r"\(x\.shape == \(2, 3\)\)$"),
    ("norms-crossmap-channels",
     lambda: _run(L.CrossMapLRN2d(3), (2, 0, 3, 3), state=False), LayerError,
     r"^CrossMapLRN2d: channels \(axis 1\) expected at least 1 \(torch's legacy loop reads "
     r"channel 0\), got 0$"),
    # -- sync batch norm -------------------------------------------------------------------
    ("norms-syncbn-axis-name", lambda: L.SyncBatchNorm(axis_name=("a", 3)), ValueError,
     r"^SyncBatchNorm: axis_name must be None, an axis name or a tuple of them, got "
     r"\('a', 3\)$"),
    ("norms-syncbn-rank", lambda: L.SyncBatchNorm().init(KEY, (4,)), LayerError,
     r"^SyncBatchNorm: input rank expected at least 2 \(N, C, \*\), got 1 \(x\.shape == \(4,\)\)$"),
    # -- dropout ---------------------------------------------------------------------------
    ("norms-dropout-p", lambda: L.Dropout2d(1.5), ValueError,
     r"^Dropout2d: p must be in \[0, 1\], got 1\.5$"),
    ("norms-alpha-dropout-p", lambda: L.AlphaDropout(-0.5), ValueError,
     r"^AlphaDropout: p must be in \[0, 1\], got -0\.5$"),
    ("norms-channel-dropout-rank", lambda: _run(L.Dropout1d(), (3,), state=False), LayerError,
     r"^Dropout1d: input rank expected 2 or 3 \(N, C, L\) or \(C, L\), got 1 "
     r"\(x\.shape == \(3,\)\)$"),
    ("norms-flag-not-a-bool", lambda: L.LayerNorm(elementwise_affine="False"), ValueError,
     r"^LayerNorm: elementwise_affine must be True or False, got 'False'$"),
    ("norms-batchnorm-flag-not-a-bool", lambda: L.BatchNorm1d(track_running_stats=0),
     ValueError, r"^BatchNorm1d: track_running_stats must be True or False, got 0$"),
    ("norms-feature-alpha-dropout-rank",
     lambda: _run(L.FeatureAlphaDropout(), (3,), train=True, state=False, key=KEY), LayerError,
     r"^FeatureAlphaDropout: input rank \(train=True drops whole channels of \(N, C, \*\)\) "
     r"expected at least 2, got 1 \(x\.shape == \(3,\)\)$"),
]  # fmt: skip
