"""Mixed precision without rewriting a model: float32 parameters, low-precision compute.

``mixed_precision(model.apply)`` returns an apply function with the same signature that
casts the floating-point parameters and inputs to ``compute_dtype`` (bfloat16 by
default) on the way in and the floating-point outputs to ``output_dtype`` (float32) on
the way out::

    apply = pl.precision.mixed_precision(model.apply)
    params = model.init(key, x.shape)                      # float32, kept float32

    def loss_fn(params, x, y):
        logits = apply(params, x)                           # bfloat16 inside, float32 out
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    grads = jax.grad(loss_fn)(params, x, y)                 # float32, like params
    updates, opt_state = opt.update(grads, opt_state, params)

The cast is part of the differentiated function, so gradients arrive in the
parameters' dtype (the transpose of a cast is a cast back) and the optimizer only ever
sees float32. Inside, every layer computes in its input's dtype, and the layers that
need range compute in at least float32 and cast back: normalization statistics
(``LayerNorm``, ``RMSNorm``, ``GroupNorm``, ``BatchNorm``) and attention scores and
softmax (``MultiHeadAttention``, ``scaled_dot_product_attention``). Integer inputs
(token ids, labels) and non-floating leaves pass through unchanged. bfloat16 has
float32's exponent range, so no loss scaling is needed; float16 would need it.

``Policy`` names the three dtypes for code that wants to cast by hand.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["Policy", "cast_floating", "mixed_precision"]


def cast_floating(tree: Any, dtype: Any) -> Any:
    """``tree`` with every floating-point array leaf cast to ``dtype``; other leaves
    (integers, booleans, PRNG keys, Python values) unchanged."""

    def cast(leaf: Any) -> Any:
        if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating):
            return jnp.asarray(leaf).astype(dtype)
        return leaf

    return jax.tree.map(cast, tree)


@dataclasses.dataclass(frozen=True)
class Policy:
    """Dtypes of a mixed-precision computation.

    Args:
      param_dtype: what parameters are stored (and optimized) in. Default float32.
      compute_dtype: what layers compute in. Default bfloat16.
      output_dtype: what the model's outputs are cast to (losses read them). Default
        float32.
    """

    param_dtype: Any = jnp.float32
    compute_dtype: Any = jnp.bfloat16
    output_dtype: Any = jnp.float32

    def cast_to_param(self, tree: Any) -> Any:
        return cast_floating(tree, self.param_dtype)

    def cast_to_compute(self, tree: Any) -> Any:
        return cast_floating(tree, self.compute_dtype)

    def cast_to_output(self, tree: Any) -> Any:
        return cast_floating(tree, self.output_dtype)


def mixed_precision(
    apply_fn: Callable[..., Any],
    compute_dtype: Any = jnp.bfloat16,
    *,
    output_dtype: Any = jnp.float32,
    policy: Policy | None = None,
) -> Callable[..., Any]:
    """Wrap ``apply_fn(params, x, *args, **kwargs)`` to run in ``compute_dtype``.

    Args:
      apply_fn: a layer's ``apply`` (or any function of ``params`` and inputs).
      compute_dtype: dtype the parameters and floating-point positional inputs are cast
        to. Default ``jnp.bfloat16``.
      output_dtype: dtype the floating-point outputs are cast to (state trees and
        caches returned beside the output included). Default ``jnp.float32``.
      policy: a ``Policy``; overrides ``compute_dtype`` and ``output_dtype``.

    Keyword arguments (``key``, ``train``, ``mask``, ``state``...) are passed unchanged:
    a floating-point ``mask`` or ``state`` keeps its dtype.

    Returns:
      A function with ``apply_fn``'s signature.
    """
    if policy is None:
        policy = Policy(compute_dtype=compute_dtype, output_dtype=output_dtype)

    @functools.wraps(apply_fn)
    def apply(params: Any, *args: Any, **kwargs: Any) -> Any:
        out = apply_fn(policy.cast_to_compute(params), *policy.cast_to_compute(args), **kwargs)
        return policy.cast_to_output(out)

    return apply
