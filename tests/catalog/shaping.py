"""Registry cases and error-catalog entries: shaping."""

from __future__ import annotations

CASES: list = []
ERRORS: list = []
