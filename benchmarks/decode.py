"""Decode throughput: a forward pass of 1024-row reads through BlockReader vs ParallelBandReader.

Claim measured: the CPU reader's decode threads read a Blosc-LZ4 store faster than zarr's own read and
than BlockReader, scaling with threads up to the cores (benchmarks/NOTES.md, "Reading and decoding on the CPU").

On a generated tick store (tsconv.synth.make_ticks: float32, Blosc-lz4 with shuffle, chunks of about
16 MiB of whole rows; default 1,048,576 x 256 = 1 GiB), each variant reads the whole store in 1024-row
pieces as the engine does, 3 times (median GB/s of decoded bytes, warm page cache):
- zarr whole-array read (``array[:]``, zarr-python's own pipeline and concurrency);
- BlockReader (one zarr read per band of store chunks);
- ParallelBandReader with 1, 2 and 16 decode threads (default prefetch; ``--threads``).

    python benchmarks/decode.py                      # writes benchmarks/results/decode.json and decode.md
    python benchmarks/decode.py --rows 262144         # a quick run
    python benchmarks/decode.py --store /path/x.zarr  # an existing store (its 'values')
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

from tsconv.io.readers.blocks import BlockReader  # noqa: E402
from tsconv.io.readers.threads import ParallelBandReader  # noqa: E402
from tsconv.synth import make_ticks  # noqa: E402


def _forward(reader, rows: int, step: int) -> float:
    t0 = time.perf_counter()
    for a in range(0, rows, step):
        reader.read(a, min(a + step, rows))
    return time.perf_counter() - t0


def _variants(values: zarr.Array, rows: int, step: int, threads: list[int], only_fast: bool) -> dict:
    def whole() -> float:
        t0 = time.perf_counter()
        np.asarray(values[:])
        return time.perf_counter() - t0

    def block() -> float:
        return _forward(BlockReader(values), rows, step)

    def forward(make):  # noqa: ANN001, ANN202 - a forward pass through a fresh fast reader
        def run() -> float:
            with make() as r:
                assert r.fast, r.fallback_reason
                return _forward(r, rows, step)

        return run

    slow = {} if only_fast else {"zarr whole-array read": whole, "BlockReader, 1024-row reads": block}
    return {
        **slow,
        **{
            f"ParallelBandReader, {t} thread{'s' if t > 1 else ''}, 1024-row reads": forward(
                lambda t=t: ParallelBandReader(values, threads=t)
            )
            for t in threads
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1 << 20)
    ap.add_argument("--features", type=int, default=256)
    ap.add_argument("--step", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--store", type=Path, help="an existing store (group with 'values' or a bare array)")
    ap.add_argument("--out", type=Path, default=RESULTS / "decode")
    ap.add_argument("--threads", default="1,2,16", help="decode-thread counts (comma list)")
    ap.add_argument("--only-fast", action="store_true", help="skip the zarr and BlockReader variants")
    args = ap.parse_args()

    work = None
    if args.store is None:
        work = Path(tempfile.mkdtemp(prefix="tsconv-decode-"))
        args.store = work / "ticks.zarr"
        t0 = time.perf_counter()
        make_ticks(args.store, rows=args.rows, features=args.features)
        print(f"generated {args.store} in {time.perf_counter() - t0:.1f} s", flush=True)
    try:
        node = zarr.open(str(args.store), mode="r")
        values = node["values"] if isinstance(node, zarr.Group) else node
        rows, nbytes = int(values.shape[0]), values.nbytes
        stored = sum(f.stat().st_size for f in Path(args.store).rglob("*") if f.is_file())
        load0 = os.getloadavg()
        results = []
        threads = [int(t) for t in args.threads.split(",") if t]
        for name, fn in _variants(values, rows, args.step, threads, args.only_fast).items():
            fn()  # warm the page cache and the allocator once
            secs = [fn() for _ in range(args.repeats)]
            med = statistics.median(secs)
            results.append({"variant": name, "seconds": secs, "median_s": med, "gbps": nbytes / med / 1e9})
            print(
                f"{name:55s} {nbytes / med / 1e9:6.2f} GB/s  ({', '.join(f'{s:.3f}' for s in secs)} s)",
                flush=True,
            )
        with ParallelBandReader(values) as r:
            default = {"threads": r.threads, "prefetch": r.prefetch}
        result = {
            "benchmark": "decode",
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "commit": commit(),
            "machine": machine(),
            "load_avg_before_after": [round(x, 2) for x in (*load0[:1], os.getloadavg()[0])],
            "store": {
                "rows": rows,
                "features": int(values.shape[1]),
                "dtype": str(values.dtype),
                "chunks": list(values.chunks),
                "codecs": [
                    repr(c)
                    for c in (*values.filters, values.serializer, *values.compressors)
                    if c is not None
                ],
                "bytes": nbytes,
                "stored_bytes": stored,
            },
            "step": args.step,
            "repeats": args.repeats,
            "reader_defaults_here": default,
            "results": results,
        }
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(_markdown(result))
    print(f"wrote {args.out.with_suffix('.json')} and .md")


def _markdown(r: dict) -> str:
    m, s = r["machine"], r["store"]
    lines = [
        "# Decode throughput: forward pass of 1024-row reads",
        "",
        f"{r['date']}, commit {r['commit']}, {m['cpu']} ({m['cores']} cores, {m['ram_gib']} GiB), Python {m['python']}; "
        f"load average {r['load_avg_before_after'][0]} before, {r['load_avg_before_after'][1]} after.",
        "",
        f"Store: {s['rows']:,} x {s['features']} {s['dtype']} ({s['bytes'] / 1e9:.2f} GB decoded, "
        f"{s['stored_bytes'] / 1e9:.2f} GB on disk), chunks {s['chunks']}, codecs {', '.join(s['codecs'])}; "
        "warm page cache. GB/s of decoded bytes, median of "
        f"{r['repeats']} runs. ParallelBandReader defaults here: {r['reader_defaults_here']}.",
        "",
        "| variant | GB/s (median) | seconds |",
        "| --- | --- | --- |",
    ]
    for x in r["results"]:
        lines.append(f"| {x['variant']} | {x['gbps']:.2f} | {', '.join(f'{t:.3f}' for t in x['seconds'])} |")
    cores = os.cpu_count() or 1
    where = (
        f"A {cores}-core machine: threads beyond {cores} cannot add decode throughput here. "
        if cores <= 2
        else ""
    )
    lines += [
        "",
        where + "For comparison, FACTS.md records 22.3 GB/s on the 16-core GPU machine for 16 threads",
        "decoding chunk files into pinned buffers by hand (no reader around them).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
