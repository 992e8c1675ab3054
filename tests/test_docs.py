"""The documentation site, checked without building it: the API reference has an entry
for every public name, and mkdocs.yml's nav lists every page. Then a two-page throwaway
site with the same plugins shows that the strict build fails on a broken link, a
missing anchor and a reference to a name that does not exist, naming page and link."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API = DOCS / "api"
# the modules whose __all__ the reference covers, and the page of each
MODULES = {
    "purelayers": "purelayers.md",
    "purelayers.layers": "layers.md",
    "purelayers.functional": "functional.md",
    "purelayers.models": "models.md",
    "purelayers.params": "params.md",
    "purelayers.init": "init.md",
    "purelayers.lora": "lora.md",
    "purelayers.sharding": "sharding.md",
    "purelayers.testing": "testing.md",
    "purelayers.debug": "debug.md",
    "purelayers.precision": "precision.md",
}


def resolve(path: str):
    """The object a mkdocstrings identifier (``purelayers.layers.linear.Linear``) names:
    attributes before submodules, as ``purelayers.layers.dropout`` is the function."""
    parts = path.split(".")
    for i in range(1, len(parts) + 1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            continue
        return obj
    raise ImportError(path)


def directives(page: Path) -> list[str]:
    return re.findall(r"^::: ([\w.]+)\s*$", page.read_text(), re.M)


def test_every_public_name_has_a_reference_entry():
    missing = []
    for module, page in MODULES.items():
        mod = importlib.import_module(module)
        text = (API / page).read_text()
        entries = {}
        for path in directives(API / page):
            entries.setdefault(path.rsplit(".", 1)[-1], []).append(path)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if isinstance(obj, types.ModuleType):
                # a submodule: its own page, or a link to one
                ok = (
                    f"::: {obj.__name__}\n" in "".join(p.read_text() for p in API.glob("*.md"))
                    and f"`{module}.{name}`" in text
                )
            elif re.search(rf"^\| `{re.escape(name)}` \|", text, re.M):
                ok = True  # a row of the page's table of names re-exported from JAX
            else:
                ok = any(resolve(p) is obj for p in entries.get(name, []))
            if not ok:
                missing.append(f"docs/api/{page}: ::: {module}.{name}")
    assert not missing, (
        "public names without a reference entry: run `python docs/gen_api.py`, or add\n"
        + "\n".join(missing)
    )


def test_every_reference_entry_is_a_public_name():
    public = {
        id(getattr(importlib.import_module(m), n))
        for m in MODULES
        for n in importlib.import_module(m).__all__
    }
    stray = [
        f"{page.name}: {path}"
        for page in API.glob("*.md")
        for path in directives(page)
        if path not in MODULES and id(resolve(path)) not in public
    ]
    assert not stray, stray


def test_nav_lists_every_page():
    nav = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r"^\s*- (?:.*: )?([\w./-]+\.md)\s*$", nav, re.M))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages == listed, (sorted(pages - listed), sorted(listed - pages))


def test_the_strict_build_names_broken_links_and_references(tmp_path):
    # the same plugins and validation as mkdocs.yml, on a two-page site
    pytest.importorskip("mkdocstrings")
    config = (ROOT / "mkdocs.yml").read_text()
    config = config[: config.index("\nnav:")].replace("paths: [.]", f"paths: [{ROOT}]")
    config = config.replace("docs/griffe_sections.py", f"{ROOT}/docs/griffe_sections.py")
    # mkdocs' own theme: the links and references are checked the same, and it loads faster
    config = re.sub(r"\ntheme:\n(  .*\n)+", "\ntheme: mkdocs\n", config)
    assert "theme: mkdocs" in config and "mkdocstrings" in config
    (tmp_path / "mkdocs.yml").write_text(config)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(
        "# Home\n\n[a page](nowhere.md), [a heading](other.md#no-such-heading).\n"
    )
    (tmp_path / "docs" / "other.md").write_text(
        "# Other\n\n[Linear][purelayers.layers.NoSuchLayer]\n\n::: purelayers.init.fans\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1
    log = run.stderr + run.stdout
    assert "Doc file 'index.md' contains a link 'nowhere.md', but the target is not found" in log
    assert "'other.md' does not contain an anchor '#no-such-heading'" in log
    assert "other.md: Could not find cross-reference target 'purelayers.layers.NoSuchLayer'" in log
    assert "Aborted with 3 warnings in strict mode" in log


def test_the_home_page_is_the_readme():
    # docs/index.md is README.md with its links made relative to docs/ (the README's
    # links work on the repository's page, the home page's on the site)
    readme = (ROOT / "README.md").read_text()
    home = (DOCS / "index.md").read_text()
    expected = readme.replace("](docs/", "](")
    expected = expected.replace(
        "The site under [`docs/`](index.md) (built by the docs command above):",
        "This site (built by the docs command above):",
    )
    expected = expected.replace(
        "\n[Changes](CHANGELOG.md) · License: [Apache 2.0](LICENSE)\n",
        "\nThe project's changes are in `CHANGELOG.md` and its license (Apache 2.0) in"
        " `LICENSE`, at\nthe root of the repository.\n",
    )
    expected = expected.replace("; docs/guides/pretrained.md runs", "; guides/pretrained.md runs")
    assert home == expected, "docs/index.md differs from README.md: make them the same"
