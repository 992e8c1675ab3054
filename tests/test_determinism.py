"""Initialization and dropout depend only on the key: not on PYTHONHASHSEED, the process,
or the order in which layers were constructed."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import hashlib, sys
import jax, jax.numpy as jnp, numpy as np
import purelayers as pl
from purelayers import layers as L

if sys.argv[1] == "reversed":  # construct unrelated layers first, in another order
    _ = [L.TransformerBlock(2), L.LSTM(3), L.Conv2d(2, 3), L.Linear(5)][::-1]

model = L.Sequential(
    L.Conv2d(4, 3, padding=1), L.BatchNorm2d(), L.ReLU(), L.Flatten(), L.Linear(16),
    L.Dropout(0.5), L.Linear(8),
)
params = model.init(jax.random.key(42), (2, 1, 6, 6))
state = model.init_state((2, 1, 6, 6))
x = jnp.ones((2, 1, 6, 6))
y, _ = model.apply(params, x, state=state, train=True, key=jax.random.key(7))
lstm = L.LSTM(5, num_layers=2, bidirectional=True).init(jax.random.key(1), (4, 2, 3))
block = L.TransformerBlock(2).init(jax.random.key(2), (1, 4, 8))
digest = hashlib.sha256()
for tree in (params, state, {"y": y}, lstm, block):
    for name, value in pl.params.flatten(tree).items():
        digest.update(name.encode())
        digest.update(np.asarray(value).tobytes())
print(digest.hexdigest())
"""


def run(hash_seed: str, order: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, order],
        capture_output=True, text=True, env=env, cwd=ROOT, check=True, timeout=600,
    )  # fmt: skip
    return out.stdout.strip().splitlines()[-1]


def test_init_and_dropout_are_byte_identical_across_processes():
    first = run("1", "plain")
    second = run("12345", "reversed")
    assert len(first) == 64
    assert first == second
