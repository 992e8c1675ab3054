"""The layer contract and containers: Sequential, Identity, Lambda, Flatten, composites."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L
from tests.composites import Residual
from tests.twins import load_from_torch


def mlp():
    return L.Sequential(L.Linear(256), L.ReLU(), L.Dropout(0.1), L.Linear(10))


def test_design_example_names_and_shapes():
    params = mlp().init(jax.random.key(0), (32, 784))
    flat = pl.params.flatten(params)
    assert {k: v.shape for k, v in flat.items()} == {
        "0.weight": (256, 784),
        "0.bias": (256,),
        "3.weight": (10, 256),
        "3.bias": (10,),
    }
    assert list(flat) == ["0.weight", "0.bias", "3.weight", "3.bias"]


def test_torch_mlp_parity(torch):
    module = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(256, 10)
    ).eval()
    model = mlp()
    params = load_from_torch(model, module, (4, 784))  # names and order equal torch's
    assert list(pl.params.flatten(params)) == list(module.state_dict())
    x = np.random.default_rng(0).standard_normal((4, 784)).astype(np.float32)
    pl.testing.assert_matches_torch(model, module, x, params=params, rtol=1e-5, atol=1e-5)


def test_parameter_free_layers_do_not_shift_weights():
    key = jax.random.key(7)
    plain = L.Sequential(L.Linear(8), L.Linear(4)).init(key, (2, 3))
    padded = L.Sequential(L.Linear(8), L.ReLU(), L.Dropout(0.5), L.Linear(4), L.Tanh()).init(
        key, (2, 3)
    )
    np.testing.assert_array_equal(plain["0"]["weight"], padded["0"]["weight"])
    np.testing.assert_array_equal(plain["1"]["weight"], padded["3"]["weight"])
    np.testing.assert_array_equal(plain["1"]["bias"], padded["3"]["bias"])


def test_children_get_distinct_keys():
    params = L.Sequential(L.Linear(4), L.Linear(4)).init(jax.random.key(0), (1, 4))
    assert not jnp.array_equal(params["0"]["weight"], params["1"]["weight"])


def test_train_threads_key_to_dropout():
    model = L.Sequential(L.Linear(64), L.Dropout(0.5))
    params = model.init(jax.random.key(0), (8, 16))
    x = jnp.ones((8, 16))
    eval_out = model.apply(params, x)
    a = model.apply(params, x, train=True, key=jax.random.key(1))
    b = model.apply(params, x, train=True, key=jax.random.key(1))
    c = model.apply(params, x, train=True, key=jax.random.key(2))
    np.testing.assert_array_equal(a, b)
    assert not jnp.array_equal(a, c)
    zeroed = np.asarray(a) == 0
    assert 0.3 < zeroed.mean() < 0.7
    np.testing.assert_allclose(np.asarray(a)[~zeroed], 2 * np.asarray(eval_out)[~zeroed], rtol=1e-6)
    with pytest.raises(
        ValueError, match=r"Sequential\[1\] Dropout: train=True .* needs a PRNG key"
    ):
        model.apply(params, x, train=True)


def test_error_names_the_child_path():
    model = L.Sequential(L.Linear(8), L.ReLU(), L.Sequential(L.Linear(4), L.Linear(2)))
    params = model.init(jax.random.key(0), (3, 5))
    with pytest.raises(
        ValueError, match=r"^Sequential\[0\] Linear: input last axis expected 5, got 6"
    ):
        model.apply(params, jnp.ones((3, 6)))
    bad = dict(params)
    bad["2"] = {"0": params["2"]["0"], "1": {"weight": jnp.ones((2, 3)), "bias": jnp.ones(2)}}
    with pytest.raises(
        ValueError, match=r"^Sequential\[2\.1\] Linear: input last axis expected 3, got 4"
    ):
        model.apply(bad, jnp.ones((3, 5)))


def test_sequential_rejects_non_layers():
    with pytest.raises(
        ValueError, match=r"Sequential: layers\[1\] must be a Layer, got .*Lambda\(fn\)"
    ):
        L.Sequential(L.Linear(2), jnp.tanh)


def test_jit_grad_vmap_match_eager():
    model = L.Sequential(L.Linear(16), L.GELU(), L.Linear(3))
    params = model.init(jax.random.key(0), (5, 4))
    x = jax.random.normal(jax.random.key(1), (5, 4))
    eager = model.apply(params, x)
    np.testing.assert_allclose(jax.jit(model.apply)(params, x), eager, rtol=1e-6, atol=1e-6)

    def loss(p, x):
        return jnp.mean(model.apply(p, x) ** 2)

    g_eager = jax.grad(loss)(params, x)
    g_jit = jax.jit(jax.grad(loss))(params, x)
    pl.testing.assert_tree_allclose(g_jit, g_eager, rtol=1e-5, atol=1e-6)
    per_example = jax.vmap(model.apply, in_axes=(None, 0))(params, x)
    np.testing.assert_allclose(per_example, eager, rtol=1e-6, atol=1e-6)
    ckpt = jax.checkpoint(model.apply)(params, x)
    np.testing.assert_allclose(ckpt, eager, rtol=1e-6, atol=1e-6)


def test_scan_over_layer():
    cell = L.Sequential(L.Linear(4), L.Tanh())
    params = cell.init(jax.random.key(0), (2, 4))
    xs = jax.random.normal(jax.random.key(1), (6, 2, 4))

    def step(h, x):
        h = cell.apply(params, h + x)
        return h, h

    _, hs = jax.lax.scan(step, jnp.zeros((2, 4)), xs)
    h = jnp.zeros((2, 4))
    for t in range(6):
        h = cell.apply(params, h + xs[t])
    np.testing.assert_allclose(hs[-1], h, rtol=1e-5, atol=1e-6)


def test_layers_are_static_args_and_hashable():
    a, b = mlp(), mlp()
    assert a == b and hash(a) == hash(b)
    assert a != L.Sequential(L.Linear(256), L.ReLU(), L.Dropout(0.2), L.Linear(10))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.layers = ()
    traces = []

    def fwd(model, params, x):
        traces.append(1)
        return model.apply(params, x)

    f = jax.jit(fwd, static_argnums=0)
    params = a.init(jax.random.key(0), (2, 784))
    f(a, params, jnp.ones((2, 784)))
    f(b, params, jnp.ones((2, 784)))
    assert len(traces) == 1


def test_init_accepts_example_array_and_jit():
    model = L.Sequential(L.Linear(3))
    by_shape = model.init(jax.random.key(0), (2, 4))
    by_array = model.init(jax.random.key(0), jnp.zeros((2, 4)))
    jitted = jax.jit(model.init, static_argnums=1)(jax.random.key(0), (2, 4))
    pl.testing.assert_tree_allclose(by_array, by_shape, rtol=0, atol=0)
    pl.testing.assert_tree_allclose(jitted, by_shape, rtol=1e-6, atol=1e-7)


@dataclasses.dataclass(frozen=True)
class _PositionTable(L.Layer):
    """A user's layer as DESIGN writes one: ``x + pos_emb[:seq]``, its width read as
    ``shape[-1]``."""

    def own_names(self):
        return ("pos_emb",)

    def init(self, key, shape, dtype=jnp.float32):
        return {"pos_emb": jax.random.normal(key, (16, shape[-1]), dtype)}

    def apply(self, params, x, *, key=None, train=False):
        return x + params["pos_emb"][None, : x.shape[-2]]


def test_a_users_layer_gets_a_shape_however_it_is_reached():
    """Directly, from an example array, inside ``Sequential`` and inside ``Repeat``, a
    user's ``init`` sees the input shape as a tuple of ints (``shape[-1]`` the width)."""
    key = jax.random.key(0)
    layer = _PositionTable()
    assert layer.init(key, (2, 4, 6))["pos_emb"].shape == (16, 6)
    assert layer.init(key, jnp.zeros((2, 4, 6)))["pos_emb"].shape == (16, 6)
    model = L.Sequential(L.Linear(6), layer)
    params = model.init(key, (2, 4, 5))
    assert list(pl.params.flatten(params)) == ["0.weight", "0.bias", "1.pos_emb"]
    x = jnp.ones((2, 4, 5))
    want = L.Linear(6).apply(params["0"], x) + params["1"]["pos_emb"][None, :4]
    np.testing.assert_allclose(model.apply(params, x), want, rtol=1e-6)
    stack = L.Repeat(layer, 3)
    params = stack.init(key, (2, 4, 6))
    assert pl.params.flatten(params)["2.pos_emb"].shape == (16, 6)
    x = jnp.zeros((2, 4, 6))
    want = sum(pl.params.flatten(params)[f"{i}.pos_emb"][None, :4] for i in range(3))
    np.testing.assert_allclose(stack.apply(params, x), jnp.broadcast_to(want, x.shape), rtol=1e-6)


