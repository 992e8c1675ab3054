"""Mixtral and Qwen3-MoE against transformers: names equal the saved file's keys,
logits, gradients, router logits and the load-balancing loss on a left-padded batch,
cached decoding, greedy ``generate``, folders both ways, and bad folders. Every
parameter of the reference is randomized."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import models as M
from purelayers.params import CheckpointError

VOCAB = 41
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=16,
    intermediate_size=12,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_experts_per_tok=2,
    max_position_embeddings=64,
)
CASES = {
    "mixtral": ("Mixtral", dict(num_local_experts=4, sliding_window=5)),
    "qwen3_moe": (
        "Qwen3Moe",
        dict(num_experts=5, moe_intermediate_size=12, norm_topk_prob=True, mlp_only_layers=[1]),
    ),
    "qwen3_moe-unnormalized": (
        "Qwen3Moe",
        dict(num_experts=4, moe_intermediate_size=8, decoder_sparse_step=1, attention_bias=True),
    ),
}


def _reference(torch, transformers, case):
    name, extra = CASES[case]
    config = getattr(transformers, f"{name}Config")(**{**TINY, **extra})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = getattr(transformers, f"{name}ForCausalLM")(config).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return hf


_MEMO: dict = {}


def _pair(torch, transformers, case, tmp_path_factory):
    """(hf, folder, model, params), made once per case."""
    if case not in _MEMO:
        hf = _reference(torch, transformers, case)
        folder = tmp_path_factory.mktemp(case)
        hf.save_pretrained(folder)
        model, params = M.from_pretrained(folder)
        _MEMO[case] = hf, folder, model, params
    return _MEMO[case]


def _batch():
    ids = np.random.default_rng(0).integers(3, VOCAB, (2, 9))
    mask = np.ones((2, 9), np.int64)
    mask[1, :3] = 0
    ids[1, :3] = 0
    return ids, mask


def _fused_grads(model, grads):
    """Our per-expert gradients in transformers' fused layout (``mlp.experts.gate_up_proj``
    ``(E, 2 * inter, hidden)``, ``mlp.experts.down_proj``), with Mixtral's
    ``block_sparse_moe`` as ``mlp``."""
    flat = pl.params.flatten(grads)
    out, mixtral = {}, model.config.model_type == "mixtral"
    gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for i in range(model.config.num_hidden_layers):
        pre = f"model.layers.{i}.{'block_sparse_moe' if mixtral else 'mlp'}"
        n = sum(
            1 for k in flat if k.startswith(f"{pre}.experts.") and k.endswith(f".{gate}.weight")
        )
        if not n:
            continue

        def w(p, pre=pre, n=n):
            return np.stack([flat[f"{pre}.experts.{e}.{p}.weight"] for e in range(n)])

        out[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.concatenate([w(gate), w(up)], 1)
        out[f"model.layers.{i}.mlp.experts.down_proj"] = w(down)
        out[f"model.layers.{i}.mlp.gate.weight"] = flat[f"{pre}.gate.weight"]
    for k, v in flat.items():
        if ".experts." not in k and ".gate.weight" not in k:
            out[k] = v
    return out


@pytest.mark.parametrize("case", CASES)
def test_names_logits_gradients_and_router_logits_match_transformers(
    torch, transformers, case, tmp_path_factory
):
    from safetensors import safe_open
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    hf, folder, model, params = _pair(torch, transformers, case, tmp_path_factory)
    with safe_open(folder / "model.safetensors", "np") as f:
        keys = set(f.keys())
    fresh = model.init(jax.random.key(0), (1, 1))
    assert set(pl.params.flatten(fresh)) == keys
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
    assert len(router) == len(out.router_logits)
    for a, b in zip(router, out.router_logits, strict=True):
        assert a.shape == tuple(b.shape)
        np.testing.assert_allclose(np.asarray(a)[rows], b.detach().numpy()[rows], atol=2e-5)
    c = model.config
    experts = getattr(c, "num_local_experts", None) or c.num_experts
    for m in (None, mask):
        want = load_balancing_loss_func(
            out.router_logits,
            experts,
            c.num_experts_per_tok,
            None if m is None else torch.tensor(m),
        )
        got = M.load_balancing_loss(router, experts, c.num_experts_per_tok, m)
        if m is None:  # padded rows' logits differ (every key masked): compare masked only
            continue
        np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
    ours = _fused_grads(model, grads)
    for name, p in hf.named_parameters():
        np.testing.assert_allclose(
            np.asarray(ours[name]), p.grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=name
        )


@pytest.mark.parametrize("case", ["mixtral", "qwen3_moe"])
def test_cached_decoding_generate_and_folders(torch, transformers, case, tmp_path_factory):
    """Prefill then one token at a time equals the full forward; greedy generate equals
    transformers' token for token; our folder loads in transformers with equal logits."""
    hf, _, model, params = _pair(torch, transformers, case, tmp_path_factory)
    ids, mask = _batch()
    keep = mask.astype(bool)
    full = model.apply(params, ids, attention_mask=mask)
    cache = model.init_cache((2, 12))
    slots = np.concatenate([mask, np.ones((2, 3), np.int64)], 1)
    step = jax.jit(lambda p, x, c: model.apply(p, x, attention_mask=slots, cache=c))
    logits, cache = step(params, ids[:, :6], cache)
    got = [logits]
    for t in range(6, 9):
        logits, cache = step(params, ids[:, t : t + 1], cache)
        got.append(logits)
    got = np.concatenate([np.asarray(g) for g in got], 1)
    np.testing.assert_allclose(got[keep], np.asarray(full)[keep], atol=2e-5)
    # logits_to_keep
    np.testing.assert_allclose(
        np.asarray(model.apply(params, ids, attention_mask=mask, logits_to_keep=2)),
        np.asarray(full)[:, -2:],
        atol=1e-6,
    )
    want = hf.generate(
        torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=6, do_sample=False,
        eos_token_id=7, pad_token_id=0,
    ).numpy()  # fmt: skip
    out = M.generate(
        model, params, ids, attention_mask=mask, max_new_tokens=6, eos_token_id=7, pad_token_id=0
    )
    np.testing.assert_array_equal(np.asarray(out), want)
    sampled = M.generate(
        model, params, ids, attention_mask=mask, max_new_tokens=4, temperature=0.7,
        key=jax.random.key(3),
    )  # fmt: skip
    assert sampled.shape == (2, 13)
    ours = M.save_pretrained(tmp_path_factory.mktemp(f"{case}-ours"), model, params)
    back = transformers.AutoModelForCausalLM.from_pretrained(ours).eval()
    again = back(torch.tensor(ids[:1])).logits.detach().numpy()
    np.testing.assert_allclose(np.asarray(model.apply(params, ids[:1])), again, atol=2e-5)


