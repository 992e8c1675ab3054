"""ModernBERT: ``transformers.ModernBertModel`` and
``ModernBertForSequenceClassification``, a pre-norm bidirectional encoder with rotary
positions, a fused ``Wqkv`` projection, GeGLU feed-forwards and layers alternating
global and sliding-window (local) attention, under transformers' names::

    embeddings.tok_embeddings.weight       (vocab_size, hidden_size)
    embeddings.norm.weight (, .bias)       (hidden_size,)
    layers.{i}.attn_norm.weight (, .bias)  (not in layer 0, whose attn_norm is the identity)
    layers.{i}.attn.Wqkv.weight (, .bias)  (3 * hidden_size, hidden_size): q, k, v rows
    layers.{i}.attn.Wo.weight (, .bias)    (hidden_size, hidden_size)
    layers.{i}.mlp_norm.weight (, .bias)
    layers.{i}.mlp.Wi.weight (, .bias)     (2 * intermediate_size, hidden_size): input, gate
    layers.{i}.mlp.Wo.weight (, .bias)     (hidden_size, intermediate_size)
    final_norm.weight (, .bias)

Biases as ``norm_bias``, ``attention_bias`` and ``mlp_bias`` say. The classifier
prefixes them with ``model.`` and adds ``head.dense`` (bias as ``classifier_bias``),
``head.norm`` and ``classifier`` ``(num_labels, hidden_size)`` with its bias. The layers
are a list (``layers.0``, ``layers.1``, ...; params not stacked): layer 0 has no
``attn_norm``, and global and local layers differ in rope base and window.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.init import trunc_normal, zeros
from purelayers.layers import (
    AttentionCore,
    Dropout,
    Embedding,
    Identity,
    Layer,
    LayerError,
    LayerNorm,
    Linear,
    Params,
    RotaryEmbedding,
    Sequential,
)
from purelayers.layers._checks import as_array, as_shape, check_choice, check_float, check_int
from purelayers.models._dense import LAYER_TYPES, check_layer_types
from purelayers.models._heads import LabelsConfig
from purelayers.models._parts import fold, init_children
from purelayers.models.bert import _ACTIVATIONS, Built, _check_activation

__all__ = [
    "ModernBertAttention",
    "ModernBertConfig",
    "ModernBertEncoderLayer",
    "ModernBertForSequenceClassification",
    "ModernBertMLP",
    "ModernBertModel",
]

_POOLINGS = ("cls", "mean")


@dataclasses.dataclass(frozen=True)
class ModernBertConfig(LabelsConfig):
    """``transformers.ModernBertConfig``: the same field names and defaults (those the
    encoder and its sequence classifier use). ``ModernBertConfig.from_dict(config_json)``
    reads a ``config.json`` as transformers 5 writes it (``layer_types`` and
    ``rope_parameters`` keyed by layer type) or as older files do
    (``global_attn_every_n_layers``, ``global_rope_theta``, ``local_rope_theta``).

    ``layer_types`` defaults to ``"full_attention"`` (global) on every layer whose index
    ``global_attn_every_n_layers`` divides and ``"sliding_attention"`` (local) elsewhere;
    a local layer's query attends keys at most ``local_attention // 2`` positions away.
    Only the default rope (``rope_type="default"``) is built; the MLM-only
    (``decoder_bias``, ``sparse_prediction``) and kernel settings
    (``deterministic_flash_attn``) are kept for the file.
    """

    model_type: ClassVar[str] = "modernbert"

    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    norm_eps: float = 1e-5
    norm_bias: bool = False
    pad_token_id: int | None = 50283
    eos_token_id: Any = 50282
    bos_token_id: int | None = 50281
    cls_token_id: int | None = 50281
    sep_token_id: int | None = 50282
    attention_bias: bool = False
    attention_dropout: float = 0.0
    layer_types: tuple[str, ...] | None = None
    rope_parameters: Mapping[str, Any] | None = None
    global_attn_every_n_layers: int = 3
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    local_attention: int = 128
    embedding_dropout: float = 0.0
    mlp_bias: bool = False
    mlp_dropout: float = 0.0
    decoder_bias: bool = True
    classifier_pooling: str = "cls"
    classifier_dropout: float = 0.0
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    deterministic_flash_attn: bool = False
    sparse_prediction: bool = False
    sparse_pred_ignore_index: int = -100
    tie_word_embeddings: bool = True

    def __post_init__(self):
        super().__post_init__()
        name = "ModernBertConfig"
        for field in (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "max_position_embeddings", "global_attn_every_n_layers",
            "local_attention",
        ):  # fmt: skip
            check_int(name, field, getattr(self, field))
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"{name}: hidden_size must be divisible by num_attention_heads="
                f"{self.num_attention_heads}, got {self.hidden_size}"
            )
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(
                f"{name}: hidden_size // num_attention_heads (the rotary head_dim) must be "
                f"even, got {self.hidden_size // self.num_attention_heads}"
            )
        _check_activation(name, "hidden_activation", self.hidden_activation)
        _check_activation(name, "classifier_activation", self.classifier_activation)
        check_choice(name, "classifier_pooling", self.classifier_pooling, _POOLINGS)
        for field in (
            "attention_dropout",
            "embedding_dropout",
            "mlp_dropout",
            "classifier_dropout",
        ):
            check_float(name, field, getattr(self, field), low=0.0, high=1.0, high_open=True)
        check_float(name, "initializer_range", self.initializer_range, low=0.0)
        check_float(name, "norm_eps", self.norm_eps, low=0.0, low_open=True)
        for field in ("global_rope_theta", "local_rope_theta"):
            check_float(name, field, getattr(self, field), low=0.0, low_open=True)
        if self.pad_token_id is not None:
            check_int(name, "pad_token_id", self.pad_token_id, minimum=0)
            if self.pad_token_id >= self.vocab_size:
                raise ValueError(
                    f"{name}: pad_token_id must be < vocab_size={self.vocab_size}, "
                    f"got {self.pad_token_id}"
                )
        self.types()
        for layer_type in LAYER_TYPES:
            self.rope_theta(layer_type)

    def types(self) -> tuple[str, ...]:
        """Each layer's attention, ``"full_attention"`` or ``"sliding_attention"``."""
        if self.layer_types is None:
            every = self.global_attn_every_n_layers
            return tuple(
                "sliding_attention" if i % every else "full_attention"
                for i in range(self.num_hidden_layers)
            )
        return check_layer_types("ModernBertConfig", self.layer_types, self.num_hidden_layers)

    def rope_theta(self, layer_type: str) -> float:
        """The rope base of ``layer_type``'s layers: ``rope_parameters[layer_type]
        ["rope_theta"]`` where given, else ``global_rope_theta`` (full attention) or
        ``local_rope_theta`` (sliding)."""
        name = "ModernBertConfig"
        nested = dict(self.rope_parameters or {})
        if set(nested) - set(LAYER_TYPES):
            raise ValueError(
                f"{name}: rope_parameters must be keyed by layer type ('full_attention', "
                f"'sliding_attention'), got keys {sorted(nested)}"
            )
        flat = dict(nested.get(layer_type) or {})
        kind = flat.get("rope_type", flat.get("type", "default"))
        if kind != "default":
            raise ValueError(
                f"{name}: rope_parameters[{layer_type!r}]['rope_type'] must be 'default' "
                f"(the only rope built for ModernBERT), got {kind!r}"
            )
        legacy = "global_rope_theta" if layer_type == "full_attention" else "local_rope_theta"
        theta = flat.get("rope_theta", getattr(self, legacy))
        check_float(name, f"rope_parameters[{layer_type!r}]['rope_theta']", theta, low=0.0,
                    low_open=True)  # fmt: skip
        return float(theta)

    @property
    def sliding_window(self) -> int:
        """How far a local layer's query sees on each side: ``local_attention // 2``."""
        return self.local_attention // 2


