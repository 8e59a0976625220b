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
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tsconv import config

__all__ = ["NativeReader", "native_reader", "unavailable_reason"]

_SOURCE = Path(__file__).with_name("fileread.c")
PART_BYTES = 2 << 20  # a file is read in parts of this size, spread over the threads
_lock = threading.Lock()
_loaded: tuple[NativeReader | None, str | None] | None = None


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


def _build() -> tuple[NativeReader | None, str | None]:
    source = _SOURCE.read_bytes()
    tag = hashlib.sha256(source + f"{sys.platform}-{platform.machine()}".encode()).hexdigest()[:16]
    lib_path = config.cache_dir() / f"fileread-{tag}.so"
    if not lib_path.exists():
        cc = config.current().compiler or shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            return None, "no C compiler (cc) to build tsconv/io/fileread.c"
        try:
            lib_path.parent.mkdir(parents=True, exist_ok=True)
            # Built beside its final name and renamed in: processes building at once each install a whole file.
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib_path.parent)
            os.close(fd)
            done = subprocess.run(
                [cc, "-O2", "-shared", "-fPIC", "-pthread", "-o", tmp, str(_SOURCE)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if done.returncode != 0:
                os.unlink(tmp)
                return None, f"{cc} failed on fileread.c: {done.stderr.strip()[-300:]}"
            os.replace(tmp, lib_path)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"cannot build fileread.c: {type(exc).__name__}: {exc}"
    try:
        return NativeReader(ctypes.CDLL(str(lib_path))), None
    except (OSError, AttributeError) as exc:
        return None, f"cannot load {lib_path}: {exc}"


def _get() -> tuple[NativeReader | None, str | None]:
    global _loaded
    if not config.current().native_read:
        return None, "the native_read setting is off"
    with _lock:
        if _loaded is None:
            _loaded = _build()
        return _loaded


def native_reader() -> NativeReader | None:
    """The native batch reader, built on first use; None when unavailable (see :func:`unavailable_reason`)."""
    return _get()[0]


def unavailable_reason() -> str | None:
    """Why :func:`native_reader` is None (no compiler, the build failed, the setting off), or None."""
    return _get()[1]
