"""Affine maps: ``Linear``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.init import Initializer, kaiming_uniform, uniform, zeros
from purelayers.layers._checks import LayerError, add_bias, as_shape, check_int
from purelayers.layers._lead_products import (
    axes_product,
    leading_axes_product,
    meshless,
    rows_product,
)
from purelayers.layers.core import Layer, Params

__all__ = ["Linear"]


def torch_default_bias(fan_in: int) -> Initializer:
    """PyTorch's default bias init for Linear and Conv: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``."""
    if fan_in == 0:
        return zeros()
    bound = 1.0 / math.sqrt(fan_in)
    return uniform(-bound, bound)


# PyTorch's default weight init for Linear and Conv.
TORCH_DEFAULT_WEIGHT = kaiming_uniform(a=math.sqrt(5))


@dataclasses.dataclass(frozen=True)
class Linear(Layer):
    r"""Affine map over the last axis: ``y = x @ weight.T + bias``. Matches ``torch.nn.Linear``.

    ``in_features`` is read from the last axis of ``init``'s ``shape``.

    Args:
      out_features: width of the output.
      bias: learn an additive ``bias``. Default ``True``.
      weight_init: initializer for ``weight`` (``fn(key, shape, dtype)``). Default
        torch's ``kaiming_uniform(a=sqrt(5))``: ``U(-1/sqrt(in), 1/sqrt(in))``.
      bias_init: initializer for ``bias``. Default torch's ``U(-1/sqrt(in), 1/sqrt(in))``.

      transposed: store ``weight`` as ``(in_features, out_features)`` and compute
        ``y = x @ weight + bias``: the layout of Hugging Face's GPT-2 ``Conv1D``
        (``c_attn``, ``c_fc``, ...), so its checkpoints load with no transpose. The
        initial values are the transpose of the default layout's. Default ``False``.

    Shape:
      input ``(..., in_features)``; output ``(..., out_features)``. Computes in the
      input's floating dtype.

    Parameters:
      ``weight``: ``(out_features, in_features)`` (``(in_features, out_features)`` if
      ``transposed``). ``bias``: ``(out_features,)``.

    Example:
      >>> lin = Linear(3)
      >>> jax.tree.map(jnp.shape, lin.init(jax.random.key(0), (8, 2)))
      {'bias': (3,), 'weight': (3, 2)}
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    out_features: int
    _: dataclasses.KW_ONLY
    bias: bool = True
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None
    transposed: bool = False

    def __post_init__(self):
        check_int("Linear", "out_features", self.out_features)

    def own_names(self) -> tuple[str, ...]:
        return ("weight", "bias") if self.bias else ("weight",)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        shape = as_shape(shape)
        if not shape:
            raise LayerError(
                "Linear", "input rank", "at least 1 (..., in_features)", "0 (a scalar)"
            )
        fan_in = shape[-1]
        wkey, bkey = jax.random.split(key)
        w_init = self.weight_init or TORCH_DEFAULT_WEIGHT
        weight = w_init(wkey, (self.out_features, fan_in), dtype)
        params = {"weight": weight.T if self.transposed else weight}
        if self.bias:
            b_init = self.bias_init or torch_default_bias(fan_in)
            params["bias"] = b_init(bkey, (self.out_features,), dtype)
        return params

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        return linear(params, x, layer="Linear", transposed=self.transposed)


def linear(
    params: Params, x: jax.Array, *, layer: str = "Linear", transposed: bool = False
) -> jax.Array:
    """``x @ weight.T + bias`` (``x @ weight + bias`` if ``transposed``) with the shape
    check every Linear-like layer shares. The product is ``_product``'s."""
    w = params["weight"]
    fan_in = w.shape[0] if transposed else w.shape[1]
    if jnp.ndim(x) == 0 or jnp.shape(x)[-1] != fan_in:
        got = jnp.shape(x)[-1] if jnp.ndim(x) else "a scalar"
        raise LayerError(
            layer,
            "input last axis",
            fan_in,
            got,
            f"x.shape == {tuple(jnp.shape(x))}; {layer} was initialized for {fan_in} input "
            f"features (weight {tuple(w.shape)})",
        )
    dtype = jnp.result_type(x) if jnp.issubdtype(jnp.result_type(x), jnp.floating) else w.dtype
    y = _product(jnp.asarray(x, dtype), w.astype(dtype), transposed)
    if "bias" in params:
        y = add_bias(y, params["bias"], -1)
    return y


def _product(x: jax.Array, w: jax.Array, transposed: bool) -> jax.Array:
    """``x @ w.T`` (``x @ w`` if ``transposed``) over ``x``'s last axis.

    On the CPU the weight gradient of an ``x`` of more than two axes multiplies the
    ``[rows, in]`` matrix of its leading axes (a free reshape, as
    ``torch.nn.functional.linear`` does), a product over one contracted axis. Over
    several (``[B, T, out]`` with ``[B, T, in]``), XLA:CPU first copies the output gradient into a transposed
    ``[out, B * T]`` array for its product kernel; over one, it multiplies the transposed
    operand in place. On a 2-core AVX-512 CPU (Intel Xeon), jitted, ``[16, 128, 256]``
    inputs: the weight gradient of a 256 -> 1024 layer 14.0 -> 7.8 ms, 256 -> 768 7.4 ->
    7.1 ms, 256 -> 256 4.7 -> 3.9 ms, 1024 -> 256 a tie (12.9 ms); the benchmark
    transformer's training step (``python -m benchmarks.run``'s, in-process, 15
    alternating rounds) 298.7 -> 288.4 ms, its four ``[1024, 2048]`` transposed copies
    of 2.4-4.6 ms each gone. Elsewhere the leading axes stay apart, so that an input
    sharded along a later axis (the sequence) is not gathered: merged rows can keep only
    a sharding of the first axis, and XLA's partitioner gathers the rest (a weight
    gradient over ``[4, 16, 32]`` split by sequence on two devices: one all-reduce of the
    ``[64, 32]`` gradient kept apart, one all-gather of the input merged). The platform
    is chosen when the program is lowered: by the lowering rules of the weight
    gradient's primitive (``_lead_products``; the forward product is ``dot_general``),
    which traces faster than a ``jax.lax.platform_dependent`` switch, or by that switch
    under ``Explicit`` mesh axes and inside ``shard_map`` (``meshless``)."""
    if x.ndim <= 2:
        return axes_product(x, w, transposed)
    if meshless(x, w):
        return leading_axes_product(x, w, transposed)
    return jax.lax.platform_dependent(
        x,
        w,
        cpu=lambda x, w: rows_product(x, w, transposed),
        default=lambda x, w: axes_product(x, w, transposed),
    )
