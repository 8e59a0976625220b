"""The default pipeline's five features through tsconv's CPU engine against polars on the same cores.

Both compute, per feature column of a price series, ``x - x[t-1]``, ``x - x[t-32]``, ``x - x[t-256]``,
``x - mean of the last 32`` and ``x - mean of the last 256`` into float32: tsconv as
``tsconv.features(x, "default")`` (numpy in, numpy [T, 5F] out), polars as one ``select`` of shift and
``rolling_mean`` expressions over a frame of the columns (its own threads: the machine's cores). The
input is built once and is not timed; each side's time is the median of ``--repeats`` (default 3) runs,
the sides taking turns. Outputs are compared (largest difference relative to each feature's scale). Writes
``results/filters.json`` and ``results/filters.md``.

    python benchmarks/filters.py [--shapes 500000x40,1048576x32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import commit, machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = ((500_000, 40), (1_048_576, 32))
FILTERS = ("diff:1", "diff:32", "diff:256", "dev:32", "dev:256")


def price_series(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Multiplicative random walks from 20 to 500 on a 0.01 grid, float32."""
    rng = np.random.default_rng(seed)
    start = rng.uniform(np.log(20.0), np.log(500.0), size=cols)
    logp = start + np.cumsum(rng.normal(scale=5e-4, size=(rows, cols)), axis=0)
    return np.round(np.exp(logp), 2).astype(np.float32)


def run_tsconv(x: np.ndarray) -> np.ndarray:
    import tsconv

    return tsconv.features(x, "default", device="cpu")


def run_polars(frame) -> np.ndarray:  # noqa: ANN001
    import polars as pl

    exprs = []
    for name in frame.columns:
        s = pl.col(name)
        exprs += [
            (s - s.shift(1)).alias(f"{name}.diff1"),
            (s - s.shift(32)).alias(f"{name}.diff32"),
            (s - s.shift(256)).alias(f"{name}.diff256"),
            (s - s.rolling_mean(32)).alias(f"{name}.dev32"),
            (s - s.rolling_mean(256)).alias(f"{name}.dev256"),
        ]
    return frame.select(exprs)


def _timed(fn) -> tuple[float, object]:  # noqa: ANN001
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _alternating(a, b, repeats: int) -> tuple[list[float], list[float], object, object]:  # noqa: ANN001
    """``a`` and ``b`` in turn, ``repeats`` times each: both sides see the same moments of a shared
    machine (the VM's speed moved 2x between back-to-back blocks of runs)."""
    ta, tb, out_a, out_b = [], [], None, None
    for _ in range(repeats):
        out_a = out_b = None
        t, out_a = _timed(a)
        ta.append(t)
        t, out_b = _timed(b)
        tb.append(t)
    return ta, tb, out_a, out_b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(f"{r}x{c}" for r, c in SHAPES))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import polars as pl
    import torch

    rows_out = []
    for shape in args.shapes.split(","):
        rows, cols = (int(v) for v in shape.split("x"))
        x = price_series(rows, cols)
        frame = pl.DataFrame({f"x{j}": x[:, j] for j in range(cols)})
        run_tsconv(x[:4096])  # imports and first-call set-up out of the timing
        run_polars(frame.head(4096))
        all_ts, all_pl, y, p = _alternating(lambda: run_tsconv(x), lambda: run_polars(frame), args.repeats)  # noqa: B023
        t_ts, t_pl = statistics.median(all_ts), statistics.median(all_pl)
        ref = p.to_numpy()  # [T, 5F] in the same column order
        ok = np.isfinite(ref)
        nan_same = bool(np.array_equal(np.isnan(y), np.isnan(ref)))
        scale = np.nanmax(np.abs(np.where(ok, ref, np.nan)), axis=0)
        rel = float(np.nanmax(np.abs(np.where(ok, y - ref, np.nan)) / scale))
        del p, y, ref
        rows_out.append(
            {
                "rows": rows,
                "features": cols,
                "outputs": 5 * cols,
                "tsconv_s": round(t_ts, 3),
                "tsconv_runs_s": [round(v, 3) for v in all_ts],
                "polars_s": round(t_pl, 3),
                "polars_runs_s": [round(v, 3) for v in all_pl],
                "speedup": round(t_pl / t_ts, 2),
                # each repeat's polars over its tsconv (run back to back), then the median
                "speedup_paired": round(
                    statistics.median(b / a for a, b in zip(all_ts, all_pl, strict=True)), 2
                ),
                "tsconv_rows_per_s": int(rows / t_ts),
                "same_nan_pattern": nan_same,
                "max_diff_of_scale": rel,
            }
        )
        print(json.dumps(rows_out[-1]), flush=True)
    meta = {
        "benchmark": "filters",
        "machine": machine(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "commit": commit(),
        "torch_threads": torch.get_num_threads(),
        "polars": pl.__version__,
        "polars_threads": pl.thread_pool_size(),
        "pipeline": "default: " + ", ".join(FILTERS) + " per feature",
        "load": os.environ.get("BENCH_LOAD", "shared 2-core VM, other jobs possible"),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "filters.json").write_text(json.dumps({**meta, "results": rows_out}, indent=2) + "\n")
    m = meta["machine"]
    lines = [
        f"# Default filters: tsconv CPU engine against polars ({m['cpu']}, {m['cores']} cores, {meta['date']}, "
        f"commit {meta['commit']})",
        "",
        f"Medians of {args.repeats}, the two sides taking turns; polars {meta['polars']} on {meta['polars_threads']} threads, torch on "
        f"{meta['torch_threads']}. Same five features ({', '.join(FILTERS)}) per price column, float32 out.",
        "",
        "| rows x features | outputs | tsconv s | polars s | tsconv speedup | paired | same NaNs | max diff / scale |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows_out:
        lines.append(
            f"| {r['rows']:,} x {r['features']} | {r['outputs']} | {r['tsconv_s']:.3f} | {r['polars_s']:.3f} | "
            f"{r['speedup']:.2f}x | {r['speedup_paired']:.2f}x | {r['same_nan_pattern']} | {r['max_diff_of_scale']:.2g} |"
        )
    (RESULTS / "filters.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
