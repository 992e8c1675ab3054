"""The layer contract and the containers: ``Layer``, ``Sequential``, ``Identity`` and
``Lambda``.

A layer is a frozen dataclass holding only configuration. Its two pure functions are
``init(key, shape, dtype) -> params`` and ``apply(params, x, *, key, train) -> y``;
params are nested dicts whose dotted names are PyTorch ``state_dict`` keys.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.layers._capture import active, paused
from purelayers.layers._checked import (
    _checking,
    _checking_shape,
    _checking_state_shape,
    unchecked,
)
from purelayers.layers._checks import (
    LayerError,
    as_shape,
    input_dtype,
)
from purelayers.layers._compose import (
    apply_child,
    check_child_name,
    check_static_train,
    child_part,
    derived_init,
    derived_init_state,
    freeze_fields,
    in_library,
    is_layers_dict,
    is_layers_tuple,
    recording_call,
)
from purelayers.layers._field_checks import check_fields
from purelayers.trees import Stacked

__all__ = ["Identity", "Lambda", "Layer", "Params", "Sequential", "State"]


Params = dict[str, Any]
State = dict[str, Any]


class _LayerType(type):
    """Checks every layer's fields once it is built (after the class's own
    ``__post_init__``, which stays the function the class wrote): bool fields hold a
    bool, ``*_init`` fields an initializer, dict-of-layers fields are frozen."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        layer = super().__call__(*args, **kwargs)
        freeze_fields(layer, Layer)
        check_fields(layer)
        return layer

    @property
    def __signature__(cls) -> inspect.Signature:
        # the constructor's own arguments (``help``, IDEs), not this ``__call__``'s
        return inspect.signature(cls.__init__).replace(
            parameters=list(inspect.signature(cls.__init__).parameters.values())[1:]
        )


