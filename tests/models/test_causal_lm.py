"""GPT-2, Llama, Mistral and Qwen2 against transformers: names and order, logits and
gradients on a left-padded batch, cached decoding, ``generate``, and Hugging Face
folders both ways. Every parameter of the reference is randomized."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import models as M
from purelayers.models import decoding as G
from purelayers.models import gpt2, llama

VOCAB = 37
TINY_LLAMA = dict(
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    intermediate_size=24,
    vocab_size=VOCAB,
    max_position_embeddings=64,
)
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def _reference(torch, transformers, kind: str, **overrides):
    """A tiny transformers model with every parameter drawn from N(0, 0.5^2) (its
    buffers, such as RoPE's inv_freq, keep their computed values)."""
    if kind == "gpt2":
        config = transformers.GPT2Config(
            n_embd=16, n_layer=2, n_head=2, vocab_size=VOCAB, n_positions=32, **overrides
        )
        cls = transformers.GPT2LMHeadModel
    else:
        name = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}[kind]
        config = getattr(transformers, f"{name}Config")(**{**TINY_LLAMA, **overrides})
        cls = getattr(transformers, f"{name}ForCausalLM")
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = cls(config).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return hf


def _ours(hf):
    model = {
        "gpt2": gpt2.GPT2LMHeadModel,
        "llama": llama.LlamaForCausalLM,
        "mistral": llama.MistralForCausalLM,
        "qwen2": llama.Qwen2ForCausalLM,
    }[hf.config.model_type]
    model = model(model.config_class.from_dict(hf.config.to_dict()))
    params = pl.params.load_state_dict(
        pl.params.abstract(model, (1, 1)), hf.state_dict(), model=model
    )
    return model, params


def _batch():
    """Two rows, the second left-padded by three."""
    ids = np.random.default_rng(0).integers(6, VOCAB, (2, 9))
    mask = np.ones((2, 9), np.int64)
    mask[1, :3] = 0
    ids[1, :3] = 0
    return ids, mask


PAD = int(_batch()[0][0, 4])  # a token of an unmasked position: its embedding row pads
CASES = {
    "gpt2": ("gpt2", {}),
    "llama-llama3-rope-biases": (
        "llama",
        dict(rope_parameters=LLAMA3, attention_bias=True, mlp_bias=True),
    ),
    "llama-tied": ("llama", dict(tie_word_embeddings=True, pad_token_id=PAD)),
    "mistral-window": ("mistral", dict(sliding_window=3, pad_token_id=PAD)),
    "qwen2": ("qwen2", dict(pad_token_id=PAD)),
}


@pytest.mark.parametrize("case", CASES)
def test_names_logits_and_gradients_match_transformers(torch, transformers, case):
    """Names in transformers' order; logits of a left-padded batch (positions from the
    mask, as generate computes them) and the gradients of every parameter by name. With
    a ``pad_token_id``, the Llama family's embedding pads that row as transformers'
    ``nn.Embedding(..., padding_idx)``: zero at init, no gradient from the lookup (the
    token occurs in the batch; a tied head still gives that row its gradient)."""
    kind, overrides = CASES[case]
    hf = _reference(torch, transformers, kind, **overrides)
    model, params = _ours(hf)
    tied = {"lm_head.weight"} if hf.config.tie_word_embeddings else set()
    fresh = model.init(jax.random.key(0), (1, 1))
    assert list(pl.params.flatten(fresh)) == [k for k in hf.state_dict() if k not in tied]
    if "pad_token_id" in overrides:
        assert hf.model.embed_tokens.padding_idx == PAD
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


