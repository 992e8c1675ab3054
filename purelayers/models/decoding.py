"""``generate``: decoding for the causal LMs as transformers' ``generate`` does it, and
for the encoder-decoders through ``_seq2seq``.

One jitted prefill writes the prompt into a fixed-shape KV cache of ``prompt +
max_new_tokens`` slots and picks the first token; one jitted decode step then adds a
token at a time, the model's forward, the sampling rule and the eos bookkeeping in one
program. Both are compiled once per (model, sampling rule, batch, prompt length, cache
length) and reused across calls and steps (``jax.jit`` with the model and the rule as
static arguments). The host queues each step before it reads the previous step's token,
so reading tokens (and a streamer) costs the device no time.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.layers import Repeat
from purelayers.layers._checks import as_array
from purelayers.models._seq2seq import generate_encoder_decoder

__all__ = ["generate", "sample_logits"]


def sample_logits(
    logits: jax.Array,
    key: jax.Array | None,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> jax.Array:
    """Next tokens ``(batch,)`` from last-position logits ``(batch, vocab)``.

    Greedy (``argmax``) unless ``do_sample``; sampling divides by ``temperature``, keeps
    the ``top_k`` largest logits, then the smallest set of tokens whose probability
    reaches ``top_p`` (at least one), and draws from what is left with ``key``: the
    order and rules of transformers' temperature, top-k and top-p warpers.
    """
    logits = logits.astype(jnp.float32)
    if not do_sample:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / temperature
    neg = jnp.finfo(jnp.float32).min
    if top_k is not None and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, neg, logits)
    if top_p is not None and top_p < 1.0:
        order = jnp.argsort(logits, axis=-1)  # ascending
        ascending = jnp.take_along_axis(logits, order, axis=-1)
        cumulative = jnp.cumsum(jax.nn.softmax(ascending, axis=-1), axis=-1)
        drop = cumulative <= 1 - top_p
        drop = drop.at[..., -1].set(False)  # the most likely token always stays
        removed = jnp.zeros_like(drop).at[jnp.arange(drop.shape[0])[:, None], order].set(drop)
        logits = jnp.where(removed, neg, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class _Rule:
    """How a step picks its tokens: ``sample_logits``' options, then eos and pad."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    eos: tuple[int, ...] = ()
    pad: int | None = None
    suppress: tuple[int, ...] = ()
    begin_suppress: tuple[int, ...] = ()

    def next(self, logits, key, step, finished):
        """Step ``step``'s tokens ``(batch,)`` (drawn with ``fold_in(key, step)``), pad
        where a row had finished, and the rows finished after them. ``suppress`` ids
        are never picked, ``begin_suppress`` ids not at step 0 (transformers'
        ``SuppressTokens`` and ``SuppressTokensAtBegin`` processors)."""
        if self.suppress or self.begin_suppress:
            vocab = jnp.arange(logits.shape[-1])
            off = jnp.isin(vocab, jnp.asarray(self.suppress or (-1,)))
            if self.begin_suppress:
                off = off | (jnp.isin(vocab, jnp.asarray(self.begin_suppress)) & (step == 0))
            logits = jnp.where(off, -jnp.inf, logits)
        k = None if key is None else jax.random.fold_in(key, step)
        token = sample_logits(
            logits,
            k,
            do_sample=self.do_sample,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
        )
        if self.eos:
            token = jnp.where(finished, jnp.int32(self.pad), token)
            finished = finished | jnp.isin(token, jnp.asarray(self.eos, jnp.int32))
        return token, finished


# The prefill and the decode step each end with the next token, so a step is one program
# and the token stays on the device; the host only reads what it reports.
@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(5,))
def _prefill(model, rule, params, ids, slot_mask, cache, key, finished):
    logits, cache = model.apply(
        params, ids, attention_mask=slot_mask, cache=cache, logits_to_keep=1
    )
    token, finished = rule.next(logits[:, -1], key, 0, finished)
    return token, finished, cache


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(5,))
def _decode(model, rule, params, token, slot_mask, cache, key, step, finished):
    logits, cache = model.apply(params, token[:, None], attention_mask=slot_mask, cache=cache)
    token, finished = rule.next(logits[:, -1], key, step, finished)
    return token, finished, cache


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(5,))
def _refill(model, rule, params, seq, slot_mask, cache, key, step, finished):
    """Step ``step`` recomputed over the whole sequence so far into an empty cache."""
    logits, cache = model.apply(
        params, seq, attention_mask=slot_mask, cache=cache, logits_to_keep=1
    )
    token, finished = rule.next(logits[:, -1], key, step, finished)
    return token, finished, cache


