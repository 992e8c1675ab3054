"""Direct preference optimization of a tiny character GPT-2, against its SFT start.

    python examples/dpo.py              # about 3 minutes on 2 CPU cores
    python examples/dpo.py --steps 50   # a quick look

Supervised fine-tuning (SFT) first: ``purelayers.models.GPT2LMHeadModel`` with a tiny
``GPT2Config`` learns next characters of Python's standard-library docstrings
interleaved with one-line reviews, ``"the json module is awful.\\n"``: three reviews in
four use a negative word, so the SFT model mostly completes a review negatively.

Then DPO (Rafailov et al., 2023) on preference pairs that share a review's prompt
``"the NAME module is "``: chosen ends with a positive word (``good``, ``clear``, ...),
rejected with a negative one. The reference model is a frozen copy of the SFT params
(no gradient flows into it) and the loss is::

    -log sigmoid(beta * ((log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected))))

with ``log pi(y)`` the summed log-probability of the completion's characters. The
figures are measured on pairs and prompts of modules that DPO never trains on: the
preference accuracy (implicit reward of chosen above rejected; at the SFT start both
rewards are zero, so the SFT figure counts log pi(chosen) > log pi(rejected)), the mean
reward margin ``beta * (...)``, and the fraction of greedy completions that are a
positive word, at the SFT start and after DPO.

Outputs in ``--out``: ``metrics.json`` and ``margin.png`` (held-out margin and
accuracy during DPO, rule-following before and after). A default run goes from 0.0
preference accuracy and no positive greedy completion at the SFT start to 1.0 for
both, with a mean reward margin of about 7.6 (numbers in the gallery notes).
"""

from __future__ import annotations

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
from purelayers import models as M

POSITIVE = ("good", "great", "clear", "useful", "handy", "solid", "neat", "elegant")
NEGATIVE = ("bad", "awful", "broken", "slow", "buggy", "ugly", "clumsy", "confusing")
PROMPT = "the {} module is "
COMPLETION = 12  # characters generated after a prompt: the longest word and "."


def parse_args(argv=None):
    p = common.gallery_parser("dpo", __doc__, steps=300)
    p.add_argument("--sft-steps", type=common.positive_int, default=800)
    p.add_argument("--batch-size", type=common.positive_int, default=32)
    p.add_argument("--seq-len", type=common.positive_int, default=64, help="SFT window")
    p.add_argument("--width", type=common.positive_int, default=96, help="n_embd")
    p.add_argument("--heads", type=common.positive_int, default=4)
    p.add_argument("--depth", type=common.positive_int, default=2, help="n_layer")
    p.add_argument("--beta", type=float, default=0.1, help="DPO temperature")
    p.add_argument("--sft-lr", type=float, default=2e-3)
    p.add_argument("--lr", type=float, default=5e-4, help="DPO learning rate")
    p.add_argument("--chars", type=common.positive_int, default=300_000, help="docstring text")
    p.add_argument("--eval-every", type=common.positive_int, default=20)
    args = p.parse_args(argv)
    for name in ("sft_lr", "lr", "beta"):
        if not getattr(args, name) > 0:
            p.error(
                f"argument --{name.replace('_', '-')}: must be positive, got {getattr(args, name)}"
            )
    return args


def review(rng, name: str, p_positive: float) -> str:
    words = POSITIVE if rng.random() < p_positive else NEGATIVE
    return PROMPT.format(name) + words[rng.integers(len(words))] + ".\n"


def sft_corpus(rng, chars: int) -> str:
    """Docstring paragraphs, each followed by three reviews of random modules (one in
    four positive)."""
    parts = []
    for paragraph in common.stdlib_text(chars).split("\n\n"):
        parts.append(paragraph + "\n\n")
        parts += [review(rng, rng.choice(common.STDLIB_MODULES), 0.25) for _ in range(3)]
    return "".join(parts)


def encode_pairs(vocab, rng, names, count: int, length: int):
    """``count`` (chosen, rejected) pairs as ids ``(2, count, length)`` padded with
    spaces, and the mask of each completion's characters ``(2, count, length)``."""
    ids = np.full((2, count, length), vocab.index[" "], np.int32)
    mask = np.zeros((2, count, length), np.float32)
    for i in range(count):
        prompt = PROMPT.format(names[rng.integers(len(names))])
        for j, words in enumerate((POSITIVE, NEGATIVE)):
            full = vocab.encode(prompt + words[rng.integers(len(words))] + ".")
            ids[j, i, : len(full)] = full
            mask[j, i, len(prompt) : len(full)] = 1.0
    return ids, mask


