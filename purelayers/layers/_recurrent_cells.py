r"""One time step of the Elman, LSTM and GRU recurrences: the gate arithmetic the
sequence layers share, and the cells ``RNNCell``, ``LSTMCell``, ``GRUCell``.

Every recurrence is split the same way: ``gi = x @ weight_ih.T + bias`` (for a sequence,
computed for all time steps at once, outside the time loop) and a step
``(state, gi_t) -> (state', h_t)`` that multiplies only by the recurrent weights.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
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


def _elman(act: Callable[[jax.Array], jax.Array]):
    def cell(gi, gh, state):
        h = act(gi + gh)
        return (h,), h

    return cell


def _lstm(gi, gh, state):
    _, c = state
    i, f, g, o = jnp.split(gi + gh, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h, c), h


def _gru(gi, gh, state):
    (h,) = state
    ir, iz, in_ = jnp.split(gi, 3, axis=-1)
    hr, hz, hn = jnp.split(gh, 3, axis=-1)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(iz + hz)
    n = jnp.tanh(in_ + r * hn)
    h = (1 - z) * n + z * h
    return (h,), h


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
KINDS = {
    "rnn_tanh": Kind(1, 1, *_STANDARD, False, _elman(jnp.tanh)),
    "rnn_relu": Kind(1, 1, *_STANDARD, False, _elman(jax.nn.relu)),
    "lstm": Kind(4, 2, *_STANDARD, False, _lstm),
    "gru": Kind(3, 1, *_STANDARD, True, _gru),
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


def param_shapes(kind: Kind, input_size: int, hidden: int, bias: bool) -> dict[str, tuple]:
    """Parameter names and shapes of one cell, in torch's order (weights, then biases)."""
    g = kind.gates * hidden
    rows = {"weight_hh": g, "weight_hh_rz": 2 * hidden, "weight_hh_n": hidden}
    rows.update(bias_ih=g, bias_hh=g, bias_hh_rz=2 * hidden, bias_hh_n=hidden)
    shapes = {"weight_ih": (g, input_size)}
    shapes.update({n: (rows[n], hidden) for n in kind.recurrent})
    if bias:
        shapes.update({n: (rows[n],) for n in kind.biases})
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
    shapes = param_shapes(kind, input_size, hidden, layer.bias)
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
    bias). Where ``bias_hh`` is simply added to the gates (LSTM, Elman) it is folded into
    the input bias: the same sum, computed once for all time steps."""

    def get(n):
        v = params.get(n + suffix)
        return None if v is None else v.astype(dtype)

    b_in = get(kind.biases[0])
    weights = tuple(get(n) for n in kind.recurrent)
    biases = tuple(get(n) for n in kind.biases[1:])
    if b_in is not None and not kind.inner:
        b_in, biases = b_in + biases[0], (None,)
    biases = tuple(b if b is None else b[None] for b in biases)  # (1, G): rows of gh
    return get("weight_ih"), b_in, weights + biases


def add(a: jax.Array, b: jax.Array | None) -> jax.Array:
    return a if b is None else a + b


def make_step(kind: Kind):
    """``step(gi_t, state, recurrent) -> (state', h_t)`` for ``split_params``' output."""
    if kind.step is not None:
        return kind.step

    def step(gi, state, recurrent):
        w_hh, b_hh = recurrent
        return kind.cell(gi, add(hmm(state[0], w_hh), b_hh), state)

    return step


# -- the cells ------------------------------------------------------------------------


def check_common(layer: str, obj: Any) -> None:
    check_int(layer, "hidden_size", obj.hidden_size)
    if not isinstance(obj.bias, bool):
        raise ValueError(f"{layer}: bias must be True or False, got {obj.bias!r}")
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
    _kind_name: ClassVar[str] = ""
    _own_order: ClassVar[tuple[str, ...]] = (
        "weight_ih",
        "weight_hh",
        "weight_hh_rz",
        "weight_hh_n",
        "bias_ih",
        "bias_hh",
        "bias_hh_rz",
        "bias_hh_n",
    )

    @property
    def kind(self) -> Kind:
        return KINDS[self._kind_name]

    def __post_init__(self):
        check_common(type(self).__name__, self)

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

    def __post_init__(self):
        if not isinstance(self.reset_after, bool):
            raise ValueError(
                f"GRUCell: reset_after must be True or False, got {self.reset_after!r}"
            )
        super().__post_init__()

    @property
    def kind(self) -> Kind:
        return KINDS["gru" if self.reset_after else "gru_reset_before"]
