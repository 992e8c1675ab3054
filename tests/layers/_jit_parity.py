"""Torch parity in one compilation per case, for the many small convolution and pooling
cases: the output and the gradients with respect to the input and every parameter come
from a single jitted ``jax.vjp`` (``tests.parity.check_parity`` compiles the forward and
backward passes separately, which dominates these tests' run time)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.params import flatten


def assert_jit_parity(torch, module, fn, params, x, *, torch_fn=None, rtol=1e-4, atol=1e-5):
    """``fn(params, x)`` against ``torch_fn(module, x)`` (default ``module(x)``): output,
    then the gradients of ``sum(out * g)`` for a random cotangent ``g`` with respect to
    ``x`` and every named parameter, each within ``rtol``/``atol``."""
    torch_fn = torch_fn or (lambda m, t: m(t))
    xt = torch.tensor(x, requires_grad=True)
    yt = torch_fn(module, xt)
    want = tuple(yt.shape)
    got = jax.eval_shape(fn, params, jax.ShapeDtypeStruct(x.shape, x.dtype)).shape
    assert tuple(got) == want, f"output shape {tuple(got)} vs torch {want}"
    cot = np.random.default_rng(0).standard_normal(want).astype(np.float32)
    (yt * torch.tensor(cot)).sum().backward()

    @jax.jit
    def run(p, x, c):
        y, vjp = jax.vjp(fn, p, x)
        return (y, *vjp(c))

    y, grad_p, grad_x = run(params, jnp.asarray(x), jnp.asarray(cot))
    np.testing.assert_allclose(np.asarray(y), yt.detach().numpy(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(
        np.asarray(grad_x), xt.grad.numpy(), rtol=rtol, atol=atol, err_msg="gradient of input"
    )
    named = dict(module.named_parameters())
    assert sorted(flatten(grad_p)) == sorted(named), "parameter names differ from torch's"
    for name, g in flatten(grad_p).items():
        np.testing.assert_allclose(
            np.asarray(g), named[name].grad.numpy(), rtol=rtol, atol=atol, err_msg=name
        )
