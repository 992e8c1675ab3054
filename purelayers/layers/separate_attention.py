"""``Attention``: separate ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj`` around one
``AttentionCore``, as Hugging Face's Llama, Mistral and Qwen2 name them (the packed
layouts are in ``multihead``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from purelayers.layers._checks import LayerError, as_shape, check_int, config_error, fold
from purelayers.layers.attention import AttentionCore, RotaryEmbedding
from purelayers.layers.core import Layer, Params
from purelayers.layers.linear import Linear
from purelayers.layers.multihead import _Projected, need_embed

__all__ = ["Attention"]

# The keys the projections of ``Attention`` get (``fold_in`` of the call's key), apart
# from the attention dropout's own (the key itself).
_PROJ_KEYS = {"q_proj": 101, "k_proj": 102, "v_proj": 103, "o_proj": 104}


@dataclasses.dataclass(frozen=True)
class Attention(_Projected):
    r"""Attention with separate projections, as Hugging Face's Llama, Mistral and Qwen2
    name them: ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (any layers; ``Linear``\ s
    with or without bias each) around ``core``, an ``AttentionCore``::

        y = o_proj(core(q_proj(x), k_proj(x), v_proj(x)))

    ``Attention.build(embed_dim, num_heads, ...)`` makes the usual ``Linear``
    projections: ``head_dim`` need not be ``embed_dim / num_heads`` (a config's
    ``head_dim``), ``bias`` switches q/k/v biases (Qwen2 has them) and ``out_bias``
    ``o_proj``'s.

    Cross-attention: ``apply(params, x, context=c)`` projects keys and values from
    ``c``. Masks, ``positions`` (per-row positions for ``core.rope``) and the cache
    (``init_cache((batch, max_len, E))``) are ``AttentionCore``'s.

    Shape:
      ``x`` ``(batch, seq, E)`` or ``(seq, E)``; output ``(…, o_proj's width)``.

    Parameters:
      the projections', under their field names, in the order q, k, v, o.

    Args:
      q_proj: the query projection (any layer; ``Attention.build`` makes ``Linear``\ s).
      k_proj: the key projection.
      v_proj: the value projection.
      o_proj: the output projection.
      core: the ``AttentionCore`` between them (heads, masks, rotary positions, cache).

    Example:
      >>> attn = Attention.build(16, 4, causal=True)
      >>> params = attn.init(jax.random.key(0), (2, 5, 16))
      >>> list(params)
      ['q_proj', 'k_proj', 'v_proj', 'o_proj']
    """

    q_proj: Layer
    k_proj: Layer
    v_proj: Layer
    o_proj: Layer
    core: AttentionCore

    def __post_init__(self):
        for f in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if not isinstance(getattr(self, f), Layer):
                raise config_error("Attention", f, "a Layer", getattr(self, f))
        if not isinstance(self.core, AttentionCore):
            raise config_error("Attention", "core", "an AttentionCore", self.core)

    @classmethod
    def build(
        cls,
        embed_dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = False,
        out_bias: bool | None = None,
        causal: bool = False,
        dropout: float = 0.0,
        rope: bool | RotaryEmbedding | None = None,
        scale: float | None = None,
    ) -> Attention:
        """``Linear`` projections for width ``embed_dim``; ``head_dim`` defaults to
        ``embed_dim // num_heads``; ``out_bias`` defaults to ``bias``; ``rope``: a
        ``RotaryEmbedding``, ``True`` for ``RotaryEmbedding()`` (as
        ``MultiHeadAttention(rope=True)``), ``None`` or ``False`` for none."""
        if rope is True:
            rope = RotaryEmbedding()
        elif rope is False:
            rope = None
        core = AttentionCore(
            num_heads,
            num_kv_heads=num_kv_heads,
            causal=causal,
            dropout=dropout,
            rope=rope,
            scale=scale,
        )
        check_int("Attention.build", "embed_dim", embed_dim)
        if head_dim is not None:
            check_int("Attention.build", "head_dim", head_dim)
        hd = embed_dim // num_heads if head_dim is None else head_dim
        if hd < 1:
            raise config_error(
                "Attention.build",
                "head_dim",
                f"a positive int (embed_dim // num_heads is {hd})",
                head_dim,
            )
        q, kv = num_heads * hd, core.kv_heads * hd
        o_bias = bias if out_bias is None else out_bias
        return cls(
            Linear(q, bias=bias),
            Linear(kv, bias=bias),
            Linear(kv, bias=bias),
            Linear(embed_dim, bias=o_bias),
            core,
        )

    def _widths(self, spec: jax.ShapeDtypeStruct) -> tuple[int, int]:
        """``head_dim`` and ``v_dim``, from the projections' output shapes."""

        def width(layer: Layer) -> int:
            return jax.eval_shape(
                lambda k, x: layer.apply(layer.init(k, spec, spec.dtype), x),
                jax.random.key(0),
                spec,
            ).shape[-1]

        return width(self.k_proj) // self.core.kv_heads, width(self.v_proj) // self.core.kv_heads

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        shape = as_shape(shape)
        if shape:
            need_embed("Attention", shape)
        params: Params = {}
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
            params[name] = getattr(self, name).init(jax.random.fold_in(key, i), shape, dtype)
        _, v_dim = self._widths(jax.ShapeDtypeStruct(shape, dtype))
        o_in = (*shape[:-1], self.core.num_heads * v_dim)
        params["o_proj"] = self.o_proj.init(jax.random.fold_in(key, 3), o_in, dtype)
        return params

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
        """An empty decoding cache for ``shape = (batch, max_len, embed_dim)``."""
        shape = as_shape(shape)
        if len(shape) != 3:
            raise LayerError("Attention", "init_cache shape", "(batch, max_len, embed_dim)", shape)
        hd, v_dim = self._widths(jax.ShapeDtypeStruct((1, 1, shape[2]), dtype))
        return self.core.init_cache(shape[:2], hd, dtype, v_dim=v_dim)

    def _qkv(
        self, params: Params, x: jax.Array, context: Any, cache: Any, *, key=None, train=False
    ) -> tuple:
        """The projections, each given its own key and ``train`` (a LoRA adapter's
        dropout on a projection's input draws from it)."""
        kv = x if context is None else jnp.asarray(context)
        q, k, v = (
            self.call(name, params, a, key=fold(key, _PROJ_KEYS[name]), train=train)
            for name, a in (("q_proj", x), ("k_proj", kv), ("v_proj", kv))
        )
        return q, k, v

    def _project_out(self, params: Params, y: jax.Array, *, key=None, train=False) -> jax.Array:
        return self.call("o_proj", params, y, key=fold(key, _PROJ_KEYS["o_proj"]), train=train)