def test_an_initializer_of_the_wrong_type_is_a_value_and_a_type_error():
    """Bad hyperparameters are ``ValueError``s; a wrong type is also a ``TypeError``."""
    for bad in ("zeros", 0.5, pl.init.zeros):
        with pytest.raises(ValueError, match="weight_init must be an initializer") as err:
            L.Linear(3, weight_init=bad)
        assert isinstance(err.value, TypeError)


def test_every_bool_field_takes_only_true_or_false():
    """A field declared ``bool`` refuses a string or a number at construction (``"False"``
    would be true), in the library's layers and in a user's subclass alike; the error is
    a ``ValueError`` (for a field no layer checks itself, also a ``TypeError``)."""

    @dataclasses.dataclass(frozen=True)
    class Gate(L.Layer):
        open: bool = True

        def apply(self, params, x, *, key=None, train=False):
            return x if self.open else jnp.zeros_like(x)

    cases = [
        (lambda: L.MultiHeadAttention(2, causal="yes"), "MultiHeadAttention: causal"),
        (lambda: L.TransformerEncoderLayer(4, norm_first=1), "TransformerEncoderLayer: norm_first"),
        (lambda: L.Embedding(3, 2, scale_grad_by_freq=None), "Embedding: scale_grad_by_freq"),
        (lambda: Gate(open="False"), "Gate: open"),
    ]
    for make, where in cases:
        with pytest.raises(ValueError, match=f"^{where} must be True or False, got "):
            make()
    with pytest.raises(TypeError, match=r"^Gate: open must be True or False, got 'False'$"):
        Gate(open="False")
    assert Gate(open=False).apply({}, jnp.ones(2)).tolist() == [0.0, 0.0]


