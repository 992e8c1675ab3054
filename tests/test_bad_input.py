"""Bad input, driven by ``tests/registry.py``: for every registered layer,

- params and state that do not fit (an entry missing, one too many, one of the wrong
  shape) raise ``LayerError`` naming the owning layer's path and the key, while
  tracing (``jax.eval_shape``: nothing compiles);
- zero-size inputs give torch's answer: along every axis whose emptiness leaves the
  params as they are (batch, sequence, spatial), the randomized torch twin's output
  shape and values, or, where torch raises, a ``LayerError``; along the other axes (the
  input width, which the twin's fixed width cannot take), a result or a ``LayerError``,
  never another exception;
- integer and bool inputs compute as torch does, or raise ``LayerError`` naming the
  dtype.

Layers of several inputs (``Case.extra``: ``Bilinear``, the decoder layers) are left to
their family test files.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L
from purelayers import models as M
from purelayers.layers.errors import LayerError
from purelayers.params import Stacked
from tests import twins
from tests.registry import CASES as ALL_CASES
from tests.registry import Case

KEY = jax.random.key(0)
CASES = [c for c in ALL_CASES if not c.extra]
BY_ID = {c.id: c for c in CASES}
WITH_PARAMS = [
    c.id for c in CASES if jax.tree.leaves(jax.eval_shape(lambda c=c: c.make().init(KEY, c.shape)))
]
WITH_STATE = [c.id for c in CASES if jax.tree.leaves(c.make().init_state(c.shape))]
FLOAT_INPUT = [c.id for c in CASES if c.ids is None]


def _input(case: Case, shape=None, dtype=jnp.float32):
    shape = case.shape if shape is None else shape
    rng = np.random.default_rng(0)
    if case.ids is not None:
        return rng.integers(0, case.ids, shape)
    return rng.standard_normal(shape).astype(np.float32)


def _traced(layer, params, x, state, kwargs):
    def go(params, state):
        if state:
            return layer.apply(params, x, state=state, **kwargs)[0]
        return layer.apply(params, x, **kwargs)

    return jax.eval_shape(go, params, state)


def _abstract_params(layer, shape):
    """``layer.init``'s tree as shapes and dtypes, in the layer's own order (traced, not
    run: the checks below only trace ``apply``)."""
    return layer.ordered(jax.eval_shape(lambda: layer.init(KEY, shape)))


def _first_leaf(tree, path=()):
    """The path (dict keys; ``"*"`` for a ``Stacked`` node) of the first array."""
    if isinstance(tree, Stacked):
        return _first_leaf(tree.tree, (*path, "*"))
    if isinstance(tree, dict):
        for k, v in tree.items():
            if jax.tree.leaves(v):
                return _first_leaf(v, (*path, k))
    return path


def _edit(tree, path, fn):
    """A copy of ``tree`` with the dict holding ``path[-1]`` replaced by ``fn(dict)``."""
    if len(path) == 1:
        return fn(dict(tree))
    if path[0] == "*":
        return Stacked(_edit(tree.tree, path[1:], fn), tree.n)
    return {**tree, path[0]: _edit(tree[path[0]], path[1:], fn)}


def _where(case: Case, path) -> str:
    """The message's start: the root's class (the wrapped layer's, for the transparent
    ``Remat``), the owner's path in brackets."""
    layer = case.make()
    if isinstance(layer, L.Tied):  # its own alias check, or the wrapped layer's
        return ("Tied", f"Sequential[{'.'.join(path[:-1])}]")
    root = type(layer.layer if isinstance(layer, L.Remat) else layer).__name__
    return (root if len(path) == 1 else f"{root}[{'.'.join(path[:-1])}]",)


def _misfits(tree, path):
    key = path[-1]

    def grown(d):
        a = d[key]
        shape = (a.shape[0] + 1, *a.shape[1:]) if a.ndim else (1,)
        return {**d, key: jnp.zeros(shape, a.dtype)}

    def other_kind(d):  # a float entry as int32, an integer one (a counter) as float32
        a = d[key]
        floating = jnp.issubdtype(a.dtype, jnp.floating)
        return {**d, key: jnp.zeros(a.shape, jnp.int32 if floating else jnp.float32)}

    return {
        "missing": (_edit(tree, path, lambda d: {k: v for k, v in d.items() if k != key}), key),
        "extra": (_edit(tree, path, lambda d: {**d, "stray": jnp.zeros((2,))}), "stray"),
        "shape": (_edit(tree, path, grown), key),
        "dtype": (_edit(tree, path, other_kind), key),
    }


