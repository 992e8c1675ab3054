"""Recurrent layers: torch parity (outputs, final states, gradients), names and order,
gradcheck, padded batches vs packed sequences, Cho's GRU, compile behaviour, errors."""

import itertools
import warnings

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import purelayers as pl
from purelayers import layers as L

IN, H, T, B = 3, 4, 5, 2

SEQ = {"RNN": L.RNN, "LSTM": L.LSTM, "GRU": L.GRU}
CELLS = {"RNNCell": L.RNNCell, "LSTMCell": L.LSTMCell, "GRUCell": L.GRUCell}


def _rng(seed=0):
    return np.random.default_rng(seed)


def _randn(shape, seed=0):
    return _rng(seed).standard_normal(shape).astype(np.float32)


def _parity(module, layer, x, hx=None, *, rtol=1e-4, atol=1e-5, **kw):
    """``pl.testing.assert_matches_torch`` with the initial state ``hx`` (``None``, ``h``
    or ``(h, c)``) passed as separate inputs, so its leaves are differentiated too: the
    outputs and final states, and the gradients w.r.t. ``x``, ``hx`` and every parameter
    (and forward mode against reverse mode), equal torch's. One compiled program per
    call (the 8 LSTM flag rows: 7.8 s jitted against 21.9 s run op by op)."""
    hs, tree = jax.tree.flatten(hx)
    return pl.testing.assert_matches_torch(
        layer,
        module,
        x,
        *hs,
        apply=lambda p, x, *hs: layer.apply(p, x, jax.tree.unflatten(tree, hs)),
        torch_call=lambda m, x, *hs: m(x, jax.tree.unflatten(tree, hs)),
        rtol=rtol,
        atol=atol,
        **kw,
    )


def _hx(kind, lead, batched, seed=7, batch=B, hidden=H):
    """A random initial state ``([lead,] [batch,] hidden)`` (an LSTM's ``(h, c)``)."""
    shape = (lead, batch, hidden) if batched else (lead, hidden)
    if lead is None:
        shape = (batch, hidden) if batched else (hidden,)
    h = _randn(shape, seed)
    return (h, _randn(shape, seed + 1)) if kind.startswith("LSTM") else h


# -- cells --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CELLS))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("given_hx", [True, False])
def test_cell_torch_parity(torch, name, bias, batched, given_hx):
    module = getattr(torch.nn, name)(IN, H, bias=bias)
    layer = CELLS[name](H, bias=bias)
    x = _randn((B, IN) if batched else (IN,))
    hx = _hx(name, None, batched) if given_hx else None
    _parity(module, layer, x, hx)


def test_rnn_cell_relu_parity(torch):
    module = torch.nn.RNNCell(IN, H, nonlinearity="relu")
    _parity(module, L.RNNCell(H, nonlinearity="relu"), _randn((B, IN)), _randn((B, H), 3))


@pytest.mark.parametrize("name", list(CELLS))
def test_cell_gradcheck(name):
    layer = CELLS[name](3)
    params = layer.init(jax.random.key(0), (2, 2))
    x = jnp.asarray(_randn((2, 2)))
    hx = _hx(name.replace("Cell", "") + "Cell", None, True)
    hx = jax.tree.map(lambda a: jnp.asarray(a[:2, :3]), hx)
    assert pl.testing.gradcheck(layer.apply, params, x, hx)


def test_gru_reset_before_gradcheck():
    layer = L.GRUCell(3, reset_after=False)
    params = layer.init(jax.random.key(0), (2, 2))
    assert pl.testing.gradcheck(layer.apply, params, jnp.ones((2, 2)), jnp.full((2, 3), 0.3))


# -- sequence layers ------------------------------------------------------------------

FLAGS = [
    (layers, bidi, batch_first, bias, batched, given)
    for layers, bidi, batch_first, bias, batched, given in itertools.product(
        [1, 2], [False, True], [False, True], [True, False], [True, False], [True, False]
    )
    if batched or not batch_first  # batch_first does not apply to unbatched input
]


def _flag_id(f):
    layers, bidi, bf, bias, batched, given = f
    return (
        f"l{layers}{'-bi' if bidi else ''}{'-bf' if bf else ''}{'' if bias else '-nobias'}"
        f"{'' if batched else '-unbatched'}{'-hx' if given else ''}"
    )


def _seq_case(torch, name, flags, **kw):
    layers, bidi, batch_first, bias, batched, given = flags
    module = getattr(torch.nn, name)(
        IN, H, num_layers=layers, bidirectional=bidi, batch_first=batch_first, bias=bias, **kw
    )
    layer = SEQ[name](
        H, num_layers=layers, bidirectional=bidi, batch_first=batch_first, bias=bias, **kw
    )
    shape = ((B, T, IN) if batch_first else (T, B, IN)) if batched else (T, IN)
    hx = _hx(name, layers * (2 if bidi else 1), batched) if given else None
    return _parity(module, layer, _randn(shape), hx)


