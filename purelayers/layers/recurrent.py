r"""Recurrent layers: the sequence layers ``RNN``, ``LSTM``, ``GRU`` (stacked, optionally
bidirectional); the one-step cells are in ``cells``.

Parameters carry PyTorch's names, layouts and gate orders, so a ``torch.nn.LSTM``
``state_dict`` loads by name and gives the same outputs and gradients.

The recurrences themselves (one ``lax.scan`` over time for both directions of a layer,
masked by ``lengths``; the LSTM's and Elman RNN's written-out derivative) are
``purelayers.functional.recurrent``'s ``recurrent_layer``.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from purelayers import functional as F
from purelayers.functional._recurrent_steps import KINDS, Kind
from purelayers.functional.recurrent import suffix
from purelayers.init import Initializer
from purelayers.layers._checks import (
    LayerError,
    as_shape,
    check_choice,
    check_float,
    check_int,
    need_key,
    need_known_in_range,
    need_width,
)
from purelayers.layers.cells import (
    check_common,
    compute_dtype,
    init_cell,
    need_input_size,
    need_state_shape,
    param_shapes,
)
from purelayers.layers.core import Layer, Params
from purelayers.layers.dropout import dropout

__all__ = ["GRU", "LSTM", "RNN"]


@dataclasses.dataclass(frozen=True)
class _Recurrent(Layer):
    """Shared implementation of ``RNN``, ``LSTM`` and ``GRU``."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    @property
    def kind(self) -> Kind:
        raise NotImplementedError(f"{type(self).__name__}: a subclass defines kind")

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    def __post_init__(self):
        name = type(self).__name__
        check_common(name, self)
        for arg in ("num_layers", "unroll"):
            check_int(name, arg, getattr(self, arg))
        check_float(name, "dropout", self.dropout, low=0.0, high=1.0)
        if self.dropout > 0 and self.num_layers == 1:
            warnings.warn(
                f"{name}: dropout={self.dropout} acts between layers and has no effect with "
                "num_layers=1",
                stacklevel=3,
            )

    @property
    def _proj(self) -> int:
        return getattr(self, "proj_size", 0)

    @property
    def _out_size(self) -> int:
        """The width of ``h``: ``proj_size`` where an LSTM projects, else ``hidden_size``."""
        return self._proj or self.hidden_size

    def own_names(self) -> tuple[str, ...]:
        """Checkpoint names in torch's ``state_dict`` order (``weight_ih_l0``, ...)."""
        base = list(param_shapes(self.kind, 1, 2, self.bias, min(self._proj, 1)))
        return tuple(
            n + suffix(layer, d)
            for layer in range(self.num_layers)
            for d in range(self.directions)
            for n in base
        )

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        shape = as_shape(shape)
        if len(shape) not in (2, 3):
            raise LayerError(
                type(self).__name__,
                "input rank",
                f"2 or 3 ({self._layouts})",
                f"{len(shape)} (shape {shape})",
            )
        params: Params = {}
        width = need_width(
            type(self).__name__, "input_size (input last axis)", shape[-1], "torch's RNNs refuse 0"
        )
        for layer in range(self.num_layers):
            for d in range(self.directions):
                i = layer * self.directions + d
                params.update(
                    init_cell(
                        self, self.kind, jax.random.fold_in(key, i), width, dtype, suffix(layer, d)
                    )
                )
            width = self._out_size * self.directions
        return params

    @property
    def _layouts(self) -> str:
        return "(B, T, input) or (T, input)" if self.batch_first else "(T, B, input) or (T, input)"

    def apply(
        self,
        params: Params,
        x: Any,
        hx: Any = None,
        *,
        key: jax.Array | None = None,
        train: bool = False,
        lengths: Any = None,
    ) -> tuple[jax.Array, Any]:
        name = type(self).__name__
        if jnp.ndim(x) not in (2, 3):
            raise LayerError(
                name,
                "input rank",
                f"2 or 3 ({self._layouts})",
                f"{jnp.ndim(x)} (x.shape == {tuple(jnp.shape(x))})",
            )
        width = params["weight_ih_l0"].shape[1]
        need_input_size(name, x, width, f"{name} was initialized for {width} input features")
        use_dropout = train and self.dropout > 0 and self.num_layers > 1
        if use_dropout:
            need_key(name, key)
        dtype = compute_dtype(x, params)
        given = tuple(jnp.shape(x))
        batched = jnp.ndim(x) == 3
        x = jnp.asarray(x, dtype)
        x = (x.swapaxes(0, 1) if self.batch_first else x) if batched else x[:, None]
        batch = x.shape[1]
        if x.shape[0] == 0:
            raise LayerError(
                name,
                "sequence length",
                "at least 1 (torch's RNNs refuse empty sequences too)",
                f"0 (x.shape == {given})",
            )
        states = self._initial_state(hx, batch, batched, dtype)
        lengths = self._lengths(lengths, batch, batched, x.shape[0])
        finals = []
        d = self.directions
        for layer in range(self.num_layers):
            if layer and use_dropout:
                x = dropout(x, self.dropout, jax.random.fold_in(key, layer), layer=name)
            layer_state = tuple(s[layer * d : (layer + 1) * d] for s in states)
            x, final = F.recurrent_layer(
                self.kind, params, x, layer_state, lengths, layer_index=layer, directions=d,
                unroll=self.unroll, reference=not self.custom_derivative, proj=self._proj > 0,
            )  # fmt: skip
            finals.append(final)
        h_n = tuple(jnp.concatenate(parts, axis=0) for parts in zip(*finals, strict=True))
        if isinstance(lengths, jax.core.Tracer):
            # unknown while tracing: a sequence whose length is outside [1, T] comes out
            # NaN (pl.debug.checked then raises), never as another length's result
            bad = (lengths < 1) | (lengths > x.shape[0])
            x = jnp.where(bad[None, :, None], jnp.nan, x)
            h_n = tuple(jnp.where(bad[None, :, None], jnp.nan, h) for h in h_n)
        if batched:
            out = x.swapaxes(0, 1) if self.batch_first else x
        else:
            out, h_n = x[:, 0], tuple(h[:, 0] for h in h_n)
        return out, (h_n if self.kind.states == 2 else h_n[0])

    def _initial_state(self, hx: Any, batch: int, batched: bool, dtype: Any) -> tuple:
        name, n = type(self).__name__, self.kind.states
        lead = (self.num_layers * self.directions, batch)
        widths = (self._out_size, self.hidden_size)[:n]  # h (P with a projection), c
        if hx is None:
            return tuple(jnp.zeros((*lead, w), dtype) for w in widths)
        if n == 2 and not (isinstance(hx, (tuple, list)) and len(hx) == 2):
            raise LayerError(name, "hx", "a pair (h_0, c_0)", type(hx).__name__)
        if n == 1 and isinstance(hx, (tuple, list)):
            raise LayerError(
                name, "hx", "one array h_0 (it has no cell state)", f"a {type(hx).__name__}"
            )
        parts = (hx,) if n == 1 else tuple(hx)
        out = []
        for what, h, w in zip(("h_0", "c_0")[:n], parts, widths, strict=True):
            need_state_shape(name, what, h, (*lead, w) if batched else (lead[0], w))
            h = jnp.asarray(h, dtype)
            out.append(h if batched else h[:, None])
        return tuple(out)

    def _lengths(self, lengths: Any, batch: int, batched: bool, steps: int) -> jax.Array | None:
        if lengths is None:
            return None
        if isinstance(lengths, (list, tuple)):  # as torch takes a list of lengths
            lengths = np.asarray(lengths)
        name = type(self).__name__
        expected = (batch,) if batched else ()
        if tuple(jnp.shape(lengths)) != expected:
            raise LayerError(
                name,
                "lengths shape",
                expected,
                tuple(jnp.shape(lengths)),
                "one length per sequence in the batch",
            )
        if not jnp.issubdtype(jnp.result_type(lengths), jnp.integer):
            raise LayerError(name, "lengths dtype", "an integer dtype", jnp.result_type(lengths))
        need_known_in_range(
            name,
            "lengths",
            lengths,
            1,
            steps,
            f"in [1, {steps}] (the sequence length; as torch's pack_padded_sequence)",
        )
        return jnp.asarray(lengths, jnp.int32).reshape(batch)