def _assert_misfit_named(case: Case, kind: str, which: str) -> None:
    """One entry of the params (``which="params"``) or of the state made not to fit:
    the ``LayerError`` names the owner's path and the key."""
    layer = case.make()
    trees = {"params": _abstract_params(layer, case.shape), "state": layer.init_state(case.shape)}
    path = _first_leaf(trees[which])
    trees[which], key = _misfits(trees[which], path)[kind]
    with pytest.raises(LayerError) as info:
        _traced(layer, trees["params"], _input(case), trees["state"], case.kwargs)
    message = str(info.value)
    where = _where(case, path)
    # first, or (an entry of the wrong width) in the line under the layer's own message
    assert message.startswith(where) or (kind == "shape" and any(w in message for w in where))
    named = repr(key) in message or f".{key}'" in message  # Tied names 'emb.weight'
    assert named, message


@pytest.mark.parametrize("kind", ["missing", "extra", "shape", "dtype"])
@pytest.mark.parametrize("case_id", WITH_PARAMS)
def test_params_that_do_not_fit_name_the_path_and_the_key(case_id, kind):
    _assert_misfit_named(BY_ID[case_id], kind, "params")


@pytest.mark.parametrize("case_id", WITH_PARAMS)
def test_params_of_another_kind_name_the_key(case_id):
    """An entry that should be an array given as a dict, and a dict given as None."""
    case = BY_ID[case_id]
    layer = case.make()
    params, state = _abstract_params(layer, case.shape), layer.init_state(case.shape)
    path = _first_leaf(params)
    bad = _edit(params, path, lambda d: {**d, path[-1]: {"x": jnp.zeros(2)}})
    with pytest.raises(LayerError, match=repr(path[-1])):
        _traced(layer, bad, _input(case), state, case.kwargs)
    with pytest.raises(LayerError, match=r"params expected a dict|params has no entry"):
        _traced(layer, None, _input(case), state, case.kwargs)


@pytest.mark.parametrize("kind", ["missing", "extra", "shape", "dtype"])
@pytest.mark.parametrize("case_id", WITH_STATE)
def test_state_that_does_not_fit_names_the_path_and_the_key(case_id, kind):
    _assert_misfit_named(BY_ID[case_id], kind, "state")


def test_a_buffer_missing_from_a_models_state_is_named_as_the_states():
    """A model whose children read their state themselves (ResNet's BatchNorms): a
    running statistic missing from the state tree is reported as the state's entry,
    with the child's path, not as a missing parameter."""
    model = M.resnet18(num_classes=5)
    params, state = model.init(KEY, (1, 3, 32, 32)), model.init_state((1, 3, 32, 32))
    flat = pl.params.flatten(state)
    del flat["layer1.0.bn1.running_var"]
    with pytest.raises(
        LayerError,
        match=r"^ResNet\[layer1\.0\.bn1\] BatchNorm2d: state has no entry 'running_var'\n"
        r"  got keys \['num_batches_tracked', 'running_mean'\]; pass the tree init_state",
    ):
        model.apply(params, jnp.ones((1, 3, 32, 32)), state=pl.params.unflatten(flat))


