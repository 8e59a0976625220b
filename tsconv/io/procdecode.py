"""Chunk decoding in worker processes, into a shared (and, on CUDA, pinned) ring: no decode threads here.

Why: in the batched GPU engine, the engine thread hands the GIL back and forth with every other Python
thread of the process, and with every core busy each hand-off waits for a core. Measured on the H200
(``benchmarks/engine_trace.py``, benchmarks/NOTES.md): the engine's loop takes 0.22-0.30 s over a
predecoded 4.3 GB store, 0.38-0.57 s with the decode threads, 0.34-0.46 s with the same decoding in
15 processes, but 0.95 s with the processes plus 15 threads doing only the per-chunk Python work. So the
read side here has no Python threads at all. The consumer's thread hands out the bands that fall due
(``b .. b + prefetch`` when it moves to band ``b``) as 8-byte tokens on a FIFO; whichever worker is free
takes the next one (a first version gave band ``j`` to worker ``j % workers``; handing bands out this way
did not shorten the engine's 0.12-0.20 s of waiting for bands on the H200, but it is no slower and keeps
a slow worker from holding up the bands behind it), decodes it into ring slot ``j % ring_len``
and publishes ``j`` in the slot's header word; the consumer's thread polls that word. A slot is handed out
again only once its previous band has landed.

:class:`ProcessBandReader` has :class:`~tsconv.io.decode.ParallelBandReader`'s interface and buffer
lifetime (it is one, with a different ring and decoders). It is used when ``TSCONV_DECODE_PROCS`` is set
to a worker count (see :func:`use_processes`), on Linux x86-64 (the publishing relies on the
processor keeping stores in order), for stores the fast path reads. Workers are fresh interpreters
loading ``_decode_worker.py`` by path, started with :mod:`subprocess` (not :mod:`multiprocessing`, whose spawn
and forkserver methods re-import the caller's ``__main__`` in every worker) and kept for the next
reader of the process; they exit with it.
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np

from ..errors import StoreError
from .decode import ParallelBandReader

__all__ = ["ProcessBandReader", "decode_processes", "supported", "use_processes"]

_WORKER = Path(__file__).with_name("_decode_worker.py")
# the worker's loader (kept in the worker's file, which this process does not import): see _decode_worker
_LOADER = (
    "import importlib.util, sys; s = importlib.util.spec_from_file_location('tsconv_decode_worker', sys.argv[1]); "
    "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); m.main()"
)
_STOP, _SLOT0 = 0, 1  # header words (int64): stop, then one a slot, then one a worker (busy ns)
_idle: list[subprocess.Popen] = []  # started workers not serving a reader now
_idle_lock = threading.Lock()


def decode_processes() -> int:
    """``TSCONV_DECODE_PROCS`` (worker processes for the fast reader; 0 or unset: decode threads)."""
    env = os.environ.get("TSCONV_DECODE_PROCS", "").strip()
    return max(0, int(env)) if env else 0


def supported() -> str | None:
    """None when decode processes can run here, else why not."""
    if sys.platform != "linux":
        return f"platform {sys.platform}"
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"processor {platform.machine()} (the slot words need in-order stores)"
    return None


def use_processes() -> bool:
    """Decode in processes: asked for (``TSCONV_DECODE_PROCS``) and supported here."""
    return decode_processes() > 0 and supported() is None


def _take_workers(n: int) -> list[subprocess.Popen]:
    with _idle_lock:
        alive = [w for w in _idle if w.poll() is None]
        taken, _idle[:] = alive[:n], alive[n:]
    while len(taken) < n:
        taken.append(
            subprocess.Popen(
                [sys.executable, "-s", "-B", "-P", "-c", _LOADER, str(_WORKER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
                close_fds=True,
            )
        )
    return taken


class _Segment:
    """A shared-memory segment for a ring, page-locked for the GPU once when asked.

    Kept for the next reader of the process, like the workers: a fresh segment each run cost the H200
    runs about 0.3 s (page-locking hundreds of MB, and first-touch faults in the workers).
    """

    def __init__(self, size: int) -> None:
        self.shm = shared_memory.SharedMemory(create=True, size=size)
        self.size = self.shm.size
        self.path = f"/dev/shm/{self.shm.name.lstrip('/')}"
        self.locked = 0  # the address page-locked with cudaHostRegister, or 0

    def lock(self) -> None:
        if not self.locked:
            self.locked = _register_pinned(np.ndarray((self.size,), dtype=np.uint8, buffer=self.shm.buf))

    def free(self) -> None:
        if self.locked:
            try:
                import torch

                torch.cuda.cudart().cudaHostUnregister(self.locked)
            except Exception:  # noqa: BLE001 - at exit CUDA may be gone already; the process frees it
                pass
            self.locked = 0
        self.shm.unlink()
        try:
            self.shm.close()
        except BufferError:  # views of it are still alive: the mapping goes when the last one does
            pass


_segments: list[_Segment] = []  # segments not serving a reader now (at most _KEEP_SEGMENTS)
_KEEP_SEGMENTS = 2


def _take_segment(size: int, pin: bool) -> _Segment:
    with _idle_lock:
        fits = [seg for seg in _segments if size <= seg.size <= 2 * size]
        seg = fits[0] if fits else None
        if seg is not None:
            _segments.remove(seg)
    if seg is None:
        seg = _Segment(size)
    if pin:
        seg.lock()
    return seg


def _keep_segment(seg: _Segment) -> None:
    with _idle_lock:
        _segments.append(seg)
        extra = _segments[:-_KEEP_SEGMENTS]
        del _segments[:-_KEEP_SEGMENTS]
    for old in extra:
        old.free()


def _give_back(workers: list[subprocess.Popen]) -> None:
    with _idle_lock:
        _idle.extend(w for w in workers if w.poll() is None)


@atexit.register
def _stop_idle_workers() -> None:
    with _idle_lock:
        workers, _idle[:] = list(_idle), []
        segments, _segments[:] = list(_segments), []
    for seg in segments:
        seg.free()
    for w in workers:
        try:
            w.stdin.close()  # end of input: the worker returns
            w.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            w.kill()


class ProcessBandReader(ParallelBandReader):
    """:class:`ParallelBandReader` with the chunk files decoded by ``workers`` processes (see the module).

    ``workers`` defaults to ``TSCONV_DECODE_PROCS`` (else the decode-thread default), at most ``threads``
    when that is given (a dask task's share of the cores).
    """

    def __init__(
        self, array: Any, *, workers: int | None = None, threads: int | None = None, **kw: Any
    ) -> None:
        n = workers or decode_processes() or threads
        if workers is None and threads is not None and n is not None:
            n = min(n, threads)
        super().__init__(array, threads=n, **kw)

    # -- the ring and its decoders -----------------------------------------------------------------

    def _plan_ring(self, prefetch: int | None, max_ring_bytes: int, band_bytes: int) -> None:
        super()._plan_ring(prefetch, max_ring_bytes, band_bytes)
        self.workers = max(1, min(self.threads, self._n_bands))

    def _start(self, pin: bool) -> None:
        lay = self._layout
        sep = getattr(getattr(self.array, "metadata", None).chunk_key_encoding, "separator", "/")
        if lay.key((3, 5)) != f"c{sep}3{sep}5":
            msg = f"chunk keys like {lay.key((3, 5))!r}"
            raise ValueError(msg)
        header_words = _SLOT0 + self._ring_len + self.workers
        ring_offset = -(-header_words * 8 // 4096) * 4096
        ring_bytes = self._ring_len * self.band_rows * self.n_features * lay.dtype.itemsize
        self._queue_dir = tempfile.mkdtemp(prefix="tsconv-decode-")
        self._queue_path = os.path.join(self._queue_dir, "bands")
        os.mkfifo(self._queue_path, 0o600)
        # read-write (Linux): opening never waits, and the queue has a writer from now until close, so a
        # worker's reads wait for bands instead of seeing the end of the queue
        self._queue = os.open(self._queue_path, os.O_RDWR)
        self._seg = _take_segment(ring_offset + ring_bytes, pin)
        buf = self._seg.shm.buf
        self._header = np.ndarray((header_words,), dtype=np.int64, buffer=buf)
        self._header[:] = 0
        self._header[_SLOT0 : _SLOT0 + self._ring_len] = -1
        self._ring = np.ndarray(
            (self._ring_len, self.band_rows, self.n_features), dtype=lay.dtype, buffer=buf, offset=ring_offset
        )
        self._ring_owner = None
        self.pinned = bool(pin and self._seg.locked)
        if isinstance(lay.codec, numcodecs.Blosc):
            codec = "blosc"
        elif isinstance(lay.codec, numcodecs.Zstd):
            codec = "zstd"
        else:
            codec = None
        job = {
            "path": self._seg.path, "size": self._seg.size, "queue": self._queue_path,
            "header_words": header_words, "ring_offset": ring_offset, "ring_len": self._ring_len, "rows": self.rows,
            "band_rows": self.band_rows, "n_features": self.n_features, "dtype": lay.dtype.str,
            "chunk_rows": self._col_rows, "chunk_width": self._col_width, "whole": self._whole,
            "codec": codec, "root": str(lay.root), "sep": sep, "fill": np.asarray(lay.fill).item(),
        }  # fmt: skip
        self._errors = ""  # what the workers wrote to stderr so far
        self._workers = _take_workers(self.workers)
        for k, w in enumerate(self._workers):
            w.stdin.write(json.dumps({**job, "worker": k}) + "\n")
            w.stdin.flush()
        self._spins = 0  # polls of the current wait for a band
        self._issued = -1  # the highest band handed out
        self._in_slot = [-1] * self._ring_len  # the band last handed out for each slot
        self._finalizer = weakref.finalize(
            self, _finish, self._seg, header_words, self._workers, self._queue, self._queue_dir
        )

    @property
    def busy_seconds(self) -> float:
        """Seconds the workers spent decoding, summed, plus any decoding behind the ring here."""
        if self._closed:
            return self._final_busy
        words = self._header[_SLOT0 + self._ring_len : _SLOT0 + self._ring_len + self.workers]
        return float(words.sum()) / 1e9 + self._busy

    def _advance(self, b: int) -> None:
        """The consumer moved to band ``b``: hand out bands ``b .. b + prefetch`` not handed out yet."""
        self._pos = b
        first = max(self._issued + 1, b)
        last = min(b + self.prefetch, self._n_bands - 1)
        if first > last:
            return
        for j in range(first, last + 1):
            s = j % self._ring_len
            prev = self._in_slot[s]
            # After a jump, the slot's previous band may still be in a worker's hands: let it land first.
            while prev >= 0 and self._header[_SLOT0 + s] not in (prev, -2 - prev):
                self._wait_a_little()
            self._in_slot[s] = j
        os.write(self._queue, b"".join(j.to_bytes(8, "little", signed=True) for j in range(first, last + 1)))
        self._issued = last

    def _band(self, i: int) -> np.ndarray:
        if self._pos is None or i > self._pos:
            self._advance(i)
        if i < self._pos - self.hold:  # behind the ring: decode here, as the thread reader does
            return self._band_behind(i)
        s = i % self._ring_len
        word = _SLOT0 + s
        self._spins = 0
        while self._header[word] != i:
            if self._header[word] == -2 - i:
                self._raise_band_error(i)
            self._wait_a_little()
        if self._slot_band[s] != i:
            self._slot_band[s] = i
            self._decoded += 1
        return self._ring[s, : self._band_len(i)]

    def _wait_a_little(self) -> None:
        """Sleep briefly while a band lands (checking now and then that the workers live)."""
        self._spins += 1
        if self._spins % 2048 == 0 and any(w.poll() is not None for w in self._workers):
            self._raise_band_error(None)
        time.sleep(2e-5 if self._spins < 1000 else 2e-4)

    def _raise_band_error(self, band: int | None) -> None:
        """Band ``band`` failed to decode (its worker's message), or a worker died (``band`` None)."""
        a = None if band is None else band * self.band_rows
        self._errors += "".join(_available(w.stderr) for w in self._workers)
        lines = self._errors.splitlines()
        if a is not None:
            mine = [ln for ln in lines if ln.startswith(f"cannot read rows {a:,}..")]
            detail = mine[-1].split(": ", 1)[1] if mine else "decoding failed"
            msg = f"cannot read rows {a:,}..{a + self._band_len(band):,} of {self.where}: {detail}"
            raise StoreError(
                msg, hint="the store may be damaged or truncated; check it with `tsconv inspect`."
            )
        self.close()
        detail = lines[-1] if lines else "no message"
        msg = f"a decode worker process of {self.where} exited ({detail})"
        raise StoreError(msg, hint="TSCONV_DECODE_PROCS=0 decodes in threads instead.")

    def close(self) -> None:
        """Stop the workers (they finish the band in hand), free the ring; the workers stay for reuse."""
        if not self.fast or self._closed:
            return
        self._final_busy = self.busy_seconds
        self._closed = True
        self._header = self._ring = None  # our views of the segment (the caller's may outlive it)
        self._finalizer()


def _available(stream: Any) -> str:
    """What a worker's stderr holds now (non-blocking)."""
    try:
        os.set_blocking(stream.fileno(), False)
        return stream.read() or ""
    except (OSError, TypeError, ValueError):
        return ""


def _finish(seg: _Segment, header_words: int, workers: list, queue: int, queue_dir: str) -> None:
    """Stop the workers and keep the healthy ones and the segment for the next reader."""
    header = np.ndarray((header_words,), dtype=np.int64, buffer=seg.shm.buf)
    header[_STOP] = 1
    del header
    os.close(queue)  # end of the queue: each worker answers "done" after the band in hand
    shutil.rmtree(queue_dir, ignore_errors=True)
    healthy = []
    for w in workers:
        try:
            if w.poll() is None and w.stdout.readline().strip() == "done":
                healthy.append(w)
            else:
                w.kill()
        except OSError:
            w.kill()
    _give_back(healthy)
    _keep_segment(seg)


def _register_pinned(ring: np.ndarray) -> int:
    """Page-lock the ring for the GPU (cudaHostRegister, portable and mapped); its address, or 0."""
    try:
        import torch

        if not torch.cuda.is_available():
            return 0
        ptr = ring.ctypes.data
        if int(torch.cuda.cudart().cudaHostRegister(ptr, ring.nbytes, 3)) != 0:
            return 0
        return ptr
    except (ImportError, RuntimeError, AttributeError):
        return 0
