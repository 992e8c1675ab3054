"""Convolutions over channels-first inputs: ``Conv1d``, ``Conv2d``, ``Conv3d`` and the
transposed ``ConvTranspose1d``, ``ConvTranspose2d``, ``ConvTranspose3d``.

All six share one N-d implementation; the variants fix the number of spatial axes. The
math is ``purelayers.functional.conv``. Parameters use PyTorch's names and layouts, so a
torch ``state_dict`` loads by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

import purelayers.functional as F
from purelayers.functional.conv import Pads
from purelayers.init import Initializer, fans
from purelayers.layers._checks import (
    LayerError,
    as_shape,
    check_int,
    need_width,
)
from purelayers.layers._spatial import (
    batched,
    check_rank,
    is_int,
    need_nonempty,
    ntuple,
    unbatched,
)
from purelayers.layers.core import Layer, Params
from purelayers.layers.linear import TORCH_DEFAULT_WEIGHT, torch_default_bias

__all__ = [
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
]

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
_JNP_PAD_MODE = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


def _check_common(layer: Any) -> None:
    """Checks and tuple normalization shared by every convolution's constructor."""
    name, nd = type(layer).__name__, layer._nd
    check_int(name, "out_channels", layer.out_channels)
    check_int(name, "groups", layer.groups)
    for arg, minimum in (("kernel_size", 1), ("stride", 1), ("dilation", 1)):
        _set(layer, arg, ntuple(name, arg, getattr(layer, arg), nd, minimum=minimum))
    if layer.out_channels % layer.groups:
        raise ValueError(
            f"{name}: out_channels must be divisible by groups, got out_channels="
            f"{layer.out_channels} and groups={layer.groups}"
        )


