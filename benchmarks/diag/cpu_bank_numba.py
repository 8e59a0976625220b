"""A compiled CPU pass for the default bank, prototyped with numba, against the torch path and polars.

Claim measured (benchmarks/NOTES.md, section 20, "The CPU bank on many cores"): the CPU bank's torch ops stop
scaling with threads; one compiled pass per tile of rows x channels, doing the torch ladder's own float64
additions, gives the same bits faster. Needs numba, which tsconv does not depend on: install it apart
(``pip install --target DIR numba llvmlite`` and put DIR on PYTHONPATH).

    python benchmarks/diag/cpu_bank_numba.py [--rows 500000] [--features 40] [--repeats 9]

Prints the bitwise check on a chunk with a NaN gap and an infinity, then medians of the torch bank on one
65,536-row chunk against the prototype (taking turns), and of ``tsconv.features`` on the whole series against the
prototype and polars.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import filters as F  # noqa: E402

try:
    import numba
except ImportError:  # pragma: no cover - a diagnostic
    sys.exit("numba is not installed: pip install --target DIR numba llvmlite, then put DIR on PYTHONPATH")

HALO = 256


@numba.njit(parallel=True, fastmath=False, boundscheck=False)
def default_bank(x: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """diff:1, diff:32, diff:256, dev:32, dev:256 of ``x`` [n + 256, C] float32 into ``out`` [n, 5C]."""
    rows, channels = x.shape
    n = rows - HALO
    cb, seg = 8, 2048
    nblk = (channels + cb - 1) // cb
    nseg = (n + seg - 1) // seg
    for task in numba.prange(nblk * nseg):
        c0 = (task % nblk) * cb
        w = min(channels, c0 + cb) - c0
        o0 = (task // nblk) * seg
        o1 = min(n, o0 + seg)
        length = o1 - o0 + HALO
        lev = np.zeros((length, cb), np.float64)
        s32 = np.empty((o1 - o0, cb), np.float64)
        for i in range(length):
            for k in range(w):
                lev[i, k] = x[o0 + i, c0 + k]
        for j in range(8):  # ladder level j + 1 from level j, in place from the last row down
            h = 1 << j
            for i in range(length - 1, h - 1, -1):
                for k in range(cb):
                    lev[i, k] = lev[i - h, k] + lev[i, k]
            if j == 4:
                for i in range(o1 - o0):
                    for k in range(cb):
                        s32[i, k] = lev[i + HALO, k]
        for i in range(o1 - o0):
            t = o0 + i + HALO
            for k in range(w):
                c = c0 + k
                xc = x[t, c]
                cur = np.float64(xc)
                base = c * 5
                out[o0 + i, base + 0] = xc - x[t - 1, c]
                out[o0 + i, base + 1] = xc - x[t - 32, c]
                out[o0 + i, base + 2] = xc - x[t - 256, c]
                out[o0 + i, base + 3] = np.float32(cur - s32[i, k] * (1.0 / 32))
                out[o0 + i, base + 4] = np.float32(cur - lev[i + HALO, k] * (1.0 / 256))


def _median(fn, repeats: int) -> float:  # noqa: ANN001
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> None:
    import polars as pl

    import tsconv
    from tsconv.kernels.filterbank import filter_bank
    from tsconv.pipeline.filters import filter_spec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--features", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    bank = tuple(filter_spec(s) for s in F.FILTERS)
    x = F.price_series(65_536 + HALO, args.features)
    x[1000:1300, 3] = np.nan
    x[5000, min(7, args.features - 1)] = np.inf
    ref = filter_bank(torch.from_numpy(x), bank).numpy()
    out = np.empty_like(ref)
    t = time.perf_counter()
    default_bank(x, out)
    print(f"first call (compile) {time.perf_counter() - t:.2f} s")
    print("bits equal to the torch path:", np.array_equal(ref.view(np.uint32), out.view(np.uint32)))
    tt = _median(lambda: filter_bank(torch.from_numpy(x), bank), args.repeats)
    tn = _median(lambda: default_bank(x, out), args.repeats)
    print(f"65,536 x {args.features} chunk: torch {tt * 1e3:.1f} ms, prototype {tn * 1e3:.1f} ms")
    series = F.price_series(args.rows, args.features)
    padded = np.concatenate([np.zeros((HALO, args.features), np.float32), series])
    frame = pl.DataFrame({f"c{i}": series[:, i] for i in range(args.features)})
    tf = _median(lambda: tsconv.features(series, "default", device="cpu"), args.repeats)
    tp = _median(
        lambda: default_bank(padded, np.empty((args.rows, 5 * args.features), np.float32)), args.repeats
    )
    tl = _median(lambda: F.run_polars(frame), args.repeats)
    print(f"{args.rows:,} x {args.features}: features {tf:.3f} s, prototype {tp:.3f} s, polars {tl:.3f} s")


if __name__ == "__main__":
    main()
