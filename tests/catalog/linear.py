"""Registry cases and error-catalog entries: linear."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from purelayers import layers as L
from purelayers.layers.errors import LayerError
from tests.case import Case

KEY = jax.random.key(0)


def _pair(layer, s1, s2, x1=None, x2=None, **kwargs):
    """``layer`` initialized for ``(s1, s2)`` and applied to zeros of those shapes (or
    to ``x1`` / ``x2``), traced only."""

    def go():
        a = jnp.zeros(s1) if x1 is None else x1
        b = jnp.zeros(s2) if x2 is None else x2
        return layer.apply(layer.init(KEY, (s1, s2)), a, b, **kwargs)

    return jax.eval_shape(go)


def _bag(layer, x, *args, shape=None, **kwargs):
    """``layer`` applied to the concrete ids ``x`` (and ``args``), params for ``shape``."""
    x = np.asarray(x)
    params = layer.init(KEY, x.shape if shape is None else shape)
    return layer.apply(params, x, *args, **kwargs)


def _bag_traced(layer, x, *args, **kwargs):
    params = layer.init(KEY, jnp.shape(x))
    return jax.eval_shape(lambda: layer.apply(params, x, *args, **kwargs))


_I = jnp.int32

CASES: list = [
    Case("Bilinear", lambda: L.Bilinear(5), (3, 4), (3, 5), lambda t: t.nn.Bilinear(4, 2, 5),
         extra=((3, 2),), init_all=True, gradcheck=((2, 3), (2, 2))),
    Case("CosineSimilarity", lambda: L.CosineSimilarity(), (3, 4), (3,),
         lambda t: t.nn.CosineSimilarity(), extra=((1, 4),), init_all=True,
         gradcheck=((2, 3), (1, 3))),
    Case("PairwiseDistance", lambda: L.PairwiseDistance(), (3, 4), (3,),
         lambda t: t.nn.PairwiseDistance(), extra=((3, 4),), init_all=True,
         gradcheck=((2, 3), (2, 3))),
    Case("EmbeddingBag", lambda: L.EmbeddingBag(11, 5), (3, 4), (3, 5),
         lambda t: t.nn.EmbeddingBag(11, 5), ids=11),
    Case("Embedding-max_norm", lambda: L.Embedding(11, 4, max_norm=1.5), (2, 5), (2, 5, 4),
         lambda t: t.nn.Embedding(11, 4, max_norm=1.5), ids=11,
         gradcheck="the derivative is torch's, a plain lookup's (the rescaling is outside "
                   "autograd), not the rescaled value's finite difference; "
                   "tests/layers/test_embedding.py checks it against torch"),
    # two layers and initial states: tests/layers/test_recurrent.py
    Case("LSTM-proj", lambda: L.LSTM(4, proj_size=2, bidirectional=True), (3, 2, 3), (3, 2, 4),
         lambda t: t.nn.LSTM(3, 4, proj_size=2, bidirectional=True), rtol=1e-4,
         gradcheck=(2, 1, 3)),
]  # fmt: skip

ERRORS: list = [
    # two-input init
    ("linear-pair-init-one-shape", lambda: L.Bilinear(3).init(KEY, (2, 4)), ValueError,
     r"^Bilinear\.init: shape must be the two inputs' shapes, \(x1\.shape, x2\.shape\), "
     r"got \(2, 4\)$"),
    ("linear-pair-init-bad-shape", lambda: L.CosineSimilarity().init(KEY, ((2, 4), (2, -1))),
     ValueError, r"^CosineSimilarity\.init: shape must be .* got \(2, -1\)$"),
    # Bilinear
    ("linear-bilinear-out-features", lambda: L.Bilinear(0), ValueError,
     r"^Bilinear: out_features must be a positive integer, got 0$"),
    ("linear-bilinear-bias", lambda: L.Bilinear(3, bias=1), ValueError,
     r"^Bilinear: bias must be True or False, got 1$"),
    ("linear-bilinear-scalar", lambda: L.Bilinear(3).init(KEY, ((), (4,))), LayerError,
     r"^Bilinear: x1 rank expected at least 1 \(\.\.\., in1_features\), got 0 \(a scalar\)$"),
    ("linear-bilinear-weight-rank",
     lambda: jax.eval_shape(lambda: L.Bilinear(3).apply(
         {"weight": jnp.zeros((3, 4)), "bias": jnp.zeros(3)}, jnp.zeros(4), jnp.zeros(4))),
     LayerError, r"^Bilinear: params entry 'weight' rank expected 3 \(out, in1, in2\), got 2\n"
     r"  the params do not fit this input either: Bilinear: params entry 'weight' shape "
     r"expected \(3, 4, 4\), got \(3, 4\)$"),
    ("linear-bilinear-x2-width", lambda: _pair(L.Bilinear(3), (2, 4), (2, 5), x2=jnp.zeros((2, 6))),
     LayerError, r"^Bilinear: x2 last axis \(in2_features\) expected 5, got 6\n  x1\.shape == "
     r"\(2, 4\), x2\.shape == \(2, 6\); weight \(3, 4, 5\) was initialized for in2_features == 5\n"
     r"  the params do not fit this input either: Bilinear: params entry 'weight' shape "
     r"expected \(3, 4, 6\), got \(3, 4, 5\)$"),
    ("linear-bilinear-batch", lambda: _pair(L.Bilinear(3), (2, 4), (1, 5)), LayerError,
     r"^Bilinear: x2 leading \(batch\) axes expected x1's \(2,\), got \(1,\) .*\n  torch's "
     r"Bilinear does not broadcast"),
    ("linear-bilinear-dtype",
     lambda: _pair(L.Bilinear(3), (2, 4), (2, 5), x2=jnp.zeros((2, 5), jnp.int32)), LayerError,
     r"^Bilinear: x2 dtype expected floating point, got int32$"),
    # distances
    ("linear-cosine-dim", lambda: L.CosineSimilarity(dim=1.5), ValueError,
     r"^CosineSimilarity: dim must be an integer >= -2147483648, got 1\.5$"),
    ("linear-cosine-eps", lambda: L.CosineSimilarity(eps=-1.0), ValueError,
     r"^CosineSimilarity: eps must be >= 0, got -1\.0$"),
    ("linear-cosine-dim-range", lambda: _pair(L.CosineSimilarity(dim=2), (3, 4), (3, 4)),
     LayerError, r"^CosineSimilarity: dim=2 expected an axis of the broadcast shape, in \[-2, 2\), "
     r"got shape \(3, 4\)$"),
    ("linear-distance-broadcast", lambda: _pair(L.PairwiseDistance(), (3, 4), (2, 4)), LayerError,
     r"^PairwiseDistance: input shapes expected shapes that broadcast .* got x1\.shape == "
     r"\(3, 4\), x2\.shape == \(2, 4\)$"),
    ("linear-cosine-int",
     lambda: _pair(L.CosineSimilarity(), (3, 4), (3, 4), jnp.zeros((3, 4), _I), jnp.ones((3, 4), _I)),
     LayerError, r"^CosineSimilarity: inputs' common dtype expected floating point, got int32 "
     r"\(x1 int32, x2 int32\)\n  as torch refuses it"),
    ("linear-distance-p-type", lambda: L.PairwiseDistance(p="2"), ValueError,
     r"^PairwiseDistance: p must be a real number or \+-inf, got '2'$"),
    ("linear-distance-p-nan", lambda: L.PairwiseDistance(p=float("nan")), ValueError,
     r"^PairwiseDistance: p must be a real number or \+-inf, got nan$"),
    ("linear-distance-eps", lambda: L.PairwiseDistance(eps=float("inf")), ValueError,
     r"^PairwiseDistance: eps must be a finite number, got inf$"),
    ("linear-distance-keepdim", lambda: L.PairwiseDistance(keepdim=1), ValueError,
     r"^PairwiseDistance: keepdim must be True or False, got 1$"),
    # Embedding / EmbeddingBag options
    ("linear-embedding-max-norm", lambda: L.Embedding(4, 2, max_norm=-1.0), ValueError,
     r"^Embedding: max_norm must be >= 0, got -1\.0$"),
    ("linear-embedding-norm-type", lambda: L.EmbeddingBag(4, 2, norm_type=None), ValueError,
     r"^EmbeddingBag: norm_type must be a real number or \+-inf, got None$"),
    ("linear-embedding-scale-grad", lambda: L.Embedding(4, 2, scale_grad_by_freq=1), ValueError,
     r"^Embedding: scale_grad_by_freq must be True or False, got 1$"),
    ("linear-bag-mode", lambda: L.EmbeddingBag(4, 2, mode="min"), ValueError,
     r"^EmbeddingBag: mode must be one of 'sum', 'mean', 'max', got 'min'$"),
    ("linear-bag-sparse", lambda: L.EmbeddingBag(4, 2, sparse=True), ValueError,
     r"^EmbeddingBag: sparse must be False \(JAX computes dense gradients; .*got True$"),
    ("linear-embedding-sparse", lambda: L.Embedding(4, 2, sparse=True), ValueError,
     r"^Embedding: sparse must be False \(JAX computes dense gradients; .*got True$"),
    ("linear-bag-last-offset-flag", lambda: L.EmbeddingBag(4, 2, include_last_offset=None),
     ValueError, r"^EmbeddingBag: include_last_offset must be True or False, got None$"),
    ("linear-bag-max-freq",
     lambda: L.EmbeddingBag(4, 2, mode="max", scale_grad_by_freq=True), ValueError,
     r"^EmbeddingBag: mode='max' does not support scale_grad_by_freq=True"),
    ("linear-bag-rank", lambda: _bag(L.EmbeddingBag(4, 2), np.zeros((2, 2, 2), np.int32)),
     LayerError, r"^EmbeddingBag: input rank expected 1 \(with offsets\) or 2 \(bags of equal "
     r"length\), got 3 \(input\.shape == \(2, 2, 2\)\)$"),
    ("linear-bag-psw-mode",
     lambda: _bag(L.EmbeddingBag(4, 2), np.zeros((2, 3), np.int32), None, np.ones((2, 3))),
     LayerError, r"^EmbeddingBag: per_sample_weights with mode='mean' expected mode='sum', got "
     r"mode='mean'\n  torch supports per_sample_weights only for mode='sum'$"),
    ("linear-bag-psw-shape",
     lambda: _bag(L.EmbeddingBag(4, 2, mode="sum"), np.zeros((2, 3), np.int32), None,
                  np.ones((3, 2))),
     LayerError, r"^EmbeddingBag: per_sample_weights shape expected input's \(2, 3\), got \(3, 2\)$"),
    ("linear-bag-psw-dtype",
     lambda: _bag(L.EmbeddingBag(4, 2, mode="sum"), np.zeros((2, 3), np.int32), None,
                  np.ones((2, 3), np.int32)),
     LayerError, r"^EmbeddingBag: per_sample_weights dtype expected floating point, got int32$"),
    ("linear-bag-2d-offsets",
     lambda: _bag(L.EmbeddingBag(4, 2), np.zeros((2, 3), np.int32), np.array([0, 1])),
     LayerError, r"^EmbeddingBag: offsets with a 2-d input expected None \(each row of a 2-d "
     r"input is one bag\), got offsets of shape \(2,\)"),
    ("linear-bag-empty-bags", lambda: _bag(L.EmbeddingBag(4, 2), np.zeros((2, 0), np.int32)),
     LayerError, r"^EmbeddingBag: input bag length \(axis 1\) expected at least 1 \(torch refuses "
     r"empty fixed-length bags too\), got 0 \(input\.shape == \(2, 0\)\)$"),
    ("linear-bag-no-offsets", lambda: _bag(L.EmbeddingBag(4, 2), np.zeros(3, np.int32)),
     LayerError, r"^EmbeddingBag: offsets with a 1-d input expected a 1-d array of bag starts, "
     r"got None$"),
    ("linear-bag-offsets-dtype",
     lambda: _bag(L.EmbeddingBag(4, 2), np.zeros(3, np.int32), np.array([0.0, 1.0])),
     LayerError, r"^EmbeddingBag: offsets dtype expected an integer dtype, got float"),
    ("linear-bag-offsets-first",
     lambda: _bag(L.EmbeddingBag(4, 2), np.zeros(3, np.int32), np.array([1, 2])), LayerError,
     r"^EmbeddingBag: offsets\[0\] expected 0 \(the first bag starts at the first id, as torch "
     r"requires\), got 1$"),
    ("linear-bag-offsets-order",
     lambda: _bag(L.EmbeddingBag(4, 2), np.zeros(5, np.int32), np.array([0, 3, 2])), LayerError,
     r"^EmbeddingBag: offsets\[2\] expected at least offsets\[1\] == 3 \(offsets are bag starts, "
     r"non-decreasing\), got 2$"),
    ("linear-bag-offsets-last",
     lambda: _bag(L.EmbeddingBag(4, 2, include_last_offset=True), np.zeros(5, np.int32),
                  np.array([0, 2, 4])),
     LayerError, r"^EmbeddingBag: offsets\[-1\] expected the input's length 5 "
     r"\(include_last_offset=True\), got 4$"),
    # LSTM projections
    ("linear-lstm-proj-size", lambda: L.LSTM(4, proj_size=-1), ValueError,
     r"^LSTM: proj_size must be an integer >= 0, got -1$"),
    ("linear-lstm-proj-smaller", lambda: L.LSTM(4, proj_size=4), ValueError,
     r"^LSTM: proj_size must be smaller than hidden_size, got proj_size=4 with hidden_size=4 "
     r"\(torch: proj_size has to be smaller than hidden_size\)$"),
]  # fmt: skip
