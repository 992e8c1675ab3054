"""Dropout: ``Dropout``, channel-wise ``Dropout1d/2d/3d``, ``AlphaDropout`` and
``FeatureAlphaDropout``.

Every one is the identity in eval mode (``train=False``) and at ``p = 0``; in train mode
it draws its mask from ``key`` (required). ``p = 1`` drops everything, as torch, which
returns ``x * 0``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.layers._checks import LayerError, check_float, need_key
from purelayers.layers.core import Layer, Params

__all__ = [
    "AlphaDropout",
    "Dropout",
    "Dropout1d",
    "Dropout2d",
    "Dropout3d",
    "FeatureAlphaDropout",
    "dropout",
]

# SELU's saturation value -scale * alpha, negated: where alpha dropout sends dropped units
_SELU_SATURATION = 1.7580993408473766


def dropout(x: jax.Array, p: float, key: jax.Array, *, layer: str = "dropout") -> jax.Array:
    """Inverted dropout: zero each entry with probability ``p`` and scale the rest by
    ``1 / (1 - p)``, so the expectation is unchanged. ``key`` is required."""
    return _masked(x, p, key, jnp.shape(x), False, layer)


def _masked(
    x: Any, p: float, key: jax.Array | None, mask_shape: tuple, alpha: bool, layer: str
) -> jax.Array:
    """Dropout with one Bernoulli draw per entry of ``mask_shape`` (broadcast over ``x``):
    torch's alpha dropout where ``alpha``, else inverted dropout."""
    if p == 0.0:
        return x
    need_key(layer, key)
    if math.prod(jnp.shape(x)) == 0:
        return x
    if p == 1.0:
        return x * 0 if jnp.issubdtype(jnp.result_type(x), jnp.inexact) else jnp.zeros_like(x)
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
        raise LayerError(
            layer,
            "input dtype in train mode",
            "floating point",
            jnp.dtype(jnp.result_type(x)).name,
            "as torch, which cannot scale integer, bool or complex inputs by 1 / (1 - p); "
            "eval mode, p=0 and p=1 pass them through",
        )
    keep = jax.random.bernoulli(key, 1.0 - p, mask_shape)
    if not alpha:
        return jnp.where(keep, x / (1.0 - p), jnp.zeros_like(x))
    a = 1.0 / math.sqrt((_SELU_SATURATION**2 * p + 1) * (1 - p))
    kept = a * x + _SELU_SATURATION * a * p
    return jnp.where(keep, kept, jnp.full_like(kept, _SELU_SATURATION * a * (p - 1)))


def _check_p(layer: str, p: Any) -> None:
    check_float(layer, "p", p, low=0.0, high=1.0)


@dataclasses.dataclass(frozen=True)
class Dropout(Layer):
    r"""Zeroes random entries in training: ``y = x * m / (1 - p)``, ``m ~ Bernoulli(1 - p)``.

    The mask is drawn from ``key`` (required in training: a ``ValueError`` says so when it
    is missing). In eval mode (``train=False``), or at ``p = 0``, it is the identity; at
    ``p = 1`` the output is ``x * 0``, as torch. Matches ``torch.nn.Dropout`` in
    distribution.

    Args:
      p: probability of zeroing an entry, in ``[0, 1]``. Default ``0.5``.
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      any; output the same shape and dtype.

    Parameters: none.

    Example:
      >>> y = Dropout(0.5).apply({}, jnp.ones(8), train=True, key=jax.random.key(0))
      >>> sorted(set(y.tolist()))   # each entry dropped or doubled
      [0.0, 2.0]
      >>> Dropout(0.5).apply({}, jnp.ones(3)).tolist()   # eval mode: the identity
      [1.0, 1.0, 1.0]
    """

    p: float = 0.5

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def __post_init__(self):
        _check_p("Dropout", self.p)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        if not train:
            return x
        return dropout(x, self.p, key, layer="Dropout")