def _linear(width: int, bias: bool, std: float, cutoff: float) -> Linear:
    """transformers' ModernBERT init: ``N(0, std^2)`` truncated at ``cutoff * std``,
    zero bias."""
    std = std or 0.02
    w = trunc_normal(std=std, a=-cutoff * std, b=cutoff * std)
    return Linear(width, bias=bias, weight_init=w, bias_init=zeros())


def _stds(c: ModernBertConfig) -> dict[str, float]:
    """transformers' ``_init_weights`` stds by role."""
    return {
        "in": c.initializer_range,
        "out": c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers),
        "final_out": c.hidden_size**-0.5,
    }


@dataclasses.dataclass(frozen=True)
class ModernBertAttention(Layer):
    r"""transformers' ``ModernBertAttention``: ``q, k, v = split(Wqkv(x), 3)``, then
    ``out_drop(Wo(core(q, k, v, mask)))`` with the layer's rotary embedding in ``core``.

    Shape:
      ``x`` and output ``(batch, seq, hidden_size)``; ``mask`` broadcastable to ``(batch,
      heads, seq, seq)`` (``True`` where a query may attend).

    Parameters:
      ``Wqkv`` ``(3 * hidden_size, hidden_size)`` (query, key, value rows), ``Wo``
      ``(hidden_size, hidden_size)``.
    """

    Wqkv: Layer
    Wo: Layer
    core: AttentionCore
    out_drop: Layer = Identity()

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        qkv = self.call("Wqkv", params, x, key=fold(key, 0), train=train)
        q, k, v = jnp.split(qkv, 3, axis=-1)
        h = self.call("core", params, q, k, v, mask=mask, key=fold(key, 1), train=train)
        h = self.call("Wo", params, h, key=fold(key, 2), train=train)
        return self.call("out_drop", params, h, key=fold(key, 3), train=train)