def test_ordered_restores_torch_order_after_jit():
    model = L.Sequential(*[L.Linear(2) for _ in range(12)])
    params = model.init(jax.random.key(0), (1, 2))
    sorted_tree = jax.jit(lambda p: p)(params)
    assert list(sorted_tree)[:3] == ["0", "1", "10"]  # JAX sorts keys as strings
    names = list(pl.params.flatten(model.ordered(sorted_tree)))
    assert names == list(pl.params.flatten(params))
    assert names[:4] == ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_identity_lambda_flatten(torch):
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    assert L.Identity().apply({}, x) is x
    np.testing.assert_allclose(L.Lambda(jnp.tanh).apply({}, x), np.tanh(x), rtol=1e-6)
    for start, end in [(1, -1), (0, -1), (1, 2), (2, 3), (-2, -1)]:
        expected = torch.nn.Flatten(start, end)(torch.tensor(x)).numpy()
        np.testing.assert_array_equal(L.Flatten(start, end).apply({}, x), expected)
    with pytest.raises(ValueError, match=r"Flatten: start_dim=3 and end_dim=1 must name axes"):
        L.Flatten(3, 1).apply({}, x)
    with pytest.raises(ValueError, match="Lambda: fn must be callable"):
        L.Lambda(3)


def test_custom_composite(torch):
    block = Residual(L.Tanh(), L.Sequential(L.Linear(8), L.ReLU(), L.Linear(4)))
    model = L.Sequential(L.Linear(4), block, L.Linear(2))
    params = model.init(jax.random.key(0), (3, 5))
    assert list(pl.params.flatten(params)) == [
        "0.weight", "0.bias", "1.body.0.weight", "1.body.0.bias", "1.body.2.weight",
        "1.body.2.bias", "2.weight", "2.bias",
    ]  # fmt: skip

    class TorchResidual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.Tanh()
            self.body = torch.nn.Sequential(
                torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)
            )

        def forward(self, x):
            return x + self.body(self.norm(x))

    module = torch.nn.Sequential(torch.nn.Linear(5, 4), TorchResidual(), torch.nn.Linear(4, 2))
    params = load_from_torch(model, module, (3, 5))
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    pl.testing.assert_matches_torch(model, module, x, params=params)
    with pytest.raises(ValueError, match=r"^Sequential\[1\.body\.0\] Linear: input last axis"):
        bad = dict(params)
        bad["1"] = {"body": {**params["1"]["body"], "0": {"weight": jnp.ones((8, 3))}}}
        model.apply(bad, jnp.asarray(x))
    assert pl.testing.gradcheck(model.apply, params, jnp.asarray(x))


