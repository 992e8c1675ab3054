"""Every public layer, with example arguments, inputs, a torch twin and what to check.

One ``Case`` drives all of a layer's table checks: the contract (names, shapes, jit,
vmap, grad, dtypes, hashing), torch parity of outputs and derivatives
(``pl.testing.assert_matches_torch``, weights copied in by name from the randomized
twin) and ``pl.testing.gradcheck`` in ``tests/test_layers.py``; params, state and
inputs that do not fit in ``tests/test_bad_input.py``; and the error catalog
(``tests/test_errors.py`` runs each case's ``errors``).

A new layer joins by one ``Case`` row, here or in its family's ``tests/catalog/``
module: ``torch=`` builds ``torch.nn``'s class (or a twin written beside the row, for a
layer torch has none of), ``errors=`` lists its error-catalog entries.
``test_every_public_layer_is_registered`` fails while a public layer is missing, and
``test_every_raise_site_is_in_the_catalog`` while one of its raise sites is reached by no
entry. Family test files keep what a table cannot say: worked examples,
algorithm-specific cases, hand-derived values.
"""

from __future__ import annotations

from purelayers import layers as L
from tests import catalog, twins
from tests.case import KINKS, Case, act

__all__ = ["CASES", "ERRORS", "KINKS", "Case"]


def _mha(module, x):
    """``torch.nn.MultiheadAttention`` as causal self-attention (its boolean mask is
    True where attention is *not* allowed)."""
    t = x.shape[1 if module.batch_first else 0]
    mask = x.new_ones((t, t)).triu(1).bool()
    return module(x, x, x, attn_mask=mask, need_weights=False)[0]


