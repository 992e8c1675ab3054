"""What the causal LMs share: positions and masks from ``attention_mask`` (padded
batches, the fixed-shape decoding cache, a sliding window), and the ``CausalLM`` base
whose ``apply``/``init_cache`` each model's decoder plugs into."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.layers import Layer, LayerError, dropout
from purelayers.layers._checks import ConfigTypeError, as_array, as_shape, check_int, need_key
from purelayers.models.config import Frozen, _frozen

__all__ = ["CausalLM", "decoder_inputs", "drop", "positions_and_mask"]


def drop(x: jax.Array, p: float, key: jax.Array | None, train: bool) -> jax.Array:
    """Dropout in train mode (``key`` required there), the identity otherwise."""
    if not train or p == 0.0:
        return x
    need_key("dropout", key)
    return dropout(x, p, key)


def decoder_inputs(
    layer: str,
    input_ids: Any,
    attention_mask: Any,
    position_ids: Any,
    cache: Any,
    window: int | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """A decoder's ``(ids, positions, mask)``: ``input_ids`` checked to be ``(batch,
    seq)``, and ``positions_and_mask`` at the cache's length (a ``Repeat``'s stacked
    cache: every block's length is the same)."""
    ids = as_array(input_ids)
    if ids.ndim != 2:
        raise LayerError(layer, "input_ids must be (batch, seq);", 2, ids.ndim)
    if cache is None:
        offset, slots = jnp.zeros((), jnp.int32), ids.shape[1]
    elif "0" in cache:  # per-block caches (Repeat.unstack_cache)
        offset, slots = cache["0"]["length"], cache["0"]["keys"].shape[1]
    else:
        offset, slots = cache["length"][0], cache["keys"].shape[2]
    positions, mask = positions_and_mask(
        layer, ids, attention_mask, position_ids, offset, slots, window
    )
    return ids, positions, mask


