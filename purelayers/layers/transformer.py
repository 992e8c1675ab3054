"""Transformer blocks: ``TransformerBlock``, pre-norm, GPT-2 style by default and
Llama style through ``TransformerBlock.llama(...)``."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.layers._checks import (
    LayerError,
    as_shape,
    check_choice,
    check_float,
    check_int,
    need_key,
)
from purelayers.layers.activation import gelu, silu
from purelayers.layers.core import Layer, Params
from purelayers.layers.dropout import dropout as _dropout
from purelayers.layers.linear import Linear
from purelayers.layers.multihead import MultiHeadAttention
from purelayers.layers.norm import LayerNorm, RMSNorm

__all__ = ["TransformerBlock"]

_PARTS = ("ln1", "attn", "ln2", "fc", "proj")


@dataclasses.dataclass(frozen=True)
class TransformerBlock(Layer):
    r"""A pre-norm transformer block::

        x = x + dropout(attn(ln1(x)))
        x = x + dropout(proj(act(fc(ln2(x)))))

    The defaults are GPT-2's block with torch's defaults: ``LayerNorm`` (eps ``1e-5``),
    causal multi-head self-attention (scale ``1/sqrt(head_dim)``), an MLP of width
    ``mlp_ratio * E`` with the exact (erf) GELU, biases everywhere. For ``E = 8`` and 2
    heads it has twelve parameters, 872 scalars, in this order: ``ln1.weight``,
    ``ln1.bias``, ``attn.qkv.weight``, ``attn.qkv.bias``, ``attn.out.weight``,
    ``attn.out.bias``, ``ln2.weight``, ``ln2.bias``, ``fc.weight``, ``fc.bias``,
    ``proj.weight``, ``proj.bias`` (``attn`` is a ``MultiHeadAttention``).

    Llama style (``TransformerBlock.llama(num_heads, num_kv_heads=...)``, or the options
    below): ``norm="rmsnorm"``, ``activation="swiglu"``, ``rope=True``, ``bias=False``,
    grouped-query attention. Its names are ``ln1.weight``, ``attn.qkv.weight``,
    ``attn.out.weight``, ``ln2.weight``, ``fc.weight``, ``proj.weight``, where SwiGLU's
    gate and up projections are packed into ``fc.weight`` ``(2 * hidden, E)``, gate rows
    first: ``proj(silu(gate) * up)``. From a Hugging Face Llama layer: ``ln1`` =
    ``input_layernorm``, ``ln2`` = ``post_attention_layernorm``, ``attn.qkv.weight`` =
    ``concat(q_proj, k_proj, v_proj)``, ``attn.out`` = ``o_proj``, ``fc.weight`` =
    ``concat(gate_proj, up_proj)``, ``proj`` = ``down_proj`` (HF's q/k weights use the
    same rotate-half RoPE convention).

    Args:
      num_heads: attention heads; must divide the width ``E`` (read at ``init``).
      mlp_ratio: MLP hidden width as a multiple of ``E``. Default ``4``.
      causal: causal self-attention. Default ``True``.
      dropout: dropout on the attention weights and on both residual branches, in
        train mode only (needs ``key``). Default ``0.0``.
      activation: ``"gelu"`` (exact erf), ``"gelu_tanh"``, ``"relu"`` or ``"swiglu"``.
        Default ``"gelu"``.
      norm: ``"layernorm"`` or ``"rmsnorm"``. Default ``"layernorm"``.
      norm_eps: the norms' eps. Default ``1e-5``.
      bias: biases in the linear maps and the LayerNorms. Default ``True``.
      num_kv_heads: key/value heads (grouped-query attention). Default ``None``
        (``num_heads``).
      rope: rotary position embedding on queries and keys. Default ``False``.
      rope_theta: RoPE base. Default ``10000.0``.
      hidden_dim: MLP hidden width, overriding ``mlp_ratio``. Default ``None``.

    Decoding: ``init_cache((batch, max_len, E))`` and ``apply(..., cache=cache)`` return
    ``(y, new_cache)`` as ``MultiHeadAttention`` does.

    Shape:
      input ``(batch, seq, E)`` or ``(seq, E)``; output the same.

    Parameters:
      the norms' as ``LayerNorm``/``RMSNorm`` (ones, zeros); ``attn.*`` as
      ``MultiHeadAttention`` (torch's ``nn.MultiheadAttention`` init); ``fc.*`` and
      ``proj.*`` as ``Linear`` (torch's default init).
    """

    _own_order: ClassVar[tuple[str, ...]] = ()

    num_heads: int
    _: dataclasses.KW_ONLY
    mlp_ratio: float = 4
    causal: bool = True
    dropout: float = 0.0
    activation: str = "gelu"
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    bias: bool = True
    num_kv_heads: int | None = None
    rope: bool = False
    rope_theta: float = 10000.0
    hidden_dim: int | None = None

    def __post_init__(self):
        name = "TransformerBlock"
        check_float(name, "mlp_ratio", self.mlp_ratio, low=0.0, low_open=True)
        check_float(name, "dropout", self.dropout, low=0.0, high=1.0, high_open=True)
        check_choice(name, "activation", self.activation, ("gelu", "gelu_tanh", "relu", "swiglu"))
        check_choice(name, "norm", self.norm, ("layernorm", "rmsnorm"))
        check_float(name, "norm_eps", self.norm_eps, low=0.0, low_open=True)
        if self.hidden_dim is not None:
            check_int(name, "hidden_dim", self.hidden_dim)
        try:
            self.attention  # noqa: B018  (validates num_heads / num_kv_heads now)
        except ValueError as e:
            raise ValueError(str(e).replace("MultiHeadAttention", name, 1)) from None

    @classmethod
    def llama(
        cls,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        hidden_dim: int | None = None,
        mlp_ratio: float = 8 / 3,
        rope_theta: float = 10000.0,
        norm_eps: float = 1e-5,
        causal: bool = True,
        dropout: float = 0.0,
    ) -> TransformerBlock:
        """The Llama block: RMSNorm, SwiGLU MLP, RoPE, grouped-query attention, no biases."""
        return cls(
            num_heads,
            mlp_ratio=mlp_ratio,
            causal=causal,
            dropout=dropout,
            activation="swiglu",
            norm="rmsnorm",
            norm_eps=norm_eps,
            bias=False,
            num_kv_heads=num_kv_heads,
            rope=True,
            rope_theta=rope_theta,
            hidden_dim=hidden_dim,
        )

    @property
    def attention(self) -> MultiHeadAttention:
        return MultiHeadAttention(
            self.num_heads,
            num_kv_heads=self.num_kv_heads,
            bias=self.bias,
            causal=self.causal,
            dropout=self.dropout,
            rope=self.rope,
            rope_theta=self.rope_theta,
        )

    def hidden(self, embed_dim: int) -> int:
        """The MLP's hidden width for inputs of width ``embed_dim``."""
        return self.hidden_dim or max(1, round(self.mlp_ratio * embed_dim))

    def parts(self, embed_dim: int) -> dict[str, Layer]:
        """The sub-layers, by checkpoint name and in registration order."""
        if self.norm == "layernorm":
            norm: Layer = LayerNorm(eps=self.norm_eps, bias=self.bias)
        else:
            norm = RMSNorm(eps=self.norm_eps)
        width = self.hidden(embed_dim) * (2 if self.activation == "swiglu" else 1)
        return {
            "ln1": norm,
            "attn": self.attention,
            "ln2": norm,
            "fc": Linear(width, bias=self.bias),
            "proj": Linear(embed_dim, bias=self.bias),
        }

    def children(self) -> dict[str, Layer]:
        # Names and order do not depend on the width; any width lists them.
        return self.parts(self.num_heads)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        shape = as_shape(shape)
        if len(shape) not in (2, 3):
            raise LayerError(
                "TransformerBlock", "input rank", "2 or 3 ((seq, E) or (batch, seq, E))", len(shape)
            )
        e = shape[-1]
        parts = self.parts(e)
        inputs = {"fc": (*shape[:-1], e), "proj": (*shape[:-1], self.hidden(e))}
        out: Params = {}
        for i, (name, layer) in enumerate(parts.items()):
            try:
                p = layer.init(jax.random.fold_in(key, i), inputs.get(name, shape), dtype)
            except LayerError as err:
                raise err.within("TransformerBlock", name) from None
            if p:
                out[name] = p
        return out

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
        """The attention's decoding cache for ``shape = (batch, max_len, E)``."""
        return self.attention.init_cache(shape, dtype)

    def _call(self, layer: Layer, name: str, params: Params, x: Any, **kwargs: Any) -> Any:
        try:
            return layer.apply(params.get(name, {}), x, **kwargs)
        except LayerError as err:
            raise err.within("TransformerBlock", name) from None

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
        cache: dict[str, jax.Array] | None = None,
    ):
        x = jnp.asarray(x)
        if x.ndim not in (2, 3):
            raise LayerError(
                "TransformerBlock", "input rank", "2 or 3 ((seq, E) or (batch, seq, E))", x.ndim
            )
        parts = self.parts(x.shape[-1])
        p = self.dropout if train else 0.0
        if p > 0.0:
            need_key("TransformerBlock", key)
        keys = [None if p == 0.0 else jax.random.fold_in(key, i) for i in range(3)]

        h = self._call(parts["ln1"], "ln1", params, x)
        h = self._call(
            parts["attn"], "attn", params, h, mask=mask, key=keys[0], train=train, cache=cache
        )
        if cache is not None:
            h, cache = h
        x = x + (h if p == 0.0 else _dropout(h, p, keys[1]))

        h = self._call(parts["ln2"], "ln2", params, x)
        h = self._activation(self._call(parts["fc"], "fc", params, h))
        h = self._call(parts["proj"], "proj", params, h)
        x = x + (h if p == 0.0 else _dropout(h, p, keys[2]))
        return x if cache is None else (x, cache)

    def _activation(self, h: jax.Array) -> jax.Array:
        if self.activation == "swiglu":
            gate, up = jnp.split(h, 2, axis=-1)
            return silu(gate) * up
        if self.activation == "relu":
            return jnp.where(h > 0, h, jnp.zeros_like(h))
        return gelu(h, "tanh" if self.activation == "gelu_tanh" else "none")
