"""ModernBERT against transformers': a tiny three-layer encoder (one global layer, two
local ones whose window of 4 is shorter than the 9-token batch), every parameter
randomized, norms and biases included, on a batch padded on the right (row 0) and on
the left (row 1). Names equal transformers' ``state_dict`` keys in order; logits and
every parameter's gradient; folders both ways (``from_pretrained`` picking the class
from ``architectures``) and a layer's output by ``capture``; a LoRA adapter on
``Wqkv``, ``Wo`` and ``Wi`` loading in PEFT; old-style config keys; the refusals."""

from __future__ import annotations

import copy
import warnings

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

import purelayers as pl
from purelayers import lora
from purelayers import models as M
from purelayers.layers import LayerError

TOL = dict(rtol=1e-5, atol=2e-5)
TINY = dict(
    vocab_size=99, hidden_size=32, intermediate_size=24, num_hidden_layers=3,
    num_attention_heads=4, local_attention=4, max_position_embeddings=64, pad_token_id=0,
    bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, num_labels=3,
)  # fmt: skip
# "mean": mean pooling and every optional bias; "cls": transformers' defaults (no biases)
VARIANTS = {
    "mean": dict(classifier_pooling="mean", norm_bias=True, attention_bias=True,
                 mlp_bias=True, classifier_bias=True, classifier_activation="silu"),
    "cls": dict(classifier_pooling="cls"),
}  # fmt: skip


def _randomized(torch, module, seed):
    """``module`` with every parameter drawn from ``N(0, 0.5^2)`` (the rotary buffers
    kept), in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in module.parameters():
            t.copy_(torch.randn(t.shape, generator=gen) * 0.5)
    return module.eval()


@pytest.fixture(scope="module")
def hfs(torch, transformers):
    out = {}
    for seed, (name, extra) in enumerate(VARIANTS.items()):
        config = transformers.ModernBertConfig(**TINY, **extra)
        model = transformers.ModernBertForSequenceClassification(config)
        out[name] = _randomized(torch, model, seed)
    return out


def _batch():
    ids = np.random.default_rng(0).integers(3, TINY["vocab_size"], (2, 9))
    mask = np.ones((2, 9), np.int64)
    mask[0, 6:] = 0
    mask[1, :4] = 0
    ids[mask == 0] = 0
    return ids, mask


def _theirs(torch, hf):
    ids, mask = (torch.from_numpy(a) for a in _batch())
    with torch.no_grad():
        out = hf(ids, attention_mask=mask)
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()


def _ours(model, params):
    fn = jax.jit(lambda p, ids, mask: model.apply(p, ids, attention_mask=mask))
    return np.asarray(fn(params, *_batch()))


def test_names_logits_and_gradients_match_transformers(hfs):
    """Mean pooling, every bias: names in transformers' order, logits and every
    parameter's gradient (one jitted program)."""
    hf = hfs["mean"]
    model = M.ModernBertForSequenceClassification(M.ModernBertConfig.from_dict(hf.config.to_dict()))
    assert model.config.types() == ("full_attention", "sliding_attention", "sliding_attention")
    names = list(pl.params.flatten(model.ordered(pl.params.abstract(model, (2, 9)))))
    assert names == list(hf.state_dict())
    assert "model.layers.0.attn_norm.weight" not in names  # layer 0's is the identity
    pl.testing.assert_matches_torch(
        model, hf, *_batch(),
        apply=lambda p, ids, mask: model.apply(p, ids, attention_mask=mask),
        torch_call=lambda m, ids, mask: m(ids, attention_mask=mask).logits,
        forward_mode=False, rtol=1e-4, atol=1e-4,
    )  # fmt: skip