@dataclasses.dataclass(frozen=True)
class _ChannelDropout(Layer):
    """Shared implementation of Dropout1d/2d/3d (documented on Dropout2d)."""

    _ranks: ClassVar[tuple[int, ...]] = ()  # the ranks it takes
    _unbatched: ClassVar[int | None] = None  # the rank of one sample (C, *spatial)
    _layout: ClassVar[str] = ""

    p: float = 0.5

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def __post_init__(self):
        _check_p(type(self).__name__, self.p)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        shape = tuple(jnp.shape(x))
        if len(shape) not in self._ranks:
            raise LayerError(
                type(self).__name__,
                "input rank",
                f"{' or '.join(map(str, self._ranks))} {self._layout}",
                f"{len(shape)} (x.shape == {shape})",
            )
        if not train:
            return x
        channels = 1 if len(shape) == self._unbatched else 2
        mask = shape[:channels] + (1,) * (len(shape) - channels)
        return _masked(x, self.p, key, mask, False, type(self).__name__)


@dataclasses.dataclass(frozen=True)
class Dropout1d(_ChannelDropout):
    r"""Drops whole channels in training: ``y = x * m[n, c] / (1 - p)``, ``m ~ Bernoulli(1 - p)``.

    One draw from ``key`` (required in training) per channel of each sample of ``(N, C, L)``
    or one ``(C, L)``; eval mode (``train=False``) or ``p = 0`` is the identity, ``p = 1``
    gives ``x * 0``. Matches ``torch.nn.Dropout1d(p)`` in distribution.

    Args:
      p: probability of zeroing a channel, in ``[0, 1]``. Default ``0.5``.
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      input ``(N, C, L)`` or ``(C, L)``; output the same shape and dtype.

    Parameters: none.

    Example:
      >>> y = Dropout1d(0.5).apply({}, jnp.ones((2, 3, 4)), train=True, key=jax.random.key(0))
      >>> bool(jnp.all((y == 0).all(axis=2) | (y == 2).all(axis=2)))
      True
    """

    _ranks: ClassVar[tuple[int, ...]] = (2, 3)
    _unbatched: ClassVar[int | None] = 2
    _layout: ClassVar[str] = "(N, C, L) or (C, L)"


@dataclasses.dataclass(frozen=True)
class Dropout2d(_ChannelDropout):
    r"""Drops whole channels in training: ``y = x * m[n, c] / (1 - p)``, ``m ~ Bernoulli(1 - p)``.

    One draw from ``key`` (required in training) per channel of each sample of ``(N, C, H,
    W)``; eval mode (``train=False``) or ``p = 0`` is the identity, ``p = 1`` gives ``x *
    0``. Matches ``torch.nn.Dropout2d(p)`` in distribution. A 3-d input is ``(N, C, L)``, as
    torch 2.13 reads it (with a warning that this will change); other ranks, which torch
    deprecates, are an error.

    Args:
      p: probability of zeroing a channel, in ``[0, 1]``. Default ``0.5``.
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      input ``(N, C, H, W)`` or ``(N, C, L)``; output the same shape and dtype.

    Parameters: none.

    Example:
      >>> y = Dropout2d(0.5).apply({}, jnp.ones((2, 3, 4, 4)), train=True, key=jax.random.key(0))
      >>> bool(jnp.all((y == 0).all(axis=(2, 3)) | (y == 2).all(axis=(2, 3))))
      True
    """

    _ranks: ClassVar[tuple[int, ...]] = (3, 4)
    _layout: ClassVar[str] = "(N, C, L) or (N, C, H, W)"


