r"""Recurrent cells, one time step each: ``RNNCell``, ``LSTMCell``, ``GRUCell`` (torch's
names, layouts and gate orders), and the parameter names and initialization the sequence
layers (``recurrent``) share. The step math is ``purelayers.functional.recurrent``'s.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.functional._recurrent_steps import KINDS, Kind, hmm, make_step, split_params
from purelayers.init import Initializer, uniform
from purelayers.layers._checks import LayerError, as_shape, check_choice, check_float, check_int
from purelayers.layers.core import Layer, Params

__all__ = ["GRUCell", "LSTMCell", "RNNCell"]


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

    Matches ``torch.nn.RNNCell(input_size, hidden_size)``; the input width comes from
    ``init``'s shape.

    Args:
      hidden_size: width ``H`` of the state (required).
      nonlinearity: ``act``, ``"tanh"`` or ``"relu"`` (keyword-only). Default ``"tanh"``.
      bias: learn ``bias_ih`` and ``bias_hh`` (keyword-only). Default ``True``.
      weight_init: initializer for both weights (keyword-only). Default ``None``: the
        uniform init below.
      bias_init: initializer for both biases (keyword-only). Default ``None``: the
        uniform init below.

    Shape:
      ``apply(params, x, hx=None)``: ``x`` ``(B, I)`` or ``(I,)``; ``hx`` ``(B, H)`` or
      ``(H,)``, zeros when omitted; returns ``h'`` of ``hx``'s shape.

    Parameters:
      ``weight_ih`` ``(H, I)``, ``weight_hh`` ``(H, H)``, ``bias_ih`` ``(H,)``,
      ``bias_hh`` ``(H,)``; all ``U(-1/sqrt(H), 1/sqrt(H))``.

    Example:
      >>> cell = RNNCell(3)
      >>> params = cell.init(jax.random.key(0), (2, 4))
      >>> jax.tree.map(jnp.shape, params)
      {'bias_hh': (3,), 'bias_ih': (3,), 'weight_hh': (3, 3), 'weight_ih': (3, 4)}
      >>> cell.apply(params, jnp.ones((2, 4))).shape
      (2, 3)
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
    r"""One LSTM step: ``c' = sigmoid(f) c + sigmoid(i) tanh(g)``, ``h' = sigmoid(o) tanh(c')``.

    Matches ``torch.nn.LSTMCell(input_size, hidden_size)`` (gate order input, forget,
    cell, output); the input width comes from ``init``'s shape. The gates are::

        i, f, g, o = split(x W_ih^T + b_ih + h W_hh^T + b_hh, 4)

    Args:
      hidden_size: width ``H`` of ``h`` and ``c`` (required).
      bias: learn ``bias_ih`` and ``bias_hh`` (keyword-only). Default ``True``.
      forget_bias: if set (e.g. ``1.0``), the forget-gate rows ``[H, 2H)`` of ``bias_ih``
        start at this value and those of ``bias_hh`` at zero, so the cell starts by
        keeping its memory. Needs ``bias=True`` (keyword-only). Default ``None``
        (torch's init).
      weight_init: initializer for both weights (keyword-only). Default ``None``: the
        uniform init below.
      bias_init: initializer for both biases, applied before ``forget_bias``
        (keyword-only). Default ``None``: the uniform init below.

    Shape:
      ``apply(params, x, hx=None)``: ``x`` ``(B, I)`` or ``(I,)``; ``hx`` a pair
      ``(h, c)`` each ``(B, H)`` or ``(H,)``, zeros when omitted; returns ``(h', c')``.

    Parameters:
      ``weight_ih`` ``(4H, I)``, ``weight_hh`` ``(4H, H)``, ``bias_ih`` ``(4H,)``,
      ``bias_hh`` ``(4H,)``; all ``U(-1/sqrt(H), 1/sqrt(H))``.

    Example:
      >>> cell = LSTMCell(3)
      >>> params = cell.init(jax.random.key(0), (4,))
      >>> jax.tree.map(jnp.shape, params)
      {'bias_hh': (12,), 'bias_ih': (12,), 'weight_hh': (12, 3), 'weight_ih': (12, 4)}
      >>> h, c = cell.apply(params, jnp.ones(4))
      >>> h.shape, c.shape
      ((3,), (3,))
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
    r"""One GRU step: ``h' = (1 - z) n + z h``, ``n = tanh(W_in x + b_in + r (W_hn h + b_hn))``.

    Matches ``torch.nn.GRUCell(input_size, hidden_size)`` (gate order reset, update,
    new); the input width comes from ``init``'s shape. The gates are::

        r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
        z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)

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
      hidden_size: width ``H`` of the state (required).
      bias: learn the biases (keyword-only). Default ``True``.
      reset_after: ``True`` (torch's) or ``False`` (Cho et al.) (keyword-only). Default
        ``True``.
      weight_init: initializer for all weights (keyword-only). Default ``None``: the
        uniform init below.
      bias_init: initializer for all biases (keyword-only). Default ``None``: the
        uniform init below.

    Shape:
      ``apply(params, x, hx=None)``: ``x`` ``(B, I)`` or ``(I,)``; ``hx`` ``(B, H)`` or
      ``(H,)``, zeros when omitted; returns ``h'`` of ``hx``'s shape.

    Parameters:
      ``weight_ih`` ``(3H, I)``, ``weight_hh`` ``(3H, H)``, ``bias_ih`` ``(3H,)``,
      ``bias_hh`` ``(3H,)`` (with ``reset_after=False``, ``weight_hh_rz``,
      ``weight_hh_n``, ``bias_hh_rz``, ``bias_hh_n`` in place of the ``hh`` pair); all
      ``U(-1/sqrt(H), 1/sqrt(H))``.

    Example:
      >>> cell = GRUCell(3)
      >>> params = cell.init(jax.random.key(0), (2, 4))
      >>> jax.tree.map(jnp.shape, params)
      {'bias_hh': (9,), 'bias_ih': (9,), 'weight_hh': (9, 3), 'weight_ih': (9, 4)}
      >>> cell.apply(params, jnp.ones((2, 4)), jnp.zeros((2, 3))).shape
      (2, 3)
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
