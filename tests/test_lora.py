"""``purelayers.lora`` against PEFT: the same base weights and the same (random) A and B
give the same outputs and adapter gradients; adapter folders go both ways; ``merge``
equals ``merge_and_unload``; only adapters train; every error names its argument.

Golden values come from torch and peft at test time. Every torch parameter is drawn at
random (``lora_B`` too, which PEFT starts at zero), so no name or layout mistake hides
behind a default init.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections import OrderedDict

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import purelayers as pl
from purelayers import layers as L
from purelayers import lora
from purelayers import models as M
from purelayers.params import CheckpointError

TOL = dict(rtol=1e-4, atol=1e-4)


# -- helpers ----------------------------------------------------------------------------


def _ours(name: str) -> str:
    """PEFT's ``state_dict`` name as ours: no ``base_model.model.``, ``base_layer.`` or
    adapter name (``default``)."""
    name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
    return re.sub(r"\.default(?=\.|$)", "", name)


def _randomize(torch, module, seed, scale=0.3, only=None):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if only is None or only in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def _load(lmodel, shape, torch_module):
    """Our params for ``lmodel`` from a (PEFT) torch module's ``state_dict``, by name."""
    flat = {_ours(k): v for k, v in torch_module.state_dict().items()}
    dtype = jnp.int32 if lmodel.takes_ids else jnp.float32
    template = pl.params.abstract(lmodel, jax.ShapeDtypeStruct(shape, dtype))
    names = set(pl.params.flatten(template)) | set(lmodel.aliases())
    return pl.params.load_state_dict(
        template, {k: v for k, v in flat.items() if k in names}, model=lmodel
    )


def _lora_grads(torch_module):
    return {
        _ours(n): p.grad.numpy()
        for n, p in torch_module.named_parameters()
        if "lora_" in n and p.grad is not None
    }


def _close(actual: dict, expected: dict, what: str):
    assert sorted(actual) == sorted(expected), (what, sorted(actual), sorted(expected))
    for k in expected:
        np.testing.assert_allclose(
            np.asarray(actual[k]), np.asarray(expected[k]), **TOL, err_msg=f"{what}: {k}"
        )


def _adapter_flat(params):
    flat = pl.params.flatten(params)
    return {k: v for k, v in flat.items() if "lora_" in k}


