"""Whether a PEFT adapter folder fits a wrapped model, before ``lora.load_adapter``
builds anything: its ``adapter_config.json`` settings (plain LoRA with the wrapped
model's ``r``, ``lora_alpha`` and ``use_rslora``; PEFT settings that would make it
compute something else are refused by name), its adapter names and shapes, and the
base weights PEFT saves beside the adapters (taken out by the names they load under;
one side of a tied pair alone is refused)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from purelayers import _safetensors_io as _io
from purelayers import params as _params
from purelayers._labels import checkpoint_names
from purelayers.layers.core import Params
from purelayers.lora.model import LoraModel

_PREFIX = "base_model.model."  # PEFT's prefix for a LoRA model's adapter names
_ADAPTER_KEYS = frozenset({"lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"})


def read_config(file: Path) -> dict[str, Any]:
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as e:
        config = f"not valid JSON ({e})"
    if not isinstance(config, dict):
        problem = config if isinstance(config, str) else "not a JSON object"
        raise _params.CheckpointError(file, problem)
    return config


def check_config(file: Path, config: dict[str, Any], lmodel: LoraModel) -> None:
    """The file's settings must be the wrapped model's (and plain LoRA)."""
    want = {
        "peft_type": "LORA",
        "r": lmodel.r,
        "lora_alpha": lmodel.lora_alpha,
        "use_rslora": lmodel.use_rslora,
        "use_dora": False,
        "bias": "none",
        "lora_bias": False,
        "rank_pattern": {},
        "alpha_pattern": {},
    }
    defaults = {"use_rslora": False, "use_dora": False, "bias": "none", "lora_bias": False}
    init = config.get("init_lora_weights", True)
    if isinstance(init, str) and init.startswith(_REWRITES_BASE):
        raise _params.CheckpointError(
            file,
            f"init_lora_weights is {init!r}: PEFT rewrites the base weights from it when it "
            "loads the adapter, which lora.load_adapter does not; save the adapter with PEFT's "
            "save_pretrained(..., path_initial_model_for_weight_conversion=...) to get a plain "
            "LoRA adapter of the unchanged base",
        )
    for field in _VARIANTS:
        if config.get(field) not in (None, False, [], {}):
            raise _params.CheckpointError(
                file,
                f"{field} is {config[field]!r}: a LoRA variant (or a change to the base "
                "model) that lora.load_adapter does not implement; it reads plain LoRA adapters",
            )
    for field, expected in want.items():
        got = config.get(field, defaults.get(field, {} if field.endswith("pattern") else None))
        if got != expected and not (got is None and field.endswith("pattern")):
            raise _params.CheckpointError(
                file,
                f"{field} is {got!r} but the wrapped model has {expected!r}; wrap the model "
                f"with the adapter's settings (lora.wrap(model, ..., {field}={got!r}))"
                if field in ("r", "lora_alpha", "use_rslora")
                else f"{field} is {got!r}; lora.load_adapter reads plain LoRA adapters "
                f"({field}={expected!r})",
            )


# PEFT initializations that rewrite the base weights when the adapter is loaded
_REWRITES_BASE = ("pissa", "olora", "corda", "loftq")
# adapter_config.json fields that change what PEFT computes beyond plain LoRA (set: refused)
_VARIANTS = (
    "alora_invocation_tokens",
    "velora_config",
    "monteclora_config",
    "use_bdlora",
    "arrow_config",
    "kasa_config",
    "layer_replication",
    "use_qalora",
    "loftq_config",
)


def base_weights(lmodel: LoraModel, base_params: Params, got: dict[str, Any]) -> dict[str, Any]:
    """Take out of ``got`` the base weights PEFT saves beside an adapter (with its default
    ``save_embedding_layers="auto"``, a targeted ``embed_tokens`` or ``lm_head``'s
    ``<name>.base_layer.weight``; a resized embedding's ``<name>.weight``), by the base
    name they load under, as ``PeftModel.from_pretrained`` loads them into the model.
    Names that are neither adapters nor base names stay in ``got`` (unexpected)."""
    names = set(checkpoint_names(base_params)) | set(lmodel.model.aliases())
    base = {}
    for key in list(got):
        parts = key.split(".")
        if _ADAPTER_KEYS.intersection(parts):
            continue
        name = ".".join(p for p in parts if p != "base_layer")
        if name in names:
            base[name] = got.pop(key)
    return base


def check_ties(file: Path, lmodel: LoraModel, base_params: Params, base: dict[str, Any]) -> None:
    """A base weight saved for one side of a tied pair only (PEFT's ``modules_to_save``
    on ``lm_head`` or the embedding, with its default ``ensure_weight_tying=False``)
    that differs from the model's: PEFT unties the pair (the other side keeps its
    weight), which a tied model cannot hold; a ``CheckpointError`` rather than both
    sides changed."""
    flat = None
    for alias, original in lmodel.model.aliases().items():
        saved = [n for n in (alias, original) if n in base]
        if len(saved) != 1:
            continue
        if flat is None:
            flat = _params.flatten(base_params)
        if original in flat and not _io.same_values(base[saved[0]], flat[original]):
            raise _params.CheckpointError(
                file,
                f"it holds a new {saved[0]!r} but not {(alias, original)[saved[0] == alias]!r}, "
                f"which the model ties to it ({alias!r} is {original!r}): PEFT unties the two "
                "(modules_to_save without ensure_weight_tying=True), a tied model cannot; save "
                "the adapter with ensure_weight_tying=True, or build the model untied",
            )


def check_names(file: Path, expected: dict[str, tuple], got: dict[str, tuple]) -> None:
    missing = [n for n in expected if n not in got]
    unexpected = [n for n in got if n not in expected]
    wrong = [
        f"{n}: expected {expected[n]}, got {got[n]}"
        for n in expected
        if n in got and got[n] != expected[n]
    ]
    problems = []
    if missing:
        problems.append(
            f"missing {len(missing)} adapter arrays {[_PREFIX + n for n in missing[:4]]}"
        )
    if unexpected:
        problems.append(
            f"{len(unexpected)} names the model has no adapter for {sorted(unexpected)[:4]}"
        )
    if wrong:
        problems.append(f"shapes that do not fit: {'; '.join(wrong[:4])}")
    if problems:
        raise _params.CheckpointError(
            file,
            "does not fit the wrapped model: " + "; ".join(problems) + " (is it an adapter of "
            "this base model, wrapped with the same target_modules and r?)",
        )
