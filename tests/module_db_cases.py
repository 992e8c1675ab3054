"""Driving torch's own module samples (``torch.testing._internal.common_modules.module_db``)
through the class table of docs/layers/torch-nn.md: the torch class each entry names -> our class, its
constructor arguments -> ours, its forward inputs -> our ``apply``, and one jitted
program per sample that compares outputs, gradients and the buffers after a
training-mode step with torch's, in float64. ``tests/test_module_db.py`` runs it."""

from __future__ import annotations

import copy
import inspect
import sys
import types
import unittest
import warnings
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import purelayers as pl
from purelayers import layers as L
from purelayers.testing import _worst

# torch's name -> ours, where ours differs (docs/layers/torch-nn.md: one concept keeps one class)
RENAMED = {"MultiheadAttention": "InProjAttention"}

# Constructor arguments that are input widths: ``init`` reads them from the shape.
WIDTHS = {
    "in_features", "in1_features", "in2_features", "in_channels", "input_size",
    "num_features", "num_channels", "normalized_shape", "d_model", "embed_dim",
}  # fmt: skip

# torch classes with no layer here: its losses (purelayers has none) and its Lazy
# variants (every purelayers layer reads its input widths from init's shape).
NOT_LAYERS = ("Loss", "Lazy")

# Samples refused, with the reason: ``(torch class, predicate(desc, index), reason)``.
REFUSED: list[tuple[str, Any, str]] = []

# float64 on both sides: what is left is the order of sums
RTOL, ATOL = 1e-7, 1e-9


def load_module_db(torch) -> dict[str, Any]:
    """torch's ``module_db`` by class name (losses and Lazy classes left out).
    ``common_utils`` imports ``expecttest`` for its ``TestCase`` base only; where that
    package is missing a stand-in with ``unittest.TestCase`` is enough."""
    if "expecttest" not in sys.modules:
        try:
            import expecttest  # noqa: F401
        except ImportError:
            stub = types.ModuleType("expecttest")
            stub.TestCase = unittest.TestCase
            sys.modules["expecttest"] = stub
    from torch.testing._internal.common_modules import module_db

    return {
        info.module_cls.__name__: info
        for info in module_db
        if not any(word in info.module_cls.__name__ for word in NOT_LAYERS)
    }


def samples(torch, info) -> list:
    """The entry's sample inputs in training mode (a superset of eval mode's), float64."""
    return list(
        info.module_inputs_func(
            info, device="cpu", dtype=torch.float64, requires_grad=True, training=True
        )
    )


def refusal(name: str, index: int, desc: str) -> str | None:
    for cls, pred, reason in REFUSED:
        if cls == name and pred(desc, index):
            return reason
    return None


# -- constructor arguments ----------------------------------------------------------------


def _activation(act: Any) -> Any:
    """torch's ``F.relu`` / ``F.gelu`` (functions) as our activation names."""
    return act if isinstance(act, str) else act.__name__


def _encoder_layer(m) -> L.Layer:
    """Our ``TransformerEncoderLayer`` for a built torch one (``TransformerEncoder``'s
    samples pass a module, not arguments)."""
    return L.TransformerEncoderLayer(
        m.self_attn.num_heads,
        m.linear1.out_features,
        m.dropout.p,
        _activation(m.activation),
        m.norm1.eps,
        m.self_attn.batch_first,
        m.norm_first,
        m.linear1.bias is not None,
    )


def torch_arguments(cls, args: tuple, kwargs: dict) -> dict:
    """The sample's constructor arguments by torch's names."""
    sig = inspect.signature(cls.__init__)
    if any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values()):
        if args:  # torch's RNN classes: *args; the samples pass keywords
            raise ValueError(f"{cls.__name__}: positional arguments to *args")
        return dict(kwargs)
    bound = sig.bind(None, *args, **kwargs)
    return {k: v for k, v in list(bound.arguments.items())[1:]}


