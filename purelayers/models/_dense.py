"""What the dense decoder families after Llama share (Qwen3, OLMo 2, Gemma 2 and 3,
Qwen2's sliding-window layers): an attention with optional q/k RMSNorm (per head or over
the projection's width), a query scale and attention logit soft-capping; a decoder
layer with the norm placements of Llama (pre-norms), OLMo 2 (post-norms) and Gemma
(both); a gated MLP; Gemma's ``(1 + weight)`` RMSNorm; and a backbone whose layers may
differ (a sliding window or a rope base per layer), all under transformers' names."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers import init as _init
from purelayers.functional.attention import causal_mask, mask4
from purelayers.layers import AttentionCore, Embedding, Layer, Linear, Repeat, RMSNorm
from purelayers.layers._checks import as_shape
from purelayers.models._causal import CausalLM, decoder_inputs, positions_and_mask
from purelayers.models._parts import fold

__all__ = [
    "DecoderAttention",
    "DecoderLayer",
    "DecoderModel",
    "GatedMLP",
    "GemmaRMSNorm",
    "check_layer_types",
]

LAYER_TYPES = ("full_attention", "sliding_attention")
_ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
}


def check_layer_types(name: str, layer_types: Any, n: int) -> tuple[str, ...]:
    """``layer_types`` checked: ``n`` entries, each ``"full_attention"`` or
    ``"sliding_attention"`` (a ``ValueError`` naming the config and the field else)."""
    types = tuple(layer_types)
    if len(types) != n:
        raise ValueError(
            f"{name}: layer_types must list num_hidden_layers={n} entries, got {len(types)}"
        )
    for i, t in enumerate(types):
        if t not in LAYER_TYPES:
            raise ValueError(
                f"{name}: layer_types[{i}] must be 'full_attention' or 'sliding_attention', "
                f"got {t!r}"
            )
    return types


def activation(name: str, field: str, value: str) -> Any:
    """The MLP activation transformers' ``ACT2FN[value]`` is, for the names handled."""
    if value not in _ACTIVATIONS:
        raise ValueError(f"{name}: {field} must be one of {sorted(_ACTIVATIONS)}, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class GemmaRMSNorm(Layer):
    r"""Gemma's RMSNorm: ``y = x / sqrt(mean(x**2) + eps) * (1 + weight)``, computed in
    float32 and cast back to ``x``'s dtype (``transformers.Gemma2RMSNorm``).

    Parameters:
      ``weight``: ``(x.shape[-1],)``, zeros (the identity scale).
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    eps: float = 1e-6

    def own_names(self) -> tuple[str, ...]:
        return ("weight",)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        return {"weight": jnp.zeros(as_shape(shape)[-1:], dtype)}

    def apply(self, params, x, *, key=None, train=False):
        x = jnp.asarray(x)
        h = x.astype(jnp.float32)
        h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + self.eps)
        scale = 1.0 + params["weight"].astype(jnp.float32)
        return (h * scale.reshape((1,) * (h.ndim - 1) + scale.shape)).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class GatedMLP(Layer):
    """``down_proj(act(gate_proj(x)) * up_proj(x))``, ``act`` one of ``silu``,
    ``gelu_pytorch_tanh``, ``gelu`` (transformers' names)."""

    gate_proj: Layer
    up_proj: Layer
    down_proj: Layer
    act: str = "silu"

    def apply(self, params, x, *, key=None, train=False):
        def proj(name, i, a):  # each its own key (a LoRA adapter's dropout draws from it)
            return self.call(name, params, a, key=fold(key, i), train=train)

        gate = _ACTIVATIONS[self.act](proj("gate_proj", 0, x))
        return proj("down_proj", 2, gate * proj("up_proj", 1, x))


@dataclasses.dataclass(frozen=True)
class DecoderAttention(Layer):
    r"""``o_proj(attend(rope(q_norm(q_proj(x))), rope(k_norm(k_proj(x))), v_proj(x)))``.

    ``q_norm``/``k_norm`` (``None``: none) normalize each head's ``head_dim`` values
    (Qwen3, Gemma 3: ``norm_per_head=True``) or the whole projection (OLMo 2), before
    the rotary embedding. ``core`` is the ``AttentionCore`` (heads, rope, scale, cache);
    ``softcap`` (Gemma 2) bounds the scaled scores as ``softcap * tanh(s / softcap)``
    before the masks; ``window`` hides keys ``window`` or more positions before the
    query (applied by the model's mask, kept here to describe the layer).
    """

    q_proj: Layer
    k_proj: Layer
    v_proj: Layer
    o_proj: Layer
    q_norm: Layer | None = None
    k_norm: Layer | None = None
    _: dataclasses.KW_ONLY
    core: AttentionCore = dataclasses.field(default_factory=lambda: AttentionCore(1))
    head_dim: int = 1
    norm_per_head: bool = True
    softcap: float | None = None
    window: int | None = None

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict[str, Any]:
        shape = as_shape(shape)
        h, kh, hd = self.core.num_heads, self.core.kv_heads, self.head_dim
        widths = {"q_norm": hd if self.norm_per_head else h * hd}
        widths["k_norm"] = hd if self.norm_per_head else kh * hd
        inputs = {"o_proj": (*shape[:-1], h * hd), **{n: (w,) for n, w in widths.items()}}
        out = {}
        for i, name in enumerate(("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")):
            if getattr(self, name) is not None:
                k = jax.random.fold_in(key, i)
                out[name] = self.init_child(name, k, inputs.get(name, shape), dtype)
        return out

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
        b, max_len = as_shape(shape)[:2]
        return self.core.init_cache((b, max_len), self.head_dim, dtype)

    def _normed(self, name: str, params, a: jax.Array) -> jax.Array:
        if getattr(self, name) is None:
            return a
        if not self.norm_per_head:
            return self.call(name, params, a)
        heads = a.reshape(*a.shape[:-1], -1, self.head_dim)
        return self.call(name, params, heads).reshape(a.shape)

    def apply(self, params, x, *, mask=None, positions=None, cache=None, key=None, train=False):
        def proj(name, i, a):
            return self.call(name, params, a, key=fold(key, i), train=train)

        q = self._normed("q_norm", params, proj("q_proj", 101, x))
        k = self._normed("k_norm", params, proj("k_proj", 102, x))
        v = proj("v_proj", 103, x)
        opts = dict(mask=mask, positions=positions, cache=cache, layer="DecoderAttention")
        if self.softcap is None:
            out = self.core.attend(q, k, v, key=key, train=train, **opts)
        else:
            out = self._capped(q, k, v, key=key, train=train, **opts)
        out, cache = out if cache is not None else (out, None)
        y = proj("o_proj", 104, out)
        return y if cache is None else (y, cache)

    def _capped(self, q, k, v, *, mask, positions, cache, key, train, layer):
        """Attention with soft-capped scores, written out (transformers' eager form:
        scores in the input dtype, softmax in float32)."""
        core = self.core
        h, kh, hd = core.num_heads, core.kv_heads, self.head_dim
        b, t = q.shape[:2]
        q, k = q.reshape(b, t, h, hd), k.reshape(b, t, kh, hd)
        v = v.reshape(b, t, kh, -1)
        offset = jnp.zeros((), jnp.int32) if cache is None else cache["length"]
        pos = offset + jnp.arange(t) if positions is None else jnp.asarray(positions)
        q, k = core.rope.apply({}, q, pos), core.rope.apply({}, k, pos)
        if cache is None:
            visible = causal_mask(t, t)[None, None]
        else:
            k, v, cache, visible = core._write_cache(cache, k, v, offset, layer)
        s = k.shape[1]
        m = visible if mask is None else visible & mask4(mask, (b,), h, t, s, "mask", layer)
        g = h // kh
        qg = q.reshape(b, t, kh, g, hd)
        scale = core.scale if core.scale is not None else 1.0 / math.sqrt(hd)
        scores = jnp.einsum("btkgd,bskd->bkgts", qg, k.astype(q.dtype)) * scale
        scores = jnp.tanh(scores / self.softcap) * self.softcap
        m = jnp.broadcast_to(m, (b, h, t, s)).reshape(b, kh, g, t, s)
        scores = jnp.where(m, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        if train and core.dropout > 0.0:
            from purelayers.models._causal import drop

            probs = drop(probs, core.dropout, key, train)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v.astype(q.dtype)).reshape(b, t, -1)
        return out if cache is None else (out, cache)


@dataclasses.dataclass(frozen=True)
class DecoderLayer(Layer):
    r"""A decoder block. Pre-norms (``post_norms=False``, Llama, Qwen3)::

        h = x + self_attn(input_layernorm(x));  h + mlp(post_attention_layernorm(h))

    post-norms (``post_norms=True``; a norm left ``None`` is skipped: OLMo 2 has no
    input or pre-feed-forward norm, Gemma all four)::

        h = x + post_attention_layernorm(self_attn(input_layernorm(x)))
        h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))
    """

    self_attn: DecoderAttention
    mlp: Layer
    input_layernorm: Layer | None = None
    post_attention_layernorm: Layer | None = None
    pre_feedforward_layernorm: Layer | None = None
    post_feedforward_layernorm: Layer | None = None
    _: dataclasses.KW_ONLY
    post_norms: bool = False

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
        return self.self_attn.init_cache(shape, dtype)

    def _norm(self, name: str, params, x):
        return x if getattr(self, name) is None else self.call(name, params, x)

    def apply(self, params, x, *, mask=None, positions=None, cache=None, key=None, train=False):
        if isinstance(mask, Mapping):  # the model's masks by window
            mask = mask[self.self_attn.window]
        h = self._norm("input_layernorm", params, x)
        a = self.call(
            "self_attn", params, h, mask=mask, positions=positions, cache=cache, key=key,
            train=train,
        )  # fmt: skip
        a, cache = a if cache is not None else (a, None)
        if self.post_norms:
            x = x + self._norm("post_attention_layernorm", params, a)
            h = self._norm("pre_feedforward_layernorm", params, x)
            m = self.call("mlp", params, h, key=fold(key, 3), train=train)
            x = x + self._norm("post_feedforward_layernorm", params, m)
        else:
            x = x + a
            h = self._norm("post_attention_layernorm", params, x)
            x = x + self.call("mlp", params, h, key=fold(key, 3), train=train)
        return x if cache is None else (x, cache)


@dataclasses.dataclass(frozen=True)
class DecoderModel(Layer):
    """``embed_tokens``, ``layers``, ``norm`` (transformers' ``XxxModel``). ``layers``
    is a ``Repeat`` of one block where all blocks are alike, else a tuple of blocks
    (``layers.0``, ``layers.1``, ... as an ``nn.ModuleList``), each with its own window
    and rope. ``embed_scale`` (Gemma): the embeddings are multiplied by it, rounded to
    the embedding's dtype first."""

    embed_tokens: Layer
    layers: Any
    norm: Layer
    _: dataclasses.KW_ONLY
    hidden_size: int = 1
    embed_scale: float | None = None
    name: str = "DecoderModel"

    @property
    def takes_ids(self) -> bool:
        return True

    def blocks(self) -> tuple[DecoderLayer, ...]:
        if isinstance(self.layers, Repeat):
            return (self.layers.layer,)
        return tuple(self.layers)

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> Any:
        b, max_len = as_shape(shape)
        full = (b, max_len, self.hidden_size)
        if isinstance(self.layers, Repeat):
            return self.layers.init_cache(full, dtype)
        caches = {}
        for i, block in enumerate(self.layers):  # keys and values apart (each donated)
            caches[str(i)] = {
                k: jnp.zeros_like(v) for k, v in block.init_cache(full, dtype).items()
            }
        return caches

    def apply(
        self, params, input_ids, *, attention_mask=None, position_ids=None, cache=None, key=None,
        train=False,
    ):  # fmt: skip
        windows = sorted({b.self_attn.window or 0 for b in self.blocks()})
        first = windows[0] or None
        ids, positions, mask = decoder_inputs(
            self.name, input_ids, attention_mask, position_ids, cache, first
        )
        masks: Any = mask
        if len(windows) > 1:
            if cache is None:
                offset, slots = jnp.zeros((), jnp.int32), ids.shape[1]
            else:
                offset, slots = cache["0"]["length"], cache["0"]["keys"].shape[1]
            masks = {first: mask}
            for w in windows[1:]:
                masks[w] = positions_and_mask(
                    self.name, ids, attention_mask, position_ids, offset, slots, w
                )[1]
        h = self.call("embed_tokens", params, ids)
        if self.embed_scale is not None:
            h = h * jnp.asarray(self.embed_scale, jnp.float32).astype(h.dtype)
        opts = dict(mask=masks, positions=positions, train=train)
        if isinstance(self.layers, Repeat):
            out = self.call("layers", params, h, cache=cache, key=key, **opts)
            h, cache = out if cache is not None else (out, None)
        else:
            new = {}
            for i in range(len(self.layers)):
                c = None if cache is None else cache[str(i)]
                out = self.call(f"layers.{i}", params, h, cache=c, key=fold(key, i), **opts)
                h, new[str(i)] = out if cache is not None else (out, None)
            cache = None if cache is None else new
        h = self.call("norm", params, h)
        return h if cache is None else (h, cache)


def stack_blocks(blocks: Sequence[DecoderLayer]) -> Any:
    """One ``Repeat`` where every block is alike, else the tuple of blocks."""
    if all(b == blocks[0] for b in blocks):
        return Repeat(blocks[0], len(blocks))
    return tuple(blocks)


def linear(width: int, bias: bool, std: float) -> Linear:
    """A projection initialized as transformers' ``_init_weights``."""
    return Linear(width, bias=bias, weight_init=_init.normal(std=std), bias_init=_init.zeros())


def rms_norm(eps: float, gemma: bool = False) -> Layer:
    return GemmaRMSNorm(eps) if gemma else RMSNorm(eps=eps)


def embedding(c: Any) -> Embedding:
    std = _init.normal(std=c.initializer_range)
    return Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id, weight_init=std)


@dataclasses.dataclass(frozen=True)
class DenseCausalLM(CausalLM):
    """A causal LM over a ``DecoderModel`` (see ``CausalLM``); ``final_logit_softcapping``
    (Gemma) bounds the logits as ``cap * tanh(logits / cap)``."""

    base_model_prefix: ClassVar[str] = "model"
    embedding_name: ClassVar[str] = "embed_tokens.weight"
    ignore_on_load: ClassVar[tuple[str, ...]] = (r"\.rotary_emb\.",)

    def build(self) -> dict[str, Layer]:
        c = self.config
        head = Linear(c.vocab_size, bias=False, weight_init=_init.normal(std=c.initializer_range))
        return {"model": self.backbone(), "lm_head": head}

    def backbone(self) -> DecoderModel:
        raise NotImplementedError(f"{type(self).__name__}: a subclass defines backbone()")

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def apply(self, params, input_ids, **kwargs):
        """See ``CausalLM.apply``; the logits soft-capped where the config says so."""
        out = super().apply(params, input_ids, **kwargs)
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap is None:
            return out
        logits, cache = out if kwargs.get("cache") is not None else (out, None)
        logits = (jnp.tanh(logits / cap) * cap).astype(logits.dtype)
        return logits if cache is None else (logits, cache)


def dense_backbone(
    c: Any,
    *,
    windows: Sequence[int | None],
    ropes: Sequence[Any],
    qkv_bias: bool = False,
    o_bias: bool = False,
    qk_norm: str | None = None,
    norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm"),
    post_norms: bool = False,
    gemma: bool = False,
    act: str = "silu",
    scale: float | None = None,
    softcap: float | None = None,
    embed_scale: float | None = None,
) -> DecoderModel:
    """The ``DecoderModel`` of a Llama-shaped config ``c`` (``hidden_size``,
    ``num_attention_heads``, ``kv_heads``, ``dim_per_head``, ``intermediate_size``,
    ``rms_norm_eps``, ...): block ``i`` attends within ``windows[i]`` (``None``: all
    keys) with rotary embedding ``ropes[i]``. ``qk_norm``: ``"head"`` (an RMSNorm over
    each head's values), ``"width"`` (over the whole projection) or ``None``; ``norms``
    the block's norms by name; ``gemma``: ``(1 + weight)`` norms."""
    std = c.initializer_range
    hd, kv, heads = c.dim_per_head, c.kv_heads, c.num_attention_heads
    norm = rms_norm(c.rms_norm_eps, gemma)
    qn = kn = None
    if qk_norm is not None:
        qn = kn = norm
    blocks = []
    for window, rope in zip(windows, ropes, strict=True):
        core = AttentionCore(
            heads, num_kv_heads=kv, causal=True, dropout=c.attention_dropout, rope=rope,
            scale=scale,
        )  # fmt: skip
        attn = DecoderAttention(
            linear(heads * hd, qkv_bias, std),
            linear(kv * hd, qkv_bias, std),
            linear(kv * hd, qkv_bias, std),
            linear(c.hidden_size, o_bias, std),
            qn,
            kn,
            core=core,
            head_dim=hd,
            norm_per_head=qk_norm == "head",
            softcap=softcap,
            window=window,
        )
        mlp = GatedMLP(
            linear(c.intermediate_size, False, std),
            linear(c.intermediate_size, False, std),
            linear(c.hidden_size, False, std),
            act,
        )
        parts = {n: norm for n in norms}
        blocks.append(DecoderLayer(attn, mlp, **parts, post_norms=post_norms))
    return DecoderModel(
        embedding(c),
        stack_blocks(blocks),
        norm,
        hidden_size=c.hidden_size,
        embed_scale=embed_scale,
        name=type(c).__name__.replace("Config", "Model"),
    )


def qwen_windows(c: Any) -> tuple[int | None, ...]:
    """Qwen2/Qwen3's per-layer windows, as transformers' config reads them: with
    ``use_sliding_window``, ``sliding_window`` on the layers ``layer_types`` marks
    ``"sliding_attention"`` (by default those from ``max_window_layers`` on), ``None``
    (full attention) elsewhere; without it, every layer attends to all keys."""
    n = c.num_hidden_layers
    window = c.sliding_window if c.use_sliding_window else None
    types = c.layer_types
    if types is None:
        types = [
            "sliding_attention" if window is not None and i >= c.max_window_layers else "full"
            for i in range(n)
        ]
    return tuple(window if t == "sliding_attention" else None for t in types)


def check_qwen_window(c: Any) -> None:
    """``layer_types``, ``sliding_window`` and ``max_window_layers`` checked."""
    name = type(c).__name__
    if c.layer_types is not None:
        check_layer_types(name, c.layer_types, c.num_hidden_layers)
    if c.use_sliding_window and (
        isinstance(c.sliding_window, bool)
        or not isinstance(c.sliding_window, int)
        or c.sliding_window < 1
    ):
        raise ValueError(
            f"{name}: sliding_window must be a positive int with use_sliding_window=True, "
            f"got {c.sliding_window!r}"
        )
