"""The pretrained-model examples and the generate benchmark run end to end, offline,
in a short smoke mode (a random GPT-2 that transformers builds and saves)."""

import importlib.util
import json
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str):
    sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


SMALL = ["--width", "32", "--depth", "2", "--heads", "2"]


def test_generate_example_streams_tokens_and_reports_speed(transformers, tmp_path):
    example = load_example("generate")
    metrics = example.main([*SMALL, "--max-new-tokens", "6", "--out", str(tmp_path)])
    assert metrics["new_tokens"] == 6 and metrics["tokens_per_second"] > 0
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics


def test_finetune_example_learns_and_transformers_loads_the_result(transformers, tmp_path):
    example = load_example("finetune_gpt2")
    args = [*SMALL, "--steps", "25", "--batch-size", "8", "--seq-len", "32", "--chars", "20000"]
    metrics = example.main([*args, "--lr", "1e-2", "--out", str(tmp_path)])
    assert metrics["valid_loss"] < metrics["initial_valid_loss"]
    assert metrics["transformers_max_logit_diff"] < 1e-4
    assert (tmp_path / "model" / "config.json").is_file()


def test_generate_benchmark_smoke(transformers, tmp_path):
    from benchmarks import generate

    out = generate.main(["--smoke", "--json", str(tmp_path / "g.json")])
    (row,) = out["rows"]
    assert row["same_tokens"]
    for impl in ("purelayers", "transformers"):
        assert row[impl]["tokens_per_s"] > 0 and row[impl]["ttft_s"] > 0
    assert json.loads((tmp_path / "g.json").read_text())["rows"][0]["batch"] == 1
