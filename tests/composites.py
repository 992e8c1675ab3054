"""Custom composite layers shared by tests: the README's residual block."""

import dataclasses

import jax
import jax.numpy as jnp

from purelayers import layers as L


@dataclasses.dataclass(frozen=True)
class Residual(L.Layer):
    """The README's custom composite: x + body(norm(x))."""

    norm: L.Layer
    body: L.Layer

    def init(self, key, shape, dtype=jnp.float32):
        return {
            "norm": self.init_child("norm", jax.random.fold_in(key, 0), shape, dtype),
            "body": self.init_child("body", jax.random.fold_in(key, 1), shape, dtype),
        }

    def apply(self, params, x, *, key=None, train=False):
        h = self.call("norm", params, x)
        return x + self.call("body", params, h, key=key, train=train)
