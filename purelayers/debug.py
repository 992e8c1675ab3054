"""Runtime checks for traced code: NaNs and out-of-range ids as errors under ``jax.jit``.

Shape errors are raised while tracing, but values only exist when the compiled code
runs: a NaN from ``log`` of a negative number, or an embedding id past the end of the
table (which ``Embedding`` turns into a row of NaN rather than reading other memory),
pass through ``jit`` silently. ``checked`` compiles the same function with
``jax.experimental.checkify`` checks and raises ``CheckError`` when one fails::

    import purelayers as pl

    apply = pl.debug.checked(model.apply)        # jitted, with NaN and index checks
    logits = apply(params, ids)                  # CheckError if an id is out of range

    loss_and_grad = pl.debug.checked(jax.value_and_grad(loss_fn))

``assert_finite(tree, what)`` checks values you choose (an intermediate activation, a
gradient tree) and names the non-finite leaves: eagerly it raises at once, inside a
``checked`` function it becomes one more runtime check.

The checks cost a little speed (each checked operation tests its output); use
``checked`` to find a problem, not in the training loop for good.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from purelayers.params import flatten

__all__ = ["CheckError", "assert_finite", "checked"]


class CheckError(ValueError):
    """A runtime check of ``checked`` or ``assert_finite`` failed."""


_HINTS = {
    "nan generated": (
        "a NaN appeared inside the function",
        "look for log/sqrt/division of values out of their domain, an overflow in low "
        "precision, or NaN inputs; narrow it down with pl.debug.assert_finite on "
        "intermediate values",
    ),
    "division by zero": ("a division by zero", "guard the denominator (e.g. + eps)"),
    "out-of-bounds": (
        "an index is out of range",
        "for Embedding, every id must be in [0, num_embeddings); check the tokenizer's "
        "vocabulary size against the table",
    ),
}


def _raise(name: str, message: str) -> None:
    what, hint = "a check failed", None
    for key, (w, h) in _HINTS.items():
        if key in message:
            what, hint = w, h
            break
    text = f"{name}: {what}: {message.strip()}"
    raise CheckError(text + (f"\n  {hint}" if hint else ""))


def _leaves(tree: Any) -> dict[str, Any]:
    if isinstance(tree, dict):
        try:
            return flatten(tree)
        except ValueError:
            pass
    paths = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(p) or "value": leaf for p, leaf in paths}


def assert_finite(tree: Any, what: str = "value") -> None:
    """Raise ``CheckError`` if any floating-point leaf of ``tree`` holds a NaN or an Inf.

    The message names each such leaf by its dotted path (``"0.weight"``) and counts the
    bad entries. Eagerly it raises at once; inside a function given to ``checked`` (jitted
    or not) it is a runtime check. Under a bare ``jax.jit`` it cannot raise: JAX then
    reports that the check was not functionalized; wrap the function with ``checked``.
    """
    leaves = {
        k: v for k, v in _leaves(tree).items() if jnp.issubdtype(jnp.result_type(v), jnp.inexact)
    }
    if not any(isinstance(v, jax.core.Tracer) for v in leaves.values()):
        bad = {k: int(jnp.sum(~jnp.isfinite(v))) for k, v in leaves.items()}
        bad = {k: n for k, n in bad.items() if n}
        if bad:
            names = ", ".join(f"{k} ({n} of {jnp.size(leaves[k])} entries)" for k, n in bad.items())
            raise CheckError(f"assert_finite: {what} is not finite: NaN or Inf in {names}")
        return
    for k, v in leaves.items():
        count = jnp.sum(~jnp.isfinite(v))
        checkify.check(
            count == 0,
            f"{what} is not finite: NaN or Inf in {k} ({{n}} of {jnp.size(v)} entries)",
            n=count,
        )


def checked(
    fn: Callable[..., Any],
    *,
    nan: bool = True,
    ids: bool = True,
    jit: bool = True,
    static_argnums: int | tuple[int, ...] = (),
    static_argnames: str | tuple[str, ...] = (),
) -> Callable[..., Any]:
    """``fn`` with runtime checks; it raises ``CheckError`` naming the failed check.

    Args:
      fn: any JAX-traceable function, e.g. ``model.apply`` or ``jax.grad(loss)``.
      nan: fail when an operation produces a NaN or divides by zero
        (``checkify.float_checks``), and when a returned array holds a NaN or an Inf
        (checked after the call, when the result is concrete). Default ``True``.
      ids: fail on out-of-bounds indexing and gathers (``checkify.index_checks``): an
        ``Embedding`` id outside ``[0, num_embeddings)``. Default ``True``.
      jit: compile the checked function with ``jax.jit``. Default ``True``.
      static_argnums: passed to ``jax.jit`` (e.g. a layer passed as an argument).
      static_argnames: passed to ``jax.jit``, as ``static_argnums``.

    ``assert_finite`` calls inside ``fn`` are always checked. When several checks fail in
    one call, one of them is reported (``checkify`` may report an ``assert_finite``
    failure in place of the NaN that caused it).

    Returns:
      a function with ``fn``'s signature and result.
    """
    errors = checkify.user_checks
    if nan:
        errors = errors | checkify.float_checks
    if ids:
        errors = errors | checkify.index_checks
    name = f"checked({getattr(fn, '__qualname__', type(fn).__name__)})"

    run = checkify.checkify(fn, errors=errors)
    if jit:
        run = jax.jit(run, static_argnums=static_argnums, static_argnames=static_argnames)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        err, out = run(*args, **kwargs)
        message = err.get()
        if message is not None:
            _raise(name, message)
        if nan and not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(out)):
            try:
                assert_finite(out, "the output")
            except CheckError as e:
                raise CheckError(f"{name}: {str(e).removeprefix('assert_finite: ')}") from None
        return out

    return wrapper
