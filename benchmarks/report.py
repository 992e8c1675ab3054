"""Markdown tables and checks over a benchmark run's results."""

from __future__ import annotations

import importlib.metadata
from typing import Any

PACKAGES = {
    "purelayers": "purelayers",
    "jax": "jax",
    "flax-linen": "flax",
    "flax-nnx": "flax",
    "equinox": "equinox",
    "haiku": "dm-haiku",
    "torch": "torch",
    "torch-compile": "torch",
}
OURS = ("purelayers", "purelayers-bf16")
# relative difference of initial losses above which two models are not the same model
LOSS_RTOL = 1e-4


def versions(impls: list[str]) -> dict[str, str]:
    out = {}
    for pkg in {"jax", "jaxlib", "optax", *(PACKAGES.get(i, "jax") for i in impls)}:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "?"
    return dict(sorted(out.items()))


def loss_mismatches(results: dict[str, dict[str, Any]]) -> list[str]:
    """``workload/impl`` whose initial loss differs from purelayers' (or the first one's)."""
    bad = []
    for name, row in results.items():
        losses = {i: r["initial_loss"] for i, r in row.items() if "initial_loss" in r}
        if not losses:
            continue
        ref = losses.get("purelayers", next(iter(losses.values())))
        for impl, loss in losses.items():
            if abs(loss - ref) > LOSS_RTOL * max(abs(ref), 1.0) * (50 if "bf16" in impl else 1):
                bad.append(f"{name}/{impl}: {loss:.6f} vs {ref:.6f}")
    return bad


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _cell(results: dict, name: str, impl: str, key: str) -> float | None:
    r = results[name].get(impl, {})
    return r.get(key)


def _cpu_use(results: dict, name: str, impl: str) -> str:
    busy = _cell(results, name, impl, "cores_busy")
    if busy is None:
        return "-"
    share = _cell(results, name, impl, "kernel_share")
    faults = _cell(results, name, impl, "faults_per_step")
    return f"{busy:.2f} / {100 * share:.0f}% / {faults:,.0f}"


def _step_rows(data: dict, impls: list[str]) -> list[list[str]]:
    rows = []
    for name, row in data["results"].items():
        cells = [name]
        for impl in impls:
            r = row.get(impl, {})
            if "step_ms" in r:
                cells.append(f"{r['step_ms']:.2f} ±{100 * r['step_iqr_rel']:.0f}%")
            else:
                cells.append("error" if "error" in r else "-")
        rows.append(cells)
    return rows


def _ratio_rows(data: dict, impls: list[str]) -> list[list[str]]:
    rows = []
    for name, row in data["results"].items():
        base = row.get("jax", {}).get("step_ms")
        cells = [name]
        for impl in impls:
            v = row.get(impl, {}).get("step_ms")
            cells.append(f"{v / base:.2f}" if v and base else "-")
        peers = {
            i: r["step_ms"]
            for i, r in row.items()
            if i not in OURS and "bf16" not in i and "step_ms" in r
        }
        ours = row.get("purelayers", {}).get("step_ms")
        if peers and ours:
            best = min(peers, key=peers.get)
            cells.append(f"{ours / peers[best]:.2f} ({best})")
        else:
            cells.append("-")
        rows.append(cells)
    return rows


