"""WhisperForConditionalGeneration and WhisperModel against transformers', every
parameter randomized: names, teacher-forced logits and gradients (a right-padded decoder
row), greedy ``generate`` from a decoder prompt token for token with suppressed tokens
(cached decoding equal to uncached), Hugging Face folders both ways, LoRA, the config
and the errors."""

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
from purelayers.models.whisper import (
    WhisperConfig,
    WhisperForConditionalGeneration,
    WhisperModel,
    sinusoids,
)
from tests.twins import randomize

TINY = dict(
    vocab_size=96,
    num_mel_bins=8,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    d_model=32,
    encoder_ffn_dim=40,
    decoder_ffn_dim=36,
    max_source_positions=6,
    max_target_positions=24,
    decoder_start_token_id=1,
    pad_token_id=0,
    bos_token_id=0,
    eos_token_id=2,
    suppress_tokens=None,
    begin_suppress_tokens=None,
)
PROMPT = np.array([[1, 10, 11], [1, 12, 13]])  # <|startoftranscript|> and two more


def _features():
    return np.random.default_rng(0).standard_normal((2, 8, 12)).astype(np.float32)


def _decoder_batch():
    """Decoder ids (2, 7), row 1 padded on the right."""
    dec = np.random.default_rng(1).integers(3, 96, (2, 7))
    mask = np.ones((2, 7), np.int64)
    mask[1, 5:] = 0
    dec[mask == 0] = 0
    return dec, mask


@pytest.fixture(scope="module")
def pair(torch, transformers):
    """(transformers model, our model, our params)."""
    config = transformers.WhisperConfig(**TINY, attn_implementation="eager")
    hf = randomize(torch, transformers.WhisperForConditionalGeneration(config)).eval()
    with torch.no_grad():  # smaller weights and final bias: greedy tokens that vary
        hf.model.decoder.layer_norm.bias.mul_(0.1)
        for name, p in hf.named_parameters():
            if "layer_norm" not in name:
                p.mul_(0.5)
    model = WhisperForConditionalGeneration(WhisperConfig.from_dict(hf.config.to_dict()))
    template = pl.params.abstract(model, model.example_shape())
    params = pl.params.load_state_dict(template, hf.state_dict(), model=model)
    return hf, model, model.ordered(params)


def _torch_logits(torch, hf, features, dec, dec_mask=None):
    with torch.no_grad():
        out = hf(
            input_features=torch.from_numpy(features),
            decoder_input_ids=torch.from_numpy(dec),
            decoder_attention_mask=None if dec_mask is None else torch.from_numpy(dec_mask),
        )
    return out.logits.numpy()


@functools.partial(jax.jit, static_argnums=0)
def _run(model, params, features, dec):
    return model.apply(params, features, decoder_input_ids=dec)


def _logits(model, params, features, dec):
    """Teacher-forced logits, compiled once per (model, shapes)."""
    return np.asarray(_run(model, params, features, dec))


def test_names_order_and_shapes_are_the_checkpoints(torch, pair, tmp_path):
    hf, model, params = pair
    from safetensors import safe_open

    hf.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "np") as f:
        keys = set(f.keys())
    flat = pl.params.flatten(params)
    assert set(flat) == keys and "proj_out.weight" not in flat
    theirs = dict(hf.named_parameters())
    assert list(flat) == list(theirs)
    assert {k: v.shape for k, v in flat.items()} == {k: tuple(v.shape) for k, v in theirs.items()}
    init = pl.params.flatten(model.ordered(model.init(jax.random.key(0), (2, 8, 12))))
    assert list(init) == list(theirs)
    fresh = type(hf)(hf.config)  # transformers' init: the sinusoids, a zero padding row
    np.testing.assert_allclose(
        init["model.encoder.embed_positions.weight"],
        fresh.model.encoder.embed_positions.weight.detach().numpy(),
        atol=1e-6,
    )
    np.testing.assert_array_equal(init["model.decoder.embed_tokens.weight"][0], np.zeros(32))
    np.testing.assert_array_equal(init["model.encoder.layer_norm.weight"], np.ones(32))
    assert sinusoids(6, 32).shape == (6, 32)