@dataclasses.dataclass(frozen=True)
class ModernBertMLP(Layer):
    r"""transformers' ``ModernBertMLP``, a GeGLU: ``input, gate = split(Wi(x), 2)``, then
    ``Wo(drop(act(input) * gate))``.

    Shape:
      ``x`` and output ``(batch, seq, hidden_size)``.

    Parameters:
      ``Wi`` ``(2 * intermediate_size, hidden_size)``, ``Wo`` ``(hidden_size,
      intermediate_size)``.
    """

    Wi: Layer
    act: Layer
    drop: Layer
    Wo: Layer

    def apply(
        self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False
    ) -> jax.Array:
        h, gate = jnp.split(self.call("Wi", params, x, key=fold(key, 0), train=train), 2, -1)
        h = self.call("drop", params, self.call("act", params, h) * gate, key=fold(key, 1),
                      train=train)  # fmt: skip
        return self.call("Wo", params, h, key=fold(key, 2), train=train)


@dataclasses.dataclass(frozen=True)
class ModernBertEncoderLayer(Layer):
    r"""transformers' ``ModernBertEncoderLayer``, pre-norm::

        h = x + attn(attn_norm(x));  h + mlp(mlp_norm(h))

    ``attn_norm`` is the identity in layer 0 (the embeddings end with a norm).
    ``layer_type`` picks the model's mask for it (``"full_attention"`` or
    ``"sliding_attention"``).
    """

    attn_norm: Layer
    attn: ModernBertAttention
    mlp_norm: Layer
    mlp: ModernBertMLP
    layer_type: str = "full_attention"

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        if isinstance(mask, Mapping):  # the model's masks by layer type
            mask = mask[self.layer_type]
        h = self.call("attn_norm", params, x)
        x = x + self.call("attn", params, h, mask=mask, key=fold(key, 0), train=train)
        h = self.call("mlp_norm", params, x)
        return x + self.call("mlp", params, h, key=fold(key, 1), train=train)


def _layer(c: ModernBertConfig, index: int, layer_type: str) -> ModernBertEncoderLayer:
    stds, cut = _stds(c), c.initializer_cutoff_factor
    norm = LayerNorm(eps=c.norm_eps, bias=c.norm_bias)
    rope = RotaryEmbedding(c.rope_theta(layer_type))
    core = AttentionCore(c.num_attention_heads, dropout=c.attention_dropout, rope=rope)
    attn = ModernBertAttention(
        _linear(3 * c.hidden_size, c.attention_bias, stds["in"], cut),
        _linear(c.hidden_size, c.attention_bias, stds["out"], cut),
        core,
        Dropout(c.attention_dropout) if c.attention_dropout > 0.0 else Identity(),
    )
    mlp = ModernBertMLP(
        _linear(2 * c.intermediate_size, c.mlp_bias, stds["in"], cut),
        _ACTIVATIONS[c.hidden_activation],
        Dropout(c.mlp_dropout),
        _linear(c.hidden_size, c.mlp_bias, stds["out"], cut),
    )
    first = Identity() if index == 0 else norm
    return ModernBertEncoderLayer(first, attn, norm, mlp, layer_type)


