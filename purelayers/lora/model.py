"""How ``purelayers.lora.wrap`` rewires a model: the module paths targets match, and a
copy of the model with LoRA layers in place of its targets (``LoraModel``).

Layers are frozen dataclasses, so wrapping rebuilds every layer on the way from the root
to a target: a ``Sequential`` from its ``(name, layer)`` pairs, a ``Repeat`` around its
(one, shared) block, ``Remat``/``Tied`` around their layer, and any other layer with
``dataclasses.replace`` on the field that holds the child (a tuple field for a list of
children) or a copy with a new dict attribute (the ``_parts`` of ``purelayers.models``'
GPT-2 and Llama families). A layer that builds its children when asked (BERT, ViT,
ResNet) cannot be rewired: ``wrap`` says so.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from purelayers._patterns import check_pattern, matches
from purelayers.layers import Linear, Remat, Repeat, Sequential, Tied
from purelayers.layers.core import Layer, Params
from purelayers.lora.layers import SUPPORTED, _Lora, lora_layer

__all__ = [
    "TASK_HEADS",
    "LoraModel",
    "join",
    "modules",
    "parse_targets",
    "resolve",
    "resolve_saved",
    "unwrap",
]


def join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _raw_apply(layer: Layer) -> Any:
    """``layer.apply`` without the params check ``Layer`` may wrap it in (``unchecked``):
    ``LoraModel.apply`` has checked the tree against its own ``init`` already, and the
    rewired copy of a model whose children live in a dict attribute compares equal to
    the original (its fields are), so its check must not run from the original's."""
    fn = type(layer).apply
    return functools.partial(getattr(fn, "unchecked", None) or fn, layer)


def unwrap(layer: Layer) -> Layer:
    """The layer under any ``Remat``/``Tied`` (transparent to names)."""
    while isinstance(layer, (Remat, Tied)):
        layer = layer.layer
    return layer


def rewrap(layer: Layer, core: Layer) -> Layer:
    """``layer``'s ``Remat``/``Tied`` wrappers around ``core`` instead of its own."""
    if isinstance(layer, Remat):
        return dataclasses.replace(layer, layer=rewrap(layer.layer, core))
    if isinstance(layer, Tied):
        return Tied(rewrap(layer.layer, core), dict(layer.ties))
    return core


def modules(layer: Layer, path: str = "") -> Iterator[tuple[str, Layer]]:
    """``(dotted path, layer)`` for every sublayer, in registration order (per block
    inside a ``Repeat``); the root is not listed."""
    core = unwrap(layer)
    if path:
        yield path, core
    for name, child in core.children().items():
        yield from modules(child, join(path, name))


@dataclasses.dataclass(frozen=True)
class LoraModel(Layer):
    """``model`` with LoRA layers in place of the layers at ``target_modules``; made by
    ``wrap``, which checks its arguments.

    Its checkpoint names are ``model``'s plus each target's adapter
    (``<target>.lora_A.weight``, ...), in torch's order; ``init``, ``apply`` and
    everything else are ``model``'s, run on the rewired copy (so ``M.generate`` works
    with it). Attributes ``model`` does not share with ``Layer`` (``config``,
    ``init_cache``, ...) are read from the rewired copy.

    Attributes:
      model: the layer given to ``wrap`` (``merge`` returns it).
      target_modules: the wrapped layers' paths, per block, in registration order.
      modules_to_save: the paths of the modules that train in full beside the adapters
        (PEFT's ``modules_to_save``), in registration order.
      r, lora_alpha, lora_dropout, use_rslora: the LoRA settings.
    """

    model: Layer
    target_modules: tuple[str, ...]
    r: int = 8
    lora_alpha: float = 8
    lora_dropout: float = 0.0
    use_rslora: bool = False
    modules_to_save: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "_inner", _rebuild(self.model, "", set(self.target_modules), self))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def settings(self) -> dict[str, Any]:
        return {
            "r": self.r,
            "lora_alpha": self.lora_alpha,
            "lora_dropout": self.lora_dropout,
            "use_rslora": self.use_rslora,
        }

    def adapters(self) -> dict[str, _Lora]:
        """``{target path: its LoRA layer}``, in ``target_modules``' order."""
        found = {p: m for p, m in modules(self._inner) if isinstance(m, _Lora)}
        return {p: found[p] for p in self.target_modules}

    @property
    def takes_ids(self) -> bool:
        return self._inner.takes_ids

    @property
    def accepts(self) -> tuple[str, ...]:
        return getattr(self._inner, "accepts", ("floating", "integer", "bool"))

    def children(self) -> dict[str, Layer]:
        return self._inner.children()

    def own_names(self) -> tuple[str, ...]:
        return self._inner.own_names()

    def aliases(self) -> dict[str, str]:
        return self._inner.aliases()

    def ordered(self, tree: dict[str, Any]) -> dict[str, Any]:
        return self._inner.ordered(tree)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        """``model``'s params with fresh adapters (from ``init``'s keys, not ``lora.init``'s)."""
        return self._inner.init(key, shape, dtype)

    def init_state(self, shape: Any, dtype: Any = jnp.float32) -> Any:
        return self._inner.init_state(shape, dtype)

    def apply(self, params: Params, x: Any, *args: Any, **kwargs: Any) -> Any:
        """``model.apply`` with the adapters: the same arguments and return value."""
        return _raw_apply(self._inner)(params, x, *args, **kwargs)


