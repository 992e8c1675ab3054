"""BERT: ``transformers.BertModel``, a post-norm bidirectional encoder, as a composition
of layers whose params tree is the Hugging Face checkpoint.

Each class here is one of transformers' modules (``BertEmbeddings``, ``BertAttention``,
``BertSelfAttention``, ``BertLayer``, ``BertEncoder``, ``BertModel``) holding the same
children under the same names, so the dotted names are the checkpoint's keys in
transformers' order::

    embeddings.word_embeddings.weight        (vocab_size, hidden_size)
    embeddings.position_embeddings.weight    (max_position_embeddings, hidden_size)
    embeddings.token_type_embeddings.weight  (type_vocab_size, hidden_size)
    embeddings.LayerNorm.weight, .bias       (hidden_size,)
    encoder.layer.{i}.attention.self.query.weight, .bias   (and key, value)
    encoder.layer.{i}.attention.output.dense.weight, .bias
    encoder.layer.{i}.attention.output.LayerNorm.weight, .bias
    encoder.layer.{i}.intermediate.dense.weight, .bias     (intermediate_size, hidden_size)
    encoder.layer.{i}.output.dense.weight, .bias           (hidden_size, intermediate_size)
    encoder.layer.{i}.output.LayerNorm.weight, .bias
    pooler.dense.weight, .bias

The blocks are one ``Repeat`` (stacked params, one compiled block body).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.init import normal, zeros
from purelayers.layers import (
    GELU,
    AttentionCore,
    Dropout,
    Embedding,
    Layer,
    LayerError,
    LayerNorm,
    Linear,
    Params,
    ReLU,
    Repeat,
    Sequential,
    SiLU,
    Tanh,
)
from purelayers.layers._checks import as_array, as_shape, check_choice, check_float, check_int
from purelayers.models._heads import LabelsConfig
from purelayers.models._parts import fold, init_children

__all__ = [
    "BertAttention",
    "BertConfig",
    "BertEmbeddings",
    "BertEncoder",
    "BertLayer",
    "BertModel",
    "BertOutput",
    "BertSelfAttention",
]

# transformers' ACT2FN names and the layers that compute them ("gelu_new" and
# "gelu_fast" are the tanh approximation written out).
_ACTIVATIONS: Mapping[str, Layer] = MappingProxyType(
    {
        "gelu": GELU(),
        "gelu_python": GELU(),
        "gelu_new": GELU("tanh"),
        "gelu_fast": GELU("tanh"),
        "gelu_pytorch_tanh": GELU("tanh"),
        "relu": ReLU(),
        "silu": SiLU(),
        "swish": SiLU(),
        "tanh": Tanh(),
    }
)


def _check_activation(config: str, field: str, name: Any) -> None:
    check_choice(config, field, name, tuple(_ACTIVATIONS))


def _dense(width: int, std: float, bias: bool = True) -> Linear:
    """transformers' ``nn.Linear`` init: ``N(0, std^2)`` weights, zero bias."""
    return Linear(width, bias=bias, weight_init=normal(std=std), bias_init=zeros())


def _std(initializer_range: float) -> float:
    return initializer_range or 0.02  # transformers' rule: 0 means the default


@dataclasses.dataclass(frozen=True)
class BertConfig(LabelsConfig):
    """``transformers.BertConfig``: the same field names and defaults (those the encoder
    and its heads use: ``id2label``, ``label2id`` and ``classifier_dropout``, ``None``
    for ``hidden_dropout_prob``, size the task heads). ``BertConfig.from_dict(config_json)``
    reads a ``config.json``.

    A decoder (``is_decoder`` or ``add_cross_attention``) is not supported: those must
    stay ``False``.
    """

    model_type: ClassVar[str] = "bert"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    is_decoder: bool = False
    add_cross_attention: bool = False
    classifier_dropout: float | None = None

    def __post_init__(self):
        super().__post_init__()
        name = "BertConfig"
        for field in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            check_int(name, field, getattr(self, field))
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"{name}: hidden_size must be divisible by num_attention_heads="
                f"{self.num_attention_heads}, got {self.hidden_size}"
            )
        _check_activation(name, "hidden_act", self.hidden_act)
        for field in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            check_float(name, field, getattr(self, field), low=0.0, high=1.0, high_open=True)
        check_float(name, "initializer_range", self.initializer_range, low=0.0)
        check_float(name, "layer_norm_eps", self.layer_norm_eps, low=0.0, low_open=True)
        if self.classifier_dropout is not None:
            check_float(
                name, "classifier_dropout", self.classifier_dropout, low=0.0, high=1.0,
                high_open=True,
            )  # fmt: skip
        if self.pad_token_id is not None:
            check_int(name, "pad_token_id", self.pad_token_id, minimum=0)
            if self.pad_token_id >= self.vocab_size:
                raise ValueError(
                    f"{name}: pad_token_id must be < vocab_size={self.vocab_size}, "
                    f"got {self.pad_token_id}"
                )
        for field in ("is_decoder", "add_cross_attention"):
            if getattr(self, field) is not False:
                raise ValueError(
                    f"{name}: {field} must be False (BertModel here is the bidirectional "
                    f"encoder), got {getattr(self, field)!r}"
                )


