"""Ingest: seconds, input rows/s and peak RSS of `tsconv.ingest` on a 10M-row long-format Parquet file.

Claim measured: `tsconv.ingest` turns long-format Parquet into a store at millions of input rows per second
in bounded memory (one band of output), exactly, and the store then runs through `tsconv process`
(benchmarks/NOTES.md, "Ingest").

The input (generated streaming, one row group at a time with pyarrow's ParquetWriter) holds 10,000
irregular timestamps x 1024 features = 10.24M (time, feature, value) rows minus 1 % dropped at random
(missing cells), values being per-feature random walks on a 0.01 price grid, times timestamp[ns, UTC].
Row groups hold 1024 timestamps (~1M rows) each.

Variants, each ingested in its own child process (so ru_maxrss is the ingest's own):
- sorted, 1 band: the default (the whole 40 MB output fits in one 256 MiB band: one pass);
- sorted, 1-chunk bands: 16 MiB bands (3 bands), showing what re-scanning per band costs when Parquet
  row-group statistics let each band read only its own row groups;
- shuffled, 1 band / 1-chunk bands: the same rows, every row group holding a random tenth of all cells,
  so no row group can be skipped and every band re-reads the whole file.

    python benchmarks/ingest.py                 # writes benchmarks/results/ingest.json and ingest.md
    python benchmarks/ingest.py --timestamps 2000   # a quick run
    python benchmarks/ingest.py --timestamps 1500 --features 32 --out /tmp/ingest   # a smoke test
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import commit, machine  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
T0_NS = 1_767_346_200_000_000_000  # 2026-01-02 09:30 UTC
GROUP_TS = 1024  # timestamps per row group


def _names(features: int) -> list[str]:
    return [f"px_{j:04d}" for j in range(features)]


def generate(path: Path, *, timestamps: int, features: int, seed: int, shuffled: bool) -> int:
    """Write the long-format Parquet file; returns its row count. Memory: one row group (~1M rows)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    names = pa.array(_names(features)).dictionary_encode()
    level = np.round(rng.uniform(20, 500, size=features), 2)
    ticks = np.zeros(features, dtype=np.int64)
    t_last = T0_NS
    schema = pa.schema(
        [("time", pa.timestamp("ns", tz="UTC")), ("feature", names.type), ("value", pa.float64())]
    )
    n_groups = -(-timestamps // GROUP_TS)
    # The shuffled file deals each cell to a random row group: every group then spans the whole time range.
    deal = np.random.default_rng(seed + 1)
    pending: list[list[pa.Table]] = [[] for _ in range(n_groups)] if shuffled else []
    rows = 0
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for g in range(n_groups):
            n = min(GROUP_TS, timestamps - g * GROUP_TS)
            gaps = rng.exponential(2e6, size=n).astype(np.int64) + 1000  # bursty: ~2 ms mean, >= 1 us
            t = t_last + np.cumsum(gaps)
            t_last = int(t[-1])
            steps = rng.choice(np.array([-2, -1, 0, 0, 0, 0, 1, 2], dtype=np.int64), size=(n, features))
            path_ticks = ticks + np.cumsum(steps, axis=0)
            ticks = path_ticks[-1]
            px = np.maximum(level + path_ticks / 100.0, 0.01).round(2)
            keep = rng.random((n, features)) >= 0.01
            ti, fi = np.nonzero(keep)
            table = pa.table(
                {
                    "time": pa.array(t[ti], type=pa.timestamp("ns", tz="UTC")),
                    "feature": pa.DictionaryArray.from_arrays(
                        pa.array(fi.astype(np.int32)), names.dictionary
                    ),
                    "value": pa.array(px[ti, fi]),
                },
                schema=schema,
            )
            rows += table.num_rows
            if not shuffled:
                writer.write_table(table, row_group_size=table.num_rows)
                continue
            dest = deal.integers(0, n_groups, size=table.num_rows)
            for k in range(n_groups):
                pending[k].append(table.filter(pa.array(dest == k)))
        for k, parts in enumerate(pending):
            table = pa.concat_tables(parts)
            perm = deal.permutation(table.num_rows)
            writer.write_table(table.take(pa.array(perm)), row_group_size=table.num_rows)
            pending[k] = []
    return rows


def _child(src: str, out: str, band_bytes: int) -> None:
    """Run one ingest in this (child) process and print its report as JSON."""
    import tsconv.io.ingest as ing

    ing._BAND_BYTES = band_bytes
    report = ing.ingest(src, out, overwrite=True)
    print(json.dumps(report.to_dict()))


def _run_child(src: Path, out: Path, band_bytes: int) -> dict:
    cmd = [sys.executable, __file__, "--child", str(src), str(out), str(band_bytes)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def _check(src: Path, out: Path, features: int) -> dict:
    """Compare the first row group with the store: every kept cell, and NaN elsewhere."""
    import numpy as np
    import pyarrow.parquet as pq
    import zarr

    g = zarr.open_group(str(out), mode="r")
    values, times = g["values"], np.asarray(g["time"][:])
    rg = pq.ParquetFile(src).read_row_group(0)
    t = rg.column("time").cast("int64").to_numpy()
    f = np.array([int(n[3:]) for n in rg.column("feature").to_pylist()])
    v = rg.column("value").to_numpy()
    r = np.searchsorted(times, t)
    block = np.asarray(values[: int(r.max()) + 1])
    ok = bool((times[r] == t).all() and np.array_equal(block[r, f], v.astype(np.float32)))
    nan_frac = float(np.isnan(block).mean())
    return {
        "first_row_group_exact": ok,
        "nan_fraction_first_rows": round(nan_frac, 4),
        "shape": list(values.shape),
        "features_ok": g.attrs["features"] == _names(features),
    }


def _process_child(store: Path, work: Path) -> dict:
    """Run `tsconv process` on an ingested store in its own process; returns its report."""
    report = work / "process_report.json"
    subprocess.run(
        [sys.executable, "-m", "tsconv", "process", "-i", str(store), "-o", str(work / "features.zarr"),
         "--device", "cpu", "-q", "--report", str(report)],
        check=True,
    )  # fmt: skip
    shutil.rmtree(work / "features.zarr", ignore_errors=True)
    return json.loads(report.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timestamps", type=int, default=10_000)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--workdir", type=Path, default=None, help="where the Parquet files go (default: a temp dir)"
    )
    ap.add_argument("--no-shuffled", action="store_true", help="skip the shuffled-input variants")
    ap.add_argument("--out", type=Path, default=RESULTS / "ingest", help="writes OUT.json and OUT.md")
    args = ap.parse_args()

    import polars as pl
    import pyarrow as pa

    work = Path(tempfile.mkdtemp(prefix="tsconv-ingest-", dir=args.workdir))
    chunk_bytes = 16 << 20
    try:
        variants = [("sorted", False)] + ([] if args.no_shuffled else [("shuffled", True)])
        rows_out = []
        processed: dict = {}
        for label, shuffled in variants:
            src = work / f"ticks_long_{label}.parquet"
            t = time.perf_counter()
            n = generate(
                src, timestamps=args.timestamps, features=args.features, seed=args.seed, shuffled=shuffled
            )
            gen_s = time.perf_counter() - t
            size = src.stat().st_size
            print(f"generated {src.name}: {n:,} rows, {size / 2**20:.0f} MiB in {gen_s:.1f} s", flush=True)
            for band_label, band in (
                ("1 band (default 256 MiB)", 256 << 20),
                ("1-chunk bands (16 MiB)", chunk_bytes),
            ):
                out = work / f"out_{label}.zarr"
                rep = _run_child(src, out, band)
                check = _check(src, out, args.features)
                row = {
                    "input": label,
                    "bands": band_label,
                    "input_rows": rep["input_rows"],
                    "input_mib": round(size / 2**20, 1),
                    "rows": rep["rows"],
                    "features": rep["features"],
                    "seconds": round(rep["seconds"], 2),
                    "rows_per_s": round(rep["rows_per_s"]),
                    "peak_rss_mib": round(rep["peak_rss_bytes"] / 2**20),
                    "check": check,
                }
                print(json.dumps(row), flush=True)
                rows_out.append(row)
                if not processed:  # the acceptance's second half: `tsconv process` on the ingested store
                    processed.update(_process_child(out, work))
                    print(json.dumps({"process_after_ingest": processed}), flush=True)
                shutil.rmtree(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    result = {
        "benchmark": "ingest",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": machine(),
        "note": "shared CPU machine (2 cores, other jobs running): figures are indicative",
        "versions": {"polars": pl.__version__, "pyarrow": pa.__version__},
        "timestamps": args.timestamps,
        "features_in": args.features,
        "results": rows_out,
        "process_after_ingest": processed,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    m = result["machine"]
    lines = [
        "# Ingest: long-format Parquet -> zarr store",
        "",
        f"{result['date']}, commit {result['commit']}, {m['cpu']} ({m['cores']} cores, {m['ram_gib']} GiB), "
        f"polars {pl.__version__}, pyarrow {pa.__version__}. {result['note']}.",
        "",
        f"Input: {args.timestamps:,} timestamps x {args.features} features, 1 % of cells missing, "
        "zstd Parquet, ~1M-row row groups; output float32, 16 MiB chunks. Each ingest runs in its own process.",
        "",
        "| input | bands | input rows | input MiB | output rows x features | seconds | input rows/s | peak RSS MiB | check |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    for r in rows_out:
        ok = "exact" if r["check"]["first_row_group_exact"] and r["check"]["features_ok"] else "MISMATCH"
        lines.append(
            f"| {r['input']} | {r['bands']} | {r['input_rows']:,} | {r['input_mib']} | {r['rows']:,} x {r['features']} | "
            f"{r['seconds']} | {r['rows_per_s']:,} | {r['peak_rss_mib']} | {ok} |"
        )
    if processed:
        lines += [
            "",
            f"Then `tsconv process` (default pipeline, CPU) on the first ingested store: {processed['rows']:,} rows x "
            f"{processed['features_in']} -> {processed['features_out']} features in {processed['seconds']:.2f} s "
            f"({processed['rows_per_s']:,.0f} rows/s, peak RSS {processed['peak_rss_bytes'] / 2**20:.0f} MiB).",
        ]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
