"""The second round of the catalog (torch-named layers), one module per family.

Each module lists its layers' registry cases in ``CASES`` (``tests/case.py``'s
``Case``; run through ``tests/test_layers.py`` and ``tests/test_bad_input.py`` with the
first round's), each case carrying its own error-catalog entries (``Case.errors``) and,
for a layer torch has no class for, a twin built beside it. Entries that belong to no
single case go in the module's ``ERRORS`` (``tests/test_errors.py``'s format: ``(id,
trigger, exception type, message regex)``). The modules are found here by listing the
package: a new family module needs no edit of this file.
"""

from __future__ import annotations

import importlib
import pkgutil

FAMILIES = tuple(
    importlib.import_module(f"{__name__}.{info.name}")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name)
    if not info.name.startswith("_")
)
CASES = [case for family in FAMILIES for case in family.CASES]
ERRORS = [entry for family in FAMILIES for entry in getattr(family, "ERRORS", [])]
