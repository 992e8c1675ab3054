"""``generate`` for encoder-decoders (T5, Whisper): the encoder runs once, inside the
first jitted program, which also computes every decoder block's cross-attention keys and
values into the cache, runs the decoder prompt (``decoder_start_token_id``, or the ids
given) and picks the first new token; one jitted decode step then adds a token at a time
to the decoder's fixed-shape self-attention cache. ``decoding.generate`` checks the
options and dispatches here."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["decoder_prompt", "generate_encoder_decoder"]


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


def decoder_prompt(model: Any, prompt: Any, batch: int) -> jax.Array:
    """The decoder's prompt ``(batch, n)``: ``prompt`` (``generate``'s
    ``decoder_input_ids``) checked, else one ``decoder_start_token_id`` per row; a
    model with ``requires_decoder_prompt`` (Whisper, whose start tokens name the
    language and the task) must be given one."""
    who = type(model).__name__
    if prompt is None:
        if getattr(model, "requires_decoder_prompt", False):
            raise ValueError(
                f"generate: {who} needs decoder_input_ids= (the decoder prompt, e.g. the ids "
                "of <|startoftranscript|><|en|><|transcribe|><|notimestamps|>): language "
                "detection and forced_decoder_ids are not implemented"
            )
        return jnp.full((batch, 1), decoder_start_id(model), jnp.int32)
    host = np.asarray(prompt)
    if host.ndim != 2 or host.shape[0] != batch or host.shape[1] < 1:
        raise ValueError(
            f"generate: decoder_input_ids must be ({batch}, n >= 1), one prompt row per "
            f"input, got shape {host.shape}"
        )
    vocab = getattr(model.config, "vocab_size", None)
    if not np.issubdtype(host.dtype, np.integer) or (
        vocab is not None and (host.min() < 0 or host.max() >= vocab)
    ):
        raise ValueError(
            f"generate: decoder_input_ids must be token ids in [0, vocab_size={vocab}), got "
            f"{host.dtype} values in [{host.min()}, {host.max()}]"
        )
    return jnp.asarray(host, jnp.int32)


def generate_encoder_decoder(
    model: Any,
    params: Any,
    ids: jax.Array,
    mask: jax.Array | None,
    *,
    max_new_tokens: int,
    rule: Any,
    key: jax.Array | None,
    prompt: Any = None,
    streamer: Any = None,
) -> np.ndarray:
    """Decoder ids ``(batch, n + k)``, ``k <= max_new_tokens``: the prompt ``(batch,
    n)`` (``decoder_prompt``: ``decoder_start_token_id`` by default) and the new
    tokens; ``rule`` (``decoding._Rule``) picks each token and pads finished rows.
    ``mask`` marks the encoder's padding, on either side (``None``: a model whose
    encoder takes none)."""
    b = ids.shape[0]
    start = decoder_prompt(model, prompt, b)
    finished = jnp.zeros((b,), bool)
    slots = start.shape[1] - 1 + max_new_tokens
    token, finished, cache = _start(model, rule, slots, params, ids, mask, start, key, finished)
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
