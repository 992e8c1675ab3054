"""Side-by-side training-step benchmark: purelayers against raw JAX, Flax (linen and NNX),
Equinox, Haiku and PyTorch (eager, and ``torch.compile`` as ``torch-compile``) on four
workloads (see ``benchmarks/workloads.py``).

    python -m benchmarks.run                        # everything installed, ~10 min
    python -m benchmarks.run --quick                # tiny shapes, 1 repeat: smoke test
    python -m benchmarks.run --workloads mlp cnn --impls purelayers jax torch --repeats 20
    python -m benchmarks.run --impls purelayers torch torch-compile   # torch.compile too
    python -m benchmarks.run --precision bf16 --workloads mlp transformer
    python -m benchmarks.run --host-devices 2       # JAX steps data-parallel over 2 CPU devices
    python -m benchmarks.run --workloads cnn --xla-option \
        xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_REDUCE

For each workload every implementation starts from the same weights (purelayers' params
copied by name) and must report the same initial loss. Measured:

- step: one jitted training step (forward, softmax cross-entropy, backward, optax Adam
  update, donated buffers; PyTorch: the eager equivalent, or its module under
  ``torch.compile``, the default where torch has a GPU and opt-in on the CPU), timed with
  ``block_until_ready``. Each sample runs enough consecutive steps to last about
  ``--target-ms``; implementations take turns within every round (rotating order), so
  load changes hit all of them alike. Reported: median over rounds and the IQR.
- CPU use over those timed steps (``harness.CpuUse``): CPU seconds per wall second
  (threads spinning while they wait count too), the share of it spent in the kernel and
  the minor page faults per step, which show where a step leaves cores idle or pays for
  first touches of freshly mapped memory.
- first call: trace + compile + first step, in fresh subprocesses per implementation
  (``--fresh``, default 3; the median; each with an empty Inductor cache, so
  ``torch-compile``'s is a cold compile).
- eager: one un-jitted forward pass (after a warm-up call), median.
- memory: JAX: XLA's buffer assignment for the compiled step (argument + temp bytes);
  PyTorch: resident params and batch plus the growth of the RSS high-water mark over
  three steps in the fresh subprocess.

Results go to ``benchmarks/results/<time>.json`` (or ``--json``) and a markdown report
to stdout (and ``--markdown``).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import report, workloads

# name -> (module, builder, package that must be importable)
IMPLS: dict[str, tuple[str, str, str | None]] = {
    "purelayers": ("benchmarks.impl_purelayers", "build", None),
    "jax": ("benchmarks.impl_jax", "build", None),
    "flax-linen": ("benchmarks.impl_flax", "build_linen", "flax"),
    "flax-nnx": ("benchmarks.impl_flax", "build_nnx", "flax"),
    "equinox": ("benchmarks.impl_equinox", "build", "equinox"),
    "haiku": ("benchmarks.impl_haiku", "build", "haiku"),
    "torch": ("benchmarks.impl_torch", "build", "torch"),
    "torch-compile": ("benchmarks.impl_torch", "build", "torch"),
    "purelayers-bf16": ("benchmarks.impl_purelayers", "build_bf16", None),
    "jax-bf16": ("benchmarks.impl_jax", "build_bf16", None),
}
BF16 = ("purelayers-bf16", "jax-bf16")
TORCH = ("torch", "torch-compile")
QUICK_IMPLS = ("purelayers", "jax")
RESULTS = Path(__file__).parent / "results"


def available(name: str) -> bool:
    package = IMPLS[name][2]
    return package is None or importlib.util.find_spec(package) is not None


def make_runner(
    impl: str,
    w: workloads.Workload,
    flat: dict,
    x,
    y,
    xla_options: dict[str, str] | None = None,
    devices: int = 1,
):
    """The implementation's runner; ``xla_options`` are compiler options for every JAX
    step (``jax.stages.Lowered.compile``), and ``devices`` the JAX devices its batch is
    split over (``--host-devices``); neither touches PyTorch."""
    from benchmarks.harness import JaxRunner, TorchRunner

    module, builder, _ = IMPLS[impl]
    model = getattr(importlib.import_module(module), builder)(w, flat, x, y)
    if impl in TORCH:
        return TorchRunner(model, compiled=impl == "torch-compile")
    return JaxRunner(model, xla_options, devices)


def use_host_devices(n: int) -> None:
    """Give JAX ``n`` CPU devices (``jax_num_cpu_devices``); before any JAX computation.
    Raises ``ValueError`` where the backend is not the CPU or is already running."""
    import jax

    if n == 1:
        return
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError as e:
        raise ValueError(f"--host-devices {n}: JAX is already running in this process") from e
    if jax.default_backend() != "cpu":
        raise ValueError(f"--host-devices is for the CPU backend, not {jax.default_backend()}")


def _torch_has_gpu() -> bool:
    if not available("torch"):
        return False
    import torch

    return torch.cuda.is_available()


def default_impls(quick: bool) -> list[str]:
    """Every installed implementation (``--quick``: purelayers and raw JAX). ``torch-compile``
    joins by default where torch has a GPU; on the CPU a cold Inductor compile takes
    15-30 s per workload and process (2-core AMD EPYC), so it is asked for by name
    (``--impls``)."""
    if quick:
        return list(QUICK_IMPLS)
    return [
        i
        for i in IMPLS
        if i not in BF16 and available(i) and (i != "torch-compile" or _torch_has_gpu())
    ]


_ENVIRONMENT = (
    "GLIBC_TUNABLES",
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_TRIM_THRESHOLD_",
    "XLA_FLAGS",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "JAX_DEFAULT_MATMUL_PRECISION",
    "OMP_NUM_THREADS",
)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _cpu_model() -> str | None:
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


# -- fresh-process measurement --------------------------------------------------------------


def child(
    impl: str,
    workload: str,
    quick: bool,
    xla_options: dict[str, str] | None = None,
    host_devices: int = 1,
) -> dict[str, Any]:
    """First call and memory of one implementation, measured in this process."""
    w = workloads.get(workload, quick=quick)
    x, y = w.data()
    runner = make_runner(impl, w, w.flat_params(), x, y, xla_options, host_devices)
    return runner.first_call()


def first_call_subprocess(
    impl: str,
    workload: str,
    quick: bool,
    xla_options: dict[str, str] | None = None,
    host_devices: int = 1,
) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.run", "--child", impl, workload]
    cmd += ["--quick"] if quick else []
    cmd += ["--host-devices", str(host_devices)]
    for k, v in (xla_options or {}).items():
        cmd += ["--xla-option", f"{k}={v}"]
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as cache:
        # Inductor (and Triton) keep compiled kernels on disk between processes: an empty
        # cache per process makes torch-compile's first call a cold compile, as JAX's is
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=cache)
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=600, cwd=root, env=env
            )
        except subprocess.TimeoutExpired:
            return {"error": "timed out after 600 s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def _median_first_call(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fresh processes' figures, each the median over the runs (the first error, if
    any run failed). One compile in a fresh process varies by 10-20% here."""
    errors = [r for r in runs if "error" in r]
    if errors:
        return errors[0]
    out = dict(runs[0])
    for k, v in out.items():
        if isinstance(v, float):
            out[k] = statistics.median(r[k] for r in runs)
    out["processes"] = len(runs)
    return out


