"""Shared argument checks and error formatting, so every message reads the same way.

Configuration errors (raised in constructors)::

    Dropout: p must be in [0, 1], got 1.5

Shape errors (raised when ``apply`` or ``init`` traces), with the layer's path inside
its containers::

    Sequential[3] Linear: input last axis expected 256, got 255
      x.shape == (8, 255); Linear was initialized for 256 input features
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.layers.errors import LayerError  # the family modules import it from here


class ConfigTypeError(ValueError, TypeError):
    """A hyperparameter of the wrong type (a string where an initializer belongs, a dict
    where a config belongs): a ``ValueError``, as every bad hyperparameter is, and a
    ``TypeError``, as Python's convention for a wrong type has it."""


def config_error(layer: str, arg: str, rule: str, value: Any) -> ValueError:
    return ValueError(f"{layer}: {arg} must be {rule}, got {value!r}")


def check_int(layer: str, arg: str, value: Any, *, minimum: int = 1) -> None:
    """``value`` must be an integer (not a bool) no smaller than ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        rule = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise config_error(layer, arg, rule, value)


def check_float(
    layer: str,
    arg: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """``value`` must be a finite real number in the given (half-)open or closed range."""
    real = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
    ok = real and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        if low is not None and high is not None:
            rule = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        elif low is not None:
            rule = f"{'>' if low_open else '>='} {low:g}"
        elif high is not None:
            rule = f"{'<' if high_open else '<='} {high:g}"
        else:
            rule = "a finite number"
        if not real and rule != "a finite number":
            rule = f"a Python or NumPy number {rule}"  # not an array, a string, a bool
        raise config_error(layer, arg, rule, value)


def check_choice(layer: str, arg: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise config_error(layer, arg, "one of " + ", ".join(repr(c) for c in choices), value)


def as_shape(shape: Any) -> tuple[int, ...]:
    """``init``'s ``shape`` argument: a shape tuple of non-negative ints, or an example
    array (or ``jax.ShapeDtypeStruct``)."""
    if hasattr(shape, "shape") and hasattr(shape, "dtype"):
        return tuple(int(d) for d in shape.shape)
    dims = (shape,) if isinstance(shape, (int, np.integer)) else shape
    try:
        dims = tuple(dims)
    except TypeError:
        dims = None
    if dims is not None and any(isinstance(d, jax.core.Tracer) for d in dims):
        raise ValueError(
            f"init: shape must be static, got traced values {shape!r}: "
            "jax.eval_shape(model.init, key, shape) traces the shape too. For an abstract "
            "params tree use purelayers.params.abstract(model, shape), or "
            "jax.eval_shape(lambda k: model.init(k, shape), key)"
        )
    if dims is None or any(
        isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in dims
    ):
        raise ValueError(
            f"init: shape must be the input's shape (a tuple of non-negative ints) or an "
            f"example array (or jax.ShapeDtypeStruct), got {shape!r}"
        )
    return tuple(int(d) for d in dims)


def check_shape(layer: str, shape: Any) -> None:
    """``init``'s ``shape``: an example array (or ``jax.ShapeDtypeStruct``), or a tuple
    of non-negative ints; else ``ValueError`` naming ``layer``."""
    if hasattr(shape, "shape") and hasattr(shape, "dtype"):
        return
    try:
        as_shape(shape)
    except ValueError as e:
        raise ValueError(f"{layer}.{e}") from None


_KINDS = {"floating": "floating point", "integer": "integer", "bool": "bool", "complex": "complex"}


def dtype_kind(x: Any) -> str | None:
    """``"floating"`` (real), ``"complex"``, ``"integer"`` or ``"bool"``; None for a
    non-array. A layer whose torch counterpart computes in real floating point refuses
    complex inputs (torch does too) rather than drop their imaginary parts."""
    try:
        dt = jnp.result_type(x)
    except TypeError:
        return None
    if dt == jnp.bool_:
        return "bool"
    if jnp.issubdtype(dt, jnp.complexfloating):
        return "complex"
    return "integer" if jnp.issubdtype(dt, jnp.integer) else "floating"


def need_dtype(layer: str, x: Any, accepts: Sequence[str]) -> None:
    """``x``'s dtype must be of a kind in ``accepts`` (as the torch layer's is)."""
    kind = dtype_kind(x)
    if kind is None or kind in accepts:
        return
    raise LayerError(
        layer,
        "input dtype",
        " or ".join(_KINDS[k] for k in accepts),
        f"{jnp.result_type(x)}",
        f"the torch layer refuses {_KINDS[kind]} inputs too; cast first (x.astype(jnp.float32))",
    )


def need_representable(layer: str, what: str, value: Any, x: Any) -> None:
    """A constant (a bound, a fill value) that an integer input must hold as it is, as
    torch requires ("value cannot be converted ... without overflow")."""
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.integer):
        return
    info = jnp.iinfo(dtype)
    if not info.min <= value <= info.max:
        raise LayerError(
            layer,
            what,
            f"within {dtype}'s range [{info.min}, {info.max}] for an input of that dtype",
            value,
            "as torch refuses it; cast the input first",
        )


def need_width(layer: str, what: str, width: int, refusal: str) -> int:
    """An input width (features, channels) that torch's layer refuses when empty."""
    if width == 0:
        raise LayerError(layer, what, f"at least 1 ({refusal})", 0)
    return width


