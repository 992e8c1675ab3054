"""Recurrent-layer measurements: compile time against sequence length, and the step time
of a purelayers LSTM against ``torch.nn.LSTM`` (CPU, eager).

    python -m benchmarks.recurrent            # the full measurement (about a minute)
    python -m benchmarks.recurrent --quick    # tiny sizes, one repeat: a smoke test
    python -m benchmarks.recurrent --unroll 1 2 4 8   # also sweep the scan's unroll
    python -m benchmarks.recurrent --plain-autodiff   # also JAX's own scan derivative
    python -m benchmarks.recurrent --single-thread    # CPU time, one thread each

Every step is forward and backward of ``mean(output ** 2)`` with respect to all
parameters (no optimizer update), timed with ``block_until_ready`` as the median of
interleaved repeats, so both implementations see the same machine load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.layers import LSTM

_DEFAULT = LSTM(1)  # the layer's own unroll and custom_derivative


def _loss_and_grad(layer: LSTM) -> Callable:
    def loss(params, x):
        out, _ = layer.apply(params, x)
        return jnp.mean(out**2)

    return jax.jit(jax.value_and_grad(loss))


def compile_seconds(seq: int, batch: int, inputs: int, hidden: int) -> tuple[float, int]:
    """Trace, lower and compile a fresh jitted training step; also its jaxpr size."""
    layer = LSTM(hidden)
    shape = (seq, batch, inputs)
    params = layer.init(jax.random.key(0), shape)
    x = jax.ShapeDtypeStruct(shape, jnp.float32)
    step = _loss_and_grad(layer)
    start = time.perf_counter()
    step.lower(params, x).compile()
    seconds = time.perf_counter() - start
    return seconds, _count_eqns(jax.make_jaxpr(step)(params, x).jaxpr)


def _count_eqns(jaxpr) -> int:
    """Equations in ``jaxpr`` and every sub-jaxpr (scan bodies, jit calls)."""
    total = 0
    for eqn in jaxpr.eqns:
        total += 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    total += _count_eqns(getattr(inner, "jaxpr", inner))
    return total


def _naive_step(params: dict, x: jax.Array, hidden: int) -> Callable:
    """The textbook scan: input projection inside the loop (for comparison only)."""

    def loss(p, x):
        def body(carry, x_t):
            h, c = carry
            g = x_t @ p["weight_ih_l0"].T + p["bias_ih_l0"][None] + h @ p["weight_hh_l0"].T
            g = g + p["bias_hh_l0"][None]
            i, f, gg, o = jnp.split(g, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(gg)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h

        zeros = jnp.zeros((x.shape[1], hidden), x.dtype)
        _, out = jax.lax.scan(body, (zeros, zeros), x)
        return jnp.mean(out**2)

    return jax.jit(jax.value_and_grad(loss))


def step_times(
    seq: int,
    batch: int,
    inputs: int,
    hidden: int,
    repeats: int,
    unrolls: list[int],
    custom_derivatives: tuple[bool, ...] = (True,),
    cpu_time: bool = False,
) -> dict[str, float]:
    """Median milliseconds per forward+backward step for each implementation: the
    purelayers LSTM for every ``unroll`` in ``unrolls`` and ``custom_derivative`` in
    ``custom_derivatives``, a textbook scan, and ``torch.nn.LSTM`` when installed."""
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((seq, batch, inputs)).astype(np.float32)
    params = LSTM(hidden).init(jax.random.key(0), x_np.shape)  # the same for every variant
    x = jnp.asarray(x_np)
    runs: dict[str, Callable[[], None]] = {}
    for unroll in unrolls:
        for custom in custom_derivatives:
            layer = LSTM(hidden, unroll=unroll, custom_derivative=custom)
            fn = _loss_and_grad(layer)
            jax.block_until_ready(fn(params, x))  # compile now
            name = f"purelayers (unroll {unroll}{'' if custom else ', plain autodiff'})"
            runs[name] = lambda fn=fn: jax.block_until_ready(fn(params, x))
    naive = _naive_step(params, x, hidden)
    jax.block_until_ready(naive(params, x))
    runs["raw JAX scan, projection inside"] = lambda: jax.block_until_ready(naive(params, x))
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        if cpu_time:
            torch.set_num_threads(1)
        module = torch.nn.LSTM(inputs, hidden)
        xt = torch.tensor(x_np)

        def torch_step():
            module.zero_grad(set_to_none=True)
            out, _ = module(xt)
            (out**2).mean().backward()

        torch_step()
        runs["torch.nn.LSTM (eager)"] = torch_step
    samples: dict[str, list[float]] = {name: [] for name in runs}
    clock = time.process_time if cpu_time else time.perf_counter
    for _ in range(repeats):
        for name, run in runs.items():
            start = clock()
            run()
            samples[name].append((clock() - start) * 1e3)
    return {name: statistics.median(v) for name, v in samples.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repeat")
    parser.add_argument("--repeats", type=int, default=30, help="timed steps per implementation")
    parser.add_argument(
        "--unroll",
        type=int,
        nargs="+",
        default=None,
        help="scan unroll values to time (default: the layer's own)",
    )
    parser.add_argument(
        "--plain-autodiff",
        action="store_true",
        help="also time JAX's own derivative of the scan (weight gradient inside the loop)",
    )
    parser.add_argument(
        "--single-thread",
        action="store_true",
        help="one thread for XLA and torch, timed in process CPU time: a measure of the work "
        "done that holds up on a machine shared with other jobs",
    )
    args = parser.parse_args(argv)
    if args.single_thread:
        # read when the CPU backend starts, i.e. at the first computation below
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        )
    if args.quick:
        batch, inputs, hidden, seq, repeats, lengths = 2, 3, 4, 5, 1, (4, 16)
    else:
        batch, inputs, hidden, seq, repeats, lengths = 32, 64, 256, 100, args.repeats, (16, 1024)
    unrolls = args.unroll or [_DEFAULT.unroll]

    compiled = {n: compile_seconds(n, batch, inputs, hidden) for n in lengths}
    print(f"compile time of a jitted LSTM step (batch {batch}, input {inputs}, hidden {hidden})")
    print("| sequence length | compile s | jaxpr equations |")
    print("| ---: | ---: | ---: |")
    for n, (sec, eqns) in compiled.items():
        print(f"| {n} | {sec:.3f} | {eqns} |")
    ratio = compiled[lengths[1]][0] / compiled[lengths[0]][0]
    print(f"ratio {lengths[1]} / {lengths[0]}: {ratio:.2f}\n")

    customs = (True, False) if args.plain_autodiff else (_DEFAULT.custom_derivative,)
    times = step_times(
        seq, batch, inputs, hidden, repeats, unrolls, customs, cpu_time=args.single_thread
    )
    what = "CPU ms, one thread" if args.single_thread else "ms"
    print(
        f"forward+backward step, batch {batch}, input {inputs}, hidden {hidden}, seq {seq} "
        f"(median of {repeats}, {what})"
    )
    fastest = min(times.values())
    torch_ms = times.get("torch.nn.LSTM (eager)")
    print("| implementation | ms | vs fastest | vs torch |")
    print("| --- | ---: | ---: | ---: |")
    for name, ms in times.items():
        vs_torch = f"{ms / torch_ms:.2f}" if torch_ms else "-"
        print(f"| {name} | {ms:.2f} | {ms / fastest:.2f} | {vs_torch} |")
    return {"compile": compiled, "compile_ratio": ratio, "step_ms": times}


if __name__ == "__main__":
    main(sys.argv[1:])
