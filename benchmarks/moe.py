"""The mixture-of-experts layer's expert products: the dropless top-k dispatch
(``F.moe_experts``) against the dense every-expert-on-every-token form
(``F.moe_experts_reference``), forward and forward+backward, at 8 and 32 experts.

    python -m benchmarks.moe [--tokens 1024] [--hidden 256] [--inter 512] [--top-k 2]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from purelayers import functional as F


def _glu(g, u):
    return jax.nn.silu(g) * u


def _time(fn, *args, repeats: int = 5) -> float:
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def run(tokens: int, hidden: int, inter: int, top_k: int, experts: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    r = lambda *s: jnp.asarray(rng.standard_normal(s).astype(np.float32) * 0.1)  # noqa: E731
    x, logits = r(tokens, hidden), r(tokens, experts)
    w_in = (r(experts, inter, hidden), r(experts, inter, hidden))
    w_out = r(experts, hidden, inter)
    weights, idx = F.top_k_routing(logits, top_k)
    out = {}
    for name, f in (("dropless", F.moe_experts), ("dense", F.moe_experts_reference)):
        fwd = jax.jit(lambda x, w_in, w_out, f=f: f(x, weights, idx, w_in, w_out, act=_glu))
        grad = jax.jit(
            jax.grad(
                lambda x, w_in, w_out, f=f: jnp.sum(f(x, weights, idx, w_in, w_out, act=_glu)),
                argnums=(0, 1, 2),
            )
        )
        out[f"{name} fwd"] = _time(fwd, x, w_in, w_out)
        out[f"{name} fwd+bwd"] = _time(grad, x, w_in, w_out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--inter", type=int, default=512)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--experts", type=int, nargs="+", default=[8, 32])
    a = p.parse_args()
    print(f"device: {jax.devices()[0].platform}; tokens {a.tokens}, hidden {a.hidden}, "
          f"inter {a.inter}, top_k {a.top_k}; best of 5, ms")  # fmt: skip
    cols = ["dropless fwd", "dense fwd", "dropless fwd+bwd", "dense fwd+bwd"]
    print(f"{'experts':>8} " + " ".join(f"{c:>17}" for c in cols))
    for e in a.experts:
        got = run(a.tokens, a.hidden, a.inter, a.top_k, e)
        print(f"{e:>8} " + " ".join(f"{got[c]:>17.2f}" for c in cols))


if __name__ == "__main__":
    main()
