"""LoRA on a classifier: ``lora.wrap``'s ``modules_to_save`` (the head trains in full),
``save_adapter`` writing the head as PEFT's ``modules_to_save`` do, and adapter folders
both ways between us and PEFT on a tiny ``BertForSequenceClassification`` whose every
parameter is randomized."""

from __future__ import annotations

import copy
import json

import jax
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L
from purelayers import lora
from purelayers import models as M

TOL = dict(rtol=1e-4, atol=1e-4)
TINY = dict(
    vocab_size=50,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=24,
    max_position_embeddings=16,
)
TARGETS = ["query", "value"]


@pytest.fixture(scope="module")
def bert(torch, transformers, tmp_path_factory):
    """transformers' tiny classifier (three labels, every parameter randomized), its
    folder, and ours loaded from it."""
    from tests.twins import randomize

    config = transformers.BertConfig(**TINY, num_labels=3, attn_implementation="eager")
    base = randomize(torch, transformers.BertForSequenceClassification(config), seed=3).eval()
    folder = tmp_path_factory.mktemp("bert-cls")
    base.save_pretrained(folder)
    model, params = M.from_pretrained(folder)
    assert isinstance(model, M.BertForSequenceClassification)
    return base, folder, model, params


def _batch():
    ids = np.random.default_rng(0).integers(1, TINY["vocab_size"], (2, 7))
    mask = np.ones((2, 7), np.int64)
    mask[1, 5:] = 0
    return ids, mask


def _theirs(torch, module):
    ids, mask = _batch()
    with torch.no_grad():
        return module(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


def _ours(lmodel, params):
    ids, mask = _batch()
    return np.asarray(lmodel.apply(params, ids, attention_mask=mask))


def _trained_looking(params, prefixes, seed=1):
    """``params`` with every leaf under one of ``prefixes`` (or an adapter) redrawn."""
    flat = pl.params.flatten(params)
    rng = np.random.default_rng(seed)
    for name, v in flat.items():
        if ".lora_" in name or name.startswith(prefixes):
            flat[name] = (rng.normal(size=v.shape) * 0.3).astype(np.float32)
    return pl.params.unflatten(flat)


def test_head_trains_in_full_and_our_adapter_loads_in_peft(torch, peft, bert, tmp_path):
    base, base_folder, model, base_params = bert
    # the base model's logits first: its params check caches by equality, and the rewired
    # copy inside the wrapped model compares equal to it
    plain = _ours(model, base_params)
    lmodel = lora.wrap(model, TARGETS, r=4, lora_alpha=8, modules_to_save=("classifier",))
    assert lmodel.modules_to_save == ("classifier",)
    # PEFT's SEQ_CLS model adds the head by itself: so does wrap, given nothing
    assert lora.wrap(model, TARGETS, r=4, lora_alpha=8).modules_to_save == ("classifier",)
    params = lora.init(lmodel, jax.random.key(0), base_params)
    params = _trained_looking(params, ("classifier.",))
    mask = pl.params.flatten(lora.trainable(params, lmodel))
    assert {n for n, t in mask.items() if t} == {
        n for n in mask if ".lora_" in n or n.startswith("classifier.")
    }
    assert not any(t for n, t in pl.params.flatten(lora.trainable(params)).items() if "cls" in n)

    folder = lora.save_adapter(tmp_path / "ours", lmodel, params)
    saved = pl.params.load(folder / "adapter_model.safetensors")
    flat = pl.params.flatten(params)
    wanted = [n for n in flat if ".lora_" in n] + ["classifier.weight", "classifier.bias"]
    assert sorted(saved) == sorted("base_model.model." + n for n in wanted)
    np.testing.assert_array_equal(
        saved["base_model.model.classifier.weight"], flat["classifier.weight"]
    )
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["modules_to_save"] == ["classifier"]
    assert config["task_type"] == "SEQ_CLS"
    assert config["base_model_name_or_path"] == str(base_folder)

    expected = _ours(lmodel, params)
    assert not np.allclose(expected, plain, atol=1e-2)
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(base), folder).eval()
    np.testing.assert_allclose(_theirs(torch, theirs), expected, **TOL)
    auto = peft.AutoPeftModelForSequenceClassification.from_pretrained(folder).eval()
    np.testing.assert_allclose(_theirs(torch, auto), expected, **TOL)
    # and back into ours
    loaded = lora.load_adapter(folder, lmodel, base_params)
    np.testing.assert_allclose(_ours(lmodel, loaded), expected, **TOL)


