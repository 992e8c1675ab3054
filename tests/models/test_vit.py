"""ViTModel against transformers' ``ViTModel``: checkpoint names, order, shapes and init;
outputs and gradients; Hugging Face folders both ways; the config; the errors. Every
parameter of the reference is randomized.

transformers 5 holds ViT under new module names in memory (``layers.0.attention.q_proj``)
and converts them to the checkpoint names (``encoder.layer.0.attention.attention.query``)
when it saves; ours are the checkpoint names, so the reference's ``state_dict`` is
renamed with transformers' own conversion before it is compared or loaded."""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import models as M
from purelayers.layers import LayerError
from purelayers.models.vit import ViTConfig, ViTModel
from tests.twins import randomize

TINY = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    image_size=16,
    patch_size=4,
)
PIXELS = (2, 3, 16, 16)


@pytest.fixture(scope="module")
def hf(torch, transformers):
    """A tiny transformers ViTModel, every parameter drawn from N(0, 0.5^2), eval mode."""
    config = transformers.ViTConfig(**TINY, attn_implementation="eager")
    return randomize(torch, transformers.ViTModel(config)).eval()


def _checkpoint_names(hf) -> dict[str, str]:
    """``{in-memory name: checkpoint name}`` in the module's order, by transformers'
    own save-time conversion, one name at a time so the order is kept."""
    from transformers.core_model_loading import revert_weight_conversion

    return {k: next(iter(revert_weight_conversion(hf, {k: v}))) for k, v in hf.state_dict().items()}


def _state_dict(hf) -> dict:
    names = _checkpoint_names(hf)
    return {names[k]: v for k, v in hf.state_dict().items()}


def _model(hf) -> ViTModel:
    return ViTModel(ViTConfig.from_dict(hf.config.to_dict()))


def _loaded(hf):
    model = _model(hf)
    template = pl.params.abstract(model, model.example_shape())
    return model, pl.params.load_state_dict(template, _state_dict(hf), model=model)


def _pixels():
    return np.random.default_rng(0).standard_normal(PIXELS).astype(np.float32)


@jax.jit
def _forward(params, pixels):
    return ViTModel(ViTConfig(**TINY)).apply(params, pixels)


def _torch_outputs(torch, hf, pixels):
    with torch.no_grad():
        out = hf(torch.from_numpy(pixels))
    return out.last_hidden_state.numpy(), out.pooler_output.numpy()


def _assert_outputs(ours, theirs):
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-5)


def test_init_gives_the_checkpoint_names_order_shapes_and_init(hf):
    model = _model(hf)
    theirs = _state_dict(hf)
    params = model.init(jax.random.key(0), PIXELS)
    flat = {k: np.asarray(v) for k, v in pl.params.flatten(params).items()}
    assert list(flat) == list(theirs)
    assert {k: v.shape for k, v in flat.items()} == {k: tuple(v.shape) for k, v in theirs.items()}
    template = pl.params.abstract(model, model.example_shape())
    assert list(pl.params.flatten(model.ordered(template))) == list(theirs)
    for name, value in flat.items():
        if "layernorm" in name:
            want = 1.0 if name.endswith("weight") else 0.0
            np.testing.assert_array_equal(value, np.full(value.shape, want), err_msg=name)
        elif name.endswith("bias"):
            np.testing.assert_array_equal(value, np.zeros(value.shape), err_msg=name)
        elif value.size > 300:
            assert 0.015 < value.std() < 0.025, name


def test_names_are_those_transformers_writes(hf, tmp_path):
    from safetensors import safe_open

    hf.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "np") as f:
        written = set(f.keys())
    model = _model(hf)
    assert set(pl.params.flatten(pl.params.abstract(model, model.example_shape()))) == written


