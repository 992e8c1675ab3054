r"""Optimizer labels and masks by checkpoint name: ``label`` and ``mask``.

Both give a tree shaped like ``params`` (the same pytree structure, so optax accepts
it) whose leaves are chosen by each array's dotted checkpoint name, the name
``pl.params.flatten`` lists (``blocks.3.attn.qkv.weight``):

- ``label(params, rules)``: one label per array, for ``optax.multi_transform``;
- ``mask(params, *patterns)``: one bool per array, for ``optax.masked`` and the
  ``mask=`` of ``optax.adamw``.

Patterns (one syntax for every rule table of the library, ``purelayers.sharding``
included) match the whole name:

- a glob (``fnmatch``, case-sensitive): ``*`` matches any run of characters *including
  dots*, so ``"*.bias"`` matches ``0.bias`` and ``blocks.3.fc.bias`` (but not a root
  ``bias``), ``"blocks.*"`` every array under ``blocks`` and ``"*"`` every name; ``?``
  one character; ``[seq]`` one character of ``seq``, ``[!seq]`` one not in it;
- ``"re:<regex>"``: a regular expression that must match the whole name
  (``re.fullmatch``): ``r"re:blocks\.[0-5]\..*"``.

``matches(pattern, name)`` says whether one name matches.

Rules of the trees:

- Dicts (fresh from ``init``, or key-sorted by ``jit`` and optax), lists, tuples and
  other pytree nodes all work; the result keeps the params' own dict order.
- Leaves are never read, so abstract trees (``jax.ShapeDtypeStruct`` leaves, from
  ``pl.params.abstract``) and traced trees (inside ``jit``, where optax calls a label
  or mask function) work alike.
- ``None`` entries (no array) stay ``None`` and have no name: JAX reads ``None`` as an
  empty subtree, in params and labels alike.
- A ``Repeat``'s blocks (``Stacked``) are one array per name, stacked over blocks, and
  so one leaf: its label (or mask bit) is that of every block's name
  (``blocks.0.fc.weight``, ``blocks.1.fc.weight``, ...), which must agree; rules that
  tell blocks apart (``"blocks.0.*"``) raise ``ValueError``, as they do in
  ``purelayers.sharding`` (a spec cannot differ by block either).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import jax

from purelayers._patterns import check_pattern, matches
from purelayers.trees import BlockKey, Stacked

__all__ = ["label", "mask", "matches"]

_NO_MATCH = object()  # the label of a name no rule matches
_SHOWN = 3  # names shown per group in a message before "... (k more)"


def _key_name(key: Any) -> str:
    for attr in ("key", "idx", "name"):  # DictKey, SequenceKey, GetAttrKey, FlattenedIndexKey
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def leaf_names(path: tuple[Any, ...]) -> tuple[str, list[str]]:
    """The leaf's display name (``blocks.{0..3}.fc.weight`` under a ``Repeat``) and its
    checkpoint names, one per block in C order of the enclosing ``Stacked`` nodes."""
    shown: list[str] = []
    names = [""]
    for key in path:
        if isinstance(key, BlockKey):
            parts = [str(i) for i in range(key.n)]
            shown.append(f"{{0..{key.n - 1}}}")
        else:
            parts = [_key_name(key)]
            shown.append(parts[0])
        names = [f"{p}.{q}" if p else q for p in names for q in parts]
    return ".".join(shown), names


def _listing(names: Sequence[str]) -> str:
    more = f", ... ({len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def mixed_blocks(who: str, what: str, shown: str, by_name: dict[str, Any]) -> ValueError:
    groups: dict[Any, list[str]] = {}
    for name, value in by_name.items():
        groups.setdefault(value, []).append(name)
    lines = "".join(
        f"\n  {'no rule' if v is _NO_MATCH else repr(v)}: {_listing(names)}"
        for v, names in groups.items()
    )
    return ValueError(
        f"{who}: the blocks of the stacked array {shown!r} get different {what}s:{lines}\n"
        "  a Repeat stores each name of its blocks as one array stacked over the blocks, so "
        f"they share one {what}: use a pattern that matches every block (blocks.* rather "
        "than blocks.0), or build the blocks with Sequential to treat them apart"
    )


def _same(a: Any, b: Any) -> bool:
    return a is b or (a is not _NO_MATCH and b is not _NO_MATCH and bool(a == b))


def _by_name(
    params: Any, fn: Callable[[str], Any], who: str, what: str, empty: Any
) -> tuple[Any, list[str]]:
    """``params`` with each leaf replaced by ``fn`` of its name (the same for every block
    of a stacked leaf, else ``ValueError``; ``empty`` for a stack of no blocks), and the
    display names of the leaves whose value is ``_NO_MATCH``."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    values, unmatched = [], []
    for path, _ in leaves:
        shown, names = leaf_names(path)
        by_name = {name: fn(name) for name in names}
        first = next(iter(by_name.values()), empty)
        if not all(_same(v, first) for v in by_name.values()):
            raise mixed_blocks(who, what, shown, by_name)
        if first is _NO_MATCH:
            unmatched.append(shown)
        values.append(first)
    return _in_order(jax.tree_util.tree_unflatten(treedef, values), params), unmatched


