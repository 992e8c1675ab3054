"""Whisper's layers (``purelayers.models.whisper``): the attention, the pre-norm encoder
and decoder layers, the convolutional encoder and the decoder, under transformers'
names."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from purelayers.layers import GELU, AttentionCore, Layer, Params
from purelayers.layers._checks import as_shape
from purelayers.models._causal import drop
from purelayers.models._parts import fold, init_children

__all__ = [
    "WhisperAttention",
    "WhisperDecoder",
    "WhisperDecoderLayer",
    "WhisperEncoder",
    "WhisperEncoderLayer",
    "sinusoids",
]


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> jax.Array:
    r"""transformers' ``sinusoids``: ``[sin(t w_i), cos(t w_i)]`` for ``t < length`` and
    ``w_i = max_timescale ** (-i / (channels / 2 - 1))``, ``i < channels / 2``.

    Shape:
      ``(length, channels)``, float32.
    """
    step = math.log(max_timescale) / (channels // 2 - 1)
    inv = jnp.exp(-step * jnp.arange(channels // 2, dtype=jnp.float32))
    t = jnp.arange(length, dtype=jnp.float32)[:, None] * inv[None, :]
    return jnp.concatenate([jnp.sin(t), jnp.cos(t)], axis=1)


@dataclasses.dataclass(frozen=True)
class WhisperAttention(Layer):
    r"""transformers' ``WhisperAttention``: ``out_proj(softmax((q_proj(x) s) k^T + mask)
    v)``, ``s = head_dim ** -0.5``, the projections in its order ``k_proj`` (no bias),
    ``v_proj``, ``q_proj``, ``out_proj``.

    ``apply(params, x, kv=None, *, mask=None, cache=None)``: self-attention over ``x``
    (causal where ``core`` is), or cross-attention over ``kv``; ``mask`` boolean,
    broadcastable to ``(batch, heads, q_len, k_len)``. With ``cache``: a self-attention
    cache (``core.init_cache``) is written and attended; a cross-attention cache
    ``{"keys", "values"}`` (``cross_cache``) holds ``k_proj(kv)``, ``v_proj(kv)``
    computed once; ``(y, cache)`` is returned.

    Shape:
      ``x`` ``(batch, seq, d_model)``, ``kv`` ``(batch, source, d_model)``; output like
      ``x``.
    """

    k_proj: Layer
    v_proj: Layer
    q_proj: Layer
    out_proj: Layer
    core: AttentionCore
    head_dim: int = 64

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        x = as_shape(shape)
        names = ("k_proj", "v_proj", "q_proj", "out_proj")
        return init_children(self, key, dict.fromkeys(names, x), dtype)

    def cross_cache(self, params: Params, kv: Any) -> dict[str, jax.Array]:
        """``{"keys": k_proj(kv), "values": v_proj(kv)}``, computed once for every
        decoding step."""
        return {"keys": self.call("k_proj", params, kv), "values": self.call("v_proj", params, kv)}

    def apply(self, params, x, kv=None, *, mask=None, cache=None, key=None, train=False):
        q = self.call("q_proj", params, x) * self.head_dim**-0.5
        if cache is not None and "length" not in cache:  # cross-attention, k and v cached
            k, v = cache["keys"], cache["values"]
        else:
            source = x if kv is None else kv
            k, v = self.call("k_proj", params, source), self.call("v_proj", params, source)
        own = cache if cache is not None and "length" in cache else None
        out = self.core.attend(
            q, k, v, mask=mask, cache=own, key=key, train=train, layer="WhisperAttention"
        )
        out, own = out if own is not None else (out, None)
        y = self.call("out_proj", params, out)
        if cache is None:
            return y
        return y, (cache if own is None else own)


class _Block:
    """The pre-norm block of both stacks::

    x = x + self_attn(self_attn_layer_norm(x))
    x = x + encoder_attn(encoder_attn_layer_norm(x), encoder_hidden_states)   (decoder)
    x = x + fc2(act(fc1(final_layer_norm(x))))
    """

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        x = as_shape(shape)
        names = list(self.children())
        params = init_children(self, key, {n: x for n in names if n not in ("act", "fc2")}, dtype)
        hidden = (*x[:-1], jnp.shape(params["fc1"]["weight"])[0])
        params["fc2"] = self.init_child("fc2", jax.random.fold_in(key, names.index("fc2")), hidden)
        return {n: params[n] for n in names if n in params}

    def _attend(self, name, params, x, kv, mask, cache, key, train):
        h = self.call(f"{name}_layer_norm", params, x)
        out = self.call(name, params, h, kv, mask=mask, cache=cache, key=fold(key, 0), train=train)
        out, cache = out if cache is not None else (out, None)
        return x + drop(out, self.dropout, fold(key, 1), train), cache

    def _feed_forward(self, params, x, key, train):
        h = self.act.apply({}, self.call("fc1", params, self.call("final_layer_norm", params, x)))
        h = drop(h, self.activation_dropout, fold(key, 0), train)
        h = self.call("fc2", params, h)
        return x + drop(h, self.dropout, fold(key, 1), train)


@dataclasses.dataclass(frozen=True)
class WhisperEncoderLayer(_Block, Layer):
    """transformers' ``WhisperEncoderLayer`` (see ``_Block``), ``apply(params, x)``."""

    self_attn: Layer
    self_attn_layer_norm: Layer
    fc1: Layer
    fc2: Layer
    final_layer_norm: Layer
    act: Layer = GELU()
    dropout: float = 0.0
    activation_dropout: float = 0.0

    def apply(self, params, x, *, key=None, train=False):
        h, _ = self._attend("self_attn", params, x, None, None, None, fold(key, 0), train)
        return self._feed_forward(params, h, fold(key, 1), train)


