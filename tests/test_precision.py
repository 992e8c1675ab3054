"""Mixed precision: float32 params, bfloat16 compute, float32 statistics and outputs."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from purelayers import layers as L
from purelayers.precision import Policy, cast_floating, mixed_precision

# bfloat16 keeps 8 significant bits: relative error ~ 2**-8 per rounding.
BF16_TOL = dict(rtol=5e-2, atol=5e-2)


def _gpt_block(d: int = 32, heads: int = 4) -> L.Layer:
    return L.Sequential(
        L.LayerNorm(),
        L.MultiHeadAttention(heads, causal=True),
        L.LayerNorm(),
        L.Linear(4 * d),
        L.GELU(),
        L.Linear(10),
    )


def _setup(model: L.Layer, shape):
    params = model.init(jax.random.key(0), shape)
    x = jax.random.normal(jax.random.key(1), shape)
    return params, x


def test_cast_floating_leaves_integers_and_keys_alone():
    tree = {"w": jnp.ones(3), "ids": jnp.arange(3), "mask": jnp.ones(3, bool), "n": 3}
    out = cast_floating(tree, jnp.bfloat16)
    assert out["w"].dtype == jnp.bfloat16
    assert out["ids"].dtype == jnp.arange(3).dtype
    assert out["mask"].dtype == jnp.bool_
    assert out["n"] == 3


@pytest.mark.parametrize("model,shape", [(_gpt_block(), (2, 8, 32))])
def test_outputs_close_to_float32_and_float32_dtype(model, shape):
    params, x = _setup(model, shape)
    ref = jax.jit(model.apply)(params, x)
    apply = jax.jit(mixed_precision(model.apply))
    out = apply(params, x)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(out, ref, **BF16_TOL)
    # the computation really ran in bfloat16: results differ from float32
    assert not np.allclose(out, ref, rtol=1e-6, atol=1e-6)


def test_compute_dtype_reaches_the_layers():
    seen = []

    def probe(params, x):
        seen.append((params["weight"].dtype, x.dtype))
        return x @ params["weight"].T

    mixed_precision(probe)({"weight": jnp.ones((3, 4))}, jnp.ones((2, 4)))
    assert seen == [(jnp.bfloat16, jnp.bfloat16)]


def test_norm_statistics_in_float32():
    """A row with |mean| >> std: bfloat16 statistics would lose the variance entirely
    (bf16 spacing at 256 is 2), float32 statistics keep it."""
    ln = L.LayerNorm()
    x = jnp.array([[256.0, 258.0, 256.0, 258.0]])
    params = ln.init(jax.random.key(0), x.shape)
    out = mixed_precision(ln.apply)(params, x)
    np.testing.assert_allclose(out, [[-1.0, 1.0, -1.0, 1.0]], atol=1e-2)


def test_gradients_are_float32_and_optax_sees_float32():
    model = _gpt_block()
    params, x = _setup(model, (2, 8, 32))
    labels = jnp.arange(16).reshape(2, 8) % 10
    apply = mixed_precision(model.apply)

    def loss(p):
        return optax.softmax_cross_entropy_with_integer_labels(apply(p, x), labels).mean()

    def loss32(p):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), labels).mean()

    opt = optax.adam(1e-3)

    @jax.jit  # one compiled program: both gradients and an Adam step
    def program(p):
        grads, ref = jax.grad(loss)(p), jax.grad(loss32)(p)
        state = opt.init(p)
        updates, state = opt.update(grads, state, p)
        return grads, ref, optax.apply_updates(p, updates), state

    grads, ref, new, state = program(params)
    assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref), strict=True):
        scale = float(jnp.max(jnp.abs(r))) + 1e-6
        assert float(jnp.max(jnp.abs(g - r))) <= 0.1 * scale
    assert {a.dtype for a in jax.tree.leaves((new, state)) if hasattr(a, "dtype")} <= {
        jnp.dtype(jnp.float32),
        jnp.dtype(jnp.int32),
    }


def test_jit_and_policy_output_dtype():
    lin = L.Linear(3)
    params = lin.init(jax.random.key(0), (2, 4))
    apply = jax.jit(mixed_precision(lin.apply, policy=Policy(output_dtype=jnp.bfloat16)))
    assert apply(params, jnp.ones((2, 4))).dtype == jnp.bfloat16
    assert mixed_precision(lin.apply, jnp.float16)(params, jnp.ones((2, 4))).dtype == jnp.float32


def test_integer_inputs_pass_through():
    def f(params, ids):
        assert jnp.issubdtype(ids.dtype, jnp.integer)
        return params["weight"][ids]

    out = mixed_precision(f)({"weight": jnp.ones((5, 3))}, jnp.array([1, 2]))
    assert out.dtype == jnp.float32 and out.shape == (2, 3)


@pytest.mark.parametrize(
    ("layer", "shapes"),
    [
        (L.Linear(32), [(32, 128, 64)]),
        (L.Conv1d(32, 3, padding=1), [(32, 64, 128)]),
        (L.Conv2d(16, 3, padding=1), [(16, 8, 32, 32)]),
        (L.Bilinear(16), [(32, 128, 8), (32, 128, 12)]),
        (L.PReLU(8), [(32, 8, 512)]),
    ],
    ids=["linear", "conv1d", "conv2d", "bilinear", "prelu"],
)
def test_broadcast_parameter_gradients_sum_in_float32(layer, shapes):
    """A bias's gradient (or a PReLU slope's) is a sum over every broadcast row (4,096
    here; 16,384 for the 2-d convolution and PReLU), and XLA adds a bfloat16 sum in
    bfloat16, rounding each partial sum. The loss ``sum(y + y**2)`` gives the output
    cotangent ``1 + 2y``, of mean ~1 on every row, the case where rounded partial sums
    drift: JAX's own gradient (a bfloat16 broadcast's transpose) was 14% off float32's in
    relative norm for Linear's bias, 13% for Conv1d's, 91% for Conv2d's, 3.5% for
    Bilinear's, 16% for PReLU's slope, while the weights' products, which accumulate in
    float32, are ~0.2% off. The layers broadcast these parameters through float32, and
    their gradients are as close to float32's as the weights' (~0.2%; asserted under 1%).
    """
    params = layer.init(jax.random.key(0), shapes[0] if len(shapes) == 1 else tuple(shapes))
    xs = [jax.random.normal(jax.random.key(i + 1), shape) for i, shape in enumerate(shapes)]

    def grads(apply):
        return jax.jit(jax.grad(lambda p: jnp.sum((lambda y: y + y * y)(apply(p, *xs)))))(params)

    ref, low = grads(layer.apply), grads(mixed_precision(layer.apply))
    for name in ref:
        err = jnp.linalg.norm(low[name] - ref[name]) / jnp.linalg.norm(ref[name])
        assert float(err) < 0.01, (name, float(err))