@pytest.mark.parametrize("case", ["gpt2", "llama-tied"])
def test_logits_to_keep_equals_transformers_and_the_last_positions(torch, transformers, case):
    """``logits_to_keep=n`` gives the last ``n`` positions of the full logits, as
    transformers' argument of that name does; 0 keeps all; bad values name it."""
    kind, overrides = CASES[case]
    hf = _reference(torch, transformers, kind, **overrides)
    model, params = _ours(hf)
    ids = np.random.default_rng(3).integers(0, VOCAB, (2, 7))
    full = np.asarray(model.apply(params, ids))
    assert full.shape == (2, 7, VOCAB)
    np.testing.assert_array_equal(np.asarray(model.apply(params, ids, logits_to_keep=0)), full)
    for n in (1, 3):
        ours = np.asarray(model.apply(params, ids, logits_to_keep=n))
        assert ours.shape == (2, n, VOCAB)
        np.testing.assert_allclose(ours, full[:, -n:], rtol=1e-6, atol=1e-6)
        ref = hf(torch.tensor(ids), logits_to_keep=n).logits.detach().numpy()
        np.testing.assert_allclose(ours, ref, atol=2e-5)
    for bad in (-1, 1.0, True):
        with pytest.raises(ValueError, match="logits_to_keep"):
            model.apply(params, ids, logits_to_keep=bad)


@pytest.mark.parametrize("case", ["gpt2", "mistral-window"])
def test_cached_decoding_equals_the_full_forward(torch, transformers, case):
    """A prompt prefilled into the cache, then one token at a time: the logits of the
    whole left-padded sequence at once."""
    kind, overrides = CASES[case]
    model, params = _ours(_reference(torch, transformers, kind, **overrides))
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


@pytest.mark.parametrize("case", ["gpt2", "llama-tied"])
def test_greedy_generate_equals_transformers_on_a_left_padded_batch(torch, transformers, case):
    """Greedy tokens of transformers' generate, with eos and pad handling, and the
    decode step compiled once for all the steps."""
    kind, overrides = CASES[case]
    hf = _reference(torch, transformers, kind, **overrides)
    model, params = _ours(hf)
    ids, mask = _batch()
    want = hf.generate(
        torch.tensor(ids),
        attention_mask=torch.tensor(mask),
        max_new_tokens=8,
        do_sample=False,
        eos_token_id=7,
        pad_token_id=0,
    ).numpy()
    before = G._decode._cache_size()
    got = M.generate(
        model, params, ids, attention_mask=mask, max_new_tokens=8, eos_token_id=7, pad_token_id=0
    )
    assert G._decode._cache_size() - before <= 1
    np.testing.assert_array_equal(np.asarray(got), want)


def test_an_eos_in_every_row_stops_early_and_pads_finished_rows(torch, transformers):
    """With eos set to each row's first greedy token, the row is finished at once:
    generation stops after one step and the result is one token longer."""
    model, params = _ours(_reference(torch, transformers, "gpt2"))
    ids, mask = _batch()
    first = np.asarray(M.generate(model, params, ids, attention_mask=mask, max_new_tokens=1))[:, -1]
    got = M.generate(
        model,
        params,
        ids,
        attention_mask=mask,
        max_new_tokens=6,
        eos_token_id=[int(t) for t in first],
        pad_token_id=0,
    )
    assert got.shape == (2, 10)
    np.testing.assert_array_equal(np.asarray(got)[:, -1], first)
    # NumPy arguments, as transformers takes them: an array of eos ids, an np.int64 count
    again = M.generate(
        model, params, ids, attention_mask=mask, max_new_tokens=np.int64(6), eos_token_id=first
    )
    np.testing.assert_array_equal(np.asarray(again)[:, :10], np.asarray(got))


