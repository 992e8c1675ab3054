"""Mixture of experts: ``MixtureOfExperts``, a router and stacked expert MLPs under
Mixtral's, Qwen3-MoE's or gpt-oss's checkpoint names and layouts."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

import purelayers.functional as F
from purelayers.init import Initializer, normal, zeros
from purelayers.layers._checks import LayerError, as_shape, check_int
from purelayers.layers.core import Layer, Params
from purelayers.layers.linear import Linear
from purelayers.layers.repeat import Repeat

__all__ = ["MixtureOfExperts"]

# per-expert names and shapes ("o": hidden, "i": intermediate), in the checkpoint's order
_PER_EXPERT = {  # (gate, up, down) as the checkpoint names them
    "mixtral": ("w1", "w3", "w2"),
    "qwen3_moe": ("gate_proj", "up_proj", "down_proj"),
}
STYLES = ("mixtral", "qwen3_moe", "gpt_oss")


def kids_stack(blocks: Mapping[str, Any]) -> Any:
    """Per-expert trees (``{"0": ..., "1": ...}``) stacked along a new leading axis."""
    n = len(blocks)
    return jax.tree.map(lambda *a: jnp.stack(a), *[blocks[str(i)] for i in range(n)])


@dataclasses.dataclass(frozen=True)
class ExpertMLP(Layer):
    """One expert: ``down(silu(gate(x)) * up(x))``, its three projections named by
    ``names`` (gate, up, down), without biases. ``MixtureOfExperts`` stacks ``num_experts``
    of them as a ``Repeat``'s blocks (names ``experts.N.w1.weight``)."""

    names: tuple[str, str, str]
    intermediate_size: int
    _: dataclasses.KW_ONLY
    hidden_size: int = 1  # the down projection's width; init takes it from the input
    weight_init: Initializer | None = None

    def children(self) -> dict[str, Layer]:
        gate, up, down = self.names
        inner = Linear(self.intermediate_size, bias=False, weight_init=self.weight_init)
        outer = Linear(self.hidden_size, bias=False, weight_init=self.weight_init)
        kids = {gate: inner, up: inner, down: outer}
        # the checkpoint's order: Mixtral's w1, w2, w3; Qwen3-MoE's gate, up, down
        order = sorted(kids) if gate == "w1" else list(kids)
        return {k: kids[k] for k in order}

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        shape = as_shape(shape)
        gate, up, down = self.names
        inner = Linear(self.intermediate_size, bias=False, weight_init=self.weight_init)
        # the down projection drawn directly: an empty hidden axis gives a (0, inter) weight
        w_init = self.weight_init or normal(std=0.02)
        made = {
            gate: inner.init(jax.random.fold_in(key, 0), shape, dtype),
            up: inner.init(jax.random.fold_in(key, 1), shape, dtype),
            down: {
                "weight": w_init(
                    jax.random.fold_in(key, 2), (shape[-1], self.intermediate_size), dtype
                )
            },
        }
        return {k: made[k] for k in self.children()}

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        gate, up, down = self.names
        h = jax.nn.silu(self.call(gate, params, x)) * self.call(up, params, x)
        return self.call(down, params, h)


def _silu_glu(gate: jax.Array, up: jax.Array) -> jax.Array:
    return jax.nn.silu(gate) * up


