"""A training run for tests/test_training_state.py: checkpoints every few steps with
orbax's ``CheckpointManager`` and resumes from the latest one. Run as
``python -m tests.train_state_worker FOLDER STEPS``; prints ``step loss.hex()`` lines.
Nothing runs on import."""

from __future__ import annotations

import os
import sys


def batch(position: int):
    import numpy as np

    rng = np.random.default_rng(position)
    x = rng.normal(size=(8, 4)).astype(np.float32)
    return x, (x.sum(1, keepdims=True) > 0).astype(np.float32)


def main(folder: str, steps: int, every: int = 3) -> None:
    import jax
    import jax.numpy as jnp
    import optax
    import orbax.checkpoint as ocp

    import purelayers as pl
    from purelayers import layers as L

    model = L.Sequential(
        L.Linear(16), L.ReLU(), L.Dropout(0.1), L.Repeat(L.Linear(16), 2), L.Linear(1)
    )
    params = model.init(jax.random.key(0), (8, 4))
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2))
    state = {
        "params": params,
        "opt": tx.init(params),
        "step": 0,
        "key": jax.random.key(1),
        "position": 0,
    }
    options = ocp.CheckpointManagerOptions(
        max_to_keep=2,
        save_interval_steps=every,
        enable_async_checkpointing=True,
        cleanup_tmp_directories=True,
    )
    manager = ocp.CheckpointManager(
        os.path.abspath(folder), options=options, item_handlers=ocp.StandardCheckpointHandler()
    )
    latest = manager.latest_step()
    if latest is not None:
        target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        pl.params.check_like(target, manager.item_metadata(latest))
        state = manager.restore(latest, args=ocp.args.StandardRestore(target))

    @jax.jit
    def train_step(params, opt, key, x, y):
        def loss_fn(p):
            return jnp.mean((model.apply(p, x, key=key, train=True) - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    while state["step"] < steps:
        key, sub = jax.random.split(state["key"])
        params, opt, loss = train_step(
            state["params"], state["opt"], sub, *batch(state["position"])
        )
        step = state["step"] + 1
        state = {"params": params, "opt": opt, "step": step, "key": key, "position": step}
        print(step, float(loss).hex(), flush=True)
        manager.save(step, args=ocp.args.StandardSave(state))
    manager.wait_until_finished()
    manager.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
