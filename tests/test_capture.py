"""``pl.capture``: the sublayers' return values by dotted path, equal to running the
sublayers by hand, eagerly and under ``jit``, ``grad`` and ``vmap``, through every way
a child is applied (``Sequential`` numbered and named, ``Layer.call`` in a composite,
``Repeat``'s scan and its unrolled per-block form, ``Remat``), and the model untouched."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import purelayers as pl
from purelayers import layers as L
from purelayers import models as M
from tests.composites import Residual

KEY = jax.random.key(0)


def _model():
    return L.Sequential(
        {
            "embed": L.Linear(8),
            "blocks": L.Repeat(Residual(L.LayerNorm(), L.Sequential(L.Linear(8), L.GELU())), 3),
            "norm": L.LayerNorm(),
            "head": L.Linear(4),
        }
    )


def _by_hand(model, params, x):
    """Every sublayer's output, computed one layer at a time."""
    out = {"embed": model["embed"].apply(params["embed"], x)}
    rep = model["blocks"]
    blocks = rep.unstack(params["blocks"])
    h = out["embed"]
    for i in range(rep.n):
        block, p = rep.layer, blocks[str(i)]
        n = block.norm.apply(p["norm"], h)
        out[f"blocks.{i}.norm"] = n
        body = block.body.apply(p["body"], n)
        out[f"blocks.{i}.body"] = body
        out[f"blocks.{i}.body.0"] = block.body[0].apply(p["body"]["0"], n)
        h = block.apply(p, h)
        out[f"blocks.{i}"] = h
    out["norm"] = model["norm"].apply(params["norm"], h)
    out["head"] = model["head"].apply(params["head"], out["norm"])
    return out


@pytest.mark.parametrize(
    ("patterns", "names"),
    [
        (("blocks.1",), ["blocks.1"]),
        (("blocks.*.norm",), ["blocks.0.norm", "blocks.1.norm", "blocks.2.norm"]),
        (("*.body.0", "norm"), ["blocks.0.body.0", "blocks.1.body.0", "blocks.2.body.0", "norm"]),
        (("re:blocks\\.[02]",), ["blocks.0", "blocks.2"]),
        (("embed", "head", "nothing.here"), ["embed", "head"]),
    ],
)
def test_exactly_the_matched_paths_with_the_values_computed_by_hand(patterns, names):
    model = _model()
    params = model.init(KEY, (2, 5, 6))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 5, 6)), jnp.float32)
    hand = _by_hand(model, params, x)
    h = hash(model)
    for fn in (pl.capture(model.apply, *patterns), jax.jit(pl.capture(model.apply, *patterns))):
        out, values = fn(params, x)
        assert sorted(values) == sorted(names)
        for name in names:
            np.testing.assert_allclose(values[name], hand[name], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out, model.apply(params, x), rtol=1e-5, atol=1e-5)
    assert hash(model) == h and model == _model()


def test_the_root_is_not_a_sublayer_and_names_are_relative_to_the_model():
    model = _model()
    params = model.init(KEY, (2, 5, 6))
    _, values = pl.capture(model.apply, "*")(params, jnp.ones((2, 5, 6)))
    assert "" not in values and "embed" in values and "blocks.2.body.1" in values
    assert len(values) == 4 + 3 * 5  # 4 children, 5 sublayers per block (itself included)


def test_grad_and_vmap_through_a_capture():
    model = _model()
    params = model.init(KEY, (2, 5, 6))
    x = jnp.ones((2, 5, 6))
    probe = pl.capture(model.apply, "blocks.2.norm")

    def loss(p):
        return jnp.sum(probe(p, x)[1]["blocks.2.norm"] ** 2)

    def by_hand(p):
        return jnp.sum(_by_hand(model, p, x)["blocks.2.norm"] ** 2)

    @jax.jit  # one program for the transformed captures and their references
    def runs(params, x):
        xs = jnp.stack([x, 2 * x])
        return (
            (jax.grad(loss)(params), jax.grad(by_hand)(params)),
            jax.vmap(probe, in_axes=(None, 0))(params, xs)[1]["blocks.2.norm"][1],
            _by_hand(model, params, 2 * x)["blocks.2.norm"],
        )

    (grads, expected), mapped, doubled = runs(params, x)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(mapped, doubled, atol=1e-5)


