"""Hand-offs that must not lose work: a LoRA adapter that ``peft.AutoPeftModelFor
CausalLM`` loads by itself, ``save_pretrained``'s refusal of a wrapped model and its
copy of the tokenizer files, and ``generate``'s refusal of right-padded prompts."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from purelayers import lora
from purelayers import models as M
from tests.chat_folder import chat_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory, transformers):
    return chat_folder(tmp_path_factory.mktemp("handoffs") / "base", model_type="llama")


def _adapted(folder):
    model, base = M.from_pretrained(folder)
    lmodel = lora.wrap(model, ["q_proj", "v_proj"], r=4, lora_alpha=8)
    params = lora.init(lmodel, jax.random.key(0), base)
    # B is zeros at init: give the adapters values so that they change the logits
    params = jax.tree.map(
        lambda p, t: p + 0.05 * jax.random.normal(jax.random.key(1), p.shape) if t else p,
        params,
        lora.trainable(params),
    )
    return model, lmodel, params


def test_auto_peft_model_loads_our_adapter_with_equal_logits(torch, peft, folder, tmp_path):
    model, lmodel, params = _adapted(folder)
    assert model.name_or_path == str(folder)
    adapter = lora.save_adapter(tmp_path / "adapter", lmodel, params)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["task_type"] == "CAUSAL_LM"
    assert config["base_model_name_or_path"] == str(folder)
    theirs = peft.AutoPeftModelForCausalLM.from_pretrained(adapter).eval()
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        expected = theirs(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(lmodel.apply(params, ids), expected, rtol=1e-4, atol=1e-4)
    # as given
    lora.save_adapter(
        tmp_path / "given", lmodel, params, base_model_name_or_path="org/base", task_type="X"
    )
    config = json.loads((tmp_path / "given" / "adapter_config.json").read_text())
    assert (config["base_model_name_or_path"], config["task_type"]) == ("org/base", "X")


def test_save_pretrained_refuses_a_wrapped_model_and_copies_tokenizer_files(
    transformers, folder, tmp_path
):
    _, lmodel, params = _adapted(folder)
    with pytest.raises(ValueError, match=r"lora\.merge.*lora\.save_adapter"):
        M.save_pretrained(tmp_path / "wrapped", lmodel, params)
    assert not (tmp_path / "wrapped").exists()
    merged_model, merged = lora.merge(lmodel, params)
    out = M.save_pretrained(tmp_path / "merged", merged_model, merged, tokenizer_from=folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / name).read_bytes() == (folder / name).read_bytes()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    with pytest.raises(ValueError, match=r"^save_pretrained: tokenizer_from=.* holds none"):
        M.save_pretrained(
            tmp_path / "x", merged_model, merged, tokenizer_from=tmp_path / "merged" / "none"
        )


def test_generate_refuses_right_padding_and_runs_an_unmerged_lora_model(folder):
    model, lmodel, params = _adapted(folder)
    ids = np.array([[5, 6, 7, 0], [5, 6, 7, 8]])
    with pytest.raises(ValueError, match=r"0 after a 1 in row 0 .*pad prompts on the left"):
        M.generate(
            model, params, ids, attention_mask=[[1, 1, 1, 0], [1, 1, 1, 1]], max_new_tokens=2
        )
    left = np.array([[0, 5, 6, 7], [5, 6, 7, 8]])
    mask = np.array([[0, 1, 1, 1], [1, 1, 1, 1]])
    out = M.generate(lmodel, params, left, attention_mask=mask, max_new_tokens=3, eos_token_id=None)
    _, merged = lora.merge(lmodel, params)
    again = M.generate(
        model, merged, left, attention_mask=mask, max_new_tokens=3, eos_token_id=None
    )
    np.testing.assert_array_equal(out, again)