def test_logits_and_gradients_match_transformers(pair):
    hf, model, _ = pair
    dec, dec_mask = _decoder_batch()

    def apply(params, features, dec, dec_mask):
        return model.apply(params, features, decoder_input_ids=dec, decoder_attention_mask=dec_mask)

    def torch_call(module, features, dec, dec_mask):
        return module(
            input_features=features, decoder_input_ids=dec, decoder_attention_mask=dec_mask
        ).logits

    # the frozen encoder positions get no gradient (None in torch, zeros here)
    pl.testing.assert_matches_torch(
        model, hf, _features(), dec, dec_mask, apply=apply, torch_call=torch_call,
        init_shape=(2, 8, 12), rtol=1e-4, atol=1e-4, forward_mode=False,
    )  # fmt: skip


def test_greedy_generate_equals_transformers_and_cached_equals_uncached(torch, pair):
    hf, model, params = pair
    features = _features()

    def theirs(**kw):
        with torch.no_grad():
            return hf.generate(
                torch.from_numpy(features),
                decoder_input_ids=torch.from_numpy(PROMPT),
                max_new_tokens=8,
                **kw,
            ).numpy()

    # suppress the first greedy token of row 0 at the start and its second one always
    plain = theirs(eos_token_id=None)
    begin, always = [int(plain[0, 0])], [int(plain[0, 1])]
    hf.generation_config.begin_suppress_tokens = begin
    hf.generation_config.suppress_tokens = always
    try:
        want = theirs(eos_token_id=None)
        eos = next(int(t) for t in want[1, :4] if t not in want[0])  # ends row 1 alone
        want_eos = theirs(eos_token_id=eos)
    finally:
        hf.generation_config.begin_suppress_tokens = None
        hf.generation_config.suppress_tokens = None
    assert (want != plain).any() and want[0, 0] != begin[0] and not np.isin(want, always).any()
    generation = {"eos_token_id": eos, "pad_token_id": 0, "decoder_start_token_id": 1}
    generation |= {"suppress_tokens": always, "begin_suppress_tokens": begin}
    suppressing = dataclasses.replace(model, generation_config=generation)
    ours = np.asarray(
        M.generate(suppressing, params, features, decoder_input_ids=PROMPT, max_new_tokens=8)
    )
    # the prompt, then transformers' greedy tokens; row 1 pads after its eos
    full = np.concatenate([PROMPT, want], 1)
    expected = full.copy()
    expected[1, 3 + list(want[1]).index(eos) + 1 :] = 0
    np.testing.assert_array_equal(ours, expected)
    # transformers' Whisper returns the new ids alone, eos and padding dropped
    new = ours[:, 3:].copy()
    new[new == eos] = 0
    np.testing.assert_array_equal(new, want_eos)
    # uncached: the whole sequence at once gives the logits the cached steps saw
    logits = _logits(model, params, features, full[:, :-1])
    start = jax.jit(lambda p, x: model.init_cache(p, model.encode(p, x), 10))
    decode = jax.jit(lambda p, t, c: model.decode(p, t, cache=c))
    cache, steps = start(params, features), []
    for t in range(full.shape[1] - 1):
        step, cache = decode(params, full[:, t : t + 1], cache)
        steps.append(np.asarray(step[:, 0]))
    np.testing.assert_allclose(np.stack(steps, 1), logits, rtol=1e-5, atol=1e-5)
    masked = logits[:, 2:].copy()
    masked[:, :, always] = -np.inf
    masked[:, 0, begin] = -np.inf
    np.testing.assert_array_equal(masked.argmax(-1), want)


def test_save_pretrained_loads_in_transformers_and_back(torch, transformers, pair, tmp_path):
    hf, model, params = pair
    features, (dec, dec_mask) = _features(), _decoder_batch()
    want = _torch_logits(torch, hf, features, dec)
    M.save_pretrained(tmp_path / "ours", model, params)
    loaded, info = transformers.WhisperForConditionalGeneration.from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    np.testing.assert_allclose(_torch_logits(torch, loaded.eval(), features, dec), want, atol=1e-5)
    hf.save_pretrained(tmp_path / "theirs")
    with warnings.catch_warnings():
        warnings.simplefilter("error", pl.params.CheckpointWarning)
        again, again_params = M.from_pretrained(tmp_path / "theirs")
    assert isinstance(again, WhisperForConditionalGeneration) and again.config == model.config
    np.testing.assert_allclose(
        _logits(again, again_params, features, dec), want, rtol=1e-4, atol=1e-4
    )
    # the base model, picked by architectures[0], reads the same file
    file = tmp_path / "theirs" / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), "architectures": ["WhisperModel"]}))
    with warnings.catch_warnings():  # the file holds no proj_out.weight: nothing left out
        warnings.simplefilter("error", pl.params.CheckpointWarning)
        base, base_params = M.from_pretrained(tmp_path / "theirs")
    assert isinstance(base, WhisperModel)
    hidden = jax.jit(
        lambda p: base.apply(p, features, decoder_input_ids=dec, decoder_attention_mask=dec_mask)
    )(base_params)
    with torch.no_grad():
        expected = hf.model(
            input_features=torch.from_numpy(features),
            decoder_input_ids=torch.from_numpy(dec),
            decoder_attention_mask=torch.from_numpy(dec_mask),
        ).last_hidden_state.numpy()
    np.testing.assert_allclose(np.asarray(hidden), expected, rtol=1e-4, atol=1e-4)


