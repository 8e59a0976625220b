"""The output's time column: the input's time rows, read and written chunk file by chunk file.

Why not through zarr: the writer copies each output chunk's time rows while the engine runs, and
zarr-python reads and writes them in Python on its event loop (14 + 4 ms per 65,536 rows on the 2-core
development VM). On the H200 host those calls held the GIL the engine thread launches with: the e2e job
(1M x 1024, 16 MB chunks) took 0.255 s without the time column against 0.40-0.43 s with it
(benchmarks/NOTES.md, "The writer"). Here chunk files are read and decoded with numcodecs, which
releases the GIL (:class:`TimeReader`; the files of one read are read by one call of
:mod:`tsconv.io.readers.fileread`'s native reader when it is there); the output's time chunks go through
:class:`~tsconv.io.writers.encode.ChunkFileWriter` like the values. Layouts the fast path does not take (other
codecs, sharding, remote or format-2 stores) are read through zarr, as before.

Every reader of an input's time goes through :class:`TimeColumn`, which decodes the stored values (CF
units, datetime64; :mod:`tsconv.io.timecoding`) to int64 ns block by block; tsconv's own int64 ns arrays
pass through untouched, so the fast path costs nothing more for them.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from tsconv.errors import StoreError
from tsconv.io.readers import fileread
from tsconv.io.readers.chunkfile import chunk_cut_short, chunk_layout, decode_bytes
from tsconv.io.timecoding import TimeCoding, time_coding

__all__ = ["ShiftedTime", "TimeColumn", "TimeReader"]


class TimeColumn:
    """A 1-D stored time array seen as int64 nanoseconds since the epoch (UTC), decoded on each read.

    ``array`` is the stored array and ``coding`` how its values encode instants (default: read from its
    dtype and attributes, refusing what cannot be decoded). Slicing returns decoded int64 rows."""

    ndim = 1
    dtype = np.dtype(np.int64)

    def __init__(self, array: Any, coding: TimeCoding | None = None, *, where: str = "'time'") -> None:
        self.array = array
        self.where = where
        self.coding = coding if coding is not None else time_coding(array, where=where)
        self.shape = (int(array.shape[0]),)
        self.chunks = tuple(getattr(array, "chunks", None) or (max(1, self.shape[0]),))

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def plain(self) -> bool:
        """Whether the stored values are int64 ns as they are (tsconv's own layout)."""
        return self.coding.identity

    def decode(self, raw: np.ndarray, row0: int) -> np.ndarray:
        """Stored values of rows row0, row0 + 1, ... as int64 ns."""
        return self.coding.decode(raw, row0, where=self.where)

    def __getitem__(self, key: slice | int) -> Any:
        if isinstance(key, slice):
            a, b, step = key.indices(self.shape[0])
            if step != 1:
                raise IndexError("time rows are read as contiguous slices")
            return self.decode(self.stored(a, b), a)
        i = int(key) + (self.shape[0] if int(key) < 0 else 0)
        if not 0 <= i < self.shape[0]:
            raise IndexError(f"time row {key} outside 0..{self.shape[0]}")
        return self.decode(self.stored(i, i + 1), i)[0]

    def stored(self, a: int, b: int) -> np.ndarray:
        """Stored values of rows [a, b) as zarr reads them; a chunk that does not decode is a StoreError."""
        cut = chunk_cut_short(self.array, a, b)  # zarr would decode it from the bytes past its end, silently
        if cut is not None:
            raise damaged(self.where, f"rows {a:,}..{b:,}", ValueError(cut))
        try:
            return np.asarray(self.array[a:b])
        except Exception as exc:  # a damaged chunk file: name it, without a traceback
            first = exc
        n = self.chunks[0]
        for c in range(a // n, -(-b // n)):  # read chunk by chunk to find the one that fails
            c0, c1 = c * n, min((c + 1) * n, self.shape[0])
            try:
                self.array[c0:c1]
            except Exception as exc:
                raise damaged(self.where, f"chunk {c} (rows {c0:,}..{c1:,})", exc) from None
        raise damaged(self.where, f"rows {a:,}..{b:,}", first) from None


def damaged(where: str, what: str, exc: BaseException) -> StoreError:
    """The error for time rows that cannot be read: which array and chunk, why, and the fix."""
    why = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
    return StoreError(
        f"cannot read {what} of {where}: {why}",
        hint="the time array's chunk file is damaged or truncated: restore it from a copy, or re-create the "
        "store (one made by `tsconv ingest`: `tsconv ingest FILES -o STORE --overwrite`).",
    )


class ShiftedTime:
    """A 1-D array seen from row ``offset`` on: the output's time when it covers a time range."""

    def __init__(self, array: Any, offset: int) -> None:
        self.array, self.offset = array, offset

    def __getitem__(self, rows: slice) -> np.ndarray:
        return np.asarray(self.array[rows.start + self.offset : rows.stop + self.offset])


class TimeReader:
    """Rows [a, b) of a 1-D time source (a :class:`TimeColumn`, a stored array taken as int ns, or a
    :class:`ShiftedTime` of either) as int64 ns.

    Thread-safe. ``fast`` says whether chunk files are read directly; ``fallback_reason`` why not."""

    def __init__(self, source: Any) -> None:
        self.source = source
        inner, self.offset = (source.array, source.offset) if isinstance(source, ShiftedTime) else (source, 0)
        self.column = (
            inner
            if isinstance(inner, TimeColumn)
            else TimeColumn(inner, TimeCoding(np.dtype(inner.dtype), description="the time rows"))
        )
        self.array = self.column.array
        self._layout, self.fallback_reason = chunk_layout(self.array, ndim=1)
        kinds = "iuf" if self.column.coding.cf else "iu"  # floats only with units: they are decoded
        if self._layout is not None and self._layout.dtype.kind not in kinds:
            self._layout, self.fallback_reason = None, f"dtype {self._layout.dtype}"
        self.fast = self._layout is not None
        self._rows = int(self.array.shape[0]) if self.fast else 0
        # Decoded chunks that reads took part of: readers and writers ask for a band of rows at a time, and
        # a time chunk (zarr's default for 2M int64 rows: 65,536; xarray's: often the whole coordinate) spans
        # many bands, each of which would otherwise decode the whole chunk again.
        self._decoded: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, a: int, b: int) -> np.ndarray:
        """Rows [a, b) of the source (after its offset)."""
        lo, hi = a + self.offset, b + self.offset
        if self._layout is None:
            return self.column.decode(self.column.stored(lo, hi), lo)
        if not 0 <= lo <= hi <= self._rows:
            raise IndexError(f"time rows {lo}..{hi} outside 0..{self._rows}")
        lay = self._layout
        n = lay.chunks[0]
        out = np.empty(hi - lo, dtype=lay.dtype)  # the stored values, decoded to ns at the end
        chunks = range(lo // n, -(-hi // n))
        # chunks this read takes part of and an earlier read decoded: neither read from disk nor decoded
        hits = {
            c: h for c in chunks if not lo <= c * n < c * n + n <= hi and (h := self._cached(c)) is not None
        }
        todo = [c for c in chunks if c not in hits]
        native = fileread.native_reader()
        stored = dict(zip(todo, self._read_files(native, todo), strict=True)) if native is not None else {}
        for c in chunks:
            c0 = c * n
            s0, s1 = max(lo, c0), min(hi, c0 + n)
            dest = out[s0 - lo : s1 - lo]
            if c in hits:
                dest[:] = hits[c][s0 - c0 : s1 - c0]
                continue
            if stored.get(c) is not None:
                data = stored[c]
                if s1 - s0 == n and lay.codec is not None:
                    self._decode(c, data, dest.view(np.uint8))  # a whole chunk: straight into place
                    continue
            else:
                data = self._file(c)
            values = self._values(c, data)
            if s1 - s0 < n:
                self._keep(c, values)
            dest[:] = values[s0 - c0 : s1 - c0]
        return out if self.column.plain else self.column.decode(out, lo)

    _KEEP_BYTES = 64 << 20  # decoded chunks kept for partial reads, in all

    def _cached(self, c: int) -> np.ndarray | None:
        with self._lock:
            hit = self._decoded.get(c)
            if hit is not None:
                self._decoded.move_to_end(c)
            return hit

    def _keep(self, c: int, values: np.ndarray) -> None:
        if values.nbytes > self._KEEP_BYTES:
            return
        with self._lock:
            self._decoded[c] = values
            while sum(v.nbytes for v in self._decoded.values()) > self._KEEP_BYTES:
                self._decoded.popitem(last=False)

    def _path(self, c: int) -> str:
        lay = self._layout
        assert lay is not None
        return f"{os.fspath(lay.root)}/{lay.key((c, 0))}"

    def _read_files(self, native: fileread.NativeReader, chunks: list[int]) -> list[np.ndarray | None]:
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
        except Exception as exc:  # e.g. a truncated frame: numcodecs raises RuntimeError or ValueError
            raise damaged(self.column.where, f"chunk {c} (file {self._path(c)})", exc) from None

    def _values(self, c: int, data: Any) -> np.ndarray:
        """Chunk ``c``'s stored values from its stored bytes (``None``: the fill value)."""
        lay = self._layout
        assert lay is not None
        n = lay.chunks[0]
        if data is None:
            return np.full(n, lay.fill, dtype=lay.dtype)
        raw = np.empty(n * lay.dtype.itemsize, dtype=np.uint8)
        self._decode(c, data, raw)
        return raw.view(lay.dtype)
