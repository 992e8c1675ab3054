"""Registry cases and error-catalog entries: pools."""

from __future__ import annotations

CASES: list = []
ERRORS: list = []