def _pairwise(flags: list[tuple]) -> list[tuple]:
    """A covering subset of ``flags``: every value of each flag meets every value of each
    other flag in some row, and every (layers, directions, batching) shape appears
    (greedy, deterministic: 8 of the 48 combinations)."""

    def pairs(f):
        return {(i, f[i], j, f[j]) for i in range(len(f)) for j in range(i + 1, len(f))}

    def shape(f):
        return f[0], f[1], f[4]

    need, shapes, chosen = set().union(*map(pairs, flags)), {shape(f) for f in flags}, []
    while need or shapes:
        best = max(flags, key=lambda f: len(pairs(f) & need) + 3 * (shape(f) in shapes))
        chosen.append(best)
        need -= pairs(best)
        shapes.discard(shape(best))
    return chosen


# LSTM, GRU and RNN share one code path; the flags' interactions are pairwise (each
# changes one shape or one data flow), so every pair of flag values is covered, on the
# LSTM. GRU and RNN differ from it only in their cell, which meets every value of every
# flag in two complementary rows: 2 layers, both directions, batch-first, biases, batched,
# given states; and 1 layer, one direction, time-major, no biases, unbatched, zero states.
PAIRWISE = _pairwise(FLAGS)
EACH_VALUE = [(2, True, True, True, True, True), (1, False, False, False, False, False)]


@pytest.mark.parametrize("flags", PAIRWISE, ids=_flag_id)
def test_lstm_torch_parity_every_pair_of_flags(torch, flags):
    _seq_case(torch, "LSTM", flags)


def test_flag_rows_cover_what_they_claim():
    values = {(i, v) for f in FLAGS for i, v in enumerate(f)}
    assert {(i, v) for f in EACH_VALUE for i, v in enumerate(f)} == values
    assert set(EACH_VALUE) <= set(FLAGS)
    pairs = {(i, f[i], j, f[j]) for f in FLAGS for i in range(6) for j in range(i + 1, 6)}
    assert {
        (i, f[i], j, f[j]) for f in PAIRWISE for i in range(6) for j in range(i + 1, 6)
    } == pairs


@pytest.mark.parametrize("flags", EACH_VALUE, ids=_flag_id)
@pytest.mark.parametrize("name", ["GRU", "RNN"])
def test_gru_rnn_torch_parity(torch, name, flags):
    _seq_case(torch, name, flags)


def test_rnn_relu_parity(torch):
    _seq_case(torch, "RNN", (2, True, False, True, True, True), nonlinearity="relu")


@pytest.mark.parametrize("name", list(SEQ))
def test_state_dict_names_and_order(torch, name):
    module = getattr(torch.nn, name)(IN, H, num_layers=3, bidirectional=True)
    layer = SEQ[name](H, num_layers=3, bidirectional=True)
    params = layer.init(jax.random.key(0), (T, B, IN))
    assert list(pl.params.flatten(params)) == list(module.state_dict())
    for k, v in module.state_dict().items():
        assert params[k].shape == tuple(v.shape), k
    # a key-sorted tree (as jit returns) is listed in torch's order again
    assert list(layer.ordered(dict(sorted(params.items())))) == list(module.state_dict())
    # and our checkpoint loads into torch unchanged
    module.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in params.items()})


def test_cell_names_and_order(torch):
    for name, cls in CELLS.items():
        module = getattr(torch.nn, name)(IN, H)
        params = cls(H).init(jax.random.key(0), (B, IN))
        assert list(params) == list(module.state_dict())
        assert list(cls(H).ordered(dict(sorted(params.items())))) == list(module.state_dict())


def test_two_layer_bidirectional_lstm_gradcheck():
    layer = L.LSTM(2, num_layers=2, bidirectional=True)
    params = layer.init(jax.random.key(0), (3, 2, 2))
    x = jnp.asarray(_randn((3, 2, 2)))
    hx = (jnp.asarray(_randn((4, 2, 2), 1)), jnp.asarray(_randn((4, 2, 2), 2)))
    assert pl.testing.gradcheck(layer.apply, params, x, hx)


KINDS = {"rnn_tanh": "RNN", "rnn_relu": "RNN", "lstm": "LSTM", "gru": "GRU"}  # every Linearized


# every kind stacked, both directions, padded; one plain single-layer run; and, with 32
# steps of a batch of 128 and gate tangents of at least CHUNK_ELEMENTS, a padded Elman
# layer whose tangent loop runs in chunks of two steps (``chunk_steps``; a stacked
# chunked LSTM: ``test_partial_derivatives_skip_zero_tangents``; the chunked LSTM at the
# benchmark's shape: tests/functional/test_recurrent.py)
CHUNKED = (32, 128)
DERIVATIVE_CASES = [
    # a GRU always takes JAX's derivative (``custom_derivative`` is accepted for symmetry),
    # so it has no written-out derivative to compare
    *[
        pytest.param(kind, 2, True, (T, 2), (T, B), 3, id=f"l2-bi-pad-{kind}")
        for kind in KINDS
        if kind != "gru"
    ],
    pytest.param("lstm", 1, False, None, (T, B), 3, id="l1-lstm"),
    pytest.param("rnn_tanh", 1, False, "ragged", CHUNKED, 512, id="chunked-pad-rnn_tanh"),
]


