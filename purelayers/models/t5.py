"""T5 (``transformers.T5ForConditionalGeneration``): an encoder-decoder with relative
position buckets, under Hugging Face's names and layouts.

Pre-norm blocks with T5's RMS LayerNorm (no mean subtraction, no bias), attention
without the ``1 / sqrt(d)`` scaling, a learned bias per relative-position bucket held by
the first block's self-attention and shared by the others (bidirectional buckets in the
encoder, causal ones in the decoder), and the v1.0 ReLU (``wi``, ``wo``) or the v1.1
gated-GELU (``wi_0``, ``wi_1``, ``wo``) feed-forward::

    shared.weight                                               (vocab_size, d_model)
    encoder.block.{i}.layer.0.SelfAttention.q.weight            (num_heads * d_kv, d_model)
    encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight  (buckets, heads)
    encoder.block.{i}.layer.0.layer_norm.weight
    encoder.block.{i}.layer.1.DenseReluDense.wi.weight          (d_ff, d_model)
    encoder.final_layer_norm.weight
    decoder.block.{i}.layer.1.EncDecAttention.k.weight          (cross-attention)
    decoder.block.{i}.layer.2.DenseReluDense.wo.weight
    lm_head.weight                                              (untied heads only)

``encoder.embed_tokens.weight``, ``decoder.embed_tokens.weight`` (and a tied
``lm_head.weight``) are aliases of ``shared.weight``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from purelayers import init as _init
from purelayers.layers import AttentionCore, Embedding, Layer, LayerError, RMSNorm
from purelayers.layers._checks import as_array, as_shape, check_choice, check_float, check_int
from purelayers.models._parts import fold, init_children
from purelayers.models._t5_layers import (
    T5Attention,
    T5Block,
    T5DenseActDense,
    T5DenseGatedActDense,
    T5LayerCrossAttention,
    T5LayerFF,
    T5LayerSelfAttention,
    T5Stack,
    _linear,
    relative_position_bucket,
)
from purelayers.models.bert import _ACTIVATIONS
from purelayers.models.config import Config, Frozen, _frozen

__all__ = [
    "T5Attention",
    "T5Block",
    "T5Config",
    "T5ForConditionalGeneration",
    "T5Stack",
    "relative_position_bucket",
]


@dataclasses.dataclass(frozen=True)
class T5Config(Config):
    """``transformers.T5Config``'s fields and defaults (those the model uses).

    ``feed_forward_proj``: ``"relu"`` (T5 v1.0: ``DenseReluDense.wi``/``wo``) or
    ``"gated-gelu"`` (v1.1: ``wi_0``/``wi_1``/``wo`` with the tanh GELU), or another
    ``[gated-]<activation>``. ``tie_word_embeddings``: the head is ``shared.weight``
    (else ``lm_head.weight`` of its own). ``scale_decoder_outputs``: the decoder's
    output is multiplied by ``d_model ** -0.5`` before the head; default ``None``: as
    ``tie_word_embeddings``, the rule transformers applies to configs without it.
    transformers 5 writes ``tie_word_embeddings: true`` for every T5 (it ties every
    head at construction and unties one its file holds) beside
    ``scale_decoder_outputs``; ``from_pretrained`` takes the head the file holds the
    same way (``T5ForConditionalGeneration.fit_checkpoint``), so a v1.1 folder loads
    untied whichever way its config says.
    ``decoder_start_token_id``: the first decoder id ``generate`` feeds (published T5
    checkpoints set 0, the pad id; transformers' default is unset).
    """

    model_type: ClassVar[str] = "t5"

    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_decoder_layers: int | None = None
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-6
    initializer_factor: float = 1.0
    feed_forward_proj: str = "relu"
    is_encoder_decoder: bool = True
    use_cache: bool = True
    pad_token_id: int | None = 0
    eos_token_id: int | tuple[int, ...] | None = 1
    decoder_start_token_id: int | None = None
    tie_word_embeddings: bool = True
    scale_decoder_outputs: bool | None = None

    def __post_init__(self):
        super().__post_init__()
        name = "T5Config"
        for field in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads"):
            check_int(name, field, getattr(self, field))
        if self.num_decoder_layers is None:
            object.__setattr__(self, "num_decoder_layers", self.num_layers)
        check_int(name, "num_decoder_layers", self.num_decoder_layers)
        check_int(
            name, "relative_attention_num_buckets", self.relative_attention_num_buckets, minimum=4
        )
        check_int(name, "relative_attention_max_distance", self.relative_attention_max_distance)
        check_float(name, "dropout_rate", self.dropout_rate, low=0.0, high=1.0, high_open=True)
        check_float(name, "layer_norm_epsilon", self.layer_norm_epsilon, low=0.0, low_open=True)
        check_float(name, "initializer_factor", self.initializer_factor, low=0.0)
        parts = str(self.feed_forward_proj).split("-")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
            raise ValueError(
                f"{name}: feed_forward_proj must be '<activation>' or 'gated-<activation>' "
                f"('relu', 'gated-gelu'), got {self.feed_forward_proj!r}"
            )
        check_choice(name, "feed_forward_proj activation", parts[-1], tuple(_ACTIVATIONS))
        if self.is_encoder_decoder is not True:
            raise ValueError(
                f"{name}: is_encoder_decoder must be True, got {self.is_encoder_decoder!r}"
            )
        if self.scale_decoder_outputs is None:
            object.__setattr__(self, "scale_decoder_outputs", bool(self.tie_word_embeddings))

    @property
    def is_gated_act(self) -> bool:
        return self.feed_forward_proj.startswith("gated-")

    @property
    def dense_act_fn(self) -> str:
        """transformers' activation name (``"gated-gelu"`` means ``gelu_new``)."""
        if self.feed_forward_proj == "gated-gelu":
            return "gelu_new"
        return self.feed_forward_proj.split("-")[-1]


def _stack(c: T5Config, n: int, decoder: bool) -> T5Stack:
    """``n`` blocks (relative position bias in the first) and the final norm."""
    f, d, inner = c.initializer_factor, c.d_model, c.num_heads * c.d_kv
    act = _ACTIVATIONS[c.dense_act_fn]

    def norm() -> RMSNorm:
        return RMSNorm(eps=c.layer_norm_epsilon, weight_init=_init.constant(f))

    def attention(first: bool, causal: bool) -> T5Attention:
        table = Embedding(
            c.relative_attention_num_buckets, c.num_heads, weight_init=_init.normal(std=f * d**-0.5)
        )
        return T5Attention(
            _linear(inner, f * (d * c.d_kv) ** -0.5),
            _linear(inner, f * d**-0.5),
            _linear(inner, f * d**-0.5),
            _linear(d, f * inner**-0.5),
            table if first else None,
            AttentionCore(c.num_heads, causal=causal, dropout=c.dropout_rate, scale=1.0),
            bidirectional=not decoder,
            num_buckets=c.relative_attention_num_buckets,
            max_distance=c.relative_attention_max_distance,
            d_kv=c.d_kv,
        )

    if c.is_gated_act:
        dense = T5DenseGatedActDense(
            _linear(c.d_ff, f * d**-0.5),
            _linear(c.d_ff, f * d**-0.5),
            _linear(d, f * c.d_ff**-0.5),
            act,
            c.dropout_rate,
        )
    else:
        dense = T5DenseActDense(
            _linear(c.d_ff, f * d**-0.5), _linear(d, f * c.d_ff**-0.5), act, c.dropout_rate
        )
    blocks = []
    for i in range(n):
        layers: list[Layer] = [
            T5LayerSelfAttention(attention(i == 0, decoder), norm(), c.dropout_rate)
        ]
        if decoder:
            layers.append(T5LayerCrossAttention(attention(False, False), norm(), c.dropout_rate))
        layers.append(T5LayerFF(dense, norm(), c.dropout_rate))
        blocks.append(T5Block(tuple(layers)))
    return T5Stack(tuple(blocks), norm(), c.dropout_rate)


@dataclasses.dataclass(frozen=True)
class T5ForConditionalGeneration(Layer):
    r"""``transformers.T5ForConditionalGeneration``: ``shared`` embeddings, an
    ``encoder`` and a ``decoder`` ``T5Stack``, and the head::

        logits = lm_head(decoder(shared(decoder_input_ids), encoder(shared(input_ids)))
                         * (d_model ** -0.5 if scale_decoder_outputs else 1))

    ``apply(params, input_ids, *, attention_mask=None, decoder_input_ids,
    decoder_attention_mask=None, key=None, train=False)`` returns the logits
    ``(batch, target, vocab_size)``, as transformers' ``.logits``. ``attention_mask``
    (1 = token, 0 = padding, on either side: positions are relative) hides encoder
    padding from the encoder and from the decoder's cross-attention;
    ``decoder_attention_mask`` hides decoder padding. Dropout (``dropout_rate``) runs
    only with ``train=True``, from ``key``.

    ``encode``, ``init_cache`` and ``decode`` split the same computation for
    ``generate`` (``purelayers.models.generate``): the encoder runs once, the
    cross-attention keys and values are computed once, and the decoder adds a token at
    a time to a fixed-shape self-attention cache.

    ``init(key, (batch, seq))``: transformers' init (``initializer_factor`` ``f``):
    ``shared`` and an untied ``lm_head`` ``N(0, f^2)``; ``q`` ``N(0, f^2 / (d_model
    d_kv))``, ``k``, ``v``, ``wi`` and the bias table ``N(0, f^2 / d_model)``, ``o``
    ``N(0, f^2 / (heads d_kv))``, ``wo`` ``N(0, f^2 / d_ff)``; norms at ``f``.

    ``generation_config`` (keyword only): a ``generation_config.json``'s contents, whose
    ``eos_token_id``, ``pad_token_id`` and ``decoder_start_token_id`` ``generate`` uses
    in place of the config's, as transformers' ``model.generation_config``.

    Shape:
      ``input_ids``, ``attention_mask`` ``(batch, source)``; ``decoder_input_ids``,
      ``decoder_attention_mask`` ``(batch, target)``; logits ``(batch, target,
      vocab_size)``.

    Example:
      >>> from purelayers.models.t5 import T5Config, T5ForConditionalGeneration
      >>> t5 = T5ForConditionalGeneration(T5Config(vocab_size=50, d_model=8, d_kv=4,
      ...                                          d_ff=16, num_layers=1, num_heads=2))
      >>> names = list(pl.params.flatten(t5.ordered(pl.params.abstract(t5, (1, 5)))))
      >>> len(names), names[0], names[1]
      (26, 'shared.weight', 'encoder.block.0.layer.0.SelfAttention.q.weight')
    """

    config: T5Config
    generation_config: Mapping[str, Any] | None = dataclasses.field(default=None, kw_only=True)

    config_class: ClassVar[type[T5Config]] = T5Config
    base_model_prefix: ClassVar[str] = "transformer"
    is_encoder_decoder: ClassVar[bool] = True
    peft_task_type: ClassVar[str] = "SEQ_2_SEQ_LM"
    output_embeddings: ClassVar[str] = "lm_head"
    # transformers' _keys_to_ignore_on_load_unexpected: an old checkpoint's stray table
    ignore_on_load: ClassVar[tuple[str, ...]] = (
        r"^decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight$",
    )

    def __post_init__(self):
        if not isinstance(self.config, T5Config):
            raise ValueError(
                f"T5ForConditionalGeneration: config must be a T5Config, got {self.config!r}"
            )
        ids = self.generation_config
        if ids is not None and not isinstance(ids, Frozen):
            if not isinstance(ids, Mapping):
                raise ValueError(
                    "T5ForConditionalGeneration: generation_config must be a dict (a "
                    f"generation_config.json's contents), got {type(ids).__name__}"
                )
            object.__setattr__(self, "generation_config", _frozen(dict(ids)))
        c = self.config
        parts = {
            "shared": Embedding(
                c.vocab_size, c.d_model, weight_init=_init.normal(std=c.initializer_factor)
            ),
            "encoder": _stack(c, c.num_layers, decoder=False),
            "decoder": _stack(c, c.num_decoder_layers, decoder=True),
            "lm_head": _linear(c.vocab_size, c.initializer_factor),
        }
        object.__setattr__(self, "_parts", parts)

    @property
    def takes_ids(self) -> bool:
        return True

    def children(self) -> dict[str, Layer]:
        return dict(self._parts)

    def aliases(self) -> dict[str, str]:
        out = {
            "encoder.embed_tokens.weight": "shared.weight",
            "decoder.embed_tokens.weight": "shared.weight",
        }
        if self.config.tie_word_embeddings:
            out["lm_head.weight"] = "shared.weight"
        return out

    def example_shape(self) -> tuple[int, ...]:
        """The input shape ``from_pretrained`` builds its params template for."""
        return (1, 1)

    def fit_checkpoint(self, tensors: Mapping[str, Any]) -> T5ForConditionalGeneration:
        """The model for a file's ``tensors`` (name to a tensor with ``read()``), as
        transformers 5 loads T5: a tied config whose file holds an ``lm_head.weight``
        that differs from ``shared.weight`` gets that head, untied (transformers 5 ties
        every T5 head and unties one the file holds); an untied config whose file holds
        no ``lm_head.weight`` gets the tied head. ``scale_decoder_outputs`` is kept
        either way. Otherwise the model itself."""
        c = self.config
        head = tensors.get("lm_head.weight")
        if c.tie_word_embeddings and head is not None:
            names = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
            shared = next((tensors[n] for n in names if n in tensors), None)
            same = (
                shared is not None
                and tuple(shared.shape) == tuple(head.shape)
                and np.array_equal(np.asarray(shared.read()), np.asarray(head.read()))
            )
            tie = same
        else:
            tie = c.tie_word_embeddings or head is None
        if tie == c.tie_word_embeddings:
            return self
        config = dataclasses.replace(
            c, tie_word_embeddings=tie, scale_decoder_outputs=c.scale_decoder_outputs
        )
        return type(self)(config, generation_config=self.generation_config)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        ids = as_shape(shape)
        if len(ids) != 2:
            raise LayerError("T5ForConditionalGeneration", "input_ids shape", "(batch, seq)", ids)
        h = (*ids, self.config.d_model)
        shapes = {"shared": ids, "encoder": h, "decoder": h}
        if not self.config.tie_word_embeddings:
            shapes["lm_head"] = h
        return init_children(self, key, shapes, dtype)

    def _ids(self, what: str, ids: Any, mask: Any) -> jax.Array:
        ids = as_array(ids)
        if ids.ndim != 2:
            raise LayerError(
                "T5ForConditionalGeneration", f"{what} shape", "(batch, seq)", ids.shape
            )
        if mask is not None and jnp.shape(mask) != ids.shape:
            raise LayerError(
                "T5ForConditionalGeneration", f"{what} mask shape", ids.shape, jnp.shape(mask)
            )
        return ids

    def encode(
        self,
        params: Any,
        input_ids: Any,
        *,
        attention_mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        """The encoder's last hidden state ``(batch, source, d_model)``."""
        ids = self._ids("input_ids", input_ids, attention_mask)
        h = self.call("shared", params, ids)
        return self.call("encoder", params, h, attention_mask=attention_mask, key=key, train=train)

    def init_cache(self, params: Any, encoder_hidden_states: Any, max_len: int) -> Any:
        """The decoder's cache for up to ``max_len`` decoder positions: empty
        self-attention slots, and each block's cross-attention keys and values of
        ``encoder_hidden_states`` (computed here, once)."""
        check_int("T5ForConditionalGeneration", "max_len", max_len)
        h = jnp.asarray(encoder_hidden_states)
        return self._parts["decoder"].init_cache(params["decoder"], h, max_len, h.dtype)

    def decode(
        self,
        params: Any,
        decoder_input_ids: Any,
        encoder_hidden_states: Any = None,
        *,
        attention_mask: Any = None,
        decoder_attention_mask: Any = None,
        cache: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ):
        """Logits ``(batch, target, vocab_size)`` of the decoder over
        ``encoder_hidden_states`` (masked by the encoder's ``attention_mask``); with a
        ``cache`` (``init_cache``; ``decoder_attention_mask`` then covers its
        ``max_len`` slots) ``(logits, cache)``, the encoder states read from it."""
        ids = self._ids("decoder_input_ids", decoder_input_ids, None)
        h = self.call("shared", params, ids)
        out = self.call(
            "decoder",
            params,
            h,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=attention_mask,
            cache=cache,
            key=fold(key, 1),
            train=train,
        )
        h, cache = out if cache is not None else (out, None)
        if self.config.scale_decoder_outputs:
            h = h * self.config.d_model**-0.5
        head = params
        if self.config.tie_word_embeddings:
            head = {"lm_head": {"weight": params["shared"]["weight"]}}
        logits = self.call("lm_head", head, h, key=fold(key, 2), train=train)
        return logits if cache is None else (logits, cache)

    def apply(
        self,
        params: Any,
        input_ids: Any,
        *,
        attention_mask: Any = None,
        decoder_input_ids: Any,
        decoder_attention_mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        ids = self._ids("decoder_input_ids", decoder_input_ids, decoder_attention_mask)
        encoded = self.encode(
            params, input_ids, attention_mask=attention_mask, key=fold(key, 0), train=train
        )
        return self.decode(
            params,
            ids,
            encoded,
            attention_mask=attention_mask,
            decoder_attention_mask=decoder_attention_mask,
            key=key,
            train=train,
        )
