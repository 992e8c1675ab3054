r"""The LoRA layers ``purelayers.lora.wrap`` puts in place of its targets: a frozen base
layer plus a trainable low-rank update, under PEFT's names and with PEFT's defaults.

``LoraLinear`` (PEFT's ``lora.Linear``), ``LoraEmbedding`` (``lora.Embedding``) and
``LoraConv`` (``lora.Conv1d``/``Conv2d``/``Conv3d``). Each keeps the base layer's own
arrays under their names (``weight``, ``bias``) and adds the adapter beside them, so a
wrapped ``q_proj`` flattens to ``q_proj.weight``, ``q_proj.bias``,
``q_proj.lora_A.weight``, ``q_proj.lora_B.weight``: PEFT's ``state_dict`` names less its
``base_layer.`` and adapter-name (``default.``) components.

The update is scaled by ``lora_alpha / r`` (``lora_alpha / sqrt(r)`` with
``use_rslora``), as PEFT's ``scaling``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.init import normal, zeros
from purelayers.layers._checks import check_float, check_int, config_error, promote_float
from purelayers.layers.conv import Conv1d, Conv2d, Conv3d, _ConvNd
from purelayers.layers.core import Layer, Params
from purelayers.layers.dropout import dropout
from purelayers.layers.embedding import Embedding, _gather_rows
from purelayers.layers.linear import TORCH_DEFAULT_WEIGHT, Linear

__all__ = ["SUPPORTED", "LoraConv", "LoraEmbedding", "LoraLinear", "check_settings", "lora_layer"]

# The layer types LoRA wraps (PEFT: nn.Linear, transformers' Conv1D, nn.Embedding, nn.ConvNd).
SUPPORTED: tuple[type, ...] = (Linear, Embedding, Conv1d, Conv2d, Conv3d)


def check_settings(who: str, r: Any, lora_alpha: Any, lora_dropout: Any, use_rslora: Any) -> None:
    """The hyperparameters every LoRA layer shares, checked with ``who`` in the message."""
    check_int(who, "r", r)
    check_float(who, "lora_alpha", lora_alpha, low=0.0, low_open=True)
    check_float(who, "lora_dropout", lora_dropout, low=0.0, high=1.0, high_open=True)
    if not isinstance(use_rslora, bool):
        raise config_error(who, "use_rslora", "True or False", use_rslora)


def _f32(a: jax.Array) -> jax.Array:
    return a.astype(promote_float(a.dtype))


def adapter_dtype(base_dtype: Any) -> Any:
    """The adapters' dtype for a base weight of ``base_dtype``: float32 over a float16 or
    bfloat16 base, as PEFT's ``autocast_adapter_dtype=True`` (its default) makes them,
    else the base's."""
    return jnp.float32 if base_dtype in (jnp.float16, jnp.bfloat16) else base_dtype


def _plus(y: jax.Array, update: jax.Array) -> jax.Array:
    """``y + update`` in the wider of the two dtypes, back in ``y``'s (PEFT: the sum
    promotes, then the result is cast to the base output's dtype)."""
    if update.dtype == y.dtype:
        return y + update
    return (y.astype(jnp.promote_types(y.dtype, update.dtype)) + update).astype(y.dtype)