@dataclasses.dataclass(frozen=True)
class _Embeddings(Built):
    """transformers' ``ModernBertEmbeddings``: ``drop(norm(tok_embeddings(ids)))`` (no
    position table: positions are rotary)."""

    config: ModernBertConfig

    @property
    def takes_ids(self) -> bool:
        return True

    def build(self) -> dict[str, Layer]:
        c = self.config
        std = c.initializer_range or 0.02
        cut = c.initializer_cutoff_factor * std
        weight = trunc_normal(std=std, a=-cut, b=cut)
        return {
            "tok_embeddings": Embedding(
                c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id, weight_init=weight
            ),
            "norm": LayerNorm(eps=c.norm_eps, bias=c.norm_bias),
            "drop": Dropout(c.embedding_dropout),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        ids = as_shape(shape)
        shapes = {"tok_embeddings": ids, "norm": (*ids, self.config.hidden_size)}
        return init_children(self, key, shapes, dtype)

    def apply(
        self, params: Params, input_ids: Any, *, key: jax.Array | None = None, train: bool = False
    ) -> jax.Array:
        h = self.call("norm", params, self.call("tok_embeddings", params, input_ids))
        return self.call("drop", params, h, key=key, train=train)


def _masks(c: ModernBertConfig, attention_mask: Any, seq: int) -> dict[str, jax.Array]:
    """The boolean masks ``(batch or 1, 1, seq, seq)`` by layer type: full attention
    sees every non-padding key; sliding attention those at most ``sliding_window``
    positions from the query."""
    full = jnp.ones((1, 1, 1, seq), bool)
    if attention_mask is not None:
        full = (jnp.asarray(attention_mask) != 0)[:, None, None, :]
    i = jnp.arange(seq)
    near = jnp.abs(i[:, None] - i[None, :]) <= c.sliding_window
    return {"full_attention": full, "sliding_attention": full & near[None, None]}


@dataclasses.dataclass(frozen=True)
class ModernBertModel(Built):
    r"""``transformers.ModernBertModel(config)``: ``embeddings``, ``num_hidden_layers``
    pre-norm layers, ``final_norm``.

    ``apply(params, input_ids, *, attention_mask=None, key=None, train=False)`` returns
    ``last_hidden_state``, as transformers' ``.last_hidden_state``. ``attention_mask``
    is ``1`` for a token and ``0`` for padding (on either side): no query attends a
    padding key. Positions are ``0 .. seq - 1`` (padding included), rotated into the
    queries and keys with the layer type's rope base; a local layer's query sees keys at
    most ``local_attention // 2`` positions away. A query with no key to attend (a
    padding position whose window holds only padding) gets zeros from its attention, as
    transformers' default ``sdpa`` gives. Dropout (``embedding_dropout``,
    ``attention_dropout``, ``mlp_dropout``) runs only with ``train=True``, from ``key``.

    ``init(key, (batch, seq))`` gives transformers' names (see
    ``purelayers.models.modernbert``) and init: weights ``N(0, std^2)`` truncated at
    ``initializer_cutoff_factor * std`` (``std = initializer_range`` for the embeddings,
    ``Wqkv`` and ``Wi``, ``initializer_range / sqrt(2 * num_hidden_layers)`` for the
    ``Wo``\\ s), zero biases, norms at ones and zeros.

    Shape:
      ``input_ids``, ``attention_mask`` ``(batch, seq)``; output ``(batch, seq,
      hidden_size)``.

    Example:
      >>> from purelayers.models import ModernBertConfig, ModernBertModel
      >>> model = ModernBertModel(ModernBertConfig(
      ...     vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
      ...     num_attention_heads=2, pad_token_id=0))
      >>> names = list(pl.params.flatten(model.ordered(pl.params.abstract(model, (1, 5)))))
      >>> names[:3], names[-1]
      (['embeddings.tok_embeddings.weight', 'embeddings.norm.weight', 'layers.0.attn.Wqkv.weight'], 'final_norm.weight')
    """

    config: ModernBertConfig

    config_class: ClassVar[type[ModernBertConfig]] = ModernBertConfig
    base_model_prefix: ClassVar[str] = "model"
    ignore_on_load: ClassVar[tuple[str, ...]] = (r"(^|\.)rotary_emb\.",)
    optional_on_load: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        if not isinstance(self.config, ModernBertConfig):
            raise ValueError(
                f"{type(self).__name__}: config must be a ModernBertConfig, got {self.config!r}"
            )
        super().__post_init__()

    @property
    def takes_ids(self) -> bool:
        return True

    def example_shape(self) -> tuple[int, ...]:
        """The input shape ``from_pretrained`` builds its params template for."""
        return (1, 1)

    def build(self) -> dict[str, Layer]:
        c = self.config
        layers = [_layer(c, i, t) for i, t in enumerate(c.types())]
        return {
            "embeddings": _Embeddings(c),
            "layers": Sequential(*layers),
            "final_norm": LayerNorm(eps=c.norm_eps, bias=c.norm_bias),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        ids = as_shape(shape)
        h = (*ids, self.config.hidden_size)
        return init_children(self, key, {"embeddings": ids, "layers": h, "final_norm": h}, dtype)

    def apply(
        self,
        params: Params,
        input_ids: Any,
        *,
        attention_mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        name = type(self).__name__
        ids = as_array(input_ids)
        if ids.ndim != 2:
            raise LayerError(name, "input_ids shape", "(batch, seq)", ids.shape)
        if attention_mask is not None and jnp.shape(attention_mask) != ids.shape:
            raise LayerError(name, "attention_mask shape", ids.shape, jnp.shape(attention_mask))
        masks = _masks(self.config, attention_mask, ids.shape[1])
        h = self.call("embeddings", params, ids, key=fold(key, 0), train=train)
        for i in range(self.config.num_hidden_layers):
            h = self.call(f"layers.{i}", params, h, mask=masks, key=fold(key, i + 1), train=train)
        return self.call("final_norm", params, h)


@dataclasses.dataclass(frozen=True)
class ModernBertForSequenceClassification(ModernBertModel):
    r"""``transformers.ModernBertForSequenceClassification``: the encoder's output pooled
    (``classifier_pooling``: ``"cls"``, position 0; ``"mean"``, the mean over the
    non-padding tokens), then ``logits = classifier(drop(head(pooled)))`` with
    ``head = norm(act(dense(.)))``, ``config.num_labels`` wide.

    ``apply(params, input_ids, *, attention_mask=None, key=None, train=False)`` returns
    the logits (no loss). With ``"cls"`` pooling, position 0 is taken whatever the
    padding, as transformers does (pad on the right, or make position 0 the ``[CLS]``).

    Shape:
      ``input_ids``, ``attention_mask`` ``(batch, seq)``; output ``(batch, num_labels)``.

    Parameters:
      ``model.*`` (``ModernBertModel``'s); ``head.dense.weight`` ``(hidden_size,
      hidden_size)`` (``N(0, initializer_range^2 / (2 * num_hidden_layers))``,
      truncated), ``head.norm``, ``classifier.weight`` ``(num_labels, hidden_size)``
      (std ``hidden_size ** -0.5``, truncated) and ``classifier.bias`` (zeros).
    """

    peft_task_type: ClassVar[str] = "SEQ_CLS"

    def build(self) -> dict[str, Layer]:
        c = self.config
        stds, cut = _stds(c), c.initializer_cutoff_factor
        head = {
            "dense": _linear(c.hidden_size, c.classifier_bias, stds["out"], cut),
            "act": _ACTIVATIONS[c.classifier_activation],
            "norm": LayerNorm(eps=c.norm_eps, bias=c.norm_bias),
        }
        return {
            "model": ModernBertModel(c),
            "head": Sequential(head),
            "drop": Dropout(c.classifier_dropout),
            "classifier": _linear(c.num_labels, True, stds["final_out"], cut),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        ids = as_shape(shape)
        h = (ids[0], self.config.hidden_size)
        return init_children(self, key, {"model": ids, "head": h, "classifier": h}, dtype)

    def apply(
        self,
        params: Params,
        input_ids: Any,
        *,
        attention_mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        h = self.call(
            "model", params, input_ids, attention_mask=attention_mask, key=fold(key, 0),
            train=train,
        )  # fmt: skip
        if self.config.classifier_pooling == "cls":
            pooled = h[:, 0]
        else:
            if attention_mask is None:
                attention_mask = jnp.ones(h.shape[:2], h.dtype)
            m = jnp.asarray(attention_mask).astype(h.dtype)
            pooled = (h * m[..., None]).sum(axis=1) / m.sum(axis=1, keepdims=True)
        pooled = self.call("head", params, pooled)
        pooled = self.call("drop", params, pooled, key=fold(key, 1), train=train)
        return self.call("classifier", params, pooled)
