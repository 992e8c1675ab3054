"""Testing helpers: ``gradcheck``, ``assert_matches_torch`` (parity with a ``torch.nn``
twin) and tree comparisons by checkpoint name."""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.params import _to_numpy, flatten
from purelayers.trees import BlockKey

__all__ = ["assert_matches_torch", "assert_tree_allclose", "gradcheck"]


def _is_float(x: Any) -> bool:
    return (hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)) or isinstance(x, float)


def _leaf_name(path: Sequence[Any], index: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    """``"0.weight (argument 0)"`` for the key path of a leaf inside ``args``, and the
    element ``index`` within it. A ``Repeat``'s stacked leaf is named by the block that
    ``index`` falls in, as its checkpoint name (``blocks.1.weight``), and the index is
    then the one within that block's array."""
    arg, parts = path[0].idx, []
    for k in path[1:]:
        if isinstance(k, BlockKey) and index:
            parts.append(str(index[0]))
            index = index[1:]
        else:
            parts.append(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))))
    rest = ".".join(parts)
    return (f"{rest} (argument {arg})" if rest else f"argument {arg}"), index


def gradcheck(
    fn: Callable[..., Any],
    *args: Any,
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    batch_size: int = 64,
) -> bool:
    """Check ``fn``'s derivatives against central finite differences, in float64.

    Like ``torch.autograd.gradcheck`` for any function of pytrees: every floating-point
    leaf of ``args`` is cast to float64 and perturbed entry by entry by ``+-eps``; the
    full Jacobian of every floating-point output leaf is computed three ways (reverse
    mode, forward mode, finite differences) and each analytic entry ``a`` must satisfy
    ``|a - n| <= atol + rtol * |n|`` against the numerical ``n``. Integer leaves (ids,
    PRNG keys) pass through unchanged. A function with a custom VJP, which has no
    forward mode, is checked in reverse mode alone (torch's ``gradcheck`` checks reverse
    mode by default too), so a wrong custom VJP fails it as well.

    Returns ``True``; raises ``AssertionError`` naming the worst leaf by its dotted path
    (``"0.weight (argument 0)"``), the entry, and the analytic and numerical values.

    Example:
      >>> layer = L.Sequential(L.Linear(3), L.Tanh())
      >>> params = layer.init(jax.random.key(0), (2, 4))
      >>> gradcheck(layer.apply, params, jnp.ones((2, 4)))
      True
    """
    with jax.enable_x64(True):
        # float64 on the host: nothing compiles but the one program below
        args64 = jax.tree.map(lambda a: np.asarray(a, np.float64) if _is_float(a) else a, args)
        leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(args64)
        leaves = [leaf for _, leaf in leaves_with_path]
        slots = [i for i, leaf in enumerate(leaves) if _is_float(leaf)]
        if not slots:
            raise ValueError("gradcheck: no floating-point leaf in args to differentiate")
        xs = [leaves[i] for i in slots]
        flat = np.concatenate([np.ravel(x) for x in xs])
        bounds = np.cumsum([0] + [int(np.size(x)) for x in xs])

        def unravel(v):
            return [
                v[lo:hi].reshape(np.shape(x))
                for x, lo, hi in zip(xs, bounds[:-1], bounds[1:], strict=True)
            ]

        def f(v):
            full = list(leaves)
            for i, x in zip(slots, unravel(v), strict=True):
                full[i] = x
            out = fn(*jax.tree.unflatten(treedef, full))
            outs = [jnp.ravel(o) for o in jax.tree.leaves(out) if _is_float(o)]
            if not outs:
                raise ValueError("gradcheck: fn returned no floating-point output")
            return jnp.concatenate(outs)

        # One compiled program for all three Jacobians over all inputs at once. ``fn`` is
        # traced once for both analytic ones: forward mode is its linearization applied to
        # every unit tangent, reverse mode that linear map's transpose applied to every
        # unit cotangent (what ``jax.jacfwd`` and ``jax.jacrev`` compute, without tracing
        # ``fn`` a second time). A custom VJP has no forward mode: its linearization
        # can only be transposed, so such an ``fn`` is checked in reverse mode alone.
        def jacobians_of(flat, forward_mode):
            out, forward = jax.linearize(f, flat)
            backward = jax.linear_transpose(forward, flat)
            rev = jax.vmap(lambda c: backward(c)[0])(jnp.eye(out.size, dtype=out.dtype))
            fwd = (
                jax.vmap(forward, out_axes=1)(jnp.eye(flat.size, dtype=flat.dtype))
                if forward_mode
                else None
            )
            return rev, fwd, _finite_differences(f, flat, eps, batch_size)

        jitted = jax.jit(jacobians_of, static_argnums=1)
        try:
            rev, fwd, numerical = jitted(flat, True)
        except TypeError as e:
            if not _no_forward_mode(e):
                raise
            rev, fwd, numerical = jitted(flat, False)
        jacobians = {"reverse-mode": np.asarray(rev)}
        if fwd is not None:
            jacobians["forward-mode"] = np.asarray(fwd)
        numerical = np.asarray(numerical)
        worst = None
        for mode, jac in jacobians.items():
            excess = np.abs(jac - numerical) - (atol + rtol * np.abs(numerical))
            if excess.size == 0 or excess.max() <= 0:
                continue
            out_i, in_i = np.unravel_index(int(np.argmax(excess)), excess.shape)
            if worst is not None and excess[out_i, in_i] <= worst[0]:
                continue
            n = int(np.searchsorted(bounds, in_i, side="right")) - 1
            local = int(in_i - bounds[n])
            index = np.unravel_index(local, np.shape(xs[n])) if np.ndim(xs[n]) else ()
            name, index = _leaf_name(leaves_with_path[slots[n]][0], tuple(map(int, index)))
            worst = (
                float(excess[out_i, in_i]),
                name,
                mode,
                int(out_i),
                index,
                float(jac[out_i, in_i]),
                float(numerical[out_i, in_i]),
            )
    if worst is not None:
        _, name, mode, out_i, in_i, a, num = worst
        raise AssertionError(
            f"gradcheck: the {mode} derivative with respect to {name} disagrees with central "
            f"finite differences at input index {tuple(int(i) for i in in_i)}, output "
            f"element {out_i}: analytic {a:.10g}, numerical {num:.10g} "
            f"(|diff| {abs(a - num):.3g} > atol {atol:g} + rtol {rtol:g} * |numerical|)"
        )
    return True


