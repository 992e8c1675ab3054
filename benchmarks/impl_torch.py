"""PyTorch (CPU, eager) versions of the workloads. purelayers' names are PyTorch's
``state_dict`` names, so the shared weights load with ``load_state_dict(strict=True)``.
Attention is ``F.scaled_dot_product_attention(is_causal=True)`` behind the same packed
``qkv``/``out`` projections as purelayers' ``MultiHeadAttention``.
"""

from __future__ import annotations

import numpy as np

from benchmarks.harness import TorchModel
from benchmarks.workloads import Workload


def _modules(w: Workload):
    from torch import nn
    from torch.nn import functional as F

    class Attention(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(d, 3 * d)
            self.out = nn.Linear(d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).unbind(2)
            q, k, v = (a.transpose(1, 2) for a in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(y.transpose(1, 2).reshape(b, t, d))

    class Block(nn.Module):
        def __init__(self, d, heads):
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.attn = Attention(d, heads)
            self.ln2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(
                nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d)
            )

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.blocks = nn.Sequential(
                *(Block(d, w.dims["heads"]) for _ in range(w.dims["layers"]))
            )
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, w.classes)

        def forward(self, x):
            return self.head(self.ln_f(self.blocks(x)))

    class LSTMClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(w.x_shape[-1], w.dims["hidden"])
            self.head = nn.Linear(w.dims["hidden"], w.classes)

        def forward(self, x):
            out, _ = self.lstm(x)
            return self.head(out[-1])

    if w.name == "mlp":
        h = w.dims["hidden"]
        return nn.Sequential(
            nn.Linear(w.x_shape[-1], h),
            nn.ReLU(),
            nn.Linear(h, h),
            nn.ReLU(),
            nn.Linear(h, w.classes),
        )
    if w.name == "cnn":
        c1, c2, h = w.dims["c1"], w.dims["c2"], w.dims["hidden"]
        side = w.x_shape[-1] // 4
        return nn.Sequential(
            nn.Conv2d(w.x_shape[1], c1, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(c2 * side * side, h),
            nn.ReLU(),
            nn.Linear(h, w.classes),
        )
    if w.name == "transformer":
        return GPT(w.x_shape[-1])
    return LSTMClassifier()


def build(w: Workload, flat: dict, x: np.ndarray, y: np.ndarray) -> TorchModel:
    import torch

    module = _modules(w)
    module.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in flat.items()})
    module.train()
    return TorchModel(module, torch.from_numpy(x), torch.from_numpy(y).long())
