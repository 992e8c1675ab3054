"""The learned-slope activation: ``PReLU`` and its function ``prelu``
(``torch.nn.PReLU``, ``torch.nn.functional.prelu``)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.functional.activation import (
    prelu,
)
from purelayers.init import Initializer, constant
from purelayers.layers._checks import (
    LayerError,
    as_shape,
    check_float,
    check_int,
)
from purelayers.layers.core import Layer, Params

__all__ = ["PReLU", "prelu"]


_UNSET: Any = object()  # an argument not given


@dataclasses.dataclass(frozen=True, init=False)
class PReLU(Layer):
    r"""``y = x`` if ``x > 0`` else ``weight * x``, with a learned slope ``weight``.

    Matches ``torch.nn.PReLU(num_parameters, init)``.

    Args:
      num_parameters: 1 (one slope shared by all channels) or the channel count ``C``.
        Default ``1``.
      init: the initial slope, torch's argument (second, as torch's). Default ``0.25``.
        Stored as the field ``init_value`` (``init`` is the layer's method), which is
        also accepted as a keyword.
      weight_init: an initializer overriding the initial slope (keyword-only). Default
        ``None``: the constant ``init``.

    Shape:
      input ``(N, C, ...)`` (channels on axis 1, as torch) or any shape when
      ``num_parameters == 1``; output the same shape and dtype.

    Parameters:
      ``weight``: ``(num_parameters,)``, filled with ``init``.

    Example:
      >>> p = PReLU()
      >>> params = p.init(jax.random.key(0), (2, 3))
      >>> jax.tree.map(jnp.shape, params)
      {'weight': (1,)}
      >>> p.apply(params, jnp.array([-4.0, 2.0]))
      Array([-1.,  2.], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    num_parameters: int = 1
    init_value: float = 0.25
    _: dataclasses.KW_ONLY
    weight_init: Initializer | None = None

    def __init__(
        self,
        num_parameters: int = 1,
        init: float = 0.25,
        *,
        init_value: Any = _UNSET,
        weight_init: Initializer | None = None,
    ):
        if init_value is _UNSET:
            check_float("PReLU", "init", init)
            init_value = init
        elif init != 0.25:
            raise ValueError(
                f"PReLU: init and init_value name one argument; got init={init!r} and "
                f"init_value={init_value!r}"
            )
        object.__setattr__(self, "num_parameters", num_parameters)
        object.__setattr__(self, "init_value", init_value)
        object.__setattr__(self, "weight_init", weight_init)
        self.__post_init__()

    def __post_init__(self):
        check_int("PReLU", "num_parameters", self.num_parameters)
        check_float("PReLU", "init_value", self.init_value)

    def own_names(self) -> tuple[str, ...]:
        return ("weight",)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        self._check(as_shape(shape))
        w_init = self.weight_init or constant(self.init_value)
        return {"weight": w_init(key, (self.num_parameters,), dtype)}

    def _check(self, shape: tuple[int, ...]) -> None:
        if self.num_parameters == 1:
            return
        channels = shape[1] if len(shape) >= 2 else (shape[0] if shape else None)
        if channels != self.num_parameters:
            raise LayerError(
                "PReLU",
                "input channels (axis 1)",
                self.num_parameters,
                channels,
                f"x.shape == {shape}; PReLU(num_parameters={self.num_parameters}) learns one "
                "slope per channel on axis 1",
            )

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        self._check(tuple(jnp.shape(x)))
        return prelu(x, params["weight"])
