r"""The Elman, LSTM and GRU recurrences: one step (``rnn_cell``, ``lstm_cell``,
``gru_cell``, torch's gate orders) and a layer over a sequence (``recurrent_layer``, and
``rnn``, ``lstm``, ``gru`` for one direction).

Every recurrence is split the same way: ``gi = x @ weight_ih.T + bias`` and a step
``(gi_t, state) -> (state', h_t)`` that multiplies only by the recurrent weights; the time
loop is one ``lax.scan`` for every direction of a layer at once (their states stacked on
a leading axis), masked by ``lengths``. Gate activations are one ``tanh`` over the whole
gate block (``sigmoid(v) = 0.5 * tanh(0.5 * v) + 0.5``).

The fast path, beside ``recurrent_layer_reference`` (the same scan with JAX's own
derivative): LSTM and Elman layers take one product per step of ``[x_t, h_{t-1}]`` with
``[weight_ih, weight_hh]`` and differentiate through a written-out derivative
(``_fused_recurrence``). ``tests/functional/test_recurrent.py`` shows them equal.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from purelayers.functional._recurrent_steps import (
    KINDS,
    Kind,
    add,
    hmm,
    make_step,
    projected_step,
    split_params,
)

__all__ = [
    "gru",
    "gru_cell",
    "lstm",
    "lstm_cell",
    "recurrent_layer",
    "recurrent_layer_reference",
    "rnn",
    "rnn_cell",
]

Params = dict[str, Any]


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


def recurrent_layer(
    kind: str | Kind,
    params: Params,
    x: jax.Array,
    state0: tuple[jax.Array, ...],
    lengths: jax.Array | None = None,
    *,
    layer_index: int = 0,
    directions: int = 1,
    unroll: int = 1,
    reference: bool = False,
    proj: bool = False,
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """One layer of a recurrence over time, every direction.

    Args:
      kind: ``"rnn_tanh"``, ``"rnn_relu"``, ``"lstm"``, ``"gru"`` or
        ``"gru_reset_before"`` (or one of ``KINDS``' values).
      params: torch's names with the layer's suffix (``weight_ih_l0``,
        ``weight_hh_l0_reverse``, ...).
      x: ``(T, B, I)``.
      state0: ``(h_0,)`` or ``(h_0, c_0)``, each ``(D, B, H)`` (``h`` ``(D, B, P)`` with an
        LSTM's projection).
      lengths: ``(B,)`` int32 or ``None``: past a sequence's length its state is held
        and its output is zero; the reverse direction starts at its last valid step.
      layer_index: the layer of the names' suffix (``_l0``, ...).
      directions: ``D``, 1 or 2.
      unroll: time steps per ``lax.scan`` iteration.
      reference: the plain scan with JAX's own derivative (``recurrent_layer_reference``).
      proj: the LSTM has ``weight_hr`` (torch's ``proj_size``).

    Returns:
      output ``(T, B, D * H)`` (``D * P``) and final states like ``state0``.
    """
    kind = KINDS[kind] if isinstance(kind, str) else kind
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
    if kind.linearized is not None and not reference and not kind.inner and not proj:
        # the input projection inside the loop (``_fused_recurrence``)
        xs = x if directions == 1 else jnp.stack([x, _reverse_time(x, lengths)], axis=1)
        w_ih = _joined([p[0] for p in parts])
        final, ys = _fused_recurrence(kind, unroll, xs, state, w_ih, *recurrent, lengths)
        return _outputs(ys, final, directions, lengths)
    w_ih = jnp.concatenate([p[0] for p in parts], axis=0)  # (D * G, I)
    gi = hmm(x, w_ih)  # every step, every direction: one product
    if parts[0][1] is not None:
        b_in = jnp.concatenate([p[1] for p in parts], axis=0).astype(gi.dtype)
        gi = gi + _summed_in_float32(b_in.reshape((1,) * (gi.ndim - 1) + (-1,)), gi.shape)
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


def chunk_steps(steps: int, batch: int) -> int:
    """Time steps per chunk of the tangent loop: the divisor of ``steps`` nearest (in
    ratio) to ``CHUNK_ROWS / batch`` and within a factor of two of it, else ``steps``
    (one chunk). The benchmark's 100 steps of a batch of 32 run in chunks of 10; 32 steps
    of 128 in chunks of 2; 97 steps in one."""
    target = max(CHUNK_ROWS / max(batch, 1), 1.0)
    near = [d for d in range(1, steps + 1) if steps % d == 0 and target / 2 <= d <= target * 2]
    return min(near, key=lambda d: abs(math.log(d / target))) if near else steps


# rows (steps x batch) of one chunk's weight-gradient product
CHUNK_ROWS = 320

# the gate tangents of all steps (steps x directions x batch x gates) from which the fused
# layers' tangent loop is chunked; below it one loop runs faster
CHUNK_ELEMENTS = 2**21


def _summed_in_float32(p: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``p`` (broadcastable to ``shape``) broadcast in float32 where it is narrower, so
    that its gradient, a sum over the broadcast axes, adds in float32."""
    if not jnp.issubdtype(p.dtype, jnp.floating) or jnp.finfo(p.dtype).bits >= 32:
        return p
    return jnp.broadcast_to(p.astype(jnp.float32), shape).astype(p.dtype)


def _tangent_loop(lin, unroll, factors, terms, d_b, d_state0, w_hh, lengths, *, chunked):
    """The linear loop of the recurrence's tangent; JAX's transpose of it is the backward
    pass. Each step adds ``dh_{t-1} @ w_hh.T`` to the tangent from outside the loop,
    ``sum(seq @ w.T for seq, w in terms)`` plus ``d_b``. Without ``chunked`` the terms
    are one product each over all steps before a single loop; with it, they are taken
    inside the loop a chunk of steps at a time (``chunk_steps``), one product per term
    and chunk, a loop over chunks around a loop over each chunk's steps.

    Transposed, each chunk's products become weight gradients accumulated across the
    backward loop, one product per chunk, so the gate cotangents of all steps are never
    stored, zero-filled or transposed whole."""
    steps, batch = jax.tree.leaves(factors)[0].shape[0], d_state0[0].shape[-2]
    size = chunk_steps(steps, batch) if chunked else steps

    def steps_of(d_carry, inp):
        """The steps of ``inp`` (a chunk, or the whole sequence), their terms first."""
        fac, seqs, ts = inp
        d_g = None
        for s, (_, w) in zip(seqs, terms, strict=True):
            d_g = add(_all_steps(s, w), d_g)
        if d_b is not None:  # summed over steps and batch in float32
            lead = jax.tree.leaves(fac)[0].shape[:-1]  # (steps, [D,] B)
            d_g = add(d_g, _summed_in_float32(d_b[None], (*lead, d_b.shape[-1])))

        def step(d_carry, inp):
            fac_t, d_g_t, t = inp
            d_gh_t = hmm(d_carry[0], w_hh)
            d_new, d_h = lin.tangent(
                fac_t, jnp.zeros((), d_gh_t.dtype) if d_g_t is None else d_g_t, d_gh_t, d_carry
            )
            return _mask(d_new, d_h, d_carry, t, lengths)

        return lax.scan(step, d_carry, (fac, d_g, ts), unroll=min(unroll, size))

    inputs = (factors, tuple(s for s, _ in terms), jnp.arange(steps, dtype=jnp.int32))
    if size == steps:  # one chunk: one loop, the terms before it
        return steps_of(d_state0, inputs)

    def chunks(a):
        return a.reshape((steps // size, size, *a.shape[1:]))

    d_final, d_ys = lax.scan(steps_of, d_state0, jax.tree.map(chunks, inputs))
    return d_final, d_ys.reshape((steps, *d_ys.shape[2:]))


def _fused_step(cell):
    """A step whose gates are one product ``[x_t, h_{t-1}] @ [w_ih, w_hh].T`` plus the
    bias, ``cell``'s ``gi`` and ``gh`` (``cell`` only sums them)."""

    def step(x_t, state, recurrent):
        w, b = recurrent
        z = hmm(jnp.concatenate([x_t, state[0]], axis=-1), w)
        return cell(z, jnp.zeros((), z.dtype) if b is None else b, state)

    return step


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _fused_recurrence(kind, unroll, xs, state0, w_ih, w_hh, b, lengths):
    """``state_t = cell([x_t, h_{t-1}] @ [w_ih, w_hh].T + b, state_{t-1})`` over time,
    for cells that only sum ``gi`` and ``gh`` (LSTM, Elman); ``xs`` ``(T, [D,] B, I)``
    (a bidirectional layer's loop reads ``x`` and its time-reversed copy), and no
    ``(T, B, G)`` input projection is stored.

    Its derivative is written out and takes about 20% off the lstm benchmark's training
    step against ``recurrent_layer_reference``. The forward loop also stacks each step's
    derivative coefficients (``Linearized``); the tangent loop (``_tangent_loop``) is
    linear, with the projection's tangent ``dx @ w_ih.T + [x, h_{t-1}, 1] @ [dw_ih, dw_hh,
    db].T`` taken outside the per-step recurrence (in chunks of steps where the gate
    tangents of all steps reach ``CHUNK_ELEMENTS``); JAX's transpose of it is a backward
    loop that carries only ``dgates_t @ w_hh`` and recomputes nothing. Terms whose
    tangents are symbolic zeros, such as a first layer's input, are left out."""
    w = jnp.concatenate([w_ih, w_hh], axis=-1)
    step = _fused_step(kind.cell)
    final, ys, _ = _scan(
        lambda g, st, r: (*step(g, st, r), None), unroll, xs, state0, (w, b), lengths
    )
    return final, ys


def _fused_recurrence_jvp(kind, unroll, primals, tangents):
    xs, state0, w_ih, w_hh, b, lengths = primals
    d_xs, d_state0, d_w_ih, d_w_hh, d_b, _ = tangents
    lin = kind.linearized
    w = jnp.concatenate([w_ih, w_hh], axis=-1)
    forward = _fused_step(lin.forward)

    def step(x_t, state, recurrent):
        new, h, factors = forward(x_t, state, recurrent)
        return new, h, (factors, None if lengths is None else state[0])

    final, ys, (factors, prev_h) = _scan(step, unroll, xs, state0, (w, b), lengths, True)
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
        lin, unroll, factors, tuple(terms), d_bias, d_state0, w_hh, lengths, chunked=chunked
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


def recurrent_layer_reference(
    kind: str | Kind,
    params: Params,
    x: jax.Array,
    state0: tuple[jax.Array, ...],
    lengths: jax.Array | None = None,
    **kwargs: Any,
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """``recurrent_layer`` as a plain ``lax.scan`` (the input projection one product
    before it) differentiated by JAX: the formulation the fast path is tested against."""
    return recurrent_layer(kind, params, x, state0, lengths, **kwargs, reference=True)


# -- one direction, torch's arguments ----------------------------------------------------


def _weights(w_ih, w_hh, b_ih, b_hh) -> Params:
    p = {"weight_ih_l0": w_ih, "weight_hh_l0": w_hh}
    if b_ih is not None:
        p.update(bias_ih_l0=b_ih, bias_hh_l0=b_hh)
    return p


def _sequence(kind, x, state, w_ih, w_hh, b_ih, b_hh, lengths, reference):
    ys, final = recurrent_layer(
        kind, _weights(w_ih, w_hh, b_ih, b_hh), x, tuple(s[None] for s in state), lengths,
        reference=reference,
    )  # fmt: skip
    return ys, tuple(f[0] for f in final)


def lstm(
    x: jax.Array,
    state: tuple[jax.Array, jax.Array],
    w_ih: jax.Array,
    w_hh: jax.Array,
    b_ih: jax.Array | None = None,
    b_hh: jax.Array | None = None,
    *,
    lengths: jax.Array | None = None,
    reference: bool = False,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """One LSTM direction over time: ``lstm_cell`` at every step of ``x`` ``(T, B, I)``
    from ``state = (h_0, c_0)``, each ``(B, H)``; returns ``(outputs (T, B, H), (h_T,
    c_T))``. Weights as ``torch.nn.LSTM``'s ``weight_ih_l0`` ``(4H, I)``, ``weight_hh_l0``
    ``(4H, H)``, biases ``(4H,)`` (both or neither). ``lengths``, ``reference``: as
    ``recurrent_layer``."""
    return _sequence("lstm", x, state, w_ih, w_hh, b_ih, b_hh, lengths, reference)


def gru(
    x: jax.Array,
    h: jax.Array,
    w_ih: jax.Array,
    w_hh: jax.Array,
    b_ih: jax.Array | None = None,
    b_hh: jax.Array | None = None,
    *,
    lengths: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """One GRU direction over time (``gru_cell`` at every step, torch's weights ``(3H,
    I)``, ``(3H, H)``): ``(outputs (T, B, H), h_T)``."""
    ys, (h,) = _sequence("gru", x, (h,), w_ih, w_hh, b_ih, b_hh, lengths, True)
    return ys, h


def rnn(
    x: jax.Array,
    h: jax.Array,
    w_ih: jax.Array,
    w_hh: jax.Array,
    b_ih: jax.Array | None = None,
    b_hh: jax.Array | None = None,
    *,
    nonlinearity: str = "tanh",
    lengths: jax.Array | None = None,
    reference: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """One Elman RNN direction over time (``rnn_cell`` at every step, torch's weights
    ``(H, I)``, ``(H, H)``): ``(outputs (T, B, H), h_T)``."""
    kind = "rnn_" + nonlinearity
    ys, (h,) = _sequence(kind, x, (h,), w_ih, w_hh, b_ih, b_hh, lengths, reference)
    return ys, h


def _cell(kind, x, state, w_ih, w_hh, b_ih, b_hh):
    gi = hmm(x, w_ih)
    gh = hmm(state[0], w_hh)
    if b_ih is not None:
        row = (1,) * (gi.ndim - 1) + (-1,)
        gi, gh = gi + b_ih.reshape(row), gh + b_hh.reshape(row)
    return KINDS[kind].cell(gi, gh, state)[0]


def lstm_cell(x, state, w_ih, w_hh, b_ih=None, b_hh=None) -> tuple[jax.Array, jax.Array]:
    """One LSTM step, torch's gate order (input, forget, cell, output)::

        i, f, g, o = split(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh, 4)
        c' = sigmoid(f) * c + sigmoid(i) * tanh(g);  h' = sigmoid(o) * tanh(c')

    ``x`` ``(B, I)``, ``state = (h, c)`` each ``(B, H)``; returns ``(h', c')``."""
    return _cell("lstm", x, tuple(state), w_ih, w_hh, b_ih, b_hh)


def gru_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None) -> jax.Array:
    """One GRU step, torch's gate order (reset, update, new)::

    r, z = sigmoid(x W_i{r,z}^T + b_i{r,z} + h W_h{r,z}^T + b_h{r,z})
    n = tanh(x W_in^T + b_in + r * (h W_hn^T + b_hn));  h' = (1 - z) * n + z * h
    """
    return _cell("gru", x, (h,), w_ih, w_hh, b_ih, b_hh)[0]


def rnn_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None, *, nonlinearity="tanh") -> jax.Array:
    """One Elman step: ``h' = act(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh)``, ``act``
    ``tanh`` or ``relu``."""
    return _cell("rnn_" + nonlinearity, x, (h,), w_ih, w_hh, b_ih, b_hh)[0]
