"""Layers: frozen configurations with pure ``init`` and ``apply`` functions.

One module per family; each lists its public names in ``__all__``, and this package
exports exactly those: a new layer joins its family module's ``__all__`` and nothing here.
"""

import importlib as _importlib

from purelayers.layers.activation import *
from purelayers.layers.attention import *
from purelayers.layers.bilinear import *
from purelayers.layers.cells import *
from purelayers.layers.conv import *
from purelayers.layers.core import *
from purelayers.layers.distance import *
from purelayers.layers.dropout import *
from purelayers.layers.embedding import *
from purelayers.layers.embedding_bag import *
from purelayers.layers.encoder_decoder import *
from purelayers.layers.encoder_decoder_stack import *
from purelayers.layers.errors import LayerError
from purelayers.layers.fold import *
from purelayers.layers.fractional import *
from purelayers.layers.instancenorm import *
from purelayers.layers.linear import *
from purelayers.layers.lppool import *
from purelayers.layers.lrn import *
from purelayers.layers.moe import *
from purelayers.layers.multihead import *
from purelayers.layers.norm import *
from purelayers.layers.padding import *
from purelayers.layers.parametrize import *
from purelayers.layers.pool import *
from purelayers.layers.recurrent import *
from purelayers.layers.repeat import *
from purelayers.layers.separate_attention import *
from purelayers.layers.shape import *
from purelayers.layers.shuffle import *
from purelayers.layers.tied import *
from purelayers.layers.transformer import *
from purelayers.layers.unpool import *
from purelayers.layers.upsample import *

_FAMILIES = (
    "activation",
    "attention",
    "bilinear",
    "cells",
    "conv",
    "core",
    "distance",
    "dropout",
    "embedding",
    "embedding_bag",
    "encoder_decoder",
    "encoder_decoder_stack",
    "fold",
    "fractional",
    "instancenorm",
    "linear",
    "lppool",
    "lrn",
    "moe",
    "multihead",
    "norm",
    "padding",
    "parametrize",
    "pool",
    "recurrent",
    "repeat",
    "separate_attention",
    "shape",
    "shuffle",
    "tied",
    "transformer",
    "unpool",
    "upsample",
)

__all__ = [
    "LayerError",
    *(
        name
        for family in _FAMILIES
        for name in _importlib.import_module(f"{__name__}.{family}").__all__
    ),
]
