"""T5's layers (``purelayers.models.t5``): the relative position buckets, attention
without scaling, the pre-norm residual steps, the feed-forwards, the blocks and the
stacks, under transformers' names."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers import init as _init
from purelayers.layers import AttentionCore, Layer, Linear
from purelayers.layers._checks import as_shape
from purelayers.models._causal import drop
from purelayers.models._parts import fold, init_children

__all__ = [
    "T5Attention",
    "T5Block",
    "T5DenseActDense",
    "T5DenseGatedActDense",
    "T5LayerCrossAttention",
    "T5LayerFF",
    "T5LayerSelfAttention",
    "T5Stack",
    "relative_position_bucket",
]


def relative_position_bucket(
    relative_position: jax.Array, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> jax.Array:
    r"""T5's bucket of each ``memory - query`` offset, as transformers'
    ``T5Attention._relative_position_bucket``.

    Bidirectional: half the buckets for keys after the query, half for those at or
    before it; causal: only ``-min(offset, 0)`` counts. Within a half of ``n`` buckets,
    distances below ``n / 2`` have a bucket each, larger ones share logarithmically
    wider buckets up to ``max_distance``, and everything beyond falls in the last.

    Shape:
      any integer shape; the output has it, int32 in ``[0, num_buckets)``.
    """
    rel = jnp.asarray(relative_position, jnp.int32)
    buckets = jnp.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets = (rel > 0).astype(jnp.int32) * num_buckets
        rel = jnp.abs(rel)
    else:
        rel = -jnp.minimum(rel, 0)
    max_exact = num_buckets // 2
    scaled = jnp.log(jnp.maximum(rel, 1).astype(jnp.float32) / max_exact)
    scaled = scaled / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    large = jnp.minimum(max_exact + scaled.astype(jnp.int32), num_buckets - 1)
    return buckets + jnp.where(rel < max_exact, rel, large)


def _linear(width: int, std: float) -> Linear:
    return Linear(width, bias=False, weight_init=_init.normal(std=std))


@dataclasses.dataclass(frozen=True)
class T5Attention(Layer):
    r"""transformers' ``T5Attention``: ``o(softmax(q k^T + bias + mask) v)``, no scaling.

    ``apply(params, x, kv=None, *, bias=None, mask=None, cache=None)``: self-attention
    over ``x``, or cross-attention over ``kv``; ``bias`` (``(1 | batch, heads, q_len,
    k_len)``, floats) is the relative position bias plus the padding mask, added to the
    scores. With ``cache``: a self-attention cache (``core.init_cache``) is written and
    attended; a cross-attention cache ``{"keys", "values"}`` (``cross_cache``) holds
    ``k(kv)`` and ``v(kv)`` computed once; ``(y, cache)`` is returned.

    Parameters:
      ``q``, ``k``, ``v`` ``(heads * d_kv, d_model)``, ``o`` ``(d_model, heads * d_kv)``,
      no biases; ``relative_attention_bias.weight`` ``(num_buckets, heads)`` in the first
      block only.
    """

    q: Layer
    k: Layer
    v: Layer
    o: Layer
    relative_attention_bias: Layer | None
    core: AttentionCore
    bidirectional: bool = True
    num_buckets: int = 32
    max_distance: int = 128
    d_kv: int = 64

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        x = as_shape(shape)
        inner = (*x[:-1], self.core.num_heads * self.d_kv)
        shapes = {"q": x, "k": x, "v": x, "o": inner, "relative_attention_bias": x[:-1]}
        return init_children(self, key, shapes, dtype)

    def position_bias(self, params: Any, q_len: int, k_len: int, offset: Any = 0) -> jax.Array:
        """``(1, heads, q_len, k_len)``: the learned bias of each (query ``offset + i``,
        key ``j``) pair's bucket."""
        query = offset + jnp.arange(q_len)[:, None]
        buckets = relative_position_bucket(
            jnp.arange(k_len)[None, :] - query,
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )
        values = self.call("relative_attention_bias", params, buckets)  # (q, k, heads)
        return jnp.transpose(values, (2, 0, 1))[None]

    def cross_cache(self, params: Any, kv: Any) -> dict[str, jax.Array]:
        """``{"keys": k(kv), "values": v(kv)}``: a cross-attention's keys and values,
        computed once for every decoding step."""
        return {"keys": self.call("k", params, kv), "values": self.call("v", params, kv)}

    def apply(self, params, x, kv=None, *, bias=None, mask=None, cache=None, key=None, train=False):
        q = self.call("q", params, x, key=fold(key, 101), train=train)
        if cache is not None and "length" not in cache:  # cross-attention, k and v cached
            k, v = cache["keys"], cache["values"]
        else:
            source = x if kv is None else kv
            k = self.call("k", params, source, key=fold(key, 102), train=train)
            v = self.call("v", params, source, key=fold(key, 103), train=train)
        scores = bias
        if mask is not None and bias is not None:  # padding as transformers' additive minimum
            scores = jnp.where(mask, bias, jnp.finfo(bias.dtype).min)
        elif mask is not None:
            scores = mask
        self_cache = cache if cache is not None and "length" in cache else None
        out = self.core.attend(
            q, k, v, mask=scores, cache=self_cache, key=key, train=train, layer="T5Attention"
        )
        out, self_cache = out if self_cache is not None else (out, None)
        y = self.call("o", params, out, key=fold(key, 104), train=train)
        if cache is None:
            return y
        return y, (cache if self_cache is None else self_cache)


