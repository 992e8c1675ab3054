"""``Linear``'s product over leading axes, whose weight gradient is chosen per platform.

``leading_axes_product(x, w, transposed)`` is ``x @ w.T`` (``x @ w`` if ``transposed``)
over the last axis of ``x`` ``[..., in]``: XLA's own product, so ``jax.checkpoint``
policies that save matrix products see it. Its tangent in the weight is
``lead_product(x, dw)``, a primitive whose transpose, the weight gradient, is the
primitive ``lead_contraction``: ``a`` ``[..., p]`` and ``b`` ``[..., q]`` contracted over
all their leading axes into ``[p, q]``. Both are lowered on the CPU as one product of
the leading axes merged into rows (a free reshape), elsewhere as one ``dot_general``
with the leading axes kept apart (the reasons and figures are in ``linear._product``'s
docstring). Their derivatives are each other (the transposes of ``lead_product`` are a
``lead_product`` and a ``lead_contraction``, those of ``lead_contraction`` two
``lead_product``s), so derivatives of any order and mode stay in the two primitives.

They are used where no mesh with typed axes is in play (``meshless``: no mesh, or only
``Auto`` axes); under ``Explicit`` axes or inside ``shard_map`` the layer keeps
``jax.lax.platform_dependent``, whose forms JAX's sharding types pass through.

Primitives rather than ``jax.lax.platform_dependent``: that stages a ``switch``, whose
derivative JAX builds for both forms, 7-10 ms of tracing per product (20 products and
their gradient: 0.19-0.27 s against 0.05 s for one form alone). The benchmark
transformer's training step (17 ``Linear``s on ``[16, 128, *]``) traces in 0.41-0.54 s
where it took 0.69-0.81 s, and its first call in a fresh process takes 2.29-2.76 s
where it took 2.65-3.02 s (raw JAX 2.75-3.20 s; ``python -m benchmarks.run
--workloads transformer mlp cnn lstm --impls purelayers jax --repeats 1 --no-eager
--fresh 3``, two runs each way, Intel Xeon, 2 cores). The compiled program is the
same.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

# -- the two forms of each product ------------------------------------------------------


def axes_product(x: jax.Array, w: jax.Array, transposed: bool) -> jax.Array:
    """``x @ w.T`` (``x @ w`` if ``transposed``) over ``x``'s last axis, its leading axes
    kept apart."""
    return lax.dot_general(x, w, (((x.ndim - 1,), (0 if transposed else 1,)), ((), ())))


def rows_product(x: jax.Array, w: jax.Array, transposed: bool) -> jax.Array:
    """``axes_product`` of ``x``'s leading axes merged into rows."""
    lead = x.shape[:-1]
    y = axes_product(x.reshape(math.prod(lead), x.shape[-1]), w, transposed)
    return y.reshape(*lead, y.shape[-1])


def _axes_contraction(a, b):
    lead = tuple(range(a.ndim - 1))
    return lax.dot_general(a, b, ((lead, lead), ((), ())))


def _rows_contraction(a, b):
    rows = math.prod(a.shape[:-1])  # (not -1: an axis of length 0 leaves it undetermined)
    return _axes_contraction(a.reshape(rows, a.shape[-1]), b.reshape(rows, b.shape[-1]))


# -- the primitives -----------------------------------------------------------------------

lead_product_p = Primitive("purelayers_lead_product")
lead_contraction_p = Primitive("purelayers_lead_contraction")


def lead_product(x: jax.Array, w: jax.Array, transposed: bool) -> jax.Array:
    """``x`` ``[..., in]`` times ``w`` ``[out, in]`` (``[in, out]`` if ``transposed``)."""
    return lead_product_p.bind(x, w, transposed=transposed)


def lead_contraction(a: jax.Array, b: jax.Array) -> jax.Array:
    """``sum over leading axes of a[..., p, None] * b[..., None, q]`` -> ``[p, q]``."""
    return lead_contraction_p.bind(a, b)


@functools.lru_cache(maxsize=512)
def _out_aval(form, *avals, **params):
    # the axes form's own output type, as JAX's ``dot_general`` gives it
    return jax.make_jaxpr(functools.partial(form, **params))(*avals).out_avals[0]


lead_product_p.def_impl(axes_product)
lead_product_p.def_abstract_eval(functools.partial(_out_aval, axes_product))
lead_contraction_p.def_impl(_axes_contraction)
lead_contraction_p.def_abstract_eval(functools.partial(_out_aval, _axes_contraction))

