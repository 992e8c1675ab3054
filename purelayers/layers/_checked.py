"""The checks wrapped around every layer class's own ``init``, ``init_state`` and
``apply`` when it is defined (``Layer.__init_subclass__``): the input shape named by the
layer, the params (and state) compared with what ``init`` builds for the input before
``apply`` runs (``_fit.py``), and ``unchecked`` for trees a container already checked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from purelayers.layers._capture import paused
from purelayers.layers._checks import LayerError, as_shape, check_shape, need_dtype
from purelayers.layers._fit import check_fit, remember, takes_two

__all__ = ["unchecked"]


def _checking(raw: Callable[..., Any]) -> Callable[..., Any]:
    """``raw`` (a class's own ``apply``) preceded by the params (and state) check."""

    @functools.wraps(raw)
    def apply(self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        # only the most derived apply checks (not a super().apply call), and only when
        # given an input (positionally, as every layer takes it)
        if args and getattr(type(self).apply, "unchecked", None) is raw:
            need_dtype(type(self).__name__, args[0], self.accepts)
            _check_call(self, raw, params, args, kwargs)
        return raw(self, params, *args, **kwargs)

    apply.unchecked = raw  # type: ignore[attr-defined]
    return apply


def _check_call(layer: Any, raw: Callable[..., Any], params: Any, args: tuple, kwargs: dict):
    x, state = args[0], kwargs.get("state")
    if takes_two(layer):
        if len(args) < 2:
            return  # the layer's own apply names the missing input
        x = args[:2]
    try:
        check_fit(layer, params, x, "params")
        if state is not None:
            check_fit(layer, state, x, "state")
    except LayerError as mismatch:
        # Where the layer's own checks refuse this call (an input of the wrong width for
        # these params, say), theirs is the message, and the misfit entry is named under it.
        try:
            with paused():
                jax.eval_shape(lambda: raw(layer, params, *args, **kwargs))
        except LayerError as own:
            if mismatch.what.endswith(" dtype") and " entry " not in own.what:
                # an entry of another kind is wrong whatever the input (the error it
                # causes downstream, an integer activation, say, is only its symptom)
                raise mismatch from None
            if mismatch.what.endswith(" shape") and str(mismatch).splitlines()[0] not in str(own):
                misfit = f"the params do not fit this input either: {str(mismatch).splitlines()[0]}"
                own.hint = f"{own.hint}\n  {misfit}" if own.hint else misfit
                own.args = (own._message(),)
            raise
        except Exception:  # the mismatch is the error to report
            pass
        raise mismatch from None


def _checking_shape(raw: Callable[..., Any]) -> Callable[..., Any]:
    """``raw`` (a class's own ``init``) after checking ``shape`` names this layer.

    A layer written outside the library gets ``shape`` as a tuple of ints even when it
    is given an example array or a ``jax.ShapeDtypeStruct`` (as containers pass their
    children), so ``shape[-1]`` is the input width however the layer is reached."""
    users = not raw.__module__.startswith("purelayers.")

    @functools.wraps(raw)
    def init(self: Any, key: Any, shape: Any, *args: Any, **kwargs: Any) -> Any:
        check_shape(type(self).__name__, shape)
        if users and hasattr(shape, "shape") and hasattr(shape, "dtype"):
            shape = as_shape(shape)
        params = raw(self, key, shape, *args, **kwargs)
        most_derived = getattr(type(self).init, "unchecked", None) is raw
        if most_derived and len(args) <= 1 and kwargs.keys() <= {"dtype"}:
            remember(self, as_shape(shape), params)
        return params

    init.unchecked = raw  # type: ignore[attr-defined]
    return init


def _checking_state_shape(raw: Callable[..., Any]) -> Callable[..., Any]:
    """``raw`` (a class's own ``init_state``) after checking ``shape``, an error naming
    this layer's ``init_state``."""

    @functools.wraps(raw)
    def init_state(self: Any, shape: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            check_shape(type(self).__name__, shape)
        except ValueError as e:
            raise ValueError(str(e).replace(".init: ", ".init_state: ", 1)) from None
        return raw(self, shape, *args, **kwargs)

    init_state.unchecked = raw  # type: ignore[attr-defined]
    return init_state


def unchecked(layer: Any) -> Callable[..., Any]:
    """``layer.apply`` without the params check (for trees already checked)."""
    fn = type(layer).apply
    raw = getattr(fn, "unchecked", None)
    return fn.__get__(layer) if raw is None else functools.partial(raw, layer)