def _in_order(out: Any, like: Any) -> Any:
    """``out`` (built by JAX, whose dicts come back key-sorted) with ``like``'s dict order."""
    if type(like) is dict and type(out) is dict:
        return {k: _in_order(out[k], v) for k, v in like.items()}
    if isinstance(like, Stacked) and isinstance(out, Stacked):
        return Stacked(_in_order(out.tree, like.tree), out.n)
    if type(like) in (list, tuple) and type(out) is type(like):
        return type(like)(_in_order(o, v) for o, v in zip(out, like, strict=True))
    return out


def _check_label(value: Any, where: str) -> None:
    try:
        hash(value)
    except TypeError:
        raise ValueError(
            f"label: {where} label {value!r} is not hashable; optax.multi_transform keys its "
            "transforms by label, so use a string such as 'decay' or 'frozen'"
        ) from None
    if jax.tree.leaves(value) != [value]:
        raise ValueError(
            f"label: {where} label {value!r} is not a single pytree leaf (None, a tuple, ...); "
            "optax reads the labels as the leaves of a tree shaped like params, so use a "
            "string such as 'decay' or 'frozen'"
        )


def _rule_pairs(rules: Any) -> list[tuple[str, Hashable]]:
    if isinstance(rules, Mapping):
        pairs = list(rules.items())
        places = [("rules", f"rules[{p!r}]") for p, _ in pairs]
    elif isinstance(rules, Sequence) and not isinstance(rules, (str, bytes)):
        pairs = list(rules)
        for i, pair in enumerate(pairs):
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise ValueError(f"label: rules[{i}] must be a (pattern, label) pair, got {pair!r}")
        places = [(f"rules[{i}]", f"rules[{i}]") for i in range(len(pairs))]
    else:
        raise ValueError(
            "label: rules must be a dict {pattern: label} or a list of (pattern, label) "
            f"pairs, got {rules!r}"
        )
    for (pattern, value), (of_pattern, of_label) in zip(pairs, places, strict=True):
        check_pattern(pattern, f"label: {of_pattern}")
        _check_label(value, of_label)
    return [(pattern, value) for pattern, value in pairs]


def label(params: Any, rules: Mapping[str, Hashable] | Sequence[tuple[str, Hashable]]) -> Any:
    r"""A tree of labels shaped like ``params``, for ``optax.multi_transform``.

    Each array takes the label of the first rule whose pattern matches its dotted
    checkpoint name (the module docstring gives the pattern syntax). A rule that
    matches no name is fine (one rule table can serve several models); a name that no
    rule matches is an error, so end the rules with a catch-all ``"*"``.

    Args:
      params: a params tree (nested dicts, ``Repeat``'s ``Stacked`` blocks; abstract or
        traced leaves work too, as they are never read; ``None`` entries stay ``None``).
      rules: ``{pattern: label}`` in order (a dict keeps insertion order), or a list of
        ``(pattern, label)`` pairs. A label is any hashable pytree leaf (a string,
        typically): the keys of ``optax.multi_transform``'s transforms.

    Returns:
      the tree of labels, the same pytree structure as ``params``, in its dict order.

    Raises:
      ValueError: ``rules`` not a dict or a list of pairs, an invalid pattern, a label
        that is unhashable or not a pytree leaf (``None``, a tuple); a name no rule
        matches (all of them are listed); rules that label the blocks of one
        ``Repeat`` apart (a stacked array is one leaf).

    Example:
      >>> model = L.Sequential(L.Linear(8), L.LayerNorm(), L.Linear(2))
      >>> params = model.init(jax.random.key(0), (1, 4))
      >>> pl.params.label(params, {"*.bias": "no_decay", "1.*": "no_decay", "*": "decay"})
      {'0': {'weight': 'decay', 'bias': 'no_decay'}, '1': {'weight': 'no_decay', 'bias': 'no_decay'}, '2': {'weight': 'decay', 'bias': 'no_decay'}}

      With optax (a label tree, or a function of the tree optax calls it with)::

        rules = {"*.bias": "no_decay", "*norm*": "no_decay", "*": "decay"}
        tx = optax.multi_transform(
            {"decay": optax.adamw(3e-4, weight_decay=0.1), "no_decay": optax.adam(3e-4)},
            lambda tree: pl.params.label(tree, rules),
        )
        frozen = optax.multi_transform(
            {"train": optax.adam(1e-4), "frozen": optax.set_to_zero()},
            pl.params.label(params, {"head.*": "train", "*": "frozen"}),
        )
    """
    pairs = _rule_pairs(rules)

    def first_match(name: str) -> Any:
        return next((v for p, v in pairs if matches(p, name)), _NO_MATCH)

    labels, unmatched = _by_name(params, first_match, "label", "label", _NO_MATCH)
    if unmatched:
        listed = "".join(f"\n  {name}" for name in unmatched)
        raise ValueError(
            f"label: no rule matches {len(unmatched)} name(s) of params:{listed}\n"
            f"  patterns tried: {[p for p, _ in pairs]}\n"
            '  add a rule for them, or end the rules with a catch-all such as "*": "decay"'
        )
    return labels


