"""Write a synthetic tick store (zarr) for demos, tests and benchmarks.

Presets:

    # demo: 200k steps x 64 features (51 MB float32, ~24 MB on disk), under a second
    python data/make_ticks.py --output data/ticks.zarr --rows 200000 --features 64

    # benchmarks: 1M steps x 1024 features (4.3 GB float32, ~2.3 GB on disk), 15-20 s on 2 cores, ~145 MB RAM
    python data/make_ticks.py --output data/ticks_1m_1024.zarr --rows 1000000 --features 1024

Until the project is installed into the virtualenv, run with ``PYTHONPATH=<repo root>``. The same seed,
rows and features always give the same store, whatever the chunking or zarr format. See
:func:`tsconv.synth.make_ticks` for what the data looks like.
"""

from __future__ import annotations

import argparse
import sys
import time

from tsconv.errors import TsconvError
from tsconv.synth import make_ticks


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="make_ticks.py",
        description="Write a synthetic tick store: values [T, F], time [T] (int64 ns) and attribute features.",
        epilog="Presets: --rows 200000 --features 64 (demo); --rows 1000000 --features 1024 (benchmarks).",
    )
    p.add_argument("--output", "-o", required=True, help="path of the zarr store to create")
    p.add_argument("--rows", type=int, required=True, help="time steps T")
    p.add_argument("--features", type=int, required=True, help="features F (px_i, vol_i, spread_i, ...)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16"])
    p.add_argument("--chunk-rows", type=int, default=None, help="rows per chunk (default: ~16 MiB chunks)")
    p.add_argument("--chunk-features", type=int, default=None, help="features per chunk (default: all)")
    p.add_argument(
        "--nan-fraction", type=float, default=0.01, help="fraction of cells in NaN gaps (0: dense)"
    )
    p.add_argument("--zarr-format", type=int, default=3, choices=[2, 3])
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at --output")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    start = time.perf_counter()
    try:
        path = make_ticks(
            args.output,
            rows=args.rows,
            features=args.features,
            seed=args.seed,
            dtype=args.dtype,
            chunk_rows=args.chunk_rows,
            chunk_features=args.chunk_features,
            nan_fraction=args.nan_fraction,
            zarr_format=args.zarr_format,
            overwrite=args.overwrite,
            progress=not args.quiet,
        )
    except TsconvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(
            f"wrote {path} ({args.rows} x {args.features} {args.dtype}) in {time.perf_counter() - start:.1f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
