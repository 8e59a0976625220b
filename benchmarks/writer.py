"""Write throughput of the output writer: zarr in the caller's thread (the old path) vs threads and direct files.

Claim measured: writing output chunk files directly from threads costs the engine's thread far less than
zarr in the caller's thread, with the same bytes (benchmarks/NOTES.md, "The writer").

The output is what the engine writes: ``rows`` x 64 float32 features (default 1,048,576 rows, 268 MB),
65,536-row chunks (about 16 MB, ``output_chunk_rows(1024, 64)``), Blosc-lz4 with shuffle, appended in
1024-row blocks as the engine emits them. The rows are real features: a causal filter bank (diff, ma, dev)
over seeded random walks on a 0.01 tick grid with 1% NaN, so they compress like the engine's output.
Each variant creates a fresh store, appends every block and calls ``finish()`` (page cache, no fsync);
median of ``repeats`` runs, the variants taking turns. Also reported: CPU seconds of the process, the
seconds the caller spent inside ``append``/``finish`` (what the engine's thread pays), the writer's
``busy_seconds`` (encode + write summed over threads) and ``wait_seconds`` (caller blocked on buffers
or completions), and a floor: Blosc encoding alone of the same chunks in one thread, in memory.

    python benchmarks/writer.py                 # writes benchmarks/results/writer.json and writer.md
    python benchmarks/writer.py --rows 262144   # a quick run
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE.parent))

from provenance import commit, machine  # noqa: E402

import tsconv  # noqa: E402
from tsconv.io.writers.encode import ChunkFileWriter  # noqa: E402
from tsconv.io.writers.zarr_writer import OutputWriter, default_write_threads, output_chunk_rows  # noqa: E402

FEATURES_OUT = 64
STEP = 1024
PIPELINE = {"conv": [{"filters": ["diff:1", "diff:8", "ma:16", "dev:32"]}]}  # 4 outputs per input feature


def _features(rows: int, seed: int = 0) -> np.ndarray:
    """rows x 64 float32 engine output: the filter bank over 16 random walks with NaN gaps."""
    rng = np.random.default_rng(seed)
    n_in = FEATURES_OUT // 4
    steps = rng.choice([-1, 0, 0, 0, 1], size=(rows, n_in)) * 0.01
    x = (100.0 + rng.uniform(-20, 20, size=n_in) + np.cumsum(steps, axis=0)).astype(np.float32)
    x[rng.random(x.shape) < 0.01] = np.nan
    y = tsconv.features(x, PIPELINE, chunk=65536)
    assert y.shape == (rows, FEATURES_OUT), y.shape
    return np.ascontiguousarray(y, dtype=np.float32)


def _write(path: Path, y: np.ndarray, **kw) -> dict:
    rows = y.shape[0]
    writer = OutputWriter.create(
        path,
        rows=rows,
        names=tuple(f"y{j}" for j in range(y.shape[1])),
        chunk_rows=output_chunk_rows(STEP, y.shape[1]),
        time_source=None,
        attrs={"tsconv": {"complete": False, "rows": rows, "rows_done": 0}},
        **kw,
    )
    caller = 0.0
    t0 = time.perf_counter()
    for a in range(0, rows, STEP):
        block = y[a : a + STEP]
        t = time.perf_counter()
        writer.append(block)
        caller += time.perf_counter() - t
    t = time.perf_counter()
    writer.finish()
    end = time.perf_counter()
    caller += end - t
    return {
        "seconds": end - t0,
        "caller_s": caller,
        "busy_s": writer.busy_seconds,
        "wait_s": writer.wait_seconds,
        "fast": writer.fast,
        "threads": writer.threads,
    }


def _encode_floor(y: np.ndarray, path: Path) -> dict:
    """Blosc encoding of every chunk in one thread, in memory: the per-core rate the writer scales."""
    values = zarr.open_group(str(path), mode="r")["values"]
    enc = ChunkFileWriter(values)
    chunk_rows = enc.chunk_rows
    buf = np.full((chunk_rows, y.shape[1]), np.nan, dtype=np.float32)
    stored, t0 = 0, time.perf_counter()
    for a in range(0, y.shape[0], chunk_rows):
        n = min(chunk_rows, y.shape[0] - a)
        buf[:n] = y[a : a + n]
        stored += len(enc.codec.encode(buf))
    secs = time.perf_counter() - t0
    return {"seconds": secs, "gbps": y.nbytes / secs / 1e9, "ratio": y.nbytes / stored}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1 << 20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS / "writer")
    args = ap.parse_args()

    t0 = time.perf_counter()
    y = _features(args.rows)
    print(f"features computed in {time.perf_counter() - t0:.1f} s", flush=True)
    here = default_write_threads()
    variants = {
        "zarr, caller's thread (old path)": {"threads": 0, "fast": False},
        f"zarr, {here} threads": {"threads": here, "fast": False},
        "direct files, caller's thread": {"threads": 0},
        f"direct files, {here} threads (default here)": {"threads": here},
        "direct files, 8 threads (default on 8+ cores)": {"threads": 8},
    }
    work = Path(tempfile.mkdtemp(prefix="tsconv-writer-"))
    load0 = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    try:
        # Variants take turns within each repeat, so load from other jobs on a shared machine spreads
        # over all of them; the first round only warms the allocator and the page cache.
        for i in range(args.repeats + 1):
            for name, kw in variants.items():
                path = work / "out.zarr"
                c0 = time.process_time()
                r = _write(path, y, **kw)
                r["cpu_s"] = time.process_time() - c0  # all threads of this process
                shutil.rmtree(path)
                if i:
                    runs[name].append(r)
                    print(f"{name:48s} {r['seconds']:.3f} s wall, {r['cpu_s']:.3f} s CPU", flush=True)
        results = []
        for name, kw in variants.items():
            rs = runs[name]
            med = statistics.median(r["seconds"] for r in rs)
            cpu = statistics.median(r["cpu_s"] for r in rs)
            results.append(
                {
                    "variant": name,
                    "options": kw,
                    "fast": rs[0]["fast"],
                    "threads": rs[0]["threads"],
                    "seconds": [round(r["seconds"], 4) for r in rs],
                    "median_s": med,
                    "gbps": y.nbytes / med / 1e9,
                    "cpu_s": cpu,
                    "gb_per_cpu_s": y.nbytes / cpu / 1e9,
                    "caller_s": statistics.median(r["caller_s"] for r in rs),
                    "busy_s": statistics.median(r["busy_s"] for r in rs),
                    "wait_s": statistics.median(r["wait_s"] for r in rs),
                }
            )
        path = work / "floor.zarr"
        _write(path, y[: 2 * STEP], threads=0)  # a store of the same layout for the codec
        floor = _encode_floor(y, path)
        stored = None
        path = work / "size.zarr"
        _write(path, y, threads=0)
        stored = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "benchmark": "writer",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": machine(),
        "load_avg_before_after": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "output": {
            "rows": args.rows,
            "features": FEATURES_OUT,
            "bytes": y.nbytes,
            "stored_bytes": stored,
            "chunk_rows": output_chunk_rows(STEP, FEATURES_OUT),
            "codec": "blosc lz4 clevel 5 shuffle",
            "pipeline": PIPELINE,
            "nan_fraction": float(np.isnan(y).mean()),
        },
        "append_rows": STEP,
        "repeats": args.repeats,
        "encode_floor_1_thread": floor,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(_markdown(result))
    print(f"wrote {args.out.with_suffix('.json')} and .md")


def _markdown(r: dict) -> str:
    m, o, f = r["machine"], r["output"], r["encode_floor_1_thread"]
    old = r["results"][0]["median_s"]
    lines = [
        "# Output writer throughput",
        "",
        f"{r['date']}, commit {r['commit']}, {m['cpu']} ({m['cores']} cores, {m['ram_gib']} GiB), "
        f"Python {m['python']}; load average {r['load_avg_before_after'][0]} before, "
        f"{r['load_avg_before_after'][1]} after.",
        "",
        f"Output: {o['rows']:,} x {o['features']} float32 ({o['bytes'] / 1e9:.2f} GB, "
        f"{o['stored_bytes'] / 1e9:.2f} GB stored, {o['nan_fraction']:.1%} NaN), {o['chunk_rows']:,}-row chunks, "
        f"{o['codec']}, appended in {r['append_rows']}-row blocks; fresh store per run, page cache, no fsync. "
        f"GB/s of uncompressed output, median of {r['repeats']} runs (after one warm-up run). "
        "GB per CPU s: output bytes over the process's CPU time (all threads), which load from other jobs "
        "on the machine disturbs less than wall time. caller: seconds inside append/finish; caller work: "
        "the same less the time blocked on buffers or completions (the copies the caller pays); busy: "
        "encode + write summed over the writer's threads.",
        "",
        f"Floor: Blosc encoding alone, one thread, in memory: {f['gbps']:.2f} GB/s ({f['seconds']:.3f} s, "
        f"ratio {f['ratio']:.2f}).",
        "",
        "| variant | GB/s (wall) | vs old | GB per CPU s | caller s | caller work s | busy s | seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for x in r["results"]:
        lines.append(
            f"| {x['variant']} | {x['gbps']:.2f} | {old / x['median_s']:.2f}x | {x['gb_per_cpu_s']:.2f} | "
            f"{x['caller_s']:.3f} | {x['caller_s'] - x['wait_s']:.3f} | {x['busy_s']:.3f} | "
            f"{', '.join(f'{t:.3f}' for t in x['seconds'])} |"
        )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