def _unstacked(layer: Any, params: Any) -> Any:
    """``params`` with every ``Repeat``'s stacked blocks as per-block copies."""
    if isinstance(layer, Repeat):
        return layer.unstack(params)
    if not isinstance(params, dict):
        return params
    kids = layer.children()
    return {k: _unstacked(kids[k], v) if k in kids else v for k, v in params.items()}


def _unstacked_cache(model: Any, cache: Any) -> Any:
    """The decoder's stacked cache as per-block caches (its one ``Repeat`` of blocks)."""
    backbone = model.children()[model.base_model_prefix]
    stacks = [c for c in backbone.children().values() if isinstance(c, Repeat)]
    return stacks[0].unstack_cache(cache) if len(stacks) == 1 else cache


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in np.ravel(np.asarray(value))]  # an int, a list or an array


def _default_ids(model: Any) -> dict[str, Any]:
    """The eos and pad ids ``generate`` uses unless given, and the suppressed ids: the
    model's ``generation_config``'s where it has one (an id it lacks is unset), else the
    config's, as transformers' ``model.generation_config``."""
    generation = getattr(model, "generation_config", None)
    names = ("eos_token_id", "pad_token_id", "suppress_tokens", "begin_suppress_tokens")
    if generation is not None:
        return {k: generation.get(k) for k in names}
    return {k: getattr(model.config, k, None) for k in names}


class _FromModel:
    """The default of ``generate``'s ``eos_token_id``/``pad_token_id``: the model's. An
    explicit ``None`` means none, as a keyword given to transformers' ``generate``."""

    def __repr__(self) -> str:
        return "<the model's>"


_FROM_MODEL: Any = _FromModel()


def _sampling(temperature: Any, top_k: Any, top_p: Any) -> tuple[float, int | None, float | None]:
    """``do_sample``'s settings checked, as transformers' warpers take them: ``None``
    is the default (temperature 1, every token, no nucleus); ``top_k=0`` keeps every
    token."""
    temperature = 1.0 if temperature is None else temperature
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.number)):
        raise ValueError(f"generate: temperature must be a number > 0, got {temperature!r}")
    if not temperature > 0:  # NaN too
        raise ValueError(f"generate: temperature must be > 0, got {temperature}")
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0
    ):
        raise ValueError(f"generate: top_k must be an int >= 0 (0: off) or None, got {top_k!r}")
    if top_p is not None and (
        isinstance(top_p, bool)
        or not isinstance(top_p, (int, float, np.number))
        or not 0.0 < top_p <= 1.0
    ):
        raise ValueError(f"generate: top_p must be in (0, 1], got {top_p!r}")
    return float(temperature), int(top_k) if top_k else None, top_p