def test_outputs_and_gradients_match_transformers(torch, hf):
    model, params = _loaded(hf)
    pixels = _pixels()
    rng = np.random.default_rng(1)
    cotangents = [rng.standard_normal((2, 17, 32)), rng.standard_normal((2, 32))]
    cotangents = [c.astype(np.float32) for c in cotangents]

    @jax.jit
    def run(params, pixels):
        def loss(p, x):
            outs = model.apply(p, x)
            return sum(jnp.sum(o * c) for o, c in zip(outs, cotangents, strict=True)), outs

        return jax.grad(loss, argnums=(0, 1), has_aux=True)(params, pixels)

    (grads, pixel_grad), outs = run(params, pixels)
    hf.zero_grad(set_to_none=True)
    x = torch.from_numpy(pixels).requires_grad_(True)
    out = hf(x)
    theirs = (out.last_hidden_state, out.pooler_output)
    sum((t * torch.from_numpy(c)).sum() for t, c in zip(theirs, cotangents, strict=True)).backward()
    _assert_outputs(outs, [t.detach().numpy() for t in theirs])
    names = _checkpoint_names(hf)
    torch_grads = {names[k]: p.grad.numpy() for k, p in hf.named_parameters()}
    ours = pl.params.flatten(grads)
    assert set(ours) == set(torch_grads)
    for name, g in ours.items():
        np.testing.assert_allclose(
            np.asarray(g), torch_grads[name], rtol=1e-5, atol=1e-5, err_msg=name
        )
    np.testing.assert_allclose(np.asarray(pixel_grad), x.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_dropout_runs_only_in_training(hf):
    model, params = _loaded(hf)
    model = ViTModel(dataclasses.replace(model.config, hidden_dropout_prob=0.2))
    pixels = _pixels()

    @jax.jit
    def run(params, key):
        return model.apply(params, pixels, key=key, train=True)

    a, b = run(params, jax.random.key(1)), run(params, jax.random.key(1))
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.allclose(a[0], _forward(params, pixels)[0])
    with pytest.raises(ValueError, match="key"):
        jax.eval_shape(lambda p: model.apply(p, pixels, train=True), params)


def test_save_pretrained_loads_in_transformers(torch, transformers, hf, tmp_path):
    model, params = _loaded(hf)
    M.save_pretrained(tmp_path, model, params)
    loaded, info = transformers.ViTModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    pixels = _pixels()
    _assert_outputs(_torch_outputs(torch, loaded.eval(), pixels), _torch_outputs(torch, hf, pixels))


def test_from_pretrained_reads_a_transformers_folder(torch, hf, tmp_path):
    hf.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pl.params.CheckpointWarning)
        model, params = M.from_pretrained(tmp_path)
    assert isinstance(model, ViTModel)
    assert model.config == ViTConfig(**TINY)
    pixels = _pixels()
    _assert_outputs(_forward(params, pixels), _torch_outputs(torch, hf, pixels))


def test_config_matches_transformers_and_round_trips(transformers, hf):
    ours = ViTConfig.from_dict(hf.config.to_dict())
    for field in dataclasses.fields(ViTConfig):
        assert getattr(ours, field.name) == getattr(hf.config, field.name), field.name
    assert ViTConfig.from_dict(ours.to_dict()) == ours
    assert ours.to_dict()["model_type"] == "vit"
    defaults = transformers.ViTConfig()
    for field in dataclasses.fields(ViTConfig):
        assert getattr(ViTConfig(), field.name) == getattr(defaults, field.name), field.name
    pair = ViTConfig.from_dict({**ours.to_dict(), "image_size": [16, 8], "patch_size": [4, 4]})
    assert pair.image_size == (16, 8) and pair.num_patches == 8
    assert ViTModel(pair).example_shape() == (1, 3, 16, 8)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(num_attention_heads=5), "hidden_size must be divisible by num_attention_heads=5"),
        (dict(hidden_act="mish"), "hidden_act must be one of 'gelu', .*, got 'mish'"),
        (dict(patch_size=0), r"patch_size must be a positive integer or a pair \(height, width\)"),
        (dict(patch_size=32), "patch_size must fit in image_size=16, got 32"),
        (dict(qkv_bias=1), "qkv_bias must be True or False, got 1"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(overrides, match):
    with pytest.raises(ValueError, match=f"^ViTConfig: {match}"):
        ViTConfig(**{**TINY, **overrides})


def test_image_size_is_fixed():
    model = ViTModel(ViTConfig(**TINY))
    params = pl.params.abstract(model, model.example_shape())
    want = r"pixel_values shape expected \(batch, 3, 16, 16\), got \(1, 3, 32, 32\)"
    with pytest.raises(LayerError, match=want):
        model.apply(params, np.zeros((1, 3, 32, 32), np.float32))
    with pytest.raises(LayerError, match=r"expected \(batch, 3, 16, 16\), got \(1, 1, 16, 16\)"):
        model.init(jax.random.key(0), (1, 1, 16, 16))
