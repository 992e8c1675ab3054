"""LoRA supervised fine-tuning of a chat model on prompt/response pairs, with its
tokenizer's chat template; resumable; saved for PEFT and for transformers.

    python examples/finetune_chat.py --model FOLDER --data pairs.jsonl --out runs/chat
    python examples/finetune_chat.py --model FOLDER --data pairs.jsonl --out runs/chat --resume

``FOLDER`` is a Hugging Face causal LM folder with its tokenizer and a chat template
(GPT-2, Llama, Mistral or Qwen2: ``tokenizer.json``, ``tokenizer_config.json``, a
``chat_template``); ``pairs.jsonl`` holds one JSON object a line with ``"prompt"`` and
``"response"`` strings (and optionally ``"system"``; blank lines are skipped). A line
that is not such an object is an error naming the file and line; so is an example
longer than ``--max-length`` tokens, unless ``--truncation right`` cuts it (its last
tokens are lost; the count is printed and written to ``metrics.json``). No line is
skipped silently.

Each pair goes through the template (``M.sft_batch``): the labels are ``-100`` over
the prompt and the padding, so ``M.causal_lm_loss`` trains on the response (and its
end-of-turn token) alone. A held-out share of the pairs (``--valid-fraction``) gives
the validation loss every ``--eval-every`` steps. ``lora.wrap`` puts rank-``--r``
adapters on ``--targets`` (default: the attention's query and value projections) and
optax Adam trains those alone. The order of the batches is a function of the seed and
the step, so a resumed run sees what the uninterrupted run would.

Checkpoints: every ``--checkpoint-every`` steps, ``--out/checkpoints/<step>`` holds the
adapter arrays, the optimizer state, the step and the loss history, written with
orbax's ``CheckpointManager`` (the last ``--keep`` kept; with ``pl.params.save`` where
orbax is not installed). They are saved as flat lists of leaves (``state_leaves``),
which orbax takes whatever the tree's node types, and rebuilt on ``--resume`` from the
tree the run builds, after a check that every name and shape matches. ``--resume``
continues from the latest checkpoint, with the losses the uninterrupted run has.

At the end: ``--out/adapter`` (``peft.AutoPeftModelForCausalLM.from_pretrained`` loads
it with the base model it names), ``--out/merged`` (the adapters folded into the
weights, with the tokenizer files: ``transformers.AutoModelForCausalLM`` and
``AutoTokenizer`` load it), ``--out/loss.png`` and ``--out/metrics.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

import purelayers as pl
from purelayers import lora
from purelayers import models as M

# The attention's query and value projections of each family, as PEFT's target_modules.
QUERY_VALUE = {"gpt2": ("attn.c_attn",), "llama": ("q_proj", "v_proj")}
QUERY_VALUE["mistral"] = QUERY_VALUE["qwen2"] = QUERY_VALUE["llama"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True, help="a causal LM folder with a tokenizer")
    p.add_argument("--data", type=Path, required=True, help="JSONL of prompt/response pairs")
    p.add_argument("--out", type=Path, default=Path("runs/finetune_chat"))
    p.add_argument("--targets", nargs="+", default=None, help="target_modules (default: q, v)")
    p.add_argument("--r", type=int, default=8)
    p.add_argument("--lora-alpha", type=float, default=16)
    p.add_argument("--lora-dropout", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--truncation", choices=("error", "right"), default="error")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--valid-fraction", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--keep", type=int, default=2, help="checkpoints kept")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


# -- data -------------------------------------------------------------------------------


def read_pairs(path: Path) -> list[tuple[int, dict]]:
    """``(line number, example)`` for each non-blank line of a JSONL file; a line that
    is not an object with string ``prompt`` and ``response`` is a ``ValueError`` naming
    it."""
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            example = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{number}: not valid JSON ({e})") from None
        if not isinstance(example, dict) or not all(
            isinstance(example.get(k), str) for k in ("prompt", "response")
        ):
            raise ValueError(
                f'{path}:{number}: expected an object with "prompt" and "response" strings, '
                f"got {line[:80]!r}"
            )
        pairs.append((number, example))
    if not pairs:
        raise ValueError(f"{path}: no examples")
    return pairs


def encode(tokenizer, pairs, path: Path, max_length: int, truncation: str):
    """The pairs as ``(input_ids, attention_mask, labels)`` rows ``(n, max_length)``
    (right-padded, prompt and padding labelled -100), and how many were truncated; an
    example that does not fit is an error naming its line."""
    rows, truncated = [], 0
    for number, example in pairs:
        try:
            one = M.sft_batch(
                tokenizer,
                [example],
                max_length=max_length,
                pad_to="max_length",
                truncation=truncation,
            )
        except ValueError as e:
            raise ValueError(f"{path}:{number}: {e}") from None
        truncated += one["num_truncated"]
        rows.append([one[k][0] for k in ("input_ids", "attention_mask", "labels")])
    return tuple(np.stack(column) for column in zip(*rows, strict=True)), truncated


def batch_rows(step: int, n: int, batch_size: int, seed: int) -> np.ndarray:
    """The rows of step ``step``'s batch: epoch after epoch of a permutation drawn from
    ``(seed, epoch)``, a function of the step alone (so a resumed run continues it)."""
    positions = np.arange(step * batch_size, (step + 1) * batch_size)
    epochs, offsets = np.divmod(positions, n)
    orders = {e: np.random.default_rng([seed, e]).permutation(n) for e in set(epochs.tolist())}
    return np.array([orders[e][o] for e, o in zip(epochs.tolist(), offsets, strict=True)])


# -- checkpoints ------------------------------------------------------------------------


def state_leaves(tree) -> tuple[dict[str, np.ndarray], list[str]]:
    """A tree's leaves as ``{"000000": array, ...}`` (a plain dict every checkpointer
    takes) and their key paths (for error messages)."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    arrays = {f"{i:06d}": np.asarray(leaf) for i, (_, leaf) in enumerate(flat)}
    return arrays, [jax.tree_util.keystr(path) for path, _ in flat]


