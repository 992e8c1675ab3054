"""Composites that are fields plus ``apply``: children found in fields, and ``init`` /
``init_state`` derived from one abstract run of ``apply``.

A derived ``init`` runs the layer's ``apply`` once under ``jax.eval_shape`` on an input of
the given shape (eval mode). While it runs, ``Layer.call`` notes the input each child
receives and hands the child stand-in params (and state) of the shapes its own ``init``
(``init_state``) builds for that input. The children are then initialized for real, child
``i`` (its ordinal among the children with params, in field order) with
``jax.random.fold_in(key, i)``, and the tree is assembled in field order, torch's order.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

import jax
import jax.numpy as jnp

from purelayers.layers._capture import paused, run_child
from purelayers.layers._checks import LayerError, as_shape, input_dtype, missing_params, need_dtype
from purelayers.layers._fit import takes_two

__all__ = [
    "FrozenDict",
    "apply_child",
    "check_child_name",
    "check_static_train",
    "members",
    "raise_with_path",
    "unchecked",
]


class FrozenDict(Mapping):
    """A dict field of a layer, held frozen: hashable, and equal to another by its items
    in order (``nn.ModuleDict`` keeps insertion order; so does this)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any]):
        object.__setattr__(self, "_items", dict(items))

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenDict):
            return tuple(self._items.items()) == tuple(other._items.items())
        return NotImplemented

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenDict is immutable")

    def __repr__(self) -> str:
        return repr(self._items)


def check_child_name(who: str, name: Any) -> str:
    """A child name is a non-empty string without ``'.'`` (a dot would split the
    checkpoint name)."""
    if not isinstance(name, str) or not name or "." in name:
        raise ValueError(
            f"{who}: child names must be non-empty strings without '.', got {name!r} "
            "(a dot would split the checkpoint name)"
        )
    return name


def is_layers_tuple(value: Any, layer_type: type) -> bool:
    return (
        isinstance(value, (tuple, list))
        and bool(value)
        and all(isinstance(v, layer_type) for v in value)
    )


def is_layers_dict(value: Any, layer_type: type) -> bool:
    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(isinstance(v, layer_type) for v in value.values())
    )


def freeze_fields(layer: Any, layer_type: type) -> None:
    """Hold dict-of-layers fields as ``FrozenDict`` (checking their keys) and
    tuple-of-layers fields as tuples, so the layer stays hashable; a name used by two
    children, or by a child and one of the layer's own arrays, is refused."""
    who = type(layer).__name__
    names: dict[str, str] = {}
    for f in dataclasses.fields(layer):
        value = getattr(layer, f.name, None)
        if is_layers_dict(value, layer_type):
            for key in value:
                check_child_name(f"{who}: {f.name}", key)
            if not isinstance(value, FrozenDict):
                object.__setattr__(layer, f.name, FrozenDict(value))
        elif is_layers_tuple(value, layer_type) and isinstance(value, list):
            object.__setattr__(layer, f.name, tuple(value))
        if (
            isinstance(value, layer_type)
            or is_layers_dict(value, layer_type)
            or (is_layers_tuple(value, layer_type))
        ):
            names[f.name] = f.name
    own = layer.own_names() if hasattr(layer, "own_names") else ()
    for name in own:
        if name in names:
            raise ValueError(
                f"{who}: the name {name!r} is used twice, by a child (field {name!r}) and "
                "by one of the layer's own arrays (own_names)"
            )


def members(layer: Any, layer_type: type) -> list[tuple[str, Any]]:
    """The children a derived ``init`` initializes, by dotted name, in field order: a
    field holding a layer is one; each member of a tuple (``blocks.0``) or dict
    (``heads.cls``) field is one of its own."""
    out: list[tuple[str, Any]] = []
    for f in dataclasses.fields(layer):
        value = getattr(layer, f.name)
        if isinstance(value, layer_type):
            out.append((f.name, value))
        elif is_layers_tuple(value, layer_type):
            out.extend((f"{f.name}.{i}", v) for i, v in enumerate(value))
        elif is_layers_dict(value, layer_type):
            out.extend((f"{f.name}.{k}", v) for k, v in value.items())
    return out


# -- the recording run -------------------------------------------------------------


@dataclasses.dataclass
class _Recording:
    """What a derived ``init`` learns from one abstract run of ``owner.apply``: the input
    of each child (its ``init`` argument) and the abstract params and state it builds."""

    owner: Any
    dtype: Any
    inputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    state: dict[str, Any] = dataclasses.field(default_factory=dict)


_RECORDING: contextvars.ContextVar[_Recording | None] = contextvars.ContextVar(
    "purelayers_recording", default=None
)


