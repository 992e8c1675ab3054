"""Sums, means or maxima of bags of embeddings: ``EmbeddingBag``."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.init import Initializer
from purelayers.layers._checks import LayerError, check_choice
from purelayers.layers.core import Layer, Params
from purelayers.layers.embedding import (
    check_table,
    init_table,
    lookup,
    renormed,
    table_and_ids,
)

__all__ = ["EmbeddingBag"]


@dataclasses.dataclass(frozen=True)
class EmbeddingBag(Layer):
    r"""Reduces bags of looked-up rows: ``y[b] = reduce(weight[ids in bag b])``.

    Matches ``torch.nn.EmbeddingBag``. ``apply(params, input, offsets=None,
    per_sample_weights=None)``:

    - a 2-d ``input`` ``(B, N)`` is ``B`` bags of ``N`` ids each (``offsets`` must be
      None);
    - a 1-d ``input`` ``(L,)`` with 1-d ``offsets`` holds the bags back to back: bag
      ``b`` is ``input[offsets[b]:offsets[b + 1]]``, the last one running to the end,
      so there are ``B = len(offsets)`` bags; with ``include_last_offset``, ``offsets``
      has one more entry, ``L``, the end of the last bag (``B = len(offsets) - 1``).
      ``offsets[0]`` must be 0 and the offsets non-decreasing and at most ``L``, as torch
      requires; with ``include_last_offset`` the last must be ``L``, as torch documents
      (torch's own results for ids past a smaller one disagree between modes). The number of bags comes from ``offsets.shape``, so
      shapes are static under ``jit``.

    ``mode``: ``"sum"`` (optionally weighting each id by ``per_sample_weights``, of
    ``input``'s shape; only with ``"sum"``, as torch), ``"mean"`` or ``"max"`` (per
    feature; the derivative goes to the first maximal entry, as torch). Ids equal to
    ``padding_idx`` are left out of their bag (and of the mean's count); an empty bag
    (or one of padding only) gives zeros. ``max_norm``, ``norm_type`` and
    ``scale_grad_by_freq`` act on the looked-up rows as in ``Embedding`` (the stored
    weight is not changed; ``renorm(params, input)`` gives the params torch's in-place
    rescaling leaves).

    ``scale_grad_by_freq`` divides each row's gradient by its id's count in ``input``,
    as ``torch.nn.Embedding`` does. (torch 2.13's CPU kernel for ``EmbeddingBag``
    divides the ``k``-th distinct id's gradient by the count of the ``k``-th smallest
    entry of ``input`` instead, which differs when ids occur with different counts.)

    Out-of-range ids are errors as in ``Embedding`` (eagerly a ``LayerError``; under
    ``jit`` their bags come out NaN); so are offsets that break torch's rules (under
    ``jit``, every bag comes out NaN).

    Args:
      num_embeddings: rows in the table.
      embedding_dim: width of each row.
      max_norm: rescale looked-up rows whose norm exceeds it (as ``Embedding``). Default
        None.
      norm_type: the order of ``max_norm``'s norm. Default ``2.0``.
      scale_grad_by_freq: divide each row's gradient by its id's count. Not with
        ``mode="max"`` (torch refuses it). Default ``False``.
      mode: ``"sum"``, ``"mean"`` or ``"max"``. Default ``"mean"``.
      sparse: must be ``False``: JAX computes dense gradients, so ``True`` (torch's
        sparse gradient) is refused. Default ``False``.
      include_last_offset: ``offsets`` ends with the end of the last bag. Default
        ``False``.
      padding_idx: an id left out of every bag; its row starts at zero and gets no
        gradient. Negative values count from the end. Default None.
      weight_init: initializer for ``weight``. Default ``normal(std=1)``, as torch.

    Shape:
      ``input`` ``(B, N)``, or ``(L,)`` with ``offsets`` ``(B,)`` (``(B + 1,)`` with
      ``include_last_offset``), integers; ``per_sample_weights`` ``input``'s shape;
      output ``(B, embedding_dim)`` in the table's dtype.

    Parameters:
      ``weight``: ``(num_embeddings, embedding_dim)``, N(0, 1), row ``padding_idx`` zero.

    Example:
      >>> bag = EmbeddingBag(10, 3, mode="sum")
      >>> params = bag.init(jax.random.key(0), (6,))
      >>> bag.apply(params, jnp.array([1, 2, 4, 5, 4, 3]), jnp.array([0, 2])).shape
      (2, 3)
    """

    num_embeddings: int
    embedding_dim: int
    max_norm: float | None = None
    norm_type: float = 2.0
    scale_grad_by_freq: bool = False
    mode: str = "mean"
    sparse: bool = False
    _: dataclasses.KW_ONLY  # (torch's next positional argument is its private _weight)
    include_last_offset: bool = False
    padding_idx: int | None = None
    weight_init: Initializer | None = None

    def __post_init__(self):
        check_table(self)
        check_choice("EmbeddingBag", "mode", self.mode, ("sum", "mean", "max"))
        if self.mode == "max" and self.scale_grad_by_freq:
            raise ValueError(
                "EmbeddingBag: mode='max' does not support scale_grad_by_freq=True (as torch: "
                "max mode does not support scaling the gradient by the frequency)"
            )

    @property
    def takes_ids(self) -> bool:
        return True

    def own_names(self) -> tuple[str, ...]:
        return ("weight",)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        """The table; ``shape`` (the input's) does not affect it."""
        del shape
        return init_table(self, key, dtype)

    def renorm(self, params: Params, input: Any) -> Params:
        """``params`` as torch's ``max_norm`` leaves its weight after a call on ``input``
        (unchanged without ``max_norm``); ``apply`` never changes its params."""
        return renormed(self, params, input)

    def apply(
        self,
        params: Params,
        input: Any,
        offsets: Any = None,
        per_sample_weights: Any = None,
        *,
        key: jax.Array | None = None,
        train: bool = False,
    ) -> jax.Array:
        if jnp.ndim(input) not in (1, 2):
            raise LayerError(
                "EmbeddingBag",
                "input rank",
                "1 (with offsets) or 2 (bags of equal length)",
                f"{jnp.ndim(input)} (input.shape == {tuple(jnp.shape(input))})",
            )
        weight, ids = table_and_ids(self, params, input)
        psw = self._weights(per_sample_weights, ids, weight.dtype)
        if ids.ndim == 2:
            seg, valid, count = self._fixed_bags(ids, offsets)
        else:
            seg, valid, count = self._offset_bags(ids, offsets)
        ids = ids.reshape(-1)
        rows = lookup(self, weight, ids)
        keep = jnp.ones(ids.shape, bool)
        if self.padding_idx is not None:
            keep = ids != self.padding_idx
        y = self._reduce(rows, keep, seg, count, psw)
        if valid is not None:
            y = jnp.where(valid, y, jnp.nan)
        return y

    def _weights(self, psw: Any, ids: jax.Array, dtype: Any) -> jax.Array | None:
        if psw is None:
            return None
        if self.mode != "sum":
            raise LayerError(
                "EmbeddingBag",
                f"per_sample_weights with mode={self.mode!r}",
                "mode='sum'",
                f"mode={self.mode!r}",
                "torch supports per_sample_weights only for mode='sum'",
            )
        if tuple(jnp.shape(psw)) != tuple(ids.shape):
            raise LayerError(
                "EmbeddingBag",
                "per_sample_weights shape",
                f"input's {tuple(ids.shape)}",
                tuple(jnp.shape(psw)),
            )
        if not jnp.issubdtype(jnp.result_type(psw), jnp.floating):
            raise LayerError(
                "EmbeddingBag",
                "per_sample_weights dtype",
                "floating point",
                f"{jnp.result_type(psw)}",
            )
        return jnp.asarray(psw, dtype).reshape(-1)

    def _fixed_bags(self, ids: jax.Array, offsets: Any) -> tuple[jax.Array, None, int]:
        """Each id's bag, no offsets to check, and the number of bags."""
        if offsets is not None:
            raise LayerError(
                "EmbeddingBag",
                "offsets with a 2-d input",
                "None (each row of a 2-d input is one bag)",
                f"offsets of shape {tuple(jnp.shape(offsets))}",
                "pass a 1-d input with offsets, or a 2-d input alone, as torch",
            )
        batch, length = ids.shape
        if length == 0:
            raise LayerError(
                "EmbeddingBag",
                "input bag length (axis 1)",
                "at least 1 (torch refuses empty fixed-length bags too)",
                f"0 (input.shape == {tuple(ids.shape)})",
            )
        return jnp.repeat(jnp.arange(batch, dtype=jnp.int32), length), None, batch

    def _offset_bags(self, ids: jax.Array, offsets: Any) -> tuple[jax.Array, Any, int]:
        """Each id's bag (``count`` or more: dropped), whether traced offsets keep
        torch's rules (None when concrete: checked here), and the number of bags."""
        if offsets is None or jnp.ndim(offsets) != 1:
            got = "None" if offsets is None else f"shape {tuple(jnp.shape(offsets))}"
            raise LayerError(
                "EmbeddingBag",
                "offsets with a 1-d input",
                "a 1-d array of bag starts",
                got,
            )
        if not jnp.issubdtype(jnp.result_type(offsets), jnp.integer):
            raise LayerError(
                "EmbeddingBag", "offsets dtype", "an integer dtype", f"{jnp.result_type(offsets)}"
            )
        n = ids.shape[0]
        if not isinstance(offsets, jax.core.Tracer):
            self._check_offsets(np.asarray(offsets), n)
            valid = None
        else:
            good = offsets[1:] >= offsets[:-1] if offsets.shape[0] > 1 else jnp.array(True)
            last = offsets[-1] == n if self.include_last_offset else offsets[-1] <= n
            valid = jnp.all(good) & (offsets[0] == 0) & last
            valid = valid if offsets.shape[0] else None
        offsets = jnp.asarray(offsets, jnp.int32)
        positions = jnp.arange(n, dtype=jnp.int32)
        seg = jnp.searchsorted(offsets, positions, side="right").astype(jnp.int32) - 1
        count = max(offsets.shape[0] - 1, 0) if self.include_last_offset else offsets.shape[0]
        return seg, valid, count

    def _check_offsets(self, offsets: np.ndarray, n: int) -> None:
        if not offsets.size:
            return
        if offsets[0] != 0:
            raise LayerError(
                "EmbeddingBag",
                "offsets[0]",
                "0 (the first bag starts at the first id, as torch requires)",
                int(offsets[0]),
            )
        down = np.flatnonzero(np.diff(offsets) < 0)
        if down.size:
            i = int(down[0]) + 1
            raise LayerError(
                "EmbeddingBag",
                f"offsets[{i}]",
                f"at least offsets[{i - 1}] == {int(offsets[i - 1])} (offsets are bag starts, "
                "non-decreasing)",
                int(offsets[i]),
            )
        if offsets[-1] > n or (self.include_last_offset and offsets[-1] != n):
            rule = (
                "the input's length" if self.include_last_offset else "at most the input's length"
            )
            raise LayerError(
                "EmbeddingBag",
                "offsets[-1]",
                f"{rule} {n}" + (" (include_last_offset=True)" if self.include_last_offset else ""),
                int(offsets[-1]),
            )

    def _reduce(self, rows, keep, seg, count, psw) -> jax.Array:
        """Bag ``seg[i]`` of ``count`` gathers row ``i`` where ``keep[i]``."""
        zero = jnp.zeros((), rows.dtype)
        if count == 0 or rows.shape[0] == 0:
            return jnp.zeros((count, rows.shape[1]), rows.dtype)
        if self.mode != "max":
            scale = keep.astype(rows.dtype) if psw is None else jnp.where(keep, psw, zero)
            total = jax.ops.segment_sum(rows * scale[:, None], seg, count)
            if self.mode == "sum":
                return total
            n = jax.ops.segment_sum(keep.astype(jnp.int32), seg, count)
            return total / jnp.maximum(n, 1).astype(rows.dtype)[:, None]
        # the first maximal entry of each bag and feature (torch's choice among ties)
        length = rows.shape[0]
        kept = keep[:, None]
        masked = jnp.where(kept, rows, -jnp.inf)
        peak = jax.ops.segment_max(jax.lax.stop_gradient(masked), seg, count)
        top = jnp.take(peak, seg, axis=0, mode="fill", fill_value=0)
        hit = kept & (jax.lax.stop_gradient(rows) == top)
        pos = jnp.where(hit, jnp.arange(length, dtype=jnp.int32)[:, None], length)
        first = jnp.minimum(jax.ops.segment_min(pos, seg, count), length)
        padded = jnp.concatenate([rows, jnp.zeros((1, rows.shape[1]), rows.dtype)])
        y = jnp.take_along_axis(padded, first, axis=0)
        return jnp.where(jnp.isnan(peak), peak, y)
