"""The benchmark transformer's training step with purelayers' parts swapped, one at a time,
for raw JAX's: which part makes a gap between the two.

    python -m benchmarks.variants                    # the full workload, 7 rounds
    python -m benchmarks.variants --quick            # tiny shapes, one round (smoke test)
    python -m benchmarks.variants --parts attention norm --repeats 15

The parts are the layers the workload's block is made of, each with the same params
subtree in both forms: ``norm`` (``LayerNorm`` against ``impl_jax.layer_norm``'s two
passes), ``attention`` (``MultiHeadAttention`` against einsum and masked softmax),
``linear`` (the MLP's and the head's ``Linear``) and ``gelu``. Variants: every part
purelayers', every part raw JAX's, and each part swapped in both (``purelayers - norm``
is purelayers with raw JAX's norms; ``jax + norm`` is raw JAX with purelayers'). Each
runs through the benchmark's own jitted Adam step (``harness.JaxRunner``), all from the
same weights (their first losses must agree), timed in rotating rounds as
``benchmarks.run`` does; reported: the median step and its ratio to all-raw-JAX.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from benchmarks import impl_jax, workloads
from benchmarks.harness import JaxModel, JaxRunner, median_spread
from purelayers import layers as L
from purelayers import params as P

PARTS = ("norm", "attention", "linear", "gelu")


def _parts(heads: int, raw: Iterable[str]) -> dict[str, Callable[..., Any]]:
    """Each part's function of ``(params, x)`` (``gelu``: of ``x``), raw JAX's for the
    names in ``raw``, purelayers' for the rest."""
    raw = set(raw)
    mha = L.MultiHeadAttention(heads, causal=True)
    return {
        "norm": impl_jax.layer_norm if "norm" in raw else L.LayerNorm().apply,
        "attention": functools.partial(impl_jax.attention, heads=heads)
        if "attention" in raw
        else mha.apply,
        "linear": impl_jax.linear
        if "linear" in raw
        else (lambda p, x: L.Linear(p["weight"].shape[0]).apply(p, x)),
        "gelu": functools.partial(jax.nn.gelu, approximate=True)
        if "gelu" in raw
        else functools.partial(L.GELU(approximate="tanh").apply, {}),
    }


def forward_fn(heads: int, raw: Iterable[str]) -> Callable[[Any, jax.Array], jax.Array]:
    """The workload's GPT (``impl_jax.transformer_forward``) with the parts in ``raw``
    written as raw JAX writes them."""
    return impl_jax.transformer_forward(**_parts(heads, raw))


def variants(parts: Iterable[str]) -> dict[str, frozenset[str]]:
    """Variant name -> the parts written as raw JAX's."""
    parts = tuple(parts)
    out = {"purelayers": frozenset(), "jax": frozenset(PARTS)}
    for part in parts:
        out[f"purelayers - {part}"] = frozenset({part})
        out[f"jax + {part}"] = frozenset(PARTS) - {part}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.variants", description=__doc__)
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--repeats", type=int, default=None, help="rounds (default 7; --quick 1)")
    p.add_argument("--target-ms", type=float, default=200.0, help="duration of one sample")
    p.add_argument("--quick", action="store_true", help="tiny shapes, one round")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 7)
    if repeats < 1:
        p.error(f"--repeats must be >= 1, got {repeats}")

    w = workloads.get("transformer", quick=args.quick)
    x, y = w.data()
    params = P.unflatten(dict(w.flat_params()))
    runners: dict[str, JaxRunner] = {}
    losses: dict[str, float] = {}
    for name, raw in variants(args.parts).items():
        runners[name] = JaxRunner(JaxModel(params, forward_fn(w.dims["heads"], raw), x, y))
        losses[name] = runners[name].initial_loss()
    np.testing.assert_allclose(list(losses.values()), losses["jax"], rtol=1e-5)

    steps = {}
    for name, r in runners.items():
        r.run(1 if args.quick else 2)  # warm-up
        steps[name] = 1 if args.quick else max(1, round(args.target_ms / 1e3 / r.run(1)))
    samples: dict[str, list[float]] = {name: [] for name in runners}
    names = list(runners)
    for k in range(repeats):
        for name in names[k % len(names) :] + names[: k % len(names)]:
            samples[name].append(runners[name].run(steps[name]))
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "devices": [str(d) for d in jax.devices()],
        "repeats": repeats,
        "variants": {},
    }
    print(f"{results['date']}, {results['devices']}, {repeats} rounds", flush=True)
    base = median_spread(samples["jax"])["median"]
    for name in names:
        stats = median_spread(samples[name])
        ms = 1e3 * stats["median"]
        results["variants"][name] = {
            "step_ms": ms,
            "iqr_rel": stats["iqr_rel"],
            "vs_jax": stats["median"] / base,
            "compile_s": runners[name].timings["compile_s"],
            "loss": losses[name],
        }
        print(
            f"{name:>22}: {ms:9.3f} ms (IQR {100 * stats['iqr_rel']:4.1f}%), "
            f"{stats['median'] / base:5.2f}x raw JAX, compile "
            f"{runners[name].timings['compile_s']:5.2f} s",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
