"""Activations: parameter-free layers over ``purelayers.functional``'s activation
functions (re-exported here, so ``L.relu`` is ``F.relu``): the rectifiers and
self-gated ones (``elementwise``), the squashing ones (``squashing``), the gated ones
(``gated``), the softmax family, the thresholds and shrinks, and the learned-slope
``PReLU``.

Shape: every activation maps ``(...)`` to the same shape and dtype, except the gated
ones (``SwiGLU``, ``GLU``), which halve an axis.
"""

from purelayers.layers.activation import elementwise as _elementwise
from purelayers.layers.activation import gated as _gated
from purelayers.layers.activation import prelu as _prelu
from purelayers.layers.activation import softmax as _softmax
from purelayers.layers.activation import squashing as _squashing
from purelayers.layers.activation import thresholds as _thresholds
from purelayers.layers.activation.elementwise import *
from purelayers.layers.activation.elementwise import _Activation
from purelayers.layers.activation.gated import *
from purelayers.layers.activation.prelu import *
from purelayers.layers.activation.softmax import *
from purelayers.layers.activation.squashing import *
from purelayers.layers.activation.thresholds import *

__all__ = sorted(
    {
        *_elementwise.__all__,
        *_gated.__all__,
        *_prelu.__all__,
        *_softmax.__all__,
        *_squashing.__all__,
        *_thresholds.__all__,
    }
)
