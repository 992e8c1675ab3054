"""Lookup tables: ``Embedding``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from purelayers.init import Initializer, normal
from purelayers.layers._checks import LayerError, as_array, check_float, check_int, config_error
from purelayers.layers.core import Layer, Params
from purelayers.layers.distance import _pnorm

__all__ = ["Embedding"]


@dataclasses.dataclass(frozen=True)
class Embedding(Layer):
    r"""A lookup table: ``y[..., :] = weight[ids[...], :]``. Matches ``torch.nn.Embedding``.

    Takes integer ids of any shape (``takes_ids`` is True, so a ``Sequential`` starting
    with it infers shapes from integer ids). Repeated ids accumulate gradient into their
    row. The row ``padding_idx``, if given, starts at zero and never receives gradient
    (its value is still looked up as it is), as in torch.

    ``max_norm``: torch rescales, in place, every looked-up row whose ``norm_type``-norm
    exceeds ``max_norm`` to norm ``max_norm`` (``row * max_norm / (norm + 1e-7)``),
    outside autograd. A pure function cannot change its params, so here the looked-up
    rows are rescaled in the output and ``params["weight"]`` is left as it was. The
    outputs and gradients of a call equal torch's (the gradient is that of a plain
    lookup, as torch's is, the rescaling being outside autograd), but torch's weight
    also keeps the rescaled rows for later calls: to do the same, carry on with
    ``params = emb.renorm(params, ids)``, the params torch's in-place rescaling leaves.

    ``scale_grad_by_freq``: each row's gradient is divided by how often its id occurs in
    ``ids``, as torch's. Only the derivative changes, forward and reverse mode alike.

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
      max_norm: rescale looked-up rows whose norm exceeds it (see above); ``>= 0``.
        Default None.
      norm_type: the order ``p`` of ``max_norm``'s norm (``inf`` allowed). Default
        ``2.0``.
      scale_grad_by_freq: divide each row's gradient by its id's count in ``ids``.
        Default ``False``.
      sparse: must be ``False``: JAX computes dense gradients, so ``True`` (torch's
        sparse gradient) is refused. Default ``False``.
      weight_init: (keyword only) initializer for ``weight``. Default ``normal(std=1)``,
        as torch; the ``padding_idx`` row is zeroed after it either way.

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
    padding_idx: int | None = None
    max_norm: float | None = None
    norm_type: float = 2.0
    scale_grad_by_freq: bool = False
    sparse: bool = False
    _: dataclasses.KW_ONLY
    weight_init: Initializer | None = None

    def __post_init__(self):
        check_table(self)

    @property
    def takes_ids(self) -> bool:
        return True

    def own_names(self) -> tuple[str, ...]:
        return ("weight",)

    def init(self, key: jax.Array, shape: Any, dtype: Any = jnp.float32) -> Params:
        """The table; ``shape`` (the ids' shape) does not affect it."""
        del shape
        return init_table(self, key, dtype)

    def apply(self, params: Params, x: Any, *, key: jax.Array | None = None, train: bool = False):
        weight, ids = table_and_ids(self, params, x)
        return lookup(self, weight, ids)

    def renorm(self, params: Params, ids: Any) -> Params:
        """``params`` as torch's ``max_norm`` leaves its weight after a call on ``ids``
        (rows of the ids present rescaled in place there); unchanged without
        ``max_norm``. ``apply`` never changes its params: use this to keep torch's
        running renormalization across calls."""
        return renormed(self, params, ids)


def table_and_ids(layer: Any, params: Params, x: Any) -> tuple[jax.Array, jax.Array]:
    """The checked table and ids: the table's shape, the ids' integer dtype, and (for
    concrete ids) their range."""
    name = type(layer).__name__
    weight = params["weight"]
    table = (layer.num_embeddings, layer.embedding_dim)
    if tuple(weight.shape) != table:
        raise LayerError(
            name,
            "weight shape",
            table,
            tuple(weight.shape),
            "the table does not match num_embeddings and embedding_dim",
        )
    concrete = not isinstance(x, jax.core.Tracer)
    ids = np.asarray(x) if concrete else x
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise LayerError(
            name,
            "ids dtype",
            "an integer dtype",
            ids.dtype,
            f"{name} looks up rows by integer id; cast with ids.astype(jnp.int32)",
        )
    if concrete:
        check_range(name, ids, layer.num_embeddings)
    return weight, as_array(x if isinstance(x, jax.Array) else ids)


