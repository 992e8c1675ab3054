"""Folders saved from a head the library lacks, of a base model it has: a BERT causal LM
and a ViT masked-image model load into the base models, their heads left out and the pooler they
never had initialized anew, both reported."""

from __future__ import annotations

import numpy as np
import pytest

import purelayers as pl
from purelayers import models as M


@pytest.mark.parametrize("head", ["BertLMHeadModel", "ViTForMaskedImageModeling"])
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
    assert f"{head} is not in the library" in messages
    assert isinstance(model, base_cls)
    base = getattr(hf, "bert", None) or hf.vit
    want = base(**{k: torch.tensor(v) for k, v in inputs.items()}).last_hidden_state
    got = model.apply(params, *inputs.values())[0]
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), atol=2e-5)
    assert np.all(np.isfinite(np.asarray(model.apply(params, *inputs.values())[1])))


def test_from_pretrained_onto_shardings(torch, transformers, tmp_path):
    """``shardings=`` (a function of the model) places every array, a ``Repeat``'s
    stacked blocks and the tied embedding included, with the plain load's values."""
    import jax

    import purelayers.sharding as S

    config = transformers.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=40, n_positions=16)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    mesh = S.make_mesh("data=1")

    def shardings(model):
        return S.named_shardings(pl.params.abstract(model, (1, 1)), S.data_parallel(), mesh)

    _, placed = M.from_pretrained(tmp_path, shardings=shardings)
    _, plain = M.from_pretrained(tmp_path)
    for a in jax.tree.leaves(placed):
        assert isinstance(a.sharding, S.NamedSharding) and a.sharding.mesh == mesh
    for name, a in pl.params.flatten(placed).items():
        np.testing.assert_array_equal(np.asarray(a), np.asarray(pl.params.flatten(plain)[name]))
    # both come back in torch's order (the transformers model's state_dict, tied head aside)
    want = [k for k in transformers.GPT2LMHeadModel(config).state_dict() if k != "lm_head.weight"]
    assert list(pl.params.flatten(plain)) == list(pl.params.flatten(placed)) == want
    # An error of the shardings function or its rules is the caller's, not the file's.
    with pytest.raises(ValueError, match=r"^sharding: rules must be a list of \(pattern, spec\)"):
        M.from_pretrained(
            tmp_path,
            shardings=lambda m: S.named_shardings(
                pl.params.abstract(m, (1, 1)), {"*": S.P()}, mesh
            ),
        )