@dataclasses.dataclass(frozen=True)
class LSTM(_Recurrent):
    r"""Stacked LSTM: ``(h_t, c_t) = LSTMCell(x_t, (h_{t-1}, c_{t-1}))`` per layer and direction.

    Matches ``torch.nn.LSTM(input_size, hidden_size, ...)``; the input width comes from
    ``init``'s shape. Each layer and direction runs the ``LSTMCell`` recurrence (gate
    order input, forget, cell, output) over time. ``apply(params, x, hx=None, *,
    key=None, train=False, lengths=None)`` returns ``(output, (h_n, c_n))``.

    Args:
      hidden_size: width ``H`` of each direction's state (required).
      num_layers: stacked layers; layer ``l > 0`` reads layer ``l - 1``'s output
        (keyword-only, as every argument below). Default ``1``.
      bias: learn the biases. Default ``True``.
      batch_first: input and output are ``(B, T, *)`` instead of ``(T, B, *)``; the
        states stay ``(num_layers * D, B, H)``, as in torch. Default ``False``.
      dropout: probability of dropping each output of every layer but the last, in
        train mode (``key`` required). Default ``0.0``.
      bidirectional: add a reverse-time direction per layer (``D = 2``); the output is
        the two directions' states concatenated. Default ``False``.
      proj_size: if ``P > 0``, each step's ``h`` is projected to width ``P``, as torch:
        ``h_t = (o * tanh(c_t)) @ weight_hr.T``, which then feeds the recurrence
        (``weight_hh`` is ``(4H, P)``), the output and the next layer, while ``c`` keeps
        width ``H``. Must be smaller than ``hidden_size``. The derivative is then JAX's
        own of the scan (``custom_derivative`` does not apply). Default ``0`` (none).
      forget_bias: if set, every forget-gate bias starts as in ``LSTMCell``. Default
        ``None``.
      weight_init: initializer for all weights (``weight_hr`` included). Default ``None``: the
        uniform init below.
      bias_init: initializer for all biases. Default ``None``: the uniform init below.
      unroll: time steps per iteration of the ``lax.scan`` over time (capped at ``T``).
        Same results for any value. Default ``1``.
      custom_derivative: differentiate with the written-out derivative of the
        recurrence (``F.recurrent_layer``) rather than JAX's own derivative of the scan
        (``F.recurrent_layer_reference``). Both are exact (equal to round-off); ``False``
        is for comparison and benchmarks. Default ``True``.

    Shape:
      ``x``: ``(T, B, I)`` (``(B, T, I)`` with ``batch_first``) or unbatched ``(T, I)``.
      ``hx``: ``(h_0, c_0)``, each ``(num_layers * D, B, H)`` (unbatched
      ``(num_layers * D, H)``; ``h_0`` has width ``P`` with ``proj_size``); zeros when
      omitted. ``output``: ``(T, B, D * H)`` (``D * P`` with ``proj_size``; batch-first
      or unbatched like ``x``); ``h_n``, ``c_n`` like ``h_0``, ``c_0``, ordered layer by
      layer, forward before reverse.

    Padded batches: ``lengths`` ``(B,)`` integers (``()`` unbatched) gives each
    sequence's true length ``1 <= lengths[b] <= T``; steps past it leave the state
    unchanged, so ``h_n`` is each sequence's state after its own last step, the reverse
    direction starts at each sequence's own last step, and ``output`` is zero past the
    length. This is what ``torch.nn.utils.rnn.pack_padded_sequence`` followed by
    ``pad_packed_sequence`` gives (for ``T == max(lengths)``). A length outside
    ``[1, T]`` is an error, as in torch: eagerly a ``LayerError`` names it; under
    ``jit``, ``vmap`` or ``grad`` the lengths are not known while tracing, so that
    sequence's output and final state come out NaN (never another length's result), and
    ``pl.debug.checked(lstm.apply)`` turns that into a ``CheckError``, as for
    ``Embedding``'s ids. An empty sequence (``T == 0``) is refused, as torch does.

    Parameters:
      per layer ``l``, then the same with suffix ``_reverse`` when bidirectional:
      ``weight_ih_l{l}`` ``(4H, I)`` (``I = D * H`` for ``l > 0``), ``weight_hh_l{l}``
      ``(4H, H)``, ``bias_ih_l{l}`` ``(4H,)``, ``bias_hh_l{l}`` ``(4H,)``, then with
      ``proj_size`` ``weight_hr_l{l}`` ``(P, H)`` (and ``weight_hh_l{l}`` ``(4H, P)``,
      ``I = D * P`` for ``l > 0``); all ``U(-1/sqrt(H), 1/sqrt(H))``.

    Example:
      >>> lstm = LSTM(8, num_layers=2)
      >>> params = lstm.init(jax.random.key(0), (5, 3, 4))
      >>> out, (h, c) = lstm.apply(params, jnp.ones((5, 3, 4)))
      >>> out.shape, h.shape
      ((5, 3, 8), (2, 3, 8))
    """

    hidden_size: int
    _: dataclasses.KW_ONLY
    num_layers: int = 1
    bias: bool = True
    batch_first: bool = False
    dropout: float = 0.0
    bidirectional: bool = False
    proj_size: int = 0
    forget_bias: float | None = None
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None
    unroll: int = 1
    custom_derivative: bool = True

    def __post_init__(self):
        super().__post_init__()
        check_int("LSTM", "proj_size", self.proj_size, minimum=0)
        if self.proj_size >= self.hidden_size:
            raise ValueError(
                f"LSTM: proj_size must be smaller than hidden_size, got proj_size="
                f"{self.proj_size!r} with hidden_size={self.hidden_size!r} (torch: proj_size "
                "has to be smaller than hidden_size)"
            )

    @property
    def kind(self) -> Kind:
        return KINDS["lstm"]