def test_a_layer_of_two_inputs_is_checked_against_both_shapes():
    """``Bilinear``'s params depend on both inputs' widths: a missing, unexpected or
    wrongly shaped entry is named as for any layer, eagerly and under ``jit``, as are
    entries given to the parameter-free two-input layers."""
    layer, x1, x2 = L.Bilinear(4), jnp.ones((3, 5)), jnp.ones((3, 2))
    params = layer.init(KEY, (x1.shape, x2.shape))
    cases = [
        (
            {"weight": params["weight"]},
            r"params entry 'bias' expected an array of shape \(4,\), got nothing",
        ),
        ({**params, "bias": jnp.ones(5)}, r"params entry 'bias' shape expected \(4,\), got \(5,\)"),
        ({**params, "extra": jnp.ones(1)}, r"params entry 'extra' expected no such entry"),
    ]
    for bad, message in cases:
        for run in (layer.apply, jax.jit(layer.apply)):
            with pytest.raises(LayerError, match=rf"^Bilinear: {message}"):
                run(bad, x1, x2)
    with pytest.raises(LayerError, match=r"^Bilinear: params entry 'bias' expected no such entry"):
        L.Bilinear(4, bias=False).apply(params, x1, x2)
    for free in (L.CosineSimilarity(), L.PairwiseDistance()):
        with pytest.raises(LayerError, match=r"params entry 'w' expected no such entry"):
            free.apply({"w": jnp.ones(2)}, x1, x1)


def test_a_switched_off_bias_is_expected_absent_and_a_switched_on_one_required():
    x = jnp.ones((4, 5))
    on, off = L.Linear(6), L.Linear(6, bias=False)
    p_on, p_off = on.init(KEY, x.shape), off.init(KEY, x.shape)
    with pytest.raises(LayerError, match=r"^Linear: params entry 'bias' expected an array"):
        on.apply(p_off, x)
    with pytest.raises(LayerError, match=r"^Linear: params entry 'bias' expected no such entry"):
        off.apply(p_on, x)
    # a (7, 5) weight for Linear(6) used to give a (4, 7) output
    with pytest.raises(LayerError, match=r"'weight' shape expected \(6, 5\), got \(7, 5\)"):
        off.apply({"weight": jnp.ones((7, 5))}, x)


def test_entries_that_are_not_arrays_or_of_another_kind_are_named(torch):
    """An abstract tree (``pl.params.abstract``: shapes, no values) or torch tensors
    given as params are named as such (they used to pass the check and fail later with
    an ``AttributeError``); a float parameter given as integers, or an integer counter
    as floats, is named by its dtype (torch refuses both; before, an int32 weight
    computed in float32 and an int32 ``running_mean`` kept truncated statistics)."""
    model = L.Sequential({"fc": L.Linear(3), "bn": L.BatchNorm1d()})
    x = jnp.ones((4, 5))
    params, state = model.init(KEY, x.shape), model.init_state(x.shape)
    abstract = pl.params.abstract(model, x.shape)
    with pytest.raises(
        LayerError,
        match=r"^Sequential\[fc\] Linear: params entry 'weight' "
        r"expected a JAX or NumPy array, got jax\.ShapeDtypeStruct\n  an abstract",
    ):
        model.apply(abstract, x, state=state)
    tensors = {k: torch.tensor(np.asarray(v)) for k, v in pl.params.flatten(params).items()}
    with pytest.raises(
        LayerError, match=r"got torch\.Tensor\n.*load through pl\.params\.load_state_dict"
    ):
        model.apply(pl.params.unflatten(tensors), x, state=state)
    ints = {**params, "fc": {**params["fc"], "weight": jnp.ones((3, 5), jnp.int32)}}
    for run in (model.apply, jax.jit(model.apply, static_argnames="train")):
        with pytest.raises(
            LayerError,
            match=r"^Sequential\[fc\] Linear: params entry 'weight' "
            r"dtype expected floating point \(as init builds it\), got int32",
        ):
            run(ints, x, state=state)
    counter = {"bn": {**state["bn"], "num_batches_tracked": jnp.float32(0.5)}}
    with pytest.raises(
        LayerError,
        match=r"state entry 'num_batches_tracked' dtype expected "
        r"an integer dtype \(as init_state builds it\), got float32",
    ):
        model.apply(params, x, state=counter, train=True)
    # float widths are one kind: a bfloat16 or float64 tree computes
    half = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
    assert model.apply(half, x, state=state)[0].shape == (4, 3)
    # A tied weight given as integers is named, not the integer activation it causes.
    tied = L.Tied(L.Sequential({"emb": L.Embedding(7, 4), "head": L.Linear(7, bias=False)}),
                  {"head.weight": "emb.weight"})  # fmt: skip
    ids = jnp.zeros((2, 3), jnp.int32)
    p = tied.init(KEY, ids.shape)
    p = {**p, "emb": {"weight": p["emb"]["weight"].astype(jnp.int32)}}
    with pytest.raises(LayerError, match=r"params entry 'weight' dtype expected floating point"):
        tied.apply(p, ids)


