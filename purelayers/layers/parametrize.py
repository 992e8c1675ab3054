r"""Parametrizations: ``WeightNorm`` and ``SpectralNorm``, wrappers that compute one array
of a layer (its ``weight``, say) from other arrays on every call.

The names are those of ``torch.nn.utils.parametrizations``: the computed array leaves
the layer's own names and its sources appear under
``parametrizations.<name>.original*`` (buffers under ``parametrizations.<name>.0.*``),
after the layer's other arrays and children, so the ``state_dict`` of
``weight_norm(torch.nn.Linear(5, 4))`` loads by name::

    bias, parametrizations.weight.original0, parametrizations.weight.original1

``apply`` rebuilds the layer's params with the computed array and runs the layer's own
``apply`` on them, so any layer with a parameter of that name can be wrapped (``Linear``,
``Conv*``, ``ConvTranspose*``, ``Embedding``, an ``LSTM``'s ``weight_hh_l0``, ...).
Errors raised by the wrapped layer name it inside the wrapper
(``WeightNorm(Linear): input last axis expected 5, got 4``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from purelayers.layers._checks import LayerError, check_float, check_int, promote_float
from purelayers.layers.conv import _ConvTransposeNd
from purelayers.layers.core import Layer, Params, State, unchecked

__all__ = ["SpectralNorm", "WeightNorm"]

_P = "parametrizations"
# torch's constructor runs 15 power iterations, then one forward pass in training mode
_WARMUP = 15


def _l2(x: jax.Array, axes: tuple[int, ...] | None = None, keepdims: bool = False) -> jax.Array:
    """The 2-norm over ``axes`` (all by default); its derivative at zero is zero, as
    torch's ``norm`` backward makes it."""
    sq = jnp.sum(x * x, axis=axes, keepdims=keepdims)
    positive = sq > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1)), 0)


def _normalize(x: jax.Array, eps: float) -> jax.Array:
    """``torch.nn.functional.normalize(x, dim=0, eps=eps)``: ``x / max(||x||, eps)``,
    with torch's ``clamp_min`` derivative (the norm's side wins the tie)."""
    n = _l2(x)
    return x / jnp.where(n >= eps, n, eps)


def _power_method(mat: jax.Array, u: jax.Array, v: jax.Array, n: int, eps: float):
    """``n`` steps of ``u = normalize(W v)``, ``v = normalize(W^T u)``, as torch's
    ``_SpectralNorm._power_method`` (no derivative flows through them)."""
    mat, u, v = lax.stop_gradient((mat, u, v))

    def step(_, uv):
        u = _normalize(mat @ uv[1], eps)
        return u, _normalize(mat.T @ u, eps)

    return lax.fori_loop(0, n, step, (u, v))


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5, 6))
def _start(key, original, rows: int, hw: tuple[int, int], steps: int, eps: float, dtype: Any):
    """``SpectralNorm``'s initial ``u``, ``v``: ``normalize`` of normal draws from ``key``
    (of ones without one), then ``steps`` power iterations on ``original`` (if given).
    One compiled program per configuration, not one per operation."""
    if key is None:
        u, v = jnp.ones(hw[:1], dtype), jnp.ones(hw[1:], dtype)
    else:
        ku, kv = jax.random.split(key)
        u, v = jax.random.normal(ku, hw[:1], dtype), jax.random.normal(kv, hw[1:], dtype)
    u, v = _normalize(u, eps), _normalize(v, eps)
    if original is None:
        return u, v
    return _power_method(_matrix(original.astype(dtype), rows), u, v, steps, eps)


def _matrix(w: jax.Array, dim: int) -> jax.Array:
    """``w`` with axis ``dim`` first, flattened to ``(w.shape[dim], rest)``, as torch's
    ``_reshape_weight_to_matrix``."""
    rest = math.prod(s for i, s in enumerate(w.shape) if i != dim)
    return jnp.moveaxis(w, dim, 0).reshape(w.shape[dim], rest)


# -- torch's submodules, as nodes of the checkpoint tree ---------------------------------


@dataclasses.dataclass(frozen=True)
class _Node(Layer):
    """A torch submodule that only holds arrays: its own names and its children, so
    params checks, ``ordered`` and error paths follow torch's module tree."""

    names: tuple[str, ...] = ()
    kids: tuple[tuple[str, Layer], ...] = ()

    def own_names(self) -> tuple[str, ...]:
        return self.names

    def children(self) -> dict[str, Layer]:
        return dict(self.kids)


