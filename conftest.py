"""Suite-wide settings, for the tests and the docstring examples (``--doctest-modules``
over ``purelayers``): XLA compiles without LLVM's optimization passes, silent rank
promotion is an error, hypothesis is derandomized, and every example may use ``jax``,
``jnp``, ``np``, ``pl`` and ``L`` without importing them."""

import os
import re
from importlib.metadata import version

# The suite's time is XLA compiling many small programs, not running them. Three
# settings that change compile speed, not results: no LLVM optimization passes (they
# cost about as much as the rest of the compile), XLA:CPU's elemental emitters instead
# of its newer MLIR fusion emitters (about half the backend compile time of the layer
# table), and one LLVM module per program rather than several compiled in parallel (the
# suite's workers already use every core). Set before JAX creates its CPU backend;
# subprocesses that tests start (examples, the 8-device sharding script) inherit them.
_XLA_FLAGS = ["--xla_backend_optimization_level=0", "--xla_cpu_parallel_codegen_split_count=1"]
# jaxlib 0.11 no longer knows the emitters' flag, and XLA aborts the process on a flag it
# does not know: it is passed only to the releases that have it.
if tuple(int(p) for p in re.findall(r"\d+", version("jaxlib"))[:2]) < (0, 11):
    _XLA_FLAGS.append("--xla_cpu_use_fusion_emitters=false")
os.environ["XLA_FLAGS"] = " ".join((os.environ.get("XLA_FLAGS", ""), *_XLA_FLAGS)).strip()

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import settings

import purelayers as pl
from purelayers import layers as L

jax.config.update("jax_numpy_rank_promotion", "raise")

# Every property test draws the same examples on every run and machine (a failure
# reproduces by rerunning), with no per-example deadline (the first example compiles).
settings.register_profile("purelayers", derandomize=True, deadline=None, print_blob=True)
settings.load_profile("purelayers")


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace):
    doctest_namespace.update(jax=jax, jnp=jnp, np=np, pl=pl, L=L)


# Tests that each take seconds (fresh processes, whole training scripts), run first: the
# workers start on them, and the suite ends on the many short tests, which even out what
# each worker has left. Only the order changes.
_LONG_FIRST = (
    "tests/test_sharding.py",
    "tests/test_distributed.py",
    "tests/test_benchmarks.py",
    "tests/test_determinism.py",
    "tests/test_training_state.py",
    "tests/test_checkpoint_scale.py",
    "tests/test_gallery_",
    "tests/test_example_",
)


def pytest_collection_modifyitems(items):
    def long(item) -> bool:
        path = item.nodeid.split("::")[0]
        return any(path.startswith(prefix) for prefix in _LONG_FIRST)

    items.sort(key=lambda item: not long(item))  # stable: the order within each group stays
