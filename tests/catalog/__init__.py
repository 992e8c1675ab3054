"""The second round of the catalog (torch-named layers), one module per family.

Each module lists its layers' registry cases in ``CASES`` (``tests/case.py``'s
``Case``; run through ``tests/test_layers.py`` and ``tests/test_bad_input.py`` with the
first round's) and its error-catalog entries in ``ERRORS`` (``tests/test_errors.py``'s
format: ``(id, trigger, exception type, message regex)``).
"""

from __future__ import annotations

from tests.catalog import activations, linear, norms, parametrize, pools, shaping, transformers

FAMILIES = (activations, shaping, pools, norms, linear, transformers, parametrize)
CASES = [case for family in FAMILIES for case in family.CASES]
ERRORS = [entry for family in FAMILIES for entry in family.ERRORS]
