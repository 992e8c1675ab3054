"""Weight tying: ``Tied``, a layer whose checkpoint names include aliases of others
(GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from purelayers.layers._checks import LayerError
from purelayers.layers.core import Layer, Params
from purelayers.layers.repeat import Repeat

__all__ = ["Tied"]


def _owner(layer: Layer, dotted: str) -> tuple[Layer, str] | None:
    """The layer that owns the array ``dotted`` (relative to ``layer``) and its own name
    there, or ``None`` if no such array is declared."""
    *path, leaf = dotted.split(".")
    for part in path:
        kids = layer.children()
        if part not in kids:
            return None
        layer = kids[part]
    return (layer, leaf) if leaf in layer.own_names() else None


def _stacked_at(layer: Layer, dotted: str) -> str | None:
    """The path of the ``Repeat`` whose stacked blocks hold ``dotted``, if one does."""
    parts = dotted.split(".")
    for i, part in enumerate(parts[:-1]):
        if isinstance(layer, Repeat):
            return ".".join(parts[:i]) or "the root"
        layer = layer.children()[part]
    return None


def _get(tree: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, Mapping) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _without(tree: Params, parts: list[str]) -> Params:
    """``tree`` without the array at ``parts``; groups left empty are dropped."""
    head, *rest = parts
    out = dict(tree)
    if rest:
        sub = _without(tree[head], rest)
        if sub:
            out[head] = sub
        else:
            del out[head]
    else:
        del out[head]
    return out


def _with(tree: Params, parts: list[str], value: Any) -> Params:
    head, *rest = parts
    out = dict(tree)
    out[head] = _with(tree.get(head, {}), rest, value) if rest else value
    return out


@dataclasses.dataclass(frozen=True, init=False)
class Tied(Layer):
    r"""``y = layer(x)`` with ``params[alias] = params[original]`` for every tied pair.

    Matches torch's weight tying (``lm_head.weight = transformer.wte.weight``; torch has
    no module for it): each alias is the same array as its original.

    The params tree holds the original only; ``apply`` hands ``layer`` the original's
    array under both names, so ``jax.grad`` sums the gradients of both uses into it (as
    torch's tied parameter accumulates them) and an optax step moves it once. Names,
    state and order are otherwise ``layer``'s.

    Checkpoints (pass ``model=`` to ``purelayers.params``' functions): files and
    ``state_dict``\ s load with or without the alias (when present it must equal the
    original, else the load fails naming both); ``save`` writes the original only, as
    Hugging Face does, and the alias too with ``write_aliases=True``, for torch's strict
    ``load_state_dict``.

    Args:
      layer: the untied layer, written as its torch twin is (a ``Linear`` head and an
        ``Embedding``, say). Required.
      aliases: ``{alias: original}``, dotted names relative to ``layer``; both must be
        arrays ``layer`` declares (``own_names`` of the child they name), of one shape.
        Required, non-empty.

    Shape:
      whatever ``layer`` takes and returns.

    Parameters:
      ``layer``'s, without the aliases (each original keeps its name, shape and init).

    Raises:
      ValueError: at construction, a name that is no declared array of ``layer`` (or
        one in a ``Repeat``'s stacked blocks), an alias that is also an original, or a
        name tied to itself.

    Example:
      >>> lm = Tied(L.Sequential({"wte": L.Embedding(10, 4), "lm_head": L.Linear(10, bias=False)}),
      ...           {"lm_head.weight": "wte.weight"})
      >>> list(pl.params.flatten(lm.init(jax.random.key(0), (2, 3))))
      ['wte.weight']
    """

    layer: Layer
    ties: tuple[tuple[str, str], ...]

    def __init__(self, layer: Layer, aliases: Mapping[str, str]):
        if not isinstance(layer, Layer):
            raise ValueError(f"Tied: layer must be a Layer, got {layer!r}")
        if not isinstance(aliases, Mapping) or not aliases:
            raise ValueError(
                f"Tied: aliases must be a non-empty mapping of alias to original, got {aliases!r}"
            )
        for alias, original in aliases.items():
            for role, name in (("alias", alias), ("original", original)):
                if not isinstance(name, str) or _owner(layer, name) is None:
                    raise ValueError(
                        f"Tied: {role} {name!r} names no array of {type(layer).__name__}; "
                        "name a parameter its children declare (e.g. 'lm_head.weight')"
                    )
                stack = _stacked_at(layer, name)
                if stack is not None:
                    raise ValueError(
                        f"Tied: {role} {name!r} lies in the stacked blocks of the Repeat at "
                        f"{stack!r}, which holds one array per name for all its blocks; tie "
                        "arrays outside it, or build the blocks with Sequential"
                    )
            if alias == original:
                raise ValueError(f"Tied: {alias!r} is tied to itself")
            if alias in aliases.values():
                raise ValueError(f"Tied: {alias!r} is both an alias and an original")
        object.__setattr__(self, "layer", layer)
        object.__setattr__(self, "ties", tuple(aliases.items()))

    @property
    def takes_ids(self) -> bool:
        return self.layer.takes_ids

    def children(self) -> dict[str, Layer]:
        return self.layer.children()

    def own_names(self) -> tuple[str, ...]:
        return self.layer.own_names()

    def aliases(self) -> dict[str, str]:
        return {**self.layer.aliases(), **dict(self.ties)}

    def ordered(self, tree: dict[str, Any]) -> dict[str, Any]:
        return self.layer.ordered(tree)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        params = self.layer.init(key, shape, dtype)
        for alias, original in self.ties:
            a, o = _get(params, alias), _get(params, original)
            if a is None or o is None or jnp.shape(a) != jnp.shape(o):
                raise LayerError(
                    "Tied",
                    f"{alias!r} and {original!r} must be arrays of one shape",
                    jnp.shape(o) if o is not None else "an array",
                    jnp.shape(a) if a is not None else "no array",
                )
            params = _without(params, alias.split("."))
        return params

    def init_state(self, shape: Any, dtype: Any = jnp.float32) -> Any:
        return self.layer.init_state(shape, dtype)

    def init_cache(self, *args: Any, **kwargs: Any) -> Any:
        """``layer``'s decoding cache."""
        return self.layer.init_cache(*args, **kwargs)

    def untie(self, params: Params) -> Params:
        """``params`` with every alias present (the original's array): ``layer``'s tree."""
        for alias, original in self.ties:
            value = _get(params, original)
            if value is None:
                raise LayerError(
                    "Tied",
                    f"params has no entry {original!r} (the original of {alias!r})",
                    None,
                    None,
                )
            params = _with(params, alias.split("."), value)
        return params

    def apply(self, params: Params, x: Any, *args: Any, **kwargs: Any) -> Any:
        """``layer.apply`` with each alias bound to its original's array."""
        return self.layer.apply(self.untie(params), x, *args, **kwargs)