def _snapshot(tree):
    return {k: np.array(v) for k, v in pl.params.flatten(tree).items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _randomized_adapters(params, seed=1):
    """``params`` with every adapter leaf redrawn (B too), so nothing is zero."""
    keys = iter(jax.random.split(jax.random.key(seed), 64))
    mask = lora.trainable(params)
    return jax.tree.map(
        lambda a, m: 0.3 * jax.random.normal(next(keys), a.shape, a.dtype) if m else a,
        params,
        mask,
    )


# -- a plain torch module with q_proj / v_proj --------------------------------------------


def _mlp():
    return L.Sequential(
        {"q_proj": L.Linear(5), "act": L.Tanh(), "v_proj": L.Linear(4), "out": L.Linear(3)}
    )


def _mlp_pair(torch):
    nn = torch.nn
    theirs = nn.Sequential(
        OrderedDict(
            q_proj=nn.Linear(6, 5), act=nn.Tanh(), v_proj=nn.Linear(5, 4), out=nn.Linear(4, 3)
        )
    )
    _randomize(torch, theirs, 0)
    return theirs, _mlp()


@pytest.mark.parametrize("use_rslora", [False, True])
def test_linear_matches_peft_outputs_and_gradients(torch, peft, use_rslora):
    base, ours = _mlp_pair(torch)
    config = peft.LoraConfig(
        r=3, lora_alpha=5, target_modules=["q_proj", "v_proj"], use_rslora=use_rslora
    )
    theirs = peft.get_peft_model(copy.deepcopy(base), config)
    _randomize(torch, theirs, 1, only="lora_")
    lmodel = lora.wrap(ours, ("q_proj", "v_proj"), r=3, lora_alpha=5, use_rslora=use_rslora)
    assert lmodel.target_modules == ("q_proj", "v_proj")
    assert lmodel != ours and hash(lmodel) != hash(ours)
    for path, layer in lmodel.adapters().items():
        peft_layer = theirs.base_model.model.get_submodule(path)
        assert layer.scaling == pytest.approx(peft_layer.scaling["default"])
    assert lmodel.adapters()["q_proj"].scaling == pytest.approx(5 / 3**0.5 if use_rslora else 5 / 3)

    x = np.random.default_rng(0).normal(size=(2, 6)).astype(np.float32)
    g = np.random.default_rng(1).normal(size=(2, 3)).astype(np.float32)
    params = _load(lmodel, x.shape, theirs)
    torch_order = [_ours(k) for k in theirs.state_dict()]
    assert list(pl.params.flatten(lmodel.init(jax.random.key(0), x.shape))) == torch_order
    assert list(pl.params.flatten(lmodel.ordered(params))) == torch_order
    y_t = theirs(torch.tensor(x))
    (y_t * torch.tensor(g)).sum().backward()
    y, grads = lmodel.apply(params, x), jax.grad(lambda p: (lmodel.apply(p, x) * g).sum())(params)
    np.testing.assert_allclose(y, y_t.detach().numpy(), **TOL)
    _close(_adapter_flat(grads), _lora_grads(theirs), "adapter gradients")


def test_gradcheck_of_lora_layers():
    key = jax.random.key(0)
    lin = lora.LoraLinear(L.Linear(3, transposed=True), r=2, lora_alpha=3)
    p = _randomized_adapters(lin.init(key, (2, 4)))
    assert pl.testing.gradcheck(lin.apply, p, jax.random.normal(key, (2, 4)))
    conv = lora.LoraConv(L.Conv2d(2, 3, stride=2, padding=1), r=2, lora_alpha=4)
    p = _randomized_adapters(conv.init(key, (1, 2, 4, 4)))
    assert pl.testing.gradcheck(conv.apply, p, jax.random.normal(key, (1, 2, 4, 4)))
    emb = lora.LoraEmbedding(L.Embedding(5, 3), r=2, lora_alpha=2)
    p = _randomized_adapters(emb.init(key, (2, 3)))
    assert pl.testing.gradcheck(lambda p: emb.apply(p, jnp.array([[0, 1, 4], [1, 2, 2]])), p)


def test_trainable_is_true_exactly_on_adapter_leaves():
    ours = _mlp()
    lmodel = lora.wrap(ours, ["q_proj", "v_proj"], r=2)
    params = lmodel.init(jax.random.key(0), (1, 6))
    mask = pl.params.flatten(lora.trainable(params))
    assert [k for k, v in mask.items() if v] == [
        "q_proj.lora_A.weight",
        "q_proj.lora_B.weight",
        "v_proj.lora_A.weight",
        "v_proj.lora_B.weight",
    ]
    assert jax.tree.structure(lora.trainable(params)) == jax.tree.structure(params)


def test_dropout_uses_key_in_train_mode_only():
    ours = _mlp()
    lmodel = lora.wrap(ours, ["q_proj", "v_proj"], r=2, lora_dropout=0.5)
    plain = lora.wrap(ours, ["q_proj", "v_proj"], r=2)
    params = _randomized_adapters(lmodel.init(jax.random.key(0), (4, 6)))
    x = jax.random.normal(jax.random.key(1), (4, 6))
    k1, k2 = jax.random.key(2), jax.random.key(3)
    a = lmodel.apply(params, x, train=True, key=k1)
    assert np.array_equal(a, lmodel.apply(params, x, train=True, key=k1))
    assert not np.allclose(a, lmodel.apply(params, x, train=True, key=k2))
    assert np.array_equal(lmodel.apply(params, x), plain.apply(params, x))  # eval: none
    assert not np.allclose(a, lmodel.apply(params, x))
    assert np.array_equal(plain.apply(params, x, train=True, key=k1), plain.apply(params, x))
    # dropout is on the adapter's input only: with B = 0 train mode changes nothing
    zero_b = jax.tree_util.tree_map_with_path(
        lambda path, a: jnp.zeros_like(a) if "lora_B" in jax.tree_util.keystr(path) else a, params
    )
    assert np.array_equal(lmodel.apply(zero_b, x, train=True, key=k1), lmodel.apply(zero_b, x))
    with pytest.raises(
        ValueError, match=r"LoraLinear: train=True draws random numbers and needs a PRNG key"
    ):
        lmodel.apply(params, x, train=True)


@dataclasses.dataclass(frozen=True)
class _Stack(L.Layer):
    """A custom composite holding a tuple of layers (torch's ``ModuleList``) then a
    ``Remat``-wrapped ``Repeat``."""

    blocks: tuple
    deep: L.Layer

    def init(self, key, shape, dtype=jnp.float32):
        kids = self.children()
        return {
            "blocks": kids["blocks"].init(jax.random.fold_in(key, 0), shape, dtype),
            "deep": kids["deep"].init(jax.random.fold_in(key, 1), shape, dtype),
        }

    def apply(self, params, x, *, key=None, train=False):
        return self.call("deep", params, self.call("blocks", params, x))


def test_wrap_rewires_tuple_fields_remat_and_repeat():
    block = L.Sequential({"fc": L.Linear(3), "act": L.Tanh()})
    model = _Stack((L.Linear(3), L.Linear(3)), L.Remat(L.Repeat(block, 2)))
    lmodel = lora.wrap(model, ["blocks.1", "re:deep\\.\\d\\.fc"], r=2, lora_alpha=3)
    assert lmodel.target_modules == ("blocks.1", "deep.0.fc", "deep.1.fc")
    base = model.init(jax.random.key(0), (2, 3))
    params = _randomized_adapters(lora.init(lmodel, jax.random.key(1), base))
    assert [k for k in pl.params.flatten(params) if "lora_" in k] == [
        "blocks.1.lora_A.weight",
        "blocks.1.lora_B.weight",
        "deep.0.fc.lora_A.weight",
        "deep.0.fc.lora_B.weight",
        "deep.1.fc.lora_A.weight",
        "deep.1.fc.lora_B.weight",
    ]
    x = jax.random.normal(jax.random.key(2), (2, 3))
    same, merged = lora.merge(lmodel, params)
    assert same is model
    np.testing.assert_allclose(lmodel.apply(params, x), model.apply(merged, x), **TOL)
    assert not np.allclose(lmodel.apply(params, x), model.apply(base, x))


# -- transformers models -------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2(transformers, torch, tmp_path_factory):
    config = transformers.GPT2Config(
        n_embd=16, n_layer=2, n_head=2, vocab_size=50, n_positions=32, bos_token_id=None,
        eos_token_id=None,
    )  # fmt: skip
    base = transformers.GPT2LMHeadModel(config).eval()
    _randomize(torch, base, 10, scale=0.2)
    folder = tmp_path_factory.mktemp("gpt2")
    base.save_pretrained(folder)
    model, params = M.from_pretrained(folder)
    return base, model, params


@pytest.fixture(scope="module")
def llama(transformers, torch, tmp_path_factory):
    config = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=50, max_position_embeddings=32,
    )  # fmt: skip
    base = transformers.LlamaForCausalLM(config).eval()
    _randomize(torch, base, 11, scale=0.2)
    folder = tmp_path_factory.mktemp("llama")
    base.save_pretrained(folder)
    model, params = M.from_pretrained(folder)
    return base, model, params


