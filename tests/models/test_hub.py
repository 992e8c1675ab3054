"""Folders saved from another head of the same base model: a BERT masked-LM and a ViT
image classifier load into the base models, their heads left out and the pooler they
never had initialized anew, both reported."""

from __future__ import annotations

import numpy as np
import pytest

import purelayers as pl
from purelayers import models as M


@pytest.mark.parametrize("head", ["BertForMaskedLM", "ViTForImageClassification"])
def test_a_head_without_a_pooler_loads_into_the_base_model(torch, transformers, tmp_path, head):
    if head.startswith("Bert"):
        config = transformers.BertConfig(
            vocab_size=50,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=24,
            max_position_embeddings=16,
        )
        inputs = {"input_ids": np.array([[2, 5, 7, 9]])}
        base_cls = M.BertModel
    else:
        config = transformers.ViTConfig(
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=24,
            image_size=8,
            patch_size=4,
            num_labels=3,
        )
        inputs = {
            "pixel_values": np.random.default_rng(0)
            .standard_normal((1, 3, 8, 8))
            .astype(np.float32)
        }
        base_cls = M.ViTModel
    config._attn_implementation = "eager"
    hf = getattr(transformers, head)(config).eval()
    hf.save_pretrained(tmp_path)
    with pytest.warns(pl.params.CheckpointWarning) as caught:
        model, params = M.from_pretrained(tmp_path)
    messages = " ".join(str(w.message) for w in caught)
    assert "initialized anew" in messages and "pooler.dense.weight" in messages
    assert "left out" in messages  # the head's own names
    assert isinstance(model, base_cls)
    base = getattr(hf, "bert", None) or hf.vit
    want = base(**{k: torch.tensor(v) for k, v in inputs.items()}).last_hidden_state
    got = model.apply(params, *inputs.values())[0]
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), atol=2e-5)
    assert np.all(np.isfinite(np.asarray(model.apply(params, *inputs.values())[1])))
