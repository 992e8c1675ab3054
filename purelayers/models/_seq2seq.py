"""``generate`` for encoder-decoders (T5): the encoder runs once, inside the first
jitted program, which also computes every decoder block's cross-attention keys and
values into the cache and picks the first token after ``decoder_start_token_id``; one
jitted decode step then adds a token at a time to the decoder's fixed-shape
self-attention cache. ``decoding.generate`` checks the options and dispatches here."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["generate_encoder_decoder"]


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _start(model, rule, slots, params, ids, mask, start, key, finished):
    encoded = model.encode(params, ids, attention_mask=mask)
    cache = model.init_cache(params, encoded, slots)
    logits, cache = model.decode(params, start, attention_mask=mask, cache=cache)
    token, finished = rule.next(logits[:, -1], key, 0, finished)
    return token, finished, cache


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(4,))
def _step(model, rule, params, token, cache, mask, key, step, finished):
    logits, cache = model.decode(params, token[:, None], attention_mask=mask, cache=cache)
    token, finished = rule.next(logits[:, -1], key, step, finished)
    return token, finished, cache


def decoder_start_id(model: Any) -> int:
    """The model's ``decoder_start_token_id``: its ``generation_config``'s where set,
    else the config's (transformers' order); a ``ValueError`` where neither has one."""
    generation = getattr(model, "generation_config", None) or {}
    start = generation.get("decoder_start_token_id")
    if start is None:
        start = getattr(model.config, "decoder_start_token_id", None)
    if start is None:
        raise ValueError(
            f"generate: {type(model).__name__} has no decoder_start_token_id (set it in the "
            "config or generation_config; T5 checkpoints use 0, the pad id)"
        )
    return int(start)


def generate_encoder_decoder(
    model: Any,
    params: Any,
    ids: jax.Array,
    mask: jax.Array,
    *,
    max_new_tokens: int,
    rule: Any,
    key: jax.Array | None,
    streamer: Any = None,
) -> np.ndarray:
    """Decoder ids ``(batch, 1 + n)``, ``n <= max_new_tokens``, starting with
    ``decoder_start_token_id``; ``rule`` (``decoding._Rule``) picks each token and
    pads finished rows. ``mask`` marks the encoder's padding, on either side."""
    b = ids.shape[0]
    start = jnp.full((b, 1), decoder_start_id(model), jnp.int32)
    finished = jnp.zeros((b,), bool)
    token, finished, cache = _start(
        model, rule, max_new_tokens, params, ids, mask, start, key, finished
    )
    out = [np.asarray(start)]
    if streamer is not None:
        streamer.put(out[0])
    for step in range(1, max_new_tokens + 1):
        # the next step is queued before this token is read (see decoding.generate)
        ahead = None
        if step < max_new_tokens:
            ahead = _step(model, rule, params, token, cache, mask, key, step, finished)
        out.append(np.asarray(token)[:, None])
        if streamer is not None:
            streamer.put(out[-1][:, 0])
        if ahead is None or (rule.eos and np.asarray(finished).all()):
            break
        token, finished, cache = ahead
    if streamer is not None:
        streamer.end()
    return np.concatenate(out, axis=1)
