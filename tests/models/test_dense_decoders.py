"""Qwen3, OLMo 2, Gemma 2, Gemma 3 (text) and Qwen2 with sliding-window layers against
transformers: names, logits and gradients on a left-padded batch, cached decoding,
greedy ``generate``, Hugging Face folders both ways, LoRA and sharding rules. Every
parameter of the reference is randomized; windows are shorter than the sequence and a
rope scaling changes the result."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import lora
from purelayers import models as M
from purelayers import sharding as S

VOCAB = 37
TINY = dict(
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    intermediate_size=24,
    vocab_size=VOCAB,
    max_position_embeddings=64,
)
LINEAR = {"rope_type": "linear", "factor": 2.5, "rope_theta": 1000.0}
CASES = {
    "qwen3": (
        "Qwen3",
        dict(attention_bias=True, use_sliding_window=True, sliding_window=3, max_window_layers=1,
             rope_parameters=LINEAR, pad_token_id=5),
    ),
    "olmo2": ("Olmo2", dict(attention_bias=True, rope_parameters=LINEAR, pad_token_id=5)),
    "gemma2": (
        "Gemma2",
        dict(sliding_window=3, attn_logit_softcapping=4.0, final_logit_softcapping=3.0,
             query_pre_attn_scalar=6, rope_parameters=LINEAR, pad_token_id=5),
    ),
    "gemma3_text": (
        "Gemma3Text",
        dict(sliding_window=3, sliding_window_pattern=2, final_logit_softcapping=3.0,
             query_pre_attn_scalar=6, pad_token_id=5,
             rope_parameters={"full_attention": LINEAR,
                              "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}),
    ),
    "qwen2-sliding": (
        "Qwen2",
        dict(use_sliding_window=True, sliding_window=3, max_window_layers=1, pad_token_id=5),
    ),
}  # fmt: skip


def _reference(torch, transformers, case):
    name, overrides = CASES[case]
    config = getattr(transformers, f"{name}Config")(**{**TINY, **overrides})
    cls = getattr(transformers, f"{name.removesuffix('Text')}ForCausalLM")
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = cls(config).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return hf


def _batch():
    """Two rows of 9, the second left-padded by three."""
    ids = np.random.default_rng(0).integers(6, VOCAB, (2, 9))
    mask = np.ones((2, 9), np.int64)
    mask[1, :3] = 0
    ids[1, :3] = 0
    return ids, mask


@pytest.fixture(scope="module", params=list(CASES))
def family(request, torch, transformers, tmp_path_factory):
    """The reference, its folder, and ours loaded from it (one model per family)."""
    hf = _reference(torch, transformers, request.param)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder / "hf")
    model, params = M.from_pretrained(folder / "hf")
    return request.param, hf, model, params, folder


def test_names_logits_and_gradients_match_transformers(torch, family):
    _, hf, model, params, _ = family
    tied = {"lm_head.weight"} if hf.config.tie_word_embeddings else set()
    fresh = model.init(jax.random.key(0), (1, 1))
    assert list(pl.params.flatten(fresh)) == [k for k in hf.state_dict() if k not in tied]
    ids, mask = _batch()
    keep = mask.astype(bool)
    cot = np.random.default_rng(2).standard_normal((*ids.shape, VOCAB)).astype(np.float32)
    cot *= keep[..., None]

    def loss(p):
        logits = model.apply(p, ids, attention_mask=mask)
        return jnp.sum(logits * cot), logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    positions = np.where(keep, np.cumsum(mask, 1) - 1, 0)
    hf.zero_grad()
    out = hf(
        torch.tensor(ids), attention_mask=torch.tensor(mask), position_ids=torch.tensor(positions)
    ).logits
    (out * torch.tensor(cot)).sum().backward()
    np.testing.assert_allclose(np.asarray(logits)[keep], out.detach().numpy()[keep], atol=3e-5)
    ours = pl.params.flatten(grads)
    for name, p in hf.named_parameters():
        np.testing.assert_allclose(
            np.asarray(ours[name]), p.grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=name
        )


def test_cached_decoding_equals_the_full_forward_and_logits_to_keep(family):
    _, _, model, params, _ = family
    ids, mask = _batch()
    full = np.asarray(jax.jit(lambda p: model.apply(p, ids, attention_mask=mask))(params))
    cache = model.init_cache((2, 12))
    slots = np.concatenate([mask, np.ones((2, 3), np.int64)], 1)
    step = jax.jit(lambda p, x, c: model.apply(p, x, attention_mask=slots, cache=c))
    logits, cache = step(params, ids[:, :5], cache)
    got = [logits]
    for t in range(5, 9):
        logits, cache = step(params, ids[:, t : t + 1], cache)
        got.append(logits)
    got = np.concatenate([np.asarray(g) for g in got], 1)
    keep = mask.astype(bool)
    np.testing.assert_allclose(got[keep], full[keep], atol=3e-5)
    last = np.asarray(model.apply(params, ids, attention_mask=mask, logits_to_keep=2))
    np.testing.assert_allclose(last, full[:, -2:], atol=1e-5)


def test_greedy_generate_equals_transformers_and_sampling_runs(torch, family):
    _, hf, model, params, _ = family
    ids, mask = _batch()
    want = hf.generate(
        torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=6,
        do_sample=False, eos_token_id=7, pad_token_id=0,
    ).numpy()  # fmt: skip
    got = M.generate(
        model, params, ids, attention_mask=mask, max_new_tokens=6, eos_token_id=7, pad_token_id=0
    )
    np.testing.assert_array_equal(np.asarray(got), want)
    key = jax.random.key(3)
    drawn = M.generate(
        model, params, ids, attention_mask=mask, max_new_tokens=4, do_sample=True, key=key
    )
    again = M.generate(
        model, params, ids, attention_mask=mask, max_new_tokens=4, do_sample=True, key=key
    )
    np.testing.assert_array_equal(np.asarray(drawn), np.asarray(again))


def test_folders_both_ways(torch, transformers, family):
    """transformers' sharded folder loads here; ours loads in transformers with equal
    logits, and back here to the same model."""
    _, hf, model, params, folder = family
    ids, _ = _batch()
    want = hf(torch.tensor(ids[:1])).logits.detach().numpy()
    np.testing.assert_allclose(np.asarray(model.apply(params, ids[:1])), want, atol=3e-5)
    hf.save_pretrained(folder / "sharded", max_shard_size="20KB")
    assert (folder / "sharded" / "model.safetensors.index.json").is_file()
    again, loaded = M.from_pretrained(folder / "sharded")
    assert again == model
    np.testing.assert_allclose(np.asarray(model.apply(loaded, ids[:1])), want, atol=3e-5)
    M.save_pretrained(folder / "ours", model, params)
    config = json.loads((folder / "ours" / "config.json").read_text())
    assert config["model_type"] == hf.config.model_type
    back = transformers.AutoModelForCausalLM.from_pretrained(folder / "ours").eval()
    assert type(back) is type(hf)
    np.testing.assert_allclose(back(torch.tensor(ids[:1])).logits.detach().numpy(), want, atol=3e-5)
    assert getattr(back.config, "layer_types", None) == getattr(hf.config, "layer_types", None)
    assert M.from_pretrained(folder / "ours")[0] == model


def test_lora_capture_and_sharding_rules(family):
    """LoRA by target names on every projection (outputs unchanged at init), ``capture``
    of a block's attention output, and Llama's sharding rules on a one-device mesh."""
    _, hf, model, params, _ = family
    ids, mask = _batch()
    base = np.asarray(model.apply(params, ids, attention_mask=mask))
    lmodel = lora.wrap(model, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj"], r=2)
    lparams = lora.init(lmodel, jax.random.key(1), params)
    n = hf.config.num_hidden_layers
    assert len(lmodel.target_modules) == 5 * n
    np.testing.assert_allclose(
        np.asarray(lmodel.apply(lparams, ids, attention_mask=mask)), base, atol=1e-5
    )
    probe = pl.capture(model.apply, "model.layers.1.self_attn")
    _, seen = jax.jit(probe)(params, ids, attention_mask=mask)
    assert seen["model.layers.1.self_attn"].shape == (2, 9, 16)
    mesh = S.make_mesh({"model": 1})
    rules = [*S.transformer_block("model.layers.*", axis="model"), ("*", S.P())]
    specs = S.partition_specs(params, rules, mesh)
    assert jax.tree.structure(specs) is not None
    sharded = M.from_pretrained(
        _folder(family), shardings=lambda m: S.named_shardings(
            pl.params.abstract(m, m.example_shape()), rules, mesh)
    )[1]  # fmt: skip
    np.testing.assert_allclose(
        np.asarray(model.apply(sharded, ids, attention_mask=mask)), base, atol=1e-6
    )


def _folder(family):
    return family[4] / "hf"
