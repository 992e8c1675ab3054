"""Pure array functions, ``torch.nn.functional``'s counterpart: ``import purelayers.functional as F``.

Every layer's ``apply`` calls these for its math. This package is the one home of
platform-specific fast paths, custom derivatives and ``lax``-level code; each fast path sits
beside a plain reference formulation that the tests show equal to it.
"""

import importlib as _importlib

from purelayers.functional.activation import *
from purelayers.functional.attention import *
from purelayers.functional.conv import *
from purelayers.functional.distance import *
from purelayers.functional.linear import *
from purelayers.functional.moe import *
from purelayers.functional.normalization import *
from purelayers.functional.pooling import *
from purelayers.functional.recurrent import *

_FAMILIES = (
    "activation",
    "attention",
    "conv",
    "distance",
    "linear",
    "moe",
    "normalization",
    "pooling",
    "recurrent",
)

__all__ = [
    name
    for family in _FAMILIES
    for name in _importlib.import_module(f"{__name__}.{family}").__all__
]
