"""The GPU reader: chunk files read as stored bytes, sent to the GPU compressed, decoded there.

Why: with the CPU decoding, the engine's input stage is bound by numcodecs in 16 threads (11-20 GB/s on
H200 hosts) and those threads' GIL hand-offs slow the engine thread's launches. Measured on the H200
(``benchmarks/gpu_decode.py``): reading the 16 MB-chunk store's files
(2.6 GB stored) runs at 30 GB/s on 8 threads, H2D at 55 GB/s, and the GPU decodes the 4.3 GB at 53 GB/s;
read, copy and decode pipelined in batches of 32 chunks gave 32 GB/s of decoded rows on the GPU, against
16 GB/s for the CPU reader plus H2D in the same process. See :mod:`tsconv.kernels.blosc_lz4` for what it
decodes.

The default reader of the batched engine on CUDA with pinned transfers (``--decode cpu`` turns it off; the
``gpu_read_threads`` setting gives its reading threads, default 8), for Blosc-LZ4
stores the fast reader handles
(:func:`unsupported_reason` says why not otherwise; the engine then uses the CPU reader). A chunk whose
header the GPU decoder does not handle is decoded by numcodecs in the reading thread and copied in.

How it runs. Bands (one row of the chunk grid) go in *batches* of ``batch`` bands, through three rings:
pinned host slots for the stored bytes (three batches), device slots for them and device slots for the
decoded bands (two batches each, alternating halves). Reading batches g + 1 and g + 2's files (no
decoding: one call of :mod:`tsconv.io.readers.fileread`'s native reader per batch, or a thread per file with
``readinto`` without it) overlaps the engine's use of batch g. Launching batch g: one H2D copy on a copy
stream, one decode launch on a decode stream (two, alternating, so consecutive batches can decode at once).
A device half is reused two batches later, after the engine has released every band of it
(:meth:`GpuBandReader.release` with the event after its last reader). Damaged chunks set an error flag on
the GPU; the engine's output thread checks the flags of a step's input (:meth:`GpuBandReader.verify`)
before it hands the step's rows to the writer, so no row computed from a damaged chunk is stored, and
:meth:`GpuBandReader.finish` and every reuse of a half check them too; each raises ``StoreError``.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import torch

from tsconv import config, trace
from tsconv.errors import StoreError
from tsconv.io.contracts import DeviceBandReader
from tsconv.io.readers import fileread
from tsconv.io.readers.blocks import BlockReader
from tsconv.io.readers.chunkfile import chunk_layout, decode_bytes
from tsconv.io.readers.threads import lower_thread_priority
from tsconv.kernels import blosc_header

__all__ = ["GpuBandReader", "batch_bands", "device_bytes", "unsupported_reason"]

# A decode launch wants about this many warps (one per LZ4 stream) to fill the H200: batches of 8 / 12 / 32
# 16 MB chunks (1,024 / 1,536 / 4,096 warps) decode at 41 / 53 / 66 GB/s, all 256 at once at 77 GB/s
# (e964f2f); the decoded ring's share of the budget below caps 16 MB chunks at 12 per batch.
TARGET_WARPS = 2048
# The decoded-band ring's share of the GPU memory budget (both halves).
MAX_DECODED_BYTES = 384 << 20
# CUDA priority of the decode streams (0: the default; lower is higher); engine_trace.py's dprioN variants
DECODE_STREAM_PRIORITY = 0
# With the native reader, a batch whose host third is still being copied from is handed to its task at
# once, which waits for the copy: otherwise its read starts only at the engine's next read_device, one
# batch later (engine_trace.py's lateread variant turns this off).
EARLY_READS = True
_HOST_PARTS = 3  # host ring thirds: batches read ahead (two) plus the one being copied
_META = 4  # per-batch metadata and error-flag slots


def _chunk_bytes(layout: Any) -> int:
    return layout.chunks[0] * layout.chunks[1] * layout.dtype.itemsize


def unsupported_reason(array: Any) -> str | None:
    """None when :class:`GpuBandReader` can read ``array``; else why not (the first chunk file present
    decides the codec details; chunks that differ later are decoded on the CPU)."""
    layout, why = chunk_layout(array)
    if why is not None:
        return why
    if not isinstance(layout.codec, numcodecs.Blosc):
        return "not Blosc-compressed (the GPU decodes Blosc-LZ4)"
    n_bands = -(-int(array.shape[0]) // layout.chunks[0])
    n_cols = -(-int(array.shape[1]) // layout.chunks[1])
    for b in range(min(n_bands, 4)):
        for c in range(n_cols):
            path = layout.root / layout.key((b, c))
            try:
                with open(path, "rb") as f:
                    head = f.read(16)
                    size = os.fstat(f.fileno()).st_size
            except FileNotFoundError:
                continue
            try:
                h = blosc_header.parse_header(head)
            except ValueError as exc:
                return str(exc)
            return blosc_header.unsupported_reason(
                h, nbytes=_chunk_bytes(layout), size=size, typesize=layout.dtype.itemsize
            )
    return "no chunk files in the first bands"


def _batch_bands(layout: Any, band_bytes: int, n_cols: int) -> int:
    """Bands per decode launch: about TARGET_WARPS streams, both halves within MAX_DECODED_BYTES."""
    chunk = _chunk_bytes(layout)
    blocks = max(1, -(-chunk // (512 << 10)))  # c-blosc's blocks for large LZ4 chunks: 512 KB
    warps_per_band = blocks * layout.dtype.itemsize * n_cols
    by_warps = -(-TARGET_WARPS // warps_per_band)
    by_memory = max(1, MAX_DECODED_BYTES // (2 * band_bytes))
    return max(1, min(by_warps, by_memory))


def batch_bands(array: Any) -> int:
    """Bands per decode launch that keep the decoder busy (about TARGET_WARPS streams, the decoded ring within
    MAX_DECODED_BYTES), at most the array's bands. A smaller batch holds less GPU memory and decodes slower."""
    layout, _ = chunk_layout(array)
    n_cols = -(-int(array.shape[1]) // layout.chunks[1])
    band_bytes = layout.chunks[0] * int(array.shape[1]) * layout.dtype.itemsize
    n_bands = -(-int(array.shape[0]) // layout.chunks[0])
    return max(1, min(_batch_bands(layout, band_bytes, n_cols), n_bands))


def device_bytes(array: Any) -> dict[int, int]:
    """GPU memory a :class:`GpuBandReader` of ``array`` holds, by bands per launch: from :func:`batch_bands`
    (largest, first) down to one. Each is the decoded-band ring and the ring of stored bytes (sized from the
    chunk files), plus a chunk-sized buffer per chunk of a batch when chunks split the features."""
    layout, _ = chunk_layout(array)
    n_cols = -(-int(array.shape[1]) // layout.chunks[1])
    band_bytes = layout.chunks[0] * int(array.shape[1]) * layout.dtype.itemsize
    slot = _slot_layout(_file_sizes(layout, int(array.shape[0]), n_cols))[1]
    tmp = 0 if n_cols == 1 else 2 * n_cols * _chunk_bytes(layout)
    return {b: 2 * b * (band_bytes + slot) + b * tmp for b in range(batch_bands(array), 0, -1)}


def _padded(n: int) -> int:
    return -(-n // 16) * 16


def _chunk_paths(layout: Any, rows: int, n_cols: int) -> list[list[str]]:
    """Every chunk file's path, [band][column], as strings (pathlib costs ~10 us a path; 256+ a run)."""
    root = os.fspath(layout.root)
    return [
        [f"{root}/{layout.key((b, c))}" for c in range(n_cols)] for b in range(-(-rows // layout.chunks[0]))
    ]


def _file_sizes(layout: Any, rows: int, n_cols: int, paths: list[list[str]] | None = None) -> np.ndarray:
    paths = _chunk_paths(layout, rows, n_cols) if paths is None else paths
    sizes = np.zeros((len(paths), n_cols), dtype=np.int64)
    for b, row in enumerate(paths):
        for c, path in enumerate(row):
            try:
                sizes[b, c] = os.stat(path).st_size
            except FileNotFoundError:
                sizes[b, c] = 0
    return sizes


def _slot_layout(sizes: np.ndarray) -> tuple[np.ndarray, int]:
    """Each chunk's offset in its band's slot (chunks 16-byte aligned, in column order) and the slot size."""
    padded = -(-sizes // 16) * 16
    within = np.cumsum(padded, axis=1) - padded
    return within, int(max(1, padded.sum(axis=1).max()))


class GpuBandReader(DeviceBandReader):
    """Rows of a Blosc-LZ4 zarr array, decoded on ``device`` band by band (see the module docstring).

    For the batched engine: :meth:`read_device` returns a device view of the rows and the event to wait
    on, :meth:`release` takes back a band once the GPU work reading it is done, :meth:`finish` checks the
    error flags. :meth:`read` (host rows, decoded by numcodecs) serves the engine's start state.
    """

    def __init__(
        self,
        array: Any,
        *,
        device: torch.device,
        where: str = "the store",
        threads: int | None = None,
        batch: int | None = None,
    ):
        layout, why = chunk_layout(array)
        if why is not None or not isinstance(layout.codec, numcodecs.Blosc):
            raise ValueError(f"GpuBandReader cannot read this array: {why or 'not Blosc-compressed'}")
        self.array, self.where, self.device = array, where, torch.device(device)
        self._layout = layout
        from tsconv.kernels.blosc_lz4 import decode_chunks  # Triton: only where the GPU decodes

        self._decode_chunks = decode_chunks
        self.rows = int(array.shape[0])
        self.n_features = int(array.shape[1])
        self.band_rows = layout.chunks[0]
        self.dtype = np.dtype(layout.dtype)
        self.threads = max(1, int(threads or config.current().gpu_read_threads))
        self.fast, self.fallback_reason, self.hold = True, None, 1
        self.cuda = self.device.type == "cuda"
        self.pinned = self.cuda
        self._col_rows, self._col_width = layout.chunks
        self._n_cols = -(-self.n_features // self._col_width)
        self._n_bands = -(-self.rows // self.band_rows)
        self._chunk = _chunk_bytes(layout)
        # A tensor, not a Python number: torch takes no int above 2**63 - 1 (a uint64 fill of 2**64 - 1
        # raised on the first absent chunk)
        self._fill = torch.from_numpy(np.asarray(layout.fill, dtype=self.dtype)).to(self.device)
        self._whole = self._n_cols == 1 and self._col_width == self.n_features
        self.batch = min(batch or batch_bands(array), self._n_bands)
        # The engine's pieces: up to a whole batch (one prepare launch over its bands), never across one's end.
        self.piece_bands = self.ring_bands = self.batch
        self.prefetch = self.batch
        self._paths = _chunk_paths(layout, self.rows, self._n_cols)
        self._sizes = _file_sizes(layout, self.rows, self._n_cols, self._paths)
        self._within, self._slot = _slot_layout(self._sizes)
        ring = 2 * self.batch
        # Three host thirds: the files of the next two batches are read while one is in use.
        self._host = torch.empty(
            (_HOST_PARTS * self.batch, self._slot), dtype=torch.uint8, pin_memory=self.cuda
        )
        self._host_np = self._host.numpy()
        self._dev_stored = torch.empty((ring, self._slot), dtype=torch.uint8, device=self.device)
        torch_dtype = torch.from_numpy(np.empty(0, dtype=self.dtype)).dtype
        self._bands = torch.empty(
            (ring, self.band_rows, self.n_features), dtype=torch_dtype, device=self.device
        )
        self._tmp = (
            None
            if self._whole
            else torch.empty((ring * self._n_cols, self._chunk), dtype=torch.uint8, device=self.device)
        )
        per = self.batch * self._n_cols
        # Per batch, in a ring of _META slots: chunk offsets and sizes (host, device), error flags (device,
        # host). A slot is reused four batches later, long after its copies and its check.
        self._meta_host = torch.zeros((_META, 2, per), dtype=torch.int64, pin_memory=self.cuda)
        self._meta_host_np = self._meta_host.numpy()
        self._meta_dev = torch.zeros((_META, 2, per), dtype=torch.int64, device=self.device)
        self._err_dev = torch.zeros((_META, per), dtype=torch.int32, device=self.device)
        self._err_host = torch.zeros((_META, per), dtype=torch.int32, pin_memory=self.cuda)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="tsconv-read", initializer=lower_thread_priority)  # fmt: skip
        # A batch's chunk files are read by one native call (GIL released throughout; fileread.py says why),
        # else one task per file in the pool. Each future gives its chunks' LZ4 block counts (see _check_chunk).
        self._native = fileread.native_reader()
        self.file_reads = (
            "native" if self._native is not None else f"python ({fileread.unavailable_reason()})"
        )
        self._reads: dict[int, list[Future[list[int]]]] = {}  # batch -> its reads
        self._launched: dict[int, Any] = {}  # batch -> event after its decode
        self._copied: dict[int, Any] = {}  # batch -> event after its H2D copy
        self._released: dict[int, Any] = {}  # batch -> event after the engine's last use of its bands
        self._unchecked: list[tuple[int, Any]] = []  # (batch, decode event): error flags not checked yet
        self._cpu_chunks: dict[tuple[int, int], np.ndarray] = {}
        self._lock = threading.Lock()
        self._err_lock = threading.Lock()  # error flags: checked by the engine thread and the output thread
        self._failure: StoreError | None = None
        self._busy = 0.0
        self._decoded = 0
        self._zarr = BlockReader(array, max_cached=1, where=where)
        self._closed = False
        self._spans: list[tuple[Any, Any, Any, Any]] = []  # per batch: copy start / end, decode start / end
        self.gpu_stage_seconds: dict[str, float] = {"h2d": 0.0, "gpu_decode": 0.0}
        self._trace_base: tuple[Any, float] | None = None
        if self.cuda:
            if trace.on:  # a reference event on an idle device: the GPU spans on the host clock
                torch.cuda.synchronize(self.device)
                base = torch.cuda.Event(enable_timing=True)
                base.record()
                base.synchronize()
                self._trace_base = (base, time.perf_counter())
            self._copy_stream = torch.cuda.Stream(self.device)
            self._decode_streams = [
                torch.cuda.Stream(self.device, priority=DECODE_STREAM_PRIORITY) for _ in range(2)
            ]
        self._schedule(0)

    # -- interface ---------------------------------------------------------------------------------

    @property
    def busy_seconds(self) -> float:
        """Seconds the reading threads spent reading chunk files (and decoding any chunk on the CPU)."""
        return self._busy

    @property
    def bands_decoded(self) -> int:
        return self._decoded

    def read_device(self, start: int, stop: int) -> tuple[torch.Tensor, Any]:
        """Rows [start, stop) of bands of one batch as a view of the device ring, and the event to wait on
        first (None on the CPU). Valid until the batch is released and its half reused two batches later."""
        b = start // self.band_rows
        g = b // self.batch
        if (stop - 1) // self.band_rows // self.batch != g:
            raise ValueError(f"rows [{start}, {stop}) span batches; read_device serves one batch at a time")
        if g not in self._launched:
            if self._launched and g < max(self._launched):
                raise ValueError(f"read_device reads forward: band {b} is behind the batches decoded")
            self._launch(g)
        self._ahead(g)
        half = self._bands[(g % 2) * self.batch : (g % 2 + 1) * self.batch].view(-1, self.n_features)
        a = g * self.batch * self.band_rows
        return half[start - a : stop - a], self._launched[g]

    def verify(self, stop: int) -> None:
        """Raise ``StoreError`` if a chunk of the batches holding rows before ``stop`` did not decode.

        For the engine's output thread, before it hands on rows computed from rows before ``stop``: the GPU
        work that read them is done by then, so their decodes are too and this does not wait."""
        if stop > 0:
            self._check_errors(wait_upto=(stop - 1) // self.band_rows // self.batch)

    def release(self, band: int, event: Any) -> None:
        """The GPU work that reads ``band`` ends at ``event``: its slot may be reused after it."""
        g = band // self.batch
        self._released[g] = event  # bands are released in order: the last one of a batch covers it

    def finish(self) -> None:
        """Wait for every launched decode and raise ``StoreError`` if a chunk was damaged; fill
        ``gpu_stage_seconds`` (event times of the stored bytes' H2D copies and of the decode launches)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            h2d = sum(a.elapsed_time(b) for a, b, _, _ in self._spans) / 1e3
            dec = sum(c.elapsed_time(d) for _, _, c, d in self._spans) / 1e3
            self.gpu_stage_seconds = {"h2d": h2d, "gpu_decode": dec}
            if self._trace_base is not None:
                base, base_t = self._trace_base
                for g, (c0, c1, d0, d1) in enumerate(self._spans):
                    trace.add("gpu_stored_h2d", base_t + base.elapsed_time(c0) / 1e3,
                              base_t + base.elapsed_time(c1) / 1e3, g, thread=-4)  # fmt: skip
                    trace.add("gpu_decode", base_t + base.elapsed_time(d0) / 1e3,
                              base_t + base.elapsed_time(d1) / 1e3, g, thread=-5)  # fmt: skip
        self._check_errors(wait_upto=math.inf)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Host rows [start, stop), read through zarr (the engine's start state; not the fast path)."""
        return self._zarr.read(start, stop)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> GpuBandReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -----------------------------------------------------------------------------------

    def _band_len(self, b: int) -> int:
        return min(self.band_rows, self.rows - b * self.band_rows)

    def _path(self, b: int, c: int) -> Path:
        return Path(self._paths[b][c])

    def _damaged(self, b: int, why: str) -> StoreError:
        a = b * self.band_rows
        return StoreError(
            f"cannot read rows {a:,}..{a + self._band_len(b):,} of {self.where}: {why}",
            hint="the store may be damaged or truncated; check it with `tsconv inspect`. "
            "--decode cpu (decode='cpu') decodes on the CPU instead.",
        )

    def _schedule(self, g: int, *, wait: bool = True) -> bool:
        """Start reading batch ``g``'s chunk files into host third g % 3 (True once they are started).

        The third is free once the H2D copy of batch g - 3 is done: ``wait`` waits for it, else this
        returns False while it is not."""
        if g in self._reads or g in self._launched or g * self.batch >= self._n_bands:
            return True
        prev = self._copied.get(g - _HOST_PARTS)
        after = None
        if prev is not None:
            if self._native is not None and EARLY_READS and not wait:
                after = prev  # the batch's task waits for the copy itself: its read starts as the third frees
            elif not (wait or prev.query()):
                return False
            else:
                prev.synchronize()
        hh = g % _HOST_PARTS
        for other in [o for o in self._reads if o % _HOST_PARTS == hh]:  # a batch never launched (a jump):
            for f in self._reads.pop(other):  # its reads write into the same third, so let them end first
                f.exception()
        if self._native is not None:
            self._reads[g] = [self._pool.submit(self._read_batch, g, hh, after)]
            return True
        futs = []
        for b in range(g * self.batch, min((g + 1) * self.batch, self._n_bands)):
            slot = hh * self.batch + b % self.batch
            for c in range(self._n_cols):
                futs.append(self._pool.submit(self._read_chunk, b, c, slot))
        self._reads[g] = futs
        return True

    def _ahead(self, g: int) -> None:
        """While the engine reads batch ``g``: launch batch g + 1 once its files are read, and read the
        files of the batches after it as their host thirds free up. Nothing here waits (the GPU work waits
        for the GPU work before it on the GPU)."""
        nxt = g + 1
        if nxt not in self._launched and nxt * self.batch < self._n_bands:
            futs = self._reads.get(nxt)
            if futs is not None and all(f.done() for f in futs):
                self._launch(nxt)
        for x in (g + 1, g + 2, g + 3):
            if not self._schedule(x, wait=False):
                break
        self._check_errors()

    def _read_batch(self, g: int, hh: int, after: Any = None) -> list[int]:
        """Read batch ``g``'s chunk files into host third ``hh`` with one native call, once the event
        ``after`` (the copy out of that third) is done; each chunk's LZ4 block count as :meth:`_check_chunk`
        gives it (0: missing, or decoded on the CPU)."""
        if after is not None:
            with torch.cuda.device(self.device):
                after.synchronize()  # off the GIL
        t0 = time.perf_counter()
        b0, b1 = g * self.batch, min((g + 1) * self.batch, self._n_bands)
        used = 1
        try:
            sizes = self._sizes[b0:b1].reshape(-1)
            slots = hh * self.batch + np.arange(b0, b1) % self.batch
            offsets = (slots[:, None] * self._slot + self._within[b0:b1]).reshape(-1)
            for k in np.flatnonzero(sizes == 0):
                self._absent(b0 + int(k) // self._n_cols, int(k) % self._n_cols)
            present = np.flatnonzero(sizes)
            keys = [divmod(int(k), self._n_cols) for k in present]
            paths = [os.fsencode(self._paths[b0 + i][c]) for i, c in keys]
            used = min(self.threads, max(1, len(paths)))
            assert self._native is not None
            status = self._native.read(
                paths, self._host.data_ptr(), offsets[present], sizes[present], threads=self.threads
            )
            blocks = [0] * sizes.size
            for k, (i, c), got, path in zip(present, keys, status, paths, strict=True):
                b, size = b0 + i, int(sizes[k])
                if got < 0:  # OSError(errno, ...) is the subclass Python's open would raise
                    exc = OSError(-int(got), os.strerror(-int(got)), os.fsdecode(path))
                    raise self._damaged(b, f"{type(exc).__name__}: {exc}")
                if got != size:
                    raise self._damaged(
                        b, f"chunk file {os.path.basename(path).decode()} changed size while read"
                    )
                pos = int(offsets[k]) - int(slots[i]) * self._slot
                blocks[k] = self._check_chunk(b, c, self._host_np[slots[i], pos : pos + size])
            return blocks
        finally:
            t1 = time.perf_counter()
            with self._lock:
                self._busy += (t1 - t0) * used  # thread-seconds, as the per-file tasks count them
            if trace.on:
                trace.add("decode", t0, t1, b0)

    def _read_chunk(self, b: int, c: int, slot: int) -> list[int]:
        """Read chunk (b, c)'s stored bytes into its place in host slot ``slot`` (the per-file path)."""
        t0 = time.perf_counter()
        try:
            size = int(self._sizes[b, c])
            if size == 0:
                self._absent(b, c)
                return [0]
            pos = int(self._within[b, c])
            view = self._host_np[slot, pos : pos + size]
            try:
                with open(self._path(b, c), "rb", buffering=0) as f:
                    got = f.readinto(memoryview(view))
            except OSError as exc:
                raise self._damaged(b, f"{type(exc).__name__}: {exc}") from None
            if got != size:
                raise self._damaged(b, f"chunk file {self._path(b, c).name} changed size while read")
            return [self._check_chunk(b, c, view)]
        finally:
            t1 = time.perf_counter()
            with self._lock:
                self._busy += t1 - t0
            if trace.on:
                trace.add("decode", t0, t1, b)

    def _absent(self, b: int, c: int) -> None:
        """Chunk (b, c), which had no bytes when the reader opened, is the fill value where its file is missing;
        an empty file is a chunk cut short (a crash before its data reached the disk), which zarr and the CPU
        reader refuse too."""
        try:
            empty = os.stat(self._paths[b][c]).st_size == 0
        except FileNotFoundError:
            return
        if empty:
            raise self._damaged(b, f"chunk file {self._layout.key((b, c))} is empty (0 bytes)")

    def _check_chunk(self, b: int, c: int, view: np.ndarray) -> int:
        """Chunk (b, c)'s LZ4 block count when the GPU decodes its stored bytes ``view``; else 0, after
        decoding it on the CPU here (kept in ``_cpu_chunks``)."""
        try:
            h = blosc_header.parse_header(view)
            why = blosc_header.unsupported_reason(
                h, nbytes=self._chunk, size=view.size, typesize=self.dtype.itemsize
            )
        except ValueError as exc:
            why = str(exc)
        if why is None:
            return h.nblocks
        dest = np.empty(self._chunk, dtype=np.uint8)  # the CPU decodes what the GPU does not
        try:
            decode_bytes(self._layout.codec, view, dest, self._chunk)
        except Exception as exc:
            raise self._damaged(b, f"{type(exc).__name__}: {exc}") from None
        with self._lock:
            self._cpu_chunks[(b, c)] = dest
        return 0

    # -- decoding ----------------------------------------------------------------------------------

    def _launch(self, g: int) -> None:
        """Copy batch ``g``'s stored bytes to the GPU and decode them (see the module docstring)."""
        h, ms = g % 2, g % _META
        t0 = time.perf_counter()
        self._schedule(g)
        blocks = [n for f in self._reads.pop(g) for n in f.result()]  # raises a damaged chunk's StoreError
        t1 = time.perf_counter()
        # Half h held batch g - 2: the copy waits for its decode (which read the stored half), the decode for
        # the engine's last read of its bands; on the GPU, so the engine thread does not wait here.
        before = [
            e for e in (self._launched.pop(g - 2, None), self._released.pop(g - 2, None)) if e is not None
        ]
        self._check_errors(wait_upto=g - _META)  # its flags' slot is reused (four batches on: long decoded)
        for old in [o for o in self._copied if o < g - _HOST_PARTS]:
            del self._copied[old]
        b0, b1 = g * self.batch, min((g + 1) * self.batch, self._n_bands)
        nb = b1 - b0
        # chunk offsets in the device half and sizes (0: not decoded here); numpy on the pinned buffer,
        # because element-wise tensor writes cost about 10 us each on the engine thread
        meta = self._meta_host[ms]
        mnp = self._meta_host_np[ms]
        mnp[:] = 0
        n_chunks = nb * self._n_cols
        rows = (h * self.batch + np.arange(nb, dtype=np.int64)) * self._slot
        mnp[0, :n_chunks] = (rows[:, None] + self._within[b0:b1]).reshape(-1)
        mnp[1, :n_chunks] = np.where(
            np.asarray(blocks, dtype=np.int64) > 0, self._sizes[b0:b1].reshape(-1), 0
        )
        used = (
            (h * self.batch + nb - 1) * self._slot
            + int(self._within[b1 - 1, -1])
            + _padded(int(self._sizes[b1 - 1, -1]))
        )
        lo = h * self.batch * self._slot
        hlo = (g % _HOST_PARTS) * self.batch * self._slot
        stored = self._dev_stored.view(-1)
        host = self._host.view(-1)[hlo : hlo + used - lo]
        max_blocks = max([1, *blocks])
        if self.cuda:
            with torch.cuda.stream(self._copy_stream):
                for e in before:
                    self._copy_stream.wait_event(e)
                c0 = torch.cuda.Event(enable_timing=True)
                c0.record(self._copy_stream)
                stored[lo:used].copy_(host, non_blocking=True)
                self._meta_dev[ms].copy_(meta, non_blocking=True)
                copied = torch.cuda.Event(enable_timing=True)
                copied.record(self._copy_stream)
            stream = self._decode_streams[h]
            stream.wait_event(copied)  # (after the waits above, on the copy stream)
            ctx: Any = torch.cuda.stream(stream)
        else:
            stored[lo:used].copy_(host)
            self._meta_dev[ms].copy_(meta)
            copied = None
            ctx = contextlib.nullcontext()
        with ctx:
            if self.cuda:
                d0 = torch.cuda.Event(enable_timing=True)
                d0.record(stream)
            err = self._err_dev[ms, :n_chunks]
            err.zero_()
            if self._whole:
                out = self._bands.view(torch.uint8).view(2 * self.batch, -1)[
                    h * self.batch : h * self.batch + nb
                ]
            else:
                assert self._tmp is not None
                out = self._tmp[h * self.batch * self._n_cols : h * self.batch * self._n_cols + n_chunks]
            self._decode_chunks(
                stored, self._meta_dev[ms, 0, :n_chunks], self._meta_dev[ms, 1, :n_chunks], out,
                typesize=self.dtype.itemsize, max_blocks=max_blocks, err=err,
            )  # fmt: skip
            if not self._whole or self._cpu_chunks or not all(blocks):
                self._place(h, b0, b1, out, blocks)
            if self.cuda:
                self._err_host[ms].zero_()
                self._err_host[ms, :n_chunks].copy_(err, non_blocking=True)
                done = torch.cuda.Event(enable_timing=True)
                done.record(stream)
                self._spans.append((c0, copied, d0, done))
            else:
                self._err_host[ms].zero_()
                self._err_host[ms, :n_chunks].copy_(err)
                done = None
        with self._err_lock:
            self._unchecked.append((g, done))
        if trace.on:
            trace.add("reader_wait_files", t0, t1, g)
            trace.add("reader_launch", t1, time.perf_counter(), g)
        self._launched[g] = done
        self._copied[g] = copied
        self._decoded += nb

    def _place(self, h: int, b0: int, b1: int, out: torch.Tensor, blocks: list[int]) -> None:
        """Chunks not decoded by the kernel (missing: the fill value; decoded on the CPU: copied in), and
        for chunks that split the features, each decoded chunk into its columns of the band."""
        torch_dtype = self._bands.dtype
        for i, b in enumerate(range(b0, b1)):
            band = self._bands[h * self.batch + i]
            for c in range(self._n_cols):
                k = i * self._n_cols + c
                c0 = c * self._col_width
                c1 = min(c0 + self._col_width, self.n_features)
                cpu = self._cpu_chunks.pop((b, c), None)
                if cpu is not None:
                    chunk = torch.from_numpy(cpu).to(self.device)
                elif not blocks[k]:
                    band[:, c0:c1] = self._fill
                    continue
                else:
                    chunk = out[k]
                if self._whole and cpu is None:
                    continue  # decoded in place
                view = chunk.view(torch_dtype).view(self._col_rows, self._col_width)
                band[:, c0:c1] = view[: self.band_rows, : c1 - c0]

    def _check_errors(self, *, wait_upto: float = -1) -> None:
        """Raise ``StoreError`` for the first damaged chunk among the launched batches whose decode has
        ended, waiting for those up to batch ``wait_upto``. Once raised, every later call raises it again
        (the engine thread and the output thread both check)."""
        with self._err_lock:
            if self._failure is not None:
                raise self._failure
            while self._unchecked:
                g, ev = self._unchecked[0]
                if ev is not None:
                    if g > wait_upto and not ev.query():
                        return
                    ev.synchronize()
                self._unchecked.pop(0)
                flags = self._err_host[g % _META].numpy()
                bad = np.flatnonzero(flags[: self.batch * self._n_cols])
                if bad.size:
                    b = g * self.batch + int(bad[0]) // self._n_cols
                    self._failure = self._damaged(b, "a chunk does not decode (Blosc-LZ4 on the GPU)")
                    raise self._failure