@dataclasses.dataclass(frozen=True)
class Layer(metaclass=_LayerType):
    """Base class of every layer: a frozen, hashable configuration.

    A subclass is a frozen dataclass (``@dataclasses.dataclass(frozen=True)``) with
    ``apply(params, x, *, key=None, train=False) -> y``, pure; a layer with buffers also
    takes ``state=`` and returns ``(y, new_state)``. Children are fields: a field holding
    a layer, a tuple of layers (members ``blocks.0``, ``blocks.1``, as ``nn.ModuleList``)
    or a dict of layers with string keys (``heads.cls``, as ``nn.ModuleDict``; held as
    a hashable ``FrozenDict``). ``self.call(name, params, x, ...)`` applies one
    (``self.call("blocks.1", params, h)``), naming its path in any error it raises.

    ``init(key, shape, dtype)`` and ``init_state(shape, dtype)`` are derived from
    ``apply`` (see ``init``); a layer writes its own ``init`` only for arrays of its
    own, declared by name in ``own_names()`` (PyTorch's order), and can still have its
    children initialized for it with ``init_children``.

    Params check: ``apply`` on a library layer (the outermost one; its children are
    covered by its tree) compares ``params`` (and ``state=``) with the names and shapes
    ``init`` (``init_state``) builds for that input, once per trace: a missing,
    unexpected or wrongly shaped entry raises ``LayerError`` naming the layer's path,
    the key, expected and got.

    Example:
      >>> @dataclasses.dataclass(frozen=True)
      ... class Residual(L.Layer):
      ...     norm: L.Layer = L.LayerNorm()
      ...     body: L.Layer = L.Linear(4)
      ...
      ...     def apply(self, params, x, *, key=None, train=False):
      ...         return x + self.call("body", params, self.call("norm", params, x))
      >>> params = Residual().init(jax.random.key(0), (2, 4))
      >>> list(pl.params.flatten(params))
      ['norm.weight', 'norm.bias', 'body.weight', 'body.bias']
    """

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        # the library's own layers check the params they are given; a user's apply
        # stays the function it is (its children are checked as ``call`` runs them)
        raw = cls.__dict__.get("apply")
        if callable(raw) and not hasattr(raw, "unchecked") and in_library(cls):
            cls.apply = _checking(raw)
        raw_init = cls.__dict__.get("init")
        if callable(raw_init) and not hasattr(raw_init, "unchecked"):
            cls.init = _checking_shape(raw_init)
        raw_state = cls.__dict__.get("init_state")
        if callable(raw_state) and not hasattr(raw_state, "unchecked"):
            cls.init_state = _checking_state_shape(raw_state)

    # The input dtypes the layer computes on ("floating", "integer", "bool", "complex");
    # another raises LayerError naming the dtype. Containers take any and let children
    # check.
    accepts: ClassVar[tuple[str, ...]] = ("floating", "integer", "bool", "complex")

    @property
    def takes_ids(self) -> bool:
        """Whether the input is integer ids rather than floating-point features."""
        return False

    def __post_init__(self) -> None:
        """Checks of the layer's own settings, in a subclass (none here)."""

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        """Initial parameters for inputs of ``shape``.

        Derived from ``apply`` when a layer does not write its own: ``apply`` runs once
        abstractly on an input of ``shape`` (eval mode; a tuple of shapes or arrays for
        an ``apply`` of several positional inputs) and each child is initialized at the
        input it receives there, child ``i`` (its ordinal among the children with
        parameters, in field order) with ``jax.random.fold_in(key, i)``. ``{}`` for a
        layer without children.
        """
        return self.init_children(key, shape, dtype)

    init.derived = True  # type: ignore[attr-defined]

    def init_state(self, shape: Any, dtype: Any = jnp.float32) -> State:
        """Initial buffers (running statistics) for inputs of ``shape``; derived from
        ``apply`` as ``init`` is (each child's ``init_state`` at the input it receives);
        ``{}`` if none."""
        return derived_init_state(self, Layer, shape, dtype)

    def init_children(
        self, key: jax.Array, shape: Any, dtype: Any = jnp.float32, params: Params | None = None
    ) -> Params:
        """The children's params, each initialized at the input it receives in ``apply``
        (see ``init``), in field order.

        A layer with arrays of its own writes ``init`` and calls this for its children,
        passing its own arrays as ``params`` so that ``apply`` can read them while it runs::

            def init(self, key, shape, dtype=jnp.float32):
                k_own, k_children = jax.random.split(key)
                own = {"pos_emb": 0.02 * jax.random.normal(k_own, (16, 8), dtype)}
                return {**own, **self.init_children(k_children, shape, dtype, own)}
        """
        return derived_init(self, Layer, key, shape, dtype, params)

    def output_shape(self, shape: Any, dtype: Any = jnp.float32, **kwargs: Any) -> Any:
        """The output's ``jax.ShapeDtypeStruct`` (a tree of them for several outputs) for
        an input of ``shape``, without computing anything (``jax.eval_shape`` of ``init``
        and ``apply``; ``kwargs`` go to ``apply``).

        Example:
          >>> L.Conv2d(8, 3, stride=2).output_shape((1, 3, 32, 32)).shape
          (1, 8, 15, 15)
        """
        first = jnp.int32 if self.takes_ids else dtype
        x = jax.ShapeDtypeStruct(as_shape(shape), input_dtype(shape, first))
        params = jax.eval_shape(lambda: self.init(jax.random.key(0), x, dtype))
        state = jax.eval_shape(lambda: self.init_state(x, dtype))
        if jax.tree.leaves(state):
            return jax.eval_shape(
                lambda p, s, x: self.apply(p, x, state=s, **kwargs)[0], params, state, x
            )
        return jax.eval_shape(lambda p, x: self.apply(p, x, **kwargs), params, x)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        raise NotImplementedError(f"{type(self).__name__} does not define apply")

    def runs_before(self, previous: Layer, x: Any) -> bool:
        """Whether ``Sequential`` may apply this layer before ``previous`` (then
        ``previous`` on its output), given ``previous``'s input ``x``, with the same
        outputs and gradients. ``False`` here; a max pool says so of a ``ReLU``."""
        del previous, x
        return False

    # -- composition helpers -------------------------------------------------------

    def own_names(self) -> tuple[str, ...]:
        """The names of the layer's own arrays (parameters, then buffers), in PyTorch's
        registration order; children's arrays are not listed.

        This is where a layer declares the names it owns, once: ``init`` and
        ``init_state`` build their dicts under these names, ``ordered`` lists arbitrary
        (key-sorted) trees by them, and aliases (``Tied``) are checked against them. A
        setting that switches an array off leaves its name out (``Linear(4, bias=False)``
        owns only ``("weight",)``). Default: ``()``, a layer whose arrays are all in
        children. Override it in a custom layer with arrays of its own (a learned
        position table ``pos_emb``, say).
        """
        return ()

    def children(self) -> dict[str, Layer]:
        """Child layers by checkpoint name: fields holding a layer, in field order.

        A field holding a tuple of layers is a container of members named ``"0"``,
        ``"1"``, ... (``blocks.0.ln1.weight``, as ``torch.nn.ModuleList``), and one holding
        a dict of layers a container of members under its keys (``heads.cls.weight``, as
        ``torch.nn.ModuleDict``); ``self.call("blocks.1", ...)`` applies one member.
        """
        out: dict[str, Layer] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Layer):
                out[f.name] = value
            elif is_layers_tuple(value, Layer):
                out[f.name] = Sequential(*value)
            elif is_layers_dict(value, Layer):
                out[f.name] = Sequential(dict(value))
        return out

    def aliases(self) -> dict[str, str]:
        """Tied names: ``{alias: original}``, dotted and relative to this layer.

        An alias names the same array as its original (GPT-2's ``lm_head.weight`` is
        ``transformer.wte.weight``); the params tree holds only the original. ``Tied``
        declares them; containers collect their children's under the child's name.
        ``purelayers.params`` uses them (``model=``) to load files with or without the
        alias and to write it on request.
        """
        out: dict[str, str] = {}
        for name, child in self.children().items():
            for alias, original in child.aliases().items():
                out[f"{name}.{alias}"] = f"{name}.{original}"
        return out

    def call(self, name: str, params: Params, x: Any, *args: Any, **kwargs: Any) -> Any:
        """Apply the child ``name`` to ``x`` with its part of ``params``.

        ``name`` is a key of ``children()`` or a dotted path below one (``"blocks.1"``, a
        member of a tuple or dict field). This is the one way containers and composites
        run a child: errors raised inside it then name its path (``Sequential[conv]
        Conv2d: ...``) and a child whose entry is missing from ``params`` fails naming
        it. Given ``state=`` (the composite's whole state tree), the child gets its own
        part: a child with buffers returns ``(y, child_state)``, one without returns
        ``y``. Other ``args`` and ``kwargs`` (``key``, ``train``, ``mask``, ...) go to the
        child's ``apply`` unchanged.
        """
        child = self._child(name)
        check_static_train(type(self).__name__, kwargs.get("train", False))
        try:
            recording_call(self, name, child, params, x, args, kwargs)
        except LayerError as e:  # the child's init refuses the input apply gives it
            raise e.within(type(self).__name__, name) from None
        p = child_part(params, name)
        if "state" in kwargs:
            part = child_part(kwargs["state"], name) if kwargs["state"] is not None else None
            if part is None or (isinstance(part, Mapping) and not jax.tree.leaves(part)):
                kwargs = {k: v for k, v in kwargs.items() if k != "state"}
            else:
                kwargs = {**kwargs, "state": part}
        return apply_child(self, name, child, p, x, *args, **kwargs)

    def init_child(self, name: str, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Any:
        """``init`` of the child ``name`` (a key of ``children()`` or a dotted path below
        one), with errors naming its path as ``call`` does for ``apply``
        (``Residual[body.1] Softmax: ...``)."""
        child = self._child(name)
        try:
            return child.init(key, shape, dtype)
        except LayerError as e:
            raise e.within(type(self).__name__, name) from None

    def _child(self, name: str) -> Layer:
        layer: Layer = self
        for part in name.split("."):
            kids = layer.children()
            if part not in kids:
                raise LayerError(
                    type(self).__name__,
                    f"has no child {name!r}",
                    None,
                    None,
                    f"its children are {list(self.children())}",
                )
            layer = kids[part]
        return layer

    def ordered(self, tree: dict[str, Any]) -> dict[str, Any]:
        """``tree`` (params, state, or both merged) re-listed in PyTorch's order.

        JAX transformations return dicts with sorted keys; this restores registration
        order: the layer's own arrays (``own_names()``, then any others as given), then
        its children in order.
        """
        kids = self.children()
        own = [k for k in tree if k not in kids]
        rank = {name: i for i, name in enumerate(self.own_names())}
        own.sort(key=lambda k: rank.get(k, len(rank)))
        out = {k: tree[k] for k in own}
        for name, child in kids.items():
            if name in tree:
                sub = tree[name]
                out[name] = child.ordered(sub) if isinstance(sub, (dict, Stacked)) else sub
        return out


def _spec(shape: Any, dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(as_shape(shape), input_dtype(shape, dtype))


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)), tree)


