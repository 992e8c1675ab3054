"""Gated activations, which halve an axis: ``SwiGLU`` (Llama's MLP activation) and
``GLU``, as parameter-free layers.

Shape: input with ``2 * D`` entries on the halved axis; output the same with ``D`` there.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from purelayers.functional.activation import glu, silu
from purelayers.layers._checks import LayerError, check_int
from purelayers.layers.activation.elementwise import _Activation
from purelayers.layers.activation.softmax import _need_axis

__all__ = ["GLU", "SwiGLU"]


@dataclasses.dataclass(frozen=True)
class SwiGLU(_Activation):
    r"""Gated SiLU over the last axis: ``y = silu(gate) * up`` with ``gate, up = split(x, 2)``.

    The gate is the first half: Llama's MLP activation, its gate and up projections
    packed into one matrix. torch has no module for it; it equals
    ``torch.nn.functional.silu(gate) * up``. Halves the last axis (``halves_width``).

    Shape:
      input ``(..., 2 * D)``; output ``(..., D)``.

    Example:
      >>> SwiGLU().apply({}, jnp.array([[0.0, 20.0, 5.0, 0.5]]))
      Array([[ 0., 10.]], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    halves_width: ClassVar[bool] = True

    def function(self, x):
        if jnp.shape(x)[-1] % 2:
            raise LayerError("SwiGLU", "input last axis", "an even width", jnp.shape(x)[-1])
        gate, up = jnp.split(x, 2, axis=-1)
        return silu(gate) * up


@dataclasses.dataclass(frozen=True)
class GLU(_Activation):
    r"""Gated linear unit: ``y = a * sigmoid(b)``, ``a, b`` the two halves of ``x`` on ``dim``.

    Matches ``torch.nn.GLU(dim)``.

    Args:
      dim: the axis to halve; its length must be even. Default ``-1``.

    Shape:
      input with ``2 * D`` entries on ``dim``; output the same with ``D`` there.

    Example:
      >>> GLU().apply({}, jnp.array([[2.0, 4.0, 0.0, 0.0]]))
      Array([[1., 2.]], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    dim: int = -1

    def __post_init__(self):
        check_int("GLU", "dim", self.dim, minimum=-(2**31))

    @property
    def halves_width(self) -> bool:  # type: ignore[override]
        """Whether the halved axis is the last one (an MLP around it then doubles its
        first projection)."""
        return self.dim == -1

    def function(self, x):
        _need_axis("GLU", x, self.dim, "dim")
        shape = tuple(jnp.shape(x))
        if not shape or shape[self.dim] % 2:
            raise LayerError(
                "GLU",
                f"input dim {self.dim}",
                "an even length (GLU halves it)",
                shape[self.dim] if shape else "a scalar",
                f"x.shape == {shape}",
            )
        return glu(x, self.dim)
