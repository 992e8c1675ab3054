"""Composites written as fields plus ``apply``: ``init`` and ``init_state`` derived from
``apply``, tuple and dict fields as ``nn.ModuleList`` / ``nn.ModuleDict``, against a torch
twin written with those containers."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L


@dataclasses.dataclass(frozen=True)
class ConvBlock(L.Layer):
    norm: L.Layer = L.GroupNorm(2)
    conv: L.Layer = L.Conv2d(8, 3, padding=1)
    bn: L.Layer = L.BatchNorm2d()

    def apply(self, params, x, *, key=None, train=False, state=None):
        h = self.call("conv", params, jax.nn.silu(self.call("norm", params, x)))
        h, bn = self.call("bn", params, h, state=state, train=train)
        return x + h, {"bn": bn}


@dataclasses.dataclass(frozen=True)
class AttnBlock(L.Layer):
    norm: L.Layer = L.GroupNorm(2)
    qkv: L.Layer = L.Conv2d(24, 1)
    proj: L.Layer = L.Conv2d(8, 1)

    def apply(self, params, x, *, key=None, train=False):
        n, c, h, w = x.shape
        qkv = self.call("qkv", params, self.call("norm", params, x)).reshape(n, 3 * c, h * w)
        q, k, v = jnp.split(qkv, 3, axis=1)
        a = jax.nn.softmax(jnp.einsum("ncq,nck->nqk", q, k) / c**0.5, axis=-1)
        return x + self.call("proj", params, jnp.einsum("nqk,nck->ncq", a, v).reshape(n, c, h, w))


@dataclasses.dataclass(frozen=True)
class TinyUNet(L.Layer):
    stem: L.Layer = L.Conv2d(8, 3, padding=1)
    down: tuple[L.Layer, ...] = (ConvBlock(), ConvBlock())
    pool: L.Layer = L.AvgPool2d(2)
    mid: L.Layer = AttnBlock()
    up: L.Layer = L.ConvTranspose2d(8, 2, stride=2)
    heads: Any = dataclasses.field(
        default_factory=lambda: {"seg": L.Conv2d(3, 1), "edge": L.Conv2d(1, 3, padding=1)}
    )

    def apply(self, params, x, *, key=None, train=False, state=None):
        h = self.call("stem", params, x)
        new_state = {"down": {}}
        for i in range(len(self.down)):
            h, s = self.call(f"down.{i}", params, h, state=state, train=train)
            new_state["down"][str(i)] = s
        h = self.call("up", params, self.call("mid", params, self.call("pool", params, h))) + h
        out = tuple(self.call(f"heads.{name}", params, h) for name in self.heads)
        return out, new_state


def _twin(torch):
    nn = torch.nn

    class TConvBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.conv, self.bn = (
                nn.GroupNorm(2, 8),
                nn.Conv2d(8, 8, 3, padding=1),
                nn.BatchNorm2d(8),
            )

        def forward(self, x):
            return x + self.bn(self.conv(nn.functional.silu(self.norm(x))))

    class TAttnBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.qkv, self.proj = (
                nn.GroupNorm(2, 8),
                nn.Conv2d(8, 24, 1),
                nn.Conv2d(8, 8, 1),
            )

        def forward(self, x):
            n, c, h, w = x.shape
            q, k, v = self.qkv(self.norm(x)).reshape(n, 3 * c, h * w).chunk(3, dim=1)
            a = torch.softmax(torch.einsum("ncq,nck->nqk", q, k) / c**0.5, dim=-1)
            return x + self.proj(torch.einsum("nqk,nck->ncq", a, v).reshape(n, c, h, w))

    class TUNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.down = nn.ModuleList([TConvBlock(), TConvBlock()])
            self.pool = nn.AvgPool2d(2)
            self.mid = TAttnBlock()
            self.up = nn.ConvTranspose2d(8, 8, 2, stride=2)
            self.heads = nn.ModuleDict(
                {"seg": nn.Conv2d(8, 3, 1), "edge": nn.Conv2d(8, 1, 3, padding=1)}
            )

        def forward(self, x):
            h = self.stem(x)
            for block in self.down:
                h = block(h)
            h = self.up(self.mid(self.pool(h))) + h
            return tuple(head(h) for head in self.heads.values())

    module = TUNet().double()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # every parameter and buffer away from its default
        for name, t in module.state_dict().items():
            if name.endswith("num_batches_tracked"):
                t.fill_(3)
            elif name.endswith("running_var"):
                t.copy_(0.5 + torch.rand(t.shape, generator=g, dtype=t.dtype))
            else:
                t.copy_(0.3 * torch.randn(t.shape, generator=g, dtype=t.dtype))
    return module


SHAPE = (2, 3, 8, 8)


def test_derived_init_names_order_and_shapes_are_torchs(torch):
    model = TinyUNet()
    params = model.init(jax.random.key(0), SHAPE)
    state = model.init_state(SHAPE)
    twin = _twin(torch)
    ours = {k: tuple(v.shape) for k, v in pl.params.flatten(pl.params.merge(params, state)).items()}
    theirs = {k: tuple(v.shape) for k, v in twin.state_dict().items()}
    assert list(ours) == list(theirs)
    assert ours == theirs


def test_derived_init_folds_one_key_per_child():
    params = TinyUNet().init(jax.random.key(0), SHAPE)
    # the two blocks are equal configurations at equal inputs: only their keys differ
    a, b = params["down"]["0"]["conv"]["weight"], params["down"]["1"]["conv"]["weight"]
    assert not np.allclose(a, b)
    # child i of the parametrized children (in field order) gets fold_in(key, i)
    stem = L.Conv2d(8, 3, padding=1).init(jax.random.fold_in(jax.random.key(0), 0), SHAPE)
    np.testing.assert_array_equal(params["stem"]["weight"], stem["weight"])
    block0 = ConvBlock().init(jax.random.fold_in(jax.random.key(0), 1), (2, 8, 8, 8))
    np.testing.assert_array_equal(params["down"]["0"]["conv"]["weight"], block0["conv"]["weight"])


@pytest.mark.parametrize("train", [False, True])
def test_tiny_unet_matches_torch(torch, train):
    jax.config.update("jax_enable_x64", True)
    try:
        twin = _twin(torch)
        x = np.random.default_rng(1).standard_normal(SHAPE)
        model = TinyUNet()
        template = jax.eval_shape(lambda: model.init(jax.random.key(0), SHAPE, jnp.float64))
        flat = {k: v.numpy() for k, v in twin.state_dict().items()}
        buffers = {k for k, _ in twin.named_buffers()}
        params = pl.params.load_state_dict(
            template, {k: v for k, v in flat.items() if k not in buffers}
        )
        state = pl.params.load_state_dict(
            jax.eval_shape(lambda: model.init_state(SHAPE, jnp.float64)),
            {k: v for k, v in flat.items() if k in buffers},
        )
        twin.train(train)
        xt = torch.tensor(x, requires_grad=True)
        expected = twin(xt)
        (out, new_state) = model.apply(params, jnp.asarray(x), state=state, train=train)
        for o, e in zip(out, expected, strict=True):
            np.testing.assert_allclose(o, e.detach().numpy(), rtol=1e-9, atol=1e-9)
        buffers = pl.params.flatten(new_state)
        for name, value in buffers.items():
            np.testing.assert_allclose(
                value, twin.state_dict()[name].numpy(), rtol=1e-9, atol=1e-12
            )
        cot = [
            np.random.default_rng(2 + i).standard_normal(e.shape) for i, e in enumerate(expected)
        ]
        sum(((e * torch.tensor(c)).sum() for e, c in zip(expected, cot, strict=True))).backward()

        def loss(p, x):
            out = model.apply(p, x, state=state, train=train)[0]
            return sum(jnp.sum(o * c) for o, c in zip(out, cot, strict=True))

        gp, gx = jax.grad(loss, argnums=(0, 1))(params, jnp.asarray(x))
        np.testing.assert_allclose(gx, xt.grad.numpy(), rtol=1e-8, atol=1e-9)
        named = dict(twin.named_parameters())
        flat_grads = pl.params.flatten(gp)
        assert set(flat_grads) == set(named)
        for name, g in flat_grads.items():
            np.testing.assert_allclose(
                g, named[name].grad.numpy(), rtol=1e-8, atol=1e-9, err_msg=name
            )
    finally:
        jax.config.update("jax_enable_x64", False)


def test_call_reaches_tuple_and_dict_members():
    model = TinyUNet()
    params = model.init(jax.random.key(0), SHAPE)
    h = jnp.ones((2, 8, 8, 8))
    y = model.call("heads.seg", params, h)
    np.testing.assert_allclose(y, L.Conv2d(3, 1).apply(params["heads"]["seg"], h), rtol=1e-6)
    assert model.children()["heads"]["edge"] == L.Conv2d(1, 3, padding=1)


def test_dict_field_is_frozen_hashable_and_ordered():
    a, b = TinyUNet(), TinyUNet()
    assert hash(a) == hash(b) and a == b
    swapped = TinyUNet(heads={"edge": L.Conv2d(1, 3, padding=1), "seg": L.Conv2d(3, 1)})
    assert swapped != a
    jax.jit(TinyUNet.apply, static_argnums=0)  # a static argument: hashable


@pytest.mark.parametrize("key", ["a.b", "", 3])
def test_dict_field_key_must_be_a_plain_string(key):
    with pytest.raises(ValueError, match=r"child names must be non-empty strings without '\.'"):
        TinyUNet(heads={key: L.Conv2d(3, 1)})


def test_a_child_name_used_twice_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Twice(L.Layer):
        weight: L.Layer = L.Linear(3)

        def own_names(self):
            return ("weight",)

        def apply(self, params, x, *, key=None, train=False):
            return self.call("weight", params, x)

    with pytest.raises(ValueError, match="Twice: the name 'weight' is used twice"):
        Twice()


def test_init_of_a_composite_whose_apply_raises_names_the_child():
    @dataclasses.dataclass(frozen=True)
    class Bad(L.Layer):
        fc: L.Layer = L.Linear(4)
        out: L.Layer = L.LayerNorm()

        def apply(self, params, x, *, key=None, train=False):
            h = self.call("fc", params, x)
            return self.call("out", params, h[..., :3]) + h[..., :1] * 0

    params = Bad().init(jax.random.key(0), (2, 5))  # LayerNorm takes the width it is given
    assert params["out"]["weight"].shape == (3,)

    @dataclasses.dataclass(frozen=True)
    class Mismatch(L.Layer):
        fc: L.Layer = L.Linear(4)
        emb: L.Layer = L.Embedding(10, 4)

        def apply(self, params, x, *, key=None, train=False):
            return self.call("emb", params, self.call("fc", params, x))

    with pytest.raises(L.LayerError, match=r"^Mismatch\[emb\] Embedding: "):
        Mismatch().init(jax.random.key(0), (2, 5))


def test_own_arrays_with_children_initialized_for_it():
    @dataclasses.dataclass(frozen=True)
    class PosEmb(L.Layer):
        body: L.Layer = L.Linear(8)

        def own_names(self):
            return ("pos_emb",)

        def init(self, key, shape, dtype=jnp.float32):
            k_own, k_children = jax.random.split(key)
            own = {"pos_emb": 0.02 * jax.random.normal(k_own, shape[1:], dtype)}
            return {**own, **self.init_children(k_children, shape, dtype, own)}

        def apply(self, params, x, *, key=None, train=False):
            return self.call("body", params, x + params["pos_emb"][None])

    params = PosEmb().init(jax.random.key(0), (2, 5, 4))
    assert list(pl.params.flatten(params)) == ["pos_emb", "body.weight", "body.bias"]
    assert PosEmb().apply(params, jnp.ones((2, 5, 4))).shape == (2, 5, 8)


def test_traced_train_names_static_argnames():
    model = L.Sequential(L.Linear(4), L.Dropout(0.5))
    params = model.init(jax.random.key(0), (2, 3))
    with pytest.raises(L.LayerError, match=r"static_argnames='train'"):
        jax.jit(model.apply)(params, jnp.ones((2, 3)), train=True, key=jax.random.key(1))
    y = jax.jit(model.apply, static_argnames="train")(
        params, jnp.ones((2, 3)), train=True, key=jax.random.key(1)
    )
    assert y.shape == (2, 4)


def test_any_exception_inside_a_child_carries_its_path():
    @dataclasses.dataclass(frozen=True)
    class Boom(L.Layer):
        def apply(self, params, x, *, key=None, train=False):
            raise TypeError("unsupported operand")

    @dataclasses.dataclass(frozen=True)
    class Outer(L.Layer):
        blocks: tuple[L.Layer, ...] = (L.Identity(), L.Sequential(L.Identity(), Boom()))

        def apply(self, params, x, *, key=None, train=False):
            return self.call("blocks.1", params, self.call("blocks.0", params, x))

    with pytest.raises(TypeError, match=r"^Outer\[blocks\.1\.1\] Boom: unsupported operand$"):
        Outer().apply({}, jnp.ones(3))


def test_output_shape():
    heads = TinyUNet().output_shape(SHAPE)  # a stateful layer: the output, not the state
    assert [h.shape for h in heads] == [(2, 3, 8, 8), (2, 1, 8, 8)]
    assert L.Linear(5).output_shape((7, 3)).shape == (7, 5)


def test_a_child_apply_never_reaches_needs_init_written():
    @dataclasses.dataclass(frozen=True)
    class Unused(L.Layer):
        fc: L.Layer = L.Linear(3)
        spare: L.Layer = L.Linear(2)
        act: L.Layer = L.ReLU()  # parameter-free: unreached is fine

        def apply(self, params, x, *, key=None, train=False):
            return self.call("fc", params, x)

    with pytest.raises(L.LayerError, match=r"^Unused: child 'spare' \(Linear\) has parameters"):
        Unused().init(jax.random.key(0), (2, 4))


def test_frozen_dict_field_cannot_be_changed():
    heads = TinyUNet().heads
    with pytest.raises(AttributeError, match="FrozenDict is immutable"):
        heads.x = 1
    with pytest.raises(TypeError):
        heads["seg"] = L.Linear(2)
