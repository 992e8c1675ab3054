"""The character-level GPT example runs end to end in a short smoke mode."""

import importlib.util
import json
import sys
from pathlib import Path

import purelayers as pl

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "char_gpt.py"


def load_example():
    spec = importlib.util.spec_from_file_location("char_gpt", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_smoke_run_learns_samples_and_saves(tmp_path):
    example = load_example()
    args = ["--steps", "12", "--out", str(tmp_path), "--chars", "20000", "--width", "32"]
    args += ["--depth", "2", "--heads", "2", "--seq-len", "32", "--batch-size", "8"]
    args += ["--eval-every", "6", "--sample-len", "20", "--lr", "1e-2"]
    metrics = example.main(args)
    assert metrics["valid_loss"] < metrics["initial_valid_loss"]
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == 12
    sample = (tmp_path / "sample.txt").read_text()
    assert sample.startswith("The ") and len(sample) == 4 + 20
    names = list(pl.params.load(tmp_path / "model.safetensors"))
    assert names[:3] == ["pos_emb", "embed.weight", "blocks.0.ln1.weight"]
    assert names[-2:] == ["head.weight", "head.bias"]
