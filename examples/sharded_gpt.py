"""Train a character-level GPT on a (data, model) device mesh with purelayers.sharding.

    python examples/sharded_gpt.py --mesh data=2,model=4 --steps 50

On a machine without accelerators this runs on host (CPU) devices: the script sets
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` for the mesh's ``N`` devices
unless XLA_FLAGS already sets it (host devices share the machine's cores, so this
shows the mechanics, not a speed-up). The batch is split over ``data``; inside each
block the attention heads and the MLP are split over ``model`` (Megatron style: ``fc``
column-parallel, ``proj`` row-parallel); embeddings, norms and the head are replicated.
Parameters are born sharded (``init_sharded``), the whole Adam step is one
``jax.jit`` with in/out shardings, and XLA inserts every collective. It prints each
step's wall time, the validation loss against the unigram baseline, and with
``--out DIR`` saves a checkpoint (torch-loadable) and loads it back onto the mesh.

The model is ``examples/char_gpt.py``'s where that file imports (else a copy of it
here, with the same checkpoint names); the text is the docstrings of Python's standard
library (no download).

Several hosts. Run the same command on every host with the coordinator's address::

    python examples/sharded_gpt.py --mesh data=4,model=8 \\
        --coordinator 10.0.0.1:1234 --num-processes 4 --process-id $RANK

which calls ``jax.distributed.initialize(coordinator_address, num_processes,
process_id)`` before anything else touches JAX (on Cloud TPU and SLURM clusters the
arguments can be omitted: ``jax.distributed.initialize()`` finds them). The mesh then
spans every host's devices; put ``model`` within a host (fast links) and ``data``
across hosts. Each process builds the full batch here for simplicity; at scale feed
each process its own rows with ``jax.make_array_from_process_local_data``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import purelayers.sharding as S
from purelayers import layers as L
from purelayers.init import normal


@dataclasses.dataclass(frozen=True)
class GPT(L.Layer):
    """``head(norm(blocks(embed(ids) + pos_emb[:T])))`` with ``blocks`` a ``Repeat`` of
    ``TransformerBlock``s: the names of ``examples/char_gpt.py``'s model (used instead
    when that file is importable), defined here so this example stands alone.

    Parameters: ``pos_emb`` ``(max_len, dim)`` N(0, 0.02); ``embed.weight``;
    ``blocks.N.*``; ``norm.*``; ``head.*``.
    """

    embed: L.Embedding
    blocks: L.Repeat
    norm: L.LayerNorm
    head: L.Linear
    max_len: int

    def own_names(self) -> tuple[str, ...]:
        return ("pos_emb",)

    @property
    def takes_ids(self) -> bool:
        return True

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict:
        dim = self.embed.embedding_dim
        feats = (*shape, dim)
        return {
            "pos_emb": normal(std=0.02)(jax.random.fold_in(key, 0), (self.max_len, dim), dtype),
            "embed": self.embed.init(jax.random.fold_in(key, 1), shape, dtype),
            "blocks": self.blocks.init(jax.random.fold_in(key, 2), feats, dtype),
            "norm": self.norm.init(jax.random.fold_in(key, 3), feats, dtype),
            "head": self.head.init(jax.random.fold_in(key, 4), feats, dtype),
        }

    def apply(self, params: dict, x: Any, *, key: jax.Array | None = None, train: bool = False):
        h = self.call("embed", params, x) + params["pos_emb"][None, : x.shape[1]]
        h = self.call("blocks", params, h)
        return self.call("head", params, self.call("norm", params, h))


def local_model(vocab: int, dim: int, layers: int, heads: int, max_len: int) -> GPT:
    block = L.TransformerBlock(heads, causal=True)
    return GPT(
        L.Embedding(vocab, dim), L.Repeat(block, layers), L.LayerNorm(), L.Linear(vocab), max_len
    )


def build_model(vocab: int, dim: int, layers: int, heads: int, max_len: int) -> L.Layer:
    """``examples/char_gpt.py``'s model where that file imports, else ``local_model``."""
    try:
        import char_gpt

        config = argparse.Namespace(
            heads=heads, dropout=0.0, rope=False, width=dim, depth=layers, max_len=max_len
        )
        return char_gpt.build_model(vocab, config)
    except (ImportError, AttributeError, TypeError):
        return local_model(vocab, dim, layers, heads, max_len)


def gpt_rules(model_axis: str = "model") -> list[S.Rule]:
    """Megatron inside every block, everything else replicated."""
    return [*S.transformer_block("blocks.*", axis=model_axis), ("*", S.P())]


