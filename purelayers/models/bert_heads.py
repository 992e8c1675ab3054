"""BERT's task heads, as transformers' ``BertForSequenceClassification``,
``BertForTokenClassification``, ``BertForMaskedLM`` and ``BertForQuestionAnswering``:
a ``bert`` (``BertModel``, without its pooler where transformers builds none) and the
head, under transformers' names::

    bert.*                                     BertModel's names, prefixed
    classifier.weight, .bias                   (num_labels, hidden_size): classifiers
    qa_outputs.weight, .bias                   (num_labels, hidden_size): question answering
    cls.predictions.bias                       (vocab_size,): masked LM
    cls.predictions.transform.dense.weight, .bias
    cls.predictions.transform.LayerNorm.weight, .bias
    cls.predictions.decoder.weight             tied to bert.embeddings.word_embeddings.weight

``apply(params, input_ids, *, attention_mask=None, token_type_ids=None, key=None,
train=False)`` returns transformers' output arrays without the loss: ``logits`` for the
classifiers and the masked LM, ``(start_logits, end_logits)`` for question answering.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.layers import Dropout, Layer, LayerNorm, Params, Sequential
from purelayers.layers._checks import as_shape
from purelayers.models._parts import fold, init_children
from purelayers.models.bert import _ACTIVATIONS, BertConfig, BertModel, Built, _dense, _std

__all__ = [
    "BertForMaskedLM",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertLMPredictionHead",
    "BertOnlyMLMHead",
]


def classifier_dropout(config: BertConfig) -> Dropout:
    """The dropout before a classifier: ``classifier_dropout``, else
    ``hidden_dropout_prob``, as transformers' heads choose it."""
    c = config
    return Dropout(c.hidden_dropout_prob if c.classifier_dropout is None else c.classifier_dropout)