@dataclasses.dataclass(frozen=True)
class WhisperDecoderLayer(_Block, Layer):
    """transformers' ``WhisperDecoderLayer`` (see ``_Block``): ``apply(params, x, *,
    encoder_hidden_states, mask=None, cache=None)``, ``cache`` ``{"self", "cross"}``."""

    self_attn: Layer
    self_attn_layer_norm: Layer
    encoder_attn: Layer
    encoder_attn_layer_norm: Layer
    fc1: Layer
    fc2: Layer
    final_layer_norm: Layer
    act: Layer = GELU()
    dropout: float = 0.0
    activation_dropout: float = 0.0

    def apply(
        self, params, x, *, encoder_hidden_states=None, mask=None, cache=None, key=None, train=False
    ):
        own, cross = (None, None) if cache is None else (cache["self"], cache["cross"])
        h, own = self._attend("self_attn", params, x, None, mask, own, fold(key, 0), train)
        h, cross = self._attend(
            "encoder_attn", params, h, encoder_hidden_states, None, cross, fold(key, 1), train
        )
        h = self._feed_forward(params, h, fold(key, 2), train)
        return h if cache is None else (h, {"self": own, "cross": cross})


@dataclasses.dataclass(frozen=True)
class WhisperEncoder(Layer):
    r"""transformers' ``WhisperEncoder``::

        h = gelu(conv2(gelu(conv1(input_features)))).transpose(0, 2, 1) + embed_positions
        y = layer_norm(layers(dropout(h)))

    ``conv1`` (kernel 3, padding 1) and ``conv2`` (kernel 3, stride 2, padding 1) halve
    ``2 * max_source_positions`` frames to ``max_source_positions``; the positions are
    the sinusoids (``init``) held as ``embed_positions.weight`` and not trained.

    Shape:
      ``input_features`` ``(batch, num_mel_bins, 2 * max_source_positions)``; output
      ``(batch, max_source_positions, d_model)``.
    """

    conv1: Layer
    conv2: Layer
    embed_positions: Layer
    layers: tuple[Layer, ...]
    layer_norm: Layer
    dropout: float = 0.0

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        b, mel, frames = as_shape(shape)
        n = frames // 2
        e = self.embed_positions.embedding_dim
        h = (b, n, e)
        params = init_children(
            self, key, {"conv1": (b, mel, frames), "conv2": (b, e, frames), "layer_norm": h}, dtype
        )
        params["embed_positions"] = {"weight": sinusoids(n, e).astype(dtype)}
        params["layers"] = {
            str(i): self.init_child(f"layers.{i}", jax.random.fold_in(key, 10 + i), h, dtype)
            for i in range(len(self.layers))
        }
        return {k: params[k] for k in self.children()}

    def apply(self, params, input_features, *, key=None, train=False):
        gelu = GELU()
        h = gelu.apply({}, self.call("conv1", params, input_features))
        h = gelu.apply({}, self.call("conv2", params, h))
        h = jnp.swapaxes(h, 1, 2)
        positions = self.call("embed_positions", params, jnp.arange(h.shape[1]))
        h = drop(h + jax.lax.stop_gradient(positions)[None], self.dropout, fold(key, 0), train)
        for i in range(len(self.layers)):
            h = self.call(f"layers.{i}", params, h, key=fold(key, i + 1), train=train)
        return self.call("layer_norm", params, h)


