"""CLIP: ``transformers.CLIPModel``, a text tower and a vision tower whose pooled,
projected outputs are compared by cosine similarity, as a composition of layers whose
params tree is the Hugging Face checkpoint, in its order::

    logit_scale                                                 ()
    text_model.embeddings.token_embedding.weight                (vocab_size, E_t)
    text_model.embeddings.position_embedding.weight             (max_position_embeddings, E_t)
    text_model.encoder.layers.{i}.self_attn.k_proj.weight, .bias   (and v_proj, q_proj, out_proj)
    text_model.encoder.layers.{i}.layer_norm1.weight, .bias
    text_model.encoder.layers.{i}.mlp.fc1.weight, .bias         (intermediate_size, E_t)
    text_model.encoder.layers.{i}.mlp.fc2.weight, .bias         (E_t, intermediate_size)
    text_model.encoder.layers.{i}.layer_norm2.weight, .bias
    text_model.final_layer_norm.weight, .bias
    vision_model.embeddings.class_embedding                     (E_v,)
    vision_model.embeddings.patch_embedding.weight              (E_v, num_channels, p, p)
    vision_model.embeddings.position_embedding.weight           (num_patches + 1, E_v)
    vision_model.pre_layrnorm.weight, .bias                     (sic)
    vision_model.encoder.layers.{i}. ...                        (as the text tower's)
    vision_model.post_layernorm.weight, .bias
    visual_projection.weight                                    (projection_dim, E_v)
    text_projection.weight                                      (projection_dim, E_t)

The blocks of each tower are one ``Repeat`` (stacked params, one compiled block body).
Every layer is held in a dataclass field, so ``lora.wrap`` reaches each ``Linear``
(``q_proj``, ``v_proj``, ``fc1``, ...). The pieces here (``CLIPAttention``, the encoder,
the text embeddings) are SigLIP's too (``purelayers.models.siglip``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.init import constant, normal, zeros
from purelayers.layers import (
    AttentionCore,
    Conv2d,
    Embedding,
    Lambda,
    Layer,
    LayerNorm,
    Linear,
    Params,
    Repeat,
    Sequential,
)
from purelayers.layers._two_inputs import pair_init, two_shapes
from purelayers.models._parts import fold
from purelayers.models._towers import (
    check_ids,
    check_pixels,
    normalized,
    padding_mask,
    patches,
)
from purelayers.models.bert import _ACTIVATIONS, self_attention
from purelayers.models.clip_config import (
    CLIPConfig,
    CLIPTextConfig,
    CLIPVisionConfig,
)

__all__ = [
    "CLIPAttention",
    "CLIPConfig",
    "CLIPEncoder",
    "CLIPEncoderLayer",
    "CLIPModel",
    "CLIPTextConfig",
    "CLIPTextEmbeddings",
    "CLIPTextModel",
    "CLIPVisionConfig",
    "CLIPVisionEmbeddings",
    "CLIPVisionModel",
]


def quick_gelu(x: jax.Array) -> jax.Array:
    """transformers' ``quick_gelu``: ``x * sigmoid(1.702 x)``."""
    return x * jax.nn.sigmoid(1.702 * x)


def activation(name: str) -> Layer:
    """The layer computing transformers' ``ACT2FN[name]``."""
    return Lambda(quick_gelu) if name == "quick_gelu" else _ACTIVATIONS[name]


# -- the shared blocks ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CLIPAttention(Layer):
    r"""transformers' ``CLIPAttention`` (and ``SiglipAttention``): separate projections
    in their registration order ``k_proj``, ``v_proj``, ``q_proj``, ``out_proj``::

        y = out_proj(core(q_proj(x), k_proj(x), v_proj(x), mask))

    Shape:
      ``x`` and output ``(batch, seq, E)``; ``mask`` broadcastable to ``(batch, heads,
      seq, seq)``, ``True`` where a query may attend.
    """

    k_proj: Layer
    v_proj: Layer
    q_proj: Layer
    out_proj: Layer
    core: AttentionCore

    @classmethod
    def build(cls, config: Any, *, causal: bool = False, std: float = 0.02) -> CLIPAttention:
        """``Linear`` projections of width ``config.hidden_size`` with biases."""
        e = config.hidden_size
        core = AttentionCore(
            config.num_attention_heads, causal=causal, dropout=config.attention_dropout
        )
        return cls(*(_linear(e, std) for _ in range(4)), core)

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        h = self_attention(self, params, x, ("q_proj", "k_proj", "v_proj"), mask, key, train)
        return self.call("out_proj", params, h)


