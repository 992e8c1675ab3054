"""The benchmark's smoke mode: tiny shapes, one repeat, so the harness never rots.

No timing is asserted; only that every workload runs, that the implementations build
the same model (same parameter count and initial loss) and that the report is written.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from benchmarks import harness, report, run


def test_eager_and_bf16_columns(tmp_path):
    data = run.main(
        [
            "--quick",
            "--workloads",
            "mlp",
            "--precision",
            "bf16",
            "--first-call",
            "off",
            "--json",
            str(tmp_path / "bf16.json"),
        ]
    )
    row = data["results"]["mlp"]
    assert set(row) == {"purelayers", "jax", "purelayers-bf16", "jax-bf16"}
    assert row["purelayers"]["eager_ms"] > 0
    assert "Mixed precision" in report.markdown(data)
    assert data["mismatched_losses"] == []


# the peers the bench extra does not bring: torch (the flax, equinox and haiku columns
# share the same runner interface, checked by every full benchmark run)
PEERS = [i for i in ("torch",) if run.available(i)]


def test_quick_run_of_every_workload_writes_json_and_table(tmp_path, capsys):
    """One run of every workload for purelayers, raw JAX and torch: all build the same
    model, and the report is written."""
    out, md = tmp_path / "quick.json", tmp_path / "quick.md"
    # third-party layers broadcast implicitly; purelayers' own rank checks are tested elsewhere
    with jax.numpy_rank_promotion("allow"):
        data = run.main(
            ["--quick", "--impls", "purelayers", "jax", *PEERS, "--no-eager", "--first-call",
             "off", "--json", str(out), "--markdown", str(md)]
        )  # fmt: skip
    assert json.loads(out.read_text())["results"].keys() == set(run.workloads.WORKLOADS)
    assert data["mismatched_losses"] == []
    for name, row in data["results"].items():
        assert row["purelayers"]["params"] == row["jax"]["params"], name
        for impl in ("purelayers", "jax", *PEERS):
            assert "error" not in row[impl], (name, impl, row[impl])
            assert row[impl]["step_ms"] > 0
        for impl in ("purelayers", "jax"):
            assert row[impl]["peak_mb"] > 0
        for impl in ("purelayers", "jax", *PEERS):
            assert row[impl]["cores_busy"] > 0, (name, impl)
            assert 0 <= row[impl]["kernel_share"] <= 1, (name, impl)
            assert row[impl]["faults_per_step"] >= 0, (name, impl)
    text = capsys.readouterr().out
    assert "purelayers / fastest peer" in text and text.strip() == md.read_text().strip()
    assert "### CPU use during the timed steps" in text


def test_cpu_use_counts_cpu_time_and_first_touches():
    """A step that spins keeps a core busy, one that sleeps does not, and one that
    writes a freshly mapped 64 MiB array faults its pages in (4 KiB pages: 16,384 faults;
    fewer, but at least one, with transparent huge pages)."""
    import time

    def spin(n):
        for _ in range(n):
            end = time.perf_counter() + 0.05
            while time.perf_counter() < end:
                pass
        return 0.05

    def sleep(n):
        time.sleep(0.05 * n)
        return 0.05

    def touch(n):
        for _ in range(n):
            np.ones(64 * 2**20 // 8)  # float64: 64 MiB, mapped afresh by the allocator
        return 0.0

    busy, idle, fresh = harness.CpuUse(), harness.CpuUse(), harness.CpuUse()
    assert busy.figures() == {}
    assert busy.timed(spin, 4) == 0.05 and idle.timed(sleep, 4) == 0.05
    fresh.timed(touch, 2)
    assert busy.steps == 4 and busy.wall_s >= 0.2
    assert busy.figures()["cores_busy"] > 0.3  # one spinning thread, less on a loaded host
    assert idle.figures()["cores_busy"] < 0.2
    assert fresh.figures()["faults_per_step"] >= 1
    assert fresh.figures()["kernel_share"] > 0


def test_xla_options_reach_every_compiled_step_and_the_report(tmp_path):
    """``xla_dump_to`` makes XLA write the modules it compiles: files appear only if the
    option reached the compiler, in this process and in a fresh one (whose first-call
    figures are reported)."""
    here, fresh = tmp_path / "here", tmp_path / "fresh"
    data = run.main(
        [
            *("--quick", "--workloads", "mlp", "--impls", "purelayers", "--first-call", "off"),
            *("--no-eager", "--xla-option", f"xla_dump_to={here}"),
            *("--json", str(tmp_path / "opt.json")),
        ]
    )
    assert data["meta"]["xla_options"] == {"xla_dump_to": str(here)}
    assert f"`xla_dump_to={here}`" in report.markdown(data)
    assert any("step" in f.name for f in here.iterdir())
    fc = run.first_call_subprocess("purelayers", "mlp", True, {"xla_dump_to": str(fresh)})
    assert "error" not in fc, fc
    assert fc["first_call_s"] > 0 and fc["compile_s"] > 0 and fc["peak_mb"] > 0
    assert any("step" in f.name for f in fresh.iterdir())


@pytest.mark.skipif(not run.available("torch"), reason="torch is not installed")
def test_torch_compile_column_trains_the_same_model(tmp_path):
    """``torch-compile``: the torch module under ``torch.compile`` starts from the shared
    weights (same parameter count and initial loss as eager torch), compiles before the
    timed steps (its compile time recorded), and has no eager-forward figure. It joins
    the default implementations only where torch has a GPU."""
    data = run.main(
        [
            *("--quick", "--workloads", "mlp", "--impls", "torch", "torch-compile"),
            *("--first-call", "off", "--json", str(tmp_path / "tc.json")),
        ]
    )
    row = data["results"]["mlp"]
    assert data["mismatched_losses"] == []
    assert row["torch-compile"]["params"] == row["torch"]["params"]
    assert row["torch-compile"]["initial_loss"] == row["torch"]["initial_loss"]
    assert row["torch-compile"]["step_ms"] > 0 and row["torch-compile"]["compile_s"] > 0
    assert "compile_s" not in row["torch"]
    assert "eager_ms" in row["torch"] and "eager_ms" not in row["torch-compile"]
    assert "torch-compile" in report.markdown(data)
    assert ("torch-compile" in run.default_impls(False)) == run._torch_has_gpu()
    assert run.default_impls(True) == ["purelayers", "jax"]


def test_host_devices_split_every_jax_step_in_a_fresh_process(tmp_path):
    """``--host-devices 2``: the process gets two CPU devices and every JAX step's batch is
    split over them, the lstm's time-major input along its second axis; the models still
    start from the same loss as PyTorch's, and the report says how the steps ran."""
    out = tmp_path / "dp.json"
    cmd = [sys.executable, "-m", "benchmarks.run", "--quick", "--workloads", "lstm",
           "--impls", "purelayers", "jax", "--host-devices", "2", "--no-eager",
           "--json", str(out)]  # fmt: skip
    root = Path(run.__file__).resolve().parent.parent
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["meta"]["host_devices"] == 2 and len(data["meta"]["devices"]) == 2
    assert data["mismatched_losses"] == []
    row = data["results"]["lstm"]
    for impl in ("purelayers", "jax"):
        assert row[impl]["fresh_devices"] == 2, (impl, row[impl])
        assert row[impl]["step_ms"] > 0
    assert "batch split over 2 CPU devices" in done.stdout


