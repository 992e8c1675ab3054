"""The benchmark transformer's training step with purelayers' parts swapped, one at a time,
for raw JAX's: which part makes a gap between the two.

    python -m benchmarks.variants                    # the full workload, 7 rounds
    python -m benchmarks.variants --quick            # tiny shapes, one round (smoke test)
    python -m benchmarks.variants --parts attention norm --repeats 15
    python -m benchmarks.variants --parts norm --cores   # and the attention's core alone

The parts are the layers the workload's block is made of, each with the same params
subtree in both forms: ``norm`` (``LayerNorm`` against ``impl_jax.layer_norm``'s two
passes), ``attention`` (``MultiHeadAttention`` against einsum and masked softmax),
``linear`` (the MLP's and the head's ``Linear``) and ``gelu``. Variants: every part
purelayers', every part raw JAX's, and each part swapped in both (``purelayers - norm``
is purelayers with raw JAX's norms; ``jax + norm`` is raw JAX with purelayers'). Each
runs through the benchmark's own jitted Adam step (``harness.JaxRunner``), all from the
same weights (their first losses must agree), timed in rotating rounds as
``benchmarks.run`` does; reported: the median step and its ratio to all-raw-JAX.

``--cores`` adds purelayers with only the attention's core replaced (``MultiHeadAttention``'s
projections and split kept): ``jax.nn.dot_product_attention`` (the form off the CPU), the
CPU's explicit form (``F.dot_product_attention_reference``), the same in two query halves, and
raw JAX's einsums and masked softmax. Each core is used on every platform, so on a GPU
this shows what the CPU's forms would cost there, and on the CPU what the GPU's would.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from benchmarks import impl_jax, workloads
from benchmarks.harness import JaxModel, JaxRunner, median_spread
from purelayers import layers as L
from purelayers import params as P
from purelayers.functional.attention import _attend_cpu, dot_product_attention_reference

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


def _cores() -> dict[str, Callable[[jax.Array, jax.Array, jax.Array], jax.Array]]:
    """Causal attention cores of ``[B, T, N, H]`` heads, by name."""

    def explicit(halves):
        if halves:
            return lambda q, k, v: _attend_cpu(
                q, k, v, None, None, True, 1 / math.sqrt(q.shape[-1])
            )
        return lambda q, k, v: dot_product_attention_reference(q, k, v, is_causal=True)

    return {
        "dot_product_attention": lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=True
        ),
        "explicit": explicit(False),
        "explicit halves": explicit(True),
        "raw jax": impl_jax.causal_attention,
    }


def core_forward_fn(heads: int, core: str) -> Callable[[Any, jax.Array], jax.Array]:
    """The workload's GPT, all purelayers' but the attention's core (one of ``_cores``)."""
    mha = L.MultiHeadAttention(heads, causal=True)
    attend = _cores()[core]

    def attention(p, x):
        b, t, e = x.shape
        q, k, v = (a.reshape(b, t, heads, e // heads) for a in mha._qkv(p, x, None, None))
        return mha._project_out(p, attend(q, k, v).reshape(b, t, e))

    return impl_jax.transformer_forward(**{**_parts(heads, ()), "attention": attention})


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
    p.add_argument("--cores", action="store_true", help="also swap the attention's core alone")
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
    forwards = {
        name: forward_fn(w.dims["heads"], raw) for name, raw in variants(args.parts).items()
    }
    if args.cores:
        for core in _cores():
            forwards[f"purelayers, core {core}"] = core_forward_fn(w.dims["heads"], core)
    for name, forward in forwards.items():
        runners[name] = JaxRunner(JaxModel(params, forward, x, y))
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
            f"{name:>38}: {ms:9.3f} ms (IQR {100 * stats['iqr_rel']:4.1f}%), "
            f"{stats['median'] / base:5.2f}x raw JAX, compile "
            f"{runners[name].timings['compile_s']:5.2f} s",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
