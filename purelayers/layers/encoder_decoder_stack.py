"""torch's transformer stacks: ``TransformerEncoder``, ``TransformerDecoder`` (copies of
one encoder or decoder layer, under torch's ``layers.{i}.`` names, with an optional final
norm) and ``Transformer`` (an encoder and a decoder stack), under torch's names,
arguments and mask conventions (``encoder_decoder``'s docstring); the layers themselves
are in ``encoder_decoder``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers import init as _init
from purelayers.layers import attention as _tm
from purelayers.layers._checks import (
    LayerError,
    as_shape,
    check_float,
    check_int,
    check_shape,
    config_error,
)
from purelayers.layers.core import Layer, Params, Sequential, apply_child
from purelayers.layers.encoder_decoder import TransformerDecoderLayer, TransformerEncoderLayer
from purelayers.layers.norm import LayerNorm

__all__ = ["Transformer", "TransformerDecoder", "TransformerEncoder"]


# -- the stacks --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Stack(Layer):
    """``num_layers`` copies of ``layer`` (``layers.0``, ...), then ``norm``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    def _check(self, layer: Any, kind: type, arg: str) -> None:
        name = type(self).__name__
        if not isinstance(layer, Layer):
            raise config_error(name, arg, f"a Layer (a {kind.__name__})", layer)
        check_int(name, "num_layers", self.num_layers, minimum=0)
        if self.norm is not None and not isinstance(self.norm, Layer):
            raise config_error(name, "norm", "a Layer or None", self.norm)

    _field: ClassVar[str] = "encoder_layer"

    def _layer(self) -> Layer:
        return getattr(self, self._field)

    def children(self) -> dict[str, Layer]:
        out: dict[str, Layer] = {"layers": Sequential(*[self._layer()] * self.num_layers)}
        return out if self.norm is None else {**out, "norm": self.norm}

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        # torch deep-copies one layer: every copy starts with the same weights
        one = self._layer().init(jax.random.fold_in(key, 0), shape, dtype)
        params: Params = {"layers": {str(i): one for i in range(self.num_layers)}}
        if self.norm is not None:
            params["norm"] = self.norm.init(jax.random.fold_in(key, 1), shape, dtype)
        return params

    def _stacked(self, params, x, args, key, train):
        layers = params.get("layers", {})
        for i in range(self.num_layers):
            k = None if key is None else jax.random.fold_in(key, i)
            x = apply_child(
                self, f"layers.{i}", self._layer(), layers.get(str(i), {}), x, *args,
                key=k, train=train,
            )  # fmt: skip
        return x if self.norm is None else self.call("norm", params, x)