IDS = np.array([[3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 8, 9, 7]], np.int64)


def _logits(torch, module, ids=IDS):
    return module(torch.tensor(ids)).logits


@pytest.mark.parametrize("which, targets", [("gpt2", ["c_attn"]), ("llama", ["q_proj", "v_proj"])])
def test_transformers_models_match_peft(torch, peft, request, which, targets):
    base, model, base_params = request.getfixturevalue(which)
    theirs = peft.get_peft_model(
        copy.deepcopy(base), peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets)
    )
    _randomize(torch, theirs, 12, only="lora_")
    lmodel = lora.wrap(model, targets, r=4, lora_alpha=8)
    peft_targets = sorted(
        n for n, m in theirs.base_model.model.named_modules() if hasattr(m, "lora_A")
    )
    assert sorted(lmodel.target_modules) == peft_targets
    if which == "gpt2":  # the base model's check and caches first: the wrapped one differs
        np.testing.assert_allclose(
            model.apply(base_params, IDS), _logits(torch, base).detach().numpy(), **TOL
        )
    assert lmodel != model
    params = _load(lmodel, IDS.shape, theirs)
    g = np.random.default_rng(0).normal(size=(*IDS.shape, 50)).astype(np.float32)
    (_logits(torch, theirs) * torch.tensor(g)).sum().backward()

    def loss(p):
        logits = lmodel.apply(p, IDS)
        return (logits * g).sum(), logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    np.testing.assert_allclose(logits, _logits(torch, theirs).detach().numpy(), **TOL)
    _close(_adapter_flat(grads), _lora_grads(theirs), "adapter gradients")


_DROPOUT_TARGETS = {
    "gpt2": ["attn.c_attn", "mlp.c_proj"],
    # an attention output, an MLP input and the head (the other projections are built by
    # the same code as their neighbours)
    "llama": ["o_proj", "up_proj", "lm_head"],
}


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_lora_dropout_acts_in_the_models_train_mode(request, which):
    """PEFT's dropout on each adapter's input, in train mode, inside the library's causal
    models: each target's projection gets a key of its own. With the model's
    own dropouts at 0, each single target with ``lora_dropout=0.5`` changes the train-
    mode logits (and two keys give two results, one key one), while eval mode and
    ``lora_dropout=0`` leave them as without dropout."""
    _, model, base_params = request.getfixturevalue(which)
    if which == "gpt2":
        config = dataclasses.replace(model.config, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    else:
        config = dataclasses.replace(model.config, attention_dropout=0.0)
    model = type(model)(config)
    k1, k2 = jax.random.key(1), jax.random.key(2)
    for target in _DROPOUT_TARGETS[which]:
        lmodel = lora.wrap(model, [target], r=2, lora_alpha=4, lora_dropout=0.5)
        plain = lora.wrap(model, [target], r=2, lora_alpha=4)
        params = _randomized_adapters(lora.init(lmodel, jax.random.key(0), base_params))
        eval_ = lmodel.apply(params, IDS)
        a = lmodel.apply(params, IDS, train=True, key=k1)
        assert not np.allclose(a, eval_), target
        np.testing.assert_array_equal(a, lmodel.apply(params, IDS, train=True, key=k1))
        assert not np.allclose(a, lmodel.apply(params, IDS, train=True, key=k2)), target
        np.testing.assert_array_equal(eval_, plain.apply(params, IDS))
        np.testing.assert_array_equal(plain.apply(params, IDS, train=True, key=k1), eval_)


def test_bfloat16_base_gets_float32_adapters_as_peft(torch, peft, llama, tmp_path):
    """PEFT's ``autocast_adapter_dtype=True`` (its default) keeps the adapters of a
    bfloat16 model in float32, computes them in float32 and casts the sum back: so do
    ``init`` and ``load_adapter``, and the logits agree with PEFT's to bfloat16's
    precision; ``merge`` gives bfloat16 weights again."""
    base, model, base_params = llama
    theirs = peft.get_peft_model(
        copy.deepcopy(base).to(torch.bfloat16),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    _randomize(torch, theirs, 13, only="lora_")
    assert {p.dtype for n, p in theirs.named_parameters() if "lora_" in n} == {torch.float32}
    theirs.save_pretrained(tmp_path)
    lmodel = lora.wrap(model, ["q_proj", "v_proj"], r=4, lora_alpha=8)
    bf16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), base_params)
    fresh = lora.init(lmodel, jax.random.key(0), bf16)
    loaded = lora.load_adapter(tmp_path, lmodel, bf16)
    for tree in (fresh, loaded):
        kinds = {
            ("lora_" in jax.tree_util.keystr(path), np.dtype(leaf.dtype).name)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        }
        assert kinds == {(True, "float32"), (False, "bfloat16")}
    want = theirs(torch.tensor(IDS)).logits.float().detach().numpy()
    got = lmodel.apply(loaded, IDS)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=0.05, atol=0.05)
    _, merged = lora.merge(lmodel, loaded)
    assert {np.dtype(leaf.dtype).name for leaf in jax.tree.leaves(merged)} == {"bfloat16"}