def make_train_step(model: L.Layer, optimizer: Any, param_sh, opt_sh, batch_sh):
    """One jitted Adam step with explicit in/out shardings (params and state donated)."""
    import optax

    def loss_fn(params, x, y):
        logits = model.apply(params, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    replicated = S.NamedSharding(batch_sh.mesh, S.P())
    return jax.jit(
        step,
        in_shardings=(param_sh, opt_sh, batch_sh, batch_sh),
        out_shardings=(param_sh, opt_sh, replicated),
        donate_argnums=(0, 1),
    )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--mesh", default="data=2,model=4", help="mesh axes (default data=2,model=4)")
    p.add_argument("--steps", type=int, default=50, help="training steps (default 50)")
    p.add_argument("--batch-size", type=int, default=32, help="global batch (default 32)")
    p.add_argument("--seq", type=int, default=64, help="context length (default 64)")
    p.add_argument("--dim", type=int, default=128, help="embedding width (default 128)")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks (default 2)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chars", type=int, default=300_000, help="corpus size in characters")
    p.add_argument("--print-every", type=int, default=10)
    p.add_argument("--out", type=Path, default=None, help="save and reload a checkpoint here")
    p.add_argument("--coordinator", default=None, help="multi-host: coordinator host:port")
    p.add_argument("--num-processes", type=int, default=None, help="multi-host: process count")
    p.add_argument("--process-id", type=int, default=None, help="multi-host: this process")
    return p.parse_args(argv)


def _mesh_size(spec: str) -> int:
    sizes = [part.partition("=")[2] for part in spec.split(",") if part.strip()]
    return math.prod(int(s) for s in sizes if s.strip().isdigit()) or 1


def main(argv=None) -> dict:
    args = parse_args(argv)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        # Read when JAX first creates its backends, which happens below, not at import.
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_force_host_platform_device_count={_mesh_size(args.mesh)}".strip()
        )
    if args.coordinator is not None:
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    import common
    import optax

    mesh = S.make_mesh(args.mesh)
    data_axis = "data" if "data" in mesh.shape else None
    text = common.stdlib_text(args.chars)
    vocab = common.CharVocab(text)
    ids = vocab.encode(text)
    split = int(0.9 * len(ids))
    train_ids, valid_ids = ids[:split], ids[split:]
    model = build_model(len(vocab), args.dim, args.layers, args.heads, args.seq)
    shape = (args.batch_size, args.seq)

    rules = gpt_rules() if "model" in mesh.shape else S.data_parallel()
    params = S.init_sharded(model, jax.random.key(args.seed), shape, mesh, rules)
    param_sh = jax.tree.map(lambda a: a.sharding, params)
    optimizer = optax.adam(args.lr)
    opt_sh = S.optimizer_shardings(jax.eval_shape(optimizer.init, params), param_sh)
    opt_state = jax.jit(optimizer.init, out_shardings=opt_sh)(params)
    batch_sh = S.batch_sharding(mesh, data_axis) if data_axis else S.NamedSharding(mesh, S.P())
    step = make_train_step(model, optimizer, param_sh, opt_sh, batch_sh)

    rng = np.random.default_rng(args.seed)

    def batch(source: np.ndarray):
        starts = rng.integers(0, len(source) - args.seq - 1, args.batch_size)
        x = np.stack([source[s : s + args.seq] for s in starts])
        y = np.stack([source[s + 1 : s + args.seq + 1] for s in starts])
        return jax.device_put(x, batch_sh), jax.device_put(y, batch_sh)

    print(
        f"mesh {dict(mesh.shape)} on {len(mesh.devices.flat)} {jax.default_backend()} devices; "
        f"{type(model).__name__}, {sum(math.prod(a.shape) for a in jax.tree.leaves(params)):,} parameters"
    )
    times = []
    for i in range(1, args.steps + 1):
        x, y = batch(train_ids)
        start = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, x, y)
        loss = float(loss)
        times.append(time.perf_counter() - start)
        if i == 1 or i % args.print_every == 0 or i == args.steps:
            print(f"step {i:4d}  loss {loss:.4f}  {times[-1] * 1e3:8.1f} ms")
    steady = times[1:] or times
    median_ms = float(np.median(steady) * 1e3)
    eval_loss = jax.jit(
        lambda p, x, y: optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()
    )
    valid = float(np.mean([float(eval_loss(params, *batch(valid_ids))) for _ in range(4)]))
    baseline = common.unigram_loss(train_ids, valid_ids, len(vocab))
    print(f"step time: median {median_ms:.1f} ms over {len(steady)} steps (first step compiles)")
    print(f"valid loss {valid:.4f} nats/char (unigram baseline {baseline:.4f})")
    result = {"mesh": dict(mesh.shape), "step_ms": median_ms, "valid_loss": valid}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = S.save(args.out / "model.safetensors", params, model=model)  # torch order
        abstract = jax.eval_shape(lambda k: model.init(k, shape), jax.random.key(0))
        restored = S.load_sharded(path, abstract, param_sh)
        same = all(
            bool(jnp.array_equal(a, b)) and a.sharding == b.sharding
            for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(restored), strict=True)
        )
        print(f"saved {path}; reloaded onto the mesh: {'identical' if same else 'DIFFERENT'}")
        result["reloaded_identical"] = same
    return result


if __name__ == "__main__":
    main()
