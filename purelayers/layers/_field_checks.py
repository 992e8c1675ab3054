"""The checks every layer's fields get at construction, after its own
``__post_init__`` (``Layer.__init_subclass__`` wraps it): bool fields hold a bool, and
``*_init`` fields an initializer."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from purelayers import init as _initializers
from purelayers.layers._checks import ConfigTypeError


def check_fields(layer: Any) -> None:
    """Every bool field holds True or False; every ``*_init`` field an initializer."""
    _check_flags(layer)
    _check_initializers(layer)


# the initializer factories of ``purelayers.init`` (``pl.init.zeros`` makes an initializer)
_FACTORIES = tuple(
    n for n in _initializers.__all__ if n not in ("Initializer", "calculate_gain", "fans")
)


def _check_initializers(layer: Any) -> None:
    """Every ``*_init`` field is an initializer ``fn(key, shape, dtype)`` or None."""
    for f in dataclasses.fields(layer):
        value = getattr(layer, f.name, None)
        if not f.name.endswith("_init") or value is None:
            continue
        factory = next((n for n in _FACTORIES if getattr(_initializers, n, None) is value), None)
        if factory is not None:
            raise ConfigTypeError(
                f"{type(layer).__name__}: {f.name} must be an initializer fn(key, shape, "
                f"dtype) or None, got the factory pl.init.{factory} itself (call it: "
                f"pl.init.{factory}())"
            )
        if not callable(value):
            if isinstance(value, str) and value in _initializers.__all__:
                example = f"pl.init.{value}()"
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                example = f"pl.init.constant({value})"
            else:
                example = "pl.init.normal(std=0.02)"
            raise ConfigTypeError(
                f"{type(layer).__name__}: {f.name} must be an initializer fn(key, shape, "
                f"dtype) or None, got {value!r} (for example {example})"
            )


def _check_flags(layer: Any) -> None:
    """Every field declared ``bool`` holds ``True`` or ``False``: a string
    such as ``"False"`` or a number would be read by its truth value, silently."""
    for f in dataclasses.fields(layer):
        if f.type not in ("bool", bool):
            continue
        value = getattr(layer, f.name, None)
        if not isinstance(value, bool):
            raise ConfigTypeError(
                f"{type(layer).__name__}: {f.name} must be True or False, got {value!r}"
            )


def checking_fields(post: Callable[..., Any]) -> Callable[..., Any]:
    """A class's own ``__post_init__``, then ``check_fields``."""

    @functools.wraps(post)
    def __post_init__(self: Any) -> None:
        post(self)
        check_fields(self)

    __post_init__.unchecked = post  # type: ignore[attr-defined]
    return __post_init__