def from_leaves(template, arrays: dict[str, np.ndarray], names: list[str], where: Path):
    """``template``'s tree with the saved leaves; a ``ValueError`` naming the first
    leaf whose name or shape differs, before anything is used."""
    flat = jax.tree_util.tree_flatten_with_path(template)[0]
    want_names = [jax.tree_util.keystr(path) for path, _ in flat]
    if len(arrays) != len(flat) or names != want_names:
        first = next(
            (i for i, (a, b) in enumerate(zip(names, want_names, strict=False)) if a != b),
            min(len(names), len(want_names)),
        )
        got = names[first] if first < len(names) else "nothing"
        expected = want_names[first] if first < len(want_names) else "nothing"
        raise ValueError(
            f"--resume: {where} does not fit this run (another model, targets or optimizer?): "
            f"leaf {first} is {got}, this run has {expected}"
        )
    leaves = [arrays[f"{i:06d}"] for i in range(len(flat))]
    for a, (_, b), name in zip(leaves, flat, names, strict=True):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise ValueError(
                f"--resume: {where} does not fit this run: {name} is {a.dtype}{list(a.shape)}, "
                f"this run has {b.dtype}{list(b.shape)}"
            )
    return jax.tree.unflatten(jax.tree.structure(template), [jnp.asarray(a) for a in leaves])


