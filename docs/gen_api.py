"""Writes docs/api/*.md: an entry for every public name (each module's ``__all__``),
grouped by the module that defines it. Run it after adding public names:
``python docs/gen_api.py`` (tests/test_docs.py fails, naming them, until they have an
entry). Names are given by their public path where griffe resolves it statically, else
by the path of the module that defines them; names re-exported from JAX get a table."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PAGES = {
    "purelayers": "purelayers",
    "layers": "purelayers.layers",
    "functional": "purelayers.functional",
    "models": "purelayers.models",
    "params": "purelayers.params",
    "init": "purelayers.init",
    "lora": "purelayers.lora",
    "sharding": "purelayers.sharding",
    "testing": "purelayers.testing",
    "debug": "purelayers.debug",
    "precision": "purelayers.precision",
}
SPECIAL = ("Submodules", "Constants", "Re-exports")
PACKAGE = griffe.load("purelayers", search_paths=[str(ROOT)], resolve_aliases=True)


def found(path: str) -> bool:
    try:
        PACKAGE[path.split(".", 1)[1]]
    except (KeyError, griffe.AliasResolutionError):
        return False
    return True


def submodule(path: str) -> bool:
    try:
        return importlib.util.find_spec(path) is not None
    except ModuleNotFoundError:
        return False


def identifier(module: str, name: str, obj: object) -> str:
    home = getattr(obj, "__module__", None) if group(obj) != "Constants" else None
    for path in (f"{module}.{name}", *([f"{home}.{name}"] if home else [])):
        if found(path) and not submodule(path):
            return path
    path = f"{home}.{getattr(obj, '__qualname__', name)}"
    if not home or not found(path):
        raise SystemExit(f"{module}.{name}: griffe finds it under no path")
    return path


def group(obj: object) -> str:
    if isinstance(obj, types.ModuleType):
        return "Submodules"
    if isinstance(obj, (type, types.FunctionType)):
        return obj.__module__ if obj.__module__.startswith("purelayers") else "Re-exports"
    return "Constants"


def page(module: str) -> str:
    mod = importlib.import_module(module)
    groups: dict[str, list[str]] = {}
    for name in mod.__all__:
        groups.setdefault(group(getattr(mod, name)), []).append(name)
    own = module if module != "purelayers" else "purelayers."
    single = len([k for k in groups if k not in ("Submodules", "Re-exports")]) == 1
    lines = [f"# `{module}`", "", f"::: {module}", "    options:", "      members: false"]
    lines += ["      show_root_heading: false", "      show_root_toc_entry: false", ""]
    for key in sorted(groups, key=lambda k: (k in SPECIAL, not k.startswith(own), k)):
        names = groups[key]
        if key == "Re-exports":
            lines += ["## Re-exported from JAX", "", "| name | is |", "| --- | --- |"]
            for n in names:
                obj = getattr(mod, n)
                lines.append(f"| `{n}` | `{obj.__module__}.{obj.__qualname__}` |")
            lines.append("")
        elif key == "Submodules":
            lines += ["## Submodules", ""]
            lines += [f"- [`{module}.{n}`]({n}.md)" for n in names] + [""]
        else:
            if not single:
                title = ".".join(c.lstrip("_") for c in key.split(".")[1:])
                lines += ["## Constants" if key == "Constants" else f"## `{title}`", ""]
            for n in names:
                lines += [f"::: {identifier(module, n, getattr(mod, n))}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    for slug, module in PAGES.items():
        (ROOT / "docs" / "api" / f"{slug}.md").write_text(page(module))