CASES = [
    # core
    Case("Sequential", lambda: L.Sequential(L.Linear(8), L.ReLU(), L.Linear(3)), (4, 5), (4, 3),
         lambda t: t.nn.Sequential(t.nn.Linear(5, 8), t.nn.ReLU(), t.nn.Linear(8, 3))),
    Case("Sequential-named",
         lambda: L.Sequential({"fc": L.Linear(4), "act": L.Tanh(), "out": L.Linear(3)}), (3, 5),
         (3, 3), lambda t: t.nn.Sequential(__import__("collections").OrderedDict(
             fc=t.nn.Linear(5, 4), act=t.nn.Tanh(), out=t.nn.Linear(4, 3)))),
    Case("Identity", lambda: L.Identity(), (2, 3), (2, 3), lambda t: t.nn.Identity()),
    Case("Lambda", lambda: L.Lambda(L.tanh), (2, 3), (2, 3), lambda t: t.nn.Tanh()),
    Case("Flatten", lambda: L.Flatten(), (2, 3, 4, 5), (2, 60), lambda t: t.nn.Flatten(),
         gradcheck=(2, 3, 2)),
    Case("Linear", lambda: L.Linear(6), (4, 5), (4, 6), lambda t: t.nn.Linear(5, 6),
         gradcheck=(2, 5)),
    Case("Linear-nobias", lambda: L.Linear(6, bias=False), (2, 3, 5), (2, 3, 6),
         lambda t: t.nn.Linear(5, 6, bias=False), gradcheck=(2, 2, 5)),
    Case("Linear-4d", lambda: L.Linear(6), (2, 3, 4, 5), (2, 3, 4, 6),
         lambda t: t.nn.Linear(5, 6), gradcheck=(2, 1, 2, 5)),
    Case("Dropout", lambda: L.Dropout(0.2), (4, 5), (4, 5), lambda t: t.nn.Dropout(0.2)),
    # activations
    act("ReLU", L.ReLU, "ReLU"),
    act("ReLU6", L.ReLU6, "ReLU6"),
    act("LeakyReLU", L.LeakyReLU, "LeakyReLU"),
    act("LeakyReLU-0.2", lambda: L.LeakyReLU(0.2), lambda t: t.nn.LeakyReLU(0.2)),
    act("ELU", L.ELU, "ELU"),
    act("ELU-0.7", lambda: L.ELU(0.7), lambda t: t.nn.ELU(0.7)),
    act("SELU", L.SELU, "SELU"),
    act("GELU", L.GELU, "GELU"),
    act("GELU-tanh", lambda: L.GELU("tanh"), lambda t: t.nn.GELU(approximate="tanh")),
    act("SiLU", L.SiLU, "SiLU"),
    act("Sigmoid", L.Sigmoid, "Sigmoid"),
    act("Tanh", L.Tanh, "Tanh"),
    act("Softplus", L.Softplus, "Softplus"),
    act("Softplus-beta", lambda: L.Softplus(beta=2.0, threshold=5.0),
         lambda t: t.nn.Softplus(2.0, 5.0)),
    act("Softplus-negative-beta", lambda: L.Softplus(beta=-1.5, threshold=2.0),
         lambda t: t.nn.Softplus(-1.5, 2.0)),
    act("Softsign", L.Softsign, "Softsign"),
    act("HardSigmoid", L.HardSigmoid, "Hardsigmoid"),
    act("Exponential", L.Exponential, twins.exp),
    act("Softmax", L.Softmax, lambda t: t.nn.Softmax(dim=-1)),
    act("Softmax-axis0", lambda: L.Softmax(axis=0), lambda t: t.nn.Softmax(dim=0)),
    act("LogSoftmax", L.LogSoftmax, lambda t: t.nn.LogSoftmax(dim=-1)),
    Case("SwiGLU", L.SwiGLU, (2, 3, 4), (2, 3, 2), twins.swiglu, gradcheck=(2, 6)),
    Case("PReLU", lambda: L.PReLU(3), (2, 3, 4), (2, 3, 4), lambda t: t.nn.PReLU(3)),
    Case("PReLU-1", lambda: L.PReLU(), (2, 3, 4), (2, 3, 4), lambda t: t.nn.PReLU()),
    # convolutions
    Case("Conv1d", lambda: L.Conv1d(4, 3, padding=1), (2, 3, 7), (2, 4, 7),
         lambda t: t.nn.Conv1d(3, 4, 3, padding=1), rtol=1e-4),
    Case("Conv2d", lambda: L.Conv2d(8, 3, stride=2, padding=1), (2, 1, 28, 28), (2, 8, 14, 14),
         lambda t: t.nn.Conv2d(1, 8, 3, stride=2, padding=1), rtol=1e-4, gradcheck=(1, 1, 5, 5)),
    Case("Conv2d-groups", lambda: L.Conv2d(4, 3, groups=2, padding="same"), (2, 4, 6, 6),
         (2, 4, 6, 6), lambda t: t.nn.Conv2d(4, 4, 3, groups=2, padding="same"), rtol=1e-4,
         gradcheck=(1, 4, 4, 4)),
    Case("Conv3d", lambda: L.Conv3d(2, 2), (1, 3, 4, 4, 4), (1, 2, 3, 3, 3),
         lambda t: t.nn.Conv3d(3, 2, 2), rtol=1e-4, gradcheck=(1, 3, 3, 3, 3)),
    Case("ConvTranspose1d", lambda: L.ConvTranspose1d(2, 3, stride=2), (2, 3, 5), (2, 2, 11),
         lambda t: t.nn.ConvTranspose1d(3, 2, 3, stride=2), rtol=1e-4),
    Case("ConvTranspose2d", lambda: L.ConvTranspose2d(2, 3, stride=2, padding=1, output_padding=1),
         (2, 3, 4, 4), (2, 2, 8, 8),
         lambda t: t.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1),
         rtol=1e-4, gradcheck=(1, 3, 3, 3)),
    Case("ConvTranspose3d", lambda: L.ConvTranspose3d(2, 2), (1, 3, 3, 3, 3), (1, 2, 4, 4, 4),
         lambda t: t.nn.ConvTranspose3d(3, 2, 2), rtol=1e-4, gradcheck=(1, 2, 2, 2, 2)),
    # pooling
    Case("MaxPool1d", lambda: L.MaxPool1d(2), (2, 3, 8), (2, 3, 4), lambda t: t.nn.MaxPool1d(2)),
    Case("MaxPool2d", lambda: L.MaxPool2d(3, 2, 1, ceil_mode=True), (2, 3, 8, 8), (2, 3, 5, 5),
         lambda t: t.nn.MaxPool2d(3, 2, 1, ceil_mode=True), gradcheck=(1, 2, 5, 5)),
    Case("AvgPool1d", lambda: L.AvgPool1d(3, 2, 1), (2, 3, 8), (2, 3, 4),
         lambda t: t.nn.AvgPool1d(3, 2, 1)),
    Case("AvgPool2d", lambda: L.AvgPool2d(2), (2, 3, 8, 8), (2, 3, 4, 4), lambda t: t.nn.AvgPool2d(2),
         gradcheck=(1, 2, 4, 4)),
    Case("AdaptiveAvgPool1d", lambda: L.AdaptiveAvgPool1d(4), (2, 3, 8), (2, 3, 4),
         lambda t: t.nn.AdaptiveAvgPool1d(4)),
    Case("AdaptiveAvgPool2d", lambda: L.AdaptiveAvgPool2d(1), (2, 3, 8, 8), (2, 3, 1, 1),
         lambda t: t.nn.AdaptiveAvgPool2d(1), gradcheck=(1, 2, 4, 4)),
    Case("AdaptiveMaxPool1d", lambda: L.AdaptiveMaxPool1d(2), (2, 3, 8), (2, 3, 2),
         lambda t: t.nn.AdaptiveMaxPool1d(2)),
    Case("AdaptiveMaxPool2d", lambda: L.AdaptiveMaxPool2d((2, 4)), (2, 3, 8, 8), (2, 3, 2, 4),
         lambda t: t.nn.AdaptiveMaxPool2d((2, 4)), gradcheck=(1, 2, 4, 5)),
    # embeddings and norms
    Case("Embedding", lambda: L.Embedding(11, 4), (2, 5), (2, 5, 4),
         lambda t: t.nn.Embedding(11, 4), ids=11),
    Case("Embedding-padding", lambda: L.Embedding(11, 4, padding_idx=0), (2, 5), (2, 5, 4),
         lambda t: t.nn.Embedding(11, 4, padding_idx=0), ids=11,
         gradcheck="the padding row's gradient is zero by design (torch's), not its finite "
                   "difference; tests/layers/test_embedding.py checks it by hand"),
    Case("LayerNorm", lambda: L.LayerNorm(), (2, 3, 6), (2, 3, 6), lambda t: t.nn.LayerNorm(6),
         rtol=1e-4),
    Case("RMSNorm", lambda: L.RMSNorm(), (2, 3, 6), (2, 3, 6), lambda t: t.nn.RMSNorm(6),
         rtol=1e-4),
    Case("GroupNorm", lambda: L.GroupNorm(2), (2, 4, 5), (2, 4, 5), lambda t: t.nn.GroupNorm(2, 4),
         rtol=1e-4),
    Case("BatchNorm1d", lambda: L.BatchNorm1d(), (4, 3), (4, 3), lambda t: t.nn.BatchNorm1d(3),
         rtol=1e-4),
    Case("BatchNorm2d", lambda: L.BatchNorm2d(), (4, 3, 5, 5), (4, 3, 5, 5),
         lambda t: t.nn.BatchNorm2d(3), rtol=1e-4, gradcheck=(2, 3, 2, 2)),
    Case("BatchNorm3d", lambda: L.BatchNorm3d(), (2, 3, 2, 3, 3), (2, 3, 2, 3, 3),
         lambda t: t.nn.BatchNorm3d(3), rtol=1e-4, gradcheck=(1, 3, 2, 2, 2)),
    # recurrent
    Case("RNNCell", lambda: L.RNNCell(6), (3, 4), (3, 6), lambda t: t.nn.RNNCell(4, 6),
         rtol=1e-4),
    Case("LSTMCell", lambda: L.LSTMCell(6), (3, 4), (3, 6), lambda t: t.nn.LSTMCell(4, 6),
         rtol=1e-4),
    Case("GRUCell", lambda: L.GRUCell(6), (3, 4), (3, 6), lambda t: t.nn.GRUCell(4, 6), rtol=1e-4),
    Case("RNN", lambda: L.RNN(6, num_layers=2), (5, 3, 4), (5, 3, 6),
         lambda t: t.nn.RNN(4, 6, num_layers=2), rtol=1e-4, gradcheck=(3, 2, 3)),
    Case("LSTM", lambda: L.LSTM(6, bidirectional=True, batch_first=True), (3, 5, 4), (3, 5, 12),
         lambda t: t.nn.LSTM(4, 6, bidirectional=True, batch_first=True), rtol=1e-4,
         gradcheck=(2, 3, 3)),
    Case("GRU", lambda: L.GRU(6), (5, 3, 4), (5, 3, 6), lambda t: t.nn.GRU(4, 6), rtol=1e-4,
         gradcheck=(3, 2, 3)),
    # attention
    Case("MultiHeadAttention", lambda: L.MultiHeadAttention(2, causal=True), (2, 5, 8), (2, 5, 8),
         lambda t: twins.attention(t, "fused", 8, 2, causal=True), rtol=1e-4,
         gradcheck=(1, 3, 4)),
    Case("MultiHeadAttention-gqa-rope",
         lambda: L.MultiHeadAttention(4, num_kv_heads=2, rope=True, bias=False), (2, 5, 16),
         (2, 5, 16), lambda t: twins.attention(t, "fused", 16, 4, kv=2, bias=False, theta=1e4),
         rtol=1e-4, gradcheck=(1, 3, 8)),
    Case("AttentionCore", lambda: L.AttentionCore(2, causal=True), (2, 5, 8), (2, 5, 8),
         lambda t: twins.attention(t, "core", 8, 2, causal=True), rtol=1e-4, gradcheck=(1, 3, 4)),
    Case("RotaryEmbedding", lambda: L.RotaryEmbedding(), (2, 5, 2, 4), (2, 5, 2, 4), twins.rope,
         rtol=1e-4, gradcheck=(1, 3, 1, 4)),
    Case("Attention", lambda: L.Attention.build(8, 4, num_kv_heads=2, head_dim=4, bias=True,
                                                out_bias=False, rope=L.RotaryEmbedding()),
         (2, 5, 8), (2, 5, 8),
         lambda t: twins.attention(t, "separate", 8, 4, kv=2, hd=4, out_bias=False, theta=1e4),
         rtol=1e-4, gradcheck=(1, 3, 8)),
    Case("InProjAttention", lambda: L.InProjAttention(2, causal=True, batch_first=True),
         (2, 5, 8), (2, 5, 8), lambda t: t.nn.MultiheadAttention(8, 2, batch_first=True),
         torch_call=_mha, rtol=1e-4, gradcheck=(1, 3, 4)),
    # transformer
    Case("TransformerBlock", lambda: L.TransformerBlock(2), (2, 5, 8), (2, 5, 8),
         lambda t: twins.block(t, 8, 2), rtol=1e-4, gradcheck=(1, 3, 4)),
    Case("TransformerBlock-llama",
         lambda: L.TransformerBlock(4, num_kv_heads=2, norm="rmsnorm", activation="swiglu",
                                    rope=True, bias=False, hidden_dim=24), (2, 5, 16), (2, 5, 16),
         lambda t: twins.block(t, 16, 4, kv=2, llama=True, hidden=24), rtol=1e-4,
         gradcheck=(1, 3, 8)),
    Case("TransformerBlock-parts",
         lambda: L.TransformerBlock(attn=L.Attention.build(8, 2, bias=True, out_bias=False,
                                                           causal=True),
                                    norm=L.RMSNorm(eps=1e-6), activation=L.SwiGLU(),
                                    hidden_dim=12, bias=False), (2, 5, 8), (2, 5, 8),
         lambda t: twins.block(t, 8, 2, llama=True, hidden=12, eps=1e-6, attn=twins.attention(
             t, "separate", 8, 2, out_bias=False, causal=True)), rtol=1e-4, gradcheck=(1, 3, 8)),
    Case("Repeat", lambda: L.Repeat(L.TransformerBlock(2), 3), (2, 5, 8), (2, 5, 8),
         # three blocks deep: torch's own float32 gradients are up to 1.2e-5 from its float64
         # ones here, so the two float32 sides differ by more than the default atol 1e-5
         lambda t: t.nn.Sequential(*[twins.block(t, 8, 2) for _ in range(3)]), rtol=1e-4,
         atol=5e-5, gradcheck=(1, 2, 4)),
    Case("Tied", lambda: L.Tied(L.Sequential({"emb": L.Embedding(7, 4), "head": L.Linear(7, bias=False)}),
                                {"head.weight": "emb.weight"}), (2, 5), (2, 5, 7),
         lambda t: twins.tied_lm(t, 7, 4), ids=7),
    Case("Remat", lambda: L.Remat(L.Sequential(L.Linear(8), L.GELU(), L.Linear(3))), (4, 5),
         (4, 3), lambda t: t.nn.Sequential(t.nn.Linear(5, 8), t.nn.GELU(), t.nn.Linear(8, 3)),
         gradcheck=(2, 5)),
]  # fmt: skip
CASES += catalog.CASES

# Every case's error-catalog entries, and the catalog modules' entries of no single case.
ERRORS = [entry for case in CASES for entry in case.errors] + catalog.ERRORS