def our_layer(torch, name: str, args: tuple, kwargs: dict) -> tuple[L.Layer, dict]:
    """Our layer for torch's ``name(*args, **kwargs)``, and the extra ``apply`` keywords
    (``random_samples``). Input widths are dropped; ``normalized_shape`` becomes
    ``normalized_ndim``; activations given as torch functions become names."""
    cls = getattr(torch.nn, name)
    named = torch_arguments(cls, args, kwargs)
    extra = {}
    if "_random_samples" in named:
        samples_ = named.pop("_random_samples")
        extra["random_samples"] = None if samples_ is None else samples_.detach().numpy()
    if name in ("LayerNorm", "RMSNorm"):
        shape = named["normalized_shape"]
        named["normalized_ndim"] = 1 if isinstance(shape, int) else len(shape)
    if "activation" in named:
        named["activation"] = _activation(named["activation"])
    if name == "TransformerEncoder":
        named["encoder_layer"] = _encoder_layer(named["encoder_layer"])
        if named.get("norm") is not None:
            norm = named["norm"]
            named["norm"] = L.LayerNorm(eps=norm.eps, bias=norm.bias is not None)
    named = {k: v for k, v in named.items() if k not in WIDTHS and k not in ("device", "dtype")}
    return getattr(L, RENAMED.get(name, name))(**named), extra


# -- inputs -------------------------------------------------------------------------------


def _numpy(torch, v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.detach().numpy().copy()
    if isinstance(v, (tuple, list)):
        return tuple(_numpy(torch, x) for x in v)
    return v


def _torch_leaves(torch, out: Any) -> list:
    if out is None:
        return []
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _torch_leaves(torch, o)]
    return [out]


def _floating(a: Any) -> bool:
    return hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating)


def _init_shape(name: str, args: tuple) -> Any:
    if name in ("Bilinear", "Transformer"):
        return (args[0].shape, args[1].shape)
    return args[0].shape


def _mha_apply(layer, params, args, kwargs, **kw):
    """``nn.MultiheadAttention(q, k, v, key_padding_mask, need_weights, attn_mask)`` as
    ``InProjAttention.apply`` takes it: the same masks, in torch's meaning."""
    q, k, v = args[:3]
    return layer.apply(
        params,
        q,
        context=k,
        value=v,
        mask=kwargs.get("attn_mask"),
        key_padding_mask=kwargs.get("key_padding_mask"),
        need_weights=True,
        **kw,
    )


def _apply(name, layer, params, args, kwargs, **kw):
    if name == "MultiheadAttention":
        return _mha_apply(layer, params, args, kwargs, **kw)
    return layer.apply(params, *args, **kwargs, **kw)


# -- one sample ---------------------------------------------------------------------------