def test_the_check_runs_under_jit_and_vmap_and_inside_containers():
    model = L.Sequential(L.Linear(3), L.ReLU(), L.Repeat(L.Sequential(L.Linear(3)), 2))
    params = model.init(KEY, (4, 5))
    bad = {**params, "2": Stacked({"0": {"weight": params["2"].tree["0"]["weight"]}}, 2)}
    for run in (model.apply, jax.jit(model.apply), jax.vmap(model.apply, in_axes=(None, 0))):
        x = (
            jnp.ones((2, 4, 5))
            if run is not model.apply and "vmap" in repr(run)
            else jnp.ones((4, 5))
        )
        with pytest.raises(
            LayerError, match=r"^Sequential\[2\.\*\.0\] Linear: params entry 'bias'"
        ):
            run(bad, x)


def test_per_block_params_of_a_repeat_are_checked_per_block():
    rep = L.Repeat(L.Linear(4), 3)
    params = rep.init(KEY, (2, 4))
    blocks = rep.unstack(params)
    rep.apply(blocks, jnp.ones((2, 4)))  # fits
    blocks["1"] = {"weight": blocks["1"]["weight"]}
    with pytest.raises(LayerError, match=r"^Repeat\[1\] Linear: params entry 'bias'"):
        rep.apply(blocks, jnp.ones((2, 4)))


def _jitted(layer, case: Case, state):
    """The first output of ``apply``, one compiled program (cheaper than op by op)."""

    def run(params, state, x):
        out = layer.apply(params, x, state=state, **case.kwargs) if state else (
            layer.apply(params, x, **case.kwargs))  # fmt: skip
        return jax.tree.leaves(out[0] if state else out)[0]

    return jax.jit(run)


# -- empty axes ---------------------------------------------------------------------


def _zeroed(case: Case):
    for axis in range(len(case.shape)):
        shape = list(case.shape)
        shape[axis] = 0
        yield axis, tuple(shape)


EMPTY = [(c.id, axis) for c in CASES for axis, _ in _zeroed(c)]


