"""Name patterns, one syntax for every rule table (sharding, labels, masks, LoRA).

A pattern is matched against a whole dotted name (``blocks.3.attn.q_proj.weight``):

- a glob (``fnmatch``, case-sensitive): ``*`` matches any run of characters *including
  dots*, so ``"*.bias"`` matches ``bias`` only inside a child (``0.bias``,
  ``blocks.3.fc.bias``) and ``"*"`` matches every name; ``?`` one character; ``[seq]``
  one character of ``seq``, ``[!seq]`` one not in it;
- ``"re:<regex>"``: a regular expression that must match the whole name
  (``re.fullmatch``): ``"re:blocks\\.[0-5]\\..*"``.
"""

from __future__ import annotations

import fnmatch
import functools
import re

__all__ = ["check_pattern", "matches"]


@functools.lru_cache(maxsize=4096)
def _compile(pattern: str) -> re.Pattern[str]:
    if pattern.startswith("re:"):
        return re.compile(pattern[3:])
    return re.compile(fnmatch.translate(pattern))


def check_pattern(pattern: object, who: str) -> str:
    """``pattern`` if it is a valid pattern, else ``ValueError`` naming ``who`` (the
    function and where the pattern sits, ``"label: rules[2]"``) and the pattern."""
    if not isinstance(pattern, str):
        raise ValueError(f"{who} pattern must be a string, got {pattern!r}")
    try:
        _compile(pattern)
    except re.error as e:
        raise ValueError(
            f"{who} pattern {pattern!r} is not a valid regular expression: {e}"
        ) from None
    return pattern


def matches(pattern: str, name: str) -> bool:
    """Whether the dotted ``name`` matches ``pattern`` (a glob on the whole name, where
    ``*`` also matches dots, or ``"re:<regex>"`` matched with ``re.fullmatch``).

    >>> matches("*.bias", "blocks.3.fc.bias"), matches("*.bias", "bias")
    (True, False)
    >>> matches("re:blocks\\\\.[0-5]\\\\..*", "blocks.4.attn.weight")
    True
    """
    return _compile(pattern).fullmatch(name) is not None
