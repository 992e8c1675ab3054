"""The sequence layers' time loop: one ``lax.scan`` over time for every direction of a
layer at once, masked by ``lengths``, and its written-out derivative
(``jax.custom_jvp``; the design and its measurements are in ``recurrent``'s docstring).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from purelayers.layers._checks import add_bias, summed_in_float32
from purelayers.layers._recurrent_cells import (
    Kind,
    add,
    hmm,
    make_step,
    projected_step,
    split_params,
)
from purelayers.layers.core import Params


def _reverse_time(a: jax.Array, lengths: jax.Array | None) -> jax.Array:
    """``a`` ``(T, B, ...)`` reversed in time; with ``lengths``, each sequence is reversed
    within its own length (padding stays in place), so the reverse direction starts
    at each sequence's last valid step. Applying it twice gives ``a`` back."""
    if lengths is None:
        return jnp.flip(a, axis=0)
    t = jnp.arange(a.shape[0], dtype=lengths.dtype)[:, None]
    idx = jnp.where(t < lengths[None, :], lengths[None, :] - 1 - t, t)
    idx = idx.reshape(idx.shape + (1,) * (a.ndim - 2))
    return jnp.take_along_axis(a, idx, axis=0)


def run_layer(
    kind: Kind,
    params: Params,
    layer_index: int,
    directions: int,
    x: jax.Array,
    state0: tuple[jax.Array, ...],
    lengths: jax.Array | None,
    *,
    unroll: int,
    custom_derivative: bool,
    proj: bool = False,
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """One layer, all directions. ``x`` ``(T, B, I)``; ``state0`` each ``(D, B, H)``
    (``h`` ``(D, B, P)`` with an LSTM's projection). Returns output ``(T, B, D * H)``
    (``D * P``) and final states like ``state0``. ``unroll`` and ``custom_derivative``
    are the layer's arguments of those names; ``proj``: the LSTM has ``weight_hr``."""
    steps, batch, _ = x.shape
    dtype = x.dtype
    parts = [split_params(kind, params, suffix(layer_index, d), dtype) for d in range(directions)]
    if proj:  # the projection joins the recurrent arrays: (w_hh, b_hh, w_hr)
        parts = [
            (w, b, (*r, params["weight_hr" + suffix(layer_index, d)].astype(dtype)))
            for d, (w, b, r) in enumerate(parts)
        ]
    recurrent = tuple(_joined([p[2][j] for p in parts]) for j in range(len(parts[0][2])))
    state = tuple(s[0] for s in state0) if directions == 1 else state0
    unroll = min(unroll, max(steps, 1))
    if kind.linearized is not None and custom_derivative and not kind.inner and not proj:
        # the input projection inside the loop (``_fused_recurrence``)
        xs = x if directions == 1 else jnp.stack([x, _reverse_time(x, lengths)], axis=1)
        w_ih = _joined([p[0] for p in parts])
        final, ys = _fused_recurrence(kind, unroll, xs, state, w_ih, *recurrent, lengths)
        return _outputs(ys, final, directions, lengths)
    w_ih = jnp.concatenate([p[0] for p in parts], axis=0)  # (D * G, I)
    gi = hmm(x, w_ih)  # every step, every direction: one product
    if parts[0][1] is not None:
        b_in = jnp.concatenate([p[1] for p in parts], axis=0)
        gi = add_bias(gi, b_in, -1)
    if directions == 2:
        gi = gi.reshape(steps, batch, directions, gi.shape[-1] // directions)
        gi = jnp.stack([gi[:, :, 0], _reverse_time(gi[:, :, 1], lengths)], axis=1)

    if proj:
        final, ys, _ = _scan(
            lambda g, st, r: (*projected_step(kind, g, st, r), None),
            unroll,
            gi,
            state,
            recurrent,
            lengths,
        )
    elif kind.linearized is not None and custom_derivative:
        w_hh, b_hh = recurrent
        final, ys = _recurrence(kind, unroll, gi, state, w_hh, b_hh, lengths)
    else:
        step = make_step(kind)
        final, ys, _ = _scan(
            lambda g, st, r: (*step(g, st, r), None), unroll, gi, state, recurrent, lengths
        )
    return _outputs(ys, final, directions, lengths)


def _outputs(ys, final, directions: int, lengths):
    """The layer's output ``(T, B, D * H)`` and final states ``(D, B, ...)`` from the
    loop's per-direction ones (the reverse direction's outputs back in forward time)."""
    if directions == 1:
        return ys, tuple(f[None] for f in final)
    rev = _reverse_time(ys[:, 1], lengths)
    out = jnp.concatenate([ys[:, 0], rev], axis=-1)
    return out, final


def _mask(new: tuple, h: jax.Array, old: tuple, t: jax.Array, lengths: jax.Array | None):
    """Past a sequence's length its state is held and its output is zero."""
    if lengths is None:
        return new, h
    valid = (t < lengths).reshape((1,) * (h.ndim - 2) + (h.shape[-2], 1))
    new = tuple(jnp.where(valid, n, o) for n, o in zip(new, old, strict=True))
    return new, jnp.where(valid, h, jnp.zeros_like(h))


def _scan(step, unroll: int, gi, state0, recurrent, lengths, keep: bool = False):
    """The recurrence over time: ``(final state, outputs, per-step extras)``.

    ``step(gi_t, state, recurrent) -> (state', h_t, extras)``; with ``keep`` the extras
    (the residuals of the derivative) are stacked over time."""

    def body(carry, inp):
        g_t, t = inp
        new, h, extra = step(g_t, carry, recurrent)
        new, h = _mask(new, h, carry, t, lengths)
        return new, ((h, extra) if keep else h)

    ts = jnp.arange(gi.shape[0], dtype=jnp.int32)
    final, out = lax.scan(body, state0, (gi, ts), unroll=unroll)
    return (final, *out) if keep else (final, out, None)


def _all_steps(h: jax.Array, w: jax.Array) -> jax.Array:
    """``h @ w.T`` for every step at once: ``h`` ``(T, [D,] B, H)``, ``w`` ``([D,] G, H)``."""
    if w.ndim == 3:
        out = lax.dot_general(h, w, (((3,), (2,)), ((1,), (0,))))  # (D, T, B, G)
        return out.swapaxes(0, 1)
    return hmm(h, w)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _recurrence(kind, unroll, gi, state0, w_hh, b_hh, lengths):
    """``state_t = cell(gi_t, h_{t-1} @ w_hh.T + b_hh, state_{t-1})`` over time.

    Its derivative is written out (see ``Linearized``): the primal loop also stacks each
    step's derivative coefficients, and the tangent loop (``_tangent_loop``, in one
    chunk) is linear, with the weight term ``h_{t-1} @ dw_hh.T`` one product over all
    steps before it. JAX's transpose of that loop is the backward pass: it carries only
    ``dgh_t @ w_hh`` and forms the ``w_hh`` gradient as one product after it. The forward
    loops multiply by ``w_hh`` transposed once before them (``_transposed``)."""

    def step(g, state, recurrent):
        w_t, b = recurrent
        return (*kind.cell(g, add(_times(state[0], w_t), b), state), None)

    final, ys, _ = _scan(step, unroll, gi, state0, (_transposed(w_hh), b_hh), lengths)
    return final, ys


@_recurrence.defjvp
def _recurrence_jvp(kind, unroll, primals, tangents):
    gi, state0, w_hh, b_hh, lengths = primals
    d_gi, d_state0, d_w, d_b, _ = tangents
    lin = kind.linearized

    def step(g, state, recurrent):
        w_t, b = recurrent
        new, h, factors = lin.forward(g, add(_times(state[0], w_t), b), state)
        # h_{t-1} for the weight term: the outputs shifted by one step, unless padding
        # zeroes outputs while the state is held
        return new, h, (factors, None if lengths is None else state[0])

    recurrent = (_transposed(w_hh), b_hh)
    final, ys, (factors, prev_h) = _scan(step, unroll, gi, state0, recurrent, lengths, True)
    if prev_h is None:
        prev_h = jnp.concatenate([state0[0][None], ys[:-1]])
    # the tangent of h_{t-1} @ w_hh.T + b_hh that does not depend on the loop, one product
    # over all steps before it; where gi and gh are only summed (LSTM, Elman) the loop
    # adds it to d_gi, so the backward loop writes one cotangent per step, not two
    terms = ((prev_h, d_w),)
    d_final, d_ys = _tangent_loop(
        lin, unroll, factors, d_gi, terms, d_b, kind.inner, d_state0, w_hh, lengths, chunked=False
    )
    return (final, ys), (d_final, d_ys)


def chunk_steps(steps: int, batch: int) -> int:
    """Time steps per chunk of the tangent loop: the divisor of ``steps`` nearest (in
    ratio) to ``CHUNK_ROWS / batch`` and within a factor of two of it, else ``steps``
    (one chunk). The benchmark's 100 steps of a batch of 32 run in chunks of 10; 32 steps
    of 128 in chunks of 2; 97 steps in one."""
    target = max(CHUNK_ROWS / max(batch, 1), 1.0)
    near = [d for d in range(1, steps + 1) if steps % d == 0 and target / 2 <= d <= target * 2]
    return min(near, key=lambda d: abs(math.log(d / target))) if near else steps


# rows (steps x batch) of one chunk's weight-gradient product: 320 rows ran at ~155
# GFLOP/s (``[1024, 320] x [320, 321]``, 2-core AVX-512 CPU), near the machine's ceiling
CHUNK_ROWS = 320

# the gate tangents of all steps (steps x directions x batch x gates) from which the fused
# layers' tangent loop is chunked. The benchmark's LSTM (batch 32, 64 inputs, 100 steps,
# jitted gradient of the layer alone): hidden 128 (1.6M) 24.0 / 26.9 ms in one loop and
# 32.7 / 28.8 chunked, hidden 192 (2.5M) 44.6 / 53.8 against 42.8 / 38.8, hidden 256
# (3.3M) the training step 72.7 -> 61.1 ms; an Elman RNN of hidden 256 (0.8M) 18.3 / 18.7
# against 20.5 / 19.8 ms, with the nested loop's compile 0.27 -> 0.45 s.
CHUNK_ELEMENTS = 2**21


def _tangent_loop(
    lin, unroll, factors, d_gi, terms, d_b, inner, d_state0, w_hh, lengths, *, chunked
):
    """The linear loop of the recurrence's tangent; JAX's transpose of it is the backward
    pass. Each step adds ``dh_{t-1} @ w_hh.T`` to the tangents from outside the loop:
    ``d_gi`` ``(T, ...)`` (or ``None``) and the terms ``sum(seq @ w.T for seq, w in
    terms)`` plus ``d_b``. ``inner``: the cell uses ``gh`` apart from ``gi`` (GRU);
    otherwise the terms join ``d_gi``. Without ``chunked`` the terms are one product each
    over all steps before a single loop; with it, they are taken inside the loop a chunk
    of steps at a time (``chunk_steps``), one product per term and chunk, a loop over
    chunks around a loop over each chunk's steps. The fused layers chunk where the gate
    tangents of all steps reach ``CHUNK_ELEMENTS``.

    Transposed, each chunk's products become weight gradients accumulated across the
    backward loop, one product per chunk, so the gate cotangents of all steps are never
    stored, zero-filled or transposed whole. Against the terms taken for all steps before
    the loop (their transpose one product after the backward loop), for the benchmark's
    LSTM (batch 32, 64 inputs, hidden 256, 100 steps, chunks of 10; ``python -m
    benchmarks.run --workloads lstm --impls purelayers jax torch --repeats 7 --fresh 5``,
    2-core AVX-512 CPU): the training step 72.7 -> 61.1 ms (torch 52.4 and 55.3 ms in the
    same runs), temporaries 37.7 -> 31.3 MiB, so glibc, which maps blocks over 32 MiB
    afresh on every call, no longer page-faults them in each step (9,700 faults a step
    -> ~200); under allocator settings that keep freed memory the step is 7% faster. The
    price is a loop nested in the backward loop: first call (trace, compile, first step)
    0.99 -> 1.14 s, against raw JAX's 1.04-1.09 s."""
    steps, batch = jax.tree.leaves(factors)[0].shape[0], d_state0[0].shape[-2]
    size = chunk_steps(steps, batch) if chunked else steps

    def steps_of(d_carry, inp):
        """The steps of ``inp`` (a chunk, or the whole sequence), their terms first."""
        fac, seqs, d_gi, ts = inp
        d_ghw = None
        for s, (_, w) in zip(seqs, terms, strict=True):
            d_ghw = add(_all_steps(s, w), d_ghw)
        if d_b is not None:
            # summed over steps and batch in float32 where the layer computes narrower
            # (the bias gradient of an LSTM over 32 steps x batch 128: 25% -> 0.4% off)
            lead = jax.tree.leaves(fac)[0].shape[:-1]  # (steps, [D,] B)
            d_ghw = add(d_ghw, summed_in_float32(d_b[None], (*lead, d_b.shape[-1])))
        if not inner:
            d_gi, d_ghw = add(d_ghw, d_gi), None

        def step(d_carry, inp):
            fac_t, d_gi_t, d_ghw_t, t = inp
            d_gh_t = add(hmm(d_carry[0], w_hh), d_ghw_t)
            if d_gi_t is None:  # no tangent from outside the loop
                d_gi_t = jnp.zeros((), d_gh_t.dtype)
            d_new, d_h = lin.tangent(fac_t, d_gi_t, d_gh_t, d_carry)
            return _mask(d_new, d_h, d_carry, t, lengths)

        return lax.scan(step, d_carry, (fac, d_gi, d_ghw, ts), unroll=min(unroll, size))

    inputs = (factors, tuple(s for s, _ in terms), d_gi, jnp.arange(steps, dtype=jnp.int32))
    if size == steps:  # one chunk: one loop, the terms before it
        return steps_of(d_state0, inputs)

    def chunks(a):
        return a.reshape((steps // size, size, *a.shape[1:]))

    d_final, d_ys = lax.scan(steps_of, d_state0, jax.tree.map(chunks, inputs))
    return d_final, d_ys.reshape((steps, *d_ys.shape[2:]))


def _fused_step(cell):
    """A step whose gates are one product ``[x_t, h_{t-1}] @ [w_ih, w_hh].T`` plus the
    bias, ``cell``'s ``gi`` and ``gh`` (``cell`` only sums them); the step is given the
    joined weights transposed (``_transposed``)."""

    def step(x_t, state, recurrent):
        w_t, b = recurrent
        z = _times(jnp.concatenate([x_t, state[0]], axis=-1), w_t)
        return cell(z, jnp.zeros((), z.dtype) if b is None else b, state)

    return step


def _transposed(w: jax.Array) -> jax.Array:
    """A weight ``([D,] G, K)`` transposed once before a loop over time, to ``([D,] K,
    G)``, so that each step's product (``_times``) reads its right operand row by row
    instead of transposing it. XLA:CPU's per-step products with small batches run faster
    so (interleaved medians, 2-core AVX-512 CPU): a loop of 100 ``[32, 320] x [320,
    1024]`` products 0.93x the time, ``[32, 256] x [256, 768]`` 0.86x, ``[32, 256] x [256,
    256]`` 0.86x, ``[64, 512] x [512, 2048]`` a tie (1.02x); the benchmark's LSTM (batch
    32, 64 inputs, hidden 256, 100 steps) forward 0.87-0.92x in three runs, its training
    step within noise (0.95-1.02x, six runs); a GRU of the same sizes forward 0.97x and
    its forward and backward 0.96-0.99x (two runs each). The backward loops keep ``w``:
    their products, ``dg_t @ w``, already read it row by row."""
    return w.swapaxes(-1, -2)


def _times(h: jax.Array, w_t: jax.Array) -> jax.Array:
    """``h @ w_t`` over the last axis: ``h`` ``([D,] B, K)``, ``w_t`` ``([D,] K, G)``, one
    batched product per direction when both have the leading axis."""
    if w_t.ndim == 3:
        return lax.dot_general(h, w_t, (((h.ndim - 1,), (1,)), ((0,), (0,))))
    return lax.dot_general(h, w_t, (((h.ndim - 1,), (0,)), ((), ())))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _fused_recurrence(kind, unroll, xs, state0, w_ih, w_hh, b, lengths):
    """``_recurrence`` for cells that only sum ``gi`` and ``gh`` (LSTM, Elman), with the
    input projection inside the loop: each step is one product of ``[x_t, h_{t-1}]``
    (``xs`` ``(T, [D,] B, I)``) with the joined weights ``[w_ih, w_hh]``, and no
    ``(T, B, G)`` projection is stored (for a bidirectional layer the loop reads ``x``
    and its time-reversed copy). Against the projection as one product before the loop
    (LSTM, batch 32, 64 inputs, hidden 256, 100 steps, jitted, interleaved medians on a
    2-core AVX-512 CPU): the benchmark's training step 48.1 -> 46.7 ms with 47.8 -> 37.7
    MiB of temporaries; forward and backward of a bidirectional layer 106.8 -> 77.9 ms,
    its forward 33.1 -> 24.6 ms; a unidirectional forward is a tie (14.6 vs 15.3 ms).
    The derivative is ``_recurrence``'s, with the projection's tangent ``dx @ w_ih.T +
    [x, h_{t-1}, 1] @ [dw_ih, dw_hh, db].T`` taken in ``_tangent_loop``'s chunks (the
    column of ones puts the bias gradient in the weights' product); terms whose tangents
    are symbolic zeros, such as a first layer's input, are left out."""
    w_t = _transposed(jnp.concatenate([w_ih, w_hh], axis=-1))
    step = _fused_step(kind.cell)
    final, ys, _ = _scan(
        lambda g, st, r: (*step(g, st, r), None), unroll, xs, state0, (w_t, b), lengths
    )
    return final, ys


def _fused_recurrence_jvp(kind, unroll, primals, tangents):
    xs, state0, w_ih, w_hh, b, lengths = primals
    d_xs, d_state0, d_w_ih, d_w_hh, d_b, _ = tangents
    lin = kind.linearized
    w_t = _transposed(jnp.concatenate([w_ih, w_hh], axis=-1))
    forward = _fused_step(lin.forward)

    def step(x_t, state, recurrent):
        new, h, factors = forward(x_t, state, recurrent)
        return new, h, (factors, None if lengths is None else state[0])

    final, ys, (factors, prev_h) = _scan(step, unroll, xs, state0, (w_t, b), lengths, True)
    if prev_h is None:
        prev_h = jnp.concatenate([state0[0][None], ys[:-1]])
    # the projection's tangent dx @ w_ih.T + x @ dw_ih.T + h_{t-1} @ dw_hh.T + db, for
    # _tangent_loop's chunks; terms whose tangents are zero are left out (the input of a
    # first layer, the weights where only inputs are differentiated)
    chunked = ys.size // ys.shape[-1] * w_ih.shape[-2] >= CHUNK_ELEMENTS
    terms, d_bias = [], None
    if not all(_zero(t) for t in (d_w_ih, d_w_hh, d_b)):
        seqs, d_ws = [xs, prev_h], [_dense(d_w_ih, w_ih), _dense(d_w_hh, w_hh)]
        if not chunked:  # one product per term over all steps, the bias added
            terms += zip(seqs, d_ws, strict=True)
            d_bias = None if b is None else _dense(d_b, b)
        else:  # one product per chunk: [x, h_{t-1}, 1] @ [dw_ih, dw_hh, db].T
            if b is not None:  # the bias as a column of ones
                seqs.append(jnp.ones((*xs.shape[:-1], 1), xs.dtype))
                d_ws.append(_dense(d_b, b).reshape((*w_ih.shape[:-1], 1)))
            terms.append((jnp.concatenate(seqs, axis=-1), jnp.concatenate(d_ws, axis=-1)))
    if not _zero(d_xs):
        terms.append((d_xs, w_ih))
    d_state0 = tuple(_dense(d, s) for d, s in zip(d_state0, state0, strict=True))
    d_final, d_ys = _tangent_loop(
        lin,
        unroll,
        factors,
        None,
        tuple(terms),
        d_bias,
        False,
        d_state0,
        w_hh,
        lengths,
        chunked=chunked,
    )
    return (final, ys), (d_final, d_ys)


_fused_recurrence.defjvp(_fused_recurrence_jvp, symbolic_zeros=True)


def _zero(t) -> bool:
    """Whether a tangent is zero by construction (a symbolic zero, or a missing bias)."""
    return t is None or isinstance(t, SymbolicZero)


def _dense(t, like: jax.Array) -> jax.Array:
    return jnp.zeros_like(like) if _zero(t) else t


def _joined(arrays: list[jax.Array | None]) -> jax.Array | None:
    """One direction's array, or the directions' arrays stacked on a leading axis (biases
    become ``(D, 1, G)``); ``None`` (no bias) stays ``None``."""
    if arrays[0] is None:
        return None
    return arrays[0] if len(arrays) == 1 else jnp.stack(arrays)


def suffix(layer: int, direction: int) -> str:
    return f"_l{layer}" + ("_reverse" if direction else "")