def test_gpt2_adapter_round_trips_with_peft(torch, peft, gpt2, tmp_path):
    base, model, base_params = gpt2
    kept = _snapshot(base_params)
    lmodel = lora.wrap(model, ["*.attn.c_attn", "attn.c_proj"], r=4, lora_alpha=16)
    params = _randomized_adapters(lora.init(lmodel, jax.random.key(0), base_params))
    folder = lora.save_adapter(tmp_path / "ours" / "adapter", lmodel, params)
    saved = pl.params.load(folder / "adapter_model.safetensors")
    assert sorted(saved) == sorted("base_model.model." + k for k in _adapter_flat(params))
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["fan_in_fan_out"] is True and config["r"] == 4
    assert config["target_modules"] == list(lmodel.target_modules)
    reference = peft.LoraConfig(
        r=4,
        lora_alpha=16,
        target_modules=list(lmodel.target_modules),
        fan_in_fan_out=True,
        task_type="CAUSAL_LM",
        base_model_name_or_path=model.name_or_path,
    ).to_dict()
    skip = {"target_modules", "inference_mode", "peft_type"}
    assert set(config) <= set(reference)
    assert {k: v for k, v in config.items() if k not in skip} == {
        k: reference[k] for k in config if k not in skip
    }
    # ours -> PEFT
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(base), folder).eval()
    with torch.no_grad():
        expected = _logits(torch, theirs).numpy()
    np.testing.assert_allclose(lmodel.apply(params, IDS), expected, **TOL)
    # PEFT -> ours
    theirs = peft.get_peft_model(
        copy.deepcopy(base), peft.LoraConfig(r=4, lora_alpha=16, target_modules=["c_attn"])
    )
    _randomize(torch, theirs, 13, only="lora_")
    theirs.save_pretrained(tmp_path / "peft")
    lmodel2 = lora.wrap(model, ["c_attn"], r=4, lora_alpha=16)
    loaded = lora.load_adapter(tmp_path / "peft", lmodel2, base_params)
    with torch.no_grad():
        expected = _logits(torch, theirs.eval()).numpy()
    np.testing.assert_allclose(lmodel2.apply(loaded, IDS), expected, **TOL)
    assert _same(_snapshot(base_params), kept)


def test_peft_default_save_of_embedding_targets_loads_with_its_base_weights(
    torch, peft, llama, tmp_path
):
    """With ``embed_tokens`` or ``lm_head`` among the targets, PEFT's default
    ``save_pretrained`` (``save_embedding_layers="auto"``) writes their base weights too,
    as ``<name>.base_layer.weight``, and ``PeftModel.from_pretrained`` loads them into
    the model: ``load_adapter`` reads such a folder and takes those weights as well (the
    saved base weights are perturbed here, so ignoring them would change the logits)."""
    base, model, base_params = llama
    kept = _snapshot(base_params)
    for i, targets in enumerate((["lm_head", "q_proj"], ["embed_tokens", "v_proj"])):
        theirs = peft.get_peft_model(
            copy.deepcopy(base), peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets)
        )
        _randomize(torch, theirs, 30 + i, only="lora_")
        _randomize(torch, theirs, 40 + i, only=targets[0] + ".base_layer")
        folder = tmp_path / f"peft{i}"
        theirs.save_pretrained(folder)
        saved = pl.params.load(folder / "adapter_model.safetensors")
        assert any(k.endswith(f"{targets[0]}.base_layer.weight") for k in saved), sorted(saved)
        with torch.no_grad():
            expected = _logits(torch, peft.PeftModel.from_pretrained(copy.deepcopy(base), folder))
        lmodel = lora.wrap(model, targets, r=4, lora_alpha=8)
        loaded = lora.load_adapter(folder, lmodel, base_params)
        np.testing.assert_allclose(lmodel.apply(loaded, IDS), expected.numpy(), **TOL)
        name = next(k for k in pl.params.flatten(base_params) if k.endswith(targets[0] + ".weight"))
        assert not np.allclose(pl.params.flatten(loaded)[name], kept[name])
    assert _same(_snapshot(base_params), kept)
    # A resized vocabulary's base weight does not fit the model: named, nothing loaded.
    flat = {k: np.asarray(v) for k, v in saved.items()}
    key = next(k for k in flat if k.endswith("base_layer.weight"))
    flat[key] = np.zeros((flat[key].shape[0] + 2, flat[key].shape[1]), np.float32)
    pl.params.save(folder / "adapter_model.safetensors", pl.params.unflatten(flat))
    with pytest.raises(CheckpointError, match=r"base weights it holds beside the adapter do not"):
        lora.load_adapter(folder, lmodel, base_params)


