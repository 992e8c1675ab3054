"""The layer contract and the containers: ``Layer``, ``Sequential``, ``Identity``,
``Lambda`` and ``Flatten``.

A layer is a frozen dataclass holding only configuration. Its two pure functions are
``init(key, shape, dtype) -> params`` and ``apply(params, x, *, key, train) -> y``;
params are nested dicts whose dotted names are PyTorch ``state_dict`` keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.layers._checks import (
    LayerError,
    as_shape,
    check_int,
    input_dtype,
    missing_params,
)

__all__ = ["Flatten", "Identity", "Lambda", "Layer", "Params", "Sequential", "State"]


Params = dict[str, Any]
State = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Layer:
    """Base class of every layer: a frozen, hashable configuration.

    Subclasses are frozen dataclasses (decorate them with
    ``@dataclasses.dataclass(frozen=True)``) and override:

    - ``init(key, shape, dtype=jnp.float32) -> params``: ``shape`` is the full input
      shape, batch axes included (an example array or ``jax.ShapeDtypeStruct`` is
      accepted too). Build the dict in registration order: the layer's own arrays first,
      in PyTorch's order, then each child under its field name.
    - ``apply(params, x, *, key=None, train=False) -> y``: pure. Layers with buffers
      also take ``state=`` and then return ``(y, new_state)``.
    - ``init_state(shape, dtype=jnp.float32) -> state``: the buffers (``{}`` here).

    A custom composite, a pre-norm residual block::

        @dataclasses.dataclass(frozen=True)
        class Residual(L.Layer):
            norm: L.Layer
            body: L.Layer

            def init(self, key, shape, dtype=jnp.float32):
                return {"norm": self.norm.init(jax.random.fold_in(key, 0), shape, dtype),
                        "body": self.body.init(jax.random.fold_in(key, 1), shape, dtype)}

            def apply(self, params, x, *, key=None, train=False):
                h = self.call("norm", params, x)
                return x + self.call("body", params, h, key=key, train=train)
    """

    # Names of the layer's own arrays in PyTorch's registration order (parameters, then
    # buffers); used to list an arbitrary (e.g. jitted, key-sorted) tree in that order.
    _own_order: ClassVar[tuple[str, ...]] = ("weight", "bias")

    @property
    def takes_ids(self) -> bool:
        """Whether the input is integer ids rather than floating-point features."""
        return False

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        """Initial parameters for inputs of ``shape``; ``{}`` for parameter-free layers."""
        del key, shape, dtype
        return {}

    def init_state(self, shape: Any, dtype: Any = jnp.float32) -> State:
        """Initial buffers (running statistics) for inputs of ``shape``; ``{}`` if none."""
        del shape, dtype
        return {}

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        raise NotImplementedError(f"{type(self).__name__} does not define apply")

    # -- composition helpers -------------------------------------------------------

    def children(self) -> dict[str, Layer]:
        """Child layers by checkpoint name: fields holding a layer, in field order.

        A field holding a tuple of layers is one child container whose members are
        named ``"0"``, ``"1"``, ... (``blocks.0.ln1.weight``, as ``torch.nn.ModuleList``).
        """
        out: dict[str, Layer] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Layer):
                out[f.name] = value
            elif (
                isinstance(value, (tuple, list))
                and value
                and all(isinstance(v, Layer) for v in value)
            ):
                out[f.name] = Sequential(*value)
        return out

    def call(self, name: str, params: Params, x: Any, *args: Any, **kwargs: Any) -> Any:
        """Apply the child held in field ``name`` to ``x`` with ``params[name]``.

        Shape errors raised inside the child then name its path (``Block[attn] ...``).
        """
        child = getattr(self, name)
        p = params.get(name, {})
        try:
            return child.apply(p, x, *args, **kwargs)
        except LayerError as e:
            raise e.within(type(self).__name__, name) from None
        except KeyError as e:
            if not e.args or e.args[0] in p:
                raise
            err = missing_params(type(child).__name__, e, p)
            raise err.within(type(self).__name__, name) from None

    def ordered(self, tree: dict[str, Any]) -> dict[str, Any]:
        """``tree`` (params, state, or both merged) re-listed in PyTorch's order.

        JAX transformations return dicts with sorted keys; this restores registration
        order: the layer's own arrays (``_own_order``, then any others as given), then
        its children in order.
        """
        kids = self.children()
        own = [k for k in tree if k not in kids]
        rank = {name: i for i, name in enumerate(self._own_order)}
        own.sort(key=lambda k: rank.get(k, len(rank)))
        out = {k: tree[k] for k in own}
        for name, child in kids.items():
            if name in tree:
                sub = tree[name]
                out[name] = child.ordered(sub) if isinstance(sub, dict) else sub
        return out


def _spec(shape: Any, dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(as_shape(shape), input_dtype(shape, dtype))


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)), tree)


@dataclasses.dataclass(frozen=True, init=False)
class Sequential(Layer):
    """Applies layers in order. Matches ``torch.nn.Sequential``.

    Children are named ``"0"``, ``"1"``, ... by position; parameter-free layers consume
    an index, as in torch, so ``Sequential(Linear(256), ReLU(), Linear(10))`` has
    ``0.weight``, ``0.bias``, ``2.weight``, ``2.bias``.

    ``key`` is split per child with ``jax.random.fold_in(key, index)``; ``train`` is passed
    to every child. In ``init`` each child with parameters gets
    ``fold_in(key, ordinal)`` where ``ordinal`` counts only the children with parameters
    before it, so inserting an activation or dropout changes no other layer's weights.

    If any child has buffers (BatchNorm), ``init_state(shape)`` returns them under the
    child's index and ``apply(params, x, state=state)`` returns ``(y, new_state)``.

    Shape:
      input: whatever the first layer takes; output: whatever the last one returns.

    Example:
      >>> mlp = Sequential(Linear(3), ReLU(), Linear(1))
      >>> jax.tree.map(jnp.shape, mlp.init(jax.random.key(0), (5, 2)))
      {'0': {'bias': (3,), 'weight': (3, 2)}, '2': {'bias': (1,), 'weight': (1, 3)}}
    """

    layers: tuple[Layer, ...]

    def __init__(self, *layers: Layer):
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = tuple(layers[0])
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise ValueError(
                    f"Sequential: layers[{i}] must be a Layer, got {type(layer).__name__} "
                    f"({layer!r}); wrap plain functions in Lambda(fn)"
                )
        object.__setattr__(self, "layers", tuple(layers))

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, index: int) -> Layer:
        return self.layers[index]

    def __iter__(self) -> Iterator[Layer]:
        return iter(self.layers)

    @property
    def takes_ids(self) -> bool:
        return bool(self.layers) and self.layers[0].takes_ids

    def children(self) -> dict[str, Layer]:
        return {str(i): layer for i, layer in enumerate(self.layers)}

    def _trace(self, key: jax.Array | None, shape: Any, dtype: Any) -> tuple[Params, State]:
        """Params (abstract when ``key`` is None) and state, threading shapes through."""
        first = jnp.int32 if self.takes_ids else dtype
        x = _spec(shape, first)
        params: Params = {}
        state: State = {}
        ordinal = 0
        for i, layer in enumerate(self.layers):
            name = str(i)
            try:
                if key is None:
                    p = jax.eval_shape(
                        lambda k, layer=layer, x=x: layer.init(k, x, dtype), jax.random.key(0)
                    )
                else:
                    p = layer.init(jax.random.fold_in(key, ordinal), x, dtype)
                s = layer.init_state(x, dtype)
                x = _output_spec(layer, p, s, x)
            except LayerError as e:
                raise e.within("Sequential", name) from None
            if jax.tree.leaves(p):
                params[name] = p
                ordinal += 1
            if jax.tree.leaves(s):
                state[name] = s
        return params, state

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        return self._trace(key, shape, dtype)[0]

    def init_state(self, shape: Any, dtype: Any = jnp.float32) -> State:
        return self._trace(None, shape, dtype)[1]

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
        state: State | None = None,
    ) -> Any:
        new_state: State = {}
        for i, layer in enumerate(self.layers):
            name = str(i)
            child_key = None if key is None else jax.random.fold_in(key, i)
            p = params.get(name, {})
            try:
                if state is not None and name in state:
                    x, new_state[name] = layer.apply(
                        p, x, key=child_key, train=train, state=state[name]
                    )
                else:
                    x = layer.apply(p, x, key=child_key, train=train)
            except LayerError as e:
                raise e.within("Sequential", name) from None
            except KeyError as e:
                if not e.args or e.args[0] in p:
                    raise
                raise missing_params(type(layer).__name__, e, p).within(
                    "Sequential", name
                ) from None
        return x if state is None else (x, new_state)


def _output_spec(layer: Layer, params: Any, state: Any, x: jax.ShapeDtypeStruct) -> Any:
    if jax.tree.leaves(state):

        def run(p, s, x):
            return layer.apply(p, x, state=s)[0]

        return jax.eval_shape(run, _abstract(params), _abstract(state), x)
    return jax.eval_shape(lambda p, x: layer.apply(p, x), _abstract(params), x)


@dataclasses.dataclass(frozen=True)
class Identity(Layer):
    """Returns its input unchanged. Matches ``torch.nn.Identity``."""

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        return x


@dataclasses.dataclass(frozen=True)
class Lambda(Layer):
    """A parameter-free function ``fn(x) -> y`` used as a layer.

    ``fn`` must be hashable (a function or a frozen object) so the layer stays a valid
    ``jax.jit`` static argument. Example: ``Lambda(jnp.tanh)``.
    """

    fn: Callable[[Any], Any]

    def __post_init__(self):
        if not callable(self.fn):
            raise ValueError(f"Lambda: fn must be callable, got {self.fn!r}")

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        return self.fn(x)


@dataclasses.dataclass(frozen=True)
class Flatten(Layer):
    """Flattens axes ``start_dim..end_dim`` (inclusive) into one. Matches ``torch.nn.Flatten``.

    Shape:
      input ``(N, C, H, W)`` with the defaults; output ``(N, C * H * W)``.
    """

    start_dim: int = 1
    end_dim: int = -1

    def __post_init__(self):
        check_int("Flatten", "start_dim", self.start_dim, minimum=-(2**31))
        check_int("Flatten", "end_dim", self.end_dim, minimum=-(2**31))

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        ndim = max(jnp.ndim(x), 1)
        start, end = self.start_dim, self.end_dim
        start, end = start + ndim if start < 0 else start, end + ndim if end < 0 else end
        if not (0 <= start < ndim and 0 <= end < ndim and start <= end):
            raise LayerError(
                "Flatten",
                f"start_dim={self.start_dim} and end_dim={self.end_dim} must name axes of "
                f"x.shape == {tuple(jnp.shape(x))} with start_dim <= end_dim",
                None,
                None,
            )
        shape = tuple(jnp.shape(x))
        if not shape:
            return jnp.reshape(x, (1,))
        merged = 1
        for d in shape[start : end + 1]:
            merged *= d
        return jnp.reshape(x, (*shape[:start], merged, *shape[end + 1 :]))
