"""Registry cases and error-catalog entries: transformers."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from purelayers import layers as L
from purelayers.layers.errors import LayerError
from tests.case import Case

KEY = jax.random.key(0)


def _run(layer, shape, *xs, init_shape=None, **kwargs):
    """``init`` for ``init_shape`` (default ``shape``), then ``apply`` to ones of ``shape``
    and of the shapes ``xs``, traced only (nothing compiles)."""

    def go():
        inputs = [jnp.ones(s) for s in (shape, *xs)]
        params = layer.init(KEY, shape if init_shape is None else init_shape)
        return layer.apply(params, *inputs, **kwargs)

    return jax.eval_shape(go)


def _complex_memory(layer):
    params = layer.init(KEY, (3, 2, 8))
    return jax.eval_shape(
        lambda: layer.apply(params, jnp.ones((3, 2, 8)), jnp.ones((4, 2, 8), jnp.complex64))
    )


def _mha_weights(layer, **kwargs):
    return _run(layer, (1, 3, 4), need_weights=True, **kwargs)


def _enc(**kw):
    return L.TransformerEncoderLayer(2, 16, 0.0, **kw)


def _refusing(call):
    """``call``, with torch's refusal of an empty input width (an ``AssertionError`` in
    ``multi_head_attention_forward``) raised as the ``RuntimeError`` the registry's
    empty-axis check takes for a refusal."""

    def run(module, *xs):
        try:
            return call(module, *xs)
        except AssertionError as e:
            raise RuntimeError(str(e)) from e

    return run


_torch_mha = _refusing(lambda module, x: module(x, x, x, need_weights=False)[0])


# the stacks only compose gradchecked layers: their float64 gradcheck would add no check
_COMPOSED = (
    "a composition of the gradchecked {} and LayerNorm; a small Transformer of both stacks "
    "is gradchecked in tests/layers/test_encoder_decoder.py"
)

CASES = [
    Case("TransformerEncoderLayer", lambda: L.TransformerEncoderLayer(2, 16, 0.0), (3, 2, 8),
         (3, 2, 8), lambda t: t.nn.TransformerEncoderLayer(8, 2, 16, 0.0),
         torch_call=_refusing(lambda module, x: module(x)), rtol=1e-4,
         atol=1e-4, gradcheck=(2, 1, 4)),
    Case("TransformerDecoderLayer",
         lambda: L.TransformerDecoderLayer(2, 16, 0.0, batch_first=True), (2, 3, 8), (2, 3, 8),
         lambda t: t.nn.TransformerDecoderLayer(8, 2, 16, 0.0, batch_first=True),
         extra=((2, 4, 8),), rtol=1e-4, atol=1e-4, gradcheck=((1, 2, 4), (1, 3, 4))),
    Case("TransformerEncoder",
         lambda: L.TransformerEncoder(_enc(norm_first=True), 2, norm=L.LayerNorm()), (3, 2, 8),
         (3, 2, 8), lambda t: t.nn.TransformerEncoder(
             t.nn.TransformerEncoderLayer(8, 2, 16, 0.0, norm_first=True), 2,
             norm=t.nn.LayerNorm(8), enable_nested_tensor=False), rtol=1e-4, atol=1e-4,
         gradcheck=_COMPOSED.format("TransformerEncoderLayer")),
    Case("TransformerDecoder",
         lambda: L.TransformerDecoder(L.TransformerDecoderLayer(2, 16, 0.0, activation="gelu"),
                                      1, norm=L.LayerNorm()), (3, 2, 8), (3, 2, 8),
         lambda t: t.nn.TransformerDecoder(
             t.nn.TransformerDecoderLayer(8, 2, 16, 0.0, activation="gelu"), 1,
             norm=t.nn.LayerNorm(8)), extra=((4, 2, 8),), rtol=1e-4, atol=1e-4,
         gradcheck=_COMPOSED.format("TransformerDecoderLayer")),
    Case("Transformer", lambda: L.Transformer(2, 1, 1, 16, 0.0), (4, 2, 8), (3, 2, 8),
         lambda t: t.nn.Transformer(8, 2, 1, 1, 16, 0.0), extra=((3, 2, 8),), rtol=1e-4,
         atol=1e-4, gradcheck=_COMPOSED.format("encoder and decoder layers")),
    Case("InProjAttention-bias-kv-zero-attn",
         lambda: L.InProjAttention(2, add_bias_kv=True, add_zero_attn=True), (2, 5, 8),
         (2, 5, 8), lambda t: t.nn.MultiheadAttention(8, 2, add_bias_kv=True, add_zero_attn=True),
         torch_call=_torch_mha, rtol=1e-4, gradcheck=(1, 3, 4)),
]  # fmt: skip

_P = "transformers-"

ERRORS = [
    (_P + "inproj-kdim", lambda: L.InProjAttention(2, kdim=0), ValueError,
     r"^InProjAttention: kdim must be a positive integer, got 0$"),
    (_P + "inproj-append-causal", lambda: L.InProjAttention(2, add_zero_attn=True, causal=True),
     ValueError, r"^InProjAttention: add_bias_kv and add_zero_attn append keys, which works "
     r"without rope and causal, got rope=False, causal=True"),
    (_P + "inproj-cache-weights",
     lambda: _run(L.InProjAttention(2), (1, 3, 4), need_weights=True,
                  cache=L.InProjAttention(2).init_cache((1, 4, 4))), LayerError,
     r"^InProjAttention: cache= works without need_weights, add_bias_kv and add_zero_attn$"),
    (_P + "inproj-value-alone", lambda: _run(L.InProjAttention(2), (1, 3, 4), value=jnp.ones((1, 2, 4))),
     LayerError, r"^InProjAttention: value= needs context= \(the keys' input\) too$"),
    (_P + "inproj-key-padding-mask-shape",
     lambda: _run(L.InProjAttention(2), (1, 3, 4), key_padding_mask=jnp.ones((3,), bool)),
     LayerError, r"^InProjAttention: key_padding_mask shape expected \(N, S\), got \(3,\)$"),
    (_P + "inproj-weights-dropout-key",
     lambda: _mha_weights(L.InProjAttention(2, dropout=0.5), train=True), LayerError,
     r"^InProjAttention: train=True draws random numbers and needs a PRNG key"),
    (_P + "encoder-layer-rank", lambda: _run(_enc(), (3, 2, 2, 8), init_shape=(3, 2, 8)),
     LayerError, r"^TransformerEncoderLayer: input rank expected 2 or 3 \(\(S, E\) or "
     r"\(S, N, E\)\), got 4$"),
    (_P + "encoder-layer-mask-shape",
     lambda: _run(_enc(), (3, 2, 8), src_mask=jnp.zeros((3, 4), bool)), LayerError,
     r"^TransformerEncoderLayer: src_mask \(bool, True where not allowed, or float, added to "
     r"the scores\) expected \(3, 3\) bool or float or \(4, 3, 3\) bool or float, got "
     r"\(3, 4\) bool$"),
    (_P + "encoder-layer-kpm-dtype",
     lambda: _run(_enc(batch_first=True), (2, 3, 8),
                  src_key_padding_mask=jnp.zeros((2, 3), jnp.int32)), LayerError,
     r"^TransformerEncoderLayer: src_key_padding_mask .* expected \(2, 3\) bool or float, "
     r"got \(2, 3\) int32$"),
    (_P + "encoder-layer-causal-needs-mask", lambda: _run(_enc(), (3, 2, 8), is_causal=True),
     LayerError, r"^TransformerEncoderLayer: is_causal=True is a hint that src_mask is the "
     r"causal mask and needs src_mask, as torch's\n  pass src_mask=Transformer\."
     r"generate_square_subsequent_mask\(3\)$"),
    (_P + "nhead", lambda: L.TransformerEncoderLayer(0), ValueError,
     r"^TransformerEncoderLayer: nhead must be a positive integer, got 0$"),
    (_P + "dim-feedforward", lambda: L.TransformerDecoderLayer(2, 0), ValueError,
     r"^TransformerDecoderLayer: dim_feedforward must be a positive integer, got 0$"),
    (_P + "dropout", lambda: L.TransformerEncoderLayer(2, dropout=1.5), ValueError,
     r"^TransformerEncoderLayer: dropout must be in \[0, 1\], got 1\.5$"),
    (_P + "eps", lambda: L.TransformerEncoderLayer(2, layer_norm_eps=0.0), ValueError,
     r"^TransformerEncoderLayer: layer_norm_eps must be > 0, got 0\.0$"),
    (_P + "activation", lambda: L.TransformerEncoderLayer(2, activation="tanh"), ValueError,
     r"^TransformerEncoderLayer: activation must be \"relu\", \"gelu\", a Layer or a "
     r"callable, got 'tanh'$"),
    (_P + "heads-divide-width", lambda: L.TransformerEncoderLayer(4).init(KEY, (3, 2, 6)),
     LayerError, r"^TransformerEncoderLayer\[self_attn\] InProjAttention: embed_dim 6 \(the "
     r"last axis of x\) must be divisible by num_heads 4"),
    (_P + "decoder-memory",
     lambda: _run(L.TransformerDecoderLayer(2, 16), (3, 2, 8), (4, 2, 6)), LayerError,
     r"^TransformerDecoderLayer: memory \(the encoder's output\) must have tgt's rank, width "
     r"8 and batch 2;\n  tgt\.shape == \(3, 2, 8\), memory\.shape == \(4, 2, 6\)$"),
    (_P + "decoder-memory-dtype",
     lambda: _complex_memory(L.TransformerDecoderLayer(2, 16)),
     LayerError, r"^TransformerDecoderLayer: memory dtype expected floating point, got complex64\n"),
    (_P + "encoder-not-layer", lambda: L.TransformerEncoder("layer", 2), ValueError,
     r"^TransformerEncoder: encoder_layer must be a Layer \(a TransformerEncoderLayer\), "
     r"got 'layer'$"),
    (_P + "num-layers", lambda: L.TransformerDecoder(L.TransformerDecoderLayer(2), -1),
     ValueError, r"^TransformerDecoder: num_layers must be an integer >= 0, got -1$"),
    (_P + "stack-norm", lambda: L.TransformerEncoder(_enc(), 1, norm="layernorm"), ValueError,
     r"^TransformerEncoder: norm must be a Layer or None, got 'layernorm'$"),
    (_P + "transformer-args", lambda: L.Transformer(nhead=0), ValueError,
     r"^Transformer: nhead must be a positive integer, got 0$"),
    (_P + "transformer-encoder-layers", lambda: L.Transformer(num_encoder_layers=-1), ValueError,
     r"^Transformer: num_encoder_layers must be an integer >= 0, got -1$"),
    (_P + "transformer-decoder-layers", lambda: L.Transformer(num_decoder_layers=1.5), ValueError,
     r"^Transformer: num_decoder_layers must be an integer >= 0, got 1\.5$"),
    (_P + "transformer-eps", lambda: L.Transformer(layer_norm_eps=-1.0), ValueError,
     r"^Transformer: layer_norm_eps must be > 0, got -1\.0$"),
    (_P + "transformer-custom", lambda: L.Transformer(custom_encoder=lambda x: x), ValueError,
     r"^Transformer: custom_encoder must be a Layer or None, got <function"),
    (_P + "square-mask", lambda: L.Transformer.generate_square_subsequent_mask(-1), ValueError,
     r"^Transformer\.generate_square_subsequent_mask: sz must be an integer >= 0, got -1$"),
    (_P + "transformer-init-widths",
     lambda: L.Transformer(2, 1, 1, 16).init(KEY, ((4, 2, 8), (3, 2, 6))), LayerError,
     r"^Transformer: tgt width \(d_model\) expected \(8,\), got \(6,\)$"),
    (_P + "transformer-apply-batch",
     lambda: _run(L.Transformer(2, 1, 1, 16), (4, 2, 8), (3, 3, 8)), LayerError,
     r"^Transformer: src and tgt must agree in rank, batch and width \(d_model\);\n  "
     r"src\.shape == \(4, 2, 8\), tgt\.shape == \(3, 3, 8\)$"),
]  # fmt: skip
