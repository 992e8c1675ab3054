"""Compile time of a deep transformer: ``Repeat`` (one ``lax.scan``-ed block body) against
the plain Python-loop stack (``Sequential`` of the same blocks).

    python -m benchmarks.repeat                 # depths 2 and 24, d256 h8 seq128 batch16
    python -m benchmarks.repeat --depths 2 8 --smoke
    python -m benchmarks.repeat --depths 4 --seq-len 1024 --batch-size 4 --repeats 1
                                                # rematerialization's effect on memory

For each depth and stack it times, in this process, tracing + lowering and XLA
compilation of one training step's forward and backward pass (``jax.value_and_grad`` of
a mean-square loss, jitted), then one run of the compiled step, and checks that the two
stacks give the same loss. Compile times are the median of ``--repeats`` fresh
compilations (a new function object each time, so nothing is cached in between). Peak
memory is XLA's buffer assignment for the compiled step (temporaries, MiB). Stacks: the
scan (``Repeat``, with and without ``remat``) and the Python-loop ``Sequential`` (with
and without each block wrapped in ``Remat``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import purelayers as pl
from purelayers import layers as L


def step_fn(model: L.Layer):
    def loss(params, x):
        return jnp.mean(model.apply(params, x) ** 2)

    return jax.value_and_grad(loss)


def measure(model: L.Layer, params, x, repeats: int) -> dict:
    lower_s, compile_s = [], []
    compiled = None
    for _ in range(repeats):
        fn = jax.jit(step_fn(model))  # a fresh function: no cache hit
        t0 = time.perf_counter()
        lowered = fn.lower(params, x)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        lower_s.append(t1 - t0)
        compile_s.append(t2 - t1)
    t0 = time.perf_counter()
    value, grads = compiled(params, x)
    jax.block_until_ready(grads)
    run_s = time.perf_counter() - t0
    return {
        "trace_lower_s": statistics.median(lower_s),
        "compile_s": statistics.median(compile_s),
        "total_s": statistics.median(a + b for a, b in zip(lower_s, compile_s, strict=True)),
        "first_run_s": run_s,
        "peak_mib": compiled.memory_analysis().temp_size_in_bytes / 2**20,
        "loss": float(value),
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--depths", type=int, nargs="+", default=[2, 24])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat")
    p.add_argument("--json", type=str, default=None, help="also write results here")
    args = p.parse_args(argv)
    if args.smoke:
        args.width, args.heads, args.seq_len, args.batch_size, args.repeats = 16, 2, 8, 2, 1

    block = L.TransformerBlock(args.heads)
    shape = (args.batch_size, args.seq_len, args.width)
    x = jax.random.normal(jax.random.key(1), shape)
    results: dict = {"shape": shape, "rows": []}
    for depth in args.depths:
        stacks = {
            "Repeat": L.Repeat(block, depth),
            "Repeat(remat)": L.Repeat(block, depth, remat=True),
            "Sequential": L.Sequential(*[block] * depth),
            "Sequential(Remat)": L.Sequential(*[L.Remat(block)] * depth),
        }
        stacked = stacks["Repeat"].init(jax.random.key(0), shape)
        # The same weights as per-block trees, the storage the Python-loop stacks read.
        unrolled = pl.params.unflatten(pl.params.flatten(stacked))
        for name, model in stacks.items():
            params = stacked if name.startswith("Repeat") else unrolled
            row = {"stack": name, "depth": depth, **measure(model, params, x, args.repeats)}
            results["rows"].append(row)
            print(
                f"{name:>17} depth {depth:>3}: trace+lower {row['trace_lower_s']:6.2f} s, "
                f"compile {row['compile_s']:6.2f} s, total {row['total_s']:6.2f} s, "
                f"first run {row['first_run_s']:6.3f} s, peak {row['peak_mib']:8.1f} MiB, "
                f"loss {row['loss']:.6f}",
                flush=True,
            )
        losses = [r["loss"] for r in results["rows"] if r["depth"] == depth]
        np.testing.assert_allclose(losses, losses[0], rtol=1e-5)

    lo, hi = min(args.depths), max(args.depths)
    for name in ("Repeat", "Repeat(remat)", "Sequential", "Sequential(Remat)"):
        total = {r["depth"]: r["total_s"] for r in results["rows"] if r["stack"] == name}
        ratio = total[hi] / total[lo]
        results.setdefault("ratios", {})[name] = ratio
        print(f"{name:>17}: depth {hi} / depth {lo} compile-time ratio {ratio:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
