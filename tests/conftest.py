"""Suite-wide settings: silent rank promotion is an error, XLA compiles without LLVM's
optimization passes, hypothesis is derandomized, and torch is found or skipped."""

import os

# The suite's time is XLA compiling many small programs, not running them: LLVM's
# optimization passes (which change speed, not results) would cost about as much as
# the rest of the compile. Set before JAX creates its CPU backend; subprocesses that
# tests start (examples, the 8-device sharding script) inherit it.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
).strip()

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

# Every property test draws the same examples on every run and machine (a failure
# reproduces by rerunning), with no per-example deadline (the first example compiles).
settings.register_profile("purelayers", derandomize=True, deadline=None, print_blob=True)
settings.load_profile("purelayers")


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
