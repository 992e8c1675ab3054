"""Checkpoints at model scale: loads that cost one copy, saves killed at any moment,
rival savers, file modes, and loaded arrays that share nothing with their sources.
Real child processes throughout (tests/checkpoint_workers.py)."""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import random
import signal
import stat
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import _atomic
from purelayers import layers as L
from tests import checkpoint_workers as workers

MiB = 1 << 20


@pytest.fixture(scope="module")
def ctx():
    """Children forked from a server that has imported purelayers once (milliseconds
    each, where a fresh interpreter would import JAX anew)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.checkpoint_workers", "purelayers.params"])
    return context


def _temporaries(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.iterdir() if p.name.startswith(f".{target.name}."))


# -- memory ---------------------------------------------------------------------------


def _big_checkpoint(folder: Path, sharded: bool) -> Path:
    """128 MiB of float32 in tensors of 96, 16, 8, 4, 2, 1, 1 MiB."""
    rng = np.random.default_rng(0)
    sizes = [96, 16, 8, 4, 2, 1, 1]
    params = {
        f"t{i}": rng.standard_normal((m * MiB // 4096, 1024), np.float32)
        for i, m in enumerate(sizes)
    }
    target = folder / ("sharded" if sharded else "model.safetensors")
    return pl.params.save(target, params, max_shard_bytes=40 * MiB if sharded else None)


@pytest.mark.parametrize(
    "how, sharded", [("load", False), ("load_into", True), ("load_into_bf16", False)]
)
def test_loading_costs_one_copy_of_the_result(tmp_path, how, sharded):
    """Peak resident memory a load adds, measured in a fresh process (``getrusage``):
    at most 1.25 times the bytes of the loaded arrays plus a fixed 32 MiB, for a single
    file, a sharded folder, and a cast to bfloat16 (half the file's bytes). Before
    one-copy reads the first case added 2.0x."""
    path = _big_checkpoint(tmp_path, sharded)
    out = subprocess.run(
        [sys.executable, workers.__file__, str(path), how],
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["result_bytes"] == (64 if how == "load_into_bf16" else 128) * MiB
    assert got["added"] <= 1.25 * got["result_bytes"] + 32 * MiB, got


# -- killed savers ----------------------------------------------------------------------


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_savers_killed_at_random_moments_leave_a_complete_checkpoint_and_no_leftovers(
    tmp_path, ctx
):
    """24 savers, each SIGKILLed at a random moment while it saves checkpoint after
    checkpoint: after every kill the file loads and is one complete checkpoint (every
    tensor from the same save), at most one temporary (folder) is left, and after one
    more save none of that target's is. Another target's leftovers, and a temporary of
    a live process, are never touched."""
    target = tmp_path / "model.safetensors"
    pl.params.save(target, workers.values(-1))
    other = tmp_path / f".other.safetensors.{_atomic._host()}.{_dead_pid()}.0123abcd.tmp"
    other.mkdir()
    live = tmp_path / f".model.safetensors.{_atomic._host()}.{os.getpid()}.89abcdef.tmp"
    live.mkdir()
    held = os.open(live, os.O_RDONLY)  # a live writer's: it holds the folder's lock
    fcntl.flock(held, fcntl.LOCK_EX)
    rng = random.Random(0)
    seen = set()
    for i in range(24):
        started = ctx.Event()
        child = ctx.Process(target=workers.save_forever, args=(str(target), 1000 * i, 1, started))
        child.start()
        assert started.wait(30)
        os.kill(child.pid, 0)
        import time

        time.sleep(rng.uniform(0.0, 0.15))
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL
        k = workers.which(pl.params.load(target))
        assert pl.params.load_metadata(target).get("k", "-1") == str(k)
        seen.add(k // 1000 if k >= 0 else -1)
        left = [n for n in _temporaries(target) if n != live.name]
        assert len(left) <= 1, left
    assert len(seen) > 12, f"too few kills landed after a first save: {sorted(seen)}"
    pl.params.save(target, workers.values(7))
    assert _temporaries(target) == [live.name]
    assert other.is_dir()
    assert workers.which(pl.params.load(target)) == 7
    os.close(held)  # the writer is gone: the next save removes its folder
    pl.params.save(target, workers.values(8))
    assert _temporaries(target) == []


def test_stale_temporaries_are_removed_only_when_their_writer_is_gone(tmp_path):
    """A writer locks its folder before giving it its ``.tmp`` name, so a ``.tmp``
    leftover of this machine whose lock is free is a killed writer's, whatever process
    now has its pid (a restarted container's writer often gets the killed one's): it is
    removed. One whose writer still holds its lock stays, as do a ``.new`` folder (not
    yet locked) of a live process, and another machine's (a shared file system)."""
    host = _atomic._host()
    target = tmp_path / "m.safetensors"
    dead = tmp_path / f".m.safetensors.{host}.{_dead_pid()}.00000000.tmp"
    dead.mkdir()
    (dead / "m.safetensors").write_bytes(b"partial")
    reused = tmp_path / f".m.safetensors.{host}.{os.getpid()}.11111111.tmp"  # a live pid
    reused.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path / f".m.safetensors.{host}.1.22222222.tmp")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert holder.stdout.readline().strip() == b"locked"
    held = tmp_path / f".m.safetensors.{host}.1.22222222.tmp"
    starting = tmp_path / f".m.safetensors.{host}.{os.getpid()}.44444444.new"
    starting.mkdir()
    killed_starting = tmp_path / f".m.safetensors.{host}.{_dead_pid()}.55555555.new"
    killed_starting.mkdir()
    unrelated = tmp_path / ".m.safetensors.notapid.tmp"
    unrelated.mkdir()
    elsewhere = tmp_path / f".m.safetensors.another-host.{_dead_pid()}.33333333.tmp"
    elsewhere.mkdir()
    try:
        assert sorted(_atomic.remove_stale(target)) == sorted([dead, reused, killed_starting])
        assert held.is_dir() and starting.is_dir() and unrelated.is_dir() and elsewhere.is_dir()
    finally:
        holder.communicate(b"")
    assert _atomic.remove_stale(target) == [held]


