"""gradcheck: passes on correct derivatives, and bites on a 1% error."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import purelayers as pl


@jax.custom_jvp
def wrong_sin(x):
    return jnp.sin(x)


@wrong_sin.defjvp
def _wrong_sin_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return jnp.sin(x), 1.01 * jnp.cos(x) * t  # 1% too large


def test_passes_on_correct_derivatives():
    params = {"w": jnp.array([[0.3, -1.2], [0.8, 0.5]]), "b": jnp.array([0.1, -0.2])}

    def fn(p, x):
        return jnp.tanh(x @ p["w"].T + p["b"][None, :])

    assert pl.testing.gradcheck(fn, params, jnp.array([[1.0, 2.0], [-0.5, 0.3]])) is True


def test_fails_on_a_one_percent_error_naming_the_leaf():
    params = {"layer": {"weight": jnp.array([0.4, -0.7, 1.1])}}

    def fn(p, x):
        return wrong_sin(p["layer"]["weight"]) * x

    with pytest.raises(
        AssertionError, match=r"layer\.weight \(argument 0\).*analytic .* numerical"
    ):
        pl.testing.gradcheck(fn, params, jnp.ones(3))


def _sin_vjp(factor):
    """``sin`` as a ``custom_vjp`` whose backward is ``factor`` times the true one."""

    @jax.custom_vjp
    def sin(x):
        return jnp.sin(x)

    sin.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (factor * g * jnp.cos(x),))
    return sin


def test_a_custom_vjp_is_checked_in_reverse_mode():
    """A ``custom_vjp`` has no forward mode; its reverse mode is still checked: right
    passes, 1% too large fails naming the leaf (d sin(x) / dx at x = 0.4 is cos(0.4) =
    0.92106, so the wrong rule gives 0.93027)."""
    params = {"w": jnp.array([0.4, -0.7, 1.1])}
    right, wrong = _sin_vjp(1.0), _sin_vjp(1.01)
    assert pl.testing.gradcheck(lambda p: right(p["w"]), params) is True
    with pytest.raises(
        AssertionError, match=r"reverse-mode derivative with respect to w \(argument 0\)"
    ) as err:
        pl.testing.gradcheck(lambda p: wrong(p["w"]), params)
    assert "analytic 0.9302" in str(err.value) and "numerical 0.9210" in str(err.value)


def test_a_repeat_leaf_is_named_by_its_block():
    """A ``Repeat``'s params are stacked (leading axis: the block); the failing leaf is
    named as its checkpoint name, ``blocks.2.scale``, with the index inside block 2's
    array, where only block 2's derivative is wrong (``sin`` scaled by ``[1, 1, 1.01]``
    per block, so block 2's gradient is 1% too large)."""
    from purelayers import layers as L

    sins = (_sin_vjp(1.0), _sin_vjp(1.01))

    @dataclasses.dataclass(frozen=True)
    class Scale(L.Layer):
        def init(self, key, shape, dtype=jnp.float32):
            return {"scale": jnp.linspace(0.2, 0.8, shape[-1], dtype=dtype)}

        def apply(self, params, x, *, key=None, train=False):
            return x * params["scale"]

    model = L.Sequential({"blocks": L.Repeat(Scale(), 3)})
    params = model.init(jax.random.key(0), (4,))

    def fn(p, x):
        blocks = p["blocks"].tree["scale"]  # (3, 4): block 2's goes through the wrong sin
        return sum(sins[i == 2](blocks[i]) * x for i in range(3))

    with pytest.raises(
        AssertionError,
        match=r"with respect to blocks\.2\.scale \(argument 0\) .* at input index \(\d,\)",
    ):
        pl.testing.gradcheck(fn, params, jnp.ones(4))


def test_integer_leaves_pass_through():
    def fn(x, ids):
        return x[ids] ** 2

    assert pl.testing.gradcheck(fn, jnp.array([1.0, 2.0, 3.0]), jnp.array([2, 0]))


# -- assert_matches_torch ------------------------------------------------------------------


def _randomized(torch, module):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.5)
    return module


