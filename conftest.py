"""Suite-wide settings, for the tests and the docstring examples (``--doctest-modules``
over ``purelayers``): XLA compiles without LLVM's optimization passes, silent rank
promotion is an error, hypothesis is derandomized, and every example may use ``jax``,
``jnp``, ``np``, ``pl`` and ``L`` without importing them."""

import os

# The suite's time is XLA compiling many small programs, not running them: LLVM's
# optimization passes (which change speed, not results) cost about as much as the rest
# of the compile. Set before JAX creates its CPU backend; subprocesses that tests start
# (examples, the 8-device sharding script) inherit it.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
).strip()

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
