"""The output's time column: the input's time rows, read and written chunk file by chunk file.

Why not through zarr: the writer copies each output chunk's time rows while the engine runs, and
zarr-python reads and writes them in Python on its event loop (14 + 4 ms per 65,536 rows on the 2-core
development VM). On the H200 host those calls held the GIL the engine thread launches with: the e2e job
(1M x 1024, 16 MB chunks) took 0.255 s without the time column against 0.40-0.43 s with it
(benchmarks/NOTES.md, twelfth session). Here chunk files are read and decoded with numcodecs, which
releases the GIL (:class:`TimeReader`); the output's time chunks go through
:class:`~tsconv.io.encode.ChunkFileWriter` like the values. Layouts the fast path does not take (other
codecs, sharding, remote or format-2 stores) are read through zarr, as before.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .decode import _inspect

__all__ = ["ShiftedTime", "TimeReader"]


class ShiftedTime:
    """A 1-D array seen from row ``offset`` on: the output's time when it covers a time range."""

    def __init__(self, array: Any, offset: int) -> None:
        self.array, self.offset = array, offset

    def __getitem__(self, rows: slice) -> np.ndarray:
        return np.asarray(self.array[rows.start + self.offset : rows.stop + self.offset])


class TimeReader:
    """Rows [a, b) of a 1-D time source (a zarr array, or a :class:`ShiftedTime` of one) as int64.

    Thread-safe. ``fast`` says whether chunk files are read directly; ``fallback_reason`` why not."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.array, self.offset = (
            (source.array, source.offset) if isinstance(source, ShiftedTime) else (source, 0)
        )
        self._layout, self.fallback_reason = _inspect(self.array, ndim=1)
        if self._layout is not None and self._layout.dtype.kind not in "iu":
            self._layout, self.fallback_reason = None, f"dtype {self._layout.dtype}"
        self.fast = self._layout is not None
        self._rows = int(self.array.shape[0]) if self.fast else 0

    def read(self, a: int, b: int) -> np.ndarray:
        """Rows [a, b) of the source (after its offset)."""
        if self._layout is None:
            return np.asarray(self.source[a:b]).astype(np.int64)
        lo, hi = a + self.offset, b + self.offset
        if not 0 <= lo <= hi <= self._rows:
            raise IndexError(f"time rows {lo}..{hi} outside 0..{self._rows}")
        lay = self._layout
        n = lay.chunks[0]
        out = np.empty(hi - lo, dtype=np.int64)
        for c in range(lo // n, -(-hi // n)):
            c0 = c * n
            s0, s1 = max(lo, c0), min(hi, c0 + n)
            out[s0 - lo : s1 - lo] = self._chunk(c)[s0 - c0 : s1 - c0]
        return out

    def _chunk(self, c: int) -> np.ndarray:
        lay = self._layout
        assert lay is not None
        n = lay.chunks[0]
        try:
            with open(lay.root / lay.key((c, 0)), "rb") as f:
                data = f.read()
        except FileNotFoundError:  # never written: the fill value, as zarr reads it
            return np.full(n, lay.fill, dtype=np.int64)
        nbytes = n * lay.dtype.itemsize
        if lay.codec is None:
            raw = data
        else:
            raw = np.empty(nbytes, dtype=np.uint8)
            lay.codec.decode(data, out=raw)
        if len(raw) != nbytes:
            path = os.fspath(lay.root / lay.key((c, 0)))
            raise ValueError(f"time chunk {path} holds {len(raw)} bytes, expected {nbytes}")
        return np.frombuffer(raw, dtype=lay.dtype).astype(np.int64, copy=False)
