"""torchvision's ResNets: names and order of the checkpoint, torch parity of outputs,
running statistics and gradients in both modes, initialization, errors.

torchvision is not a test dependency, so the reference is ``_torchvision``: its
``BasicBlock``, ``Bottleneck`` and ``ResNet`` written out in plain ``torch.nn`` with
torchvision's attribute names, registration order and forward passes.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers.models import resnet as R
from tests.twins import randomize

SHAPE = (2, 3, 32, 32)


def _torchvision(torch):
    """torchvision.models.resnet's module structure (groups 1, base width 64, no
    dilation), as its state_dict() names and orders it."""
    nn = torch.nn

    def conv3x3(cin, cout, stride=1):
        return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)

    def conv1x1(cin, cout, stride=1):
        return nn.Conv2d(cin, cout, kernel_size=1, stride=stride, bias=False)

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = conv3x3(inplanes, planes, stride)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = conv3x3(planes, planes)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            identity = x if self.downsample is None else self.downsample(x)
            return self.relu(out + identity)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = conv1x1(inplanes, planes)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = conv3x3(planes, planes, stride)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = conv1x1(planes, planes * 4)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            identity = x if self.downsample is None else self.downsample(x)
            return self.relu(out + identity)

    class ResNet(nn.Module):
        def __init__(self, block, layers, num_classes=1000):
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            self.layer1 = self._make_layer(block, 64, layers[0])
            self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
            self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
            self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512 * block.expansion, num_classes)

        def _make_layer(self, block, planes, blocks, stride=1):
            downsample = None
            if stride != 1 or self.inplanes != planes * block.expansion:
                downsample = nn.Sequential(
                    conv1x1(self.inplanes, planes * block.expansion, stride),
                    nn.BatchNorm2d(planes * block.expansion),
                )
            layers = [block(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes * block.expansion
            layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
            return nn.Sequential(*layers)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return types.SimpleNamespace(
        resnet18=lambda **kw: ResNet(BasicBlock, [2, 2, 2, 2], **kw),
        resnet34=lambda **kw: ResNet(BasicBlock, [3, 4, 6, 3], **kw),
        resnet50=lambda **kw: ResNet(Bottleneck, [3, 4, 6, 3], **kw),
        ResNet=ResNet,
        Bottleneck=Bottleneck,
    )


@pytest.fixture(scope="module")
def tv(torch):
    return _torchvision(torch)


def _templates(model, shape=SHAPE):
    """Abstract params and state, and their merged flattening in the model's order."""
    params, state = pl.params.abstract(model, shape, state=True)
    merged = pl.params.flatten(model.ordered(pl.params.merge(params, state)))
    return params, state, merged


# -- names -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["resnet18", "resnet34", "resnet50"])
def test_names_order_and_shapes_are_torchvision_state_dict(torch, tv, name):
    with torch.device("meta"):  # names and shapes only: nothing allocated or drawn
        twin = getattr(tv, name)(num_classes=10)
    params, state, merged = _templates(getattr(R, name)(num_classes=10))
    sd = twin.state_dict()
    assert list(merged) == list(sd)
    assert {k: tuple(v.shape) for k, v in merged.items()} == {
        k: tuple(v.shape) for k, v in sd.items()
    }
    # trainable arrays in params, buffers in state
    assert sorted(pl.params.flatten(params)) == sorted(k for k, _ in twin.named_parameters())
    assert sorted(pl.params.flatten(state)) == sorted(k for k, _ in twin.named_buffers())


def test_design_names_and_default_head():
    _, state18, flat18 = _templates(R.resnet18())
    assert flat18["layer2.0.downsample.1.weight"].shape == (128,)
    assert flat18["layer2.0.downsample.0.weight"].shape == (128, 64, 1, 1)
    assert "layer2.0.downsample.1.running_mean" in pl.params.flatten(state18)
    assert flat18["fc.weight"].shape == (1000, 512)
    assert "layer1.0.downsample.0.weight" not in flat18  # 64 -> 64 at stride 1
    params50, _, flat50 = _templates(R.resnet50())
    assert flat50["layer1.0.conv3.weight"].shape == (256, 64, 1, 1)
    assert flat50["layer1.0.downsample.0.weight"].shape == (256, 64, 1, 1)  # 64 -> 256
    assert flat50["layer2.0.conv2.weight"].shape == (128, 128, 3, 3)  # V1.5: strides here
    assert flat50["fc.weight"].shape == (1000, 2048)
    assert pl.params.count(params50) == 25_557_032
    assert R.resnet18(10) == R.ResNet(R.BasicBlock, (2, 2, 2, 2), 10)
    assert hash(R.resnet50()) == hash(R.ResNet(R.Bottleneck, [3, 4, 6, 3]))


