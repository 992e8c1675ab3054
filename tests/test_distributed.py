"""Sharded checkpoints across processes: two local processes joined by
``jax.distributed`` (CPU collectives over gloo) load one checkpoint straight onto their
devices, train, and save it back (tests/distributed_scenario.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import purelayers as pl
import purelayers.sharding as S
from tests import distributed_scenario as scenario

SCRIPT = Path(scenario.__file__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The checkpoint, the two processes' results, and the one-process reference."""
    folder = tmp_path_factory.mktemp("distributed")
    params = scenario.model().init(jax.random.key(0), scenario.SHAPE)
    pl.params.save(folder / "init", params, max_shard_bytes=1 << 20)
    big = np.full(scenario.BIG, 1.5, np.float32)
    pl.params.save(folder / "big.safetensors", {"big": {"weight": big}})
    del big
    port = _free_port()
    outs = [folder / f"rank{r}.json" for r in range(2)]
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), str(r), "2", str(port), str(folder), str(outs[r])],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for r in range(2)
    ]
    # The reference meanwhile, in this process: one device, the same ten steps.
    mesh = S.make_mesh("data=1")
    ref_params, ref_losses = scenario.train(
        jax.device_put(params, S.named_shardings(params, S.data_parallel(), mesh)),
        mesh,
        S.data_parallel(),
        "data",
    )
    for p in procs:
        log, _ = p.communicate(timeout=300)
        assert p.returncode == 0, log[-3000:]
    results = [json.loads(o.read_text()) for o in outs]
    return folder, results, ref_params, ref_losses


def test_two_processes_train_like_one(run):
    _, results, _, ref_losses = run
    for r in results:
        assert (r["devices"], r["local_devices"]) == (4, 2)
        np.testing.assert_allclose(r["losses"], ref_losses, rtol=2e-5, atol=2e-6)
    assert results[0]["losses"] == results[1]["losses"]
    assert ref_losses[-1] < ref_losses[0]


def test_the_checkpoint_they_save_is_the_trained_model(run):
    folder, _, ref_params, _ = run
    saved = pl.params.load_into(
        folder / "trained", pl.params.abstract(scenario.model(), scenario.SHAPE)
    )
    for name, got in pl.params.flatten(saved).items():
        want = np.asarray(pl.params.flatten(ref_params)[name])
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_each_process_reads_only_its_share(run):
    """A 128 MiB checkpoint split over four devices, two per process: each process's
    load adds at most the bytes its own devices hold (64 MiB) plus 32 MiB, so neither
    ever holds the whole checkpoint."""
    _, results, _, _ = run
    whole = int(np.prod(scenario.BIG)) * 4
    for r in results:
        assert r["share"] == whole // 2
        assert r["load_added"] <= r["share"] + (32 << 20) < whole, r
