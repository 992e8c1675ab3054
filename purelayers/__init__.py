"""purelayers: functional neural-network layers on JAX whose checkpoints are PyTorch checkpoints."""

from purelayers import (
    debug,
    functional,
    init,
    layers,
    lora,
    models,
    params,
    precision,
    sharding,
    testing,
)
from purelayers.layers._capture import capture

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "capture",
    "debug",
    "functional",
    "init",
    "layers",
    "lora",
    "models",
    "params",
    "precision",
    "sharding",
    "testing",
]