@dataclasses.dataclass(frozen=True)
class _Lora(Layer):
    """What the three LoRA layers share: the settings, the scaling, the base's names.

    Each defines ``adapter_shapes(weight_shape) -> {relative name: shape}`` (the adapter
    for a base ``weight`` of that shape), ``init_adapter(key, weight_shape, dtype)`` (its
    initial arrays, nested as the params tree holds them) and ``delta(params)``
    (``scaling * B @ A`` in the base ``weight``'s layout, leading block axes kept, in at
    least float32: what ``merge`` adds, PEFT's ``get_delta_weight``).
    """

    base: Layer
    r: int = 8
    lora_alpha: float = 8
    lora_dropout: float = 0.0
    use_rslora: bool = False

    base_types: ClassVar[tuple[type, ...]] = ()
    base_rule: ClassVar[str] = ""
    adapter_keys: ClassVar[tuple[str, str]] = ("lora_A.weight", "lora_B.weight")

    @property
    def weight_rank(self) -> int:
        """The number of axes of the base ``weight``."""
        return 2

    def __post_init__(self):
        name = type(self).__name__
        if not isinstance(self.base, self.base_types):
            raise config_error(name, "base", self.base_rule, self.base)
        check_settings(name, self.r, self.lora_alpha, self.lora_dropout, self.use_rslora)
        object.__setattr__(self, "_kids", self._adapter_layers())

    def _adapter_layers(self) -> dict[str, Layer]:
        return {}

    @property
    def scaling(self) -> float:
        """``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with ``use_rslora`` (PEFT's)."""
        return self.lora_alpha / (math.sqrt(self.r) if self.use_rslora else self.r)

    @property
    def takes_ids(self) -> bool:
        return self.base.takes_ids

    @property
    def accepts(self) -> tuple[str, ...]:
        """The input dtypes the base layer takes."""
        return getattr(self.base, "accepts", ("floating", "integer", "bool"))

    def children(self) -> dict[str, Layer]:
        return dict(self._kids)

    def base_params(self, params: Params) -> Params:
        return {k: params[k] for k in self.base.own_names()}

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        """The base layer's params as ``base.init(key, shape, dtype)`` draws them, then the
        adapter from ``fold_in(key, 1)``."""
        params = self.base.init(key, shape, dtype)
        weight = params["weight"]
        adapter = self.init_adapter(
            jax.random.fold_in(key, 1), tuple(weight.shape), adapter_dtype(weight.dtype)
        )
        return {**params, **adapter}

    def _update(self, params: Params, x: Any, key: jax.Array | None, train: bool) -> jax.Array:
        """``B(A(dropout(x)))``, dropout drawn from ``key`` in train mode only."""
        x, a = jnp.asarray(x), params["lora_A"]["weight"]
        if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != a.dtype:
            x = x.astype(a.dtype)  # PEFT: the adapter's input in the adapter's dtype
        if train and self.lora_dropout > 0.0:
            x = dropout(x, self.lora_dropout, key, layer=type(self).__name__)
        return self.call("lora_B", params, self.call("lora_A", params, x))


