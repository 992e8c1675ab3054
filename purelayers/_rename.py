"""Moving checkpoints between naming conventions: ``rename`` and the shipped name maps.

Public through ``purelayers.params``.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["PURELAYERS_TO_TORCH_MHA", "TORCH_MHA_TO_PURELAYERS", "rename"]


def _rule_renamer(rules: Mapping[str, str | None]) -> Callable[[str], str | None]:
    table: dict[str, list[tuple[list[str], list[str] | None]]] = {}
    for old, new in rules.items():
        if not isinstance(old, str) or not old or not all(old.split(".")):
            raise ValueError(f"rename: rule {old!r} is not a dotted name")
        if new is not None and not isinstance(new, str):
            raise ValueError(f"rename: rule {old!r} maps to {new!r}, not a str or None")
        table.setdefault(old.split(".")[0], []).append(
            (old.split("."), None if new is None else [p for p in new.split(".") if p])
        )
    for candidates in table.values():
        candidates.sort(key=lambda rule: -len(rule[0]))

    def renamer(name: str) -> str | None:
        parts, out, i = name.split("."), [], 0
        while i < len(parts):
            rule = next(
                (r for r in table.get(parts[i], ()) if parts[i : i + len(r[0])] == r[0]), None
            )
            if rule is None:
                out.append(parts[i])
                i += 1
            elif rule[1] is None:
                return None
            else:
                out.extend(rule[1])
                i += len(rule[0])
        return ".".join(out)

    return renamer


def rename(
    flat: Mapping[str, Any], mapping: Mapping[str, str | None] | Callable[[str], str | None]
) -> dict[str, Any]:
    """``flat`` with its names changed, in the same order, values untouched.

    Args:
      flat: ``{dotted name: array}``, e.g. a torch ``state_dict()`` or ``load``'s result.
      mapping: either a function ``name -> new name`` (``None`` drops the entry; use
        ``re.sub`` inside it for patterns), or a dict of rules on whole name components:
        a rule ``"old.part": "new.part"`` replaces that run of components wherever it
        occurs in a name, so ``{"out_proj": "out"}`` turns
        ``"blocks.0.attn.out_proj.weight"`` into ``"blocks.0.attn.out.weight"``, and
        ``{"module": ""}`` strips the ``module.`` prefix ``DataParallel`` adds. Rules
        apply to the original name, left to right, longest rule first where several
        match at a component; a rule mapping to ``None`` drops every name it matches.
        Prefix a rule with its module's path to confine it (``"encoder.out_proj"``).

    Raises:
      ValueError: two names would get the same new name (all such collisions are
        named), a rule or result is not a dotted name.

    Example:
      >>> list(rename({"attn.in_proj_weight": np.zeros((24, 8))}, TORCH_MHA_TO_PURELAYERS))
      ['attn.qkv.weight']
    """
    if isinstance(mapping, Mapping):
        fn = _rule_renamer(mapping)
    elif callable(mapping):
        fn = mapping
    else:
        raise ValueError(f"rename: mapping must be a dict or a function, got {mapping!r}")
    out: dict[str, Any] = {}
    source: dict[str, list[str]] = {}
    for name, value in flat.items():
        new = fn(name)
        if new is None:
            continue
        if not isinstance(new, str) or not new or not all(new.split(".")):
            raise ValueError(f"rename: {name!r} maps to {new!r}, which is not a dotted name")
        source.setdefault(new, []).append(name)
        out[new] = value
    clashes = [f"{olds} -> {new!r}" for new, olds in source.items() if len(olds) > 1]
    if clashes:
        raise ValueError("rename: several names map to one name: " + "; ".join(clashes))
    return out


TORCH_MHA_TO_PURELAYERS: Mapping[str, str] = types.MappingProxyType(
    {
        "in_proj_weight": "qkv.weight",
        "in_proj_bias": "qkv.bias",
        "out_proj.weight": "out.weight",
        "out_proj.bias": "out.bias",
    }
)
"""``rename`` rules from ``torch.nn.MultiheadAttention``'s names to ``MultiHeadAttention``'s.

Torch's packed ``in_proj_weight`` ``[3E, E]`` (query, key, value rows) is the layout of
``qkv.weight``. Modules built with ``kdim``/``vdim`` (separate ``q_proj_weight`` ...) or
``add_bias_kv`` have no counterpart.
"""

PURELAYERS_TO_TORCH_MHA: Mapping[str, str] = types.MappingProxyType(
    {new: old for old, new in TORCH_MHA_TO_PURELAYERS.items()}
)
"""The inverse of ``TORCH_MHA_TO_PURELAYERS``: ``qkv.weight`` -> ``in_proj_weight`` ..."""
