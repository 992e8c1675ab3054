"""Training state through orbax, flax.serialization and ``pl.params``: round trips of
stacked blocks, BatchNorm state, a LoRA Llama and optax states over them; concurrent
saves and loads of one path; a run killed with SIGKILL and resumed bit-identically."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import flax.serialization as fs
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

import purelayers as pl
from purelayers import layers as L
from purelayers import lora
from purelayers import models as M
from tests import checkpoint_workers as workers

ROOT = Path(__file__).resolve().parents[1]


def _repeat():
    model = L.Sequential(L.Linear(8), L.Repeat(L.Linear(8), 3), L.Linear(2))
    return model.init(jax.random.key(0), (2, 4))


def _batchnorm():
    model = L.Sequential(L.Conv2d(4, 3), L.BatchNorm2d(), L.ReLU())
    state = model.init_state((2, 3, 8, 8))
    return jax.tree.map(lambda a: a + 1, state)


def _lora_llama():
    config = M.LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
    )  # fmt: skip
    lmodel = lora.wrap(M.LlamaForCausalLM(config), ["q_proj", "v_proj"], r=2)
    return lmodel.init(jax.random.key(0), (1, 8))


TREES = {"repeat": _repeat, "batchnorm": _batchnorm, "lora_llama": _lora_llama}


def _with_optimizer(params):
    """params, an adam state and a multi_transform/chain state (masked nodes, empty
    states) after one update, a step and typed keys of two impls."""
    floats = jax.tree.map(lambda a: jnp.issubdtype(a.dtype, jnp.floating), params)
    labels = jax.tree.map(lambda f: "train" if f else "freeze", floats)
    numbers = jax.tree.map(lambda a: a.astype(jnp.float32), params)  # (counters too)
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.multi_transform({"train": optax.adamw(1e-3), "freeze": optax.set_to_zero()}, labels),
    )
    opt = tx.init(numbers)
    grads = jax.tree.map(jnp.ones_like, numbers)
    _, opt = tx.update(grads, opt, numbers)
    adam = optax.adam(1e-3)
    _, adam_state = adam.update(grads, adam.init(numbers), numbers)
    return {
        "params": params,
        "adam": adam_state,
        "opt": opt,
        "step": jnp.int32(7),
        "key": jax.random.key(3),
        "rbg": jax.random.key(4, impl="rbg"),
    }


def _same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            assert jax.random.key_impl(x) == jax.random.key_impl(y)
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        assert x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("which", TREES)
def test_orbax_and_flax_round_trip(tmp_path, which):
    tree = _with_optimizer(TREES[which]())
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "standard", tree)
    checkpointer.wait_until_finished()
    _same(checkpointer.restore(tmp_path / "standard", abstract), tree)
    options = ocp.CheckpointManagerOptions(max_to_keep=1)
    with ocp.CheckpointManager(tmp_path / "managed", options=options) as manager:
        for step in (1, 2):
            manager.save(step, args=ocp.args.StandardSave(tree))
        manager.wait_until_finished()
        assert manager.all_steps() == [2]
        _same(manager.restore(2, args=ocp.args.StandardRestore(abstract)), tree)
    assert sorted(os.listdir(tmp_path / "managed")) == ["2"]  # no temporaries
    flax_tree = {k: v for k, v in tree.items() if k not in ("key", "rbg")}  # (arrays only)
    _same(fs.from_bytes(flax_tree, fs.to_bytes(flax_tree)), flax_tree)
    _same(fs.from_state_dict(flax_tree, fs.to_state_dict(flax_tree)), flax_tree)


@pytest.mark.parametrize("which", TREES)
def test_params_save_and_load_into_round_trip_optimizer_states_and_keys(tmp_path, which):
    tree = _with_optimizer(TREES[which]())
    path = pl.params.save(tmp_path / "state.safetensors", tree)
    names = list(pl.params.load(path))
    assert "key" in names and "step" in names
    assert any(n.startswith("opt.1.inner_states.train.inner_state.0.mu.") for n in names)
    assert any(n.startswith("adam.0.nu.") for n in names)
    _same(pl.params.load_into(path, tree), tree)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)
    _same(pl.params.load_into(path, abstract), tree)
    if which == "lora_llama":
        assert "adam.0.mu.model.layers.0.self_attn.q_proj.lora_A.weight" in names


def test_check_like_names_the_first_mismatches():
    tree = _with_optimizer(_repeat())
    pl.params.check_like(tree, tree)
    other = _with_optimizer(_batchnorm())
    with pytest.raises(ValueError, match=r"names only the run has \(\d+\): \[adam\.0\.mu\.0"):
        pl.params.check_like(tree, other)
    wider = dict(tree, params=jax.tree.map(lambda a: jnp.zeros((*a.shape, 2)), tree["params"]))
    with pytest.raises(ValueError, match=r"shapes differ: params\.0\.bias: run \(8,\), saved"):
        pl.params.check_like(tree, wider)


def test_flax_refuses_a_state_that_is_not_a_stacked_nodes():
    params = _repeat()
    state = fs.to_state_dict(params)
    assert set(state["1"]) == {"tree"}
    state["1"] = {"weight": state["1"]["tree"]["weight"]}
    with pytest.raises(ValueError, match=r"a Stacked node's state is \{'tree': ...\}, got"):
        fs.from_state_dict(params, state)


@pytest.mark.parametrize("sharded", [False, True])
def test_concurrent_saves_and_loads_read_whole_checkpoints(tmp_path, sharded):
    path = tmp_path / ("ck" if sharded else "ck.safetensors")
    size = {"max_shard_bytes": 300_000} if sharded else {}
    pl.params.save(path, workers.values(0), **size)
    stop, errors = threading.Event(), []

    def saver(first):
        k = first
        try:
            while not stop.is_set():
                pl.params.save(path, workers.values(k), **size)
                k += 2
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=saver, args=(i + 1,)) for i in range(2)]
    for t in threads:
        t.start()
    seen, deadline = set(), time.monotonic() + 3
    try:
        while time.monotonic() < deadline:
            seen.add(workers.which(pl.params.load(path)))  # one whole checkpoint, or raises
            loaded = pl.params.load_into(path, workers.values(0))
            workers.which(pl.params.flatten(loaded))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors
    assert len(seen) > 1  # the loads did overlap saves


def _run(folder, steps):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "tests.train_state_worker", str(folder), str(steps)]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)


def _losses(lines):
    return dict(line.split() for line in lines if line.strip())


def test_a_run_killed_mid_training_resumes_bit_identically(tmp_path):
    steps = 12
    reference, killed = _run(tmp_path / "reference", steps), _run(tmp_path / "run", steps)
    seen = []
    for line in killed.stdout:
        seen.append(line)
        if line.startswith("7 "):  # after the checkpoint of step 6, mid-run
            killed.send_signal(signal.SIGKILL)
            break
    killed.wait(60)
    assert killed.returncode == -signal.SIGKILL
    expected = _losses(reference.communicate(timeout=300)[0].splitlines())
    assert len(expected) == steps
    resumed = _run(tmp_path / "run", steps)
    lines = resumed.communicate(timeout=300)[0].splitlines()
    assert resumed.returncode == 0
    got = _losses(lines)
    assert int(min(got, key=int)) in (4, 7)  # from the checkpoint of step 3 or 6
    assert got == {k: v for k, v in expected.items() if k in got}
    assert _losses(seen) == {k: v for k, v in expected.items() if k in _losses(seen)}
    assert sorted(os.listdir(tmp_path / "run"), key=int) == ["9", "12"]  # no temporaries
