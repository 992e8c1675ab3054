"""Affine maps: ``Linear``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

import purelayers.functional as F
from purelayers.init import Initializer, kaiming_uniform, uniform, zeros
from purelayers.layers._checks import LayerError, as_shape, check_int
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
    """``F.linear`` of ``params``' ``weight`` and ``bias``, with the input check every
    Linear-like layer shares (a ``LayerError`` naming ``layer``)."""
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
    return F.linear(x, w, params.get("bias"), transposed=transposed)