def _torch_out(torch, case, module, x):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = case.torch_call(module, x) if case.torch_call else module(x)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize(("case_id", "axis"), EMPTY, ids=[f"{c}-axis{a}" for c, a in EMPTY])
def test_empty_axes_give_torchs_answer(case_id, axis, torch):
    case = BY_ID[case_id]
    layer = case.make()
    shape = dict(_zeroed(case))[axis]
    x = _input(case, shape)
    params = None
    try:
        state = layer.init_state(shape)
        run = _jitted(layer, case, state)
        abstract = jax.eval_shape(lambda: layer.init(KEY, shape))
        out = jax.eval_shape(run, abstract, state, x)
        # an empty output has no values to compare: tracing gives its shape, and nothing
        # needs initializing or compiling
        if 0 in out.shape:
            ours = np.zeros(out.shape)
        else:
            params = layer.init(KEY, shape)
            ours = np.asarray(run(params, state, x))
        raised = None
    except LayerError as e:
        ours, raised = None, e
    same_params = (
        jax.tree.map(jnp.shape, jax.eval_shape(lambda: layer.init(KEY, case.shape)))
        == jax.tree.map(jnp.shape, abstract)
        if raised is None
        else True
    )
    if not same_params:
        return  # the input width: the twin's fixed width cannot take it; ours computed
    module = twins.randomize(torch, case.torch(torch)).eval()
    if params is not None:  # the values ours computed with
        flat = pl.params.flatten(pl.params.merge(params, state))
        module.load_state_dict(
            {k: torch.tensor(np.asarray(v)) for k, v in flat.items()}, strict=False
        )
    xt = torch.tensor(x)
    try:
        theirs = _torch_out(torch, case, module, xt).numpy()
    except (RuntimeError, ValueError, IndexError) as e:
        assert raised is not None, f"torch raises {e!r}; ours returned {ours.shape}"
        return
    assert raised is None, f"torch returns {theirs.shape}; ours raised {raised}"
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_empty_axes_in_training_and_gradients_as_torch(torch):
    """Norms training on an empty batch or empty spatial axes keep torch's statistics
    (InstanceNorm's empty batch: NaN, as torch's average of nothing), a jitted gradient
    through a zero-width ``Linear`` is zeros of the weight's shape, and a ResNet takes an
    empty batch."""
    for ours, module, shape in [
        (L.BatchNorm2d(), torch.nn.BatchNorm2d(3), (4, 3, 0, 5)),
        (L.BatchNorm2d(), torch.nn.BatchNorm2d(3), (0, 3, 5, 5)),
        (
            L.InstanceNorm2d(track_running_stats=True),
            torch.nn.InstanceNorm2d(3, track_running_stats=True),
            (0, 3, 5, 5),
        ),
        (
            L.InstanceNorm2d(track_running_stats=True),
            torch.nn.InstanceNorm2d(3, track_running_stats=True),
            (2, 3, 0, 5),
        ),
    ]:
        params, state = ours.init(KEY, shape), ours.init_state(shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the mean of nothing
            run = jax.jit(lambda p, x, s, layer=ours: layer.apply(p, x, state=s, train=True))
            y, new = run(params, jnp.ones(shape), state)
            theirs = module.train()(torch.ones(shape))
        assert y.shape == tuple(theirs.shape)
        buffers = {k: v for k, v in module.state_dict().items() if k in new}
        assert len(buffers) == 3
        for name, value in buffers.items():
            np.testing.assert_array_equal(np.asarray(new[name]), value.numpy(), err_msg=name)
    linear = L.Linear(6)
    params = linear.init(KEY, (2, 3, 0))
    grads = jax.jit(jax.grad(lambda p: linear.apply(p, jnp.ones((2, 3, 0))).sum()))(params)
    assert grads["weight"].shape == (6, 0)
    np.testing.assert_array_equal(np.asarray(grads["bias"]), np.full(6, 6.0))
    resnet = M.ResNet(M.BasicBlock, (1, 1, 1, 1), num_classes=5)  # resnet18's path, a block a stage
    params, state = resnet.init(KEY, (1, 3, 32, 32)), resnet.init_state((1, 3, 32, 32))
    assert resnet.apply(params, jnp.ones((0, 3, 32, 32)), state=state)[0].shape == (0, 5)


def test_empty_widths_as_torch(torch):
    """Where the input width is what is empty, against torch modules of that width."""
    x = np.zeros((4, 0), np.float32)
    ours = L.Linear(6)
    params = ours.init(KEY, x.shape)
    module = torch.nn.Linear(0, 6)
    np.testing.assert_array_equal(
        np.asarray(ours.apply(params, x)), module(torch.tensor(x)).detach()
    )
    np.testing.assert_array_equal(np.asarray(params["bias"]), np.zeros(6))  # torch: bound 0
    for layer, module, shape in [
        (L.LayerNorm(), torch.nn.LayerNorm(0), (2, 3, 0)),
        (L.RMSNorm(), torch.nn.RMSNorm(0), (2, 3, 0)),
        (L.GroupNorm(1), torch.nn.GroupNorm(1, 0), (2, 0, 5)),
        (L.RNNCell(6), torch.nn.RNNCell(0, 6), (3, 0)),
        (L.Conv2d(4, 3), torch.nn.Conv2d(0, 4, 3), (2, 0, 6, 6)),  # torch: no channels out
    ]:
        p = layer.init(KEY, shape)
        flat = pl.params.flatten(p)
        module.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in flat.items()})
        xs = np.zeros(shape, np.float32)
        ours, theirs = np.asarray(layer.apply(p, xs)), module(torch.tensor(xs)).detach()
        assert ours.shape == tuple(theirs.shape)
        np.testing.assert_allclose(ours, theirs, atol=1e-6)
    with pytest.raises(LayerError, match=r"embed_dim\) expected at least 1"):
        L.InProjAttention(2).init(KEY, (2, 5, 0))  # torch: "embed_dim ... must be greater than 0"


