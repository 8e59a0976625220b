"""The fast reader: chunk files decoded in parallel threads straight into a reused ring of band buffers.

zarr-python decodes at 1.6-2.4 GB/s; 16 threads decoding the chunk files with numcodecs (whose C code
releases the GIL) into reused buffers reach about 22 GB/s on the GPU machine (``/work/shared/FACTS.md``).
:class:`ParallelBandReader` does that for the layouts tsconv writes and most stores use:

* a local zarr format-3 array, 2-D, regular chunk grid, default chunk key encoding, no sharding and no
  storage transformers;
* codecs exactly ``bytes`` (little endian) then at most one compressor, ``blosc`` (any cname, shuffle)
  or ``zstd`` (any level, with or without checksum); no filters, no transpose.

Everything else (format 2, sharding, other codecs, big-endian bytes, remote or in-memory stores, 1-D
arrays, stand-ins that are not zarr arrays) is served by :class:`~tsconv.io.readers.blocks.BlockReader`
(zarr reads) with the same result; :attr:`ParallelBandReader.fallback_reason` says why.

How it reads. A *band* is one row of the chunk grid across all features: ``chunks[0]`` rows x F.
The reader keeps a ring of ``prefetch + 1 + hold`` band buffers, allocated once (pinned host memory when
asked and CUDA is present), and one task per chunk file in a thread pool. When the consumer first reads
from band ``b``, bands ``b .. b + prefetch`` are scheduled into the ring (band ``j`` goes to slot
``j % ring``); bands ``b - hold .. b - 1`` stay intact (``hold`` defaults to 1), older slots are
reused. A chunk spanning all features is decoded straight into its band buffer
(``codec.decode(data, out=band)``); otherwise it is decoded into a per-thread scratch buffer and copied
into its column slice. A missing chunk file is the fill value.

Buffer lifetime: :meth:`ParallelBandReader.read` returns a *view* of the ring when the rows lie in one
band, or (with ``hold > 1``) in at most ``hold + 1`` bands whose slots are adjacent (no wrap). That view
stays valid until a read that reaches ``hold + 1`` or more bands past its first band (where a read ends,
not where it starts: reading band L reuses the slots of bands L - hold - 1 and before); copy it if it must live
longer. Other reads spanning bands return a fresh array. The chunked engine uses each block before its next
read and keeps only copies (see there).

Reads behind the ring (resume reads bands backwards to rebuild the fill state; random access) are
decoded synchronously in the calling thread into a fresh array, leaving the prefetch state alone; the
last such band is kept, so reading it again costs nothing.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

import numpy as np

from tsconv import config, trace
from tsconv.errors import StoreError
from tsconv.io.contracts import BandReader
from tsconv.io.readers.blocks import BlockReader
from tsconv.io.readers.chunkfile import chunk_layout, decode_chunk_into

__all__ = ["ParallelBandReader", "fast_path_reason", "default_threads", "lower_thread_priority"]

DEFAULT_MAX_RING_BYTES = 1 << 30


IO_NICE = 5  # the decode and write threads' nice value above the engine's thread


def lower_thread_priority() -> None:
    """Thread-pool initializer: raise this worker thread's nice value by IO_NICE.

    With every core decoding or encoding, the engine's own thread (which launches the GPU work and hands
    out the next bands) was runnable but not running for about half of a run on the 16-core GPU machine
    (benchmarks/NOTES.md); a lower priority for the I/O threads lets it in first. Linux nice values are
    per thread; raising one needs no privilege. Elsewhere this does nothing.
    """
    nice = IO_NICE
    if not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    except OSError:
        pass


def default_threads() -> int:
    """The ``decode_threads`` setting, else min(16, CPU count): 16 threads reached the measured 22 GB/s
    on the 16-core GPU machine."""
    n = config.current().decode_threads
    return max(1, n) if n is not None else max(1, min(16, config.cpu_count()))


def fast_path_reason(array: Any) -> str | None:
    """None when :class:`ParallelBandReader` decodes ``array`` itself, else why it falls back to zarr."""
    return chunk_layout(array)[1]


def _alloc_ring(shape: tuple[int, int, int], dtype: np.dtype, pin: bool) -> tuple[np.ndarray, Any]:
    """The ring, pinned (page-locked, for fast H2D copies) when asked and CUDA is there; (array, owner)."""
    if pin:
        import torch

        if torch.cuda.is_available():
            nbytes = math.prod(shape) * dtype.itemsize
            owner = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=True)
            return owner.numpy()[:nbytes].view(dtype).reshape(shape), owner
    return np.empty(shape, dtype=dtype), None


class ParallelBandReader(BandReader):
    """Serve row ranges of a 2-D zarr array, decoding bands of ``chunks[0]`` rows ahead in threads.

    Same interface as :class:`~tsconv.io.readers.blocks.BlockReader` (``rows``, ``n_features``, ``band_rows``,
    ``read``, ``bands_decoded``), plus ``close()`` (also a context manager). ``threads`` decode threads
    (default min(16, CPU count)); ``prefetch`` bands decoded ahead of the one being read (default: enough
    chunk files in flight for every thread, at least 2, within ``max_ring_bytes``); ``pin`` allocates the
    ring in pinned memory when CUDA is available; ``hold`` bands behind the one being read stay intact
    (see the module docstring). Memory: ``(prefetch + 1 + hold) x band bytes``.
    ``fast`` says whether the fast path is used, ``fallback_reason`` why not. See the module docstring
    for how long a returned view stays valid.
    """

    def __init__(
        self,
        array: Any,
        *,
        threads: int | None = None,
        prefetch: int | None = None,
        pin: bool = False,
        where: str = "the store",
        max_ring_bytes: int = DEFAULT_MAX_RING_BYTES,
        hold: int = 1,
    ) -> None:
        self.array = array
        self.where = where
        self.rows = int(array.shape[0])
        self.n_features = int(array.shape[1]) if array.ndim == 2 else 1
        self.band_rows = int(array.chunks[0])
        self.threads = max(1, int(threads)) if threads is not None else default_threads()
        self.hold = max(1, int(hold))
        layout, reason = chunk_layout(array)
        self.fallback_reason = reason
        self.fast = layout is not None
        self.pinned = False
        self.prefetch = 0
        self._closed = False
        if layout is None:
            self._fallback = BlockReader(array, where=where)
            return
        self._layout = layout
        self._col_rows, self._col_width = layout.chunks
        self._n_cols = -(-self.n_features // self._col_width)
        self._cols = range(self._n_cols)  # the chunk columns each band decodes (narrow() may cut them)
        self._n_bands = -(-self.rows // self.band_rows)
        self._whole = (
            self._n_cols == 1 and self._col_width == self.n_features
        )  # decode straight into the band
        band_bytes = self.band_rows * self.n_features * layout.dtype.itemsize
        self._plan_ring(prefetch, max_ring_bytes, band_bytes)
        self._slot_band = [-1] * self._ring_len
        self._pos: int | None = None  # the band the consumer reads now
        self._side: tuple[int, np.ndarray] | None = None  # the last band decoded behind the ring
        self._decoded = 0
        self._busy = 0.0
        self._busy_lock = threading.Lock()
        self._tls = threading.local()
        self._start(pin)

    def _plan_ring(self, prefetch: int | None, max_ring_bytes: int, band_bytes: int) -> None:
        """Set ``prefetch`` and the ring's length."""
        if prefetch is None:
            prefetch = max(2, -(-self.threads // self._n_cols))
            prefetch = min(prefetch, max(1, max_ring_bytes // max(band_bytes, 1) - 1 - self.hold))
        self.prefetch = max(1, min(int(prefetch), max(1, self._n_bands - 1)))
        self._ring_len = min(self.prefetch + 1 + self.hold, max(self._n_bands, 2))  # a slot per band at most

    def _start(self, pin: bool) -> None:
        """Allocate the ring and start the decoders."""
        self._ring, self._ring_owner = _alloc_ring(
            (self._ring_len, self.band_rows, self.n_features), self._layout.dtype, pin
        )
        self.pinned = self._ring_owner is not None
        self._slot_futures: list[list[Future[None]]] = [[] for _ in range(self._ring_len)]
        self._pool = ThreadPoolExecutor(
            max_workers=self.threads, thread_name_prefix="tsconv-decode", initializer=lower_thread_priority
        )
        self._finalizer = weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)

    # -- interface ---------------------------------------------------------------------------------

    @property
    def kind(self) -> str:
        return "threads" if self.fast else "zarr"

    @property
    def ring_bands(self) -> int | None:
        """Bands in the ring (reads of adjacent bands are views unless they cross its wrap); None: fallback
        reader."""
        return self._ring_len if self.fast else None

    @property
    def busy_seconds(self) -> float:
        """Seconds spent reading and decoding chunk files, summed over threads (0 on the fallback)."""
        return self._busy if self.fast else 0.0

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.array.dtype)

    @property
    def bands_decoded(self) -> int:
        """Bands decoded (or being decoded) so far."""
        return self._fallback.bands_decoded if not self.fast else self._decoded

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop): a view of the ring (one band, or adjacent held bands; see the module's buffer
        lifetime), else a new array."""
        if not self.fast:
            return self._fallback.read(start, stop)
        if not 0 <= start < stop <= self.rows:
            msg = f"row range [{start}, {stop}) outside [0, {self.rows})"
            raise IndexError(msg)
        if self._closed:
            msg = "read() on a closed ParallelBandReader"
            raise ValueError(msg)
        first, last = start // self.band_rows, (stop - 1) // self.band_rows
        if first == last:
            a = first * self.band_rows
            return self._band(first)[start - a : stop - a]
        s0 = first % self._ring_len
        if 1 < self.hold and last - first <= self.hold and s0 + last - first < self._ring_len:
            # Adjacent slots (reading `last` reuses only slots of bands < first): one view of them all.
            for i in range(first, last + 1):
                self._band(i)
            if all(self._slot_band[s0 + k] == first + k for k in range(last - first + 1)):
                a = first * self.band_rows
                return self._ring[s0 : s0 + last - first + 1].reshape(-1, self.n_features)[
                    start - a : stop - a
                ]
        out = np.empty((stop - start, self.n_features), dtype=self._layout.dtype)
        for i in range(first, last + 1):  # each band is copied out before the ring moves past it
            a = i * self.band_rows
            band = self._band(i)
            lo, hi = max(start, a), min(stop, a + band.shape[0])
            out[lo - start : hi - start] = band[lo - a : hi - a]
        return out

    def read_ahead(self, row: int) -> None:
        """Start decoding the bands from ``row``'s on, before the first read (later reads at or after that
        band, up to ``prefetch`` bands on, find them in the ring). A no-op once reading has begun, and on the
        fallback."""
        if self.fast and not self._closed and self._pos is None and 0 <= row < self.rows:
            self._advance(row // self.band_rows)

    def narrow(self, features: np.ndarray) -> None:
        """Bands scheduled from now on decode only the chunk columns holding ``features`` (the others' values
        in them are left as the ring had them)."""
        if self.fast:
            self._cols = sorted({int(f) // self._col_width for f in np.asarray(features).reshape(-1)})

    def close(self) -> None:
        """Stop prefetching: cancel queued decodes, wait for running ones, free the threads."""
        if not self.fast or self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ParallelBandReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the ring ----------------------------------------------------------------------------------

    def _band_len(self, i: int) -> int:
        return min(self.band_rows, self.rows - i * self.band_rows)

    def _band(self, i: int) -> np.ndarray:
        if self._pos is None or i > self._pos:
            self._advance(i)
        s = i % self._ring_len
        if self._slot_band[s] == i:
            for fut in self._slot_futures[s]:
                fut.result()  # raises the chunk's StoreError
            return self._ring[s, : self._band_len(i)]
        return self._band_behind(i)

    def _band_behind(self, i: int) -> np.ndarray:
        """Band ``i`` when the ring does not hold it (a backward or random read): decoded here, into a
        fresh array."""
        if self._side is not None and self._side[0] == i:
            return self._side[1]
        buf = np.empty((self.band_rows, self.n_features), dtype=self._layout.dtype)
        for col in self._cols:
            self._decode_chunk(i, col, buf)
        self._decoded += 1
        band = buf[: self._band_len(i)]
        self._side = (i, band)
        return band

    def _advance(self, b: int) -> None:
        """The consumer moved to band ``b``: schedule bands b .. b + prefetch (band b - 1 stays intact)."""
        self._pos = b
        for j in range(b, min(self._n_bands, b + self.prefetch + 1)):
            s = j % self._ring_len
            if self._slot_band[s] == j:
                continue
            # The slot's previous band (j - ring <= b - hold - 1, or a skipped band after a jump) may still be
            # decoding into it: wait until those writes are over before reusing the buffer.
            wait_futures(self._slot_futures[s])
            self._slot_band[s] = j
            buf = self._ring[s]
            self._slot_futures[s] = [self._pool.submit(self._decode_chunk, j, col, buf) for col in self._cols]
            self._decoded += 1

    # -- one chunk file ----------------------------------------------------------------------------

    def _scratch(self, name: str, nbytes: int) -> np.ndarray:
        buf = getattr(self._tls, name, None)
        if buf is None or buf.size < nbytes:
            buf = np.empty(max(nbytes, 1), dtype=np.uint8)
            setattr(self._tls, name, buf)
        return buf[:nbytes]

    def _decode_chunk(self, band: int, col: int, out: np.ndarray) -> None:
        """Decode chunk (band, col) into its place in the band buffer ``out`` [band_rows, F]."""
        t0 = time.perf_counter()
        try:
            self._decode_chunk_timed(band, col, out)
        finally:
            t1 = time.perf_counter()
            with self._busy_lock:
                self._busy += t1 - t0
            if trace.on:
                trace.add("decode", t0, t1, band)

    def _decode_chunk_timed(self, band: int, col: int, out: np.ndarray) -> None:
        a = band * self.band_rows
        n = self._band_len(band)
        c0 = col * self._col_width
        c1 = min(c0 + self._col_width, self.n_features)
        try:
            lay = self._layout
            decode_chunk_into(
                lay.root / lay.key((band, col)), out, n=n, cols=(c0, c1), whole=self._whole, fill=lay.fill,
                chunk_shape=(self._col_rows, self._col_width), codec=lay.codec, scratch=self._scratch,
            )  # fmt: skip
        except Exception as exc:  # a damaged chunk: say where, as BlockReader does
            raise StoreError(
                f"cannot read rows {a:,}..{a + n:,} of {self.where}: {type(exc).__name__}: {exc}",
                hint="the store may be damaged or truncated; check it with `tsconv inspect`.",
            ) from None
