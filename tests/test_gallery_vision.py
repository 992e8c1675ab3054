"""Smoke runs of the vision and graph gallery scripts (ViT, VAE, GAN, distillation, GNN):
two steps at tiny sizes write their named figures and their picture."""

import json
import math

import pytest

from tests.example_loader import load_example


def run(name: str, tmp_path, *flags: str) -> dict:
    metrics = load_example(name).main([*flags, "--steps", "2", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "metrics.json").read_text()) == pytest.approx(metrics)
    assert metrics["steps"] == 2
    assert (tmp_path / f"{name}.png").stat().st_size > 0
    return metrics


def finite(metrics: dict, *names: str) -> None:
    for name in (*names, "seconds"):
        assert math.isfinite(metrics[name]), name


def test_vit(tmp_path):
    flags = ["--width", "8", "--depth", "1", "--heads", "2", "--patch", "4", "--batch-size", "8"]
    metrics = run("vit", tmp_path, *flags)
    finite(metrics, "test_accuracy", "chance")
    assert 0.0 <= metrics["test_accuracy"] <= 1.0


def test_vae(tmp_path):
    flags = ["--width", "4", "--latent", "2", "--batch-size", "8", "--samples", "4"]
    metrics = run("vae", tmp_path, *flags)
    finite(metrics, "test_neg_elbo", "initial_neg_elbo", "test_kl", "test_recon_mse")
    assert metrics["test_kl"] >= 0.0
    assert metrics["mean_image_mse"] == pytest.approx(0.0740, abs=1e-4)


def test_gan(tmp_path):
    flags = ["--width", "4", "--latent", "4", "--batch-size", "8", "--samples", "16"]
    metrics = run("gan", tmp_path, *flags, "--classifier-steps", "2")
    finite(metrics, "confident_fraction", "untrained_confident_fraction")
    assert 0 <= metrics["classes"] <= 10 and 0 <= metrics["untrained_classes"] <= 10


def test_distillation(tmp_path):
    flags = ["--teacher-steps", "2", "--width", "4", "--hidden", "4", "--batch-size", "8"]
    metrics = run("distillation", tmp_path, *flags)
    finite(metrics, "distilled_test_accuracy", "student_test_accuracy", "teacher_test_accuracy")


def test_gnn(tmp_path):
    metrics = run("gnn", tmp_path, "--splits", "2", "--hidden", "4")
    finite(metrics, "gcn_accuracy", "mlp_accuracy")
    assert metrics["majority"] == 0.5  # 17 members in each club


def test_zero_steps_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        load_example("gnn").main(["--steps", "0"])
    assert e.value.code == 2
    assert "must be at least 1, got 0" in capsys.readouterr().err
