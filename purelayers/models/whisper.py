"""Whisper (``transformers.WhisperForConditionalGeneration`` and ``WhisperModel``): a
speech encoder over log-mel features and a text decoder with cross-attention, under
Hugging Face's names and layouts::

    model.encoder.conv1.weight, .bias                       (d_model, num_mel_bins, 3)
    model.encoder.conv2.weight, .bias                       (d_model, d_model, 3), stride 2
    model.encoder.embed_positions.weight                    (max_source_positions, d_model)
    model.encoder.layers.{i}.self_attn.k_proj.weight        (no bias; v_proj, q_proj,
                                                             out_proj with biases)
    model.encoder.layers.{i}.self_attn_layer_norm.weight, .bias
    model.encoder.layers.{i}.fc1.weight, .bias              (encoder_ffn_dim, d_model)
    model.encoder.layers.{i}.fc2.weight, .bias
    model.encoder.layers.{i}.final_layer_norm.weight, .bias
    model.encoder.layer_norm.weight, .bias
    model.decoder.embed_tokens.weight                       (vocab_size, d_model)
    model.decoder.embed_positions.weight                    (max_target_positions, d_model)
    model.decoder.layers.{i}.self_attn.*, self_attn_layer_norm.*
    model.decoder.layers.{i}.encoder_attn.*, encoder_attn_layer_norm.*
    model.decoder.layers.{i}.fc1.*, fc2.*, final_layer_norm.*
    model.decoder.layer_norm.weight, .bias
    proj_out.weight                                         (an alias of embed_tokens)

Pre-norm blocks (LayerNorm, eps ``1e-5``), attention with the queries scaled by
``head_dim ** -0.5`` before the product (transformers' order), the encoder's
sinusoidal positions a parameter that no gradient reaches (transformers freezes it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.init import normal, zeros
from purelayers.layers import (
    GELU,
    AttentionCore,
    Conv1d,
    Embedding,
    Layer,
    LayerError,
    LayerNorm,
    Linear,
    Params,
)
from purelayers.layers._checks import as_array, as_shape, check_int
from purelayers.models._causal import drop
from purelayers.models._parts import fold, init_children
from purelayers.models.bert import _ACTIVATIONS
from purelayers.models.config import Frozen, _frozen
from purelayers.models.whisper_config import WhisperConfig

__all__ = [
    "WhisperAttention",
    "WhisperConfig",
    "WhisperDecoder",
    "WhisperDecoderLayer",
    "WhisperEncoder",
    "WhisperEncoderLayer",
    "WhisperForConditionalGeneration",
    "WhisperModel",
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


def _linear(width: int, std: float, bias: bool = True) -> Linear:
    return Linear(width, bias=bias, weight_init=normal(std=std), bias_init=zeros())


def _attention(c: WhisperConfig, heads: int, causal: bool) -> WhisperAttention:
    e, std = c.d_model, c.init_std
    core = AttentionCore(heads, causal=causal, dropout=c.attention_dropout, scale=1.0)
    projections = (_linear(e, std, bias=False), _linear(e, std), _linear(e, std), _linear(e, std))
    return WhisperAttention(*projections, core, head_dim=e // heads)


def _block_parts(c: WhisperConfig, ffn: int) -> dict[str, Any]:
    return {
        "fc1": _linear(ffn, c.init_std),
        "fc2": _linear(c.d_model, c.init_std),
        "final_layer_norm": LayerNorm(),
        "act": _ACTIVATIONS[c.activation_function],
        "dropout": c.dropout,
        "activation_dropout": c.activation_dropout,
    }


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


def _check_config(who: str, config: Any) -> None:
    if not isinstance(config, WhisperConfig):
        raise ValueError(f"{who}: config must be a WhisperConfig, got {config!r}")


def _check_features(who: str, c: WhisperConfig, features: Any, mask: Any) -> jax.Array:
    """``input_features`` as an array of ``(batch, num_mel_bins, 2 *
    max_source_positions)``; a ``LayerError`` naming the axis otherwise."""
    if mask is not None:
        raise ValueError(f"{who}: the encoder takes no attention_mask (got one)")
    x = as_array(features)
    if x.ndim != 3:
        raise LayerError(
            who, "input_features shape", "(batch, num_mel_bins, frames)", tuple(x.shape)
        )
    frames = 2 * c.max_source_positions
    for axis, name, want in ((1, "mel bins", c.num_mel_bins), (2, "frames", frames)):
        if x.shape[axis] != want:
            raise LayerError(
                who, f"input_features {name} (axis {axis})", want, x.shape[axis],
                f"input_features.shape == {tuple(x.shape)}",
            )  # fmt: skip
    return x


def _check_ids(who: str, c: WhisperConfig, ids: Any, mask: Any) -> jax.Array:
    """Decoder ids ``(batch, seq)``, ``seq <= max_target_positions``, and their mask."""
    ids = as_array(ids)
    if ids.ndim != 2:
        raise LayerError(who, "decoder_input_ids shape", "(batch, seq)", ids.shape)
    if ids.shape[1] > c.max_target_positions:
        raise LayerError(
            who, "decoder_input_ids length (axis 1) at most max_target_positions",
            c.max_target_positions, ids.shape[1],
        )  # fmt: skip
    if mask is not None and jnp.shape(mask) != ids.shape:
        raise LayerError(who, "decoder_attention_mask shape", ids.shape, jnp.shape(mask))
    return ids


def _check_training(who: str, c: WhisperConfig, train: bool) -> None:
    """Training with a layer drop or SpecAugment (not implemented) is refused."""
    if not train:
        return
    for name in ("encoder_layerdrop", "decoder_layerdrop", "apply_spec_augment"):
        if getattr(c, name):
            raise ValueError(
                f"{who}: training with {name}={getattr(c, name)!r} is not implemented (set "
                f"it to {False if name == 'apply_spec_augment' else 0.0})"
            )


def _check_max_len(who: str, c: WhisperConfig, max_len: Any) -> None:
    check_int(who, "max_len", max_len)
    if max_len > c.max_target_positions:
        raise ValueError(
            f"{who}: max_len (the decoder prompt plus the new tokens) must be at most "
            f"max_target_positions={c.max_target_positions}, got {max_len}"
        )


@dataclasses.dataclass(frozen=True)
class WhisperModel(Layer):
    r"""transformers' ``WhisperModel``: ``encoder`` and ``decoder``, no head.

    ``apply(params, input_features, *, decoder_input_ids, decoder_attention_mask=None,
    key=None, train=False)`` returns the decoder's last hidden state ``(batch, target,
    d_model)``, as transformers' ``.last_hidden_state``. ``encode`` and ``decode`` split
    it (see ``WhisperForConditionalGeneration``).

    ``init(key, (batch, num_mel_bins, frames))``: transformers' init, ``N(0,
    init_std^2)`` weights and embeddings (the padding row of ``embed_tokens`` zero, and
    kept there by its gradient, as torch's ``padding_idx``), zero biases, unit norms,
    the encoder's sinusoidal positions.

    Example:
      >>> from purelayers.models.whisper import WhisperConfig, WhisperModel
      >>> config = WhisperConfig(vocab_size=50, num_mel_bins=4, d_model=8,
      ...     encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
      ...     decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
      ...     max_source_positions=6, max_target_positions=10, pad_token_id=0)
      >>> model = WhisperModel(config)
      >>> names = list(pl.params.flatten(model.ordered(pl.params.abstract(model, (1, 4, 12)))))
      >>> names[0], names[4], names[-1]
      ('encoder.conv1.weight', 'encoder.embed_positions.weight', 'decoder.layer_norm.bias')
    """

    config: WhisperConfig

    config_class: ClassVar[type[WhisperConfig]] = WhisperConfig
    base_model_prefix: ClassVar[str] = "model"
    main_input_name: ClassVar[str] = "input_features"
    is_encoder_decoder: ClassVar[bool] = True

    def __post_init__(self):
        _check_config(type(self).__name__, self.config)
        c = self.config
        encoder_layers = tuple(
            WhisperEncoderLayer(
                _attention(c, c.encoder_attention_heads, False),
                LayerNorm(),
                **_block_parts(c, c.encoder_ffn_dim),
            )
            for _ in range(c.encoder_layers)
        )
        decoder_layers = tuple(
            WhisperDecoderLayer(
                _attention(c, c.decoder_attention_heads, True),
                LayerNorm(),
                _attention(c, c.decoder_attention_heads, False),
                LayerNorm(),
                **_block_parts(c, c.decoder_ffn_dim),
            )
            for _ in range(c.decoder_layers)
        )
        std = normal(std=c.init_std)
        conv = dict(kernel_size=3, padding=1, weight_init=std, bias_init=zeros())
        parts = {
            "encoder": WhisperEncoder(
                Conv1d(c.d_model, **conv),
                Conv1d(c.d_model, stride=2, **conv),
                Embedding(c.max_source_positions, c.d_model),
                encoder_layers,
                LayerNorm(),
                c.dropout,
            ),
            "decoder": WhisperDecoder(
                Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_token_id, weight_init=std),
                Embedding(c.max_target_positions, c.d_model, weight_init=std),
                decoder_layers,
                LayerNorm(),
                c.dropout,
            ),
        }
        object.__setattr__(self, "_parts", parts)

    def children(self) -> dict[str, Layer]:
        return dict(self._parts)

    def example_shape(self) -> tuple[int, ...]:
        """The ``input_features`` shape ``from_pretrained`` builds its template for."""
        return (1, self.config.num_mel_bins, 2 * self.config.max_source_positions)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        features = as_shape(shape)
        if len(features) != 3:
            raise LayerError(
                type(self).__name__, "input_features shape", "(batch, mel, frames)", features
            )
        return init_children(self, key, {"encoder": features, "decoder": (features[0], 1)}, dtype)

    def encode(self, params, input_features, *, attention_mask=None, key=None, train=False):
        """The encoder's last hidden state ``(batch, max_source_positions, d_model)``.
        ``attention_mask`` must be ``None``: Whisper's encoder attends every frame (its
        features are padded to 30 seconds), as transformers' (which ignores one)."""
        who = type(self).__name__
        x = _check_features(who, self.config, input_features, attention_mask)
        _check_training(who, self.config, train)
        return self.call("encoder", params, x, key=key, train=train)

    def init_cache(self, params: Params, encoder_hidden_states: Any, max_len: int) -> Any:
        """The decoder's cache for up to ``max_len`` positions (at most
        ``max_target_positions``): empty self-attention slots, and each layer's
        cross-attention keys and values of ``encoder_hidden_states``, computed here."""
        _check_max_len(type(self).__name__, self.config, max_len)
        h = jnp.asarray(encoder_hidden_states)
        decoder = self._parts["decoder"]
        return decoder.init_cache(params["decoder"], h, max_len, h.dtype)

    def decode_hidden(self, params, ids, encoded, *, mask=None, cache=None, key=None, train=False):
        """The decoder's output (and cache) over ``encoded`` (or the cache's keys)."""
        who = type(self).__name__
        _check_training(who, self.config, train)
        ids = _check_ids(who, self.config, ids, None if cache is not None else mask)
        return self.call(
            "decoder",
            params,
            ids,
            encoder_hidden_states=encoded,
            attention_mask=mask,
            cache=cache,
            key=key,
            train=train,
        )

    def apply(
        self,
        params,
        input_features,
        *,
        decoder_input_ids,
        decoder_attention_mask=None,
        key=None,
        train=False,
    ):
        ids = _check_ids(
            type(self).__name__, self.config, decoder_input_ids, decoder_attention_mask
        )
        encoded = self.encode(params, input_features, key=fold(key, 0), train=train)
        return self.decode_hidden(
            params, ids, encoded, mask=decoder_attention_mask, key=fold(key, 1), train=train
        )


