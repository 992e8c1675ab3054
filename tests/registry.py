"""Every public layer with example arguments and inputs, for the contract test.

A new layer joins by adding a ``Case`` here; ``tests/test_contract.py`` then runs it
through the whole contract, and fails while any public layer is missing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from purelayers import layers as L


@dataclasses.dataclass(frozen=True)
class Case:
    """``make()`` builds the layer; ``shape`` is its input; ``out_shape`` the documented
    shape of its (first) output; ``ids`` the vocabulary size when the input is integer ids;
    ``torch`` builds the equivalent ``torch.nn`` module (for names), when one exists."""

    id: str
    make: Callable[[], L.Layer]
    shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    torch: Callable[[Any], Any] | None = None
    ids: int | None = None
    kwargs: dict = dataclasses.field(default_factory=dict)


def _act(name, make, torch_name=None, shape=(2, 3, 4)):
    torch_make = (lambda t: getattr(t.nn, torch_name)()) if torch_name else None
    return Case(name, make, shape, shape, torch_make)


CASES = [
    # core
    Case("Sequential", lambda: L.Sequential(L.Linear(8), L.ReLU(), L.Linear(3)), (4, 5), (4, 3),
         lambda t: t.nn.Sequential(t.nn.Linear(5, 8), t.nn.ReLU(), t.nn.Linear(8, 3))),
    Case("Identity", lambda: L.Identity(), (2, 3), (2, 3), lambda t: t.nn.Identity()),
    Case("Lambda", lambda: L.Lambda(L.tanh), (2, 3), (2, 3)),
    Case("Flatten", lambda: L.Flatten(), (2, 3, 4, 5), (2, 60), lambda t: t.nn.Flatten()),
    Case("Linear", lambda: L.Linear(6), (4, 5), (4, 6), lambda t: t.nn.Linear(5, 6)),
    Case("Linear-nobias", lambda: L.Linear(6, bias=False), (2, 3, 5), (2, 3, 6),
         lambda t: t.nn.Linear(5, 6, bias=False)),
    Case("Dropout", lambda: L.Dropout(0.2), (4, 5), (4, 5), lambda t: t.nn.Dropout(0.2)),
    # activations
    _act("ReLU", L.ReLU, "ReLU"),
    _act("LeakyReLU", L.LeakyReLU, "LeakyReLU"),
    _act("ELU", L.ELU, "ELU"),
    _act("SELU", L.SELU, "SELU"),
    _act("GELU", L.GELU, "GELU"),
    _act("SiLU", L.SiLU, "SiLU"),
    _act("Sigmoid", L.Sigmoid, "Sigmoid"),
    _act("Tanh", L.Tanh, "Tanh"),
    _act("Softplus", L.Softplus, "Softplus"),
    _act("Softsign", L.Softsign, "Softsign"),
    _act("HardSigmoid", L.HardSigmoid, "Hardsigmoid"),
    _act("Exponential", L.Exponential),
    _act("Softmax", L.Softmax),
    Case("SwiGLU", L.SwiGLU, (2, 3, 4), (2, 3, 2)),
    _act("LogSoftmax", L.LogSoftmax),
    Case("PReLU", lambda: L.PReLU(3), (2, 3, 4), (2, 3, 4), lambda t: t.nn.PReLU(3)),
    # convolutions
    Case("Conv1d", lambda: L.Conv1d(4, 3, padding=1), (2, 3, 7), (2, 4, 7),
         lambda t: t.nn.Conv1d(3, 4, 3, padding=1)),
    Case("Conv2d", lambda: L.Conv2d(8, 3, stride=2, padding=1), (2, 1, 28, 28), (2, 8, 14, 14),
         lambda t: t.nn.Conv2d(1, 8, 3, stride=2, padding=1)),
    Case("Conv2d-groups", lambda: L.Conv2d(4, 3, groups=2, padding="same"), (2, 4, 6, 6),
         (2, 4, 6, 6), lambda t: t.nn.Conv2d(4, 4, 3, groups=2, padding="same")),
    Case("Conv3d", lambda: L.Conv3d(2, 2), (1, 3, 4, 4, 4), (1, 2, 3, 3, 3),
         lambda t: t.nn.Conv3d(3, 2, 2)),
    Case("ConvTranspose1d", lambda: L.ConvTranspose1d(2, 3, stride=2), (2, 3, 5), (2, 2, 11),
         lambda t: t.nn.ConvTranspose1d(3, 2, 3, stride=2)),
    Case("ConvTranspose2d", lambda: L.ConvTranspose2d(2, 3, stride=2, padding=1, output_padding=1),
         (2, 3, 4, 4), (2, 2, 8, 8),
         lambda t: t.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1)),
    Case("ConvTranspose3d", lambda: L.ConvTranspose3d(2, 2), (1, 3, 3, 3, 3), (1, 2, 4, 4, 4),
         lambda t: t.nn.ConvTranspose3d(3, 2, 2)),
    # pooling
    Case("MaxPool1d", lambda: L.MaxPool1d(2), (2, 3, 8), (2, 3, 4), lambda t: t.nn.MaxPool1d(2)),
    Case("MaxPool2d", lambda: L.MaxPool2d(3, 2, 1, ceil_mode=True), (2, 3, 8, 8), (2, 3, 5, 5),
         lambda t: t.nn.MaxPool2d(3, 2, 1, ceil_mode=True)),
    Case("AvgPool1d", lambda: L.AvgPool1d(3, 2, 1), (2, 3, 8), (2, 3, 4),
         lambda t: t.nn.AvgPool1d(3, 2, 1)),
    Case("AvgPool2d", lambda: L.AvgPool2d(2), (2, 3, 8, 8), (2, 3, 4, 4), lambda t: t.nn.AvgPool2d(2)),
    Case("AdaptiveAvgPool1d", lambda: L.AdaptiveAvgPool1d(4), (2, 3, 8), (2, 3, 4),
         lambda t: t.nn.AdaptiveAvgPool1d(4)),
    Case("AdaptiveAvgPool2d", lambda: L.AdaptiveAvgPool2d(1), (2, 3, 8, 8), (2, 3, 1, 1),
         lambda t: t.nn.AdaptiveAvgPool2d(1)),
    Case("AdaptiveMaxPool1d", lambda: L.AdaptiveMaxPool1d(2), (2, 3, 8), (2, 3, 2),
         lambda t: t.nn.AdaptiveMaxPool1d(2)),
    Case("AdaptiveMaxPool2d", lambda: L.AdaptiveMaxPool2d((2, 4)), (2, 3, 8, 8), (2, 3, 2, 4),
         lambda t: t.nn.AdaptiveMaxPool2d((2, 4))),
    # embeddings and norms
    Case("Embedding", lambda: L.Embedding(11, 4, padding_idx=0), (2, 5), (2, 5, 4),
         lambda t: t.nn.Embedding(11, 4, padding_idx=0), ids=11),
    Case("LayerNorm", lambda: L.LayerNorm(), (2, 3, 6), (2, 3, 6), lambda t: t.nn.LayerNorm(6)),
    Case("RMSNorm", lambda: L.RMSNorm(), (2, 3, 6), (2, 3, 6), lambda t: t.nn.RMSNorm(6)),
    Case("GroupNorm", lambda: L.GroupNorm(2), (2, 4, 5), (2, 4, 5), lambda t: t.nn.GroupNorm(2, 4)),
    Case("BatchNorm1d", lambda: L.BatchNorm1d(), (4, 3), (4, 3), lambda t: t.nn.BatchNorm1d(3)),
    Case("BatchNorm2d", lambda: L.BatchNorm2d(), (4, 3, 5, 5), (4, 3, 5, 5),
         lambda t: t.nn.BatchNorm2d(3)),
    Case("BatchNorm3d", lambda: L.BatchNorm3d(), (2, 3, 2, 3, 3), (2, 3, 2, 3, 3),
         lambda t: t.nn.BatchNorm3d(3)),
    # recurrent
    Case("RNNCell", lambda: L.RNNCell(6), (3, 4), (3, 6), lambda t: t.nn.RNNCell(4, 6)),
    Case("LSTMCell", lambda: L.LSTMCell(6), (3, 4), (3, 6), lambda t: t.nn.LSTMCell(4, 6)),
    Case("GRUCell", lambda: L.GRUCell(6), (3, 4), (3, 6), lambda t: t.nn.GRUCell(4, 6)),
    Case("RNN", lambda: L.RNN(6, num_layers=2), (5, 3, 4), (5, 3, 6),
         lambda t: t.nn.RNN(4, 6, num_layers=2)),
    Case("LSTM", lambda: L.LSTM(6, bidirectional=True, batch_first=True), (3, 5, 4), (3, 5, 12),
         lambda t: t.nn.LSTM(4, 6, bidirectional=True, batch_first=True)),
    Case("GRU", lambda: L.GRU(6), (5, 3, 4), (5, 3, 6), lambda t: t.nn.GRU(4, 6)),
    # attention
    Case("MultiHeadAttention", lambda: L.MultiHeadAttention(2, causal=True), (2, 5, 8), (2, 5, 8)),
    Case("MultiHeadAttention-gqa-rope",
         lambda: L.MultiHeadAttention(4, num_kv_heads=2, rope=True, bias=False), (2, 5, 16),
         (2, 5, 16)),
    Case("AttentionCore", lambda: L.AttentionCore(2, causal=True), (2, 5, 8),
         (2, 5, 8)),
    Case("RotaryEmbedding", lambda: L.RotaryEmbedding(), (2, 5, 2, 4), (2, 5, 2, 4)),
    Case("Attention", lambda: L.Attention.build(8, 4, num_kv_heads=2, head_dim=4, bias=True,
                                                out_bias=False, rope=L.RotaryEmbedding()),
         (2, 5, 8), (2, 5, 8)),
    Case("InProjAttention", lambda: L.InProjAttention(2, causal=True), (2, 5, 8), (2, 5, 8),
         lambda t: t.nn.MultiheadAttention(8, 2, batch_first=True)),
    # transformer
    Case("TransformerBlock", lambda: L.TransformerBlock(2), (2, 5, 8), (2, 5, 8)),
    Case("TransformerBlock-llama",
         lambda: L.TransformerBlock(4, num_kv_heads=2, norm="rmsnorm", activation="swiglu",
                                    rope=True, bias=False), (2, 5, 16), (2, 5, 16)),
    Case("TransformerBlock-parts",
         lambda: L.TransformerBlock(attn=L.Attention.build(8, 2, bias=True, out_bias=False,
                                                           causal=True),
                                    norm=L.RMSNorm(eps=1e-6), activation=L.SwiGLU(),
                                    hidden_dim=12, bias=False), (2, 5, 8), (2, 5, 8)),
    Case("Repeat", lambda: L.Repeat(L.TransformerBlock(2), 3), (2, 5, 8), (2, 5, 8)),
    Case("Tied", lambda: L.Tied(L.Sequential({"emb": L.Embedding(7, 4), "head": L.Linear(7, bias=False)}),
                                {"head.weight": "emb.weight"}), (2, 5), (2, 5, 7), ids=7),
    Case("Remat", lambda: L.Remat(L.Sequential(L.Linear(8), L.GELU(), L.Linear(3))), (4, 5),
         (4, 3), lambda t: t.nn.Sequential(t.nn.Linear(5, 8), t.nn.GELU(), t.nn.Linear(8, 3))),
]  # fmt: skip
