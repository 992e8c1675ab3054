"""Smoke runs of the sequence gallery scripts (encoder, ssm, dpo): two steps at tiny
sizes write their named figures and their picture."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.example_loader import load_example as load

TEXT = ["--chars", "20000", "--batch-size", "4", "--seq-len", "16", "--width", "16"]


def check_run(out: Path, metrics: dict, names: list[str], picture: str) -> None:
    written = json.loads((out / "metrics.json").read_text())
    for name in [*names, "steps", "seconds"]:
        assert math.isfinite(written[name]), name
        assert written[name] == metrics[name]
    assert written["steps"] == 2
    assert (out / picture).stat().st_size > 1000


def test_encoder_smoke(tmp_path):
    args = [*TEXT, "--heads", "2", "--depth", "1", "--probe-examples", "40"]
    metrics = load("encoder").main([*args, "--steps", "2", "--out", str(tmp_path)])
    names = ["masked_accuracy", "masked_accuracy_random_init", "masked_accuracy_most_frequent"]
    names += ["probe_accuracy_pretrained", "probe_accuracy_random"]
    check_run(tmp_path, metrics, names, "curves.png")


def test_ssm_smoke_and_scan(tmp_path):
    ssm = load("ssm")
    # h_t = a_t h_{t-1} + b_t by hand: 1, 0.5 * 1 + 1, 0.5 * 1.5 + 1, then a_3 = 0
    a = np.array([[0.5, 0.5, 0.5, 0.0]], np.float32)
    b = np.array([[1.0, 1.0, 1.0, 2.0]], np.float32)
    np.testing.assert_allclose(ssm.parallel_recurrence(a, b), [[1.0, 1.5, 1.75, 2.0]])
    np.testing.assert_allclose(ssm.sequential_recurrence(a, b), [[1.0, 1.5, 1.75, 2.0]])
    args = [*TEXT, "--depth", "1", "--state", "2", "--sample-len", "8", "--eval-every", "1"]
    metrics = ssm.main([*args, "--steps", "2", "--out", str(tmp_path)])
    assert metrics["scan_max_abs_diff"] < 1e-5
    names = ["valid_loss", "unigram_loss", "sampler_scan_ms_per_char"]
    names += ["sampler_python_loop_ms_per_char"]
    check_run(tmp_path, metrics, names, "curves.png")
    sample = (tmp_path / "sample.txt").read_text()
    assert sample.startswith("The ") and len(sample) == 4 + 8


def test_dpo_smoke(tmp_path):
    args = [*TEXT, "--heads", "2", "--depth", "1", "--sft-steps", "2", "--eval-every", "1"]
    metrics = load("dpo").main([*args, "--steps", "2", "--out", str(tmp_path)])
    names = ["preference_accuracy_sft", "preference_accuracy_dpo", "reward_margin_sft"]
    names += ["reward_margin_dpo", "greedy_positive_sft", "greedy_positive_dpo"]
    names += ["generate_fori_loop_ms_per_step", "generate_python_loop_ms_per_step"]
    check_run(tmp_path, metrics, names, "margin.png")
    assert metrics["reward_margin_sft"] == 0.0  # the policy is the reference at the start


def test_steps_zero_and_beta_zero_are_refused(capsys):
    dpo = load("dpo")
    with pytest.raises(SystemExit) as e:
        dpo.main(["--steps", "0"])
    assert e.value.code == 2
    assert "--steps: must be at least 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        dpo.main(["--beta", "0"])
    assert e.value.code == 2
    assert "--beta: must be positive, got 0.0" in capsys.readouterr().err
