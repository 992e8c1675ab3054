"""What the task heads share: the label settings every transformers config carries
(``id2label``, ``label2id``; ``num_labels`` is their length) and the last-token pooling
of the sequence-classification LMs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from purelayers.models.config import Config, Frozen

__all__ = ["LabelsConfig", "last_token"]


def _labels(config: str, id2label: Any, label2id: Any) -> tuple[Frozen, Frozen]:
    if id2label is None:
        n = len(label2id) if isinstance(label2id, Mapping) else 2
        id2label = {i: f"LABEL_{i}" for i in range(n)}
    if not isinstance(id2label, Mapping) or not id2label:
        raise ValueError(
            f"{config}: id2label must be a non-empty mapping of label index to name, "
            f"got {id2label!r}"
        )
    try:  # a config.json's keys are strings
        by_index = {int(k): v for k, v in id2label.items()}
    except (TypeError, ValueError):
        raise ValueError(
            f"{config}: id2label's keys must be label indices, got {list(id2label)!r}"
        ) from None
    if label2id is None:
        label2id = {v: k for k, v in by_index.items()}
    return Frozen(by_index), Frozen({k: int(v) for k, v in label2id.items()})


@dataclasses.dataclass(frozen=True)
class LabelsConfig(Config):
    """A config with transformers' label settings: ``id2label`` (``{index: name}``,
    default two labels ``LABEL_0``, ``LABEL_1``; a ``config.json``'s string keys become
    integers) and ``label2id`` (default its inverse). ``num_labels`` is the number of
    labels, the width of a classifier head."""

    id2label: Mapping[int, str] | None = None
    label2id: Mapping[str, int] | None = None

    def __post_init__(self):
        super().__post_init__()
        id2label, label2id = _labels(type(self).__name__, self.id2label, self.label2id)
        object.__setattr__(self, "id2label", id2label)
        object.__setattr__(self, "label2id", label2id)

    @property
    def num_labels(self) -> int:
        """``len(id2label)``, as transformers' ``config.num_labels``."""
        return len(self.id2label)


def last_token(
    logits: jax.Array, input_ids: jax.Array | None, pad_token_id: int | None
) -> jax.Array:
    """``logits[b, i_b]`` at each row's last non-padding token, as transformers'
    sequence-classification LMs pool: ``i_b`` is the rightmost position whose id is not
    ``pad_token_id`` (so a left- or right-padded row gives its last token; the last
    position where there is no pad id or no padding).

    Shape:
      ``logits`` ``(batch, seq, num_labels)``; ``input_ids`` ``(batch, seq)``; output
      ``(batch, num_labels)``.
    """
    seq = logits.shape[1]
    if input_ids is None or pad_token_id is None:
        index = jnp.full((logits.shape[0],), seq - 1)
    else:
        tokens = (input_ids != pad_token_id).astype(jnp.int32) * jnp.arange(seq)[None, :]
        index = jnp.max(tokens, axis=-1)
    return jnp.take_along_axis(logits, index[:, None, None], axis=1)[:, 0]