def test_assert_matches_torch_passes_and_returns_the_loaded_params(torch):
    import numpy as np

    from purelayers import layers as L

    module = _randomized(
        torch,
        torch.nn.Sequential(torch.nn.Conv1d(3, 4, 3, padding=1), torch.nn.Tanh(),
                            torch.nn.Flatten(), torch.nn.Linear(20, 2)),
    )  # fmt: skip
    model = L.Sequential(L.Conv1d(4, 3, padding=1), L.Tanh(), L.Flatten(), L.Linear(2))
    x = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    params = pl.testing.assert_matches_torch(model, module, x, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(params["3"]["weight"], module[3].weight.detach().numpy())


def test_assert_matches_torch_names_the_worst_wrong_leaf(torch):
    """Three mutations a parity check must catch: a transposed weight, a wrong
    derivative (the output is right), and names that differ from torch's."""
    import numpy as np

    from purelayers import layers as L

    module = _randomized(torch, torch.nn.Linear(4, 4))
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    params = pl.testing.assert_matches_torch(L.Linear(4), module, x)
    transposed = {**params, "weight": params["weight"].T}
    with pytest.raises(AssertionError, match=r"(?s)Linear differs from Linear .*\n  output 0: max"):
        pl.testing.assert_matches_torch(L.Linear(4), module, x, params=transposed)

    @dataclasses.dataclass(frozen=True)
    class WrongGradient(L.Layer):
        def own_names(self):
            return ("weight", "bias")

        def init(self, key, shape, dtype=jnp.float32):
            return L.Linear(4).init(key, shape, dtype)

        def apply(self, params, x, **_):
            return L.Linear(4).apply({**params, "weight": wrong_sin(params["weight"])}, x)

    sin_module = _randomized(torch, torch.nn.Linear(4, 4))
    with torch.no_grad():
        sin_params = {"weight": np.arcsin(np.clip(sin_module.weight.numpy(), -0.99, 0.99))}
        sin_module.weight.copy_(torch.from_numpy(np.sin(sin_params["weight"])))
    sin_params["bias"] = sin_module.bias.detach().numpy()

    class SinLinear(torch.nn.Module):
        def __init__(self, base, w):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.from_numpy(w))
            self.bias = base.bias

        def forward(self, x):
            return torch.nn.functional.linear(x, torch.sin(self.weight), self.bias)

    twin = SinLinear(sin_module, sin_params["weight"])
    with pytest.raises(AssertionError, match=r"\n  gradient of weight: max \|diff\|"):
        pl.testing.assert_matches_torch(WrongGradient(), twin, x, rtol=1e-4, atol=1e-4)
    with pytest.raises(AssertionError, match=r"parameter names differ"):
        pl.testing.assert_matches_torch(L.Linear(4, bias=False), module, x)
    with pytest.raises(TypeError, match=r"module must be a torch\.nn\.Module"):
        pl.testing.assert_matches_torch(L.Linear(4), lambda x: x, x)


def test_assert_matches_torch_names_an_output_of_another_shape(torch):
    """An output of another shape than torch's (here transposed, ``(2, 3)`` for torch's
    ``(3, 2)``) is an ``AssertionError`` naming both shapes, with or without gradients
    (before the shape check, the gradient pass failed first with JAX's ``TypeError``
    about a cotangent of torch's shape)."""
    import numpy as np

    from purelayers import layers as L

    module = _randomized(torch, torch.nn.Linear(4, 2))
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    layer = L.Linear(2)
    pl.testing.assert_matches_torch(layer, module, x)
    for grads in (True, False):
        with pytest.raises(AssertionError, match=r"output 0: shape \(2, 3\), torch's \(3, 2\)"):
            pl.testing.assert_matches_torch(
                layer, module, x, apply=lambda p, x: layer.apply(p, x).T, grads=grads
            )


def test_assert_matches_torch_needs_forward_mode(torch):
    """The JVP half of the check: a layer whose derivative is a ``custom_vjp`` is right
    in reverse mode (torch agrees) but has no forward mode (``jax.jvp``, ``jacfwd`` and
    Hessian-vector products fail on it), and the check says so."""
    import numpy as np

    from purelayers import layers as L

    @jax.custom_vjp
    def tanh(x):
        return jnp.tanh(x)

    tanh.defvjp(lambda x: (jnp.tanh(x), x), lambda x, g: (g * (1 - jnp.tanh(x) ** 2),))
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    pl.testing.assert_matches_torch(L.Tanh(), torch.nn.Tanh(), x, grads=False)
    with pytest.raises(TypeError, match=r"Lambda has no forward-mode autodiff .* forward_mode="):
        pl.testing.assert_matches_torch(L.Lambda(tanh), torch.nn.Tanh(), x)
    # forward_mode=False: outputs and reverse-mode gradients alone, which a wrong rule fails
    pl.testing.assert_matches_torch(L.Lambda(tanh), torch.nn.Tanh(), x, forward_mode=False)

    @jax.custom_vjp
    def wrong(x):
        return jnp.tanh(x)

    wrong.defvjp(lambda x: (jnp.tanh(x), x), lambda x, g: (g * (1 - jnp.tanh(x) ** 2) * 1.1,))
    with pytest.raises(AssertionError, match=r"gradient of input 0"):
        pl.testing.assert_matches_torch(L.Lambda(wrong), torch.nn.Tanh(), x, forward_mode=False)


def test_assert_matches_torch_sees_nan(torch):
    """A NaN where torch has a number fails, and a NaN elsewhere in a leaf hides none of
    its other mismatches; NaN where torch has NaN (a NaN input row) agrees."""
    import numpy as np

    from purelayers import layers as L

    layer, module = L.Linear(3), _randomized(torch, torch.nn.Linear(4, 3))
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    with pytest.raises(AssertionError, match=r"output 0: max \|diff\| inf, at \(0, 0\) ours nan"):
        pl.testing.assert_matches_torch(
            layer, module, x, apply=lambda p, v: layer.apply(p, v) * jnp.nan
        )
    x[0, 0] = np.nan  # row 0 is NaN on both sides
    pl.testing.assert_matches_torch(layer, module, x)
    with pytest.raises(AssertionError, match=r"output 0: max \|diff\| 5, at \(1, "):
        pl.testing.assert_matches_torch(
            layer, module, x, apply=lambda p, v: layer.apply(p, v) + 5.0
        )


def test_assert_matches_torch_names_buffers_that_differ(torch):
    """A torch module whose buffers have other names (here one level deeper) is an
    ``AssertionError`` listing both sides' buffer names, as for parameters."""
    import numpy as np

    from purelayers import layers as L

    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    nested = torch.nn.Sequential(torch.nn.BatchNorm1d(3, affine=False))
    with pytest.raises(AssertionError, match=r"buffer names differ\n  ours  \['running_mean'"):
        pl.testing.assert_matches_torch(L.BatchNorm1d(affine=False), nested, x)