def test_peft_adapter_with_its_modules_to_save_loads_into_ours(torch, peft, bert, tmp_path):
    base, _, model, base_params = bert
    config = peft.LoraConfig(task_type="SEQ_CLS", target_modules=TARGETS, r=4, lora_alpha=8)
    theirs = peft.get_peft_model(copy.deepcopy(base), config)
    in_memory = set(theirs.state_dict())
    assert "base_model.model.classifier.modules_to_save.default.weight" in in_memory
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    theirs.save_pretrained(tmp_path / "peft")
    saved = pl.params.load(tmp_path / "peft" / "adapter_model.safetensors")
    assert "base_model.model.classifier.weight" in saved  # the base name, not the wrapper's
    written = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert written["modules_to_save"] == ["classifier", "score"]

    lmodel = lora.wrap(model, TARGETS, r=4, lora_alpha=8)
    loaded = lora.load_adapter(tmp_path / "peft", lmodel, base_params)
    expected = _theirs(torch, theirs.eval())
    assert not np.allclose(expected, _theirs(torch, base), atol=1e-2)
    np.testing.assert_allclose(_ours(lmodel, loaded), expected, **TOL)
    np.testing.assert_array_equal(
        pl.params.flatten(loaded)["classifier.weight"],
        theirs.base_model.model.classifier.modules_to_save["default"].weight.detach().numpy(),
    )


def test_task_heads_and_all_linear():
    config = M.BertConfig(**TINY)
    qa = lora.wrap(M.BertForQuestionAnswering(config), TARGETS)
    assert qa.modules_to_save == ("qa_outputs",)
    tokens = lora.wrap(M.BertForTokenClassification(config), TARGETS)
    assert tokens.modules_to_save == ("classifier",)
    seq = M.BertForSequenceClassification(config)
    both = lora.wrap(seq, TARGETS, modules_to_save=["pooler"])
    assert both.modules_to_save == ("bert.pooler", "classifier")
    # PEFT leaves the modules to save out of "all-linear"'s targets
    every = lora.wrap(seq, "all-linear")
    assert "classifier" not in every.target_modules
    assert "bert.pooler.dense" in every.target_modules
    assert lora.wrap(M.BertModel(config), TARGETS).modules_to_save == ()


def test_modules_to_save_bad_input():
    config = M.BertConfig(**TINY)
    seq = M.BertForSequenceClassification(config)
    with pytest.raises(ValueError, match=r"lora.wrap: modules_to_save must be a name or a non"):
        lora.wrap(seq, TARGETS, modules_to_save=5)
    with pytest.raises(ValueError, match=r"modules_to_save \['nope'\] match no module of Bert"):
        lora.wrap(seq, TARGETS, modules_to_save=["classifier", "nope"])
    with pytest.raises(ValueError, match=r"'bert.encoder.layer.0.attention.self.query' lies in"):
        lora.wrap(seq, TARGETS, modules_to_save="bert.encoder")
    with pytest.raises(ValueError, match=r"target 'classifier' lies in 'classifier'"):
        lora.wrap(seq, ["classifier"])
    mlm = M.BertForMaskedLM(config)
    with pytest.raises(ValueError, match=r"'cls.predictions.decoder.weight' is tied to 'bert"):
        lora.wrap(mlm, TARGETS, modules_to_save="cls.predictions.decoder")
    stacked = L.Sequential({"blocks": L.Repeat(L.Sequential({"fc": L.Linear(4)}), 2)})
    with pytest.raises(ValueError, match=r"selects 'blocks.0.fc', inside a Repeat"):
        lora.wrap(stacked, ["fc"], modules_to_save="blocks.0.fc")
    with pytest.raises(ValueError, match=r"lora.trainable: lmodel must be the layer lora.wrap"):
        lora.trainable({}, seq)
