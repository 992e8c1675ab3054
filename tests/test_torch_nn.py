"""The catalog against ``torch.nn``: every layer class torch 2.13 has is here, under its
name (or the one ``RENAMED`` gives), except the few ``LEFT_OUT`` with the reason; the
class table of the documentation (docs/layers/torch-nn.md) lists every one of them."""

from __future__ import annotations

import inspect
import pathlib
import re

import jax
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L

TABLE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "layers" / "torch-nn.md"

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


def test_docs_table_lists_every_torch_class(torch):
    text = TABLE.read_text()
    section = text[text.index("# torch.nn, class by class") :]
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


# Constructor arguments that differ from torch's on purpose: input widths are read from
# init's shape, ``dim`` is ``axis`` as in the rest of the library, a sync norm reduces
# over a named axis rather than a process group; Hardtanh's ``min_value``/``max_value``
# are torch's deprecated spellings of ``min_val``/``max_val``.
WIDTHS = {
    "in_features", "in1_features", "in2_features", "in_channels", "input_size",
    "num_features", "num_channels", "normalized_shape", "d_model", "embed_dim",
}  # fmt: skip
ARG_RENAMED = {"dim": "axis", "process_group": "axis_name"}
DEPRECATED = {"min_value", "max_value"}
# Classes whose constructors differ further, on purpose.
ARGS_DIFFER = {
    "SyncBatchNorm": "axis_name (torch's last argument, process_group) is its first: the "
    "one the layer is for",
    "MultiheadAttention": "InProjAttention is torch's module with batch_first=True, the "
    "library's (batch, seq, E) layout, and has no batch_first switch",
}


def _public_args(signature) -> list:
    return [
        p
        for p in signature.parameters.values()
        if p.name not in ("self", "device", "dtype")
        and not p.name.startswith("_")
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def _spelled(name: str, ours) -> str:
    """torch's argument ``name`` as ours spells it (``dim`` is ours where we say ``axis``)."""
    return name if name in ours else ARG_RENAMED.get(name, name)


def test_constructor_arguments_follow_torch(torch):
    """Every public argument of a torch class's constructor is one of ours, by the same
    name (but for ``WIDTHS``, ``ARG_RENAMED`` and ``DEPRECATED``). Where torch's
    constructor starts with no input width, its positional arguments are ours in order
    (``MaxPool2d(3, 2, 1, 2)`` has dilation 2, ``Embedding(10, 3, 0)`` padding_idx 0, as
    in torch); where it starts with one, ours are a prefix of the rest, the others
    keyword-only (so ``Conv2d(3, 16, 3, 1, 1)`` copied from torch is a ``TypeError``,
    not a layer with other meanings)."""
    problems = []
    for name in torch_layer_classes(torch):
        if name in LEFT_OUT or name in ARGS_DIFFER:
            continue
        ours_cls = getattr(L, RENAMED.get(name, name))
        theirs = _public_args(inspect.signature(getattr(torch.nn, name).__init__))
        if not theirs:
            continue  # torch's RNN classes take *args
        ours = {p.name: p for p in _public_args(inspect.signature(ours_cls))}

        for p in theirs:
            if p.name not in WIDTHS | DEPRECATED and _spelled(p.name, ours) not in ours:
                problems.append(f"{name}: no argument {p.name!r}")
        positional = [
            p.name for p in theirs if p.kind == p.POSITIONAL_OR_KEYWORD and p.name not in DEPRECATED
        ]
        shifted = any(n in WIDTHS for n in positional)
        positional = [_spelled(n, ours) for n in positional if n not in WIDTHS]
        mine = [n for n, p in ours.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
        # torch's positional arguments up to its first private one
        everything = [
            p.name for p in inspect.signature(getattr(torch.nn, name).__init__).parameters.values()
            if p.kind == p.POSITIONAL_OR_KEYWORD and p.name != "self" and p.name not in WIDTHS
        ]  # fmt: skip
        reachable = positional[: next(
            (i for i, n in enumerate(everything) if n.startswith("_")), len(everything)
        )]  # fmt: skip
        if mine != reachable[: len(mine)] or (not shifted and mine != reachable):
            problems.append(f"{name}: positional {mine}, torch's {reachable}")
    assert not problems, "\n".join(problems)


def test_dropout_of_one_is_accepted_and_drops_everything_as_torch(torch):
    """torch takes ``dropout=1.0`` wherever it takes a dropout probability; in train mode
    every dropped value is then zero, so the outputs are deterministic and equal
    torch's: an LSTM's second layer reads zeros, a (post-norm) encoder layer is its two
    norms applied to the input, both sublayers' outputs dropped."""
    x = np.random.default_rng(0).standard_normal((5, 2, 3)).astype(np.float32)
    key = jax.random.key(0)
    cases = [
        (L.LSTM(4, num_layers=2, dropout=1.0), torch.nn.LSTM(3, 4, num_layers=2, dropout=1.0)),
        (
            L.TransformerEncoderLayer(1, 8, dropout=1.0),
            torch.nn.TransformerEncoderLayer(3, 1, 8, dropout=1.0),
        ),
    ]
    for ours, theirs in cases:
        with torch.no_grad():
            for p in theirs.parameters():
                p.copy_(torch.randn(p.shape) * 0.5)
        params = pl.params.load_state_dict(pl.params.abstract(ours, x.shape), theirs.state_dict())
        want = theirs.train()(torch.tensor(x))
        want = (want[0] if isinstance(want, tuple) else want).detach().numpy()
        got = ours.apply(params, x, train=True, key=key)
        got = got[0] if isinstance(got, tuple) else got
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    for layer in (L.GRU, L.RNN):
        assert layer(4, num_layers=2, dropout=1.0).dropout == 1.0
    assert L.InProjAttention(2, dropout=1.0).dropout == 1.0
    assert L.TransformerDecoderLayer(1, dropout=1.0).dropout == 1.0
