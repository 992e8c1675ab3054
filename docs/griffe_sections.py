"""A griffe extension for the API reference, adapting the library's docstring sections
(STYLE.md) to griffe's Google-style parser without changing the docstrings:

- ``Parameters:`` in a layer's docstring lists its learned arrays (``weight``: shape,
  init), as ``torch.nn``'s docstrings do, not the arguments that Google style's
  ``Parameters:`` means; it and ``Buffers:`` are renamed so that griffe renders them as
  titled blocks, as it renders ``Shape:``, instead of matching them against the signature.
- ``Example:`` is read as Google style's ``Examples:``, so its doctest lines render as
  Python sessions (code), not as Markdown text.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_RENAMED = {"Parameters": "Learned parameters", "Buffers": "Buffers (state)", "Example": "Examples"}
_SECTION = re.compile(r"^(\s*)(Parameters|Buffers|Example):\s*$", re.M)


class ArraySections(griffe.Extension):
    """Renames the sections above in every docstring griffe reads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        docstring = obj.docstring
        if docstring is not None and _SECTION.search(docstring.value):
            docstring.value = _SECTION.sub(
                lambda m: f"{m.group(1)}{_RENAMED[m.group(2)]}:", docstring.value
            )