def test_a_sharded_save_removes_a_killed_single_file_saves_temporaries(tmp_path):
    """A sharded save replaces a folder's ``model.safetensors``: the temporary folder a
    killed save of that file left (a whole model's size) goes with it, as those of
    killed shard saves do (before: it stayed)."""
    host = _atomic._host()
    folder = tmp_path / "ck"
    folder.mkdir()
    dead = folder / f".model.safetensors.{host}.{_dead_pid()}.00000000.tmp"
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"partial")
    pl.params.save(folder, workers.values(1), max_shard_bytes=1)
    assert [n for n in os.listdir(folder) if n.startswith(".")] == []
    assert workers.which(pl.params.load(folder)) == 1


# Makes the folder argv[1], holds its lock, says so, and waits for its stdin to close.
_HOLD = """
import fcntl, os, sys
os.mkdir(sys.argv[1])
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("renames", [1, 2])
def test_a_sharded_save_killed_between_its_renames_leaves_one_complete_checkpoint(
    tmp_path, ctx, renames
):
    """A sharded save renames several files into place; killed after the first or the
    second rename, the folder still loads as the earlier checkpoint, whole (the index,
    renamed last, is the commit; the new shards took names the old index does not use).
    The next save completes and leaves only its own files."""
    folder = tmp_path / "ckpt"
    for k in (3, 4):  # the second save of as many shards takes the other names
        pl.params.save(folder, workers.values(k), max_shard_bytes=1)
        assert workers.which(pl.params.load(folder)) == k
    child = ctx.Process(
        target=workers.save_sharded_killed_after_renames, args=(str(folder), 5, renames)
    )
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    assert workers.which(pl.params.load(folder)) == 4
    pl.params.save(folder, workers.values(6), max_shard_bytes=1)
    assert workers.which(pl.params.load(folder)) == 6
    named = set(
        json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values()
    )
    assert sorted(os.listdir(folder)) == sorted([*named, "model.safetensors.index.json"])


def test_a_save_in_the_other_layout_replaces_the_folder_s_checkpoint(tmp_path):
    """Sharded over single-file and single-file over sharded, in one folder: what is
    left is the new checkpoint alone (otherwise readers, ours and transformers', would
    pick one layout or the other), and temporaries of killed saves of another number of
    shards go too."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    pl.params.save(folder / "model.safetensors", workers.values(1))
    pl.params.save(folder, workers.values(2), max_shard_bytes=1)
    assert "model.safetensors" not in os.listdir(folder)
    assert workers.which(pl.params.load(folder)) == 2
    host = _atomic._host()
    stale = folder / f".model-00002-of-00009.safetensors.{host}.{_dead_pid()}.0123abcd.tmp"
    stale.mkdir()
    pl.params.save(folder, workers.values(3), max_shard_bytes=1)
    assert not stale.exists()
    pl.params.save(folder / "model.safetensors", workers.values(4))
    assert os.listdir(folder) == ["model.safetensors"]
    assert workers.which(pl.params.load(folder)) == 4