def _runs_in_chunks(layer, shape: tuple[int, int]) -> bool:
    """Whether ``layer``'s gradient at input ``(steps, batch, IN)`` has a loop inside a
    loop, the chunked tangent loop's transpose (read from the traced program)."""
    x = jax.ShapeDtypeStruct((*shape, IN), jnp.float32)
    params = jax.eval_shape(lambda: layer.init(jax.random.key(0), x.shape))
    jaxpr = jax.make_jaxpr(jax.grad(lambda p, x: jnp.sum(layer.apply(p, x)[0])))(params, x)

    def scans(jaxpr, depth):  # the deepest nesting of scans in ``jaxpr``
        deepest = depth
        for eqn in jaxpr.eqns:
            inner = depth + (eqn.primitive.name == "scan")
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                deepest = max(deepest, scans(sub, inner))
        return deepest

    return scans(jaxpr.jaxpr, 0) >= 2


def test_chunked_cases_run_in_chunks():
    """Chunk sizes worked by hand: the divisor of ``steps`` nearest to ``320 / batch`` in
    ratio, within a factor of two of it. 320 / 128 = 2.5: of 32's divisors 2 and 4, 2
    (ratio 1.25 against 1.6); 320 / 32 = 10: 10 divides 100; 97 is prime: one chunk.
    The chunked cases' layers chunk (gate tangents of at least 2^21 elements: 32 x 128 x
    512), the small ones and a hidden-64 LSTM (2^20) run one loop."""
    from purelayers.functional.recurrent import chunk_steps

    assert chunk_steps(*CHUNKED) == 2
    assert chunk_steps(100, 32) == 10  # the benchmark's LSTM
    assert chunk_steps(97, 32) == 97
    assert _runs_in_chunks(L.LSTM(128), CHUNKED)
    assert _runs_in_chunks(L.LSTM(128, bidirectional=True), CHUNKED)
    assert _runs_in_chunks(L.RNN(512), CHUNKED)
    assert not _runs_in_chunks(L.LSTM(3, num_layers=2, bidirectional=True), (T, B))
    assert not _runs_in_chunks(L.LSTM(64), CHUNKED)
    assert not _runs_in_chunks(L.GRU(256), CHUNKED)  # GRU keeps one loop


@pytest.mark.parametrize(("kind", "layers", "bidi", "lengths", "shape", "hidden"), DERIVATIVE_CASES)
def test_custom_derivative_equals_jax_derivative_of_the_scan(
    kind, layers, bidi, lengths, shape, hidden
):
    """The sequence layers' written-out derivative (``custom_derivative=True``) against
    JAX's own derivative of the same scan (``custom_derivative=False``), in float64: the
    gradient w.r.t. the input, the initial state and every parameter, and a
    Hessian-vector product (forward over reverse), agree to round-off."""
    name, kw = KINDS[kind], {"nonlinearity": kind[4:]} if kind.startswith("rnn") else {}
    make = lambda custom: SEQ[name](  # noqa: E731
        hidden, num_layers=layers, bidirectional=bidi, custom_derivative=custom, **kw
    )
    steps, batch = shape
    if lengths == "ragged":  # every length from 1 to ``steps``, some sequences full
        lengths = np.minimum(np.arange(batch) % (steps + 3) + 1, steps)
    with jax.enable_x64():
        x = jnp.asarray(_randn((steps, batch, IN)), jnp.float64)
        params = make(True).ordered(
            jax.jit(make(True).init, static_argnums=(1, 2))(jax.random.key(0), x.shape, jnp.float64)
        )
        hx = jax.tree.map(
            lambda a: jnp.asarray(a, jnp.float64),
            _hx(name, layers * (2 if bidi else 1), True, batch=batch, hidden=hidden),
        )
        lens = None if lengths is None else jnp.asarray(lengths)
        args = (params, x, hx)
        tangent = jax.tree.map(lambda a: jnp.full_like(a, 0.5), args)

        def results(layer):
            def loss(args):
                leaves = jax.tree.leaves(layer.apply(*args, lengths=lens))  # output, states
                return sum(jnp.sum(jnp.sin(a) * a) for a in leaves)

            grad = jax.grad(loss)(args)
            return grad, jax.jvp(jax.grad(loss), (args,), (tangent,))[1]

        # one compiled program for both derivatives
        written, reference = jax.jit(lambda: (results(make(True)), results(make(False))))()
        assert set(written[0][0]) == set(params)
        for tree in (written, reference):  # the gradients are not trivially zero
            assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(tree))
        pl.testing.assert_tree_allclose(written, reference, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["LSTM", "GRU"])
@pytest.mark.parametrize("custom", [True, False])
def test_bfloat16_bias_gradients_sum_in_float32(name, custom):
    """In bfloat16 a bias gradient is a sum over every step and batch row (32 x 128 =
    4,096 terms here). XLA adds a bfloat16 sum in bfloat16, rounding every partial sum:
    the written-out derivative's bias gradients were 43% off float32's in relative norm
    here (GRU's input bias 45%, under either derivative), against <1% for the weights, whose
    products accumulate in float32. Summed in float32 they are within 2% of the float32
    gradients, like the weights; the loss's cotangent has a large mean (the outputs
    squared, all of one sign), which is what makes rounded partial sums drift."""
    steps, batch, hidden = 32, 128, 64
    layer = SEQ[name](hidden, custom_derivative=custom)
    p32 = layer.init(jax.random.key(0), (steps, batch, IN))
    x32 = jnp.asarray(_randn((steps, batch, IN)), jnp.float32)

    def grads(params, x):
        def loss(params):
            return jnp.sum(layer.apply(params, x)[0].astype(jnp.float32) ** 2)

        return jax.jit(jax.grad(loss))(params)

    ref = grads(p32, x32)
    low = grads(jax.tree.map(lambda a: a.astype(jnp.bfloat16), p32), x32.astype(jnp.bfloat16))
    for k in ref:
        got = np.asarray(low[k], np.float32)
        err = np.linalg.norm(got - np.asarray(ref[k])) / np.linalg.norm(np.asarray(ref[k]))
        assert err < 0.02, (k, err)


