"""BERT's task heads against transformers': names and order, outputs and gradients on a
padded batch, Hugging Face folders both ways (``from_pretrained`` picking the class from
``architectures``). Every parameter of the reference is randomized."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

import purelayers as pl
from purelayers import models as M

TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=16,
)
HEADS = [
    ("BertForSequenceClassification", 3),
    ("BertForTokenClassification", 5),
    ("BertForMaskedLM", 2),
    ("BertForQuestionAnswering", 2),
]


@pytest.fixture(scope="module")
def hfs(torch, transformers):
    """Each head's tiny transformers model, every parameter from N(0, 0.5^2), eval mode."""
    from tests.twins import randomize

    out = {}
    for name, labels in HEADS:
        config = transformers.BertConfig(**TINY, num_labels=labels, attn_implementation="eager")
        out[name] = randomize(torch, getattr(transformers, name)(config)).eval()
    return out


def _batch():
    """Two rows of seven, the second padded after four tokens; token type 1 from the
    fourth token on."""
    ids = np.random.default_rng(0).integers(1, TINY["vocab_size"], (2, 7))
    mask = np.ones((2, 7), np.int64)
    mask[1, 4:] = 0
    ids[1, 4:] = 0
    token_types = np.zeros((2, 7), np.int64)
    token_types[:, 3:] = 1
    return ids, mask, token_types


def _torch_call(module, ids, mask, token_types):
    out = module(ids, attention_mask=mask, token_type_ids=token_types)
    if hasattr(out, "start_logits"):
        return out.start_logits, out.end_logits
    return out.logits


@pytest.mark.parametrize(("name", "labels"), HEADS)
def test_outputs_and_gradients_match_transformers(hfs, name, labels):
    hf = hfs[name]
    model = getattr(M, name)(M.BertConfig.from_dict(hf.config.to_dict()))
    assert model.config.num_labels == labels

    def apply(params, ids, mask, token_types):
        return model.apply(params, ids, attention_mask=mask, token_type_ids=token_types)

    # gradients where the head adds a path to them (the pooler, the tied decoder)
    grads = name in ("BertForSequenceClassification", "BertForMaskedLM")
    pl.testing.assert_matches_torch(
        model, hf, *_batch(), apply=apply, torch_call=_torch_call, forward_mode=False, grads=grads
    )


@pytest.mark.parametrize(("name", "labels"), HEADS)
def test_folders_both_ways(torch, transformers, hfs, tmp_path, name, labels):
    """transformers' folder loads as this head (the file's names, tied ones aside, are
    the params'), and our folder loads in transformers with nothing missing or extra and
    the same outputs."""
    hf = hfs[name]
    hf.save_pretrained(tmp_path / "theirs")
    with warnings.catch_warnings():
        warnings.simplefilter("error", pl.params.CheckpointWarning)
        model, params = M.from_pretrained(tmp_path / "theirs")
    assert type(model) is getattr(M, name)
    flat = pl.params.flatten(params)
    assert set(flat) == set(load_file(tmp_path / "theirs" / "model.safetensors"))
    M.save_pretrained(tmp_path / "ours", model, params)
    loaded, info = getattr(transformers, name).from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert loaded.config.num_labels == labels
    batch = [torch.from_numpy(a) for a in _batch()]
    with torch.no_grad():
        want, got = _torch_call(hf, *batch), _torch_call(loaded.eval(), *batch)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)


def test_masked_lm_holds_its_decoder_once_and_question_answering_splits():
    config = M.BertConfig(**TINY)
    mlm = M.BertForMaskedLM(config)
    names = list(pl.params.flatten(mlm.ordered(pl.params.abstract(mlm, (1, 1)))))
    assert "cls.predictions.decoder.weight" not in names
    assert names[-5:] == [
        "cls.predictions.bias",
        "cls.predictions.transform.dense.weight",
        "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.LayerNorm.weight",
        "cls.predictions.transform.LayerNorm.bias",
    ]
    assert not any(n.startswith("bert.pooler") for n in names)
    assert mlm.aliases()["cls.predictions.decoder.weight"] == (
        "bert.embeddings.word_embeddings.weight"
    )
    qa = M.BertForQuestionAnswering(config)
    start, end = qa.output_shape((2, 7))
    assert start.shape == end.shape == (2, 7)
    assert M.BertForSequenceClassification(config).output_shape((2, 7)).shape == (2, 2)


def test_bad_labels_and_configs_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"^BertConfig: id2label must be a non-empty mapping"):
        M.BertConfig(id2label={})
    with pytest.raises(ValueError, match=r"^BertConfig: id2label's keys must be label indices"):
        M.BertConfig(id2label={"a": "x"})
    with pytest.raises(ValueError, match="BertForMaskedLM: config must be a BertConfig"):
        M.BertForMaskedLM(TINY)
    config = M.BertConfig.from_dict({"id2label": {"0": "neg", "1": "pos", "2": "mid"}})
    assert config.num_labels == 3 and config.label2id == {"neg": 0, "pos": 1, "mid": 2}