def test_two_processes_saving_one_path_leave_one_of_their_checkpoints(tmp_path, ctx):
    """Two savers racing 30 saves each to one file: the result is one complete
    checkpoint of one of them (each saver's values are its own: even and odd)."""
    target = tmp_path / "model.safetensors"
    go = ctx.Event()
    children = [
        ctx.Process(target=workers.save_times, args=(str(target), first, 2, 30, go))
        for first in (0, 1)
    ]
    for c in children:
        c.start()
    go.set()
    for c in children:
        c.join(120)
        assert c.exitcode == 0
    k = workers.which(pl.params.load(target))
    assert k in (58, 59)
    assert _temporaries(target) == []


def test_two_processes_saving_one_sharded_folder_leave_one_of_their_checkpoints(tmp_path, ctx):
    """A sharded saver preempted right after its first shard lands, and a second saver
    of the same folder meanwhile: the second waits for the first (a lock on the folder)
    instead of picking the same free shard names and overwriting some of its shards,
    so the folder holds one complete checkpoint, the later one's."""
    folder = tmp_path / "ck"
    pl.params.save(folder, workers.values(1), max_shard_bytes=1)
    paused, go_on = ctx.Event(), ctx.Event()
    first = ctx.Process(
        target=workers.save_sharded_paused_after_first_rename,
        args=(str(folder), 2, paused, go_on),
    )
    first.start()
    assert paused.wait(60)
    second = ctx.Process(target=workers.save_sharded, args=(str(folder), 3))
    second.start()
    second.join(2)
    assert second.is_alive()  # waiting for the first saver's lock
    go_on.set()
    for c in (first, second):
        c.join(120)
        assert c.exitcode == 0
    assert workers.which(pl.params.load(folder)) == 3
    assert [n for n in os.listdir(folder) if n.startswith(".")] == []  # no temporaries


@pytest.mark.parametrize("sharded", [False, True])
def test_a_save_landing_while_a_reader_loads_reads_the_old_checkpoint(
    tmp_path, monkeypatch, sharded
):
    """A reader that read the header (or index) before a new save landed reads the
    checkpoint it opened, whole: each file is opened once, and a save renames new files
    in, so the opened ones stay as they were (before: a ``CheckpointError`` saying to
    load again); the next load reads the new one."""
    path = tmp_path / ("ck" if sharded else "ck.safetensors")
    size = {"max_shard_bytes": 1} if sharded else {}
    pl.params.save(path, workers.values(1), **size)
    scan = pl._safetensors_io.scan

    def scan_then_save(p):
        found = scan(p)
        pl.params.save(path, workers.values(2), **size)  # lands between header and data
        return found

    monkeypatch.setattr(pl._safetensors_io, "scan", scan_then_save)
    assert workers.which(pl.params.load(path)) == 1
    monkeypatch.undo()
    assert workers.which(pl.params.load(path)) == 2


