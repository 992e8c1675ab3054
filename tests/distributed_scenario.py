"""Two-process sharded training for tests/test_distributed.py, one process of it:

    python tests/distributed_scenario.py RANK NPROC PORT FOLDER OUT.json

Each process has 2 host devices; with NPROC=2 they join over ``jax.distributed`` on
localhost (CPU collectives over gloo) into a 4-device mesh, data-parallel across the
processes and FSDP within each. The process loads FOLDER/big.safetensors onto
four FSDP shards (measuring the memory that adds), then FOLDER/init (a sharded
checkpoint) straight onto the mesh, trains ten steps, saves FOLDER/trained, and writes its losses
and the big load's memory to OUT.json. Nothing runs on import.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

VOCAB, DIM, LAYERS, HEADS, SEQ, BATCH, STEPS = 512, 256, 2, 4, 16, 8, 10
SHAPE = (BATCH, SEQ)
BIG = (8192, 4096)  # float32: 128 MiB


sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1] / "examples")]


def model():
    from sharded_gpt import local_model

    return local_model(VOCAB, DIM, LAYERS, HEADS, SEQ)


def batches():
    import numpy as np

    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (STEPS, BATCH, SEQ + 1)).astype(np.int32)
    return [(b[:, :-1], b[:, 1:]) for b in ids]


def optimizer():
    import optax

    return optax.sgd(0.1, momentum=0.9)


def train(params, mesh, rules, batch_axes):
    """Ten steps from ``params`` (already on ``mesh``); returns the params and losses."""
    import jax
    from sharded_gpt import make_train_step

    import purelayers.sharding as S

    net, opt = model(), optimizer()
    param_sh = S.named_shardings(params, rules, mesh)
    opt_sh = S.optimizer_shardings(jax.eval_shape(opt.init, params), param_sh)
    opt_state = jax.jit(opt.init, out_shardings=opt_sh)(params)
    batch_sh = S.NamedSharding(mesh, S.P(batch_axes))
    step = make_train_step(net, opt, param_sh, opt_sh, batch_sh)
    losses = []
    for x, y in batches():
        x, y = (
            jax.make_array_from_callback(a.shape, batch_sh, lambda i, a=a: a[i]) for a in (x, y)
        )
        params, opt_state, loss = step(params, opt_state, x, y)
        losses.append(float(loss))
    return params, losses


def main(rank: int, nproc: int, port: int, folder: Path, out: Path) -> None:
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    ).strip()
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if nproc > 1:
        jax.distributed.initialize(f"localhost:{port}", nproc, rank)
    import jax.numpy as jnp

    import purelayers as pl
    import purelayers.sharding as S

    # A 128 MiB checkpoint split four ways: this process's devices read only their
    # quarters (half of it per process) from the memory-mapped file.
    jax.block_until_ready(jnp.ones(1))
    big = {"big": {"weight": jax.ShapeDtypeStruct(BIG, jnp.float32)}}
    big_sh = S.named_shardings(big, S.fsdp("fsdp"), S.make_mesh("fsdp=4"))
    from checkpoint_workers import PeakMemory

    with PeakMemory() as peak:
        loaded = S.load_sharded(folder / "big.safetensors", big, big_sh)
        jax.block_until_ready(loaded)
    added = peak.added
    share = sum(s.data.nbytes for a in jax.tree.leaves(loaded) for s in a.addressable_shards)
    del loaded

    mesh = S.make_mesh(f"data={nproc},fsdp=2")
    rules = S.fsdp("fsdp", min_size=1024)
    template = pl.params.abstract(model(), SHAPE)
    params = S.load_sharded(folder / "init", template, S.named_shardings(template, rules, mesh))
    params, losses = train(params, mesh, rules, ("data",))
    S.save(folder / "trained", params, max_shard_bytes=1 << 20)
    result = {
        "losses": losses,
        "load_added": added,
        "share": share,
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
    }
    out.write_text(json.dumps(result))
    if nproc > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    r, n, p = (int(a) for a in sys.argv[1:4])
    main(r, n, p, Path(sys.argv[4]), Path(sys.argv[5]))