def _linear(width: int, std: float, bias: bool = True) -> Linear:
    return Linear(width, bias=bias, weight_init=normal(std=std), bias_init=zeros())


def mlp(config: Any, fc1: Linear, fc2: Linear) -> Sequential:
    """transformers' ``CLIPMLP`` (and ``SiglipMLP``): ``fc2(act(fc1(x)))``."""
    return Sequential({"fc1": fc1, "activation_fn": activation(config.hidden_act), "fc2": fc2})


class _PreNorm:
    """The pre-norm block both families share::

    x = x + self_attn(layer_norm1(x), mask)
    x = x + mlp(layer_norm2(x))
    """

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        h = self.call("layer_norm1", params, x)
        x = x + self.call("self_attn", params, h, mask=mask, key=key, train=train)
        return x + self.call("mlp", params, self.call("layer_norm2", params, x))


@dataclasses.dataclass(frozen=True)
class CLIPEncoderLayer(_PreNorm, Layer):
    """transformers' ``CLIPEncoderLayer``, pre-norm (children in its order:
    ``self_attn``, ``layer_norm1``, ``mlp``, ``layer_norm2``)::

        x = x + self_attn(layer_norm1(x), mask)
        x = x + mlp(layer_norm2(x))

    Shape:
      ``x`` and output ``(batch, seq, hidden_size)``.
    """

    self_attn: Layer
    layer_norm1: Layer
    mlp: Layer
    layer_norm2: Layer


@dataclasses.dataclass(frozen=True)
class CLIPEncoder(Layer):
    """transformers' ``CLIPEncoder``: ``layers``, a ``Repeat`` of encoder layers (names
    ``layers.0.*``, ``layers.1.*``, ...; params stacked).

    Shape:
      ``x`` and output ``(batch, seq, hidden_size)``.
    """

    layers: Layer

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        return self.call("layers", params, x, mask=mask, key=key, train=train)


def clip_encoder(config: Any, *, causal: bool = False) -> CLIPEncoder:
    """``num_hidden_layers`` ``CLIPEncoderLayer``\\ s with transformers' CLIP init."""
    e, n, f = config.hidden_size, config.num_hidden_layers, config.initializer_factor
    in_std = e**-0.5 * (2 * n) ** -0.5 * f
    attn = CLIPAttention.build(config, causal=causal, std=in_std)
    attn = dataclasses.replace(attn, out_proj=_linear(e, e**-0.5 * f))
    block = mlp(config, _linear(config.intermediate_size, (2 * e) ** -0.5 * f), _linear(e, in_std))
    ln = LayerNorm(eps=config.layer_norm_eps)
    return CLIPEncoder(Repeat(CLIPEncoderLayer(attn, ln, block, ln), n))


@dataclasses.dataclass(frozen=True)
class CLIPTextEmbeddings(Layer):
    """transformers' ``CLIPTextEmbeddings``: ``token_embedding(ids) +
    position_embedding(0 .. seq - 1)``.

    Shape:
      ``input_ids`` ``(batch, seq)``, ``seq <= max_position_embeddings``; output
      ``(batch, seq, E)``.
    """

    token_embedding: Embedding
    position_embedding: Embedding

    @property
    def takes_ids(self) -> bool:
        return True

    def apply(
        self, params: Params, input_ids: Any, *, key: jax.Array | None = None, train: bool = False
    ) -> jax.Array:
        h = self.call("token_embedding", params, input_ids)
        positions = jnp.arange(jnp.shape(input_ids)[-1])[None, :]
        return h + self.call("position_embedding", params, positions)


# -- the towers ------------------------------------------------------------------------


