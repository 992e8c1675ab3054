"""One contract, every layer: each ``tests/registry.py`` case runs through the same checks.

Checks per case: torch's state_dict names (where a torch equivalent exists), output
shape from ``jax.eval_shape``, finite output, dtype kept for float32 and bfloat16,
``jit`` equals eager, ``vmap`` over an extra batch axis equals the loop, finite
gradients, no recompilation on a second call, and hash/equality by configuration.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L
from tests.registry import CASES, Case

BY_ID = {c.id: c for c in CASES}


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


def example_input(case: Case, dtype, seed: int = 0):
    if case.ids is not None:
        return jax.random.randint(jax.random.key(seed), case.shape, 0, case.ids)
    return jax.random.normal(jax.random.key(seed), case.shape, dtype)


class Runner:
    """``case``'s layer with params (and state), applied in eval mode."""

    def __init__(self, case: Case, dtype=jnp.float32):
        self.layer = case.make()
        # jitted (one compiled program instead of one per random op), which sorts dict
        # keys; ``ordered`` restores torch's order
        init = jax.jit(self.layer.init, static_argnums=(1, 2))
        self.params = self.layer.ordered(init(jax.random.key(0), case.shape, dtype))
        self.state = self.layer.init_state(case.shape, dtype)
        self.case = case

    def __call__(self, params, x):
        if self.state:
            out, _ = self.layer.apply(params, x, state=self.state, **self.case.kwargs)
        else:
            out = self.layer.apply(params, x, **self.case.kwargs)
        return out

    def first(self, params, x):
        return jax.tree.leaves(self(params, x))[0]


@pytest.mark.parametrize("case_id", list(BY_ID))
def test_contract(case_id, torch):
    case = BY_ID[case_id]
    run = Runner(case)
    layer, params, x = run.layer, run.params, example_input(case, jnp.float32)

    # names and order: params and buffers merged, as torch's state_dict lists them
    if case.torch is not None:
        expected = list(case.torch(torch).state_dict())
        assert list(pl.params.flatten(pl.params.merge(params, run.state))) == expected

    # output shape from tracing alone, finite values
    shape = jax.eval_shape(run.first, params, x).shape
    assert shape == case.out_shape
    eager = run(params, x)
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(eager))

    # jit equals eager; a second call with new arrays of the same shapes does not retrace
    traces = []

    def traced(p, v):
        traces.append(1)
        return run(p, v)

    jitted = jax.jit(traced)
    pl.testing.assert_tree_allclose(jitted(params, x), eager, rtol=1e-5, atol=1e-5)
    jitted(jax.tree.map(lambda a: a + 0, params), example_input(case, jnp.float32, seed=1))
    assert len(traces) == 1

    # vmap over an extra leading batch axis equals the loop (both jitted: jit == eager
    # was checked above)
    xs = jnp.stack([x, example_input(case, jnp.float32, seed=2)])
    batched = jax.jit(jax.vmap(run, in_axes=(None, 0)))(params, xs)
    looped = [jitted(params, xs[i]) for i in range(2)]
    for i in range(2):
        pl.testing.assert_tree_allclose(
            jax.tree.map(lambda a, i=i: a[i], batched), looped[i], rtol=1e-5, atol=1e-5
        )

    # gradients w.r.t. params (and a floating input) are finite
    def loss(p, v):
        return sum(jnp.sum(jnp.sin(leaf)) for leaf in jax.tree.leaves(run(p, v)))

    argnums = (0,) if case.ids is not None else (0, 1)
    grads = jax.jit(jax.grad(loss, argnums=argnums))(params, x)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))

    # configuration identity
    assert case.make() == layer and hash(case.make()) == hash(layer)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("case_id", list(BY_ID))
def test_dtype_kept(case_id, dtype):
    case = BY_ID[case_id]
    run = Runner(case, dtype)
    x = example_input(case, dtype)
    out = jax.jit(run)(run.params, x)
    for leaf in jax.tree.leaves(out):
        assert leaf.dtype == dtype, f"{case_id}: {leaf.dtype} output for {dtype.__name__} input"
    assert all(
        bool(jnp.all(jnp.isfinite(leaf.astype(jnp.float32)))) for leaf in jax.tree.leaves(out)
    )
    assert all(p.dtype == dtype for p in jax.tree.leaves(run.params)), "params follow init's dtype"


def test_registry_inputs_are_meaningful():
    assert len(CASES) >= len(public_layer_classes())
    assert np.unique([c.id for c in CASES]).size == len(CASES)