class _Residual:
    """A pre-norm residual step around the attention child ``part``."""

    part: ClassVar[str] = ""

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        x = as_shape(shape)
        return init_children(self, key, {self.part: x, "layer_norm": x}, dtype)

    def apply(self, params, x, kv=None, *, bias=None, mask=None, cache=None, key=None, train=False):
        h = self.call("layer_norm", params, x)
        out = self.call(
            self.part,
            params,
            h,
            kv,
            bias=bias,
            mask=mask,
            cache=cache,
            key=fold(key, 0),
            train=train,
        )
        out, cache = out if cache is not None else (out, None)
        y = x + drop(out, self.dropout_rate, fold(key, 1), train)
        return y if cache is None else (y, cache)


@dataclasses.dataclass(frozen=True)
class T5LayerSelfAttention(_Residual, Layer):
    """transformers' ``T5LayerSelfAttention``: ``x + dropout(SelfAttention(layer_norm(x)))``."""

    SelfAttention: T5Attention
    layer_norm: Layer
    dropout_rate: float = 0.0

    part: ClassVar[str] = "SelfAttention"


@dataclasses.dataclass(frozen=True)
class T5LayerCrossAttention(_Residual, Layer):
    """transformers' ``T5LayerCrossAttention``: ``x + dropout(EncDecAttention(
    layer_norm(x), kv))``, ``kv`` the encoder's output."""

    EncDecAttention: T5Attention
    layer_norm: Layer
    dropout_rate: float = 0.0

    part: ClassVar[str] = "EncDecAttention"


def _dense_init(layer: Layer, key: jax.Array, shape: Any, inputs: tuple[str, ...], dtype: Any):
    """The feed-forward's params: ``inputs`` at ``shape``, ``wo`` at their width."""
    x = as_shape(shape)
    params = init_children(layer, key, dict.fromkeys(inputs, x), dtype)
    hidden = (*x[:-1], jnp.shape(params[inputs[0]]["weight"])[0])
    wo = layer.init_child("wo", jax.random.fold_in(key, len(inputs)), hidden, dtype)
    return {**params, "wo": wo}


@dataclasses.dataclass(frozen=True)
class T5DenseActDense(Layer):
    """transformers' ``T5DenseActDense`` (v1.0): ``wo(dropout(act(wi(x))))``."""

    wi: Layer
    wo: Layer
    act: Layer
    dropout_rate: float = 0.0

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        return _dense_init(self, key, shape, ("wi",), dtype)

    def apply(self, params, x, *, key=None, train=False):
        h = self.act.apply({}, self.call("wi", params, x, key=fold(key, 0), train=train))
        h = drop(h, self.dropout_rate, fold(key, 2), train)
        return self.call("wo", params, h, key=fold(key, 3), train=train)


@dataclasses.dataclass(frozen=True)
class T5DenseGatedActDense(Layer):
    """transformers' ``T5DenseGatedActDense`` (v1.1): ``wo(dropout(act(wi_0(x)) *
    wi_1(x)))``."""

    wi_0: Layer
    wi_1: Layer
    wo: Layer
    act: Layer
    dropout_rate: float = 0.0

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        return _dense_init(self, key, shape, ("wi_0", "wi_1"), dtype)

    def apply(self, params, x, *, key=None, train=False):
        h = self.act.apply({}, self.call("wi_0", params, x, key=fold(key, 0), train=train))
        h = h * self.call("wi_1", params, x, key=fold(key, 1), train=train)
        h = drop(h, self.dropout_rate, fold(key, 2), train)
        return self.call("wo", params, h, key=fold(key, 3), train=train)


@dataclasses.dataclass(frozen=True)
class T5LayerFF(Layer):
    """transformers' ``T5LayerFF``: ``x + dropout(DenseReluDense(layer_norm(x)))``."""

    DenseReluDense: Layer
    layer_norm: Layer
    dropout_rate: float = 0.0

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        x = as_shape(shape)
        return init_children(self, key, {"DenseReluDense": x, "layer_norm": x}, dtype)

    def apply(self, params, x, *, key=None, train=False):
        h = self.call("layer_norm", params, x)
        h = self.call("DenseReluDense", params, h, key=fold(key, 0), train=train)
        return x + drop(h, self.dropout_rate, fold(key, 1), train)