def test_modules_to_save_on_one_side_of_a_tie_is_refused_not_applied_to_both(
    torch, peft, gpt2, tmp_path
):
    """GPT-2's ``lm_head`` is tied to ``transformer.wte``. PEFT's ``modules_to_save``
    copies only the named module (its default ``ensure_weight_tying=False`` unties the
    pair), so a trained ``lm_head`` leaves the embedding as it was; a tied model cannot
    hold that, so ``load_adapter`` refuses the folder (before: the shared weight took the
    new head, changing the embedding too: logits 0.35 off PEFT's). With
    ``ensure_weight_tying=True`` PEFT keeps the tie, and the folder loads and matches."""
    base, model, base_params = gpt2
    for i, tie in enumerate((False, True)):
        config = peft.LoraConfig(
            r=4, lora_alpha=8, target_modules=["c_attn"], modules_to_save=["lm_head"],
            ensure_weight_tying=tie,
        )  # fmt: skip
        theirs = peft.get_peft_model(copy.deepcopy(base), config)
        _randomize(torch, theirs, 50 + i, only="lora_")
        _randomize(torch, theirs, 60 + i, only="modules_to_save")
        folder = tmp_path / f"tie-{tie}"
        theirs.save_pretrained(folder)
        lmodel = lora.wrap(model, ["c_attn"], r=4, lora_alpha=8)
        if not tie:
            with pytest.raises(
                CheckpointError,
                match=r"holds a new 'lm_head\.weight' but not 'transformer\.wte\.weight'",
            ):
                lora.load_adapter(folder, lmodel, base_params)
            continue
        with torch.no_grad():
            expected = _logits(torch, peft.PeftModel.from_pretrained(copy.deepcopy(base), folder))
        loaded = lora.load_adapter(folder, lmodel, base_params)
        np.testing.assert_allclose(lmodel.apply(loaded, IDS), expected.numpy(), **TOL)


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_all_linear_targets_what_peft_targets(torch, peft, request, tmp_path, which):
    """``target_modules="all-linear"`` (PEFT's shorthand): every ``Linear`` (GPT-2's
    ``Conv1D`` included) but the output layer ``lm_head``, the same modules PEFT wraps;
    PEFT's adapter for it loads into ours with equal logits."""
    base, model, base_params = request.getfixturevalue(which)
    theirs = peft.get_peft_model(
        copy.deepcopy(base), peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    )
    lmodel = lora.wrap(model, "all-linear", r=4, lora_alpha=8)
    assert sorted(lmodel.target_modules) == sorted(theirs.peft_config["default"].target_modules)
    _randomize(torch, theirs, 70, only="lora_")
    theirs.save_pretrained(tmp_path / which)
    with torch.no_grad():
        expected = _logits(torch, theirs)
    loaded = lora.load_adapter(tmp_path / which, lmodel, base_params)
    np.testing.assert_allclose(lmodel.apply(loaded, IDS), expected.numpy(), **TOL)
    with pytest.raises(ValueError, match=r"target_modules 'all-linear': Sequential has no Linear"):
        lora.wrap(L.Sequential([L.ReLU()]), "all-linear")


def test_config_targets_are_a_regex_where_peft_would_take_in_more_modules(torch, peft, tmp_path):
    """PEFT reads a ``target_modules`` list as names matching any path equal to one or
    ending in ``.`` + one: a target ``fc`` would also take in ``head.fc``. The config
    then holds one regular expression of the paths, which PEFT matches whole, so PEFT
    wraps exactly ours (and its save of it loads back); a plain list otherwise."""
    nn = torch.nn
    net = nn.Sequential(
        OrderedDict(
            fc=nn.Linear(4, 6), act=nn.ReLU(), head=nn.Sequential(OrderedDict(fc=nn.Linear(6, 3)))
        )
    )
    _randomize(torch, net, 50)
    ours = L.Sequential(
        {"fc": L.Linear(6), "act": L.ReLU(), "head": L.Sequential({"fc": L.Linear(3)})}
    )
    base = pl.params.load_state_dict(pl.params.abstract(ours, (2, 4)), net.state_dict())
    x = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
    for targets, written in ((["re:fc"], "fc"), (["head.fc"], ["head.fc"]), (["fc"], None)):
        lmodel = lora.wrap(ours, targets, r=2, lora_alpha=4)
        params = _randomized_adapters(lora.init(lmodel, jax.random.key(0), base))
        folder = lora.save_adapter(tmp_path / "_".join(targets), lmodel, params)
        config = json.loads((folder / "adapter_config.json").read_text())
        if written is not None:
            assert config["target_modules"] == written
        theirs = peft.PeftModel.from_pretrained(copy.deepcopy(net), folder).eval()
        wrapped = [n for n, m in theirs.base_model.model.named_modules() if hasattr(m, "lora_A")]
        assert wrapped == list(lmodel.target_modules)
        with torch.no_grad():
            np.testing.assert_allclose(
                lmodel.apply(params, x), theirs(torch.tensor(x)).numpy(), **TOL
            )
        theirs.save_pretrained(tmp_path / ("peft_" + "_".join(targets)))
        again = lora.load_adapter(tmp_path / ("peft_" + "_".join(targets)), lmodel, base)
        _close(_adapter_flat(again), _adapter_flat(params), "PEFT's save of ours")


def test_numpy_scalar_settings_are_written_as_json_numbers(tmp_path):
    model = _seq()
    base = model.init(jax.random.key(0), (1, 3))
    lmodel = lora.wrap(
        model, ["q_proj"], r=np.int64(2), lora_alpha=np.float32(4), lora_dropout=np.float64(0.1)
    )
    assert (type(lmodel.r), type(lmodel.lora_alpha), type(lmodel.lora_dropout)) == (
        int,
        float,
        float,
    )
    folder = lora.save_adapter(tmp_path / "a", lmodel, lora.init(lmodel, jax.random.key(1), base))
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (2, 4.0, 0.1)
    assert lora.load_adapter(folder, lmodel, base)["q_proj"]["lora_A"]["weight"].shape == (2, 3)


