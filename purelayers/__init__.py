"""purelayers: functional neural-network layers on JAX whose checkpoints are PyTorch checkpoints."""

from purelayers import debug, init, layers, lora, params, precision, sharding, testing

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "debug",
    "init",
    "layers",
    "lora",
    "params",
    "precision",
    "sharding",
    "testing",
]