@dataclasses.dataclass(frozen=True)
class WhisperDecoder(Layer):
    r"""transformers' ``WhisperDecoder``::

        h = embed_tokens(ids) + embed_positions(offset + arange(seq))
        y = layer_norm(layers(dropout(h), encoder_hidden_states))

    ``apply(params, ids, *, encoder_hidden_states, attention_mask=None, cache=None)``:
    causal self-attention (``attention_mask`` ``(batch, seq)``, with a cache ``(batch,
    max_len)``, 1 for a token, 0 for padding) and cross-attention to every encoder
    position; with ``cache`` (``init_cache``) the positions start at its length and
    ``(h, cache)`` is returned.

    Shape:
      ``ids`` ``(batch, seq)``, ``seq`` (plus the cache's length) at most
      ``max_target_positions``; output ``(batch, seq, d_model)``.
    """

    embed_tokens: Layer
    embed_positions: Layer
    layers: tuple[Layer, ...]
    layer_norm: Layer
    dropout: float = 0.0

    @property
    def takes_ids(self) -> bool:
        return True

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        ids = as_shape(shape)
        h = (*ids, self.embed_positions.embedding_dim)
        shapes = {"embed_tokens": ids, "embed_positions": ids, "layer_norm": h}
        params = init_children(self, key, shapes, dtype)
        params["layers"] = {
            str(i): self.init_child(f"layers.{i}", jax.random.fold_in(key, 10 + i), h, dtype)
            for i in range(len(self.layers))
        }
        return {k: params[k] for k in self.children()}

    def init_cache(self, params: Params, encoder_hidden_states: Any, max_len: int, dtype: Any):
        """Per layer an empty self-attention cache of ``max_len`` slots and the
        cross-attention's keys and values of ``encoder_hidden_states``."""
        b = jnp.shape(encoder_hidden_states)[0]
        cache = {}
        for i, layer in enumerate(self.layers):
            own, cross = layer.self_attn, layer.encoder_attn
            part = params["layers"][str(i)]["encoder_attn"]
            cache[str(i)] = {
                "self": own.core.init_cache((b, max_len), own.head_dim, dtype),
                "cross": cross.cross_cache(part, encoder_hidden_states),
            }
        return cache

    def apply(
        self,
        params,
        ids,
        *,
        encoder_hidden_states=None,
        attention_mask=None,
        cache=None,
        key=None,
        train=False,
    ):
        offset = 0 if cache is None else cache["0"]["self"]["length"]
        h = self.call("embed_tokens", params, ids)
        h = h + self.call("embed_positions", params, offset + jnp.arange(ids.shape[1]))[None]
        h = drop(h, self.dropout, fold(key, 0), train)
        mask = None
        if attention_mask is not None:
            mask = (jnp.asarray(attention_mask) != 0)[:, None, None, :]
        new = {}
        for i in range(len(self.layers)):
            out = self.call(
                f"layers.{i}",
                params,
                h,
                encoder_hidden_states=encoder_hidden_states,
                mask=mask,
                cache=None if cache is None else cache[str(i)],
                key=fold(key, i + 1),
                train=train,
            )
            h, new[str(i)] = out if cache is not None else (out, None)
        h = self.call("layer_norm", params, h)
        return h if cache is None else (h, new)