def test_folders_both_ways(torch, transformers, hfs, tmp_path):
    """transformers' classifier and base-model folders load as our classes with its
    outputs (the left-padded row's position 0 is padding whose local window holds only
    padding: zeros from its attention, as transformers' sdpa); our classifier folder
    loads in transformers' ``AutoModelForSequenceClassification`` with nothing missing
    or extra and the same logits."""
    hf = hfs["cls"]
    hf.save_pretrained(tmp_path / "theirs")
    hf.model.save_pretrained(tmp_path / "base")
    with warnings.catch_warnings():
        warnings.simplefilter("error", pl.params.CheckpointWarning)
        model, params = M.from_pretrained(tmp_path / "theirs")
        base, base_params = M.from_pretrained(tmp_path / "base")
    assert type(model) is M.ModernBertForSequenceClassification
    assert type(base) is M.ModernBertModel
    assert model.peft_task_type == "SEQ_CLS" and model.config.num_labels == 3
    written = load_file(tmp_path / "theirs" / "model.safetensors")
    assert list(pl.params.flatten(params)) == list(hf.state_dict())
    assert set(pl.params.flatten(params)) == set(written)
    want = _theirs(torch, hf)
    np.testing.assert_allclose(_ours(model, params), want, **TOL)
    # the base model with layer 1's output captured: transformers' hidden_states[2]
    probe = pl.capture(lambda p, ids, mask: base.apply(p, ids, attention_mask=mask), "layers.1")
    last, seen = jax.jit(probe)(base_params, *_batch())
    with torch.no_grad():
        out = hf.model(*(torch.from_numpy(a) for a in _batch()), output_hidden_states=True)
    np.testing.assert_allclose(np.asarray(last), out.last_hidden_state.numpy(), **TOL)
    np.testing.assert_allclose(np.asarray(seen["layers.1"]), out.hidden_states[2].numpy(), **TOL)

    M.save_pretrained(tmp_path / "ours", model, params)
    loaded, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert type(loaded).__name__ == "ModernBertForSequenceClassification"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert loaded.config.layer_types == hf.config.layer_types
    assert loaded.config.rope_parameters == hf.config.rope_parameters
    np.testing.assert_allclose(_theirs(torch, loaded.eval()), want, **TOL)


def test_a_head_the_library_lacks_loads_the_base_model_naming_what_it_left_out(
    transformers, tmp_path
):
    """A ``ModernBertForMaskedLM`` folder: ``ModernBertModel``, the encoder's arrays
    as the file's, and a ``CheckpointWarning`` naming the head's arrays left out."""
    config = transformers.ModernBertConfig(**TINY)
    transformers.ModernBertForMaskedLM(config).save_pretrained(tmp_path)
    with pytest.warns(pl.params.CheckpointWarning, match=r"ModernBertForMaskedLM is not in"):
        model, params = M.from_pretrained(tmp_path)
    assert type(model) is M.ModernBertModel
    written = load_file(tmp_path / "model.safetensors")
    flat = pl.params.flatten(params)
    np.testing.assert_array_equal(
        flat["layers.1.attn.Wqkv.weight"], written["model.layers.1.attn.Wqkv.weight"]
    )
    assert {"model." + n for n in flat} == {n for n in written if n.startswith("model.")}


def test_lora_on_wqkv_wo_wi_loads_in_peft(torch, peft, hfs, tmp_path):
    """An adapter on every attention and MLP Linear (``Wqkv``, both ``Wo``\\ s, ``Wi``),
    saved by us with the classifier as PEFT's ``modules_to_save``, gives our logits in
    PEFT."""
    hf = hfs["cls"]
    hf.save_pretrained(tmp_path / "base")
    model, params = M.from_pretrained(tmp_path / "base")
    lmodel = lora.wrap(model, ["Wqkv", "Wo", "Wi"], r=2, lora_alpha=4)
    lparams = lora.init(lmodel, jax.random.key(0), params)
    flat = pl.params.flatten(lparams)
    adapted = sorted({n.split(".lora_A")[0] for n in flat if ".lora_A" in n})
    assert len(adapted) == 3 * 4 and "model.layers.2.mlp.Wi" in adapted
    rng = np.random.default_rng(1)
    for n, v in flat.items():
        if ".lora_" in n or n.startswith("classifier."):
            flat[n] = (rng.normal(size=v.shape) * 0.3).astype(np.float32)
    lparams = pl.params.unflatten(flat)
    expected = _ours(lmodel, lparams)
    assert not np.allclose(expected, _theirs(torch, hf), atol=1e-2)
    folder = lora.save_adapter(tmp_path / "adapter", lmodel, lparams)
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(hf), folder).eval()
    np.testing.assert_allclose(_theirs(torch, theirs), expected, rtol=1e-4, atol=1e-4)


