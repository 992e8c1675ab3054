"""Phi-3 (``M.Phi3ForCausalLM``) against transformers: names, logits and gradients on a
left-padded batch with LongRoPE (partial rotary, short and long factors) and with a
sliding window, cached decoding, ``generate``, Hugging Face folders both ways, the v4
``su`` rope config, LoRA on the fused projections, ``capture`` and sharding rules.
Every parameter of the reference is randomized."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import models as M
from purelayers.models import phi3

VOCAB = 37
TINY = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=24,
    vocab_size=VOCAB,
    max_position_embeddings=64,
)
# rotary on half of each 8-wide head: 4 features, 2 frequencies; the batch (9 tokens)
# reaches past original_max_position_embeddings=4, so the long factors are used
LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 1000.0,
    "short_factor": [1.0, 1.7],
    "long_factor": [3.0, 11.0],
    "partial_rotary_factor": 0.5,
}
CASES = {
    "longrope-partial": dict(rope_parameters=LONGROPE, original_max_position_embeddings=4),
    "window-tied": dict(sliding_window=3, tie_word_embeddings=True),
}


def _batch():
    """Two rows of 9, the second left-padded by three."""
    ids = np.random.default_rng(0).integers(6, VOCAB, (2, 9))
    mask = np.ones((2, 9), np.int64)
    mask[1, :3] = 0
    ids[1, :3] = 0
    return ids, mask


PAD = int(_batch()[0][0, 4])  # a token of an unmasked position: its embedding row pads
IDS = dict(pad_token_id=PAD, eos_token_id=2, bos_token_id=1)


@pytest.fixture(scope="module")
def made(torch, transformers):
    """``{case: (transformers model, our model, params)}``, built once."""
    out = {}
    for name, overrides in CASES.items():
        config = transformers.Phi3Config(**TINY, **overrides, **IDS)
        config._attn_implementation = "eager"
        torch.manual_seed(0)
        hf = transformers.Phi3ForCausalLM(config).eval()
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in hf.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        model = M.Phi3ForCausalLM(M.Phi3Config.from_dict(hf.config.to_dict()))
        params = pl.params.load_state_dict(
            pl.params.abstract(model, (1, 1)), hf.state_dict(), model=model
        )
        out[name] = hf, model, params
    return out


@pytest.mark.parametrize("case", CASES)
def test_names_logits_and_gradients_match_transformers(torch, made, case):
    hf, model, params = made[case]
    tied = {"lm_head.weight"} if hf.config.tie_word_embeddings else set()
    fresh = model.init(jax.random.key(0), (1, 1))
    assert list(pl.params.flatten(fresh)) == [k for k in hf.state_dict() if k not in tied]
    assert not np.asarray(pl.params.flatten(fresh)["model.embed_tokens.weight"][PAD]).any()
    ids, mask = _batch()
    keep = mask.astype(bool)
    cot = np.random.default_rng(2).standard_normal((*ids.shape, VOCAB)).astype(np.float32)
    cot *= keep[..., None]

    def loss(p):
        logits = model.apply(p, ids, attention_mask=mask)
        return jnp.sum(logits * cot), logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    positions = np.where(keep, np.cumsum(mask, 1) - 1, 0)
    out = hf(
        torch.tensor(ids), attention_mask=torch.tensor(mask), position_ids=torch.tensor(positions)
    ).logits
    (out * torch.tensor(cot)).sum().backward()
    np.testing.assert_allclose(np.asarray(logits)[keep], out.detach().numpy()[keep], atol=2e-5)
    ours = pl.params.flatten(grads)
    for name, p in hf.named_parameters():
        np.testing.assert_allclose(
            np.asarray(ours[name]), p.grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=name
        )
    hf.zero_grad()


def test_longrope_short_and_long_factors_by_length(torch, made):
    """Within ``original_max_position_embeddings`` (4 tokens) the short factors, past it
    the long ones, with the attention factor ``sqrt(1 + ln(64 / 4) / ln 4)``: equal to
    transformers at both lengths, and the long factors change the logits of the
    first four positions."""
    hf, model, params = made["longrope-partial"]
    rope = model.config.rope()
    assert isinstance(rope, phi3.LongRopeRotaryEmbedding)
    assert rope.attention_factor == pytest.approx(np.sqrt(1 + np.log(16) / np.log(4)))
    ids = _batch()[0][:1]
    run = jax.jit(model.apply)
    short, long = np.asarray(run(params, ids[:, :4])), np.asarray(run(params, ids))
    for got, n in ((short, 4), (long, 9)):
        want = hf(torch.tensor(ids[:, :n])).logits.detach().numpy()
        np.testing.assert_allclose(got, want, atol=2e-5)
    assert np.abs(long[:, :4] - short).max() > 1e-2


@pytest.mark.parametrize("case", CASES)
def test_cached_decoding_equals_the_full_forward(made, case):
    """A prompt of 6 prefilled into the cache (already past the LongRoPE switch), then
    one token at a time: the logits of the whole left-padded sequence at once."""
    _, model, params = made[case]
    ids, mask = _batch()
    full = jax.jit(lambda p: model.apply(p, ids, attention_mask=mask))(params)
    cache = model.init_cache((2, 12))
    slots = np.concatenate([mask, np.ones((2, 3), np.int64)], 1)
    step = jax.jit(lambda p, x, c: model.apply(p, x, attention_mask=slots, cache=c))
    logits, cache = step(params, ids[:, :6], cache)
    got = [logits]
    for t in range(6, 9):
        logits, cache = step(params, ids[:, t : t + 1], cache)
        got.append(logits)
    got = np.concatenate([np.asarray(g) for g in got], 1)
    keep = mask.astype(bool)
    np.testing.assert_allclose(got[keep], np.asarray(full)[keep], atol=2e-5)
    kept = np.asarray(model.apply(params, ids, attention_mask=mask, logits_to_keep=2))
    np.testing.assert_allclose(kept, np.asarray(full)[:, -2:], atol=1e-6)


@pytest.mark.parametrize("case", CASES)
def test_greedy_generate_equals_transformers_and_sampling_runs(torch, made, case):
    hf, model, params = made[case]
    ids, mask = _batch()
    want = hf.generate(
        torch.tensor(ids),
        attention_mask=torch.tensor(mask),
        max_new_tokens=6,
        do_sample=False,
        eos_token_id=7,
        pad_token_id=0,
    ).numpy()
    run = dict(attention_mask=mask, max_new_tokens=6, eos_token_id=7, pad_token_id=0)
    got = M.generate(model, params, ids, **run)
    np.testing.assert_array_equal(np.asarray(got), want)
    # top_k=1 samples the greedy tokens; a sampled run is reproducible from its key
    key = jax.random.key(3)
    top1 = M.generate(model, params, ids, do_sample=True, key=key, top_k=1, **run)
    np.testing.assert_array_equal(np.asarray(top1), want)
    drawn = M.generate(model, params, ids, do_sample=True, key=key, temperature=2.0, **run)
    again = M.generate(model, params, ids, do_sample=True, key=key, temperature=2.0, **run)
    np.testing.assert_array_equal(np.asarray(drawn), np.asarray(again))


def test_hugging_face_folders_both_ways(torch, transformers, made, tmp_path):
    """transformers' folder loads with ours (remembering the folder; onto a mesh too),
    ours loads with transformers', logits equal; the config round-trips."""
    hf, model, _params = made["longrope-partial"]
    hf.save_pretrained(tmp_path / "hf")
    ids = _batch()[0][:1]
    want = hf(torch.tensor(ids)).logits.detach().numpy()
    loaded, got = M.from_pretrained(tmp_path / "hf")
    assert loaded.config == model.config and isinstance(loaded, M.Phi3ForCausalLM)
    assert M.name_or_path(loaded) == str(tmp_path / "hf") and M.name_or_path(model) is None
    np.testing.assert_allclose(np.asarray(loaded.apply(got, ids)), want, atol=2e-5)
    M.save_pretrained(tmp_path / "ours", loaded, got)
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["model_type"] == "phi3" and "attention_bias" not in written
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval()
    assert type(back).__name__ == "Phi3ForCausalLM"
    np.testing.assert_allclose(back(torch.tensor(ids)).logits.detach().numpy(), want, atol=2e-5)
    assert M.from_pretrained(tmp_path / "ours")[0] == loaded
    # onto a mesh with the attention rules (qkv_proj split by rows): the same values
    import purelayers.sharding as S

    mesh = S.make_mesh("model=1")
    rules = [*S.attention("model.layers.*.self_attn"), ("*", S.P())]
    _, placed = M.from_pretrained(
        tmp_path / "hf",
        shardings=lambda m: S.named_shardings(pl.params.abstract(m, (1, 1)), rules, mesh),
    )
    qkv = placed["model"]["layers"]["self_attn"]["qkv_proj"]["weight"]
    assert isinstance(qkv.sharding, S.NamedSharding) and qkv.sharding.spec == S.P(
        None, "model", None
    )
    for name, a in pl.params.flatten(placed).items():
        np.testing.assert_array_equal(np.asarray(a), np.asarray(pl.params.flatten(got)[name]))


