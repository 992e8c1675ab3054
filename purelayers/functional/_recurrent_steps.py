"""One step of the Elman, LSTM and GRU recurrences, given ``gi = x @ weight_ih.T + bias``:
the gate arithmetic, its written-out derivative (``Linearized``), and the recurrences'
parameter layouts (``Kind``, ``KINDS``); ``recurrent`` runs them over time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Params = dict[str, Any]


def hmm(h: jax.Array, w: jax.Array) -> jax.Array:
    """``h @ w.T`` over the last axis; with a leading direction axis on both
    (``h`` ``(D, B, H)``, ``w`` ``(D, G, H)``) one batched product per direction."""
    if w.ndim == 3:
        return lax.dot_general(h, w, (((h.ndim - 1,), (2,)), ((0,), (0,))))
    return lax.dot_general(h, w, (((h.ndim - 1,), (1,)), ((), ())))


# -- gate arithmetic: (gi_t, gh_t, state) -> (state', h_t), elementwise -----------------


def gate_activations(z: jax.Array, tanh_blocks: tuple[int, ...], blocks: int) -> jax.Array:
    """``z`` ``(..., blocks * H)`` with ``tanh`` on the listed gate blocks and the
    logistic sigmoid on the others, all through one ``tanh`` over the whole array:
    ``sigmoid(v) = 0.5 * tanh(0.5 * v) + 0.5``.

    Same values as ``jax.nn.sigmoid`` / ``jnp.tanh`` on the split gates (within a few
    float32 ulps); XLA:CPU vectorizes one transcendental over a contiguous array and not
    one over each slice."""
    scale, shift = _gate_constants(z, tanh_blocks, blocks)
    return jnp.tanh(z * scale) * scale + shift


def gate_derivatives(a: jax.Array, tanh_blocks: tuple[int, ...], blocks: int) -> jax.Array:
    """The derivatives of ``gate_activations`` at its output ``a``, again in one pass over
    the whole array: ``scale**2 - (a - shift)**2``, which is ``a * (1 - a)`` on the
    sigmoid blocks and ``1 - a**2`` on the tanh blocks (one pass instead of one product
    per gate block and their concatenation)."""
    scale, shift = _gate_constants(a, tanh_blocks, blocks)
    u = a - shift
    return scale * scale - u * u


def _gate_constants(z: jax.Array, tanh_blocks: tuple[int, ...], blocks: int):
    """Per column of ``z``: the scale (1 on tanh blocks, 0.5 on sigmoid blocks) and the
    shift (0 and 0.5) of ``a = scale * tanh(scale * z) + shift``, as ``(1, ..., 1, G)``
    constants of the program (not computed in it)."""
    width = z.shape[-1] // blocks
    is_tanh = np.isin(np.arange(z.shape[-1]) // width, tanh_blocks)
    row = (1,) * (z.ndim - 1) + (z.shape[-1],)
    scale = jnp.asarray(np.where(is_tanh, 1.0, 0.5).reshape(row), z.dtype)
    shift = jnp.asarray(np.where(is_tanh, 0.0, 0.5).reshape(row), z.dtype)
    return scale, shift


# -- gate arithmetic: (gi_t, gh_t, state) -> (state', h_t), with its derivative ---------
#
# ``forward(gi, gh, state) -> (state', h, factors)`` is one step's elementwise part (given
# ``gh = h @ weight_hh.T`` plus inner biases) that also returns the coefficients of its
# derivative, computed where the activations are at hand. ``tangent(factors_t, dgi, dgh, dstate) -> (dstate', dh)`` is the derivative of
# one step, linear in the tangents with no other arithmetic: JAX's reverse mode transposes
# it into the backward loop without recomputing anything per step, and the stacked
# factors are the only residuals.


class Linearized(NamedTuple):
    forward: Callable[..., Any]
    tangent: Callable[..., Any]

    def cell(self, gi, gh, state):
        """The step without its derivative coefficients (XLA drops their arithmetic)."""
        new, h, _ = self.forward(gi, gh, state)
        return new, h


def _blocks(a: jax.Array, n: int) -> list[jax.Array]:
    return jnp.split(a, n, axis=-1)


def _elman_linearized(act_name: str) -> Linearized:
    def forward(gi, gh, state):
        u = gi + gh
        if act_name == "tanh":
            h = jnp.tanh(u)
            return (h,), h, (1 - h * h,)
        # relu's derivative is [u > 0]: 0 at 0, as torch
        return (jax.nn.relu(u),), jax.nn.relu(u), ((u > 0).astype(u.dtype),)

    def tangent(fac, dgi, dgh, dstate):
        h = fac[0] * (dgi + dgh)
        return (h,), h

    return Linearized(forward, tangent)


def _lstm_forward(gi, gh, state):
    _, c_prev = state
    a = gate_activations(gi + gh, (2,), 4)
    i, f, g, o = _blocks(a, 4)
    c = f * c_prev + i * g
    tc = jnp.tanh(c)
    h = o * tc
    # dc = sum over the (i, f, g) blocks of coef * dz + f * dc_prev;
    # dh = (o block of coef * dz) + q * dc, with da the activations' derivatives
    da = gate_derivatives(a, (2,), 4)
    coef = da * jnp.concatenate([g, c_prev, i, tc], axis=-1)
    return (h, c), h, (coef, f, o * (1 - tc * tc))


def _lstm_tangent(fac, dgi, dgh, dstate):
    coef, f, q = fac
    _, dc_prev = dstate
    ki, kf, kg, ko = _blocks(coef * (dgi + dgh), 4)
    dc = ki + kf + kg + f * dc_prev
    dh = ko + q * dc
    return (dh, dc), dh


class Kind(NamedTuple):
    """A recurrence: gate count, state count, recurrent parameter names and its step.

    ``cell(gi, gh, state)`` is the elementwise part given ``gh = h @ weight_hh.T`` plus
    ``inner`` biases; ``None`` for recurrences that are not of that form (Cho's GRU),
    which give ``step`` instead.
    """

    gates: int
    states: int
    recurrent: tuple[str, ...]  # weights multiplying the state, in torch order
    biases: tuple[str, ...]  # in torch order; biases[0] is added to x @ weight_ih.T
    inner: bool  # bias_hh stays inside the step (GRU: multiplied by the reset gate)
    cell: Callable[..., Any] | None
    step: Callable[..., Any] | None = None
    linearized: Linearized | None = None  # ``cell`` with its derivative written out


def _gru_cell(gi, gh, state):
    """torch's GRU step given ``gi`` and ``gh = h @ weight_hh.T + bias_hh``: the reset
    gate multiplies the recurrent candidate, bias included."""
    (h_prev,) = state
    r, z, _ = _blocks(gate_activations(gi + gh, (2,), 3), 3)
    n = jnp.tanh(_blocks(gi, 3)[2] + r * _blocks(gh, 3)[2])
    h = (1 - z) * n + z * h_prev
    return (h,), h


def _cho_step(gi, state, recurrent):
    """Reset before the recurrent map: ``n = tanh(W_in x + b_in + W_hn (r * h) + b_hn)``."""
    (h,) = state
    w_rz, w_n, b_rz, b_n = recurrent
    ir, iz, in_ = jnp.split(gi, 3, axis=-1)
    hr, hz = jnp.split(add(hmm(h, w_rz), b_rz), 2, axis=-1)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(iz + hz)
    n = jnp.tanh(add(in_ + hmm(r * h, w_n), b_n))
    h = (1 - z) * n + z * h
    return (h,), h


_STANDARD = ("weight_hh",), ("bias_ih", "bias_hh")
_ELMAN_TANH = _elman_linearized("tanh")
_ELMAN_RELU = _elman_linearized("relu")
_LSTM = Linearized(_lstm_forward, _lstm_tangent)
KINDS = {
    "rnn_tanh": Kind(1, 1, *_STANDARD, False, _ELMAN_TANH.cell, None, _ELMAN_TANH),
    "rnn_relu": Kind(1, 1, *_STANDARD, False, _ELMAN_RELU.cell, None, _ELMAN_RELU),
    "lstm": Kind(4, 2, *_STANDARD, False, _LSTM.cell, None, _LSTM),
    "gru": Kind(3, 1, *_STANDARD, True, _gru_cell),
    "gru_reset_before": Kind(
        3,
        1,
        ("weight_hh_rz", "weight_hh_n"),
        ("bias_ih", "bias_hh_rz", "bias_hh_n"),
        True,
        None,
        _cho_step,
    ),
}


def split_params(kind: Kind, params: Params, suffix: str, dtype: Any):
    """``(weight_ih, bias added to gi or None, recurrent tuple)`` cast to ``dtype``.

    ``recurrent`` is the recurrent weights then the recurrent biases (``None`` without
    bias). Where ``bias_hh`` is simply added to the gates (LSTM, Elman), ``bias_ih`` is
    folded into it and both are added inside the step, where the add fuses into the gate
    arithmetic (no extra pass over a ``(T, B, G)`` projection)."""

    def get(n):
        v = params.get(n + suffix)
        return None if v is None else v.astype(dtype)

    b_in = get(kind.biases[0])
    weights = tuple(get(n) for n in kind.recurrent)
    biases = tuple(get(n) for n in kind.biases[1:])
    if b_in is not None and not kind.inner:
        b_in, biases = None, (b_in + biases[0],)
    biases = tuple(b if b is None else b[None] for b in biases)  # (1, G): rows of gh
    return get("weight_ih"), b_in, weights + biases


def add(a: jax.Array | None, b: jax.Array | None) -> jax.Array | None:
    """``a + b`` where ``None`` stands for zero."""
    return b if a is None else a if b is None else a + b


def make_step(kind: Kind):
    """``step(gi_t, state, recurrent) -> (state', h_t)`` for ``split_params``' output."""
    if kind.step is not None:
        return kind.step

    def step(gi, state, recurrent):
        w_hh, b_hh = recurrent
        return kind.cell(gi, add(hmm(state[0], w_hh), b_hh), state)

    return step


def projected_step(kind: Kind, gi: jax.Array, state: tuple, recurrent: tuple) -> tuple:
    """An LSTM step with torch's projection: the cell's ``h`` (width ``H``) times
    ``weight_hr.T`` is the new ``h`` (width ``P``); ``c`` keeps width ``H``."""
    w_hh, b_hh, w_hr = recurrent
    (_, c), h = kind.cell(gi, add(hmm(state[0], w_hh), b_hh), state)
    h = hmm(h, w_hr)
    return (h, c), h
