"""Smoke runs of the retrieval gallery scripts: two_tower, multimodal and rag each train
a few steps at tiny sizes and write their named figures and their picture."""

import json
import math

import pytest

from tests.example_loader import load_example


def _check_run(out, name: str, figures: tuple[str, ...]) -> dict:
    metrics = json.loads((out / "metrics.json").read_text())
    for figure in (*figures, "steps", "seconds"):
        assert math.isfinite(metrics[figure]), figure
    assert metrics["steps"] == 2
    assert (out / f"{name}.png").stat().st_size > 1000
    return metrics


def test_two_tower_smoke(tmp_path):
    example = load_example("two_tower")
    args = ["--width", "16", "--heads", "2", "--batch-size", "8", "--docs", "60"]
    example.main([*args, "--query-words", "8", "--doc-words", "16", "--buckets", "512",
                  "--steps", "2", "--out", str(tmp_path)])  # fmt: skip
    figures = [f"{p}recall_at_{k}" for p in ("", "random_encoder_", "bag_of_chars_")
               for k in (1, 5, 10)]  # fmt: skip
    metrics = _check_run(tmp_path, "two_tower", tuple(figures))
    # a fifth of the 60 docstrings held out
    assert metrics["test_documents"] == 12
    assert 0.0 <= metrics["recall_at_1"] <= metrics["recall_at_5"] <= metrics["recall_at_10"]


def test_multimodal_smoke(tmp_path):
    example = load_example("multimodal")
    args = ["--width", "16", "--depth", "1", "--heads", "2", "--batch-size", "16"]
    example.main([*args, "--steps", "2", "--out", str(tmp_path)])
    figures = ("zero_shot_accuracy", "chance_accuracy", "image_to_text_recall_at_1",
               "text_to_image_precision_at_10", "logit_scale")  # fmt: skip
    metrics = _check_run(tmp_path, "multimodal", figures)
    assert metrics["chance_accuracy"] == 0.1 and metrics["test_images"] == 450


def test_rag_smoke(tmp_path):
    example = load_example("rag")
    args = ["--width", "16", "--depth", "1", "--heads", "2", "--batch-size", "4"]
    args += ["--facts", "40", "--eval", "4", "--retriever-steps", "2"]
    example.main([*args, "--steps", "2", "--out", str(tmp_path)])
    figures = [f"{m}_{s}" for m in ("exact_match", "char_accuracy")
               for s in ("retrieved", "oracle", "no_retrieval")]  # fmt: skip
    figures += ["retriever_recall_at_1", "retriever_recall_at_5"]
    figures += ["decode_ms_per_char_python_loop", "decode_ms_per_char_fori_loop"]
    metrics = _check_run(tmp_path, "rag", tuple(figures))
    assert metrics["documents"] == 40 and metrics["test_queries"] == 4


def test_steps_zero_is_argparse_error(capsys):
    example = load_example("rag")
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--steps", "0"])
    assert exit_info.value.code == 2
    assert "--steps: must be at least 1, got 0" in capsys.readouterr().err