def markdown(data: dict) -> str:
    meta, results = data["meta"], data["results"]
    impls = [i for i in data["impls"] if "bf16" not in i]
    bf16 = [i for i in data["impls"] if "bf16" in i]
    out = [
        f"## Benchmark ({'quick smoke run' if meta['quick'] else 'full run'})",
        "",
        f"`{meta['command']}` on {meta['date']}, {meta['cpus']} CPUs ({meta['machine']}), "
        f"load average {meta['load_start']} at start, {meta['load_end']} at end, "
        f"{meta['wall_s']} s. Versions: "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
        + "."
        + (f" CPU: {meta['cpu']}." if meta.get("cpu") else "")
        + (
            " Environment: " + ", ".join(f"`{k}={v}`" for k, v in meta["environment"].items()) + "."
            if meta.get("environment")
            else ""
        )
        + (
            " XLA compiler options of every JAX step: "
            + ", ".join(f"`{k}={v}`" for k, v in meta["xla_options"].items())
            + "."
            if meta.get("xla_options")
            else ""
        )
        + (
            f" Every JAX step's batch split over {meta['host_devices']} CPU devices"
            " (`--host-devices`, params replicated); PyTorch unchanged."
            if meta.get("host_devices", 1) > 1
            else ""
        ),
        "",
        "### Training step, median ms (± IQR / median)",
        "",
        _table(["workload", *impls], _step_rows(data, impls)),
        "",
        "### Step time relative to raw JAX (lower is faster); purelayers / fastest peer",
        "",
        _table(["workload", *impls, "purelayers / fastest peer"], _ratio_rows(data, impls)),
        "",
        "### First call in a fresh process (trace + compile + first step; median of the fresh processes), s",
        "",
        _table(
            ["workload", *impls],
            [
                [n, *(_fmt(_cell(results, n, i, "fresh_first_call_s"), 2) for i in impls)]
                for n in results
            ],
        ),
        "",
        "### Eager (un-jitted) forward, ms",
        "",
        _table(
            ["workload", *impls],
            [[n, *(_fmt(_cell(results, n, i, "eager_ms"), 1) for i in impls)] for n in results],
        ),
        "",
        "### Peak memory of the training step, MiB",
        "",
        "JAX: XLA buffer assignment of the compiled step (arguments + temporaries). "
        "PyTorch: params + batch + growth of the RSS high-water mark over 3 steps in a "
        "fresh process (includes allocator slack).",
        "",
        _table(
            ["workload", *impls],
            [
                [
                    n,
                    *(
                        _fmt(
                            _cell(results, n, i, "peak_mb")
                            or _cell(results, n, i, "fresh_peak_mb"),
                            1,
                        )
                        for i in impls
                    ),
                ]
                for n in results
            ],
        ),
        "",
        "### CPU use during the timed steps: cores busy / kernel share / page faults per step",
        "",
        "CPU seconds of the whole process per wall second (worker threads spinning while "
        "they wait count too), the part of them spent in the kernel, and minor page faults "
        "(first touches of freshly mapped memory) per step.",
        "",
        _table(
            ["workload", *impls], [[n, *(_cpu_use(results, n, i) for i in impls)] for n in results]
        ),
        "",
        "### Same model everywhere: parameter count / initial loss",
        "",
        _table(
            ["workload", *data["impls"]],
            [
                [
                    n,
                    *(
                        f"{results[n][i]['params']:,} / {results[n][i]['initial_loss']:.5f}"
                        if "params" in results[n].get(i, {})
                        else results[n].get(i, {}).get("error", "-")[:60]
                        for i in data["impls"]
                    ),
                ]
                for n in results
            ],
        ),
        "",
        "(The LSTM in Flax, Equinox and Haiku has one bias vector where PyTorch and "
        "purelayers have two, `bias_ih + bias_hh`; hence fewer parameters, same function.)",
    ]
    if bf16:
        rows = []
        for n, row in results.items():
            for base in ("purelayers", "jax"):
                f32, b16 = row.get(base, {}), row.get(f"{base}-bf16", {})
                if "step_ms" in f32 and "step_ms" in b16:
                    rows.append(
                        [
                            n,
                            base,
                            f"{f32['step_ms']:.2f}",
                            f"{b16['step_ms']:.2f}",
                            f"{b16['step_ms'] / f32['step_ms']:.2f}",
                            _fmt(f32.get("peak_mb")),
                            _fmt(b16.get("peak_mb")),
                            f"{b16['initial_loss'] - f32['initial_loss']:+.5f}",
                        ]
                    )
        out += [
            "",
            "### Mixed precision (float32 params, bfloat16 compute)",
            "",
            _table(
                [
                    "workload",
                    "impl",
                    "f32 ms",
                    "bf16 ms",
                    "bf16 / f32",
                    "f32 MiB",
                    "bf16 MiB",
                    "loss diff",
                ],
                rows,
            ),
        ]
    if data.get("mismatched_losses"):
        out += ["", "**Initial losses differ:** " + "; ".join(data["mismatched_losses"])]
    errors = [
        f"{n}/{i}: {r['error']}"
        for n, row in results.items()
        for i, r in row.items()
        if "error" in r
    ]
    if errors:
        out += ["", "**Errors:** " + "; ".join(errors)]
    return "\n".join(out)
