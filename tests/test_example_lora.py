"""The LoRA example runs end to end, offline, in a short smoke mode: the loss falls, and
the adapter folder it writes loads into PEFT on the same transformers model with the
logits of our trained params."""

import sys

import numpy as np

from purelayers import lora
from purelayers import models as M
from tests.example_loader import EXAMPLES, load_example


def test_lora_example_trains_and_peft_loads_its_adapter(torch, transformers, peft, tmp_path):
    example = load_example("lora_finetune")
    sys.path.insert(0, str(EXAMPLES))
    from generate import random_gpt2

    base = random_gpt2(tmp_path / "base", 32, 2, 2)
    args = ["--model", str(base), "--steps", "25", "--batch-size", "8", "--seq-len", "32"]
    args += [
        "--chars",
        "20000",
        "--lr",
        "1e-2",
        "--eval-every",
        "5",
        "--out",
        str(tmp_path / "run"),
    ]
    metrics, lmodel, params = example.run(example.parse_args(args))
    assert metrics["valid_loss"] < metrics["initial_valid_loss"]
    assert len(metrics["loss_curve"]["loss"]) == 25
    # two blocks, r=8, width 32: c_attn's A [8, 32] and B [96, 8], c_proj's [8, 32], [32, 8]
    assert metrics["trainable_params"] == 2 * (8 * (32 + 96) + 8 * (32 + 32))
    assert metrics["optimizer_state_bytes"] == 2 * 4 * metrics["trainable_params"] + 4
    assert (tmp_path / "run" / "loss.png").stat().st_size > 0

    ids = np.random.default_rng(0).integers(0, 256, (2, 12))
    hf = transformers.AutoModelForCausalLM.from_pretrained(base).eval()
    theirs = peft.PeftModel.from_pretrained(hf, tmp_path / "run" / "adapter").eval()
    with torch.no_grad():
        expected = theirs(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(lmodel.apply(params, ids), expected, rtol=1e-4, atol=1e-4)
    _, base_params = M.from_pretrained(base)
    loaded = lora.load_adapter(metrics["adapter"], lmodel, base_params)
    np.testing.assert_allclose(lmodel.apply(loaded, ids), expected, rtol=1e-4, atol=1e-4)
