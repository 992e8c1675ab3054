"""DistilBERT: ``transformers.DistilBertModel`` and ``DistilBertForSequenceClassification``,
a post-norm bidirectional encoder (BERT's, without token types or pooler), under
transformers' names::

    embeddings.word_embeddings.weight           (vocab_size, dim)
    embeddings.position_embeddings.weight       (max_position_embeddings, dim)
    embeddings.LayerNorm.weight, .bias
    transformer.layer.{i}.attention.q_lin.weight, .bias   (and k_lin, v_lin, out_lin)
    transformer.layer.{i}.sa_layer_norm.weight, .bias
    transformer.layer.{i}.ffn.lin1.weight, .bias          (hidden_dim, dim)
    transformer.layer.{i}.ffn.lin2.weight, .bias          (dim, hidden_dim)
    transformer.layer.{i}.output_layer_norm.weight, .bias

The classifier prefixes them with ``distilbert.`` and adds ``pre_classifier`` ``(dim,
dim)`` and ``classifier`` ``(num_labels, dim)``. The blocks are one ``Repeat``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.init import normal
from purelayers.layers import (
    AttentionCore,
    Dropout,
    Embedding,
    Layer,
    LayerError,
    LayerNorm,
    Params,
    ReLU,
    Repeat,
    Sequential,
)
from purelayers.layers._checks import as_array, as_shape, check_float, check_int
from purelayers.models._heads import LabelsConfig
from purelayers.models._parts import fold, init_children
from purelayers.models.bert import (
    _ACTIVATIONS,
    BertEncoder,
    Built,
    _check_activation,
    _dense,
    _std,
    self_attention,
)

__all__ = [
    "DistilBertConfig",
    "DistilBertForSequenceClassification",
    "DistilBertModel",
    "DistilBertSelfAttention",
]

_EPS = 1e-12  # transformers' DistilBERT LayerNorms: fixed, not a setting


@dataclasses.dataclass(frozen=True)
class DistilBertConfig(LabelsConfig):
    """``transformers.DistilBertConfig``: the same field names and defaults (those the
    encoder and its classifier use). ``DistilBertConfig.from_dict(config_json)`` reads
    a ``config.json``. ``sinusoidal_pos_embds`` is kept for the file: it sets
    transformers' initial position table, which the file holds; ``init`` here draws
    ``N(0, initializer_range^2)`` either way."""

    model_type: ClassVar[str] = "distilbert"

    vocab_size: int = 30522
    max_position_embeddings: int = 512
    sinusoidal_pos_embds: bool = False
    n_layers: int = 6
    n_heads: int = 12
    dim: int = 768
    hidden_dim: int = 3072
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu"
    initializer_range: float = 0.02
    qa_dropout: float = 0.1
    seq_classif_dropout: float = 0.2
    pad_token_id: int | None = 0

    def __post_init__(self):
        super().__post_init__()
        name = "DistilBertConfig"
        for field in ("vocab_size", "max_position_embeddings", "n_layers", "n_heads"):
            check_int(name, field, getattr(self, field))
        for field in ("dim", "hidden_dim"):
            check_int(name, field, getattr(self, field))
        if self.dim % self.n_heads:
            raise ValueError(
                f"{name}: dim must be divisible by n_heads={self.n_heads}, got {self.dim}"
            )
        _check_activation(name, "activation", self.activation)
        for field in ("dropout", "attention_dropout", "qa_dropout", "seq_classif_dropout"):
            check_float(name, field, getattr(self, field), low=0.0, high=1.0, high_open=True)
        check_float(name, "initializer_range", self.initializer_range, low=0.0)
        if self.pad_token_id is not None:
            check_int(name, "pad_token_id", self.pad_token_id, minimum=0)
            if self.pad_token_id >= self.vocab_size:
                raise ValueError(
                    f"{name}: pad_token_id must be < vocab_size={self.vocab_size}, "
                    f"got {self.pad_token_id}"
                )


@dataclasses.dataclass(frozen=True)
class DistilBertSelfAttention(Layer):
    """transformers' ``DistilBertSelfAttention``: ``out_lin(core(q_lin(x), k_lin(x),
    v_lin(x), mask))``.

    Shape:
      ``x`` and output ``(batch, seq, dim)``; ``mask`` broadcastable to ``(batch, heads,
      seq, seq)`` (``True`` where a query may attend).

    Parameters:
      ``q_lin``, ``k_lin``, ``v_lin``, ``out_lin`` (``weight``, ``bias``), in that order.
    """

    q_lin: Layer
    k_lin: Layer
    v_lin: Layer
    out_lin: Layer
    core: AttentionCore

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        h = self_attention(self, params, x, ("q_lin", "k_lin", "v_lin"), mask, key, train)
        return self.call("out_lin", params, h)


@dataclasses.dataclass(frozen=True)
class _Block(Built):
    """transformers' ``TransformerBlock``: ``a = sa_layer_norm(attention(x) + x)``, then
    ``output_layer_norm(ffn(a) + a)`` with ``ffn = dropout(lin2(act(lin1(.))))``."""

    config: DistilBertConfig

    def build(self) -> dict[str, Layer]:
        c = self.config
        std = _std(c.initializer_range)
        core = AttentionCore(c.n_heads, dropout=c.attention_dropout)
        attention = DistilBertSelfAttention(
            _dense(c.dim, std), _dense(c.dim, std), _dense(c.dim, std), _dense(c.dim, std), core
        )
        ffn = {
            "lin1": _dense(c.hidden_dim, std),
            "activation": _ACTIVATIONS[c.activation],
            "lin2": _dense(c.dim, std),
            "dropout": Dropout(c.dropout),
        }
        return {
            "attention": attention,
            "sa_layer_norm": LayerNorm(eps=_EPS),
            "ffn": Sequential(ffn),
            "output_layer_norm": LayerNorm(eps=_EPS),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        x = as_shape(shape)
        names = ("attention", "sa_layer_norm", "ffn", "output_layer_norm")
        return init_children(self, key, dict.fromkeys(names, x), dtype)

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
        a = self.call("sa_layer_norm", params, a + x)
        h = self.call("ffn", params, a, key=fold(key, 1), train=train)
        return self.call("output_layer_norm", params, h + a)


@dataclasses.dataclass(frozen=True)
class _Transformer(BertEncoder):
    """transformers' DistilBERT ``Transformer``: ``layer``, ``n_layers`` blocks as one
    ``Repeat`` (names ``layer.0.*``, ...; params stacked); ``BertEncoder``'s ``init`` and
    ``apply``."""

    config: DistilBertConfig

    def build(self) -> dict[str, Layer]:
        return {"layer": Repeat(_Block(self.config), self.config.n_layers)}


@dataclasses.dataclass(frozen=True)
class _Embeddings(Built):
    """transformers' DistilBERT ``Embeddings``: ``dropout(LayerNorm(word + position))``
    at positions ``0 .. seq - 1``."""

    config: DistilBertConfig

    @property
    def takes_ids(self) -> bool:
        return True

    def build(self) -> dict[str, Layer]:
        c = self.config
        init = normal(std=_std(c.initializer_range))
        return {
            "word_embeddings": Embedding(
                c.vocab_size, c.dim, padding_idx=c.pad_token_id, weight_init=init
            ),
            "position_embeddings": Embedding(c.max_position_embeddings, c.dim, weight_init=init),
            "LayerNorm": LayerNorm(eps=_EPS),
            "dropout": Dropout(c.dropout),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        ids = as_shape(shape)
        shapes = dict.fromkeys(("word_embeddings", "position_embeddings"), ids)
        shapes["LayerNorm"] = (*ids, self.config.dim)
        return init_children(self, key, shapes, dtype)

    def apply(
        self, params: Params, input_ids: Any, *, key: jax.Array | None = None, train: bool = False
    ) -> jax.Array:
        positions = jnp.arange(input_ids.shape[1])[None, :]
        h = self.call("word_embeddings", params, input_ids)
        h = h + self.call("position_embeddings", params, positions)
        h = self.call("LayerNorm", params, h)
        return self.call("dropout", params, h, key=key, train=train)


@dataclasses.dataclass(frozen=True)
class DistilBertModel(Built):
    r"""``transformers.DistilBertModel(config)``: embeddings (word and position, no
    token types) and ``n_layers`` post-norm blocks; no pooler.

    ``apply(params, input_ids, *, attention_mask=None, key=None, train=False)`` returns
    ``last_hidden_state``, as transformers' ``.last_hidden_state``. ``attention_mask``
    is ``1`` for a token and ``0`` for padding: no query attends a padding key.
    Dropout (``dropout``, ``attention_dropout``) runs only with ``train=True``.

    ``init(key, (batch, seq))`` gives transformers' names (see
    ``purelayers.models.distilbert``): ``N(0, initializer_range^2)`` weights and
    embeddings (the padding row zero), zero biases, LayerNorms at ones and zeros.

    Shape:
      ``input_ids``, ``attention_mask`` ``(batch, seq)``, ``seq <=
      max_position_embeddings``; output ``(batch, seq, dim)``.

    Example:
      >>> from purelayers.models import DistilBertConfig, DistilBertModel
      >>> model = DistilBertModel(DistilBertConfig(
      ...     vocab_size=50, dim=8, hidden_dim=16, n_layers=1, n_heads=2))
      >>> params = model.init(jax.random.key(0), (2, 5))
      >>> list(pl.params.flatten(params))[4]
      'transformer.layer.0.attention.q_lin.weight'
    """

    config: DistilBertConfig

    config_class: ClassVar[type[DistilBertConfig]] = DistilBertConfig
    base_model_prefix: ClassVar[str] = "distilbert"
    # transformers drops these on load: position_ids was a persistent buffer once
    ignore_on_load: ClassVar[tuple[str, ...]] = (r"(^|\.)position_ids$",)
    optional_on_load: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        if not isinstance(self.config, DistilBertConfig):
            raise ValueError(
                f"{type(self).__name__}: config must be a DistilBertConfig, got {self.config!r}"
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
        return {
            "embeddings": _Embeddings(c),
            "transformer": _Transformer(c),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        ids = as_shape(shape)
        shapes = {"embeddings": ids, "transformer": (*ids, self.config.dim)}
        return init_children(self, key, shapes, dtype)

    def apply(
        self,
        params: Params,
        input_ids: Any,
        *,
        attention_mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        ids = as_array(input_ids)
        if ids.ndim != 2 or ids.shape[1] > self.config.max_position_embeddings:
            raise LayerError(
                "DistilBertModel",
                "input_ids shape",
                f"(batch, seq) with seq <= {self.config.max_position_embeddings}",
                ids.shape,
            )
        mask = None
        if attention_mask is not None:
            if jnp.shape(attention_mask) != ids.shape:
                raise LayerError(
                    "DistilBertModel", "attention_mask shape", ids.shape, jnp.shape(attention_mask)
                )
            mask = (jnp.asarray(attention_mask) != 0)[:, None, None, :]
        h = self.call("embeddings", params, ids, key=fold(key, 0), train=train)
        return self.call("transformer", params, h, mask=mask, key=fold(key, 1), train=train)


@dataclasses.dataclass(frozen=True)
class DistilBertForSequenceClassification(DistilBertModel):
    r"""``transformers.DistilBertForSequenceClassification``: ``logits =
    classifier(dropout(relu(pre_classifier(last_hidden_state[:, 0]))))``, dropout
    ``seq_classif_dropout``, ``config.num_labels`` wide.

    ``apply(params, input_ids, *, attention_mask=None, key=None, train=False)`` returns
    the logits (no loss).

    Shape:
      ``input_ids``, ``attention_mask`` ``(batch, seq)``; output ``(batch, num_labels)``.

    Parameters:
      ``distilbert.*`` (``DistilBertModel``'s); ``pre_classifier.weight`` ``(dim, dim)``,
      ``classifier.weight`` ``(num_labels, dim)``: ``N(0, initializer_range^2)``; biases
      zeros.
    """

    peft_task_type: ClassVar[str] = "SEQ_CLS"

    def build(self) -> dict[str, Layer]:
        c = self.config
        std = _std(c.initializer_range)
        return {
            "distilbert": DistilBertModel(c),
            "pre_classifier": _dense(c.dim, std),
            "relu": ReLU(),
            "dropout": Dropout(c.seq_classif_dropout),
            "classifier": _dense(c.num_labels, std),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        ids = as_shape(shape)
        h = (ids[0], self.config.dim)
        shapes = {"distilbert": ids, "pre_classifier": h, "classifier": h}
        return init_children(self, key, shapes, dtype)

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
            "distilbert",
            params,
            input_ids,
            attention_mask=attention_mask,
            key=fold(key, 0),
            train=train,
        )
        h = self.call("relu", params, self.call("pre_classifier", params, h[:, 0]))
        h = self.call("dropout", params, h, key=fold(key, 1), train=train)
        return self.call("classifier", params, h)