def test_batch_axis_is_the_one_axis_of_the_batch_size():
    assert harness.batch_axis(np.zeros((100, 32, 64)), 32) == 1
    assert harness.batch_axis(np.zeros((32, 784)), 32) == 0
    with pytest.raises(ValueError, match="2 axes have the batch size 8"):
        harness.batch_axis(np.zeros((8, 8, 3)), 8)
    with pytest.raises(ValueError, match="0 axes"):
        harness.batch_axis(np.zeros((5, 3)), 8)


def test_host_devices_need_a_process_where_jax_has_not_run():
    jax.numpy.zeros(1).block_until_ready()
    with pytest.raises(ValueError, match="already running"):
        run.use_host_devices(2)
    run.use_host_devices(1)  # nothing to change


def test_rejects_bad_arguments():
    with pytest.raises(SystemExit):
        run.parse(["--xla-option", "no_value"])
    with pytest.raises(SystemExit):
        run.parse(["--repeats", "0"])
    with pytest.raises(SystemExit):
        run.parse(["--impls", "tensorflow"])
    with pytest.raises(SystemExit):
        run.parse(["--host-devices", "0"])
    assert importlib.util.find_spec("benchmarks.run") is not None


def test_repeat_benchmark_smoke(tmp_path):
    """Compile-time and memory rows for every stack at two depths; the stacks agree."""
    from benchmarks import repeat

    out = repeat.main(["--smoke", "--depths", "1", "2", "--json", str(tmp_path / "r.json")])
    stacks = {"Repeat", "Repeat(remat)", "Sequential", "Sequential(Remat)"}
    assert {(r["stack"], r["depth"]) for r in out["rows"]} == {
        (s, d) for s in stacks for d in (1, 2)
    }
    assert all(r["peak_mib"] > 0 and r["compile_s"] > 0 for r in out["rows"])
    assert set(out["ratios"]) == stacks


