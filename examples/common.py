"""What the example scripts share: their data and the progress bar. No framework here."""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Iterator

import jax
import numpy as np
import optax
from tqdm.auto import tqdm

# Standard-library modules whose docstrings make the text corpus: imported in this
# order, so the text is the same on every run of the same Python version.
STDLIB_MODULES = (
    "abc argparse ast asyncio base64 bisect calendar cmd codecs collections "
    "concurrent.futures configparser contextlib copy csv dataclasses datetime decimal "
    "difflib doctest email enum filecmp fnmatch fractions ftplib functools getopt gettext "
    "glob gzip hashlib heapq hmac html http.client http.server imaplib inspect io "
    "ipaddress itertools json logging mailbox math mimetypes numbers operator optparse os "
    "pathlib pdb pickle pkgutil platform plistlib poplib pprint profile queue random re "
    "sched secrets selectors shelve shlex shutil smtplib socket socketserver sqlite3 "
    "statistics string struct subprocess tarfile tempfile textwrap threading time timeit "
    "tokenize traceback types typing unittest urllib.parse urllib.request uuid warnings "
    "wave weakref xml.dom.minidom zipfile zoneinfo"
).split()


def stdlib_text(max_chars: int = 2_000_000) -> str:
    """English prose from the docstrings of Python's standard library, deterministic.

    Each module contributes its own docstring, then those of its public classes,
    functions and methods in sorted order; nothing is downloaded.
    """
    seen: set[str] = set()
    parts: list[str] = []
    size = 0
    for name in STDLIB_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for doc in _docstrings(module, seen):
            parts.append(doc)
            size += len(doc) + 2
            if size >= max_chars:
                return "\n\n".join(parts)[:max_chars]
    return "\n\n".join(parts)


def _docstrings(module, seen: set[str]) -> Iterator[str]:
    objects = [module]
    for attr in sorted(vars(module)):
        if attr.startswith("_"):
            continue
        obj = getattr(module, attr, None)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            objects.append(obj)
            if inspect.isclass(obj):
                objects += [
                    m
                    for k, m in sorted(vars(obj).items())
                    if not k.startswith("_") and inspect.isfunction(m)
                ]
    for obj in objects:
        doc = inspect.getdoc(obj)
        if doc and doc not in seen and len(doc) > 40:
            seen.add(doc)
            yield doc.strip()


class CharVocab:
    """A character vocabulary: ``encode(text) -> int32 ids`` and ``decode(ids) -> text``."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        return np.fromiter((self.index[c] for c in text), np.int32, len(text))

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def unigram_loss(train_ids: np.ndarray, valid_ids: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy (nats/char) of the validation text under the training text's
    character frequencies: the baseline a sequence model must beat."""
    counts = np.bincount(train_ids, minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[valid_ids].mean())


def digits(seed: int = 0, test_fraction: float = 0.25, images: bool = False):
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images; no download), scaled to
    [0, 1] and split train/test with a fixed, stratified seed.

    Returns ``(x_train, y_train, x_test, y_test)``; ``x`` is ``(N, 64)`` float32, or
    ``(N, 1, 8, 8)`` with ``images=True``.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    if images:
        x = x.reshape(-1, 1, 8, 8)
    y = data.target.astype(np.int32)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    return x_tr, y_tr, x_te, y_te


