"""Fast path == reference: values, reverse-mode and forward-mode first derivatives."""

import jax
import jax.numpy as jnp
import numpy as np


def assert_same_function(fast, reference, *args, rtol=1e-5, atol=1e-5, seed=0):
    """``fast(*args)`` equals ``reference(*args)`` with its gradient of a random linear
    loss and its JVP along random tangents, all in one jitted program."""
    keys = jax.random.split(jax.random.key(seed), 2)
    out = jax.eval_shape(reference, *args)
    leaves, tree = jax.tree.flatten(out)
    cts = [
        jax.random.normal(k, o.shape, o.dtype)
        for k, o in zip(jax.random.split(keys[0], len(leaves)), leaves, strict=True)
    ]
    ct = jax.tree.unflatten(tree, cts)
    tangents = tuple(
        jax.random.normal(k, a.shape, a.dtype)
        for k, a in zip(jax.random.split(keys[1], len(args)), args, strict=True)
    )

    @jax.jit
    def both(*args):
        results = []
        for f in (fast, reference):
            y = f(*args)
            grads = jax.grad(
                lambda *a, f=f: sum(
                    jnp.sum(y * c)
                    for y, c in zip(jax.tree.leaves(f(*a)), jax.tree.leaves(ct), strict=True)
                ),
                argnums=tuple(range(len(args))),
            )(*args)
            _, t = jax.jvp(f, args, tangents)
            results.append((y, grads, t))
        return results

    got, want = both(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
