"""Write throughput of the Parquet output writer (:class:`tsconv.io.writers.parquet_writer.ParquetSink`).

Claim measured: writing missing values as Parquet nulls (a validity bitmap from ``isnan``) costs the writer
little next to writing them as float NaN (benchmarks/NOTES.md, "Output formats").

The frame: ``rows`` x 16 float32 (default 1,048,576 rows, 64 MiB), the first 256 rows NaN (a warm-up), 1% of
the other cells NaN and a few +-inf, appended in 16,384-row blocks as the engine emits them, with and without
an int64 ns time column read from an in-memory zarr array. Each run writes a fresh file (page cache, no
fsync) and calls ``finish()``; median of ``repeats`` runs.

    python benchmarks/parquet_writer.py               # prints rows/s
    python benchmarks/parquet_writer.py --rows 262144
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tsconv.io.writers.parquet_writer import ParquetSink  # noqa: E402

FEATURES, BLOCK, WARMUP = 16, 16384, 256


def _frame(rows: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    x[rng.random(x.shape) < 0.01] = np.nan
    x[:WARMUP] = np.nan
    x[rng.integers(WARMUP, rows, 8), rng.integers(0, FEATURES, 8)] = np.inf
    return x


def _once(x: np.ndarray, time_source: object | None, out: Path) -> float:
    names = tuple(f"f{j}" for j in range(FEATURES))
    t0 = time.perf_counter()
    sink = ParquetSink(out, names=names, time_source=time_source, metadata={})
    for a in range(0, x.shape[0], BLOCK):
        sink.append(x[a : a + BLOCK])
    sink.finish()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1 << 20)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    x = _frame(args.rows)
    t = zarr.array(np.arange(args.rows, dtype=np.int64) * 1_000_000_000, chunks=(65536,))
    with tempfile.TemporaryDirectory() as tmp:
        for label, src in (("values only", None), ("with time", t)):
            runs = [_once(x, src, Path(tmp) / "out.parquet") for _ in range(args.repeats)]
            med = statistics.median(runs)
            print(
                f"{label:12s} {args.rows:,} x {FEATURES}: median {med * 1e3:.0f} ms, {args.rows / med / 1e6:.2f} M rows/s "
                f"(runs {', '.join(f'{r * 1e3:.0f}' for r in runs)} ms)"
            )


if __name__ == "__main__":
    main()
