"""The four benchmark workloads: their shapes, their data and their purelayers models.

Every implementation builds the same model and starts from the same weights: the
purelayers parameters below, flattened to their PyTorch ``state_dict`` names, are copied
into every other library by name (``impl_*.py``). Each model ends in ``classes`` logits
trained with softmax cross-entropy on integer labels.

- ``mlp``: 784-1024-1024-10 with ReLU, batch 256.
- ``cnn``: 2 x (Conv2d 3x3 padding 1 + ReLU + MaxPool2d 2) with 32 and 64 channels, then
  Flatten -> Linear 128 -> ReLU -> Linear 10, on ``[128, 1, 28, 28]``.
- ``transformer``: 4 pre-norm GPT-2 blocks (``x + attn(ln1(x))``, ``x + mlp(ln2(x))``;
  causal 8-head attention with a packed ``qkv`` projection; MLP 4x with tanh GELU),
  d_model 256, on float features ``[16, 128, 256]`` (an embedded sequence), a final
  LayerNorm and a per-position linear head to 10 classes.
- ``lstm``: one LSTM layer, 64 inputs, 256 hidden, time-major ``[100, 32, 64]``, and a
  linear head on the last step's output.

``quick`` variants keep the structure at tiny sizes for the smoke test.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers import layers as L
from purelayers import params as P

__all__ = ["WORKLOADS", "Workload", "get", "loss_from_logits"]


@dataclasses.dataclass(frozen=True)
class Workload:
    """One model and batch. ``dims`` holds the sizes every implementation reads."""

    name: str
    x_shape: tuple[int, ...]
    y_shape: tuple[int, ...]
    classes: int
    dims: dict[str, int]

    def data(self, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(self.x_shape, dtype=np.float32)
        y = rng.integers(0, self.classes, self.y_shape).astype(np.int32)
        return x, y

    def model(self) -> L.Layer:
        return _MODELS[self.name](self)

    def flat_params(self, seed: int = 0) -> dict[str, np.ndarray]:
        """The shared initial weights under PyTorch ``state_dict`` names."""
        params = self.model().init(jax.random.key(seed), self.x_shape)
        return {k: np.asarray(v) for k, v in P.flatten(params).items()}


def loss_from_logits(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy (optax), computed in float32."""
    import optax

    logits = logits.astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


# -- purelayers models -----------------------------------------------------------------


def _maxpool2() -> L.Layer:
    try:
        from purelayers.layers.pool import MaxPool2d
    except ImportError:  # pooling not yet part of the installed layers
        return L.Lambda(_max_pool_2x2)
    return MaxPool2d(2)


def _max_pool_2x2(x: jax.Array) -> jax.Array:
    init = jnp.array(-jnp.inf, x.dtype)
    return jax.lax.reduce_window(x, init, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


def _mlp(w: Workload) -> L.Layer:
    h = w.dims["hidden"]
    return L.Sequential(L.Linear(h), L.ReLU(), L.Linear(h), L.ReLU(), L.Linear(w.classes))


def _cnn(w: Workload) -> L.Layer:
    c1, c2, h = w.dims["c1"], w.dims["c2"], w.dims["hidden"]
    return L.Sequential(
        L.Conv2d(c1, 3, padding=1),
        L.ReLU(),
        _maxpool2(),
        L.Conv2d(c2, 3, padding=1),
        L.ReLU(),
        _maxpool2(),
        L.Flatten(),
        L.Linear(h),
        L.ReLU(),
        L.Linear(w.classes),
    )


@dataclasses.dataclass(frozen=True)
class Block(L.Layer):
    """A GPT-2 pre-norm block: ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``."""

    ln1: L.Layer
    attn: L.Layer
    ln2: L.Layer
    mlp: L.Layer

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict:
        return {
            name: child.init(jax.random.fold_in(key, i), shape, dtype)
            for i, (name, child) in enumerate(self.children().items())
        }

    def apply(self, params: dict, x: Any, *, key: jax.Array | None = None, train: bool = False):
        x = x + self.call("attn", params, self.call("ln1", params, x))
        return x + self.call("mlp", params, self.call("ln2", params, x))


def block(d: int, heads: int) -> Block:
    mlp = L.Sequential(L.Linear(4 * d), L.GELU(approximate="tanh"), L.Linear(d))
    return Block(L.LayerNorm(), L.MultiHeadAttention(heads, causal=True), L.LayerNorm(), mlp)


@dataclasses.dataclass(frozen=True)
class GPT(L.Layer):
    """``blocks`` (a ``Sequential``) then ``ln_f`` then a per-position ``head``."""

    blocks: L.Sequential
    ln_f: L.Layer
    head: L.Layer

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict:
        return {
            name: child.init(jax.random.fold_in(key, i), shape, dtype)
            for i, (name, child) in enumerate(self.children().items())
        }

    def apply(self, params: dict, x: Any, *, key: jax.Array | None = None, train: bool = False):
        x = self.call("blocks", params, x)
        return self.call("head", params, self.call("ln_f", params, x))


def _transformer(w: Workload) -> L.Layer:
    d = w.x_shape[-1]
    blocks = L.Sequential(*(block(d, w.dims["heads"]) for _ in range(w.dims["layers"])))
    return GPT(blocks, L.LayerNorm(), L.Linear(w.classes))


@dataclasses.dataclass(frozen=True)
class LSTMClassifier(L.Layer):
    """``head(lstm(x)[-1])``: an LSTM over time-major ``x`` and a linear head on the last step."""

    lstm: L.Layer
    head: L.Layer

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> dict:
        hidden = self.lstm.hidden_size
        return {
            "lstm": self.lstm.init(jax.random.fold_in(key, 0), shape, dtype),
            "head": self.head.init(jax.random.fold_in(key, 1), (shape[1], hidden), dtype),
        }

    def apply(self, params: dict, x: Any, *, key: jax.Array | None = None, train: bool = False):
        out, _ = self.call("lstm", params, x)
        return self.call("head", params, out[-1])


def _lstm(w: Workload) -> L.Layer:
    return LSTMClassifier(L.LSTM(w.dims["hidden"]), L.Linear(w.classes))


_MODELS = {"mlp": _mlp, "cnn": _cnn, "transformer": _transformer, "lstm": _lstm}


def _make(quick: bool) -> dict[str, Workload]:
    if quick:
        return {
            "mlp": Workload("mlp", (8, 784), (8,), 10, {"hidden": 32}),
            "cnn": Workload("cnn", (4, 1, 28, 28), (4,), 10, {"c1": 4, "c2": 8, "hidden": 16}),
            "transformer": Workload(
                "transformer", (2, 8, 32), (2, 8), 10, {"layers": 2, "heads": 4}
            ),
            "lstm": Workload("lstm", (5, 4, 8), (4,), 10, {"hidden": 16}),
        }
    return {
        "mlp": Workload("mlp", (256, 784), (256,), 10, {"hidden": 1024}),
        "cnn": Workload("cnn", (128, 1, 28, 28), (128,), 10, {"c1": 32, "c2": 64, "hidden": 128}),
        "transformer": Workload(
            "transformer", (16, 128, 256), (16, 128), 10, {"layers": 4, "heads": 8}
        ),
        "lstm": Workload("lstm", (100, 32, 64), (32,), 10, {"hidden": 256}),
    }


WORKLOADS = tuple(_MODELS)


def get(name: str, *, quick: bool = False) -> Workload:
    return _make(quick)[name]
