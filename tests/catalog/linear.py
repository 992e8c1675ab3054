"""Registry cases and error-catalog entries: linear."""

from __future__ import annotations

CASES: list = []
ERRORS: list = []
