"""``F.recurrent_layer`` (LSTM and Elman: the input projection in the loop and a
written-out derivative) equals ``F.recurrent_layer_reference`` (a plain ``lax.scan`` that
JAX differentiates) in values and first derivatives; the one-direction functions and the
cells are the layers' math."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import functional as F

L = pl.layers


def _setup(kind, hidden, shape, bidirectional, dtype, lengths=None):
    name = {"lstm": "LSTM", "gru": "GRU"}.get(kind, "RNN")
    kw = {"nonlinearity": kind[4:]} if kind.startswith("rnn") else {}
    layer = getattr(L, name)(hidden, bidirectional=bidirectional, **kw)
    params = layer.init(jax.random.key(0), shape, dtype)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal(shape), dtype)
    d = 2 if bidirectional else 1
    n = 2 if kind == "lstm" else 1
    state = tuple(jnp.asarray(rng.standard_normal((d, shape[1], hidden)), dtype) for _ in range(n))
    lens = None if lengths is None else jnp.asarray(lengths, jnp.int32)
    return params, x, state, lens, d


def _compare(kind, params, x, state, lens, d, rtol, atol):
    def loss(f, args):
        ys, final = f(kind, args[0], args[1], args[2], lens, directions=d)
        return jnp.sum(jnp.sin(ys)) + sum(jnp.sum(jnp.cos(s)) for s in final)

    @jax.jit
    def both(args):
        fast = jax.value_and_grad(lambda a: loss(F.recurrent_layer, a))(args)
        ref = jax.value_and_grad(lambda a: loss(F.recurrent_layer_reference, a))(args)
        return fast, ref

    (l1, g1), (l2, g2) = both((params, x, state))
    np.testing.assert_allclose(l1, l2, rtol=rtol, atol=atol)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def test_benchmark_shape_lstm():
    """The lstm benchmark's layer: 64 inputs, hidden 256, 100 steps, batch 32 (its
    tangent loop runs in chunks of 10 steps)."""
    params, x, state, lens, d = _setup("lstm", 256, (100, 32, 64), False, jnp.float32)
    _compare("lstm", params, x, state, lens, d, 2e-4, 2e-4)


@pytest.mark.parametrize("kind", ["lstm", "rnn_tanh", "rnn_relu", "gru"])
@pytest.mark.parametrize("steps", [1, 3, 65])
def test_odd_shapes(kind, steps):
    """Odd lengths, both directions, padded sequences, float64."""
    with jax.enable_x64(True):
        lengths = np.minimum(np.arange(3) + 1, steps)
        params, x, state, lens, d = _setup(kind, 5, (steps, 3, 4), True, jnp.float64, lengths)
        _compare(kind, params, x, state, lens, d, 1e-9, 1e-11)


def test_sequence_and_cell_functions():
    """``F.lstm`` at every step equals ``F.lstm_cell`` stepped by hand, and ``F.gru_cell`` /
    ``F.rnn_cell`` equal the layers' cells."""
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((4, 2, 3)), jnp.float32)
    h0, c0 = (jnp.asarray(rng.standard_normal((2, 5)), jnp.float32) for _ in range(2))
    p = L.LSTMCell(5).init(jax.random.key(0), (2, 3))
    w = (p["weight_ih"], p["weight_hh"], p["bias_ih"], p["bias_hh"])
    ys, (_h, c) = F.lstm(x, (h0, c0), *w)
    state = (h0, c0)
    for t in range(4):
        state = F.lstm_cell(x[t], state, *w)
        np.testing.assert_allclose(ys[t], state[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c, state[1], rtol=1e-5, atol=1e-6)
    for cell, fn in ((L.GRUCell(5), F.gru_cell), (L.RNNCell(5), F.rnn_cell)):
        p = cell.init(jax.random.key(1), (2, 3))
        got = fn(x[0], h0, p["weight_ih"], p["weight_hh"], p["bias_ih"], p["bias_hh"])
        np.testing.assert_allclose(got, cell.apply(p, x[0], h0), rtol=1e-5, atol=1e-6)
