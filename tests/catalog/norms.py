"""Registry cases and error-catalog entries: norms."""

from __future__ import annotations

CASES: list = []
ERRORS: list = []