def test_a_v4_su_config_reads_as_transformers_reads_it(torch, transformers, made):
    """Phi-3's older config.json: ``rope_scaling`` of type ``su``, ``rope_theta`` and
    ``partial_rotary_factor`` at the top level; transformers reads it as ``longrope``,
    and so do we (the same rope as the v5 form)."""
    _hf, model, _params = made["longrope-partial"]
    old = {**TINY, **IDS, "model_type": "phi3", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}
    old["rope_scaling"] = {
        "type": "su",
        "short_factor": LONGROPE["short_factor"],
        "long_factor": LONGROPE["long_factor"],
        "original_max_position_embeddings": 4,  # transformers 5 needs it here for "su"
    }
    old["original_max_position_embeddings"] = 4
    theirs = transformers.Phi3Config.from_dict(old)
    assert theirs.rope_parameters["rope_type"] == "longrope"
    ours = M.Phi3Config.from_dict(old)
    assert ours.rope() == model.config.rope()


def test_bad_configs_name_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"^Phi3Config: rope_type must be 'default' or 'longrope'"):
        M.Phi3Config(**TINY, **IDS, rope_parameters={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ValueError, match=r"^Phi3Config: rope short_factor must be a list of 2 "):
        M.Phi3Config(**TINY, **IDS, rope_parameters={**LONGROPE, "short_factor": [1.0]})
    with pytest.raises(
        ValueError, match=r"^Phi3Config: rope long_factor must be a list of 4 .*None"
    ):
        M.Phi3Config(
            **TINY, **IDS, rope_parameters={"rope_type": "su", "short_factor": [1, 2, 3, 4]}
        )
    with pytest.raises(ValueError, match=r"^Phi3Config: partial_rotary_factor must be in \(0, 1]"):
        M.Phi3Config(**TINY, **IDS, partial_rotary_factor=1.5)
    with pytest.raises(ValueError, match=r"^Phi3Config: attention_bias is not a setting"):
        M.Phi3Config(**TINY, **IDS, attention_bias=True)
    (tmp_path / "config.json").write_text(
        json.dumps({**TINY, **IDS, "model_type": "phi3", "rope_scaling": {"type": "linear"}})
    )
    with pytest.raises(ValueError, match=r"config\.json: Phi3Config: rope_type must be"):
        M.from_pretrained(tmp_path)


def test_lora_capture_and_sharding_rules_reach_the_fused_projections(made):
    """LoRA targets ``qkv_proj`` and ``gate_up_proj`` (a fresh adapter leaves the
    logits as they were); ``capture`` sees them; the attention sharding rules split
    ``qkv_proj`` by rows and ``o_proj`` by columns (after the stacked blocks' axis)."""
    import purelayers.sharding as S
    from purelayers import lora

    _, model, params = made["longrope-partial"]
    ids = _batch()[0]
    base = np.asarray(jax.jit(model.apply)(params, ids))
    wrapped = lora.wrap(model, ["qkv_proj", "gate_up_proj"], r=2)
    names = list(pl.params.flatten(pl.params.abstract(wrapped, (1, 1))))
    assert "model.layers.1.self_attn.qkv_proj.lora_A.weight" in names
    assert "model.layers.0.mlp.gate_up_proj.lora_B.weight" in names
    fresh = wrapped.init(jax.random.key(0), (1, 1))
    merged = {**pl.params.flatten(fresh), **pl.params.flatten(params)}
    adapted = pl.params.unflatten(merged)
    np.testing.assert_allclose(np.asarray(jax.jit(wrapped.apply)(adapted, ids)), base, atol=1e-5)
    _out, seen = jax.jit(pl.capture(model.apply, "*.qkv_proj"))(params, ids)
    assert sorted(seen) == [f"model.layers.{i}.self_attn.qkv_proj" for i in (0, 1)]
    assert seen["model.layers.0.self_attn.qkv_proj"].shape == (2, 9, (4 + 2 * 2) * 8)
    mesh = S.make_mesh({"model": 1})
    rules = [*S.attention("model.layers.*.self_attn"), ("*", S.P())]
    specs = pl.params.flatten(S.partition_specs(pl.params.abstract(model, (1, 1)), rules, mesh))
    assert specs["model.layers.0.self_attn.qkv_proj.weight"] == S.P(None, "model", None)
    assert specs["model.layers.0.self_attn.o_proj.weight"] == S.P(None, None, "model")


def test_greedy_generate_across_the_longrope_switch_equals_transformers(torch, made):
    """A prompt of 3 (left-padded rows of 1 and 3 tokens) generating 7 tokens crosses
    ``original_max_position_embeddings=4``: transformers' Phi-3 runs the whole sequence
    again at that step, and so does ``generate``; the tokens are equal, stacked or
    unrolled blocks."""
    hf, model, params = made["longrope-partial"]
    assert model.recompute_cache_at == 5
    ids, mask = _batch()
    ids, mask = ids[:, 3:6].copy(), mask[:, 3:6].copy()
    mask[1, :2], ids[1, :2] = 0, 0
    want = hf.generate(
        torch.tensor(ids),
        attention_mask=torch.tensor(mask),
        max_new_tokens=7,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    ).numpy()
    for unroll in (True, False):
        got = M.generate(
            model, params, ids, attention_mask=mask, max_new_tokens=7, eos_token_id=None,
            unroll_blocks=unroll,
        )  # fmt: skip
        np.testing.assert_array_equal(np.asarray(got), want)
