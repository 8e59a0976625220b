"""The interfaces between the stages of a run: what the engines read from and what they hand rows to.

``Source`` is what an entry gives the engine (a zarr store, an array, a frame's columns): its shape, and a
``BandReader`` it opens for one run. ``BandReader`` is every member the engines use of a reader; readers
subclass it and override what differs from the defaults, so the engines never probe attributes.
``DeviceBandReader`` adds what a reader that decodes into device memory provides. ``Sink`` is where the
engines hand the computed rows, in order: a zarr output, a Parquet file, an in-memory array or frame.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

__all__ = ["BandReader", "DeviceBandReader", "FrameSink", "HostSource", "Sink", "Source", "is_rows_of"]


class BandReader:
    """Raw rows of a [T, F] series for the engines, read forward in row ranges.

    The defaults describe a plain reader (rows in ordinary host memory, no ring, no threads of its own).
    """

    rows: int
    n_features: int
    band_rows: int  # rows per band of the source's chunk grid: the natural read granularity
    dtype: np.dtype  # the stored dtype (rows are handed out in it)
    where: str = "the input"  # names the source in errors
    fast: bool = False  # reads chunk files itself (False: through zarr, or from memory)
    fallback_reason: str | None = None  # why it does not read chunk files itself
    pinned: bool = False  # read() returns views of page-locked host memory
    hold: int = 1  # bands kept intact behind the one being read (the batched engine's pieces)
    ring_bands: int | None = None  # bands of its ring: a read never spans the ring's wrap; None: no ring
    threads: int = 0  # host threads decoding for it
    file_reads: str | None = None  # how chunk files are read ("native", "python (why)"), where it reads them
    on_device: bool = False  # a DeviceBandReader: rows decoded into device memory
    # how it reads, for the report: "gpu" (decoded on the GPU), "threads" (chunk files decoded by its
    # threads), "zarr" (through zarr) or "memory" (an in-memory source)
    kind: str = "memory"

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) as a [stop - start, F] array, valid until a later read (it may be a view of
        the reader's buffers)."""
        raise NotImplementedError

    @property
    def busy_seconds(self) -> float:
        """Seconds its threads spent decoding, summed over threads."""
        return 0.0

    def verify(self, stop: int) -> None:
        """Raise if a chunk holding rows before ``stop`` did not decode (readers that decode lazily)."""

    def narrow(self, features: np.ndarray) -> None:
        """Later reads need only ``features`` (indices): a reader may leave the others' values undefined in the
        bands it has not begun to decode (a scan for the few features still missing reads less)."""

    def close(self) -> None:
        """Stop its threads and free its buffers."""

    def __enter__(self) -> BandReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HostSource(BandReader):
    """A source in host memory that is its own reader (a :class:`Source`): nothing for the GPU to decode."""

    def gpu_reader(self) -> tuple[dict[int, int], str | None]:
        return {}, f"{self.where} is in host memory"

    def open(
        self,
        *,
        device: Any,
        pinned: bool,
        hold: int,
        gpu: bool,
        threads: int | None,
        batch: int | None = None,
    ) -> BandReader:
        return self


class DeviceBandReader(BandReader):
    """A reader that decodes into device memory (the GPU reader)."""

    on_device = True
    kind = "gpu"
    piece_bands: int = 1  # bands it serves in one device view

    def read_device(self, start: int, stop: int) -> tuple[Any, Any]:
        """Rows [start, stop) as a device tensor view and the event after which they are decoded."""
        raise NotImplementedError

    def release(self, band: int, event: Any) -> None:
        """The band's slot may be reused once ``event`` (the last kernel reading it) has run."""
        raise NotImplementedError

    def finish(self) -> None:
        """After the last read: raise if any chunk did not decode; fill :attr:`gpu_stage_seconds`."""
        raise NotImplementedError

    gpu_stage_seconds: dict[
        str, float
    ]  # event-timed seconds of its ``h2d`` copies and ``gpu_decode`` launches


class Source(Protocol):
    """What a run reads: its shape and how to open a reader over it for one run."""

    rows: int
    n_features: int
    dtype: np.dtype
    where: str

    @property
    def band_rows(self) -> int:
        """Rows per band of its chunk grid."""
        ...

    def gpu_reader(self) -> tuple[dict[int, int], str | None]:
        """({bands per decode launch: device bytes}, None), largest batch first, when its chunks can be
        decoded on the GPU; else ({}, why not)."""
        ...

    def open(
        self,
        *,
        device: Any,
        pinned: bool,
        hold: int,
        gpu: bool,
        threads: int | None,
        batch: int | None = None,
    ) -> BandReader:
        """A reader for this run: ``gpu`` decodes on ``device``, ``batch`` bands per launch (None: the
        largest of :meth:`gpu_reader`); ``pinned`` reads into page-locked memory; ``hold`` bands stay intact
        behind the one being read; ``threads`` decode threads (None: default)."""
        ...


class Sink(Protocol):
    """Where the engines hand computed rows, in order."""

    threads: int  # its writer threads (0: writes in the caller's thread)

    @property
    def busy_seconds(self) -> float:
        """Seconds its threads spent encoding and writing, summed over threads."""
        ...

    def append(self, block: np.ndarray, *, release: Callable[[], None] | None = None) -> None:
        """The next rows [n, D] float32. Without ``release`` they are copied before it returns; with it
        ``block`` is lent until ``release()`` is called (exactly once, from any thread, also on failure)."""
        ...

    def reserve(self, n: int) -> np.ndarray | None:
        """Where the next rows, up to ``n`` of them, may be computed in place ([k, D] float32, 1 <= k <= n,
        C-contiguous, or rows of a feature-major buffer, each column contiguous; appending exactly it then copies
        nothing), or None where the sink has no such place."""
        ...

    def finish(self) -> None:
        """Every row has been appended: write what is buffered and make the output whole."""
        ...

    def close(self) -> None:
        """Stop without finishing (after an error): drop what is queued, leave the output as it is."""
        ...


class FrameSink(Protocol):
    """A sink that also stores chunks the engine encoded itself (Blosc-LZ4 frames made on the GPU:
    :mod:`tsconv.kernels.lz4_encode`), so the host's cores do not encode them."""

    def frame_rows(self) -> int | None:
        """Rows per chunk it stores from frames, or None when it takes rows only."""
        ...

    def decide_compression(self, sample: np.ndarray | None) -> bool | None:
        """Settle a codec still to be chosen from ``sample`` (the first chunk's rows); True when frames may
        be appended, False when not, None while undecided (no sample, or one without a value)."""
        ...

    def append_frames(
        self, frames: np.ndarray, *, rows: int, empty: np.ndarray, release: Callable[[], None]
    ) -> None:
        """The next ``rows`` rows as whole chunks' frames (uint8 [k, >= frame], each frame's length in its
        header), ``empty[c]``: chunk c is all NaN. Lent until ``release()``, as ``Sink.append``'s block."""
        ...


def is_rows_of(block: np.ndarray, out: np.ndarray, pos: int) -> bool:
    """Whether ``block`` is ``out[pos : pos + len(block)]`` itself: rows a sink's :meth:`Sink.reserve` gave,
    computed in place (appending them copies nothing)."""
    return (
        block.shape[1:] == out.shape[1:]
        and pos + block.shape[0] <= out.shape[0]
        and block.__array_interface__["data"][0] == out[pos:].__array_interface__["data"][0]
        and block.strides == out.strides
    )