def missing_params(layer: str, err: KeyError, params: Any, what: str = "params") -> LayerError:
    """A layer's ``KeyError`` on its own params (or state: ``what``), as an error that
    names the layer."""
    keys = sorted(params) if isinstance(params, dict) else type(params).__name__
    maker = "init" if what == "params" else "init_state"
    return LayerError(
        layer,
        f"{what} has no entry {err.args[0]!r}",
        None,
        None,
        f"got keys {keys}; pass the tree {maker} returned (is a child's entry missing?)",
    )


def input_dtype(shape: Any, default: Any) -> Any:
    """The dtype of the input ``init`` was shown: the example array's, else ``default``."""
    if hasattr(shape, "shape") and hasattr(shape, "dtype"):
        return shape.dtype
    return default


def need_ndim(layer: str, x: Any, ndims: Sequence[int], names: str) -> None:
    """``x`` must have one of ``ndims`` axes; ``names`` spells the accepted layouts."""
    if jnp.ndim(x) not in ndims:
        raise LayerError(
            layer,
            "input rank",
            " or ".join(str(n) for n in ndims) + f" ({names})",
            f"{jnp.ndim(x)} (x.shape == {tuple(jnp.shape(x))})",
        )


def need_axis(layer: str, x: Any, axis: int, size: int, name: str, hint: str | None = None) -> None:
    """Axis ``axis`` of ``x`` must have length ``size``."""
    shape = tuple(jnp.shape(x))
    if len(shape) == 0 or shape[axis] != size:
        got = shape[axis] if shape else "a scalar"
        hint = hint or f"x.shape == {shape}"
        raise LayerError(layer, f"input {name}", size, got, hint)


def need_known_in_range(
    layer: str, what: str, values: Any, low: int, high: int, rule: str, hint: str | None = None
) -> None:
    """Known (not traced) integer ``values`` must lie in ``[low, high]``; the first that
    does not is named by its index (``lengths[3]``). Traced values are not checked."""
    if isinstance(values, jax.core.Tracer):
        return
    known = np.asarray(values)
    bad = np.argwhere((known < low) | (known > high))
    if bad.size:
        where = tuple(int(i) for i in bad[0])
        raise LayerError(layer, f"{what}{list(where)}", rule, int(known[where]), hint)


def fold(key: jax.Array | None, i: int) -> jax.Array | None:
    """``fold_in(key, i)``, or ``None`` without a key."""
    return None if key is None else jax.random.fold_in(key, i)


def need_key(layer: str, key: Any) -> None:
    if key is None:
        raise LayerError(
            layer,
            "train=True draws random numbers and needs a PRNG key; "
            "pass key=jax.random.key(seed) (a fresh key each step)",
            None,
            None,
        )


def promote_float(dtype: Any) -> Any:
    """At least float32: the precision norms and softmaxes compute in."""
    return jnp.promote_types(dtype, jnp.float32)


def is_float(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.floating)


def as_array(x: Any) -> jax.Array:
    """``x`` as a JAX array: a JAX array or tracer as it is, a NumPy array placed on the
    default device (``jax.device_put``), anything else through ``jnp.asarray`` (Python
    scalars stay weakly typed).

    ``jnp.asarray`` of a NumPy array compiles a copy program for every new shape when it
    runs eagerly; ``device_put`` compiles nothing.
    """
    if isinstance(x, jax.Array):
        return x
    if isinstance(x, np.ndarray):
        return jax.device_put(x)
    return jnp.asarray(x)


def summed_in_float32(p: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """A parameter ``p``, already shaped to broadcast against ``shape``, to be added to or
    multiplied with an array of that shape, so that its gradient adds in float32.

    That gradient is a sum over the broadcast axes, which XLA adds in the operand's dtype:
    in bfloat16 every partial sum is rounded. ``p`` in bfloat16 or float16 is therefore
    broadcast in float32 and cast back (forward values unchanged: bfloat16 -> float32 ->
    bfloat16 is exact); in float32 and wider it is returned as it is. Measured (bias
    gradient against float32's, relative norm, output cotangent of mean ~1 on every row):
    ``Linear(32)`` on ``[32, 128, 64]`` inputs 14% -> 0.2%, ``Conv2d(16, 3)`` on ``[16, 8,
    32, 32]`` 91% -> 0.2%, an LSTM's biases over 32 steps x batch 128 25% -> 0.4%.
    """
    if not jnp.issubdtype(p.dtype, jnp.floating) or jnp.finfo(p.dtype).bits >= 32:
        return p
    return jnp.broadcast_to(p.astype(jnp.float32), shape).astype(p.dtype)


def add_bias(y: jax.Array, bias: jax.Array, axis: int) -> jax.Array:
    """``y + bias``, a 1-D ``bias`` cast to ``y``'s dtype along ``axis`` of ``y``; its
    gradient sums in float32 (``summed_in_float32``)."""
    b = broadcast_to_axis(bias.astype(y.dtype), y.ndim, axis)
    return y + summed_in_float32(b, y.shape)


def broadcast_to_axis(v: jax.Array, ndim: int, axis: int) -> jax.Array:
    """Reshape a 1-D ``v`` so it broadcasts along ``axis`` of an ``ndim``-D array.

    Explicit, so the library runs under ``jax_numpy_rank_promotion="raise"``.
    """
    axis = axis % ndim
    return v.reshape((1,) * axis + (-1,) + (1,) * (ndim - axis - 1))
