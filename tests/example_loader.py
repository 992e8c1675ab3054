"""Import an example script (examples/ is not a package) so tests can call its main()."""

import importlib.util
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    # registered under its own name: a script's dataclasses look their module up by
    # name, and scripts import their siblings (`from diffusion import ...`)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
