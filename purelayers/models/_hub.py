"""``from_pretrained`` and ``save_pretrained``: Hugging Face model folders
(``config.json`` plus ``model.safetensors``, or shards and their index) to and from
``(model, params)``, by name, with no conversion."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers import _atomic
from purelayers import _safetensors_io as _io
from purelayers import params as _params
from purelayers.errors import CheckpointError
from purelayers.models.config import _thawed

__all__ = ["MODEL_TYPES", "from_pretrained", "name_or_path", "save_pretrained"]

DEFAULT_MAX_SHARD_SIZE = 5 * 10**9  # bytes, as transformers' "5GB"
# what ``save_pretrained(..., tokenizer_from=folder)`` copies, where the folder has them
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def _model_types() -> dict[str, type]:
    from purelayers.models import (
        bert,
        clip,
        distilbert,
        gemma,
        gpt2,
        gpt_oss,
        llama,
        mixtral,
        modernbert,
        olmo2,
        phi3,
        qwen3,
        qwen3_moe,
        roberta,
        siglip,
        t5,
        vit,
        whisper,
    )

    return {
        "gpt2": gpt2.GPT2LMHeadModel,
        "llama": llama.LlamaForCausalLM,
        "mistral": llama.MistralForCausalLM,
        "qwen2": llama.Qwen2ForCausalLM,
        "mixtral": mixtral.MixtralForCausalLM,
        "qwen3_moe": qwen3_moe.Qwen3MoeForCausalLM,
        "bert": bert.BertModel,
        "vit": vit.ViTModel,
        "roberta": roberta.RobertaModel,
        "qwen3": qwen3.Qwen3ForCausalLM,
        "olmo2": olmo2.Olmo2ForCausalLM,
        "gemma2": gemma.Gemma2ForCausalLM,
        "gemma3_text": gemma.Gemma3ForCausalLM,
        "phi3": phi3.Phi3ForCausalLM,
        "clip": clip.CLIPModel,
        "siglip": siglip.SiglipModel,
        "gpt_oss": gpt_oss.GptOssForCausalLM,
        "t5": t5.T5ForConditionalGeneration,
        "distilbert": distilbert.DistilBertModel,
        "modernbert": modernbert.ModernBertModel,
        "whisper": whisper.WhisperForConditionalGeneration,
    }


def _architectures() -> dict[str, type]:
    """The task-head classes ``from_pretrained`` picks by ``config["architectures"][0]``
    (the base classes of ``_model_types()`` are found by name too)."""
    from purelayers.models import (
        bert_heads,
        distilbert,
        modernbert,
        roberta,
        seq_cls,
        vit_heads,
        whisper,
    )

    heads = [
        vit_heads.ViTForImageClassification,
        seq_cls.LlamaForSequenceClassification,
        seq_cls.Qwen2ForSequenceClassification,
        distilbert.DistilBertForSequenceClassification,
        modernbert.ModernBertForSequenceClassification,
        roberta.RobertaForSequenceClassification,
        roberta.RobertaForMaskedLM,
        bert_heads.BertForSequenceClassification,
        bert_heads.BertForTokenClassification,
        bert_heads.BertForMaskedLM,
        bert_heads.BertForQuestionAnswering,
        whisper.WhisperModel,
    ]
    return {cls.__name__: cls for cls in [*heads, *_model_types().values()]}


MODEL_TYPES = (
    "gpt2", "llama", "mistral", "qwen2", "bert", "vit", "qwen3", "olmo2", "gemma2", "gemma3_text",
    "phi3", "mixtral", "qwen3_moe", "gpt_oss", "roberta", "clip", "siglip", "t5",
    "distilbert", "modernbert", "whisper",
)  # fmt: skip

_TRUE = ("1", "ON", "YES", "TRUE")


def _resolve(path_or_id: str | os.PathLike, revision: str | None) -> Path:
    """The local folder for ``path_or_id``: itself where it is a folder, else a Hugging
    Face Hub id's snapshot in ``huggingface_hub``'s cache (``snapshot_download``,
    imported only here). ``HF_HUB_OFFLINE`` and ``HF_HUB_CACHE`` are read at the call,
    so setting them after ``huggingface_hub`` was imported still counts."""
    folder = Path(path_or_id)
    if folder.is_dir():
        if revision is not None:
            raise ValueError(
                f"from_pretrained: revision={revision!r} is for a Hub id, and {folder} is a "
                "local folder"
            )
        return folder
    text = os.fspath(path_or_id)
    parts = text.split("/")
    if (
        not isinstance(path_or_id, str)
        or len(parts) > 2
        or not all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", p) for p in parts)
    ):
        raise FileNotFoundError(
            f"from_pretrained: {text!r} is neither a folder nor a Hub id ('org/name')"
        )
    import huggingface_hub

    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE
    try:
        found = huggingface_hub.snapshot_download(
            text,
            revision=revision,
            cache_dir=os.environ.get("HF_HUB_CACHE") or None,
            local_files_only=offline,
            allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt"],
        )
    except Exception as e:  # not in the cache offline, unknown repo, no network
        where = "in the local cache (HF_HUB_OFFLINE is set)" if offline else "on the Hub"
        raise FileNotFoundError(
            f"from_pretrained: {text!r} is not a folder and was not found {where}: "
            f"{type(e).__name__}: {e}"
        ) from None
    return Path(found)


def name_or_path(model: Any) -> str | None:
    """The folder (as given) or Hub id ``from_pretrained`` loaded ``model`` from
    (transformers' ``config._name_or_path``): kept on the model's config, so a copy of
    the model (a LoRA-wrapped one too) keeps it; ``None`` for a model built here."""
    config = getattr(model, "config", None)
    return getattr(config, "name_or_path", None)


def _read_object(file: Path) -> dict[str, Any]:
    """The JSON object in ``file``; a ``ValueError`` naming it otherwise."""
    try:
        found = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"from_pretrained: {file} is not valid JSON ({e})") from None
    if not isinstance(found, dict):
        raise ValueError(f"from_pretrained: {file} must hold a JSON object")
    return found


def _read_config(folder: Path) -> dict[str, Any]:
    file = folder / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"from_pretrained: {folder} has no config.json")
    return _read_object(file)


def _generation_config(folder: Path, cls: Any) -> dict[str, Any] | None:
    """The folder's ``generation_config.json`` as read, for a model that generates, as
    transformers' ``GenerationConfig.from_pretrained`` reads it into
    ``model.generation_config``: its ``eos_token_id`` and ``pad_token_id`` (an
    instruction-tuned model's end-of-turn id is often listed there alone) are what
    ``generate`` stops and pads with, in place of the config's. None without the file."""
    file = folder / "generation_config.json"
    names = {f.name for f in dataclasses.fields(cls)}
    if not file.is_file() or "generation_config" not in names:
        return None
    return _read_object(file)


def _adapt_names(
    model: Any, names: list[str], file_names: list[str]
) -> tuple[dict[str, str], list[str]]:
    """``{model name: file name}`` for a checkpoint saved from another head of the same
    base model: with or without the base model's prefix (``transformer.``, ``bert.``),
    and the names the reference library itself ignores on load (its non-persistent
    buffers). Returns the mapping and the other file names it leaves out."""
    prefix = getattr(model, "base_model_prefix", "") + "."
    ignore = [re.compile(p) for p in getattr(model, "ignore_on_load", ())]
    kept = [n for n in file_names if not any(p.search(n) for p in ignore)]
    wanted = set(names)
    mapping = {}
    for n in kept:
        if n in wanted:
            mapping[n] = n
        elif prefix != "." and prefix + n in wanted:
            mapping[prefix + n] = n
        elif prefix != "." and n.startswith(prefix) and n[len(prefix) :] in wanted:
            mapping[n[len(prefix) :]] = n
    used = set(mapping.values())
    dropped = [n for n in kept if n not in used]
    return mapping, dropped


def from_pretrained(
    path_or_id: str | os.PathLike,
    *,
    dtype: Any = None,
    revision: str | None = None,
    shardings: Any = None,
) -> tuple[Any, Any]:
    """``(model, params)`` from a Hugging Face model folder or Hub id.

    The folder holds ``config.json`` and ``model.safetensors`` (or a sharded
    ``model.safetensors.index.json`` and its shards). The class comes from
    ``config["architectures"][0]`` where the library has that class (the BERT, RoBERTa,
    DistilBERT, ViT, Llama and Qwen2 task heads, the base models), else ``config["model_type"]``'s base class (``gpt2``,
    ``llama``, ``mistral``, ``qwen2``, ``bert``, ``roberta``, ``vit``, ``phi3``, ...),
    the other head's names left out with a ``CheckpointWarning`` naming them. Params are read by name (``pl.params.load_state_dict``'s strict rules:
    every name of the model must be in the file; a tied name may be absent), each
    tensor copied once from the memory-mapped file into its final dtype; nothing is
    initialized. A file saved from another head of the same base model loads too: the
    base model's prefix (``transformer.``, ``model.``, ``bert.``, ``vit.``) is added or
    dropped as the model's names need, and names outside the model (another head's)
    are left out, as transformers does. The params come back in the model's
    registration order, torch's ``state_dict()`` order. A ``generation_config.json``
    beside them becomes the model's ``generation_config`` as read (transformers'
    ``model.generation_config``): its ``eos_token_id`` and ``pad_token_id`` are what
    ``generate`` stops and pads with, in place of ``config.json``'s, as transformers'
    ``generate`` does (the config stays ``config.json``'s). A config that cannot be read
    is a ``ValueError`` naming the file. The model remembers ``path`` as its
    ``name_or_path`` attribute (transformers' ``model.name_or_path``; not a dataclass
    field, so it takes no part in equality), which ``lora.save_adapter`` records as the
    adapter's base model.

    ``name_or_path(model)`` tells where the model came from (``path_or_id`` as given).

    Args:
      path_or_id: the folder, or a Hugging Face Hub id (``"org/name"``) resolved
        through ``huggingface_hub``'s cache (``snapshot_download``: downloaded there
        unless already cached; with ``HF_HUB_OFFLINE=1`` only the cache is read,
        ``HF_HUB_CACHE`` says where it is). A missing folder or id is a
        ``FileNotFoundError``.
      revision: a Hub id's branch, tag or commit. Default ``None``: ``main``.
      dtype: the floating dtype of the params (``jnp.bfloat16``, say). Default
        ``None``: each tensor keeps the file's dtype.
      shardings: a tree of ``Sharding``s shaped like the params (``sharding.
        named_shardings(pl.params.abstract(model, shape), rules, mesh)``), or a
        function ``model -> tree`` (the model is only known once the config is read):
        each device then reads only its own slices from the memory-mapped file(s), as
        ``sharding.load_sharded`` does. Default ``None``: the default device.
    """
    folder = _resolve(path_or_id, revision)
    config = _read_config(folder)
    types = _model_types()
    model_type = config.get("model_type")
    if model_type not in types:
        raise ValueError(
            f"from_pretrained: {folder / 'config.json'} has model_type {model_type!r}; "
            f"supported: {', '.join(MODEL_TYPES)}"
        )
    cls = types[model_type]
    architectures = config.get("architectures") or [None]
    named = _architectures().get(architectures[0])
    if named is not None and named.config_class.model_type == model_type:
        cls = named
    unknown = architectures[0] if named is None and architectures[0] is not None else None
    generation = _generation_config(folder, cls)
    try:
        settings = cls.config_class.from_dict(config)
        model = cls(settings, generation_config=generation) if generation else cls(settings)
    except KeyError as e:  # an entry a setting needs (a rope type's factor, ...)
        raise ValueError(f"from_pretrained: {folder / 'config.json'}: missing {e}") from None
    except ValueError as e:
        raise ValueError(f"from_pretrained: {folder / 'config.json'}: {e}") from None
    tensors = _io.scan(folder)[0]
    # a model whose layout the file decides, as transformers' loading does (T5's head:
    # tied or not by whether the file holds a distinct lm_head.weight)
    fit = getattr(model, "fit_checkpoint", None)
    if fit is not None:
        model = fit(tensors)
    # where it came from (transformers' name_or_path), on the model and its config
    # (frozen; not fields: neither compared nor saved)
    object.__setattr__(model, "name_or_path", os.fspath(path_or_id))
    object.__setattr__(model.config, "name_or_path", os.fspath(path_or_id))
    real = _params.abstract(model, model.example_shape())
    # a model whose files store some arrays in another form (gpt-oss's MXFP4 experts)
    # maps them to tensors read like the file's, converted one at a time when loaded
    unpack = getattr(model, "checkpoint_tensors", None)
    if unpack is not None:
        tensors = unpack(tensors, folder)
    aliases = model.aliases()
    mapping, dropped = _adapt_names(model, [*_params.flatten(real), *aliases], list(tensors))
    if dropped:
        why = f" ({unknown} is not in the library: loaded as {cls.__name__})" if unknown else ""
        warnings.warn(
            f"from_pretrained: {len(dropped)} names of {folder} are not {cls.__name__}'s "
            f"and were left out{why}: {dropped[:20]}",
            _params.CheckpointWarning,
            stacklevel=2,
        )
    source: dict[str, Any] = {name: tensors[file_name] for name, file_name in mapping.items()}
    source.update(_initialized_anew(model, real, source, aliases, folder))

    def leaf(names: tuple[str, ...], spec: jax.ShapeDtypeStruct, _: Any) -> Any:
        if not jnp.issubdtype(spec.dtype, jnp.floating):
            return spec
        stored = source.get(names[0])
        if dtype is not None:
            want = dtype
        elif stored is not None and jnp.issubdtype(stored.dtype, jnp.floating):
            want = stored.dtype
        else:
            want = spec.dtype
        return jax.ShapeDtypeStruct(spec.shape, want)

    template = _params.fill(real, leaf)
    tree = shardings(model) if callable(shardings) else shardings
    try:
        if shardings is None:
            return model, model.ordered(_params.load_state_dict(template, source, model=model))
        from purelayers._sharded_io import load_sharded

        readable = {k: v if hasattr(v, "read") else _InMemory(v) for k, v in source.items()}
        loaded = load_sharded(folder, template, tree, model=model, tensors=readable)
        return model, model.ordered(loaded)
    except (KeyError, ValueError) as e:  # names or shapes that do not fit the config
        raise CheckpointError(
            folder, f"does not fit the {cls.__name__} its config.json describes: {e.args[0]}"
        ) from None


class _InMemory:
    """An array drawn by ``init`` where a file lacks it, read like a file's tensor."""

    def __init__(self, value: Any):
        self.value = np.asarray(value)
        self.dtype, self.shape = self.value.dtype, self.value.shape

    def read(self, index: Any = None, dtype: Any = None, out: Any = None) -> np.ndarray:
        part = self.value[() if index is None else index]
        out = np.empty(part.shape, dtype or self.dtype) if out is None else out
        np.copyto(out, part, casting="unsafe")
        return out


def _initialized_anew(
    model: Any, real: Any, source: dict[str, Any], aliases: dict[str, str], folder: Path
) -> dict[str, Any]:
    """Fresh values for the names a file may lack (``model.optional_on_load``: a BERT
    pooler that a masked-LM head never had), drawn by ``init``; jitted so that only
    those arrays are computed. Other missing names are left for the strict load to
    report."""
    optional = [re.compile(p) for p in getattr(model, "optional_on_load", ())]
    wanted = [
        n
        for n in _params.flatten(real)
        if n not in source
        and not any(a in source and o == n for a, o in aliases.items())
        and any(p.search(n) for p in optional)
    ]
    if not wanted:
        return {}
    warnings.warn(
        f"from_pretrained: {folder} has no {wanted}; they are initialized anew "
        "(train them before use)",
        _params.CheckpointWarning,
        stacklevel=3,
    )
    shape = model.example_shape()
    pick = jax.jit(lambda k: {n: _params.flatten(model.init(k, shape))[n] for n in wanted})
    return pick(jax.random.key(0))


def save_pretrained(
    path: str | os.PathLike,
    model: Any,
    params: Any,
    *,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    tokenizer_from: str | os.PathLike | None = None,
) -> Path:
    """Write a folder that transformers' ``from_pretrained`` (and ours) loads.

    ``config.json`` (the model's config, ``model_type`` and ``architectures``) and the
    weights under their Hugging Face names: ``model.safetensors``, or, above
    ``max_shard_size`` bytes, ``model-0000i-of-0000K.safetensors`` shards and
    ``model.safetensors.index.json``. Tied weights are written once, under the
    original's name, as transformers writes them. A causal LM's ``generation_config``
    (the ``generation_config.json`` ``from_pretrained`` read, sampling defaults and all)
    is written back as it was. ``tokenizer_from`` (a folder, usually the one the model
    was loaded from): its tokenizer files (``TOKENIZER_FILES``: ``tokenizer.json``,
    ``tokenizer_config.json``, ``special_tokens_map.json``, the chat template files, a
    slow tokenizer's vocabulary) are copied beside the weights, so
    ``AutoTokenizer.from_pretrained(folder)`` works on the result. Returns the folder.

    Raises:
      ValueError: a LoRA-wrapped model (its adapters would be saved as unknown names
        and lost on load: ``lora.merge`` it first, or ``lora.save_adapter`` the
        adapter), or a ``tokenizer_from`` folder holding no tokenizer file.
    """
    if type(model).__name__ == "LoraModel":
        raise ValueError(
            "save_pretrained: model is LoRA-wrapped; its adapters are not names transformers "
            "(or from_pretrained) loads. Save `lora.merge(lmodel, params)`'s model and params "
            "for a plain folder, or `lora.save_adapter(path, lmodel, params)` for PEFT"
        )
    tokenizer_files = []
    if tokenizer_from is not None:
        source = Path(tokenizer_from)
        tokenizer_files = [source / n for n in TOKENIZER_FILES if (source / n).is_file()]
        if not tokenizer_files:
            raise ValueError(
                f"save_pretrained: tokenizer_from={str(source)!r} holds none of the tokenizer "
                f"files {', '.join(TOKENIZER_FILES)}"
            )
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    floating = {
        np.dtype(a.dtype).name
        for a in jax.tree.leaves(params)
        if jnp.issubdtype(a.dtype, jnp.floating)
    }
    config = {
        **model.config.to_dict(),
        "architectures": [type(model).__name__],
        "dtype": floating.pop() if len(floating) == 1 else "float32",
    }
    total = sum(
        int(np.prod(np.shape(a))) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(params)
    )
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    # The new weights land first (atomically); only then are the other layout's files
    # removed (``params.save`` does both), so a crash in between leaves a loadable folder.
    if total > max_shard_size:
        _params.save(folder, params, model=model, max_shard_bytes=max_shard_size)
    else:
        _params.save(folder / _io.SINGLE_NAME, params, model=model)
    files = {"config.json": text}
    if getattr(model, "generation_config", None) is not None:
        generation = _thawed(model.generation_config)
        files["generation_config.json"] = json.dumps(generation, indent=2, sort_keys=True) + "\n"
    for file in tokenizer_files:
        if file.resolve() != (folder / file.name).resolve():
            files[file.name] = file.read_bytes()
    for name, content in files.items():
        with _atomic.Temporary(folder / name) as tmp:
            if isinstance(content, bytes):
                tmp.file.write_bytes(content)
            else:
                tmp.file.write_text(content, encoding="utf-8")
            tmp.finish()
            tmp.commit()
    return folder
