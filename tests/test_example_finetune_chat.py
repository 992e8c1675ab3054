"""The chat fine-tuning example end to end, offline, on a tiny folder (a random Qwen2
and a tokenizer trained on standard-library source): the held-out loss falls, a resumed
run's losses equal the uninterrupted run's bit for bit, PEFT's AutoPeftModelForCausalLM
loads the adapter and transformers the merged folder with our logits, and bad lines
are errors naming them."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from tests.chat_folder import chat_folder
from tests.example_loader import load_example

WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega".split()


def _pairs(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = rng.sample(WORDS, 3)
        out.append({"prompt": "Repeat: " + " ".join(words), "response": " ".join(words)})
    return out


def _jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _args(example, folder, data, out, *extra):
    base = ["--model", str(folder), "--data", str(data), "--out", str(out), "--max-length", "64"]
    base += ["--batch-size", "4", "--lr", "2e-2", "--eval-every", "3", "--checkpoint-every", "3"]
    base += ["--r", "4", "--valid-fraction", "0.2"]
    return example.parse_args([*base, *extra])


@pytest.fixture(scope="module")
def folder(tmp_path_factory, transformers):
    return chat_folder(tmp_path_factory.mktemp("chat") / "model")


def test_finetune_chat_trains_resumes_and_hands_off(torch, transformers, peft, folder, tmp_path):
    example = load_example("finetune_chat")
    data = tmp_path / "pairs.jsonl"
    _jsonl(data, _pairs(20))
    whole, lmodel, params = example.run(
        _args(example, folder, data, tmp_path / "whole", "--steps", "9")
    )
    curve = whole["loss_curve"]
    assert whole["valid_loss"] < curve["valid_loss"][0] or curve["loss"][-1] < curve["loss"][0]
    assert len(curve["loss"]) == 9 and whole["truncated"] == 0 and whole["held_out"] == 4
    assert (tmp_path / "whole" / "loss.png").stat().st_size > 0

    # stopped after step 6, resumed in a new run: the same losses, bit for bit
    part = tmp_path / "part"
    example.run(_args(example, folder, data, part, "--steps", "6"))
    with pytest.raises(ValueError, match="pass --resume"):
        example.run(_args(example, folder, data, part, "--steps", "9"))
    resumed, _, _ = example.run(_args(example, folder, data, part, "--steps", "9", "--resume"))
    assert resumed["resumed_from"] == 6
    assert resumed["loss_curve"] == curve
    with pytest.raises(
        ValueError,
        match=r"^--resume: .* does not fit this run: .*lora_A.*is float32\[2, 4, 32\], this run has float32\[2, 2, 32\]",
    ):
        example.run(_args(example, folder, data, part, "--steps", "12", "--resume", "--r", "2"))

    ids = np.random.default_rng(0).integers(0, lmodel.config.vocab_size, (2, 10))
    ours = lmodel.apply(params, ids)
    theirs = peft.AutoPeftModelForCausalLM.from_pretrained(tmp_path / "whole" / "adapter").eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "whole" / "merged")
    with torch.no_grad():
        for hf in (theirs, merged.eval()):
            np.testing.assert_allclose(hf(torch.tensor(ids)).logits.numpy(), ours, atol=1e-4)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "whole" / "merged")
    assert tokenizer.chat_template


def test_bad_lines_are_errors_naming_them_and_truncation_is_counted(transformers, folder, tmp_path):
    example = load_example("finetune_chat")
    data = tmp_path / "pairs.jsonl"
    rows = _pairs(6)
    _jsonl(data, [*rows[:2], {"prompt": "x"}, *rows[2:]])
    with pytest.raises(ValueError, match=r'pairs\.jsonl:3: expected an object with "prompt"'):
        example.run(_args(example, folder, data, tmp_path / "a", "--steps", "1"))
    long = {"prompt": "Repeat: alpha", "response": "alpha " * 60}
    _jsonl(data, [*rows[:4], long])
    with pytest.raises(ValueError, match=r"pairs\.jsonl:5: sft_batch: example 0 is \d+ tokens"):
        example.run(_args(example, folder, data, tmp_path / "b", "--steps", "1"))
    metrics, _, _ = example.run(
        _args(example, folder, data, tmp_path / "c", "--steps", "1", "--truncation", "right")
    )
    assert metrics["truncated"] == 1 and metrics["examples"] == 5
