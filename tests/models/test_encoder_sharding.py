"""Encoders under ``pl.sharding`` and ``pl.capture``: ``S.transformers_layers`` splits
BertForSequenceClassification's, T5's and CLIP's attention and MLP projections over a
``model`` axis (column-parallel in, row-parallel out, everything else replicated), a
jitted apply on params placed by those rules (on a one-device mesh) gives
transformers' outputs, and ``capture`` of a BERT and a T5 encoder layer gives
transformers' ``output_hidden_states`` entry for it. Every reference parameter is
randomized; one jitted program per model."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import purelayers as pl
import purelayers.sharding as S
from purelayers import models as M
from tests.twins import randomize

MESH = S.make_mesh({"model": 1})
RULES = [*S.transformers_layers("model"), ("*", S.P())]
COLUMN, ROW = S.P("model"), S.P(None, "model")
IDS = np.array([[5, 17, 33, 8, 41, 9, 2], [7, 12, 40, 3, 0, 0, 0]])
MASK = (IDS != 0).astype(np.int64)
PIXELS = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
# where each family's rules must split: name suffix -> spec (the rest replicated)
SPLIT = {
    "bert": {
        "attention.self.query.weight": COLUMN, "attention.self.key.bias": S.P("model"),
        "attention.self.value.weight": COLUMN, "attention.output.dense.weight": ROW,
        "intermediate.dense.weight": COLUMN, "layer.1.output.dense.weight": ROW,
    },
    "t5": {
        "SelfAttention.q.weight": COLUMN, "SelfAttention.k.weight": COLUMN,
        "SelfAttention.v.weight": COLUMN, "SelfAttention.o.weight": ROW,
        "EncDecAttention.q.weight": COLUMN, "EncDecAttention.o.weight": ROW,
        "DenseReluDense.wi.weight": COLUMN, "DenseReluDense.wo.weight": ROW,
    },
    "clip": {
        "self_attn.q_proj.weight": COLUMN, "self_attn.v_proj.bias": S.P("model"),
        "self_attn.out_proj.weight": ROW, "mlp.fc1.weight": COLUMN, "mlp.fc2.weight": ROW,
    },
}  # fmt: skip
# what must stay replicated: embeddings, norms, position tables, poolers, heads
REPLICATED = ("embed", "shared", "norm", "LayerNorm", "position", "relative_attention_bias",
              "pooler", "classifier", "lm_head", "projection", "logit_scale")  # fmt: skip


def _hf(torch, transformers, family):
    if family == "bert":
        config = transformers.BertConfig(
            vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=24, max_position_embeddings=16, num_labels=3,
        )  # fmt: skip
        cls = transformers.BertForSequenceClassification
    elif family == "t5":
        config = transformers.T5Config(
            vocab_size=50, d_model=16, d_kv=8, d_ff=24, num_layers=2, num_heads=2,
            relative_attention_num_buckets=8, relative_attention_max_distance=12,
            decoder_start_token_id=0,
        )  # fmt: skip
        cls = transformers.T5ForConditionalGeneration
    else:
        tower = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2)
        config = transformers.CLIPConfig(
            text_config=dict(tower, intermediate_size=24, vocab_size=50,
                             max_position_embeddings=12, eos_token_id=2, pad_token_id=0),
            vision_config=dict(tower, intermediate_size=24, image_size=16, patch_size=8),
            projection_dim=8,
        )  # fmt: skip
        cls = transformers.CLIPModel
    config._attn_implementation = "eager"
    hf = randomize(torch, cls(config), seed=5).eval()
    if family == "t5":
        with torch.no_grad():  # unscaled T5 scores stay well-conditioned
            for p in hf.parameters():
                p.mul_(0.5)
    return hf


def _theirs(torch, hf, family):
    """transformers' outputs and, for BERT and T5, the hidden state our capture gives."""
    ids, mask = torch.from_numpy(IDS), torch.from_numpy(MASK)
    with torch.no_grad():
        if family == "bert":
            out = hf(ids, attention_mask=mask, output_hidden_states=True)
            return out.logits.numpy(), out.hidden_states[2].numpy()  # layer 1's output
        if family == "t5":
            out = hf(ids, attention_mask=mask, decoder_input_ids=ids[:, :4],
                     output_hidden_states=True)  # fmt: skip
            return out.logits.numpy(), out.encoder_hidden_states[1].numpy()  # block 0's
        out = hf(input_ids=ids, pixel_values=torch.from_numpy(PIXELS), attention_mask=mask)
        return out.logits_per_image.numpy(), None