@dataclasses.dataclass(frozen=True)
class MixtureOfExperts(Layer):
    r"""A sparse mixture-of-experts MLP: a router picks ``top_k`` of ``num_experts``
    expert MLPs per token and the output is their router-weighted sum,
    ``y = sum_j w_j * expert_{e_j}(x)``, computed as a dropless top-k dispatch
    (``F.moe_experts``: tokens sorted by expert, one grouped product per tile), whose work
    grows with ``tokens * top_k``, not ``tokens * num_experts``.

    Styles (the router's normalisation, the experts' names and layouts):

    - ``"mixtral"`` (``MixtralSparseMoeBlock``): router ``gate`` (no bias); weights a
      softmax over the top-k logits; experts ``experts.N.w1/w3`` (gate, up: ``(inter,
      hidden)``) and ``experts.N.w2`` (down: ``(hidden, inter)``), SiLU-gated.
    - ``"qwen3_moe"`` (``Qwen3MoeSparseMoeBlock``): router ``gate``; a softmax over all
      experts, the top-k of it, renormalized when ``norm_topk_prob``; experts
      ``experts.N.gate_proj/up_proj/down_proj``.
    - ``"gpt_oss"`` (``GptOssMLP``): router ``router`` with a bias; the top-k logits
      then a softmax; experts fused as ``experts.gate_up_proj`` ``(E, hidden, 2 *
      inter)`` (gate and up interleaved by column) with ``gate_up_proj_bias`` ``(E, 2 *
      inter)``, ``experts.down_proj`` ``(E, inter, hidden)`` with ``down_proj_bias``
      ``(E, hidden)``, and the clamped SwiGLU ``F.clamped_swiglu(alpha, limit)``.

    Args:
      num_experts: how many experts.
      top_k: experts per token (at most ``num_experts``).
      intermediate_size: each expert's hidden width.
      style: ``"mixtral"``, ``"qwen3_moe"`` or ``"gpt_oss"``. Default ``"mixtral"``.
      norm_topk_prob: renormalize the chosen weights (``"qwen3_moe"`` only; Mixtral
        always does, gpt-oss's softmax needs none). Default ``True``.
      alpha: the clamped SwiGLU's slope (``"gpt_oss"``). Default 1.702.
      limit: the clamped SwiGLU's clamp (``"gpt_oss"``). Default 7.0.
      weight_init: the experts' and router's weights. Default ``normal(std=0.02)``.

    Shape:
      input ``(..., hidden)``; output the same. ``apply(..., output_router_logits=True)``
      returns ``(y, router_logits)`` with ``router_logits`` ``(tokens, num_experts)``,
      ``tokens`` the product of the leading axes.

    Parameters:
      ``gate.weight`` ``(E, hidden)`` (``router.weight``, ``router.bias`` for gpt-oss),
      then the experts: per expert ``experts.{N}.{name}.weight`` stored stacked (a
      ``purelayers.params.Stacked`` node, as ``Repeat``'s blocks), or gpt-oss's fused
      arrays.

    Example:
      >>> moe = L.MixtureOfExperts(4, 2, 6)
      >>> params = moe.init(jax.random.key(0), (3, 8))
      >>> [k for k in pl.params.flatten(params)][:4]
      ['gate.weight', 'experts.0.w1.weight', 'experts.0.w2.weight', 'experts.0.w3.weight']
      >>> moe.apply(params, jnp.ones((3, 8))).shape
      (3, 8)

    torch equivalent: transformers' ``MixtralSparseMoeBlock``, ``Qwen3MoeSparseMoeBlock``,
    ``GptOssMLP`` (torch itself has no mixture-of-experts module).
    """

    accepts: ClassVar[tuple[str, ...]] = ("floating",)

    num_experts: int
    top_k: int
    intermediate_size: int
    _: dataclasses.KW_ONLY
    style: str = "mixtral"
    norm_topk_prob: bool = True
    alpha: float = 1.702
    limit: float = 7.0
    weight_init: Initializer | None = None

    def __post_init__(self):
        for name in ("num_experts", "top_k", "intermediate_size"):
            check_int("MixtureOfExperts", name, getattr(self, name))
        if self.top_k > self.num_experts:
            raise ValueError(
                f"MixtureOfExperts: top_k must be at most num_experts={self.num_experts}, "
                f"got {self.top_k}"
            )
        if self.style not in STYLES:
            raise ValueError(f"MixtureOfExperts: style must be one of {STYLES}, got {self.style!r}")

    @property
    def router_name(self) -> str:
        return "router" if self.style == "gpt_oss" else "gate"

    def children(self) -> dict[str, Layer]:
        fused = self.style == "gpt_oss"
        init = self.weight_init or normal(std=0.02)
        out: dict[str, Layer] = {
            self.router_name: Linear(
                self.num_experts, bias=fused, weight_init=init, bias_init=zeros()
            )
        }
        if not fused:
            out["experts"] = Repeat(
                ExpertMLP(_PER_EXPERT[self.style], self.intermediate_size, weight_init=init),
                self.num_experts,
            )
        return out

    def own_names(self) -> tuple[str, ...]:
        return ("experts",) if self.style == "gpt_oss" else ()

    def ordered(self, tree: dict[str, Any]) -> dict[str, Any]:
        out = {k: tree[k] for k in (self.router_name, "experts") if k in tree}
        return {**out, **{k: v for k, v in tree.items() if k not in out}}

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        shape = as_shape(shape)
        if not shape:
            raise LayerError("MixtureOfExperts", "input rank", "at least 1 (..., hidden)", 0)
        hidden, inter, e = shape[-1], self.intermediate_size, self.num_experts
        k_router, k_experts = jax.random.split(key)
        kids = self.children()
        params = {self.router_name: kids[self.router_name].init(k_router, shape, dtype)}
        if self.style != "gpt_oss":
            params["experts"] = kids["experts"].init(k_experts, (1, hidden), dtype)
            return params
        init = self.weight_init or normal(std=0.02)
        keys = jax.random.split(k_experts, 2)
        params["experts"] = {
            "gate_up_proj": init(keys[0], (e, hidden, 2 * inter), dtype),
            "gate_up_proj_bias": jnp.zeros((e, 2 * inter), dtype),
            "down_proj": init(keys[1], (e, inter, hidden), dtype),
            "down_proj_bias": jnp.zeros((e, hidden), dtype),
        }
        return params

    def _weights(self, experts: Any) -> tuple[tuple[Any, ...], Any, Any, Any, Any, bool]:
        """``(w_in, w_out, act, b_in, b_out, in_out)`` for ``F.moe_experts``."""
        if self.style == "gpt_oss":

            def act(gate_up):
                return F.clamped_swiglu(gate_up, self.alpha, self.limit)

            return (
                (experts["gate_up_proj"],),
                experts["down_proj"],
                act,
                (experts["gate_up_proj_bias"],),
                experts["down_proj_bias"],
                True,
            )
        gate, up, down = _PER_EXPERT[self.style]
        w = {name: experts[name]["weight"] for name in (gate, up, down)}
        return (w[gate], w[up]), w[down], _silu_glu, None, None, False

    def apply(
        self,
        params: Params,
        x: Any,
        *,
        key: jax.Array | None = None,
        train: bool = False,
        output_router_logits: bool = False,
        reference: bool = False,
    ):
        """``y`` (and the router logits with ``output_router_logits``); ``reference``
        runs the dense every-expert form, ``F.moe_experts_reference``."""
        x = jnp.asarray(x)
        lead = x.shape[:-1]
        flat = x.reshape(math.prod(lead), x.shape[-1])
        logits = self.call(self.router_name, params, flat)
        fused = self.style == "gpt_oss"
        weights, indices = F.top_k_routing(
            logits,
            self.top_k,
            softmax_first=not fused,
            normalize=self.style == "mixtral" or self.norm_topk_prob,
        )
        experts = params["experts"]
        if isinstance(experts, Mapping) and "0" in experts:  # per-block (Repeat.unstack)
            experts = kids_stack(experts)
        w_in, w_out, act, b_in, b_out, in_out = self._weights(experts)
        run = F.moe_experts_reference if reference else F.moe_experts
        y = run(flat, weights, indices, w_in, w_out, act=act, b_in=b_in, b_out=b_out, in_out=in_out)
        y = y.reshape(*lead, x.shape[-1])
        return (y, logits) if output_router_logits else y