def test_generation_config_ids_stop_generate_as_transformers(torch, transformers, tmp_path):
    """A folder whose ``generation_config.json`` lists an eos id that ``config.json``
    does not (as instruction-tuned models list their end-of-turn token): transformers'
    generate stops on it, and so does ours after ``from_pretrained``. The eos is the
    first row's third greedy token, so that row finishes early and pads."""
    hf = _reference(torch, transformers, "llama")
    ids, mask = _batch()
    greedy = hf.generate(
        torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=6, do_sample=False
    ).numpy()
    eos = int(greedy[0, 11])
    hf.save_pretrained(tmp_path)
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(
        json.dumps({**generation, "eos_token_id": [eos, VOCAB - 1], "pad_token_id": 0})
    )
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    want = again.generate(
        torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=6, do_sample=False
    ).numpy()
    assert (want[0, 12:] == 0).all()  # transformers stopped that row
    model, params = M.from_pretrained(tmp_path)
    got = M.generate(model, params, ids, attention_mask=mask, max_new_tokens=6)
    np.testing.assert_array_equal(np.asarray(got), want)
    # The ids stay apart from config.json's (whose pad_token_id, none here, is the
    # embedding's padding row, as transformers builds it), and save_pretrained writes
    # them back as generation_config.json, which transformers reads.
    assert model.config.pad_token_id is again.config.pad_token_id is None
    assert again.model.embed_tokens.padding_idx is None
    assert dict(model.generation_config)["pad_token_id"] == 0
    M.save_pretrained(tmp_path / "ours", model, params)
    written = transformers.GenerationConfig.from_pretrained(tmp_path / "ours")
    assert (list(written.eos_token_id), written.pad_token_id) == ([eos, VOCAB - 1], 0)
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["pad_token_id"] is None
    model2, params2 = M.from_pretrained(tmp_path / "ours")
    assert model2 == model
    got = M.generate(model2, params2, ids, attention_mask=mask, max_new_tokens=6)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_a_generation_config_replaces_the_config_ids_and_saves_back_whole(
    torch, transformers, tmp_path
):
    """transformers takes ``generation_config.json`` whole as ``model.generation_config``:
    an id the file lacks is unset there (no fallback to ``config.json``), so with no pad
    id a finished row pads with the first eos id, not with ``config.json``'s pad id 0.
    ``save_pretrained`` writes the file back as it was (sampling defaults and the ids
    equal to the config's included), so transformers' generate on our folder is its
    generate on the original."""
    hf = _reference(torch, transformers, "llama", pad_token_id=0, bos_token_id=1)
    ids, mask = _batch()
    greedy = hf.generate(
        torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=6, do_sample=False
    ).numpy()
    eos = int(greedy[0, 11])  # the first row's third token: that row finishes and pads
    hf.save_pretrained(tmp_path / "hf")
    written = {
        "bos_token_id": 1,
        "eos_token_id": [eos, VOCAB - 1],
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.9,
        "max_length": 64,
    }
    (tmp_path / "hf" / "generation_config.json").write_text(json.dumps(written))
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    want = again.generate(
        torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=6, do_sample=False
    ).numpy()
    assert (want[0, 12:] == eos).all() and not (want[0, 12:] == 0).any()
    model, params = M.from_pretrained(tmp_path / "hf")
    assert dict(model.generation_config)["top_p"] == 0.9
    got = M.generate(model, params, ids, attention_mask=mask, max_new_tokens=6)
    np.testing.assert_array_equal(np.asarray(got), want)
    M.save_pretrained(tmp_path / "ours", model, params)
    read = json.loads((tmp_path / "ours" / "generation_config.json").read_text())
    assert read == {**written, "eos_token_id": [eos, VOCAB - 1]}
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval()
    settings = theirs.generation_config
    assert (settings.do_sample, settings.temperature, settings.top_p) == (True, 0.6, 0.9)
    assert (settings.pad_token_id, settings.bos_token_id) == (None, 1)
    np.testing.assert_array_equal(
        theirs.generate(
            torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=6,
            do_sample=False,
        ).numpy(),
        want,
    )  # fmt: skip


def test_ids_given_as_none_override_the_model_as_in_transformers(torch, transformers):
    """A keyword given to transformers' ``generate`` overrides the model's generation
    config even as ``None``: ``eos_token_id=None`` decodes every step (no stop),
    ``pad_token_id=None`` pads with the first eos id. Left out, both are the model's."""
    hf = _reference(torch, transformers, "llama")
    model, params = _ours(hf)
    ids, mask = _batch()
    free = np.asarray(
        M.generate(model, params, ids, attention_mask=mask, max_new_tokens=5, eos_token_id=None)
    )[:, 9:]
    # a token of the first row's first three that the second row never emits: the first
    # row finishes early, the second runs on
    step, eos = next((i, int(t)) for i, t in enumerate(free[0, :3]) if t not in free[1])
    hf.generation_config.eos_token_id, hf.generation_config.pad_token_id = eos, 0
    model = dataclasses.replace(model, generation_config={"eos_token_id": eos, "pad_token_id": 0})
    for kwargs in ({}, {"eos_token_id": None}, {"pad_token_id": None}):
        want = hf.generate(
            torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=5,
            do_sample=False, **kwargs,
        ).numpy()  # fmt: skip
        got = M.generate(model, params, ids, attention_mask=mask, max_new_tokens=5, **kwargs)
        np.testing.assert_array_equal(np.asarray(got), want)
    assert want.shape == (2, 14)  # pad_token_id=None: the first row padded with the eos id
    assert want[0, 9 + step :].tolist() == [eos] * (5 - step)


