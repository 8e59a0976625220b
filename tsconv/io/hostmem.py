"""Host arrays of a run's results, on the pages the machine serves fastest (the ``huge_pages`` setting).

numpy advises transparent huge pages for arrays of 4 MB and more. On a virtual machine whose balloon reports
free memory to its host (virtio's free-page reporting), the host takes back free 2 MB blocks, which are what a
fresh process's huge pages come from: each first write then waits for the host (on the 2-core VM a 400 MB fill
took 1.8-2.2 s against 0.15-0.18 s in 4 KB pages, which come from memory the guest still holds; NOTES,
sections 1 and 20). There, results are allocated in 4 KB pages (``MADV_NOHUGEPAGE`` over the array before its
first write); elsewhere numpy's choice stands.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys
from pathlib import Path

import numpy as np

from tsconv import config

__all__ = ["empty", "host_reclaims_free_memory", "small_pages"]

_BALLOONS = Path("/sys/bus/virtio/drivers/virtio_balloon")
_F_REPORTING = 5  # VIRTIO_BALLOON_F_REPORTING: the guest reports free pages, which the host may take back
_MADV_NOHUGEPAGE = 15
_MIN_BYTES = 4 << 20  # numpy advises huge pages from here on


def host_reclaims_free_memory(balloons: Path = _BALLOONS) -> bool:
    """Whether a virtio balloon of this machine reports free memory to its host (its feature bit 5)."""
    try:
        features = [p.read_text().strip() for p in balloons.glob("virtio*/features")]
    except OSError:
        return False
    return any(len(f) > _F_REPORTING and f[_F_REPORTING] == "1" for f in features)


@functools.cache
def _small_pages_auto() -> bool:
    return sys.platform.startswith("linux") and host_reclaims_free_memory()


@functools.cache
def _madvise() -> object | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def small_pages() -> bool:
    """Whether results go in 4 KB pages (the ``huge_pages`` setting; auto: on a VM whose host takes back free
    memory)."""
    mode = config.current().huge_pages
    return mode == "off" or (mode == "auto" and _small_pages_auto())


def empty(shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> np.ndarray:
    """``np.empty(shape, dtype)``, its pages not yet touched: in 4 KB pages where :func:`small_pages` says so."""
    out = np.empty(shape, dtype=dtype)
    if out.nbytes >= _MIN_BYTES and small_pages() and (madvise := _madvise()) is not None:
        page = mmap.PAGESIZE
        start = -(-out.ctypes.data // page) * page
        stop = (out.ctypes.data + out.nbytes) // page * page
        if stop > start:
            madvise(start, stop - start, _MADV_NOHUGEPAGE)  # advice only: a refusal leaves numpy's pages
    return out
