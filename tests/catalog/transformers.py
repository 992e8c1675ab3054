"""Registry cases and error-catalog entries: transformers."""

from __future__ import annotations

CASES: list = []
ERRORS: list = []