def _is_pattern(target: str) -> bool:
    return target.startswith("re:") or any(c in target for c in "*?[")


def _hits(target: str, path: str) -> bool:
    if _is_pattern(target):
        return matches(target, path)
    return path == target or path.endswith("." + target)


def parse_targets(target_modules: Any, what: str = "target_modules") -> tuple[str, ...]:
    items = (target_modules,) if isinstance(target_modules, str) else target_modules
    if not isinstance(items, Sequence) or isinstance(items, (bytes, bytearray)) or not items:
        raise ValueError(
            f"lora.wrap: {what} must be a name or a non-empty list of names or "
            f"patterns (e.g. ('q_proj', 'v_proj')), got {target_modules!r}"
        )
    return tuple(check_pattern(t, f"lora.wrap: {what}[{i}]") for i, t in enumerate(items))


# PEFT's task types whose model class (PeftModelForSequenceClassification, ...) adds the
# head to ``modules_to_save`` by itself, and the head names it adds.
TASK_HEADS: dict[str, tuple[str, ...]] = {
    "SEQ_CLS": ("classifier", "score"),
    "TOKEN_CLS": ("classifier", "score"),
    "QUESTION_ANS": ("qa_outputs",),
}


def _outside_repeats(layer: Layer, path: str = "") -> Iterator[tuple[str, Layer]]:
    """``modules`` less everything inside a ``Repeat`` (whose blocks' params are stacked)."""
    core = unwrap(layer)
    if path:
        yield path, core
    if isinstance(core, Repeat):
        return
    for name, child in core.children().items():
        yield from _outside_repeats(child, join(path, name))


def resolve_saved(model: Layer, modules_to_save: Any) -> tuple[str, ...]:
    """The paths of the modules that train in full: those ``modules_to_save`` names (as
    ``target_modules`` match), and for a model whose ``peft_task_type`` is a
    classification or question-answering one the head PEFT adds (``TASK_HEADS``); a
    module under one already chosen is not listed again."""
    given = () if modules_to_save is None else parse_targets(modules_to_save, "modules_to_save")
    heads = TASK_HEADS.get(getattr(type(model), "peft_task_type", None), ())
    inside = {p for p, _ in modules(model)} - {p for p, _ in _outside_repeats(model)}
    found: list[str] = []
    used: set[str] = set()
    for path, _ in modules(model):
        hits = [t for t in given if _hits(t, path)]
        used.update(hits)
        if not hits and not any(_hits(h, path) for h in heads):
            continue
        if any(path.startswith(f + ".") for f in found):
            continue
        if path in inside:
            raise ValueError(
                f"lora.wrap: modules_to_save selects {path!r}, inside a Repeat whose blocks' "
                "params are stacked; name a module outside the Repeat (or the Repeat itself)"
            )
        aliases = model.aliases()
        tied = [k for k, v in aliases.items() for n in (k, v) if n.startswith(path + ".")]
        if tied:
            raise ValueError(
                f"lora.wrap: modules_to_save selects {path!r}, whose {tied[0]!r} is tied to "
                f"{aliases[tied[0]]!r}; a tied module cannot train in full on its own"
            )
        found.append(path)
    unused = [t for t in given if t not in used]
    if unused:
        raise ValueError(
            f"lora.wrap: modules_to_save {unused} match no module of {type(model).__name__}"
        )
    return tuple(found)


ALL_LINEAR = "all-linear"


def _all_linear(model: Layer) -> tuple[str, ...]:
    """PEFT's ``target_modules="all-linear"``: every ``Linear`` (GPT-2's ``Conv1D``
    layout included) but the model's output layer (a causal LM's ``lm_head``, as
    transformers' ``get_output_embeddings()``)."""
    output = getattr(type(model), "output_embeddings", None)
    found = tuple(
        path for path, layer in modules(model) if isinstance(layer, Linear) and path != output
    )
    if not found:
        raise ValueError(
            f"lora.wrap: target_modules 'all-linear': {type(model).__name__} has no Linear layer"
        )
    return found


