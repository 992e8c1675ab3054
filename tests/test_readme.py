"""The README's code runs, and CI runs exactly the README's test command."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# Blocks that open with "# sketch" show a fragment of a larger program (named in that line).
BLOCKS = [
    b
    for b in re.findall(r"```python\n(.*?)```", README, flags=re.S)
    if not b.startswith("# sketch")
]


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_python_blocks_run(index, request):
    # blocks that show the torch side take the reference fixtures: skipped where the
    # reference is missing, failing in CI (PURELAYERS_REQUIRE_TORCH), as parity tests
    imports = re.findall(r"^(?:import|from) .*$", BLOCKS[index], re.M)
    for reference in sorted(set(re.findall(r"\b(torch|transformers|peft)\b", "\n".join(imports)))):
        request.getfixturevalue(reference)
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {"__name__": "readme"})


def test_ci_runs_the_readme_test_command():
    bash = re.search(r"```bash\n(.*?)```", README, flags=re.S).group(1)
    commands = [line for line in bash.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2, "the quickstart has exactly two commands: main job and tests"
    assert commands[1] in (ROOT / ".ci" / "run").read_text().splitlines()
