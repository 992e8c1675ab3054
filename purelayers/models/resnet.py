"""torchvision's ResNets: ``resnet18``, ``resnet34``, ``resnet50`` and their parts
``ResNet``, ``BasicBlock`` and ``Bottleneck``.

The structure is ``torchvision.models.resnet``'s, module for module, so the dotted
names of ``merge(params, state)`` are its ``state_dict()`` keys in its order
(``conv1.weight``, ``bn1.running_mean``, ``layer1.0.conv1.weight``,
``layer2.0.downsample.1.weight``, ``fc.bias``) with its layouts: a torchvision
checkpoint loads by name. The bottleneck strides on its 3x3 ``conv2``, as torchvision
does ("ResNet V1.5"). BatchNorm buffers live in the state tree, so ``apply`` takes
``state=`` and returns ``(logits, new_state)``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.init import kaiming_normal, zeros
from purelayers.layers._checks import LayerError, check_int, need_ndim
from purelayers.layers.activation import ReLU
from purelayers.layers.conv import Conv2d
from purelayers.layers.core import Layer, Params, Sequential, State
from purelayers.layers.linear import Linear
from purelayers.layers.norm import BatchNorm2d
from purelayers.layers.pool import AdaptiveAvgPool2d, MaxPool2d

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet34", "resnet50"]

# torchvision re-initializes every convolution this way (and BatchNorm to ones/zeros,
# the layer's default); fc keeps Linear's default.
_CONV_INIT = kaiming_normal(mode="fan_out", nonlinearity="relu")


def _conv(out: int, kernel: int, stride: int = 1) -> Conv2d:
    """torchvision's ``conv3x3`` / ``conv1x1``: no bias, padding keeps the size at stride 1."""
    return Conv2d(
        out, kernel, stride=stride, padding=kernel // 2, bias=False, weight_init=_CONV_INIT
    )


def _bn(zero_weight: bool = False) -> BatchNorm2d:
    return BatchNorm2d(weight_init=zeros()) if zero_weight else BatchNorm2d()


def _built() -> Any:
    """A child field that ``__post_init__`` builds from the layer's settings."""
    return dataclasses.field(init=False, repr=False, compare=False)


def _run(
    layer: Layer,
    names: tuple[str, ...],
    params: Params,
    x: Any,
    state: State | None,
    new_state: State,
    train: bool,
) -> Any:
    """Apply ``layer``'s children ``names`` in turn through ``layer.call``, threading the
    state of those that have buffers into ``new_state``."""
    for name in names:
        if state is not None and name in state:
            x, new_state[name] = layer.call(name, params, x, train=train, state=state)
        else:
            x = layer.call(name, params, x, train=train)
    return x


@dataclasses.dataclass(frozen=True)
class _Block(Layer):
    """The residual block shared by ``BasicBlock`` and ``Bottleneck``:
    ``relu(branch(x) + identity)``, ``identity = downsample(x)`` or ``x``.

    ``init`` initializes the branch as a ``Sequential`` and ``downsample`` at the block's
    input, without running ``apply``: a block whose branch and identity differ in shape
    still gets params, and ``apply`` names the missing downsample."""

    expansion: ClassVar[int] = 1
    # the residual branch in application order (relu applied more than once)
    _path: ClassVar[tuple[str, ...]] = ()

    planes: int
    stride: int = 1
    downsample: Layer | None = None
    _: dataclasses.KW_ONLY
    zero_init_residual: bool = False

    def __post_init__(self):
        name = type(self).__name__
        check_int(name, "planes", self.planes)
        check_int(name, "stride", self.stride)
        if self.downsample is not None and not isinstance(self.downsample, Layer):
            raise ValueError(f"{name}: downsample must be a Layer or None, got {self.downsample!r}")

    def _branch(self) -> Sequential:
        """The residual branch's layers with arrays, in order (``relu`` keeps shapes)."""
        kids = self.children()
        return Sequential({n: kids[n] for n in self._path if n != "relu"})

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        params = self._branch().init(jax.random.fold_in(key, 0), shape, dtype)
        if self.downsample is not None:
            k = jax.random.fold_in(key, 1)
            params["downsample"] = self.init_child("downsample", k, shape, dtype)
        return params

    def init_state(self, shape: Any, dtype: Any = jnp.float32) -> State:
        state = self._branch().init_state(shape, dtype)
        if self.downsample is not None:
            state["downsample"] = self.downsample.init_state(shape, dtype)
        return state

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
        state: State | None = None,
    ) -> tuple[jax.Array, State]:
        new_state: State = {}
        out = _run(self, self._path, params, x, state, new_state, train)
        identity = x
        if self.downsample is not None:
            identity = _run(self, ("downsample",), params, x, state, new_state, train)
        if out.shape != identity.shape:
            raise LayerError(
                type(self).__name__,
                "the residual branch and the identity must have one shape;",
                tuple(identity.shape),
                tuple(out.shape),
                f"x.shape == {tuple(jnp.shape(x))}; give a downsample (a 1x1 Conv2d of "
                f"{self.planes * self.expansion} channels with stride={self.stride}, then "
                "BatchNorm2d) where the stride or the channel count changes",
            )
        y = _run(self, ("relu",), params, out + identity, state, new_state, train)
        return y, new_state