@dataclasses.dataclass(frozen=True)
class WhisperForConditionalGeneration(Layer):
    r"""transformers' ``WhisperForConditionalGeneration``: a ``WhisperModel`` under
    ``model`` and the head ``proj_out`` (``model.decoder.embed_tokens.weight``, held
    once, unless ``tie_word_embeddings`` is off)::

        logits = proj_out(decoder(decoder_input_ids, encoder(input_features)))

    ``apply(params, input_features, *, decoder_input_ids, decoder_attention_mask=None,
    key=None, train=False)`` returns the logits ``(batch, target, vocab_size)``, as
    transformers' ``.logits`` (teacher forcing); ``decoder_attention_mask`` (1 = token,
    0 = padding) hides decoder padding. Dropout runs only with ``train=True``, from
    ``key``. ``input_features`` of another shape than ``(batch, num_mel_bins, 2 *
    max_source_positions)`` is a ``LayerError`` naming the axis.

    ``encode``, ``init_cache`` and ``decode`` split the same computation for
    ``purelayers.models.generate``: the encoder runs once, the cross-attention keys and
    values are computed once, and the decoder adds a token at a time to a fixed-shape
    self-attention cache. ``generate(model, params, input_features,
    decoder_input_ids=prompt, max_new_tokens=n)`` continues the given prompt
    (``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>``'s ids, say), with
    ``suppress_tokens`` masked at every step and ``begin_suppress_tokens`` at the first;
    language detection, timestamps, ``forced_decoder_ids`` and beams are not
    implemented (a ``ValueError`` naming the option).

    ``generation_config`` (keyword only): a ``generation_config.json``'s contents, whose
    ``eos_token_id``, ``pad_token_id``, ``suppress_tokens`` and
    ``begin_suppress_tokens`` ``generate`` uses in place of the config's.

    Shape:
      ``input_features`` ``(batch, num_mel_bins, 2 * max_source_positions)``;
      ``decoder_input_ids``, ``decoder_attention_mask`` ``(batch, target)``, ``target
      <= max_target_positions``; logits ``(batch, target, vocab_size)``.

    Example:
      >>> from purelayers.models.whisper import WhisperConfig, WhisperForConditionalGeneration
      >>> config = WhisperConfig(vocab_size=50, num_mel_bins=4, d_model=8,
      ...     encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
      ...     decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
      ...     max_source_positions=6, max_target_positions=10, pad_token_id=0)
      >>> model = WhisperForConditionalGeneration(config)
      >>> params = model.init(jax.random.key(0), (1, 4, 12))
      >>> model.apply(params, jnp.zeros((1, 4, 12)), decoder_input_ids=jnp.ones((1, 3), int)).shape
      (1, 3, 50)
    """

    config: WhisperConfig
    generation_config: Mapping[str, Any] | None = dataclasses.field(default=None, kw_only=True)

    config_class: ClassVar[type[WhisperConfig]] = WhisperConfig
    base_model_prefix: ClassVar[str] = "model"
    main_input_name: ClassVar[str] = "input_features"
    is_encoder_decoder: ClassVar[bool] = True
    requires_decoder_prompt: ClassVar[bool] = True
    peft_task_type: ClassVar[str] = "SEQ_2_SEQ_LM"
    output_embeddings: ClassVar[str] = "proj_out"

    def __post_init__(self):
        who = type(self).__name__
        _check_config(who, self.config)
        given = self.generation_config
        if given is not None and not isinstance(given, Frozen):
            if not isinstance(given, Mapping):
                raise ValueError(
                    f"{who}: generation_config must be a dict (a generation_config.json's "
                    f"contents), got {type(given).__name__}"
                )
            object.__setattr__(self, "generation_config", _frozen(dict(given)))
        parts = {
            "model": WhisperModel(self.config),
            "proj_out": _linear(self.config.vocab_size, self.config.init_std, bias=False),
        }
        object.__setattr__(self, "_parts", parts)

    def children(self) -> dict[str, Layer]:
        return dict(self._parts)

    def aliases(self) -> dict[str, str]:
        if self.config.tie_word_embeddings:
            return {"proj_out.weight": "model.decoder.embed_tokens.weight"}
        return {}

    def example_shape(self) -> tuple[int, ...]:
        """The ``input_features`` shape ``from_pretrained`` builds its template for."""
        return self._parts["model"].example_shape()

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        params = {"model": self._parts["model"].init(jax.random.fold_in(key, 0), shape, dtype)}
        if not self.config.tie_word_embeddings:
            h = (as_shape(shape)[0], 1, self.config.d_model)
            params["proj_out"] = self.init_child("proj_out", jax.random.fold_in(key, 1), h, dtype)
        return params

    def encode(self, params, input_features, *, attention_mask=None, key=None, train=False):
        """The encoder's last hidden state ``(batch, max_source_positions, d_model)``."""
        _check_features(type(self).__name__, self.config, input_features, attention_mask)
        return self._parts["model"].encode(
            params["model"], input_features, attention_mask=attention_mask, key=key, train=train
        )

    def init_cache(self, params: Params, encoder_hidden_states: Any, max_len: int) -> Any:
        """The decoder's cache for up to ``max_len`` positions (``WhisperModel``'s)."""
        _check_max_len(type(self).__name__, self.config, max_len)
        return self._parts["model"].init_cache(params["model"], encoder_hidden_states, max_len)

    def decode(
        self,
        params,
        decoder_input_ids,
        encoder_hidden_states=None,
        *,
        attention_mask=None,
        decoder_attention_mask=None,
        cache=None,
        key=None,
        train=False,
    ):
        """Logits ``(batch, target, vocab_size)`` of the decoder over
        ``encoder_hidden_states``; with a ``cache`` (``init_cache``;
        ``decoder_attention_mask`` then covers its ``max_len`` slots) ``(logits,
        cache)``, the encoder states read from it. ``attention_mask`` (the encoder's)
        must be ``None``."""
        who = type(self).__name__
        if attention_mask is not None:
            raise ValueError(f"{who}: the encoder takes no attention_mask (got one)")
        _check_ids(who, self.config, decoder_input_ids, None)
        out = self._parts["model"].decode_hidden(
            params["model"],
            decoder_input_ids,
            encoder_hidden_states,
            mask=decoder_attention_mask,
            cache=cache,
            key=fold(key, 1),
            train=train,
        )
        h, cache = out if cache is not None else (out, None)
        head = params
        if self.config.tie_word_embeddings:
            head = {"proj_out": {"weight": params["model"]["decoder"]["embed_tokens"]["weight"]}}
        logits = self.call("proj_out", head, h)
        return logits if cache is None else (logits, cache)

    def apply(
        self,
        params,
        input_features,
        *,
        decoder_input_ids,
        decoder_attention_mask=None,
        key=None,
        train=False,
    ):
        _check_ids(type(self).__name__, self.config, decoder_input_ids, decoder_attention_mask)
        encoded = self.encode(params, input_features, key=fold(key, 0), train=train)
        return self.decode(
            params,
            decoder_input_ids,
            encoded,
            decoder_attention_mask=decoder_attention_mask,
            key=key,
            train=train,
        )
