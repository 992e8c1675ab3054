"""SigLIP: ``transformers.SiglipModel``, CLIP's two towers with a sigmoid loss's
``logit_bias``, a bidirectional text tower pooled at its last position through a
``head``, and a vision tower pooled by attention (``vision_model.head``), as a
composition of layers whose params tree is the Hugging Face checkpoint, in its order::

    logit_scale, logit_bias                                     (1,) each
    text_model.embeddings.token_embedding.weight                (vocab_size, E_t)
    text_model.embeddings.position_embedding.weight             (max_position_embeddings, E_t)
    text_model.encoder.layers.{i}.layer_norm1.weight, .bias
    text_model.encoder.layers.{i}.self_attn.k_proj.weight, .bias   (and v_proj, q_proj, out_proj)
    text_model.encoder.layers.{i}.layer_norm2.weight, .bias
    text_model.encoder.layers.{i}.mlp.fc1.weight, .bias         (and fc2)
    text_model.final_layer_norm.weight, .bias
    text_model.head.weight, .bias                               (projection_size, E_t)
    vision_model.embeddings.patch_embedding.weight, .bias       (E_v, num_channels, p, p)
    vision_model.embeddings.position_embedding.weight           (num_patches, E_v)
    vision_model.encoder.layers.{i}. ...                        (as the text tower's)
    vision_model.post_layernorm.weight, .bias
    vision_model.head.probe                                     (1, 1, E_v)
    vision_model.head.attention.in_proj_weight, .in_proj_bias   (3 E_v, E_v), (3 E_v,)
    vision_model.head.attention.out_proj.weight, .bias
    vision_model.head.layernorm.weight, .bias
    vision_model.head.mlp.fc1.weight, .bias                     (and fc2)

The attention, MLP and text embeddings are CLIP's (``purelayers.models.clip``); every
layer is held in a dataclass field, so ``lora.wrap`` reaches each ``Linear``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.init import lecun_normal, normal, xavier_uniform, zeros
from purelayers.layers import (
    AttentionCore,
    Conv2d,
    Embedding,
    InProjAttention,
    Layer,
    LayerNorm,
    Linear,
    Params,
    Repeat,
)
from purelayers.layers._checks import as_shape, check_int
from purelayers.models._parts import fold
from purelayers.models._towers import check_pixels, patches
from purelayers.models.clip import (
    CLIPAttention,
    CLIPEncoder,
    CLIPTextEmbeddings,
    ImageTextModel,
    TextTower,
    _PreNorm,
    mlp,
)
from purelayers.models.clip_config import _TwoTowers, check_tower, check_vision
from purelayers.models.config import Config

__all__ = [
    "SiglipConfig",
    "SiglipEncoderLayer",
    "SiglipModel",
    "SiglipMultiheadAttentionPoolingHead",
    "SiglipTextConfig",
    "SiglipTextModel",
    "SiglipVisionConfig",
    "SiglipVisionEmbeddings",
    "SiglipVisionModel",
]


@dataclasses.dataclass(frozen=True)
class SiglipTextConfig(Config):
    """``transformers.SiglipTextConfig``: the same field names and defaults;
    ``projection_size`` ``None`` becomes ``hidden_size``, as in transformers."""

    model_type: ClassVar[str] = "siglip_text_model"

    vocab_size: int = 32000
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    max_position_embeddings: int = 64
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6
    attention_dropout: float = 0.0
    pad_token_id: int | None = 1
    bos_token_id: int | None = 49406
    eos_token_id: Any = 49407
    projection_size: int | None = None

    def __post_init__(self):
        super().__post_init__()
        check_tower(self)
        for field in ("vocab_size", "max_position_embeddings"):
            check_int("SiglipTextConfig", field, getattr(self, field))
        if self.projection_size is None:
            object.__setattr__(self, "projection_size", self.hidden_size)
        check_int("SiglipTextConfig", "projection_size", self.projection_size)


@dataclasses.dataclass(frozen=True)
class SiglipVisionConfig(Config):
    """``transformers.SiglipVisionConfig``: the same field names and defaults (square
    images; ``vision_use_head`` must be ``True``: ``SiglipModel`` pools by the head)."""

    model_type: ClassVar[str] = "siglip_vision_model"

    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    num_channels: int = 3
    image_size: int = 224
    patch_size: int = 16
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6
    attention_dropout: float = 0.0
    vision_use_head: bool = True

    def __post_init__(self):
        super().__post_init__()
        check_tower(self)
        check_vision(self)
        if self.vision_use_head is not True:
            raise ValueError(
                "SiglipVisionConfig: vision_use_head must be True (SiglipModel's image "
                f"embeddings are the attention-pooling head's output), got {self.vision_use_head!r}"
            )


@dataclasses.dataclass(frozen=True)
class SiglipConfig(_TwoTowers, Config):
    """``transformers.SiglipConfig``: ``text_config`` and ``vision_config`` dicts as in
    ``config.json`` (``None``: the defaults), read as ``config.text``
    (``SiglipTextConfig``) and ``config.vision`` (``SiglipVisionConfig``)."""

    model_type: ClassVar[str] = "siglip"
    text_class: ClassVar[type[Config]] = SiglipTextConfig
    vision_class: ClassVar[type[Config]] = SiglipVisionConfig

    text_config: Any = None
    vision_config: Any = None
    initializer_factor: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        self.check_towers()


@dataclasses.dataclass(frozen=True)
class SiglipEncoderLayer(_PreNorm, Layer):
    """transformers' ``SiglipEncoderLayer``: CLIP's pre-norm block with its children in
    SigLIP's order (``layer_norm1``, ``self_attn``, ``layer_norm2``, ``mlp``)::

        x = x + self_attn(layer_norm1(x), mask)
        x = x + mlp(layer_norm2(x))
    """

    layer_norm1: Layer
    self_attn: Layer
    layer_norm2: Layer
    mlp: Layer


def _xavier(width: int) -> Linear:
    return Linear(width, weight_init=xavier_uniform(), bias_init=normal(std=1e-6))


def _mlp(config: Any) -> Layer:
    return mlp(config, _xavier(config.intermediate_size), _xavier(config.hidden_size))


def siglip_encoder(config: Any) -> CLIPEncoder:
    """``num_hidden_layers`` ``SiglipEncoderLayer``\\ s, xavier-uniform projections."""
    e = config.hidden_size
    core = AttentionCore(config.num_attention_heads, dropout=config.attention_dropout)
    proj = Linear(e, weight_init=xavier_uniform(), bias_init=zeros())
    ln = LayerNorm(eps=config.layer_norm_eps)
    block = SiglipEncoderLayer(ln, CLIPAttention(proj, proj, proj, proj, core), ln, _mlp(config))
    return CLIPEncoder(Repeat(block, config.num_hidden_layers))


@dataclasses.dataclass(frozen=True)
class SiglipTextModel(TextTower):
    """transformers' ``SiglipTextModel``: embeddings, a bidirectional pre-norm encoder
    (padding keys masked by ``attention_mask``), ``final_layer_norm``;
    ``pooler_output = head(last_hidden_state[:, -1])``, the last position whatever it
    holds (SigLIP pads to a fixed length), as transformers does.

    ``apply(params, input_ids, *, attention_mask=None)`` returns ``(last_hidden_state,
    pooler_output)``.
    """

    embeddings: Layer
    encoder: Layer
    final_layer_norm: Layer
    head: Layer
    config: SiglipTextConfig

    @classmethod
    def build(cls, config: SiglipTextConfig) -> SiglipTextModel:
        e = config.hidden_size
        table = normal(std=e**-0.5)
        embeddings = CLIPTextEmbeddings(
            Embedding(config.vocab_size, e, weight_init=table),
            Embedding(config.max_position_embeddings, e, weight_init=table),
        )
        head = Linear(config.projection_size, weight_init=lecun_normal(), bias_init=zeros())
        ln = LayerNorm(eps=config.layer_norm_eps)
        return cls(embeddings, siglip_encoder(config), ln, head, config)

    def pool(self, params: Params, ids: jax.Array, h: jax.Array) -> jax.Array:
        """``head`` at the last position."""
        return self.call("head", params, h[:, -1])


@dataclasses.dataclass(frozen=True)
class SiglipVisionEmbeddings(Layer):
    """transformers' ``SiglipVisionEmbeddings``: patches by a strided ``Conv2d`` with
    bias (``patch_embedding``), ``position_embedding`` added; no class token.

    Shape:
      ``pixel_values`` ``(batch, C, H, W)``; output ``(batch, num_patches, E)``.
    """

    patch_embedding: Layer
    position_embedding: Layer

    def apply(
        self, params: Params, pixel_values: Any, *, key: jax.Array | None = None, train=False
    ) -> jax.Array:
        x = patches(self, params, pixel_values)
        positions = jnp.arange(x.shape[1])[None, :]
        return x + self.call("position_embedding", params, positions).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class SiglipMultiheadAttentionPoolingHead(Layer):
    """transformers' ``SiglipMultiheadAttentionPoolingHead``: a learned ``probe``
    query attends the tokens (``attention``, a ``torch.nn.MultiheadAttention``), then a
    pre-norm MLP residual::

        h = attention(probe, x, x)
        y = (h + mlp(layernorm(h)))[:, 0]

    Shape:
      ``x`` ``(batch, seq, E)``; output ``(batch, E)``.

    Parameters:
      ``probe`` ``(1, 1, E)``, xavier-uniform; the children's.
    """

    attention: Layer
    layernorm: Layer
    mlp: Layer

    def own_names(self) -> tuple[str, ...]:
        return ("probe",)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        e = as_shape(shape)[-1]
        own = {"probe": xavier_uniform()(fold(key, 0), (1, 1, e), dtype)}
        return {**own, **self.init_children(fold(key, 1), shape, dtype, own)}

    def apply(
        self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False
    ) -> jax.Array:
        x = jnp.asarray(x)
        probe = jnp.broadcast_to(params["probe"].astype(x.dtype), (x.shape[0], 1, x.shape[-1]))
        h = self.call("attention", params, probe, context=x, value=x, key=key, train=train)
        h = h + self.call("mlp", params, self.call("layernorm", params, h))
        return h[:, 0]


@dataclasses.dataclass(frozen=True)
class SiglipVisionModel(Layer):
    """transformers' ``SiglipVisionModel``: patch embeddings, a pre-norm encoder,
    ``post_layernorm``; ``pooler_output = head(last_hidden_state)``, the attention
    pooling head.

    ``apply(params, pixel_values)`` returns ``(last_hidden_state, pooler_output)``.

    Shape:
      ``pixel_values`` ``(batch, num_channels, image_size, image_size)``;
      ``last_hidden_state`` ``(batch, num_patches, E)``; ``pooler_output``
      ``(batch, E)``.
    """

    embeddings: Layer
    encoder: Layer
    post_layernorm: Layer
    head: Layer
    config: SiglipVisionConfig

    @classmethod
    def build(cls, config: SiglipVisionConfig) -> SiglipVisionModel:
        c, p = config, config.patch_size
        conv = Conv2d(c.hidden_size, p, stride=p, weight_init=lecun_normal(), bias_init=zeros())
        table = Embedding(
            (c.image_size // p) ** 2, c.hidden_size, weight_init=normal(std=c.hidden_size**-0.5)
        )
        ln = LayerNorm(eps=c.layer_norm_eps)
        attention = InProjAttention(c.num_attention_heads, batch_first=True)
        head = SiglipMultiheadAttentionPoolingHead(attention, ln, _mlp(c))
        return cls(SiglipVisionEmbeddings(conv, table), siglip_encoder(c), ln, head, c)

    def apply(
        self,
        params: Params,
        pixel_values: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> tuple[jax.Array, jax.Array]:
        x = check_pixels("SiglipVisionModel", self.config, pixel_values)
        h = self.call("embeddings", params, x)
        h = self.call("encoder", params, h, key=key, train=train)
        h = self.call("post_layernorm", params, h)
        return h, self.call("head", params, h)


@dataclasses.dataclass(frozen=True)
class SiglipModel(ImageTextModel):
    r"""``transformers.SiglipModel(config)``: the text and vision towers, their pooled
    outputs (each tower's ``head``) L2-normalized and compared::

        text_embeds  = normalize(text_model(input_ids).pooler_output)
        image_embeds = normalize(vision_model(pixel_values).pooler_output)
        logits_per_text = exp(logit_scale) * text_embeds @ image_embeds.T + logit_bias
        logits_per_image = logits_per_text.T

    ``apply(params, input_ids, pixel_values, *, attention_mask=None)`` returns
    ``(logits_per_image, logits_per_text, text_embeds, image_embeds)``, transformers'
    ``SiglipOutput`` fields in order; ``get_text_features`` and ``get_image_features``
    return the towers' unnormalized ``pooler_output``. The text tower is bidirectional
    and pools its last position (SigLIP's tokenizer pads to ``max_length``: the model
    was trained so); ``attention_mask`` (``1`` token, ``0`` padding) masks padding
    keys. ``init(key, ((batch, seq), (batch, C, H, W)))`` draws ``logit_scale`` and
    ``logit_bias`` at zero, as transformers does.

    Shape:
      as ``CLIPModel``'s, with ``projection_size`` (the text head's width, which must
      equal the vision tower's ``hidden_size``) for ``projection_dim``.

    torch: ``transformers.SiglipModel(config)``.
    """

    config: SiglipConfig
    text_model: Layer | None = None
    vision_model: Layer | None = None

    config_class: ClassVar[type[SiglipConfig]] = SiglipConfig
    base_model_prefix: ClassVar[str] = "siglip"

    def __post_init__(self):
        if not isinstance(self.config, SiglipConfig):
            raise ValueError(f"SiglipModel: config must be a SiglipConfig, got {self.config!r}")
        c = self.config
        if c.text.projection_size != c.vision.hidden_size:
            raise ValueError(
                "SiglipModel: text_config's projection_size must equal vision_config's "
                f"hidden_size={c.vision.hidden_size} (the embeddings are compared), got "
                f"{c.text.projection_size}"
            )
        if self.text_model is None:
            object.__setattr__(self, "text_model", SiglipTextModel.build(c.text))
        if self.vision_model is None:
            object.__setattr__(self, "vision_model", SiglipVisionModel.build(c.vision))

    def own_names(self) -> tuple[str, ...]:
        return ("logit_scale", "logit_bias")

    def own_params(self, key: jax.Array, dtype: Any) -> Params:
        return {"logit_scale": jnp.zeros((1,), dtype), "logit_bias": jnp.zeros((1,), dtype)}

    def logits(self, params: Params, text: jax.Array, image: jax.Array) -> jax.Array:
        """``logits_per_text`` from the normalized embeddings."""
        scale, bias = params["logit_scale"].reshape(()), params["logit_bias"].reshape(())
        return text @ image.T * jnp.exp(scale) + bias