def generate(
    model: Any,
    params: Any,
    input_ids: Any,
    *,
    max_new_tokens: int,
    attention_mask: Any = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = 50,
    top_p: float | None = None,
    key: jax.Array | None = None,
    eos_token_id: int | Sequence[int] | None = _FROM_MODEL,
    pad_token_id: int | None = _FROM_MODEL,
    streamer: Any = None,
    unroll_blocks: bool = True,
    **options: Any,
) -> jax.Array:
    """Continue ``input_ids`` ``(batch, prompt)`` by up to ``max_new_tokens`` tokens.

    Returns ``(batch, prompt + n)`` ids, ``n <= max_new_tokens``: greedy by default,
    sampled with ``do_sample=True`` (``temperature``, ``top_k``, ``top_p``, with
    transformers' defaults: 1.0, the 50 likeliest tokens, no nucleus; ``top_k=0`` or
    ``None`` keeps every token; ``temperature=None`` is 1.0; ``key`` is required, and
    step ``i`` draws with ``fold_in(key, i)``); greedy decoding ignores those three, as
    transformers' does. ``attention_mask`` (1 = token, 0 = padding) marks a
    left-padded batch: each row gets the positions and the tokens it would get alone. A
    row that emits ``eos_token_id`` (default: the model's ``generation_config``'s where
    it has one, else the config's; an int or a list; ``None`` or ``[]``: none) is
    finished: its later tokens are ``pad_token_id`` (default: likewise; ``None``: the
    first eos id), and decoding stops once every row has finished, so the result may be
    shorter, as transformers' ``generate`` (where a keyword given as ``None`` also
    overrides the model's). Prompt ids must lie in ``[0, vocab_size)``, padding
    included (``ValueError``).

    ``unroll_blocks``: the decode step runs a ``Repeat``'s blocks from per-block copies
    of their weights (``Repeat.unstack``, made once per call), about twice as fast as
    scanning the stacked weights (GPT-2-small at batch 1), for memory holding the
    blocks' weights twice while generating; ``False`` decodes from the stacked weights.

    Prompts must be padded on the left: an ``attention_mask`` row with a 0 after a 1 (a
    right-padded prompt) is a ``ValueError``. A LoRA-wrapped model (``lora.wrap``) runs
    as it is, un-merged: each targeted layer adds its adapter's product at every step;
    ``lora.merge`` first folds the adapters into the weights, for the base model's speed.

    A model with a ``recompute_cache_at`` length (Phi-3 with LongRoPE) has the whole
    sequence run again into an empty cache at the step that reaches it, as its
    transformers counterpart does.

    ``streamer`` (transformers' protocol): ``streamer.put(ids)`` gets the prompt, then
    each step's ``(batch,)`` tokens as they come; ``streamer.end()`` is called last.

    Encoder-decoders (``T5ForConditionalGeneration``, ``WhisperForConditionalGeneration``):
    ``input_ids`` is the encoder's input (Whisper's: its ``input_features``), padded on
    either side (``attention_mask``; Whisper takes none); the encoder runs once, the
    cross-attention keys and values are computed once, and the result is the decoder's
    ids ``(batch, n + k)``: the decoder prompt ``decoder_input_ids`` ``(batch, n)``
    (default: ``decoder_start_token_id``, the model's ``generation_config``'s, else its
    config's; Whisper needs one) and ``k`` new tokens, greedy tokens equal to
    transformers'. The model's ``suppress_tokens`` are never generated and its
    ``begin_suppress_tokens`` not as the first new token (``generation_config``'s, else
    the config's, as transformers' logits processors).

    Other transformers options (``num_beams`` above 1, ``forced_decoder_ids``,
    ``return_timestamps``, ``language``, ``task``, ...) are not implemented: any other
    keyword is a ``ValueError`` naming it.
    """
    seq2seq = bool(getattr(model, "is_encoder_decoder", False))
    decoder_input_ids = options.pop("decoder_input_ids", None) if seq2seq else None
    if options.get("num_beams", 1) == 1:  # transformers' default, one beam: greedy
        options.pop("num_beams", None)
    if options:
        raise ValueError(
            f"generate: options not supported: {', '.join(sorted(options))} (generate "
            "decodes greedily or samples with temperature, top_k and top_p; no beams, "
            "forced tokens, timestamps or language detection)"
        )
    features = getattr(model, "main_input_name", "input_ids") == "input_features"
    host = np.asarray(input_ids)
    if host.ndim != 2 and not features:
        raise ValueError(f"generate: input_ids must be (batch, prompt), got shape {host.shape}")
    if features and attention_mask is not None:
        raise ValueError(f"generate: {type(model).__name__} takes no attention_mask")
    ids = jnp.asarray(host, host.dtype if features else jnp.int32)
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, (int, np.integer))
        or max_new_tokens < 1
    ):
        raise ValueError(f"generate: max_new_tokens must be a positive int, got {max_new_tokens!r}")
    max_new_tokens = int(max_new_tokens)
    if do_sample and key is None:
        raise ValueError("generate: do_sample=True needs key= (a jax.random key)")
    sampling = _sampling(temperature, top_k, top_p) if do_sample else (1.0, None, None)
    if not callable(getattr(model, "init_cache", None)):
        raise ValueError(
            f"generate: model must be a causal LM (GPT-2, Llama, Mistral, Qwen2: a model "
            f"with init_cache), got {type(model).__name__}"
        )
    config = model.config
    vocab = getattr(config, "vocab_size", None)
    if not features and host.size and vocab is not None and (host.min() < 0 or host.max() >= vocab):
        bad = host.min() if host.min() < 0 else host.max()
        raise ValueError(
            f"generate: input_ids must be token ids in [0, vocab_size={vocab}), got {int(bad)} "
            "(padding positions too are looked up: pad them with a real id)"
        )
    defaults = _default_ids(model)
    eos = _ids(defaults["eos_token_id"] if eos_token_id is _FROM_MODEL else eos_token_id)
    pad = defaults["pad_token_id"] if pad_token_id is _FROM_MODEL else pad_token_id
    if pad is None and eos:
        pad = eos[0]
    suppress = (tuple(_ids(defaults[k])) for k in ("suppress_tokens", "begin_suppress_tokens"))
    rule = _Rule(do_sample, *sampling, tuple(eos), pad if eos else None, *suppress)
    if features:  # the model checks the features' shape
        return as_array(
            generate_encoder_decoder(
                model, params, ids, None, max_new_tokens=max_new_tokens, rule=rule, key=key,
                prompt=decoder_input_ids, streamer=streamer,
            )
        )  # fmt: skip
    b, prompt = ids.shape
    max_len = prompt + max_new_tokens
    mask = (
        jnp.ones((b, prompt), jnp.int32) if attention_mask is None else jnp.asarray(attention_mask)
    )
    if mask.shape != ids.shape:
        raise ValueError(
            f"generate: attention_mask must be shaped like input_ids {ids.shape}, got {mask.shape}"
        )
    if seq2seq:  # the encoder's input may be padded on either side
        return as_array(
            generate_encoder_decoder(
                model, params, ids, mask, max_new_tokens=max_new_tokens, rule=rule, key=key,
                prompt=decoder_input_ids, streamer=streamer,
            )
        )  # fmt: skip
    host_mask = np.asarray(mask) != 0
    after_token = np.logical_and.accumulate(~host_mask, axis=1) == 0  # from a row's first 1 on
    gaps = np.nonzero((after_token & ~host_mask).any(axis=1))[0]
    if gaps.size:
        raise ValueError(
            f"generate: attention_mask has a 0 after a 1 in row {int(gaps[0])} (a right-padded "
            "prompt, whose new tokens would follow the padding): pad prompts on the left "
            "(tokenizer.padding_side = 'left', or sft_batch(..., padding_side='left'))"
        )
    slot_mask = jnp.concatenate(
        [mask.astype(jnp.int32), jnp.ones((b, max_new_tokens), jnp.int32)], 1
    )
    dtype = jax.tree.leaves(params)[0].dtype
    cache_dtype = dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32
    cache = model.init_cache((b, max_len), cache_dtype)
    finished = jnp.zeros((b,), bool)
    token, finished, cache = _prefill(model, rule, params, ids, slot_mask, cache, key, finished)
    decode_params = params
    unrolled = unroll_blocks and max_new_tokens > 1
    if unrolled:
        decode_params = _unstacked(model, params)
        cache = _unstacked_cache(model, cache)
    # a sequence length at which the model's transformers counterpart drops its cache and
    # runs the whole sequence again (Phi-3's LongRoPE switching to its long factors)
    refill = getattr(model, "recompute_cache_at", None)
    fed = [ids]  # the ids given to the model so far, on the device
    out = [np.asarray(ids)]
    if streamer is not None:
        streamer.put(out[0])
    for step in range(1, max_new_tokens + 1):
        # Step ``step`` is queued before step ``step - 1``'s token is read, so the device
        # never waits for the host; a step queued after every row finished is dropped.
        ahead = None
        fed.append(token[:, None])
        if step < max_new_tokens and refill is not None and prompt < refill == prompt + step:
            empty = model.init_cache((b, max_len), cache_dtype)
            empty = _unstacked_cache(model, empty) if unrolled else empty
            seq = jnp.concatenate(fed, axis=1)
            ahead = _refill(model, rule, decode_params, seq, slot_mask, empty, key, step, finished)
        elif step < max_new_tokens:
            ahead = _decode(
                model, rule, decode_params, token, slot_mask, cache, key, step, finished
            )
        out.append(np.asarray(token)[:, None])
        if streamer is not None:
            streamer.put(out[-1][:, 0])
        if ahead is None or (eos and np.asarray(finished).all()):
            break
        token, finished, cache = ahead
    if streamer is not None:
        streamer.end()
    return as_array(np.concatenate(out, axis=1))