def test_greedy_decoding_ignores_the_sampling_settings_and_none_is_the_default():
    """transformers' greedy decoding ignores temperature, top-k and top-p (it warns);
    ``temperature=None`` is 1.0 when sampling; a NaN temperature is refused, as
    transformers' ``TemperatureLogitsWarper`` refuses it (it would make every
    probability NaN)."""
    model = M.LlamaForCausalLM(M.LlamaConfig(**TINY_LLAMA))
    params = model.init(jax.random.key(0), (1, 4))
    ids = np.array([[3, 4, 5, 6]])
    greedy = M.generate(model, params, ids, max_new_tokens=3)
    for odd in (dict(temperature=0.0), dict(top_p=1.5), dict(top_k=-1, temperature=None)):
        np.testing.assert_array_equal(
            M.generate(model, params, ids, max_new_tokens=3, **odd), greedy
        )
    key = jax.random.key(3)
    np.testing.assert_array_equal(
        M.generate(model, params, ids, max_new_tokens=3, do_sample=True, key=key, temperature=None),
        M.generate(model, params, ids, max_new_tokens=3, do_sample=True, key=key),
    )
    with pytest.raises(ValueError, match=r"^generate: temperature must be > 0, got nan$"):
        M.generate(
            model, params, ids, max_new_tokens=3, do_sample=True, key=key, temperature=float("nan")
        )


def test_config_errors_name_the_file(tmp_path):
    """A config ``from_pretrained`` cannot use is a ``ValueError`` naming the file and
    the problem: a rope type it does not implement, a rope type's missing entry."""
    folder = tmp_path / "m"
    folder.mkdir()
    base = {"model_type": "llama", **{k: v for k, v in TINY_LLAMA.items()}}
    for rope, problem in (
        ({"rope_type": "longrope", "factor": 2.0}, r"rope_type must be"),
        ({"rope_type": "linear"}, r"missing 'factor'"),
    ):
        (folder / "config.json").write_text(json.dumps({**base, "rope_scaling": rope}))
        with pytest.raises(ValueError, match=rf"^from_pretrained: .*config\.json: .*{problem}"):
            M.from_pretrained(folder)


def test_sampling_rules():
    """Top-k keeps the k largest, top-p the smallest set reaching p, temperature
    scales; the same key draws the same tokens."""
    logits = jnp.log(jnp.array([[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]]))
    keys = jax.random.split(jax.random.key(0), 200)

    @jax.jit  # 200 draws under each rule, one program
    def draws(keys):
        return [
            jax.vmap(lambda k, o=o: G.sample_logits(logits, k, do_sample=True, **o))(keys)
            for o in (dict(top_k=2), dict(top_p=0.5), dict(temperature=1e-3))
        ]

    top2, nucleus, cold = map(np.asarray, draws(keys))
    assert set(top2[:, 0]) == {2, 3}
    assert set(top2[:, 1]) <= {0, 1, 2, 3} and 0 in set(top2[:, 1])
    # top_p=0.5: row 0 keeps {3, 2} (0.4 alone < 0.5), row 1 keeps {0} (0.7 >= 0.5)
    assert set(nucleus[:, 0]) == {2, 3} and set(nucleus[:, 1]) == {0}
    assert (cold == np.array([3, 0])).all()
    same = G.sample_logits(logits, keys[0], do_sample=True)
    assert (np.asarray(same) == np.asarray(G.sample_logits(logits, keys[0], do_sample=True))).all()
    with pytest.raises(ValueError, match="do_sample=True needs key="):
        M.generate(None, None, np.zeros((1, 2), np.int32), max_new_tokens=2, do_sample=True)


