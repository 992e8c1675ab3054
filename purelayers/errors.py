"""Errors of reading checkpoint files, shared by ``purelayers.params``, ``purelayers.lora``
and ``purelayers.models`` (re-exported as ``pl.params.CheckpointError``).

A layer's own errors are ``purelayers.layers.LayerError``.
"""

from __future__ import annotations

import os

__all__ = ["CheckpointError"]


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read: truncated, corrupted, or not a checkpoint.

    The message starts with the offending path; ``.path`` holds it too.

    Example:
      >>> e = CheckpointError("m.safetensors", "truncated: 12 bytes of a 40-byte header")
      >>> e.path, isinstance(e, ValueError)
      ('m.safetensors', True)
    """

    def __init__(self, path: str | os.PathLike, problem: str):
        super().__init__(f"{os.fspath(path)}: {problem}")
        self.path = os.fspath(path)
