"""Many whole files read into one buffer by native threads, with the GIL released for the whole batch.

Why native: the GPU reader's reading threads read 256 chunk files a run (1M x 1024, 16 MB chunks), each
with a few dozen microseconds of Python around the ``readinto`` (open, paths, the header check). Every
return from ``readinto`` asked for the GIL back, so the engine thread, which launches the GPU work, was
made to hand it over about a thousand times a run; its launches took 2-3x their own CPU time
(benchmarks/NOTES.md, "Native file reads"). Python's stdlib and the project's libraries
have no call that reads a list of files into caller-given places, so ``fileread.c`` (about 120 lines of C:
``open`` / ``pread`` on a few pthreads) does it, compiled on first use with the system C compiler into
the user cache directory and called through ctypes (which releases the GIL during the call).

Without a C compiler, or with the ``native_read`` setting off, :func:`native_reader` returns None and callers
keep their Python reading threads: the results are the same.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tsconv.native import NativeLibrary

__all__ = ["LIBRARY", "NativeReader", "native_reader", "unavailable_reason"]

PART_BYTES = 2 << 20  # a file is read in parts of this size, spread over the threads


class NativeReader:
    """The compiled ``tsconv_read_files``: :meth:`read` reads a batch of files into one buffer."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        fn = lib.tsconv_read_files
        fn.argtypes = [
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_char_p),
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int64,
        ]
        fn.restype = ctypes.c_int
        self._fn = fn

    def read(
        self,
        paths: Sequence[bytes],
        base: int,
        offsets: np.ndarray,
        sizes: np.ndarray,
        *,
        threads: int,
        part: int | None = None,
    ) -> np.ndarray:
        """Read ``sizes[i]`` bytes of file ``paths[i]`` (fsencoded) to address ``base + offsets[i]``, on up
        to ``threads`` threads, in parts of at most ``part`` bytes (default PART_BYTES). Returns, per file,
        the bytes read (fewer than asked when the file is shorter) or ``-errno``. The caller keeps the buffer
        at ``base`` alive and large enough."""
        n = len(paths)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        sizes = np.ascontiguousarray(sizes, dtype=np.int64)
        if offsets.shape != (n,) or sizes.shape != (n,):
            raise ValueError(f"{n} paths need {n} offsets and sizes, got {offsets.shape} and {sizes.shape}")
        status = np.zeros(n, dtype=np.int64)
        if n:
            used = self._fn(n, (ctypes.c_char_p * n)(*paths), base, offsets.ctypes.data, sizes.ctypes.data,
                            status.ctypes.data, max(1, int(threads)), int(part or PART_BYTES))  # fmt: skip
            if used < 0:
                raise MemoryError("tsconv_read_files could not allocate its work list")
        return status


LIBRARY = NativeLibrary(
    Path(__file__).with_name("fileread.c"),
    flags=("-O2", "-pthread"),
    wrap=NativeReader,
    setting="native_read",
)


def native_reader() -> NativeReader | None:
    """The native batch reader, built on first use; None when unavailable (see :func:`unavailable_reason`)."""
    return LIBRARY.get()[0]


def unavailable_reason() -> str | None:
    """Why :func:`native_reader` is None (no compiler, the build failed, the setting off), or None."""
    return LIBRARY.get()[1]