for _p, _rows, _axes in (
    (lead_product_p, rows_product, axes_product),
    (lead_contraction_p, _rows_contraction, _axes_contraction),
):
    mlir.register_lowering(_p, mlir.lower_fun(_rows, multiple_results=False), platform="cpu")
    mlir.register_lowering(_p, mlir.lower_fun(_axes, multiple_results=False))


# -- derivatives ------------------------------------------------------------------------------


def _product_transpose_x(ct, x, w, *, transposed):
    # y = x @ w.T: x's cotangent is ct @ w, the product with ``transposed`` flipped
    return lead_product(ct, w, not transposed)


def _product_transpose_w(ct, x, w, *, transposed):
    # y = x @ w.T: w's cotangent is ct^T x over the leading axes ([out, in]), or x^T ct
    return lead_contraction(x, ct) if transposed else lead_contraction(ct, x)


def _contraction_transpose_a(ct, a, b):
    # c = sum a[..., p] b[..., q]: a's cotangent is b @ ct.T, [..., p]
    return lead_product(b, ct, False)


def _contraction_transpose_b(ct, a, b):
    # b's cotangent is a @ ct, [..., q]
    return lead_product(a, ct, True)


ad.defbilinear(lead_product_p, _product_transpose_x, _product_transpose_w)
ad.defbilinear(lead_contraction_p, _contraction_transpose_a, _contraction_transpose_b)


# -- batching: a batch of inputs is more leading axes; anything else is XLA's batched
# product (``vmap`` of the axes form) -------------------------------------------------------


def _product_batch(args, dims, *, transposed):
    (x, w), (xd, wd) = args, dims
    if wd is None:
        return lead_product(jnp.moveaxis(x, xd, 0), w, transposed), 0
    form = functools.partial(axes_product, transposed=transposed)
    return jax.vmap(form, in_axes=(xd, wd))(x, w), 0


def _contraction_batch(args, dims):
    return jax.vmap(_axes_contraction, in_axes=tuple(dims))(*args), 0


batching.primitive_batchers[lead_product_p] = _product_batch
batching.primitive_batchers[lead_contraction_p] = _contraction_batch


# -- the layer's product ---------------------------------------------------------------------


def meshless(*arrays: jax.Array) -> bool:
    """Whether no mesh with typed axes is in play: the current mesh (``jax.set_mesh``,
    ``shard_map``) and the operands' types carry only ``Auto`` axes, if any. Under
    ``Explicit`` or ``Manual`` axes JAX's sharding types (explicit shardings, varying
    manual axes) must pass through the product, which ``dot_general`` does and these
    primitives do not try to; ``Auto`` axes leave the placement to XLA's partitioner."""
    current = getattr(jax.sharding, "get_abstract_mesh", None)
    typeof = getattr(jax, "typeof", None)
    if current is None or typeof is None:
        return False
    meshes = [current()]
    meshes += [getattr(getattr(typeof(a), "sharding", None), "mesh", None) for a in arrays]
    auto = jax.sharding.AxisType.Auto
    return all(m is None or all(t == auto for t in m.axis_types) for m in meshes)


def bilinear_jvp(product, weight_term, primals, tangents):
    """The value and tangent of ``product(x, w)``, linear in each of ``x`` and ``w``:
    ``product(dx, w) + weight_term(x, dw)``, where ``weight_term`` computes
    ``product(x, dw)`` in another form; terms whose tangent is a symbolic zero are left
    out (JAX calls the rule only when one is not)."""
    (x, w), (dx, dw) = primals, tangents
    terms = []
    if not isinstance(dx, SymbolicZero):
        terms.append(product(dx, w))
    if not isinstance(dw, SymbolicZero):
        terms.append(weight_term(x, dw))
    return product(x, w), sum(terms[1:], terms[0])


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def leading_axes_product(x: jax.Array, w: jax.Array, transposed: bool) -> jax.Array:
    """``x`` ``[..., in]`` times ``w`` ``[out, in]`` (``[in, out]`` if ``transposed``):
    ``dot_general``'s value and input tangent, ``lead_product``'s weight tangent. For
    operands where ``meshless`` holds."""
    return axes_product(x, w, transposed)


def _leading_axes_product_jvp(transposed, primals, tangents):
    def product(x, w):
        return axes_product(x, w, transposed)

    def weight_term(x, dw):
        return lead_product(x, dw, transposed)

    return bilinear_jvp(product, weight_term, primals, tangents)


leading_axes_product.defjvp(_leading_axes_product_jvp, symbolic_zeros=True)
