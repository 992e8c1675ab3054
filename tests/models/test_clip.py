"""CLIPModel and SiglipModel against transformers': checkpoint names and order, the four
outputs and every gradient on a right-padded text batch, the feature functions, Hugging
Face folders both ways, LoRA on ``q_proj``/``v_proj``, the pixel errors. Every parameter
of the references is randomized; one jitted program per family computes our outputs,
features and gradients."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import lora
from purelayers import models as M
from purelayers.layers import LayerError
from tests.twins import randomize

TOWER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
TEXT = dict(TOWER, vocab_size=99, max_position_embeddings=12, eos_token_id=5, pad_token_id=1)
VISION = dict(TOWER, image_size=16, patch_size=8)
FAMILIES = {
    "clip": ("CLIPConfig", "CLIPModel", dict(projection_dim=24), {}),
    "siglip": ("SiglipConfig", "SiglipModel", {}, dict(hidden_act="gelu_pytorch_tanh")),
}
# three texts, right-padded with pad id 1, each ending in the end-of-text id 5
IDS = np.array([[7, 40, 12, 5, 1, 1, 1], [9, 5, 1, 1, 1, 1, 1], [3, 60, 71, 8, 22, 17, 5]])
MASK = (np.arange(7)[None] <= np.argmax(IDS == 5, 1)[:, None]).astype(np.int32)
PIXELS = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)


def _hf_config(transformers, family: str, **text):
    config_cls, _, top, act = FAMILIES[family]
    return getattr(transformers, config_cls)(
        text_config=dict(TEXT, **act, **text),
        vision_config=dict(VISION, **act),
        attn_implementation="eager",
        **top,
    )


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, torch, transformers):
    """``(name, hf model, our model, our params)``: a tiny transformers model with every
    parameter drawn from ``N(0, 0.5^2)``, eval mode, and ours loaded from its weights."""
    name = request.param
    hf_cls = getattr(transformers, FAMILIES[name][1])
    hf = randomize(torch, hf_cls(_hf_config(transformers, name))).eval()
    model = getattr(M, FAMILIES[name][1])(
        getattr(M, FAMILIES[name][0]).from_dict(hf.config.to_dict())
    )
    template = pl.params.abstract(model, model.example_shape())
    theirs = {k: v.detach() for k, v in hf.state_dict().items()}
    params = model.ordered(pl.params.load_state_dict(template, theirs, model=model))
    return name, hf, model, params


def _cotangents(n_text: int, n_image: int, width: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    shapes = [(n_image, n_text), (n_text, n_image), (n_text, width), (n_image, width)]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


@pytest.fixture(scope="module")
def ours(family):
    """Our outputs, features and gradients (params, pixels) in one jitted program."""
    _, _, model, params = family
    width = getattr(model.config, "projection_dim", model.config.vision.hidden_size)
    cot = _cotangents(len(IDS), len(PIXELS), width)

    @jax.jit
    def run(params, pixels):
        def loss(p, x):
            outs = model.apply(p, IDS, x, attention_mask=MASK)
            return sum(jnp.sum(o * c) for o, c in zip(outs, cot, strict=True)), outs

        grads, outs = jax.grad(loss, argnums=(0, 1), has_aux=True)(params, pixels)
        text = model.get_text_features(params, IDS, attention_mask=MASK)
        image = model.get_image_features(params, pixels)
        return outs, grads, text, image

    return cot, run(params, PIXELS)


def _torch_outputs(torch, hf, pixels=None):
    return hf(
        input_ids=torch.from_numpy(IDS),
        pixel_values=torch.from_numpy(PIXELS) if pixels is None else pixels,
        attention_mask=torch.from_numpy(MASK),
    )


def _close(a, b, name=""):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5, err_msg=name)


def test_names_order_and_shapes_are_the_checkpoints(family, tmp_path):
    from safetensors import safe_open

    _, hf, model, params = family
    hf.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "np") as f:
        written = {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118
    drawn = model.ordered(pl.params.abstract(model, ((3, 7), PIXELS.shape)))
    flat = pl.params.flatten(drawn)
    assert list(flat) == list(hf.state_dict())
    assert {k: list(v.shape) for k, v in flat.items()} == written
    assert list(pl.params.flatten(params)) == list(flat)


def test_outputs_and_gradients_match_transformers(torch, family, ours):
    _, hf, _, _ = family
    cot, (outs, (grads, pixel_grad), _, _) = ours
    hf.zero_grad(set_to_none=True)
    x = torch.from_numpy(PIXELS).requires_grad_(True)
    out = _torch_outputs(torch, hf, x)
    theirs = (out.logits_per_image, out.logits_per_text, out.text_embeds, out.image_embeds)
    sum((t * torch.from_numpy(c)).sum() for t, c in zip(theirs, cot, strict=True)).backward()
    for name, a, b in zip(("per_image", "per_text", "text", "image"), outs, theirs, strict=True):
        _close(a, b.detach().numpy(), name)
    torch_grads = {k: p.grad.numpy() for k, p in hf.named_parameters()}
    flat = pl.params.flatten(grads)
    assert set(flat) == set(torch_grads)
    for name, g in flat.items():
        _close(g, torch_grads[name], name)
    _close(pixel_grad, x.grad.numpy(), "pixel_values")


def test_features_are_transformers_pooler_outputs(torch, family, ours):
    _, hf, _, _ = family
    _, (_, _, text, image) = ours
    with torch.no_grad():
        ids, mask = torch.from_numpy(IDS), torch.from_numpy(MASK)
        theirs_text = hf.get_text_features(input_ids=ids, attention_mask=mask)
        theirs_image = hf.get_image_features(pixel_values=torch.from_numpy(PIXELS))
    _close(text, theirs_text.pooler_output.numpy(), "text")
    _close(image, theirs_image.pooler_output.numpy(), "image")


def test_clip_pools_at_the_largest_id_when_eos_token_id_is_2(torch, transformers):
    """transformers keeps the rule of CLIP's first configs (eos_token_id 2): the
    position of the largest id, not of the end-of-text id."""
    hf = randomize(torch, transformers.CLIPModel(_hf_config(transformers, "clip", eos_token_id=2)))
    model = M.CLIPModel(M.CLIPConfig.from_dict(hf.eval().config.to_dict()))
    template = pl.params.abstract(model, model.example_shape())
    params = pl.params.load_state_dict(template, dict(hf.state_dict()), model=model)
    ours = model.get_text_features(params, IDS, attention_mask=MASK)
    with torch.no_grad():
        theirs = hf.get_text_features(
            input_ids=torch.from_numpy(IDS), attention_mask=torch.from_numpy(MASK)
        ).pooler_output
    _close(ours, theirs.numpy())


def test_folders_load_both_ways(torch, transformers, family, ours, tmp_path):
    name, hf, model, params = family
    _, (outs, _, _, _) = ours
    hf.save_pretrained(tmp_path / "theirs")
    loaded_model, loaded = M.from_pretrained(tmp_path / "theirs")
    assert type(loaded_model) is type(model)
    assert (loaded_model.config.text, loaded_model.config.vision) == (
        model.config.text,
        model.config.vision,
    )
    for a, b in zip(
        loaded_model.apply(loaded, IDS, PIXELS, attention_mask=MASK), outs, strict=True
    ):
        _close(a, b)
    M.save_pretrained(tmp_path / "ours", model, params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = getattr(transformers, FAMILIES[name][1]).from_pretrained(
            tmp_path / "ours", attn_implementation="eager"
        )
    with torch.no_grad():
        out = _torch_outputs(torch, back.eval())
    theirs = (out.logits_per_image, out.logits_per_text, out.text_embeds, out.image_embeds)
    for a, b in zip(outs, theirs, strict=True):
        _close(a, b.numpy())


def test_lora_on_q_and_v_projections(family):
    _, _, model, params = family
    lmodel = lora.wrap(model, r=2, target_modules=["q_proj", "v_proj"])
    lparams = lora.init(lmodel, jax.random.key(0), params)
    names = list(pl.params.flatten(lparams))
    assert any(
        "text_model.encoder.layers.self_attn.q_proj" in n or "q_proj.lora_A" in n for n in names
    )
    base = model.apply(params, IDS, PIXELS, attention_mask=MASK)
    wrapped = lmodel.apply(lparams, IDS, PIXELS, attention_mask=MASK)
    for a, b in zip(wrapped, base, strict=True):  # B starts at zero: the base model's outputs
        _close(a, b)


@pytest.mark.parametrize(
    ("shape", "what"),
    [
        ((2, 3, 16), r"pixel_values shape expected \(batch, 3, 16, 16\), got \(2, 3, 16\)"),
        ((2, 1, 16, 16), r"pixel_values axis 1 \(channels\) expected 3, got 1"),
        ((2, 3, 24, 16), r"pixel_values axis 2 \(height\) expected 16, got 24"),
        ((2, 3, 16, 8), r"pixel_values axis 3 \(width\) expected 16, got 8"),
    ],
)
def test_pixels_of_the_wrong_shape_are_refused(shape, what):
    for name, (config_cls, model_cls, top, act) in FAMILIES.items():
        config = getattr(M, config_cls)(
            text_config=dict(TEXT, **act), vision_config=dict(VISION, **act), **top
        )
        model = getattr(M, model_cls)(config)
        tower = "CLIPVisionModel" if name == "clip" else "SiglipVisionModel"
        with pytest.raises(LayerError, match=rf"{model_cls}\[vision_model\] {tower}: {what}"):
            model.get_image_features({}, jnp.zeros(shape))


def _tiny_clip() -> M.CLIPModel:
    return M.CLIPModel(M.CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=24))


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: M.CLIPConfig(text_config=dict(TEXT, hidden_size=0)), ValueError,
         r"^CLIPConfig: text_config: CLIPTextConfig.*hidden_size"),
        (lambda: M.CLIPConfig(text_config=dict(TEXT, hidden_size=30)), ValueError,
         r"hidden_size must be divisible by num_attention_heads=4, got 30"),
        (lambda: M.CLIPConfig(vision_config=dict(VISION, hidden_act="nope")), ValueError,
         r"^CLIPConfig: vision_config: CLIPVisionConfig.*hidden_act.*'nope'"),
        (lambda: M.CLIPConfig(text_config=dict(TEXT, layer_norm_eps=0.0)), ValueError,
         r"CLIPTextConfig.*layer_norm_eps"),
        (lambda: M.CLIPConfig(text_config=dict(TEXT, attention_dropout=2.0)), ValueError,
         r"CLIPTextConfig.*attention_dropout"),
        (lambda: M.CLIPConfig(vision_config=dict(VISION, image_size=0)), ValueError,
         r"CLIPVisionConfig.*image_size"),
        (lambda: M.CLIPConfig(vision_config=dict(VISION, image_size=8, patch_size=16)),
         ValueError, r"CLIPVisionConfig: patch_size must be at most image_size=8, got 16"),
        (lambda: M.CLIPConfig(text_config=dict(TEXT, vocab_size=0)), ValueError,
         r"CLIPTextConfig.*vocab_size"),
        (lambda: M.CLIPConfig(text_config=dict(TEXT, eos_token_id=-1)), ValueError,
         r"CLIPTextConfig.*eos_token_id"),
        (lambda: M.CLIPConfig(text_config=3), ValueError,
         r"^CLIPConfig: text_config must be a dict or None, got 3$"),
        (lambda: M.CLIPConfig(projection_dim=0), ValueError, r"CLIPConfig.*projection_dim"),
        (lambda: M.CLIPConfig(logit_scale_init_value="big"), ValueError,
         r"CLIPConfig.*logit_scale_init_value"),
        (lambda: M.CLIPModel(M.SiglipConfig()), ValueError,
         r"^CLIPModel: config must be a CLIPConfig, got SiglipConfig"),
        (lambda: M.SiglipConfig(text_config=dict(TEXT, vocab_size=0)), ValueError,
         r"SiglipTextConfig.*vocab_size"),
        (lambda: M.SiglipConfig(text_config=dict(TEXT, projection_size=0)), ValueError,
         r"SiglipTextConfig.*projection_size"),
        (lambda: M.SiglipConfig(vision_config=dict(VISION, vision_use_head=False)), ValueError,
         r"SiglipVisionConfig: vision_use_head must be True .*, got False"),
        (lambda: M.SiglipModel(M.CLIPConfig()), ValueError,
         r"^SiglipModel: config must be a SiglipConfig, got CLIPConfig"),
        (lambda: M.SiglipModel(M.SiglipConfig(text_config=TEXT, vision_config=VISION | {"hidden_size": 64})),
         ValueError, r"projection_size must equal vision_config's hidden_size=64 .*, got 32"),
        (lambda: _tiny_clip().get_text_features({}, jnp.zeros((3,), jnp.int32)), LayerError,
         r"CLIPTextModel: input_ids shape expected \(batch, seq\), got \(3,\)"),
        (lambda: _tiny_clip().get_text_features({}, jnp.zeros((1, 13), jnp.int32)), LayerError,
         r"input_ids axis 1 \(sequence length\) expected at most max_position_embeddings=12, "
         r"got 13"),
        (lambda: _tiny_clip().get_text_features({}, IDS, attention_mask=MASK[:, :3]),
         LayerError, r"attention_mask shape expected \(3, 7\), got \(3, 3\)"),
    ],
)  # fmt: skip
def test_bad_settings_and_inputs_are_refused(make, error, match):
    with pytest.raises(error, match=match):
        make()