@dataclasses.dataclass(frozen=True)
class GRU(_Recurrent):
    r"""A multi-layer GRU over a sequence: ``h_t = GRUCell(x_t, h_{t-1})`` per layer and direction.

    Matches ``torch.nn.GRU(input_size, hidden_size, ...)``; the input width comes from
    ``init``'s shape. Each layer and direction runs the ``GRUCell`` recurrence (gate
    order reset, update, new) over time. ``apply(params, x, hx=None, *, key=None,
    train=False, lengths=None)`` returns ``(output, h_n)``.

    Args:
      hidden_size: width ``H`` of each direction's state (required).
      num_layers: stacked layers; layer ``l > 0`` reads layer ``l - 1``'s output
        (keyword-only, as every argument below). Default ``1``.
      bias: learn the biases. Default ``True``.
      batch_first: input and output are ``(B, T, *)`` instead of ``(T, B, *)``; the
        states stay ``(num_layers * D, B, H)``, as in torch. Default ``False``.
      dropout: probability of dropping each output of every layer but the last, in
        train mode (``key`` required). Default ``0.0``.
      bidirectional: add a reverse-time direction per layer (``D = 2``); the output is
        the two directions' states concatenated. Default ``False``.
      reset_after: ``True`` (torch's) or ``False``, Cho et al.'s recurrence with its own
        parameter names, as ``GRUCell(reset_after=False)``. Default ``True``.
      weight_init: initializer for all weights. Default ``None``: the
        uniform init below.
      bias_init: initializer for all biases. Default ``None``: the uniform init below.
      unroll: time steps per iteration of the ``lax.scan`` over time (capped at ``T``).
        Same results for any value. Default ``1``.
      custom_derivative: accepted for symmetry with ``LSTM``; a GRU always takes JAX's
        derivative of its scan. Default ``True``.

    Shape:
      ``x``: ``(T, B, I)`` (``(B, T, I)`` with ``batch_first``) or unbatched ``(T, I)``.
      ``hx``: ``h_0`` ``(num_layers * D, B, H)`` (unbatched ``(num_layers * D, H)``);
      zeros when omitted. ``output``: ``(T, B, D * H)`` (batch-first or unbatched like
      ``x``); ``h_n`` like ``h_0``, ordered layer by layer, forward before reverse.

    Padded batches: ``lengths`` ``(B,)`` integers (``()`` unbatched) gives each
    sequence's true length ``1 <= lengths[b] <= T``; steps past it leave the state
    unchanged, so ``h_n`` is each sequence's state after its own last step, the reverse
    direction starts at each sequence's own last step, and ``output`` is zero past the
    length. This is what ``torch.nn.utils.rnn.pack_padded_sequence`` followed by
    ``pad_packed_sequence`` gives (for ``T == max(lengths)``). A length outside
    ``[1, T]`` is an error, as in torch: eagerly a ``LayerError`` names it; under
    ``jit``, ``vmap`` or ``grad`` the lengths are not known while tracing, so that
    sequence's output and final state come out NaN (never another length's result), and
    ``pl.debug.checked(gru.apply)`` turns that into a ``CheckError``, as for
    ``Embedding``'s ids. An empty sequence (``T == 0``) is refused, as torch does.

    Parameters:
      per layer ``l``, then the same with suffix ``_reverse`` when bidirectional:
      ``weight_ih_l{l}`` ``(3H, I)`` (``I = D * H`` for ``l > 0``), ``weight_hh_l{l}``
      ``(3H, H)``, ``bias_ih_l{l}`` ``(3H,)``, ``bias_hh_l{l}`` ``(3H,)`` (with
      ``reset_after=False`` the ``hh`` pair is ``GRUCell``'s four ``hh_rz`` / ``hh_n``
      arrays); all ``U(-1/sqrt(H), 1/sqrt(H))``.

    Example:
      >>> gru = GRU(8, batch_first=True, bidirectional=True)
      >>> params = gru.init(jax.random.key(0), (3, 5, 4))
      >>> out, h = gru.apply(params, jnp.ones((3, 5, 4)))
      >>> out.shape, h.shape
      ((3, 5, 16), (2, 3, 8))
    """

    hidden_size: int
    _: dataclasses.KW_ONLY
    num_layers: int = 1
    bias: bool = True
    batch_first: bool = False
    dropout: float = 0.0
    bidirectional: bool = False
    reset_after: bool = True
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None
    unroll: int = 1
    custom_derivative: bool = True

    @property
    def kind(self) -> Kind:
        return KINDS["gru" if self.reset_after else "gru_reset_before"]


