"""Registry cases and error-catalog entries: parametrize."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp

from purelayers import layers as L
from purelayers.layers.errors import LayerError
from tests.case import Case

KEY = jax.random.key(0)


def _weight_norm(module, **kwargs):
    return lambda t: t.nn.utils.parametrizations.weight_norm(module(t), **kwargs)


def _legacy_weight_norm(t):
    with warnings.catch_warnings():  # deprecated in torch, still what old checkpoints hold
        warnings.simplefilter("ignore")
        return t.nn.utils.weight_norm(t.nn.Linear(5, 4))


CASES = [
    Case("WeightNorm", lambda: L.WeightNorm(L.Linear(4)), (3, 5), (3, 4),
         _weight_norm(lambda t: t.nn.Linear(5, 4)), gradcheck=(2, 5)),
    Case("WeightNorm-Conv1d", lambda: L.WeightNorm(L.Conv1d(3, 2)), (2, 2, 5), (2, 3, 4),
         _weight_norm(lambda t: t.nn.Conv1d(2, 3, 2)), rtol=1e-4, gradcheck=(1, 2, 3)),
    Case("WeightNorm-legacy", lambda: L.WeightNorm(L.Linear(4), legacy_names=True), (3, 5),
         (3, 4), _legacy_weight_norm, gradcheck=(2, 5)),
    Case("SpectralNorm", lambda: L.SpectralNorm(L.Linear(4)), (3, 5), (3, 4),
         lambda t: t.nn.utils.parametrizations.spectral_norm(t.nn.Linear(5, 4)), rtol=1e-4,
         gradcheck=(2, 5)),
]  # fmt: skip


def _sn_apply(layer, shape, *, state=True, train=False):
    def go():
        params = layer.init(KEY, shape)
        s = layer.init_state(shape) if state else None
        return layer.apply(params, jnp.ones(shape), state=s, train=train)

    return jax.eval_shape(go)


def _init(layer, shape):
    return jax.eval_shape(lambda: layer.init(KEY, shape))


def _wrong_params_state():
    sn = L.SpectralNorm(L.Linear(4))
    params = sn.init(KEY, (2, 3))
    return sn.init_state((2, 5), params=params)


def _inner_error(layer, name, shape, x_shape, edit=None):
    """An error of the wrapped layer (or of its child, after ``edit`` of the params)."""
    wrapped = layer(L.InProjAttention(2) if name else L.Linear(4), *([name] if name else []))

    def go():
        params = wrapped.init(KEY, shape)
        return wrapped.apply(edit(params) if edit else params, jnp.ones(x_shape))

    return jax.eval_shape(go)


def _narrow_out_proj(params):
    return {**params, "out_proj": {**params["out_proj"], "weight": jnp.ones((4, 3))}}


# fmt: off
ERRORS = [
    ("parametrize-layer", lambda: L.WeightNorm("linear"), ValueError,
     r"^WeightNorm: layer must be a Layer, got 'linear'$"),
    ("parametrize-name", lambda: L.SpectralNorm(L.Linear(4), "wieght"), ValueError,
     r"^SpectralNorm: name must be one of Linear's own parameters \('weight', 'bias'\), "
     r"got 'wieght'$"),
    ("parametrize-twice", lambda: L.WeightNorm(L.SpectralNorm(L.Linear(4)), "bias"), ValueError,
     r"^WeightNorm: SpectralNorm is parametrized already \(it has 'parametrizations'\); one "
     r"parametrization per layer is supported$"),
    ("parametrize-dim", lambda: L.WeightNorm(L.Linear(4), dim=0.5), ValueError,
     r"^WeightNorm: dim must be an integer >= -2147483648, got 0\.5$"),
    ("parametrize-legacy", lambda: L.WeightNorm(L.Linear(4), legacy_names=1), ValueError,
     r"^WeightNorm: legacy_names must be True or False, got 1$"),
    ("parametrize-iterations", lambda: L.SpectralNorm(L.Linear(4), n_power_iterations=0),
     ValueError, r"^SpectralNorm: n_power_iterations must be a positive integer, got 0$"),
    ("parametrize-eps", lambda: L.SpectralNorm(L.Linear(4), eps=-1.0), ValueError,
     r"^SpectralNorm: eps must be >= 0, got -1\.0$"),
    ("parametrize-buffer", lambda: _init(L.WeightNorm(L.BatchNorm1d(), "running_mean"), (4, 3)),
     LayerError, r"^WeightNorm: BatchNorm1d builds no parameter 'running_mean'\n  its params are "
     r"\['bias', 'weight'\] \(a buffer cannot be parametrized\)$"),
    ("parametrize-axis", lambda: _init(L.WeightNorm(L.Linear(4), dim=2), (3, 5)), LayerError,
     r"^WeightNorm: dim for the 2-axis 'weight' expected an axis in \[-2, 1\], got 2$"),
    ("parametrize-inner", lambda: _inner_error(L.WeightNorm, None, (3, 5), (3, 4)), LayerError,
     r"^WeightNorm\(Linear\): input last axis expected 5, got 4"),
    ("parametrize-inner-path",
     lambda: _inner_error(L.WeightNorm, "in_proj_weight", (2, 3, 4), (2, 3, 4), _narrow_out_proj),
     LayerError, r"^WeightNorm\(InProjAttention\)\[out_proj\] Linear: input last axis "
     r"expected 3, got 4"),
    ("parametrize-no-state", lambda: _sn_apply(L.SpectralNorm(L.Linear(4)), (3, 5), state=False),
     LayerError, r"^SpectralNorm: the power-iteration vectors u, v are buffers in a state tree; "
     r"pass state= from SpectralNorm\.init_state\(shape, params=params, key=key\)"),
    ("parametrize-state-params", _wrong_params_state, LayerError,
     r"^SpectralNorm: init_state: params' parametrizations\.weight\.original shape expected "
     r"\(4, 5\), got \(4, 3\)"),
]
# fmt: on