def test_a_save_landing_between_the_index_and_its_shards_is_read_again(tmp_path, monkeypatch):
    """A reader that read a sharded checkpoint's index just before a new save landed
    reads the new checkpoint (the index changed meanwhile: the read starts again; before:
    a ``CheckpointError`` saying to load again), never a mix; a shard missing from an
    unchanged index still says that it is missing."""
    path = tmp_path / "ck"
    pl.params.save(path, workers.values(1), max_shard_bytes=1)
    read_index = pl._safetensors_io.read_index

    def read_then_save(p):
        found = read_index(p)
        monkeypatch.undo()  # the save reads the index too
        pl.params.save(path, workers.values(2), max_shard_bytes=1)
        return found

    monkeypatch.setattr(pl._safetensors_io, "read_index", read_then_save)
    assert workers.which(pl.params.load(path)) == 2
    monkeypatch.undo()
    assert workers.which(pl.params.load(path)) == 2
    shard = next(p for p in path.iterdir() if p.name.endswith(".safetensors"))
    shard.unlink()
    with pytest.raises(pl.params.CheckpointError, match=r"shard .* is missing; the index maps"):
        pl.params.load(path)


# -- file modes -----------------------------------------------------------------------


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_files_get_the_mode_of_a_plain_file_under_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        plain = tmp_path / "plain"
        with open(plain, "wb"):
            pass
        single = pl.params.save(tmp_path / "m.safetensors", workers.values(1))
        index = pl.params.save(tmp_path / "sharded", workers.values(1), max_shard_bytes=600 * 1024)
    finally:
        os.umask(old)
    want = stat.S_IMODE(plain.stat().st_mode)
    assert want == 0o666 & ~mask
    written = [single, *index.parent.iterdir()]
    assert len(written) == 4  # the file, two shards, the index
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in written} == {
        p.name: want for p in written
    }


# -- no aliasing ----------------------------------------------------------------------


def test_loaded_params_share_nothing_with_the_source(tmp_path, torch):
    """Changing the torch tensor, the numpy array or the file after loading leaves the
    loaded params as they were."""
    template = {"w": jax.ShapeDtypeStruct((1024,), jnp.float32)}
    t = torch.zeros(1024)
    a = np.zeros(1024, np.float32)
    from_torch = pl.params.load_state_dict(template, {"w": t})
    from_numpy = pl.params.load_state_dict(template, {"w": a})
    t.add_(5)
    a += 5
    path = pl.params.save(tmp_path / "m.safetensors", {"w": np.zeros(1024, np.float32)})
    loaded, filled = pl.params.load(path), pl.params.load_into(path, template)
    (tensor,) = pl._safetensors_io.scan(path)[0].values()
    with open(path, "r+b") as f:  # overwrite the tensor's bytes in place
        f.seek(tensor.offset)
        f.write(np.full(1024, 5, np.float32).tobytes())
    assert np.all(np.asarray(pl.params.load(path)["w"]) == 5)  # the file did change
    for got in (from_torch["w"], from_numpy["w"], loaded["w"], filled["w"]):
        assert np.all(np.asarray(got) == 0)


def test_abstract_templates_load_params_and_state(tmp_path):
    """``pl.params.abstract`` is the documented template: nothing is initialized."""
    model = L.Sequential(L.Conv2d(4, 3), L.BatchNorm2d(), L.ReLU())
    params = model.init(jax.random.key(1), (2, 3, 8, 8))
    state = model.init_state((2, 3, 8, 8))
    path = pl.params.save(tmp_path / "m.safetensors", params, state)
    template = pl.params.abstract(model, (2, 3, 8, 8), state=True)
    assert all(isinstance(a, jax.ShapeDtypeStruct) for a in jax.tree.leaves(template))
    got_params, got_state = pl.params.load_into(path, *template)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), got_params, params))
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), got_state, state))


def test_a_file_replaced_between_its_header_and_its_data_reads_the_old_file(tmp_path):
    """A save that replaces the file after a load read its header (a trainer saving
    while an evaluator loads): the load reads the file it opened, whole (before: an
    error naming the file), never other tensors' bytes."""
    path = pl.params.save(tmp_path / "m.safetensors", workers.values(1))
    tensors, _ = pl._safetensors_io.scan(path)
    pl.params.save(path, {"other": {"weight": np.ones((3, 3), np.float32)}})
    assert workers.which({k: t.read() for k, t in tensors.items()}) == 1
    assert list(pl.params.load(path)) == ["other.weight"]
