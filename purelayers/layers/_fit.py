"""Whether a params (or state) tree fits a layer: the names and shapes its ``init`` (or
``init_state``) builds for the input ``apply`` is given, compared entry by entry.

``Layer.apply`` runs this once per trace, at the outermost layer called (children are
covered by their parent's tree). A missing, unexpected or wrongly shaped entry raises
``LayerError`` naming the layer that owns it, its path, the key, expected and got::

    Sequential[2] Linear: params entry 'weight' shape expected (3, 8), got (3, 7)
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.layers._capture import paused
from purelayers.layers._checks import _KINDS, LayerError, dtype_kind
from purelayers.trees import Stacked

__all__ = ["check_fit", "expected_tree"]


def takes_two(layer: Any) -> bool:
    """Whether ``layer.init`` takes both inputs' shapes (``Bilinear``: ``_two_inputs``)."""
    return getattr(type(layer).init, "two_inputs", False)


def _abstract_input(layer: Any, x: Any) -> Any:
    """The input as ``init`` sees it (for a layer of two inputs, ``x`` is the pair and
    so is this: their shapes), or None when ``x`` is not one array (or two)."""
    try:
        if takes_two(layer):
            return tuple(tuple(int(d) for d in jnp.shape(a)) for a in x)
        shape = tuple(int(d) for d in jnp.shape(x))
    except (TypeError, ValueError):
        return None
    return jax.ShapeDtypeStruct(shape, jnp.int32 if layer.takes_ids else jnp.float32)


def _expected(layer: Any, spec: jax.ShapeDtypeStruct, what: str) -> Any:
    if what == "params":
        # the key is made inside: nothing of this enters an enclosing trace
        return jax.eval_shape(lambda: layer.init(jax.random.key(0), spec, jnp.float32))
    return jax.eval_shape(lambda: layer.init_state(spec, jnp.float32))


class _Memo:
    """The expected trees already built, by (layer, input spec, what): the trees are
    pure functions of those, so this only saves tracing ``init`` again (``init`` itself
    primes it). Bounded, least recently used out first. A cache, not state: ``apply``
    takes every shape from its input and gives the same result and the same errors
    without it (each miss traces ``init`` abstractly, a visible share of a transformer's
    first call in a fresh process)."""

    def __init__(self, size: int = 512):
        self.size, self.items = size, collections.OrderedDict()

    def get(self, key: Any) -> Any:
        value = self.items.get(key)
        if value is not None:
            self.items.move_to_end(key)
        return value

    def put(self, key: Any, value: Any) -> None:
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.size:
            self.items.popitem(last=False)


_MEMO = _Memo()


def _identity(layer: Any) -> Any:
    """``layer`` as a memo key. Layers compare by configuration; a model that builds its
    children from its config (``purelayers.models``) and a copy with replaced children
    (``lora.wrap``) compare equal, so their children (at every depth) are part of the
    key."""
    kids = layer.children() if hasattr(layer, "children") else {}
    if not kids:
        return layer
    return (layer, tuple((name, _identity(child)) for name, child in kids.items()))


def _expected_cached(layer: Any, spec: jax.ShapeDtypeStruct, what: str) -> Any:
    key = (type(layer), _identity(layer), spec, what)
    value = _MEMO.get(key)
    if value is None:
        value = _expected(layer, spec, what)
        _MEMO.put(key, value)
    return value


def remember(layer: Any, shape: tuple[int, ...], params: Any) -> None:
    """What ``init`` just built for ``shape``, so checking ``apply`` on that input
    traces nothing more."""
    spec = jax.ShapeDtypeStruct(shape, jnp.int32 if layer.takes_ids else jnp.float32)
    abstract = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)), params
    )
    with contextlib.suppress(TypeError):  # a layer holding an unhashable value
        _MEMO.put((type(layer), _identity(layer), spec, "params"), abstract)


def expected_tree(layer: Any, x: Any, what: str) -> Any:
    """The abstract tree ``init`` (``what="params"``) or ``init_state`` (``"state"``)
    builds for input ``x``; None where it cannot be built for it (``x`` is not one
    array, or ``init`` itself refuses the shape: ``apply`` then names the problem)."""
    spec = _abstract_input(layer, x)
    if spec is None:
        return None
    with paused():
        return _expected_or_none(layer, spec, what)