def test_batchnorm_trains_on_an_empty_batch_as_torch(torch):
    bn, module = L.BatchNorm2d(), torch.nn.BatchNorm2d(3).train()
    params, state = bn.init(KEY, (4, 3, 5, 5)), bn.init_state((4, 3, 5, 5))
    x = np.zeros((0, 3, 5, 5), np.float32)
    y, new = bn.apply(params, x, state=state, train=True)
    assert y.shape == tuple(module(torch.tensor(x)).shape)
    for name, value in module.state_dict().items():
        if name in pl.params.flatten(new):
            np.testing.assert_array_equal(np.asarray(pl.params.flatten(new)[name]), value.numpy())


# -- integer and bool inputs ----------------------------------------------------------

DTYPES = [(c, k) for c in FLOAT_INPUT for k in ("int", "bool")]


@pytest.mark.parametrize(("case_id", "kind"), DTYPES, ids=[f"{c}-{k}" for c, k in DTYPES])
def test_integer_and_bool_inputs_compute_as_torch_or_name_the_dtype(case_id, kind, torch):
    case = BY_ID[case_id]
    layer = case.make()
    values = np.random.default_rng(0).integers(-3, 4, case.shape)
    values = values > 0 if kind == "bool" else values
    params, state = layer.init(KEY, case.shape), layer.init_state(case.shape)
    module = twins.randomize(torch, case.torch(torch)).eval()
    flat = pl.params.flatten(pl.params.merge(params, state))
    module.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in flat.items()}, strict=False)
    x = jax.device_put(values.astype(np.bool_ if kind == "bool" else np.int32))
    try:
        out = _jitted(layer, case, state)(params, state, x)
    except LayerError as e:
        assert "dtype" in str(e) and str(x.dtype) in str(e), str(e)
        return
    theirs = _torch_out(torch, case, module, torch.tensor(values))  # torch must compute too
    out = np.asarray(out)
    np.testing.assert_allclose(out.astype(np.float64), theirs.numpy().astype(np.float64), atol=1e-4)
    assert (out.dtype.kind == "f") == theirs.is_floating_point(), (out.dtype, theirs.dtype)


@pytest.mark.parametrize("case_id", FLOAT_INPUT)
def test_complex_inputs_compute_as_torch_or_name_the_dtype(case_id, torch):
    """A complex input is never computed as its real part: the layer refuses it with
    a ``LayerError`` naming the dtype (where torch's module refuses it, or computes in
    real arithmetic), or computes what torch computes, in complex."""
    case = BY_ID[case_id]
    layer = case.make()
    rng = np.random.default_rng(0)
    values = (rng.standard_normal(case.shape) + 1j * rng.standard_normal(case.shape)).astype(
        np.complex64
    )
    params, state = layer.init(KEY, case.shape), layer.init_state(case.shape)
    x = jax.device_put(values)
    try:
        out = _jitted(layer, case, state)(params, state, x)
    except LayerError as e:
        assert "dtype" in str(e) and "complex64" in str(e), str(e)
        return
    module = twins.randomize(torch, case.torch(torch)).eval()
    flat = pl.params.flatten(pl.params.merge(params, state))
    module.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in flat.items()}, strict=False)
    theirs = _torch_out(torch, case, module, torch.tensor(values))  # torch must compute too
    assert theirs.is_complex()
    np.testing.assert_allclose(np.asarray(out), theirs.numpy(), rtol=1e-4, atol=1e-4)


def test_a_model_and_its_lora_copy_are_each_checked_against_their_own_tree():
    """``lora.wrap`` copies a model with some children replaced; the copy compares equal
    to the original by configuration, yet each is checked against its own tree."""
    from purelayers import lora
    from purelayers import models as M

    model = M.GPT2LMHeadModel(M.GPT2Config(vocab_size=20, n_embd=8, n_layer=1, n_head=2))
    base = model.init(KEY, (1, 5))
    lmodel = lora.wrap(model, ("c_attn",), r=2)
    params = lora.init(lmodel, KEY, base)
    ids = jnp.ones((1, 5), jnp.int32)
    lmodel.apply(params, ids)
    model.apply(base, ids)
    with pytest.raises(LayerError, match=r"params entry 'lora_A' expected no such entry"):
        model.apply(params, ids)
