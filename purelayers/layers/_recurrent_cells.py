r"""One time step of the Elman, LSTM and GRU recurrences: the gate arithmetic the
sequence layers share, and the cells ``RNNCell``, ``LSTMCell``, ``GRUCell``.

Every recurrence is split the same way: ``gi = x @ weight_ih.T + bias`` and a step
``(state, gi_t) -> (state', h_t)`` that multiplies only by the recurrent weights. A
sequence layer computes ``gi`` for all time steps at once before its time loop, or, for
cells that only sum ``gi`` and ``gh`` (LSTM, Elman), as part of one product per step
(``_recurrent_loop``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from purelayers.init import Initializer, uniform
from purelayers.layers._checks import LayerError, as_shape, check_choice, check_float, check_int
from purelayers.layers.core import Layer, Params

__all__ = ["GRUCell", "LSTMCell", "RNNCell"]


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
    float32 ulps), but XLA:CPU vectorizes one transcendental over a contiguous array and
    not one over each slice: inside the LSTM time loop this made the gate arithmetic
    4.6x faster (batch 32, hidden 256: 0.21 ms to 0.045 ms a step)."""
    scale, shift = _gate_constants(z, tanh_blocks, blocks)
    return jnp.tanh(z * scale) * scale + shift


def gate_derivatives(a: jax.Array, tanh_blocks: tuple[int, ...], blocks: int) -> jax.Array:
    """The derivatives of ``gate_activations`` at its output ``a``, again in one pass over
    the whole array: ``scale**2 - (a - shift)**2``, which is ``a * (1 - a)`` on the
    sigmoid blocks and ``1 - a**2`` on the tanh blocks. In the LSTM step it replaces one
    product per gate block and their concatenation: the benchmark's training step (batch
    32, 64 inputs, hidden 256, 100 steps) compiles 64 kernels instead of 68, its forward
    loop 17 instead of 22."""
    scale, shift = _gate_constants(a, tanh_blocks, blocks)
    u = a - shift
    return scale * scale - u * u


def _gate_constants(z: jax.Array, tanh_blocks: tuple[int, ...], blocks: int):
    """Per column of ``z``: the scale (1 on tanh blocks, 0.5 on sigmoid blocks) and the
    shift (0 and 0.5) of ``a = scale * tanh(scale * z) + shift``, as ``(1, ..., 1, G)``
    constants of the program. Computed in it (an iota, compares and selects over ``z``'s
    shape) they were two kernels more to compile in the LSTM training step, which XLA
    kept out of the time loop as two ``[B, 4H]`` arrays."""
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


def _gru_forward(gi, gh, state):
    (h_prev,) = state
    in_ = _blocks(gi, 3)[2]
    hn = _blocks(gh, 3)[2]
    r, z, _ = _blocks(gate_activations(gi + gh, (2,), 3), 3)
    n = jnp.tanh(in_ + r * hn)
    h = (1 - z) * n + z * h_prev
    # dh = P (dir + dhr) + A (diz + dhz) + Q din + Q r dhn + z dh_prev
    q = (1 - z) * (1 - n * n)
    p = r * (1 - r) * hn * q
    a = z * (1 - z) * (h_prev - n)
    return (h,), h, (jnp.concatenate([p, a, q], -1), jnp.concatenate([p, a, q * r], -1), z)


