"""The catalog against ``torch.nn``: every layer class torch 2.13 has is here, under its
name (or the one ``RENAMED`` gives), except the few ``LEFT_OUT`` with the reason; the
README's "torch.nn, class by class" table lists every one of them."""

from __future__ import annotations

import inspect
import pathlib
import re

import pytest

from purelayers import layers as L

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"

_LAZY = "every purelayers layer reads its input widths from init's shape"
_LISTS = "a layer's tuple or dict fields, and the params tree itself, hold children and arrays"
LEFT_OUT = {
    "Module": "abstract base: purelayers.layers.Layer",
    "Container": "abstract base (deprecated in torch)",
    "RNNBase": "abstract base of RNN, LSTM and GRU",
    "RNNCellBase": "abstract base of the cells",
    "DataParallel": "purelayers.sharding.data_parallel shards a jitted step instead",
    "ModuleList": _LISTS,
    "ModuleDict": _LISTS,
    "ParameterList": _LISTS,
    "ParameterDict": _LISTS,
    **{f"Lazy{name}": _LAZY for name in (
        "Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
        "ConvTranspose3d", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d",
        "InstanceNorm2d", "InstanceNorm3d")},
}  # fmt: skip

# torch's name -> ours, where ours differs: ``MultiHeadAttention`` (fused ``qkv``) already
# holds the case-insensitive name, and one concept keeps one class.
RENAMED = {"MultiheadAttention": "InProjAttention"}


def torch_layer_classes(torch) -> list[str]:
    """``torch.nn``'s module classes, losses left out (``AdaptiveLogSoftmaxWithLoss``
    included: it computes a loss, with no ``_Loss`` base)."""
    nn = torch.nn
    return sorted(
        name
        for name, obj in vars(nn).items()
        if inspect.isclass(obj)
        and issubclass(obj, nn.Module)
        and not issubclass(obj, nn.modules.loss._Loss)
        and not name.endswith("Loss")
    )


def test_every_torch_layer_class_is_covered(torch):
    names = torch_layer_classes(torch)
    assert len(names) >= 139  # torch 2.13: 139 module classes besides the losses
    missing = []
    for name in names:
        if name in LEFT_OUT:
            continue
        ours = getattr(L, RENAMED.get(name, name), None)
        if not (inspect.isclass(ours) and issubclass(ours, L.Layer)):
            missing.append(name)
    assert not missing, f"torch.nn classes with no purelayers layer: {missing}"
    assert set(LEFT_OUT) <= set(names), sorted(set(LEFT_OUT) - set(names))


def test_no_two_classes_differ_only_in_case():
    classes = {}
    for name in L.__all__:
        obj = getattr(L, name)
        if inspect.isclass(obj):
            classes.setdefault(name.lower(), set()).add(obj)
    assert not [k for k, v in classes.items() if len(v) > 1]


def test_readme_table_lists_every_torch_class(torch):
    text = README.read_text()
    section = text[text.index("### torch.nn, class by class") :]
    section = section[: section.index("\n#", 1)]
    rows = dict(re.findall(r"^\| `nn\.(\w+)` \| ([^|]+) \|", section, re.M))
    names = torch_layer_classes(torch)
    assert sorted(rows) == names
    for name in names:
        if name in LEFT_OUT:
            assert rows[name].strip() == "—", name
        else:
            assert f"`{RENAMED.get(name, name)}" in rows[name], name


@pytest.mark.parametrize("torch_name, ours", sorted(RENAMED.items()))
def test_renamed_are_layers(torch_name, ours):
    assert issubclass(getattr(L, ours), L.Layer)
