"""Torch-parity checks: copy a torch module's weights in by name, compare outputs and
gradients with respect to the input and every parameter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.params import flatten, load_state_dict


def load_from_torch(layer, module, shape, dtype=jnp.float32, *, check_order: bool = True):
    """``layer``'s params filled from ``module.state_dict()`` by name (names and order
    must equal torch's). Returns the params tree."""
    template = layer.init(jax.random.key(0), shape, dtype)
    sd = {k: v for k, v in module.state_dict().items() if k in dict(module.named_parameters())}
    ours = list(flatten(template))
    if check_order:
        assert ours == list(sd), f"names/order differ:\n ours  {ours}\n torch {list(sd)}"
    return load_state_dict(template, sd)


def _as_list(out: Any) -> list:
    return [o for o in jax.tree.leaves(out)] if not hasattr(out, "shape") else [out]


def _torch_leaves(out: Any) -> list:
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _torch_leaves(o)]
    return [out]


def check_parity(
    torch,
    module,
    jax_fn: Callable[[Any, Any], Any],
    params: Any,
    inputs: list[np.ndarray],
    *,
    torch_fn: Callable[..., Any] | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    grad_inputs: bool = True,
    seed: int = 0,
):
    """Compare ``jax_fn(params, *inputs)`` with ``torch_fn(module, *tensors)`` (default
    ``module(*tensors)``): every output leaf, then gradients of ``sum(out * g)`` for a
    random cotangent ``g`` w.r.t. every floating input and every named parameter."""
    torch_fn = torch_fn or (lambda m, *xs: m(*xs))
    tensors = [
        torch.tensor(x, requires_grad=grad_inputs and np.issubdtype(x.dtype, np.floating))
        for x in inputs
    ]
    t_out = _torch_leaves(torch_fn(module, *tensors))
    j_out = _as_list(jax_fn(params, *[jnp.asarray(x) for x in inputs]))
    assert len(t_out) == len(j_out), f"{len(j_out)} outputs vs torch's {len(t_out)}"
    rng = np.random.default_rng(seed)
    cots = [rng.standard_normal(tuple(t.shape)).astype(np.float32) for t in t_out]
    for i, (t, j) in enumerate(zip(t_out, j_out, strict=True)):
        assert tuple(t.shape) == tuple(j.shape), (
            f"output {i}: shape {j.shape} vs torch {tuple(t.shape)}"
        )
        np.testing.assert_allclose(
            np.asarray(j), t.detach().numpy(), rtol=rtol, atol=atol, err_msg=f"output {i}"
        )
    sum(((t * torch.tensor(c)).sum() for t, c in zip(t_out, cots, strict=True))).backward()

    def loss(p, *xs):
        outs = _as_list(jax_fn(p, *xs))
        return sum(jnp.sum(o * jnp.asarray(c)) for o, c in zip(outs, cots, strict=True))

    float_idx = [i for i, x in enumerate(inputs) if np.issubdtype(x.dtype, np.floating)]
    argnums = (0, *[1 + i for i in float_idx]) if grad_inputs else (0,)
    grads = jax.grad(loss, argnums=argnums)(params, *[jnp.asarray(x) for x in inputs])
    named = dict(module.named_parameters())
    for name, g in flatten(grads[0]).items():
        tg = named[name].grad
        expected = np.zeros(g.shape, np.float32) if tg is None else tg.numpy()
        np.testing.assert_allclose(
            np.asarray(g), expected, rtol=rtol, atol=atol, err_msg=f"gradient of {name}"
        )
    if grad_inputs:
        for k, i in enumerate(float_idx):
            np.testing.assert_allclose(
                np.asarray(grads[1 + k]),
                tensors[i].grad.numpy(),
                rtol=rtol,
                atol=atol,
                err_msg=f"gradient of input {i}",
            )