@dataclasses.dataclass(frozen=True)
class LoraLinear(_Lora):
    r"""A frozen ``Linear`` plus a low-rank update: ``y = base(x) + s * B(A(dropout(x)))``.

    Matches PEFT's ``lora.Linear`` (``s = lora_alpha / r``, or ``lora_alpha / sqrt(r)``
    with ``use_rslora``; dropout on the adapter's input, in train mode, from ``key``).
    A transposed base (GPT-2's ``Conv1D``, PEFT's ``fan_in_fan_out=True``) keeps its
    ``[in, out]`` weight; ``A`` and ``B`` are plain ``Linear``\ s either way.

    Args:
      base: the ``Linear`` (either layout).
      r: the rank. Default ``8``.
      lora_alpha: the scale numerator. Default ``8``.
      lora_dropout: dropout probability on the adapter's input. Default ``0.0``.
      use_rslora: scale by ``lora_alpha / sqrt(r)``. Default ``False``.

    Shape:
      as ``base``: ``(..., in)`` to ``(..., out)``.

    Parameters:
      ``base``'s (``weight`` ``[out, in]``, or ``[in, out]`` transposed; ``bias``), then
      ``lora_A.weight`` ``[r, in]`` (``kaiming_uniform(a=sqrt(5))``, PEFT's default) and
      ``lora_B.weight`` ``[out, r]`` (zeros).

    Example:
      >>> lin = LoraLinear(L.Linear(3), r=2, lora_alpha=4)
      >>> list(pl.params.flatten(lin.init(jax.random.key(0), (8, 5))))
      ['weight', 'bias', 'lora_A.weight', 'lora_B.weight']
    """

    base_types: ClassVar[tuple[type, ...]] = (Linear,)
    base_rule: ClassVar[str] = "a Linear"

    def _adapter_layers(self) -> dict[str, Layer]:
        return {
            "lora_A": Linear(self.r, bias=False, weight_init=TORCH_DEFAULT_WEIGHT),
            "lora_B": Linear(self.base.out_features, bias=False, weight_init=zeros()),
        }

    def own_names(self) -> tuple[str, ...]:
        return self.base.own_names()

    def _in_out(self, weight_shape: tuple[int, ...]) -> tuple[int, int]:
        a, b = weight_shape[-2:]
        return (a, b) if self.base.transposed else (b, a)

    def adapter_shapes(self, weight_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        fan_in, out = self._in_out(weight_shape)
        return {"lora_A.weight": (self.r, fan_in), "lora_B.weight": (out, self.r)}

    def init_adapter(self, key: jax.Array, weight_shape: tuple[int, ...], dtype: Any) -> Params:
        fan_in, _ = self._in_out(weight_shape)
        return {
            "lora_A": self._kids["lora_A"].init(jax.random.fold_in(key, 0), (fan_in,), dtype),
            "lora_B": self._kids["lora_B"].init(jax.random.fold_in(key, 1), (self.r,), dtype),
        }

    def delta(self, params: Params) -> jax.Array:
        a, b = _f32(params["lora_A"]["weight"]), _f32(params["lora_B"]["weight"])
        d = jnp.matmul(b, a) * self.scaling
        return jnp.swapaxes(d, -1, -2) if self.base.transposed else d

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        y = self.base.apply(self.base_params(params), x)
        return _plus(y, self._update(params, x, key, train) * self.scaling)


@dataclasses.dataclass(frozen=True)
class LoraEmbedding(_Lora):
    r"""A frozen ``Embedding`` plus a low-rank update:
    ``y = weight[ids] + s * A.T[ids] @ B.T``.

    Matches PEFT's ``lora.Embedding``: its own arrays ``lora_embedding_A`` and
    ``lora_embedding_B`` (no ``.weight``), ``A`` zeros and ``B`` ``N(0, 1)`` (so the
    update starts at zero), no dropout (PEFT's embedding forward applies none), and the
    base's ``padding_idx`` row of ``A.T`` gets no gradient (``F.embedding``'s rule).

    Args: as ``LoraLinear``'s, with ``base`` an ``Embedding``.

    Shape:
      ids of any shape ``S``; output ``(*S, embedding_dim)``.

    Parameters:
      ``weight`` ``[num_embeddings, embedding_dim]`` (the base's), ``lora_embedding_A``
      ``[r, num_embeddings]`` (zeros), ``lora_embedding_B`` ``[embedding_dim, r]``
      (``N(0, 1)``).
    """

    base_types: ClassVar[tuple[type, ...]] = (Embedding,)
    base_rule: ClassVar[str] = "an Embedding"
    adapter_keys: ClassVar[tuple[str, str]] = ("lora_embedding_A", "lora_embedding_B")

    def own_names(self) -> tuple[str, ...]:
        return (*self.base.own_names(), "lora_embedding_A", "lora_embedding_B")

    def adapter_shapes(self, weight_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        num, dim = weight_shape[-2:]
        return {"lora_embedding_A": (self.r, num), "lora_embedding_B": (dim, self.r)}

    def init_adapter(self, key: jax.Array, weight_shape: tuple[int, ...], dtype: Any) -> Params:
        num, dim = weight_shape[-2:]
        return {
            "lora_embedding_A": zeros()(key, (self.r, num), dtype),
            "lora_embedding_B": normal(std=1.0)(jax.random.fold_in(key, 1), (dim, self.r), dtype),
        }

    def base_params(self, params: Params) -> Params:
        return {"weight": params["weight"]}

    def delta(self, params: Params) -> jax.Array:
        a, b = _f32(params["lora_embedding_A"]), _f32(params["lora_embedding_B"])
        return jnp.swapaxes(jnp.matmul(b, a), -1, -2) * self.scaling

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        y = self.base.apply(self.base_params(params), x)
        ids = jnp.asarray(x)
        after_a = _gather_rows(params["lora_embedding_A"].T, ids)  # (*S, r)
        if self.base.padding_idx is not None:
            pad = (ids == self.base.padding_idx)[..., None]
            after_a = jnp.where(pad, jax.lax.stop_gradient(after_a), after_a)
        b = params["lora_embedding_B"].astype(after_a.dtype)
        update = jnp.einsum("...r,dr->...d", after_a, b)
        return _plus(y, update * self.scaling)


@dataclasses.dataclass(frozen=True)
class LoraConv(_Lora):
    r"""A frozen ``Conv1d``/``Conv2d``/``Conv3d`` plus a low-rank update:
    ``y = base(x) + s * B(A(dropout(x)))``.

    Matches PEFT's ``lora.Conv2d`` (and ``Conv1d``, ``Conv3d``): ``A`` is a convolution
    of the base's class with ``r`` output channels and the base's kernel size, stride
    and padding; ``B`` a ``1 x 1`` convolution to the base's output channels. As PEFT's
    ``A`` drops them, the base must have ``groups=1``, ``dilation=1`` and
    ``padding_mode="zeros"`` (a ``ValueError`` otherwise).

    Args: as ``LoraLinear``'s, with ``base`` a convolution.

    Shape:
      as ``base``: ``(N, C_in, *L)`` to ``(N, C_out, *L_out)``.

    Parameters:
      ``base``'s (``weight`` ``[out, in, *k]``, ``bias``), ``lora_A.weight``
      ``[r, in, *k]`` (``kaiming_uniform(a=sqrt(5))``), ``lora_B.weight``
      ``[out, r, 1, ...]`` (zeros).
    """

    base_types: ClassVar[tuple[type, ...]] = (Conv1d, Conv2d, Conv3d)
    base_rule: ClassVar[str] = "a Conv1d, Conv2d or Conv3d"

    def __post_init__(self):
        super().__post_init__()
        b = self.base
        if b.groups != 1 or any(d != 1 for d in b.dilation) or b.padding_mode != "zeros":
            raise ValueError(
                f"LoraConv: base must have groups=1, dilation=1 and padding_mode='zeros' "
                f"(PEFT's lora_A convolution drops them), got groups={b.groups}, "
                f"dilation={b.dilation}, padding_mode={b.padding_mode!r}"
            )

    @property
    def weight_rank(self) -> int:
        return self.base._nd + 2

    def _adapter_layers(self) -> dict[str, Layer]:
        cls = type(self.base)
        base: _ConvNd = self.base
        return {
            "lora_A": cls(
                self.r,
                base.kernel_size,
                stride=base.stride,
                padding=base.padding,
                bias=False,
                weight_init=TORCH_DEFAULT_WEIGHT,
            ),
            "lora_B": cls(base.out_channels, 1, bias=False, weight_init=zeros()),
        }

    def own_names(self) -> tuple[str, ...]:
        return self.base.own_names()

    def adapter_shapes(self, weight_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        nd = self.base._nd
        out, cin, *k = weight_shape[-nd - 2 :]
        return {"lora_A.weight": (self.r, cin, *k), "lora_B.weight": (out, self.r, *(1,) * nd)}

    def init_adapter(self, key: jax.Array, weight_shape: tuple[int, ...], dtype: Any) -> Params:
        nd = self.base._nd
        cin = weight_shape[-nd - 1]
        one = (1,) * nd
        return {
            "lora_A": self._kids["lora_A"].init(jax.random.fold_in(key, 0), (1, cin, *one), dtype),
            "lora_B": self._kids["lora_B"].init(
                jax.random.fold_in(key, 1), (1, self.r, *one), dtype
            ),
        }

    def delta(self, params: Params) -> jax.Array:
        nd = self.base._nd
        a, b = _f32(params["lora_A"]["weight"]), _f32(params["lora_B"]["weight"])
        lead, (r, cin, *k) = a.shape[: -nd - 2], a.shape[-nd - 2 :]
        b2 = b.reshape(b.shape[:-nd])  # (..., out, r)
        d = jnp.matmul(b2, a.reshape(*lead, r, -1)) * self.scaling
        return d.reshape(*lead, b2.shape[-2], cin, *k)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        y = self.base.apply(self.base_params(params), x)
        return _plus(y, self._update(params, x, key, train) * self.scaling)


def lora_layer(base: Layer, **settings: Any) -> _Lora:
    """The LoRA layer for ``base`` (one of ``SUPPORTED``) with ``settings`` (``r``,
    ``lora_alpha``, ``lora_dropout``, ``use_rslora``)."""
    if isinstance(base, Embedding):
        return LoraEmbedding(base, **settings)
    if isinstance(base, (Conv1d, Conv2d, Conv3d)):
        return LoraConv(base, **settings)
    return LoraLinear(base, **settings)
