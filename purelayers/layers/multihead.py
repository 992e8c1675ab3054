"""Attention layers: projections around one ``AttentionCore``, each named as a checkpoint
names them. Packed projections here: ``MultiHeadAttention`` (fused ``qkv`` and ``out``)
and ``InProjAttention`` (``torch.nn.MultiheadAttention``'s ``in_proj_weight`` and
``out_proj``); separate ones, ``Attention`` (``q_proj``, ``k_proj``, ``v_proj``,
``o_proj``: Llama, Mistral, Qwen2), in ``separate_attention``. Other layouts (GPT-2's
``c_attn``/``c_proj``, BERT's ``self.query`` and ``output.dense``) are a few lines of
the same composition."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from purelayers.functional.attention import need_even
from purelayers.init import Initializer, xavier_normal, xavier_uniform, zeros
from purelayers.layers._checks import (
    LayerError,
    as_shape,
    check_float,
    check_int,
    config_error,
)
from purelayers.layers.attention import AttentionCore, RotaryEmbedding
from purelayers.layers.core import Layer, Params
from purelayers.layers.linear import Linear, linear

__all__ = ["InProjAttention", "MultiHeadAttention"]


def _batched(layer: str, x: Any, context: Any, mask: Any, run, *, all_batched=False) -> Any:
    """Run ``run(x, context, mask)`` on a batch; an unbatched ``(seq, E)`` input gets a
    batch axis of one and loses it again (the cache keeps its batch axis; with
    ``all_batched`` every output loses it). ``context`` may be a tuple of inputs."""
    x = jnp.asarray(x)
    if x.ndim not in (2, 3):
        raise LayerError(layer, "input rank", "2 or 3 ((seq, E) or (batch, seq, E))", x.ndim)
    if x.ndim == 3:
        return run(x, context, mask)
    c = None if context is None else jax.tree.map(lambda a: jnp.asarray(a)[None], context)
    res = run(x[None], c, mask)
    if all_batched:
        return jax.tree.map(lambda a: a[0], res)
    return (res[0][0], res[1]) if isinstance(res, tuple) else res[0]


def append_kv(layer: Any, params: Params, k: jax.Array, v: jax.Array, mask: Any):
    """``bias_k``/``bias_v`` and a zero key and value appended, as torch does; the
    mask gains a visible column for each."""
    extra = int(layer.add_bias_kv) + int(layer.add_zero_attn)
    if not extra:
        return k, v, mask
    b = k.shape[0]
    ks, vs = [k], [v]
    if layer.add_bias_kv:
        ks.append(jnp.broadcast_to(params["bias_k"][0], (b, 1, k.shape[-1])).astype(k.dtype))
        vs.append(jnp.broadcast_to(params["bias_v"][0], (b, 1, v.shape[-1])).astype(v.dtype))
    if layer.add_zero_attn:
        ks.append(jnp.zeros((b, 1, k.shape[-1]), k.dtype))
        vs.append(jnp.zeros((b, 1, v.shape[-1]), v.dtype))
    if mask is not None:
        m = jnp.asarray(mask)
        s = k.shape[1]
        if m.ndim == 0 or m.shape[-1] == 1:  # else the core names a misfit
            m = jnp.broadcast_to(m, (*m.shape[:-1], s) if m.ndim else (s,))
        fill = jnp.ones if m.dtype == jnp.bool_ else jnp.zeros
        if m.shape[-1] == s:
            mask = jnp.concatenate([m, fill((*m.shape[:-1], extra), m.dtype)], axis=-1)
    return jnp.concatenate(ks, axis=1), jnp.concatenate(vs, axis=1), mask


def _no_context(layer: str, core: AttentionCore, cache: Any) -> None:
    if core.rope is not None or cache is not None:
        raise LayerError(
            layer, "context= (cross-attention) works without rope and without cache", None, None
        )


def need_embed(layer: str, shape: tuple[int, ...]) -> int:
    """The input's last axis (the embedding width), which must not be empty: torch's
    attention layers refuse ``embed_dim=0``."""
    if shape[-1] == 0:
        raise LayerError(
            layer,
            "input last axis (embed_dim)",
            "at least 1 (torch's attention refuses embed_dim 0)",
            f"0 (shape {shape})",
        )
    return shape[-1]


def _core(layer: Any) -> AttentionCore:
    rope = layer.rope
    if rope is True:
        rope = RotaryEmbedding(layer.rope_theta)
    return AttentionCore(
        layer.num_heads,
        num_kv_heads=layer.num_kv_heads,
        causal=layer.causal,
        dropout=layer.dropout,
        rope=rope or None,
    )


class _Projected(Layer):
    """An attention layer: ``_qkv(params, x, context, cache) -> (q, k, v)``, then
    ``self.core`` (an ``AttentionCore``), then ``_project_out(params, y)``; subclasses
    define the three."""

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
        cache: dict[str, jax.Array] | None = None,
        context: Any = None,
        positions: Any = None,
    ):
        name = type(self).__name__

        def run(x, context, mask):
            if context is not None:
                _no_context(name, self.core, cache)
            q, k, v = self._qkv(params, x, context, cache, key=key, train=train)
            out = self.core.attend(
                q, k, v, mask=mask, positions=positions, cache=cache, key=key, train=train,
                layer=name,
            )  # fmt: skip
            if cache is not None:
                out, new_cache = out
                return self._project_out(params, out, key=key, train=train), new_cache
            return self._project_out(params, out, key=key, train=train)

        return _batched(name, x, context, mask, run)


class _Packed(_Projected):
    """Shared by the two layouts with one packed input projection (q, k, v rows); the
    subclasses define the fields."""

    def __post_init__(self):
        name = type(self).__name__
        check_float(name, "rope_theta", self.rope_theta, low=0.0, low_open=True)
        if not isinstance(self.rope, (bool, RotaryEmbedding)):
            raise config_error(name, "rope", "True, False or a RotaryEmbedding", self.rope)
        try:
            self.core  # noqa: B018  (checks the core's settings now)
        except ValueError as e:
            raise ValueError(str(e).replace("AttentionCore", name, 1)) from None

    @property
    def core(self) -> AttentionCore:
        return _core(self)

    @property
    def kv_heads(self) -> int:
        return self.core.kv_heads

    def head_dim(self, embed_dim: int) -> int:
        """``embed_dim // num_heads``; a ``ValueError`` naming both if it does not divide."""
        name = type(self).__name__
        if embed_dim % self.num_heads:
            divisors = [d for d in range(1, embed_dim + 1) if embed_dim % d == 0]
            raise LayerError(
                name,
                f"embed_dim {embed_dim} (the last axis of x) must be divisible by "
                f"num_heads {self.num_heads}",
                None,
                None,
                f"choose num_heads among {divisors}",
            )
        hd = embed_dim // self.num_heads
        if self.rope:
            need_even(name, hd)
        return hd

    def _rows(self, embed_dim: int) -> int:
        return (self.num_heads + 2 * self.kv_heads) * self.head_dim(embed_dim)

    def _embed_dim(self, shape: Any) -> int:
        shape = as_shape(shape)
        if not shape:
            raise LayerError(type(self).__name__, "input rank", "2 or 3", "0 (a scalar)")
        return need_embed(type(self).__name__, shape)

    def init_cache(self, shape: Any, dtype: Any = jnp.float32) -> dict[str, jax.Array]:
        """An empty decoding cache for ``shape = (batch, max_len, embed_dim)``."""
        shape = as_shape(shape)
        if len(shape) != 3:
            raise LayerError(
                type(self).__name__, "init_cache shape", "(batch, max_len, embed_dim)", shape
            )
        return self.core.init_cache(shape[:2], self.head_dim(shape[2]), dtype)

    def _qkv(self, params: Params, x: jax.Array, context: Any, cache: Any, **_: Any):
        """``q``, ``k``, ``v`` from the packed projection (rows ``[q | k | v]``)."""
        e = x.shape[-1]
        hd = self.head_dim(e)
        nq = self.num_heads * hd
        if context is None:
            qkv = self._project_in(params, x, None)
            q, kv = qkv[..., :nq], qkv[..., nq:]
        else:
            q = self._project_in(params, x, slice(0, nq))
            kv = self._project_in(params, jnp.asarray(context), slice(nq, None))
        nk = self.kv_heads * hd
        return q, kv[..., :nk], kv[..., nk:]


