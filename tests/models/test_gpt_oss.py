"""gpt-oss against transformers: YaRN rope, the fused experts layer against
``GptOssMLP``, names equal the saved file's keys, logits, gradients, router logits and
the load-balancing loss on a left-padded batch (sliding window shorter than the
sequence, attention sinks), cached decoding, greedy ``generate``, folders both ways, an
MXFP4 folder against transformers' dequantization, and bad folders. Every parameter of
the reference is randomized."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import lora
from purelayers import models as M
from purelayers import sharding as S
from purelayers.params import CheckpointError

VOCAB = 64
YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "beta_fast": 8.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 8,
    "rope_theta": 1000.0,
}
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,  # MXFP4 groups 32 values: hidden and intermediate sizes are multiples
    intermediate_size=32,
    num_hidden_layers=2,  # sliding, full
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=4,
    max_position_embeddings=32,
    rope_parameters=YARN,
)


@pytest.fixture(scope="module")
def pair(torch, transformers, tmp_path_factory):
    """(hf, folder, model, params, forward): a randomized tiny GptOss, saved, loaded
    here; ``forward(params)`` the jitted logits on ``_batch()`` (compiled once)."""
    config = transformers.GptOssConfig(**TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.GptOssForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    folder = tmp_path_factory.mktemp("gpt_oss")
    hf.save_pretrained(folder)
    model, params = M.from_pretrained(folder)
    ids, mask = _batch()
    forward = jax.jit(lambda p: model.apply(p, ids, attention_mask=mask))
    return hf, folder, model, params, forward


def _hf_logits(torch, hf, ids, mask):
    positions = np.where(mask.astype(bool), np.cumsum(mask, 1) - 1, 0)
    with torch.no_grad():
        out = hf(
            torch.tensor(ids), attention_mask=torch.tensor(mask),
            position_ids=torch.tensor(positions),
        )  # fmt: skip
    return out.logits.numpy()


def _batch():
    ids = np.random.default_rng(0).integers(3, VOCAB, (2, 9))
    mask = np.ones((2, 9), np.int64)
    mask[1, :3] = 0
    ids[1, :3] = 0
    return ids, mask


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"truncate": True, "beta_fast": 16.0},
        {"mscale": 2.0, "mscale_all_dim": 1.0},
        {"attention_factor": 0.7, "factor": 8.0},
    ],
)
def test_yarn_rope_matches_transformers(transformers, extra):
    """``YarnRotaryEmbedding``'s frequencies and attention factor equal
    ``_compute_yarn_parameters``'s, and differ from the unscaled rope's."""
    from transformers.modeling_rope_utils import _compute_yarn_parameters

    config = transformers.GptOssConfig(**{**TINY, "rope_parameters": {**YARN, **extra}})
    want_inv, want_factor = _compute_yarn_parameters(config)
    rope = M.GptOssConfig.from_dict(config.to_dict()).rope()
    inv = rope.inv_freq(8, jnp.float32)
    np.testing.assert_allclose(np.asarray(inv), want_inv.numpy(), rtol=1e-6)
    assert rope.attention_scaling == pytest.approx(want_factor)
    plain = pl.layers.RotaryEmbedding(1000.0).inv_freq(8, jnp.float32)
    assert not np.allclose(np.asarray(inv), np.asarray(plain))
    assert rope.attention_scaling != 1.0


def test_moe_layer_matches_gpt_oss_mlp(torch, pair):
    """``MixtureOfExperts(style="gpt_oss")`` equals ``GptOssMLP`` (router bias, top-k
    softmax, interleaved clamped SwiGLU, biases), values and input gradients."""
    hf, _, model, params, _ = pair
    moe = model.children()["model"].layers[0].mlp
    p = params["model"]["layers"]["0"]["mlp"]
    x = np.random.default_rng(3).standard_normal((1, 7, 32)).astype(np.float32) * 2
    cot = np.random.default_rng(4).standard_normal(x.shape).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    want, _ = hf.model.layers[0].mlp(xt)
    (dx_want,) = torch.autograd.grad((want * torch.tensor(cot)).sum(), xt)  # no .grad kept
    run = jax.jit(lambda a, c: (moe.apply(p, a), jax.vjp(lambda b: moe.apply(p, b), a)[1](c)[0]))
    y, dx = run(jnp.asarray(x), jnp.asarray(cot))
    np.testing.assert_allclose(np.asarray(y), want.detach().numpy(), rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(dx), dx_want.numpy(), rtol=1e-5, atol=2e-5)


def test_names_logits_gradients_and_router_logits_match_transformers(torch, pair):
    from safetensors import safe_open
    from transformers.models.gpt_oss.modeling_gpt_oss import load_balancing_loss_func

    hf, folder, model, params, _ = pair
    hf.zero_grad(set_to_none=True)
    with safe_open(folder / "model.safetensors", "np") as f:
        keys = set(f.keys())
    assert set(pl.params.flatten(model.init(jax.random.key(0), (1, 1)))) == keys
    assert set(pl.params.flatten(params)) == keys
    ids, mask = _batch()
    keep = mask.astype(bool)
    cot = np.random.default_rng(2).standard_normal((*ids.shape, VOCAB)).astype(np.float32)
    cot *= keep[..., None]

    def loss(p):
        logits, router = model.apply(p, ids, attention_mask=mask, output_router_logits=True)
        return jnp.sum(logits * cot), (logits, router)

    (_, (logits, router)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    positions = np.where(keep, np.cumsum(mask, 1) - 1, 0)
    out = hf(
        torch.tensor(ids),
        attention_mask=torch.tensor(mask),
        position_ids=torch.tensor(positions),
        output_router_logits=True,
    )
    (out.logits * torch.tensor(cot)).sum().backward()
    np.testing.assert_allclose(
        np.asarray(logits)[keep], out.logits.detach().numpy()[keep], atol=2e-5
    )
    rows = keep.reshape(-1)
    assert len(router) == len(out.router_logits) == 2
    for a, b in zip(router, out.router_logits, strict=True):
        np.testing.assert_allclose(np.asarray(a)[rows], b.detach().numpy()[rows], atol=2e-5)
    c = model.config
    want = load_balancing_loss_func(
        out.router_logits, c.num_local_experts, c.num_experts_per_tok, torch.tensor(mask)
    )
    got = M.load_balancing_loss(router, c.num_local_experts, c.num_experts_per_tok, mask)
    np.testing.assert_allclose(float(got), want.item(), rtol=1e-5)
    flat = pl.params.flatten(grads)
    for name, p in hf.named_parameters():
        np.testing.assert_allclose(
            np.asarray(flat[name]), p.grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=name
        )


def test_cached_decoding_generate_lora_and_folders(torch, transformers, pair, tmp_path_factory):
    """One token at a time through the cache equals the full forward (past the
    window); greedy generate equals transformers' token for token; LoRA on the attention
    projections leaves the logits unchanged at init; ``capture`` sees an attention
    output; our folder loads in transformers with equal logits."""
    hf, _, model, params, forward = pair
    ids, mask = _batch()
    keep = mask.astype(bool)
    full = np.asarray(forward(params))
    cache = model.init_cache((2, 12))
    slots = np.concatenate([mask, np.ones((2, 3), np.int64)], 1)
    step = jax.jit(lambda p, x, c: model.apply(p, x, attention_mask=slots, cache=c))
    got = []
    for t in range(9):
        logits, cache = step(params, ids[:, t : t + 1], cache)
        got.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(got, 1)[keep], full[keep], atol=2e-5)
    want = hf.generate(
        torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=6, do_sample=False,
        eos_token_id=7, pad_token_id=0,
    ).numpy()  # fmt: skip
    out = M.generate(  # its prefill keeps one position's logits (logits_to_keep=1)
        model, params, ids, attention_mask=mask, max_new_tokens=6, eos_token_id=7, pad_token_id=0
    )
    np.testing.assert_array_equal(np.asarray(out), want)
    lmodel = lora.wrap(model, ["q_proj", "k_proj", "v_proj", "o_proj"], r=2)
    assert len(lmodel.target_modules) == 4 * 2
    lparams = lora.init(lmodel, jax.random.key(1), params)
    probe = pl.capture(model.apply, "model.layers.0.self_attn")
    both = jax.jit(
        lambda lp, p: (
            lmodel.apply(lp, ids, attention_mask=mask),
            probe(p, ids, attention_mask=mask)[1],
        )
    )
    adapted, seen = both(lparams, params)
    np.testing.assert_allclose(np.asarray(adapted), full, atol=1e-5)
    assert seen["model.layers.0.self_attn"].shape == (2, 9, 32)
    ours = M.save_pretrained(tmp_path_factory.mktemp("gpt_oss-ours"), model, params)
    back = transformers.AutoModelForCausalLM.from_pretrained(ours).eval()
    assert back.config.layer_types == hf.config.layer_types
    np.testing.assert_allclose(full[keep], _hf_logits(torch, back, ids, mask)[keep], atol=2e-5)


def _mxfp4_folder(folder, out, scales=(122, 130)):
    """``folder`` with its experts' ``gate_up_proj``/``down_proj`` replaced by random
    MXFP4 blocks and scales, and an ``mxfp4`` quantization_config."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(folder, out, dirs_exist_ok=True)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
            "lm_head",
        ],
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(config))
    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(5)
    for name in list(tensors):
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            e, n_in, n_out = tensors.pop(name).shape
            tensors[name + "_blocks"] = rng.integers(0, 256, (e, n_out, n_in // 32, 16), np.uint8)
            tensors[name + "_scales"] = rng.integers(*scales, (e, n_out, n_in // 32), np.uint8)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def test_mxfp4_folder_equals_transformers_dequantization(torch, transformers, pair, tmp_path):
    """A folder with MXFP4 experts: each dequantized array equals transformers'
    ``convert_moe_packed_tensors`` on the file's blocks and scales, in float32 and
    bfloat16 (and through a sharded load), and the logits equal those of transformers' own load of the folder; the
    saved folder is dense and has no quantization_config."""
    from safetensors import safe_open
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    _, folder, model, _, forward = pair
    mx = _mxfp4_folder(folder, tmp_path / "mxfp4")
    loaded, params = M.from_pretrained(mx, dtype=jnp.float32)
    assert loaded.config.to_dict() == model.config.to_dict()
    _, half = M.from_pretrained(mx)
    mesh = S.make_mesh({"model": 1})
    rules = [*S.transformer_block("model.layers.*", axis="model"), ("*", S.P())]
    sharded = M.from_pretrained(
        mx, dtype=jnp.float32, shardings=lambda m: S.named_shardings(
            pl.params.abstract(m, m.example_shape()), rules, mesh)
    )[1]  # fmt: skip
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    flat, flat_half = pl.params.flatten(params), pl.params.flatten(half)
    with safe_open(mx / "model.safetensors", "pt") as f:
        for i in range(2):
            for proj in ("gate_up_proj", "down_proj"):
                name = f"model.layers.{i}.mlp.experts.{proj}"
                blocks, scales = f.get_tensor(name + "_blocks"), f.get_tensor(name + "_scales")
                want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).numpy()
                np.testing.assert_array_equal(np.asarray(flat[name]), want, err_msg=name)
                assert flat_half[name].dtype == jnp.bfloat16
                np.testing.assert_array_equal(np.asarray(flat_half[name], np.float32), want)
    from transformers import Mxfp4Config

    hf = transformers.AutoModelForCausalLM.from_pretrained(
        mx, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.float32
    ).eval()
    ids, mask = _batch()
    keep = mask.astype(bool)
    want = _hf_logits(torch, hf, ids, mask)
    np.testing.assert_allclose(np.asarray(forward(params))[keep], want[keep], atol=5e-5)
    saved = M.save_pretrained(tmp_path / "dense", loaded, params)
    assert "quantization_config" not in json.loads((saved / "config.json").read_text())
    assert M.from_pretrained(saved)[0] == model


def test_bad_folders_are_refused(pair, tmp_path):
    """Another quantization method, ``num_experts_per_tok`` above the experts, another
    rope type: a ValueError naming config.json and the field; MXFP4 blocks without
    scales or with misshapen ones: the checkpoint error naming each."""
    from safetensors.numpy import load_file, save_file

    folder = pair[1]
    bad = tmp_path / "bad"
    bad.mkdir()
    config = json.loads((folder / "config.json").read_text())
    for change, field in (
        ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
        ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_type"),
        ({"layer_types": ["sliding_attention", "chunked"]}, r"layer_types\[1\]"),
    ):
        (bad / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ValueError, match=rf"config\.json.*{field}"):
            M.from_pretrained(bad)
    mx = _mxfp4_folder(folder, tmp_path / "mx")
    name = "model.layers.1.mlp.experts.down_proj"
    tensors = load_file(mx / "model.safetensors")
    for drop_it in (True, False):
        t = dict(tensors)
        if drop_it:
            del t[name + "_scales"]
        else:
            t[name + "_scales"] = t[name + "_scales"][:, :3].copy()
        save_file(t, mx / "model.safetensors")
        with pytest.raises(CheckpointError, match=name.replace(".", r"\.") + "_(blocks|scales)"):
            M.from_pretrained(mx)
