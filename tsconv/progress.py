"""Progress of a long run on stderr: tqdm's bar on a terminal, a plain line every few seconds elsewhere.

A bar redrawn with carriage returns is noise in a log file or a CI job; there :class:`PlainProgress`
writes a line every :data:`PLAIN_EVERY_S` seconds (rows done of the total, rate, time left) and one at the
end.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["PLAIN_EVERY_S", "PlainProgress", "progress_bar"]

PLAIN_EVERY_S = 10.0


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def _rate(n: float, unit: str) -> str:
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.1f}{prefix} {unit}/s"
    return f"{n:.0f} {unit}/s"


class PlainProgress:
    """Progress as plain lines on ``stream``: one every ``every`` seconds of ``clock`` while updates come,
    and a last one on close (none where ``stream`` is None or fails). The same calls as a tqdm bar:
    ``update(n)``, ``close()``, a context manager."""

    def __init__(
        self,
        *,
        total: int,
        desc: str,
        unit: str = "rows",
        initial: int = 0,
        stream: TextIO | None,
        clock: Callable[[], float] = time.monotonic,
        every: float = PLAIN_EVERY_S,
    ) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self._initial, self._stream, self._clock, self._every = initial, stream, clock, every
        self._t0 = self._last = clock()
        self._lock = threading.Lock()
        self._closed = False

    def update(self, n: int = 1) -> None:
        """Count ``n`` more rows; write a line when ``every`` seconds passed since the last one."""
        with self._lock:
            self.n += n
            now = self._clock()
            if now - self._last >= self._every:
                self._last = now
                self._write(self._line(now))

    def close(self) -> None:
        """Write the last line (once)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            now = self._clock()
            elapsed = now - self._t0
            rate = (self.n - self._initial) / elapsed if elapsed > 0 else 0.0
            done = (
                f"{self.n:,} {self.unit}"
                if self.n >= self.total
                else f"stopped at {self.n:,} of {self.total:,} {self.unit}"
            )
            self._write(f"{self.desc}: {done} in {_duration(elapsed)} ({_rate(rate, self.unit)})")

    def _line(self, now: float) -> str:
        elapsed = now - self._t0
        rate = (self.n - self._initial) / elapsed if elapsed > 0 else 0.0
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        left = (
            f", about {_duration((self.total - self.n) / rate)} left"
            if rate > 0 and self.n < self.total
            else ""
        )
        return f"{self.desc}: {self.n:,} of {self.total:,} {self.unit}{pct}, {_rate(rate, self.unit)}{left}"

    def _write(self, line: str) -> None:
        """Write ``line``; where stderr is closed (``2>&-``, ``sys.stderr`` None) or cannot be written (a log on
        a full disk, a pipe whose reader left), drop this line and the later ones: the lines are for the eye,
        and the run, its output and its report go on."""
        if self._stream is None:
            return
        try:
            self._stream.write(line + "\n")
            self._stream.flush()
        except (OSError, ValueError):  # ValueError: a closed file object
            self._stream = None

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bar(
    *,
    total: int,
    desc: str,
    unit: str = "rows",
    enabled: bool = True,
    initial: int = 0,
    stream: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """A progress bar over ``total`` rows on ``stream`` (default: stderr as it is now, None where closed): tqdm's on a
    terminal, else a :class:`PlainProgress`; a silent tqdm when not ``enabled``. Use it in ``with``."""
    from tqdm import tqdm

    out = sys.stderr if stream is None else stream
    if not enabled or _is_terminal(out):
        return tqdm(total=total, initial=initial, unit=unit, unit_scale=True, disable=not enabled, desc=desc,
                    dynamic_ncols=True, file=out)  # fmt: skip
    return PlainProgress(total=total, desc=desc, unit=unit, initial=initial, stream=out, clock=clock)
