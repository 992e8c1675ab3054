"""The sequence-classification LMs, as transformers' ``LlamaForSequenceClassification``
and ``Qwen2ForSequenceClassification`` (its ``GenericForSequenceClassification``): the
causal LM's decoder under ``model`` and a bias-free ``score`` read at each row's last
non-padding token::

    model.*              the causal LM's names (model.embed_tokens.weight, ...)
    score.weight         (num_labels, hidden_size)
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers import init as _init
from purelayers.layers import Layer, Linear, Params
from purelayers.layers._checks import as_array, as_shape
from purelayers.models._heads import LabelsConfig, last_token
from purelayers.models._parts import init_children
from purelayers.models.bert import Built
from purelayers.models.llama import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

__all__ = [
    "LlamaForSequenceClassification",
    "LlamaSeqClsConfig",
    "Qwen2ForSequenceClassification",
    "Qwen2SeqClsConfig",
]


@dataclasses.dataclass(frozen=True)
class LlamaSeqClsConfig(LlamaConfig, LabelsConfig):
    """``LlamaConfig`` with the label settings (``id2label``, ``label2id``;
    ``num_labels`` their length), as transformers' ``LlamaConfig`` carries them."""


@dataclasses.dataclass(frozen=True)
class Qwen2SeqClsConfig(Qwen2Config, LabelsConfig):
    """``Qwen2Config`` with the label settings, as ``LlamaSeqClsConfig``."""


@dataclasses.dataclass(frozen=True)
class LlamaForSequenceClassification(Built):
    r"""``transformers.LlamaForSequenceClassification``: ``logits =
    score(last_hidden_state)[b, i_b]``, ``i_b`` the rightmost position of row ``b``
    whose id is not ``config.pad_token_id`` (a left- or right-padded row gives its last
    token; position 0 for a row of pads alone), as transformers'
    ``GenericForSequenceClassification`` picks it (``_heads.last_token``). Without a
    ``pad_token_id`` the last position is read, and only a batch of one row is taken.

    ``apply(params, input_ids, *, attention_mask=None, position_ids=None, key=None,
    train=False)`` returns the logits (no loss). ``position_ids`` default to ``0 ..
    seq - 1`` on every row, padded or not, as transformers' forward counts them.

    Args:
      config: a ``LlamaSeqClsConfig`` (``LlamaConfig``'s fields with ``id2label``).

    Shape:
      ``input_ids``, ``attention_mask`` ``(batch, seq)``; output ``(batch,
      num_labels)``.

    Parameters:
      ``model.*`` (the causal LM's decoder); ``score.weight`` ``(num_labels,
      hidden_size)`` ``N(0, initializer_range^2)``.

    Example:
      >>> from purelayers.models import LlamaForSequenceClassification, LlamaSeqClsConfig
      >>> model = LlamaForSequenceClassification(LlamaSeqClsConfig(
      ...     vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
      ...     num_attention_heads=2, pad_token_id=0, id2label={0: "a", 1: "b", 2: "c"}))
      >>> params = model.init(jax.random.key(0), (2, 5))
      >>> model.apply(params, jnp.array([[3, 4, 5, 0, 0], [0, 3, 4, 5, 6]])).shape
      (2, 3)
    """

    config: LlamaSeqClsConfig

    config_class: ClassVar[type] = LlamaSeqClsConfig
    causal_lm: ClassVar[type] = LlamaForCausalLM  # whose decoder is ``model``
    base_model_prefix: ClassVar[str] = "model"
    ignore_on_load: ClassVar[tuple[str, ...]] = (r"\.rotary_emb\.inv_freq$",)
    optional_on_load: ClassVar[tuple[str, ...]] = ()
    peft_task_type: ClassVar[str] = "SEQ_CLS"

    def __post_init__(self):
        if not isinstance(self.config, self.config_class):
            raise ValueError(
                f"{type(self).__name__}: config must be a {self.config_class.__name__}, "
                f"got {self.config!r}"
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
        score = Linear(c.num_labels, bias=False, weight_init=_init.normal(std=c.initializer_range))
        return {"model": self.causal_lm(c).children()["model"], "score": score}

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        ids = as_shape(shape)
        shapes = {"model": ids, "score": (ids[0], self.config.hidden_size)}
        return init_children(self, key, shapes, dtype)

    def apply(
        self,
        params: Params,
        input_ids: Any,
        *,
        attention_mask: Any = None,
        position_ids: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        ids = as_array(input_ids)
        pad = self.config.pad_token_id
        if pad is None and ids.ndim == 2 and ids.shape[0] != 1:
            raise ValueError(
                f"{type(self).__name__}: a batch of more than one row needs "
                f"config.pad_token_id (to find each row's last token), got batch "
                f"{ids.shape[0]} with pad_token_id None"
            )
        if position_ids is None and ids.ndim == 2:
            position_ids = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
        h = self.call(
            "model",
            params,
            ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            key=key,
            train=train,
        )
        # the score is linear and bias-free: reading it at the pooled token alone
        # gives transformers' pooled logits
        return self.call("score", params, last_token(h, ids, pad))


@dataclasses.dataclass(frozen=True)
class Qwen2ForSequenceClassification(LlamaForSequenceClassification):
    """``transformers.Qwen2ForSequenceClassification``: ``LlamaForSequenceClassification``
    over Qwen2's decoder (biases on q/k/v; its sliding-window layers)."""

    config: Qwen2SeqClsConfig

    config_class: ClassVar[type] = Qwen2SeqClsConfig
    causal_lm: ClassVar[type] = Qwen2ForCausalLM