def byte_corpus(chars: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``stdlib_text(chars)`` as UTF-8 bytes (token ids modulo ``vocab_size``), split
    90/10 into training and validation ids."""
    data = np.frombuffer(stdlib_text(chars).encode("utf-8"), np.uint8).astype(np.int32)
    data = data % vocab_size
    split = int(0.9 * len(data))
    return data[:split], data[split:]


def windows(rng: np.random.Generator, source: np.ndarray, batch_size: int, length: int):
    """``batch_size`` random windows of ``length + 1`` ids (inputs and next-token targets)."""
    starts = rng.integers(0, len(source) - length - 1, batch_size)
    return np.stack([source[s : s + length + 1] for s in starts])


def next_token_loss(apply):
    """``loss(params, ids)``: mean cross-entropy of ``apply(params, ids[:, :-1])``'s
    logits against the next ids ``ids[:, 1:]``."""

    def loss(params, ids):
        logits = apply(params, ids[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:]).mean()

    return loss


def optax_step(loss, optimizer):
    """One jitted optax step: ``(params, opt_state, batch) -> (params, opt_state, loss)``."""

    @jax.jit
    def step(params, opt_state, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step


def batches(rng: np.random.Generator, n: int, batch_size: int) -> Iterator[np.ndarray]:
    """Endless shuffled index batches over ``range(n)``, one epoch after another."""
    while True:
        order = rng.permutation(n)
        for start in range(0, n - batch_size + 1, batch_size):
            yield order[start : start + batch_size]


def progress(total: int, desc: str, disable: bool | None = None) -> tqdm:
    """The examples' progress bar (hidden when output is not a terminal, unless asked)."""
    if disable is None:
        disable = not sys.stderr.isatty()
    return tqdm(total=total, desc=desc, dynamic_ncols=True, disable=disable)


def plot_curves(history: dict, path) -> None:
    """Training loss (log scale) and test accuracy against the step, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    a.plot(history["step"], history["loss"])
    a.set(xlabel="step", ylabel="training loss", yscale="log")
    b.plot(history["step"], history["test_accuracy"])
    b.set(xlabel="step", ylabel="test accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def finish_text_run(out, model, params, metrics: dict, sample: str, text_chars: int) -> None:
    """Save a character model's run (checkpoint, metrics, sample) and print its summary."""
    import json

    import purelayers as pl

    out.mkdir(parents=True, exist_ok=True)
    (out / "sample.txt").write_text(sample)
    pl.params.save(out / "model.safetensors", params, model=model)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    print(
        f"{text_chars:,} characters, vocabulary {metrics['vocab']}, {metrics['parameters']:,} params"
    )
    print(f"trained {metrics['steps']} steps in {metrics['seconds']:.1f} s; outputs in {out}")
    print(
        f"validation loss {metrics['valid_loss']:.3f} nats/char "
        f"vs unigram baseline {metrics['unigram_loss']:.3f}"
    )
    print("sample:\n" + sample)


def positive_int(text: str) -> int:
    """argparse type for counts that must be at least 1 (``--steps 0`` is refused with a
    message naming the value, not a crash later)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def gallery_parser(name: str, doc: str, steps: int):
    """The gallery scripts' shared flags: ``--steps N``, ``--out DIR`` (default
    ``runs/NAME``) and ``--seed S``. Each script adds its own size flags."""
    import argparse
    from pathlib import Path

    p = argparse.ArgumentParser(
        prog=f"{name}.py", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--steps", type=positive_int, default=steps, help=f"training steps (default {steps})"
    )
    p.add_argument("--out", type=Path, default=Path("runs") / name, help="output folder")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    return p


def write_metrics(out, metrics: dict) -> dict:
    """Write ``out/metrics.json`` (the run's named figures) and return ``metrics``."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1, default=float))
    return metrics


def figure(*args, **kwargs):
    """A matplotlib figure on the Agg backend (no screen needed): ``plt.subplots``'s
    arguments, returns ``(fig, axes)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save_figure(fig, path) -> None:
    """Save a figure as a small PNG and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def image_grid(images: np.ndarray, rows: int, path, title: str | None = None) -> None:
    """Save ``(N, H, W)`` grey images in [0, 1] as a ``rows`` x ``N // rows`` grid PNG."""
    n, h, w = images.shape
    cols = n // rows
    grid = images[: rows * cols].reshape(rows, cols, h, w).transpose(0, 2, 1, 3)
    fig, ax = figure(figsize=(cols * 0.6 + 0.4, rows * 0.6 + 0.4))
    ax.imshow(grid.reshape(rows * h, cols * w), cmap="gray_r", vmin=0.0, vmax=1.0)
    ax.set_axis_off()
    if title:
        ax.set_title(title, fontsize=9)
    save_figure(fig, path)
