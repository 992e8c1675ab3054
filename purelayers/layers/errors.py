"""``LayerError``: the error a layer raises when an input, a params tree or a call does
not fit it, naming the layer's path inside its containers, what was checked, what was
expected and what was got."""

from __future__ import annotations

from typing import Any

__all__ = ["LayerError"]


class LayerError(ValueError):
    """A shape, dtype or call that does not fit a layer, found while tracing.

    A ``ValueError``. The message is one line, plus the hint on a second line indented
    by two spaces when there is one::

        {where}: {what} expected {expected}, got {got}
          {hint}

    or ``"{where}: {what}"`` (then the hint) when ``expected`` is None. ``where`` is the
    layer's class name, or ``"{root}[{path}] {layer}"`` inside containers
    (``Sequential[3] Linear``): each container the error passes through on its way out
    adds its child's name to ``path`` (``within``).

    Args:
      layer: the failing layer's class name (``"Linear"``).
      what: what was checked (``"input last axis"``, ``"params entry 'weight' shape"``).
      expected: what the layer needs, or None when ``what`` says it all.
      got: what it was given.
      hint: a further line (the input's shape, how to fix the call), or None.
      path: the dotted checkpoint path of the failing layer inside ``root``, as a tuple
        of names (``("3",)``); empty outside containers.
      root: the class name of the outermost container, with ``path``.

    Attributes:
      layer, what, expected, got, hint, path, root: as given.
      where: the message's prefix, from ``layer``, ``path`` and ``root``.

    Example:
      >>> err = LayerError("Linear", "input last axis", 4, 3, "x.shape == (2, 3)")
      >>> print(err)
      Linear: input last axis expected 4, got 3
        x.shape == (2, 3)
      >>> print(err.within("Sequential", "0"))
      Sequential[0] Linear: input last axis expected 4, got 3
        x.shape == (2, 3)

      A layer raises it when traced on an input it does not fit:

      >>> model = L.Sequential(L.Linear(8), L.ReLU())
      >>> params = model.init(jax.random.key(0), (1, 4))
      >>> try:
      ...     model.apply(params, jnp.ones((1, 3)))
      ... except L.LayerError as e:
      ...     print(e.where, "|", e.what, "|", e.expected, "|", e.got)
      Sequential[0] Linear | input last axis | 4 | 3
    """

    def __init__(
        self,
        layer: str,
        what: str,
        expected: Any,
        got: Any,
        hint: str | None = None,
        *,
        path: tuple[str, ...] = (),
        root: str | None = None,
    ):
        self.layer, self.what, self.expected, self.got, self.hint = layer, what, expected, got, hint
        self.path, self.root = path, root
        super().__init__(self._message())

    @property
    def where(self) -> str:
        """``layer``, or ``"{root}[{path}] {layer}"`` inside containers."""
        if not self.path:
            return self.layer
        return f"{self.root}[{'.'.join(self.path)}] {self.layer}"

    def _message(self) -> str:
        msg = f"{self.where}: {self.what}"
        if self.expected is not None:
            msg += f" expected {self.expected}, got {self.got}"
        return msg + (f"\n  {self.hint}" if self.hint else "")

    def within(self, container: str, name: str) -> LayerError:
        """The same error, seen from ``container`` whose child ``name`` raised it."""
        return LayerError(
            self.layer,
            self.what,
            self.expected,
            self.got,
            self.hint,
            path=(name, *self.path),
            root=container,
        )