def _expected_or_none(layer: Any, spec: jax.ShapeDtypeStruct, what: str) -> Any:
    try:
        try:
            return _expected_cached(layer, spec, what)
        except TypeError:  # a layer holding an unhashable value: not memoized
            return _expected(layer, spec, what)
    except (ValueError, TypeError, ZeroDivisionError):
        return None


def _describe(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, Stacked):
        return f"a Stacked tree of {value.n} blocks"
    if isinstance(value, Mapping):
        return f"a dict with keys {sorted(value)}"
    if hasattr(value, "shape"):
        return f"an array of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r}"


def _own(expected: Any) -> str:
    if isinstance(expected, Mapping):
        names = [f"{k} {_shape_text(v)}" for k, v in expected.items()]
        return ", ".join(names) if names else "no arrays"
    return _shape_text(expected)


def _shape_text(v: Any) -> str:
    if isinstance(v, Mapping):
        return "{...}"
    if isinstance(v, Stacked):
        return f"Stacked[{v.n}]"
    return str(tuple(v.shape))


class _Walk:
    """One comparison: ``root`` is the outermost layer's class name, ``what`` is
    ``"params"`` or ``"state"``."""

    def __init__(self, root: str, what: str, shape: tuple[int, ...]):
        self.root, self.what, self.shape = root, what, shape

    def fail(self, layer: Any, path: tuple[str, ...], key: str, expected: str, got: str, hint):
        raise LayerError(
            type(layer).__name__,
            f"{self.what} entry {key!r}",
            expected,
            got,
            hint,
            path=path,
            root=self.root if path else None,
        )

    def layer(self, layer: Any, expected: Any, given: Any, path: tuple[str, ...]) -> None:
        """``given`` against ``expected``, both the tree of ``layer`` at ``path``."""
        if isinstance(expected, Stacked):
            self.stacked(layer, expected, given, path)
            return
        if not isinstance(given, Mapping):
            if given is None and not jax.tree.leaves(expected):
                return
            raise LayerError(
                type(layer).__name__,
                f"{self.what} expected a dict (the tree {self._maker()} returns),",
                _own(expected),
                _describe(given),
                path=path,
                root=self.root if path else None,
            )
        kids = layer.children()
        missing = [
            k
            for k in expected
            if k not in given and not (k in kids and not jax.tree.leaves(expected[k]))
        ]
        if missing:
            hint = (
                f"{type(layer).__name__} {self.what}: {_own(expected)}; pass the tree "
                f"{self._maker()} returns (or a checkpoint loaded into it)"
            )
            if len(missing) == 1:
                key = missing[0]
                self.fail(layer, path, key, self._entry(kids, key, expected[key]), "nothing", hint)
            raise LayerError(
                type(layer).__name__,
                f"{self.what} entries {', '.join(map(repr, missing))}",
                "; ".join(f"{k}: {self._entry(kids, k, expected[k])}" for k in missing),
                "nothing",
                hint,
                path=path,
                root=self.root if path else None,
            )
        for key in given:
            if key not in expected:
                if key in kids and not jax.tree.leaves(given[key]):
                    continue
                self.fail(
                    layer,
                    path,
                    key,
                    "no such entry",
                    _describe(given[key]),
                    f"{type(layer).__name__} {self.what}: {_own(expected)}"
                    + (
                        "; a setting that switches an array off leaves its name out"
                        if key not in kids
                        else ""
                    ),
                )
        for key, sub in expected.items():
            if key in kids:
                self.layer(kids[key], sub, given.get(key), (*path, key))
            else:
                self.leaves(layer, path, key, sub, given[key], ())

    def _entry(self, kids: dict, key: str, sub: Any) -> str:
        if key in kids:
            return f"{type(kids[key]).__name__}'s {self.what} ({_own(sub)})"
        return f"an array of shape {_shape_text(sub)}" if not isinstance(sub, Mapping) else "a dict"

    def _maker(self) -> str:
        return "init" if self.what == "params" else "init_state"

    def stacked(self, layer: Any, expected: Stacked, given: Any, path: tuple[str, ...]) -> None:
        kids = layer.children()
        block = next(iter(kids.values()), None)
        if isinstance(given, Mapping) and given and all(str(k).isdigit() for k in given):
            # per-block trees (Repeat.unstack): each block against one block's tree
            one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), expected.tree)
            self.layer(layer, {str(i): one for i in range(expected.n)}, given, path)
            return
        if not isinstance(given, Stacked):
            raise LayerError(
                type(layer).__name__,
                f"{self.what} expected the Stacked tree {self._maker()} returns,",
                f"Stacked[{expected.n}]",
                _describe(given),
                "per-block trees become one with Repeat.stack(blocks)",
                path=path,
                root=self.root if path else None,
            )
        if given.n != expected.n:
            raise LayerError(
                type(layer).__name__,
                f"{self.what} blocks",
                expected.n,
                given.n,
                path=path,
                root=self.root if path else None,
            )
        if block is not None:
            self.layer(block, expected.tree, given.tree, (*path, "*"))

    def leaves(self, layer: Any, path: tuple[str, ...], key: str, expected: Any, given: Any, sub):
        """An own entry of ``layer`` (an array, or a dict of them in a custom layer)."""
        name = ".".join((key, *sub))
        if isinstance(expected, Mapping):
            if not isinstance(given, Mapping):
                self.fail(layer, path, name, "a dict", _describe(given), None)
            for k in expected:
                if k not in given:
                    self.fail(layer, path, f"{name}.{k}", _shape_text(expected[k]), "nothing", None)
            for k in given:
                if k not in expected:
                    self.fail(
                        layer, path, f"{name}.{k}", "no such entry", _describe(given[k]), None
                    )
            for k in expected:
                self.leaves(layer, path, key, expected[k], given[k], (*sub, k))
            return
        shape = getattr(given, "shape", None)
        if shape is None or isinstance(given, (Mapping, Stacked)):
            self.fail(
                layer,
                path,
                name,
                f"an array of shape {_shape_text(expected)}",
                _describe(given),
                None,
            )
        if not isinstance(given, (jax.Array, np.ndarray, np.generic)):
            self.fail(
                layer,
                path,
                name,
                "a JAX or NumPy array",
                f"{type(given).__module__}.{type(given).__name__}",
                "an abstract tree (pl.params.abstract, jax.eval_shape) holds no values; "
                "torch tensors load through pl.params.load_state_dict",
            )
        if tuple(shape) != tuple(expected.shape):
            raise LayerError(
                type(layer).__name__,
                f"{self.what} entry {name!r} shape",
                tuple(expected.shape),
                tuple(shape),
                f"for an input of shape {self.shape}, {self._maker()} builds {name!r} as "
                f"{tuple(expected.shape)}",
                path=path,
                root=self.root if path else None,
            )
        kind = dtype_kind(expected.dtype)
        if dtype_kind(given.dtype) != kind:
            raise LayerError(
                type(layer).__name__,
                f"{self.what} entry {name!r} dtype",
                f"{'an integer dtype' if kind == 'integer' else _KINDS[kind]} (as "
                f"{self._maker()} builds it)",
                jnp.dtype(given.dtype).name,
                "as torch, which refuses a parameter or buffer of another kind; cast the "
                "tree (pl.params.load_state_dict casts to its template's dtypes)",
                path=path,
                root=self.root if path else None,
            )


def check_fit(layer: Any, tree: Any, x: Any, what: str = "params") -> bool:
    """Raise ``LayerError`` where ``tree`` does not fit ``layer`` for input ``x``;
    True if it was checked, False where no expected tree could be built."""
    expected = expected_tree(layer, x, what)
    if expected is None:
        return False
    if isinstance(expected, dict):
        expected = layer.ordered(expected)  # torch's order in messages
    shape = tuple(tuple(jnp.shape(a)) for a in x) if takes_two(layer) else tuple(jnp.shape(x))
    _Walk(type(layer).__name__, what, shape).layer(layer, expected, tree, ())
    return True