@dataclasses.dataclass(frozen=True)
class BasicBlock(_Block):
    """ResNet-18/34's block: two 3x3 convolutions. Matches torchvision's
    ``BasicBlock(inplanes, planes, stride, downsample)`` (input channels read from the
    shape)::

        y = relu(bn2(conv2(relu(bn1(conv1(x))))) + identity)

    Args:
      planes: output channels (``expansion = 1``).
      stride: ``conv1``'s stride. Default ``1``.
      downsample: the identity's layer when the stride or the channel count changes
        (torchvision's ``Sequential(conv1x1(stride), BatchNorm2d)``), else None.
      zero_init_residual: initialize ``bn2.weight`` to zeros. Default ``False``.

    Shape:
      input ``(N, C, H, W)``; output ``(N, planes, H', W')`` with ``H' = ceil(H / stride)``.

    Parameters (state: each ``bn*``'s ``running_mean``, ``running_var``,
    ``num_batches_tracked``):
      ``conv1.weight`` ``(planes, C, 3, 3)``, ``bn1.weight``/``bias`` ``(planes,)``,
      ``conv2.weight`` ``(planes, planes, 3, 3)``, ``bn2.*``, then ``downsample.*``.
    """

    expansion: ClassVar[int] = 1
    _path: ClassVar[tuple[str, ...]] = ("conv1", "bn1", "relu", "conv2", "bn2")

    def children(self) -> dict[str, Layer]:
        kids: dict[str, Layer] = {
            "conv1": _conv(self.planes, 3, self.stride),
            "bn1": _bn(),
            "relu": ReLU(),
            "conv2": _conv(self.planes, 3),
            "bn2": _bn(self.zero_init_residual),
        }
        if self.downsample is not None:
            kids["downsample"] = self.downsample
        return kids


@dataclasses.dataclass(frozen=True)
class Bottleneck(_Block):
    """ResNet-50's block: 1x1 reduce, 3x3 (strided), 1x1 expand by ``expansion = 4``.
    Matches torchvision's ``Bottleneck(inplanes, planes, stride, downsample)`` (groups 1,
    base width 64)::

        y = relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + identity)

    Args:
      planes: the inner width; the output has ``4 * planes`` channels.
      stride: ``conv2``'s stride (torchvision's "V1.5"). Default ``1``.
      downsample: as ``BasicBlock``'s.
      zero_init_residual: initialize ``bn3.weight`` to zeros. Default ``False``.

    Shape:
      input ``(N, C, H, W)``; output ``(N, 4 * planes, H', W')``, ``H' = ceil(H / stride)``.

    Parameters (state as ``BasicBlock``'s):
      ``conv1.weight`` ``(planes, C, 1, 1)``, ``bn1.*``, ``conv2.weight``
      ``(planes, planes, 3, 3)``, ``bn2.*``, ``conv3.weight`` ``(4 * planes, planes, 1, 1)``,
      ``bn3.*`` ``(4 * planes,)``, then ``downsample.*``.
    """

    expansion: ClassVar[int] = 4
    _path: ClassVar[tuple[str, ...]] = (
        "conv1", "bn1", "relu", "conv2", "bn2", "relu", "conv3", "bn3",
    )  # fmt: skip

    def children(self) -> dict[str, Layer]:
        kids: dict[str, Layer] = {
            "conv1": _conv(self.planes, 1),
            "bn1": _bn(),
            "conv2": _conv(self.planes, 3, self.stride),
            "bn2": _bn(),
            "conv3": _conv(self.planes * 4, 1),
            "bn3": _bn(self.zero_init_residual),
            "relu": ReLU(),
        }
        if self.downsample is not None:
            kids["downsample"] = self.downsample
        return kids


def _make_layer(
    block: type[_Block], inplanes: int, planes: int, blocks: int, stride: int, zero_init: bool
) -> Sequential:
    """torchvision's ``ResNet._make_layer``: the first block strides and downsamples."""
    out = planes * block.expansion
    downsample = None
    if stride != 1 or inplanes != out:
        downsample = Sequential(_conv(out, 1, stride), _bn())
    first = block(planes, stride, downsample, zero_init_residual=zero_init)
    rest = [block(planes, zero_init_residual=zero_init) for _ in range(1, blocks)]
    return Sequential(first, *rest)


