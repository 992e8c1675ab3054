"""Distributed training on JAX's SPMD engine, with sharding rules written against
checkpoint names.

Every array of a params (or state, or optimizer-state) tree has a dotted name, its
PyTorch ``state_dict`` key (``blocks.0.fc.weight``). A *rule* maps a name pattern to a
``jax.sharding.PartitionSpec``; ``named_shardings(tree, rules, mesh)`` turns a tree into
the matching tree of ``NamedSharding``s, which ``jax.jit``, ``jax.device_put`` and
``init_sharded`` take. Communication is XLA's: nothing here moves data by hand.

The rules for a GPT (``pos_emb``, ``embed``, ``blocks.N.*``, ``norm``, ``head``) on a
``(data, model)`` mesh, Megatron-style inside each block, replicated elsewhere::

    import purelayers.sharding as S
    mesh = S.make_mesh("data=2,model=4")
    rules = [*S.transformer_block("blocks.*", axis="model"), ("*", S.P())]
    params = S.init_sharded(model, key, (batch, seq), mesh, rules)
    step = jax.jit(train_step, in_shardings=(..., S.batch_sharding(mesh, "data")))

Patterns. A rule is ``(pattern, spec)``; the first rule whose pattern matches the whole
dotted name wins. A pattern is a glob (``fnmatch``, case-sensitive): ``*`` matches any
run of characters *including dots*, so ``"*.fc.weight"`` matches
``blocks.3.fc.weight`` and ``"*"`` matches everything; ``?`` and ``[seq]`` as in
``fnmatch``. A pattern starting with ``re:`` is a regular expression matched against
the whole name (``re.fullmatch``): ``"re:blocks\\.[0-5]\\..*"``. A spec is a
``PartitionSpec`` (shorter than the array's rank means "the remaining axes are not
split", as in JAX) or a function ``(name, shape, mesh) -> PartitionSpec`` (``fsdp``
uses one). Unmatched names raise ``ValueError`` unless ``default=`` is given; a spec
whose mesh axes do not divide an array axis raises ``ValueError`` naming the array, its
shape, the rule, the mesh axis and its size.

Meshes and hosts. ``make_mesh("data=2,model=4")`` builds a ``Mesh`` with ``AxisType.Auto``
axes, so XLA's partitioner places the collectives. Across hosts, call
``jax.distributed.initialize()`` first in every process; the same rules and mesh apply,
each process feeds its slice of the batch
(``jax.make_array_from_process_local_data``), ``save`` gathers and process 0 writes, and
``load_sharded`` reads on each process only the slices its devices hold.

Packed projections (``qkv.weight`` rows ``[q | k | v]``, ``fc.weight`` rows
``[gate | up]``) split in contiguous blocks are correct but make XLA move activations
between devices after the projection; ``group_qkv`` / ``group_rows`` put the rows in
group order (``[q_0 k_0 v_0 | q_1 k_1 v_1 | ...]``) so that each device holds whole
heads, and ``ungroup_qkv`` / ``ungroup_rows`` restore torch's order before saving.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from purelayers._labels import leaf_names, mixed_blocks
from purelayers._patterns import check_pattern, matches
from purelayers._sharded_io import load_sharded, save
from purelayers.trees import BlockKey

__all__ = [
    "Mesh",
    "NamedSharding",
    "P",
    "PartitionSpec",
    "Rules",
    "attention",
    "batch_sharding",
    "column_parallel",
    "data_parallel",
    "fsdp",
    "group_qkv",
    "group_rows",
    "init_sharded",
    "linear_pair",
    "load_sharded",
    "make_mesh",
    "named_shardings",
    "optimizer_shardings",
    "partition_specs",
    "row_parallel",
    "save",
    "sharded_init_fn",
    "transformer_block",
    "transformers_layers",
    "ungroup_qkv",
    "ungroup_rows",
]

P = PartitionSpec

SpecFn = Callable[[str, tuple[int, ...], Mesh], PartitionSpec]
Rule = tuple[str, PartitionSpec | SpecFn]
Rules = Sequence[Rule]


# -- meshes ---------------------------------------------------------------------------


def make_mesh(axes: str | Mapping[str, int], *, devices: Sequence[Any] | None = None) -> Mesh:
    """A device mesh from ``"data=2,model=4"`` or ``{"data": 2, "model": 4}``.

    Takes the first ``prod(sizes)`` of ``devices`` (default ``jax.devices()``), so a
    smaller mesh than the machine is fine. Axes are ``AxisType.Auto`` (XLA places the
    collectives). Raises ``ValueError`` for a malformed spec or too few devices.
    """
    if isinstance(axes, str):
        parsed: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in axes.split(","))):
            name, eq, size = part.partition("=")
            if not eq or not name.strip().isidentifier() or not size.strip().isdigit():
                raise ValueError(
                    f"make_mesh: cannot read {part!r} in {axes!r}; write axes as "
                    "'name=size' separated by commas, e.g. 'data=2,model=4'"
                )
            parsed[name.strip()] = int(size)
        axes = parsed
    if not axes or any(
        isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in axes.values()
    ):
        raise ValueError(f"make_mesh: axes must map names to positive sizes, got {dict(axes)}")
    devices = list(jax.devices() if devices is None else devices)
    need = math.prod(axes.values())
    if need > len(devices):
        raise ValueError(
            f"make_mesh: {dict(axes)} needs {need} devices, but {len(devices)} are available; "
            "on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N before importing jax"
        )
    kinds = getattr(jax.sharding, "AxisType", None)
    extra = {} if kinds is None else {"axis_types": (kinds.Auto,) * len(axes)}
    return jax.make_mesh(tuple(axes.values()), tuple(axes), devices=devices[:need], **extra)


def batch_sharding(
    mesh: Mesh, axes: str | tuple[str, ...] = "data", *, axis: int = 0
) -> NamedSharding:
    """Batches split along their axis ``axis`` (default the first; ``1`` for time-major
    sequences ``(T, B, ...)``, as ``LSTM``'s) over mesh axis (or axes) ``axes``.

    On a CPU with few cores this is also how a recurrent model uses them: over two host
    devices (``jax_num_cpu_devices``) the LSTM benchmark's training step takes about a
    quarter less time than on one (README, "The batch over host devices")."""
    if isinstance(axis, bool) or not isinstance(axis, int) or axis < 0:
        raise ValueError(f"batch_sharding: axis must be an int >= 0, got {axis!r}")
    return NamedSharding(mesh, P(*([None] * axis), axes))


# -- rules to specs -------------------------------------------------------------------


def _check_rules(rules: Rules) -> None:
    if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence):
        raise ValueError(f"sharding: rules must be a list of (pattern, spec) pairs, got {rules!r}")
    for i, rule in enumerate(rules):
        ok = isinstance(rule, tuple) and len(rule) == 2 and isinstance(rule[0], str)
        if not ok or not (isinstance(rule[1], PartitionSpec) or callable(rule[1])):
            raise ValueError(
                f"sharding: rules[{i}] must be (pattern: str, PartitionSpec or "
                f"fn(name, shape, mesh)), got {rule!r}"
            )
        check_pattern(rule[0], f"sharding: rules[{i}]")


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _validate(name: str, shape: tuple[int, ...], spec: Any, rule: str, mesh: Mesh) -> PartitionSpec:
    where = f"sharding: {name!r} with shape {shape}: {rule} -> {spec!r}"
    if not isinstance(spec, PartitionSpec):
        raise ValueError(f"{where} is not a PartitionSpec")
    if len(spec) > len(shape):
        raise ValueError(
            f"{where} has {len(spec)} entries, but the array has {len(shape)} axes\n"
            "  give at most one entry per axis (None leaves an axis whole)"
        )
    seen: set[str] = set()
    for axis, entry in enumerate(spec):
        names = _axes(entry)
        for mesh_axis in names:
            if mesh_axis not in mesh.shape:
                raise ValueError(
                    f"{where} names mesh axis {mesh_axis!r}, but the mesh has axes "
                    f"{dict(mesh.shape)}"
                )
            if mesh_axis in seen:
                raise ValueError(f"{where} uses mesh axis {mesh_axis!r} twice")
            seen.add(mesh_axis)
        size = math.prod(mesh.shape[a] for a in names)
        if shape[axis] % size:
            label = f"mesh axis {names[0]!r}" if len(names) == 1 else f"mesh axes {names}"
            raise ValueError(
                f"{where} splits axis {axis} (size {shape[axis]}) over {label} of size "
                f"{size}, which does not divide {shape[axis]}\n"
                f"  use a mesh where the size of {label} divides {shape[axis]}, or an earlier "
                f"rule for {name!r} (P() replicates it)"
            )
    return spec


def _resolve(name: str, shape: tuple[int, ...], rules: Rules, mesh: Mesh, default: Any):
    for pattern, spec in rules:
        if matches(pattern, name):
            rule = f"rule {pattern!r}"
            if not isinstance(spec, PartitionSpec):
                spec = spec(name, shape, mesh)
            return _validate(name, shape, spec, rule, mesh)
    if default is None:
        tried = [pattern for pattern, _ in rules]
        raise ValueError(
            f"sharding: no rule matches {name!r} with shape {shape}; patterns tried: {tried}\n"
            "  add a rule for it, or pass default=P() to replicate unmatched arrays"
        )
    return _validate(name, shape, default, "default", mesh)


def _key_name(key: Any) -> str:
    if isinstance(key, BlockKey):
        return "0"  # stacked blocks share one spec: block 0's name stands for all
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def partition_specs(
    tree: Any, rules: Rules, mesh: Mesh, *, default: PartitionSpec | None = None
) -> Any:
    """The tree of ``PartitionSpec``s that ``rules`` give ``tree``'s arrays.

    Args:
      tree: any pytree of arrays or ``jax.ShapeDtypeStruct``s (params, state, an optax
        state); a leaf's name is its dotted path (dict keys and sequence indices, the
        checkpoint name for params and state trees). A ``Repeat``'s stacked blocks
        (``purelayers.params.Stacked``) take the spec every block's name gets (rules
        that give blocks different specs raise ``ValueError``, as ``label`` does), with
        the stacked leading axis left whole.
      rules: ``[(pattern, spec), ...]``, first match wins (see the module docstring).
      mesh: the ``Mesh`` (or ``AbstractMesh``) the specs refer to; its axis sizes are
        checked against the shapes.
      default: the spec of names no rule matches. Default ``None``: such a name raises.

    Raises:
      ValueError: a name no rule matches (without ``default``), a spec naming an axis
        the mesh lacks, with more entries than the array has axes, or whose mesh axes
        do not divide the array axis they split (the message names the array, its
        shape, the rule, the mesh axis and its size), or rules that tell the blocks of
        a stacked array apart (``"blocks.0.*"``: a ``Repeat``'s blocks are one array).
    """
    _check_rules(rules)
    if default is not None and not isinstance(default, PartitionSpec):
        raise ValueError(f"sharding: default must be a PartitionSpec or None, got {default!r}")

    def one(path, leaf):
        stacked = sum(isinstance(k, BlockKey) for k in path)
        shape = tuple(int(d) for d in np.shape(leaf))
        shown, names = leaf_names(path)
        names = names or [".".join(_key_name(k) for k in path)]  # a stack of no blocks
        specs = {name: _resolve(name, shape[stacked:], rules, mesh, default) for name in names}
        spec = specs[names[0]]
        if any(s != spec for s in specs.values()):
            raise mixed_blocks("sharding", "spec", shown, specs)
        return P(*(None,) * stacked, *spec) if stacked else spec

    return jax.tree_util.tree_map_with_path(one, tree)


def named_shardings(
    tree: Any, rules: Rules, mesh: Mesh, *, default: PartitionSpec | None = None
) -> Any:
    """``partition_specs`` as ``NamedSharding(mesh, spec)``s, ready for ``jax.jit``."""
    specs = partition_specs(tree, rules, mesh, default=default)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs)


def _fits(sharding: Any, shape: tuple[int, ...]) -> bool:
    """Whether ``sharding`` can lay out an array of ``shape``: no more spec entries than
    axes, and each split axis divisible by its mesh axes' sizes."""
    spec = getattr(sharding, "spec", None)
    if spec is None:  # not a NamedSharding: its own check, at placement
        return True
    if len(spec) > len(shape):
        return False
    sizes = dict(sharding.mesh.shape)
    for dim, names in zip(shape, spec, strict=False):
        names = () if names is None else (names,) if isinstance(names, str) else names
        if dim % int(np.prod([sizes[n] for n in names], dtype=np.int64)):
            return False
    return True


def optimizer_shardings(tree: Any, param_shardings: Any) -> Any:
    """Shardings for an optimizer state (or any tree holding copies of the params).

    A leaf whose dotted path ends with a parameter's name (optax's
    ``0.mu.blocks.0.fc.weight`` for ``blocks.0.fc.weight``) gets that parameter's
    sharding where it fits the leaf's shape; any other leaf (step counts, scalars, and
    statistics shaped otherwise than their parameter, such as Adafactor's factored
    ``v_row``/``v_col``, which the parameter's spec may not fit) is replicated on the
    same mesh.
    Use it on ``jax.eval_shape(optimizer.init, params)`` to create the state sharded:
    ``jax.jit(optimizer.init, out_shardings=optimizer_shardings(...))(params)``.
    """
    by_name = {
        ".".join(_key_name(k) for k in path): sharding
        for path, sharding in jax.tree_util.tree_flatten_with_path(param_shardings)[0]
    }
    if not by_name:
        raise ValueError("optimizer_shardings: param_shardings holds no sharding")
    mesh = next(iter(by_name.values())).mesh
    names = sorted(by_name, key=len, reverse=True)

    def one(path, leaf):
        name = ".".join(_key_name(k) for k in path)
        for p in names:
            if (name == p or name.endswith("." + p)) and _fits(by_name[p], np.shape(leaf)):
                return by_name[p]
        return NamedSharding(mesh, P())

    return jax.tree_util.tree_map_with_path(one, tree)


# -- ready-made rule sets -------------------------------------------------------------


def data_parallel() -> list[Rule]:
    """Every array replicated: pure data parallelism (shard the batch with
    ``batch_sharding``; XLA all-reduces the gradients)."""
    return [("*", P())]


def fsdp(axis: str = "fsdp", *, min_size: int = 1024) -> list[Rule]:
    """Fully sharded data parallel: split each array along its largest axis that the
    ``axis`` mesh axis divides; replicate arrays of fewer than ``min_size`` elements.

    Ties go to the earlier axis; an array none of whose axes divides is replicated.
    Shard the batch over ``axis`` too (``batch_sharding(mesh, axis)``, or
    ``("data", axis)`` on a 2-D mesh); XLA then gathers each weight where it is used
    and reduce-scatters its gradient.
    """

    def spec(name: str, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
        size = dict(mesh.shape).get(axis, 1)  # a missing axis fails validation by name
        if math.prod(shape) < min_size or not shape:
            return P()
        fits = [i for i, d in enumerate(shape) if d % size == 0]
        if not fits:
            return P()
        best = max(fits, key=lambda i: (shape[i], -i))
        return P(*([None] * best), axis)

    return [("*", spec)]


def _at(pattern: str, name: str) -> str:
    """The pattern for ``name`` inside the layer at ``pattern`` (``""``: the root)."""
    return f"{pattern}.{name}" if pattern else name


def column_parallel(pattern: str, axis: str = "model") -> list[Rule]:
    """A ``Linear`` whose outputs are split: ``weight`` rows and ``bias`` over ``axis``.

    ``pattern`` names the layer (``"blocks.*.fc"``; ``""`` for a root ``Linear``,
    and likewise in the other rule sets); its output stays split over
    ``axis``, so the next layer should be ``row_parallel``.
    """
    return [(_at(pattern, "weight"), P(axis, None)), (_at(pattern, "bias"), P(axis))]


def row_parallel(pattern: str, axis: str = "model") -> list[Rule]:
    """A ``Linear`` whose inputs are split: ``weight`` columns over ``axis``, ``bias``
    replicated. XLA all-reduces its output (the partial sums) over ``axis``."""
    return [(_at(pattern, "weight"), P(None, axis)), (_at(pattern, "bias"), P())]


def linear_pair(column: str, row: str, axis: str = "model") -> list[Rule]:
    """Megatron's MLP split: ``column`` column-parallel, then ``row`` row-parallel.

    The activation between them stays split over ``axis``; the only communication is
    one all-reduce of ``row``'s output (and one of the input gradient going back).
    """
    return [*column_parallel(column, axis), *row_parallel(row, axis)]


def attention(pattern: str, axis: str = "model") -> list[Rule]:
    """An attention layer at ``pattern`` (``"blocks.*.attn"``) split by heads, under
    the names of each attention class: ``MultiHeadAttention``'s ``qkv``,
    ``Attention``'s ``q_proj``/``k_proj``/``v_proj``, Phi-3's fused ``qkv_proj`` (rows
    ``[q | k | v]``) and ``InProjAttention``'s
    ``in_proj_weight``/``in_proj_bias`` (or its ``q_proj_weight``, ... with ``kdim``/
    ``vdim``) column-parallel (rows split); ``out``, ``o_proj`` and ``out_proj``
    row-parallel; ``InProjAttention``'s ``bias_k``/``bias_v`` replicated.

    ``num_heads`` and ``num_kv_heads`` should divide by the ``axis`` size. See the
    module docstring on the packed ``qkv`` rows: in torch's order the split is correct
    but not aligned to heads (XLA moves activations); ``group_qkv`` gives the aligned
    order.
    """
    rows, split = P(axis, None), P(axis)
    return [
        *linear_pair(_at(pattern, "qkv"), _at(pattern, "out"), axis),
        *column_parallel(_at(pattern, "q_proj"), axis),
        *column_parallel(_at(pattern, "k_proj"), axis),
        *column_parallel(_at(pattern, "v_proj"), axis),
        *column_parallel(_at(pattern, "qkv_proj"), axis),
        *row_parallel(_at(pattern, "o_proj"), axis),
        (_at(pattern, "in_proj_weight"), rows),
        (_at(pattern, "in_proj_bias"), split),
        (_at(pattern, "[qkv]_proj_weight"), rows),
        (_at(pattern, "bias_[kv]"), P()),
        *row_parallel(_at(pattern, "out_proj"), axis),
    ]


def transformer_block(pattern: str, axis: str = "model") -> list[Rule]:
    """Megatron tensor parallelism for ``TransformerBlock``s at ``pattern``
    (``"blocks.*"``): ``attn`` by heads (any of the attention classes a block takes:
    see ``attention``), ``fc`` column-parallel, ``proj`` row-parallel, the norms
    replicated. Covers the GPT-2 and the Llama configurations (whose ``fc`` packs
    ``[gate | up]``: see ``group_rows``)."""
    return [
        *attention(_at(pattern, "attn"), axis),
        *linear_pair(_at(pattern, "fc"), _at(pattern, "proj"), axis),
        (_at(pattern, "ln*"), P()),
    ]


# transformers' projection names, each family's (Llama's, BERT's, DistilBERT's, T5's,
# CLIP's, ModernBERT's): the first Linear of an attention or an MLP (outputs split) and
# the last (inputs split)
_COLUMN_NAMES = (
    "q_proj", "k_proj", "v_proj", "qkv_proj", "gate_proj", "up_proj", "gate_up_proj",
    "query", "key", "value", "intermediate.dense", "q_lin", "k_lin", "v_lin", "lin1",
    "q", "k", "v", "wi", "wi_0", "wi_1", "fc1", "Wqkv", "Wi",
)  # fmt: skip
_ROW_NAMES = (
    "o_proj", "down_proj", "output.dense", "out_lin", "lin2", "o", "wo", "out_proj", "fc2",
    "Wo",
)  # fmt: skip


def transformers_layers(axis: str = "model") -> list[Rule]:
    """Megatron tensor parallelism by transformers' projection names, for the models of
    ``purelayers.models``: each attention's query/key/value projections and each MLP's
    first ``Linear`` column-parallel (rows split over ``axis``), the attention's
    output and the MLP's second ``Linear`` row-parallel (columns split), for the
    decoders' ``*_proj`` names, CLIP's and SigLIP's, BERT's (``query``, ...,
    ``output.dense``), DistilBERT's (``q_lin``, ..., ``lin2``), T5's (``q``, ..., ``wo``)
    and ModernBERT's (``Wqkv``, ``Wi``, ``Wo``). Every other array (embeddings, norms,
    heads, poolers) is left to the rules after these: end with ``("*", P())``.
    ``num_heads`` and the MLP width should divide by the ``axis`` size; fused rows
    (``Wqkv``, ``Wi``) are split correctly but not by heads without ``group_rows``.

    Example:
      >>> rules = [*transformers_layers("model"), ("*", P())]
      >>> rules[0], rules[-2]
      (('*.q_proj.weight', P('model', None)), ('*.Wo.bias', P()))
    """
    rules: list[Rule] = []
    for name in _COLUMN_NAMES:
        rules += column_parallel(f"*.{name}", axis)
    for name in _ROW_NAMES:
        rules += row_parallel(f"*.{name}", axis)
    return rules


# -- packed rows in group order --------------------------------------------------------


def _group_order(sizes: Sequence[int], groups: int, who: str) -> np.ndarray:
    """Row indices taking ``[part_0 | part_1 | ...]`` (rows ``sizes``) to group order
    ``[part_0 block 0 | part_1 block 0 | ... | part_0 block 1 | ...]``."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{who}: groups must be a positive int, got {groups!r}")
    for size in sizes:
        if size % groups:
            raise ValueError(f"{who}: a part of {size} rows does not divide by groups={groups}")
    parts = np.split(np.arange(sum(sizes)), np.cumsum(sizes)[:-1])
    return np.concatenate([p.reshape(groups, -1) for p in parts], axis=1).reshape(-1)


def _rows(array: Any, sizes: Sequence[int], who: str) -> jax.Array:
    a = jnp.asarray(array)
    if not a.ndim or a.shape[0] != sum(sizes):
        raise ValueError(
            f"{who}: expected {sum(sizes)} rows (parts of {list(sizes)}), got shape {a.shape}"
        )
    return a


def group_rows(array: Any, sizes: Sequence[int], *, groups: int) -> jax.Array:
    """Rows packed as ``[part_0 | part_1 | ...]`` (``sizes`` rows each) reordered so
    that row block ``g`` of ``groups`` holds block ``g`` of every part.

    A packed weight split over ``n`` devices (rows) gives each device matching slices
    of every part only in this order: Llama's ``fc`` packs ``[gate | up]``
    (``group_rows(w, [hidden, hidden], groups=n)``); ``group_qkv`` does attention's
    ``[q | k | v]``. ``ungroup_rows`` is the inverse; both are exact permutations.
    """
    a = _rows(array, sizes, "group_rows")
    return a[_group_order(sizes, groups, "group_rows")]


def ungroup_rows(array: Any, sizes: Sequence[int], *, groups: int) -> jax.Array:
    """The inverse of ``group_rows``: the parts back one after the other."""
    a = _rows(array, sizes, "ungroup_rows")
    return a[np.argsort(_group_order(sizes, groups, "ungroup_rows"))]


def _qkv_sizes(rows: int, num_heads: int, num_kv_heads: int | None, groups: int, who: str):
    kv = num_heads if num_kv_heads is None else num_kv_heads
    for what, n in (("num_heads", num_heads), ("num_kv_heads", kv)):
        if n % groups:
            raise ValueError(f"{who}: {what}={n} must divide by groups={groups}")
    if rows % (num_heads + 2 * kv):
        raise ValueError(
            f"{who}: {rows} rows are not (num_heads + 2 * num_kv_heads) * head_dim "
            f"for num_heads={num_heads}, num_kv_heads={kv}"
        )
    hd = rows // (num_heads + 2 * kv)
    return [num_heads * hd, kv * hd, kv * hd]


def group_qkv(
    array: Any, num_heads: int, num_kv_heads: int | None = None, *, groups: int
) -> jax.Array:
    """``qkv.weight`` (or ``qkv.bias``) rows from torch's ``[q | k | v]`` order into
    head-group order ``[q_0 k_0 v_0 | q_1 k_1 v_1 | ...]`` (``groups`` groups).

    Row block ``g`` of the result (the rows a device holds when the rows are split
    ``groups`` ways) holds query heads ``g * H/groups .. (g+1) * H/groups - 1`` and the
    key/value heads they attend with. ``ungroup_qkv`` is the inverse.
    """
    a = jnp.asarray(array)
    sizes = _qkv_sizes(a.shape[0] if a.ndim else 0, num_heads, num_kv_heads, groups, "group_qkv")
    return group_rows(a, sizes, groups=groups)


def ungroup_qkv(
    array: Any, num_heads: int, num_kv_heads: int | None = None, *, groups: int
) -> jax.Array:
    """The inverse of ``group_qkv``: rows back in torch's ``[q | k | v]`` order."""
    a = jnp.asarray(array)
    sizes = _qkv_sizes(a.shape[0] if a.ndim else 0, num_heads, num_kv_heads, groups, "ungroup_qkv")
    return ungroup_rows(a, sizes, groups=groups)


# -- sharded initialization -----------------------------------------------------------


def sharded_init_fn(
    model: Any,
    shape: Any,
    mesh: Mesh,
    rules: Rules,
    *,
    dtype: Any = jnp.float32,
    default: PartitionSpec | None = None,
    state: bool = False,
):
    """``(init, shardings)``: ``init(key)`` is ``model.init`` jitted with
    ``out_shardings=shardings``, so every array is created already split.

    The tree's shapes come from ``jax.eval_shape`` (nothing is allocated); with
    ``state=True`` ``init`` returns ``(params, state)`` and both are sharded by
    ``rules``. Use ``init.lower(key).compile()`` to inspect the program.
    """

    def build(key):
        params = model.init(key, shape, dtype)
        return (params, model.init_state(shape, dtype)) if state else params

    abstract = jax.eval_shape(build, jax.random.key(0))
    shardings = named_shardings(abstract, rules, mesh, default=default)
    return jax.jit(build, out_shardings=shardings), shardings


def init_sharded(
    model: Any,
    key: jax.Array,
    shape: Any,
    mesh: Mesh,
    rules: Rules,
    *,
    dtype: Any = jnp.float32,
    default: PartitionSpec | None = None,
    state: bool = False,
) -> Any:
    """``model.init(key, shape, dtype)`` born sharded by ``rules`` over ``mesh``.

    No device ever holds a whole copy of an array its rule splits: the initializer
    runs inside one ``jax.jit`` whose ``out_shardings`` are the rules' shardings, so
    XLA computes each shard where it lives. With JAX's partitionable threefry (the
    default) the values equal ``model.init``'s. With ``state=True`` returns
    ``(params, state)``.
    """
    init, _ = sharded_init_fn(model, shape, mesh, rules, dtype=dtype, default=default, state=state)
    return init(key)
