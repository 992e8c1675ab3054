"""ViT: ``transformers.ViTModel``, a pre-norm vision transformer over image patches, as
a composition of layers whose params tree is the Hugging Face checkpoint.

transformers 5 holds ViT's modules under new names in memory (``layers.{i}.attention.
q_proj``, ``mlp.fc1``) but reads and writes its checkpoints under the names the Hub's
files have, which are the names here, in the order of its modules::

    embeddings.cls_token                               (1, 1, hidden_size)
    embeddings.position_embeddings                     (1, num_patches + 1, hidden_size)
    embeddings.patch_embeddings.projection.weight      (hidden_size, num_channels, p, p)
    embeddings.patch_embeddings.projection.bias        (hidden_size,)
    encoder.layer.{i}.attention.attention.query.weight, .bias   (and key, value)
    encoder.layer.{i}.attention.output.dense.weight, .bias
    encoder.layer.{i}.layernorm_before.weight, .bias
    encoder.layer.{i}.layernorm_after.weight, .bias
    encoder.layer.{i}.intermediate.dense.weight, .bias   (intermediate_size, hidden_size)
    encoder.layer.{i}.output.dense.weight, .bias         (hidden_size, intermediate_size)
    layernorm.weight, .bias
    pooler.dense.weight, .bias                           (pooler_output_size, hidden_size)

The blocks are one ``Repeat`` (stacked params, one compiled block body). The
self-attention is BERT's (``purelayers.models.bert.BertSelfAttention``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.init import normal, trunc_normal, zeros
from purelayers.layers import (
    AttentionCore,
    Conv2d,
    Dropout,
    Layer,
    LayerError,
    LayerNorm,
    Params,
    Repeat,
    Sequential,
)
from purelayers.layers._checks import as_shape, check_float, check_int
from purelayers.models._heads import LabelsConfig
from purelayers.models._parts import fold, init_children
from purelayers.models.bert import (
    _ACTIVATIONS,
    BertSelfAttention,
    Built,
    _check_activation,
    _dense,
    _std,
)

__all__ = ["ViTConfig", "ViTEmbeddings", "ViTLayer", "ViTModel"]


def _pair(value: Any) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_size(config: str, field: str, value: Any) -> None:
    pair = isinstance(value, tuple) and len(value) == 2 and all(map(_positive, value))
    if not (_positive(value) or pair):
        raise ValueError(
            f"{config}: {field} must be a positive integer or a pair (height, width) of "
            f"them, got {value!r}"
        )


@dataclasses.dataclass(frozen=True)
class ViTConfig(LabelsConfig):
    """``transformers.ViTConfig``: the same field names and defaults (``id2label`` and
    ``label2id`` size ``ViTForImageClassification``'s head).
    ``ViTConfig.from_dict(config_json)`` reads a ``config.json``.

    ``image_size`` and ``patch_size`` are an int or a ``(height, width)`` pair;
    ``pooler_output_size`` ``None`` becomes ``hidden_size``, as in transformers.
    ``encoder_stride`` is kept for the file (masked image modeling uses it, the
    encoder does not).
    """

    model_type: ClassVar[str] = "vit"

    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    image_size: int | tuple[int, int] = 224
    patch_size: int | tuple[int, int] = 16
    num_channels: int = 3
    qkv_bias: bool = True
    encoder_stride: int = 16
    pooler_output_size: int | None = None
    pooler_act: str = "tanh"

    def __post_init__(self):
        super().__post_init__()
        name = "ViTConfig"
        for field in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "num_channels",
            "encoder_stride",
        ):
            check_int(name, field, getattr(self, field))
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"{name}: hidden_size must be divisible by num_attention_heads="
                f"{self.num_attention_heads}, got {self.hidden_size}"
            )
        _check_activation(name, "hidden_act", self.hidden_act)
        _check_activation(name, "pooler_act", self.pooler_act)
        for field in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            check_float(name, field, getattr(self, field), low=0.0, high=1.0, high_open=True)
        check_float(name, "initializer_range", self.initializer_range, low=0.0)
        check_float(name, "layer_norm_eps", self.layer_norm_eps, low=0.0, low_open=True)
        for field in ("image_size", "patch_size"):
            _check_size(name, field, getattr(self, field))
        if any(p > s for p, s in zip(self.patch, self.image, strict=True)):
            raise ValueError(
                f"{name}: patch_size must fit in image_size={self.image_size!r}, "
                f"got {self.patch_size!r}"
            )
        if not isinstance(self.qkv_bias, bool):
            raise ValueError(f"{name}: qkv_bias must be True or False, got {self.qkv_bias!r}")
        if self.pooler_output_size is None:
            object.__setattr__(self, "pooler_output_size", self.hidden_size)
        check_int(name, "pooler_output_size", self.pooler_output_size)

    @property
    def image(self) -> tuple[int, int]:
        """``image_size`` as ``(height, width)``."""
        return _pair(self.image_size)

    @property
    def patch(self) -> tuple[int, int]:
        """``patch_size`` as ``(height, width)``."""
        return _pair(self.patch_size)

    @property
    def num_patches(self) -> int:
        """Patches per image: ``(H // p_h) * (W // p_w)``."""
        (h, w), (ph, pw) = self.image, self.patch
        return (h // ph) * (w // pw)


@dataclasses.dataclass(frozen=True)
class ViTEmbeddings(Built):
    """transformers' ``ViTEmbeddings``: the image cut into patches by a strided
    ``Conv2d`` (``patch_embeddings.projection``), a learned ``cls_token`` in front,
    ``position_embeddings`` added, then dropout.

    Shape:
      ``pixel_values`` ``(batch, num_channels, H, W)`` (``config.image_size``); output
      ``(batch, num_patches + 1, hidden_size)``.

    Parameters:
      ``cls_token`` ``(1, 1, hidden_size)`` and ``position_embeddings``
      ``(1, num_patches + 1, hidden_size)``: truncated ``N(0, initializer_range^2)``;
      ``patch_embeddings.projection.weight`` ``N(0, initializer_range^2)``, its bias
      zeros.
    """

    config: ViTConfig

    def own_names(self) -> tuple[str, ...]:
        return ("cls_token", "position_embeddings")

    def build(self) -> dict[str, Layer]:
        c = self.config
        conv = Conv2d(
            c.hidden_size,
            c.patch,
            stride=c.patch,
            weight_init=normal(std=_std(c.initializer_range)),
            bias_init=zeros(),
        )
        return {
            "patch_embeddings": Sequential({"projection": conv}),
            "dropout": Dropout(c.hidden_dropout_prob),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        c = self.config
        draw = trunc_normal(std=_std(c.initializer_range))
        params: Params = {
            "cls_token": draw(jax.random.fold_in(key, 0), (1, 1, c.hidden_size), dtype),
            "position_embeddings": draw(
                jax.random.fold_in(key, 1), (1, c.num_patches + 1, c.hidden_size), dtype
            ),
        }
        shapes = {"patch_embeddings": as_shape(shape)}
        return {**params, **init_children(self, jax.random.fold_in(key, 2), shapes, dtype)}

    def apply(
        self,
        params: Params,
        pixel_values: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        weight = params.get("patch_embeddings", {}).get("projection", {}).get("weight")
        if weight is not None:  # transformers casts the pixels to the weights' dtype
            pixel_values = jnp.asarray(pixel_values).astype(weight.dtype)
        x = self.call("patch_embeddings", params, pixel_values)  # (batch, E, h, w)
        b, e = x.shape[:2]
        x = jnp.swapaxes(x.reshape(b, e, math.prod(x.shape[2:])), 1, 2)
        cls = jnp.broadcast_to(params["cls_token"].astype(x.dtype), (b, 1, e))
        x = jnp.concatenate([cls, x], axis=1) + params["position_embeddings"].astype(x.dtype)
        return self.call("dropout", params, x, key=key, train=train)


@dataclasses.dataclass(frozen=True)
class ViTLayer(Built):
    """transformers' ``ViTLayer``, pre-norm::

        x = x + attention(layernorm_before(x))
        x = x + output(act(intermediate(layernorm_after(x))))

    ``attention`` is ``attention`` (a ``BertSelfAttention``: ``query``, ``key``,
    ``value``) then ``output.dense``; ``output`` is ``dense``; each ends in dropout.

    Shape:
      ``x`` and output ``(batch, seq, hidden_size)``.
    """

    config: ViTConfig

    def build(self) -> dict[str, Layer]:
        c = self.config
        std, e = _std(c.initializer_range), c.hidden_size

        def qkv() -> Layer:
            return _dense(e, std, bias=c.qkv_bias)

        core = AttentionCore(c.num_attention_heads, dropout=c.attention_probs_dropout_prob)
        drop = Dropout(c.hidden_dropout_prob)
        attention = Sequential(
            {
                "attention": BertSelfAttention(qkv(), qkv(), qkv(), core),
                "output": Sequential({"dense": _dense(e, std), "dropout": drop}),
            }
        )
        return {
            "attention": attention,
            "layernorm_before": LayerNorm(eps=c.layer_norm_eps),
            "layernorm_after": LayerNorm(eps=c.layer_norm_eps),
            "intermediate": Sequential(
                {
                    "dense": _dense(c.intermediate_size, std),
                    "intermediate_act_fn": _ACTIVATIONS[c.hidden_act],
                }
            ),
            "output": Sequential({"dense": _dense(e, std), "dropout": drop}),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        x = as_shape(shape)
        hidden = (*x[:-1], self.config.intermediate_size)
        shapes = dict.fromkeys(("attention", "layernorm_before", "layernorm_after"), x)
        return init_children(self, key, {**shapes, "intermediate": x, "output": hidden}, dtype)

    def apply(
        self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False
    ) -> jax.Array:
        h = self.call("layernorm_before", params, x)
        x = self.call("attention", params, h, key=fold(key, 0), train=train) + x
        h = self.call("layernorm_after", params, x)
        h = self.call("intermediate", params, h)
        return self.call("output", params, h, key=fold(key, 1), train=train) + x


@dataclasses.dataclass(frozen=True)
class ViTModel(Built):
    r"""``transformers.ViTModel(config)`` (with its pooler): patch embeddings, a
    pre-norm encoder, a final ``layernorm``, and ``pooler_output =
    tanh(pooler.dense(last_hidden_state[:, 0]))`` (``pooler_act``).

    ``apply(params, pixel_values)`` returns ``(last_hidden_state, pooler_output)``, as
    transformers' ``ViTModel(pixel_values).last_hidden_state`` and ``.pooler_output``.
    The image size is ``config.image_size`` (position embeddings are not
    interpolated); pixels are cast to the patch projection's dtype, as transformers
    casts them.
    ``ViTModel(config, add_pooling_layer=False)`` (the base of
    ``ViTForImageClassification``) has no ``pooler`` and returns ``last_hidden_state``
    alone. Dropout runs only with ``train=True``, from ``key``.

    ``init(key, (batch, num_channels, H, W))`` gives the params of transformers'
    ``ViTModel`` under its checkpoint names (see ``purelayers.models.vit``) and init:
    ``N(0, initializer_range^2)`` weights (truncated for ``cls_token`` and
    ``position_embeddings``), zero biases, LayerNorms at ones and zeros.

    Shape:
      ``pixel_values`` ``(batch, num_channels, H, W)``; ``last_hidden_state``
      ``(batch, num_patches + 1, hidden_size)``; ``pooler_output``
      ``(batch, pooler_output_size)``.

    Example:
      >>> from purelayers.models.vit import ViTConfig, ViTModel
      >>> vit = ViTModel(ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
      ...                          intermediate_size=16, image_size=8, patch_size=4))
      >>> template = vit.ordered(pl.params.abstract(vit, vit.example_shape()))
      >>> for name, leaf in list(pl.params.flatten(template).items())[:5]:
      ...     print(name, leaf.shape)
      embeddings.cls_token (1, 1, 8)
      embeddings.position_embeddings (1, 5, 8)
      embeddings.patch_embeddings.projection.weight (8, 3, 4, 4)
      embeddings.patch_embeddings.projection.bias (8,)
      encoder.layer.0.attention.attention.query.weight (8, 8)
    """

    config: ViTConfig
    add_pooling_layer: bool = True

    config_class: ClassVar[type[ViTConfig]] = ViTConfig
    base_model_prefix: ClassVar[str] = "vit"
    ignore_on_load: ClassVar[tuple[str, ...]] = ()
    # heads built without a pooler (masked-LM, image classification) save none: it is
    # initialized anew, as transformers does
    optional_on_load: ClassVar[tuple[str, ...]] = (r"^pooler\.",)

    def __post_init__(self):
        if not isinstance(self.config, ViTConfig):
            raise ValueError(f"ViTModel: config must be a ViTConfig, got {self.config!r}")
        if not isinstance(self.add_pooling_layer, bool):
            raise ValueError(
                f"ViTModel: add_pooling_layer must be True or False, got {self.add_pooling_layer!r}"
            )
        super().__post_init__()

    def example_shape(self) -> tuple[int, ...]:
        """The input shape ``from_pretrained`` builds its params template for."""
        return (1, self.config.num_channels, *self.config.image)

    def build(self) -> dict[str, Layer]:
        c = self.config
        pooler = {
            "dense": _dense(c.pooler_output_size, _std(c.initializer_range)),
            "activation": _ACTIVATIONS[c.pooler_act],
        }
        parts = {
            "embeddings": ViTEmbeddings(c),
            "encoder": Sequential({"layer": Repeat(ViTLayer(c), c.num_hidden_layers)}),
            "layernorm": LayerNorm(eps=c.layer_norm_eps),
        }
        if self.add_pooling_layer:
            parts["pooler"] = Sequential(pooler)
        return parts

    def _check_pixels(self, shape: tuple[int, ...]) -> None:
        c = self.config
        want = (c.num_channels, *c.image)
        if len(shape) != 4 or shape[1:] != want:
            raise LayerError(
                "ViTModel",
                "pixel_values shape",
                f"(batch, {', '.join(map(str, want))})",
                shape,
                "the channels and image size are config.num_channels and config.image_size "
                "(position embeddings are not interpolated): resize the images",
            )

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        pixels = as_shape(shape)
        self._check_pixels(pixels)
        c = self.config
        h = (pixels[0], c.num_patches + 1, c.hidden_size)
        shapes = {"embeddings": pixels, "encoder": h, "layernorm": h, "pooler": (h[0], h[-1])}
        return init_children(self, key, shapes, dtype)

    def apply(
        self,
        params: Params,
        pixel_values: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> tuple[jax.Array, jax.Array] | jax.Array:
        x = jnp.asarray(pixel_values)
        self._check_pixels(x.shape)
        h = self.call("embeddings", params, x, key=fold(key, 0), train=train)
        h = self.call("encoder", params, h, key=fold(key, 1), train=train)
        h = self.call("layernorm", params, h)
        if not self.add_pooling_layer:
            return h
        return h, self.call("pooler", params, h[:, 0])
