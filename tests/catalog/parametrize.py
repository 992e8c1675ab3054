"""Registry cases and error-catalog entries: parametrize."""

from __future__ import annotations

CASES: list = []
ERRORS: list = []