class _Recorder:
    """transformers' streamer protocol: what ``put`` got, and how often ``end`` ran."""

    def __init__(self):
        self.got, self.ended = [], 0

    def put(self, ids):
        self.got.append(np.array(ids))

    def end(self):
        self.ended += 1


def test_sampled_generate_draws_step_i_with_fold_in_key_i_and_streams_each_step():
    """Sampled tokens are reproducible from the key, and each one is what
    ``sample_logits`` draws from the full forward's logits at its position with
    ``fold_in(key, i)`` (the decode step samples inside its program; this recomputes
    every draw outside it). ``top_k=1`` keeps only the argmax, so it samples the greedy
    tokens; the stacked-weight decode path draws the same; the streamer gets the
    prompt, then each step's tokens, then ``end`` once."""
    config = gpt2.GPT2Config(
        n_embd=16, n_layer=2, n_head=2, vocab_size=VOCAB, n_positions=32, eos_token_id=None
    )
    model = M.GPT2LMHeadModel(config)
    params = model.init(jax.random.key(0), (1, 1))
    ids = np.random.default_rng(3).integers(0, VOCAB, (2, 5))
    key, n, rule = jax.random.key(7), 6, dict(temperature=1.5, top_k=20, top_p=0.9)
    streamer = _Recorder()
    got = np.asarray(
        M.generate(
            model, params, ids, max_new_tokens=n, do_sample=True, key=key, streamer=streamer, **rule
        )
    )
    assert got.shape == (2, 5 + n)
    np.testing.assert_array_equal(got[:, :5], ids)

    @jax.jit
    def redrawn(params, seq):
        logits = model.apply(params, seq)[:, 4:]  # position 4 + i predicts token 5 + i
        return jax.vmap(
            lambda i, lg: G.sample_logits(lg, jax.random.fold_in(key, i), do_sample=True, **rule),
            in_axes=(0, 1),
            out_axes=1,
        )(jnp.arange(n), logits)

    np.testing.assert_array_equal(np.asarray(redrawn(params, got[:, :-1])), got[:, 5:])
    again = M.generate(model, params, ids, max_new_tokens=n, do_sample=True, key=key, **rule)
    np.testing.assert_array_equal(np.asarray(again), got)
    stacked = M.generate(
        model, params, ids, max_new_tokens=n, do_sample=True, key=key, unroll_blocks=False, **rule
    )
    np.testing.assert_array_equal(np.asarray(stacked), got)
    greedy = np.asarray(M.generate(model, params, ids, max_new_tokens=n))
    top1 = M.generate(model, params, ids, max_new_tokens=n, do_sample=True, key=key, top_k=1)
    np.testing.assert_array_equal(np.asarray(top1), greedy)
    assert streamer.ended == 1 and len(streamer.got) == 1 + n
    np.testing.assert_array_equal(streamer.got[0], ids)
    for i, tokens in enumerate(streamer.got[1:]):
        np.testing.assert_array_equal(tokens, got[:, 5 + i])


def test_sampling_defaults_are_transformers(transformers):
    """transformers' ``generate`` fills an unset ``top_k`` from its global defaults
    (50) and takes ``top_k=0`` as off: ``generate``'s default is transformers', unset
    the draws are those of ``top_k=50``; ``0`` and ``None`` keep every token (at a high
    temperature over 24 draws from a vocabulary of 200, some fall outside the 50
    likeliest)."""
    theirs = transformers.GenerationConfig._get_default_generation_params()
    ours = inspect.signature(M.generate).parameters
    assert ours["top_k"].default == theirs["top_k"] == 50
    assert ours["temperature"].default == theirs["temperature"]
    config = gpt2.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=200, eos_token_id=None)
    model = M.GPT2LMHeadModel(config)
    params = model.init(jax.random.key(0), (1, 1))
    ids = np.random.default_rng(3).integers(0, 200, (4, 3))
    run = functools.partial(
        M.generate, model, params, ids, max_new_tokens=6, do_sample=True, temperature=50.0
    )
    key = jax.random.key(1)
    np.testing.assert_array_equal(np.asarray(run(key=key)), np.asarray(run(key=key, top_k=50)))
    every = np.asarray(run(key=key, top_k=0))
    np.testing.assert_array_equal(every, np.asarray(run(key=key, top_k=None)))
    logits = np.asarray(model.apply(params, every))[:, 2:-1]  # the logits each draw saw
    rank = (logits > np.take_along_axis(logits, every[:, 3:, None], -1)).sum(-1)
    assert (rank >= 50).any(), rank


