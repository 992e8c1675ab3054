"""Registry cases and error-catalog entries: activations."""

from __future__ import annotations

CASES: list = []
ERRORS: list = []
