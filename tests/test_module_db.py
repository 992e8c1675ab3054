"""torch's own module tests, through the class table of docs/layers/torch-nn.md.

torch ships the sample inputs its suite runs every ``nn`` module on
(``torch.testing._internal.common_modules.module_db``). For each entry whose class is a
layer here (every one but torch's losses and ``Lazy*`` classes), each sample builds our
layer from the sample's constructor arguments with the input widths dropped
(``tests/module_db_cases.py`` translates them), and torch's module from the same
arguments with every parameter and buffer drawn at random; the weights are copied into
our params and state by name. In float64, one jitted program per sample computes our
outputs and the gradients with respect to every floating-point input and parameter (a
random cotangent), in evaluation mode and, for a module with buffers or whose training
mode differs, in training mode with the buffers after that step; each is compared with
torch's. A sample either passes or is refused for a reason ``REFUSED`` states.

The suite runs a fixed share: every fourth class of ``CLASSES`` (each class is also
compared with torch by the layer table, tests/test_layers.py), and of each the samples
whose index in its entry is a multiple of ``STRIDE`` (the first, the ninth, ...).
``PURELAYERS_MODULE_DB=all python -m pytest tests/test_module_db.py`` runs every sample.
"""

from __future__ import annotations

import os

import pytest

from tests import module_db_cases as cases

STRIDE = 8
ALL = os.environ.get("PURELAYERS_MODULE_DB", "").lower() == "all"

# module_db's entries with a layer here (torch 2.13), by torch's class name
CLASSES = (
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "Bilinear", "CELU", "CircularPad1d",
    "CircularPad2d", "CircularPad3d", "ConstantPad1d", "ConstantPad2d", "ConstantPad3d",
    "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "ELU", "Embedding", "FractionalMaxPool2d", "FractionalMaxPool3d", "GELU", "GLU", "GRU",
    "GRUCell", "GroupNorm", "Hardshrink", "Hardswish", "Hardtanh", "InstanceNorm1d",
    "InstanceNorm2d", "InstanceNorm3d", "LPPool1d", "LPPool2d", "LPPool3d", "LSTM",
    "LSTMCell", "LayerNorm", "LeakyReLU", "Linear", "LocalResponseNorm", "LogSigmoid",
    "LogSoftmax", "MaxPool1d", "MaxPool2d", "MaxPool3d", "Mish", "MultiheadAttention",
    "PReLU", "RMSNorm", "RNN", "RNNCell", "ReLU", "ReLU6", "ReflectionPad1d",
    "ReflectionPad2d", "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d",
    "ReplicationPad3d", "SELU", "SiLU", "Sigmoid", "Softmax", "Softmax2d", "Softmin",
    "Softplus", "Softshrink", "Softsign", "Tanh", "Tanhshrink", "Threshold", "Transformer",
    "TransformerDecoderLayer", "TransformerEncoder", "TransformerEncoderLayer", "ZeroPad1d",
    "ZeroPad2d", "ZeroPad3d",
)  # fmt: skip


@pytest.fixture(scope="module")
def module_db(torch):
    return cases.load_module_db(torch)


def test_every_entry_with_a_layer_is_driven(module_db):
    """``CLASSES`` is module_db's entries less the losses and Lazy classes, each a layer
    here under its name (or the one ``RENAMED`` gives)."""
    from purelayers import layers as L

    assert sorted(module_db) == sorted(CLASSES)
    assert all(hasattr(L, cases.RENAMED.get(n, n)) for n in CLASSES)


@pytest.mark.parametrize("name", CLASSES if ALL else CLASSES[::4])
def test_module_db_samples_match_torch(torch, module_db, name):
    info = module_db[name]
    failures, refused, ran = [], [], 0
    for index, sample in enumerate(cases.samples(torch, info)):
        if not ALL and index % STRIDE:
            continue
        reason = cases.refusal(name, index, sample.desc)
        if reason is not None:
            refused.append(f"{name}[{index}]: {reason}")
            continue
        ran += 1
        try:
            cases.run_sample(torch, name, info, sample, index)
        except Exception as e:  # every failure is reported, by sample
            failures.append(f"{name}[{index}] {sample.desc!r}: {type(e).__name__}: {e}")
    assert not failures, f"{len(failures)} of {ran} samples differ:\n" + "\n".join(failures)
    if not ran:
        pytest.skip("; ".join(refused))