def test_hugging_face_folders_both_ways(torch, transformers, tmp_path):
    """transformers' save_pretrained (one file, and sharded) loads with our
    from_pretrained, ours loads with transformers', and logits agree."""
    hf = _reference(torch, transformers, "qwen2")
    hf.save_pretrained(tmp_path / "hf")
    hf.save_pretrained(tmp_path / "hf-sharded", max_shard_size="20KB")
    assert (tmp_path / "hf-sharded" / "model.safetensors.index.json").is_file()
    ids, _ = _batch()
    want = hf(torch.tensor(ids[:1])).logits.detach().numpy()
    for folder in ("hf", "hf-sharded"):
        model, params = M.from_pretrained(tmp_path / folder)
        assert isinstance(model, llama.Qwen2ForCausalLM)
        np.testing.assert_allclose(np.asarray(model.apply(params, ids[:1])), want, atol=2e-5)
    M.save_pretrained(tmp_path / "ours", model, params)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval()
    np.testing.assert_allclose(back(torch.tensor(ids[:1])).logits.detach().numpy(), want, atol=2e-5)
    M.save_pretrained(tmp_path / "ours-sharded", model, params, max_shard_size=20_000)
    assert (tmp_path / "ours-sharded" / "model.safetensors.index.json").is_file()
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours-sharded").eval()
    np.testing.assert_allclose(
        again(torch.tensor(ids[:1])).logits.detach().numpy(), want, atol=2e-5
    )
    bf16 = M.from_pretrained(tmp_path / "ours", dtype=jnp.bfloat16)[1]
    assert {a.dtype for a in jax.tree.leaves(bf16)} == {jnp.dtype(jnp.bfloat16)}
    # a bfloat16 folder keeps its dtype by default; a single-file save over a sharded
    # folder leaves no shard of the earlier layout
    M.save_pretrained(tmp_path / "ours-sharded", model, bf16)
    names = sorted(p.name for p in (tmp_path / "ours-sharded").iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors"]
    kept = M.from_pretrained(tmp_path / "ours-sharded")[1]
    assert {a.dtype for a in jax.tree.leaves(kept)} == {jnp.dtype(jnp.bfloat16)}


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_a_model_built_here_without_head_dim_saves_a_folder_transformers_loads(
    torch, transformers, kind, tmp_path
):
    """A config written without ``head_dim`` (``hidden_size // num_attention_heads``)
    leaves it out of config.json, as transformers does: its Qwen2 takes a ``null``
    literally. The folder loads in transformers with our logits."""
    cls = {
        "llama": llama.LlamaForCausalLM,
        "mistral": llama.MistralForCausalLM,
        "qwen2": llama.Qwen2ForCausalLM,
    }[kind]
    config = cls.config_class(**{k: v for k, v in TINY_LLAMA.items() if k != "head_dim"})
    model = cls(config)
    params = model.init(jax.random.key(0), (1, 4))
    params = jax.tree.map(
        lambda a: jax.random.normal(jax.random.key(a.size), a.shape) * 0.5, params
    )
    M.save_pretrained(tmp_path, model, params)
    assert "head_dim" not in json.loads((tmp_path / "config.json").read_text())
    assert M.from_pretrained(tmp_path)[0] == model
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids, _ = _batch()
    want = hf(torch.tensor(ids[:1])).logits.detach().numpy()
    np.testing.assert_allclose(np.asarray(model.apply(params, ids[:1])), want, atol=2e-5)


def test_a_tied_state_dict_loads_without_the_model(torch, transformers):
    """torch's ``state_dict()`` of a tied GPT-2 lists one tensor under ``lm_head.weight``
    and ``transformer.wte.weight``: it loads by name with no ``model=``. Separate copies
    under the two names (a file's) need the model to say they are tied."""
    hf = _reference(torch, transformers, "gpt2")
    model, _ = _ours(hf)
    template = model.init(jax.random.key(0), (1, 1))
    state = hf.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["transformer.wte.weight"].data_ptr()
    params = pl.params.load_state_dict(template, state)
    assert "lm_head.weight" not in pl.params.flatten(params)
    ids, _ = _batch()
    want = hf(torch.tensor(ids)).logits.detach().numpy()
    np.testing.assert_allclose(np.asarray(model.apply(params, ids)), want, atol=2e-5)
    numpy_views = {k: v.numpy() for k, v in state.items()}
    pl.params.load_state_dict(template, numpy_views)  # views of one memory too
    copies = {k: v.clone() for k, v in state.items()}
    with pytest.raises(KeyError, match=r"unexpected keys: \['lm_head\.weight'\]"):
        pl.params.load_state_dict(template, copies)
    again = pl.params.load_state_dict(template, copies, model=model)
    np.testing.assert_allclose(np.asarray(model.apply(again, ids)), want, atol=2e-5)


def test_gpt2_from_a_base_model_file_with_its_buffers(torch, transformers, tmp_path):
    """A GPT-2 folder as the hub's gpt2 is: names without ``transformer.`` and the old
    ``attn.bias``/``attn.masked_bias`` buffers. It loads, with the head tied."""
    hf = _reference(torch, transformers, "gpt2")
    hf.save_pretrained(tmp_path)
    from safetensors.numpy import load_file, save_file

    flat = load_file(tmp_path / "model.safetensors")
    base = {k.removeprefix("transformer."): v for k, v in flat.items() if k != "lm_head.weight"}
    base["h.0.attn.bias"] = np.tril(np.ones((1, 1, 32, 32), np.float32))
    base["h.0.attn.masked_bias"] = np.array(-1e4, np.float32)
    save_file(base, tmp_path / "model.safetensors", metadata={"format": "pt"})
    model, params = M.from_pretrained(tmp_path)
    assert isinstance(model, gpt2.GPT2LMHeadModel)
    ids, _ = _batch()
    want = hf(torch.tensor(ids)).logits.detach().numpy()
    np.testing.assert_allclose(np.asarray(model.apply(params, ids)), want, atol=2e-5)


@pytest.mark.parametrize("kind", ["linear", "dynamic", "yarn"])
def test_linear_and_dynamic_rope_scaling_equal_transformers(torch, transformers, kind):
    """``rope_type`` ``linear`` (frequencies / factor) and ``dynamic`` (NTK: the base
    grows once a call's positions reach past ``max_position_embeddings``, here 8): the
    logits of 20 tokens, and greedy decoding from 6 prompt tokens to 20, past the
    limit, equal transformers' (whose dynamic module grows its frequencies as the
    sequence does); ``yarn`` (frequencies blended by wavelength, cos/sin scaled)."""
    rope = {"rope_type": kind, "factor": 2.5, "rope_theta": 1000.0}
    if kind == "yarn":
        rope["original_max_position_embeddings"] = 4
    hf = _reference(torch, transformers, "llama", rope_parameters=rope, max_position_embeddings=8)
    model, params = _ours(hf)
    assert model.config.rope().factor == 2.5
    ids = np.random.default_rng(3).integers(6, VOCAB, (2, 20))
    want = hf(torch.tensor(ids)).logits.detach().numpy()
    np.testing.assert_allclose(np.asarray(model.apply(params, ids)), want, atol=2e-5)
    prompt = ids[:, :6]
    want = hf.generate(
        torch.tensor(prompt), max_new_tokens=14, do_sample=False, pad_token_id=0
    ).numpy()
    got = M.generate(model, params, prompt, max_new_tokens=14, pad_token_id=0)
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_mistral_and_qwen2_take_no_llama_bias_settings(torch, transformers, kind):
    """transformers' Mistral builds no projection bias and Qwen2 biases on q/k/v alone,
    whatever ``attention_bias``/``mlp_bias`` a ``config.json`` carries (neither config
    has those fields): ours reads such a config as they do (same names, same logits)
    and writes neither field; set on our config they are a ``ValueError``."""
    hf = _reference(torch, transformers, kind, attention_bias=True, mlp_bias=True)
    assert hf.config.attention_bias is True  # kept as an extra attribute, not used
    model, params = _ours(hf)
    ids = np.random.default_rng(4).integers(6, VOCAB, (2, 7))
    want = hf(torch.tensor(ids)).logits.detach().numpy()
    np.testing.assert_allclose(np.asarray(model.apply(params, ids)), want, atol=2e-5)
    assert "attention_bias" not in model.config.to_dict()
    with pytest.raises(ValueError, match=rf"^{type(model.config).__name__}: mlp_bias is not a"):
        type(model.config)(mlp_bias=True)


def test_configs_round_trip_and_unknown_models_are_named(transformers, tmp_path):
    hf = transformers.LlamaConfig(**TINY_LLAMA, rope_parameters=LLAMA3)
    config = llama.LlamaConfig.from_dict(hf.to_dict())
    assert hash(config) == hash(llama.LlamaConfig.from_dict(hf.to_dict()))
    assert config.rope() == llama.Llama3RotaryEmbedding(
        500000.0, factor=8.0, original_max_position_embeddings=16
    )
    assert (
        transformers.LlamaConfig.from_dict(config.to_dict()).rope_parameters["rope_type"]
        == "llama3"
    )
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(
        ValueError,
        match="model_type 'mamba'; supported: gpt2, llama, mistral, qwen2, bert, vit",
    ):
        M.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="GPT2Config: n_embd=10 must be divisible by n_head=3"):
        gpt2.GPT2Config(n_embd=10, n_head=3)