# -- one workload -----------------------------------------------------------------------------


def bench_workload(name: str, impls: list[str], args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.harness import CpuUse, median_spread

    w = workloads.get(name, quick=args.quick)
    x, y = w.data()
    flat = w.flat_params()
    out: dict[str, Any] = {}
    runners = {}
    for impl in impls:
        try:
            runners[impl] = make_runner(impl, w, flat, x, y, args.xla_options, args.host_devices)
        except Exception as e:  # one library failing must not lose the others' figures
            out[impl] = {"error": f"{type(e).__name__}: {e}"}
            print(f"  {name}/{impl}: failed to build: {e}", file=sys.stderr)
    for impl, r in runners.items():
        r.compile()
        out[impl] = {
            "params": r.param_count(),
            "initial_loss": r.initial_loss(),
            **r.memory_mb(),
            **r.timings,  # this process's trace/compile seconds (torch eager: none)
        }
        print(
            f"  {name:12s} {impl:16s} params {out[impl]['params']:>10,d}  "
            f"initial loss {out[impl]['initial_loss']:.6f}",
            file=sys.stderr,
        )
    if not args.no_eager:
        for impl, r in runners.items():
            if not r.has_eager:
                continue
            if not args.quick:
                r.eager_forward()  # warm-up: op-by-op dispatch compiles each op once
            samples = [r.eager_forward() for _ in range(1 if args.quick else 3)]
            out[impl]["eager_ms"] = 1e3 * median_spread(samples)["median"]
    reps = {}
    for impl, r in runners.items():
        r.run(1 if args.quick else 2)
        per_step = r.run(1)
        reps[impl] = 1 if args.quick else max(1, round(args.target_ms / 1e3 / per_step))
    samples: dict[str, list[float]] = {impl: [] for impl in runners}
    use = {impl: CpuUse() for impl in runners}
    names = list(runners)
    for k in range(args.repeats):
        for impl in names[k % len(names) :] + names[: k % len(names)]:
            samples[impl].append(use[impl].timed(runners[impl].run, reps[impl]))
    for impl in runners:
        stats = median_spread(samples[impl])
        out[impl].update(
            step_ms=1e3 * stats["median"],
            step_min_ms=1e3 * stats["min"],
            step_max_ms=1e3 * stats["max"],
            step_iqr_rel=stats["iqr_rel"],
            samples=len(samples[impl]),
            steps_per_sample=reps[impl],
            **use[impl].figures(),
        )
    runners.clear()
    gc.collect()
    if args.first_call != "off":
        for impl in impls:
            if "error" in out[impl]:
                continue
            if args.first_call == "subprocess":
                fc = _median_first_call(
                    [
                        first_call_subprocess(
                            impl, name, args.quick, args.xla_options, args.host_devices
                        )
                        for _ in range(args.fresh)
                    ]
                )
            else:
                fc = child(impl, name, args.quick, args.xla_options, args.host_devices)
            out[impl].update({k if k == "error" else f"fresh_{k}": v for k, v in fc.items()})
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--workloads", nargs="+", choices=workloads.WORKLOADS, default=None)
    p.add_argument(
        "--impls",
        nargs="+",
        choices=list(IMPLS),
        default=None,
        help="default: every installed one, torch-compile only where torch has a GPU "
        "(--quick: purelayers jax)",
    )
    p.add_argument("--repeats", type=int, default=None, help="rounds (default 10; --quick 1)")
    p.add_argument(
        "--precision",
        choices=("f32", "bf16"),
        default="f32",
        help="bf16: also run purelayers and raw JAX under purelayers.precision.mixed_precision",
    )
    p.add_argument("--quick", action="store_true", help="tiny shapes, one repeat")
    p.add_argument(
        "--first-call",
        choices=("subprocess", "inprocess", "off"),
        default=None,
        help="where to measure trace + compile + first step (default: a fresh subprocess; "
        "--quick: in this process)",
    )
    p.add_argument("--no-eager", action="store_true", help="skip the eager forward timing")
    p.add_argument("--target-ms", type=float, default=200.0, help="duration of one sample")
    p.add_argument(
        "--fresh",
        type=int,
        default=3,
        help="fresh processes per first-call measurement, their median reported (default 3)",
    )
    p.add_argument("--json", type=Path, default=None, help="default benchmarks/results/<time>.json")
    p.add_argument("--markdown", type=Path, default=None, help="also write the report here")
    p.add_argument(
        "--xla-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an XLA compiler option for every JAX implementation's step (repeatable), "
        "e.g. xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT",
    )
    p.add_argument(
        "--host-devices",
        type=int,
        default=1,
        metavar="N",
        help="split every JAX step's batch over N CPU devices (jax_num_cpu_devices), "
        "params replicated; PyTorch unchanged (default 1)",
    )
    p.add_argument("--child", nargs=2, metavar=("IMPL", "WORKLOAD"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.xla_options = {}
    for item in args.xla_option:
        name, sep, value = item.partition("=")
        if not sep or not name:
            p.error(f"--xla-option takes NAME=VALUE, got {item!r}")
        args.xla_options[name] = value
    if args.repeats is None:
        args.repeats = 1 if args.quick else 10
    if args.first_call is None:
        args.first_call = "inprocess" if args.quick else "subprocess"
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.host_devices < 1:
        p.error(f"--host-devices must be >= 1, got {args.host_devices}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    use_host_devices(args.host_devices)
    if args.child:
        print(json.dumps(child(*args.child, args.quick, args.xla_options, args.host_devices)))
        return {}
    names = args.workloads or list(workloads.WORKLOADS)
    impls = args.impls or default_impls(args.quick)
    if args.precision == "bf16":
        impls += [i for i in BF16 if i not in impls]
    missing = [i for i in impls if not available(i)]
    if missing:
        print(f"not installed, skipped: {missing} (pip install -e '.[bench]')", file=sys.stderr)
        impls = [i for i in impls if i not in missing]
    import jax

    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m benchmarks.run "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "quick": args.quick,
        "repeats": args.repeats,
        "load_start": _load(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "versions": report.versions(impls),
        "devices": [str(d) for d in jax.devices()],
        "cpu": _cpu_model(),
        # process settings that change the figures (allocator, huge pages, XLA, threads)
        "environment": {k: os.environ[k] for k in _ENVIRONMENT if k in os.environ},
        "xla_options": args.xla_options,
        "host_devices": args.host_devices,
        "transparent_hugepage": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
    }
    t0 = time.perf_counter()
    path = args.json
    if path is None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        path = RESULTS / f"{time.strftime('%Y%m%d-%H%M%S')}{'-quick' if args.quick else ''}.json"
    results: dict[str, Any] = {}
    data = {"meta": meta, "impls": impls, "results": results}
    for name in names:
        print(f"{name} ...", file=sys.stderr)
        results[name] = bench_workload(name, impls, args)
        # written after every workload, so an interrupted run keeps what it measured
        meta.update(load_end=_load(), wall_s=round(time.perf_counter() - t0, 1))
        data["mismatched_losses"] = report.loss_mismatches(results)
        text = report.markdown(data)
        path.write_text(json.dumps(data, indent=1))
        if args.markdown:
            args.markdown.write_text(text + "\n")
    print(text)
    print(f"\nJSON: {path}", file=sys.stderr)
    return data


if __name__ == "__main__":
    main()
