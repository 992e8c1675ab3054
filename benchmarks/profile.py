"""Static profile of the compiled training steps: what XLA was asked to do, independent
of machine load. For each implementation: FLOPs and bytes accessed (``cost_analysis``),
the number of HLO instructions, fusions, dots, convolutions, transposes and copies in
the optimized module, and the XLA buffer sizes.

    python -m benchmarks.profile --workloads transformer --impls purelayers jax
    python -m benchmarks.profile --dump /tmp/hlo    # also write each optimized HLO module

Two implementations with the same FLOPs but more bytes accessed or more fusions are
moving more memory for the same math: diff the dumped HLO to see where.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

from benchmarks import run, workloads

OPS = ("fusion", "dot", "convolution", "transpose", "copy", "while", "reduce-window", "scatter")


def hlo_counts(text: str) -> dict[str, int]:
    """Instruction counts by opcode in an optimized HLO module (entry and nested)."""
    ops = Counter(re.findall(r"=\s*[\w\[\]{},:. ]*?\s([a-z][a-z\-]*)\(", text))
    counts = {op: ops.get(op, 0) for op in OPS}
    counts["instructions"] = sum(ops.values())
    return counts


def profile(name: str, impls: list[str], quick: bool, dump: Path | None) -> list[dict]:
    w = workloads.get(name, quick=quick)
    x, y = w.data()
    flat = w.flat_params()
    rows = []
    for impl in impls:
        r = run.make_runner(impl, w, flat, x, y)
        if not hasattr(r, "compiled"):
            continue
        r.compile()
        cost = r.compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        text = r.compiled.as_text()
        row = {
            "workload": name,
            "impl": impl,
            "gflop": cost.get("flops", 0.0) / 1e9,
            "gb_accessed": cost.get("bytes accessed", 0.0) / 1e9,
            **r.memory_mb(),
            **hlo_counts(text),
        }
        rows.append(row)
        if dump:
            dump.mkdir(parents=True, exist_ok=True)
            (dump / f"{name}-{impl}.hlo.txt").write_text(text)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    p.add_argument("--workloads", nargs="+", choices=workloads.WORKLOADS, default=None)
    p.add_argument("--impls", nargs="+", choices=list(run.IMPLS), default=["purelayers", "jax"])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--dump", type=Path, default=None, help="write optimized HLO here")
    args = p.parse_args(argv)
    rows = []
    for name in args.workloads or workloads.WORKLOADS:
        rows += profile(name, [i for i in args.impls if run.available(i)], args.quick, args.dump)
    cols = ["workload", "impl", "gflop", "gb_accessed", "peak_mb", *OPS, "instructions"]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        cells = [
            f"{r.get(c, 0):.3f}" if isinstance(r.get(c), float) else str(r.get(c, "-"))
            for c in cols
        ]
        print("| " + " | ".join(cells) + " |")
    sys.stdout.flush()
    return rows


if __name__ == "__main__":
    main()