def positions_and_mask(
    layer: str,
    ids: jax.Array,
    attention_mask: Any,
    position_ids: Any,
    offset: jax.Array,
    slots: int,
    window: int | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """Per-row positions ``(batch, t)`` and a boolean key mask ``(batch, 1, t, slots)``
    (``None`` when nothing is masked beyond causality).

    ``attention_mask`` (1 = token, 0 = padding) covers the keys: ``(batch, t)`` without a
    cache, ``(batch, max_len)`` over the cache's slots with one. Positions default to
    the mask's running count, ``cumsum(mask) - 1`` (0 at padding), as transformers'
    ``generate`` computes them, so a left-padded row sees the positions it would alone;
    without a mask, ``offset + arange(t)``. ``window`` (Mistral's ``sliding_window``)
    hides keys ``window`` or more slots before the query's.
    """
    b, t = ids.shape
    query_slots = offset + jnp.arange(t)
    mask = None
    if attention_mask is not None:
        m = jnp.asarray(attention_mask)
        if m.shape != (b, slots):
            raise LayerError(
                layer,
                "attention_mask must be (batch, keys): (batch, seq) without a cache, "
                "(batch, max_len) with one;",
                (b, slots),
                tuple(m.shape),
            )
        keep = m.astype(bool)
        mask = keep[:, None, None, :]
        if position_ids is None:
            count = jnp.cumsum(keep.astype(jnp.int32), axis=1) - 1
            count = jax.lax.dynamic_slice_in_dim(count, offset, t, axis=1)
            here = jax.lax.dynamic_slice_in_dim(keep, offset, t, axis=1)
            position_ids = jnp.where(here, count, 0)
    if position_ids is None:
        position_ids = jnp.broadcast_to(query_slots, (b, t))
    position_ids = jnp.asarray(position_ids)
    if position_ids.shape not in ((b, t), (t,)):
        raise LayerError(layer, "position_ids shape", (b, t), tuple(position_ids.shape))
    if window is not None:
        near = query_slots[:, None] - jnp.arange(slots)[None, :] < window
        mask = near[None, None] if mask is None else mask & near[None, None]
    return jnp.broadcast_to(position_ids, (b, t)), mask


@dataclasses.dataclass(frozen=True)
class CausalLM(Layer):
    """Base of the causal LMs: ``config``, a decoder under ``backbone``, a ``lm_head``
    (tied to the embedding when ``config.tie_word_embeddings``).

    ``apply(params, input_ids, *, attention_mask=None, position_ids=None, cache=None,
    key=None, train=False)`` returns logits ``(batch, seq, vocab)``, and
    ``(logits, cache)`` with a cache from ``init_cache((batch, max_len))``.

    ``generation_config`` (keyword only): a ``generation_config.json``'s contents
    (``{"eos_token_id": [..], "pad_token_id": .., "temperature": ..}``), transformers'
    ``model.generation_config``: where given, its ``eos_token_id`` and
    ``pad_token_id`` are what ``generate`` stops and pads with, in place of the
    config's (an id it lacks is unset, as in transformers); ``from_pretrained`` reads it
    from the folder and ``save_pretrained`` writes it back as it was. The config itself
    stays ``config.json``'s: its ``pad_token_id`` is the Llama family's embedding padding
    row, as transformers builds it.
    """

    config: Any
    generation_config: Mapping[str, Any] | None = dataclasses.field(default=None, kw_only=True)
    config_class: ClassVar[type] = type(None)
    base_model_prefix: ClassVar[str] = ""
    embedding_name: ClassVar[str] = ""  # the lm_head's tied original, under backbone
    output_embeddings: ClassVar[str] = "lm_head"  # transformers' get_output_embeddings()
    ignore_on_load: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        if not isinstance(self.config, self.config_class):
            raise ConfigTypeError(
                f"{type(self).__name__}: config must be a {self.config_class.__name__}, "
                f"got {type(self.config).__name__}"
            )
        ids = self.generation_config
        if ids is not None and not isinstance(ids, Frozen):
            if not isinstance(ids, Mapping):
                raise ConfigTypeError(
                    f"{type(self).__name__}: generation_config must be a dict (a "
                    "generation_config.json's contents), "
                    f"got {type(ids).__name__}"
                )
            object.__setattr__(self, "generation_config", _frozen(dict(ids)))
        object.__setattr__(self, "_parts", self.build())

    def build(self) -> dict[str, Layer]:
        """``{backbone name: decoder, "lm_head": Linear}`` from the config."""
        raise NotImplementedError(f"{type(self).__name__}: a subclass defines build()")

    @property
    def tied(self) -> bool:
        return bool(self.config.tie_word_embeddings)

    def children(self) -> dict[str, Layer]:
        return dict(self._parts)

    def aliases(self) -> dict[str, str]:
        out = super().aliases()
        if self.tied:
            out["lm_head.weight"] = f"{self.base_model_prefix}.{self.embedding_name}"
        return out

    def example_shape(self) -> tuple[int, ...]:
        return (1, 1)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        backbone = self._parts[self.base_model_prefix]
        params = {self.base_model_prefix: backbone.init(jax.random.fold_in(key, 0), shape, dtype)}
        if not self.tied:
            hidden = (*as_shape(shape)[:2], self.hidden_size)
            params["lm_head"] = self._parts["lm_head"].init(
                jax.random.fold_in(key, 1), hidden, dtype
            )
        return params

    @property
    def hidden_size(self) -> int:
        raise NotImplementedError(f"{type(self).__name__}: a subclass defines hidden_size")

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> Any:
        """An empty decoding cache for ``shape = (batch, max_len)``."""
        return self._parts[self.base_model_prefix].init_cache(shape, dtype)

    def apply(
        self,
        params: dict[str, Any],
        input_ids: Any,
        *,
        attention_mask: Any = None,
        position_ids: Any = None,
        cache: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
        logits_to_keep: int = 0,
    ):
        """Logits ``(batch, seq, vocab)`` for ``input_ids`` ``(batch, seq)`` (with a
        ``cache``: ``(logits, cache)``). ``logits_to_keep``, as transformers': ``0``
        keeps every position, ``n > 0`` only the last ``n`` (the head's product runs on
        those alone: a prompt's prefill needs only its last position)."""
        check_int(type(self).__name__, "logits_to_keep", logits_to_keep, minimum=0)
        out = self.call(
            self.base_model_prefix,
            params,
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            key=key,
            train=train,
        )
        h, new_cache = out if cache is not None else (out, None)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        if self.tied:
            weight = params[self.base_model_prefix]
            for part in self.embedding_name.split("."):
                weight = weight[part]
            # the head given the embedding as its weight, through ``call`` like an untied
            # one (so ``capture`` reports it and errors name it). ``Linear`` multiplies on
            # the CPU as one [B * T, E] matrix: with the leading axes contracted apart,
            # XLA:CPU copies the [B, T, V] logits' gradient transposed for the weight's
            head = params.get("lm_head", {}) if isinstance(params, dict) else {}
            params = {"lm_head": {**head, "weight": weight}}
        # the head's own key, apart from every key the base model derives from ``key``
        # (a LoRA adapter's dropout on the head draws from it)
        head_key = None if key is None else jax.random.split(key)[1]
        logits = self.call("lm_head", params, h, key=head_key, train=train)
        return logits if cache is None else (logits, new_cache)
