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
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.init import normal, zeros
from purelayers.layers import (
    AttentionCore,
    Conv1d,
    Embedding,
    Layer,
    LayerError,
    LayerNorm,
    Params,
)
from purelayers.layers._checks import as_array, as_shape, check_int
from purelayers.models._parts import fold, init_children
from purelayers.models._whisper_layers import (
    WhisperAttention,
    WhisperDecoder,
    WhisperDecoderLayer,
    WhisperEncoder,
    WhisperEncoderLayer,
    sinusoids,
)
from purelayers.models.bert import _ACTIVATIONS, _dense
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


def _attention(c: WhisperConfig, heads: int, causal: bool) -> WhisperAttention:
    e, std = c.d_model, c.init_std
    core = AttentionCore(heads, causal=causal, dropout=c.attention_dropout, scale=1.0)
    projections = (_dense(e, std, bias=False), _dense(e, std), _dense(e, std), _dense(e, std))
    return WhisperAttention(*projections, core, head_dim=e // heads)


def _block_parts(c: WhisperConfig, ffn: int) -> dict[str, Any]:
    return {
        "fc1": _dense(ffn, c.init_std),
        "fc2": _dense(c.d_model, c.init_std),
        "final_layer_norm": LayerNorm(),
        "act": _ACTIVATIONS[c.activation_function],
        "dropout": c.dropout,
        "activation_dropout": c.activation_dropout,
    }


def _check_config(who: str, config: Any) -> None:
    if not isinstance(config, WhisperConfig):
        raise ValueError(f"{who}: config must be a WhisperConfig, got {config!r}")


def _no_encoder_mask(who: str, mask: Any) -> None:
    if mask is not None:
        raise ValueError(f"{who}: the encoder takes no attention_mask (got one)")


def _check_features(who: str, c: WhisperConfig, features: Any, mask: Any) -> jax.Array:
    """``input_features`` as an array of ``(batch, num_mel_bins, 2 *
    max_source_positions)``; a ``LayerError`` naming the axis otherwise."""
    _no_encoder_mask(who, mask)
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


class _TeacherForced:
    """``apply``: the encoder, then the decoder over the given ids (``encode``,
    ``decode``)."""

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
            key=fold(key, 1),
            train=train,
        )


@dataclasses.dataclass(frozen=True)
class WhisperModel(_TeacherForced, Layer):
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
        """The decoder's last hidden state ``(batch, target, d_model)`` over
        ``encoder_hidden_states``; with a ``cache`` (``init_cache``;
        ``decoder_attention_mask`` then covers its ``max_len`` slots) ``(h, cache)``,
        the encoder states read from it. ``attention_mask`` (the encoder's) must be
        ``None``."""
        who, mask = type(self).__name__, decoder_attention_mask
        _no_encoder_mask(who, attention_mask)
        _check_training(who, self.config, train)
        ids = _check_ids(who, self.config, decoder_input_ids, None if cache is not None else mask)
        return self.call(
            "decoder",
            params,
            ids,
            encoder_hidden_states=encoder_hidden_states,
            attention_mask=mask,
            cache=cache,
            key=key,
            train=train,
        )


@dataclasses.dataclass(frozen=True)
class WhisperForConditionalGeneration(_TeacherForced, Layer):
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
    ``begin_suppress_tokens`` ``generate`` uses in place of the config's; the entries
    that serve language detection and timestamps (``lang_to_id``, ``task_to_id``,
    ``forced_decoder_ids``, ``no_timestamps_token_id``, ``alignment_heads``, ...) are
    kept for ``save_pretrained`` and not read: the prompt says the language and task.

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
      >>> params = pl.params.abstract(model, (1, 4, 12))
      >>> run = lambda p, x, ids: model.apply(p, x, decoder_input_ids=ids)
      >>> jax.eval_shape(run, params, jnp.zeros((1, 4, 12)), jnp.ones((1, 3), int)).shape
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
            "proj_out": _dense(self.config.vocab_size, self.config.init_std, bias=False),
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
        _no_encoder_mask(who, attention_mask)
        _check_ids(who, self.config, decoder_input_ids, None)
        out = self._parts["model"].decode(
            params["model"],
            decoder_input_ids,
            encoder_hidden_states,
            decoder_attention_mask=decoder_attention_mask,
            cache=cache,
            key=key,
            train=train,
        )
        h, cache = out if cache is not None else (out, None)
        head = params
        if self.config.tie_word_embeddings:
            head = {"proj_out": {"weight": params["model"]["decoder"]["embed_tokens"]["weight"]}}
        logits = self.call("proj_out", head, h)
        return logits if cache is None else (logits, cache)
