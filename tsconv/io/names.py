"""Feature names: the checks that every entry (a store, an array, a stream, an ingest) makes of them."""

from __future__ import annotations

import fnmatch
import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["case_repeat", "control_name", "describe_repeats", "matching", "ordered_names", "repeated_names"]


def ordered_names(value: Any) -> tuple[str, ...] | None:
    """``value`` as names when it is an ordered, flat sequence of them (a list, a tuple, a 1-D numpy array or
    tensor, a pandas Index, a frame's columns), each as text; None for anything else: a set or a dict (their
    order is not the caller's, so names would go to the wrong columns), a string (its characters), numbers
    that are not integers, nested sequences."""
    if isinstance(value, (str, bytes, set, frozenset, dict)):
        return None
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu()
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        return None
    if arr.ndim != 1:
        return None
    if arr.dtype.kind not in "fcbO":
        return tuple(str(n) for n in arr.tolist())
    if arr.dtype.kind == "O" and all(isinstance(n, str) for n in arr):
        return tuple(arr.tolist())
    return None


def control_name(names: tuple[str, ...] | list[str]) -> str | None:
    """The first name holding a control character (a newline, an escape: they forge lines on a terminal and
    reach every output's names), or None."""
    return next((n for n in names if any(unicodedata.category(ch) == "Cc" for ch in n)), None)


def repeated_names(names: tuple[str, ...] | list[str]) -> list[str]:
    """The names that occur more than once, in order of their first repeat (empty when all differ)."""
    if len(set(names)) == len(names):
        return []
    seen: set[str] = set()
    dups: dict[str, None] = {}
    for n in names:
        if n in seen:
            dups[n] = None
        seen.add(n)
    return list(dups)


def describe_repeats(names: tuple[str, ...] | list[str], dups: list[str]) -> str:
    """'N repeats of M names: 'a', 'b' ...' for an error message."""
    shown = ", ".join(repr(n) for n in dups[:5]) + (f" and {len(dups) - 5} more" if len(dups) > 5 else "")
    extra = len(names) - len(set(names))
    return f"{extra} repeat{'s' * (extra != 1)} of {len(dups)} name{'s' * (len(dups) != 1)}: {shown}"


def case_repeat(names: tuple[str, ...] | list[str]) -> tuple[str, str] | None:
    """The first two distinct names that are equal once case is folded (``AAPL``, ``Aapl``), or None. SQL
    readers such as duckdb take column names case-insensitively: they read one such column for the other."""
    first: dict[str, str] = {}
    for n in names:
        folded = n.casefold()
        if folded in first and first[folded] != n:
            return first[folded], n
        first.setdefault(folded, n)
    return None


def matching(names: Sequence[str], patterns: Sequence[str]) -> list[int]:
    """Indices of ``names`` (in their order) that any entry of ``patterns`` picks: an entry that is one of the
    names picks that name only (a feature named like a glob, ``px[1]`` or ``px?``, stays reachable by its own
    name); any other entry is an fnmatch pattern, case-sensitive."""
    exact = set(names)
    return [
        j
        for j, n in enumerate(names)
        if any(p == n if p in exact else fnmatch.fnmatchcase(n, p) for p in patterns)
    ]
