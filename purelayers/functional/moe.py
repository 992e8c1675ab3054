"""Mixture-of-experts math: top-k routing, the experts' products as a dropless top-k
dispatch (``moe_experts``) beside the dense every-expert-on-every-token form
(``moe_experts_reference``), gpt-oss's clamped SwiGLU, and the Switch Transformer
load-balancing loss as transformers computes it.

The dispatch sorts the ``tokens * top_k`` assignments by expert, pads each expert's run
of rows to a multiple of a tile of ``T`` rows, and multiplies each tile by its one
expert's weights (gathered per tile), then gathers each assignment's row back and sums a
token's ``top_k`` rows weighted by the router. Its work is ``tokens * top_k`` rows plus at
most ``num_experts * (T - 1)`` padding rows, with ``T`` chosen so that the padding is
at most the rows themselves; the dense form's is ``tokens * num_experts`` rows. Every
step is a gather, an ``einsum`` or a scatter of positions, so ``jax.grad`` goes through.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

__all__ = [
    "clamped_swiglu",
    "load_balancing_loss",
    "moe_experts",
    "moe_experts_reference",
    "top_k_routing",
]

Act = Callable[..., jax.Array]


def top_k_routing(
    logits: jax.Array, top_k: int, *, softmax_first: bool = True, normalize: bool = True
) -> tuple[jax.Array, jax.Array]:
    r"""Router weights and chosen experts from router logits.

    ``softmax_first``: ``p = softmax(logits)`` (in float32), the ``top_k`` largest ``p``
    and, with ``normalize``, ``p / sum(p)`` over them (Mixtral; Qwen3-MoE's
    ``norm_topk_prob``); the normalized form equals a softmax over the top-k logits.
    Otherwise the ``top_k`` largest logits and a softmax over them (gpt-oss).

    Args:
      logits: ``(tokens, num_experts)``.
      top_k: experts per token.
      softmax_first: softmax over every expert before the selection. Default ``True``.
      normalize: with ``softmax_first``, renormalize the chosen weights to sum to 1.

    Shape:
      ``(tokens, top_k)`` weights (float32 where the softmax comes first, else the
      logits' dtype) and int32 expert ids, largest first.
    """
    if softmax_first:
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        weights, indices = jax.lax.top_k(probs, top_k)
        if normalize:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
        return weights, indices.astype(jnp.int32)
    values, indices = jax.lax.top_k(logits, top_k)
    return jax.nn.softmax(values, axis=-1), indices.astype(jnp.int32)


def clamped_swiglu(gate_up: jax.Array, alpha: float = 1.702, limit: float = 7.0) -> jax.Array:
    r"""gpt-oss's gated unit on interleaved ``[g0, u0, g1, u1, ...]`` columns:
    ``g = min(gate, limit)``, ``u = clip(up, -limit, limit)``,
    ``(u + 1) * g * sigmoid(alpha * g)``.

    Shape:
      ``(..., 2 * n)`` to ``(..., n)``.
    """
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = jnp.minimum(gate, limit)
    up = jnp.clip(up, -limit, limit)
    return (up + 1) * (gate * jax.nn.sigmoid(gate * alpha))


def _product(x: jax.Array, w: jax.Array, in_out: bool, spec: str) -> jax.Array:
    """``x`` times a ``(in, out)`` matrix (``in_out``) or a torch ``(out, in)`` one."""
    a, b = spec.split(",")
    return jnp.einsum(f"{a},{b}", x, w if in_out else jnp.swapaxes(w, -1, -2))


def _expert_mlp(
    x, w_in, w_out, act, b_in, b_out, in_out, pick: Callable[[jax.Array], jax.Array], spec
):
    """One pass of the experts' MLP on rows ``x`` with weights chosen by ``pick``."""
    hs = []
    for i, w in enumerate(w_in):
        h = _product(x, pick(w), in_out, spec)
        if b_in is not None and b_in[i] is not None:
            h = h + pick(b_in[i])[..., None, :]
        hs.append(h)
    y = _product(act(*hs), pick(w_out), in_out, spec)
    if b_out is not None:
        y = y + pick(b_out)[..., None, :]
    return y


def _check(x, weights, indices, w_in, w_out):
    if x.ndim != 2 or weights.shape != indices.shape or weights.shape[0] != x.shape[0]:
        raise ValueError(
            "moe_experts: x must be (tokens, hidden) and weights, indices (tokens, top_k); "
            f"got x {x.shape}, weights {weights.shape}, indices {indices.shape}"
        )
    experts = w_out.shape[0]
    if any(w.shape[0] != experts for w in w_in):
        raise ValueError(
            "moe_experts: every weight must lead with num_experts; got "
            f"{[w.shape for w in w_in]} and w_out {w_out.shape}"
        )


def moe_experts_reference(
    x: jax.Array,
    weights: jax.Array,
    indices: jax.Array,
    w_in: Sequence[jax.Array],
    w_out: jax.Array,
    *,
    act: Act,
    b_in: Sequence[jax.Array | None] | None = None,
    b_out: jax.Array | None = None,
    in_out: bool = False,
) -> jax.Array:
    r"""The dense form of ``moe_experts``: every expert on every token, then
    ``y_n = sum_e c_{n,e} * expert_e(x_n)`` with ``c`` the router weights scattered to
    their experts (0 elsewhere). Arguments as ``moe_experts``."""
    _check(x, weights, indices, w_in, w_out)
    experts = w_out.shape[0]
    dense = jnp.zeros((x.shape[0], experts), weights.dtype)
    dense = dense.at[jnp.arange(x.shape[0])[:, None], indices].add(weights)
    xs = jnp.broadcast_to(x, (experts, *x.shape))
    ys = _expert_mlp(xs, w_in, w_out, act, b_in, b_out, in_out, lambda w: w, "enh,ehf->enf")
    return jnp.einsum("ne,enh->nh", dense.astype(ys.dtype), ys).astype(x.dtype)


def _tile(rows: int, experts: int) -> int:
    """Rows per tile: a power of two near the mean rows per expert (padding at most
    ``experts * (tile - 1) <= rows``), at most 128; 1 for a few rows (decoding), where
    each row reads only its own expert's weights."""
    tile = 1
    while tile * 2 <= min(128, rows // experts):
        tile *= 2
    return tile


def moe_experts(
    x: jax.Array,
    weights: jax.Array,
    indices: jax.Array,
    w_in: Sequence[jax.Array],
    w_out: jax.Array,
    *,
    act: Act,
    b_in: Sequence[jax.Array | None] | None = None,
    b_out: jax.Array | None = None,
    in_out: bool = False,
    tile: int | None = None,
) -> jax.Array:
    r"""The experts' MLPs on their tokens: ``y_n = sum_j weights[n, j] *
    expert_{indices[n, j]}(x_n)``, where ``expert_e(x) = act(*(x W^{in}_{e,i} +
    b^{in}_{e,i})) W^{out}_e + b^{out}_e``, as a dropless top-k dispatch (see the module
    docstring): the tokens sorted by expert, tiled, one expert's product per tile,
    gathered back; no expert loop and no token dropped.

    Args:
      x: ``(tokens, hidden)``.
      weights: ``(tokens, top_k)`` router weights.
      indices: ``(tokens, top_k)`` expert ids in ``[0, num_experts)``.
      w_in: the input projections, each ``(num_experts, out, hidden)`` (torch
        ``Linear`` layout) or ``(num_experts, hidden, out)`` with ``in_out``.
      w_out: the output projection, ``(num_experts, hidden, inter)`` (or ``(num_experts,
        inter, hidden)`` with ``in_out``).
      act: ``act(*hs)`` maps the input projections' outputs to the ``inter`` features
        (``lambda g, u: silu(g) * u``; ``clamped_swiglu`` on one fused projection).
      b_in: optional biases of the input projections, each ``(num_experts, out)``.
      b_out: optional bias of the output projection, ``(num_experts, hidden)``.
      in_out: weights stored ``(in, out)`` per expert (gpt-oss) rather than torch's
        ``(out, in)``.
      tile: rows per tile; default from the sizes (see ``_tile``).

    Shape:
      ``(tokens, hidden)``, in ``x``'s dtype.
    """
    _check(x, weights, indices, w_in, w_out)
    n, k = indices.shape
    experts = w_out.shape[0]
    rows = n * k
    if rows == 0:  # no tokens: the dense form's empty answer
        return moe_experts_reference(
            x, weights, indices, w_in, w_out, act=act, b_in=b_in, b_out=b_out, in_out=in_out
        )
    tile = tile or _tile(rows, experts)
    flat = indices.reshape(-1)
    order = jnp.argsort(flat, stable=True)  # assignments sorted by expert
    sorted_expert = flat[order]
    counts = jnp.bincount(flat, length=experts)
    padded = (counts + tile - 1) // tile * tile
    pad_start = jnp.cumsum(padded) - padded  # each expert's first padded row
    start = jnp.cumsum(counts) - counts
    rank = jnp.arange(rows) - start[sorted_expert]  # the row's place within its expert
    slot = pad_start[sorted_expert] + rank  # its padded row
    capacity = -(-(rows + experts * (tile - 1)) // tile) * tile
    tiles = capacity // tile
    # every sorted row's padded slot; empty slots read a zero row
    source = jnp.full((capacity,), n, jnp.int32).at[slot].set((order // k).astype(jnp.int32))
    xs = jnp.concatenate([x, jnp.zeros((1, x.shape[1]), x.dtype)])[source]
    xs = xs.reshape(tiles, tile, x.shape[1])
    tile_expert = jnp.searchsorted(jnp.cumsum(padded), jnp.arange(tiles) * tile, side="right")
    tile_expert = jnp.minimum(tile_expert, experts - 1)

    def pick(w: jax.Array) -> jax.Array:
        return w[tile_expert]

    ys = _expert_mlp(xs, w_in, w_out, act, b_in, b_out, in_out, pick, "tsh,thf->tsf")
    ys = ys.reshape(capacity, ys.shape[-1])
    slot_of = jnp.zeros((rows,), jnp.int32).at[order].set(slot.astype(jnp.int32))
    per = ys[slot_of].reshape(n, k, ys.shape[-1])
    return jnp.einsum("nk,nkh->nh", weights.astype(per.dtype), per).astype(x.dtype)


def load_balancing_loss(
    router_logits: Sequence[jax.Array],
    num_experts: int,
    top_k: int = 2,
    attention_mask: Any = None,
) -> jax.Array:
    r"""The Switch Transformer auxiliary loss as transformers'
    ``load_balancing_loss_func``: over every layer's ``(batch * seq, num_experts)``
    logits, ``f_e`` the share of rows choosing expert ``e`` among their ``top_k`` and
    ``P_e`` the mean router probability of ``e``, both summed over layers and divided by
    the rows counted; the loss is ``num_experts * sum_e f_e P_e``. An
    ``attention_mask`` ``(batch, seq)`` leaves the padding rows out.

    Shape:
      a scalar (float32).
    """
    logits = list(router_logits)
    if not logits:
        return jnp.zeros((), jnp.float32)
    counts = jnp.zeros((num_experts,), jnp.float32)
    probs = jnp.zeros((num_experts,), jnp.float32)
    total = jnp.zeros((), jnp.float32)
    keep = None if attention_mask is None else jnp.asarray(attention_mask, jnp.float32).reshape(-1)
    for layer in logits:
        p = jax.nn.softmax(layer.astype(jnp.float32), axis=-1)
        _, chosen = jax.lax.top_k(p, top_k)
        w = jnp.ones(p.shape[0], jnp.float32) if keep is None else keep
        hits = jnp.zeros((num_experts,), jnp.float32).at[chosen].add(w[:, None])
        counts = counts + hits
        probs = probs + jnp.sum(p * w[:, None], axis=0)
        total = total + jnp.sum(w)
    return num_experts * jnp.sum((counts / total) * (probs / total))