def test_old_config_keys_read_as_transformers_reads_them(transformers):
    old = dict(TINY, num_hidden_layers=4, global_attn_every_n_layers=2)
    old.update(global_rope_theta=1000.0, local_rope_theta=500.0)
    theirs = transformers.ModernBertConfig(**old)
    ours = M.ModernBertConfig.from_dict(old)
    assert list(ours.types()) == theirs.layer_types
    for t in ("full_attention", "sliding_attention"):
        assert ours.rope_theta(t) == theirs.rope_parameters[t]["rope_theta"]
    again = M.ModernBertConfig.from_dict(theirs.to_dict())
    assert again.types() == ours.types() and again.rope_theta("sliding_attention") == 500.0


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (dict(classifier_pooling="max"), r"^ModernBertConfig: classifier_pooling"),
        (dict(hidden_activation="gelu_accurate"), r"^ModernBertConfig: hidden_activation"),
        (dict(classifier_activation="nope"), r"^ModernBertConfig: classifier_activation"),
        (dict(rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 2.0}}),
         r"rope_parameters\['full_attention'\]\['rope_type'\] must be 'default'"),
        (dict(rope_parameters={"global": {}}), r"rope_parameters must be keyed by layer type"),
        (dict(layer_types=("full_attention",)), r"layer_types must list num_hidden_layers=3"),
        (dict(hidden_size=30), r"hidden_size must be divisible by num_attention_heads=4"),
        (dict(pad_token_id=99), r"pad_token_id must be < vocab_size=99"),
        (dict(norm_eps=0.0), r"^ModernBertConfig: norm_eps"),
        (dict(num_hidden_layers=0), r"^ModernBertConfig: num_hidden_layers"),
        (dict(hidden_size=12), r"the rotary head_dim\) must be even, got 3"),
        (dict(mlp_dropout=1.5), r"^ModernBertConfig: mlp_dropout"),
        (dict(classifier_dropout=-0.1), r"^ModernBertConfig: classifier_dropout"),
        (dict(initializer_range=-1.0), r"^ModernBertConfig: initializer_range"),
        (dict(local_rope_theta=0.0), r"^ModernBertConfig: local_rope_theta"),
        (dict(pad_token_id=-1), r"^ModernBertConfig: pad_token_id"),
        (dict(rope_parameters={"sliding_attention": {"rope_theta": -5.0}}),
         r"rope_parameters\['sliding_attention'\]\['rope_theta'\]"),
    ],
)  # fmt: skip
def test_config_refusals(settings, match):
    with pytest.raises(ValueError, match=match):
        M.ModernBertConfig.from_dict({**TINY, **settings})


def test_model_refusals():
    with pytest.raises(ValueError, match=r"^ModernBertModel: config must be a ModernBertConfig"):
        M.ModernBertModel(M.BertConfig())
    model = M.ModernBertModel(M.ModernBertConfig.from_dict(TINY))
    params = pl.params.abstract(model, (1, 4))
    with pytest.raises(LayerError, match=r"ModernBertModel.*input_ids shape"):
        jax.eval_shape(lambda p: model.apply(p, np.zeros((4,), np.int32)), params)
    with pytest.raises(LayerError, match=r"ModernBertModel.*attention_mask shape"):
        jax.eval_shape(
            lambda p: model.apply(p, np.zeros((1, 4), np.int32), attention_mask=np.ones((1, 3))),
            params,
        )
