"""The reader of stores in object storage: row bands read through zarr, several fetched at once in threads.

Reading an object is a round trip of milliseconds, so reading band after band in one thread leaves the
connection idle most of the time; tsconv's own layout has one chunk per band, so zarr's own concurrency
(``async.concurrency``, per call) does not help either. :class:`PrefetchReader` keeps the next
``ahead`` bands (the ``remote_reads`` setting) being read in a thread pool, each one zarr call
(zarr fetches and decodes that band's chunks itself, so any layout zarr reads works: sharded, format 2,
other codecs). benchmarks/objstore.py measures the gain.
"""

from __future__ import annotations

import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from tsconv import config
from tsconv.io.contracts import BandReader
from tsconv.io.readers.blocks import read_rows, splice_bands

__all__ = ["DEFAULT_MAX_AHEAD_BYTES", "PrefetchReader", "default_ahead"]

DEFAULT_MAX_AHEAD_BYTES = 1 << 30  # the bands being fetched and held, at most


def default_ahead() -> int:
    """Bands fetched at once: the ``remote_reads`` setting (at least 1)."""
    return max(1, config.current().remote_reads)


class PrefetchReader(BandReader):
    """Serve row ranges of a zarr array (2-D values) from whole bands of ``chunks[0]`` rows, reading the
    next ``ahead`` bands in threads while the caller works.

    Each band is a fresh array, kept until a read starts ``hold`` bands past it; a returned view stays
    valid as long as the caller keeps it. Reads behind (a resume) are read in the caller's thread.
    Memory: ``(ahead + 1 + hold)`` bands, ``ahead`` capped to ``max_bytes`` of them.
    """

    kind = "zarr"

    def __init__(
        self,
        array: Any,
        *,
        where: str = "the store",
        ahead: int | None = None,
        hold: int = 1,
        max_bytes: int = DEFAULT_MAX_AHEAD_BYTES,
    ) -> None:
        self.array = array
        self.where = where
        self.dtype = np.dtype(array.dtype)
        self.rows = int(array.shape[0])
        self.n_features = int(array.shape[1]) if array.ndim == 2 else 1
        self.band_rows = int(array.chunks[0])
        self.hold = max(1, int(hold))
        band_bytes = self.band_rows * self.n_features * self.dtype.itemsize
        wanted = default_ahead() if ahead is None else max(1, int(ahead))
        self.ahead = max(1, min(wanted, max_bytes // max(band_bytes, 1) - 1 - self.hold))
        self.threads = self.ahead
        self.fallback_reason = f"an object store: bands read through zarr, {self.ahead} at once"
        self._n_bands = -(-self.rows // self.band_rows)
        self._bands: dict[int, Future[np.ndarray]] = {}
        self._pos = -1
        self.bands_decoded = 0
        self._busy = 0.0
        self._busy_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=self.ahead, thread_name_prefix="tsconv-fetch")
        self._finalizer = weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
        self._closed = False

    @property
    def busy_seconds(self) -> float:
        """Seconds spent reading bands, summed over threads."""
        return self._busy

    def _fetch(self, i: int) -> np.ndarray:
        t0 = time.perf_counter()
        a = i * self.band_rows
        try:
            return read_rows(self.array, a, min(a + self.band_rows, self.rows), where=self.where)
        finally:
            with self._busy_lock:
                self._busy += time.perf_counter() - t0

    def _band(self, i: int) -> np.ndarray:
        if i < self._pos and i not in self._bands:  # behind the window: read here, keep nothing
            self.bands_decoded += 1
            return self._fetch(i)
        if i > self._pos:
            self._pos = i
            for j in range(i, min(self._n_bands, i + self.ahead + 1)):
                if j not in self._bands:
                    self._bands[j] = self._pool.submit(self._fetch, j)
                    self.bands_decoded += 1
        return self._bands[i].result()

    def read(self, start: int, stop: int) -> np.ndarray:
        if not 0 <= start < stop <= self.rows:
            msg = f"row range [{start}, {stop}) outside [0, {self.rows})"
            raise IndexError(msg)
        if self._closed:
            msg = "read() on a closed PrefetchReader"
            raise ValueError(msg)
        first = start // self.band_rows
        for i in [k for k in self._bands if k < first - self.hold + 1]:
            self._bands.pop(i).cancel()
        return splice_bands(start, stop, self.band_rows, self._band)

    def close(self) -> None:
        """Stop: cancel queued reads, wait for running ones, free the threads."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._bands.clear()

    def __enter__(self) -> PrefetchReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