def mask(params: Any, *patterns: str) -> Any:
    r"""A tree of bools shaped like ``params``: ``True`` where the dotted checkpoint name
    matches any of ``patterns`` (the module docstring gives the syntax).

    For ``optax.masked`` (which applies its transform where the mask is ``True`` and
    passes the other updates through unchanged) and ``optax.adamw(..., mask=)``. Some
    pattern must match some name: a misspelt mask that silently froze or decayed nothing
    is the bug this catches. Patterns that match nothing beside one that does are fine,
    as rules are in ``label`` (``mask(params, "*.bias", "*norm*")`` on a model without
    norms).

    Args:
      params: a params tree, as for ``label``.
      *patterns: one or more patterns.

    Returns:
      the tree of bools, the same pytree structure as ``params``, in its dict order.

    Raises:
      ValueError: no patterns, an invalid pattern, patterns of which none matches a name
        of ``params`` (all of them are listed), or a pattern that matches some blocks of a
        ``Repeat`` and not the others (a stacked array is one leaf).

    Example:
      >>> model = L.Sequential(L.Linear(8), L.LayerNorm(), L.Linear(2))
      >>> params = model.init(jax.random.key(0), (1, 4))
      >>> pl.params.mask(params, "*.bias", "1.*")
      {'0': {'weight': False, 'bias': True}, '1': {'weight': True, 'bias': True}, '2': {'weight': False, 'bias': True}}

      Freeze all but the head, or decay only the weights::

        tx = optax.chain(
            optax.masked(optax.set_to_zero(), pl.params.mask(params, "re:(?!head\\.).*")),
            optax.adamw(1e-4, mask=lambda tree: pl.params.mask(tree, "*.weight")),
        )
    """
    if not patterns:
        raise ValueError("mask: no patterns given; pass at least one, e.g. mask(params, '*.bias')")
    if len(patterns) == 1 and isinstance(patterns[0], (list, tuple)):
        raise ValueError(
            f"mask: patterns are separate arguments, got one {type(patterns[0]).__name__} "
            f"{patterns[0]!r}; unpack it: mask(params, *patterns)"
        )
    for i, pattern in enumerate(patterns):
        check_pattern(pattern, f"mask: patterns[{i}]")
    used: set[str] = set()

    def any_match(name: str) -> bool:
        hits = [p for p in patterns if matches(p, name)]
        used.update(hits)
        return bool(hits)

    bits, _ = _by_name(params, any_match, "mask", "mask bit", False)
    if not used:
        names = checkpoint_names(params)
        hint = f"names look like {_listing(names)}" if names else "params has no arrays"
        raise ValueError(
            f"mask: no pattern matches a name of params: {list(patterns)}\n"
            f"  {hint}; a pattern matches the whole dotted name (see pl.params.flatten), "
            "and * matches dots too"
        )
    return bits


def checkpoint_names(params: Any) -> list[str]:
    """Every checkpoint name of ``params``, stacked blocks expanded (arrays never read)."""
    return [
        name
        for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
        for name in leaf_names(path)[1]
    ]