def check_range(layer: str, ids: np.ndarray, n: int) -> None:
    """Concrete ids must be in ``[0, n)``: else a ``LayerError`` naming the first bad
    one and where it sits."""
    bad = np.argwhere((ids < 0) | (ids >= n))
    if bad.size:
        where = tuple(int(i) for i in bad[0])
        raise LayerError(
            layer,
            f"id {int(ids[where])} at index {where} is out of range for a table of {n} "
            f"embeddings (ids must be in [0, {n}))",
            None,
            None,
        )


def init_table(layer: Any, key: jax.Array, dtype: Any) -> Params:
    """``{"weight": [num_embeddings, embedding_dim]}`` from ``weight_init`` (default
    N(0, 1), as torch), the ``padding_idx`` row zeroed (``Embedding``, ``EmbeddingBag``)."""
    table = (layer.weight_init or normal(std=1.0))(
        key, (layer.num_embeddings, layer.embedding_dim), dtype
    )
    if layer.padding_idx is not None:
        table = table.at[layer.padding_idx].set(0)
    return {"weight": table}


def check_table(layer: Any) -> None:
    """The constructor checks ``Embedding`` and ``EmbeddingBag`` share; normalizes a
    negative ``padding_idx`` as torch does."""
    name = type(layer).__name__
    if layer.sparse is not False:
        raise config_error(
            name,
            "sparse",
            "False (JAX computes dense gradients; there is no sparse gradient to ask for)",
            layer.sparse,
        )
    check_int(name, "num_embeddings", layer.num_embeddings)
    check_int(name, "embedding_dim", layer.embedding_dim)
    if layer.max_norm is not None:
        check_float(name, "max_norm", layer.max_norm, low=0.0)
    q = layer.norm_type
    if (
        isinstance(q, bool)
        or not isinstance(q, (int, float, np.integer, np.floating))
        or (math.isnan(q))
    ):
        raise config_error(name, "norm_type", "a real number or +-inf", q)
    p, n = layer.padding_idx, layer.num_embeddings
    if p is None:
        return
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not -n <= p < n:
        raise config_error(name, "padding_idx", f"in [-{n}, {n})", p)
    object.__setattr__(layer, "padding_idx", int(p) % n)


def renorm_scale(layer: Any, rows: jax.Array) -> jax.Array:
    """torch's ``embedding_renorm_`` factor for each looked-up row (``(...)``: 1 where
    its norm is within ``max_norm``), without derivative."""
    rows = jax.lax.stop_gradient(rows)
    norm = _pnorm(rows.astype(jnp.promote_types(rows.dtype, jnp.float32)), float(layer.norm_type))
    scale = jnp.where(norm > layer.max_norm, layer.max_norm / (norm + 1e-7), 1.0)
    return scale.astype(rows.dtype)


def renormed(layer: Any, params: Params, ids: Any) -> Params:
    """``params`` with the table as torch's in-place ``max_norm`` leaves it after a call
    on ``ids``: the rows of the ids present rescaled, the others unchanged."""
    weight = params["weight"]
    if layer.max_norm is None:
        return dict(params)
    ids = jnp.asarray(ids).reshape(-1)
    rows = _gather_rows(weight, ids)
    rows = rows * renorm_scale(layer, rows)[:, None]
    return {**params, "weight": weight.at[ids].set(rows, mode="drop")}


def id_counts(ids: jax.Array, rows: int) -> jax.Array:
    """How often each position's id occurs in ``ids`` (same shape; 1 where out of range)."""
    flat = ids.reshape(-1)
    counts = jnp.zeros((rows,), jnp.int32).at[flat].add(1, mode="drop")
    return jnp.take(counts, ids, mode="fill", fill_value=1)


def lookup(layer: Any, weight: jax.Array, ids: jax.Array) -> jax.Array:
    """``weight[ids]`` with torch's ``max_norm``, ``scale_grad_by_freq`` and
    ``padding_idx`` (the padding row gets no gradient; its value is still returned)."""
    y = _gather_rows(weight, ids)
    if layer.max_norm is not None:
        # the value of the rescaled row, the derivative of the plain lookup (torch
        # rescales outside autograd)
        y = y + jax.lax.stop_gradient(y * renorm_scale(layer, y)[..., None] - y)
    if layer.scale_grad_by_freq:
        frozen = jax.lax.stop_gradient(y)
        inverse = (1.0 / id_counts(ids, weight.shape[0])).astype(y.dtype)[..., None]
        y = frozen + (y - frozen) * inverse
    if layer.padding_idx is not None:
        pad = (ids == layer.padding_idx)[..., None]
        y = jnp.where(pad, jax.lax.stop_gradient(y), y)
    return y


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
