"""RoBERTa: ``transformers.RobertaModel``, ``RobertaForSequenceClassification`` and
``RobertaForMaskedLM``. BERT's encoder (``purelayers.models.bert``) under the prefix
``roberta.``, its position ids counted from the padding index as transformers'
``create_position_ids_from_input_ids`` counts them (``pad_token_id + cumsum(ids !=
pad_token_id)`` at tokens, ``pad_token_id`` at padding), so a left-padded row gets the
positions of an unpadded one. Heads::

    classifier.dense.weight, .bias        (hidden_size, hidden_size)
    classifier.out_proj.weight, .bias     (num_labels, hidden_size)
    lm_head.bias                          (vocab_size,)
    lm_head.dense.weight, .bias
    lm_head.layer_norm.weight, .bias
    lm_head.decoder.weight                tied to roberta.embeddings.word_embeddings.weight
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.layers import GELU, Layer, LayerNorm, Params, Tanh
from purelayers.layers._checks import as_shape
from purelayers.models._parts import fold, init_children
from purelayers.models.bert import (
    BertConfig,
    BertEmbeddings,
    BertEncoder,
    BertModel,
    Built,
    _dense,
    _std,
)
from purelayers.models.bert_heads import _Head, _TiedDecoder, _TiedLM, classifier_dropout

__all__ = [
    "RobertaConfig",
    "RobertaEmbeddings",
    "RobertaForMaskedLM",
    "RobertaForSequenceClassification",
    "RobertaModel",
]


@dataclasses.dataclass(frozen=True)
class RobertaConfig(BertConfig):
    """``transformers.RobertaConfig``: ``BertConfig``'s fields with RoBERTa's defaults
    (``vocab_size=50265``, ``pad_token_id=1``)."""

    model_type: ClassVar[str] = "roberta"

    vocab_size: int = 50265
    pad_token_id: int | None = 1


def position_ids(input_ids: jax.Array, padding_idx: int) -> jax.Array:
    """transformers' ``create_position_ids_from_input_ids``: ``padding_idx +
    cumsum(mask) * mask`` with ``mask = input_ids != padding_idx``.

    Shape:
      ``input_ids`` and output ``(batch, seq)``.
    """
    mask = (input_ids != padding_idx).astype(jnp.int32)
    return jnp.cumsum(mask, axis=1) * mask + padding_idx


@dataclasses.dataclass(frozen=True)
class RobertaEmbeddings(BertEmbeddings):
    """transformers' ``RobertaEmbeddings``: ``BertEmbeddings`` at the positions
    ``position_ids(input_ids, pad_token_id)``; the position table's row
    ``pad_token_id`` starts at zero and gets no gradient, as torch's ``padding_idx``."""

    def build(self) -> dict[str, Layer]:
        parts = super().build()
        # registered last in transformers' RobertaEmbeddings, with a padding row
        table = parts.pop("position_embeddings")
        parts["position_embeddings"] = dataclasses.replace(
            table, padding_idx=self.config.pad_token_id
        )
        return parts

    def position_ids(self, input_ids: jax.Array) -> jax.Array:
        """``position_ids(input_ids, pad_token_id)``."""
        return position_ids(input_ids, self.config.pad_token_id)


@dataclasses.dataclass(frozen=True)
class RobertaModel(BertModel):
    r"""``transformers.RobertaModel(config)``: ``BertModel`` with ``RobertaEmbeddings``;
    ``apply`` as ``BertModel``'s, returning ``(last_hidden_state, pooler_output)``
    (``last_hidden_state`` alone with ``add_pooling_layer=False``).

    Shape:
      ``input_ids``, ``attention_mask``, ``token_type_ids`` ``(batch, seq)``.
    """

    config_class: ClassVar[type[BertConfig]] = RobertaConfig
    base_model_prefix: ClassVar[str] = "roberta"

    def build(self) -> dict[str, Layer]:
        return {
            **super().build(),
            "embeddings": RobertaEmbeddings(self.config),
            "encoder": BertEncoder(self.config),
        }


class _RobertaHead(_Head):
    config_class: ClassVar[type[BertConfig]] = RobertaConfig
    base_model_prefix: ClassVar[str] = "roberta"
    model_class: ClassVar[type[BertModel]] = RobertaModel