@dataclasses.dataclass(frozen=True)
class TransformerEncoder(_Stack):
    r"""``num_layers`` copies of ``encoder_layer`` applied in turn, then ``norm``.
    Matches ``torch.nn.TransformerEncoder(encoder_layer, num_layers, norm)``.

    As torch deep-copies ``encoder_layer``, every copy is initialized with the same
    weights. ``apply(params, src, mask=None, src_key_padding_mask=None,
    is_causal=None)`` passes the masks to every layer; ``is_causal=None`` (torch detects
    a causal ``mask``, which changes no result) is ``False``. Padded positions are
    computed as on torch's regular path (torch's nested-tensor fast path, in eval mode
    without gradients, returns zeros there).

    Args:
      encoder_layer: the layer to repeat (a ``TransformerEncoderLayer``).
      num_layers: how many copies. Default: required.
      norm: applied to the output, or ``None``. Default ``None``.
      enable_nested_tensor: torch's switch for its nested-tensor fast path, taken only
        without gradients; accepted and changes nothing here (the regular path's results
        above). Default ``True``.
      mask_check: torch's check that a padding mask suits that fast path; accepted and
        changes nothing here. Default ``True``.

    Shape: as ``encoder_layer``'s. Parameters: ``layers.0.*``, ``layers.1.*``, ... (each
    the layer's), then ``norm.*``.

    Example:
      >>> enc = TransformerEncoder(TransformerEncoderLayer(2, 16), 2, norm=L.LayerNorm())
      >>> list(pl.params.flatten(enc.init(jax.random.key(0), (5, 3, 8))))[-2:]
      ['norm.weight', 'norm.bias']
    """

    encoder_layer: Layer
    num_layers: int
    norm: Layer | None = None
    enable_nested_tensor: bool = True
    mask_check: bool = True

    def __post_init__(self):
        self._check(self.encoder_layer, TransformerEncoderLayer, "encoder_layer")

    def apply(
        self,
        params: Params,
        src: Any,
        mask: Any = None,
        src_key_padding_mask: Any = None,
        is_causal: bool | None = None,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        args = (mask, src_key_padding_mask, bool(is_causal))
        return self._stacked(params, src, args, key, train)


@dataclasses.dataclass(frozen=True)
class TransformerDecoder(_Stack):
    r"""``num_layers`` copies of ``decoder_layer`` applied in turn (each attending to
    ``memory``), then ``norm``. Matches ``torch.nn.TransformerDecoder(decoder_layer,
    num_layers, norm)``; every copy starts with the same weights, as torch's deep copies.

    ``apply(params, tgt, memory, tgt_mask=None, memory_mask=None,
    tgt_key_padding_mask=None, memory_key_padding_mask=None, tgt_is_causal=None,
    memory_is_causal=False)``: passed to every layer (``tgt_is_causal=None`` is
    ``False``: torch's detection changes no result). ``init(key, tgt.shape)``.

    Args:
      decoder_layer: the layer copied ``num_layers`` times (a ``TransformerDecoderLayer``).
      num_layers: how many copies. ``norm``: a layer applied last, or ``None``.

    Shape:
      ``tgt`` and ``memory`` as ``decoder_layer`` takes them; output like ``tgt``.

    Parameters:
      ``layers.0.*``, ``layers.1.*``, ... (``decoder_layer``'s), then ``norm.*``.

    Example:
      >>> dec = TransformerDecoder(TransformerDecoderLayer(2, 16), 1)
      >>> params = dec.init(jax.random.key(0), (4, 3, 8))
      >>> dec.apply(params, jnp.ones((4, 3, 8)), jnp.ones((6, 3, 8))).shape
      (4, 3, 8)
    """

    decoder_layer: Layer
    num_layers: int
    norm: Layer | None = None

    def __post_init__(self):
        self._check(self.decoder_layer, TransformerDecoderLayer, "decoder_layer")

    _field: ClassVar[str] = "decoder_layer"

    def apply(
        self,
        params: Params,
        tgt: Any,
        memory: Any,
        tgt_mask: Any = None,
        memory_mask: Any = None,
        tgt_key_padding_mask: Any = None,
        memory_key_padding_mask: Any = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        args = (
            memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
            bool(tgt_is_causal), memory_is_causal,
        )  # fmt: skip
        return self._stacked(params, tgt, args, key, train)


def _pair_init(fn: Callable[..., Any]) -> Callable[..., Any]:
    """An ``init`` that checks its shape (one, or a pair) itself."""
    fn.unchecked = fn  # type: ignore[attr-defined]
    return fn


@dataclasses.dataclass(frozen=True)
class Transformer(Layer):
    r"""torch's encoder-decoder transformer: ``encoder`` (a ``TransformerEncoder`` of
    ``num_encoder_layers`` layers and a final ``LayerNorm``) reads ``src``; ``decoder``
    (``num_decoder_layers`` decoder layers and a ``LayerNorm``) reads ``tgt`` and the
    encoder's output. Matches ``torch.nn.Transformer(d_model=E, ...)``, ``E`` the
    inputs' width; every weight of two or more axes is initialized xavier-uniform (and
    the copies differ), as torch's ``_reset_parameters`` does.

    Args:
      nhead: attention heads. Default ``8``.
      num_encoder_layers: encoder layers. Default ``6``.
      num_decoder_layers: decoder layers. Default ``6``.
      dim_feedforward: as ``TransformerEncoderLayer``'s. Default ``2048``.
      dropout: as ``TransformerEncoderLayer``'s. Default ``0.1``.
      activation: as ``TransformerEncoderLayer``'s. Default ``"relu"``.
      custom_encoder: a layer used instead of the encoder stack (called as it is).
        Default ``None``.
      custom_decoder: a layer used instead of the decoder stack (called as it is).
        Default ``None``.
      layer_norm_eps: as ``TransformerEncoderLayer``'s. Default ``1e-5``.
      batch_first: as ``TransformerEncoderLayer``'s. Default ``False``.
      norm_first: as ``TransformerEncoderLayer``'s. Default ``False``.
      bias: as ``TransformerEncoderLayer``'s. Default ``True``.

    ``init(key, src.shape)`` or ``init(key, (src.shape, tgt.shape))`` (widths must
    agree). ``apply(params, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
    src_key_padding_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
    memory_is_causal=False)``: masks as torch reads them (module docstring).
    ``Transformer.generate_square_subsequent_mask(sz)`` is torch's causal float mask.

    Shape:
      ``src`` ``(S, N, E)``, ``tgt`` ``(T, N, E)`` (batch first with ``batch_first``;
      or unbatched); output like ``tgt``.

    Parameters:
      ``encoder.layers.{i}.*``, ``encoder.norm.*``, ``decoder.layers.{i}.*``,
      ``decoder.norm.*``.

    Example:
      >>> Transformer.generate_square_subsequent_mask(3)
      Array([[  0., -inf, -inf],
             [  0.,   0., -inf],
             [  0.,   0.,   0.]], dtype=float32)
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    nhead: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    dim_feedforward: int = 2048
    dropout: float = 0.1
    activation: str | Layer | Callable[[Any], Any] = "relu"
    custom_encoder: Layer | None = None
    custom_decoder: Layer | None = None
    layer_norm_eps: float = 1e-5
    batch_first: bool = False
    norm_first: bool = False
    bias: bool = True

    def __post_init__(self):
        for arg in ("custom_encoder", "custom_decoder"):
            if getattr(self, arg) is not None and not isinstance(getattr(self, arg), Layer):
                raise config_error("Transformer", arg, "a Layer or None", getattr(self, arg))
        # the arguments the inner layers know by other names (num_layers, eps)
        check_int("Transformer", "num_encoder_layers", self.num_encoder_layers, minimum=0)
        check_int("Transformer", "num_decoder_layers", self.num_decoder_layers, minimum=0)
        check_float("Transformer", "layer_norm_eps", self.layer_norm_eps, low=0.0, low_open=True)
        try:
            self.children()
        except ValueError as e:
            message = str(e).split(": ", 1)[1]
            raise ValueError(f"Transformer: {message}") from None

    @staticmethod
    def generate_square_subsequent_mask(sz: int, dtype: Any = jnp.float32) -> jax.Array:
        """``(sz, sz)``: ``-inf`` above the diagonal, ``0`` elsewhere (torch's)."""
        check_int("Transformer.generate_square_subsequent_mask", "sz", sz, minimum=0)
        return _tm.square_mask(sz, sz, dtype)

    def children(self) -> dict[str, Layer]:
        args = (self.nhead, self.dim_feedforward, self.dropout, self.activation)
        kw = dict(layer_norm_eps=self.layer_norm_eps, batch_first=self.batch_first,
                  norm_first=self.norm_first, bias=self.bias)  # fmt: skip
        norm = LayerNorm(eps=self.layer_norm_eps, bias=self.bias)
        encoder, decoder = self.custom_encoder, self.custom_decoder
        if encoder is None:
            layer = TransformerEncoderLayer(*args, **kw)
            encoder = TransformerEncoder(layer, self.num_encoder_layers, norm)
        if decoder is None:
            layer = TransformerDecoderLayer(*args, **kw)
            decoder = TransformerDecoder(layer, self.num_decoder_layers, norm)
        return {"encoder": encoder, "decoder": decoder}

    @_pair_init
    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        pair = isinstance(shape, (tuple, list)) and len(shape) == 2
        pair = pair and all(isinstance(s, (tuple, list)) or hasattr(s, "shape") for s in shape)
        for s in shape if pair else (shape,):
            check_shape("Transformer", s)
        src, tgt = (as_shape(shape[0]), as_shape(shape[1])) if pair else (as_shape(shape),) * 2
        if not src or not tgt or src[-1] != tgt[-1]:
            raise LayerError("Transformer", "tgt width (d_model)", src[-1:], tgt[-1:])
        kids = self.children()
        params = {
            "encoder": kids["encoder"].init(jax.random.fold_in(key, 0), src, dtype),
            "decoder": kids["decoder"].init(jax.random.fold_in(key, 1), tgt, dtype),
        }
        flat, tree = jax.tree.flatten(params)
        xavier = _init.xavier_uniform()
        flat = [
            xavier(jax.random.fold_in(key, 2 + i), a.shape, a.dtype) if a.ndim > 1 else a
            for i, a in enumerate(flat)
        ]
        # the flattening sorted the keys: back to torch's registration order
        return self.ordered(jax.tree.unflatten(tree, flat))

    def apply(
        self,
        params: Params,
        src: Any,
        tgt: Any,
        src_mask: Any = None,
        tgt_mask: Any = None,
        memory_mask: Any = None,
        src_key_padding_mask: Any = None,
        tgt_key_padding_mask: Any = None,
        memory_key_padding_mask: Any = None,
        src_is_causal: bool | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        src, tgt = jnp.asarray(src), jnp.asarray(tgt)
        batch_axis = 0 if self.batch_first else 1
        if (
            src.ndim != tgt.ndim
            or src.shape[-1:] != tgt.shape[-1:]
            or (src.ndim == 3 and src.shape[batch_axis] != tgt.shape[batch_axis])
        ):
            raise LayerError(
                "Transformer",
                "src and tgt must agree in rank, batch and width (d_model);",
                None,
                None,
                f"src.shape == {src.shape}, tgt.shape == {tgt.shape}",
            )
        k = (
            (None, None)
            if key is None
            else (jax.random.fold_in(key, 0), jax.random.fold_in(key, 1))
        )
        memory = self.call(
            "encoder", params, src, src_mask, src_key_padding_mask, src_is_causal,
            key=k[0], train=train,
        )  # fmt: skip
        return self.call(
            "decoder", params, tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
            memory_key_padding_mask, tgt_is_causal, memory_is_causal, key=k[1], train=train,
        )  # fmt: skip
