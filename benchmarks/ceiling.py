"""The matrix-product ceiling: GFLOP/s of one square float32 product, jitted JAX against
PyTorch, on each library's default device (the GPU where there is one).

    python -m benchmarks.ceiling                    # sizes 2048 and 512, 7 timed products
    python -m benchmarks.ceiling --sizes 8192 --repeats 20

A training step's GFLOP divided by its time, over this rate, is the share of the ceiling
the step reaches (README, Performance). Each figure is ``2 N^3`` floating-point
operations over the median of ``--repeats`` timed products after one warm-up, each
waited for (``block_until_ready``; ``torch.cuda.synchronize`` on a GPU). On a GPU the
float32 product runs at two precisions in each library: JAX's default (which may use
TF32 tensor cores) and ``precision=HIGHEST``; PyTorch's default (full float32 products,
``torch.backends.cuda.matmul.allow_tf32 = False``) and with TF32 allowed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


def _median_seconds(run: Callable[[], object], wait: Callable[[object], None], n: int) -> float:
    wait(run())
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        wait(run())
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def jax_rates(n: int, repeats: int) -> dict[str, float]:
    """GFLOP/s of ``a @ b`` for ``[n, n]`` float32 operands, per JAX precision."""
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.random((n, n), dtype=np.float32))
    b = jnp.asarray(rng.random((n, n), dtype=np.float32))
    precisions = {"jax": None}
    if jax.default_backend() != "cpu":  # the CPU ignores the precision of float32 products
        precisions["jax-highest"] = jax.lax.Precision.HIGHEST
    out = {}
    for name, precision in precisions.items():
        f = jax.jit(lambda a, b, p=precision: jnp.matmul(a, b, precision=p))
        seconds = _median_seconds(lambda f=f: f(a, b), jax.block_until_ready, repeats)
        out[name] = 2 * n**3 / seconds / 1e9
    return out


def torch_rates(n: int, repeats: int) -> dict[str, float]:
    """GFLOP/s of ``torch.matmul`` for ``[n, n]`` float32 operands (with and without TF32
    on a GPU)."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rng = np.random.default_rng(0)
    a = torch.from_numpy(rng.random((n, n), dtype=np.float32)).to(device)
    b = torch.from_numpy(rng.random((n, n), dtype=np.float32)).to(device)

    def wait(_):
        if device.type == "cuda":
            torch.cuda.synchronize()

    settings = {"torch": False} | ({"torch-tf32": True} if device.type == "cuda" else {})
    out = {}
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        for name, tf32 in settings.items():
            torch.backends.cuda.matmul.allow_tf32 = tf32
            out[name] = 2 * n**3 / _median_seconds(lambda: a @ b, wait, repeats) / 1e9
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return out


def main(argv: list[str] | None = None) -> dict[int, dict[str, float]]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ceiling", description=__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[2048, 512])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    has_torch = importlib.util.find_spec("torch") is not None
    results = {}
    for n in args.sizes:
        results[n] = jax_rates(n, args.repeats)
        if has_torch:
            results[n] |= torch_rates(n, args.repeats)
        rates = ", ".join(f"{k} {v:,.0f}" for k, v in results[n].items())
        print(f"{n}^3 float32 product, GFLOP/s: {rates}")
    print(json.dumps({"devices": [str(d) for d in jax.devices()], "gflops": results}))
    return results


if __name__ == "__main__":
    main()