@dataclasses.dataclass(frozen=True)
class MultiHeadAttention(_Packed):
    r"""Multi-head attention with packed projections, grouped-query heads, rotary
    positions and a decoding cache: ``qkv`` and ``out`` (two ``Linear`` children)
    around an ``AttentionCore``. Matches ``torch.nn.MultiheadAttention(E, num_heads,
    batch_first=True)`` for self- and cross-attention, its ``state_dict`` renamed by
    ``purelayers.params.rename(sd, purelayers.params.TORCH_MHA_TO_PURELAYERS)``
    (``InProjAttention`` takes torch's names as they are).

    ``embed_dim`` ``E`` is read from the last axis of ``init``'s ``shape`` and must divide
    by ``num_heads``; ``head_dim = E / num_heads``. With ``H = num_heads`` and
    ``K = num_kv_heads``::

        q, k, v = split(x @ qkv.weight.T + qkv.bias, [H * head_dim, K * head_dim, K * head_dim])
        y = concat_heads(softmax(q k^T / sqrt(head_dim) + masks) v) @ out.weight.T + out.bias

    Cross-attention: ``apply(params, x, context=c)`` takes queries from ``x`` (the first
    ``H * head_dim`` rows of ``qkv.weight``) and keys and values from ``c`` (the other
    rows), with the *same* parameter names, exactly as torch packs ``in_proj_weight`` for
    cross-attention when ``kdim == vdim == embed_dim``. ``c`` must have ``E`` features.

    Args:
      num_heads: query heads ``H``.
      num_kv_heads: key/value heads ``K``, a divisor of ``H``; ``1`` is multi-query
        attention. Default ``None``: ``H`` (torch's layout, where the name map applies).
      bias: learn ``qkv.bias`` and ``out.bias``. Default ``True``.
      causal: each position attends to itself and earlier ones (``causal_mask``).
        Default ``False``.
      dropout: attention-weight dropout in train mode (needs ``key``). Default ``0.0``.
      rope: rotate queries and keys by their positions: ``True`` (a
        ``RotaryEmbedding(rope_theta)``), a ``RotaryEmbedding``, or ``False``;
        self-attention only. Default ``False``.
      rope_theta: RoPE frequency base with ``rope=True``. Default ``10000.0``.
      weight_init: overrides ``qkv.weight``'s initializer.
      bias_init: overrides both biases' initializers.

    Masks, positions and decoding: as ``AttentionCore`` (``mask=``, ``positions=``,
    ``cache=``); ``init_cache((batch, max_len, E))``. Boolean masks are ``True`` where a
    query may attend (the *opposite* of torch MHA's boolean ``attn_mask``); torch's
    ``key_padding_mask`` ``kpm`` is ``mask=~kpm[:, None, None, :]``. Writing past
    ``max_len`` raises where the cached length is known and gives NaN under ``jit``
    (``AttentionCore``).

    Shape:
      ``x``: ``(batch, seq, E)`` or ``(seq, E)``; ``context``: ``(batch, kv_seq, E)``;
      output like ``x``.

    Parameters:
      ``qkv.weight``: ``((H + 2K) * head_dim, E)``, xavier-uniform (torch's
      ``in_proj_weight`` init). ``qkv.bias``: ``((H + 2K) * head_dim,)``, zeros.
      ``out.weight``: ``(E, E)``, ``U(-1/sqrt(E), 1/sqrt(E))``. ``out.bias``: ``(E,)``,
      zeros.

    Example:
      >>> mha = MultiHeadAttention(4, causal=True)
      >>> params = mha.init(jax.random.key(0), (2, 5, 16))
      >>> mha.apply(params, jnp.ones((2, 5, 16))).shape
      (2, 5, 16)
    """

    num_heads: int
    _: dataclasses.KW_ONLY
    num_kv_heads: int | None = None
    bias: bool = True
    causal: bool = False
    dropout: float = 0.0
    rope: bool | RotaryEmbedding = False
    rope_theta: float = 10000.0
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None

    def _parts(self, embed_dim: int) -> dict[str, Layer]:
        rows = self._rows(embed_dim) if embed_dim else 1
        b_init = self.bias_init or zeros()
        return {
            "qkv": Linear(
                rows,
                bias=self.bias,
                weight_init=self.weight_init or xavier_uniform(),
                bias_init=b_init,
            ),
            "out": Linear(max(embed_dim, 1), bias=self.bias, bias_init=b_init),
        }

    def children(self) -> dict[str, Layer]:
        return self._parts(0)  # names and order do not depend on the width

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        e = self._embed_dim(shape)
        parts = self._parts(e)
        feats = (*as_shape(shape)[:-1], e)
        return {
            name: layer.init(jax.random.fold_in(key, i), feats, dtype)
            for i, (name, layer) in enumerate(parts.items())
        }

    def _project_in(self, params: Params, x: jax.Array, rows: slice | None) -> jax.Array:
        p = params["qkv"] if rows is None else {k: v[rows] for k, v in params["qkv"].items()}
        return self.call("qkv", {"qkv": p}, x)

    def _project_out(self, params: Params, y: jax.Array, **_: Any) -> jax.Array:
        return self.call("out", params, y)


