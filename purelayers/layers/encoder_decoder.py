"""torch's transformer layers: ``TransformerEncoderLayer`` and ``TransformerDecoderLayer``,
under torch's names, arguments, layouts and mask conventions, built on
``InProjAttention`` (their stacks, ``TransformerEncoder``, ``TransformerDecoder`` and
``Transformer``, are in ``encoder_decoder_stack``).

Masks, as torch reads them: a boolean ``attn_mask`` (``src_mask``, ``tgt_mask``,
``memory_mask``) is ``True`` where attention is *not* allowed, a floating-point one is
added to the scores; it is ``(L, S)`` or ``(N * nhead, L, S)``. A key padding mask is
``(N, S)``, boolean ``True`` at padding (or floating point, added). Both become one
additive mask for the attention.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.layers import attention as _tm
from purelayers.layers._checks import (
    LayerError,
    as_shape,
    check_float,
    check_int,
    config_error,
    dtype_kind,
)
from purelayers.layers.activation import GELU, ReLU
from purelayers.layers.core import Lambda, Layer, Params
from purelayers.layers.dropout import dropout as _dropout
from purelayers.layers.linear import Linear
from purelayers.layers.multihead import InProjAttention
from purelayers.layers.norm import LayerNorm

__all__ = ["TransformerDecoderLayer", "TransformerEncoderLayer"]


# -- the layers --------------------------------------------------------------------------


def _activation(act: Any) -> Layer:
    if isinstance(act, Layer):
        return act
    if act == "relu":
        return ReLU()
    return GELU() if act == "gelu" else Lambda(act)


def _init_parts(layer: str, parts: dict[str, Layer], key: jax.Array, shapes: dict, dtype: Any):
    """Each part's params (those with arrays), ``fold_in(key, i)`` for the ``i``-th part."""
    params: Params = {}
    for i, (name, part) in enumerate(parts.items()):
        try:
            p = part.init(jax.random.fold_in(key, i), shapes[name], dtype)
        except LayerError as e:
            raise e.within(layer, name) from None
        if jax.tree.leaves(p):
            params[name] = p
    return params