@dataclasses.dataclass(frozen=True)
class RobertaClassificationHead(Built):
    """transformers' ``RobertaClassificationHead``: ``out_proj(dropout(tanh(dense(
    dropout(h[:, 0])))))``.

    Shape:
      ``h`` ``(batch, seq, hidden_size)``; output ``(batch, num_labels)``.
    """

    config: BertConfig

    def build(self) -> dict[str, Layer]:
        c = self.config
        std = _std(c.initializer_range)
        return {
            "dense": _dense(c.hidden_size, std),
            "activation": Tanh(),
            "dropout": classifier_dropout(c),
            "out_proj": _dense(c.num_labels, std),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        x = as_shape(shape)
        h = (x[0], x[-1])
        return init_children(self, key, {"dense": h, "out_proj": h}, dtype)

    def apply(
        self, params: Params, h: Any, *, key: jax.Array | None = None, train: bool = False
    ) -> jax.Array:
        x = self.call("dropout", params, h[:, 0], key=fold(key, 0), train=train)
        x = self.call("activation", params, self.call("dense", params, x))
        x = self.call("dropout", params, x, key=fold(key, 1), train=train)
        return self.call("out_proj", params, x)


@dataclasses.dataclass(frozen=True)
class RobertaForSequenceClassification(_RobertaHead):
    r"""``transformers.RobertaForSequenceClassification``: ``logits =
    classifier(last_hidden_state)`` (a ``RobertaClassificationHead`` on the first
    token), ``config.num_labels`` wide.

    Shape:
      ``input_ids``, ``attention_mask``, ``token_type_ids`` ``(batch, seq)``; output
      ``(batch, num_labels)``.

    Parameters:
      ``roberta.*`` (no pooler); ``classifier.dense.*``, ``classifier.out_proj.*``.
    """

    config: BertConfig

    peft_task_type: ClassVar[str] = "SEQ_CLS"

    def build(self) -> dict[str, Layer]:
        return {
            "roberta": self._bert(),
            "classifier": RobertaClassificationHead(self.config),
        }

    def _head(self, params: Params, h: Any, key: jax.Array | None, train: bool) -> jax.Array:
        return self.call("classifier", params, h, key=fold(key, 1), train=train)


@dataclasses.dataclass(frozen=True)
class RobertaLMHead(_TiedDecoder):
    """transformers' ``RobertaLMHead``: ``decoder(layer_norm(gelu(dense(h))))``, the
    decoder's weight given (the word embeddings) and its bias this layer's ``bias``.

    Shape:
      ``h`` ``(..., hidden_size)``; ``weight`` ``(vocab_size, hidden_size)``; output
      ``(..., vocab_size)``.
    """

    config: BertConfig

    def build(self) -> dict[str, Layer]:
        c = self.config
        std = _std(c.initializer_range)
        return {
            "dense": _dense(c.hidden_size, std),
            "activation": GELU(),
            "layer_norm": LayerNorm(eps=c.layer_norm_eps),
            "decoder": _dense(c.vocab_size, std),
        }

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        x = as_shape(shape)
        bias = {"bias": self._bias(dtype)}
        return {**bias, **init_children(self, key, {"dense": x, "layer_norm": x}, dtype)}

    def apply(self, params: Params, h: Any, *, weight: jax.Array) -> jax.Array:
        x = self.call("activation", params, self.call("dense", params, h))
        x = self.call("layer_norm", params, x)
        return self._decode(params, x, weight)


@dataclasses.dataclass(frozen=True)
class RobertaForMaskedLM(_RobertaHead, _TiedLM):
    r"""``transformers.RobertaForMaskedLM``: ``logits = lm_head(last_hidden_state)``,
    the decoder the word embeddings (held once; a file's ``lm_head.decoder.weight`` and
    ``.bias`` load as aliases and are not written).

    Shape:
      ``input_ids``, ``attention_mask``, ``token_type_ids`` ``(batch, seq)``; output
      ``(batch, seq, vocab_size)``.

    Parameters:
      ``roberta.*`` (no pooler); ``lm_head.*`` (``RobertaLMHead``).
    """

    config: BertConfig

    lm_path: ClassVar[str] = "lm_head"

    def build(self) -> dict[str, Layer]:
        return {
            "roberta": self._bert(),
            "lm_head": RobertaLMHead(self.config),
        }