@dataclasses.dataclass(frozen=True)
class InProjAttention(_Packed):
    r"""``torch.nn.MultiheadAttention`` under torch's own names and arguments (``embed_dim``
    dropped: ``E`` is read from the input)::

        q, k, v = split(x @ in_proj_weight.T + in_proj_bias, 3)      # rows [q | k | v]
        y = concat_heads(softmax(q k^T / sqrt(E / H) + masks) v) @ out_proj.weight.T + out_proj.bias

    A torch ``state_dict`` loads as it is. ``InProjAttention(num_heads, dropout)`` is
    ``MultiheadAttention(E, num_heads, dropout)``.

    Args:
      num_heads: query heads ``H``; ``E`` must divide by it.
      dropout: attention-weight dropout in train mode (needs ``key``). Default ``0.0``.
      bias: learn ``in_proj_bias`` and ``out_proj.bias``. Default ``True``.
      add_bias_kv: learn ``bias_k`` and ``bias_v``, appended to the projected keys and
        values as one more key visible to every query. Default ``False``.
      add_zero_attn: append a key and a value of zeros (after ``bias_k``). Default
        ``False``.
      kdim: the key input's width. Default ``None``: ``E``. Where ``kdim`` or ``vdim``
        differs from ``E`` the projections are separate (``q_proj_weight`` ``(E, E)``,
        ``k_proj_weight`` ``(E, kdim)``, ``v_proj_weight`` ``(E, vdim)``), as in torch;
        ``init`` still takes the query's shape. Keys come from ``context=``.
      vdim: the value input's width. Default ``None``: ``E``. Values come from
        ``value=`` (default: ``context``).
      batch_first: inputs and output are ``(N, L, E)`` instead of torch's default
        ``(L, N, E)``. Default ``False``.
      num_kv_heads: keyword-only, as ``MultiHeadAttention``'s (grouped-query heads give
        ``(H + 2K) * head_dim`` rows).
      causal: keyword-only, as ``MultiHeadAttention``'s.
      rope: keyword-only, as ``MultiHeadAttention``'s.
      rope_theta: keyword-only, as ``MultiHeadAttention``'s.
      weight_init: keyword-only, as ``MultiHeadAttention``'s.
      bias_init: keyword-only, as ``MultiHeadAttention``'s.

    ``apply(params, x, *, mask=None, key_padding_mask=None, key=None, train=False,
    cache=None, context=None, value=None, positions=None, need_weights=False,
    average_attn_weights=True)``. Masks have torch's meanings: ``mask`` is torch's
    ``attn_mask``, ``(L, S)``, ``(N * H, L, S)`` or broadcastable to ``(N, H, L, S)``,
    boolean ``True`` where attention is *not* allowed or floating point added to the
    scores; ``key_padding_mask`` ``(N, S)``, ``True`` at padding (or floating point
    added). ``need_weights=True`` returns ``(y, weights)`` as torch does (torch's default
    is ``True``; here ``False`` returns ``y`` alone): the attention probabilities after
    dropout, ``(N, L, S)`` averaged over heads with ``average_attn_weights=True``,
    ``(N, H, L, S)`` otherwise. A query row that may attend nothing has zero weights
    (torch: NaN) and a zero output. ``cache=`` decodes as ``MultiHeadAttention``.

    Shape:
      ``x``: ``(L, N, E)`` (``(N, L, E)`` with ``batch_first``) or unbatched ``(L, E)``;
      output like ``x``.

    Parameters:
      ``in_proj_weight``: ``(3E, E)``, xavier-uniform (or the three separate weights
      above). ``in_proj_bias``: ``(3E,)``, zeros. ``bias_k``, ``bias_v``: ``(1, 1, E)``,
      xavier-normal. ``out_proj.weight``: ``(E, E)``, torch's ``Linear`` init;
      ``out_proj.bias``: zeros.

    Example:
      >>> mha = InProjAttention(2, kdim=3, add_bias_kv=True)
      >>> list(pl.params.flatten(mha.init(jax.random.key(0), (5, 1, 4))))
      ['q_proj_weight', 'k_proj_weight', 'v_proj_weight', 'in_proj_bias', 'bias_k', 'bias_v', 'out_proj.weight', 'out_proj.bias']
      >>> x = jnp.ones((5, 1, 4))  # (L, N, E)
      >>> y, w = InProjAttention(2).apply(InProjAttention(2).init(jax.random.key(0), x.shape), x, need_weights=True)
      >>> y.shape, w.shape
      ((5, 1, 4), (1, 5, 5))

    torch: ``torch.nn.MultiheadAttention(E, num_heads, dropout, bias, add_bias_kv,
    add_zero_attn, kdim, vdim, batch_first)``.
    """

    num_heads: int
    dropout: float = 0.0
    bias: bool = True
    add_bias_kv: bool = False
    add_zero_attn: bool = False
    kdim: int | None = None
    vdim: int | None = None
    batch_first: bool = False
    _: dataclasses.KW_ONLY
    num_kv_heads: int | None = None
    causal: bool = False
    rope: bool | RotaryEmbedding = False
    rope_theta: float = 10000.0
    weight_init: Initializer | None = None
    bias_init: Initializer | None = None

    def __post_init__(self):
        super().__post_init__()
        for arg in ("kdim", "vdim"):
            if getattr(self, arg) is not None:
                check_int("InProjAttention", arg, getattr(self, arg))
        if (self.add_bias_kv or self.add_zero_attn) and (self.rope or self.causal):
            raise ValueError(
                "InProjAttention: add_bias_kv and add_zero_attn append keys, which works "
                f"without rope and causal, got rope={self.rope!r}, causal={self.causal!r} "
                "(pass a causal mask= instead, as torch does)"
            )

    def _separate(self, embed_dim: int) -> bool:
        return self.kdim not in (None, embed_dim) or self.vdim not in (None, embed_dim)

    def own_names(self) -> tuple[str, ...]:
        names = ["in_proj_weight"]
        if self.kdim is not None or self.vdim is not None:
            names += ["q_proj_weight", "k_proj_weight", "v_proj_weight"]
        names += ["in_proj_bias"] if self.bias else []
        return (*names, *(("bias_k", "bias_v") if self.add_bias_kv else ()))

    def _out(self, embed_dim: int) -> Linear:
        return Linear(max(embed_dim, 1), bias=self.bias, bias_init=self.bias_init or zeros())

    def children(self) -> dict[str, Layer]:
        return {"out_proj": self._out(0)}

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        e = self._embed_dim(shape)
        rows = self._rows(e)
        w_init = self.weight_init or xavier_uniform()
        if self._separate(e):
            nq = self.num_heads * self.head_dim(e)
            nk = (rows - nq) // 2
            kdim, vdim = self.kdim or e, self.vdim or e
            params: Params = {
                "q_proj_weight": w_init(jax.random.fold_in(key, 0), (nq, e), dtype),
                "k_proj_weight": w_init(jax.random.fold_in(key, 3), (nk, kdim), dtype),
                "v_proj_weight": w_init(jax.random.fold_in(key, 4), (nk, vdim), dtype),
            }
        else:
            params = {"in_proj_weight": w_init(jax.random.fold_in(key, 0), (rows, e), dtype)}
        if self.bias:
            b_init = self.bias_init or zeros()
            params["in_proj_bias"] = b_init(jax.random.fold_in(key, 1), (rows,), dtype)
        if self.add_bias_kv:
            kv = (1, 1, self.kv_heads * self.head_dim(e))
            params["bias_k"] = xavier_normal()(jax.random.fold_in(key, 5), kv, dtype)
            params["bias_v"] = xavier_normal()(jax.random.fold_in(key, 6), kv, dtype)
        feats = (*as_shape(shape)[:-1], e)
        params["out_proj"] = self._out(e).init(jax.random.fold_in(key, 2), feats, dtype)
        return params

    def _project_in(self, params: Params, x: jax.Array, rows: slice | None) -> jax.Array:
        p = {"weight": params["in_proj_weight"]}
        if "in_proj_bias" in params:
            p["bias"] = params["in_proj_bias"]
        if rows is not None:
            p = {k: v[rows] for k, v in p.items()}
        return linear(p, x, layer=f"{type(self).__name__}[in_proj]")

    def _project(self, params: Params, x: jax.Array, part: int, e: int) -> jax.Array:
        """Part ``part`` (0 q, 1 k, 2 v) of the input projection of ``x`` (queries of
        width ``e``)."""
        hd = self.head_dim(e)
        nq, nk = self.num_heads * hd, self.kv_heads * hd
        rows = (slice(0, nq), slice(nq, nq + nk), slice(nq + nk, None))[part]
        if not self._separate(e):
            return self._project_in(params, x, rows)
        name = ("q_proj_weight", "k_proj_weight", "v_proj_weight")[part]
        p = {"weight": params[name]}
        if "in_proj_bias" in params:
            p["bias"] = params["in_proj_bias"][rows]
        return linear(p, x, layer=f"{type(self).__name__}[{name}]")

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        mask: Any = None,
        key_padding_mask: Any = None,
        key: jax.Array | None = None,
        train: bool = False,
        cache: dict[str, jax.Array] | None = None,
        context: Any = None,
        value: Any = None,
        positions: Any = None,
        need_weights: bool = False,
        average_attn_weights: bool = True,
    ):
        """``y`` for queries ``x`` (keys and values from ``x``, or from ``context`` and
        ``value``); ``(y, weights)`` with ``need_weights``; ``(y, new_cache)`` with
        ``cache``. ``mask`` is torch's ``attn_mask``, ``key_padding_mask`` torch's."""
        name = type(self).__name__
        if not self.batch_first and jnp.ndim(x) == 3:  # torch's (L, N, E)
            swap = lambda a: None if a is None else jnp.swapaxes(jnp.asarray(a), 0, 1)  # noqa: E731
            out = dataclasses.replace(self, batch_first=True).apply(
                params, swap(x), mask=mask, key_padding_mask=key_padding_mask, key=key,
                train=train, cache=cache, context=swap(context), value=swap(value),
                positions=positions, need_weights=need_weights,
                average_attn_weights=average_attn_weights,
            )  # fmt: skip
            return (swap(out[0]), out[1]) if isinstance(out, tuple) else swap(out)
        mask = _allowed(name, self.num_heads, x, mask, key_padding_mask)
        appends = self.add_bias_kv or self.add_zero_attn
        if cache is not None and (need_weights or appends):
            raise LayerError(
                name, "cache= works without need_weights, add_bias_kv and add_zero_attn", None, None
            )
        if value is not None and context is None:
            raise LayerError(name, "value= needs context= (the keys' input) too", None, None)
        inputs = None if context is None else (context, context if value is None else value)

        def run(x, inputs, mask):
            if inputs is not None:
                _no_context(name, self.core, cache)
            e = x.shape[-1]
            if inputs is None and not self._separate(e):  # one matmul, as before
                q, k, v = self._qkv(params, x, None, cache)
            else:
                kin, vin = (x, x) if inputs is None else inputs
                q = self._project(params, x, 0, e)
                k, v = self._project(params, kin, 1, e), self._project(params, vin, 2, e)
            k, v, mask = append_kv(self, params, k, v, mask)
            if need_weights:
                out, weights = self.core.attend(
                    q, k, v, mask=mask, positions=positions, key=key, train=train,
                    layer=name, weights=True,
                )  # fmt: skip
                if average_attn_weights:
                    weights = jnp.mean(weights, axis=1)
                return self._project_out(params, out), weights
            out = self.core.attend(
                q, k, v, mask=mask, positions=positions, cache=cache, key=key, train=train,
                layer=name,
            )  # fmt: skip
            if cache is not None:
                out, new_cache = out
                return self._project_out(params, out), new_cache
            return self._project_out(params, out)

        return _batched(name, x, inputs, mask, run, all_batched=need_weights)

    def _project_out(self, params: Params, y: jax.Array, **_: Any) -> jax.Array:
        return self.call("out_proj", params, y)