class Built(Layer):
    """A composite whose children its config describes: built once, at construction,
    by ``build()`` and held in the ``_parts`` dict (so ``lora.wrap`` can put a copy with
    other children in its place)."""

    def __post_init__(self):
        object.__setattr__(self, "_parts", self.build())

    def build(self) -> dict[str, Layer]:
        """The children by name, from the config."""
        raise NotImplementedError(f"{type(self).__name__}: a subclass defines build()")

    def children(self) -> dict[str, Layer]:
        return dict(self._parts)


@dataclasses.dataclass(frozen=True)
class BertEmbeddings(Built):
    """``transformers``' ``BertEmbeddings``: ``dropout(LayerNorm(word + token_type +
    position))`` at absolute positions ``0 .. seq - 1``.

    Shape:
      ``input_ids`` and ``token_type_ids`` ``(batch, seq)`` integers; output
      ``(batch, seq, hidden_size)``.

    Parameters:
      ``word_embeddings.weight`` (row ``pad_token_id`` starts at zero and gets no
      gradient, as torch's ``padding_idx``), ``position_embeddings.weight``,
      ``token_type_embeddings.weight``: ``N(0, initializer_range^2)``.
      ``LayerNorm.weight``: ones; ``LayerNorm.bias``: zeros.
    """

    config: BertConfig

    @property
    def takes_ids(self) -> bool:
        return True

    def build(self) -> dict[str, Layer]:
        c = self.config
        init = normal(std=_std(c.initializer_range))
        e = c.hidden_size
        return {
            "word_embeddings": Embedding(
                c.vocab_size, e, padding_idx=c.pad_token_id, weight_init=init
            ),
            "position_embeddings": Embedding(c.max_position_embeddings, e, weight_init=init),
            "token_type_embeddings": Embedding(c.type_vocab_size, e, weight_init=init),
            "LayerNorm": LayerNorm(eps=c.layer_norm_eps),
            "dropout": Dropout(c.hidden_dropout_prob),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        ids = as_shape(shape)
        shapes = dict.fromkeys(
            ("word_embeddings", "position_embeddings", "token_type_embeddings"), ids
        )
        shapes["LayerNorm"] = (*ids, self.config.hidden_size)
        return init_children(self, key, shapes, dtype)

    def position_ids(self, input_ids: jax.Array) -> jax.Array:
        """The positions embedded for ``input_ids``: ``0 .. seq - 1``."""
        return jnp.arange(input_ids.shape[1])[None, :]

    def apply(
        self,
        params: Params,
        input_ids: Any,
        *,
        token_type_ids: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        input_ids = as_array(input_ids)
        if token_type_ids is None:
            token_type_ids = jnp.zeros(input_ids.shape, jnp.int32)
        positions = self.position_ids(input_ids)
        h = self.call("word_embeddings", params, input_ids)
        h = h + self.call("token_type_embeddings", params, token_type_ids)
        h = h + self.call("position_embeddings", params, positions)
        h = self.call("LayerNorm", params, h)
        return self.call("dropout", params, h, key=key, train=train)


def self_attention(
    layer: Layer,
    params: Params,
    x: Any,
    names: tuple[str, str, str],
    mask: Any,
    key: jax.Array | None,
    train: bool,
) -> jax.Array:
    """``core(q(x), k(x), v(x), mask)`` for ``layer``'s children ``names = (q, k, v)``
    and its ``core`` (an ``AttentionCore``): the heads concatenated, before any output
    projection."""
    q, k, v = (layer.call(name, params, x) for name in names)
    return layer.call("core", params, q, k, v, mask=mask, key=key, train=train)


@dataclasses.dataclass(frozen=True)
class BertSelfAttention(Layer):
    r"""Multi-head self-attention before its output projection, as transformers'
    ``BertSelfAttention`` (and ViT's) names it: ``query``, ``key`` and ``value``
    projections around ``core``, an ``AttentionCore``::

        y = core(query(x), key(x), value(x), mask)   # heads concatenated, no output proj

    Shape:
      ``x`` ``(batch, seq, E)``; ``mask`` broadcastable to ``(batch, heads, seq, seq)``
      (``True`` where a query may attend); output ``(batch, seq, heads * head_dim)``.

    Parameters:
      the projections', under ``query``, ``key``, ``value``, in that order.
    """

    query: Layer
    key: Layer
    value: Layer
    core: AttentionCore

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        x = as_shape(shape)
        return init_children(self, key, {"query": x, "key": x, "value": x}, dtype)

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        return self_attention(self, params, x, ("query", "key", "value"), mask, key, train)


@dataclasses.dataclass(frozen=True)
class BertOutput(Built):
    """transformers' ``BertSelfOutput`` and ``BertOutput`` (the same layout):
    ``LayerNorm(dropout(dense(x)) + residual)``, the post-norm residual step.

    Shape:
      ``x`` ``(batch, seq, D)``; ``residual`` and output ``(batch, seq, hidden_size)``.

    Parameters:
      ``dense.weight`` ``(hidden_size, D)``, ``N(0, initializer_range^2)``;
      ``dense.bias`` zeros; ``LayerNorm.weight`` ones, ``LayerNorm.bias`` zeros.
    """

    config: BertConfig

    def build(self) -> dict[str, Layer]:
        c = self.config
        return {
            "dense": _dense(c.hidden_size, _std(c.initializer_range)),
            "LayerNorm": LayerNorm(eps=c.layer_norm_eps),
            "dropout": Dropout(c.hidden_dropout_prob),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        x = as_shape(shape)
        out = (*x[:-1], self.config.hidden_size)
        return init_children(self, key, {"dense": x, "LayerNorm": out}, dtype)

    def apply(
        self,
        params: Params,
        x: Any,
        residual: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        h = self.call("dense", params, x)
        h = self.call("dropout", params, h, key=key, train=train)
        return self.call("LayerNorm", params, h + residual)


@dataclasses.dataclass(frozen=True)
class BertAttention(Built):
    """transformers' ``BertAttention``: ``output(self(x, mask), x)``, with children
    ``self`` (a ``BertSelfAttention``) and ``output`` (a ``BertOutput``).

    Shape:
      ``x`` and output ``(batch, seq, hidden_size)``.
    """

    config: BertConfig

    def build(self) -> dict[str, Layer]:
        c = self.config
        std = _std(c.initializer_range)
        e = c.hidden_size
        core = AttentionCore(c.num_attention_heads, dropout=c.attention_probs_dropout_prob)
        return {
            "self": BertSelfAttention(_dense(e, std), _dense(e, std), _dense(e, std), core),
            "output": BertOutput(c),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        x = as_shape(shape)
        return init_children(self, key, {"self": x, "output": x}, dtype)

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        h = self.call("self", params, x, mask=mask, key=fold(key, 0), train=train)
        return self.call("output", params, h, x, key=fold(key, 1), train=train)


@dataclasses.dataclass(frozen=True)
class BertLayer(Built):
    """transformers' ``BertLayer``: ``a = attention(x)``, then
    ``output(act(intermediate.dense(a)), a)``.

    Shape:
      ``x`` and output ``(batch, seq, hidden_size)``; ``mask`` as ``BertSelfAttention``.
    """

    config: BertConfig

    def build(self) -> dict[str, Layer]:
        c = self.config
        dense = _dense(c.intermediate_size, _std(c.initializer_range))
        act = _ACTIVATIONS[c.hidden_act]
        return {
            "attention": BertAttention(c),
            "intermediate": Sequential({"dense": dense, "intermediate_act_fn": act}),
            "output": BertOutput(c),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        x = as_shape(shape)
        hidden = (*x[:-1], self.config.intermediate_size)
        return init_children(
            self, key, {"attention": x, "intermediate": x, "output": hidden}, dtype
        )

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        a = self.call("attention", params, x, mask=mask, key=fold(key, 0), train=train)
        h = self.call("intermediate", params, a)
        return self.call("output", params, h, a, key=fold(key, 2), train=train)


@dataclasses.dataclass(frozen=True)
class BertEncoder(Built):
    """transformers' ``BertEncoder``: ``layer``, ``num_hidden_layers`` ``BertLayer``\\ s
    as one ``Repeat`` (names ``layer.0.*``, ``layer.1.*``, ...; params stacked).

    Shape:
      ``x`` and output ``(batch, seq, hidden_size)``.
    """

    config: BertConfig

    def build(self) -> dict[str, Layer]:
        return {"layer": Repeat(BertLayer(self.config), self.config.num_hidden_layers)}

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        return init_children(self, key, {"layer": as_shape(shape)}, dtype)

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        return self.call("layer", params, x, mask=mask, key=key, train=train)


@dataclasses.dataclass(frozen=True)
class BertModel(Built):
    r"""``transformers.BertModel(config)`` (with its pooler): embeddings, a post-norm
    encoder, and ``pooler_output = tanh(pooler.dense(last_hidden_state[:, 0]))``.

    ``apply(params, input_ids, attention_mask=None, token_type_ids=None)`` returns
    ``(last_hidden_state, pooler_output)``, as transformers' ``BertModel(...)
    .last_hidden_state`` and ``.pooler_output``. ``attention_mask`` is ``1`` for a
    token and ``0`` for padding: no query attends a padding key (the padding positions'
    own outputs are computed as transformers computes them, and a row with no token at
    all attends nothing, its attention giving zeros, as transformers' default ``sdpa``
    attention does; its ``eager`` attention averages every value instead).
    ``token_type_ids`` default to zeros; positions are ``0 .. seq - 1``.
    ``BertModel(config, add_pooling_layer=False)`` (the base of the masked-LM,
    token-classification and question-answering heads) has no ``pooler`` and returns
    ``last_hidden_state`` alone. Dropout (``hidden_dropout_prob``,
    ``attention_probs_dropout_prob``) runs only with ``train=True``, from ``key``.

    ``init(key, (batch, seq))`` gives the params of transformers' ``BertModel``, with
    its names (see ``purelayers.models.bert``) and init: ``N(0, initializer_range^2)``
    weights and embeddings (the padding row zero), zero biases, LayerNorms at ones and
    zeros.

    Shape:
      ``input_ids``, ``attention_mask``, ``token_type_ids`` ``(batch, seq)`` with
      ``seq <= max_position_embeddings``; ``last_hidden_state`` ``(batch, seq,
      hidden_size)``; ``pooler_output`` ``(batch, hidden_size)``.

    Example:
      >>> from purelayers.models.bert import BertConfig, BertModel
      >>> bert = BertModel(BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=2,
      ...                             num_attention_heads=2, intermediate_size=16))
      >>> names = list(pl.params.flatten(bert.ordered(pl.params.abstract(bert, (1, 5)))))
      >>> len(names), names[0], names[5], names[-1]
      (39, 'embeddings.word_embeddings.weight', 'encoder.layer.0.attention.self.query.weight', 'pooler.dense.bias')
    """

    config: BertConfig
    add_pooling_layer: bool = True

    config_class: ClassVar[type[BertConfig]] = BertConfig
    base_model_prefix: ClassVar[str] = "bert"
    # transformers drops these on load: position_ids was a persistent buffer once.
    ignore_on_load: ClassVar[tuple[str, ...]] = (r"(^|\.)position_ids$",)
    # heads built without a pooler (masked-LM, image classification) save none: it is
    # initialized anew, as transformers does
    optional_on_load: ClassVar[tuple[str, ...]] = (r"^pooler\.",)

    def __post_init__(self):
        if not isinstance(self.config, BertConfig):
            raise ValueError(f"BertModel: config must be a BertConfig, got {self.config!r}")
        if not isinstance(self.add_pooling_layer, bool):
            raise ValueError(
                f"BertModel: add_pooling_layer must be True or False, "
                f"got {self.add_pooling_layer!r}"
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
        dense = _dense(c.hidden_size, _std(c.initializer_range))
        parts = {"embeddings": BertEmbeddings(c), "encoder": BertEncoder(c)}
        if self.add_pooling_layer:
            parts["pooler"] = Sequential({"dense": dense, "activation": Tanh()})
        return parts

    def _check_ids(self, shape: tuple[int, ...]) -> None:
        if len(shape) != 2:
            raise LayerError("BertModel", "input_ids shape", "(batch, seq)", shape)
        if shape[1] > self.config.max_position_embeddings:
            raise LayerError(
                "BertModel",
                "sequence length",
                f"at most max_position_embeddings={self.config.max_position_embeddings}",
                shape[1],
            )

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        ids = as_shape(shape)
        self._check_ids(ids)
        h = (*ids, self.config.hidden_size)
        shapes = {"embeddings": ids, "encoder": h}
        if self.add_pooling_layer:
            shapes["pooler"] = (ids[0], h[-1])
        return init_children(self, key, shapes, dtype)

    def apply(
        self,
        params: Params,
        input_ids: Any,
        *,
        attention_mask: Any = None,
        token_type_ids: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> tuple[jax.Array, jax.Array] | jax.Array:
        input_ids = as_array(input_ids)
        self._check_ids(input_ids.shape)
        for what, value in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if value is not None and jnp.shape(value) != input_ids.shape:
                raise LayerError("BertModel", f"{what} shape", input_ids.shape, jnp.shape(value))
        mask = None
        if attention_mask is not None:
            mask = (jnp.asarray(attention_mask) != 0)[:, None, None, :]
        h = self.call(
            "embeddings",
            params,
            input_ids,
            token_type_ids=token_type_ids,
            key=fold(key, 0),
            train=train,
        )
        h = self.call("encoder", params, h, mask=mask, key=fold(key, 1), train=train)
        if not self.add_pooling_layer:
            return h
        return h, self.call("pooler", params, h[:, 0])