@pytest.mark.parametrize("wrt", ["params", "input", "state"])
def test_partial_derivatives_skip_zero_tangents(wrt):
    """Differentiating with respect to one argument only (the weights' tangents, or the
    input's, are then symbolic zeros the written-out derivative leaves out of its
    chunked products): reverse and forward mode against JAX's own derivative of the
    scan, a two-layer LSTM in chunks (32 steps of a batch of 128), float64."""
    steps, batch = CHUNKED
    make = lambda custom: L.LSTM(128, num_layers=2, custom_derivative=custom)  # noqa: E731
    with jax.enable_x64():
        x = jnp.asarray(_randn((steps, batch, IN)), jnp.float64)
        params = make(True).init(jax.random.key(0), x.shape, jnp.float64)
        hx = jax.tree.map(
            lambda a: jnp.asarray(a, jnp.float64), _hx("LSTM", 2, True, batch=batch, hidden=128)
        )
        index = {"params": 0, "input": 1, "state": 2}[wrt]

        def results(layer):
            def loss(arg):
                args = [params, x, hx]
                args[index] = arg
                out, (h, c) = layer.apply(*args)
                return jnp.sum(jnp.sin(out) * out) + jnp.sum(h * c)

            arg = (params, x, hx)[index]
            tangent = jax.tree.map(lambda a: jnp.full_like(a, 0.25), arg)
            return jax.grad(loss)(arg), jax.jvp(loss, (arg,), (tangent,))[1]

        written, reference = jax.jit(lambda: (results(make(True)), results(make(False))))()
        assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(written))
        pl.testing.assert_tree_allclose(written, reference, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("custom", [True, False])
def test_unroll_gives_the_same_results(custom):
    """``unroll`` changes only how the scan is compiled: outputs and gradients agree."""
    x = jnp.asarray(_randn((T, B, IN)))
    base = L.LSTM(H, bidirectional=True, custom_derivative=custom)
    params = base.init(jax.random.key(0), x.shape)
    lengths = jnp.asarray([T, 3])

    def run(layer):
        def loss(p, x):
            return jnp.sum(layer.apply(p, x, lengths=lengths)[0] ** 2)

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)

    expected = run(base)
    for unroll in (2, 3, 8):
        layer = L.LSTM(H, bidirectional=True, custom_derivative=custom, unroll=unroll)
        assert list(layer.init(jax.random.key(0), x.shape)) == list(params)
        pl.testing.assert_tree_allclose(run(layer), expected, rtol=1e-5, atol=1e-6)


def test_default_init_and_overrides():
    """Every tensor U(-1/sqrt(H), 1/sqrt(H)): for H = 64 the bound is 1/8 and the std of
    a uniform on it (1/8)/sqrt(3) = 0.0722."""
    params = L.LSTM(64, num_layers=2).init(jax.random.key(0), (3, 2, 32))
    for name, v in params.items():
        v = np.asarray(v)
        assert np.abs(v).max() <= 1 / 8, name
        if v.size > 4000:
            assert abs(v.std() - 1 / 8 / np.sqrt(3)) < 0.003, name
    assert not np.allclose(params["weight_hh_l0"][:32, :32], params["weight_hh_l1"][:32, :32])
    custom = L.GRU(4, weight_init=pl.init.zeros(), bias_init=pl.init.ones())
    p = custom.init(jax.random.key(0), (3, 2, 5))
    assert not np.any(np.asarray(p["weight_ih_l0"])) and not np.any(np.asarray(p["weight_hh_l0"]))
    assert np.all(np.asarray(p["bias_ih_l0"]) == 1) and np.all(np.asarray(p["bias_hh_l0"]) == 1)


def test_forget_bias():
    for layer, names in [
        (L.LSTMCell(4, forget_bias=1.0), ["bias_ih"]),
        (L.LSTM(4, num_layers=2, bidirectional=True, forget_bias=1.0), None),
    ]:
        params = layer.init(jax.random.key(0), (3, 2, 5) if names is None else (2, 5))
        ih = [k for k in params if k.startswith("bias_ih")]
        assert ih == (names or ih) and len(ih) in (1, 4)
        for k in ih:
            b_ih = np.asarray(params[k])
            b_hh = np.asarray(params[k.replace("_ih", "_hh")])
            np.testing.assert_array_equal(b_ih[4:8], 1.0)
            np.testing.assert_array_equal(b_hh[4:8], 0.0)
            assert not np.any(b_ih[:4] == 1.0) and np.all(np.abs(b_ih[:4]) <= 0.5)
    # the gate it sets: with zero weights and state, f = sigmoid(1) and i = sigmoid(b_i)
    cell = L.LSTMCell(4, forget_bias=1.0, weight_init=pl.init.zeros(), bias_init=pl.init.zeros())
    p = cell.init(jax.random.key(0), (1, 3))
    _, c = cell.apply(p, jnp.ones((1, 3)), (jnp.zeros((1, 4)), jnp.ones((1, 4))))
    # c' = sigmoid(1) * 1 + sigmoid(0) * tanh(0) = sigmoid(1)
    np.testing.assert_allclose(c, np.full((1, 4), 1 / (1 + np.exp(-1.0))), rtol=1e-6)