def _randomize(torch, module, seed: int) -> None:
    """Every parameter and buffer drawn at random (default inits such as zero biases,
    unit norms and zero running means hide mistakes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
        for n, b in module.named_buffers():
            if not b.is_floating_point():
                b.copy_(torch.randint(1, 10, b.shape, generator=g))
            elif "var" in n:
                b.copy_(torch.rand(b.shape, generator=g, dtype=b.dtype) + 0.5)
            else:
                b.copy_(torch.randn(b.shape, generator=g, dtype=b.dtype) * 0.5)


def _torch_side(torch, module, targs, tkwargs, rng, train: bool):
    """Outputs, cotangents, input gradients, parameter gradients and buffers after one
    call of ``module`` in the given mode."""
    module.train(train)
    module.zero_grad(set_to_none=True)

    def fresh(v):
        if isinstance(v, torch.Tensor):
            v = v.detach().clone()
            return v.requires_grad_(True) if v.is_floating_point() else v
        if isinstance(v, (tuple, list)):
            return type(v)(fresh(x) for x in v)
        return v

    args = fresh(targs)
    kwargs = {k: fresh(v) for k, v in tkwargs.items()}
    outs = _torch_leaves(torch, module(*args, **kwargs))
    cots = [rng.standard_normal(tuple(o.shape)) if o.is_floating_point() else None for o in outs]
    total = sum(
        (o * torch.from_numpy(c)).sum() for o, c in zip(outs, cots, strict=True) if c is not None
    )
    if isinstance(total, torch.Tensor) and total.requires_grad:
        total.backward()
    ins = [t for t in _torch_leaves(torch, list(args)) if isinstance(t, torch.Tensor)]
    in_grads = [
        np.zeros(tuple(t.shape)) if t.grad is None else t.grad.numpy()
        for t in ins
        if t.is_floating_point()
    ]
    p_grads = {
        n: np.zeros(tuple(p.shape)) if p.grad is None else p.grad.detach().numpy()
        for n, p in module.named_parameters()
    }
    buffers = {n: b.detach().numpy().copy() for n, b in module.named_buffers()}
    return [o.detach().numpy() for o in outs], cots, in_grads, p_grads, buffers


def run_sample(torch, name: str, info, sample, index: int) -> None:
    """Compare ``sample`` on our layer with torch's module; raises ``AssertionError``
    naming every output, gradient or buffer that differs (or the exception our side
    raised)."""
    cargs, ckwargs = sample.constructor_input.args, sample.constructor_input.kwargs
    fargs, fkwargs = sample.forward_input.args, dict(sample.forward_input.kwargs)
    if "input" in fkwargs:  # Linear's sample passes its input by keyword
        fargs = (fkwargs.pop("input"), *fargs)
    seed = zlib.crc32(f"{name}/{index}".encode())
    with warnings.catch_warnings():  # TransformerEncoder's note on nested tensors
        warnings.simplefilter("ignore", UserWarning)
        module = info.module_cls(*cargs, **ckwargs).to(torch.float64)
    _randomize(torch, module, seed)
    has_buffers = bool(list(module.buffers()))
    do_train = info.train_and_eval_differ or has_buffers
    train_module = copy.deepcopy(module)
    rng = np.random.default_rng(seed)
    want_eval = _torch_side(torch, module, fargs, fkwargs, rng, False)
    want_train = _torch_side(torch, train_module, fargs, fkwargs, rng, True) if do_train else None

    with jax.enable_x64(True):
        layer, extra = our_layer(torch, name, cargs, ckwargs)
        args = _numpy(torch, tuple(fargs))
        kwargs = {k: _numpy(torch, v) for k, v in fkwargs.items() if v is not None}
        kwargs.update(extra)
        shape = _init_shape(name, args)
        params, state = pl.params.abstract(layer, shape, jnp.float64, state=True)
        params = layer.ordered(params)
        named = {n: p.detach() for n, p in module.named_parameters()}
        ours = list(pl.params.flatten(params))
        if ours != list(named):
            raise AssertionError(f"parameter names: ours {ours}, torch's {list(named)}")
        params = pl.params.load_state_dict(params, named)
        if state:
            buffers = dict(module.named_buffers())
            wanted = list(pl.params.flatten(state))
            if not set(wanted) <= set(buffers):
                raise AssertionError(f"buffer names: ours {wanted}, torch's {list(buffers)}")
            state = pl.params.load_state_dict(state, {k: buffers[k] for k in wanted})
        leaves, treedef = jax.tree.flatten(args)
        slots = [i for i, a in enumerate(leaves) if _floating(a)]

        def call(p, floats, train):
            full = list(leaves)
            for i, f in zip(slots, floats, strict=True):
                full[i] = f
            kw = {"train": True, "key": jax.random.key(0)} if train else {}
            if state:
                out, new_state = _apply(
                    name, layer, p, jax.tree.unflatten(treedef, full), kwargs, state=state, **kw
                )
            else:
                out, new_state = (
                    _apply(name, layer, p, jax.tree.unflatten(treedef, full), kwargs, **kw),
                    None,
                )
            outs = jax.tree.leaves(out)
            return [o for o in outs if _floating(o)], (outs, new_state)

        def both(p, floats, cots_eval, cots_train):
            res = {}
            for mode, cots in (("eval", cots_eval), ("train", cots_train)):
                if cots is None:
                    continue
                _, vjp, (outs, new_state) = jax.vjp(
                    lambda p, f, mode=mode: call(p, f, mode == "train"), p, floats, has_aux=True
                )
                res[mode] = (outs, vjp(list(cots)), new_state)
            return res

        def float_cots(want):
            return None if want is None else [c for c in want[1] if c is not None]

        floats = [leaves[i] for i in slots]
        got = jax.jit(both)(params, floats, float_cots(want_eval), float_cots(want_train))

    problems = []
    for mode, want in (("eval", want_eval), ("train", want_train)):
        if want is None:
            continue
        outs, (g_params, g_inputs), new_state = got[mode]
        w_outs, _, w_in, w_p, w_buf = want
        if len(outs) != len(w_outs):
            problems.append(f"{mode}: {len(outs)} outputs, torch's {len(w_outs)}")
            continue
        pairs = [
            (f"{mode} output {i}", o, w) for i, (o, w) in enumerate(zip(outs, w_outs, strict=True))
        ]
        pairs += [
            (f"{mode} gradient of input {i}", g, w)
            for i, (g, w) in enumerate(zip(g_inputs, w_in, strict=True))
        ]
        pairs += [
            (f"{mode} gradient of {n}", g, w_p[n]) for n, g in pl.params.flatten(g_params).items()
        ]
        if mode == "train" and new_state:
            pairs += [
                (f"buffer {n} after the step", b, w_buf[n])
                for n, b in pl.params.flatten(new_state).items()
            ]
        problems += _worst(pairs, RTOL, ATOL)
    if problems:
        raise AssertionError("\n  ".join(problems))