# -- parity ----------------------------------------------------------------------------


def _randomized(torch, module):
    """Every parameter and buffer drawn anew (``randomize``), then each convolution's
    and fc's weight rescaled to He's ``sqrt(2 / fan_in)`` so that evaluation, which
    normalizes with the random running statistics, keeps activations of order one."""
    randomize(torch, module)
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim > 1:
                p.mul_((2.0 / p[0].numel()) ** 0.5 / p.std())
    return module


def _close(what, ours, theirs, rtol):
    """Each named array equals torch's to ``rtol`` of its own largest magnitude."""
    bad = []
    for name, b in theirs.items():
        a = np.asarray(ours[name], np.float64)
        b = b.detach().double().numpy()
        assert a.shape == b.shape, (what, name, a.shape, b.shape)
        err = np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)
        if err > rtol:
            bad.append(f"{name}: max |diff| / max |torch| = {err:.3g}")
    assert not bad, f"{what} differs from torch:\n  " + "\n  ".join(bad)


# ResNet-18 whole, and ResNet-50's blocks in a shallower stack: every stage's first
# Bottleneck (downsample, V1.5 stride in conv2) and one plain Bottleneck in layer2
PARITY = {
    "resnet18": (lambda tv: tv.resnet18(num_classes=10), lambda: R.resnet18(num_classes=10)),
    "bottleneck-1-2-1-1": (
        lambda tv: tv.ResNet(tv.Bottleneck, [1, 2, 1, 1], num_classes=10),
        lambda: R.ResNet(R.Bottleneck, [1, 2, 1, 1], num_classes=10),
    ),
}


@pytest.mark.parametrize("name", list(PARITY))
def test_eval_and_train_outputs_stats_and_grads_match_torchvision(torch, tv, name):
    """Both sides in float64: in training, the deep BatchNorms normalize a handful of
    values per channel (layer4's 1x1 maps: 2), which amplifies round-off so much that
    torch's own float32 gradients of ResNet-50 differ from its float64 ones by up to 50%
    of their size; in float64 the same amplification leaves ~1e-6. One compiled program
    gives the eval logits and state, the train logits and state, and the gradients."""
    make_twin, make = PARITY[name]
    twin = _randomized(torch, make_twin(tv)).double()
    model = make()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(SHAPE)
    cot = rng.standard_normal((SHAPE[0], 10))
    before = {k: v.clone() for k, v in twin.named_buffers()}
    with torch.no_grad():
        t_eval = twin.eval()(torch.from_numpy(x))
    t_train = twin.train()(torch.from_numpy(x))
    (t_train * torch.from_numpy(cot)).sum().backward()

    with jax.enable_x64(True):
        p_template, s_template = pl.params.abstract(model, SHAPE, jnp.float64, state=True)
        params = pl.params.load_state_dict(p_template, dict(twin.named_parameters()))
        state = pl.params.load_state_dict(s_template, before)

        @jax.jit
        def run(params, state, x, cot):
            y_eval, s_eval = model.apply(params, x, state=state)

            def loss(p):
                y, s = model.apply(p, x, state=state, train=True)
                return jnp.sum(y * cot), (y, s)

            grads, (y_train, s_train) = jax.grad(loss, has_aux=True)(params)
            return y_eval, s_eval, y_train, s_train, grads

        y_eval, s_eval, y_train, s_train, grads = run(params, state, x, cot)

    assert y_eval.dtype == y_train.dtype == jnp.float64
    _close("eval logits", {"y": y_eval}, {"y": t_eval}, 1e-10)
    _close("eval state", pl.params.flatten(s_eval), before, 0)
    _close("train logits", {"y": y_train}, {"y": t_train}, 1e-6)
    _close("running statistics", pl.params.flatten(s_train), dict(twin.named_buffers()), 1e-7)
    grads = pl.params.flatten(grads)
    _close("gradients", grads, {k: p.grad for k, p in twin.named_parameters()}, 1e-4)


