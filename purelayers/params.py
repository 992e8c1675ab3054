"""Parameter trees, their checkpoint names, and checkpoint files.

A params (or state) tree is a nested ``dict`` of arrays. Its dotted flattening is the
checkpoint name and equals the PyTorch ``state_dict`` key of the equivalent
``torch.nn`` model: ``{"0": {"weight": w}}`` is ``"0.weight"``.

Checkpoints are safetensors files under those names and in torch's layouts, so a
purelayers checkpoint is a PyTorch checkpoint::

    pl.params.save("model.safetensors", params, state)           # torch can load it
    params, state = pl.params.load_into("model.safetensors", params, state)
    torch_model.load_state_dict(safetensors.torch.load_file("model.safetensors"))

Optimizer labels and masks by name: ``label(params, rules)`` and ``mask(params, *patterns)``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from purelayers import _safetensors_io as _io
from purelayers._labels import label, mask, matches
from purelayers._like import check_like
from purelayers._rename import PURELAYERS_TO_TORCH_MHA, TORCH_MHA_TO_PURELAYERS, rename
from purelayers._safetensors_io import to_numpy as _to_numpy
from purelayers._save import save
from purelayers._summary import summary
from purelayers._tree import dtype_of as _dtype
from purelayers._tree import key_data as _key_data
from purelayers._tree import model_aliases as _aliases
from purelayers._tree import specs as _specs
from purelayers._tree import wrap_keys as _wrap_keys
from purelayers.errors import CheckpointError
from purelayers.trees import Stacked, count, fill, flatten, merge, take_block, unflatten

__all__ = [
    "PURELAYERS_TO_TORCH_MHA",
    "TORCH_MHA_TO_PURELAYERS",
    "CheckpointError",
    "CheckpointWarning",
    "IncompatibleKeys",
    "Stacked",
    "abstract",
    "check_like",
    "count",
    "flatten",
    "label",
    "load",
    "load_into",
    "load_metadata",
    "load_state_dict",
    "mask",
    "matches",
    "merge",
    "rename",
    "save",
    "summary",
    "unflatten",
]


# -- loading by name ------------------------------------------------------------------


def _owned_copy(value: Any, dtype: Any, out: np.ndarray | None = None) -> np.ndarray:
    """``value`` (numpy, torch, JAX, or a file's tensor) copied once into an array that
    nothing else references (``_io.owned``), cast to ``dtype`` on the way."""
    if isinstance(value, _io.Tensor):
        return value.read(dtype=dtype, out=out)
    host = _to_numpy(value)
    if out is None:
        out = _io.owned(host.shape, dtype)
    np.copyto(out, host, casting="unsafe")
    return out


class CheckpointWarning(UserWarning):
    """A non-strict load left names unmatched (the message lists them)."""


class IncompatibleKeys(NamedTuple):
    """What a non-strict load could not match, as ``torch.nn.Module.load_state_dict`` reports.

    Attributes:
      missing_keys: names of the model absent from the checkpoint; they keep the
        template's values.
      unexpected_keys: names in the checkpoint that the model lacks; they were ignored.
    """

    missing_keys: list[str]
    unexpected_keys: list[str]


def _match(
    names: Mapping[str, Any],
    available: Mapping[str, Any],
    *,
    strict: bool,
    who: str,
    aliases: Mapping[str, str] | None = None,
    equal: Callable[[str, str], bool] | None = None,
) -> tuple[dict[str, str], IncompatibleKeys]:
    """Match a template's names (``{name: leaf}``, anything with a shape) against a
    checkpoint's (``available``), by name, in one pass over the two flat dicts.

    Returns ``{template name: checkpoint name}`` for every name found, and the
    unmatched names. An alias in ``aliases`` (``{alias: original}``) that the template
    does not hold stands for its original: when the checkpoint has both, ``equal(alias,
    original)`` must hold, else a ``ValueError`` names both (as between two aliases of one
    original the checkpoint holds without it); when it has only the alias,
    the original is read from it. Raises (before anything is read or converted) one
    ``KeyError`` for missing and unexpected names under ``strict``, and one
    ``ValueError`` naming every shape mismatch.
    """
    source = {k: k for k in names if k in available}
    consumed: set[str] = set()
    both: list[tuple[str, str, str]] = []  # names holding one array twice: compared last
    for alias, original in (aliases or {}).items():
        if alias in names or alias not in available or original not in names:
            continue
        consumed.add(alias)
        if original in available:
            both.append((alias, original, original))
        elif original in source:  # another alias of it fills it: the two must agree
            both.append((alias, source[original], original))
        else:
            source[original] = alias
    keys = IncompatibleKeys(
        [k for k in names if k not in source],
        [k for k in available if k not in names and k not in consumed],
    )
    if strict and (keys.missing_keys or keys.unexpected_keys):
        raise KeyError(
            f"{who}: the checkpoint does not match the model by name; "
            f"missing keys: {keys.missing_keys}; unexpected keys: {keys.unexpected_keys}"
        )
    mismatched = [
        f"{k}: expected {tuple(np.shape(names[k]))}, got {tuple(np.shape(available[src]))}"
        + ("" if src == k else f" (from {src!r})")
        for k, src in source.items()
        if tuple(np.shape(available[src])) != tuple(np.shape(names[k]))
    ]
    if mismatched:
        raise ValueError(f"{who}: shape mismatch for " + "; ".join(mismatched))
    for alias, other, original in both:
        if equal is not None and not equal(alias, other):
            tie = (
                f"{alias!r} is tied to {original!r}"
                if other == original
                else f"{alias!r} and {other!r} are both tied to {original!r}"
            )
            raise ValueError(
                f"{who}: {tie} but the checkpoint holds different values under the two "
                "names; nothing was loaded"
            )
    return source, keys


def _equal_values(flat: Mapping[str, Any]) -> Callable[[str, str], bool]:
    def equal(a: str, b: str) -> bool:
        if isinstance(flat[a], _io.Tensor) and isinstance(flat[b], _io.Tensor):
            return _io.same_values(flat[a], flat[b])  # a file's: compared block by block
        return _io.same_values(_to_numpy(flat[a]), _to_numpy(flat[b]))

    return equal


def _filler(flat: Mapping[str, Any], source: Mapping[str, str]):
    """``fill``'s ``get``: each leaf from ``flat`` by name (blocks stacked), cast to the
    template leaf's dtype and placed on its sharding; unmatched leaves keep theirs."""

    def get(names: tuple[str, ...], leaf: Any, lead: tuple[int, ...]) -> Any:
        if not any(n in source for n in names):
            return leaf
        if not lead:
            return _like(flat[source[names[0]]], leaf)
        out = _io.owned(np.shape(leaf), jax.dtypes.canonicalize_dtype(_dtype(leaf)))
        blocks = out.reshape(-1, *out.shape[len(lead) :])
        for i, n in enumerate(names):
            block = flat[source[n]] if n in source else take_block(leaf, np.unravel_index(i, lead))
            _owned_copy(block, out.dtype, blocks[i, ...])
        return _place(out, leaf)

    return get


def _refuse_abstract_missing(templates: list[Any], missing: list[str], who: str) -> None:
    """A ``strict=False`` load keeps the template's values for missing names; an
    abstract template (``abstract(...)``, ``jax.eval_shape``) has none to keep: a
    ``KeyError`` naming them, before anything is converted (not placeholders that fail
    later)."""
    if not missing:
        return
    is_abstract: dict[str, bool] = {}
    for tree in templates:
        is_abstract.update(
            flatten(fill(tree, lambda _, a, __: isinstance(a, jax.ShapeDtypeStruct)))
        )
    abstract = [k for k in missing if is_abstract.get(k, False)]
    if abstract:
        raise KeyError(f"{who}: missing keys with no template value to keep: {abstract}")


def _load(
    template: Any, flat: Mapping[str, Any], strict: bool, who: str, model: Any = None
) -> tuple[Any, IncompatibleKeys]:
    """The filled tree and the unmatched names; all checks run before any conversion."""
    like, template = template, _key_data(template)
    names = _specs(template)
    source, keys = _match(
        names,
        flat,
        strict=strict,
        who=who,
        aliases={**_shared(flat, names), **_aliases(model, who)},
        equal=_equal_values(flat),
    )
    _refuse_abstract_missing([template], keys.missing_keys, who)
    _refuse_non_numbers(flat, source.values(), who)
    return _wrap_keys(fill(template, _filler(flat, source)), like), keys


def _refuse_non_numbers(flat: Mapping[str, Any], names: Any, who: str) -> None:
    """A ``ValueError`` naming each value to load that holds no numbers (strings,
    objects, dates), before anything is converted."""
    bad = []
    for name in dict.fromkeys(names):
        value = flat[name]
        if isinstance(value, _io.Tensor):
            continue
        try:
            kind = np.dtype(value.dtype).kind if hasattr(value, "dtype") else None
        except TypeError:  # a torch dtype: torch tensors hold numbers
            continue
        if kind is None:
            kind = np.asarray(value).dtype.kind
        if kind in "OUSMm":  # (ml_dtypes' bfloat16 and float8 are kind "V": numbers)
            bad.append(f"{name!r} ({type(value).__name__})")
    if bad:
        raise ValueError(f"{who}: values that are not numbers under {', '.join(bad)}")


def _address(value: Any) -> tuple[Any, ...] | None:
    """Where ``value``'s data lives, with its layout: equal for two views of one memory
    (the two names of a tied torch parameter in a ``state_dict``); None if unknown."""
    if callable(getattr(value, "data_ptr", None)) and callable(getattr(value, "stride", None)):
        return ("torch", value.data_ptr(), tuple(value.shape), value.stride(), str(value.dtype))
    if isinstance(value, np.ndarray):
        data = value.__array_interface__["data"][0]
        return ("numpy", data, value.shape, value.strides, value.dtype.str)
    return None


def _shared(flat: Mapping[str, Any], names: Mapping[str, Any]) -> dict[str, str]:
    """``{alias: original}`` for each name of ``flat`` the template lacks whose value is
    the very array (or a view of the same memory) held under a template name: a tied
    parameter, which torch's ``state_dict()`` lists under both its names."""
    extra = [k for k in flat if k not in names]
    if not extra or not isinstance(flat, dict):
        return {}  # a dict holds its values, so an id names one live array
    held: dict[Any, str] = {}
    for k in names:
        if k in flat:
            held.setdefault(id(flat[k]), k)
            address = _address(flat[k])
            if address is not None and address[1]:
                held.setdefault(address, k)
    found = {}
    for k in extra:
        address = _address(flat[k])
        original = held.get(id(flat[k])) or (held.get(address) if address else None)
        if original is not None:
            found[k] = original
    return found


def _like(value: Any, like: Any) -> jax.Array:
    """``value`` as a JAX array of ``like``'s dtype, on ``like``'s devices if it has any.

    The result never shares memory with ``value`` (a torch tensor or numpy array the
    caller may change later): it is copied once, straight into the new dtype, into a
    buffer JAX adopts (``_io.owned``); a JAX array is copied too, so that donating the
    loaded tree leaves the caller's arrays alive."""
    dtype = _dtype(like)
    if isinstance(value, jax.Array):  # a new buffer: donating the result keeps the source
        return _place(jnp.array(value, dtype=dtype, copy=True), like)
    return _place(_owned_copy(value, jax.dtypes.canonicalize_dtype(dtype)), like)


def _place(array: Any, like: Any) -> jax.Array:
    """``array`` on ``like``'s sharding (its default device when it has none)."""
    return jax.device_put(array, getattr(like, "sharding", None))


def _warn_unmatched(keys: IncompatibleKeys, who: str) -> None:
    parts = []
    if keys.missing_keys:
        parts.append(
            f"{len(keys.missing_keys)} names of the model were not in the checkpoint and "
            f"keep their values: {keys.missing_keys}"
        )
    if keys.unexpected_keys:
        parts.append(
            f"{len(keys.unexpected_keys)} names of the checkpoint were ignored: "
            f"{keys.unexpected_keys}"
        )
    if parts:
        warnings.warn(
            f"{who}(strict=False): {'; '.join(parts)}. "
            "Pass return_keys=True to get these lists instead of this warning.",
            CheckpointWarning,
            stacklevel=3,
        )


def abstract(model: Any, shape: Any, dtype: Any = jnp.float32, *, state: bool = False) -> Any:
    """The params tree ``model.init(key, shape, dtype)`` builds, as ``jax.ShapeDtypeStruct``
    leaves: nothing is allocated or initialized. It is the template to load a checkpoint
    into (``load_into``, ``load_state_dict``, ``sharding.load_sharded``), so a model's
    weights are never drawn only to be overwritten.

    ``jax.eval_shape(model.init, key, shape)`` does not work: ``eval_shape`` traces every
    argument, the shape too, and ``init`` needs it static. This is
    ``jax.eval_shape(lambda k: model.init(k, shape, dtype), key)``.

    Args:
      model: a layer.
      shape: its input shape (or an example array), as ``init`` takes it.
      dtype: the params' floating dtype, as ``init`` takes it.
      state: also return the buffers tree ``model.init_state(shape, dtype)`` builds.

    Returns:
      the abstract params tree; ``(params, state)`` with ``state=True``.

    Example:
      >>> model = L.Sequential(L.Linear(8), L.ReLU(), L.Linear(2))
      >>> template = pl.params.abstract(model, (1, 4))
      >>> template["0"]["weight"]
      ShapeDtypeStruct(shape=(8, 4), dtype=float32)
    """
    params = jax.eval_shape(lambda k: model.init(k, shape, dtype), jax.random.key(0))
    if not state:
        return params
    return params, jax.eval_shape(lambda: model.init_state(shape, dtype))


def load_state_dict(
    template: Any,
    flat: Mapping[str, Any],
    *,
    strict: bool = True,
    return_keys: bool = False,
    model: Any = None,
) -> Any:
    """A new tree shaped like ``template`` with arrays taken from ``flat`` by name.

    ``flat`` maps dotted names (``"0.weight"``) to numpy arrays, JAX arrays or torch
    tensors, e.g. a torch ``state_dict()``. Values are cast to the template's dtypes
    (a torch ``int64`` counter becomes the template's ``int32``, ``float32`` weights a
    ``bfloat16`` template's ``bfloat16``) and placed on its leaves' shardings. The
    template may be abstract (``abstract(model, shape)``), so no weights need
    initializing just to be overwritten. Every check runs before anything
    is converted, and ``template`` is never changed:

    - ``strict=True``: names in the template but not in ``flat`` (missing) and names in
      ``flat`` but not in the template (unexpected) raise one ``KeyError`` naming all.
    - ``strict=False``: only the names both share are loaded; the rest keep the
      template's values (a pretrained backbone under a new head). Unmatched names are
      reported: by a ``CheckpointWarning`` listing them, or, with ``return_keys=True``,
      as an ``IncompatibleKeys`` returned alongside the tree (and no warning).
    - A shape mismatch raises one ``ValueError`` naming each key, expected and got.
    - Tied names: a name the template lacks whose value is the very array held under a
      template name (torch's ``state_dict()`` of a tied model lists the one tensor under
      both names, GPT-2's ``lm_head.weight`` and ``transformer.wte.weight``) is that
      name's alias, and loads without ``model``.
    - ``model``: the layer the template belongs to, for its tied names
      (``model.aliases()``, see ``layers.Tied``), needed where the checkpoint holds the
      alias as a separate array (a file): an alias in ``flat`` must equal its original,
      else a ``ValueError`` names both; a ``flat`` with only the alias fills the original.
    - Stacked blocks (``Repeat``) are filled from their per-block names.

    Returns:
      the new tree; ``(tree, IncompatibleKeys)`` with ``return_keys=True``.
    """
    tree, keys = _load(template, flat, strict, "load_state_dict", model)
    if return_keys:
        return tree, keys
    if not strict:
        _warn_unmatched(keys, "load_state_dict")
    return tree


# -- checkpoint files -----------------------------------------------------------------


def load(path: str | os.PathLike) -> dict[str, jax.Array]:
    """The flat ``{name: array}`` dict of a checkpoint, in the order it was saved in.

    ``path`` is a ``.safetensors`` file (ours, or one written by
    ``safetensors.torch.save_file``), a sharded checkpoint's
    ``model.safetensors.index.json``, or a folder holding either. Files written by
    ``save`` list names in torch's ``state_dict`` order (a sharded checkpoint in its
    index's order; other files in their layout's order: by dtype, then name). Arrays
    become JAX arrays of the file's dtypes, as JAX canonicalizes them (``int64`` is
    ``int32`` unless x64 is on). Each tensor is copied once from the memory-mapped file
    into the array JAX keeps, so loading N bytes costs N bytes of memory (plus a
    bounded chunk), and a later change to the file leaves the arrays as they were.

    Raises:
      FileNotFoundError: nothing at ``path``.
      CheckpointError: (a ``ValueError``) a truncated, corrupted, or non-safetensors
        file, an invalid index, or a missing or mismatched shard; the message names the
        file and what is wrong.
    """
    return {
        k: jax.device_put(t.read(dtype=jax.dtypes.canonicalize_dtype(t.dtype)))
        for k, t in _io.scan(path)[0].items()
    }


def load_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The ``metadata`` stored by ``save`` (from the first shard of a sharded checkpoint)."""
    file, sharded = _io.resolve(path)
    if sharded:
        first = next(iter(_io.read_index(file).values()), None)
        if first is None:
            return {}
        file = file.parent / first
    return _io.read_metadata(file)


def load_into(
    path: str | os.PathLike,
    params: Any,
    state: Any = None,
    *,
    strict: bool = True,
    return_keys: bool = False,
    model: Any = None,
) -> Any:
    """``params`` (and ``state``) filled by name from the checkpoint at ``path``.

    ``path`` is anything ``load`` accepts. Matching follows ``load_state_dict`` over
    both templates at once: with ``strict``, one ``KeyError`` names every missing and
    unexpected key and nothing is loaded; shape mismatches raise one ``ValueError``
    naming each; values are cast to the templates' dtypes (``int64`` counters to
    ``int32``). With ``strict=False`` (a backbone under a new head), unmatched names
    keep the template's values and are reported by a ``CheckpointWarning``, or returned
    as ``IncompatibleKeys`` with ``return_keys=True``. Tied names load as
    ``load_state_dict`` describes (a file with or without the alias): those of
    ``model``, and those a file written by ``save(..., write_aliases=True)`` records.

    Any pytree of arrays is a template, not only params: an optax state (namedtuples
    named by field, ``chain``'s tuples numbered, ``multi_transform``'s dict of states;
    ``MaskedNode`` and empty states hold no names), a step counter, a typed PRNG key
    (``jax.random.key``: its key data is stored, and it comes back a typed key of the
    template's impl). The result has the template's exact tree structure.

    Returns:
      ``params``; ``(params, state)`` when a ``state`` template is given; with
      ``return_keys=True``, the same with ``IncompatibleKeys`` appended.

    Example:
      >>> import os, tempfile
      >>> model = L.Sequential(L.Linear(8), L.ReLU(), L.Linear(2))
      >>> params = model.init(jax.random.key(0), (1, 4))
      >>> path = pl.params.save(os.path.join(tempfile.mkdtemp(), "model.safetensors"), params)
      >>> template = pl.params.abstract(model, (1, 4))
      >>> loaded = pl.params.load_into(path, template)
      >>> bool(jnp.array_equal(loaded["2"]["weight"], params["2"]["weight"]))
      True
    """
    flat, meta = _io.scan(path)
    who = f"load_into({os.fspath(path)!r})"
    templates = [params] if state is None else [params, state]
    data = [_key_data(t) for t in templates]  # typed keys: their key data is stored
    names: dict[str, Any] = {}
    for tree in data:
        names.update(_specs(tree))
    source, keys = _match(
        names,
        flat,
        strict=strict,
        who=who,
        aliases={**_io.aliases(meta), **_aliases(model, who)},
        equal=_equal_values(flat),
    )
    _refuse_abstract_missing(data, keys.missing_keys, who)
    get = _filler(flat, source)
    result = tuple(_wrap_keys(fill(d, get), t) for d, t in zip(data, templates, strict=True))
    if return_keys:
        return (*result, keys)
    if not strict:
        _warn_unmatched(keys, "load_into")
    return result if state is not None else result[0]
