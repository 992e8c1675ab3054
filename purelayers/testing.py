"""Testing helpers: ``gradcheck`` and tree comparisons by checkpoint name."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from purelayers.params import _to_numpy, flatten

__all__ = ["assert_tree_allclose", "gradcheck"]


def _is_float(x: Any) -> bool:
    return (hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)) or isinstance(x, float)


def _leaf_name(path: Sequence[Any]) -> str:
    """``"0.weight (argument 0)"`` for the key path of a leaf inside ``args``."""
    arg = path[0].idx
    rest = ".".join(
        str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path[1:]
    )
    return f"{rest} (argument {arg})" if rest else f"argument {arg}"


def gradcheck(
    fn: Callable[..., Any],
    *args: Any,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    batch_size: int = 64,
) -> bool:
    """Check ``fn``'s derivatives against central finite differences, in float64.

    Like ``torch.autograd.gradcheck`` for any function of pytrees: every floating-point
    leaf of ``args`` is cast to float64 and perturbed entry by entry by ``+-eps``; the
    full Jacobian of every floating-point output leaf is computed three ways (reverse
    mode, forward mode, finite differences) and each analytic entry ``a`` must satisfy
    ``|a - n| <= atol + rtol * |n|`` against the numerical ``n``. Integer leaves (ids,
    PRNG keys) pass through unchanged.

    Returns ``True``; raises ``AssertionError`` naming the worst leaf by its dotted path
    (``"0.weight (argument 0)"``), the entry, and the analytic and numerical values.

    Example:
      >>> gradcheck(layer.apply, params, x)
      True
    """
    with jax.enable_x64(True):
        args64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64) if _is_float(a) else a, args)
        leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(args64)
        leaves = [leaf for _, leaf in leaves_with_path]
        slots = [i for i, leaf in enumerate(leaves) if _is_float(leaf)]
        if not slots:
            raise ValueError("gradcheck: no floating-point leaf in args to differentiate")
        xs = [leaves[i] for i in slots]
        flat, unravel = ravel_pytree(xs)

        def f(v):
            full = list(leaves)
            for i, x in zip(slots, unravel(v), strict=True):
                full[i] = x
            out = fn(*jax.tree.unflatten(treedef, full))
            outs = [jnp.ravel(o) for o in jax.tree.leaves(out) if _is_float(o)]
            if not outs:
                raise ValueError("gradcheck: fn returned no floating-point output")
            return jnp.concatenate(outs)

        # One compiled function per method over all inputs at once.
        jacobians = {
            "reverse-mode": np.asarray(jax.jit(jax.jacrev(f))(flat)),
            "forward-mode": np.asarray(jax.jit(jax.jacfwd(f))(flat)),
        }
        numerical = _finite_differences(f, flat, eps, batch_size)
        bounds = np.cumsum([0] + [int(np.size(x)) for x in xs])
        worst = None
        for mode, jac in jacobians.items():
            excess = np.abs(jac - numerical) - (atol + rtol * np.abs(numerical))
            if excess.size == 0 or excess.max() <= 0:
                continue
            out_i, in_i = np.unravel_index(int(np.argmax(excess)), excess.shape)
            if worst is not None and excess[out_i, in_i] <= worst[0]:
                continue
            n = int(np.searchsorted(bounds, in_i, side="right")) - 1
            local = int(in_i - bounds[n])
            worst = (
                float(excess[out_i, in_i]),
                _leaf_name(leaves_with_path[slots[n]][0]),
                mode,
                int(out_i),
                np.unravel_index(local, np.shape(xs[n])) if np.ndim(xs[n]) else (),
                float(jac[out_i, in_i]),
                float(numerical[out_i, in_i]),
            )
    if worst is not None:
        _, name, mode, out_i, in_i, a, num = worst
        raise AssertionError(
            f"gradcheck: the {mode} derivative with respect to {name} disagrees with central "
            f"finite differences at input index {tuple(int(i) for i in in_i)}, output "
            f"element {out_i}: analytic {a:.10g}, numerical {num:.10g} "
            f"(|diff| {abs(a - num):.3g} > atol {atol:g} + rtol {rtol:g} * |numerical|)"
        )
    return True


def _finite_differences(f, flat, eps, batch_size) -> np.ndarray:
    """``(outputs, inputs)`` Jacobian of ``f`` at ``flat`` by central differences."""

    @jax.jit
    def columns(flat):
        def column(j):
            step = jnp.zeros_like(flat).at[j].set(eps)
            return (f(flat + step) - f(flat - step)) / (2 * eps)

        return jax.lax.map(column, jnp.arange(flat.size), batch_size=min(batch_size, flat.size))

    return np.asarray(columns(flat)).T


def assert_tree_allclose(
    actual: Any, expected: Any, *, rtol: float = 1e-5, atol: float = 1e-6, what: str = "tree"
) -> None:
    """Both trees hold the same dotted names, and each pair of arrays is close.

    Values may be numpy, JAX arrays or torch tensors (compared as float64 on the host).
    The message names every mismatching leaf with its largest absolute error.
    """
    a, e = flatten(actual), flatten(expected)
    if list(a) != list(e) and sorted(a) != sorted(e):
        raise AssertionError(f"{what}: names differ: {sorted(a)} vs {sorted(e)}")
    bad = []
    for name in a:
        x = np.asarray(_to_numpy(a[name]), np.float64)
        y = np.asarray(_to_numpy(e[name]), np.float64)
        if x.shape != y.shape:
            bad.append(f"{name or '<root>'}: shape {x.shape} vs {y.shape}")
        elif not np.allclose(x, y, rtol=rtol, atol=atol):
            bad.append(f"{name or '<root>'}: max |diff| {np.max(np.abs(x - y)):.3g}")
    if bad:
        raise AssertionError(f"{what} differs (rtol={rtol}, atol={atol}): " + "; ".join(bad))