def _cho_reference(params, x, h):
    """Cho et al. (2014), written out with numpy, one step."""
    sig = lambda a: 1 / (1 + np.exp(-a))  # noqa: E731
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    hs = h.shape[-1]
    gi = x @ p["weight_ih"].T + p["bias_ih"]
    gh = h @ p["weight_hh_rz"].T + p["bias_hh_rz"]
    r = sig(gi[:, :hs] + gh[:, :hs])
    z = sig(gi[:, hs : 2 * hs] + gh[:, hs:])
    n = np.tanh(gi[:, 2 * hs :] + (r * h) @ p["weight_hh_n"].T + p["bias_hh_n"])
    return (1 - z) * n + z * h


@pytest.mark.parametrize("blocks, shape", [(4, (12,)), (4, (2, 3, 8)), (3, (5, 6))])
def test_gate_activations_and_derivatives_match_sigmoid_and_tanh(blocks, shape):
    """One ``tanh`` over all gate blocks (block 2 ``tanh``, the others the sigmoid) equals
    ``jax.nn.sigmoid`` / ``jnp.tanh`` block by block, and ``gate_derivatives`` at its
    output equals their derivatives (``s * (1 - s)``, ``1 - t**2``), in float64 with
    saturated inputs (+-30) among them; the constants broadcast over any leading axes."""
    from purelayers.functional._recurrent_steps import gate_activations, gate_derivatives

    with jax.enable_x64():
        z = jnp.asarray(_rng(3).standard_normal(shape) * 4)
        z = z.at[..., 0].set(30.0).at[..., -1].set(-30.0)
        a = gate_activations(z, (2,), blocks)
        da = gate_derivatives(a, (2,), blocks)
        width = shape[-1] // blocks
        for b in range(blocks):
            cols = slice(b * width, (b + 1) * width)
            f = jnp.tanh if b == 2 else jax.nn.sigmoid
            want, dwant = jax.jvp(f, (z[..., cols],), (jnp.ones_like(z[..., cols]),))
            np.testing.assert_allclose(a[..., cols], want, rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(da[..., cols], dwant, rtol=1e-9, atol=1e-15)


def test_gru_reset_before_matches_hand_written_reference():
    cell = L.GRUCell(H, reset_after=False)
    params = cell.init(jax.random.key(3), (B, IN))
    assert list(params) == [
        "weight_ih",
        "weight_hh_rz",
        "weight_hh_n",
        "bias_ih",
        "bias_hh_rz",
        "bias_hh_n",
    ]
    assert params["weight_hh_rz"].shape == (2 * H, H) and params["weight_hh_n"].shape == (H, H)
    x, h = _randn((B, IN)), _randn((B, H), 1)
    np.testing.assert_allclose(
        cell.apply(params, x, h), _cho_reference(params, x, h), rtol=1e-5, atol=1e-6
    )
    # it is a different recurrence from torch's: same x-side weights, different result
    after = L.GRUCell(H)
    p_after = dict(
        params, weight_hh=jnp.concatenate([params["weight_hh_rz"], params["weight_hh_n"]])
    )
    p_after["bias_hh"] = jnp.concatenate([params["bias_hh_rz"], params["bias_hh_n"]])
    p_after = {k: p_after[k] for k in ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]}
    assert not np.allclose(after.apply(p_after, x, h), cell.apply(params, x, h), atol=1e-4)
    # the sequence layer steps the same cell
    seq = L.GRU(H, reset_after=False, bidirectional=True)
    sp = seq.init(jax.random.key(4), (T, B, IN))
    xs = _randn((T, B, IN), 2)
    out, h_n = jax.jit(seq.apply)(sp, xs)
    fwd = {k[: -len("_l0")]: v for k, v in sp.items() if k.endswith("_l0")}
    rev = {k[: -len("_l0_reverse")]: v for k, v in sp.items() if k.endswith("_reverse")}
    hf, hr, outs_f, outs_r = np.zeros((B, H)), np.zeros((B, H)), [], []
    for t in range(T):
        hf = _cho_reference(fwd, xs[t], hf)
        hr = _cho_reference(rev, xs[T - 1 - t], hr)
        outs_f.append(hf)
        outs_r.insert(0, hr)
    expected = np.concatenate([np.stack(outs_f), np.stack(outs_r)], axis=-1)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_n, np.stack([hf, hr]), rtol=1e-5, atol=1e-6)
    assert pl.testing.gradcheck(lambda p, x: seq.apply(p, x)[0], sp, jnp.asarray(xs[:3]))


# -- padded batches -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["LSTM", "GRU"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_lengths_match_packed_sequences(torch, name, batch_first):
    _packed_parity(torch, name, np.array([5, 2, 4], np.int32), batch_first)