@dataclasses.dataclass(frozen=True, init=False)
class Sequential(Layer):
    r"""``y = layers[-1](... layers[1](layers[0](x)))``: applies layers in order.

    Matches ``torch.nn.Sequential``.

    Children are numbered ``"0"``, ``"1"``, ... by position; parameter-free layers
    consume an index, as in torch, so ``Sequential(Linear(256), ReLU(), Linear(10))``
    has ``0.weight``, ``0.bias``, ``2.weight``, ``2.bias``. Given one mapping instead
    (``torch.nn.Sequential(OrderedDict(...))``), or a list of ``(name, layer)`` pairs,
    the children take those names: ``Sequential({"conv": Conv2d(8, 3), "bn":
    BatchNorm2d(), "relu": ReLU()})`` has ``conv.weight``, ``bn.running_mean``, ....

    ``key`` is split per child with ``jax.random.fold_in(key, index)`` (``index`` the
    position, named or not); ``train`` is passed to every child. In ``init`` each child
    with parameters gets ``fold_in(key, ordinal)`` where ``ordinal`` counts only the
    children with parameters before it, so inserting an activation or dropout changes
    no other layer's weights.

    If any child has buffers (BatchNorm), ``init_state(shape)`` returns them under the
    child's name and ``apply(params, x, state=state)`` returns ``(y, new_state)``.

    Args:
      *layers: the children, in order; or a single mapping (or list of ``(name, layer)``
        pairs) of names to children. No default: ``Sequential()`` is the identity.

    Shape:
      input: whatever the first layer takes; output: whatever the last one returns.

    Parameters:
      each child's, under its name (``"0.weight"``, ``"fc.bias"``), with its own init.

    Example:
      >>> mlp = Sequential(L.Linear(3), L.ReLU(), L.Linear(1))
      >>> jax.tree.map(jnp.shape, mlp.init(jax.random.key(0), (5, 2)))
      {'0': {'bias': (3,), 'weight': (3, 2)}, '2': {'bias': (1,), 'weight': (1, 3)}}
      >>> named = Sequential({"fc": L.Linear(3), "act": L.ReLU(), "out": L.Linear(1)})
      >>> list(pl.params.flatten(named.init(jax.random.key(0), (5, 2))))
      ['fc.weight', 'fc.bias', 'out.weight', 'out.bias']
    """

    layers: tuple[Layer, ...]
    names: tuple[str, ...]

    def __init__(self, *layers: Any):
        if len(layers) == 1 and isinstance(layers[0], Mapping):
            pairs = list(layers[0].items())
        elif len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            items = list(layers[0])
            named = bool(items) and all(
                isinstance(i, tuple) and len(i) == 2 and not isinstance(i[0], Layer) for i in items
            )
            pairs = items if named else [(str(i), v) for i, v in enumerate(items)]
        else:
            pairs = [(str(i), v) for i, v in enumerate(layers)]
        numbered = all(name == str(i) for i, (name, _) in enumerate(pairs))
        seen: set[str] = set()
        for name, layer in pairs:
            check_child_name("Sequential", name)
            if name in seen:
                raise ValueError(f"Sequential: two children are named {name!r}")
            seen.add(name)
            if not isinstance(layer, Layer):
                where = name if numbered else repr(name)
                raise ValueError(
                    f"Sequential: layers[{where}] must be a Layer, got {type(layer).__name__} "
                    f"({layer!r}); wrap plain functions in Lambda(fn)"
                )
        object.__setattr__(self, "layers", tuple(layer for _, layer in pairs))
        object.__setattr__(self, "names", tuple(name for name, _ in pairs))

    def __repr__(self) -> str:
        if self.names == tuple(str(i) for i in range(len(self.layers))):
            return f"Sequential({', '.join(map(repr, self.layers))})"
        return f"Sequential({dict(zip(self.names, self.layers, strict=True))!r})"

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, index: int | str | slice) -> Layer:
        """The child at position ``index``, the child named ``index``, or (a slice) a
        ``Sequential`` of those children under their names, as torch slices."""
        if isinstance(index, str):
            return self.children()[index]
        if isinstance(index, slice):
            return Sequential(list(zip(self.names[index], self.layers[index], strict=True)))
        return self.layers[index]

    def __iter__(self) -> Iterator[Layer]:
        return iter(self.layers)

    @property
    def takes_ids(self) -> bool:
        # the first layer with arrays of its own decides (Identity, Dropout, ... before
        # an Embedding pass its ids on, as torch's)
        for layer in self.layers:
            if layer.takes_ids:
                return True
            if layer.own_names() or layer.children():
                return False
        return False

    def children(self) -> dict[str, Layer]:
        return dict(zip(self.names, self.layers, strict=True))

    def _trace(self, key: jax.Array | None, shape: Any, dtype: Any) -> tuple[Params, State]:
        """Params (abstract when ``key`` is None) and state, threading shapes through."""
        first = jnp.int32 if self.takes_ids else dtype
        x = _spec(shape, first)
        params: Params = {}
        state: State = {}
        ordinal = 0
        for name, layer in zip(self.names, self.layers, strict=True):
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
        i = 0
        while i < len(self.names):
            order = [i + 1, i] if self._fused(i, x) else [i]
            for j in order:
                name = self.names[j]
                child_key = None if key is None else jax.random.fold_in(key, j)
                if state is not None and name in state:
                    x, new_state[name] = self.call(
                        name, params, x, key=child_key, train=train, state=state
                    )
                else:
                    x = self.call(name, params, x, key=child_key, train=train)
            i += len(order)
        return x if state is None else (x, new_state)

    def _fused(self, i: int, x: Any) -> bool:
        """Whether child ``i + 1`` runs before child ``i`` on ``x``, because it says the
        two commute and the swapped order is faster (``runs_before``: a max pool after a
        ``ReLU``, ``F.max_pool_commutes_with_relu``), unless a capture wants either
        output, which then sees the written order's values."""
        if i + 1 >= len(self.layers) or not self.layers[i + 1].runs_before(self.layers[i], x):
            return False
        rec = active()
        return rec is None or not any(rec.wanted(rec.name(n)) for n in self.names[i : i + 2])


