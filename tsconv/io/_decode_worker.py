"""A decode worker process for :class:`tsconv.io.procdecode.ProcessBandReader`.

Loaded by file path in a fresh interpreter (``python -P -c <loader> _decode_worker.py``), so it imports
numpy, numcodecs and the sibling :mod:`chunkfile` (also by path) only: not the tsconv package, not torch,
and nothing from the folder it lives in or the caller's working directory (``-P``; ``tsconv/io`` holds an
``inspect.py`` that would shadow the standard library's). Protocol: one JSON job a stdin line. For a job
the worker maps the job's shared segment, opens the job's band queue (a FIFO the reader writes 8-byte
band numbers into as bands fall due) and decodes each band it takes into ring slot ``band % ring_len``,
publishing the band number in the slot's header word once the slot holds it. When the reader closes the
queue it answers ``done`` on stdout and waits for the next line; end of input ends it. A damaged chunk:
the message goes to stderr and the slot's word gets ``-2 - band`` (the reader raises when that band is
read; the other bands go on). Header words (int64): 0 stop, 1 .. 1 + ring_len the slots' bands, then
each worker's busy nanoseconds.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import time
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np


def _load_sibling(name: str) -> Any:
    import importlib.util

    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"tsconv_worker_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


chunkfile = _load_sibling("chunkfile")

STOP, SLOT0 = 0, 1  # the header's words: see the module docstring


_attached: dict[tuple[str, int], mmap.mmap] = {}  # the reader keeps its segment for the next job too


def _attach(path: str, size: int) -> mmap.mmap:
    mm = _attached.get((path, size))
    if mm is None:
        for old in _attached.values():
            try:
                old.close()
            except BufferError:
                pass
        _attached.clear()
        fd = os.open(path, os.O_RDWR)
        try:  # populate: the page tables once, not a fault per page per job
            mm = _attached[(path, size)] = mmap.mmap(
                fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            )
        finally:
            os.close(fd)
    return mm


def run_job(job: dict[str, Any]) -> None:
    k, ring_len = int(job["worker"]), int(job["ring_len"])
    band_rows, n_features, rows = int(job["band_rows"]), int(job["n_features"]), int(job["rows"])
    col_rows, col_width = int(job["chunk_rows"]), int(job["chunk_width"])
    n_cols = -(-n_features // col_width)
    mm = _attach(job["path"], int(job["size"]))
    header = np.frombuffer(mm, dtype=np.int64, count=int(job["header_words"]))
    dtype = np.dtype(job["dtype"])
    ring = np.frombuffer(
        mm, dtype=dtype, count=ring_len * band_rows * n_features, offset=int(job["ring_offset"])
    )
    ring = ring.reshape(ring_len, band_rows, n_features)
    codec = {"blosc": numcodecs.Blosc, "zstd": numcodecs.Zstd}.get(job["codec"])
    codec = codec() if codec is not None else None
    root, sep, fill, whole = Path(job["root"]), job["sep"], job["fill"], bool(job["whole"])
    buffers: dict[str, np.ndarray] = {}

    def scratch(name: str, nbytes: int) -> np.ndarray:
        buf = buffers.get(name)
        if buf is None or buf.size < nbytes:
            buf = buffers[name] = np.empty(max(nbytes, 1), dtype=np.uint8)
        return buf[:nbytes]

    busy_word = SLOT0 + ring_len + k
    busy = 0.0
    try:  # the reader's band tokens, 8 bytes each (pipe reads this small are atomic)
        queue = os.open(job["queue"], os.O_RDONLY | os.O_NONBLOCK)  # never waits for a writer...
    except FileNotFoundError:  # the reader finished before this worker got here
        del ring, header
        return
    os.set_blocking(queue, True)  # ...but reads do (the reader keeps the queue open until it closes)
    try:
        while True:
            token = os.read(queue, 8)
            if len(token) < 8 or header[STOP]:  # the reader closed the queue (or stopped): the job is over
                break
            j = int.from_bytes(token, "little", signed=True)
            t0 = time.perf_counter()
            s = j % ring_len
            header[SLOT0 + s] = -1  # the slot's previous band is gone (the reader waited for it to land)
            n = min(band_rows, rows - j * band_rows)
            done = j
            for col in range(n_cols):
                c0 = col * col_width
                try:
                    chunkfile.decode_chunk_into(
                        root / f"c{sep}{j}{sep}{col}", ring[s], n=n, cols=(c0, min(c0 + col_width, n_features)),
                        chunk_shape=(col_rows, col_width), whole=whole, fill=fill, codec=codec, scratch=scratch,
                    )  # fmt: skip
                except Exception as exc:  # noqa: BLE001 - the reader raises StoreError when band j is read
                    a = j * band_rows
                    sys.stderr.write(f"cannot read rows {a:,}..{a + n:,}: {type(exc).__name__}: {exc}\n")
                    sys.stderr.flush()
                    done = -2 - j
                    break
            header[SLOT0 + s] = done  # x86-64 keeps stores in order: the ring's bytes are visible first
            busy += time.perf_counter() - t0
            header[busy_word] = int(busy * 1e9)
    finally:
        os.close(queue)
        del ring, header


def main() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the reader's to handle: it stops the workers
    numcodecs.blosc.use_threads = False  # one decoding thread a worker: the workers are the parallelism
    for line in sys.stdin:
        if not line.strip():
            continue
        run_job(json.loads(line))
        sys.stdout.write("done\n")
        sys.stdout.flush()