def test_chunked_backward_matches_packed_sequences(torch):
    """An LSTM of hidden 128 over 32 steps of a batch of 128, lengths 1 to 32 across the
    batch: its tangent loop runs in chunks of two steps (``test_chunked_cases_run_in_chunks``)."""
    lengths = np.minimum(np.arange(128) % 35 + 1, 32).astype(np.int32)
    _packed_parity(torch, "LSTM", lengths, False, hidden=128)


def _packed_parity(torch, name, lengths, batch_first, hidden=H):
    bsz, steps = len(lengths), int(lengths.max())
    module = getattr(torch.nn, name)(
        IN, hidden, num_layers=2, bidirectional=True, batch_first=batch_first
    )
    layer = SEQ[name](hidden, num_layers=2, bidirectional=True, batch_first=batch_first)
    shape = (bsz, steps, IN) if batch_first else (steps, bsz, IN)
    rnn = torch.nn.utils.rnn

    def packed(module, xt):
        seqs = rnn.pack_padded_sequence(
            xt, torch.tensor(lengths), batch_first=batch_first, enforce_sorted=False
        )
        out, state = module(seqs)
        return rnn.pad_packed_sequence(out, batch_first=batch_first, total_length=steps)[0], state

    pl.testing.assert_matches_torch(
        layer,
        module,
        _randn(shape),
        apply=lambda p, x: layer.apply(p, x, lengths=jnp.asarray(lengths)),
        torch_call=packed,
        rtol=1e-4,
        atol=1e-5,
    )


def test_lengths_equal_unpadded_runs():
    """Each padded sequence gives exactly what running it alone, unpadded, gives."""
    layer = L.LSTM(H, bidirectional=True)
    params = layer.init(jax.random.key(0), (T, B, IN))
    x = jnp.asarray(_randn((T, 3, IN)))
    sizes = [5, 1, 3]

    @jax.jit  # every run in one program
    def runs(params, x):
        padded = layer.apply(params, x, lengths=jnp.array(sizes))
        alone = [layer.apply(params, x[:n, b]) for b, n in enumerate(sizes)]
        # unbatched input takes a scalar length
        return padded, alone, layer.apply(params, x[:, 2], lengths=jnp.array(3))[0]

    (out, (h, c)), alone, out1 = runs(params, x)
    for b, (n, (seq, (ha, ca))) in enumerate(zip(sizes, alone, strict=True)):
        np.testing.assert_allclose(out[:n, b], seq, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(out[n:, b], 0.0)
        np.testing.assert_allclose(h[:, b], ha, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(c[:, b], ca, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out1, out[:, 2], rtol=1e-5, atol=1e-6)
    # a Python list of lengths, as torch's pack_padded_sequence takes one
    np.testing.assert_array_equal(layer.apply(params, x, lengths=sizes)[0], out)


# -- dropout, dtype, transformations ---------------------------------------------------------


def test_inter_layer_dropout():
    layer = L.GRU(H, num_layers=3, dropout=0.5)
    params = layer.init(jax.random.key(0), (T, B, IN))
    x = jnp.asarray(_randn((T, B, IN)))
    plain = L.GRU(H, num_layers=2)
    pp = plain.init(jax.random.key(0), x.shape)

    @jax.jit  # every run in one program; the keys are inputs, so no run is merged
    def runs(params, pp, x, keys):
        train = [layer.apply(params, x, train=True, key=k)[0] for k in keys]
        evals = [layer.apply(params, x)[0], layer.apply(params, x, train=False, key=None)[0]]
        # no dropout configured: train mode needs no key
        return train, evals, plain.apply(pp, x, train=True)[0], plain.apply(pp, x)[0]

    keys = [jax.random.key(1), jax.random.key(1), jax.random.key(2)]
    (a, b, c), (eval_out, eval_none), plain_train, plain_eval = runs(params, pp, x, keys)
    np.testing.assert_array_equal(eval_none, eval_out)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, eval_out) and not np.allclose(a, c)
    np.testing.assert_array_equal(plain_train, plain_eval)


def test_float64_stays_float64():
    with jax.enable_x64(True):
        layer = L.LSTM(3, bidirectional=True)
        params = layer.init(jax.random.key(0), (4, 2, 2), jnp.float64)
        out, (h, c) = jax.jit(layer.apply)(params, jnp.ones((4, 2, 2), jnp.float64))
        assert out.dtype == h.dtype == c.dtype == jnp.float64


def test_vmap_and_jit_agree_with_eager():
    layer = L.LSTM(H, num_layers=2)
    params = layer.init(jax.random.key(0), (T, IN))
    xs = jnp.asarray(_randn((3, T, IN)))  # three unbatched sequences
    eager = [layer.apply(params, xs[i])[0] for i in range(3)]
    mapped = jax.vmap(lambda x: layer.apply(params, x)[0])(xs)
    jitted = jax.jit(lambda p, x: layer.apply(p, x)[0])(params, xs[0])
    np.testing.assert_allclose(mapped, np.stack(eager), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jitted, eager[0], rtol=1e-5, atol=1e-6)


# -- compilation -----------------------------------------------------------------------------


def _count_eqns(jaxpr) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else [v]:
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    n += _count_eqns(getattr(inner, "jaxpr", inner))
    return n


def test_traces_once_per_length_and_graph_does_not_grow():
    layer = L.LSTM(H, num_layers=2, bidirectional=True)
    params = layer.init(jax.random.key(0), (T, B, IN))
    traces = []

    def loss(p, x):
        traces.append(x.shape)
        return jnp.sum(layer.apply(p, x)[0] ** 2)

    step = jax.jit(jax.value_and_grad(loss))
    for steps in (4, 64):
        for seed in range(2):
            step(params, jnp.asarray(_randn((steps, B, IN), seed)))
    assert traces == [(4, B, IN), (64, B, IN)]
    sizes = [
        _count_eqns(jax.make_jaxpr(jax.value_and_grad(loss))(params, jnp.ones((n, B, IN))).jaxpr)
        for n in (4, 256)
    ]
    assert sizes[0] == sizes[1]


# -- errors ------------------------------------------------------------------------------------


_CUSTOM = "custom_derivative must be True or False,"


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.LSTM(0), r"LSTM: hidden_size must be a positive integer, got 0"),
        (lambda: L.GRU(4, num_layers=0), r"GRU: num_layers must be a positive integer, got 0"),
        (lambda: L.RNN(4, dropout=1.5), r"RNN: dropout must be in \[0, 1\], got 1.5"),
        (lambda: L.RNN(4, nonlinearity="gelu"), r"RNN: nonlinearity must be one of 'tanh', 're"),
        (lambda: L.RNNCell(4, nonlinearity="x"), r"RNNCell: nonlinearity must be one of"),
        (lambda: L.LSTM(4, bidirectional=1), r"LSTM: bidirectional must be True or False, got 1"),
        (lambda: L.GRUCell(4, bias="no"), r"GRUCell: bias must be True or False, got 'no'"),
        (lambda: L.GRU(4, reset_after=None), r"GRU: reset_after must be True or False"),
        (lambda: L.LSTM(4, forget_bias=1.0, bias=False), r"LSTM: forget_bias=1.0 .* needs bias"),
        (lambda: L.LSTMCell(4, forget_bias=float("nan")), r"LSTMCell: forget_bias must be"),
        (lambda: L.LSTM(4, unroll=0), r"^LSTM: unroll must be a positive integer, got 0$"),
        (lambda: L.RNN(4, unroll=True), r"^RNN: unroll must be a positive integer, got True$"),
        (lambda: L.GRU(4, unroll=2.0), r"^GRU: unroll must be a positive integer, got 2\.0$"),
        (lambda: L.LSTM(4, custom_derivative=1), rf"^LSTM: {_CUSTOM} got 1$"),
        (lambda: L.GRU(4, custom_derivative="no"), rf"^GRU: {_CUSTOM} got 'no'$"),
        (lambda: L.RNN(4, custom_derivative=None), rf"^RNN: {_CUSTOM} got None$"),
    ],
)
def test_config_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_dropout_with_one_layer_warns_like_torch():
    with pytest.warns(UserWarning, match="no effect with num_layers=1"):
        L.LSTM(4, dropout=0.5)


