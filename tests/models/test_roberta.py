"""RoBERTa against transformers': outputs and gradients on a batch padded on the right
and on the left (positions counted from the padding index), names equal to the file's,
Hugging Face folders both ways. Every parameter of the reference is randomized."""

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
CLASSES = ["RobertaModel", "RobertaForSequenceClassification", "RobertaForMaskedLM"]


@pytest.fixture(scope="module")
def hfs(torch, transformers):
    from tests.twins import randomize

    config = transformers.RobertaConfig(**TINY, num_labels=3, attn_implementation="eager")
    return {n: randomize(torch, getattr(transformers, n)(config)).eval() for n in CLASSES}


def _batch():
    """Row 0 padded on the right after four tokens, row 1 on the left before three
    (pad id 1, mask 0)."""
    ids = np.random.default_rng(0).integers(3, TINY["vocab_size"], (2, 7))
    mask = np.ones((2, 7), np.int64)
    mask[0, 4:] = 0
    mask[1, :3] = 0
    ids[mask == 0] = 1
    return ids, mask


def _torch_call(module, ids, mask):
    out = module(ids, attention_mask=mask)
    if hasattr(out, "pooler_output"):
        return out.last_hidden_state, out.pooler_output
    return out.logits


@pytest.mark.parametrize("name", CLASSES)
def test_outputs_and_gradients_match_transformers(hfs, name):
    hf = hfs[name]
    model = getattr(M, name)(M.RobertaConfig.from_dict(hf.config.to_dict()))

    def apply(params, ids, mask):
        return model.apply(params, ids, attention_mask=mask)

    pl.testing.assert_matches_torch(
        model, hf, *_batch(), apply=apply, torch_call=_torch_call, forward_mode=False,
        grads=name != "RobertaModel", atol=5e-5,  # a vocab-wide sum in the head's gradient
    )  # fmt: skip


@pytest.mark.parametrize("name", CLASSES[1:])
def test_folders_both_ways(torch, transformers, hfs, tmp_path, name):
    hf = hfs[name]
    hf.save_pretrained(tmp_path / "theirs")
    with warnings.catch_warnings():
        warnings.simplefilter("error", pl.params.CheckpointWarning)
        model, params = M.from_pretrained(tmp_path / "theirs")
    assert type(model) is getattr(M, name)
    assert set(pl.params.flatten(params)) == set(
        load_file(tmp_path / "theirs" / "model.safetensors")
    )
    M.save_pretrained(tmp_path / "ours", model, params)
    loaded, info = getattr(transformers, name).from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    batch = [torch.from_numpy(a) for a in _batch()]
    with torch.no_grad():
        want, got = _torch_call(hf, *batch), _torch_call(loaded.eval(), *batch)
    np.testing.assert_allclose(want.numpy(), got.numpy(), rtol=1e-5, atol=1e-5)


def test_positions_count_from_the_padding_index():
    from purelayers.models.roberta import position_ids

    ids = np.array([[5, 6, 1, 1], [1, 1, 5, 6]])
    np.testing.assert_array_equal(position_ids(ids, 1), [[2, 3, 1, 1], [1, 1, 2, 3]])
    assert jax.eval_shape(lambda i: position_ids(i, 1), ids).shape == (2, 4)
