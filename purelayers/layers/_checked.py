"""The checks wrapped around every layer class's own ``init``, ``init_state`` and
``apply`` when it is defined (``Layer.__init_subclass__``): the input shape named by the
layer, the params (and state) compared with what ``init`` builds for the input before
``apply`` runs (``_fit.py``), and ``unchecked`` for trees a container already checked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from purelayers.layers._checks import LayerError, as_shape, check_shape, need_dtype
from purelayers.layers._compose import check_static_train, unchecked
from purelayers.layers._fit import check_fit, remember, takes_two

__all__ = ["unchecked"]


def _checking(raw: Callable[..., Any]) -> Callable[..., Any]:
    """``raw`` (a class's own ``apply``) followed by the params (and state) check."""

    @functools.wraps(raw)
    def apply(self: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        # only the most derived apply checks (not a super().apply call), and only when
        # given an input (positionally, as every layer takes it)
        if not args or getattr(type(self).apply, "unchecked", None) is not raw:
            return raw(self, params, *args, **kwargs)
        need_dtype(type(self).__name__, args[0], self.accepts)
        check_static_train(type(self).__name__, kwargs.get("train", False))
        try:
            out = raw(self, params, *args, **kwargs)
        except LayerError as own:
            raise _preferred(own, _misfit(self, params, args, kwargs)) from None
        except Exception:
            mismatch = _misfit(self, params, args, kwargs)
            if mismatch is None:
                raise
            raise mismatch from None
        mismatch = _misfit(self, params, args, kwargs)
        if mismatch is not None:
            raise mismatch
        return out

    apply.unchecked = raw  # type: ignore[attr-defined]
    return apply


def _misfit(layer: Any, params: Any, args: tuple, kwargs: dict) -> LayerError | None:
    """The first params (or state) entry that does not fit this input, or None."""
    x, state = args[0], kwargs.get("state")
    if takes_two(layer):
        if len(args) < 2:
            return None  # the layer's own apply names the missing input
        x = args[:2]
    try:
        check_fit(layer, params, x, "params")
        if state is not None:
            check_fit(layer, state, x, "state")
    except LayerError as mismatch:
        return mismatch
    return None


def _preferred(own: LayerError, mismatch: LayerError | None) -> LayerError:
    """The error to report when the layer's own checks refused a call: theirs (an input
    of the wrong width for these params, say), with a misfit entry named under it; but
    an entry of another kind, which is wrong whatever the input (the error it causes
    downstream is only its symptom)."""
    if mismatch is None:
        return own
    if mismatch.what.endswith(" dtype") and " entry " not in own.what:
        return mismatch
    if mismatch.what.endswith(" shape") and str(mismatch).splitlines()[0] not in str(own):
        misfit = f"the params do not fit this input either: {str(mismatch).splitlines()[0]}"
        own.hint = f"{own.hint}\n  {misfit}" if own.hint else misfit
        own.args = (own._message(),)
    return own


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
