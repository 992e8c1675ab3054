"""Layers: frozen configurations with pure ``init`` and ``apply`` functions.

One module per family; each lists its public names in ``__all__``, all of which this
package exports.
"""

# ruff: noqa: F403

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
from purelayers.layers import recurrent as _recurrent
from purelayers.layers import repeat as _repeat
from purelayers.layers import shape as _shape
from purelayers.layers import shuffle as _shuffle
from purelayers.layers import thresholds as _thresholds
from purelayers.layers import tied as _tied
from purelayers.layers import transformer as _transformer
from purelayers.layers import unpool as _unpool
from purelayers.layers import upsample as _upsample
from purelayers.layers._checks import LayerError
from purelayers.layers.activation import *
from purelayers.layers.attention import *
from purelayers.layers.bilinear import *
from purelayers.layers.conv import *
from purelayers.layers.core import *
from purelayers.layers.distance import *
from purelayers.layers.dropout import *
from purelayers.layers.embedding import *
from purelayers.layers.embedding_bag import *
from purelayers.layers.encoder_decoder import *
from purelayers.layers.fold import *
from purelayers.layers.fractional import *
from purelayers.layers.instancenorm import *
from purelayers.layers.linear import *
from purelayers.layers.lppool import *
from purelayers.layers.lrn import *
from purelayers.layers.multihead import *
from purelayers.layers.norm import *
from purelayers.layers.padding import *
from purelayers.layers.parametrize import *
from purelayers.layers.pool import *
from purelayers.layers.recurrent import *
from purelayers.layers.repeat import *
from purelayers.layers.shape import *
from purelayers.layers.shuffle import *
from purelayers.layers.thresholds import *
from purelayers.layers.tied import *
from purelayers.layers.transformer import *
from purelayers.layers.unpool import *
from purelayers.layers.upsample import *

__all__ = [
    "LayerError",
    *_core.__all__,
    *_linear.__all__,
    *_bilinear.__all__,
    *_distance.__all__,
    *_activation.__all__,
    *_thresholds.__all__,
    *_dropout.__all__,
    *_attention.__all__,
    *_multihead.__all__,
    *_transformer.__all__,
    *_encoder_decoder.__all__,
    *_repeat.__all__,
    *_tied.__all__,
    *_conv.__all__,
    *_pool.__all__,
    *_lppool.__all__,
    *_fractional.__all__,
    *_unpool.__all__,
    *_padding.__all__,
    *_upsample.__all__,
    *_shuffle.__all__,
    *_fold.__all__,
    *_shape.__all__,
    *_embedding.__all__,
    *_embedding_bag.__all__,
    *_norm.__all__,
    *_instancenorm.__all__,
    *_lrn.__all__,
    *_recurrent.__all__,
    *_parametrize.__all__,
]
