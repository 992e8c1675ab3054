"""Smoke runs of the generative gallery scripts (DDPM with an MLP and with a UNet,
rectified flow): each writes its named, finite figures and its picture."""

import json
import math

import numpy as np
import pytest

from tests.example_loader import load_example


def _finite(tree) -> bool:
    if isinstance(tree, dict):
        return all(_finite(v) for v in tree.values())
    if isinstance(tree, str):
        return True
    return math.isfinite(tree)


def _check_run(out, metrics: dict, names: list[str]) -> None:
    written = json.loads((out / "metrics.json").read_text())
    for name in [*names, "steps", "seconds", "sampler"]:
        assert name in written, name
        assert _finite(written[name]), (name, written[name])
    timing = written["sampler"]
    assert timing["chosen"] in ("fused", "loop")
    assert timing[f"{timing['chosen']}_ms_per_step"] == min(
        timing["fused_ms_per_step"], timing["loop_ms_per_step"]
    )
    assert written["steps"] == 2
    assert metrics["sampler"] == timing
    assert (out / "samples.png").stat().st_size > 0


def test_diffusion_smoke(tmp_path):
    example = load_example("diffusion")
    flags = ["--width", "16", "--batch-size", "16", "--samples", "32", "--diffusion-steps", "4"]
    metrics = example.main([*flags, "--steps", "2", "--out", str(tmp_path)])
    _check_run(tmp_path, metrics, ["energy_distance_generated", "energy_distance_noise"])
    # energy distance, worked by hand: point masses at 0 and 3 in the plane give
    # 2 * 3 - 0 - 0; a set against itself gives 0
    a, b = np.zeros((4, 2)), np.tile([[3.0, 0.0]], (5, 1))
    assert example.energy_distance(a, b) == pytest.approx(6.0)
    pts = np.array([[0.0, 0.0], [1.0, 0.0]])
    assert example.energy_distance(pts, pts) == pytest.approx(0.0, abs=1e-12)


def test_flow_matching_smoke(tmp_path):
    example = load_example("flow_matching")
    flags = ["--width", "16", "--batch-size", "16", "--samples", "32", "--ode-steps", "2"]
    metrics = example.main([*flags, "--steps", "2", "--out", str(tmp_path)])
    _check_run(tmp_path, metrics, ["energy_distance_euler", "energy_distance_midpoint"])


def test_diffusion_unet_smoke(tmp_path):
    example = load_example("diffusion_unet")
    flags = ["--width", "8", "--batch-size", "4", "--samples", "4", "--diffusion-steps", "2"]
    metrics = example.main([*flags, "--steps", "2", "--out", str(tmp_path)])
    _check_run(tmp_path, metrics, ["generated", "real_test", "noise"])
    assert metrics["real_test"]["mean_max_prob"] > 0.5  # the judge knows real digits


def test_steps_zero_is_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        load_example("flow_matching").main(["--steps", "0"])
    assert e.value.code == 2
    assert "must be at least 1, got 0" in capsys.readouterr().err