def _init_params(layer: Any, key: jax.Array, shape: Any, dtype: Any, *, transposed: bool) -> Params:
    name, nd = type(layer).__name__, layer._nd
    shape = as_shape(shape)
    check_rank(name, shape, nd)
    cin, groups = shape[-nd - 1], layer.groups
    if cin % groups:
        raise LayerError(
            name,
            f"input channels must be divisible by groups={groups};",
            f"a multiple of {groups}",
            cin,
            f"x.shape == {shape}",
        )
    k = layer.kernel_size
    if transposed:
        w_shape = (cin, layer.out_channels // groups, *k)
    else:
        w_shape = (layer.out_channels, cin // groups, *k)
    fan_in = fans(w_shape)[0]
    wkey, bkey = jax.random.split(key)
    params = {"weight": (layer.weight_init or TORCH_DEFAULT_WEIGHT)(wkey, w_shape, dtype)}
    if layer.bias:
        b_init = layer.bias_init or torch_default_bias(fan_in)
        params["bias"] = b_init(bkey, (layer.out_channels,), dtype)
    return params


def _need_channels(layer: str, x: jax.Array, cin: int, w: jax.Array) -> None:
    if x.shape[1] != cin:
        raise LayerError(
            layer,
            "input channels (axis 1)",
            cin,
            x.shape[1],
            f"x.shape == {tuple(x.shape)}; {layer} was initialized for {cin} input channels "
            f"(weight {tuple(w.shape)})",
        )


def _pad_input(layer: str, x: jax.Array, pads: Pads, mode: str) -> jax.Array:
    """Pads the spatial axes as ``torch.nn.functional.pad(x, ..., mode)`` does."""
    for axis, (lo, hi) in enumerate(pads, start=2):
        size, widest = x.shape[axis], max(lo, hi)
        # torch: reflect needs padding < size, circular <= size (one wrap); replicate any
        too_wide = widest >= size if mode == "reflect" else widest > size
        if too_wide and mode != "replicate":
            rule = "smaller than" if mode == "reflect" else "at most"
            raise LayerError(
                layer,
                f"padding_mode={mode!r} needs each padding {rule} the input size; "
                f"input axis {axis} size",
                f"> {widest}" if mode == "reflect" else f">= {widest}",
                size,
                f"x.shape == {tuple(x.shape)}",
            )
    return jnp.pad(x, ((0, 0), (0, 0), *pads), mode=_JNP_PAD_MODE[mode])


def _need_fit(layer: str, x: jax.Array, pads: Pads, extent: Sequence[int]) -> None:
    """The padded input must hold at least one kernel window on every spatial axis."""
    padded = tuple(n + lo + hi for n, (lo, hi) in zip(x.shape[2:], pads, strict=True))
    if any(p < e for p, e in zip(padded, extent, strict=True)):
        raise LayerError(
            layer,
            "padded input size per spatial axis must hold the dilated kernel;",
            f">= {tuple(extent)}",
            padded,
            f"x.shape == {tuple(x.shape)}",
        )


@dataclasses.dataclass(frozen=True)
class _ConvNd(Layer):
    """The N-d convolution behind ``Conv1d``, ``Conv2d`` and ``Conv3d``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    _nd: ClassVar[int] = 2

    out_channels: int
    kernel_size: int | tuple[int, ...]
    _: dataclasses.KW_ONLY
    stride: int | tuple[int, ...] = 1
    padding: int | tuple[int, ...] | str = 0
    dilation: int | tuple[int, ...] = 1
    groups: int = 1
    bias: bool = True
    padding_mode: str = "zeros"
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None

    def __post_init__(self):
        _check_common(self)
        name, nd = type(self).__name__, self._nd
        if isinstance(self.padding, str):
            if self.padding not in ("valid", "same"):
                raise ValueError(
                    f"{name}: padding must be 'valid', 'same', an integer >= 0 or a tuple "
                    f"of {nd} such integers, got {self.padding!r}"
                )
            if self.padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError(
                    f"{name}: padding='same' needs stride 1 (as torch), got stride={self.stride}"
                )
        else:
            _set(self, "padding", ntuple(name, "padding", self.padding, nd, minimum=0))
        if self.padding_mode not in _PADDING_MODES:
            choices = ", ".join(repr(m) for m in _PADDING_MODES)
            raise ValueError(
                f"{name}: padding_mode must be one of {choices}, got {self.padding_mode!r}"
            )

    def pads(self) -> Pads:
        """``(low, high)`` padding per spatial axis. ``"same"`` pads ``d * (k - 1)`` in
        total with the odd one on the high side, as torch does."""
        if self.padding == "valid":
            return ((0, 0),) * self._nd
        if self.padding == "same":
            totals = [d * (k - 1) for d, k in zip(self.dilation, self.kernel_size, strict=True)]
            return tuple((t // 2, t - t // 2) for t in totals)
        return tuple((p, p) for p in self.padding)

    def own_names(self) -> tuple[str, ...]:
        return ("weight", "bias") if self.bias else ("weight",)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        return _init_params(self, key, shape, dtype, transposed=False)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        name = type(self).__name__
        w = params["weight"]
        x, added = batched(name, x, self._nd)
        _need_channels(name, x, w.shape[1] * self.groups, w)
        pads = self.pads()
        if self.padding_mode != "zeros":
            x = _pad_input(name, x, pads, self.padding_mode)
            pads = ((0, 0),) * self._nd
        extent = [d * (k - 1) + 1 for d, k in zip(self.dilation, self.kernel_size, strict=True)]
        _need_fit(name, x, pads, extent)
        y = F.conv(
            x,
            w,
            params.get("bias"),
            stride=self.stride,
            padding=pads,
            dilation=self.dilation,
            groups=self.groups,
        )
        if x.shape[1] == 0:  # torch answers an input without channels with no channels
            y = y[:, :0]
        return unbatched(y, added)


@dataclasses.dataclass(frozen=True)
class Conv1d(_ConvNd):
    r"""1-d convolution: ``y[n, o] = bias[o] + sum_c corr(x[n, c], weight[o, c])``.

    ``corr``: the cross-correlation over ``L`` (``F.conv``); ``c``: over the ``C_in/groups``
    channels of ``o``'s group. Matches ``torch.nn.Conv1d``.

    Args:
      out_channels: number of output channels; divisible by ``groups``.
      kernel_size: an int (or a 1-tuple).
      stride: an int or a tuple of 1, each >= 1. Default ``1``.
      padding: ints >= 0 added on both sides, ``"valid"`` (none) or ``"same"`` (stride 1;
        an odd excess goes on the high side, as torch). Default ``0``.
      dilation: spacing between kernel taps, an int or a tuple, each >= 1. Default ``1``.
      groups: independent channel groups (``groups = C_in`` is depthwise). Default ``1``.
      bias: learn an additive ``bias``. Default ``True``.
      padding_mode: ``"zeros"`` (default), ``"reflect"``, ``"replicate"`` or ``"circular"``.
      weight_init: initializer for ``weight``. Default torch's ``U(-1/sqrt(fan_in),
        1/sqrt(fan_in))``, ``fan_in = C_in/groups * prod(kernel_size)``.
      bias_init: initializer for ``bias``. Default ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``.

    Shape:
      input ``(N, C_in, L)`` or ``(C_in, L)``, ``C_in`` as ``init`` saw it; output ``(N,
      out_channels, L_out)`` in the input's floating dtype, per spatial axis ``out = (L +
      pad_low + pad_high - dilation * (k - 1) - 1) // stride + 1``.

    Parameters:
      ``weight``: ``(out_channels, C_in/groups, k)``. ``bias``: ``(out_channels,)``.

    Example:
      >>> conv = Conv1d(4, 3, padding="same")
      >>> jax.tree.map(jnp.shape, conv.init(jax.random.key(0), (2, 6, 10)))
      {'bias': (4,), 'weight': (4, 6, 3)}
    """

    _nd: ClassVar[int] = 1


@dataclasses.dataclass(frozen=True)
class Conv2d(_ConvNd):
    r"""2-d convolution: ``y[n, o] = bias[o] + sum_c corr(x[n, c], weight[o, c])``.

    ``corr``: the cross-correlation over ``H, W`` (``F.conv``); ``c``: over the
    ``C_in/groups`` channels of ``o``'s group. Matches ``torch.nn.Conv2d``.

    Args:
      out_channels: number of output channels; divisible by ``groups``.
      kernel_size: an int or a tuple of one int per spatial axis.
      stride: an int or a tuple of 2, each >= 1. Default ``1``.
      padding: ints >= 0 added on both sides, ``"valid"`` (none) or ``"same"`` (stride 1;
        an odd excess goes on the high side, as torch). Default ``0``.
      dilation: spacing between kernel taps, an int or a tuple, each >= 1. Default ``1``.
      groups: independent channel groups (``groups = C_in`` is depthwise). Default ``1``.
      bias: learn an additive ``bias``. Default ``True``.
      padding_mode: ``"zeros"`` (default), ``"reflect"``, ``"replicate"`` or ``"circular"``.
      weight_init: initializer for ``weight``. Default torch's ``U(-1/sqrt(fan_in),
        1/sqrt(fan_in))``, ``fan_in = C_in/groups * prod(kernel_size)``.
      bias_init: initializer for ``bias``. Default ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``.

    Shape:
      input ``(N, C_in, H, W)`` or ``(C_in, H, W)``, ``C_in`` as ``init`` saw it; output ``(N,
      out_channels, H_out, W_out)`` in the input's floating dtype, per spatial axis ``out = (L
      + pad_low + pad_high - dilation * (k - 1) - 1) // stride + 1``.

    Parameters:
      ``weight``: ``(out_channels, C_in/groups, kh, kw)``. ``bias``: ``(out_channels,)``.

    Example:
      ``Conv2d(8, 3, stride=2, padding=1)`` maps ``(N, 1, 28, 28)`` to ``(N, 8, 14, 14)``:
      ``floor((28 + 2 - 2 - 1) / 2) + 1 = 14``.

      >>> conv = Conv2d(8, 3, stride=2, padding=1)
      >>> jax.tree.map(jnp.shape, conv.init(jax.random.key(0), (4, 1, 28, 28)))
      {'bias': (8,), 'weight': (8, 1, 3, 3)}
    """

    _nd: ClassVar[int] = 2


@dataclasses.dataclass(frozen=True)
class Conv3d(_ConvNd):
    r"""3-d convolution: ``y[n, o] = bias[o] + sum_c corr(x[n, c], weight[o, c])``.

    ``corr``: the cross-correlation over ``D, H, W`` (``F.conv``); ``c``: over the
    ``C_in/groups`` channels of ``o``'s group. Matches ``torch.nn.Conv3d``.

    Args:
      out_channels: number of output channels; divisible by ``groups``.
      kernel_size: an int or a tuple of one int per spatial axis.
      stride: an int or a tuple of 3, each >= 1. Default ``1``.
      padding: ints >= 0 added on both sides, ``"valid"`` (none) or ``"same"`` (stride 1;
        an odd excess goes on the high side, as torch). Default ``0``.
      dilation: spacing between kernel taps, an int or a tuple, each >= 1. Default ``1``.
      groups: independent channel groups (``groups = C_in`` is depthwise). Default ``1``.
      bias: learn an additive ``bias``. Default ``True``.
      padding_mode: ``"zeros"`` (default), ``"reflect"``, ``"replicate"`` or ``"circular"``.
      weight_init: initializer for ``weight``. Default torch's ``U(-1/sqrt(fan_in),
        1/sqrt(fan_in))``, ``fan_in = C_in/groups * prod(kernel_size)``.
      bias_init: initializer for ``bias``. Default ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``.

    Shape:
      input ``(N, C_in, D, H, W)`` or ``(C_in, D, H, W)``, ``C_in`` as ``init`` saw it; output
      ``(N, out_channels, D_out, H_out, W_out)`` in the input's floating dtype, per spatial
      axis ``out = (L + pad_low + pad_high - dilation * (k - 1) - 1) // stride + 1``.

    Parameters:
      ``weight``: ``(out_channels, C_in/groups, kd, kh, kw)``. ``bias``: ``(out_channels,)``.

    Example:
      >>> conv = Conv3d(4, (1, 3, 3), padding=(0, 1, 1))
      >>> conv.apply(conv.init(jax.random.key(0), (1, 2, 3, 5, 5)), jnp.ones((1, 2, 3, 5, 5))).shape
      (1, 4, 3, 5, 5)
    """

    _nd: ClassVar[int] = 3


@dataclasses.dataclass(frozen=True)
class _ConvTransposeNd(Layer):
    """The N-d transposed convolution behind ``ConvTranspose1d/2d/3d``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    _nd: ClassVar[int] = 2

    out_channels: int
    kernel_size: int | tuple[int, ...]
    _: dataclasses.KW_ONLY
    stride: int | tuple[int, ...] = 1
    padding: int | tuple[int, ...] = 0
    output_padding: int | tuple[int, ...] = 0
    dilation: int | tuple[int, ...] = 1
    groups: int = 1
    bias: bool = True
    padding_mode: str = "zeros"
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None

    def __post_init__(self):
        _check_common(self)
        name, nd = type(self).__name__, self._nd
        if self.padding_mode != "zeros":
            raise ValueError(
                f"{name}: padding_mode must be 'zeros' (torch's transposed convolutions "
                f"take no other), got {self.padding_mode!r}"
            )
        for arg in ("padding", "output_padding"):
            _set(self, arg, ntuple(name, arg, getattr(self, arg), nd, minimum=0))
        limit = tuple(max(s, d) for s, d in zip(self.stride, self.dilation, strict=True))
        if any(op >= m for op, m in zip(self.output_padding, limit, strict=True)):
            raise ValueError(
                f"{name}: output_padding must be smaller than either stride or dilation "
                f"(max(stride, dilation) = {limit}), got {self.output_padding}"
            )

    def own_names(self) -> tuple[str, ...]:
        return ("weight", "bias") if self.bias else ("weight",)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        dims = as_shape(shape)
        if len(dims) >= 2:
            need_width(
                type(self).__name__,
                "input channels (axis 1)",
                dims[-self._nd - 1],
                "torch's transposed convolutions refuse a weight without input channels",
            )
        return _init_params(self, key, shape, dtype, transposed=True)

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
        output_size: Sequence[int] | None = None,
    ):
        """``output_size`` (spatial, or full with batch and channels) picks the
        ``output_padding`` that gives that size, as torch's ``forward(x, output_size)``."""
        name, nd, g = type(self).__name__, self._nd, self.groups
        w = params["weight"]
        x, added = batched(name, x, nd)
        if x.shape[0] and x.shape[1]:
            need_nonempty(
                name, x, 2, "torch's transposed convolutions take empty batches or channels only"
            )
        cin = w.shape[0]
        _need_channels(name, x, cin, w)
        k, s, d, p = self.kernel_size, self.stride, self.dilation, self.padding
        out_pad = self._output_padding(x.shape[2:], output_size)
        sizes = [
            (n - 1) * s_ - 2 * p_ + d_ * (k_ - 1) + op + 1
            for n, s_, p_, d_, k_, op in zip(x.shape[2:], s, p, d, k, out_pad, strict=True)
        ]
        if any(n < 1 for n in sizes):
            raise LayerError(
                name, "output size per spatial axis", ">= 1", tuple(sizes), f"x.shape == {x.shape}"
            )
        # The transposed convolution is the forward convolution of the stride-dilated input
        # with the kernel regrouped to [out, in/groups, *k] and flipped spatially.
        cout = w.shape[1] * g
        w_fwd = w.reshape(g, cin // g, cout // g, *k).swapaxes(1, 2).reshape(cout, cin // g, *k)
        w_fwd = jnp.flip(w_fwd, axis=tuple(range(2, 2 + nd)))
        pads = tuple(
            (d_ * (k_ - 1) - p_, d_ * (k_ - 1) - p_ + op)
            for k_, d_, p_, op in zip(k, d, p, out_pad, strict=True)
        )
        y = F.conv(
            x,
            w_fwd,
            params.get("bias"),
            stride=(1,) * nd,
            padding=pads,
            dilation=d,
            groups=g,
            lhs_dilation=s,
        )
        return unbatched(y, added)

    def _output_padding(
        self, spatial: Sequence[int], output_size: Sequence[int] | None
    ) -> tuple[int, ...]:
        if output_size is None:
            return self.output_padding
        name, nd = type(self).__name__, self._nd
        size = tuple(output_size)
        if len(size) == nd + 2:
            size = size[2:]
        if len(size) != nd or not all(is_int(v) for v in size):
            raise LayerError(name, "output_size", f"{nd} spatial sizes", output_size)
        out = []
        for n, want, k, s, p, d in zip(
            spatial, size, self.kernel_size, self.stride, self.padding, self.dilation, strict=True
        ):
            least = (n - 1) * s - 2 * p + d * (k - 1) + 1
            if not least <= want < least + s:
                raise LayerError(
                    name,
                    "output_size must be reachable by some output_padding;",
                    f"each size in [{least}, {least + s - 1}]",
                    tuple(size),
                )
            out.append(want - least)
        return tuple(out)


@dataclasses.dataclass(frozen=True)
class ConvTranspose1d(_ConvTransposeNd):
    r"""1-d transposed convolution: ``y[n, o, s*i + d*k - p] += weight[c, o, k] * x[n, c, i]``.

    Over sequences ``(N, C, L)``, with ``s, d, p`` the stride, dilation and padding: the gradient
    of ``Conv1d`` with respect to its input. Matches ``torch.nn.ConvTranspose1d``.

    ``apply(params, x, output_size=...)`` picks the ``output_padding`` that gives that
    size, as torch's ``forward(x, output_size)``.

    Args:
      out_channels: number of output channels; divisible by ``groups``.
      kernel_size: an int (or a 1-tuple).
      stride: an int or a tuple of 1, each >= 1. Default ``1``.
      padding: ints >= 0 removed from each side of the output. Default ``0``.
      output_padding: extra size on the high side of each output axis, smaller than
        ``max(stride, dilation)`` (as torch). Default ``0``.
      dilation: spacing between kernel taps. Default ``1``.
      groups: independent channel groups. Default ``1``.
      bias: learn an additive ``bias``. Default ``True``.
      padding_mode: ``"zeros"``, the only mode torch's transposed convolutions take.
      weight_init: initializer for ``weight``. Default ``kaiming_uniform(a=sqrt(5))`` with
        torch's ``fan_in = out_channels/groups * prod(kernel_size)``.
      bias_init: initializer for ``bias``. Default ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``.

    Shape:
      input ``(N, C_in, *L)`` or ``(C_in, *L)``; output ``(N, out_channels, *L_out)``,
      ``L_out = (L - 1) * stride - 2 * padding + dilation * (kernel_size - 1) +
      output_padding + 1``.

    Parameters:
      ``weight``: ``(C_in, out_channels/groups, k)``. ``bias``: ``(out_channels,)``.

    Example:
      >>> up = ConvTranspose1d(2, 4, stride=2, padding=1)
      >>> up.apply(up.init(jax.random.key(0), (1, 3, 5)), jnp.ones((1, 3, 5))).shape
      (1, 2, 10)
    """

    _nd: ClassVar[int] = 1


@dataclasses.dataclass(frozen=True)
class ConvTranspose2d(_ConvTransposeNd):
    r"""2-d transposed convolution: ``y[n, o, s*i + d*k - p] += weight[c, o, k] * x[n, c, i]``.

    Per spatial axis, over images ``(N, C, H, W)``, with ``s, d, p`` the stride, dilation
    and padding: the gradient of ``Conv2d`` with respect to its input. Matches
    ``torch.nn.ConvTranspose2d``.

    Computed as the forward convolution of the stride-dilated input with the weight
    regrouped and flipped. ``apply(params, x, output_size=...)`` picks the
    ``output_padding`` that gives that size, as torch's ``forward(x, output_size)``.

    Args:
      out_channels: number of output channels; divisible by ``groups``.
      kernel_size: an int or a tuple of one int per spatial axis.
      stride: an int or a tuple of 2, each >= 1. Default ``1``.
      padding: ints >= 0 removed from each side of the output. Default ``0``.
      output_padding: extra size on the high side of each output axis, smaller than
        ``max(stride, dilation)`` (as torch). Default ``0``.
      dilation: spacing between kernel taps. Default ``1``.
      groups: independent channel groups. Default ``1``.
      bias: learn an additive ``bias``. Default ``True``.
      padding_mode: ``"zeros"``, the only mode torch's transposed convolutions take.
      weight_init: initializer for ``weight``. Default ``kaiming_uniform(a=sqrt(5))`` with
        torch's ``fan_in = out_channels/groups * prod(kernel_size)``.
      bias_init: initializer for ``bias``. Default ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``.

    Shape:
      input ``(N, C_in, *L)`` or ``(C_in, *L)``; output ``(N, out_channels, *L_out)``,
      ``L_out = (L - 1) * stride - 2 * padding + dilation * (kernel_size - 1) +
      output_padding + 1``.

    Parameters:
      ``weight``: ``(C_in, out_channels/groups, kh, kw)``. ``bias``: ``(out_channels,)``.

    Example:
      ``ConvTranspose2d(1, 4, stride=2, padding=1)`` doubles the size, ``(N, C, 7, 7)``
      to ``(N, 1, 14, 14)``: ``(7 - 1) * 2 - 2 * 1 + (4 - 1) + 1 = 14``.

      >>> up = ConvTranspose2d(1, 4, stride=2, padding=1)
      >>> jax.tree.map(jnp.shape, up.init(jax.random.key(0), (2, 8, 7, 7)))
      {'bias': (1,), 'weight': (8, 1, 4, 4)}
    """

    _nd: ClassVar[int] = 2


@dataclasses.dataclass(frozen=True)
class ConvTranspose3d(_ConvTransposeNd):
    r"""3-d transposed convolution: ``y[n, o, s*i + d*k - p] += weight[c, o, k] * x[n, c, i]``.

    Per spatial axis, over volumes ``(N, C, D, H, W)``, with ``s, d, p`` the stride,
    dilation and padding: the gradient of ``Conv3d`` with respect to its input. Matches
    ``torch.nn.ConvTranspose3d``.

    ``apply(params, x, output_size=...)`` picks the ``output_padding`` that gives that
    size, as torch's ``forward(x, output_size)``.

    Args:
      out_channels: number of output channels; divisible by ``groups``.
      kernel_size: an int or a tuple of one int per spatial axis.
      stride: an int or a tuple of 3, each >= 1. Default ``1``.
      padding: ints >= 0 removed from each side of the output. Default ``0``.
      output_padding: extra size on the high side of each output axis, smaller than
        ``max(stride, dilation)`` (as torch). Default ``0``.
      dilation: spacing between kernel taps. Default ``1``.
      groups: independent channel groups. Default ``1``.
      bias: learn an additive ``bias``. Default ``True``.
      padding_mode: ``"zeros"``, the only mode torch's transposed convolutions take.
      weight_init: initializer for ``weight``. Default ``kaiming_uniform(a=sqrt(5))`` with
        torch's ``fan_in = out_channels/groups * prod(kernel_size)``.
      bias_init: initializer for ``bias``. Default ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``.

    Shape:
      input ``(N, C_in, *L)`` or ``(C_in, *L)``; output ``(N, out_channels, *L_out)``,
      ``L_out = (L - 1) * stride - 2 * padding + dilation * (kernel_size - 1) +
      output_padding + 1``.

    Parameters:
      ``weight``: ``(C_in, out_channels/groups, kd, kh, kw)``. ``bias``: ``(out_channels,)``.

    Example:
      >>> up = ConvTranspose3d(2, 2, stride=2)
      >>> jax.tree.map(jnp.shape, up.init(jax.random.key(0), (1, 3, 2, 2, 2)))
      {'bias': (2,), 'weight': (3, 2, 2, 2, 2)}
    """

    _nd: ClassVar[int] = 3