@dataclasses.dataclass(frozen=True)
class RNN(_Recurrent):
    r"""A multi-layer Elman RNN: ``h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)`` per layer.

    Matches ``torch.nn.RNN(input_size, hidden_size, ...)``; the input width comes from
    ``init``'s shape. ``apply(params, x, hx=None, *, key=None, train=False,
    lengths=None)`` returns ``(output, h_n)``.

    Args:
      hidden_size: width ``H`` of each direction's state (required).
      nonlinearity: ``act``, ``"tanh"`` or ``"relu"`` (keyword-only, as every argument
        below). Default ``"tanh"``.
      num_layers: stacked layers; layer ``l > 0`` reads layer ``l - 1``'s output.
        Default ``1``.
      bias: learn the biases. Default ``True``.
      batch_first: input and output are ``(B, T, *)`` instead of ``(T, B, *)``; the
        states stay ``(num_layers * D, B, H)``, as in torch. Default ``False``.
      dropout: probability of dropping each output of every layer but the last, in
        train mode (``key`` required). Default ``0.0``.
      bidirectional: add a reverse-time direction per layer (``D = 2``); the output is
        the two directions' states concatenated. Default ``False``.
      weight_init: initializer for all weights. Default ``None``: the
        uniform init below.
      bias_init: initializer for all biases. Default ``None``: the uniform init below.
      unroll: time steps per iteration of the ``lax.scan`` over time (capped at ``T``).
        Same results for any value. Default ``1``.
      custom_derivative: use the written-out derivative of the recurrence rather than
        JAX's derivative of the scan (both exact). Default ``True``.

    Shape:
      ``x``: ``(T, B, I)`` (``(B, T, I)`` with ``batch_first``) or unbatched ``(T, I)``.
      ``hx``: ``h_0`` ``(num_layers * D, B, H)`` (unbatched ``(num_layers * D, H)``);
      zeros when omitted. ``output``: ``(T, B, D * H)`` (batch-first or unbatched like
      ``x``); ``h_n`` like ``h_0``, ordered layer by layer, forward before reverse.

    Padded batches: ``lengths`` ``(B,)`` integers (``()`` unbatched) gives each
    sequence's true length ``1 <= lengths[b] <= T``; steps past it leave the state
    unchanged, so ``h_n`` is each sequence's state after its own last step, the reverse
    direction starts at each sequence's own last step, and ``output`` is zero past the
    length. This is what ``torch.nn.utils.rnn.pack_padded_sequence`` followed by
    ``pad_packed_sequence`` gives (for ``T == max(lengths)``). A length outside
    ``[1, T]`` is an error, as in torch: eagerly a ``LayerError`` names it; under
    ``jit``, ``vmap`` or ``grad`` the lengths are not known while tracing, so that
    sequence's output and final state come out NaN (never another length's result), and
    ``pl.debug.checked(rnn.apply)`` turns that into a ``CheckError``, as for
    ``Embedding``'s ids. An empty sequence (``T == 0``) is refused, as torch does.

    Parameters:
      per layer ``l``, then the same with suffix ``_reverse`` when bidirectional:
      ``weight_ih_l{l}`` ``(H, I)`` (``I = D * H`` for ``l > 0``), ``weight_hh_l{l}``
      ``(H, H)``, ``bias_ih_l{l}`` ``(H,)``, ``bias_hh_l{l}`` ``(H,)``; all
      ``U(-1/sqrt(H), 1/sqrt(H))``.

    Example:
      >>> rnn = RNN(8, nonlinearity="relu")
      >>> params = rnn.init(jax.random.key(0), (5, 4))
      >>> out, h = rnn.apply(params, jnp.ones((5, 4)))
      >>> out.shape, h.shape
      ((5, 8), (1, 8))
    """

    hidden_size: int
    _: dataclasses.KW_ONLY
    nonlinearity: str = "tanh"
    num_layers: int = 1
    bias: bool = True
    batch_first: bool = False
    dropout: float = 0.0
    bidirectional: bool = False
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None
    unroll: int = 1
    custom_derivative: bool = True

    def __post_init__(self):
        check_choice("RNN", "nonlinearity", self.nonlinearity, ("tanh", "relu"))
        super().__post_init__()

    @property
    def kind(self) -> Kind:
        return KINDS["rnn_" + self.nonlinearity]