def _gru_tangent(fac, dgi, dgh, dstate):
    on_gi, on_gh, z = fac
    (dh_prev,) = dstate
    kr, kz, kn = _blocks(on_gi * dgi + on_gh * dgh, 3)
    dh = kr + kz + kn + z * dh_prev
    return (dh,), dh


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
_GRU = Linearized(_gru_forward, _gru_tangent)
KINDS = {
    "rnn_tanh": Kind(1, 1, *_STANDARD, False, _ELMAN_TANH.cell, None, _ELMAN_TANH),
    "rnn_relu": Kind(1, 1, *_STANDARD, False, _ELMAN_RELU.cell, None, _ELMAN_RELU),
    "lstm": Kind(4, 2, *_STANDARD, False, _LSTM.cell, None, _LSTM),
    "gru": Kind(3, 1, *_STANDARD, True, _GRU.cell, None, _GRU),
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


def param_shapes(
    kind: Kind, input_size: int, hidden: int, bias: bool, proj: int = 0
) -> dict[str, tuple]:
    """Parameter names and shapes of one cell, in torch's order (weights, then biases,
    then an LSTM's projection ``weight_hr`` ``(proj, hidden)`` when ``proj``)."""
    g = kind.gates * hidden
    rows = {"weight_hh": g, "weight_hh_rz": 2 * hidden, "weight_hh_n": hidden}
    rows.update(bias_ih=g, bias_hh=g, bias_hh_rz=2 * hidden, bias_hh_n=hidden)
    shapes = {"weight_ih": (g, input_size)}
    shapes.update({n: (rows[n], proj or hidden) for n in kind.recurrent})
    if bias:
        shapes.update({n: (rows[n],) for n in kind.biases})
    if proj:
        shapes["weight_hr"] = (proj, hidden)
    return shapes


def init_cell(
    layer: Any, kind: Kind, key: jax.Array, input_size: int, dtype: Any, suffix: str = ""
) -> Params:
    """One cell's parameters named ``name + suffix``; tensor ``i`` (torch order) draws
    from ``fold_in(key, i)``. Default ``U(-1/sqrt(H), 1/sqrt(H))`` for every tensor."""
    hidden = layer.hidden_size
    bound = 1.0 / math.sqrt(hidden)
    default = uniform(-bound, bound)
    forget_bias = getattr(layer, "forget_bias", None)
    params = {}
    shapes = param_shapes(kind, input_size, hidden, layer.bias, getattr(layer, "proj_size", 0))
    for i, (name, shape) in enumerate(shapes.items()):
        is_bias = name.startswith("bias")
        init = (layer.bias_init if is_bias else layer.weight_init) or default
        value = init(jax.random.fold_in(key, i), shape, dtype)
        if is_bias and forget_bias is not None:
            fill = forget_bias if name == "bias_ih" else 0.0
            value = value.at[hidden : 2 * hidden].set(fill)
        params[name + suffix] = value
    return params


def split_params(kind: Kind, params: Params, suffix: str, dtype: Any):
    """``(weight_ih, bias added to gi or None, recurrent tuple)`` cast to ``dtype``.

    ``recurrent`` is the recurrent weights then the recurrent biases (``None`` without
    bias). Where ``bias_hh`` is simply added to the gates (LSTM, Elman), ``bias_ih`` is
    folded into it and both are added inside the step, where the add fuses into the gate
    arithmetic: adding ``bias_ih`` to the input projection of every step instead is one
    more pass over, and one more buffer of, ``(T, B, G)`` (LSTM training step, batch 32,
    hidden 256, 100 steps: 59.8 -> 47.5 MiB of temporaries, 58 -> 47 ms)."""

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


# -- the cells ------------------------------------------------------------------------


def check_common(layer: str, obj: Any) -> None:
    check_int(layer, "hidden_size", obj.hidden_size)
    fb = getattr(obj, "forget_bias", None)
    if fb is not None:
        check_float(layer, "forget_bias", fb)
        if not obj.bias:
            raise ValueError(
                f"{layer}: forget_bias={fb!r} sets the forget-gate bias, which needs "
                "bias=True; got bias=False"
            )


def need_input_size(layer: str, x: Any, size: int, hint: str) -> None:
    if jnp.shape(x)[-1] != size:
        raise LayerError(
            layer,
            "input last axis (input_size)",
            size,
            jnp.shape(x)[-1],
            f"x.shape == {tuple(jnp.shape(x))}; {hint}",
        )


def need_state_shape(layer: str, what: str, h: Any, shape: tuple[int, ...]) -> None:
    if tuple(jnp.shape(h)) != shape:
        raise LayerError(layer, f"{what} shape", shape, tuple(jnp.shape(h)))


def compute_dtype(x: Any, params: Params) -> Any:
    dt = jnp.result_type(x)
    if jnp.issubdtype(dt, jnp.floating):
        return dt
    return jnp.result_type(params["weight_ih"])


@dataclasses.dataclass(frozen=True)
class _Cell(Layer):
    accepts: ClassVar[tuple[str, ...]] = ("floating",)
    _kind_name: ClassVar[str] = ""

    @property
    def kind(self) -> Kind:
        return KINDS[self._kind_name]

    def __post_init__(self):
        check_common(type(self).__name__, self)

    def own_names(self) -> tuple[str, ...]:
        return tuple(param_shapes(self.kind, 1, 1, self.bias))

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        shape = as_shape(shape)
        if len(shape) not in (1, 2):
            raise LayerError(
                type(self).__name__,
                "input rank",
                "1 or 2 ((input,) or (batch, input))",
                f"{len(shape)} (shape {shape})",
            )
        return init_cell(self, self.kind, key, shape[-1], dtype)

    def apply(
        self,
        params: Params,
        x: Any,
        hx: Any = None,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> Any:
        name = type(self).__name__
        kind = self.kind
        if jnp.ndim(x) not in (1, 2):
            raise LayerError(
                name,
                "input rank",
                "1 or 2 ((input,) or (batch, input))",
                f"{jnp.ndim(x)} (x.shape == {tuple(jnp.shape(x))})",
            )
        w_ih = params["weight_ih"]
        need_input_size(
            name, x, w_ih.shape[1], f"{name} was initialized for {w_ih.shape[1]} input features"
        )
        dtype = compute_dtype(x, params)
        batched = jnp.ndim(x) == 2
        x = jnp.asarray(x, dtype)
        if not batched:
            x = x[None]
        state = self._state(hx, x.shape[0], batched, dtype)
        w_ih, b_in, recurrent = split_params(kind, params, "", dtype)
        gi = hmm(x, w_ih)
        if b_in is not None:
            gi = gi + b_in[None]
        state, _ = make_step(kind)(gi, state, recurrent)
        if not batched:
            state = tuple(s[0] for s in state)
        return state if kind.states == 2 else state[0]

    def _state(self, hx: Any, batch: int, batched: bool, dtype: Any) -> tuple:
        name, n = type(self).__name__, self.kind.states
        shape = (batch, self.hidden_size) if batched else (self.hidden_size,)
        if hx is None:
            return tuple(jnp.zeros((batch, self.hidden_size), dtype) for _ in range(n))
        parts = (hx,) if n == 1 else hx
        if n == 2 and not (isinstance(hx, (tuple, list)) and len(hx) == 2):
            raise LayerError(name, "hx", "a pair (h, c)", type(hx).__name__)
        if n == 1 and isinstance(hx, (tuple, list)):
            raise LayerError(
                name, "hx", "one array (it has no cell state)", f"a {type(hx).__name__}"
            )
        out = []
        for what, h in zip(("h", "c")[:n], parts, strict=True):
            need_state_shape(name, f"hx {what}" if n == 2 else "hx", h, shape)
            h = jnp.asarray(h, dtype)
            out.append(h if batched else h[None])
        return tuple(out)


@dataclasses.dataclass(frozen=True)
class RNNCell(_Cell):
    r"""One step of the Elman recurrence: ``h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh)``.

    Matches ``torch.nn.RNNCell``.

    Args:
      hidden_size: width ``H`` of the state.
      nonlinearity: ``"tanh"`` (default) or ``"relu"``.
      bias: learn ``bias_ih`` and ``bias_hh``. Default ``True``.
      weight_init, bias_init: initializers overriding the default for both weights /
        both biases.

    Shape:
      ``apply(params, x, hx=None)``: ``x`` ``(B, I)`` or ``(I,)``; ``hx`` ``(B, H)`` or
      ``(H,)``, zeros when omitted; returns ``h'`` of ``hx``'s shape.

    Parameters:
      ``weight_ih`` ``(H, I)``, ``weight_hh`` ``(H, H)``, ``bias_ih`` ``(H,)``,
      ``bias_hh`` ``(H,)``; all ``U(-1/sqrt(H), 1/sqrt(H))``.
    """

    hidden_size: int
    _: dataclasses.KW_ONLY
    nonlinearity: str = "tanh"
    bias: bool = True
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None

    def __post_init__(self):
        check_choice("RNNCell", "nonlinearity", self.nonlinearity, ("tanh", "relu"))
        super().__post_init__()

    @property
    def kind(self) -> Kind:
        return KINDS["rnn_" + self.nonlinearity]


@dataclasses.dataclass(frozen=True)
class LSTMCell(_Cell):
    r"""One LSTM step. Matches ``torch.nn.LSTMCell`` (gate order input, forget, cell, output)::

        i, f, g, o = split(x W_ih^T + b_ih + h W_hh^T + b_hh, 4)
        c' = sigmoid(f) * c + sigmoid(i) * tanh(g)
        h' = sigmoid(o) * tanh(c')

    Args:
      hidden_size: width ``H`` of ``h`` and ``c``.
      bias: learn ``bias_ih`` and ``bias_hh``. Default ``True``.
      forget_bias: if set (e.g. ``1.0``), the forget-gate rows ``[H, 2H)`` of ``bias_ih``
        start at this value and those of ``bias_hh`` at zero, so the cell starts by
        keeping its memory. Needs ``bias=True``. Default ``None`` (torch's init).
      weight_init, bias_init: initializers overriding the default for both weights /
        both biases (``forget_bias`` is applied after ``bias_init``).

    Shape:
      ``apply(params, x, hx=None)``: ``x`` ``(B, I)`` or ``(I,)``; ``hx`` a pair
      ``(h, c)`` each ``(B, H)`` or ``(H,)``, zeros when omitted; returns ``(h', c')``.

    Parameters:
      ``weight_ih`` ``(4H, I)``, ``weight_hh`` ``(4H, H)``, ``bias_ih`` ``(4H,)``,
      ``bias_hh`` ``(4H,)``; all ``U(-1/sqrt(H), 1/sqrt(H))``.
    """

    hidden_size: int
    _: dataclasses.KW_ONLY
    bias: bool = True
    forget_bias: float | None = None
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None
    _kind_name: ClassVar[str] = "lstm"


@dataclasses.dataclass(frozen=True)
class GRUCell(_Cell):
    r"""One GRU step. Matches ``torch.nn.GRUCell`` (gate order reset, update, new)::

        r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
        z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
        h' = (1 - z) * n + z * h

    The reset gate multiplies the recurrent affine map, bias included ("reset after",
    as torch and cuDNN).

    ``reset_after=False`` gives the original recurrence of Cho et al. (2014), where
    the reset gate multiplies the state *before* the recurrent map::

        n = tanh(W_in x + b_in + W_hn (r * h) + b_hn)

    Its parameters are named differently on purpose (``weight_hh_rz`` ``(2H, H)`` for the
    gates, ``weight_hh_n`` ``(H, H)`` for the candidate, ``bias_hh_rz``, ``bias_hh_n``):
    ``r * (W_hn h)`` and ``W_hn (r * h)`` differ for any weights as soon as ``r`` varies
    across units, so no choice of torch ``GRUCell`` weights reproduces this cell and a
    torch checkpoint must not load into it silently.

    Args:
      hidden_size: width ``H`` of the state.
      bias: learn the biases. Default ``True``.
      reset_after: ``True`` (default, torch's) or ``False`` (Cho et al.).
      weight_init, bias_init: initializers overriding the default for all weights /
        all biases.

    Shape:
      ``apply(params, x, hx=None)``: ``x`` ``(B, I)`` or ``(I,)``; ``hx`` ``(B, H)`` or
      ``(H,)``, zeros when omitted; returns ``h'`` of ``hx``'s shape.

    Parameters:
      ``weight_ih`` ``(3H, I)``, ``weight_hh`` ``(3H, H)``, ``bias_ih`` ``(3H,)``,
      ``bias_hh`` ``(3H,)``; all ``U(-1/sqrt(H), 1/sqrt(H))``.
    """

    hidden_size: int
    _: dataclasses.KW_ONLY
    bias: bool = True
    reset_after: bool = True
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None

    @property
    def kind(self) -> Kind:
        return KINDS["gru" if self.reset_after else "gru_reset_before"]
