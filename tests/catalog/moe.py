"""Mixture of experts: ``MixtureOfExperts`` against a torch twin written here (torch
has no mixture-of-experts module): Mixtral's block, per-expert ``w1``/``w2``/``w3``."""

from __future__ import annotations

from purelayers import layers as L
from tests.case import Case


def _mixtral_twin(t):
    nn = t.nn

    class Expert(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(4, 6, bias=False)
            self.w2 = nn.Linear(6, 4, bias=False)
            self.w3 = nn.Linear(4, 6, bias=False)

        def forward(self, x):
            return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(4, 3, bias=False)
            self.experts = nn.ModuleList(Expert() for _ in range(3))

        def forward(self, x):
            probs = t.softmax(self.gate(x), dim=-1)
            top, idx = t.topk(probs, 2, dim=-1)
            top = top / top.sum(-1, keepdim=True)
            out = t.zeros_like(x)
            for j in range(2):
                for e, expert in enumerate(self.experts):
                    chosen = (idx[..., j] == e).to(x.dtype)[..., None]
                    out = out + chosen * top[..., j : j + 1] * expert(x)
            return out

    return Block()


CASES: list = [
    Case(
        "MixtureOfExperts",
        lambda: L.MixtureOfExperts(3, 2, 6),
        (5, 4),
        (5, 4),
        _mixtral_twin,
        gradcheck="top-k routing is piecewise constant in its choice; values and gradients "
        "are compared with the twin's",
    ),
]