def test_shape_errors():
    lstm = L.LSTM(H, num_layers=2, bidirectional=True)
    params = lstm.init(jax.random.key(0), (T, B, IN))
    x = jnp.ones((T, B, IN))
    with pytest.raises(ValueError, match=r"LSTM: input last axis \(input_size\) expected 3, got 5"):
        lstm.apply(params, jnp.ones((T, B, 5)))
    with pytest.raises(ValueError, match=r"LSTM: input rank expected 2 or 3 .*got 4"):
        lstm.apply(params, jnp.ones((1, T, B, IN)))
    good = jnp.zeros((4, B, H))
    with pytest.raises(ValueError, match=r"LSTM: hx expected a pair \(h_0, c_0\), got"):
        lstm.apply(params, x, good)
    with pytest.raises(ValueError, match=r"LSTM: c_0 shape expected \(4, 2, 4\), got \(2, 2, 4\)"):
        lstm.apply(params, x, (good, jnp.zeros((2, B, H))))
    gru = L.GRU(H)
    gp = gru.init(jax.random.key(0), (T, IN))
    with pytest.raises(ValueError, match=r"GRU: h_0 shape expected \(1, 4\), got \(1, 2, 4\)"):
        gru.apply(gp, jnp.ones((T, IN)), jnp.zeros((1, B, H)))
    with pytest.raises(ValueError, match=r"GRU: lengths shape expected \(2,\), got \(3,\)"):
        gru.apply(gp, x, lengths=jnp.array([1, 2, 3]))
    with pytest.raises(ValueError, match=r"GRU: lengths dtype expected an integer dtype"):
        gru.apply(gp, x, lengths=jnp.array([1.0, 2.0]))
    drop = L.RNN(H, num_layers=2, dropout=0.1)
    dp = drop.init(jax.random.key(0), x.shape)
    with pytest.raises(ValueError, match=r"RNN: train=True draws random numbers and needs a PRNG"):
        drop.apply(dp, x, train=True)
    cell = L.LSTMCell(H)
    cp = cell.init(jax.random.key(0), (B, IN))
    with pytest.raises(ValueError, match=r"LSTMCell: hx h shape expected \(2, 4\), got \(2, 3\)"):
        cell.apply(cp, jnp.ones((B, IN)), (jnp.zeros((B, 3)), jnp.zeros((B, H))))
    with pytest.raises(ValueError, match=r"LSTMCell: input rank expected 1 or 2"):
        cell.apply(cp, jnp.ones((1, B, IN)))
    with pytest.raises(ValueError, match=r"Sequential\[0\] GRUCell: input last axis"):
        seq = L.Sequential(L.GRUCell(H))
        seq.apply({"0": L.GRUCell(H).init(jax.random.key(0), (B, IN))}, jnp.ones((B, 7)))


