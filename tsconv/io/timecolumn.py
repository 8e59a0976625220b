"""The output's time column: the input's time rows, read and written chunk file by chunk file.

Why not through zarr: the writer copies each output chunk's time rows while the engine runs, and
zarr-python reads and writes them in Python on its event loop (14 + 4 ms per 65,536 rows on the 2-core
development VM). On the H200 host those calls held the GIL the engine thread launches with: the e2e job
(1M x 1024, 16 MB chunks) took 0.255 s without the time column against 0.40-0.43 s with it
(benchmarks/NOTES.md, twelfth session). Here chunk files are read and decoded with numcodecs, which
releases the GIL (:class:`TimeReader`; the files of one read are read by one call of
:mod:`tsconv.io.fileread`'s native reader when it is there); the output's time chunks go through
:class:`~tsconv.io.encode.ChunkFileWriter` like the values. Layouts the fast path does not take (other
codecs, sharding, remote or format-2 stores) are read through zarr, as before.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import fileread
from .chunkfile import decode_bytes
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
        chunks = range(lo // n, -(-hi // n))
        native = fileread.native_reader()
        stored = self._read_files(native, chunks) if native is not None else None
        for i, c in enumerate(chunks):
            c0 = c * n
            s0, s1 = max(lo, c0), min(hi, c0 + n)
            dest = out[s0 - lo : s1 - lo]
            if stored is not None and stored[i] is not None:
                data = stored[i]
                if lay.dtype == np.int64 and s1 - s0 == n and lay.codec is not None:
                    self._decode(c, data, dest.view(np.uint8))  # a whole chunk: straight into place
                    continue
            else:
                data = self._file(c)
            dest[:] = self._values(c, data)[s0 - c0 : s1 - c0]
        return out

    def _path(self, c: int) -> str:
        lay = self._layout
        assert lay is not None
        return f"{os.fspath(lay.root)}/{lay.key((c, 0))}"

    def _read_files(self, native: fileread.NativeReader, chunks: range) -> list[np.ndarray | None]:
        """The stored bytes of ``chunks``' files, read by one native call (None: missing, or larger than
        the bound, left to :meth:`_file`)."""
        lay = self._layout
        assert lay is not None
        nbytes = lay.chunks[0] * lay.dtype.itemsize
        bound = nbytes + nbytes // 128 + 64  # Blosc and Zstd frames stay within this; a larger file: _file
        paths = [os.fsencode(self._path(c)) for c in chunks]
        buf = np.empty(len(paths) * bound, dtype=np.uint8)
        offsets = np.arange(len(paths), dtype=np.int64) * bound
        status = native.read(paths, buf.ctypes.data, offsets, np.full(len(paths), bound), threads=4)
        return [buf[o : o + g] if 0 <= g < bound else None for o, g in zip(offsets, status, strict=True)]

    def _file(self, c: int) -> bytes | None:
        try:
            with open(self._path(c), "rb") as f:
                return f.read()
        except FileNotFoundError:  # never written: the fill value, as zarr reads it
            return None

    def _decode(self, c: int, data: Any, raw: np.ndarray) -> None:
        """Chunk ``c``'s stored bytes ``data`` decoded into ``raw`` (uint8, the chunk's size)."""
        lay = self._layout
        assert lay is not None
        data = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
        try:
            if lay.codec is None:
                if data.size != raw.size:
                    raise ValueError(f"holds {data.size} bytes, expected {raw.size}")
                raw[:] = data
            else:
                decode_bytes(lay.codec, data, raw, raw.size)  # checks the size the chunk declares
        except ValueError as exc:
            raise ValueError(f"time chunk {self._path(c)}: {exc}") from None

    def _values(self, c: int, data: Any) -> np.ndarray:
        """Chunk ``c`` as int64 from its stored bytes (``None``: the fill value)."""
        lay = self._layout
        assert lay is not None
        n = lay.chunks[0]
        if data is None:
            return np.full(n, lay.fill, dtype=np.int64)
        raw = np.empty(n * lay.dtype.itemsize, dtype=np.uint8)
        self._decode(c, data, raw)
        return raw.view(lay.dtype).astype(np.int64, copy=False)
