"""The table checks, every ``tests/registry.py`` case through each.

- ``test_contract``: torch's ``state_dict`` names, the declared output shape,
  finite output, float32 kept, ``init`` traced under ``jit`` at float32 and bfloat16
  (params follow the dtype) and run eagerly, ``jit`` equals eager, ``vmap`` over an extra
  batch axis equals the eager loop, finite gradients, no retrace on a second call, hash
  and equality by configuration; outputs and their dtype from bfloat16 params and input.
  One compiled program (gradients with the output, the vmapped forward, the bfloat16
  forward); the eager runs compile op by op, programs shared between layers.
- ``test_matches_torch``: ``pl.testing.assert_matches_torch`` against the randomized
  torch twin: outputs, reverse-mode gradients w.r.t. input and every parameter by name,
  forward mode against reverse mode; one compiled program.
- ``test_gradcheck``: ``pl.testing.gradcheck`` in float64 at the case's small shape,
  params drawn at random; one compiled program.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L
from tests import twins
from tests.registry import CASES, Case

BY_ID = {c.id: c for c in CASES}
PARITY = [c.id for c in CASES if c.torch is not None]
GRADCHECK = [c.id for c in CASES if c.grad_shape is not None]


def public_layer_classes() -> list[type]:
    classes = []
    for name in L.__all__:
        obj = getattr(L, name)
        if inspect.isclass(obj) and issubclass(obj, L.Layer) and obj is not L.Layer:
            classes.append(obj)
    return classes


def test_every_public_layer_is_registered():
    covered = {type(c.make()) for c in CASES}
    missing = [cls.__name__ for cls in public_layer_classes() if cls not in covered]
    assert not missing, f"add these layers to tests/registry.py: {missing}"


def test_every_case_is_checked_against_torch_and_gradchecked_or_says_why():
    assert len(CASES) >= len(public_layer_classes())
    assert np.unique([c.id for c in CASES]).size == len(CASES)
    no_twin = [c.id for c in CASES if c.torch is None]
    assert not no_twin, (
        f"give these cases a torch twin (torch.nn's class, or one built beside the row): {no_twin}"
    )
    for c in CASES:
        if isinstance(c.gradcheck, str):
            assert c.gradcheck.strip(), f"{c.id}: say why it is not gradchecked"


def _host_input(case: Case, dtype, seed: int = 0, shape=None) -> np.ndarray:
    """Standard normal (or ids below ``case.ids``) of ``case.shape``, drawn by numpy."""
    shape = case.shape if shape is None else shape
    rng = np.random.default_rng(seed)
    if case.ids is not None:
        return rng.integers(0, case.ids, shape).astype(np.int32)
    return rng.standard_normal(shape).astype(dtype)


def example_inputs(case: Case, dtype, seed: int = 0) -> tuple:
    """``example_input`` and, for a layer of several inputs, standard normal ``extra``
    inputs (seeded apart from the first), as numpy arrays: every check on the host, so
    the only programs compiled are the ones under test."""
    rng = np.random.default_rng([seed, 1])
    if case.extra_x is not None:
        extra = tuple(
            a.astype(dtype if np.issubdtype(a.dtype, np.floating) else np.int32)
            for a in case.extra_x()
        )
    else:
        extra = tuple(rng.standard_normal(s).astype(dtype) for s in case.extra)
    return (_host_input(case, dtype, seed), *extra)


def _finite(leaf) -> bool:
    return bool(np.isfinite(np.asarray(leaf, np.float32)).all())


def _floating(tree) -> list:
    """The floating-point output leaves (a max pool's indices are integers)."""
    return [leaf for leaf in jax.tree.leaves(tree) if jnp.issubdtype(leaf.dtype, jnp.floating)]


def _apply(layer: L.Layer, case: Case, state):
    def run(params, *xs):
        if state:
            out, _ = layer.apply(params, *xs, state=state, **case.kwargs)
            return out
        return layer.apply(params, *xs, **case.kwargs)

    return run


@pytest.mark.parametrize("case_id", list(BY_ID))
def test_contract(case_id, torch):
    case = BY_ID[case_id]
    layer = case.make()
    init_arg = case.init_arg()
    state = layer.init_state(init_arg, jnp.float32)
    run = _apply(layer, case, state)
    run16 = _apply(layer, case, layer.init_state(init_arg, jnp.bfloat16))
    host = example_inputs(case, np.float32)
    host2 = example_inputs(case, np.float32, seed=2)
    # host arrays placed on the device as they are (``jnp.asarray`` would compile a copy)
    x = jax.device_put(host)
    xs = jax.device_put(tuple(np.stack(a) for a in zip(host, host2, strict=True)))
    x16 = jax.device_put(example_inputs(case, jnp.bfloat16, seed=3))
    floating = [i + 1 for i, v in enumerate(x) if jnp.issubdtype(v.dtype, jnp.floating)]
    argnums = (0, *floating)

    def loss(p, *v):
        out = run(p, *v)
        return sum(jnp.sum(jnp.sin(leaf)) for leaf in _floating(out)), out

    # init traces under jit at both dtypes (abstractly: the same trace jit makes, nothing
    # to compile) and runs eagerly, op by op (those programs are shared between layers)
    key = jax.random.key(0)
    for dtype in (jnp.float32, jnp.bfloat16):
        spec = jax.eval_shape(jax.jit(lambda k, d=dtype: layer.init(k, init_arg, d)), key)
        assert all(a.dtype == dtype for a in jax.tree.leaves(spec)), "params follow dtype"
    params = layer.init(key, init_arg, jnp.float32)
    traces = []

    @jax.jit
    def program(params, x, xs, x16):
        traces.append(1)
        grads, out = jax.grad(loss, argnums, has_aux=True)(params, *x)
        batched = jax.vmap(run, in_axes=(None, *[0] * len(xs)))(params, *xs)
        params16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
        return out, batched, grads, run16(params16, *x16)

    out, batched, grads, out16 = program(params, x, xs, x16)
    params = layer.ordered(params)

    # names and order: params and buffers merged, as torch's state_dict lists them (a
    # tied alias is stored once, under its original)
    if case.torch is not None:
        aliases = layer.aliases()
        expected = [k for k in case.torch(torch).state_dict() if k not in aliases]
        assert list(pl.params.flatten(pl.params.merge(params, state))) == expected

    # the declared output shape (the traced one: jit compiles from the trace); finite
    # float32 values
    assert jax.tree.leaves(out)[0].shape == case.out_shape
    for leaf in _floating(out):
        assert leaf.dtype == jnp.float32, f"{case_id}: {leaf.dtype} output for float32 input"
        assert _finite(leaf)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))

    # jit equals eager (the second input's eager run reuses the first's op programs)
    pl.testing.assert_tree_allclose(out, run(params, *x), rtol=1e-5, atol=1e-5)
    second = run(params, *jax.device_put(host2))

    # vmap over an extra leading batch axis equals the loop
    for i, one in enumerate((out, second)):
        pl.testing.assert_tree_allclose(
            jax.tree.map(lambda a, i=i: np.asarray(a)[i], batched), one, rtol=1e-5, atol=1e-5
        )

    # gradients w.r.t. params (and a floating input) are finite
    assert all(_finite(g) for g in jax.tree.leaves(grads))

    # a second call with new arrays of the same shapes does not retrace
    again = jax.device_put(jax.tree.map(np.array, (params, xs, x16)))
    program(again[0], jax.device_put(example_inputs(case, np.float32, 1)), *again[1:])
    assert len(traces) == 1

    # bfloat16 params and input: outputs and their dtype stay bfloat16
    for leaf in _floating(out16):
        assert leaf.dtype == jnp.bfloat16, f"{case_id}: {leaf.dtype} output for bfloat16 input"
        assert _finite(leaf)

    # configuration identity
    assert case.make() == layer and hash(case.make()) == hash(layer)


