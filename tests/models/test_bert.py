"""BertModel against transformers' ``BertModel``: names, order, shapes and init; outputs
and gradients on a padded batch with two token types; dropout; Hugging Face folders both
ways; the config; the errors. Every parameter of the reference is randomized."""

from __future__ import annotations

import dataclasses
import warnings

import jax
import numpy as np
import pytest

import purelayers as pl
from purelayers import models as M
from purelayers.layers import LayerError
from purelayers.models.bert import BertConfig, BertModel
from tests.twins import randomize

TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=16,
)


@pytest.fixture(scope="module")
def hf(torch, transformers):
    """A tiny transformers BertModel, every parameter drawn from N(0, 0.5^2), eval mode."""
    config = transformers.BertConfig(**TINY, attn_implementation="eager")
    return randomize(torch, transformers.BertModel(config)).eval()


def _model(hf) -> BertModel:
    return BertModel(BertConfig.from_dict(hf.config.to_dict()))


def _batch():
    """Two rows of seven, the second padded after four tokens (pad id 0, mask 0); token
    type 1 from the fourth token on."""
    ids = np.random.default_rng(0).integers(1, TINY["vocab_size"], (2, 7))
    mask = np.ones((2, 7), np.int64)
    mask[1, 4:] = 0
    ids[1, 4:] = 0
    token_types = np.zeros((2, 7), np.int64)
    token_types[:, 3:] = 1
    return ids, mask, token_types


@jax.jit
def _forward(params, ids, mask, token_types):
    model = BertModel(BertConfig(**TINY))
    return model.apply(params, ids, attention_mask=mask, token_type_ids=token_types)


def _torch_outputs(torch, hf, ids, mask, token_types):
    with torch.no_grad():
        out = hf(
            torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            token_type_ids=torch.from_numpy(token_types),
        )
    return out.last_hidden_state.numpy(), out.pooler_output.numpy()


def _assert_outputs(ours, theirs):
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-5)


def test_init_gives_transformers_names_order_shapes_and_init(hf):
    model = _model(hf)
    params = model.init(jax.random.key(0), (2, 7))
    flat = {k: np.asarray(v) for k, v in pl.params.flatten(params).items()}
    theirs = hf.state_dict()
    assert list(flat) == list(theirs)
    assert {k: v.shape for k, v in flat.items()} == {k: tuple(v.shape) for k, v in theirs.items()}
    assert list(pl.params.flatten(model.ordered(pl.params.abstract(model, (1, 1))))) == list(theirs)
    # transformers' _init_weights: N(0, 0.02^2) weights, zero biases, unit LayerNorms,
    # the padding row of the word embeddings zero
    for name, value in flat.items():
        if "LayerNorm" in name:
            want = 1.0 if name.endswith("weight") else 0.0
            np.testing.assert_array_equal(value, np.full(value.shape, want), err_msg=name)
        elif name.endswith("bias"):
            np.testing.assert_array_equal(value, np.zeros(value.shape), err_msg=name)
        elif value.size > 300:
            assert 0.015 < value.std() < 0.025, name
    words = flat["embeddings.word_embeddings.weight"]
    np.testing.assert_array_equal(words[0], np.zeros(32))


def test_outputs_and_gradients_match_transformers(torch, hf):
    """Every parameter's gradient, including the padding row's (none) and the position and
    token-type tables', equals torch's; padded keys are not attended."""
    model = _model(hf)

    def apply(params, ids, mask, token_types):
        return model.apply(params, ids, attention_mask=mask, token_type_ids=token_types)

    def torch_call(module, ids, mask, token_types):
        out = module(ids, attention_mask=mask, token_type_ids=token_types)
        return out.last_hidden_state, out.pooler_output

    pl.testing.assert_matches_torch(model, hf, *_batch(), apply=apply, torch_call=torch_call)


def test_loaded_state_dict_gives_transformers_outputs(torch, hf):
    model = _model(hf)
    params = pl.params.load_state_dict(
        pl.params.abstract(model, (1, 1)), hf.state_dict(), model=model
    )
    batch = _batch()
    _assert_outputs(_forward(params, *batch), _torch_outputs(torch, hf, *batch))


def test_a_row_of_only_padding_matches_transformers_default_attention(torch, transformers, hf):
    """A row without tokens attends nothing (zeros), as transformers' sdpa attention
    gives (its eager attention averages every value instead)."""
    sdpa = transformers.BertModel(transformers.BertConfig(**TINY, attn_implementation="sdpa"))
    sdpa.load_state_dict(hf.state_dict())
    model = _model(hf)
    params = pl.params.load_state_dict(
        pl.params.abstract(model, (1, 1)), hf.state_dict(), model=model
    )
    ids, mask, token_types = _batch()
    mask[1] = 0
    batch = ids, mask, token_types
    _assert_outputs(_forward(params, *batch), _torch_outputs(torch, sdpa.eval(), *batch))


