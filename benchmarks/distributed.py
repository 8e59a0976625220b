"""Scale-out on dask: `tsconv process` single-process vs a LocalCluster of 1 and 2 workers, same store.

Claim measured: on the CPU, a job split over dask workers gives the single process's output bit for bit;
the timings show what the workers cost or gain against the single process (benchmarks/NOTES.md, "dask on
the VM"; the GPU counterpart is gpu_dask_check.py).

Each variant runs once in a fresh process on a synthetic tick store (tsconv.synth.make_ticks) with the
default pipeline. Recorded: wall seconds of the whole call (cluster start-up included), the report's
seconds (partitions only, from submit to the last result), rows/s of both, peak RSS (max over workers),
and whether the output equals the single-process one bit for bit.

    python benchmarks/distributed.py                         # 400000x64, variants single,1,2
    python benchmarks/distributed.py --size 1000000x64 --workers 1,2,4
    python benchmarks/distributed.py --size 20000x8 --workers 0,1 --out /tmp/distributed   # a smoke test

Writes OUT.json and OUT.md (default benchmarks/results/distributed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
# This file is named like the dask.distributed package: keep its folder off the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]


def _child(src: str, out: str, chunk: int, workers: int, device: str) -> dict:
    import tsconv

    t0 = time.perf_counter()
    r = tsconv.process(src, out, chunk=chunk, overwrite=True, workers=workers or None, device=device)
    wall = time.perf_counter() - t0
    return {
        "wall_seconds": wall,
        "seconds": r.seconds,
        "peak_rss_bytes": r.peak_rss_bytes,
        "device": r.device,
    }


def _equal(a: str, b: str) -> bool:
    import numpy as np
    import zarr

    va, vb = zarr.open_group(a, mode="r")["values"], zarr.open_group(b, mode="r")["values"]
    step = 65536
    return all(
        np.array_equal(np.asarray(va[s : s + step]), np.asarray(vb[s : s + step]), equal_nan=True)
        for s in range(0, va.shape[0], step)
    )


def _commit() -> str:
    if os.environ.get("TSCONV_COMMIT"):  # the GPU machine's copy may carry stale git metadata
        return os.environ["TSCONV_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True).strip()
    except Exception:
        return os.environ.get("TSCONV_COMMIT", "unknown")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="400000x64", help="ROWSxFEATURES")
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--workers", default="0,1,2", help="comma-separated; 0 = single process, no dask")
    ap.add_argument("--workdir", default=None, help="where to put the stores (default: a temp dir)")
    ap.add_argument(
        "--device", default="cpu", choices=("cpu", "auto", "cuda"), help="tsconv.process(device=...)"
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "distributed", help="writes OUT.json and OUT.md")
    ap.add_argument(
        "--child", nargs=5, metavar=("SRC", "OUT", "CHUNK", "WORKERS", "DEVICE"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.child:
        src, out, chunk, workers, device = args.child
        print(json.dumps(_child(src, out, int(chunk), int(workers), device)))
        return

    from tsconv.synth import make_ticks

    rows, feats = (int(v) for v in args.size.lower().split("x"))
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tsconv-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"ticks-{rows}x{feats}.zarr"
    if not src.exists():
        make_ticks(src, rows=rows, features=feats, seed=0)
    records, outs = [], {}
    for w in (int(v) for v in args.workers.split(",")):
        out = work / f"out-{w}.zarr"
        shutil.rmtree(out, ignore_errors=True)
        res = subprocess.run(
            [sys.executable, __file__, "--child", str(src), str(out), str(args.chunk), str(w), args.device],
            capture_output=True,
            text=True,
        )
        if res.returncode:
            sys.exit(res.stderr)
        fig = json.loads(res.stdout.strip().splitlines()[-1])
        outs[w] = out
        rec = {
            "variant": "single process" if w == 0 else f"dask, {w} worker{'s' if w > 1 else ''}",
            "workers": w,
            "rows": rows,
            "features": feats,
            "chunk": args.chunk,
            "device": fig["device"],
            "wall_seconds": round(fig["wall_seconds"], 2),
            "wall_rows_per_s": round(rows / fig["wall_seconds"]),
            "compute_seconds": round(fig["seconds"], 2),
            "compute_rows_per_s": round(rows / fig["seconds"]),
            "peak_rss_mib": round(fig["peak_rss_bytes"] / 2**20),
        }
        records.append(rec)
        print(json.dumps(rec), flush=True)
    base = outs[min(outs)]
    for r in records:
        r["identical_to_first"] = _equal(str(base), str(outs[r["workers"]]))
    first = records[0]
    for r in records:
        r["speedup_wall"] = round(first["wall_seconds"] / r["wall_seconds"], 2)
        r["speedup_compute"] = round(first["compute_seconds"] / r["compute_seconds"], 2)
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        for out in outs.values():
            shutil.rmtree(out, ignore_errors=True)
    meta = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()})",
        "gpu": None if args.device == "cpu" else "see each row's device",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "commit": _commit(),
        "pipeline": "default (diff:1, diff:32, diff:256, dev:32, dev:256 per feature; K=257, D=5F)",
        "note": "dask workers: one thread each, torch threads = cpu_count // workers; "
        "single process: torch's default threads",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({**meta, "results": records}, indent=2) + "\n")
    lines = [
        f"# dask scale-out ({meta['machine']}, {meta['date']}, commit {meta['commit']})",
        "",
        f"Pipeline: {meta['pipeline']}; {rows:,} x {feats} synthetic ticks, chunk {args.chunk}. One run per",
        "variant in a fresh process. Wall: the whole `tsconv.process` call, cluster start-up included;",
        "compute: the report's seconds (submit to last partition). Speed-ups are against the first row.",
        f"{meta['note']}.",
        "",
        "| variant | wall s | wall rows/s | compute s | compute rows/s | speed-up (wall) | speed-up (compute) | peak RSS MiB | identical |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in records:
        lines.append(
            f"| {r['variant']} | {r['wall_seconds']:.2f} | {r['wall_rows_per_s']:,} | {r['compute_seconds']:.2f} | "
            f"{r['compute_rows_per_s']:,} | {r['speedup_wall']:.2f}x | {r['speedup_compute']:.2f}x | "
            f"{r['peak_rss_mib']:,} | {'yes' if r['identical_to_first'] else 'NO'} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
