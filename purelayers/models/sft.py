"""Supervised fine-tuning of the causal LMs: ``causal_lm_loss`` (transformers' loss) and
``sft_batch``, which turns prompt/response pairs into padded, masked training batches
through a tokenizer's chat template.

::

    batch = M.sft_batch(tokenizer, [("What is 2+2?", "4"), ...], max_length=512)
    logits = model.apply(params, batch["input_ids"], attention_mask=batch["attention_mask"])
    loss = M.causal_lm_loss(logits, batch["labels"])   # the response tokens only

The tokenizer is any object with transformers' ``apply_chat_template`` and ``__call__``
(``AutoTokenizer.from_pretrained(folder)``, ``PreTrainedTokenizerFast``; neither needs
torch); this module does not import transformers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["IGNORE_INDEX", "causal_lm_loss", "encode_chat", "sft_batch"]

IGNORE_INDEX = -100  # transformers' label for "no loss here"


def causal_lm_loss(
    logits: jax.Array,
    labels: jax.Array,
    *,
    ignore_index: int = IGNORE_INDEX,
    num_items_in_batch: Any = None,
) -> jax.Array:
    r"""transformers' causal LM loss: the next-token cross-entropy, mean over counted
    tokens.

    .. math::

        \mathcal{L} = \frac{1}{N} \sum_{b, t \,:\, y_{b,t+1} \ne \text{ignore}}
            -\log \operatorname{softmax}(z_{b,t})_{y_{b,t+1}}

    The labels are shifted by one inside (position ``t``'s logits predict label
    ``t + 1``; the last position predicts nothing), positions whose shifted label is
    ``ignore_index`` are left out, and ``N`` is the number of counted tokens (or
    ``num_items_in_batch`` where given, as transformers' gradient accumulation divides by
    the whole batch's count). The logits are upcast to float32 first, as transformers
    does; a batch with no counted token gives NaN, as torch's mean does. The per-token
    terms are optax's ``softmax_cross_entropy_with_integer_labels`` (optax is needed).

    Args:
      logits: ``(batch, seq, vocab)`` (any leading axes), the model's output.
      labels: ``(batch, seq)`` int ids, ``ignore_index`` where no loss is wanted (the
        prompt, the padding): usually ``input_ids`` with those positions masked.
      ignore_index: the label that is left out. Default ``-100``.
      num_items_in_batch: divide the sum by this instead of the count.

    Shape:
      logits ``(*, seq, vocab)``, labels ``(*, seq)`` -> a scalar.

    Example:
      >>> logits = jnp.zeros((1, 3, 5))
      >>> round(float(causal_lm_loss(logits, jnp.array([[-100, 2, 4]]))), 4)  # log(5)
      1.6094

    torch equivalent: ``transformers.loss.loss_utils.ForCausalLMLoss(logits, labels,
    vocab_size)``, the ``loss`` of ``model(input_ids, labels=labels)``.
    """
    import optax

    logits = jnp.asarray(logits)
    labels = jnp.asarray(labels)
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"causal_lm_loss: labels must be shaped like logits without the vocab axis, "
            f"expected {logits.shape[:-1]}, got {labels.shape}"
        )
    shifted = labels[..., 1:]
    counted = shifted != ignore_index
    terms = optax.softmax_cross_entropy_with_integer_labels(
        logits[..., :-1, :].astype(jnp.float32), jnp.where(counted, shifted, 0)
    )
    total = jnp.sum(jnp.where(counted, terms, 0.0))
    count = jnp.sum(counted) if num_items_in_batch is None else num_items_in_batch
    return total / count


# -- batches --------------------------------------------------------------------------


def _pair(example: Any, index: int) -> tuple[str, str, str | None]:
    """``(prompt, response, system)`` of one example: a ``(prompt, response)`` pair or a
    mapping with ``"prompt"`` and ``"response"`` (and optionally ``"system"``)."""
    if isinstance(example, Mapping):
        missing = [k for k in ("prompt", "response") if k not in example]
        if missing:
            raise ValueError(
                f"sft_batch: example {index} has no {' or '.join(map(repr, missing))} "
                f"(keys: {sorted(example)})"
            )
        prompt, response, system = example["prompt"], example["response"], example.get("system")
    elif isinstance(example, Sequence) and not isinstance(example, str) and len(example) == 2:
        (prompt, response), system = example, None
    else:
        raise ValueError(
            f"sft_batch: example {index} must be a (prompt, response) pair or a dict with "
            f"'prompt' and 'response', got {type(example).__name__}"
        )
    for name, value in (("prompt", prompt), ("response", response)):
        if not isinstance(value, str):
            raise ValueError(
                f"sft_batch: example {index}'s {name} must be a string, got {type(value).__name__}"
            )
    return prompt, response, system


def _ids(tokenizer: Any, text: str) -> list[int]:
    # the template already holds the special tokens (bos, turn markers): none added
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_chat(
    tokenizer: Any, prompt: str, response: str, *, system: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids, labels)`` of one prompt/response pair through the chat template.

    The conversation (an optional system turn, the user's ``prompt``, the assistant's
    ``response``) is rendered with ``tokenizer.apply_chat_template`` and tokenized
    without added special tokens (the template holds them); the labels equal the ids
    except over the prompt, the template's rendering of the conversation up to the
    assistant's turn (``add_generation_prompt=True``), which is ``-100``. What the
    template puts after the response (the end-of-turn token) is trained on, so the
    model learns to stop.

    Raises:
      ValueError: a template whose prompt is not a prefix of the whole conversation
        (in tokens), which leaves no place to cut.
    """
    turns = [] if system is None else [{"role": "system", "content": system}]
    turns.append({"role": "user", "content": prompt})
    head = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    whole = tokenizer.apply_chat_template(
        [*turns, {"role": "assistant", "content": response}], tokenize=False
    )
    head_ids, ids = _ids(tokenizer, head), _ids(tokenizer, whole)
    if ids[: len(head_ids)] != head_ids:
        raise ValueError(
            "encode_chat: the chat template's rendering of the prompt (add_generation_prompt"
            "=True) is not a prefix of the whole conversation's tokens, so the prompt "
            f"cannot be masked; prompt {prompt[:40]!r}"
        )
    labels = np.array(ids, np.int32)
    labels[: len(head_ids)] = IGNORE_INDEX
    return np.array(ids, np.int32), labels


def _pad_id(tokenizer: Any, pad_token_id: int | None) -> int:
    for value in (pad_token_id, getattr(tokenizer, "pad_token_id", None)):
        if value is not None:
            return int(value)
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError(
            "sft_batch: the tokenizer has neither a pad_token_id nor an eos_token_id; "
            "pass pad_token_id="
        )
    return int(eos)


def _rows(encoded: list[tuple[np.ndarray, np.ndarray]], max_length: int, packing: bool):
    """The examples as rows: one each, or (``packing``) consecutive examples joined while
    they fit in ``max_length``."""
    if not packing:
        return encoded
    rows, ids, labels = [], [], []
    for one_ids, one_labels in encoded:
        if ids and sum(map(len, ids)) + len(one_ids) > max_length:
            rows.append((np.concatenate(ids), np.concatenate(labels)))
            ids, labels = [], []
        ids.append(one_ids)
        labels.append(one_labels)
    if ids:
        rows.append((np.concatenate(ids), np.concatenate(labels)))
    return rows


def sft_batch(
    tokenizer: Any,
    examples: Sequence[Any],
    *,
    max_length: int,
    padding_side: str = "right",
    pad_to: str = "longest",
    truncation: str = "error",
    packing: bool = False,
    pad_token_id: int | None = None,
) -> dict[str, Any]:
    """A supervised fine-tuning batch from prompt/response pairs.

    Each example (a ``(prompt, response)`` pair or a dict with ``"prompt"``,
    ``"response"`` and optionally ``"system"``) goes through the tokenizer's chat
    template (``encode_chat``); its labels are ``-100`` over the prompt, and every
    padding position is ``-100`` in ``labels`` and ``0`` in ``attention_mask``. Feed
    ``input_ids`` and ``attention_mask`` to the model and ``labels`` to
    ``causal_lm_loss``.

    Truncation policy: ``truncation="error"`` (the default) makes an example longer
    than ``max_length`` tokens a ``ValueError`` naming it (its index and length);
    ``"right"`` cuts it to its first ``max_length`` tokens (the end of the response and
    its end-of-turn token are lost) and counts it in ``num_truncated``. An example
    whose prompt alone fills ``max_length`` has nothing left to train on and is an
    error under either policy. No example is ever dropped.

    Args:
      tokenizer: a transformers tokenizer with a chat template.
      examples: the pairs (at least one).
      max_length: the longest row, in tokens.
      padding_side: ``"right"`` (training; transformers' default) or ``"left"`` (the
        side ``generate`` needs).
      pad_to: ``"longest"`` (the longest row) or ``"max_length"`` (every batch one
        shape, so a jitted step compiles once).
      truncation: ``"error"`` or ``"right"``, above.
      packing: join consecutive examples into rows of up to ``max_length`` tokens (an
        example is never split across rows; rows are padded as above). The examples of
        a row attend to the ones before them in the row (the model's mask covers
        padding only); each keeps its prompt masked.
      pad_token_id: the padding id; default the tokenizer's ``pad_token_id``, else its
        ``eos_token_id``. Padding is masked, so the id only needs to be a valid token.

    Returns:
      ``{"input_ids", "attention_mask", "labels"}``: int32 NumPy arrays ``(rows,
      length)``, and ``"num_truncated"``: how many examples ``truncation="right"`` cut.

    Example:
      >>> batch = sft_batch(tok, [("Hi", "Hello!"), ("2+2?", "4")], max_length=64)  # doctest: +SKIP
      >>> batch["input_ids"].shape, batch["labels"][0, :3]  # doctest: +SKIP
      ((2, 23), array([-100, -100, -100], dtype=int32))
    """
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
        raise ValueError(f"sft_batch: max_length must be a positive int, got {max_length!r}")
    choices = {
        "padding_side": (padding_side, ("right", "left")),
        "pad_to": (pad_to, ("longest", "max_length")),
        "truncation": (truncation, ("error", "right")),
    }
    for name, (value, allowed) in choices.items():
        if value not in allowed:
            raise ValueError(f"sft_batch: {name} must be one of {allowed}, got {value!r}")
    if len(examples) == 0:
        raise ValueError("sft_batch: examples is empty")
    pad = _pad_id(tokenizer, pad_token_id)
    encoded, truncated = [], 0
    for index, example in enumerate(examples):
        prompt, response, system = _pair(example, index)
        ids, labels = encode_chat(tokenizer, prompt, response, system=system)
        if len(ids) > max_length:
            if truncation == "error":
                raise ValueError(
                    f"sft_batch: example {index} is {len(ids)} tokens, more than max_length="
                    f"{max_length} (prompt {prompt[:40]!r}); raise max_length or pass "
                    "truncation='right'"
                )
            ids, labels, truncated = ids[:max_length], labels[:max_length], truncated + 1
        if not (labels != IGNORE_INDEX).any():
            raise ValueError(
                f"sft_batch: example {index}'s prompt fills max_length={max_length} tokens, "
                f"leaving no response token to train on (prompt {prompt[:40]!r})"
            )
        encoded.append((ids, labels))
    rows = _rows(encoded, max_length, packing)
    width = max_length if pad_to == "max_length" else max(len(i) for i, _ in rows)
    out = {
        "input_ids": np.full((len(rows), width), pad, np.int32),
        "attention_mask": np.zeros((len(rows), width), np.int32),
        "labels": np.full((len(rows), width), IGNORE_INDEX, np.int32),
    }
    for r, (ids, labels) in enumerate(rows):
        span = slice(0, len(ids)) if padding_side == "right" else slice(width - len(ids), width)
        out["input_ids"][r, span] = ids
        out["attention_mask"][r, span] = 1
        out["labels"][r, span] = labels
    out["num_truncated"] = truncated
    return out