@dataclasses.dataclass(frozen=True)
class _Block(Layer):
    """Shared by the encoder and decoder layers: torch's arguments, the feed-forward
    block and the residual wiring."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)
    attentions: ClassVar[tuple[str, ...]] = ("self_attn",)

    nhead: int
    dim_feedforward: int = 2048
    dropout: float = 0.1
    activation: str | Layer | Callable[[Any], Any] = "relu"
    layer_norm_eps: float = 1e-5
    batch_first: bool = False
    norm_first: bool = False
    bias: bool = True

    def __post_init__(self):
        name = type(self).__name__
        check_int(name, "nhead", self.nhead)
        check_int(name, "dim_feedforward", self.dim_feedforward)
        check_float(name, "dropout", self.dropout, low=0.0, high=1.0)
        check_float(name, "layer_norm_eps", self.layer_norm_eps, low=0.0, low_open=True)
        act = self.activation
        named = isinstance(act, str) and act in ("relu", "gelu")
        if not (named or isinstance(act, Layer) or callable(act)):
            raise config_error(name, "activation", '"relu", "gelu", a Layer or a callable', act)

    def _parts(self, e: int) -> dict[str, Layer]:
        attn = InProjAttention(self.nhead, self.dropout, self.bias, batch_first=True)
        parts: dict[str, Layer] = dict.fromkeys(self.attentions, attn)
        parts["linear1"] = Linear(self.dim_feedforward, bias=self.bias)
        parts["linear2"] = Linear(max(e, 1), bias=self.bias)
        for i in range(len(self.attentions) + 1):
            parts[f"norm{i + 1}"] = LayerNorm(eps=self.layer_norm_eps, bias=self.bias)
        parts["activation"] = _activation(self.activation)
        return parts

    def children(self) -> dict[str, Layer]:
        return self._parts(0)  # names and order do not depend on the width

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        shape = as_shape(shape)
        e = shape[-1] if shape else 0
        parts = self._parts(e)
        shapes = dict.fromkeys(parts, shape)
        shapes["linear2"] = shapes["activation"] = (*shape[:-1], self.dim_feedforward)
        return _init_parts(type(self).__name__, parts, key, shapes, dtype)

    def _drop(self, x: jax.Array, key: jax.Array | None, i: int, train: bool) -> jax.Array:
        if not train or self.dropout == 0.0:
            return x
        k = None if key is None else jax.random.fold_in(key, i)
        return _dropout(x, self.dropout, k, layer=type(self).__name__)

    def _attend(self, name, params, x, mem, mask, key, train, i):
        k = None if key is None else jax.random.fold_in(key, i)
        ctx = {} if mem is None else {"context": mem}
        y = self.call(name, params, x, mask=mask, key=k, train=train, **ctx)
        return self._drop(y, key, i + 10, train)

    def _ff(self, params: Params, x: jax.Array, key: jax.Array | None, train: bool):
        h = self.call("activation", params, self.call("linear1", params, x))
        y = self.call("linear2", params, self._drop(h, key, 20, train))
        return self._drop(y, key, 21, train)

    def _run(self, params, x, sublayers):
        """The residual wiring of ``sublayers`` (functions of the normed input), each
        with its norm: post-norm, or pre-norm with ``norm_first``."""
        for i, sub in enumerate(sublayers):
            norm = f"norm{i + 1}"
            if self.norm_first:
                x = x + sub(self.call(norm, params, x))
            else:
                x = self.call(norm, params, x + sub(x))
        return x


@dataclasses.dataclass(frozen=True)
class TransformerEncoderLayer(_Block):
    r"""Self-attention and a feed-forward block, each in a residual with a
    ``LayerNorm``::

        x = norm1(x + dropout1(self_attn(x)))               # norm_first=False
        x = norm2(x + dropout2(linear2(dropout(activation(linear1(x))))))

    (``norm_first=True``: ``x = x + sublayer(norm_i(x))`` for each.) ``d_model`` ``E``
    is the input's last axis. Matches
    ``torch.nn.TransformerEncoderLayer(E, nhead, ...)`` in eval mode (and its fast path).

    Args:
      nhead: attention heads; must divide ``E``.
      dim_feedforward: ``linear1``'s width. Default ``2048``.
      dropout: on the attention weights and the three dropouts above, in train mode
        (needs ``key``). Default ``0.1``.
      activation: ``"relu"``, ``"gelu"`` (exact), a layer (its params, if any, under
        ``activation``) or a function. Default ``"relu"``.
      layer_norm_eps: the norms' eps. Default ``1e-5``.
      batch_first: inputs are ``(N, S, E)``; else ``(S, N, E)``. Default ``False``.
      norm_first: pre-norm. Default ``False``.
      bias: biases in the attention, linears and norms. Default ``True``.

    ``apply(params, src, src_mask=None, src_key_padding_mask=None, is_causal=False)``:
    masks as torch reads them (module docstring). ``is_causal`` is torch's hint that
    ``src_mask`` is causal: it needs ``src_mask``; without a key padding mask the
    attention is then causal and the mask unread, as in torch.

    Shape:
      ``src`` ``(S, N, E)``, ``(N, S, E)`` with ``batch_first`` or ``(S, E)``; output the
      same.

    Parameters:
      ``self_attn.in_proj_weight`` ``(3E, E)``, ``self_attn.in_proj_bias``,
      ``self_attn.out_proj.*`` (``InProjAttention``), ``linear1.*`` ``(F, E)``,
      ``linear2.*`` ``(E, F)`` (``Linear``), ``norm1.*``, ``norm2.*`` (ones, zeros).

    Example:
      >>> layer = TransformerEncoderLayer(2, dim_feedforward=16)
      >>> params = layer.init(jax.random.key(0), (5, 3, 8))
      >>> layer.apply(params, jnp.ones((5, 3, 8))).shape
      (5, 3, 8)
    """

    def apply(
        self,
        params: Params,
        src: Any,
        src_mask: Any = None,
        src_key_padding_mask: Any = None,
        is_causal: bool = False,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        name = type(self).__name__
        x = _tm.batch_first_layout(name, src, self.batch_first)
        names = ("src_mask", "src_key_padding_mask", "is_causal")
        m = _tm.torch_mask(
            name, names, x, x.shape[-2], self.nhead, src_mask, src_key_padding_mask, is_causal
        )

        def sa(h):
            return self._attend("self_attn", params, h, None, m, key, train, 0)

        y = self._run(params, x, (sa, lambda h: self._ff(params, h, key, train)))
        return _tm.restore_layout(y, self.batch_first)


@dataclasses.dataclass(frozen=True)
class TransformerDecoderLayer(_Block):
    r"""Self-attention, cross-attention to ``memory`` and a feed-forward block, each in
    a residual with a ``LayerNorm``::

        x = norm1(x + dropout1(self_attn(x)))               # norm_first=False
        x = norm2(x + dropout2(multihead_attn(x, memory)))
        x = norm3(x + dropout3(linear2(dropout(activation(linear1(x))))))

    (``norm_first=True``: ``x = x + sublayer(norm_i(x))`` for each.) Matches
    ``torch.nn.TransformerDecoderLayer(E, nhead, ...)``; the arguments are
    ``TransformerEncoderLayer``'s. ``init(key, tgt.shape)``; ``memory`` must have the
    same width ``E`` and batch.

    ``apply(params, tgt, memory, tgt_mask=None, memory_mask=None,
    tgt_key_padding_mask=None, memory_key_padding_mask=None, tgt_is_causal=False,
    memory_is_causal=False)``: masks as torch reads them, ``tgt_mask`` ``(T, T)``,
    ``memory_mask`` ``(T, S)``; the ``*_is_causal`` hints as in
    ``TransformerEncoderLayer``.

    Args:
      nhead: attention heads (both attentions).
      dim_feedforward: the feed-forward width. Default ``2048``.
      dropout: after each sublayer and inside the feed-forward block. Default ``0.1``.
      activation: ``"relu"``, ``"gelu"``, a layer or a function. Default ``"relu"``.
      layer_norm_eps: the norms' epsilon. Default ``1e-5``.
      batch_first: inputs ``(N, T, E)`` instead of ``(T, N, E)``. Default ``False``.
      norm_first: pre-norm residuals. Default ``False``.
      bias: biases in the projections and norms. Default ``True``.

    Shape:
      ``tgt`` ``(T, N, E)`` (``(N, T, E)`` with ``batch_first``, or ``(T, E)``),
      ``memory`` ``(S, N, E)`` likewise; output like ``tgt``.

    Parameters:
      ``self_attn.*``, ``multihead_attn.*`` (``InProjAttention``), ``linear1.*``,
      ``linear2.*``, ``norm1.*``, ``norm2.*``, ``norm3.*``.

    Example:
      >>> layer = TransformerDecoderLayer(2, dim_feedforward=16)
      >>> params = layer.init(jax.random.key(0), (4, 3, 8))
      >>> layer.apply(params, jnp.ones((4, 3, 8)), jnp.ones((6, 3, 8))).shape
      (4, 3, 8)
    """

    attentions: ClassVar[tuple[str, ...]] = ("self_attn", "multihead_attn")

    def apply(
        self,
        params: Params,
        tgt: Any,
        memory: Any,
        tgt_mask: Any = None,
        memory_mask: Any = None,
        tgt_key_padding_mask: Any = None,
        memory_key_padding_mask: Any = None,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        name = type(self).__name__
        x = _tm.batch_first_layout(name, tgt, self.batch_first)
        mem = _tm.batch_first_layout(name, memory, self.batch_first)
        if dtype_kind(mem) != "floating":
            raise LayerError(
                name,
                "memory dtype",
                "floating point",
                str(jnp.result_type(mem)),
                "the encoder's output, as torch's decoder layer takes it",
            )
        e = x.shape[-1]
        if mem.ndim != x.ndim or mem.shape[-1] != e or (x.ndim == 3 and mem.shape[0] != x.shape[0]):
            want = f"width {e}" + (f" and batch {x.shape[0]}" if x.ndim == 3 else "")
            raise LayerError(
                name,
                f"memory (the encoder's output) must have tgt's rank, {want};",
                None,
                None,
                f"tgt.shape == {tuple(jnp.shape(tgt))}, memory.shape == {tuple(jnp.shape(memory))}",
            )
        t, s = x.shape[-2], mem.shape[-2]
        tm = _tm.torch_mask(
            name, ("tgt_mask", "tgt_key_padding_mask", "tgt_is_causal"), x, t, self.nhead,
            tgt_mask, tgt_key_padding_mask, tgt_is_causal,
        )  # fmt: skip
        mm = _tm.torch_mask(
            name, ("memory_mask", "memory_key_padding_mask", "memory_is_causal"), x, s,
            self.nhead, memory_mask, memory_key_padding_mask, memory_is_causal,
        )  # fmt: skip
        subs = (
            lambda h: self._attend("self_attn", params, h, None, tm, key, train, 0),
            lambda h: self._attend("multihead_attn", params, h, mem, mm, key, train, 1),
            lambda h: self._ff(params, h, key, train),
        )
        return _tm.restore_layout(self._run(params, x, subs), self.batch_first)