def _output_spec(layer: Layer, params: Any, state: Any, x: jax.ShapeDtypeStruct) -> Any:
    with paused():
        return _output_spec_of(layer, params, state, x)


def _output_spec_of(layer: Layer, params: Any, state: Any, x: jax.ShapeDtypeStruct) -> Any:
    if jax.tree.leaves(state):

        def run(p, s, x):
            return unchecked(layer)(p, x, state=s)[0]

        return jax.eval_shape(run, _abstract(params), _abstract(state), x)
    return jax.eval_shape(lambda p, x: unchecked(layer)(p, x), _abstract(params), x)


@dataclasses.dataclass(frozen=True)
class Identity(Layer):
    r"""``y = x``.

    Matches ``torch.nn.Identity()`` (torch's ignored arguments are not taken).

    Shape:
      any; output the input itself.

    Parameters: none.

    Example:
      >>> Identity().apply({}, jnp.ones(2))
      Array([1., 1.], dtype=float32)
    """

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        return x


@dataclasses.dataclass(frozen=True)
class Lambda(Layer):
    r"""``y = fn(x)``: a parameter-free function used as a layer.

    torch has no module for it; it stands for a function call in a ``forward``.

    Args:
      fn: the function, required; hashable (a function or a frozen object) so the layer
        stays a valid ``jax.jit`` static argument.

    Shape:
      whatever ``fn`` takes and returns.

    Parameters: none.

    Example:
      >>> Lambda(jnp.tanh).apply({}, jnp.zeros(2))
      Array([0., 0.], dtype=float32)
    """

    fn: Callable[[Any], Any]

    def __post_init__(self):
        if not callable(self.fn):
            raise ValueError(f"Lambda: fn must be callable, got {self.fn!r}")

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        return self.fn(x)
