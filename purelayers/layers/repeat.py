"""``Repeat``: ``n`` copies of one block applied with ``lax.scan``, so compile time does
not grow with depth, while checkpoint names stay per block (``0.ln1.weight``, ...)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from purelayers.layers._checks import LayerError, check_int
from purelayers.layers.core import Layer, Params, _spec

__all__ = ["Repeat"]


def _stack(trees: list[Any]) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


@dataclasses.dataclass(frozen=True)
class Repeat(Layer):
    r"""``n`` copies of ``layer`` (each with its own parameters) applied in sequence.

    Equivalent to ``Sequential(layer, layer, ..., layer)``, with the same parameter names
    (``"0.ln1.weight"``, ``"1.ln1.weight"``, ...), the same initial weights (block ``i``
    gets ``fold_in(key, i)``) and the same per-block dropout keys, so a torch
    ``nn.Sequential`` of ``n`` blocks loads into it by name and its outputs equal the
    unrolled stack's. ``apply`` stacks the blocks' parameters along a new leading axis and
    runs the block body once under ``lax.scan``: the block is traced and compiled once,
    whatever ``n`` is (a 24-block stack compiles about as fast as a 2-block one).

    The block must map its input to an output of the same shape and dtype (a residual
    block does).

    Args:
      layer: the block.
      n: how many copies.
      remat: rematerialize each block in the backward pass (``jax.checkpoint``), so only
        the activations between blocks are stored and each block's internals are
        recomputed: lower peak memory for about one extra forward pass. Default ``False``.
      remat_policy: a ``jax.checkpoint_policies`` policy deciding what inside a block may
        still be saved with ``remat``. Default ``None``: nothing is saved
        (``nothing_saveable``).

    Decoding: if ``layer`` has ``init_cache``, ``init_cache(shape)`` stacks ``n`` caches
    along a leading axis, and ``apply(params, x, cache=cache)`` returns
    ``(y, new_cache)``.

    Shape:
      whatever ``layer`` takes; output the same shape.

    Parameters:
      ``"{i}.{name}"`` for block ``i`` and each of ``layer``'s parameter names.
    """

    layer: Layer
    n: int
    _: dataclasses.KW_ONLY
    remat: bool = False
    remat_policy: Callable[..., Any] | None = None

    def __post_init__(self):
        if not isinstance(self.layer, Layer):
            raise ValueError(f"Repeat: layer must be a Layer, got {self.layer!r}")
        check_int("Repeat", "n", self.n)

    def children(self) -> dict[str, Layer]:
        return {str(i): self.layer for i in range(self.n)}

    @property
    def takes_ids(self) -> bool:
        return self.layer.takes_ids

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        x = _spec(shape, dtype)
        out: Params = {}
        for i in range(self.n):
            try:
                p = self.layer.init(jax.random.fold_in(key, i), x, dtype)
            except LayerError as e:
                raise e.within("Repeat", str(i)) from None
            if jax.tree.leaves(p):
                out[str(i)] = p
        return out

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> Any:
        """``n`` of ``layer``'s caches stacked along a new leading axis."""
        if not hasattr(self.layer, "init_cache"):
            raise LayerError(
                "Repeat", f"{type(self.layer).__name__} has no decoding cache", None, None
            )
        one = self.layer.init_cache(shape, dtype)
        return jax.tree.map(lambda a: jnp.broadcast_to(a, (self.n, *jnp.shape(a))), one)

    def _stacked_params(self, params: Params) -> Any:
        missing = [str(i) for i in range(self.n) if str(i) not in params]
        if missing and len(missing) != self.n:
            raise LayerError(
                "Repeat",
                f"params for blocks {missing} are missing",
                None,
                None,
                f"expected blocks 0..{self.n - 1}, got {sorted(params)}",
            )
        if missing:  # a parameter-free block
            return None
        return _stack([params[str(i)] for i in range(self.n)])

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
        cache: Any = None,
        **kwargs: Any,
    ):
        stacked = self._stacked_params(params)

        def body(h, inputs):
            p, i, c = inputs
            k = None if key is None else jax.random.fold_in(key, i)
            extra = dict(kwargs) if c is None else {**kwargs, "cache": c}
            try:
                out = self.layer.apply({} if p is None else p, h, key=k, train=train, **extra)
            except LayerError as e:
                # The body is traced once for all blocks: "*" stands for any of them.
                raise e.within("Repeat", "*") from None
            return (out, None) if c is None else out

        if self.remat:
            policy = self.remat_policy or jax.checkpoint_policies.nothing_saveable
            body = jax.checkpoint(body, policy=policy)
        y, new_cache = jax.lax.scan(body, x, (stacked, jnp.arange(self.n), cache))
        return y if cache is None else (y, new_cache)
