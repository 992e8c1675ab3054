"""Child processes for tests/test_checkpoint_scale.py: savers to kill, rival savers, and
memory measurements. Nothing runs on import."""

from __future__ import annotations

import json
import sys
import time

import numpy as np

TENSORS = {"0.weight": (64, 1024), "0.bias": (64,), "1.weight": (256, 512), "2.running_mean": (7,)}


def values(k: int) -> dict[str, dict[str, np.ndarray]]:
    """Checkpoint number ``k`` (a params tree): every element of every tensor is ``k``."""
    tree: dict[str, dict[str, np.ndarray]] = {}
    for name, shape in TENSORS.items():
        child, leaf = name.split(".")
        tree.setdefault(child, {})[leaf] = np.full(shape, k, np.float32)
    return tree


def which(flat) -> int:
    """The number of the complete checkpoint ``flat`` is; raises if it is a mix."""
    ks = {name: np.unique(np.asarray(a)).tolist() for name, a in flat.items()}
    if sorted(flat) != sorted(TENSORS) or any(len(v) != 1 for v in ks.values()):
        raise AssertionError(f"not one complete checkpoint: {ks}")
    (k,) = set(v[0] for v in ks.values())
    return int(k)


def save_forever(path: str, first: int, step: int, started) -> None:
    """Save checkpoints ``first``, ``first + step``, ... to ``path`` until killed."""
    from purelayers import params

    started.set()
    k = first
    while True:
        params.save(path, values(k), metadata={"k": str(k)})
        k += step


def save_times(path: str, first: int, step: int, times: int, go) -> None:
    from purelayers import params

    go.wait()
    for i in range(times):
        params.save(path, values(first + i * step))


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


class PeakMemory:
    """The peak resident memory a block of code adds, in bytes (Linux).

    ``resource.getrusage``'s ``ru_maxrss`` cannot be reset, and a child process starts
    with its parent's peak (the pages ``fork`` counted before ``exec``), so the block's
    peak is read from ``/proc/self/status`` (``VmHWM``) after resetting it to the
    current resident size (``/proc/self/clear_refs``).
    """

    def __enter__(self) -> PeakMemory:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self.base = _status("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        self.added = _status("VmHWM") - self.base


def measure(path: str, how: str) -> None:
    """Print the peak resident memory a load adds (bytes) and its time, as JSON."""
    import jax
    import jax.numpy as jnp

    from purelayers import params

    jax.block_until_ready(jnp.ones(1))  # the backend is up before the baseline
    from purelayers import _safetensors_io as io

    tensors, _ = io.scan(path)
    dtype = {"load": jnp.float32, "load_into": jnp.float32, "load_into_bf16": jnp.bfloat16}[how]
    template = {k: jax.ShapeDtypeStruct(t.shape, dtype) for k, t in tensors.items()}
    with PeakMemory() as peak:
        start = time.perf_counter()
        if how == "load":
            out = params.load(path)
        else:
            out = params.load_into(path, params.unflatten(template))
        jax.block_until_ready(out)
        seconds = time.perf_counter() - start
    size = sum(a.nbytes for a in jax.tree.leaves(out))
    print(json.dumps({"added": peak.added, "result_bytes": size, "seconds": seconds}))


if __name__ == "__main__":
    measure(sys.argv[1], sys.argv[2])


def save_sharded_killed_after_renames(path: str, k: int, renames: int) -> None:
    """Save checkpoint ``k`` into the folder ``path`` in shards, and SIGKILL this process
    right after its ``renames``-th rename: a save killed part-way through its renames."""
    import os
    import signal

    from purelayers import params

    replace, done = os.replace, []

    def replace_then_die(src, dst):
        replace(src, dst)
        done.append(dst)
        if len(done) == renames:
            os.kill(os.getpid(), signal.SIGKILL)

    os.replace = replace_then_die
    params.save(path, values(k), max_shard_bytes=1)


def save_sharded_paused_after_first_rename(path: str, k: int, paused, go_on) -> None:
    """Save checkpoint ``k`` into the folder ``path`` in shards, stopping right after its
    first shard lands until ``go_on`` is set (a saver the OS preempts mid-save)."""
    import os

    from purelayers import params

    replace = os.replace

    def replace_then_wait(src, dst):
        replace(src, dst)
        if not paused.is_set():
            paused.set()
            go_on.wait(60)

    os.replace = replace_then_wait
    params.save(path, values(k), max_shard_bytes=1)


def save_sharded(path: str, k: int) -> None:
    from purelayers import params

    params.save(path, values(k), max_shard_bytes=1)
