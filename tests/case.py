"""A registry case: one layer, its example input, its torch twin, its error-catalog
entries and what to check.

``tests/registry.py`` lists the first round's cases; each family module of
``tests/catalog/`` lists its own. ``act`` builds an elementwise activation's case.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from purelayers import layers as L


@dataclasses.dataclass(frozen=True)
class Case:
    """``make()`` builds the layer; ``shape`` is its input; ``out_shape`` the documented
    shape of its (first) output; ``ids`` the vocabulary size when the input is integer
    ids; ``kwargs`` go to ``apply``.

    ``torch(torch)`` builds the equivalent module (``torch.nn``'s, or a twin from
    ``tests/twins.py``): its ``state_dict`` names must equal ours, and (its weights
    randomized) its outputs and gradients too, called as ``torch_call(module, x)``
    (default ``module(x)``) on ``x()`` (default: standard normal of ``shape``), within
    ``rtol``/``atol``. ``gradcheck``: the (small) input shape for ``gradcheck`` in
    float64, or a string saying why the layer has no derivative to check.

    A layer of several inputs (``Bilinear``, a decoder layer) lists the shapes of the
    inputs after the first in ``extra`` (standard normal, passed after ``x`` to both
    sides, their gradients compared too) and sets ``init_all`` where its ``init`` takes every input's shape (``Bilinear``:
    ``init(key, (x1.shape, x2.shape))``; a decoder layer initializes from ``x``'s shape
    alone); its ``gradcheck`` then holds every input's small shape, ``(x, *extra)``.
    ``extra_x()`` gives the extra inputs themselves where they are not standard normal
    (``MaxUnpool2d``'s integer indices): the same arrays at every seed; integer ones are
    not differentiated.

    ``errors``: the layer's error-catalog entries, ``(id, trigger, exception type,
    message regex)`` as ``tests/test_errors.py`` runs them (``pytest.raises(type,
    match=regex)`` around ``trigger()``): bad constructor arguments, inputs it refuses.
    ``tests/test_errors.py`` collects them from every case, so a new layer's raise sites
    are covered from its row.

    A layer torch has no class for gets a twin, a ``torch.nn.Module`` built in the test
    with our names: a builder beside its row (in the family's ``tests/catalog/`` module),
    or in ``tests/twins.py`` when several rows share it."""

    id: str
    make: Callable[[], L.Layer]
    shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    torch: Callable[[Any], Any] | None = None
    ids: int | None = None
    extra: tuple[tuple[int, ...], ...] = ()
    init_all: bool = False
    extra_x: Callable[[], tuple[np.ndarray, ...]] | None = None
    kwargs: dict = dataclasses.field(default_factory=dict)
    x: Callable[[], np.ndarray] | None = None
    torch_call: Callable[..., Any] | None = None
    rtol: float = 1e-5
    atol: float = 1e-5
    gradcheck: tuple[int, ...] | str | None = None
    errors: tuple[tuple[str, Callable[[], Any], type[BaseException], str], ...] = ()

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """Every input's shape: ``(shape, *extra)``."""
        return (self.shape, *self.extra)

    def init_arg(self, shapes: tuple[tuple[int, ...], ...] | None = None) -> Any:
        """What ``init`` takes for inputs of ``shapes`` (default ``self.shapes``)."""
        shapes = self.shapes if shapes is None else shapes
        return tuple(shapes) if self.init_all else shapes[0]

    @property
    def grad_shape(self) -> tuple[int, ...] | None:
        """The gradcheck input shape: ``gradcheck``, else ``shape``; ``None`` when the
        case says why it has none. (Several inputs: see ``grad_shapes``.)"""
        if isinstance(self.gradcheck, str):
            return None
        if self.extra:
            return self.grad_shapes[0]
        return self.shape if self.gradcheck is None else self.gradcheck

    @property
    def grad_shapes(self) -> tuple[tuple[int, ...], ...] | None:
        """Every input's gradcheck shape, ``(x, *extra)``."""
        if isinstance(self.gradcheck, str):
            return None
        if not self.extra:
            return (self.grad_shape,)
        return self.shapes if self.gradcheck is None else tuple(self.gradcheck)


# Inputs on both sides of every activation kink, the kinks themselves (0, +-3), and
# softplus's linear region (beta * x > threshold).
_K = np.array([-30.0, -4.0, -3.0, -2.5, -1.0, -1e-3, 0.0, 1e-3, 0.5, 2.9, 3.0, 3.5, 10.0, 25.0])
KINKS = np.stack([_K, -_K[::-1] * 0.5]).astype(np.float32)


def act(name, make, torch_make=None, gradcheck=(2, 5), errors=()):
    """An elementwise activation: contract at ``(2, 3, 4)``, parity at the kinks,
    gradcheck at a random ``(2, 5)`` input (no entry within ``1e-6`` of a kink);
    ``errors``: its error-catalog entries (``Case.errors``)."""
    twin = torch_make if callable(torch_make) else None
    if isinstance(torch_make, str):
        twin = lambda t: getattr(t.nn, torch_make)()  # noqa: E731
    return Case(
        name, make, (2, 3, 4), (2, 3, 4), twin, x=lambda: KINKS, gradcheck=gradcheck,
        errors=tuple(errors),
    )  # fmt: skip
