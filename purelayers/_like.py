"""``purelayers.params.check_like``: a saved tree (orbax's metadata, a restored tree)
compared with a run's template by name and shape, before anything is restored."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from purelayers._tree import key_data
from purelayers.trees import key_name

__all__ = ["check_like"]

_SHOWN = 5


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        ".".join(key_name(k) for k in path): tuple(int(d) for d in np.shape(leaf))
        for path, leaf in leaves
    }


def _first(items: list[str]) -> str:
    more = f", ... ({len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
    return "[" + ", ".join(items[:_SHOWN]) + more + "]"


def check_like(template: Any, saved: Any, *, what: str = "the checkpoint") -> None:
    """Raise one ``ValueError`` unless ``saved`` has exactly ``template``'s names and shapes.

    The names are the trees' key paths as orbax writes them (``opt.1.0.mu.model.layers.
    tree.self_attn.q_proj.lora_A.weight``: dict keys, sequence indices, namedtuple
    fields, ``tree`` for a ``Repeat``'s stacked blocks), so ``saved`` may be orbax's
    metadata of a step (``CheckpointManager.item_metadata(step)``), whose leaves carry
    shapes and dtypes and whose namedtuples are dicts, or any tree of arrays. A typed
    PRNG key in ``template`` stands for its key data, as orbax stores it. Call it before
    ``restore``: a resume with another model or optimizer then fails naming the first
    mismatching names and shapes, and nothing is restored.

    Args:
      template: the run's tree (arrays or ``jax.ShapeDtypeStruct``s), as it will be
        restored.
      saved: the saved tree or its metadata.
      what: how the message names ``saved``.

    Raises:
      ValueError: names only one side has, or shapes that differ; the message lists
        the first few of each, ``name: run shape, saved shape``.

    Example:
      >>> run = {"w": jnp.zeros((2, 3)), "step": jnp.int32(0)}
      >>> pl.params.check_like(run, {"w": jnp.ones((2, 3)), "step": jnp.int32(5)})
      >>> pl.params.check_like(run, {"w": jnp.ones((4, 3)), "step": jnp.int32(5)})
      Traceback (most recent call last):
      ...
      ValueError: the checkpoint does not match the run: shapes differ: w: run (2, 3), saved (4, 3)
    """
    problems = []
    if saved is None:  # what item_metadata gives without the item's handler
        problems.append(
            "no saved tree to compare (None): give orbax's CheckpointManager "
            "item_handlers=ocp.StandardCheckpointHandler(), so item_metadata reads the tree"
        )
    mine, theirs = _shapes(key_data(template)), _shapes(key_data(saved))
    only_run = [k for k in mine if k not in theirs] if saved is not None else []
    only_saved = [k for k in theirs if k not in mine]
    shapes = [
        f"{k}: run {mine[k]}, saved {theirs[k]}"
        for k in mine
        if k in theirs and mine[k] != theirs[k]
    ]
    if only_run:
        problems.append(f"names only the run has ({len(only_run)}): {_first(only_run)}")
    if only_saved:
        problems.append(f"names only {what} has ({len(only_saved)}): {_first(only_saved)}")
    if shapes:
        problems.append("shapes differ: " + "; ".join(shapes[:_SHOWN]))
        if len(shapes) > _SHOWN:
            problems[-1] += f"; ... ({len(shapes) - _SHOWN} more)"
    if problems:
        raise ValueError(f"{what} does not match the run: " + "; ".join(problems))
