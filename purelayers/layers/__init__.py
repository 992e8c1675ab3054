"""Layers: frozen configurations with pure ``init`` and ``apply`` functions.

One module per family; each lists its public names in ``__all__``.
"""

from purelayers.layers import activation as _activation
from purelayers.layers import attention as _attention
from purelayers.layers import conv as _conv
from purelayers.layers import core as _core
from purelayers.layers import dropout as _dropout
from purelayers.layers import embedding as _embedding
from purelayers.layers import linear as _linear
from purelayers.layers import multihead as _multihead
from purelayers.layers import norm as _norm
from purelayers.layers import pool as _pool
from purelayers.layers import recurrent as _recurrent
from purelayers.layers import repeat as _repeat
from purelayers.layers import tied as _tied
from purelayers.layers import transformer as _transformer
from purelayers.layers._checks import LayerError
from purelayers.layers.activation import (
    ELU,
    GELU,
    SELU,
    Exponential,
    HardSigmoid,
    LeakyReLU,
    LogSoftmax,
    PReLU,
    ReLU,
    ReLU6,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Softsign,
    SwiGLU,
    Tanh,
    elu,
    exponential,
    gelu,
    hard_sigmoid,
    leaky_relu,
    log_softmax,
    prelu,
    relu,
    relu6,
    selu,
    sigmoid,
    silu,
    softmax,
    softplus,
    softsign,
    tanh,
)
from purelayers.layers.attention import (
    AttentionCore,
    RotaryEmbedding,
    causal_mask,
    rotary_embedding,
    scaled_dot_product_attention,
)
from purelayers.layers.conv import (
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
)
from purelayers.layers.core import Flatten, Identity, Lambda, Layer, Params, Sequential, State
from purelayers.layers.dropout import Dropout, dropout
from purelayers.layers.embedding import Embedding
from purelayers.layers.linear import Linear
from purelayers.layers.multihead import Attention, InProjAttention, MultiHeadAttention
from purelayers.layers.norm import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    GroupNorm,
    LayerNorm,
    RMSNorm,
)
from purelayers.layers.pool import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AvgPool1d,
    AvgPool2d,
    MaxPool1d,
    MaxPool2d,
)
from purelayers.layers.recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from purelayers.layers.repeat import Remat, Repeat
from purelayers.layers.tied import Tied
from purelayers.layers.transformer import TransformerBlock

__all__ = [
    "LayerError",
    *_core.__all__,
    *_linear.__all__,
    *_activation.__all__,
    *_dropout.__all__,
    *_attention.__all__,
    *_multihead.__all__,
    *_transformer.__all__,
    *_repeat.__all__,
    *_tied.__all__,
    *_conv.__all__,
    *_pool.__all__,
    *_embedding.__all__,
    *_norm.__all__,
    *_recurrent.__all__,
]
