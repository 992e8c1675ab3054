"""The character-LSTM example runs end to end in a few steps and learns something."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import char_lstm


def test_char_lstm_smoke(tmp_path):
    metrics = char_lstm.main(
        [
            "--steps", "12", "--eval-every", "4", "--batch-size", "8", "--seq-len", "16",
            "--embed", "8", "--hidden", "32", "--chars", "30000", "--sample-len", "20",
            "--lr", "1e-2", "--out", str(tmp_path),
        ]
    )  # fmt: skip
    valid = metrics["history"]["valid_loss"]
    assert valid[-1] < valid[0]
    assert metrics["valid_loss"] < metrics["unigram_loss"] + 0.5
    assert (tmp_path / "sample.txt").read_text().startswith("The ")
    assert (tmp_path / "model.safetensors").stat().st_size > 0
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == 12