class ModuleDict(_Node):
    """torch's ``parametrizations``: one entry per parametrized array."""


class ParametrizationList(_Node):
    """torch's ``parametrizations.<name>``: the original array(s), then the
    parametrization as child ``0``."""


class _WeightNorm(_Node):
    """torch's weight-norm parametrization (no arrays of its own)."""


class _SpectralNorm(_Node):
    """torch's spectral-norm parametrization: the power-iteration buffers ``_u``, ``_v``."""


# -- the shared wrapper ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Parametrized(Layer):
    """What ``WeightNorm`` and ``SpectralNorm`` share: the wrapped layer's names, the
    params split, and the wrapped layer's errors renamed."""

    _originals: ClassVar[tuple[str, ...]] = ()
    _buffers: ClassVar[tuple[str, ...]] = ()
    _kind: ClassVar[type[_Node]] = _Node

    layer: Layer
    name: str = "weight"

    def _check_wrapped(self) -> None:
        me = type(self).__name__
        if not isinstance(self.layer, Layer):
            raise ValueError(f"{me}: layer must be a Layer, got {self.layer!r}")
        own = self.layer.own_names()
        if not isinstance(self.name, str) or self.name not in own:
            raise ValueError(
                f"{me}: name must be one of {type(self.layer).__name__}'s own parameters "
                f"{own}, got {self.name!r}"
            )
        if _P in self.layer.children():
            raise ValueError(
                f"{me}: {type(self.layer).__name__} is parametrized already (it has "
                f"'{_P}'); one parametrization per layer is supported"
            )

    def _check_dim(self) -> None:
        if self.dim is not None:
            check_int(type(self).__name__, "dim", self.dim, minimum=-(2**31))

    @property
    def accepts(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.layer.accepts

    @property
    def takes_ids(self) -> bool:
        return self.layer.takes_ids

    def own_names(self) -> tuple[str, ...]:
        return tuple(n for n in self.layer.own_names() if n != self.name)

    def _node(self) -> Layer:
        """torch's ``parametrizations.<name>`` module: the originals, the buffers."""
        return ParametrizationList(self._originals, (("0", self._kind(self._buffers)),))

    def children(self) -> dict[str, Layer]:
        return {**self.layer.children(), _P: ModuleDict(kids=((self.name, self._node()),))}

    def aliases(self) -> dict[str, str]:
        return self.layer.aliases()

    def _weight(self, params: Params) -> jax.Array:
        """The wrapped layer's array ``name`` from its freshly built params."""
        if self.name not in params:
            raise LayerError(
                type(self).__name__,
                f"{type(self.layer).__name__} builds no parameter {self.name!r}",
                None,
                None,
                f"its params are {sorted(params)} (a buffer cannot be parametrized)",
            )
        return params[self.name]

    def _axis(self, ndim: int, dim: int) -> int:
        """``dim`` as an axis of a ``ndim``-axis array."""
        if not -ndim <= dim < ndim:
            raise LayerError(
                type(self).__name__,
                f"dim for the {ndim}-axis {self.name!r}",
                f"an axis in [{-ndim}, {ndim - 1}]",
                dim,
            )
        return dim % ndim

    def _pack(self, params: Params, parts: dict[str, Any]) -> Params:
        rest = {k: v for k, v in params.items() if k != self.name}
        return self.ordered({**rest, _P: {self.name: parts}})

    def _split(self, params: Params) -> tuple[Params, Params]:
        """The wrapped layer's other entries, and ``parametrizations.<name>``."""
        rest = {k: v for k, v in params.items() if k != _P}
        return rest, params[_P][self.name]

    def _run(self, params: Params, x: Any, *args: Any, **kwargs: Any) -> Any:
        try:  # the wrapper's tree was checked: the layer runs unchecked
            return unchecked(self.layer)(params, x, *args, **kwargs)
        except LayerError as e:
            raise _inside(type(self).__name__, e) from None


def _inside(wrapper: str, e: LayerError) -> LayerError:
    """``e``, raised by the wrapped layer, naming it inside ``wrapper``:
    ``WeightNorm(Linear): ...``, or ``WeightNorm(InProjAttention)[out_proj] Linear: ...``."""
    if e.path:
        return LayerError(
            e.layer, e.what, e.expected, e.got, e.hint, path=e.path, root=f"{wrapper}({e.root})"
        )
    return LayerError(f"{wrapper}({e.layer})", e.what, e.expected, e.got, e.hint)


@dataclasses.dataclass(frozen=True)
class WeightNorm(_Parametrized):
    r"""Weight normalization of ``layer``'s parameter ``name``:
    ``weight = g * v / ||v||``, the norm over every axis but ``dim``.

    The direction ``v`` and the magnitude ``g`` are learned separately (Salimans and
    Kingma, 2016). Matches ``torch.nn.utils.parametrizations.weight_norm(module, name,
    dim)``; with ``legacy_names=True``, the older ``torch.nn.utils.weight_norm``.

    Args:
      layer: the layer whose parameter is computed (``Linear``, ``Conv2d``, ...).
      name: which of ``layer``'s parameters. Default ``"weight"``.
      dim: the axis of ``name`` that keeps one norm per index (``0``: one per output
        unit or channel, in torch's ``[out, in, ...]`` layout). ``None`` takes one norm
        over the whole array; so does ``-1``, as in torch (another negative ``dim``
        counts from the end). Default ``0``.
      legacy_names: name the two arrays ``<name>_g`` and ``<name>_v`` among ``layer``'s
        own parameters, as the deprecated ``torch.nn.utils.weight_norm`` did. Default
        ``False``.

    Shape:
      whatever ``layer`` takes and returns; ``apply``'s keyword arguments (``key``,
      ``train``, ``state``, ...) pass through to it.

    Parameters:
      ``parametrizations.<name>.original0``: ``g``, the shape of ``name`` with every axis
      but ``dim`` of size 1 (``()`` for the whole array); initialized to ``||w||`` of
      ``layer``'s initial ``w``. ``parametrizations.<name>.original1``: ``v``, the shape
      of ``name``; initialized to ``w`` (so the initial weight is ``layer``'s). The rest
      of ``layer``'s params keep their names, before these.

    Example:
      >>> wn = WeightNorm(L.Linear(3))
      >>> params = wn.init(jax.random.key(0), (2, 4))
      >>> jax.tree.map(jnp.shape, pl.params.flatten(params))
      {'bias': (3,), 'parametrizations.weight.original0': (3, 1), 'parametrizations.weight.original1': (3, 4)}
    """

    _originals: ClassVar[tuple[str, ...]] = ("original0", "original1")
    _kind: ClassVar[type[_Node]] = _WeightNorm

    dim: int | None = 0
    _: dataclasses.KW_ONLY
    legacy_names: bool = False

    def __post_init__(self):
        self._check_wrapped()
        self._check_dim()

    @property
    def _legacy(self) -> tuple[str, str]:
        return f"{self.name}_g", f"{self.name}_v"

    def own_names(self) -> tuple[str, ...]:
        own = super().own_names()
        return own + self._legacy if self.legacy_names else own

    def children(self) -> dict[str, Layer]:
        return self.layer.children() if self.legacy_names else super().children()

    def _norm_axes(self, ndim: int) -> tuple[int, ...] | None:
        """The axes the norm runs over; None for the whole array (torch's -1 too)."""
        if self.dim is None or self.dim == -1:
            return None
        axis = self._axis(ndim, self.dim)
        return tuple(i for i in range(ndim) if i != axis)

    def _norm(self, v: jax.Array) -> jax.Array:
        axes = self._norm_axes(v.ndim)
        return _l2(v.astype(promote_float(v.dtype)), axes, keepdims=axes is not None)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        params = self.layer.init(key, shape, dtype)
        w = self._weight(params)
        g = self._norm(w).astype(w.dtype)
        if self.legacy_names:
            rest = {k: v for k, v in params.items() if k != self.name}
            g_name, v_name = self._legacy
            return self.ordered({**rest, g_name: g, v_name: w})
        return self._pack(params, {"original0": g, "original1": w})

    def init_state(self, shape: Any, dtype: Any = jnp.float32) -> State:
        return self.layer.init_state(shape, dtype)

    def weight(self, params: Params) -> jax.Array:
        """The computed ``g * v / ||v||`` (``layer``'s ``name``) from ``params``."""
        if self.legacy_names:
            g, v = (params[n] for n in self._legacy)
        else:
            parts = params[_P][self.name]
            g, v = parts["original0"], parts["original1"]
        vf = v.astype(promote_float(v.dtype))
        return (vf * (g.astype(vf.dtype) / self._norm(v))).astype(v.dtype)

    def apply(self, params: Params, x: Any, *args: Any, **kwargs: Any) -> Any:
        """``layer.apply`` with ``name`` computed from ``g`` and ``v``."""
        drop = set(self._legacy) if self.legacy_names else {_P}
        rest = {k: v for k, v in params.items() if k not in drop}
        call = {**rest, self.name: self.weight(params)}
        state = kwargs.pop("state", None)
        if state is None:
            return self._run(call, x, *args, **kwargs)
        if state:  # the wrapped layer's buffers
            return self._run(call, x, *args, state=state, **kwargs)
        return self._run(call, x, *args, **kwargs), {}


@dataclasses.dataclass(frozen=True)
class SpectralNorm(_Parametrized):
    r"""Spectral normalization of ``layer``'s parameter ``name``: ``weight = W / sigma``
    with ``sigma = u^T W v`` estimating ``W``'s largest singular value.

    ``W`` is viewed as a matrix with axis ``dim`` as its rows (the other axes flattened,
    in order). ``u`` and ``v`` are buffers: with ``train=True`` each call first runs
    ``n_power_iterations`` steps ``u = normalize(W v)``, ``v = normalize(W^T u)``
    (``normalize(a) = a / max(||a||, eps)``) and returns them as the new state; with
    ``train=False`` the stored ones are used. As in torch, no derivative flows through
    the power iterations: in training mode ``u`` and ``v`` are constants of the
    gradient. A one-axis ``W`` needs no estimate: ``weight = normalize(W)``, and there
    are no buffers. Matches ``torch.nn.utils.parametrizations.spectral_norm(module,
    name, n_power_iterations, eps, dim)`` in the same mode.

    Args:
      layer: the layer whose parameter is computed.
      name: which of ``layer``'s parameters. Default ``"weight"``.
      n_power_iterations: power-iteration steps per training call; positive. Default
        ``1``.
      eps: the floor of the norms in ``normalize``; ``>= 0``. Default ``1e-12``.
      dim: the axis of ``W`` that indexes the matrix's rows. Default ``None``: torch's
        rule, ``1`` for ``ConvTranspose1d/2d/3d`` (whose weight is ``[in, out, ...]``)
        and ``0`` otherwise.

    Shape:
      whatever ``layer`` takes and returns; other keyword arguments (``key``, ...) pass
      through to it. With buffers, ``apply(params, x, state=state, train=...)`` returns
      ``(y, new_state)``.

    Parameters:
      ``parametrizations.<name>.original``: ``W``, ``layer``'s initial ``name`` (the rest
      of ``layer``'s params keep their names, before it).

    State:
      ``parametrizations.<name>.0._u``: ``(rows,)`` and ``parametrizations.<name>.0._v``:
      ``(columns,)``, both unit vectors. ``init_state(shape, params=params, key=key)``
      is torch's start: ``normalize`` of standard normal draws from ``key``, then
      ``15 + n_power_iterations`` power iterations on ``params``' ``W`` (torch's
      constructor runs 15, then one training-mode forward pass). Without ``key`` the
      start vectors are ``normalize(ones)``; without ``params`` no iterations run yet,
      so ``sigma`` is only an estimate after a training call.

    Example:
      >>> sn = SpectralNorm(L.Linear(3))
      >>> params = sn.init(jax.random.key(0), (2, 4))
      >>> state = sn.init_state((2, 4), params=params, key=jax.random.key(1))
      >>> y, state = sn.apply(params, jnp.ones((2, 4)), state=state, train=True)
      >>> jax.tree.map(jnp.shape, pl.params.flatten(state))
      {'parametrizations.weight.0._u': (3,), 'parametrizations.weight.0._v': (4,)}
    """

    _originals: ClassVar[tuple[str, ...]] = ("original",)
    _buffers: ClassVar[tuple[str, ...]] = ("_u", "_v")
    _kind: ClassVar[type[_Node]] = _SpectralNorm

    n_power_iterations: int = 1
    eps: float = 1e-12
    dim: int | None = None

    def __post_init__(self):
        self._check_wrapped()
        check_int("SpectralNorm", "n_power_iterations", self.n_power_iterations)
        check_float("SpectralNorm", "eps", self.eps, low=0.0)
        self._check_dim()

    def _row_axis(self, ndim: int) -> int:
        default = 1 if isinstance(self.layer, _ConvTransposeNd) else 0
        return self._axis(ndim, default if self.dim is None else self.dim)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        params = self.layer.init(key, shape, dtype)
        w = self._weight(params)
        if w.ndim > 1:
            self._row_axis(w.ndim)
        return self._pack(params, {"original": w})

    def init_state(
        self,
        shape: Any,
        dtype: Any = jnp.float32,
        *,
        params: Params | None = None,
        key: jax.Array | None = None,
    ) -> State:
        """``layer``'s buffers and ``u``, ``v`` (see the class's State section)."""
        state = self.layer.init_state(shape, dtype)
        spec = self._weight(
            jax.eval_shape(lambda: self.layer.init(jax.random.key(0), shape, dtype))
        )
        if len(spec.shape) <= 1:
            return state
        rows = self._row_axis(len(spec.shape))
        h = spec.shape[rows]
        w = math.prod(s for i, s in enumerate(spec.shape) if i != rows)
        original = None
        if params is not None:
            original = self._split(params)[1]["original"]
            if tuple(jnp.shape(original)) != tuple(spec.shape):
                raise LayerError(
                    "SpectralNorm",
                    f"init_state: params' {_P}.{self.name}.original shape",
                    tuple(spec.shape),
                    tuple(jnp.shape(original)),
                    "pass the params init built for this shape",
                )
        steps = _WARMUP + self.n_power_iterations
        u, v = _start(key, original, rows, (h, w), steps, self.eps, promote_float(spec.dtype))
        buffers = {"_u": u.astype(spec.dtype), "_v": v.astype(spec.dtype)}
        return self.ordered({**state, _P: {self.name: {"0": buffers}}})

    def weight(
        self, params: Params, state: State | None = None, *, train: bool = False
    ) -> tuple[jax.Array, State | None]:
        """The computed ``W / sigma`` and the new ``u``, ``v`` buffers (``state``'s
        ``parametrizations.<name>.0`` entry after this call; None for a one-axis ``W``)."""
        w = self._split(params)[1]["original"]
        f = promote_float(w.dtype)
        if w.ndim <= 1:
            return _normalize(w.astype(f), self.eps).astype(w.dtype), None
        if not state or _P not in state:
            raise LayerError(
                "SpectralNorm",
                "the power-iteration vectors u, v are buffers in a state tree; pass "
                "state= from SpectralNorm.init_state(shape, params=params, key=key) (or "
                "the model's init_state) and use the returned (y, new_state)",
                None,
                None,
            )
        buffers = state[_P][self.name]["0"]
        mat = _matrix(w.astype(f), self._row_axis(w.ndim))
        u, v = buffers["_u"].astype(f), buffers["_v"].astype(f)
        if train:
            u, v = _power_method(mat, u, v, self.n_power_iterations, self.eps)
            u = u.astype(buffers["_u"].dtype).astype(f)
            v = v.astype(buffers["_v"].dtype).astype(f)
        sigma = jnp.dot(u, mat @ v)
        new = {"_u": u.astype(buffers["_u"].dtype), "_v": v.astype(buffers["_v"].dtype)}
        return (w.astype(f) / sigma).astype(w.dtype), new

    def apply(
        self,
        params: Params,
        x: Any,
        *args: Any,
        state: State | None = None,
        train: bool = False,
        **kwargs: Any,
    ) -> Any:
        """``layer.apply`` with ``name`` computed as ``W / sigma``."""
        weight, buffers = self.weight(params, state, train=train)
        rest = {k: v for k, v in params.items() if k != _P}
        inner = {k: v for k, v in (state or {}).items() if k != _P}
        call = {**rest, self.name: weight}
        if inner:
            y, new = self._run(call, x, *args, state=inner, train=train, **kwargs)
        else:
            y, new = self._run(call, x, *args, train=train, **kwargs), {}
        if state is None:
            return y
        if buffers is not None:
            new = {**new, _P: {self.name: {"0": buffers}}}
        return y, self.ordered(new)
