"""Torch twins of the layers ``torch.nn`` has no class for, written in the test with our
names (so a ``state_dict`` loads by name), and ``randomize`` for every twin's weights.

Each builder takes the ``torch`` module (the suite's fixture) first: the library never
imports torch, and neither does this file at import time.
"""

from __future__ import annotations

import jax
import numpy as np

from purelayers.params import flatten, load_state_dict


def randomize(torch, module, seed: int = 1):
    """Every parameter and floating buffer of ``module`` drawn anew (``N(0, 0.5^2)``;
    running variances from ``U(0.5, 1.5)``), since default inits (zero biases, unit
    norms) hide mapping mistakes. Returns ``module``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=gen) + 0.5)
            else:
                t.copy_(torch.randn(t.shape, generator=gen) * 0.5)
    return module


def load_from_torch(layer, module, shape, dtype=np.float32):
    """``layer``'s params filled from ``module``'s parameters by name; the names and
    their order must equal ``module.named_parameters()``. Nothing is initialized: the
    template is ``jax.eval_shape`` of ``layer.init``."""
    template = layer.ordered(
        jax.eval_shape(lambda k: layer.init(k, shape, dtype), jax.random.key(0))
    )
    named = {k: v.detach() for k, v in module.named_parameters()}
    ours = list(flatten(template))
    if ours != list(named):
        raise AssertionError(f"names/order differ:\n ours  {ours}\n torch {list(named)}")
    return load_state_dict(template, named)


def rotate_half(torch, x, theta: float = 10000.0):
    """Rotate-half RoPE of ``x`` ``(..., seq, head_dim)`` at positions ``0..seq-1``."""
    d, t = x.shape[-1], x.shape[-2]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.arange(t, dtype=torch.float32)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], -1)
    rot = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * ang.cos() + rot * ang.sin()


def rope(torch, theta: float = 10000.0):
    """``RotaryEmbedding``: ``(batch, seq, heads, head_dim)`` in, the same out."""

    class Rope(torch.nn.Module):
        def forward(self, x):
            return rotate_half(torch, x.transpose(1, 2), theta).transpose(1, 2)

    return Rope()


def attention(
    torch,
    kind: str,
    e: int,
    h: int,
    *,
    kv: int | None = None,
    hd: int | None = None,
    bias: bool = True,
    out_bias: bool | None = None,
    causal: bool = False,
    theta: float | None = None,
):
    """Grouped-query self-attention with our names: ``kind`` ``"fused"`` (``qkv``,
    ``out``: ``MultiHeadAttention``), ``"separate"`` (``q_proj``/``k_proj``/``v_proj``,
    ``o_proj``: ``Attention``) or ``"core"`` (no projections: ``AttentionCore``);
    rotate-half RoPE where ``theta`` is given."""
    nn, F = torch.nn, torch.nn.functional
    kv, hd = kv or h, hd or e // h
    out_bias = bias if out_bias is None else out_bias

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            if kind == "fused":
                self.qkv = nn.Linear(e, (h + 2 * kv) * hd, bias=bias)
                self.out = nn.Linear(h * hd, e, bias=out_bias)
            elif kind == "separate":
                self.q_proj = nn.Linear(e, h * hd, bias=bias)
                self.k_proj = nn.Linear(e, kv * hd, bias=bias)
                self.v_proj = nn.Linear(e, kv * hd, bias=bias)
                self.o_proj = nn.Linear(h * hd, e, bias=out_bias)

        def forward(self, x):
            b, t, _ = x.shape
            if kind == "separate":
                q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            elif kind == "fused":
                q, k, v = self.qkv(x).split([h * hd, kv * hd, kv * hd], -1)
            else:
                q = k = v = x
            q = q.reshape(b, t, h, q.shape[-1] // h).transpose(1, 2)
            k = k.reshape(b, t, kv, k.shape[-1] // kv).transpose(1, 2)
            v = v.reshape(b, t, kv, v.shape[-1] // kv).transpose(1, 2)
            if theta is not None:
                q, k = rotate_half(torch, q, theta), rotate_half(torch, k, theta)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            a = a.transpose(1, 2).reshape(b, t, a.shape[1] * a.shape[-1])
            if kind == "core":
                return a
            return (self.out if kind == "fused" else self.o_proj)(a)

    return Attn()


def block(torch, e, h, *, kv=None, llama=False, hidden=None, act="gelu", attn=None, eps=1e-5):
    """``TransformerBlock``: pre-norm ``ln1``, ``attn``, ``ln2``, ``fc``, ``proj``.
    GPT-2 style by default (LayerNorm, causal fused attention, biases, GELU); ``llama``:
    RMSNorm, RoPE, grouped-query attention, SwiGLU with ``fc`` packing gate then up, no
    biases. ``attn``: another attention twin in place of the default. ``act="prelu"``:
    a ``PReLU`` module ``act`` between ``fc`` and ``proj``."""
    nn, F = torch.nn, torch.nn.functional
    hidden = hidden or 4 * e

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            norm = (lambda: nn.RMSNorm(e, eps=eps)) if llama else (lambda: nn.LayerNorm(e, eps))
            self.ln1 = norm()
            self.attn = attn or attention(
                torch, "fused", e, h, kv=kv, bias=not llama, causal=True,
                theta=10000.0 if llama else None,
            )  # fmt: skip
            self.ln2 = norm()
            self.fc = nn.Linear(e, hidden * (2 if llama else 1), bias=not llama)
            if act == "prelu":
                self.act = nn.PReLU()
            self.proj = nn.Linear(hidden, e, bias=not llama)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            z = self.fc(self.ln2(x))
            if llama:
                gate, up = z.chunk(2, -1)
                z = F.silu(gate) * up
            elif act == "prelu":
                z = self.act(z)
            else:
                z = F.gelu(z, approximate="tanh" if act == "gelu_tanh" else "none")
            return x + self.proj(z)

    return Block()


def swiglu(torch):
    """``SwiGLU``: ``silu(gate) * up`` over the two halves of the last axis."""

    class SwiGLU(torch.nn.Module):
        def forward(self, x):
            gate, up = x.chunk(2, -1)
            return torch.nn.functional.silu(gate) * up

    return SwiGLU()


def exp(torch):
    """``Exponential``."""

    class Exp(torch.nn.Module):
        def forward(self, x):
            return torch.exp(x)

    return Exp()


def tied_lm(torch, vocab: int, dim: int):
    """``Tied(Sequential(emb=Embedding, head=Linear without bias))`` with ``head.weight``
    the same tensor as ``emb.weight``."""
    nn = torch.nn

    class TiedLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, dim)
            self.head = nn.Linear(dim, vocab, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids):
            return self.head(self.emb(ids))

    return TiedLM()