class TextTower(Layer):
    """What CLIP's and SigLIP's text towers share: ``input_ids`` checked, embedded, run
    through ``encoder`` (padding keys masked by ``attention_mask``) and
    ``final_layer_norm``; the subclass's ``pool(params, ids, h)`` gives
    ``pooler_output``."""

    @property
    def takes_ids(self) -> bool:
        return True

    def apply(
        self,
        params: Params,
        input_ids: Any,
        *,
        attention_mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> tuple[jax.Array, jax.Array]:
        ids = check_ids(type(self).__name__, self.config, input_ids, attention_mask)
        h = self.call("embeddings", params, ids)
        mask = padding_mask(attention_mask)
        h = self.call("encoder", params, h, mask=mask, key=key, train=train)
        h = self.call("final_layer_norm", params, h)
        return h, self.pool(params, ids, h)


@dataclasses.dataclass(frozen=True)
class CLIPTextModel(TextTower):
    """transformers' ``CLIPTextModel``: embeddings, a causal pre-norm encoder (padding
    keys masked by ``attention_mask``), ``final_layer_norm``; ``pooler_output`` is the
    hidden state at the end-of-text token (``eos_token_id``'s rule, see
    ``CLIPTextConfig``).

    ``apply(params, input_ids, *, attention_mask=None)`` returns ``(last_hidden_state,
    pooler_output)``.

    Shape:
      ``input_ids`` ``(batch, seq)``; ``last_hidden_state`` ``(batch, seq, E)``;
      ``pooler_output`` ``(batch, E)``.
    """

    embeddings: Layer
    encoder: Layer
    final_layer_norm: Layer
    config: CLIPTextConfig

    @classmethod
    def build(cls, config: CLIPTextConfig) -> CLIPTextModel:
        """The tower for ``config``, with transformers' init."""
        e, std = config.hidden_size, 0.02 * config.initializer_factor
        embeddings = CLIPTextEmbeddings(
            Embedding(config.vocab_size, e, weight_init=normal(std=std)),
            Embedding(config.max_position_embeddings, e, weight_init=normal(std=std)),
        )
        encoder = clip_encoder(config, causal=True)
        return cls(embeddings, encoder, LayerNorm(eps=config.layer_norm_eps), config)

    def pool(self, params: Params, ids: jax.Array, h: jax.Array) -> jax.Array:
        """The hidden state at each row's end-of-text token."""
        eos = self.config.eos_token_id
        # transformers' rule: eos_token_id 2 is the pre-fix config, pooled at the largest id
        where = jnp.argmax(ids, -1) if eos == 2 else jnp.argmax(ids == eos, -1)
        return h[jnp.arange(h.shape[0]), where]


@dataclasses.dataclass(frozen=True)
class CLIPVisionEmbeddings(Layer):
    """transformers' ``CLIPVisionEmbeddings``: patches by a strided ``Conv2d`` without
    bias (``patch_embedding``), ``class_embedding`` in front, ``position_embedding``
    added.

    Shape:
      ``pixel_values`` ``(batch, C, H, W)``; output ``(batch, num_patches + 1, E)``.

    Parameters:
      ``class_embedding`` ``(E,)``, ``N(0, 1 / E)``; the children's.
    """

    patch_embedding: Layer
    position_embedding: Layer

    def own_names(self) -> tuple[str, ...]:
        return ("class_embedding",)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        e = self.patch_embedding.out_channels
        own = {"class_embedding": e**-0.5 * jax.random.normal(fold(key, 0), (e,), dtype)}
        return {**own, **self.init_children(fold(key, 1), shape, dtype, own)}

    def apply(
        self,
        params: Params,
        pixel_values: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        x = patches(self, params, pixel_values)
        b, e = x.shape[0], x.shape[2]
        cls = jnp.broadcast_to(params["class_embedding"].astype(x.dtype), (b, 1, e))
        x = jnp.concatenate([cls, x], axis=1)
        positions = jnp.arange(x.shape[1])[None, :]
        return x + self.call("position_embedding", params, positions).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class CLIPVisionModel(Layer):
    """transformers' ``CLIPVisionModel``: patch embeddings, ``pre_layrnorm`` (sic), a
    pre-norm encoder; ``pooler_output = post_layernorm(last_hidden_state[:, 0])``.

    ``apply(params, pixel_values)`` returns ``(last_hidden_state, pooler_output)``.

    Shape:
      ``pixel_values`` ``(batch, num_channels, image_size, image_size)``;
      ``last_hidden_state`` ``(batch, num_patches + 1, E)``; ``pooler_output``
      ``(batch, E)``.
    """

    embeddings: Layer
    pre_layrnorm: Layer
    encoder: Layer
    post_layernorm: Layer
    config: CLIPVisionConfig

    @classmethod
    def build(cls, config: CLIPVisionConfig) -> CLIPVisionModel:
        """The tower for ``config``, with transformers' init."""
        c, f = config, config.initializer_factor
        p = c.patch_size
        conv = Conv2d(
            c.hidden_size, p, stride=p, bias=False, weight_init=normal(std=c.initializer_range * f)
        )
        positions = (c.image_size // p) ** 2 + 1
        table = Embedding(positions, c.hidden_size, weight_init=normal(std=c.initializer_range * f))
        ln = LayerNorm(eps=c.layer_norm_eps)
        return cls(CLIPVisionEmbeddings(conv, table), ln, clip_encoder(c), ln, c)

    def apply(
        self,
        params: Params,
        pixel_values: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> tuple[jax.Array, jax.Array]:
        x = check_pixels("CLIPVisionModel", self.config, pixel_values)
        h = self.call("embeddings", params, x)
        h = self.call("pre_layrnorm", params, h)
        h = self.call("encoder", params, h, key=key, train=train)
        return h, self.call("post_layernorm", params, h[:, 0])


class ImageTextModel(Layer):
    """What ``CLIPModel`` and ``SiglipModel`` share: the inputs, ``init`` (the
    subclass's ``own_params(key, dtype)``, then the children's), the features from the
    towers' ``pooler_output`` (through the subclass's ``project``), and ``apply`` from
    those and the subclass's ``logits``."""

    # transformers drops position_ids on load: older files hold it
    ignore_on_load: ClassVar[tuple[str, ...]] = (r"(^|\.)position_ids$",)

    @property
    def takes_ids(self) -> bool:
        return True

    def example_shape(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The input shapes ``from_pretrained`` builds its params template for."""
        v = self.config.vision
        return ((1, 1), (1, v.num_channels, v.image_size, v.image_size))

    def apply(
        self,
        params: Params,
        input_ids: Any,
        pixel_values: Any,
        *,
        attention_mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        image = self.get_image_features(params, pixel_values, key=fold(key, 0), train=train)
        text = self.get_text_features(
            params, input_ids, attention_mask=attention_mask, key=fold(key, 1), train=train
        )
        image, text = normalized(image), normalized(text)
        per_text = self.logits(params, text, image)
        return per_text.T, per_text, text, image

    @pair_init
    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        """The params for ``shape = (input_ids.shape, pixel_values.shape)``."""
        shape = two_shapes(type(self).__name__, shape)
        own = self.own_params(key, dtype)
        return {**own, **self.init_children(fold(key, 1), shape, dtype, own)}

    def get_text_features(
        self,
        params: Params,
        input_ids: Any,
        *,
        attention_mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        """The text embeddings, unnormalized: ``text_model``'s ``pooler_output``, through
        ``text_projection`` where the model has one."""
        pooled = self.call(
            "text_model", params, input_ids, attention_mask=attention_mask, key=key, train=train
        )[1]
        return self.project("text_projection", params, pooled)

    def get_image_features(
        self, params: Params, pixel_values: Any, *, key: jax.Array | None = None, train=False
    ) -> jax.Array:
        """The image embeddings, unnormalized: ``vision_model``'s ``pooler_output``,
        through ``visual_projection`` where the model has one."""
        pooled = self.call("vision_model", params, pixel_values, key=key, train=train)[1]
        return self.project("visual_projection", params, pooled)

    def project(self, name: str, params: Params, pooled: jax.Array) -> jax.Array:
        """A tower's ``pooler_output`` through the projection ``name``; as it is where
        the model has none."""
        return pooled


@dataclasses.dataclass(frozen=True)
class CLIPModel(ImageTextModel):
    r"""``transformers.CLIPModel(config)``: a text tower and a vision tower, each
    pooled and projected (``text_projection``, ``visual_projection``, no bias), the
    embeddings L2-normalized and compared::

        text_embeds  = normalize(text_projection(text_model(input_ids).pooler_output))
        image_embeds = normalize(visual_projection(vision_model(pixel_values).pooler_output))
        logits_per_text = exp(logit_scale) * text_embeds @ image_embeds.T
        logits_per_image = logits_per_text.T

    ``apply(params, input_ids, pixel_values, *, attention_mask=None)`` returns
    ``(logits_per_image, logits_per_text, text_embeds, image_embeds)``, transformers'
    ``CLIPOutput`` fields in order. ``get_text_features(params, input_ids, *,
    attention_mask=None)`` and ``get_image_features(params, pixel_values)`` return the
    projected, unnormalized embeddings (the ``pooler_output`` of transformers 5's
    ``get_text_features`` and ``get_image_features``). The text tower is causal, pools
    at the end-of-text token (``CLIPTextConfig``) and masks padding keys by
    ``attention_mask`` (``1`` token, ``0`` padding; pad on the right, as CLIP's
    tokenizer does). Images are ``vision_config``'s ``image_size`` (position embeddings
    are not interpolated). Attention dropout runs only with ``train=True``, from ``key``.

    ``init(key, ((batch, seq), (batch, C, H, W)))`` gives the params under the
    checkpoint's names (see ``purelayers.models.clip``) with transformers' init
    (``logit_scale`` at ``logit_scale_init_value``).

    Shape:
      ``input_ids``, ``attention_mask`` ``(n_text, seq)``; ``pixel_values``
      ``(n_image, num_channels, image_size, image_size)``; ``logits_per_image``
      ``(n_image, n_text)``; ``logits_per_text`` ``(n_text, n_image)``;
      ``text_embeds`` ``(n_text, projection_dim)``; ``image_embeds`` ``(n_image,
      projection_dim)``.

    Example:
      >>> from purelayers.models.clip import CLIPConfig, CLIPModel
      >>> tower = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
      ...              num_attention_heads=2)
      >>> clip = CLIPModel(CLIPConfig(text_config=dict(tower, vocab_size=20),
      ...                  vision_config=dict(tower, image_size=8, patch_size=4),
      ...                  projection_dim=4))
      >>> names = list(pl.params.flatten(clip.ordered(pl.params.abstract(clip, clip.example_shape()))))
      >>> names[:2], names[-2:]
      (['logit_scale', 'text_model.embeddings.token_embedding.weight'], ['visual_projection.weight', 'text_projection.weight'])

    torch: ``transformers.CLIPModel(config)``.
    """

    config: CLIPConfig
    text_model: Layer | None = None
    vision_model: Layer | None = None
    visual_projection: Layer | None = None
    text_projection: Layer | None = None

    config_class: ClassVar[type[CLIPConfig]] = CLIPConfig
    base_model_prefix: ClassVar[str] = "clip"

    def __post_init__(self):
        if not isinstance(self.config, CLIPConfig):
            raise ValueError(f"CLIPModel: config must be a CLIPConfig, got {self.config!r}")
        c = self.config
        f = c.initializer_factor
        built = {
            "text_model": lambda: CLIPTextModel.build(c.text),
            "vision_model": lambda: CLIPVisionModel.build(c.vision),
            "visual_projection": lambda: _linear(
                c.projection_dim, c.vision.hidden_size**-0.5 * f, bias=False
            ),
            "text_projection": lambda: _linear(
                c.projection_dim, c.text.hidden_size**-0.5 * f, bias=False
            ),
        }
        for name, make in built.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, make())

    def own_names(self) -> tuple[str, ...]:
        return ("logit_scale",)

    def own_params(self, key: jax.Array, dtype: Any) -> Params:
        return {"logit_scale": constant(self.config.logit_scale_init_value)(key, (), dtype)}

    def project(self, name: str, params: Params, pooled: jax.Array) -> jax.Array:
        return self.call(name, params, pooled)

    def logits(self, params: Params, text: jax.Array, image: jax.Array) -> jax.Array:
        """``logits_per_text`` from the normalized embeddings."""
        return text @ image.T * jnp.exp(params["logit_scale"])