# -- property test ---------------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(
    name=st.sampled_from(list(SEQ)),
    steps=st.integers(1, 6),
    batch=st.integers(1, 3),
    inputs=st.integers(1, 4),
    hidden=st.integers(1, 5),
    layers=st.integers(1, 2),
    bidi=st.booleans(),
    batch_first=st.booleans(),
)
def test_property_forward_matches_torch(
    torch, name, steps, batch, inputs, hidden, layers, bidi, batch_first
):
    module = getattr(torch.nn, name)(
        inputs, hidden, num_layers=layers, bidirectional=bidi, batch_first=batch_first
    )
    layer = SEQ[name](hidden, num_layers=layers, bidirectional=bidi, batch_first=batch_first)
    shape = (batch, steps, inputs) if batch_first else (steps, batch, inputs)
    x = _randn(shape)
    params = _parity(module, layer, x, grads=False)
    out, state = jax.eval_shape(layer.apply, params, x)
    d = 2 if bidi else 1
    assert out.shape == (*shape[:2], d * hidden)
    for j in jax.tree.leaves(state):
        assert j.shape == (layers * d, batch, hidden)


# -- LSTM projections (proj_size) ------------------------------------------------------

P = 2
PROJ = [  # (layers, bidirectional, batch_first, batched, given hx)
    (2, True, False, True, True),
    (2, False, True, True, False),
    (1, True, False, False, True),
]


@pytest.mark.parametrize("flags", PROJ, ids=["l2-bi-hx", "l2-bf", "l1-bi-unbatched-hx"])
def test_lstm_proj_torch_parity(torch, flags):
    """torch's projected LSTM: h (width P) feeds the recurrence, the output and the next
    layer; c keeps width H; h_0 has width P. Outputs, (h_n, c_n) and every gradient."""
    layers, bidi, batch_first, batched, given = flags
    module = torch.nn.LSTM(
        IN, H, num_layers=layers, bidirectional=bidi, batch_first=batch_first, proj_size=P
    )
    layer = L.LSTM(H, num_layers=layers, bidirectional=bidi, batch_first=batch_first, proj_size=P)
    shape = ((B, T, IN) if batch_first else (T, B, IN)) if batched else (T, IN)
    lead = layers * (2 if bidi else 1)
    hx = None
    if given:
        mid = (B,) if batched else ()
        hx = (_randn((lead, *mid, P), 7), _randn((lead, *mid, H), 8))
    with warnings.catch_warnings():  # torch's notice that oneDNN has no projections
        warnings.filterwarnings("ignore", "LSTM with projections", UserWarning)
        params = _parity(module, layer, _randn(shape), hx)
    names = list(pl.params.flatten(layer.ordered(params)))
    assert names == list(module.state_dict())
    assert params["weight_hh_l0"].shape == (4 * H, P) and params["weight_hr_l0"].shape == (P, H)
    if layers == 2:
        assert params["weight_ih_l1"].shape == (4 * H, P * (2 if bidi else 1))


def test_lstm_proj_init_states_and_lengths():
    """weight_hr draws torch's U(-1/sqrt(H), 1/sqrt(H)); h_n has width P, c_n width H;
    padded sequences equal the unpadded runs, as without a projection."""
    lstm = L.LSTM(8, proj_size=3)
    params = lstm.init(jax.random.key(0), (5, 2, 4))
    hr = np.asarray(params["weight_hr_l0"])
    assert hr.shape == (3, 8) and np.abs(hr).max() <= 1 / np.sqrt(8)
    x = _randn((5, 2, 4))
    out, (h, c) = lstm.apply(params, x, lengths=jnp.array([5, 3]))
    assert out.shape == (5, 2, 3) and h.shape == (1, 2, 3) and c.shape == (1, 2, 8)
    short, (h1, c1) = lstm.apply(params, x[:3, 1:])
    np.testing.assert_allclose(out[:3, 1:], short, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h[:, 1:], h1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c[:, 1:], c1, rtol=1e-5, atol=1e-6)
    assert not np.asarray(out[3:, 1]).any()
    with pytest.raises(ValueError, match=r"h_0 shape expected \(1, 2, 3\), got \(1, 2, 8\)"):
        lstm.apply(params, x, (jnp.zeros((1, 2, 8)), jnp.zeros((1, 2, 8))))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: L.LSTM(4, proj_size=4), r"proj_size must be smaller than hidden_size, got "
         r"proj_size=4 with hidden_size=4"),
        (lambda: L.LSTM(4, proj_size=-1), r"proj_size must be an integer >= 0, got -1"),
        (lambda: L.LSTM(4, proj_size=1.5), r"proj_size must be an integer >= 0, got 1.5"),
    ],
)  # fmt: skip
def test_lstm_proj_config_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()