def test_dropout_runs_only_in_training_and_needs_a_key(hf):
    model = _model(hf)
    params = pl.params.load_state_dict(
        pl.params.abstract(model, (1, 1)), hf.state_dict(), model=model
    )
    ids, mask, token_types = _batch()

    @jax.jit
    def run(params, key):
        return model.apply(
            params, ids, attention_mask=mask, token_type_ids=token_types, key=key, train=True
        )

    a, b = run(params, jax.random.key(1)), run(params, jax.random.key(1))
    c = run(params, jax.random.key(2))
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.allclose(a[0], c[0])
    assert not np.allclose(a[0], _forward(params, ids, mask, token_types)[0])
    assert np.isfinite(np.asarray(a[0])).all()
    with pytest.raises(ValueError, match="key"):
        jax.eval_shape(lambda p: model.apply(p, ids, train=True), params)


def test_save_pretrained_loads_in_transformers(torch, transformers, hf, tmp_path):
    model = _model(hf)
    params = pl.params.load_state_dict(
        pl.params.abstract(model, (1, 1)), hf.state_dict(), model=model
    )
    M.save_pretrained(tmp_path, model, params)
    loaded, info = transformers.BertModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    loaded = loaded.eval()
    batch = _batch()
    _assert_outputs(_torch_outputs(torch, loaded, *batch), _torch_outputs(torch, hf, *batch))


def test_from_pretrained_reads_a_transformers_folder(torch, hf, tmp_path):
    hf.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pl.params.CheckpointWarning)
        model, params = M.from_pretrained(tmp_path)
    assert isinstance(model, BertModel)
    assert model.config == BertConfig(**TINY)
    batch = _batch()
    _assert_outputs(_forward(params, *batch), _torch_outputs(torch, hf, *batch))


def test_from_pretrained_ignores_what_transformers_ignores(hf, tmp_path):
    """An old checkpoint's persistent ``embeddings.position_ids`` buffer is dropped
    without a warning, as transformers drops it."""
    from safetensors.numpy import load_file, save_file

    hf.save_pretrained(tmp_path)
    file = tmp_path / "model.safetensors"
    tensors = load_file(file)
    tensors["embeddings.position_ids"] = np.arange(16, dtype=np.int64)[None]
    save_file(tensors, file, metadata={"format": "pt"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", pl.params.CheckpointWarning)
        _, params = M.from_pretrained(tmp_path)
    assert "embeddings.position_ids" not in pl.params.flatten(params)


def test_config_matches_transformers_and_round_trips(transformers, hf):
    ours = BertConfig.from_dict(hf.config.to_dict())
    for field in dataclasses.fields(BertConfig):
        assert getattr(ours, field.name) == getattr(hf.config, field.name), field.name
    assert BertConfig.from_dict(ours.to_dict()) == ours
    assert ours.to_dict()["model_type"] == "bert"
    defaults = transformers.BertConfig()
    for field in dataclasses.fields(BertConfig):
        assert getattr(BertConfig(), field.name) == getattr(defaults, field.name), field.name
    assert hash(BertModel(ours)) == hash(BertModel(BertConfig.from_dict(ours.to_dict())))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(hidden_size=30), "hidden_size must be divisible by num_attention_heads=4, got 30"),
        (dict(hidden_act="mish"), "hidden_act must be one of 'gelu', .*, got 'mish'"),
        (dict(num_hidden_layers=0), "num_hidden_layers must be a positive integer, got 0"),
        (dict(hidden_dropout_prob=1.0), r"hidden_dropout_prob must be in \[0, 1\), got 1.0"),
        (dict(layer_norm_eps=0.0), "layer_norm_eps must be > 0, got 0.0"),
        (dict(pad_token_id=99), "pad_token_id must be < vocab_size=99, got 99"),
        (dict(is_decoder=True), "is_decoder must be False"),
        (dict(classifier_dropout=1.0), r"classifier_dropout must be in \[0, 1\), got 1.0"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(overrides, match):
    with pytest.raises(ValueError, match=f"^BertConfig: {match}"):
        BertConfig(**{**TINY, **overrides})


def test_shape_errors_name_what_was_expected_and_got():
    model = BertModel(BertConfig(**TINY))
    params = pl.params.abstract(model, (1, 1))
    ids = np.ones((2, 7), np.int32)
    with pytest.raises(LayerError, match=r"input_ids shape expected \(batch, seq\), got \(7,\)"):
        model.apply(params, ids[0])
    with pytest.raises(
        LayerError, match="sequence length expected at most max_position_embeddings=16, got 17"
    ):
        model.init(jax.random.key(0), (1, 17))
    with pytest.raises(LayerError, match=r"attention_mask shape expected \(2, 7\), got \(2, 6\)"):
        model.apply(params, ids, attention_mask=ids[:, :6])
    with pytest.raises(ValueError, match="config must be a BertConfig"):
        BertModel(TINY)
    with pytest.raises(ValueError, match="add_pooling_layer must be True or False, got 0"):
        BertModel(BertConfig(**TINY), add_pooling_layer=0)
    from purelayers.models.bert import Built

    with pytest.raises(NotImplementedError, match="Built: a subclass defines build"):
        Built()