def test_merge_equals_peft_merge_and_unload(torch, peft, gpt2):
    base, model, base_params = gpt2
    theirs = peft.get_peft_model(
        copy.deepcopy(base), peft.LoraConfig(r=2, lora_alpha=3, target_modules=["c_attn", "c_fc"])
    )
    _randomize(torch, theirs, 14, only="lora_")
    lmodel = lora.wrap(model, ["c_attn", "c_fc"], r=2, lora_alpha=3)
    params = _load(lmodel, IDS.shape, theirs)
    merged_model, merged = lora.merge(lmodel, params)
    assert merged_model is model
    assert list(pl.params.flatten(merged)) == list(pl.params.flatten(base_params))
    assert list(pl.params.flatten(model.ordered(merged))) == list(
        pl.params.flatten(model.init(jax.random.key(0), IDS.shape))
    )
    flat = {k: v.numpy() for k, v in theirs.merge_and_unload().state_dict().items()}
    ours = pl.params.flatten(merged)
    _close(ours, {k: flat[k] for k in ours}, "merged weights")
    np.testing.assert_allclose(
        jax.jit(model.apply)(merged, IDS), jax.jit(lmodel.apply)(params, IDS), **TOL
    )
    # what M.generate reads of a model is the wrapped model's too
    assert lmodel.config == model.config and lmodel.base_model_prefix == "transformer"
    assert jax.tree.map(jnp.shape, lmodel.init_cache((1, 8))) == jax.tree.map(
        jnp.shape, model.init_cache((1, 8))
    )


def test_optax_step_moves_only_adapters(gpt2):
    _, model, base_params = gpt2
    lmodel = lora.wrap(model, ["c_attn"], r=4, lora_alpha=8)
    params = _randomized_adapters(lora.init(lmodel, jax.random.key(0), base_params))
    mask = lora.trainable(params)
    tx = optax.multi_transform({True: optax.adam(1e-2), False: optax.set_to_zero()}, mask)
    state = tx.init(params)

    @jax.jit
    def step(p, s):
        loss, grads = jax.value_and_grad(
            lambda p: optax.softmax_cross_entropy_with_integer_labels(
                lmodel.apply(p, IDS[:, :-1]), IDS[:, 1:]
            ).mean()
        )(p)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    before = _snapshot(params)
    new, state, _ = step(params, state)
    after = _snapshot(new)
    trained = {k for k, v in pl.params.flatten(mask).items() if v}
    assert all(np.array_equal(before[k], after[k]) for k in before if k not in trained)
    assert all(not np.array_equal(before[k], after[k]) for k in trained)
    adapter_bytes = sum(before[k].nbytes for k in trained)
    state_bytes = sum(a.nbytes for a in jax.tree.leaves(state))
    full_state = jax.eval_shape(optax.adam(1e-2).init, params)
    full = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(full_state))
    assert state_bytes == 2 * adapter_bytes + 4  # mu, nu and adam's step count
    assert state_bytes < full / 5
    print(f"optax state: LoRA {state_bytes} bytes, full-model adam {full} bytes")


# -- Embedding and Conv2d -------------------------------------------------------------------


def test_embedding_and_conv_match_peft(torch, peft, tmp_path):
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(11, 6, padding_idx=0)
            self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)

    base = Net()
    _randomize(torch, base, 20)
    config = peft.LoraConfig(r=2, lora_alpha=5, target_modules=["emb", "conv"])
    theirs = peft.get_peft_model(copy.deepcopy(base), config)
    _randomize(torch, theirs, 21, only="lora_")
    net = theirs.base_model.model
    ids = np.array([[0, 3, 10], [5, 0, 3]])
    img = np.random.default_rng(0).normal(size=(2, 3, 5, 5)).astype(np.float32)
    cases = [
        ("emb", L.Embedding(11, 6, padding_idx=0), ids, torch.tensor(ids)),
        ("conv", L.Conv2d(4, 3, stride=2, padding=1), img, torch.tensor(img)),
    ]
    flat = {_ours(k): v for k, v in theirs.state_dict().items()}
    merged_t = {
        k: v.numpy() for k, v in copy.deepcopy(theirs).merge_and_unload().state_dict().items()
    }
    for name, layer, x, xt in cases:
        lmodel = lora.wrap(L.Sequential({name: layer}), [name], r=2, lora_alpha=5)
        sub = {k: v for k, v in flat.items() if k.startswith(name + ".")}
        template = pl.params.abstract(lmodel, jax.ShapeDtypeStruct(x.shape, x.dtype))
        params = pl.params.load_state_dict(template, sub)
        y_t = getattr(net, name)(xt)
        g = np.random.default_rng(2).normal(size=tuple(y_t.shape)).astype(np.float32)
        (y_t * torch.tensor(g)).sum().backward()

        def loss(p, m=lmodel, x=x, g=g):
            y = m.apply(p, x)
            return (y * g).sum(), y

        grads, y = jax.jit(jax.grad(loss, has_aux=True))(params)  # one program for both
        np.testing.assert_allclose(y, y_t.detach().numpy(), **TOL, err_msg=name)
        expect = {k: v for k, v in _lora_grads(theirs).items() if k.startswith(name + ".")}
        _close(_adapter_flat(grads), expect, f"{name} adapter gradients")
        if name == "emb":  # ids hold padding_idx 0: its column of A gets no gradient
            assert not np.asarray(grads["emb"]["lora_embedding_A"])[:, 0].any()
            assert np.asarray(grads["emb"]["lora_embedding_A"])[:, 3].any()
        _, merged = lora.merge(lmodel, params)
        _close(pl.params.flatten(merged), {k: merged_t[k] for k in pl.params.flatten(merged)}, name)
    # adapter folders, both ways, for the two kinds at once
    both = lora.wrap(
        L.Sequential(dict((c[0], c[1]) for c in cases)), ["emb", "conv"], r=2, lora_alpha=5
    )
    base_params = {
        "emb": cases[0][1].init(jax.random.key(0), ids.shape),
        "conv": cases[1][1].init(jax.random.key(1), img.shape),
    }
    theirs.save_pretrained(tmp_path / "peft")
    loaded = lora.load_adapter(tmp_path / "peft", both, base_params)
    _close(_adapter_flat(loaded), {k: v.numpy() for k, v in flat.items() if "lora_" in k}, "file")
    mine = _randomized_adapters(loaded, seed=5)
    lora.save_adapter(tmp_path / "ours", both, mine)
    again = peft.PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "ours")
    _close(
        _adapter_flat(mine),
        {_ours(k): v.numpy() for k, v in again.state_dict().items() if "lora_" in k},
        "ours in PEFT",
    )


