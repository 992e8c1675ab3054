"""Suite-wide settings, for the tests and the docstring examples (``--doctest-modules``
over ``purelayers``): XLA compiles without LLVM's optimization passes, silent rank
promotion is an error, hypothesis is derandomized, and every example may use ``jax``,
``jnp``, ``np``, ``pl`` and ``L`` without importing them."""

import os
import shutil
import tempfile

# The suite's time is XLA compiling many small programs, not running them: LLVM's
# optimization passes (which change speed, not results) cost about as much as the rest
# of the compile. Set before JAX creates its CPU backend; subprocesses that tests start
# (examples, the 8-device sharding script) inherit it.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
).strip()

# One compilation cache for the whole run, shared by the xdist workers and the
# subprocesses tests start (set before they are spawned, so they inherit it): a program
# that two processes need (the same small op at the same shape, say) compiles once. It
# starts empty every run and is removed at its end.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="purelayers-xla-cache-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import settings

import purelayers as pl
from purelayers import layers as L

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update(
    "jax_persistent_cache_min_compile_time_secs",
    float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
)
jax.config.update(
    "jax_persistent_cache_min_entry_size_bytes",
    int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]),
)

# Every property test draws the same examples on every run and machine (a failure
# reproduces by rerunning), with no per-example deadline (the first example compiles).
settings.register_profile("purelayers", derandomize=True, deadline=None, print_blob=True)
settings.load_profile("purelayers")


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace):
    doctest_namespace.update(jax=jax, jnp=jnp, np=np, pl=pl, L=L)


def pytest_unconfigure(config):
    # the process that made the cache removes it (with xdist: the controller, last)
    if _OWN_CACHE and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
