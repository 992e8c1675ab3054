"""Layers: frozen configurations with pure ``init`` and ``apply`` functions.

One module per family; each lists its public names in ``__all__``, all of which this
package exports.
"""

from purelayers.layers import activation as _activation
from purelayers.layers import attention as _attention
from purelayers.layers import bilinear as _bilinear
from purelayers.layers import conv as _conv
from purelayers.layers import core as _core
from purelayers.layers import distance as _distance
from purelayers.layers import dropout as _dropout
from purelayers.layers import embedding as _embedding
from purelayers.layers import embedding_bag as _embedding_bag
from purelayers.layers import encoder_decoder as _encoder_decoder
from purelayers.layers import encoder_decoder_stack as _encoder_decoder_stack
from purelayers.layers import fold as _fold
from purelayers.layers import fractional as _fractional
from purelayers.layers import instancenorm as _instancenorm
from purelayers.layers import linear as _linear
from purelayers.layers import lppool as _lppool
from purelayers.layers import lrn as _lrn
from purelayers.layers import multihead as _multihead
from purelayers.layers import norm as _norm
from purelayers.layers import padding as _padding
from purelayers.layers import parametrize as _parametrize
from purelayers.layers import pool as _pool
from purelayers.layers import prelu as _prelu
from purelayers.layers import recurrent as _recurrent
from purelayers.layers import repeat as _repeat
from purelayers.layers import rotary as _rotary
from purelayers.layers import separate_attention as _separate_attention
from purelayers.layers import shape as _shape
from purelayers.layers import shuffle as _shuffle
from purelayers.layers import thresholds as _thresholds
from purelayers.layers import tied as _tied
from purelayers.layers import transformer as _transformer
from purelayers.layers import unpool as _unpool
from purelayers.layers import upsample as _upsample
from purelayers.layers._checks import LayerError
from purelayers.layers.activation import (
    CELU,
    ELU,
    GELU,
    GLU,
    SELU,
    Exponential,
    HardSigmoid,
    Hardsigmoid,
    LeakyReLU,
    LogSigmoid,
    LogSoftmax,
    Mish,
    ReLU,
    ReLU6,
    Sigmoid,
    SiLU,
    Softmax,
    Softmax2d,
    Softmin,
    Softplus,
    Softsign,
    SwiGLU,
    Tanh,
    celu,
    elu,
    exponential,
    gelu,
    glu,
    hard_sigmoid,
    leaky_relu,
    log_sigmoid,
    log_softmax,
    mish,
    relu,
    relu6,
    selu,
    sigmoid,
    silu,
    softmax,
    softmin,
    softplus,
    softsign,
    tanh,
)
from purelayers.layers.attention import (
    AttentionCore,
    causal_mask,
    scaled_dot_product_attention,
)
from purelayers.layers.bilinear import (
    Bilinear,
)
from purelayers.layers.conv import (
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
)
from purelayers.layers.core import (
    Flatten,
    Identity,
    Lambda,
    Layer,
    Params,
    Sequential,
    State,
)
from purelayers.layers.distance import (
    CosineSimilarity,
    PairwiseDistance,
)
from purelayers.layers.dropout import (
    AlphaDropout,
    Dropout,
    Dropout1d,
    Dropout2d,
    Dropout3d,
    FeatureAlphaDropout,
    dropout,
)
from purelayers.layers.embedding import (
    Embedding,
)
from purelayers.layers.embedding_bag import (
    EmbeddingBag,
)
from purelayers.layers.encoder_decoder import (
    TransformerDecoderLayer,
    TransformerEncoderLayer,
)
from purelayers.layers.encoder_decoder_stack import (
    Transformer,
    TransformerDecoder,
    TransformerEncoder,
)
from purelayers.layers.fold import (
    Fold,
    Unfold,
)
from purelayers.layers.fractional import (
    FractionalMaxPool2d,
    FractionalMaxPool3d,
)
from purelayers.layers.instancenorm import (
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
)
from purelayers.layers.linear import (
    Linear,
)
from purelayers.layers.lppool import (
    LPPool1d,
    LPPool2d,
    LPPool3d,
)
from purelayers.layers.lrn import (
    CrossMapLRN2d,
    LocalResponseNorm,
)
from purelayers.layers.multihead import (
    InProjAttention,
    MultiHeadAttention,
)
from purelayers.layers.norm import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    GroupNorm,
    LayerNorm,
    RMSNorm,
    SyncBatchNorm,
)
from purelayers.layers.padding import (
    CircularPad1d,
    CircularPad2d,
    CircularPad3d,
    ConstantPad1d,
    ConstantPad2d,
    ConstantPad3d,
    ReflectionPad1d,
    ReflectionPad2d,
    ReflectionPad3d,
    ReplicationPad1d,
    ReplicationPad2d,
    ReplicationPad3d,
    ZeroPad1d,
    ZeroPad2d,
    ZeroPad3d,
)
from purelayers.layers.parametrize import (
    SpectralNorm,
    WeightNorm,
)
from purelayers.layers.pool import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AdaptiveMaxPool3d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
)
from purelayers.layers.prelu import PReLU, prelu
from purelayers.layers.recurrent import (
    GRU,
    LSTM,
    RNN,
    GRUCell,
    LSTMCell,
    RNNCell,
)
from purelayers.layers.repeat import (
    Remat,
    Repeat,
)
from purelayers.layers.rotary import (
    RotaryEmbedding,
    rotary_embedding,
)
from purelayers.layers.separate_attention import Attention
from purelayers.layers.shape import (
    Unflatten,
)
from purelayers.layers.shuffle import (
    ChannelShuffle,
    PixelShuffle,
    PixelUnshuffle,
)
from purelayers.layers.thresholds import (
    Hardshrink,
    Hardswish,
    Hardtanh,
    RReLU,
    Softshrink,
    Tanhshrink,
    Threshold,
    hardshrink,
    hardswish,
    hardtanh,
    rrelu,
    softshrink,
    tanhshrink,
    threshold,
)
from purelayers.layers.tied import (
    Tied,
)
from purelayers.layers.transformer import (
    TransformerBlock,
)
from purelayers.layers.unpool import (
    MaxUnpool1d,
    MaxUnpool2d,
    MaxUnpool3d,
)
from purelayers.layers.upsample import (
    Upsample,
    UpsamplingBilinear2d,
    UpsamplingNearest2d,
)

__all__ = [
    "LayerError",
    *_activation.__all__,
    *_prelu.__all__,
    *_attention.__all__,
    *_bilinear.__all__,
    *_conv.__all__,
    *_core.__all__,
    *_distance.__all__,
    *_dropout.__all__,
    *_embedding.__all__,
    *_embedding_bag.__all__,
    *_encoder_decoder.__all__,
    *_encoder_decoder_stack.__all__,
    *_fold.__all__,
    *_fractional.__all__,
    *_instancenorm.__all__,
    *_linear.__all__,
    *_lppool.__all__,
    *_lrn.__all__,
    *_multihead.__all__,
    *_separate_attention.__all__,
    *_norm.__all__,
    *_padding.__all__,
    *_parametrize.__all__,
    *_pool.__all__,
    *_recurrent.__all__,
    *_repeat.__all__,
    *_rotary.__all__,
    *_shape.__all__,
    *_shuffle.__all__,
    *_thresholds.__all__,
    *_tied.__all__,
    *_transformer.__all__,
    *_unpool.__all__,
    *_upsample.__all__,
]