# -- bad input ------------------------------------------------------------------------------


def _seq():
    return L.Sequential({"q_proj": L.Linear(4), "act": L.ReLU(), "v_proj": L.Linear(2)})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(target_modules=[]), r"lora.wrap: target_modules must be a name or a non-empty"),
        (dict(target_modules=[3]), r"lora.wrap: target_modules\[0\] pattern must be a string"),
        (dict(target_modules=["k_proj"]), r"target_modules \['k_proj'\] match no Linear"),
        (dict(target_modules=["act"]), r"target_modules 'act' matches 'act', a ReLU"),
        (dict(target_modules=["q_proj"], r=0), r"lora.wrap: r must be a positive integer, got 0"),
        (
            dict(target_modules=["q_proj"], lora_alpha=0),
            r"lora.wrap: lora_alpha must be > 0, got 0",
        ),
        (
            dict(target_modules=["q_proj"], lora_alpha=jnp.float32(8)),
            r"lora.wrap: lora_alpha must be a Python or NumPy number > 0, got Array\(8",
        ),
        (
            dict(target_modules=["q_proj"], lora_dropout=1.0),
            r"lora.wrap: lora_dropout must be in \[0, 1\), got 1.0",
        ),
        (
            dict(target_modules=["q_proj"], use_rslora="yes"),
            r"lora.wrap: use_rslora must be True or False, got 'yes'",
        ),
        (dict(target_modules=["q_proj"], bias="all"), r"lora.wrap: bias must be one of 'none'"),
    ],
)
def test_wrap_rejects_bad_arguments(kwargs, message):
    model = _seq()
    before = copy.deepcopy(model)
    with pytest.raises(ValueError, match=message):
        lora.wrap(model, **kwargs)
    assert model == before


def test_wrap_rejects_models_it_cannot_wrap(gpt2):
    with pytest.raises(ValueError, match=r"lora.wrap: model must be a purelayers Layer"):
        lora.wrap("gpt2", ["c_attn"])
    lmodel = lora.wrap(_seq(), ["q_proj"])
    with pytest.raises(ValueError, match=r"lora.wrap: model is already LoRA-wrapped"):
        lora.wrap(lmodel, ["v_proj"])
    _, model, _ = gpt2
    with pytest.raises(ValueError, match=r"'lm_head.weight' is tied to 'transformer.wte.weight'"):
        lora.wrap(model, ["lm_head"])
    with pytest.raises(ValueError, match=r"some blocks of the Repeat at 'transformer.h'.*share"):
        lora.wrap(model, ["transformer.h.1.attn.c_attn"])
    bert = M.BertModel(
        M.BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=8, max_position_embeddings=8)
    )  # fmt: skip
    assert lora.wrap(bert, ["query"]).target_modules  # BERT holds its children: wrappable

    @dataclasses.dataclass(frozen=True)
    class Builds(L.Layer):  # a layer that builds its children anew when asked
        def children(self):
            return {"query": L.Linear(4)}

        def apply(self, params, x, *, key=None, train=False):
            return self.call("query", params, x)

    with pytest.raises(ValueError, match=r"cannot put a LoRA layer under .*builds its children"):
        lora.wrap(Builds(), ["query"])
    dilated = L.Sequential({"conv": L.Conv2d(2, 3, dilation=2)})
    with pytest.raises(ValueError, match=r"target 'conv': LoraConv: base must have groups=1"):
        lora.wrap(dilated, ["conv"])
    with pytest.raises(ValueError, match=r"LoraConv: base must have groups=1, dilation=1"):
        lora.LoraConv(L.Conv2d(4, 3, groups=2))
    with pytest.raises(AttributeError, match=r"_no_such"):
        lmodel._no_such  # noqa: B018 (private names are not read from the wrapped copy)
    with pytest.raises(ValueError, match=r"LoraLinear: base must be a Linear, got ReLU"):
        lora.LoraLinear(L.ReLU())
    with pytest.raises(ValueError, match=r"LoraEmbedding: r must be a positive integer, got -1"):
        lora.LoraEmbedding(L.Embedding(3, 2), r=-1)