def test_unrolled_repeat_remat_and_state():
    rep = L.Repeat(L.Sequential(L.Linear(3), L.Tanh()), 2, remat=True)
    params = rep.init(KEY, (4, 3))
    x = jnp.ones((4, 3))
    stacked = jax.jit(pl.capture(rep.apply, "*.0"))(params, x)[1]
    unrolled = pl.capture(rep.apply, "*.0")(rep.unstack(params), x)[1]
    assert sorted(stacked) == sorted(unrolled) == ["0.0", "1.0"]
    for k in stacked:
        np.testing.assert_allclose(stacked[k], unrolled[k], rtol=1e-6)
    remat = L.Remat(L.Sequential(L.Linear(3), L.GELU()))
    p = remat.init(KEY, (4, 3))
    _, values = jax.jit(pl.capture(remat.apply, "0"))(p, x)
    np.testing.assert_allclose(values["0"], remat.layer[0].apply(p["0"], x), rtol=1e-6)
    net = L.Sequential({"conv": L.Conv2d(2, 3), "bn": L.BatchNorm2d()})
    p, s = net.init(KEY, (2, 1, 5, 5)), net.init_state((2, 1, 5, 5))
    (y, _), values = pl.capture(net.apply, "bn")(p, jnp.ones((2, 1, 5, 5)), state=s, train=True)
    y_bn, s_bn = values["bn"]  # the sublayer's return value: (y, new_state)
    np.testing.assert_array_equal(y, y_bn)
    assert set(s_bn) == {"running_mean", "running_var", "num_batches_tracked"}


def test_models_by_their_checkpoint_names():
    config = M.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=32)
    model = M.GPT2LMHeadModel(config)
    params = model.init(KEY, (2, 7))
    ids = jnp.ones((2, 7), jnp.int32)
    _, values = jax.jit(pl.capture(model.apply, "transformer.h.*.attn", "transformer.ln_f"))(
        params, ids
    )
    assert sorted(values) == ["transformer.h.0.attn", "transformer.h.1.attn", "transformer.ln_f"]
    assert values["transformer.h.1.attn"].shape == (2, 7, 16)
    # the head tied to the embedding is a sublayer too: its output is the logits
    logits, values = pl.capture(model.apply, "lm_head")(params, ids)
    assert model.tied and "lm_head" not in params and list(values) == ["lm_head"]
    np.testing.assert_array_equal(values["lm_head"], logits)


def test_bad_patterns():
    with pytest.raises(ValueError, match=r"^capture: give at least one pattern"):
        pl.capture(_model().apply)
    with pytest.raises(ValueError, match=r"^capture: patterns\[1\] pattern 're:\(' is not a valid"):
        pl.capture(_model().apply, "x", "re:(")


def test_a_jitted_function_is_refused_not_captured_empty():
    """A capture around an already-jitted function cannot see its sublayers (they run in
    the function's own trace, and a second call comes back from the compilation cache
    without tracing): ``fn`` jitted is refused, and values recorded inside a jitted
    callee (dead tracers) are an error on every call, even when the callee was compiled
    before (it is traced again under the capture), where the other order,
    ``jit(capture(...))``, works."""
    model = _model()
    params = model.init(KEY, (2, 5))
    x = jax.random.normal(jax.random.key(1), (2, 5))
    jitted = jax.jit(model.apply)
    with pytest.raises(ValueError, match=r"^capture: fn is already jitted .*jax\.jit\(pl\.capture"):
        pl.capture(jitted, "head")
    inside = pl.capture(lambda p, v: jitted(p, v), "head")
    for _ in range(2):  # the second call too, though the callee's trace is cached by then
        with pytest.raises(
            ValueError, match=r"^capture: the values of \['head'\] were recorded inside"
        ):
            inside(params, x)
    jitted(params, x)  # a callee compiled before the capture was made
    with pytest.raises(
        ValueError, match=r"^capture: the values of \['head'\] were recorded inside"
    ):
        pl.capture(lambda p, v: jitted(p, v), "head")(params, x)
    out, values = jax.jit(pl.capture(model.apply, "head"))(params, x)
    np.testing.assert_array_equal(values["head"], out)