def main(argv=None) -> dict:
    args = parse_args(argv)
    rng = np.random.default_rng(args.seed)
    corpus = sft_corpus(rng, args.chars)
    vocab = common.CharVocab(corpus)
    corpus_ids = vocab.encode(corpus)
    names = list(common.STDLIB_MODULES)
    rng.shuffle(names)
    dpo_names, held_out_names = names[: len(names) * 3 // 4], names[len(names) * 3 // 4 :]
    pair_len = max(len(PROMPT.format(n)) for n in names) + COMPLETION

    config = M.GPT2Config(
        vocab_size=len(vocab), n_positions=max(args.seq_len, pair_len), n_embd=args.width,
        n_layer=args.depth, n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    model = M.GPT2LMHeadModel(config)
    key = jax.random.key(args.seed)
    params = model.init(key, (args.batch_size, args.seq_len))

    # --- SFT: next-character prediction on the corpus --------------------------------
    sft_opt = optax.adamw(
        optax.warmup_cosine_decay_schedule(0.0, args.sft_lr, 50, max(args.sft_steps, 51)), 1e-4
    )
    sft_step = common.optax_step(common.next_token_loss(model.apply), sft_opt)
    opt_state = sft_opt.init(params)
    start = time.perf_counter()
    bar = common.progress(args.sft_steps + args.steps, "dpo")
    bar.set_description("sft")
    for _ in range(args.sft_steps):
        batch = common.windows(rng, corpus_ids, args.batch_size, args.seq_len)
        params, opt_state, loss = sft_step(params, opt_state, batch)
        bar.update(1)
    bar.set_postfix(sft_loss=f"{float(loss):.3f}")
    sft_seconds = time.perf_counter() - start

    # --- DPO against the frozen SFT params ---------------------------------------------
    def completion_logp(params, ids, mask):
        """Summed log-probability of the masked characters, one figure per sequence."""
        logits = model.apply(params, ids[:, :-1])
        logp = -optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:])
        return jnp.sum(logp * mask[:, 1:], axis=-1)

    def rewards(params, reference, ids, mask):
        """Implicit rewards ``beta * (log pi - log ref)`` of chosen and rejected."""
        both_ids, both_mask = ids.reshape(-1, ids.shape[-1]), mask.reshape(-1, ids.shape[-1])
        ratio = completion_logp(params, both_ids, both_mask) - jax.lax.stop_gradient(
            completion_logp(reference, both_ids, both_mask)
        )
        return args.beta * ratio.reshape(2, -1)

    def dpo_loss(params, batch):
        reference, ids, mask = batch
        chosen, rejected = rewards(params, reference, ids, mask)
        return -jnp.mean(jax.nn.log_sigmoid(chosen - rejected))

    @jax.jit
    def evaluate(params, reference, ids, mask):
        chosen, rejected = rewards(params, reference, ids, mask)
        logp_chosen, logp_rejected = (
            completion_logp(params, i, m) for i, m in zip(ids, mask, strict=True)
        )
        return {
            "accuracy": jnp.mean(chosen > rejected),
            "margin": jnp.mean(chosen - rejected),
            "logp_accuracy": jnp.mean(logp_chosen > logp_rejected),
        }

    reference = jax.tree.map(jnp.copy, params)  # frozen SFT copy
    held_ids, held_mask = encode_pairs(
        vocab, np.random.default_rng(1), held_out_names, 256, pair_len
    )
    sft_eval = {k: float(v) for k, v in evaluate(params, reference, held_ids, held_mask).items()}
    greedy = make_greedy(model, vocab, held_out_names, pair_len)
    sft_rule, timings = greedy(params, timed=True)

    dpo_opt = optax.adam(args.lr)
    dpo_step = common.optax_step(dpo_loss, dpo_opt)
    opt_state = dpo_opt.init(params)
    history: dict[str, list[float]] = {"step": [0], "margin": [0.0], "accuracy": []}
    history["accuracy"].append(sft_eval["logp_accuracy"])
    bar.set_description("dpo")
    start_dpo = time.perf_counter()
    for i in range(1, args.steps + 1):
        ids, mask = encode_pairs(vocab, rng, dpo_names, args.batch_size, pair_len)
        params, opt_state, loss = dpo_step(params, opt_state, (reference, ids, mask))
        if i % args.eval_every == 0 or i == args.steps:
            e = evaluate(params, reference, held_ids, held_mask)
            history["step"].append(i)
            history["margin"].append(float(e["margin"]))
            history["accuracy"].append(float(e["accuracy"]))
            bar.set_postfix(loss=f"{float(loss):.3f}", margin=f"{history['margin'][-1]:.2f}")
        bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start
    dpo_eval = {k: float(v) for k, v in evaluate(params, reference, held_ids, held_mask).items()}
    dpo_rule, _ = greedy(params)

    metrics = {
        "preference_accuracy_sft": sft_eval["logp_accuracy"],
        "preference_accuracy_dpo": dpo_eval["accuracy"],
        "reward_margin_sft": sft_eval["margin"],
        "reward_margin_dpo": dpo_eval["margin"],
        "logp_accuracy_dpo": dpo_eval["logp_accuracy"],
        "greedy_positive_sft": sft_rule,
        "greedy_positive_dpo": dpo_rule,
        "steps": args.steps,
        "sft_steps": args.sft_steps,
        "seconds": seconds,
        "sft_seconds": sft_seconds,
        "dpo_seconds": time.perf_counter() - start_dpo,
        **timings,
        "parameters": pl.params.count(params),
        "history": history,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    plot(history, metrics, args.out / "margin.png")
    common.write_metrics(args.out, metrics)
    print(
        f"SFT {args.sft_steps} + DPO {args.steps} steps in {seconds:.1f} s; outputs in {args.out}"
    )
    print(
        f"held-out preference accuracy {metrics['preference_accuracy_sft']:.3f} (SFT) -> "
        f"{metrics['preference_accuracy_dpo']:.3f} (DPO), reward margin "
        f"{metrics['reward_margin_dpo']:.3f}; greedy positive completions "
        f"{sft_rule:.3f} -> {dpo_rule:.3f}"
    )
    return metrics


def make_greedy(model, vocab, names, length: int):
    """``greedy(params, timed=False) -> (fraction, timings)``: the greedy completions of
    ``"the NAME module is "`` for ``names``, and the fraction that are a positive word.

    The prompts lie right-padded in one ``(N, length)`` buffer; each step runs the model
    on the whole buffer (no KV cache: 40 characters, two layers) and writes each row's
    argmax after its prompt. Timed both ways, the steps as one ``lax.fori_loop`` in one
    jitted call and a Python loop over a jitted step; the ``fori_loop`` is used (no
    convolutions here, so none of XLA:CPU's slow convolutions inside loops, and one
    dispatch instead of twelve).
    """
    prompts = [vocab.encode(PROMPT.format(n)) for n in names]
    buffer = np.full((len(names), length), vocab.index[" "], np.int32)
    for row, p in enumerate(prompts):
        buffer[row, : len(p)] = p
    lengths = jnp.asarray([len(p) for p in prompts])
    rows = jnp.arange(len(names))

    def step(k, params, buffer):
        logits = model.apply(params, buffer)
        nxt = jnp.argmax(logits[rows, lengths + k - 1], axis=-1).astype(jnp.int32)
        return buffer.at[rows, lengths + k].set(nxt)

    looped = jax.jit(
        lambda params, buf: jax.lax.fori_loop(0, COMPLETION, lambda k, b: step(k, params, b), buf)
    )
    one = jax.jit(step)

    def greedy(params, timed: bool = False):
        out = np.asarray(looped(params, buffer))
        timings = {}
        if timed:
            t0 = time.perf_counter()
            looped(params, buffer).block_until_ready()
            timings["generate_fori_loop_ms_per_step"] = (
                1e3 * (time.perf_counter() - t0) / COMPLETION
            )
            buf = one(0, params, buffer)  # compile
            t0 = time.perf_counter()
            buf = jnp.asarray(buffer)
            for k in range(COMPLETION):
                buf = one(k, params, buf)
            buf.block_until_ready()
            timings["generate_python_loop_ms_per_step"] = (
                1e3 * (time.perf_counter() - t0) / COMPLETION
            )
        words = [
            vocab.decode(row[n : n + COMPLETION]).split(".")[0]
            for row, n in zip(out, np.asarray(lengths), strict=True)
        ]
        return float(np.mean([w in POSITIVE for w in words])), timings

    return greedy


def plot(history: dict, metrics: dict, path) -> None:
    fig, (a, b) = common.figure(1, 2, figsize=(9, 3.2))
    a.plot(history["step"], history["margin"], color="tab:blue", label="margin")
    a.set(xlabel="DPO step", ylabel="reward margin (held out)", title="chosen - rejected")
    twin = a.twinx()
    twin.plot(history["step"], history["accuracy"], color="tab:orange", ls="--", label="accuracy")
    fig.legend(loc="lower center", bbox_to_anchor=(0.3, 0.25), fontsize=8)
    twin.set(ylabel="preference accuracy", ylim=(0, 1.05))
    names = ["SFT start", "after DPO"]
    values = [metrics["greedy_positive_sft"], metrics["greedy_positive_dpo"]]
    b.bar_label(b.bar(names, values, color=["gray", "tab:blue"]), fmt="%.2f")
    b.set(ylim=(0, 1.1), ylabel="fraction", title="greedy completions that are positive")
    common.save_figure(fig, path)


if __name__ == "__main__":
    main()