class Checkpoints:
    """Numbered checkpoints under ``folder``: orbax's ``CheckpointManager`` (arrays and
    a JSON record), or ``pl.params.save`` and a JSON file where orbax is missing."""

    def __init__(self, folder: Path, keep: int):
        self.folder = folder.resolve()
        try:
            import orbax.checkpoint as ocp
        except ImportError:
            self.ocp = None
            self.folder.mkdir(parents=True, exist_ok=True)
            self.keep = keep
            return
        self.ocp = ocp
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self.manager = ocp.CheckpointManager(
            self.folder, options=options, item_names=("arrays", "record")
        )

    def latest(self) -> int | None:
        if self.ocp is not None:
            return self.manager.latest_step()
        steps = [int(p.name) for p in self.folder.iterdir() if p.name.isdigit()]
        return max(steps, default=None)

    def save(self, step: int, arrays: dict, record: dict) -> None:
        if self.ocp is not None:
            args = self.ocp.args.Composite(
                arrays=self.ocp.args.StandardSave(arrays), record=self.ocp.args.JsonSave(record)
            )
            self.manager.save(step, args=args)
            return
        folder = self.folder / str(step)
        folder.mkdir(exist_ok=True)
        pl.params.save(folder / "arrays.safetensors", arrays)
        (folder / "record.json").write_text(json.dumps(record))
        for old in sorted(int(p.name) for p in self.folder.iterdir() if p.name.isdigit())[
            : -self.keep
        ]:
            for file in (self.folder / str(old)).iterdir():
                file.unlink()
            (self.folder / str(old)).rmdir()

    def restore(self, step: int) -> tuple[dict, dict]:
        if self.ocp is not None:
            args = self.ocp.args.Composite(
                arrays=self.ocp.args.StandardRestore(), record=self.ocp.args.JsonRestore()
            )
            got = self.manager.restore(step, args=args)
            return {k: np.asarray(v) for k, v in got["arrays"].items()}, dict(got["record"])
        folder = self.folder / str(step)
        arrays = pl.params.load(folder / "arrays.safetensors")
        return dict(arrays), json.loads((folder / "record.json").read_text())

    def close(self) -> None:
        if self.ocp is not None:
            self.manager.wait_until_finished()
            self.manager.close()


# -- the run ----------------------------------------------------------------------------