def test_untied_head_loads_and_saves_as_transformers(torch, transformers, tmp_path):
    config = transformers.WhisperConfig(**TINY, tie_word_embeddings=False)
    hf = randomize(torch, transformers.WhisperForConditionalGeneration(config), seed=3).eval()
    assert hf.proj_out.weight is not hf.model.decoder.embed_tokens.weight
    hf.save_pretrained(tmp_path / "theirs")
    with warnings.catch_warnings():
        warnings.simplefilter("error", pl.params.CheckpointWarning)
        model, params = M.from_pretrained(tmp_path / "theirs")
    assert not model.config.tie_word_embeddings and "proj_out" in params
    features, (dec, _) = _features(), _decoder_batch()
    want = _torch_logits(torch, hf, features, dec)
    np.testing.assert_allclose(_logits(model, params, features, dec), want, rtol=1e-4, atol=1e-4)
    M.save_pretrained(tmp_path / "ours", model, params)
    loaded, info = transformers.WhisperForConditionalGeneration.from_pretrained(
        tmp_path / "ours", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    np.testing.assert_allclose(_torch_logits(torch, loaded.eval(), features, dec), want, atol=1e-5)


# PEFT's loading calls a deprecated transformers property
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_reaches_attention_and_feed_forward_and_loads_in_peft(torch, pair, tmp_path):
    import peft

    hf, model, params = pair
    targets = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]
    lmodel = lora.wrap(model, targets, r=2, lora_alpha=4)
    lparams = lora.init(lmodel, jax.random.key(0), params)
    flat = pl.params.flatten(lparams)
    names = [n for n in flat if "lora_A" in n]
    assert len(names) == 2 * 6 + 2 * 10  # 6 Linears per encoder layer, 10 per decoder layer
    assert "model.decoder.layers.1.encoder_attn.k_proj.lora_A.weight" in names
    assert "model.encoder.layers.0.fc2.lora_A.weight" in names
    features, (dec, _) = _features(), _decoder_batch()
    base = _logits(model, params, features, dec)
    np.testing.assert_allclose(_logits(lmodel, lparams, features, dec), base, atol=1e-5)
    rng = np.random.default_rng(2)  # a trained adapter: B no longer zero
    trained = {
        k: rng.standard_normal(v.shape).astype(np.float32) * 0.3 if "lora_B" in k else v
        for k, v in flat.items()
    }
    lparams = pl.params.load_state_dict(lparams, trained)
    ours = _logits(lmodel, lparams, features, dec)
    assert np.abs(ours - base).max() > 1e-2
    lora.save_adapter(tmp_path, lmodel, lparams)
    adapter = json.loads((tmp_path / "adapter_config.json").read_text())
    assert adapter["task_type"] == "SEQ_2_SEQ_LM"
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(hf), tmp_path).eval()
    with torch.no_grad():  # PeftModelForSeq2SeqLM's own forward passes input_ids
        theirs = loaded.base_model(
            input_features=torch.from_numpy(features), decoder_input_ids=torch.from_numpy(dec)
        ).logits.numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_config_matches_transformers_and_round_trips(transformers):
    hf = transformers.WhisperConfig(**TINY)
    ours = WhisperConfig.from_dict(hf.to_dict())
    for field in dataclasses.fields(WhisperConfig):
        value = getattr(hf, field.name)
        assert getattr(ours, field.name) == (tuple(value) if isinstance(value, list) else value)
    assert WhisperConfig.from_dict(ours.to_dict()) == ours
    assert WhisperConfig() == WhisperConfig.from_dict(transformers.WhisperConfig().to_dict())


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(d_model=30), "d_model must be divisible by encoder_attention_heads=4, got 30"),
        (dict(activation_function="mish"), "activation_function must be one of"),
        (dict(max_source_positions=0), "max_source_positions must be a positive integer"),
        (dict(dropout=1.0), r"dropout must be in \[0, 1\), got 1.0"),
        (
            dict(d_model=33, encoder_attention_heads=1, decoder_attention_heads=3),
            "d_model must be even",
        ),
        (dict(init_std=-1.0), "init_std must be"),
        (dict(is_encoder_decoder=False), "is_encoder_decoder must be True"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(overrides, match):
    with pytest.raises(ValueError, match=f"^WhisperConfig: {match}"):
        WhisperConfig(**{**TINY, **overrides})


def test_errors_name_what_was_expected_and_got(pair):
    _, model, params = pair
    features = _features()
    who = "WhisperForConditionalGeneration"
    with pytest.raises(
        LayerError, match=rf"{who}: input_features mel bins \(axis 1\) expected 8, got 6"
    ):
        model.apply(params, features[:, :6], decoder_input_ids=PROMPT)
    with pytest.raises(LayerError, match=r"input_features frames \(axis 2\) expected 12, got 10"):
        model.apply(params, features[..., :10], decoder_input_ids=PROMPT)
    with pytest.raises(
        LayerError, match=r"decoder_input_ids length \(axis 1\).* expected 24, got 25"
    ):
        model.apply(params, features, decoder_input_ids=np.ones((2, 25), np.int32))
    for option, value in [
        ("forced_decoder_ids", [[1, 2]]),
        ("return_timestamps", True),
        ("language", "en"),
        ("task", "transcribe"),
        ("num_beams", 2),
    ]:
        with pytest.raises(ValueError, match=f"options not supported: {option}"):
            M.generate(model, params, features, decoder_input_ids=PROMPT, max_new_tokens=2,
                       **{option: value})  # fmt: skip
    with pytest.raises(ValueError, match=f"{who} needs decoder_input_ids"):
        M.generate(model, params, features, max_new_tokens=2)
    with pytest.raises(ValueError, match=f"{who} takes no attention_mask"):
        M.generate(model, params, features, attention_mask=np.ones((2, 12)), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"decoder_input_ids must be \(2, n >= 1\)"):
        M.generate(model, params, features, decoder_input_ids=PROMPT[:1], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"max_len .* at most max_target_positions=24, got 25"):
        M.generate(model, params, features, decoder_input_ids=PROMPT, max_new_tokens=23)
    with pytest.raises(
        ValueError, match=r"decoder_input_ids must be token ids in \[0, vocab_size=96\)"
    ):
        M.generate(model, params, features, decoder_input_ids=PROMPT + 90, max_new_tokens=2)
    with pytest.raises(LayerError, match=rf"{who}: input_features shape expected \(batch, num_mel"):
        model.apply(params, features[0], decoder_input_ids=PROMPT)
    with pytest.raises(LayerError, match=r"decoder_input_ids shape expected \(batch, seq\)"):
        model.apply(params, features, decoder_input_ids=PROMPT[0])
    with pytest.raises(LayerError, match=r"decoder_attention_mask shape expected \(2, 3\)"):
        model.apply(params, features, decoder_input_ids=PROMPT, decoder_attention_mask=PROMPT[:1])
    with pytest.raises(ValueError, match=f"{who}: the encoder takes no attention_mask"):
        model.encode(params, features, attention_mask=np.ones((2, 12)))
    with pytest.raises(ValueError, match=f"{who}: the encoder takes no attention_mask"):
        model.decode(params, PROMPT, attention_mask=np.ones((2, 12)))
    with pytest.raises(ValueError, match="max_len must be a positive integer, got 0"):
        model.init_cache(params, np.zeros((2, 6, 32), np.float32), 0)
    dropping = WhisperForConditionalGeneration(
        dataclasses.replace(model.config, encoder_layerdrop=0.1)
    )
    with pytest.raises(ValueError, match=r"training with encoder_layerdrop=0.1 is not implemented"):
        dropping.apply(
            params, features, decoder_input_ids=PROMPT, train=True, key=jax.random.key(0)
        )
    with pytest.raises(
        LayerError, match=r"WhisperModel: input_features shape expected \(batch, mel"
    ):
        WhisperModel(model.config).init(jax.random.key(0), (2, 12))
    with pytest.raises(ValueError, match="config must be a WhisperConfig"):
        WhisperForConditionalGeneration(TINY)
    with pytest.raises(ValueError, match="generation_config must be a dict"):
        WhisperForConditionalGeneration(model.config, generation_config=3)
