"""ViT's image classifier, the Llama and Qwen2 sequence classifiers and DistilBERT against
transformers': names equal to the saved file's keys, outputs on padded batches (left and
right padding for the LMs, which pool each row's last non-padding token), gradients of
one head, Hugging Face folders both ways (``from_pretrained`` picking the class from
``architectures``). Every parameter of the reference is randomized."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

import purelayers as pl
from purelayers import models as M

TEXT = dict(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2)
LM = dict(**TEXT, num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
VIT = dict(TEXT, num_attention_heads=4, image_size=16, patch_size=4)
VIT.pop("vocab_size")
DISTIL = dict(vocab_size=99, dim=32, hidden_dim=37, n_layers=2, n_heads=4)
DISTIL.update(max_position_embeddings=16)
NAMES = [
    "ViTForImageClassification",
    "LlamaForSequenceClassification",
    "Qwen2ForSequenceClassification",
    "DistilBertModel",
    "DistilBertForSequenceClassification",
]


@pytest.fixture(scope="module")
def hfs(torch, transformers):
    """Each tiny transformers model, every parameter from N(0, 0.5^2) (buffers kept:
    the LMs' rotary frequencies are one), eval mode."""
    gen = torch.Generator().manual_seed(1)

    def randomize(torch, module):
        with torch.no_grad():
            for t in module.parameters():
                t.copy_(torch.randn(t.shape, generator=gen) * 0.5)
        return module

    configs = {
        "ViT": transformers.ViTConfig(**VIT, num_labels=3),
        "Llama": transformers.LlamaConfig(**LM, num_labels=3),
        "Qwen2": transformers.Qwen2Config(**LM, num_labels=3),
        "DistilBert": transformers.DistilBertConfig(**DISTIL, num_labels=3),
    }
    out = {}
    for name in NAMES:
        config = next(c for k, c in configs.items() if name.startswith(k))
        config._attn_implementation = "eager"
        out[name] = randomize(torch, getattr(transformers, name)(config)).eval()
    return out


def _inputs(name):
    """The model's inputs as numpy arrays: two images; or two rows of seven tokens, row
    0 padded on the right after four, row 1 (the LMs) on the left before three."""
    rng = np.random.default_rng(0)
    if name.startswith("ViT"):
        return (rng.standard_normal((2, 3, 16, 16)).astype(np.float32),)
    ids = rng.integers(1, 99, (2, 7))
    mask = np.ones((2, 7), np.int64)
    mask[0, 4:] = 0
    if "ForSequence" in name and not name.startswith("Distil"):
        mask[1, :3] = 0
    ids[mask == 0] = 0
    return ids, mask


def _ours(model, params, inputs):
    if len(inputs) == 1:
        return model.apply(params, inputs[0])
    return model.apply(params, inputs[0], attention_mask=inputs[1])


def _theirs(torch, hf, inputs):
    with torch.no_grad():
        out = hf(*[torch.from_numpy(a) for a in inputs])
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()


@pytest.mark.parametrize("name", NAMES)
def test_folders_both_ways(torch, transformers, hfs, tmp_path, name):
    """transformers' folder loads as this class, its names those of the file, with
    transformers' outputs; our folder loads in transformers with nothing missing or
    extra and the same outputs."""
    hf = hfs[name]
    hf.save_pretrained(tmp_path / "theirs")
    with warnings.catch_warnings():
        warnings.simplefilter("error", pl.params.CheckpointWarning)
        model, params = M.from_pretrained(tmp_path / "theirs")
    assert type(model) is getattr(M, name)
    written = load_file(tmp_path / "theirs" / "model.safetensors")
    assert set(pl.params.flatten(params)) == set(written)
    template = pl.params.abstract(model, model.example_shape())
    assert set(pl.params.flatten(template)) == set(written)
    inputs = _inputs(name)
    want = _theirs(torch, hf, inputs)
    got = jax.jit(lambda p, *a: _ours(model, p, a))(params, *inputs)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    if "ForSequence" in name or "ForImage" in name:
        assert model.peft_task_type == "SEQ_CLS" and model.config.num_labels == 3
    M.save_pretrained(tmp_path / "ours", model, params)
    loaded, info = getattr(transformers, name).from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert loaded.config.num_labels == 3
    np.testing.assert_allclose(_theirs(torch, loaded.eval(), inputs), want, rtol=1e-5, atol=1e-5)


def test_llama_classifier_gradients_match_transformers(hfs):
    """Names in transformers' order, logits and every parameter's gradient on a batch
    padded on the right and on the left."""
    hf = hfs["LlamaForSequenceClassification"]
    model = M.LlamaForSequenceClassification(M.LlamaSeqClsConfig.from_dict(hf.config.to_dict()))

    def apply(params, ids, mask):
        return model.apply(params, ids, attention_mask=mask)

    pl.testing.assert_matches_torch(
        model, hf, *_inputs("LlamaForSequenceClassification"), apply=apply,
        torch_call=lambda m, ids, mask: m(ids, attention_mask=mask).logits,
        forward_mode=False, atol=5e-5,
    )  # fmt: skip


def test_last_token_pooling_and_refusals():
    from purelayers.models._heads import last_token

    logits = np.arange(2 * 4, dtype=np.float32).reshape(2, 4, 1)
    ids = np.array([[5, 6, 0, 0], [0, 0, 5, 6]])
    np.testing.assert_array_equal(last_token(logits, ids, 0)[:, 0], [1, 7])
    np.testing.assert_array_equal(last_token(logits, ids, None)[:, 0], [3, 7])
    config = M.LlamaSeqClsConfig(**{**LM, "pad_token_id": None})
    model = M.LlamaForSequenceClassification(config)
    params = pl.params.abstract(model, (2, 4))
    with pytest.raises(ValueError, match=r"^LlamaForSequenceClassification: a batch of more"):
        jax.eval_shape(lambda p: model.apply(p, ids), params)
    assert jax.eval_shape(lambda p: model.apply(p, ids[:1]), params).shape == (1, 2)
    with pytest.raises(ValueError, match="config must be a LlamaSeqClsConfig"):
        M.LlamaForSequenceClassification(M.LlamaConfig())
    with pytest.raises(ValueError, match="config must be a ViTConfig"):
        M.ViTForImageClassification(M.LlamaConfig())
    with pytest.raises(ValueError, match="ViTModel: add_pooling_layer must be True or False"):
        M.ViTModel(M.ViTConfig(), add_pooling_layer=1)


def test_distilbert_refusals():
    with pytest.raises(ValueError, match=r"^DistilBertModel: config must be a DistilBertConfig"):
        M.DistilBertModel(M.BertConfig())
    with pytest.raises(ValueError, match=r"^DistilBertConfig: dim must be divisible by n_heads"):
        M.DistilBertConfig(dim=30, n_heads=4)
    with pytest.raises(ValueError, match=r"^DistilBertConfig: pad_token_id must be < vocab_size"):
        M.DistilBertConfig(vocab_size=5, pad_token_id=5)
    bad = dict(n_layers=0, dim=0, activation="bad", dropout=1.5, initializer_range=-1.0)
    bad.update(pad_token_id=-1)
    for field, value in bad.items():
        with pytest.raises(ValueError, match=rf"^DistilBertConfig: {field}"):
            M.DistilBertConfig(**{field: value})
    model = M.DistilBertModel(M.DistilBertConfig(**DISTIL))
    params = pl.params.abstract(model, (1, 4))
    with pytest.raises(pl.layers.LayerError, match=r"DistilBertModel.*input_ids shape"):
        jax.eval_shape(lambda p: model.apply(p, np.zeros((1, 17), np.int32)), params)
    with pytest.raises(pl.layers.LayerError, match=r"DistilBertModel.*attention_mask shape"):
        jax.eval_shape(
            lambda p: model.apply(p, np.zeros((1, 4), np.int32), attention_mask=np.ones((1, 3))),
            params,
        )