@pytest.mark.parametrize("case_id", PARITY)
def test_matches_torch(case_id, torch):
    case = BY_ID[case_id]
    module = twins.randomize(torch, case.torch(torch))
    rng = np.random.default_rng(0)
    if case.x is not None:
        x = case.x()
    elif case.ids is not None:
        x = rng.integers(0, case.ids, case.shape)
    else:
        x = rng.standard_normal(case.shape).astype(np.float32)
    extra = (
        list(case.extra_x())
        if case.extra_x is not None
        else [rng.standard_normal(s).astype(np.float32) for s in case.extra]
    )
    pl.testing.assert_matches_torch(
        case.make(), module, x, *extra, init_shape=case.init_arg(), torch_call=case.torch_call,
        rtol=case.rtol, atol=case.atol, **case.kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("case_id", GRADCHECK)
def test_gradcheck(case_id):
    case = BY_ID[case_id]
    layer = case.make()
    shapes = case.grad_shapes
    init_arg = case.init_arg(shapes)
    rng = np.random.default_rng(0)
    # random params of the declared shapes (nothing to compile for an init)
    template = jax.eval_shape(lambda k: layer.init(k, init_arg, jnp.float32), jax.random.key(0))
    params = jax.tree.map(lambda a: 0.5 * rng.standard_normal(a.shape), template)
    first = shapes[0]
    x = rng.integers(0, case.ids, first) if case.ids is not None else rng.standard_normal(first)
    given = case.extra_x() if case.extra_x is not None else None
    xs = (x, *(rng.standard_normal(s) for s in shapes[1:])) if given is None else (x, *given)
    state = layer.init_state(init_arg, jnp.float32)
    if not state:
        assert pl.testing.gradcheck(_apply(layer, case, state), params, *xs)
        return
    # buffers (running statistics, in eval mode) are differentiated too: float64 as well

    def with_state(p, s, *v):
        return layer.apply(p, *v, state=s, **case.kwargs)[0]

    assert pl.testing.gradcheck(with_state, params, state, *xs)
