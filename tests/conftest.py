"""torch, transformers and peft, the golden references: found, or skipped (suite-wide settings are in the root
``conftest.py``)."""

import os

import pytest

# a script run in its own process (it sets an 8-device XLA_FLAGS when imported), not a
# module for --doctest-modules to import
collect_ignore = ["sharding_scenarios.py", "distributed_scenario.py"]


@pytest.fixture(scope="session")
def torch():
    """The golden reference. Skips where torch is missing, unless PURELAYERS_REQUIRE_TORCH
    is set (as in CI), where a missing torch fails loudly."""
    try:
        import torch as _torch
    except ImportError:
        if os.environ.get("PURELAYERS_REQUIRE_TORCH"):
            raise
        pytest.skip("torch is not installed (set PURELAYERS_REQUIRE_TORCH=1 to fail instead)")
    _torch.manual_seed(0)
    return _torch


@pytest.fixture(scope="session")
def transformers(torch):
    """Hugging Face transformers, the reference for ``purelayers.models``; skipped or
    failing where it is missing, as ``torch``."""
    try:
        import transformers as _transformers
    except ImportError:
        if os.environ.get("PURELAYERS_REQUIRE_TORCH"):
            raise
        pytest.skip("transformers is not installed (set PURELAYERS_REQUIRE_TORCH=1 to fail)")
    _transformers.logging.set_verbosity_error()
    return _transformers


@pytest.fixture(scope="session")
def peft(transformers):
    """Hugging Face PEFT, the reference for ``purelayers.lora``; skipped or failing where
    it is missing, as ``torch``."""
    try:
        import peft as _peft
    except ImportError:
        if os.environ.get("PURELAYERS_REQUIRE_TORCH"):
            raise
        pytest.skip("peft is not installed (set PURELAYERS_REQUIRE_TORCH=1 to fail)")
    return _peft