def resolve(model: Layer, targets: tuple[str, ...]) -> tuple[str, ...]:
    """The paths of the layers ``targets`` select, in registration order."""
    if targets == (ALL_LINEAR,):
        return resolve(model, _all_linear(model))
    aliases = model.aliases()
    found, supported = [], []
    for path, layer in modules(model):
        ok = isinstance(layer, SUPPORTED)
        if ok:
            supported.append(path)
        hits = [t for t in targets if _hits(t, path)]
        named = [t for t in hits if not _is_pattern(t)]
        tied = [f"{path}.{n}" for n in layer.own_names() if f"{path}.{n}" in aliases]
        problem = None
        if named and not ok:
            problem = (
                f"{named[0]!r} matches {path!r}, a {type(layer).__name__}; LoRA wraps Linear, "
                "Embedding and Conv1d/Conv2d/Conv3d layers (name the ones inside it)"
            )
        elif hits and ok and tied:
            problem = (
                f"{hits[0]!r} matches {path!r}, whose {tied[0]!r} is tied to "
                f"{aliases[tied[0]]!r}; a tied layer cannot take an adapter of its own"
            )
        if problem:
            raise ValueError(f"lora.wrap: target_modules {problem}")
        if ok and hits:
            found.append(path)
    if not found:
        shown = ", ".join(supported[:8]) + (", ..." if len(supported) > 8 else "")
        raise ValueError(
            f"lora.wrap: target_modules {list(targets)} match no Linear, Embedding or Conv "
            f"layer of {type(model).__name__}; its layers include: {shown or 'none'}"
        )
    return tuple(found)


def _make_lora(path: str, layer: Layer, lmodel: LoraModel) -> Layer:
    try:
        return lora_layer(layer, **lmodel.settings())
    except ValueError as e:
        raise ValueError(f"lora.wrap: target {path!r}: {e}") from None


def _relative(targets: set[str], prefix: str) -> set[str]:
    """The targets at or under ``prefix``, relative to it (``""`` for ``prefix`` itself)."""
    return {t[len(prefix) :] for t in targets if t == prefix or t.startswith(prefix + ".")}


def _rebuild(layer: Layer, path: str, targets: set[str], lmodel: LoraModel) -> Layer:
    """A copy of ``layer`` (at ``path``) with LoRA layers at ``targets``; ``layer`` itself
    where nothing under it is targeted."""
    if path and not _relative(targets, path):
        return layer
    core = unwrap(layer)
    if path in targets:
        return rewrap(layer, _make_lora(path, core, lmodel))
    if isinstance(core, Repeat):
        # the targets inside each block, relative to it, must be the same for every block
        inside = [_relative(targets, join(path, str(i))) for i in range(core.n)]
        odd = [str(i) for i, rel in enumerate(inside) if rel != inside[0]]
        if odd:
            raise ValueError(
                f"lora.wrap: target_modules select layers in some blocks of the Repeat at "
                f"{path!r} but not in others (blocks {', '.join(odd)} differ from block 0); "
                "Repeat blocks share one structure, so target the layer in every block "
                "(a name such as 'attn.c_attn', or a pattern such as '*.h.*.attn.c_attn')"
            )
        block = _rebuild(core.layer, join(path, "0"), targets, lmodel)
        return rewrap(layer, dataclasses.replace(core, layer=block))
    kids = core.children()
    new = {name: _rebuild(kid, join(path, name), targets, lmodel) for name, kid in kids.items()}
    changed = {name: kid for name, kid in new.items() if kid is not kids[name]}
    return rewrap(layer, _with_children(core, kids, changed, path))


def _with_children(
    core: Layer, kids: dict[str, Layer], changed: dict[str, Layer], path: str
) -> Layer:
    """``core`` with the children in ``changed`` replaced (``kids`` its current ones)."""
    if isinstance(core, Sequential):
        return Sequential([(n, changed.get(n, k)) for n, k in kids.items()])
    fields = {f.name for f in dataclasses.fields(core)}
    replace: dict[str, Any] = {}
    dicts: dict[str, dict[str, Layer]] = {}
    for name, kid in changed.items():
        value = getattr(core, name, None) if name in fields else None
        if value is kids[name]:
            replace[name] = kid
        elif isinstance(value, (tuple, list)) and kids[name] == Sequential(*value):
            replace[name] = type(value)(kid.layers)
        else:
            for attr, d in vars(core).items():
                if attr not in fields and isinstance(d, dict) and d.get(name) is kids[name]:
                    dicts.setdefault(attr, dict(d))[name] = kid
                    break
    try:
        out = dataclasses.replace(core, **replace) if replace else copy.copy(core)
        for attr, d in dicts.items():
            object.__setattr__(out, attr, d)
        now = out.children()
    except (TypeError, ValueError):
        now = {}
    stuck = [
        n
        for n, kid in changed.items()
        if now.get(n) is not kid and not (isinstance(kid, Sequential) and now.get(n) == kid)
    ]
    if stuck:
        raise ValueError(
            f"lora.wrap: cannot put a LoRA layer under {join(path, stuck[0])!r}: "
            f"{type(core).__name__} does not hold its child {stuck[0]!r} in a dataclass field "
            "or a dict attribute (it builds its children when asked), so no wrapped copy "
            "of it can be made"
        )
    return out