def test_functions_reject_bad_models_and_params(tmp_path):
    model = _seq()
    lmodel = lora.wrap(model, ["q_proj"])
    base = model.init(jax.random.key(0), (1, 3))
    kept = _snapshot(base)
    for fn, args in [
        (lora.init, (model, jax.random.key(0), base)),
        (lora.merge, (model, base)),
        (lora.save_adapter, (tmp_path / "a", model, base)),
        (lora.load_adapter, (tmp_path / "a", model, base)),
    ]:
        with pytest.raises(ValueError, match=rf"lora.{fn.__name__}: lmodel must be the layer"):
            fn(*args)
    with pytest.raises(ValueError, match=r"lora.init: params has no base weight for the LoRA "):
        lora.init(lmodel, jax.random.key(0), {"v_proj": base["v_proj"]})
    with pytest.raises(
        ValueError, match=r"lora.save_adapter: params has no 'q_proj.lora_A.weight'"
    ):
        lora.save_adapter(tmp_path / "a", lmodel, base)
    assert not (tmp_path / "a").exists()
    assert _same(_snapshot(base), kept)


def test_load_adapter_rejects_files_that_do_not_fit(tmp_path):
    model = _seq()
    base = model.init(jax.random.key(0), (1, 3))
    lmodel = lora.wrap(model, ["q_proj"], r=2, lora_alpha=4)
    params = lora.init(lmodel, jax.random.key(1), base)
    folder = lora.save_adapter(tmp_path / "ok", lmodel, params)
    kept = _snapshot(base)

    def variant(name, edit=None, weights=None):
        out = tmp_path / name
        out.mkdir()
        config = json.loads((folder / "adapter_config.json").read_text())
        text = json.dumps(edit(config)) if callable(edit) else edit
        (out / "adapter_config.json").write_text(text if edit is not None else json.dumps(config))
        src = weights or folder
        (out / "adapter_model.safetensors").write_bytes(
            (src / "adapter_model.safetensors").read_bytes()
        )
        return out

    with pytest.raises(FileNotFoundError, match=r"lora.load_adapter: .* has no adapter_config"):
        lora.load_adapter(tmp_path / "nowhere", lmodel, base)
    with pytest.raises(CheckpointError, match=r"adapter_config.json: not valid JSON"):
        lora.load_adapter(variant("json", "{"), lmodel, base)
    with pytest.raises(CheckpointError, match=r"adapter_config.json: r is 3 but the wrapped model"):
        lora.load_adapter(variant("r", lambda c: {**c, "r": 3}), lmodel, base)
    with pytest.raises(CheckpointError, match=r"use_dora is True; lora.load_adapter reads plain"):
        lora.load_adapter(variant("dora", lambda c: {**c, "use_dora": True}), lmodel, base)
    # PEFT initializations that rewrite the base when loading, and LoRA variants: named
    for field, value, pattern in (
        (
            "init_lora_weights",
            "pissa_niter_4",
            r"init_lora_weights is 'pissa_niter_4': PEFT rewrites",
        ),
        ("init_lora_weights", "olora", r"init_lora_weights is 'olora'"),
        ("alora_invocation_tokens", [5, 6], r"alora_invocation_tokens is \[5, 6\]: a LoRA variant"),
        ("layer_replication", [[0, 1]], r"layer_replication is \[\[0, 1\]\]: a LoRA variant"),
    ):
        edited = variant(f"{field}-{value}", lambda c, f=field, v=value: {**c, f: v})
        with pytest.raises(CheckpointError, match=pattern):
            lora.load_adapter(edited, lmodel, base)
    for harmless in ({"init_lora_weights": "gaussian"}, {"loftq_config": {}, "use_qalora": False}):
        lora.load_adapter(
            variant(f"ok-{sorted(harmless)[0]}", lambda c, h=harmless: {**c, **h}), lmodel, base
        )
    other = lora.wrap(model, ["v_proj"], r=2, lora_alpha=4)
    lora.save_adapter(tmp_path / "other", other, lora.init(other, jax.random.key(1), base))
    with pytest.raises(
        CheckpointError, match=r"adapter_model.safetensors: does not fit the wrapped"
    ):
        lora.load_adapter(variant("names", weights=tmp_path / "other"), lmodel, base)
    wide = lora.wrap(L.Sequential({"q_proj": L.Linear(5)}), ["q_proj"], r=2, lora_alpha=4)
    wide_params = lora.init(wide, jax.random.key(1), wide.model.init(jax.random.key(0), (1, 3)))
    lora.save_adapter(tmp_path / "wide", wide, wide_params)
    with pytest.raises(CheckpointError, match=r"shapes that do not fit: q_proj.lora_B.weight"):
        lora.load_adapter(variant("shapes", weights=tmp_path / "wide"), lmodel, base)
    garbage = variant("garbage")
    (garbage / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=r"adapter_model.safetensors"):
        lora.load_adapter(garbage, lmodel, base)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "adapter_config.json").write_text("[]")
    (tmp_path / "bad" / "adapter_model.safetensors").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"not a JSON object"):
        lora.load_adapter(tmp_path / "bad", lmodel, base)
    assert _same(_snapshot(base), kept)


def test_base_model_applies_after_its_wrapped_copy():
    """The params check's cache tells a model from its LoRA-wrapped copy at any depth
    (a BERT's projections sit below a ``Repeat``): the base model applies to base params
    after the wrapped one applied to its own."""
    config = M.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, type_vocab_size=2,
    )  # fmt: skip
    model = M.BertModel(config)
    params = model.init(jax.random.key(0), (2, 5))
    lmodel = lora.wrap(model, ["query"], r=2)
    lparams = lora.init(lmodel, jax.random.key(1), params)
    ids = np.ones((2, 5), np.int32)
    wrapped = lmodel.apply(lparams, ids)
    base = model.apply(params, ids)
    np.testing.assert_allclose(np.asarray(wrapped[0]), np.asarray(base[0]), atol=1e-6)
