"""Intermediate values by name: ``pl.capture(model.apply, "*.attn")(params, x)``.

A capture is active for the duration of one call of the wrapped function, in a
``contextvars.ContextVar`` (so threads and nested captures do not see each other's).
``Layer.call`` (through ``apply_child``) reports each child's return value under its
dotted path relative to the model; containers whose children run inside a JAX
transformation (``Repeat``'s ``lax.scan``, ``Remat``'s ``jax.checkpoint``) collect
their children's values inside it and return them as outputs, so no tracer leaves its
trace. Nothing is stored on the model or in its params.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax

from purelayers._patterns import check_pattern, matches

__all__ = ["capture"]


class _Recorder:
    """Values reported under ``path`` (the names of the children being applied), kept
    where ``wanted(name)`` is true."""

    def __init__(self, wanted: Callable[[str], bool], path: tuple[str, ...] = ()):
        self.wanted, self.path = wanted, path
        self.values: dict[str, Any] = {}

    def name(self, child: str) -> str:
        return ".".join((*self.path, child))


_ACTIVE: contextvars.ContextVar[_Recorder | None] = contextvars.ContextVar(
    "purelayers_capture", default=None
)


# A jit-cache-sensitive context (``jax.make_user_context``): a capture calls ``fn`` under a
# token of its own, so a jitted function that ``fn`` calls is traced again under it rather
# than served from a cache filled outside the capture (where no sublayer was reported).
_TRACE_TOKEN = jax.make_user_context(default_value=None)


def active() -> _Recorder | None:
    return _ACTIVE.get()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No capture inside (abstract evaluations of ``init`` and ``apply`` made for
    checks: their tracers must not be reported)."""
    token = _ACTIVE.set(None)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


@contextlib.contextmanager
def _activated(recorder: _Recorder | None) -> Iterator[None]:
    token = _ACTIVE.set(recorder)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def run_child(name: str, fn: Callable[[], Any]) -> Any:
    """``fn()`` (a child's apply) with ``name`` pushed on the active capture's path, its
    return value recorded if the full name is wanted."""
    rec = _ACTIVE.get()
    if rec is None:
        return fn()
    full = rec.name(name)
    inner = _Recorder(rec.wanted, (*rec.path, name))
    inner.values = rec.values
    with _activated(inner):
        out = fn()
    if rec.wanted(full):
        rec.values[full] = out
    return out