def _allowed(layer: str, heads: int, x: Any, attn_mask: Any, kpm: Any) -> Any:
    """torch's ``attn_mask`` (boolean ``True`` where attention is *not* allowed, or
    floating point added to the scores; ``(L, S)``, ``(N * heads, L, S)`` or anything
    broadcastable to ``(N, heads, L, S)``) and ``key_padding_mask`` (``(N, S)``, ``True``
    at padding, or floating point added) as the core's mask (boolean ``True`` where a
    query may attend, or floating point added)."""
    batched = jnp.ndim(x) == 3
    n = jnp.shape(x)[0] if batched else 1
    masks = []
    if attn_mask is not None:
        m = jnp.asarray(attn_mask)
        if batched and m.ndim == 3 and m.shape[0] == n * heads and n > 1:
            m = m.reshape(n, heads, *m.shape[1:])
        masks.append(m)
    if kpm is not None:
        k = jnp.asarray(kpm)
        if k.ndim != (2 if batched else 1):
            want = "(N, S)" if batched else "(S,)"
            raise LayerError(layer, "key_padding_mask shape", want, tuple(k.shape))
        masks.append(k.reshape(k.shape[0], 1, 1, k.shape[1]) if batched else k)
    if not masks:
        return None
    nd = max(m.ndim for m in masks)  # leading axes of one, as broadcasting would add
    masks = [m.reshape((1,) * (nd - m.ndim) + m.shape) for m in masks]
    if all(m.dtype == jnp.bool_ for m in masks):
        allowed = ~masks[0]
        for m in masks[1:]:
            allowed = allowed & ~m
        return allowed
    total = None
    for m in masks:
        if m.dtype == jnp.bool_:
            m = jnp.where(m, -jnp.inf, 0.0)
        total = m if total is None else total + m
    return total