def test_first_call_figures_are_the_median_of_the_fresh_processes():
    """Three processes' figures, field by field: the medians of (1, 3, 2) and (9, 7, 8) are
    2 and 8; a failed process's error is reported instead of a median."""
    runs = [
        {"first_call_s": 1.0, "compile_s": 9.0, "peak_mb": 5.0},
        {"first_call_s": 3.0, "compile_s": 7.0, "peak_mb": 5.0},
        {"first_call_s": 2.0, "compile_s": 8.0, "peak_mb": 5.0},
    ]
    got = run._median_first_call(runs)
    assert got == {"first_call_s": 2.0, "compile_s": 8.0, "peak_mb": 5.0, "processes": 3}
    assert run._median_first_call([*runs, {"error": "boom"}]) == {"error": "boom"}


def test_ceiling_smoke(torch):
    """One rate per library and size, positive; ``--repeats 0`` refused."""
    from benchmarks import ceiling

    out = ceiling.main(["--sizes", "64", "32", "--repeats", "1"])
    assert set(out) == {64, 32}
    for rates in out.values():
        assert {"jax", "torch"} <= set(rates)
        assert all(r > 0 for r in rates.values())
    with pytest.raises(SystemExit):
        ceiling.main(["--repeats", "0"])


def test_variants_smoke():
    """Every variant builds and trains from the same weights (``main`` checks the first
    losses agree), and its two ends are the benchmark's own models: the all-purelayers
    and all-raw-JAX variants start from the loss of ``benchmarks.run``'s purelayers and
    raw JAX implementations. ``--cores`` adds purelayers with only the attention's core
    swapped, for each core, starting from the all-raw-JAX variant's loss (checked inside
    ``main``)."""
    from benchmarks import variants, workloads

    out = variants.main(["--quick", "--parts", "norm", "--cores"])
    cores = {name for name in out["variants"] if name.startswith("purelayers, core ")}
    assert cores == {f"purelayers, core {c}" for c in variants._cores()}
    assert len(cores) == 4
    assert set(out["variants"]) - cores == {"purelayers", "jax", "purelayers - norm", "jax + norm"}
    assert all(v["step_ms"] > 0 for v in out["variants"].values())
    w = workloads.get("transformer", quick=True)
    x, y = w.data()
    for impl in ("purelayers", "jax"):
        reference = run.make_runner(impl, w, w.flat_params(), x, y).initial_loss()
        assert out["variants"][impl]["loss"] == pytest.approx(reference, rel=1e-6)
    assert variants.variants(["gelu"])["jax + gelu"] == {"norm", "attention", "linear"}