def _finite_differences(f, flat, eps, batch_size):
    """``(outputs, inputs)`` Jacobian of ``f`` at ``flat`` by central differences (traced
    inside the caller's ``jit``)."""

    def column(j):
        step = jnp.zeros_like(flat).at[j].set(eps)
        # both evaluations in one batched call: ``f`` is traced once, not twice
        plus, minus = jax.vmap(f)(jnp.stack([flat + step, flat - step]))
        return (plus - minus) / (2 * eps)

    if flat.size <= batch_size:  # one batch: no loop to compile
        return jax.vmap(column, out_axes=1)(jnp.arange(flat.size))
    # whole batches only (the last padded with repeats of the last column, dropped after):
    # lax.map traces a ragged remainder as a second program
    padded = -(-flat.size // batch_size) * batch_size
    columns = jnp.minimum(jnp.arange(padded), flat.size - 1)
    return jax.lax.map(column, columns, batch_size=batch_size)[: flat.size].T


def assert_tree_allclose(
    actual: Any, expected: Any, *, rtol: float = 1e-5, atol: float = 1e-6, what: str = "tree"
) -> None:
    """Both trees hold the same dotted names, and each pair of arrays is close.

    Values may be numpy, JAX arrays or torch tensors (compared as float64 on the host).
    The message names every mismatching leaf with its largest absolute error.
    """
    a, e = flatten(actual), flatten(expected)
    if list(a) != list(e) and sorted(a) != sorted(e):
        raise AssertionError(f"{what}: names differ: {sorted(a)} vs {sorted(e)}")
    bad = []
    for name in a:
        x = np.asarray(_to_numpy(a[name]), np.float64)
        y = np.asarray(_to_numpy(e[name]), np.float64)
        if x.shape != y.shape:
            bad.append(f"{name or '<root>'}: shape {x.shape} vs {y.shape}")
        elif not np.allclose(x, y, rtol=rtol, atol=atol):
            bad.append(f"{name or '<root>'}: max |diff| {np.max(np.abs(x - y)):.3g}")
    if bad:
        raise AssertionError(f"{what} differs (rtol={rtol}, atol={atol}): " + "; ".join(bad))


# -- torch parity -------------------------------------------------------------------------


def _torch_of(module: Any) -> Any:
    """The ``torch`` package ``module`` comes from; it is already imported by whoever
    built the module, so nothing is imported here."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(module, torch.nn.Module):
        raise TypeError(f"assert_matches_torch: module must be a torch.nn.Module, got {module!r}")
    return torch


def _torch_leaves(out: Any) -> list:
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _torch_leaves(o)]
    return [out]


def _worst(pairs: list[tuple[str, Any, Any]], rtol: float, atol: float) -> list[str]:
    """Mismatch lines for ``(name, ours, theirs)`` pairs, the worst (by excess over the
    tolerance) first."""
    bad = []
    for name, a, b in pairs:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            bad.append((np.inf, f"{name}: shape {a.shape}, torch's {b.shape}"))
            continue
        # NaN where torch has NaN (and the same infinity) agrees; NaN on one side only, or
        # opposite infinities, is the worst mismatch (it must not hide the leaf's others)
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        with np.errstate(invalid="ignore"):
            excess = np.abs(a - b) - (atol + rtol * np.abs(b))
        excess = np.where(same, -np.inf, np.where(np.isnan(excess), np.inf, excess))
        if a.size and np.max(excess) > 0:
            i = np.unravel_index(int(np.argmax(excess)), a.shape)
            with np.errstate(invalid="ignore"):
                diff = np.where(same, 0.0, np.abs(a - b))
            diff = np.where(np.isnan(diff), np.inf, diff)  # NaN on one side only
            bad.append(
                (
                    float(np.max(excess)),
                    f"{name}: max |diff| {np.max(diff):.3g}, "
                    f"at {tuple(map(int, i))} ours {a[i]:.8g} vs torch {b[i]:.8g}",
                )
            )
    return [line for _, line in sorted(bad, key=lambda t: -t[0])]


# forward mode against reverse mode, relative to sum |g| |J t| (see assert_matches_torch)
_FORWARD_RTOL = 1e-2


def assert_matches_torch(
    layer: Any,
    module: Any,
    *inputs: Any,
    params: Any = None,
    state: Any = None,
    init_shape: Any = None,
    apply: Callable[..., Any] | None = None,
    torch_call: Callable[..., Any] | None = None,
    train: bool = False,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    grads: bool = True,
    forward_mode: bool = True,
    seed: int = 0,
    **apply_kwargs: Any,
) -> Any:
    """Check ``layer`` against its ``torch.nn`` twin: names, outputs and derivatives.

    ``module``'s parameters are copied into ``layer``'s params tree by name (into the
    abstract ``jax.eval_shape(layer.init, ...)`` template for ``inputs[0]``, with
    ``purelayers.params.load_state_dict``; the names and their order must equal
    ``module.named_parameters()``), unless ``params`` is given; a layer with buffers
    (``layer.init_state``) gets ``module``'s buffers as its ``state`` the same way,
    unless ``state`` is given. Both run on ``inputs`` (numpy arrays), the module in
    eval mode unless ``train``. Checked, in one jitted program on the JAX side:

    - every output leaf against torch's;
    - reverse mode: the gradients of ``sum(out * g)`` for a random cotangent ``g`` with
      respect to every floating-point input and every parameter, against torch's
      ``backward``, by dotted name;
    - forward mode (unless ``forward_mode=False``): for random tangents ``t`` of the
      same inputs and parameters, the JVP must satisfy ``<g, J t> = <J^T g, t>`` against
      the reverse-mode gradients, to 1% of ``sum |g| |J t|`` (float32 round-off; a
      forward rule that is not the transpose of the reverse one is off by far more). A
      layer with a custom VJP has no forward mode: a ``TypeError`` says so,
      and ``forward_mode=False`` checks it in reverse mode alone (as ``gradcheck`` does).

    The library never imports torch: it uses the ``torch`` that built ``module``.

    Args:
      layer: the purelayers layer.
      module: the torch module (its parameters are the reference weights: randomize
        them, since default inits such as zero biases and unit norms hide mistakes).
      inputs: the inputs, as ``module(*inputs)`` and ``layer.apply(params, *inputs)``
        take them.
      params: the params tree to use instead of loading ``module``'s.
      state: the state tree to use instead of loading ``module``'s buffers.
      init_shape: what ``layer.init`` and ``layer.init_state`` take, where that is not
        ``inputs[0].shape`` (a layer of two inputs: ``(x1.shape, x2.shape)``).
      apply: the JAX side, ``apply(params, *inputs)``, instead of ``layer.apply`` (a
        jitted training step, a function of several layers); it gets no ``state``.
      torch_call: the torch side, ``torch_call(module, *tensors)``, instead of
        ``module(*tensors)``.
      train: run both sides in training mode (``module.train()``, ``layer.apply(...,
        train=True)``; batch statistics, no dropout unless given a key).
      rtol: the relative tolerance: ``|ours - torch| <= atol + rtol * |torch|``.
      atol: the absolute tolerance.
      grads: also compare derivatives. Default ``True``.
      forward_mode: also check forward mode against reverse mode. Default ``True``;
        ``False`` for a layer with a custom VJP.
      seed: seeds the cotangent and the tangents (a stream of their own: inputs drawn
        from ``np.random.default_rng(seed)`` are not reused as cotangents).
      apply_kwargs: passed to ``layer.apply``.

    Returns:
      the params tree used.

    Raises:
      AssertionError: names that differ, or every output or derivative that differs,
        the worst first, named by dotted path with the worst entry's two values.
      TypeError: ``module`` is not a ``torch.nn.Module``.

    Example:
      >>> import torch
      >>> x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
      >>> params = pl.testing.assert_matches_torch(L.Linear(3), torch.nn.Linear(4, 3), x)
      >>> sorted(params)
      ['bias', 'weight']
    """
    from purelayers.params import load_state_dict

    torch = _torch_of(module)
    module = module.train(train)
    module.zero_grad(set_to_none=True)  # a module checked before holds gradients
    inputs = tuple(np.asarray(x) for x in inputs)
    named = dict(module.named_parameters())
    shape, dtype = inputs[0].shape if init_shape is None else init_shape, inputs[0].dtype
    if not np.issubdtype(dtype, np.floating):
        dtype = np.float32
    if params is None:
        template = layer.ordered(
            jax.eval_shape(lambda k: layer.init(k, shape, dtype), jax.random.key(0))
        )
        ours = list(flatten(template))
        if ours != list(named):
            raise AssertionError(
                f"assert_matches_torch: parameter names differ\n  ours  {ours}\n  torch {list(named)}"
            )
        params = load_state_dict(template, {k: v.detach() for k, v in named.items()})
    if state is None and apply is None:
        state_template = layer.init_state(shape, dtype)
        if state_template:
            buffers = dict(module.named_buffers())
            wanted = list(flatten(state_template))
            if not set(wanted) <= set(buffers):
                raise AssertionError(
                    f"assert_matches_torch: buffer names differ\n  ours  {wanted}\n  "
                    f"torch {list(buffers)}"
                )
            state = load_state_dict(state_template, {k: buffers[k] for k in wanted})
    floats = [i for i, x in enumerate(inputs) if np.issubdtype(x.dtype, np.floating)]
    tensors = [
        torch.from_numpy(x.copy()).requires_grad_(grads and i in floats)
        for i, x in enumerate(inputs)
    ]
    t_out = _torch_leaves(torch_call(module, *tensors) if torch_call else module(*tensors))
    # a stream of its own: inputs drawn from default_rng(seed) never double as cotangents
    rng = np.random.default_rng([seed, 0x636F74])
    cots = [rng.standard_normal(tuple(t.shape)).astype(np.float32) for t in t_out]

    def fn(p, *xs):
        full = list(inputs)
        for i, x in zip(floats, xs, strict=True):
            full[i] = x
        if apply is not None:
            out = apply(p, *full)
        elif state:
            out, _ = layer.apply(p, *full, state=state, train=train, **apply_kwargs)
        else:
            kwargs = {"train": True, **apply_kwargs} if train else apply_kwargs
            out = layer.apply(p, *full, **kwargs)
        return jax.tree.leaves(out)

    # placed as they are: ``jnp.asarray`` of a host array compiles a copy per shape
    float_inputs = [jax.device_put(inputs[i]) for i in floats]
    out_specs = jax.eval_shape(fn, params, *float_inputs)
    if len(out_specs) != len(t_out):
        raise AssertionError(
            f"assert_matches_torch: {len(out_specs)} outputs, torch's {len(t_out)}"
        )
    misfit = [
        f"output {i}: shape {tuple(o.shape)}, torch's {tuple(t.shape)}"
        for i, (o, t) in enumerate(zip(out_specs, t_out, strict=True))
        if tuple(o.shape) != tuple(t.shape)
    ]
    if misfit:  # before any cotangent of torch's shape meets an output of another
        raise AssertionError("assert_matches_torch: " + "; ".join(misfit))
    # integer outputs (indices) are compared, not differentiated
    differentiable = [jnp.issubdtype(o.dtype, jnp.floating) for o in out_specs]
    cots = [
        c.astype(o.dtype) if d else np.zeros(o.shape, jax.dtypes.float0)
        for c, o, d in zip(cots, out_specs, differentiable, strict=True)
    ]
    primals = (params, *float_inputs)
    tangents = jax.tree.map(
        lambda a: (
            rng.standard_normal(a.shape).astype(a.dtype)
            if jnp.issubdtype(a.dtype, jnp.floating)
            else np.zeros(a.shape, jax.dtypes.float0)
        ),
        primals,
    )

    @functools.partial(jax.jit, static_argnums=3)
    def run(primals, cs, tangents, forward_mode):
        if not grads:
            return fn(*primals), None, None
        # traced once: forward mode is the linearization, reverse mode its transpose (how
        # ``jax.vjp`` computes it) over the floating outputs (integers have no cotangent)
        out, forward = jax.linearize(fn, *primals)

        def floating(*ts):
            return [o for o, d in zip(forward(*ts), differentiable, strict=True) if d]

        picked = [c for c, d in zip(cs, differentiable, strict=True) if d]
        grads_ = jax.linear_transpose(floating, *primals)(picked)
        return out, grads_, forward(*tangents) if forward_mode else None

    try:
        j_out, j_grads, out_t = run(primals, cots, tangents, forward_mode)
    except TypeError as e:
        if not _no_forward_mode(e):
            raise
        raise TypeError(
            f"assert_matches_torch: {type(layer).__name__} has no forward-mode autodiff (a "
            "custom VJP inside it: jax.jvp, jax.jacfwd and Hessian-vector products fail "
            "on it); pass forward_mode=False to check its outputs and reverse-mode gradients "
            "alone"
        ) from e
    pairs = [
        (f"output {i}", j, t.detach().numpy())
        for i, (j, t) in enumerate(zip(j_out, t_out, strict=True))
    ]
    forward_line = None
    if grads:
        total = sum(
            (t * torch.from_numpy(np.asarray(c, np.float32)).to(t.dtype)).sum()
            for t, c, d in zip(t_out, cots, differentiable, strict=True)
            if d
        )
        total.backward()
        for name, g in flatten(j_grads[0]).items():
            tg = named[name].grad if name in named else None
            pairs.append((f"gradient of {name}", g, np.zeros(g.shape) if tg is None else tg))
        for k, i in enumerate(floats):
            pairs.append((f"gradient of input {i}", j_grads[1 + k], tensors[i].grad))

        def products(xs, ys, keep):
            return [
                np.asarray(x, np.float64).ravel() * np.asarray(y, np.float64).ravel()
                for x, y, k in zip(xs, ys, keep, strict=True)
                if k
            ]

        ins = products(
            jax.tree.leaves(j_grads),
            jax.tree.leaves(tangents),
            [t.dtype != jax.dtypes.float0 for t in jax.tree.leaves(tangents)],
        )
        outs = products(cots, out_t, differentiable) if out_t is not None else None
        forward = sum(float(np.sum(t)) for t in outs) if outs is not None else math.nan
        reverse = sum(float(np.sum(t)) for t in ins)
        scale = max(
            sum(float(np.sum(np.abs(t))) for t in ins),
            sum(float(np.sum(np.abs(t))) for t in outs or ()),
            1e-30,
        )
        # Both sides are float32 sums: in a saturated softmax, round-off reaches 0.1% of
        # the scale; a forward rule that is not the reverse one's transpose is off by O(1).
        one_nan = math.isnan(forward) != math.isnan(reverse)  # (NaN on both sides agrees)
        if outs is not None and (one_nan or abs(forward - reverse) > _FORWARD_RTOL * scale):
            forward_line = (
                f"forward mode: <g, J t> = {forward:.8g} but reverse mode <J^T g, t> = "
                f"{reverse:.8g} (|diff| {abs(forward - reverse):.3g} > {_FORWARD_RTOL:g} of "
                f"the scale {scale:.3g})"
            )
    bad = _worst([(n, a, _to_numpy(b)) for n, a, b in pairs], rtol, atol)
    if forward_line:
        bad.append(forward_line)
    if bad:
        raise AssertionError(
            f"assert_matches_torch: {type(layer).__name__} differs from {type(module).__name__} "
            f"(rtol={rtol}, atol={atol}):\n  " + "\n  ".join(bad)
        )
    return params


def _no_forward_mode(error: TypeError) -> bool:
    """Whether ``error`` is JAX's refusal of forward mode on a function with a custom VJP
    ("can't apply forward-mode autodiff (jvp) to a ..." function)."""
    return "can't apply forward-mode autodiff" in str(error)