@dataclasses.dataclass(frozen=True)
class T5Block(Layer):
    """transformers' ``T5Block``: ``layer`` = (self-attention, [cross-attention,]
    feed-forward), each a pre-norm residual step.

    ``apply(params, x, *, bias, encoder_hidden_states=None, cross_mask=None,
    cache=None)``: ``bias`` the self-attention's scores bias (relative positions and
    mask), ``cross_mask`` the encoder keys a decoder query may attend; ``cache`` (a
    decoder's) ``{"self": ..., "cross": ...}``.
    """

    layer: tuple[Layer, ...]

    @property
    def is_decoder(self) -> bool:
        return len(self.layer) == 3

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        x = as_shape(shape)
        layers = {
            str(i): self.init_child(f"layer.{i}", jax.random.fold_in(key, i), x, dtype)
            for i in range(len(self.layer))
        }
        return {"layer": layers}

    def apply(
        self,
        params,
        x,
        *,
        bias=None,
        mask=None,
        encoder_hidden_states=None,
        cross_mask=None,
        cache=None,
        key=None,
        train=False,
    ):
        own = None if cache is None else cache["self"]
        out = self.call(
            "layer.0", params, x, bias=bias, mask=mask, cache=own, key=fold(key, 0), train=train
        )
        h, own = out if cache is not None else (out, None)
        if self.is_decoder:
            cross = None if cache is None else cache["cross"]
            out = self.call(
                "layer.1",
                params,
                h,
                encoder_hidden_states,
                mask=cross_mask,
                cache=cross,
                key=fold(key, 1),
                train=train,
            )
            h, cross = out if cache is not None else (out, None)
        h = self.call(f"layer.{len(self.layer) - 1}", params, h, key=fold(key, 2), train=train)
        return h if cache is None else (h, {"self": own, "cross": cross})


@dataclasses.dataclass(frozen=True)
class T5Stack(Layer):
    """transformers' ``T5Stack`` after its embedding: ``dropout``, the ``block``\\ s (the
    first one's self-attention computes the relative position bias every block adds),
    ``final_layer_norm``, ``dropout``.

    ``apply(params, h, *, attention_mask=None, encoder_hidden_states=None,
    encoder_attention_mask=None, cache=None)``: ``h`` the embedded ids ``(batch, seq,
    d_model)``; ``attention_mask`` ``(batch, seq)`` (with a cache: ``(batch,
    max_len)``) 1 for a token, 0 for padding; a decoder attends causally and to
    ``encoder_hidden_states`` (keys masked by ``encoder_attention_mask``).
    """

    block: tuple[Layer, ...]
    final_layer_norm: Layer
    dropout_rate: float = 0.0

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        x = as_shape(shape)
        blocks = {
            str(i): self.init_child(f"block.{i}", jax.random.fold_in(key, i), x, dtype)
            for i in range(len(self.block))
        }
        norm = self.init_child("final_layer_norm", jax.random.fold_in(key, len(blocks)), x, dtype)
        return {"block": blocks, "final_layer_norm": norm}

    @property
    def is_decoder(self) -> bool:
        return self.block[0].is_decoder

    def init_cache(self, params: Any, encoder_hidden_states: Any, max_len: int, dtype: Any) -> Any:
        """A decoder's cache: per block an empty self-attention cache of ``max_len``
        slots and the cross-attention's keys and values of ``encoder_hidden_states``."""
        b = jnp.shape(encoder_hidden_states)[0]
        cache = {}
        for i, blk in enumerate(self.block):
            own = blk.layer[0].SelfAttention
            cross = blk.layer[1].EncDecAttention
            part = params["block"][str(i)]["layer"]["1"]["EncDecAttention"]
            cache[str(i)] = {
                "self": own.core.init_cache((b, max_len), own.d_kv, dtype),
                "cross": cross.cross_cache(part, encoder_hidden_states),
            }
        return cache

    def apply(
        self,
        params,
        h,
        *,
        attention_mask=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        cache=None,
        key=None,
        train=False,
    ):
        h = drop(h, self.dropout_rate, fold(key, 0), train)
        t = h.shape[1]
        if cache is None:
            offset, slots = 0, t
        else:
            offset, slots = cache["0"]["self"]["length"], cache["0"]["self"]["keys"].shape[1]
        first = self.block[0].layer[0].SelfAttention
        bias = first.position_bias(
            params["block"]["0"]["layer"]["0"]["SelfAttention"], t, slots, offset
        )
        mask = None
        if attention_mask is not None:
            mask = (jnp.asarray(attention_mask) != 0)[:, None, None, :]
        cross_mask = None
        if encoder_attention_mask is not None:
            cross_mask = (jnp.asarray(encoder_attention_mask) != 0)[:, None, None, :]
        new_cache = {}
        for i in range(len(self.block)):
            out = self.call(
                f"block.{i}",
                params,
                h,
                bias=bias,
                mask=mask,
                encoder_hidden_states=encoder_hidden_states,
                cross_mask=cross_mask,
                cache=None if cache is None else cache[str(i)],
                key=fold(key, i + 1),
                train=train,
            )
            h, new_cache[str(i)] = out if cache is not None else (out, None)
        h = self.call("final_layer_norm", params, h)
        h = drop(h, self.dropout_rate, fold(key, len(self.block) + 1), train)
        return h if cache is None else (h, new_cache)