def test_a_left_padded_row_generates_what_it_generates_alone(torch, transformers):
    """The same tokens, token for token, with three pads in front or none."""
    model, params = _ours(_reference(torch, transformers, "llama"))
    ids, mask = _batch()
    both = np.asarray(M.generate(model, params, ids, attention_mask=mask, max_new_tokens=6))
    alone = np.asarray(M.generate(model, params, ids[1:, 3:], max_new_tokens=6))[0]
    # alone, the row stops at its eos (the config's, 2); in the batch it goes on padded
    np.testing.assert_array_equal(both[1, 3 : 3 + len(alone)], alone)
    assert (both[1, 3 + len(alone) :] == 2).all()


def test_the_file_names_are_the_params_names_with_or_without_the_tied_head(
    torch, transformers, tmp_path
):
    """transformers' folder holds exactly our names (GPT-2's tied head once); a file
    that also carries ``lm_head.weight`` (equal to ``transformer.wte.weight``) loads."""
    from safetensors.numpy import load_file, save_file

    hf = _reference(torch, transformers, "gpt2")
    hf.save_pretrained(tmp_path)
    flat = load_file(tmp_path / "model.safetensors")
    _, params = M.from_pretrained(tmp_path)
    ours = {k: v.shape for k, v in pl.params.flatten(params).items()}
    assert ours == {k: v.shape for k, v in flat.items() if k != "lm_head.weight"}
    flat["lm_head.weight"] = flat["transformer.wte.weight"]
    save_file(flat, tmp_path / "model.safetensors", metadata={"format": "pt"})
    _, again = M.from_pretrained(tmp_path)
    np.testing.assert_array_equal(
        pl.params.flatten(again)["transformer.wte.weight"], flat["transformer.wte.weight"]
    )
    flat["lm_head.weight"] = flat["lm_head.weight"] + 1
    save_file(flat, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(pl.params.CheckpointError, match=r"tied to 'transformer\.wte\.weight'"):
        M.from_pretrained(tmp_path)
