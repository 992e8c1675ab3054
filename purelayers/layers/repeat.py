"""How a block runs, not what it computes: ``Repeat`` (``n`` copies of one block applied
with ``lax.scan``, so compile time does not grow with depth, while checkpoint names stay
per block, ``0.ln1.weight``, ...) and ``Remat`` (a layer whose activations are
recomputed in the backward pass instead of stored)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from purelayers.layers._checks import LayerError, check_int
from purelayers.layers.core import Layer, Params, _spec

__all__ = ["Remat", "Repeat"]


def _policy(policy: Callable[..., Any] | None) -> Callable[..., Any]:
    return policy or jax.checkpoint_policies.nothing_saveable


def _check_policy(layer: str, policy: Any) -> None:
    if policy is not None and not callable(policy):
        raise ValueError(
            f"{layer}: remat_policy must be a jax.checkpoint_policies policy or None, "
            f"got {policy!r}"
        )


@dataclasses.dataclass(frozen=True)
class Remat(Layer):
    r"""``layer`` with its activations rematerialized (``jax.checkpoint``): the backward
    pass recomputes them from the layer's input instead of keeping them from the forward
    pass, for about one extra forward pass of ``layer``; outputs and gradients are
    unchanged.

    Measured (``python -m benchmarks.repeat --depths 4 --seq-len 1024 --batch-size 4``,
    XLA's buffer assignment for a 4-block d256 transformer training step on the CPU):
    ``Repeat(block, 4, remat=True)`` needs 622 MiB against 1942 MiB without ``remat``,
    but a Python-loop ``Sequential`` of ``Remat`` blocks needs 2149 MiB against 2081 MiB
    for the plain stack: XLA:CPU's schedule of one flat program keeps the recomputed
    activations alive as long as the stored ones would have been. For memory on the CPU,
    use ``Repeat(..., remat=True)``; ``Remat`` is for single blocks and for backends
    whose scheduler honours the recomputation.

    Transparent to names: its parameters (and state, and ``ordered``) are exactly
    ``layer``'s, so ``Sequential(Remat(block), Remat(block))`` has the same checkpoint
    names as ``Sequential(block, block)`` and loads the same torch ``state_dict``. The
    ``key``, ``train`` and any other keyword arguments (``state``, ``mask``, ...) pass
    through to ``layer.apply``.

    Args:
      layer: the layer to rematerialize.
      remat_policy: a ``jax.checkpoint_policies`` policy naming what inside ``layer``
        may still be saved. Default ``None``: nothing is saved (``nothing_saveable``);
        ``jax.checkpoint_policies.dots_with_no_batch_dims_saveable`` keeps the matrix
        products and recomputes only the elementwise work.

    Shape:
      whatever ``layer`` takes and returns.
    """

    layer: Layer
    _: dataclasses.KW_ONLY
    remat_policy: Callable[..., Any] | None = None

    def __post_init__(self):
        if not isinstance(self.layer, Layer):
            raise ValueError(f"Remat: layer must be a Layer, got {self.layer!r}")
        _check_policy("Remat", self.remat_policy)

    def children(self) -> dict[str, Layer]:
        return {}

    def ordered(self, tree: dict[str, Any]) -> dict[str, Any]:
        return self.layer.ordered(tree)

    @property
    def takes_ids(self) -> bool:
        return self.layer.takes_ids

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        return self.layer.init(key, shape, dtype)

    def init_state(self, shape: Any, dtype: Any = jnp.float32) -> Any:
        return self.layer.init_state(shape, dtype)

    def apply(self, params: Params, x: Any, **kwargs: Any):
        """``layer.apply(params, x, **kwargs)`` (``key``, ``train``, ``state``, ...)."""
        train = kwargs.pop("train", False)  # a Python bool: stays static

        def run(p, x, kw):
            return self.layer.apply(p, x, train=train, **kw)

        return jax.checkpoint(run, policy=_policy(self.remat_policy))(params, x, kwargs)


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
    whatever ``n`` is. Only the stacking of each parameter (and the unstacking of its
    gradient) grows with ``n``: a 24-block GPT-2 stack's training step compiled in 2.14x
    the time of a 2-block one, against 5.12x for ``Sequential``
    (``python -m benchmarks.repeat --depths 2 24 --repeats 3``).

    The block must map its input to an output of the same shape and dtype (a residual
    block does).

    Args:
      layer: the block.
      n: how many copies.
      remat: rematerialize each block in the backward pass (``jax.checkpoint``), so only
        the activations between blocks are stored and each block's internals are
        recomputed: lower peak memory for about one extra forward pass (4 blocks, d256,
        sequence 1024, batch 4: 622 MiB against 1942 MiB). Default ``False``.
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
        _check_policy("Repeat", self.remat_policy)

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
            body = jax.checkpoint(body, policy=_policy(self.remat_policy))
        y, new_cache = jax.lax.scan(body, x, (stacked, jnp.arange(self.n), cache))
        return y if cache is None else (y, new_cache)
