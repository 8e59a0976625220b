"""An opt-in timeline of the engine's threads, for finding which stage waits on which.

Off by default (each hook is one module-global test). ``with recording() as spans:`` turns it on for
one run; ``spans`` then holds ``(name, thread, t0, t1, arg)`` tuples in ``time.perf_counter`` seconds:
decode of each chunk (reader threads), the engine thread's waits and launches, GPU work of each piece
and step (from CUDA events, placed on the same clock), and the writer threads' chunk writes.
``benchmarks/engine_trace.py`` records one and summarises it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["on", "add", "recording"]

on = False  # read by the hooks; set only through recording()
_spans: list[tuple[str, int, float, float, Any]] = []


def add(name: str, t0: float, t1: float, arg: Any = None, *, thread: int | None = None) -> None:
    """Record one span (list.append is atomic under the GIL, so threads need no lock)."""
    _spans.append((name, threading.get_native_id() if thread is None else thread, t0, t1, arg))


@contextmanager
def recording() -> Iterator[list[tuple[str, int, float, float, Any]]]:
    """Record spans while the block runs; the yielded list is filled in place."""
    global on
    _spans.clear()
    out: list[tuple[str, int, float, float, Any]] = []
    on = True
    try:
        yield out
    finally:
        on = False
        out.extend(_spans)
        _spans.clear()