def collect(fn: Callable[..., Any], wanted: Callable[[str], bool]) -> Callable[..., Any]:
    """``fn`` returning ``(out, values)``: the values its children report (names relative
    to the current path) where ``wanted(relative name)``, for a container to thread out
    of a transformation as outputs. Without an active capture, ``fn`` unchanged."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        rec = _Recorder(wanted)
        with _activated(rec):
            out = fn(*args, **kwargs)
        return out, rec.values

    return run


def capture(fn: Callable[..., Any], *patterns: str) -> Callable[..., Any]:
    """``fn`` (a model's ``apply``, or any function calling it) returning ``(output,
    {name: value})``: the return value of every sublayer whose dotted path relative to
    the model matches one of ``patterns``.

    A sublayer is a child applied by a container or through ``Layer.call``: ``"0"``,
    ``"blocks.3.attn"``, ``"transformer.h.11.mlp"`` (a ``Repeat``'s blocks by index, as
    their checkpoint names); the model itself is not one. Patterns are those of
    ``purelayers.params.label``: a glob on the whole name where ``*`` also matches dots,
    or ``"re:<regex>"``. The value is what the sublayer returned (``(y, new_state)``
    for a layer given ``state=``). Works eagerly and under ``jax.jit``, ``jax.grad``
    and ``jax.vmap`` of the captured function; the model and its plain ``apply`` are
    unchanged, and a name that matches no sublayer is simply absent. ``fn`` itself
    must not be jitted (a ``ValueError`` says so): a compiled function's sublayers run
    in its own trace, out of the capture's sight; jit the captured function instead.

    Example:
      >>> model = L.Sequential({"embed": L.Linear(8), "act": L.GELU(), "head": L.Linear(2)})
      >>> params = model.init(jax.random.key(0), (4, 3))
      >>> probe = pl.capture(model.apply, "embed", "act")
      >>> out, acts = jax.jit(probe)(params, jnp.ones((4, 3)))
      >>> sorted(acts), acts["act"].shape
      (['act', 'embed'], (4, 8))

    Equivalent of registering forward hooks (``register_forward_hook``) on the matched
    ``torch.nn`` modules and keeping their outputs.
    """
    if not patterns:
        raise ValueError("capture: give at least one pattern (a sublayer name or glob)")
    if callable(getattr(fn, "lower", None)) and hasattr(fn, "__wrapped__"):
        raise ValueError(f"capture: fn is already jitted ({_JITTED_HINT})")
    for i, p in enumerate(patterns):
        check_pattern(p, f"capture: patterns[{i}]")

    def wanted(name: str) -> bool:
        return any(matches(p, name) for p in patterns)

    # one token per capture, renewed after a leak: a jitted callee is traced (and its
    # reports found dead) on every call, never served empty from its cache
    token = [object()]

    @functools.wraps(fn)
    def captured(*args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        rec = _Recorder(wanted)
        with _activated(rec), _TRACE_TOKEN(token[0]):
            out = fn(*args, **kwargs)
        try:
            _check_not_leaked(out, rec.values)
        except ValueError:
            token[0] = object()
            raise
        return out, dict(rec.values)

    return captured


_JITTED_HINT = (
    "a compiled function runs its sublayers inside its own trace, which a capture "
    "around it cannot see; capture the plain function and jit the result: "
    "jax.jit(pl.capture(model.apply, ...))"
)


def _check_not_leaked(out: Any, values: dict[str, Any]) -> None:
    """Values recorded inside a ``jax.jit`` that ``fn`` calls (rather than one around
    the capture) are that trace's tracers, dead once it returns: an error, not a
    result that fails later or comes back empty from the compilation cache."""
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(out)):
        return  # under a transformation of the captured function: values are its tracers
    leaked = [
        name
        for name, value in values.items()
        if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(value))
    ]
    if leaked:
        raise ValueError(
            f"capture: the values of {leaked} were recorded inside a jitted function that "
            f"fn calls ({_JITTED_HINT})"
        )


def _block_name(rec: _Recorder, i: int, rest: str) -> str:
    """``rest`` (``"*"`` or ``"*.attn"``: a name inside a scanned block) for block ``i``."""
    return ".".join((*rec.path, str(i) + rest[1:]))


def scanned(rec: _Recorder, n: int) -> Callable[[str], bool]:
    """Which names inside a ``Repeat``'s scanned block (``"*"``, ``"*.attn"``, ...) some
    block ``0..n-1`` of the active capture wants."""
    return lambda rest: any(rec.wanted(_block_name(rec, i, rest)) for i in range(n))


def record_blocks(rec: _Recorder, stacked: dict[str, Any], n: int) -> None:
    """Values collected in a scan over ``n`` blocks (leading axis ``n``), recorded per
    block under the block's index, where wanted."""
    for rest, value in stacked.items():
        for i in range(n):
            name = _block_name(rec, i, rest)
            if rec.wanted(name):
                rec.values[name] = jax.tree.map(lambda a, i=i: a[i], value)


def inner(rec: _Recorder) -> Callable[[str], bool]:
    """Which names relative to the active capture's path it wants (for ``collect``)."""
    return lambda rest: rec.wanted(".".join((*rec.path, rest)))


def record(rec: _Recorder, values: dict[str, Any]) -> None:
    """Values ``collect`` returned (names relative to ``rec``'s path)."""
    for rest, value in values.items():
        rec.values[".".join((*rec.path, rest))] = value