def test_sequential_indexing_by_position_name_and_slice():
    seq = L.Sequential({"fc": L.Linear(4), "act": L.ReLU(), "out": L.Linear(2)})
    assert seq[0] == seq["fc"] == L.Linear(4) and len(seq) == 3
    tail = seq[1:]  # keeps the children's names, as torch's slicing does
    assert tail.names == ("act", "out") and tail["out"] == L.Linear(2)
    numbered = L.Sequential(L.Linear(4), L.ReLU(), L.Linear(2))[1:]
    assert numbered.names == ("1", "2")
    params = tail.init(jax.random.key(0), (3, 4))
    assert list(pl.params.flatten(params)) == ["out.weight", "out.bias"]


def test_host_arrays_are_placed_without_compiling_a_copy():
    """A NumPy array handed to an eager call is placed on the device as it is: no
    ``jit(stage)`` copy program is compiled for it (``jnp.asarray`` of a NumPy array
    compiles one per new shape). ``as_array`` returns JAX arrays and tracers unchanged and
    keeps a Python scalar weakly typed; the layers that take host ids or inputs
    (``Embedding``, a batched convolution input, ``scaled_dot_product_attention``)
    compile only their own ops."""
    from purelayers.layers._checks import as_array

    compiled: list[str] = []

    def listen(event, duration, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(kw.get("fun_name"))

    rng = np.random.default_rng(0)
    emb = L.Embedding(50, 4)
    conv = L.Conv1d(3, 2)
    emb_params = emb.init(jax.random.key(0), (2, 3))
    conv_params = conv.init(jax.random.key(1), (2, 4, 9))
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        placed = as_array(rng.standard_normal((3, 13)).astype(np.float32))
        ids = emb.apply(emb_params, rng.integers(0, 50, (3, 17)))
        y = conv.apply(conv_params, rng.standard_normal((2, 4, 19)).astype(np.float32))
        q = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
        att = L.scaled_dot_product_attention(q, q, q)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert compiled, "the layers' own ops compile"
    assert "jit(stage)" not in compiled, compiled
    assert placed.shape == (3, 13) and placed.dtype == jnp.float32
    assert ids.shape == (3, 17, 4) and y.shape == (2, 3, 18) and att.shape == q.shape
    already = jnp.ones(3)
    assert as_array(already) is already
    jax.jit(lambda a: as_array(a) * 2)(already)  # a tracer passes through
    assert as_array(2.0).weak_type and as_array([1, 2]).dtype == jnp.int32
