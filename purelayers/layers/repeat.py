"""How a block runs, not what it computes: ``Repeat`` (``n`` copies of one block applied
with ``lax.scan``, so compile time does not grow with depth, while checkpoint names stay
per block, ``0.ln1.weight``, ...) and ``Remat`` (a layer whose activations are
recomputed in the backward pass instead of stored)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.layers import _capture
from purelayers.layers._checks import LayerError, check_int
from purelayers.layers.attention import need_cache_room
from purelayers.layers.core import Layer, Params, _output_spec, _spec, apply_child
from purelayers.trees import Stacked

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
    r"""``y = layer(x)``, with ``layer``'s activations recomputed in the backward pass.

    torch has no module for it; it is ``torch.utils.checkpoint.checkpoint(layer, x)`` as a
    layer (``jax.checkpoint``). The backward pass recomputes the activations from the
    layer's input instead of keeping them from the forward pass, for about one extra
    forward pass of ``layer``; outputs and gradients are unchanged.

    On the CPU, a Python-loop ``Sequential`` of ``Remat`` blocks saves no memory: XLA:CPU's
    schedule of one flat program keeps the recomputed activations alive as long as the
    stored ones would have been. For memory on the CPU use ``Repeat(..., remat=True)``;
    ``Remat`` is for single blocks and for backends whose scheduler honours the
    recomputation.

    Transparent to names: its parameters (and state, and ``ordered``) are exactly
    ``layer``'s, so ``Sequential(Remat(block), Remat(block))`` has the same checkpoint
    names as ``Sequential(block, block)`` and loads the same torch ``state_dict``. The
    ``key``, ``train`` and any other keyword arguments (``state``, ``mask``, ...) pass
    through to ``layer.apply``.

    Args:
      layer: the layer to rematerialize (required).
      remat_policy: a ``jax.checkpoint_policies`` policy naming what inside ``layer``
        may still be saved (keyword-only). Default ``None``: nothing is saved
        (``nothing_saveable``); ``jax.checkpoint_policies.dots_with_no_batch_dims_saveable``
        keeps the matrix products and recomputes only the elementwise work.

    Shape:
      whatever ``layer`` takes and returns.

    Parameters:
      exactly ``layer``'s, under the same names.

    Example:
      >>> r = Remat(L.Linear(3))
      >>> params = r.init(jax.random.key(0), (2, 4))
      >>> jax.tree.map(jnp.shape, params)
      {'bias': (3,), 'weight': (3, 4)}
      >>> jax.grad(lambda p: r.apply(p, jnp.ones((2, 4))).sum())(params)["bias"]
      Array([2., 2., 2.], dtype=float32)
    """

    layer: Layer
    _: dataclasses.KW_ONLY
    remat_policy: Callable[..., Any] | None = None

    def __post_init__(self):
        if not isinstance(self.layer, Layer):
            raise ValueError(f"Remat: layer must be a Layer, got {self.layer!r}")
        _check_policy("Remat", self.remat_policy)

    def children(self) -> dict[str, Layer]:
        return self.layer.children()

    def own_names(self) -> tuple[str, ...]:
        return self.layer.own_names()

    def aliases(self) -> dict[str, str]:
        return self.layer.aliases()

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
        # arrays (key, state, cache, masks) go through the checkpoint; Python values
        # (train, need_weights, ...) are closed over and stay static
        arrays = {k: v for k, v in kwargs.items() if _all_arrays(v)}
        static = {k: v for k, v in kwargs.items() if k not in arrays}

        def run(p, x, kw):
            return self.layer.apply(p, x, **static, **kw)

        rec = _capture.active()
        if rec is None:
            return jax.checkpoint(run, policy=_policy(self.remat_policy))(params, x, arrays)
        # captured values leave the checkpoint as its outputs, not as leaked tracers
        run = _capture.collect(run, _capture.inner(rec))
        out, values = jax.checkpoint(run, policy=_policy(self.remat_policy))(params, x, arrays)
        _capture.record(rec, values)
        return out


def _need_cache_room(cache: Any, x: Any) -> None:
    """Inside the scan the blocks' cached lengths are traced, so the attention cannot
    check them: where they are known here, ``x``'s positions must fit every block's
    decoding cache (an attention cache: ``keys``, ``values``, ``length``, stacked)."""
    nodes = [cache] if isinstance(cache, dict) else []
    while nodes:
        node = nodes.pop()
        if node.keys() == {"keys", "values", "length"}:
            length, keys = node["length"], node["keys"]
            if isinstance(length, jax.core.Tracer) or jnp.ndim(keys) < 3 or jnp.ndim(x) < 2:
                continue
            used = int(np.max(np.asarray(length)))
            need_cache_room("Repeat", used, jnp.shape(x)[-2], keys.shape[2])
        else:
            nodes.extend(v for v in node.values() if isinstance(v, dict))


def _all_arrays(value: Any) -> bool:
    """Whether ``value`` is an array, or a tree of them (not a Python scalar or None)."""
    leaves = jax.tree.leaves(value)
    return bool(leaves) and all(isinstance(a, (jax.Array, np.ndarray)) for a in leaves)


def _stack_leaves(trees: list[Any]) -> Any:
    """``jnp.stack`` leaf by leaf, keeping the first tree's dict order (torch's)."""
    first = trees[0]
    if isinstance(first, dict):
        return {k: _stack_leaves([t[k] for t in trees]) for k in first}
    if isinstance(first, Stacked):
        return Stacked(_stack_leaves([t.tree for t in trees]), first.n)
    return jnp.stack(trees)


def _stack(trees: list[Any], n: int) -> Any:
    if not jax.tree.leaves(trees[0]):
        return {}
    return Stacked(_stack_leaves(trees), n)


@dataclasses.dataclass(frozen=True)
class Repeat(Layer):
    r"""``y = f_{n-1}(... f_1(f_0(x)))``: ``f_i`` is copy ``i`` of ``layer``, with its own params.

    Matches a ``torch.nn.Sequential`` of ``n`` independent copies of the block: the same
    checkpoint names (``"0.ln1.weight"``, ``"1.ln1.weight"``, ...), the same initial
    weights as ``Sequential(layer, ..., layer)`` (block ``i`` gets ``fold_in(key, i)``)
    and the same per-block dropout keys, so a torch ``nn.Sequential`` of ``n`` blocks
    loads into it by name and its outputs equal the unrolled stack's.

    Storage: the params tree holds the blocks stacked, as one ``purelayers.params.Stacked``
    node whose arrays have a leading axis ``n`` (``ln1.weight`` ``(n, E)``), and
    ``apply`` runs the block body once under ``lax.scan`` over them: the block is traced
    and compiled once whatever ``n`` is, and no call stacks, slices or copies the
    weights (on the repeat benchmark a 24-block GPT-2 step compiles about as fast as a
    2-block one, where ``Sequential`` takes about five times as long).
    ``purelayers.params.flatten``, ``save``, ``load_into``, ``load_state_dict`` and
    ``summary`` list and fill the per-block names, so checkpoints stay torch's; optax and
    ``jax.grad`` see one array per block parameter.

    The block must map its input to an output of the same shape and dtype (a residual
    block does).

    Args:
      layer: the block (required).
      n: how many copies (required).
      remat: rematerialize each block in the backward pass (``jax.checkpoint``), so only
        the activations between blocks are stored and each block's internals are
        recomputed: lower peak memory (about a third of it on the repeat benchmark's
        4-block transformer step) for about one extra forward pass (keyword-only).
        Default ``False``.
      remat_policy: a ``jax.checkpoint_policies`` policy deciding what inside a block may
        still be saved with ``remat`` (keyword-only). Default ``None``: nothing is saved
        (``nothing_saveable``).

    Decoding: if ``layer`` has ``init_cache``, ``init_cache(shape)`` stacks ``n`` caches
    along a leading axis, and ``apply(params, x, cache=cache)`` returns
    ``(y, new_cache)``. ``apply`` also takes per-block params (``unstack(params)``) and
    runs them as an unrolled loop (faster for decoding; see ``unstack``).

    Buffers: if ``layer`` has state (BatchNorm), ``init_state(shape)`` is stacked the
    same way and ``apply(params, x, state=state)`` returns ``(y, new_state)``.

    Shape:
      whatever ``layer`` takes; output the same shape.

    Parameters:
      ``"{i}.{name}"`` for block ``i`` and each of ``layer``'s parameter names, stored as
      ``Stacked({name: (n, *shape)}, n)``, each block initialized as ``layer``'s.

    Example:
      >>> rep = Repeat(L.Linear(4), 3)
      >>> params = rep.init(jax.random.key(0), (2, 4))
      >>> jax.tree.map(jnp.shape, params)
      Stacked({'bias': (3, 4), 'weight': (3, 4, 4)}, n=3)
      >>> list(pl.params.flatten(params))
      ['0.weight', '0.bias', '1.weight', '1.bias', '2.weight', '2.bias']
      >>> rep.apply(params, jnp.ones((2, 4))).shape
      (2, 4)
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

    def ordered(self, tree: Any) -> Any:
        if isinstance(tree, Stacked):
            return Stacked(self.layer.ordered(tree.tree), tree.n)
        return super().ordered(tree)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        x = _spec(shape, dtype)
        blocks = []
        for i in range(self.n):
            try:
                blocks.append(self.layer.init(jax.random.fold_in(key, i), x, dtype))
            except LayerError as e:
                raise e.within("Repeat", str(i)) from None
        if blocks:
            self._check_chain(blocks[0], x)
        return _stack(blocks, self.n)

    def _check_chain(self, params: Params, x: jax.ShapeDtypeStruct) -> None:
        """A block's output is the next block's input: it must keep the input's shape and
        dtype (a ``lax.scan`` carry), else ``init`` names the block, not ``apply``'s scan."""
        try:
            out = _output_spec(self.layer, params, self.layer.init_state(x, x.dtype), x)
        except (ValueError, TypeError):  # the block needs more than x (a mask, a memory)
            return
        if isinstance(out, jax.ShapeDtypeStruct) and (out.shape, out.dtype) != (x.shape, x.dtype):
            raise LayerError(
                "Repeat",
                f"{type(self.layer).__name__} block output (the next block's input)",
                f"shape {x.shape} and dtype {x.dtype.name}, its input's",
                f"shape {out.shape} and dtype {out.dtype.name}",
                "a Repeat chains its blocks, so each must keep its input's shape and dtype; "
                "Sequential(*[block] * n) takes blocks that change them",
            )

    def init_state(self, shape: Any, dtype: Any = jnp.float32) -> Any:
        one = self.layer.init_state(_spec(shape, dtype), dtype)
        return _stack([one] * self.n, self.n)

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> Any:
        """``n`` of ``layer``'s caches stacked along a new leading axis."""
        if not hasattr(self.layer, "init_cache"):
            raise LayerError(
                "Repeat", f"{type(self.layer).__name__} has no decoding cache", None, None
            )
        one = self.layer.init_cache(shape, dtype)
        return jax.tree.map(lambda a: jnp.broadcast_to(a, (self.n, *jnp.shape(a))), one)

    def stack(self, blocks: Any) -> Any:
        """Per-block params (``{"0": ..., "1": ...}``, as ``unflatten`` gives) as the
        stacked tree ``apply`` takes. This copies the weights once; loading through
        ``purelayers.params.load_into`` with an ``init`` template needs no such step."""
        names = [str(i) for i in range(self.n)]
        if not isinstance(blocks, dict) or sorted(blocks, key=int) != names:
            got = sorted(blocks) if isinstance(blocks, dict) else type(blocks).__name__
            raise LayerError("Repeat", "blocks", names, got)
        return _stack([blocks[k] for k in names], self.n)

    def unstack(self, params: Any) -> dict[str, Any]:
        """The stacked params as per-block trees (``{"0": ..., "1": ...}``), a copy.

        ``apply`` takes them too and then runs the blocks as an unrolled loop instead of
        a scan: each block reads its own arrays where a scan step slices (copies) them
        out of the stacked ones. Where weights are read once per call, as in
        token-by-token decoding, that is much faster (the README's generation figures), for
        a second copy of the weights and a compile that grows with ``n``.
        """
        return _split(self.n, self._blocks(params, "params"))

    def unstack_cache(self, cache: Any) -> dict[str, Any]:
        """A stacked decoding cache (``init_cache``) as per-block caches, a copy: with
        per-block params, ``apply`` then reads and writes each block's cache in place
        instead of slicing it out of the stack (a third of a GPT-2-small decode step at
        batch 8). ``apply`` returns them per block too."""
        return _split(self.n, cache)

    def _apply_unrolled(self, blocks, x, key, train, cache, state, kwargs):
        names = [str(i) for i in range(self.n)]
        if sorted(blocks, key=lambda k: int(k) if k.isdigit() else -1) != names:
            raise LayerError("Repeat", "per-block params", names, sorted(blocks))
        blocks_state = None if state is None else self._blocks(state, "state")
        per_block_cache = isinstance(cache, dict) and sorted(cache) == sorted(names)
        caches, states = [], []
        for i, name in enumerate(names):
            extra = dict(kwargs)
            if per_block_cache:
                extra["cache"] = cache[name]
            elif cache is not None:
                extra["cache"] = jax.tree.map(lambda a, i=i: a[i], cache)
            if blocks_state is not None:
                extra["state"] = jax.tree.map(lambda a, i=i: a[i], blocks_state)
            k = None if key is None else jax.random.fold_in(key, i)

            arrays = {k_: extra.pop(k_) for k_ in ("cache", "state") if k_ in extra}

            def run(p, h, arrays, k=k, name=name, extra=extra):
                # other keyword arguments stay Python values (closed over, not traced)
                kw = {**extra, **arrays}
                return apply_child(self, name, self.layer, p, h, key=k, train=train, **kw)

            rec = _capture.active()
            if self.remat and rec is not None:
                out, values = jax.checkpoint(
                    _capture.collect(run, _capture.inner(rec)), policy=_policy(self.remat_policy)
                )(blocks[name], x, arrays)
                _capture.record(rec, values)
            elif self.remat:
                out = jax.checkpoint(run, policy=_policy(self.remat_policy))(
                    blocks[name], x, arrays
                )
            else:
                out = run(blocks[name], x, arrays)
            if blocks_state is not None:
                out, s = out
                states.append(s)
            if cache is not None:
                out, c = out
                caches.append(c)
            x = out
        restack = lambda parts: jax.tree.map(lambda *a: jnp.stack(a), *parts)  # noqa: E731
        if per_block_cache:
            cache = dict(zip(names, caches, strict=True))
        elif cache is not None:  # written back in place (no new stacked array)
            for i, c in enumerate(caches):
                cache = jax.tree.map(lambda whole, part, i=i: whole.at[i].set(part), cache, c)
        out: Any = x if cache is None else (x, cache)
        if state is None:
            return out
        return out, Stacked(restack(states), self.n) if states else state

    def _blocks(self, tree: Any, what: str) -> Any:
        """The stacked tree under a ``Stacked`` node (``None`` for parameter-free blocks)."""
        if isinstance(tree, Stacked):
            if tree.n != self.n:
                raise LayerError("Repeat", f"{what} blocks", self.n, tree.n)
            return tree.tree
        if not tree:
            return None
        raise LayerError(
            "Repeat",
            f"{what} must be the Stacked tree init returns",
            None,
            None,
            f"got {type(tree).__name__} with keys {sorted(tree) if isinstance(tree, dict) else '?'}; "
            "per-block trees become one with Repeat.stack(blocks), or load a checkpoint "
            "with purelayers.params.load_into(path, model.init(...))",
        )

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
        cache: Any = None,
        state: Any = None,
        **kwargs: Any,
    ):
        if isinstance(params, dict) and params and all(k.isdigit() for k in params):
            return self._apply_unrolled(params, x, key, train, cache, state, kwargs)
        stacked = self._blocks(params, "params")
        blocks_state = None if state is None else self._blocks(state, "state")
        rec = _capture.active()

        def body(h, inputs):
            p, i, c, s = inputs
            k = None if key is None else jax.random.fold_in(key, i)
            extra = dict(kwargs)
            if c is not None:
                extra["cache"] = c
            if s is not None:
                extra["state"] = s

            # The body is traced once for all blocks: "*" stands for any of them.
            def block():
                p_ = {} if p is None else p
                return apply_child(self, "*", self.layer, p_, h, key=k, train=train, **extra)

            values: dict[str, Any] = {}
            if rec is None:
                out = block()
            else:  # captured values leave the scan as its outputs, one per block
                out, values = _capture.collect(block, _capture.scanned(rec, self.n))()
            if s is not None:
                out, s = out
            if c is not None:
                out, c = out
            return out, (c, s, values)

        if cache is not None:
            _need_cache_room(cache, x)
        if self.remat:
            body = jax.checkpoint(body, policy=_policy(self.remat_policy))
        xs = (stacked, jnp.arange(self.n), cache, blocks_state)
        y, (new_cache, new_state, values) = jax.lax.scan(body, x, xs)
        if rec is not None:
            _capture.record_blocks(rec, values, self.n)
        out: Any = y if cache is None else (y, new_cache)
        if state is None:
            return out
        return out, Stacked(new_state, self.n) if new_state is not None else state


def _split(n: int, stacked: Any) -> dict[str, Any]:
    """``stacked``'s leaves split along their leading axis into ``n`` per-block trees,
    ``{"0": ..., "1": ..., ...}`` in block order (a jitted function's dict output comes
    back with sorted keys, ``"10"`` before ``"2"``)."""
    blocks = _split_blocks(n, stacked)
    return {str(i): block for i, block in enumerate(blocks)}


@functools.partial(jax.jit, static_argnums=0)
def _split_blocks(n: int, stacked: Any) -> list[Any]:
    return [jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(n)]