def _unstacked(spec, ndim):
    """``spec`` of an array of ``ndim`` axes per block, without a stacked block axis
    (kept whole: a leading ``None``) and its trailing ``None`` entries: ``P("model", None)``
    reads ``("model",)``, a replicated array ``()``."""
    entries = list(spec)
    extra = max(len(entries) - ndim, 0)
    assert all(e is None for e in entries[:extra])
    entries = entries[extra:]
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


@pytest.mark.parametrize("family", list(SPLIT))
def test_rules_place_encoder_params_and_capture_layers(torch, transformers, family):
    hf = _hf(torch, transformers, family)
    cls = type(hf).__name__
    model = getattr(M, cls)(getattr(M, cls).config_class.from_dict(hf.config.to_dict()))
    template = pl.params.abstract(model, model.example_shape())
    theirs = {k: v.detach() for k, v in hf.state_dict().items()}
    params = model.ordered(pl.params.load_state_dict(template, theirs, model=model))

    # a Repeat's stacked blocks (BERT's) keep their leading block axis whole
    flat = pl.params.flatten(params)
    found = pl.params.flatten(S.partition_specs(params, RULES, MESH))
    specs = {n: _unstacked(s, np.ndim(flat[n])) for n, s in found.items()}
    for suffix, spec in SPLIT[family].items():
        found = [n for n in specs if n.endswith(suffix)]
        assert found and all(specs[n] == tuple(spec) for n in found), (suffix, found)
    for name, spec in specs.items():  # embeddings, norms, heads, poolers: replicated
        if any(part in name for part in REPLICATED):
            assert spec == (), name
    shardings = S.named_shardings(params, RULES, MESH)
    placed = jax.device_put(params, shardings)
    assert all(jax.tree.leaves(jax.tree.map(lambda a, s: a.sharding == s, placed, shardings)))

    if family == "bert":
        apply, layer = (lambda p: model.apply(p, IDS, attention_mask=MASK)), "bert.encoder.layer.1"
    elif family == "t5":

        def apply(p):
            return model.apply(p, IDS, attention_mask=MASK, decoder_input_ids=IDS[:, :4])

        layer = "encoder.block.0"
    else:
        apply, layer = (lambda p: model.apply(p, IDS, PIXELS, attention_mask=MASK)[0]), None
    want, hidden = _theirs(torch, hf, family)
    if layer is None:
        got = jax.jit(apply)(placed)
    else:
        got, seen = jax.jit(pl.capture(apply, layer))(placed)
        assert list(seen) == [layer]
        np.testing.assert_allclose(np.asarray(seen[layer]), hidden, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=2e-5)


def test_rules_split_modernbert_and_distilbert_projections():
    """The fused and the plain names of the other encoders, on abstract params (no
    compile): every weight of an attention or MLP projection split, the rest whole."""
    modern = M.ModernBertForSequenceClassification(M.ModernBertConfig(
        vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=2, pad_token_id=0, attention_bias=True,
    ))  # fmt: skip
    distil = M.DistilBertForSequenceClassification(
        M.DistilBertConfig(vocab_size=50, dim=16, hidden_dim=24, n_layers=2, n_heads=2)
    )
    want = {  # column-parallel modules, row-parallel ones, Linears per layer
        modern: ({"Wqkv", "Wi"}, {"Wo"}, 4),
        distil: ({"q_lin", "k_lin", "v_lin", "lin1"}, {"out_lin", "lin2"}, 6),
    }
    for model, (column, row, per_layer) in want.items():
        params = pl.params.abstract(model, (1, 1))
        flat = pl.params.flatten(params)
        found = pl.params.flatten(S.partition_specs(params, RULES, MESH))
        for name, spec in found.items():
            module, leaf = name.split(".")[-2:]
            got = _unstacked(spec, len(flat[name].shape))
            if module in column:
                assert got == (tuple(COLUMN) if leaf == "weight" else ("model",)), name
            elif module in row and leaf == "weight":
                assert got == tuple(ROW), name
            else:  # embeddings, norms, the row-parallel biases, the classifier
                assert got == (), name
        projections = [n for n in found if n.split(".")[-2] in column | row]
        assert sum(n.endswith(".weight") for n in projections) == 2 * per_layer
