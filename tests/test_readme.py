"""The code of the README and of the documentation site runs, and CI runs exactly the
README's test and docs commands."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(text: str) -> list[str]:
    """The ```python blocks of a Markdown text, but those that open with "# sketch" (a
    fragment of a larger program, named in that line)."""
    return [
        b
        for b in re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
        if not b.startswith("# sketch")
    ]


# each distinct block once (the site's home page repeats the README's), named by its page
BLOCKS: dict[str, str] = {}
for page in PAGES:
    for i, block in enumerate(python_blocks(page.read_text())):
        if block not in BLOCKS.values():
            BLOCKS[f"{page.relative_to(ROOT)}:{i}"] = block


@pytest.mark.parametrize("where", list(BLOCKS))
def test_python_blocks_run(where, request):
    # blocks that show the torch side take the reference fixtures: skipped where the
    # reference is missing, failing in CI (PURELAYERS_REQUIRE_TORCH), as parity tests
    block = BLOCKS[where]
    imports = re.findall(r"^(?:import|from) .*$", block, re.M)
    for reference in sorted(set(re.findall(r"\b(torch|transformers|peft)\b", "\n".join(imports)))):
        request.getfixturevalue(reference)
    exec(compile(block, f"{where} (python block)", "exec"), {"__name__": "readme"})


def test_every_page_block_is_run_or_a_sketch():
    # a block whose fence the pattern above misses (an indented or tilde fence) would
    # silently not run: every ```python fence opens a block that is run or a sketch
    for page in PAGES:
        text = page.read_text()
        fences = len(re.findall(r"^\s*(?:```|~~~)\s*py(?:thon)?\b", text, re.M))
        blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
        assert fences == len(blocks), f"{page}: a python fence not at a line start"


def test_ci_runs_the_readme_test_command():
    bash = re.search(r"```bash\n(.*?)```", README, flags=re.S).group(1)
    lines = bash.splitlines()
    commands = [line for line in lines if line and not line.startswith("#")]
    assert len(commands) == 3, "the quickstart has exactly three commands: main job, tests, docs"
    assert [line.split(":")[0] for line in lines if line.startswith("#")] == [
        "# main job",
        "# tests",
        "# docs",
    ]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci
    assert commands[2] in ci
    assert ci.index(commands[1]) < ci.index(commands[2]), "the docs build runs after the tests"
    assert "mkdocs build --strict" in commands[2]
