"""The output store: created up front, written in whole chunks, marked complete only at the end.

Layout: a zarr (format 3) group with ``values`` [T, D] float32, ``time`` copied from the input when it
has one, and attributes ``features`` (output names), ``pipeline`` (as run), ``source`` and ``tsconv``
(``complete``, ``rows_done``, ``fingerprint``, ...). Every write covers whole chunks, and ``rows_done``
advances only over the prefix of chunks whose data is stored (each chunk file is written atomically), so
a run killed at any moment resumes from ``rows_done`` and rewrites anything after it.

Writes run in a thread pool, several chunks at once: for the layout tsconv creates, each task encodes
its chunk with numcodecs' Blosc (which releases the GIL) and writes the chunk file itself
(:mod:`tsconv.io.encode`, the same bytes zarr would write); other layouts are written by zarr from the
threads (disjoint chunks). Chunks may finish out of order; ``rows_done`` still only covers a contiguous
prefix, and the first failure surfaces at the next ``append`` or at ``finish``.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
import time
import uuid
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec

from ..errors import OutputExistsError, StoreError, TsconvError
from ..stream import trace
from .encode import ChunkFileWriter, remove_partial_files
from .store import is_zarr_store
from .timecolumn import TimeReader

__all__ = [
    "COMPRESSIONS",
    "FORMAT_VERSION",
    "OutputWriter",
    "check_compression",
    "default_write_threads",
    "output_chunk_rows",
    "prepare_output",
]

FORMAT_VERSION = 1
_TARGET_CHUNK_BYTES = 16 << 20  # ~16 MB chunks read back fastest (see ../shared/FACTS.md)


def default_write_threads() -> int:
    """``TSCONV_WRITE_THREADS`` if set, else min(8, CPU count): ~16 MB chunks at ~1.5 GB/s of Blosc-lz4 per
    thread cover 15 GB/s of input."""
    env = os.environ.get("TSCONV_WRITE_THREADS")
    if env:
        return max(0, int(env))
    return max(1, min(8, os.cpu_count() or 1))


def output_chunk_rows(chunk: int, n_outputs: int) -> int:
    """Rows per output chunk: a multiple of the engine's chunk, about 16 MB."""
    per_chunk = chunk * n_outputs * 4
    return chunk * max(1, _TARGET_CHUNK_BYTES // max(per_chunk, 1))


COMPRESSIONS = ("auto", "lz4", "none")
# "auto": lz4 unless a sample of the first chunk written shows it saving less than this share of the bytes
AUTO_MIN_SAVING = 0.10
_AUTO_SAMPLE_BYTES = 1 << 20


def check_compression(compression: str) -> None:
    if compression not in COMPRESSIONS:
        raise TsconvError(
            f"unknown output compression {compression!r}", hint=f"use one of {', '.join(COMPRESSIONS)}."
        )


def _codec(clevel: int = 5) -> BloscCodec:
    """The output's codec: Blosc-LZ4 with byte shuffle; clevel 0 stores the bytes uncompressed (Blosc's framing
    only), which any Blosc reader decodes."""
    return BloscCodec(cname="lz4", clevel=clevel, shuffle="shuffle")


def prepare_output(
    path: Path, *, input_path: Path, overwrite: bool, resume: bool, fingerprint: str
) -> tuple[str, int]:
    """Decide what to do with ``path``: returns (action, rows_done), action one of create/resume/done.

    Refuses to touch the input, a path that is not a zarr store, or an existing output without
    ``overwrite`` or ``resume``.
    """
    out, inp = path.resolve(), input_path.resolve()
    if out == inp or inp.is_relative_to(out) or out.is_relative_to(inp):
        raise StoreError(
            f"output {str(out)!r} would overlap the input store {str(inp)!r}",
            hint="choose an output path outside the input store; tsconv never writes into its input.",
        )
    if not out.exists():
        return "create", 0
    if not is_zarr_store(out):
        raise StoreError(
            f"output path {str(out)!r} exists and is not a zarr store; refusing to replace it",
            hint="remove it yourself or choose another --output.",
        )
    if resume:
        try:
            meta = dict(zarr.open_group(str(out), mode="r").attrs.get("tsconv", {}))
        except Exception as exc:
            raise StoreError(f"cannot resume into {str(out)!r}: {exc}") from None
        if meta.get("fingerprint") != fingerprint:
            raise StoreError(
                f"cannot resume into {str(out)!r}: it was written by a different input, pipeline or chunk size",
                hint="use --overwrite to start again.",
            )
        if meta.get("complete"):
            return "done", int(meta["rows"])
        return "resume", int(meta.get("rows_done", 0))
    if overwrite:
        shutil.rmtree(out)
        return "create", 0
    raise OutputExistsError(
        f"output store {str(out)!r} already exists",
        hint="pass --overwrite to replace it or --resume to finish an interrupted run.",
    )


def _local_group_json(group: zarr.Group) -> Path | None:
    """The zarr.json holding a local format-3 group's attributes, or None (other stores: through zarr)."""
    from zarr.storage import LocalStore

    store = getattr(group, "store", None)
    if not isinstance(store, LocalStore) or group.metadata.zarr_format != 3:
        return None
    path = Path(store.root) / group.path / "zarr.json" if group.path else Path(store.root) / "zarr.json"
    return path if path.is_file() else None


def _replace_json(path: Path, doc: dict[str, Any], *, indent: int | None = 2) -> None:
    """Write a zarr.json atomically: a kill leaves the old file (and a ``.partial`` that reopening removes).
    ``indent=None`` for frequent updates: only then does ``json`` encode in C, not in Python."""
    tmp = path.with_name(f"zarr.json.{uuid.uuid4().hex}.partial")
    tmp.write_text(json.dumps(doc, indent=indent))
    os.replace(tmp, path)


def _array_doc(
    shape: list[int], chunks: list[int], dtype: str, fill: Any, codec: BloscCodec
) -> dict[str, Any]:
    """A zarr format-3 array's zarr.json as zarr 3.1 writes it for ``create_array(..., compressors=[codec])``."""
    blosc = {"typesize": np.dtype(dtype).itemsize, "cname": codec.cname.value, "clevel": int(codec.clevel),
             "shuffle": codec.shuffle.value, "blocksize": int(codec.blocksize)}  # fmt: skip
    return {
        "shape": shape,
        "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill,
        "codecs": [
            {"name": "bytes", "configuration": {"endian": "little"}},
            {"name": "blosc", "configuration": blosc},
        ],
        "attributes": {},
        "zarr_format": 3,
        "node_type": "array",
        "storage_transformers": [],
    }


def _write_layout(
    root: Path, *, rows: int, n_values: int, chunk_rows: int, clevel: int, time: bool, attrs: dict[str, Any]
) -> None:
    """The empty output store's metadata, written as files. Why not zarr's ``create_array``: through its event
    loop the three documents took 19-24 ms on the H200 host, about a tenth of the e2e job, against about
    1 ms here (benchmarks/NOTES.md, fourteenth session). tests/test_writer.py checks the documents equal
    zarr's own for the same calls."""
    root.mkdir(parents=True)
    docs = {
        root / "zarr.json": {"attributes": attrs, "zarr_format": 3, "node_type": "group"},
        root / "values" / "zarr.json": _array_doc(
            [rows, n_values], [chunk_rows, n_values], "float32", "NaN", _codec(clevel)
        ),
    }
    if time:
        docs[root / "time" / "zarr.json"] = _array_doc([rows], [chunk_rows], "int64", 0, _codec())
    for path, doc in docs.items():
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(doc, indent=2))


