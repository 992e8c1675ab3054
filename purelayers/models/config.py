"""The models' configs: frozen dataclasses with transformers' field names.

``Config.from_dict(config_json)`` takes a ``config.json`` as transformers writes it: the
fields the class declares are read (defaults for absent ones), the rest are ignored;
nested dicts (``rope_scaling``, v5's ``rope_parameters``) become ``Frozen`` mappings and
lists tuples, so the config (and the model holding it) stays hashable.
``to_dict()`` gives the JSON back, with ``model_type``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, TypeVar

from purelayers.layers._checks import ConfigTypeError

__all__ = ["Config", "Frozen"]

C = TypeVar("C", bound="Config")


class Frozen(Mapping):
    """A read-only, hashable mapping (a nested config dict)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] = ()):
        object.__setattr__(self, "_items", {k: _frozen(v) for k, v in dict(items).items()})

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._items.items(), key=lambda kv: kv[0])))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return f"Frozen({self._items!r})"


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return value if isinstance(value, Frozen) else Frozen(value)
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def _thawed(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class Config:
    """Base of every model config; subclasses set ``model_type`` and declare fields."""

    model_type: ClassVar[str] = ""
    # fields a subclass inherits that its transformers config does not have (Mistral's
    # ``attention_bias``): left at their defaults, neither read from nor written to JSON
    not_settings: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        for name in self.not_settings:
            field = next(f for f in dataclasses.fields(self) if f.name == name)
            if getattr(self, name) != field.default:
                raise ValueError(
                    f"{type(self).__name__}: {name} is not a setting of transformers' "
                    f"{type(self).__name__} (the model is built without it), got "
                    f"{getattr(self, name)!r}"
                )
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (Mapping, list)) and not isinstance(value, Frozen):
                object.__setattr__(self, f.name, _frozen(value))

    @classmethod
    def from_dict(cls: type[C], config: Mapping[str, Any]) -> C:
        """The config from a ``config.json`` dict (unknown keys ignored)."""
        if not isinstance(config, Mapping):
            raise ConfigTypeError(
                f"{cls.__name__}.from_dict: expected a dict, got {type(config).__name__}"
            )
        given = config.get("model_type")
        if cls.model_type and given not in (None, cls.model_type):
            raise ValueError(
                f"{cls.__name__}.from_dict: model_type is {given!r}, expected {cls.model_type!r}"
            )
        names = {f.name for f in dataclasses.fields(cls) if f.init} - set(cls.not_settings)
        return cls(**{k: _frozen(v) for k, v in config.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        """The ``config.json`` dict, ``model_type`` included."""
        out = {
            f.name: _thawed(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name not in self.not_settings
        }
        return {"model_type": self.model_type, **out}
