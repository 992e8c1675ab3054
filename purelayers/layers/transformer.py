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
    config_error,
    need_key,
)
from purelayers.layers.activation import GELU, ReLU, SwiGLU
from purelayers.layers.core import Layer, Params
from purelayers.layers.dropout import dropout as _dropout
from purelayers.layers.linear import Linear
from purelayers.layers.multihead import MultiHeadAttention, need_embed
from purelayers.layers.norm import LayerNorm, RMSNorm

__all__ = ["TransformerBlock"]

_NORMS = ("layernorm", "rmsnorm")
_ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "swiglu")
# Each part's init key (a fold_in index), fixed by name, not by position.
_KEY_INDEX = {"ln1": 0, "attn": 1, "ln2": 2, "fc": 3, "proj": 4, "act": 5}


@dataclasses.dataclass(frozen=True)
class TransformerBlock(Layer):
    r"""A pre-norm transformer block, built from child layers::

        x = x + dropout(attn(ln1(x)))
        x = x + dropout(proj(activation(fc(ln2(x)))))

    The defaults are GPT-2's block with torch's defaults: ``LayerNorm`` (eps ``1e-5``),
    causal ``MultiHeadAttention`` (scale ``1/sqrt(head_dim)``), an MLP of width
    ``mlp_ratio * E`` with the exact (erf) ``GELU``, biases everywhere. For ``E = 8`` and
    2 heads it has twelve parameters, 872 scalars, in this order: ``ln1.weight``,
    ``ln1.bias``, ``attn.qkv.weight``, ``attn.qkv.bias``, ``attn.out.weight``,
    ``attn.out.bias``, ``ln2.weight``, ``ln2.bias``, ``fc.weight``, ``fc.bias``,
    ``proj.weight``, ``proj.bias``.

    The parts are layers: ``norm`` (a prototype used for both ``ln1`` and ``ln2``),
    ``activation`` and ``attn`` (any attention layer taking ``mask``, ``key``,
    ``train`` and ``cache``: ``MultiHeadAttention``, ``Attention``,
    ``InProjAttention``). A gated ``activation`` (``SwiGLU``, ``halves_width``) gets an
    ``fc`` of twice the hidden width, gate rows first. The activation is the child
    ``act``, between ``fc`` and ``proj``: one with parameters (``PReLU``) keeps them
    under ``act.*``. ``norm`` and ``activation`` also
    take the names ``"layernorm"``/``"rmsnorm"`` and ``"gelu"``/``"gelu_tanh"``/
    ``"relu"``/``"swiglu"``, which become those layers (with ``norm_eps`` and ``bias``).

    Llama style (``TransformerBlock.llama(num_heads, num_kv_heads=...)``): ``RMSNorm``,
    ``SwiGLU``, RoPE, grouped-query attention, no biases. Its names are ``ln1.weight``,
    ``attn.qkv.weight``, ``attn.out.weight``, ``ln2.weight``, ``fc.weight``,
    ``proj.weight``, where ``fc.weight`` ``(2 * hidden, E)`` packs the gate and up
    projections. (``purelayers.models`` composes Hugging Face's own layouts.)

    Args:
      num_heads: attention heads of the default ``MultiHeadAttention``; must divide the
        width ``E`` (read at ``init``). Not given with ``attn``.
      attn: the attention layer. Default ``None``: ``MultiHeadAttention(num_heads,
        num_kv_heads=..., bias=bias, causal=causal, dropout=dropout, rope=rope,
        rope_theta=rope_theta)``.
      norm: the norm layer (or its name). Default ``"layernorm"``.
      activation: the MLP's activation layer (or its name). Default ``"gelu"``.
      mlp_ratio: MLP hidden width as a multiple of ``E``. Default ``4``.
      hidden_dim: MLP hidden width, overriding ``mlp_ratio``. Default ``None``.
      causal: causal self-attention (default attention). Default ``True``.
      dropout: dropout on the attention weights (default attention) and on both
        residual branches, in train mode only (needs ``key``). Default ``0.0``.
      norm_eps: the eps of a norm given by name. Default ``1e-5``.
      bias: biases in ``fc``, ``proj``, the default attention and a LayerNorm given by
        name. Default ``True``.
      num_kv_heads: key/value heads of the default attention. Default ``None``.
      rope: rotary position embedding in the default attention. Default ``False``.
      rope_theta: RoPE base. Default ``10000.0``.

    Decoding: ``init_cache((batch, max_len, E))`` and ``apply(..., cache=cache)`` return
    ``(y, new_cache)`` as the attention does.

    Shape:
      input ``(batch, seq, E)`` or ``(seq, E)``; output the same.

    Parameters:
      the norms' (ones, zeros); ``attn.*`` as the attention layer's; ``fc.*`` and
      ``proj.*`` as ``Linear`` (torch's default init).

    Example:
      >>> block = TransformerBlock(4)
      >>> params = block.init(jax.random.key(0), (2, 5, 16))
      >>> block.apply(params, jnp.ones((2, 5, 16))).shape
      (2, 5, 16)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    num_heads: int | None = None
    _: dataclasses.KW_ONLY
    attn: Layer | None = None
    norm: Layer | str = "layernorm"
    activation: Layer | str = "gelu"
    mlp_ratio: float = 4
    hidden_dim: int | None = None
    causal: bool = True
    dropout: float = 0.0
    norm_eps: float = 1e-5
    bias: bool = True
    num_kv_heads: int | None = None
    rope: bool = False
    rope_theta: float = 10000.0

    def __post_init__(self):
        name = "TransformerBlock"
        check_float(name, "mlp_ratio", self.mlp_ratio, low=0.0, low_open=True)
        check_float(name, "dropout", self.dropout, low=0.0, high=1.0)
        check_float(name, "norm_eps", self.norm_eps, low=0.0, low_open=True)
        if self.hidden_dim is not None:
            check_int(name, "hidden_dim", self.hidden_dim)
        if isinstance(self.norm, str):
            check_choice(name, "norm", self.norm, _NORMS)
            norm = LayerNorm(eps=self.norm_eps, bias=self.bias)
            object.__setattr__(
                self, "norm", norm if self.norm == "layernorm" else RMSNorm(eps=self.norm_eps)
            )
        elif not isinstance(self.norm, Layer):
            raise config_error(name, "norm", f"a Layer or one of {_NORMS}", self.norm)
        if isinstance(self.activation, str):
            check_choice(name, "activation", self.activation, _ACTIVATIONS)
            acts = {"gelu": GELU(), "gelu_tanh": GELU("tanh"), "relu": ReLU(), "swiglu": SwiGLU()}
            object.__setattr__(self, "activation", acts[self.activation])
        elif not isinstance(self.activation, Layer):
            raise config_error(
                name, "activation", f"a Layer or one of {_ACTIVATIONS}", self.activation
            )
        if self.attn is None:
            if self.num_heads is None:
                raise ValueError(f"{name}: give num_heads (for the default attention) or attn")
            try:
                attn = MultiHeadAttention(
                    self.num_heads,
                    num_kv_heads=self.num_kv_heads,
                    bias=self.bias,
                    causal=self.causal,
                    dropout=self.dropout,
                    rope=self.rope,
                    rope_theta=self.rope_theta,
                )
            except ValueError as e:
                raise ValueError(str(e).replace("MultiHeadAttention", name, 1)) from None
            object.__setattr__(self, "attn", attn)
        elif not isinstance(self.attn, Layer):
            raise config_error(name, "attn", "a Layer or None", self.attn)

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
            activation=SwiGLU(),
            norm=RMSNorm(eps=norm_eps),
            bias=False,
            num_kv_heads=num_kv_heads,
            rope=True,
            rope_theta=rope_theta,
            hidden_dim=hidden_dim,
        )

    @property
    def attention(self) -> Layer:
        return self.attn

    def hidden(self, embed_dim: int) -> int:
        """The MLP's hidden width for inputs of width ``embed_dim``."""
        return self.hidden_dim or max(1, round(self.mlp_ratio * embed_dim))

    def parts(self, embed_dim: int) -> dict[str, Layer]:
        """The sub-layers, by checkpoint name and in registration order."""
        gated = getattr(self.activation, "halves_width", False)
        width = self.hidden(embed_dim) * (2 if gated else 1)
        return {
            "ln1": self.norm,
            "attn": self.attn,
            "ln2": self.norm,
            "fc": Linear(width, bias=self.bias),
            "act": self.activation,
            "proj": Linear(embed_dim, bias=self.bias),
        }

    def children(self) -> dict[str, Layer]:
        # Names and order do not depend on the width; any width lists them.
        return self.parts(1)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        shape = as_shape(shape)
        if len(shape) not in (2, 3):
            raise LayerError(
                "TransformerBlock", "input rank", "2 or 3 ((seq, E) or (batch, seq, E))", len(shape)
            )
        e = need_embed("TransformerBlock", shape)
        parts = self.parts(e)
        width = parts["fc"].out_features
        inputs = {"fc": (*shape[:-1], e), "act": (*shape[:-1], width)}
        inputs["proj"] = (*shape[:-1], self.hidden(e))
        out: Params = {}
        for name, layer in parts.items():
            try:
                p = layer.init(
                    jax.random.fold_in(key, _KEY_INDEX[name]), inputs.get(name, shape), dtype
                )
            except LayerError as err:
                raise err.within("TransformerBlock", name) from None
            if p:
                out[name] = p
        return out

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
        """The attention's decoding cache for ``shape = (batch, max_len, E)``."""
        return self.attn.init_cache(shape, dtype)

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
        p = self.dropout if train else 0.0
        if p > 0.0:
            need_key("TransformerBlock", key)
        keys = [None if p == 0.0 else jax.random.fold_in(key, i) for i in range(3)]
        extra = {} if cache is None else {"cache": cache}

        h = self.call("ln1", params, x)
        h = self.call("attn", params, h, mask=mask, key=keys[0], train=train, **extra)
        if cache is not None:
            h, cache = h
        x = x + (h if p == 0.0 else _dropout(h, p, keys[1]))

        h = self.call("ln2", params, x)
        h = self.call("act", params, self.call("fc", params, h))
        h = self.call("proj", params, h)
        x = x + (h if p == 0.0 else _dropout(h, p, keys[2]))
        return x if cache is None else (x, cache)