@pytest.mark.parametrize("case", ["mixtral", "qwen3_moe"])
def test_lora_capture_and_sharding_rules(torch, transformers, case, tmp_path_factory):
    """LoRA by target names on the attention projections (outputs unchanged at init),
    ``capture`` of a block's attention, and the transformer sharding rules on a
    one-device mesh, loading the folder sharded."""
    import purelayers.lora as lora
    import purelayers.sharding as S

    _, folder, model, params = _pair(torch, transformers, case, tmp_path_factory)
    ids, mask = _batch()
    base = np.asarray(model.apply(params, ids, attention_mask=mask))
    lmodel = lora.wrap(model, ["q_proj", "v_proj"], r=2)
    lparams = lora.init(lmodel, jax.random.key(1), params)
    assert len(lmodel.target_modules) == 2 * TINY["num_hidden_layers"]
    np.testing.assert_allclose(
        np.asarray(lmodel.apply(lparams, ids, attention_mask=mask)), base, atol=1e-5
    )
    probe = pl.capture(model.apply, "model.layers.0.self_attn")
    _, seen = jax.jit(probe)(params, ids, attention_mask=mask)
    assert seen["model.layers.0.self_attn"].shape == (2, 9, TINY["hidden_size"])
    mesh = S.make_mesh({"model": 1})
    rules = [*S.transformer_block("model.layers.*", axis="model"), ("*", S.P())]
    sharded = M.from_pretrained(
        folder, shardings=lambda m: S.named_shardings(
            pl.params.abstract(m, m.example_shape()), rules, mesh)
    )[1]  # fmt: skip
    np.testing.assert_allclose(
        np.asarray(model.apply(sharded, ids, attention_mask=mask)), base, atol=1e-6
    )


def test_bad_folders_are_refused(torch, transformers, tmp_path_factory):
    """``num_experts_per_tok`` above the experts: a ValueError naming config.json and
    the field; expert weights missing or misshapen: the checkpoint error naming each."""
    from safetensors.numpy import load_file, save_file

    _, folder, _, _ = _pair(torch, transformers, "mixtral", tmp_path_factory)
    bad = tmp_path_factory.mktemp("bad")
    config = json.loads((folder / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": 5}))
    with pytest.raises(ValueError, match=r"config\.json.*num_experts_per_tok"):
        M.from_pretrained(bad)
    (bad / "config.json").write_text(json.dumps(config))
    gone = "model.layers.1.block_sparse_moe.experts.2.w3.weight"
    wrong = "model.layers.0.block_sparse_moe.experts.1.w2.weight"
    for name in (gone, wrong):
        tensors = load_file(folder / "model.safetensors")
        if name == gone:
            del tensors[name]
        else:
            tensors[name] = tensors[name][:, :5].copy()
        save_file(tensors, bad / "model.safetensors")
        with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
            M.from_pretrained(bad)
