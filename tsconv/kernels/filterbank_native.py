"""The CPU bank as one compiled pass (``filterbank_native.c``): the torch path's bits, several times fewer passes.

Why native: the torch path (:mod:`tsconv.kernels.filterbank`) runs a bank as some 25 ops per tile, each a pass
over float64 arrays of the tile's size; on 16 cores it stopped scaling at about 4 threads and polars computed
the default bank 3.7x faster, and on 2 cores it stayed short of 2x polars (benchmarks/NOTES.md, section 20).
No library offers these windowed sums in the ladder's order (the order that makes chunked runs equal whole
ones bit for bit), so a C kernel walks each block of rows and channels once with every ladder level in
cache. It covers the kinds whose float64 operations C reproduces exactly (id, lag, diff, ma, dev, std,
zscore: additions, multiplications, divisions and square roots, correctly rounded in both); ret's logarithm
and the EMA stay on torch ops. Without a C compiler, or with the ``native_bank`` setting off,
:func:`native_bank` returns None and the torch path runs: the same bits.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import torch

from tsconv.native import NativeLibrary
from tsconv.pipeline.filters import Filter

__all__ = ["LIBRARY", "NATIVE_KINDS", "NativeBank", "native_bank", "unavailable_reason"]

# The C kernel's kind codes (its enum); the kinds it computes.
_CODES = {"id": 0, "lag": 1, "diff": 2, "ma": 3, "dev": 4, "std": 5, "zscore": 6}
NATIVE_KINDS = frozenset(_CODES)
_MIN_CHANNELS = 4  # its channel blocks are 4, 8 or 16 wide
_MAX_FILTERS = 64
_MAX_WINDOWS = 16


class NativeBank:
    """The compiled ``tsconv_bank``: :meth:`run` computes a bank into a caller's output."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        fn = lib.tsconv_bank
        fn.argtypes = [ptr, i64, i64, i64, i64, i64, ctypes.c_int, ptr, ptr, ptr, i64, i64, i64, i64, i64,
                       ctypes.c_int]  # fmt: skip
        fn.restype = ctypes.c_int
        tasks = lib.tsconv_bank_tasks
        tasks.argtypes = [i64, i64, i64]
        tasks.restype = i64
        self._fn, self._tasks = fn, tasks

    @staticmethod
    def covers(filters: tuple[Filter, ...], channels: int) -> bool:
        """Whether the kernel computes this bank on ``channels`` input channels."""
        windows = {f.taps for f in filters if f.kind in ("ma", "dev", "std", "zscore")}
        return (
            channels >= _MIN_CHANNELS
            and 0 < len(filters) <= _MAX_FILTERS
            and len(windows) <= _MAX_WINDOWS
            and all(f.kind in NATIVE_KINDS for f in filters)
        )

    def run(self, x: torch.Tensor, filters: tuple[Filter, ...], *, dilation: int, halo: int, out: torch.Tensor,
            workers: int, run_parts) -> None:  # noqa: ANN001  # fmt: skip
        """The bank on ``x`` [n + halo, C] (float32 or float64, CPU) into ``out`` [n, C * M] (float32, row-major or
        feature-major: each column contiguous, rows of a polars frame's columns), split into tasks of rows over ``workers``
        threads by ``run_parts(part, count)`` (the caller's thread pool; each part is one C call, which releases
        the GIL)."""
        if x.stride(1) != 1 or x.stride(0) < x.shape[1]:
            x = x.contiguous()  # the kernel reads each row's channels as one run
        n = out.shape[0]
        channels = x.shape[1]
        kinds = np.array([_CODES[f.kind] for f in filters], dtype=np.int32)
        params = np.array(
            [f.taps if f.kind in ("ma", "dev", "std", "zscore") else (f.n if f.kind in ("lag", "diff") else 0)
             for f in filters],
            dtype=np.int64,
        )  # fmt: skip
        # Rows per task: long enough that the halo each task re-walks stays small (a quarter at most), short
        # enough that every thread gets several tasks.
        rows = max(4 * halo, 2048, -(-n // max(1, 4 * workers)))
        rows = min(rows, max(n, 1), 16_384)
        tasks = int(self._tasks(n, channels, rows))
        parts = max(1, min(workers, tasks))
        xp, op = x.data_ptr(), out.data_ptr()
        wide = int(x.dtype == torch.float64)
        m = len(filters)
        fails: list[int] = []

        def part(k: int, count: int) -> None:
            rc = self._fn(xp, x.stride(0), n, channels, halo, dilation, m, kinds.ctypes.data, params.ctypes.data,
                          op, out.stride(0), out.stride(1), rows, k, count, wide)  # fmt: skip
            if rc != 0:
                fails.append(rc)

        run_parts(part, parts)
        if fails:
            raise MemoryError("the native bank could not allocate its scratch")


# -march=native: the kernel's vectors are 4 doubles, whole AVX registers where the CPU has them (the library is
# keyed by the CPU's flags); no fast-math and no contraction into fused multiply-adds, so every operation rounds
# as torch's does. -fno-fast-math comes after the CC setting's own arguments: a CC='gcc -ffast-math' took the
# kernel's NaN checks out (finite math only), and outputs whose windows held a NaN were numbers.
LIBRARY = NativeLibrary(
    Path(__file__).with_name("filterbank_native.c"),
    flags=("-O3", "-march=native", "-fno-fast-math", "-ffp-contract=off", "-fno-math-errno"),
    wrap=NativeBank,
    setting="native_bank",
    per_cpu=True,
)


def native_bank() -> NativeBank | None:
    """The compiled bank, built on first use; None when unavailable (see :func:`unavailable_reason`)."""
    return LIBRARY.get()[0]


def unavailable_reason() -> str | None:
    """Why :func:`native_bank` is None (no compiler, the build failed, the setting off), or None."""
    return LIBRARY.get()[1]