@dataclasses.dataclass(frozen=True)
class ResNet(Layer):
    """torchvision's ``ResNet(block, layers, num_classes, zero_init_residual)``::

        conv1 (7x7, 64, stride 2, pad 3, no bias) -> bn1 -> relu -> maxpool (3, 2, 1)
        -> layer1 (64) -> layer2 (128, /2) -> layer3 (256, /2) -> layer4 (512, /2)
        -> avgpool (adaptive, 1x1) -> flatten -> fc

    ``layer{i}`` is a ``Sequential`` of ``layers[i - 1]`` blocks; its first block strides
    (layers 2-4) and downsamples where the stride or the width changes. Input channels
    are read from the shape (torchvision fixes 3).

    Args:
      block: ``BasicBlock`` (ResNet-18/34) or ``Bottleneck`` (ResNet-50 and deeper).
      layers: blocks per stage, four positive ints (``(2, 2, 2, 2)`` is ResNet-18).
      num_classes: ``fc``'s output width. Default ``1000``.
      zero_init_residual: each block's last BatchNorm weight starts at zeros, so every
        residual branch starts at zero. Default ``False``, as torchvision.

    The children are fields built from the settings, and ``init`` and ``init_state`` are
    derived from ``apply``. Initialization (torchvision's): convolutions ``kaiming_normal(mode="fan_out",
    nonlinearity="relu")``; BatchNorm weight ones, bias zeros; ``fc`` Linear's default.

    Shape:
      input ``(N, C, H, W)`` (``x``); output ``(logits (N, num_classes), new_state)``.
      Spatial sizes shrink by 32 overall; ``avgpool`` accepts any size left.

    ``apply(params, x, *, state, train=False)``: ``train=True`` normalizes with batch
    statistics and returns updated running statistics (momentum 0.1, unbiased variance,
    as torch's ``model.train()``); ``train=False`` uses the running statistics and
    returns ``state`` unchanged.

    Example:
      >>> model = resnet18(num_classes=10)
      >>> params, state = pl.params.abstract(model, (2, 3, 32, 32), state=True)
      >>> flat = pl.params.flatten(model.ordered(pl.params.merge(params, state)))
      >>> list(flat)[:3], flat["fc.weight"].shape
      (['conv1.weight', 'bn1.weight', 'bn1.bias'], (10, 512))
    """

    block: type[_Block]
    layers: tuple[int, ...]
    num_classes: int = 1000
    _: dataclasses.KW_ONLY
    zero_init_residual: bool = False
    # the children, torchvision's modules in its order, built from the settings above
    conv1: Conv2d = _built()
    bn1: BatchNorm2d = _built()
    relu: ReLU = _built()
    maxpool: MaxPool2d = _built()
    layer1: Sequential = _built()
    layer2: Sequential = _built()
    layer3: Sequential = _built()
    layer4: Sequential = _built()
    avgpool: AdaptiveAvgPool2d = _built()
    fc: Linear = _built()

    def __post_init__(self):
        if not (isinstance(self.block, type) and issubclass(self.block, _Block)):
            raise ValueError(f"ResNet: block must be BasicBlock or Bottleneck, got {self.block!r}")
        layers = tuple(self.layers) if isinstance(self.layers, (tuple, list)) else ()
        if len(layers) != 4:
            raise ValueError(f"ResNet: layers must be 4 positive ints, got {self.layers!r}")
        for n in layers:
            check_int("ResNet", "layers", n)
        check_int("ResNet", "num_classes", self.num_classes)
        object.__setattr__(self, "layers", layers)
        kids: dict[str, Layer] = {
            "conv1": Conv2d(64, 7, stride=2, padding=3, bias=False, weight_init=_CONV_INIT),
            "bn1": _bn(),
            "relu": ReLU(),
            "maxpool": MaxPool2d(3, 2, 1),
        }
        inplanes = 64
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers, strict=True)):
            kids[f"layer{i + 1}"] = _make_layer(
                self.block, inplanes, planes, blocks, 1 if i == 0 else 2, self.zero_init_residual
            )
            inplanes = planes * self.block.expansion
        kids["avgpool"] = AdaptiveAvgPool2d(1)
        kids["fc"] = Linear(self.num_classes)
        for name, value in kids.items():
            object.__setattr__(self, name, value)

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
        state: State | None = None,
    ) -> tuple[jax.Array, State]:
        del key  # nothing random
        need_ndim("ResNet", x, (4,), "(N, C, H, W)")
        new_state: State = {}
        h = self.call("conv1", params, x)
        h, new_state["bn1"] = self.call("bn1", params, h, state=state, train=train)
        h = self.call("maxpool", params, self.call("relu", params, h))
        for name in ("layer1", "layer2", "layer3", "layer4"):
            h, new_state[name] = self.call(name, params, h, state=state, train=train)
        h = self.call("avgpool", params, h)
        h = h.reshape(h.shape[0], math.prod(h.shape[1:]))  # torch.flatten(x, 1)
        return self.call("fc", params, h), new_state


def resnet18(num_classes: int = 1000) -> ResNet:
    """ResNet-18 (``BasicBlock``, ``(2, 2, 2, 2)``): ``torchvision.models.resnet18``;
    11.7M parameters at ``num_classes=1000``."""
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes)


def resnet34(num_classes: int = 1000) -> ResNet:
    """ResNet-34 (``BasicBlock``, ``(3, 4, 6, 3)``): ``torchvision.models.resnet34``;
    21.8M parameters at ``num_classes=1000``."""
    return ResNet(BasicBlock, (3, 4, 6, 3), num_classes)


def resnet50(num_classes: int = 1000) -> ResNet:
    """ResNet-50 (``Bottleneck``, ``(3, 4, 6, 3)``): ``torchvision.models.resnet50``;
    25.6M parameters at ``num_classes=1000``."""
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes)