def unchecked(layer: Any) -> Callable[..., Any]:
    """``layer.apply`` without the params check (for trees already checked)."""
    fn = type(layer).apply
    raw = getattr(fn, "unchecked", None)
    return fn.__get__(layer) if raw is None else functools.partial(raw, layer)


def _spec(x: Any) -> Any:
    return jax.ShapeDtypeStruct(tuple(jnp.shape(x)), jnp.result_type(x))


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def child_input(child: Any, x: Any, args: tuple) -> Any:
    """What ``child.init`` takes for a call ``child.apply(params, x, *args)``: the specs
    of every positional array for a layer whose ``init`` is derived (it runs its apply on
    them all), of both inputs for a two-input layer (``Bilinear``), else of ``x``."""
    if getattr(type(child).init, "derived", False) and args and all(_is_array(a) for a in args):
        return (_spec(x), *(_spec(a) for a in args))
    if takes_two(child) and args:
        return (tuple(jnp.shape(x)), tuple(jnp.shape(args[0])))
    return _spec(x)


def _stand_in(tree: Any) -> Any:
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)


def _get(tree: Mapping, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, Mapping) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _put(tree: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = value


def recording_call(
    layer: Any, name: str, child: Any, params: Any, x: Any, args: tuple, kwargs: dict
) -> None:
    """Inside a derived ``init``'s run of ``layer.apply``: the first time child ``name``
    is called, note its input and give ``params`` (and ``kwargs["state"]``) stand-in
    entries of the shapes the child builds for it."""
    rec = _RECORDING.get()
    if rec is None or rec.owner is not layer or name in rec.inputs:
        return
    spec = child_input(child, x, args)
    rec.inputs[name] = spec
    abstract = jax.eval_shape(lambda: child.init(jax.random.key(0), spec, rec.dtype))
    rec.params[name] = abstract
    if jax.tree.leaves(abstract) and isinstance(params, dict) and _get(params, name) is None:
        _put(params, name, _stand_in(abstract))
    state = kwargs.get("state")
    if isinstance(state, dict):
        abstract_state = jax.eval_shape(lambda: child.init_state(spec, rec.dtype))
        rec.state[name] = abstract_state
        if jax.tree.leaves(abstract_state) and _get(state, name) is None:
            _put(state, name, _stand_in(abstract_state))


def _inputs(layer: Any, shape: Any, dtype: Any) -> tuple:
    """The example inputs for ``layer.apply``: one shape (or array), or a tuple of them
    for a layer whose apply takes several positional inputs."""
    several = isinstance(shape, (tuple, list)) and bool(shape)
    several = several and all(_is_array(s) or isinstance(s, (tuple, list)) for s in shape)
    shapes = tuple(shape) if several else (shape,)
    first = jnp.int32 if layer.takes_ids else dtype
    return tuple(
        jax.ShapeDtypeStruct(as_shape(s), input_dtype(s, first if i == 0 else dtype))
        for i, s in enumerate(shapes)
    )


def _takes_state(layer: Any) -> bool:
    try:
        return "state" in inspect.signature(type(layer).apply).parameters
    except (TypeError, ValueError):
        return False


def record(layer: Any, shape: Any, dtype: Any, own: Any = None) -> _Recording:
    """Run ``layer.apply`` abstractly on an input of ``shape`` in eval mode, noting each
    child's input (see ``recording_call``)."""
    rec = _Recording(layer, dtype)
    xs = _inputs(layer, shape, dtype)
    stateful = _takes_state(layer)

    def run(*xs: Any) -> Any:
        params = dict(own or {})
        kwargs = {"state": {}} if stateful else {}
        token = _RECORDING.set(rec)
        try:
            return unchecked(layer)(params, *xs, **kwargs)
        finally:
            _RECORDING.reset(token)

    with paused():
        jax.eval_shape(run, *xs)
    return rec


def _unreached(layer: Any, name: str, child: Any, shape: Any) -> LayerError:
    return LayerError(
        type(layer).__name__,
        f"child {name!r} ({type(child).__name__}) has parameters but apply did not call it "
        f"on an input of shape {shape} in eval mode, so the input it takes is unknown",
        None,
        None,
        "call it from apply (self.call(name, params, x)) or write init for this layer",
    )


def _has_arrays(child: Any, layer_type: type) -> bool:
    return bool(child.own_names()) or bool(members(child, layer_type)) or bool(child.children())


def derived_init(
    layer: Any, layer_type: type, key: jax.Array, shape: Any, dtype: Any, own: Any = None
) -> dict:
    """The children's params, each initialized at the input it receives in ``apply``
    (``layer_type``: the class of layers)."""
    kids = members(layer, layer_type)
    if not kids:
        return {}
    rec = record(layer, shape, dtype, own)
    out: dict[str, Any] = {}
    ordinal = 0
    for name, child in kids:
        if name not in rec.inputs:
            if _has_arrays(child, layer_type):
                raise _unreached(layer, name, child, shape)
            continue
        if not jax.tree.leaves(rec.params[name]):
            continue
        # the abstract run already took this input: the child's init accepts it
        _put(out, name, child.init(jax.random.fold_in(key, ordinal), rec.inputs[name], dtype))
        ordinal += 1
    return out


def derived_init_state(layer: Any, layer_type: type, shape: Any, dtype: Any) -> dict:
    """The children's buffers, each built for the input it receives in ``apply``."""
    kids = members(layer, layer_type)
    if not kids or not _takes_state(layer):
        return {}
    rec = record(layer, shape, dtype)
    out: dict[str, Any] = {}
    for name, child in kids:
        if name in rec.state and jax.tree.leaves(rec.state[name]):
            _put(out, name, child.init_state(rec.inputs[name], dtype))
    return out


# -- errors ------------------------------------------------------------------------


def check_static_train(layer: str, train: Any) -> None:
    """``train`` must be a Python bool: under ``jax.jit`` it is traced unless static."""
    if isinstance(train, jax.core.Tracer):
        raise LayerError(
            layer,
            "train is a traced value: jax.jit traces every argument not marked static, and "
            "train picks which computation to build",
            None,
            None,
            "pass it as a static argument: jax.jit(model.apply, static_argnames='train')",
        )


def raise_with_path(error: Exception, parent: str, name: str, child: str) -> NoReturn:
    """Raise ``error`` (any exception raised inside child ``name`` of ``parent``) again
    with its message prefixed by the child's path, as a ``LayerError``'s is
    (``Sequential[blocks.1] Linear: ...``): the same object, so its type and traceback
    stay. An exception whose first argument is not a message gets a note instead."""
    where = getattr(error, "_purelayers_where", None)
    if where is None:
        if error.args and not isinstance(error.args[0], str):
            error.add_note(f"raised in {parent}[{name}] {child}")
            raise error
        message = error.args[0] if error.args else ""
        path, layer = (name,), child
    else:
        message, path, layer = where
        path = (name, *path)
    error._purelayers_where = (message, path, layer)  # type: ignore[attr-defined]
    error.args = (f"{parent}[{'.'.join(path)}] {layer}: {message}", *error.args[1:])
    raise error


# -- applying a child ----------------------------------------------------------------


def in_library(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "purelayers"


def child_part(tree: Any, name: str) -> Any:
    """The entry of ``tree`` at the dotted ``name`` (``{}`` where a level is missing)."""
    for part in name.split("."):
        tree = tree.get(part, {}) if isinstance(tree, Mapping) else {}
    return tree


def apply_child(
    parent: Any, name: str, child: Any, params: Any, x: Any, *args: Any, **kwargs: Any
) -> Any:
    """``child.apply(params, x, *args, **kwargs)`` with errors naming ``parent[name]``.

    ``Layer.call`` looks the child up by name; containers that hold their children's
    params in another form (``Repeat``'s stacked blocks) call this directly.
    """
    # a checking parent's tree was checked: the child runs unchecked
    run = unchecked(child) if hasattr(type(parent).apply, "unchecked") else child.apply
    try:
        need_dtype(type(child).__name__, x, child.accepts)
        return run_child(name, lambda: run(params, x, *args, **kwargs))
    except LayerError as e:
        raise e.within(type(parent).__name__, name) from None
    except ValueError as e:
        if type(e) is not ValueError:  # another library's own kind of error: as it is
            raise
        # a plain ValueError (a custom layer's own shape check): given the path too
        layer = type(child).__name__
        message = str(e).removeprefix(f"{layer}: ")
        raise LayerError(layer, message, None, None).within(type(parent).__name__, name) from e
    except KeyError as e:
        if not e.args or (isinstance(params, Mapping) and e.args[0] in params):
            raise
        state = kwargs.get("state")
        if _a_missing_buffer(child, e.args[0], state, x):
            err = missing_params(type(child).__name__, e, state, what="state")
        else:
            err = missing_params(type(child).__name__, e, params)
        raise err.within(type(parent).__name__, name) from None
    except Exception as e:
        # any other exception keeps its type and gains the child's path in its message
        raise_with_path(e, type(parent).__name__, name, type(child).__name__)


def _a_missing_buffer(child: Any, key: Any, state: Any, x: Any) -> bool:
    """Whether ``key`` is a buffer ``child.init_state`` builds for ``x`` that ``state``
    lacks (so the error is the state's, not the params')."""
    if not isinstance(state, Mapping) or key in state or not hasattr(child, "init_state"):
        return False
    try:
        with paused():
            expected = jax.eval_shape(lambda: child.init_state(tuple(jnp.shape(x))))
    except Exception:  # no expected state for this input: not a buffer
        return False
    return isinstance(expected, Mapping) and key in expected
