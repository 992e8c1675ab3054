r"""LoRA adapters in PEFT's format: wrap a model's layers, train only the adapters, and
read and write PEFT's adapter folders.

::

    from purelayers import lora, models as M

    model, base = M.from_pretrained("gpt2-folder")
    lmodel = lora.wrap(model, target_modules=("c_attn",), r=8, lora_alpha=16)
    params = lora.init(lmodel, jax.random.key(0), base)   # base weights + A and B
    tx = optax.multi_transform({True: optax.adam(1e-3), False: optax.set_to_zero()},
                               lora.trainable(params))    # only the adapters move
    ...
    lora.save_adapter("out/adapter", lmodel, params)      # peft.PeftModel.from_pretrained loads it
    model, merged = lora.merge(lmodel, params)            # the base names, adapters folded in

PEFT's vocabulary and defaults throughout (``r=8``, ``lora_alpha=8``,
``lora_dropout=0.0``, ``use_rslora=False``, ``bias="none"``). A targeted layer computes
``y = base(x) + s * B(A(dropout(x)))`` with ``s = lora_alpha / r`` (``lora_alpha /
sqrt(r)`` with ``use_rslora``); see ``purelayers.lora.layers`` for each kind.

Targets: a name without ``*?[`` (and not ``re:...``) matches a module path equal to it
or ending in ``"." + name``, PEFT's rule for a list; one with them is a pattern
(``purelayers._patterns``: an fnmatch glob on the whole dotted path, ``*`` matching
dots, or ``re:<regex>``) and selects the ``Linear``, ``Embedding`` and ``Conv1d/2d/3d``
layers among the paths it matches. Paths are checkpoint paths, per block inside a
``Repeat`` (``transformer.h.0.attn.c_attn``); as a ``Repeat``'s blocks share one
structure, a target must select a layer in all of its blocks or in none.

``modules_to_save=`` (PEFT's option) names modules that train in full beside the
adapters; a classifier's or question-answering model's head is always one, as in PEFT:
``trainable(params, lmodel)`` marks them, ``save_adapter`` writes their weights under
PEFT's names and ``load_adapter`` reads them back.

Dropout needs ``key`` and ``train=True`` to reach the LoRA layer. The causal models of
``purelayers.models`` (and ``layers.Attention``) give each projection a key of its own
from the one ``apply`` gets, so every adapter draws its own mask, as PEFT's
``nn.Dropout`` modules do; a layer of your own must pass ``key`` and ``train`` on to the
children that may take adapters, or their dropout stays off.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers import _atomic
from purelayers import params as _params
from purelayers.layers._checks import check_choice
from purelayers.layers.core import Layer, Params
from purelayers.lora._checks import (
    _ADAPTER_KEYS,
    _PREFIX,
    base_weights,
    check_config,
    check_names,
    check_ties,
    read_config,
)
from purelayers.lora.layers import (
    LoraConv,
    LoraEmbedding,
    LoraLinear,
    _Lora,
    adapter_dtype,
    check_settings,
)
from purelayers.lora.model import (
    ALL_LINEAR,
    LoraModel,
    join,
    modules,
    parse_targets,
    resolve,
    resolve_saved,
    unwrap,
)
from purelayers.trees import Stacked

__all__ = [
    "ADAPTER_CONFIG_NAME",
    "ADAPTER_WEIGHTS_NAME",
    "LoraConv",
    "LoraEmbedding",
    "LoraLinear",
    "LoraModel",
    "init",
    "load_adapter",
    "merge",
    "save_adapter",
    "trainable",
    "wrap",
]

ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_CONFIG_NAME = "adapter_config.json"


# -- wrap -------------------------------------------------------------------------------


def wrap(
    model: Layer,
    target_modules: str | Sequence[str],
    *,
    r: int = 8,
    lora_alpha: float = 8,
    lora_dropout: float = 0.0,
    use_rslora: bool = False,
    bias: str = "none",
    modules_to_save: str | Sequence[str] | None = None,
) -> LoraModel:
    r"""``model`` with a LoRA adapter on each layer ``target_modules`` selects, as
    ``peft.get_peft_model(model, peft.LoraConfig(...))``.

    Each targeted ``Linear`` (either layout; GPT-2's transposed ``Conv1D`` is PEFT's
    ``fan_in_fan_out=True``) becomes a ``LoraLinear`` computing ``base(x) +
    (lora_alpha / r) * B(A(dropout(x)))``, with ``lora_A.weight`` ``[r, in]`` and
    ``lora_B.weight`` ``[out, r]`` beside the frozen ``weight`` and ``bias``; an
    ``Embedding`` a ``LoraEmbedding`` (``lora_embedding_A`` ``[r, num_embeddings]``,
    ``lora_embedding_B`` ``[embedding_dim, r]``); a ``Conv1d/2d/3d`` a ``LoraConv``.

    Args:
      model: a layer (a ``purelayers.models`` model, a ``Sequential``, ...) whose
        children are dataclass fields or entries of a dict attribute (as in
        ``purelayers.models``' GPT-2 and Llama families); not already wrapped.
      target_modules: a name or a list of names and patterns (module docstring): names
        match a path equal to them or ending in ``.name`` (``"q_proj"``,
        ``"attn.c_attn"``), patterns the whole path (``"*.h.*.attn.c_attn"``);
        ``"all-linear"`` (PEFT's shorthand) every ``Linear`` but a causal LM's
        ``lm_head``.
      r: the rank, a positive int. Default ``8``.
      lora_alpha: the scale numerator, > 0. Default ``8``.
      lora_dropout: dropout on each adapter's input in train mode, in ``[0, 1)``.
        Default ``0.0``.
      use_rslora: scale by ``lora_alpha / sqrt(r)`` (rank-stabilized LoRA). Default
        ``False``.
      bias: which biases train; only ``"none"`` (no base bias trains).
      modules_to_save: a name or a list of names and patterns (matched as
        ``target_modules``) of modules that train in full beside the adapters, PEFT's
        ``modules_to_save`` (``trainable(params, lmodel)`` marks their leaves;
        ``save_adapter`` writes their weights). A model whose class has a
        classification or question-answering ``peft_task_type``
        (``BertForSequenceClassification``, ...) adds its head as PEFT's
        ``PeftModelFor...`` classes do (``classifier`` or ``score`` for ``SEQ_CLS`` and
        ``TOKEN_CLS``, ``qa_outputs`` for ``QUESTION_ANS``), given or not; such a head
        is left out of ``"all-linear"``'s targets, as PEFT leaves it. Default ``None``.

    Returns:
      a ``LoraModel``; ``init`` (or ``load_adapter``) makes its params from the base's.

    Raises:
      ValueError: a bad setting (naming it), targets that match nothing, a name that
        matches a layer of another kind, a tied layer, a target in only some blocks of
        a ``Repeat``, or a model whose children cannot be replaced; ``modules_to_save``
        names that match nothing, a module in it that is or holds a target, is tied, or
        lies inside a ``Repeat``.

    Example:
      >>> mlp = L.Sequential({"q_proj": L.Linear(4), "act": L.ReLU(), "out": L.Linear(2)})
      >>> lmodel = wrap(mlp, target_modules=["q_proj"], r=2, lora_alpha=4)
      >>> list(pl.params.flatten(lmodel.init(jax.random.key(0), (1, 3))))
      ['q_proj.weight', 'q_proj.bias', 'q_proj.lora_A.weight', 'q_proj.lora_B.weight', 'out.weight', 'out.bias']
    """
    if not isinstance(model, Layer):
        raise ValueError(f"lora.wrap: model must be a purelayers Layer, got {model!r}")
    if isinstance(model, LoraModel):
        raise ValueError(
            "lora.wrap: model is already LoRA-wrapped; wrap lmodel.model with all the "
            "target_modules at once, or lora.merge it first"
        )
    chosen = parse_targets(target_modules)
    check_settings("lora.wrap", r, lora_alpha, lora_dropout, use_rslora)
    check_choice("lora.wrap", "bias", bias, ("none",))
    paths = resolve(model, chosen)
    saved = resolve_saved(model, modules_to_save)
    if chosen == (ALL_LINEAR,):  # PEFT: the modules to save are no targets
        paths = tuple(p for p in paths if not any(_under(p, s) for s in saved)) or paths
    clash = [(p, s) for p in paths for s in saved if _under(p, s)]
    if clash:
        raise ValueError(
            f"lora.wrap: target {clash[0][0]!r} lies in {clash[0][1]!r}, a module of "
            "modules_to_save (or the head PEFT trains in full for this model's task); a "
            "module takes an adapter or trains in full, not both"
        )
    # NumPy scalars become Python numbers: the settings are written to adapter_config.json
    r, lora_alpha, lora_dropout = (
        v.item() if isinstance(v, np.generic) else v for v in (r, lora_alpha, lora_dropout)
    )
    settings = dict(r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, use_rslora=use_rslora)
    return LoraModel(model, paths, **settings, modules_to_save=saved)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


# -- params -----------------------------------------------------------------------------


def _need_wrapped(who: str, lmodel: Any) -> LoraModel:
    if not isinstance(lmodel, LoraModel):
        raise ValueError(f"{who}: lmodel must be the layer lora.wrap returns, got {lmodel!r}")
    return lmodel


Visit = Callable[[_Lora, Params, tuple[str, ...], tuple[int, ...]], Params]


def _map_targets(lmodel: LoraModel, params: Any, visit: Visit, who: str) -> Any:
    """``params`` with the subtree of each LoRA layer replaced by ``visit(layer, subtree,
    names, lead)``: ``names`` the target's paths (one per block under ``Repeat``s, in C
    order of the stacked axes ``lead``). Every target must be found with its base
    ``weight``, else a ``ValueError`` names the missing ones."""
    seen: set[str] = set()

    def go(layer: Layer, tree: Any, names: tuple[str, ...], lead: tuple[int, ...]) -> Any:
        core = unwrap(layer)
        if isinstance(core, _Lora):
            weight = tree.get("weight") if isinstance(tree, Mapping) else None
            if getattr(weight, "ndim", None) != len(lead) + core.weight_rank:
                return tree
            seen.update(names)
            return visit(core, tree, names, lead)
        kids = core.children()
        if isinstance(tree, Stacked) and "0" in kids:
            inner = tuple(join(p, str(i)) for p in names for i in range(tree.n))
            return Stacked(go(kids["0"], tree.tree, inner, (*lead, tree.n)), tree.n)
        if not isinstance(tree, Mapping):
            return tree
        return {
            k: go(kids[k], v, tuple(join(p, k) for p in names), lead) if k in kids else v
            for k, v in tree.items()
        }

    out = go(lmodel._inner, params, ("",), ())
    missing = [p for p in lmodel.target_modules if p not in seen]
    if missing:
        shown = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
        raise ValueError(
            f"{who}: params has no base weight for the LoRA targets {shown}; pass the "
            "params of the model given to lora.wrap (from its init or M.from_pretrained)"
        )
    return out


def _stack(trees: list[Any], lead: tuple[int, ...]) -> Any:
    """One tree from per-block trees (C order of ``lead``), each leaf ``(*lead, ...)``."""
    if not lead:
        return trees[0]
    return jax.tree.map(lambda *a: jnp.stack(a).reshape(*lead, *jnp.shape(a[0])), *trees)


def _base_only(tree: Params) -> Params:
    return {k: v for k, v in tree.items() if k not in _ADAPTER_KEYS}


def _with_adapter(layer: _Lora, tree: Params, adapter: Params) -> Params:
    return layer.ordered({**_base_only(tree), **adapter})


def init(lmodel: LoraModel, key: jax.Array, base_params: Params) -> Params:
    """``base_params`` (the params of the model given to ``wrap``) with a fresh adapter
    on every target: PEFT's defaults (``lora_A`` ``kaiming_uniform(a=sqrt(5))``,
    ``lora_B`` zeros; an Embedding's ``lora_embedding_A`` zeros and ``lora_embedding_B``
    ``N(0, 1)``), so the model's outputs start unchanged. Target ``i`` of
    ``lmodel.target_modules`` (one per block) draws from ``fold_in(key, i)``; adapters
    take their base weight's dtype, but float32 over a float16 or bfloat16 base, as
    PEFT's ``autocast_adapter_dtype=True`` (its default) makes them; the adapter then
    computes in float32 and its sum with the base output is cast back, as PEFT's.
    Existing adapter entries are replaced; the base arrays are reused, not copied, and
    ``base_params`` is not changed.

    Raises:
      ValueError: ``lmodel`` not from ``wrap``, or ``base_params`` lacking a target's
        weight (naming it).
    """
    lmodel = _need_wrapped("lora.init", lmodel)
    index = {p: i for i, p in enumerate(lmodel.target_modules)}

    def visit(layer: _Lora, tree: Params, names: tuple[str, ...], lead: tuple[int, ...]):
        w = tree["weight"]
        shape = tuple(w.shape[len(lead) :])
        dtype = adapter_dtype(w.dtype)
        drawn = [layer.init_adapter(jax.random.fold_in(key, index[n]), shape, dtype) for n in names]
        return _with_adapter(layer, tree, _stack(drawn, lead))

    return _map_targets(lmodel, base_params, visit, "lora.init")


def trainable(params: Any, lmodel: LoraModel | None = None) -> Any:
    """A bool tree shaped like ``params`` (``Stacked`` nodes included): True on the
    adapter leaves (under ``lora_A``/``lora_B``, or named ``lora_embedding_A``/
    ``lora_embedding_B``) and, given ``lmodel``, on every leaf of its
    ``modules_to_save`` (the head of a classifier, ...); False on every other base leaf.
    For optax::

        tx = optax.multi_transform({True: optax.adam(1e-3), False: optax.set_to_zero()},
                                   lora.trainable(params, lmodel))

    whose state then holds moments for the trained leaves only (``optax.masked`` alone
    passes the other gradients through unchanged: chain it with ``set_to_zero`` on the
    rest).

    Raises:
      ValueError: ``lmodel`` given but not from ``wrap``.
    """
    saved = () if lmodel is None else _need_wrapped("lora.trainable", lmodel).modules_to_save

    def is_trained(path: tuple[Any, ...], _: Any) -> bool:
        keys = [getattr(k, "key", None) for k in path]
        if any(k in _ADAPTER_KEYS for k in keys):
            return True
        name = ".".join(str(k) for k in keys)
        return any(_under(name, s) for s in saved)

    return jax.tree_util.tree_map_with_path(is_trained, params)


def merge(lmodel: LoraModel, params: Params) -> tuple[Layer, Params]:
    """``(lmodel.model, merged)``: the model given to ``wrap`` and params with exactly
    its names, each target's ``weight`` replaced by ``weight + scaling * B @ A`` (in the
    weight's layout: transposed for a transposed ``Linear``; ``[out, in, *k]`` for a
    convolution; an Embedding's ``(B @ A).T``), computed in at least float32 and cast to
    the weight's dtype, as PEFT's ``merge_and_unload``. ``params`` is not changed; the
    merged tree lists its names in the model's order (``model.ordered``).
    """
    lmodel = _need_wrapped("lora.merge", lmodel)

    def visit(layer: _Lora, tree: Params, names: tuple[str, ...], lead: tuple[int, ...]):
        w = tree["weight"]
        base = _base_only(tree)
        base["weight"] = (
            w.astype(jnp.promote_types(w.dtype, jnp.float32)) + layer.delta(tree)
        ).astype(w.dtype)
        return base

    model = lmodel.model
    return model, model.ordered(_map_targets(lmodel, params, visit, "lora.merge"))


# -- PEFT's adapter folder ---------------------------------------------------------------


def _adapter_names(lmodel: LoraModel) -> list[str]:
    """Our dotted names of every adapter array, per block, in target order."""
    names = []
    for path, layer in lmodel.adapters().items():
        names += [f"{path}.{n}" for n in layer.adapter_keys]
    return names


def _peft_targets(lmodel: LoraModel) -> list[str] | str:
    """``target_modules`` for ``adapter_config.json``: the matched paths, which PEFT reads
    as names of the modules whose path equals one or ends in ``.`` + one; where that
    would also take in another module (``fc`` beside ``head.fc``), one regular expression
    of the paths, which PEFT matches against whole paths."""
    chosen = set(lmodel.target_modules)
    for path, _ in modules(lmodel.model):
        parts = path.split(".")
        suffixes = (".".join(parts[i:]) for i in range(1, len(parts)))
        if path not in chosen and any(s in chosen for s in suffixes):
            return "|".join(re.escape(t) for t in lmodel.target_modules)
    return list(lmodel.target_modules)


def _task_type(model: Layer) -> str | None:
    """PEFT's ``task_type`` for the base model: the class's ``peft_task_type`` where it
    names one, ``CAUSAL_LM`` for a causal LM (a model with ``init_cache``), else none."""
    named = getattr(type(model), "peft_task_type", None)
    if named is not None:
        return named
    return "CAUSAL_LM" if callable(getattr(model, "init_cache", None)) else None


def _peft_config(
    lmodel: LoraModel, base_model_name_or_path: str | None, task_type: str | None
) -> dict[str, Any]:
    """What ``peft.LoraConfig(...).to_dict()`` holds for these settings (the fields every
    PEFT release since 0.9 reads), with the matched paths as ``target_modules``."""
    linears = [m.base for m in lmodel.adapters().values() if isinstance(m, LoraLinear)]
    fan_in_fan_out = bool(linears) and all(b.transposed for b in linears)
    return {
        "peft_type": "LORA",
        "task_type": task_type,
        "base_model_name_or_path": base_model_name_or_path,
        "revision": None,
        "inference_mode": True,
        "r": lmodel.r,
        "target_modules": _peft_targets(lmodel),
        "exclude_modules": None,
        "lora_alpha": lmodel.lora_alpha,
        "lora_dropout": lmodel.lora_dropout,
        "fan_in_fan_out": fan_in_fan_out,
        "bias": "none",
        "use_rslora": lmodel.use_rslora,
        "modules_to_save": list(lmodel.modules_to_save) or None,
        "init_lora_weights": True,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "megatron_config": None,
        "megatron_core": "megatron.core",
        "loftq_config": {},
        "use_dora": False,
        "layer_replication": None,
        "lora_bias": False,
    }


def save_adapter(
    path: str | os.PathLike,
    lmodel: LoraModel,
    params: Params,
    *,
    base_model_name_or_path: str | None = None,
    task_type: str | None = None,
) -> Path:
    """Write PEFT's adapter folder: ``peft.PeftModel.from_pretrained(base, path)`` loads
    it onto the torch model whose ``state_dict`` names ``lmodel.model``'s params carry.

    ``adapter_model.safetensors`` holds the adapter arrays, named
    ``base_model.model.<target>.lora_A.weight`` (per block; in their dtype), and the
    weights of ``lmodel.modules_to_save`` under the names PEFT saves them by
    (``base_model.model.classifier.weight``: the base name, where PEFT's model holds
    ``classifier.modules_to_save.default.weight``), no other base weight. A classifier's
    or question-answering model's head is always among them (``wrap`` adds it, as PEFT
    does): PEFT builds that head afresh from the base model
    when it loads the adapter, so a trained head it does not find is lost.
    ``adapter_config.json`` PEFT's ``LoraConfig`` fields with the matched paths as
    ``target_modules`` (and the saved modules' paths as ``modules_to_save``) and
    ``fan_in_fan_out`` true for transposed (GPT-2) Linears, its
    ``task_type`` and ``base_model_name_or_path``: with both,
    ``peft.AutoPeftModelForCausalLM.from_pretrained(path)`` loads the base model and the
    adapter by itself. The folder is created if needed; each file is written atomically,
    and nothing is written when a check fails.

    Args:
      path: the folder.
      lmodel: the ``LoraModel``.
      params: its params (from ``init``, ``load_adapter``, or training).
      base_model_name_or_path: the base model's folder or Hub id, recorded in the
        config. Default: where ``M.from_pretrained`` loaded ``lmodel.model`` from (its
        ``name_or_path``), else ``None``.
      task_type: PEFT's task type (``"CAUSAL_LM"``, ``"SEQ_CLS"``, ...). Default: the
        model's (``"CAUSAL_LM"`` for the causal LMs), else ``None``.

    Returns:
      the folder.
    """
    lmodel = _need_wrapped("lora.save_adapter", lmodel)
    flat = _params.flatten(params)
    names = _adapter_names(lmodel)
    missing = [n for n in names if n not in flat]
    if missing:
        raise ValueError(
            f"lora.save_adapter: params has no {missing[0]!r} ({len(missing)} adapter arrays "
            "missing); pass the params lora.init or lora.load_adapter returns"
        )
    names += [n for n in flat if any(_under(n, s) for s in lmodel.modules_to_save)]
    tensors = _params.unflatten({_PREFIX + n: flat[n] for n in names})
    if base_model_name_or_path is None:
        base_model_name_or_path = getattr(lmodel.model, "name_or_path", None)
    if task_type is None:
        task_type = _task_type(lmodel.model)
    config = _peft_config(lmodel, base_model_name_or_path, task_type)
    text = json.dumps(config, indent=2, sort_keys=True)
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    _params.save(folder / ADAPTER_WEIGHTS_NAME, tensors)
    with _atomic.Temporary(folder / ADAPTER_CONFIG_NAME) as tmp:
        tmp.file.write_text(text + "\n", encoding="utf-8")
        tmp.finish()
        tmp.commit()
    return folder


def load_adapter(path: str | os.PathLike, lmodel: LoraModel, base_params: Params) -> Params:
    """``base_params`` with the adapter of PEFT's folder at ``path`` (written by
    ``peft``'s ``save_pretrained`` or by ``save_adapter``) on every target.

    The config's ``r``, ``lora_alpha`` and ``use_rslora`` must be ``lmodel``'s, and the
    file must hold exactly ``lmodel``'s adapter names (``base_model.model.<target>...``,
    per block) with their shapes; arrays are cast to the dtype ``init`` gives adapters
    (the base weight's; float32 over a float16 or bfloat16 base). Base weights PEFT
    saves beside an adapter (by default when ``embed_tokens`` or ``lm_head`` is a
    target: ``<name>.base_layer.weight``; the weights of PEFT's ``modules_to_save``,
    such as a classifier's head: ``classifier.weight``) replace the base's under that
    name, as ``PeftModel.from_pretrained`` loads them (cast to its dtype, shapes
    checked). Every
    check runs before anything is built; ``base_params`` is not changed.

    Raises:
      FileNotFoundError: no ``adapter_config.json`` or ``adapter_model.safetensors``.
      CheckpointError: (a ``ValueError``) a config or file that does not fit ``lmodel``
        (names missing or unexpected, wrong shapes, other settings), naming the file.
      ValueError: ``base_params`` lacking a target's weight.
    """
    lmodel = _need_wrapped("lora.load_adapter", lmodel)
    folder = Path(path)
    config_file, weights_file = folder / ADAPTER_CONFIG_NAME, folder / ADAPTER_WEIGHTS_NAME
    for file in (config_file, weights_file):
        if not file.is_file():
            raise FileNotFoundError(
                f"lora.load_adapter: {folder} has no {file.name} (PEFT's adapter folder holds "
                f"{ADAPTER_CONFIG_NAME} and {ADAPTER_WEIGHTS_NAME})"
            )
    check_config(config_file, read_config(config_file), lmodel)
    tensors = _params.load(weights_file)
    expected: dict[str, tuple[int, ...]] = {}

    def shapes(layer: _Lora, tree: Params, names: tuple[str, ...], lead: tuple[int, ...]):
        rel = layer.adapter_shapes(tuple(tree["weight"].shape[len(lead) :]))
        expected.update({f"{n}.{k}": s for n in names for k, s in rel.items()})
        return tree

    _map_targets(lmodel, base_params, shapes, "lora.load_adapter")
    got = {k.removeprefix(_PREFIX): v for k, v in tensors.items()}
    base = base_weights(lmodel, base_params, got)
    check_names(weights_file, expected, {k: tuple(v.shape) for k, v in got.items()})
    check_ties(weights_file, lmodel, base_params, base)
    if base:
        try:
            base_params = _params.load_state_dict(
                base_params, base, strict=False, return_keys=True, model=lmodel.model
            )[0]
        except ValueError as e:
            raise _params.CheckpointError(
                weights_file,
                f"the base weights it holds beside the adapter do not fit the model ({e}); "
                "was the vocabulary resized? build the model with the adapter's",
            ) from None

    def fetch(layer: _Lora, tree: Params, names: tuple[str, ...], lead: tuple[int, ...]):
        dtype = adapter_dtype(tree["weight"].dtype)
        rel = list(layer.adapter_shapes(tuple(tree["weight"].shape[len(lead) :])))
        blocks = [
            _params.unflatten({k: jnp.asarray(got[f"{n}.{k}"], dtype) for k in rel}) for n in names
        ]
        return _with_adapter(layer, tree, _stack(blocks, lead))

    return _map_targets(lmodel, base_params, fetch, "lora.load_adapter")