def test_checkpoint_loads_into_torchvision_unchanged(torch, tv):
    """Our params and state, merged under their names, load strictly into the twin."""
    model = R.resnet18(num_classes=10)
    twin = _randomized(torch, tv.resnet18(num_classes=10))
    p_template, s_template = pl.params.abstract(model, SHAPE, state=True)
    params = pl.params.load_state_dict(p_template, dict(twin.named_parameters()))
    state = pl.params.load_state_dict(s_template, dict(twin.named_buffers()))
    merged = pl.params.flatten(model.ordered(pl.params.merge(params, state)))
    fresh = tv.resnet18(num_classes=10)
    fresh.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in merged.items()})
    for k, v in twin.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


# -- initialization --------------------------------------------------------------------


def test_init_is_torchvisions():
    """Convolutions ``kaiming_normal(fan_out, relu)``, BatchNorm ones and zeros;
    ``zero_init_residual`` zeros each block's last BatchNorm weight."""
    kaiming = pl.init.kaiming_normal(mode="fan_out", nonlinearity="relu")
    kids = R.resnet50().children()
    assert kids["conv1"].weight_init == kaiming
    assert kids["layer2"][0].children()["conv2"].weight_init == kaiming
    assert kids["layer2"][0].downsample[0].weight_init == kaiming

    shape = (1, 32, 4, 4)
    params = R.BasicBlock(32).init(jax.random.key(0), shape)
    std = float(np.std(np.asarray(params["conv1"]["weight"])))
    assert abs(std / (2.0 / (32 * 9)) ** 0.5 - 1) < 0.05
    assert np.all(np.asarray(params["bn2"]["weight"]) == 1)
    assert np.all(np.asarray(params["bn2"]["bias"]) == 0)
    zeroed = R.BasicBlock(32, zero_init_residual=True).init(jax.random.key(0), shape)
    assert np.all(np.asarray(zeroed["bn2"]["weight"]) == 0)
    assert np.all(np.asarray(zeroed["bn1"]["weight"]) == 1)
    bottleneck = R.ResNet(R.Bottleneck, (1, 1, 1, 1), zero_init_residual=True)
    block = bottleneck.children()["layer1"][0]
    assert block.children()["bn3"].weight_init == pl.init.zeros()


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: R.ResNet(R.BasicBlock, (2, 2, 2)), r"ResNet: layers must be 4 positive ints"),
        (lambda: R.ResNet(R.BasicBlock, (2, 0, 2, 2)), r"ResNet: layers must be a positive"),
        (lambda: R.ResNet(int, (2, 2, 2, 2)), r"ResNet: block must be BasicBlock or Bottleneck"),
        (lambda: R.resnet18(num_classes=0), r"ResNet: num_classes must be a positive integer"),
        (lambda: R.BasicBlock(64, stride=0), r"BasicBlock: stride must be a positive integer"),
        (lambda: R.Bottleneck(64, downsample=3), r"Bottleneck: downsample must be a Layer"),
    ],
)
def test_bad_settings_name_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_apply_errors_name_the_rule():
    model = R.resnet18(num_classes=10)
    params, state = pl.params.abstract(model, SHAPE, state=True)
    x = jax.ShapeDtypeStruct(SHAPE, jnp.float32)
    with pytest.raises(ValueError, match=r"ResNet\[bn1\] BatchNorm2d: .*pass state="):
        jax.eval_shape(lambda p, x: model.apply(p, x), params, x)
    with pytest.raises(ValueError, match=r"ResNet: input rank expected 4"):
        jax.eval_shape(lambda p, s: model.apply(p, jnp.zeros(SHAPE[1:]), state=s), params, state)
    with pytest.raises(ValueError, match=r"ResNet: input rank expected 4"):
        model.init(jax.random.key(0), SHAPE[1:])
    block = R.BasicBlock(16)  # 8 channels in, 16 out, and no downsample
    shape = (2, 8, 4, 4)
    bp, bs = pl.params.abstract(block, shape, state=True)
    with pytest.raises(
        ValueError, match=r"(?s)BasicBlock: the residual branch .*give a downsample"
    ):
        jax.eval_shape(
            lambda p, s, x: block.apply(p, x, state=s), bp, bs, jax.ShapeDtypeStruct(shape, "f4")
        )
