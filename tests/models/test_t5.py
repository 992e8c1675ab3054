"""T5ForConditionalGeneration against transformers': v1.0 (ReLU, tied head, scaled
decoder output) and v1.1 (gated GELU, untied head), every parameter randomized, encoder
inputs padded on the left in one row and on the right in the other: names, logits and
gradients, greedy ``generate`` token for token (cached decoding equal to uncached),
Hugging Face folders both ways, LoRA on ``q``/``v``, the config and the errors."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import warnings

import jax
import numpy as np
import pytest

import purelayers as pl
from purelayers import lora
from purelayers import models as M
from purelayers.layers import LayerError
from purelayers.models.t5 import T5Config, T5ForConditionalGeneration, relative_position_bucket
from tests.twins import randomize

TINY = dict(
    vocab_size=99,
    d_model=32,
    d_kv=8,
    d_ff=37,
    num_layers=2,
    num_heads=4,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=12,
    decoder_start_token_id=0,
)
VARIANTS = {"v1.0": dict(feed_forward_proj="relu"), "v1.1": dict(feed_forward_proj="gated-gelu")}


def _batch():
    """Encoder ids (2, 20): row 0 padded on the left, row 1 on the right (pad id 0);
    decoder ids (2, 17), row 1 padded on the right."""
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 99, (2, 20))
    mask = np.ones((2, 20), np.int64)
    mask[0, :5] = 0
    mask[1, 15:] = 0
    ids[mask == 0] = 0
    dec = rng.integers(2, 99, (2, 17))
    dec_mask = np.ones((2, 17), np.int64)
    dec_mask[1, 12:] = 0
    return ids, mask, dec, dec_mask


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, torch, transformers):
    """(transformers model, our model, our params): v1.0 tied with its scaled output,
    v1.1 with an lm_head of its own (as published v1.1 checkpoints)."""
    untied = request.param == "v1.1"
    config = transformers.T5Config(
        **TINY,
        **VARIANTS[request.param],
        tie_word_embeddings=not untied,
        attn_implementation="eager",
    )
    hf = transformers.T5ForConditionalGeneration(config)
    if untied:  # transformers 5 ties at construction; a checkpoint's own head unties it
        hf.lm_head.weight = torch.nn.Parameter(hf.lm_head.weight.detach().clone())
    hf = randomize(torch, hf).eval()
    with torch.no_grad():  # N(0, 0.25^2): unscaled attention scores stay well-conditioned
        for p in hf.parameters():
            p.mul_(0.5)
    # transformers 5 writes tie_word_embeddings=True always; v1.1's config.json says False
    config = {**hf.config.to_dict(), "tie_word_embeddings": not untied}
    model = T5ForConditionalGeneration(T5Config.from_dict(config))
    assert model.config.scale_decoder_outputs is not untied
    params = pl.params.load_state_dict(
        pl.params.abstract(model, (1, 1)), hf.state_dict(), model=model
    )
    return hf, model, model.ordered(params)


def _torch_logits(torch, hf, ids, mask, dec, dec_mask):
    with torch.no_grad():
        out = hf(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            decoder_input_ids=torch.from_numpy(dec),
            decoder_attention_mask=torch.from_numpy(dec_mask),
        )
    return out.logits.numpy()


def _logits(model, params, ids, mask, dec, dec_mask):
    run = jax.jit(
        lambda p: model.apply(
            p, ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask
        )
    )
    return np.asarray(run(params))


def test_names_order_and_shapes_are_the_checkpoints(pair, tmp_path):
    hf, model, params = pair
    from safetensors import safe_open

    hf.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "np") as f:
        keys = set(f.keys())
    flat = pl.params.flatten(params)
    assert set(flat) == keys
    theirs = dict(hf.named_parameters())
    assert list(flat) == list(theirs)
    assert {k: tuple(v.shape) for k, v in flat.items()} == {
        k: tuple(v.shape) for k, v in theirs.items()
    }
    init = pl.params.flatten(model.ordered(model.init(jax.random.key(0), (2, 7))))
    assert list(init) == list(theirs)
    bias = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    assert init[bias].shape == (8, 4)
    assert not any("block.1" in k and "relative_attention_bias" in k for k in init)
    np.testing.assert_array_equal(init["encoder.final_layer_norm.weight"], np.ones(32))


def test_logits_and_gradients_match_transformers(torch, pair):
    hf, model, _ = pair

    def apply(params, ids, mask, dec, dec_mask):
        return model.apply(
            params, ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask
        )

    def torch_call(module, ids, mask, dec, dec_mask):
        return module(
            input_ids=ids,
            attention_mask=mask,
            decoder_input_ids=dec,
            decoder_attention_mask=dec_mask,
        ).logits

    pl.testing.assert_matches_torch(
        model, hf, *_batch(), apply=apply, torch_call=torch_call, rtol=1e-4, atol=1e-4,
        forward_mode=False,
    )  # fmt: skip


def test_relative_position_buckets_match_transformers(transformers, torch):
    rel = np.arange(-40, 41)[None, :] - np.zeros((1, 1), np.int64)
    bucket = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket
    for bidirectional in (True, False):
        for n, distance in ((8, 12), (32, 128)):
            want = bucket(torch.from_numpy(rel), bidirectional, n, distance).numpy()
            got = relative_position_bucket(
                rel, bidirectional=bidirectional, num_buckets=n, max_distance=distance
            )
            np.testing.assert_array_equal(np.asarray(got), want)


def test_greedy_generate_equals_transformers_and_cached_equals_uncached(torch, pair):
    hf, model, params = pair
    ids, mask, _, _ = _batch()
    ours = np.asarray(
        M.generate(model, params, ids, attention_mask=mask, max_new_tokens=8, eos_token_id=None)
    )
    with torch.no_grad():
        theirs = hf.generate(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            max_new_tokens=8,
            do_sample=False,
            eos_token_id=None,
        ).numpy()
    np.testing.assert_array_equal(ours, theirs)
    assert (ours[:, 0] == 0).all()
    # uncached: the whole decoder sequence at once picks the same tokens, with the logits
    # the cached steps saw
    logits = _logits(model, params, ids, mask, ours[:, :-1], np.ones_like(ours[:, :-1]))
    np.testing.assert_array_equal(logits.argmax(-1), ours[:, 1:])
    encoded = jax.jit(lambda p: model.encode(p, ids, attention_mask=mask))(params)
    cache = jax.jit(model.init_cache, static_argnums=2)(params, encoded, 8)
    decode = jax.jit(lambda p, t, c: model.decode(p, t, attention_mask=mask, cache=c))
    steps = []
    for t in range(ours.shape[1] - 1):
        step, cache = decode(params, ours[:, t : t + 1], cache)
        steps.append(np.asarray(step[:, 0]))
    np.testing.assert_allclose(np.stack(steps, 1), logits, rtol=1e-5, atol=1e-5)
    # an eos that appears mid-way: that row pads after it, as transformers'
    eos = int(ours[1, 3])
    ours = np.asarray(
        M.generate(model, params, ids, attention_mask=mask, max_new_tokens=8, eos_token_id=eos)
    )
    with torch.no_grad():
        theirs = hf.generate(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            max_new_tokens=8,
            do_sample=False,
            eos_token_id=eos,
        ).numpy()
    np.testing.assert_array_equal(ours, theirs)


# sampling is the same code for both feed-forwards: the gated (v1.1) variant draws
@pytest.mark.parametrize("pair", ["v1.1"], indirect=True)
def test_sampling_draws_from_the_key(pair):
    _, model, params = pair
    ids, mask, _, _ = _batch()

    def sample(seed, **kw):
        return np.asarray(
            M.generate(
                model, params, ids, attention_mask=mask, max_new_tokens=5, eos_token_id=None,
                do_sample=True, key=jax.random.key(seed), **kw,
            )
        )  # fmt: skip

    a, b = sample(1), sample(1)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (2, 6) and ((a >= 0) & (a < 99)).all()
    greedy = M.generate(
        model, params, ids, attention_mask=mask, max_new_tokens=5, eos_token_id=None
    )
    np.testing.assert_array_equal(sample(2, top_k=1), np.asarray(greedy))


def test_save_pretrained_loads_in_transformers_and_back(torch, transformers, pair, tmp_path):
    hf, model, params = pair
    batch = _batch()
    M.save_pretrained(tmp_path / "ours", model, params)
    loaded, info = transformers.T5ForConditionalGeneration.from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    want = _torch_logits(torch, hf, *batch)
    np.testing.assert_allclose(_torch_logits(torch, loaded.eval(), *batch), want, atol=1e-5)
    hf.save_pretrained(tmp_path / "theirs")
    if not model.config.tie_word_embeddings:  # as published v1.1 configs say
        file = tmp_path / "theirs" / "config.json"
        config = {**json.loads(file.read_text()), "tie_word_embeddings": False}
        file.write_text(json.dumps(config))
    with warnings.catch_warnings():
        warnings.simplefilter("error", pl.params.CheckpointWarning)
        again, again_params = M.from_pretrained(tmp_path / "theirs")
    assert isinstance(again, T5ForConditionalGeneration)
    assert again.config.scale_decoder_outputs == model.config.scale_decoder_outputs
    np.testing.assert_allclose(_logits(again, again_params, *batch), want, rtol=1e-4, atol=1e-4)


@functools.partial(jax.jit, static_argnums=0)
def _static_logits(model, params, ids, mask, dec, dec_mask):
    return model.apply(
        params, ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask
    )


def test_every_folder_transformers_5_writes_loads_with_its_logits(torch, transformers, tmp_path):
    """transformers 5 ties every T5 head at construction, writes ``tie_word_embeddings:
    true`` with ``scale_decoder_outputs`` (false for a v1.1 model), and unties a head
    its file holds. So: a v1.1 model whose head was untied writes a tied config with a
    distinct ``lm_head.weight`` (loaded untied, its config saying so when saved back); a
    v1.1 model built in transformers 5 writes no head at all (tied, unscaled); a
    transformers 4 config saying untied beside a file with no head is tied too. Each
    loads with transformers' logits, and our folder loads back in transformers."""
    batch = _batch()
    config = transformers.T5Config(
        **TINY, **VARIANTS["v1.1"], tie_word_embeddings=False, attn_implementation="eager"
    )
    tied = randomize(torch, transformers.T5ForConditionalGeneration(config), seed=4).eval()
    assert tied.lm_head.weight is tied.shared.weight
    untied = copy.deepcopy(tied)
    with torch.no_grad():
        untied.lm_head.weight = torch.nn.Parameter(torch.randn(untied.lm_head.weight.shape))
    cases = [("untied", untied, {}, False), ("tied", tied, {}, True)]
    cases.append(("tied-v4-config", tied, {"tie_word_embeddings": False}, True))
    wants = {}
    for name, hf, edit, tie in cases:
        folder = tmp_path / name
        hf.save_pretrained(folder)
        written = json.loads((folder / "config.json").read_text())
        assert written["tie_word_embeddings"] is True
        assert written["scale_decoder_outputs"] is False
        (folder / "config.json").write_text(json.dumps({**written, **edit}))
        with warnings.catch_warnings():
            warnings.simplefilter("error", pl.params.CheckpointWarning)
            model, params = M.from_pretrained(folder)
        assert model.config.tie_word_embeddings is tie, name
        assert model.config.scale_decoder_outputs is False
        assert ("lm_head" in params) is not tie
        if id(hf) not in wants:
            wants[id(hf)] = _torch_logits(torch, hf, *batch)
        want = wants[id(hf)]
        got = _static_logits(model, params, *batch)  # the two tied models compile once
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        if name == "tied-v4-config":  # the same model as "tied"'s
            continue
        M.save_pretrained(tmp_path / f"ours-{name}", model, params)
        back = transformers.T5ForConditionalGeneration.from_pretrained(
            tmp_path / f"ours-{name}", attn_implementation="eager"
        )
        assert back.config.scale_decoder_outputs is False
        np.testing.assert_allclose(_torch_logits(torch, back.eval(), *batch), want, atol=1e-5)


