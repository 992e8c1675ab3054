"""A bilinear map of two inputs: ``Bilinear``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

import purelayers.functional as F
from purelayers.init import Initializer, uniform
from purelayers.layers._checks import LayerError, check_int, need_width
from purelayers.layers._two_inputs import pair_init, two_shapes
from purelayers.layers.core import Layer, Params

__all__ = ["Bilinear"]


@dataclasses.dataclass(frozen=True)
class Bilinear(Layer):
    r"""Bilinear map of two inputs: ``y[..., o] = x1[..., :] @ weight[o] @ x2[..., :] + bias[o]``.

    Matches ``torch.nn.Bilinear(in1_features, in2_features, out_features, bias)``;
    ``in1_features`` and ``in2_features`` are read from the last axes of the two shapes
    ``init`` takes: ``init(key, (x1.shape, x2.shape))``, ``apply(params, x1, x2)``.

    The leading (batch) axes of ``x1`` and ``x2`` must be equal, as torch requires: they
    are not broadcast against each other.

    Args:
      out_features: width of the output.
      bias: learn an additive ``bias``. Default ``True``.
      weight_init: initializer for ``weight``. Default torch's
        ``U(-1/sqrt(in1_features), 1/sqrt(in1_features))``.
      bias_init: initializer for ``bias``. Default the same uniform as ``weight``.

    Shape:
      ``x1`` ``(*, in1_features)``, ``x2`` ``(*, in2_features)`` with the same ``*``
      (none included); output ``(*, out_features)``.

    Parameters:
      ``weight``: ``(out_features, in1_features, in2_features)``. ``bias``:
      ``(out_features,)``.

    Example:
      >>> bil = Bilinear(5)
      >>> params = bil.init(jax.random.key(0), ((8, 3), (8, 4)))
      >>> jax.tree.map(jnp.shape, params)
      {'bias': (5,), 'weight': (5, 3, 4)}
      >>> bil.apply(params, jnp.ones((8, 3)), jnp.ones((8, 4))).shape
      (8, 5)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    out_features: int
    _: dataclasses.KW_ONLY
    bias: bool = True
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None

    def __post_init__(self):
        check_int("Bilinear", "out_features", self.out_features)

    def own_names(self) -> tuple[str, ...]:
        return ("weight", "bias") if self.bias else ("weight",)

    @pair_init
    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        """``shape``: the two inputs' shapes, ``(x1.shape, x2.shape)``."""
        s1, s2 = two_shapes("Bilinear", shape)
        for i, s in enumerate((s1, s2), 1):
            if not s:
                raise LayerError(
                    "Bilinear", f"x{i} rank", f"at least 1 (..., in{i}_features)", "0 (a scalar)"
                )
        in1 = need_width("Bilinear", "x1 last axis (in1_features)", s1[-1], "torch refuses 0")
        bound = 1.0 / math.sqrt(in1)
        wkey, bkey = jax.random.split(key)
        w_init = self.weight_init or uniform(-bound, bound)
        params = {"weight": w_init(wkey, (self.out_features, in1, s2[-1]), dtype)}
        if self.bias:
            b_init = self.bias_init or uniform(-bound, bound)
            params["bias"] = b_init(bkey, (self.out_features,), dtype)
        return params

    def apply(
        self,
        params: Params,
        x1: Any,
        x2: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        w = params["weight"]
        if jnp.ndim(w) != 3:
            raise LayerError(
                "Bilinear", "params entry 'weight' rank", "3 (out, in1, in2)", jnp.ndim(w)
            )
        shapes = tuple(jnp.shape(x1)), tuple(jnp.shape(x2))
        for i, (s, width) in enumerate(zip(shapes, w.shape[1:], strict=True), 1):
            if not s or s[-1] != width:
                raise LayerError(
                    "Bilinear",
                    f"x{i} last axis (in{i}_features)",
                    width,
                    s[-1] if s else "a scalar",
                    f"x1.shape == {shapes[0]}, x2.shape == {shapes[1]}; weight "
                    f"{tuple(w.shape)} was initialized for in{i}_features == {width}",
                )
        if shapes[0][:-1] != shapes[1][:-1]:
            raise LayerError(
                "Bilinear",
                "x2 leading (batch) axes",
                f"x1's {shapes[0][:-1]}",
                f"{shapes[1][:-1]} (x1.shape == {shapes[0]}, x2.shape == {shapes[1]})",
                "torch's Bilinear does not broadcast its inputs: give both the same batch axes",
            )
        for i, x in enumerate((x1, x2), 1):
            if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
                raise LayerError(
                    "Bilinear", f"x{i} dtype", "floating point", f"{jnp.result_type(x)}"
                )
        return F.bilinear(x1, x2, w, params.get("bias"))
