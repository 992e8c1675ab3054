"""Lookup tables: ``Embedding``."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.init import Initializer, normal
from purelayers.layers._checks import LayerError, check_int, config_error
from purelayers.layers.core import Layer, Params

__all__ = ["Embedding"]


@dataclasses.dataclass(frozen=True)
class Embedding(Layer):
    r"""A lookup table: ``y[..., :] = weight[ids[...], :]``. Matches ``torch.nn.Embedding``.

    Takes integer ids of any shape (``takes_ids`` is True, so a ``Sequential`` starting
    with it infers shapes from integer ids). Repeated ids accumulate gradient into their
    row. The row ``padding_idx``, if given, starts at zero and never receives gradient
    (its value is still looked up as it is), as in torch.

    Out-of-range ids (negative ones included; there is no wrap-around) are errors:

    - with concrete ids (eager calls), a ``ValueError`` names the first bad id, where it
      sits, and the table size;
    - under ``jit``, ``vmap`` or ``grad`` the ids are not known while tracing, so their
      rows come out as NaN (never another row's values), which any loss turns into NaN.
      To get an error instead, wrap the call with ``jax.experimental.checkify``::

          from jax.experimental import checkify
          checked = jax.jit(checkify.checkify(emb.apply, errors=checkify.index_checks))
          err, y = checked(params, ids)
          err.throw()   # "index 7 is out of bounds for axis 0 with size 5"

    Args:
      num_embeddings: rows in the table (the vocabulary size).
      embedding_dim: width of each row.
      padding_idx: a row kept at zero with zero gradient, in ``[-num_embeddings,
        num_embeddings)``; negative values count from the end (``-1`` is the last row)
        and are stored normalized, as torch does. Default None.
      weight_init: initializer for ``weight``. Default ``normal(std=1)``, as torch; the
        ``padding_idx`` row is zeroed after it either way.

    Shape:
      ids: any shape ``S``, any integer dtype; output ``(*S, embedding_dim)`` in the
      table's dtype.

    Parameters:
      ``weight``: ``(num_embeddings, embedding_dim)``, N(0, 1), row ``padding_idx`` zero.

    Example:
      >>> emb = Embedding(100, 16)
      >>> params = emb.init(jax.random.key(0), (4, 7))
      >>> emb.apply(params, jnp.zeros((4, 7), jnp.int32)).shape
      (4, 7, 16)
    """

    num_embeddings: int
    embedding_dim: int
    _: dataclasses.KW_ONLY
    padding_idx: int | None = None
    weight_init: Initializer | None = None

    def __post_init__(self):
        check_int("Embedding", "num_embeddings", self.num_embeddings)
        check_int("Embedding", "embedding_dim", self.embedding_dim)
        p, n = self.padding_idx, self.num_embeddings
        if p is None:
            return
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not -n <= p < n:
            raise config_error("Embedding", "padding_idx", f"in [-{n}, {n})", p)
        object.__setattr__(self, "padding_idx", int(p) % n)

    @property
    def takes_ids(self) -> bool:
        return True

    def own_names(self) -> tuple[str, ...]:
        return ("weight",)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        """The table; ``shape`` (the ids' shape) does not affect it."""
        del shape
        table = (self.weight_init or normal(std=1.0))(
            key, (self.num_embeddings, self.embedding_dim), dtype
        )
        if self.padding_idx is not None:
            table = table.at[self.padding_idx].set(0)
        return {"weight": table}

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        weight = params["weight"]
        table = (self.num_embeddings, self.embedding_dim)
        if tuple(weight.shape) != table:
            raise LayerError(
                "Embedding",
                "weight shape",
                table,
                tuple(weight.shape),
                "the table does not match num_embeddings and embedding_dim",
            )
        concrete = not isinstance(x, jax.core.Tracer)
        ids = np.asarray(x) if concrete else x
        if not jnp.issubdtype(ids.dtype, jnp.integer):
            raise LayerError(
                "Embedding",
                "ids dtype",
                "an integer dtype",
                ids.dtype,
                "Embedding looks up rows by integer id; cast with ids.astype(jnp.int32)",
            )
        if concrete:
            self._check_range(ids)
        ids = jnp.asarray(ids)
        y = _gather_rows(weight, ids)
        if self.padding_idx is not None:
            # torch gives the padding row no gradient; its value is still returned.
            pad = (ids == self.padding_idx)[..., None]
            y = jnp.where(pad, jax.lax.stop_gradient(y), y)
        return y

    def _check_range(self, ids: np.ndarray) -> None:
        bad = np.argwhere((ids < 0) | (ids >= self.num_embeddings))
        if bad.size:
            where = tuple(int(i) for i in bad[0])
            n = self.num_embeddings
            raise LayerError(
                "Embedding",
                f"id {int(ids[where])} at index {where} is out of range for a table of {n} "
                f"embeddings (ids must be in [0, {n}))",
                None,
                None,
            )


def _gather_rows(weight: jax.Array, ids: jax.Array) -> jax.Array:
    """``weight[ids]`` where any id outside ``[0, rows)`` gives a row of NaN.

    ``lax.gather`` in fill mode, unlike ``jnp.take``, does not wrap negative ids, and
    ``checkify.index_checks`` reports the offending id as given.
    """
    dims = jax.lax.GatherDimensionNumbers(
        offset_dims=(ids.ndim,), collapsed_slice_dims=(0,), start_index_map=(0,)
    )
    return jax.lax.gather(
        weight,
        ids[..., None],
        dims,
        (1, weight.shape[1]),
        mode=jax.lax.GatherScatterMode.FILL_OR_DROP,
        fill_value=None,  # NaN for floating tables
    )