@dataclasses.dataclass(frozen=True)
class Dropout3d(_ChannelDropout):
    r"""Drops whole channels in training: ``y = x * m[n, c] / (1 - p)``, ``m ~ Bernoulli(1 - p)``.

    One draw from ``key`` (required in training) per channel of each sample of ``(N, C, D,
    H, W)`` or one ``(C, D, H, W)``; eval mode (``train=False``) or ``p = 0`` is the
    identity, ``p = 1`` gives ``x * 0``. Matches ``torch.nn.Dropout3d(p)`` in distribution.

    Args:
      p: probability of zeroing a channel, in ``[0, 1]``. Default ``0.5``.
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      input ``(N, C, D, H, W)`` or ``(C, D, H, W)``; output the same shape and dtype.

    Parameters: none.

    Example:
      >>> x = jnp.ones((2, 3, 2, 2, 2))
      >>> Dropout3d(0.2).apply({}, x, train=True, key=jax.random.key(0)).shape
      (2, 3, 2, 2, 2)
    """

    _ranks: ClassVar[tuple[int, ...]] = (4, 5)
    _unbatched: ClassVar[int | None] = 4
    _layout: ClassVar[str] = "(N, C, D, H, W) or (C, D, H, W)"


@dataclasses.dataclass(frozen=True)
class AlphaDropout(Layer):
    r"""SELU's dropout: ``y = a * (x + alpha' * p)`` if kept, else ``a * alpha' * (p - 1)``.

    In train mode each entry is dropped with probability ``p`` (drawn from ``key``,
    required) to SELU's saturation value, then transformed affinely with ``alpha' =
    1.7580993408473766`` (SELU's ``scale * alpha``) and ``a = 1 / sqrt((alpha'^2 p + 1)(1 -
    p))``, so zero-mean unit-variance inputs keep both moments. Eval mode or ``p = 0``: the
    identity; ``p = 1``: ``x * 0``, as torch. Matches ``torch.nn.AlphaDropout(p)`` in
    distribution.

    Args:
      p: probability of dropping an entry, in ``[0, 1]``. Default ``0.5``.
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      any; output the same shape and dtype.

    Parameters: none.

    Example:
      >>> y = AlphaDropout(0.5).apply({}, jnp.zeros(64), train=True, key=jax.random.key(0))
      >>> sorted(set(np.asarray(y, np.float64).round(4).tolist()))  # a = 0.8864
      [-0.7792, 0.7792]
    """

    _feature: ClassVar[bool] = False

    p: float = 0.5

    inplace: bool = False  # torch's flag, accepted for its signature: apply is pure

    def __post_init__(self):
        _check_p(type(self).__name__, self.p)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        if not train:
            return x
        shape = tuple(jnp.shape(x))
        if self._feature:
            if len(shape) < 2:
                raise LayerError(
                    type(self).__name__,
                    "input rank (train=True drops whole channels of (N, C, *))",
                    "at least 2",
                    f"{len(shape)} (x.shape == {shape})",
                )
            shape = shape[:2] + (1,) * (len(shape) - 2)
        return _masked(x, self.p, key, shape, True, type(self).__name__)


@dataclasses.dataclass(frozen=True)
class FeatureAlphaDropout(AlphaDropout):
    r"""Channel alpha dropout: ``y = a * (x + alpha' * p)`` if kept, else ``a * alpha' * (p - 1)``.

    ``alpha'`` and ``a`` as in ``AlphaDropout``, with one draw from ``key`` (required in
    training) per channel of each sample of ``(N, C, *)``. Eval mode or ``p = 0``: the
    identity. Matches ``torch.nn.FeatureAlphaDropout(p)`` in distribution.

    Args:
      p: probability of dropping a channel, in ``[0, 1]``. Default ``0.5``.
      inplace: torch's flag, ignored (``apply`` is pure). Default ``False``.

    Shape:
      input ``(N, C, *)`` (train mode needs the two axes); output the same shape and
      dtype.

    Parameters: none.

    Example:
      >>> x = jnp.zeros((2, 3, 4))
      >>> y = FeatureAlphaDropout(0.5).apply({}, x, train=True, key=jax.random.key(0))
      >>> bool(jnp.all(y == y[:, :, :1]))   # one value per channel
      True
    """

    _feature: ClassVar[bool] = True
