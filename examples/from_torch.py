"""PyTorch to JAX and back, through one safetensors file each way.

    python examples/from_torch.py          # needs torch (pip install torch==2.13.0)

1. Build a digits classifier in torch and train it a few steps there.
2. Save its ``state_dict()`` with ``safetensors.torch.save_file``.
3. Load that file into the equivalent purelayers model by name (``pl.params.load_into``)
   and show both frameworks give the same logits.
4. Fine-tune in JAX with optax.
5. Save with ``pl.params.save``; torch loads it with ``load_state_dict(strict=True)`` and
   reproduces the JAX logits.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import jax
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

import purelayers as pl
from purelayers import layers as L


def torch_model(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(16 * 4 * 4, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 10),
    )  # fmt: skip


def jax_model() -> L.Sequential:
    return L.Sequential(
        L.Conv2d(16, 3, padding=1), L.ReLU(), L.MaxPool2d(2), L.Flatten(),
        L.Linear(64), L.LayerNorm(), L.GELU(), L.Linear(10),
    )  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--torch-steps", type=int, default=100, help="training steps in torch")
    p.add_argument("--steps", type=int, default=300, help="fine-tuning steps in JAX")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/from_torch"))
    return p.parse_args(argv)


def main(argv=None) -> dict:
    import torch
    from safetensors.torch import load_file, save_file

    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    x_tr, y_tr, x_te, y_te = common.digits(seed=args.seed, images=True)
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)

    # 1-2. train in torch, save its state_dict
    net = torch_model(torch)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    batches = common.batches(rng, len(x_tr), args.batch_size)
    for _, idx in zip(range(args.torch_steps), batches, strict=False):
        logits = net(torch.tensor(x_tr[idx]))
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(y_tr[idx]).long())
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    save_file(net.state_dict(), args.out / "from_torch.safetensors")

    # 3. load by name into purelayers; same logits
    model = jax_model()
    template = model.init(jax.random.key(0), (1, *x_tr.shape[1:]))
    params = pl.params.load_into(args.out / "from_torch.safetensors", template)
    with torch.no_grad():
        torch_logits = net(torch.tensor(x_te)).numpy()
    jax_logits = np.asarray(model.apply(params, x_te))
    gap_in = float(np.abs(torch_logits - jax_logits).max())
    acc_torch = float((torch_logits.argmax(-1) == y_te).mean())
    print(f"torch -> JAX: max |logit difference| {gap_in:.2e}; accuracy {acc_torch:.4f} in both")

    # 4. fine-tune in JAX
    optimizer = optax.adam(1e-3)
    opt_state = optimizer.init(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, x, y):
        def loss_fn(p):
            return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    bar = common.progress(args.steps, "fine-tune in JAX")
    for _, idx in zip(range(args.steps), batches, strict=False):
        params, opt_state, loss = step(params, opt_state, x_tr[idx], y_tr[idx])
        bar.set_postfix(loss=f"{float(loss):.4f}")
        bar.update(1)
    bar.close()
    jax_logits = np.asarray(jax.jit(model.apply)(params, x_te))
    acc_jax = float((jax_logits.argmax(-1) == y_te).mean())

    # 5. back to torch
    pl.params.save(args.out / "to_torch.safetensors", params, model=model)
    net.load_state_dict(load_file(args.out / "to_torch.safetensors"), strict=True)
    with torch.no_grad():
        back = net(torch.tensor(x_te)).numpy()
    gap_out = float(np.abs(back - jax_logits).max())
    print(f"JAX -> torch: max |logit difference| {gap_out:.2e}")
    print(f"test accuracy: {acc_torch:.4f} after torch, {acc_jax:.4f} after JAX fine-tuning")
    return {"gap_in": gap_in, "gap_out": gap_out, "acc_torch": acc_torch, "acc_jax": acc_jax}


if __name__ == "__main__":
    main()