def plot_loss(history: dict, path: Path) -> None:
    """Training and held-out loss against the step, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(history["step"], history["loss"], label="training batch")
    ax.plot(history["eval_step"], history["valid_loss"], "o-", label="held out")
    ax.set(xlabel="step", ylabel="loss (nats/token, response only)", title="chat fine-tuning")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(args: argparse.Namespace):
    """Train (or resume); returns ``(metrics, lmodel, params)``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{args.model}: the tokenizer has no chat template")
    pairs = read_pairs(args.data)
    (ids, mask, labels), truncated = encode(
        tokenizer, pairs, args.data, args.max_length, args.truncation
    )
    order = np.random.default_rng(args.seed).permutation(len(pairs))
    n_valid = max(1, round(args.valid_fraction * len(pairs))) if len(pairs) > 1 else 0
    valid_rows, train_rows = order[:n_valid], order[n_valid:]
    if len(train_rows) == 0:
        raise ValueError(f"{args.data}: no examples left to train on after the held-out share")

    model, base = M.from_pretrained(args.model, dtype=jnp.float32)
    targets = tuple(args.targets or QUERY_VALUE[model.config.model_type])
    lmodel = lora.wrap(
        model, targets, r=args.r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout
    )
    params = lora.init(lmodel, jax.random.key(args.seed), base)
    trainable = lora.trainable(params)
    optimizer = optax.multi_transform(
        {True: optax.adam(args.lr), False: optax.set_to_zero()}, trainable
    )
    opt_state = optimizer.init(params)
    dropout_key = jax.random.key(args.seed + 1)

    def adapters(tree):  # the trainable leaves only (the base weights are the folder's), by path
        flat = jax.tree_util.tree_flatten_with_path(tree)[0]
        marks = jax.tree.leaves(trainable)
        return {jax.tree_util.keystr(p): a for (p, a), t in zip(flat, marks, strict=True) if t}

    def with_adapters(tree, values):
        leaves, it = jax.tree.leaves(tree), iter(values.values())
        new = [
            next(it) if t else a for a, t in zip(leaves, jax.tree.leaves(trainable), strict=True)
        ]
        return jax.tree.unflatten(jax.tree.structure(tree), new)

    def loss_fn(params, batch, key):
        ids, mask, labels = batch
        logits = lmodel.apply(params, ids, attention_mask=mask, key=key, train=True)
        return M.causal_lm_loss(logits, labels)

    @jax.jit
    def train_step(params, opt_state, batch, step):
        key = jax.random.fold_in(dropout_key, step)
        value, grads = jax.value_and_grad(loss_fn)(params, batch, key)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    @jax.jit
    def held_out(params, batch):
        ids, mask, labels = batch
        return M.causal_lm_loss(lmodel.apply(params, ids, attention_mask=mask), labels)

    def rows(which):
        return tuple(jnp.asarray(a[which]) for a in (ids, mask, labels))

    valid = rows(valid_rows) if n_valid else None
    checkpoints = Checkpoints(args.out / "checkpoints", args.keep)
    history = {"step": [], "loss": [], "eval_step": [], "valid_loss": []}
    start = 0
    latest = checkpoints.latest()
    if args.resume and latest is not None:
        arrays, record = checkpoints.restore(latest)
        where = checkpoints.folder / str(latest)
        saved = from_leaves((adapters(params), opt_state), arrays, record["names"], where)
        params, opt_state = with_adapters(params, saved[0]), saved[1]
        start, history = record["step"], record["history"]
        print(f"resumed from {where} at step {start}")
    elif latest is not None:
        raise ValueError(
            f"{checkpoints.folder} holds checkpoints (latest step {latest}): pass --resume, "
            "or another --out"
        )

    def checkpoint(step: int) -> None:
        arrays, names = state_leaves((adapters(params), opt_state))
        checkpoints.save(step, arrays, {"step": step, "names": names, "history": history})

    began = time.perf_counter()
    bar = common.progress(args.steps - start, "finetune_chat")
    for step in range(start, args.steps):
        batch = rows(train_rows[batch_rows(step, len(train_rows), args.batch_size, args.seed)])
        params, opt_state, loss = train_step(params, opt_state, batch, step)
        done = step + 1
        history["step"].append(done)
        history["loss"].append(float(loss))
        if valid is not None and (done % args.eval_every == 0 or done == args.steps):
            history["eval_step"].append(done)
            history["valid_loss"].append(float(held_out(params, valid)))
        if done % args.checkpoint_every == 0 or done == args.steps:
            checkpoint(done)
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss):.3f}")
    bar.close()
    checkpoints.close()
    seconds = time.perf_counter() - began

    out = args.out
    adapter = lora.save_adapter(out / "adapter", lmodel, params)
    merged_model, merged = lora.merge(lmodel, params)
    merged_folder = M.save_pretrained(
        out / "merged", merged_model, merged, tokenizer_from=args.model
    )
    plot_loss(history, out / "loss.png")
    metrics = {
        "model": str(args.model),
        "examples": len(pairs),
        "held_out": int(n_valid),
        "truncated": int(truncated),
        "target_modules": list(targets),
        "steps": args.steps,
        "resumed_from": start if args.resume else None,
        "seconds": round(seconds, 2),
        "trainable_params": int(sum(a.size for a in adapters(params).values())),
        "valid_loss": history["valid_loss"][-1] if history["valid_loss"] else None,
        "loss_curve": history,
        "adapter": str(adapter),
        "merged": str(merged_folder),
        "checkpoints": "orbax" if checkpoints.ocp is not None else "pl.params",
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    return metrics, lmodel, params


def main(argv=None) -> dict:
    metrics, _, _ = run(parse_args(argv))
    print(f"LoRA on {metrics['target_modules']} of {metrics['model']}")
    print(
        f"{metrics['examples']} examples ({metrics['held_out']} held out, "
        f"{metrics['truncated']} truncated to --max-length)"
    )
    curve = metrics["loss_curve"]
    if curve["valid_loss"]:
        print("held-out loss: " + " -> ".join(f"{v:.3f}" for v in curve["valid_loss"]))
    print(f"adapter (PEFT): {metrics['adapter']}")
    print(f"merged model (transformers): {metrics['merged']}")
    return metrics


if __name__ == "__main__":
    main()
