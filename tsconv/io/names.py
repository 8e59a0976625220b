"""Feature names: the checks that every entry (a store, an array, a stream, an ingest) makes of them."""

from __future__ import annotations

import unicodedata

__all__ = ["control_name", "describe_repeats", "repeated_names"]


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