class _Head(Built):
    """What the BERT-family heads share: the config check, the names, the base model's
    call (under ``base_model_prefix``) and ``apply``, which runs the base model and
    hands its output to the subclass's ``_head(params, h, key, train)``."""

    config_class: ClassVar[type[BertConfig]] = BertConfig
    base_model_prefix: ClassVar[str] = "bert"
    model_class: ClassVar[type[BertModel]] = BertModel
    ignore_on_load: ClassVar[tuple[str, ...]] = BertModel.ignore_on_load
    optional_on_load: ClassVar[tuple[str, ...]] = ()
    pooled: ClassVar[bool] = False  # whether the head reads the pooler's output

    def __post_init__(self):
        if not isinstance(self.config, BertConfig):
            raise ValueError(
                f"{type(self).__name__}: config must be a BertConfig, got {self.config!r}"
            )
        super().__post_init__()

    takes_ids = BertModel.takes_ids
    example_shape = BertModel.example_shape

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        ids = as_shape(shape)
        h = (ids[0], self.config.hidden_size) if self.pooled else (*ids, self.config.hidden_size)
        heads = ("classifier", "qa_outputs", "cls", "lm_head")
        shapes = {self.base_model_prefix: ids, **dict.fromkeys(heads, h)}
        return init_children(self, key, shapes, dtype)

    def _bert(self) -> BertModel:
        return self.model_class(self.config, add_pooling_layer=self.pooled)

    def _encode(self, params, input_ids, attention_mask, token_type_ids, key, train):
        return self.call(
            self.base_model_prefix,
            params,
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            key=fold(key, 0),
            train=train,
        )

    def apply(
        self,
        params: Params,
        input_ids: Any,
        *,
        attention_mask: Any = None,
        token_type_ids: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> Any:
        h = self._encode(params, input_ids, attention_mask, token_type_ids, key, train)
        return self._head(params, h, key, train)


class _DropoutClassifier(_Head):
    """``classifier(dropout(h))`` on the base model's output."""

    def build(self) -> dict[str, Layer]:
        c = self.config
        return {
            self.base_model_prefix: self._bert(),
            "dropout": classifier_dropout(c),
            "classifier": _dense(c.num_labels, _std(c.initializer_range)),
        }

    def _head(self, params: Params, h: Any, key: jax.Array | None, train: bool) -> jax.Array:
        h = self.call("dropout", params, h, key=fold(key, 1), train=train)
        return self.call("classifier", params, h)


class _TiedLM(_Head):
    """A masked LM whose decoder is the word embeddings (held once, at
    ``<base_model_prefix>.embeddings.word_embeddings.weight``); the head at
    ``lm_path`` owns the decoder's ``bias``, and a file's ``<lm_path>.decoder.weight``
    and ``.bias`` load as aliases."""

    lm_path: ClassVar[str] = "cls.predictions"

    def aliases(self) -> dict[str, str]:
        p = self.lm_path
        return {
            **super().aliases(),
            f"{p}.decoder.weight": f"{self.base_model_prefix}.embeddings.word_embeddings.weight",
            f"{p}.decoder.bias": f"{p}.bias",
        }

    def _head(self, params: Params, h: Any, key: jax.Array | None, train: bool) -> jax.Array:
        weight = params[self.base_model_prefix]["embeddings"]["word_embeddings"]["weight"]
        return self.call(self.lm_path.split(".")[0], params, h, weight=weight)


class _TiedDecoder(Built):
    """A head whose last step is ``decoder``, a ``Linear`` of the given weight (the word
    embeddings) and this layer's own ``bias`` ``(vocab_size,)``."""

    def own_names(self) -> tuple[str, ...]:
        return ("bias",)

    def _bias(self, dtype: Any) -> jax.Array:
        return jnp.zeros((self.config.vocab_size,), dtype)

    def _decode(self, params: Params, h: Any, weight: jax.Array) -> jax.Array:
        return self.call("decoder", {"decoder": {"weight": weight, "bias": params["bias"]}}, h)


@dataclasses.dataclass(frozen=True)
class BertForSequenceClassification(_DropoutClassifier):
    r"""``transformers.BertForSequenceClassification``: ``logits =
    classifier(dropout(pooler_output))``, ``config.num_labels`` wide.

    Args:
      config: a ``BertConfig``; ``id2label`` sets the labels, ``classifier_dropout``
        (else ``hidden_dropout_prob``) the dropout before the classifier.

    Shape:
      ``input_ids``, ``attention_mask``, ``token_type_ids`` ``(batch, seq)``; output
      ``(batch, num_labels)``.

    Parameters:
      ``bert.*`` (``BertModel``'s, pooler included); ``classifier.weight``
      ``(num_labels, hidden_size)`` ``N(0, initializer_range^2)``, ``classifier.bias``
      zeros.

    Example:
      >>> from purelayers.models import BertConfig, BertForSequenceClassification
      >>> model = BertForSequenceClassification(BertConfig(
      ...     vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
      ...     intermediate_size=16, id2label={0: "neg", 1: "pos", 2: "neutral"}))
      >>> params = model.init(jax.random.key(0), (2, 5))
      >>> model.apply(params, jnp.ones((2, 5), jnp.int32)).shape
      (2, 3)
    """

    config: BertConfig

    pooled: ClassVar[bool] = True
    peft_task_type: ClassVar[str] = "SEQ_CLS"

    def _head(self, params: Params, h: Any, key: jax.Array | None, train: bool) -> jax.Array:
        _, pooled = h
        return super()._head(params, pooled, key, train)


@dataclasses.dataclass(frozen=True)
class BertForTokenClassification(_DropoutClassifier):
    r"""``transformers.BertForTokenClassification``: ``logits =
    classifier(dropout(last_hidden_state))``, one row of ``num_labels`` per token.

    Shape:
      ``input_ids``, ``attention_mask``, ``token_type_ids`` ``(batch, seq)``; output
      ``(batch, seq, num_labels)``.

    Parameters:
      ``bert.*`` (no pooler); ``classifier.weight`` ``(num_labels, hidden_size)``,
      ``classifier.bias``.
    """

    config: BertConfig

    peft_task_type: ClassVar[str] = "TOKEN_CLS"


@dataclasses.dataclass(frozen=True)
class BertForQuestionAnswering(_Head):
    r"""``transformers.BertForQuestionAnswering``: ``logits =
    qa_outputs(last_hidden_state)``; ``start_logits = logits[..., 0]``, ``end_logits =
    logits[..., 1]``.

    Shape:
      ``input_ids``, ``attention_mask``, ``token_type_ids`` ``(batch, seq)``; each
      output ``(batch, seq)``.

    Parameters:
      ``bert.*`` (no pooler); ``qa_outputs.weight`` ``(num_labels, hidden_size)`` (two
      labels, the default), ``qa_outputs.bias``.
    """

    config: BertConfig

    peft_task_type: ClassVar[str] = "QUESTION_ANS"

    def build(self) -> dict[str, Layer]:
        c = self.config
        return {
            self.base_model_prefix: self._bert(),
            "qa_outputs": _dense(c.num_labels, _std(c.initializer_range)),
        }

    def _head(
        self, params: Params, h: Any, key: jax.Array | None, train: bool
    ) -> tuple[jax.Array, jax.Array]:
        logits = self.call("qa_outputs", params, h)
        return logits[..., 0], logits[..., 1]


@dataclasses.dataclass(frozen=True)
class BertLMPredictionHead(_TiedDecoder):
    r"""transformers' ``BertLMPredictionHead``: ``decoder(LayerNorm(act(dense(h))))``,
    where ``decoder`` is a ``Linear`` whose weight is given (the word embeddings) and
    whose bias is this layer's own ``bias``.

    ``apply(params, h, *, weight)``.

    Shape:
      ``h`` ``(..., hidden_size)``; ``weight`` ``(vocab_size, hidden_size)``; output
      ``(..., vocab_size)``.

    Parameters:
      ``bias`` ``(vocab_size,)`` zeros; ``transform.dense.weight``, ``.bias``;
      ``transform.LayerNorm.weight``, ``.bias``.
    """

    config: BertConfig

    def build(self) -> dict[str, Layer]:
        c = self.config
        std = _std(c.initializer_range)
        transform = {
            "dense": _dense(c.hidden_size, std),
            "transform_act_fn": _ACTIVATIONS[c.hidden_act],
            "LayerNorm": LayerNorm(eps=c.layer_norm_eps),
        }
        return {"transform": Sequential(transform), "decoder": _dense(c.vocab_size, std)}

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        return {
            "bias": self._bias(dtype),
            "transform": self.init_child("transform", key, as_shape(shape), dtype),
        }

    def apply(self, params: Params, h: Any, *, weight: jax.Array) -> jax.Array:
        return self._decode(params, self.call("transform", params, h), weight)


@dataclasses.dataclass(frozen=True)
class BertOnlyMLMHead(Built):
    """transformers' ``BertOnlyMLMHead``: ``predictions`` (a ``BertLMPredictionHead``);
    ``apply(params, h, *, weight)`` as that."""

    config: BertConfig

    def build(self) -> dict[str, Layer]:
        return {"predictions": BertLMPredictionHead(self.config)}

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        return init_children(self, key, {"predictions": as_shape(shape)}, dtype)

    def apply(self, params: Params, h: Any, *, weight: jax.Array) -> jax.Array:
        return self.call("predictions", params, h, weight=weight)


@dataclasses.dataclass(frozen=True)
class BertForMaskedLM(_TiedLM):
    r"""``transformers.BertForMaskedLM``: ``logits = cls.predictions(last_hidden_state)``,
    its decoder the word embeddings (held once, at
    ``bert.embeddings.word_embeddings.weight``; a file's
    ``cls.predictions.decoder.weight`` and ``.bias`` load as aliases and are not
    written, as transformers writes them).

    Shape:
      ``input_ids``, ``attention_mask``, ``token_type_ids`` ``(batch, seq)``; output
      ``(batch, seq, vocab_size)``.

    Parameters:
      ``bert.*`` (no pooler); ``cls.predictions.*`` (``BertLMPredictionHead``).
    """

    config: BertConfig

    def build(self) -> dict[str, Layer]:
        return {
            self.base_model_prefix: self._bert(),
            "cls": BertOnlyMLMHead(self.config),
        }