def test_lora_targets_q_and_v(pair):
    _, model, params = pair
    lmodel = lora.wrap(model, ["q", "v"], r=2, lora_alpha=4)
    lparams = lora.init(lmodel, jax.random.key(0), params)
    names = [n for n in pl.params.flatten(lparams) if "lora_" in n]
    assert "encoder.block.0.layer.0.SelfAttention.q.lora_A.weight" in names
    assert "decoder.block.1.layer.1.EncDecAttention.v.lora_B.weight" in names
    assert not any(".k.lora" in n or ".o.lora" in n for n in names)
    ids, mask, dec, dec_mask = _batch()
    base = _logits(model, params, ids, mask, dec, dec_mask)
    np.testing.assert_allclose(_logits(lmodel, lparams, ids, mask, dec, dec_mask), base, atol=1e-5)


def test_config_matches_transformers_and_round_trips(transformers):
    for variant in VARIANTS.values():
        hf = transformers.T5Config(**TINY, **variant)
        ours = T5Config.from_dict(hf.to_dict())
        for field in dataclasses.fields(T5Config):
            if field.name != "eos_token_id":
                assert getattr(ours, field.name) == getattr(hf, field.name, None), field.name
        assert ours.dense_act_fn == hf.dense_act_fn and ours.is_gated_act == hf.is_gated_act
        assert T5Config.from_dict(ours.to_dict()) == ours
    # a transformers 4 config: an untied head means no output scaling
    old = T5Config.from_dict({**TINY, "tie_word_embeddings": False})
    assert old.scale_decoder_outputs is False


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(feed_forward_proj="gated-gelu-x"), "feed_forward_proj must be"),
        (dict(feed_forward_proj="mish"), "feed_forward_proj activation must be one of"),
        (dict(d_kv=0), "d_kv must be a positive integer, got 0"),
        (dict(dropout_rate=1.0), r"dropout_rate must be in \[0, 1\), got 1.0"),
        (dict(is_encoder_decoder=False), "is_encoder_decoder must be True"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(overrides, match):
    with pytest.raises(ValueError, match=f"^T5Config: {match}"):
        T5Config(**{**TINY, **overrides})


def test_errors_name_what_was_expected_and_got():
    model = T5ForConditionalGeneration(T5Config(**TINY))
    params = pl.params.abstract(model, (1, 1))
    ids = np.ones((2, 7), np.int32)
    with pytest.raises(LayerError, match=r"input_ids shape expected \(batch, seq\), got \(7,\)"):
        model.apply(params, ids[0], decoder_input_ids=ids)
    with pytest.raises(LayerError, match=r"decoder_input_ids mask shape expected \(2, 7\)"):
        model.apply(params, ids, decoder_input_ids=ids, decoder_attention_mask=ids[:, :3])
    with pytest.raises(ValueError, match="config must be a T5Config"):
        T5ForConditionalGeneration(TINY)
    with pytest.raises(ValueError, match="generation_config must be a dict"):
        T5ForConditionalGeneration(T5Config(**TINY), generation_config=3)
    with pytest.raises(ValueError, match="options not supported: forced_decoder_ids"):
        M.generate(model, params, ids, max_new_tokens=2, forced_decoder_ids=[[1, 2]])
    no_start = T5ForConditionalGeneration(T5Config(**{**TINY, "decoder_start_token_id": None}))
    real = no_start.init(jax.random.key(0), (1, 1))
    with pytest.raises(ValueError, match="has no decoder_start_token_id"):
        M.generate(no_start, real, ids, max_new_tokens=2)
    with pytest.raises(ValueError, match="max_len must be a positive integer"):
        model.init_cache(real, np.zeros((2, 7, 32), np.float32), 0)
