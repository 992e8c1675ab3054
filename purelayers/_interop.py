"""``Stacked`` nodes for ``flax.serialization``, registered without importing flax.

``flax.serialization`` (``to_state_dict``, ``to_bytes``, ``from_bytes``) knows dicts,
lists, tuples and namedtuples, and any class registered with its
``register_serialization_state``. ``Stacked`` is registered there as soon as
``flax.serialization`` is imported: at once when it already is, else by a finder on
``sys.meta_path`` that runs the registration right after the module's own code (and
then leaves ``sys.meta_path``). Importing purelayers never imports flax.

A ``Stacked`` node's state dict is ``{"tree": <the stacked tree's state dict>}``, the
attribute its key-path entry names (``BlockKey`` is ``GetAttrKey("tree")``), as orbax
names it too; restoring rebuilds the ``Stacked`` node with the target's block count.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

_MODULE = "flax.serialization"


_STACKED: list[type] = []  # the class to register (install's argument)


def _register(module: Any) -> None:
    (Stacked,) = _STACKED
    if module.is_serializable(Stacked):
        return

    def to_state(s: Stacked) -> dict[str, Any]:
        return {"tree": module.to_state_dict(s.tree)}

    def from_state(target: Stacked, state: dict[str, Any]) -> Stacked:
        if not isinstance(state, dict) or set(state) != {"tree"}:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(
                f"flax.serialization: a Stacked node's state is {{'tree': ...}}, got {got} "
                f"at path {module.current_path()}"
            )
        return Stacked(module.from_state_dict(target.tree, state["tree"], name="tree"), target.n)

    module.register_serialization_state(Stacked, to_state, from_state)


class _Loader(importlib.abc.Loader):
    """The module's own loader, with the registration after its code ran."""

    def __init__(self, loader: Any):
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _register(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ... for tools
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _MODULE:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once: later imports find it in sys.modules
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install(stacked: type) -> None:
    """Register ``stacked`` (``trees.Stacked``) with ``flax.serialization`` now or when
    it is imported."""
    _STACKED[:] = [stacked]
    if _MODULE in sys.modules:
        _register(sys.modules[_MODULE])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