def _compression_of(array: zarr.Array) -> str:
    """ "lz4" or "none" (clevel 0) for tsconv's Blosc-LZ4 outputs; else the codecs' names."""
    codecs = tuple(array.metadata.codecs) if array.metadata.zarr_format == 3 else ()
    blosc = [c for c in codecs if isinstance(c, BloscCodec)]
    if blosc:
        return "none" if int(blosc[0].clevel) == 0 else str(blosc[0].cname.value)
    return ", ".join(type(c).__name__ for c in codecs) or "zarr format 2"


def _where(group: zarr.Group) -> str:
    root = getattr(group.store, "root", None)
    return f"the output store {str(root)!r}" if root is not None else f"the output store {group.store_path}"


class OutputWriter:
    """Buffers rows into whole output chunks; a thread pool encodes and stores them, several at once.

    ``threads``: write threads (default min(8, CPU count)); 0 or 1 writes each chunk in the caller's
    thread as it fills. ``buffers``: chunk buffers (default threads + 1, one being filled), which bounds
    memory: ``append`` blocks while all are in flight. ``fast=False`` always writes through zarr.

    Attributes: ``rows_done`` (rows stored: a contiguous prefix, as recorded in ``tsconv.rows_done``),
    ``fast`` and ``fallback_reason`` (whether chunk files are written directly, and why not),
    ``busy_seconds`` (encode + write + record, summed over threads) and ``wait_seconds`` (time
    ``append`` and ``finish`` spent blocked on free buffers or completions). ``close()`` (also leaving a
    ``with`` block) stops the threads without marking the store complete.
    """

    def __init__(
        self,
        group: zarr.Group,
        *,
        time_source: Any | None,
        start: int,
        stop: int | None = None,
        record: bool = True,
        threads: int | None = None,
        buffers: int | None = None,
        fast: bool = True,
    ) -> None:
        """Write rows [start, stop) (default: to the end). ``record``: advance ``tsconv.rows_done`` and mark
        the store complete; a region writer (one of several dask tasks) leaves the attributes alone."""
        self.group = group
        self.values = group["values"]
        self.time_out = group["time"] if "time" in group.array_keys() else None
        self.time_source = time_source
        self.rows = int(self.values.shape[0])
        self.chunk_rows = int(self.values.chunks[0])
        if start % self.chunk_rows and start != self.rows:
            msg = f"resume point {start} is not on a chunk boundary of {self.chunk_rows} rows"
            raise StoreError(msg)
        self.stop = self.rows if stop is None else stop
        if self.stop % self.chunk_rows and self.stop != self.rows:
            msg = f"region end {self.stop} is not on a chunk boundary of {self.chunk_rows} rows"
            raise StoreError(msg)
        self.record = record
        self.where = _where(group)
        self.threads = default_write_threads() if threads is None else max(0, int(threads))
        self._sync = self.threads <= 1
        self._max_buffers = (
            1 if self._sync else max(1, int(buffers) if buffers is not None else self.threads + 1)
        )
        self._chunks: ChunkFileWriter | None = None
        self.fallback_reason: str | None = "fast=False"
        if fast:
            self._chunks, self.fallback_reason = ChunkFileWriter.for_array(self.values)
            if self._chunks is not None and self._chunks.dtype != np.float32:
                self._chunks, self.fallback_reason = None, f"dtype {self._chunks.dtype} (buffers are float32)"
        self.fast = self._chunks is not None
        self._auto_pending = False  # create(compression="auto"): the codec is chosen at the first chunk
        self._auto_lock = threading.Lock()
        self.compression = _compression_of(self.values)
        # A task's time rows cover whole time chunks when they are chunked like the values; otherwise two
        # tasks could read-modify-write one time chunk at once, so those writes take turns.
        aligned = self.time_out is None or int(self.time_out.chunks[0]) == self.chunk_rows
        self._time_lock = None if aligned else threading.Lock()
        # The time rows are read from the input's chunk files and written as chunk files (GIL-free) where
        # the layouts allow: zarr's Python in these threads slows the engine thread (timecolumn.py).
        self._time_in = (
            TimeReader(time_source) if self.time_out is not None and time_source is not None else None
        )
        self._time_chunks: ChunkFileWriter | None = None
        if fast and aligned and self.time_out is not None:
            self._time_chunks, _ = ChunkFileWriter.for_array(self.time_out)
        self.rows_done = start
        self._meta: dict[str, Any] | None = None  # the tsconv attributes as last written
        self._group_json = _local_group_json(group)
        self._group_doc: dict[str, Any] | None = None  # its contents, as last written by _set_meta
        self.busy_seconds = 0.0
        self.wait_seconds = 0.0
        self._next = start  # first row of the buffer being filled
        self._buf: np.ndarray | None = None
        self._fill = 0
        self._free: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        self._allocated = 0
        self._lock = threading.Lock()  # rows_done, _stored, _error, busy_seconds and the attributes
        self._stored: dict[int, int] = {}  # chunks stored beyond the prefix: start row -> stop row
        self._error: StoreError | None = None
        self._inflight: list[Future[None]] = []
        self._pool: ThreadPoolExecutor | None = None
        self._finalizer: weakref.finalize | None = None
        self._closed = False

    @classmethod
    def create(
        cls,
        path: Path,
        *,
        rows: int,
        names: tuple[str, ...],
        chunk_rows: int,
        time_source: Any | None,
        attrs: dict[str, Any],
        threads: int | None = None,
        buffers: int | None = None,
        fast: bool = True,
        compression: str = "auto",
    ) -> OutputWriter:
        """A writer of a new output store at ``path``. ``compression`` (the values' codec): ``lz4`` (Blosc-LZ4,
        byte shuffle), ``none`` (Blosc without compression) or ``auto`` (lz4, switched to none before the
        first chunk is stored when lz4 saves less than AUTO_MIN_SAVING of a sample of it: float features
        often do not compress, and encoding them cost the writer threads more CPU than the rest of the
        run; benchmarks/NOTES.md, thirteenth session). The time column is always lz4."""
        check_compression(compression)
        # Build the empty store beside its final place and rename it in: a kill during creation then
        # leaves no half-made store at ``path`` that a later --resume would have to refuse.
        tmp = path.with_name(f".{path.name}.creating")
        if tmp.exists():
            shutil.rmtree(tmp)
        _write_layout(
            tmp,
            rows=rows,
            n_values=len(names),
            chunk_rows=min(chunk_rows, rows),
            clevel=0 if compression == "none" else 5,
            time=time_source is not None,
            attrs={**attrs, "features": list(names)},
        )
        tmp.rename(path)
        writer = cls(
            zarr.open_group(str(path), mode="r+"),
            time_source=time_source,
            start=0,
            threads=threads,
            buffers=buffers,
            fast=fast,
        )
        writer._auto_pending = compression == "auto" and writer.fast
        return writer

    @classmethod
    def reopen(
        cls,
        path: Path,
        *,
        time_source: Any | None,
        start: int,
        threads: int | None = None,
        buffers: int | None = None,
        fast: bool = True,
    ) -> OutputWriter:
        """A writer resuming at ``start``; temporary chunk files a killed run left behind are removed."""
        for tmp in Path(path).glob("zarr.json.*.partial"):  # a progress update cut short (_set_meta)
            tmp.unlink(missing_ok=True)
        group = zarr.open_group(str(path), mode="r+")
        for name in group.array_keys():  # no one else writes this store during a single-process resume
            remove_partial_files(group[name])
        return cls(group, time_source=time_source, start=start, threads=threads, buffers=buffers, fast=fast)

    @classmethod
    def region(
        cls,
        path: Path,
        *,
        time_source: Any | None,
        start: int,
        stop: int,
        threads: int | None = None,
        buffers: int | None = None,
        fast: bool = True,
    ) -> OutputWriter:
        """A writer of the chunk-aligned rows [start, stop) only, which never touches the attributes."""
        group = zarr.open_group(str(path), mode="r+")
        return cls(
            group,
            time_source=time_source,
            start=start,
            stop=stop,
            record=False,
            threads=threads,
            buffers=buffers,
            fast=fast,
        )

    # -- the caller's side ------------------------------------------------------------------------

    def append(self, block: np.ndarray) -> None:
        """Add the next rows, in order (copied before returning); full chunks go to the writer threads.

        Raises the first failed write (a :class:`StoreError` naming its rows) of any earlier chunk.
        """
        self._check_open()
        self._raise_if_failed()
        n, i = block.shape[0], 0
        if self._next + self._fill + n > self.stop:
            msg = f"internal error: {n} more rows after row {self._next + self._fill:,} overrun the end {self.stop:,}"
            raise RuntimeError(msg)
        while i < n:
            if self._buf is None:
                self._buf = self._take_buffer()
            take = min(n - i, self.chunk_rows - self._fill)
            self._buf[self._fill : self._fill + take] = block[i : i + take]
            self._fill += take
            i += take
            if self._fill == self.chunk_rows or self._next + self._fill == self.stop:
                self._submit()

    def finish(self) -> None:
        """Wait for every write, then mark the store complete (a region writer: just wait).

        Raises the first failed write as a :class:`StoreError`; the store then stays incomplete.
        """
        self._check_open()
        try:
            self._raise_if_failed()
            if self._next + self._fill != self.stop:
                msg = f"internal error: finished with {self._next + self._fill} of {self.stop} rows appended"
                raise RuntimeError(msg)
            if self._fill:
                self._submit()
            self._drain()
            self._raise_if_failed()
            if self.rows_done != self.stop:
                msg = f"internal error: finished with {self.rows_done} of {self.stop} rows written"
                raise RuntimeError(msg)
            if self.record:
                with self._lock:
                    self._set_meta(complete=True, rows_done=self.rows, partitions_done=None)  # None: drop it
        finally:
            self.close()

    def close(self) -> None:
        """Stop: drop queued chunk writes, wait for running ones, free the threads. Never marks complete."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            if self._finalizer is not None:
                self._finalizer.detach()
            self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> OutputWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            msg = "the OutputWriter is closed (finished, or stopped after an error)"
            raise ValueError(msg)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _take_buffer(self) -> np.ndarray:
        """A free chunk buffer: a returned one, a new one while under the limit, else wait for one."""
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        if self._allocated < self._max_buffers:
            self._allocated += 1
            return np.empty((self.chunk_rows, self.values.shape[1]), dtype=np.float32)
        t0 = time.perf_counter()
        buf = self._free.get()
        self.wait_seconds += time.perf_counter() - t0
        if self._error is not None:  # surface a failure as soon as it is seen
            self._free.put(buf)
            raise self._error
        return buf

    def _submit(self) -> None:
        """Hand the filled buffer to a writer thread (or write it here when synchronous)."""
        a, b, buf = self._next, self._next + self._fill, self._buf
        assert buf is not None
        self._buf, self._fill, self._next = None, 0, b
        if self._sync:
            self._store(a, b, buf)
            self._raise_if_failed()
            return
        if self._pool is None:
            from .decode import lower_thread_priority

            self._pool = ThreadPoolExecutor(
                max_workers=self.threads, thread_name_prefix="tsconv-write", initializer=lower_thread_priority
            )
            # Threads die with the writer if the caller neither finishes nor closes it.
            self._finalizer = weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
        self._inflight = [f for f in self._inflight if not f.done()]
        self._inflight.append(self._pool.submit(self._store, a, b, buf))

    def _drain(self) -> None:
        if self._inflight:
            t0 = time.perf_counter()
            wait_futures(self._inflight)
            self.wait_seconds += time.perf_counter() - t0
            self._inflight = []

    # -- the writer threads' side -----------------------------------------------------------------

    def _store(self, a: int, b: int, buf: np.ndarray) -> None:
        """Store rows [a, b) from ``buf``, then advance ``rows_done`` over the stored prefix. Never raises:
        a failure is kept for the caller's next ``append`` or ``finish``."""
        t0 = time.perf_counter()
        failure: BaseException | None = None
        try:
            self._write(a, b, buf)
        except Exception as exc:
            failure = exc
        finally:
            self._free.put(buf)  # the data is in the file (or lost): the buffer may be refilled
        with self._lock:
            try:
                if failure is None:
                    self._advance(a, b)
            except Exception as exc:
                failure = exc
            if failure is not None and self._error is None:
                self._error = StoreError(
                    f"cannot write rows {a:,}..{b:,} of {self.where}: {type(failure).__name__}: {failure}",
                    hint="check free space and permissions; rows before tsconv.rows_done are stored, "
                    "and --resume continues from there.",
                )
                self._error.__cause__ = failure
            t1 = time.perf_counter()
            self.busy_seconds += t1 - t0
        if trace.on:
            trace.add("write", t0, t1, a)

    def _write(self, a: int, b: int, buf: np.ndarray) -> None:
        n = b - a
        if self._chunks is not None:
            if self._auto_pending:
                with self._auto_lock:  # the other writer threads wait for the choice (~1 ms)
                    if self._auto_pending:
                        self._choose_compression(buf[:n])
                        self._auto_pending = False
            if n < self.chunk_rows:
                buf[n:] = self._chunks.fill  # zarr pads the edge chunk with the fill value
            self._chunks.write(a // self.chunk_rows, buf)
        else:
            self.values[a:b] = buf[:n]
        if self.time_out is not None:
            assert self._time_in is not None
            t = self._time_in.read(a, b)
            if self._time_chunks is not None:
                if n < self.chunk_rows:  # the edge chunk, padded as zarr pads it
                    t = np.concatenate([t, np.full(self.chunk_rows - n, self._time_chunks.fill, np.int64)])
                self._time_chunks.write(a // self.chunk_rows, t)
            elif self._time_lock is None:
                self.time_out[a:b] = t
            else:
                with self._time_lock:
                    self.time_out[a:b] = t

    def _choose_compression(self, rows: np.ndarray) -> None:
        """compression="auto": keep lz4 if it saves at least AUTO_MIN_SAVING of a sample of ``rows`` (about
        1 MiB from their middle, past a warm-up's NaN rows), else store the values uncompressed from now on
        (the array's codec rewritten to clevel 0, so its metadata says how the chunks are stored)."""
        assert self._chunks is not None
        take = max(1, _AUTO_SAMPLE_BYTES // max(rows[:1].nbytes, 1))
        lo = max(0, min(rows.shape[0] - take, rows.shape[0] // 2))
        sample = np.ascontiguousarray(rows[lo : lo + take])
        saving = 1.0 - len(self._chunks.codec.encode(sample)) / max(sample.nbytes, 1)
        if saving >= AUTO_MIN_SAVING:
            self.compression = f"lz4 (auto: it saved {saving:.0%} of a sample)"
            return
        path = self._chunks.root / "zarr.json"
        doc = json.loads(path.read_text())
        for codec in doc["codecs"]:
            if codec.get("name") == "blosc":
                codec["configuration"]["clevel"] = 0
        _replace_json(path, doc)
        self.values = self.group["values"]
        self._chunks = ChunkFileWriter(self.values)
        self.compression = f"none (auto: lz4 saved {saving:.0%} of a sample)"

    def _advance(self, a: int, b: int) -> None:
        """Rows [a, b) are stored: extend the contiguous prefix and record it (under ``_lock``)."""
        self._stored[a] = b
        prefix = self.rows_done
        while prefix in self._stored:
            prefix = self._stored.pop(prefix)
        if prefix == self.rows_done:
            return  # an earlier chunk is still in flight (or failed): rows_done must not pass it
        if self.record:
            self._set_meta(rows_done=prefix)
        self.rows_done = prefix

    def _set_meta(self, **changes: Any) -> None:
        meta = dict(self._meta if self._meta is not None else self.group.attrs.get("tsconv", {}))
        meta.update(changes)
        meta = {k: v for k, v in meta.items() if v is not None or k not in changes}
        if self._group_json is not None:
            # The group's zarr.json rewritten here (atomically), not through zarr: zarr's attribute update
            # runs Python on its event loop that slows the engine thread (timecolumn.py says how much), and
            # the final one took 2-3 ms of the run's tail. The document is read once: nothing else writes
            # this store's attributes while it runs. Progress is written compact (json's C encoder).
            if self._group_doc is None:
                self._group_doc = json.loads(self._group_json.read_text())
            self._group_doc.setdefault("attributes", {})["tsconv"] = meta
            done = meta.get("complete", False)
            _replace_json(self._group_json, self._group_doc, indent=2 if done else None)
        else:
            self.group.attrs["tsconv"] = meta
        self._meta = meta
