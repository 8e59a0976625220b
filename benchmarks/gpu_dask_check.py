"""GPU: the engine inside one dask worker against the plain engine (target: within 10%), same output.

    python benchmarks/gpu_dask_check.py --out $OUT/gpu_dask_check.json [--rows 400000 --features 64]

Runs `tsconv.process(device="cuda")` plain and with `workers=1` (a one-GPU local cluster started before
timing, so cluster start-up is excluded, as the report does), each warmed up once then timed `--repeat`
times; records medians and checks the outputs are bitwise identical.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import zarr

# benchmarks/distributed.py would shadow the real `distributed` package.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import tsconv  # noqa: E402
from tsconv.distributed import local_cluster  # noqa: E402
from tsconv.synth import make_ticks  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_dask_check.json")
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--partition-rows", type=int, default=None, help="rows per dask task (default: the engine's)"
    )
    args = ap.parse_args()
    from distributed import Client

    work = Path(tempfile.mkdtemp(prefix="tsconv-dask-gpu-"))
    src = make_ticks(work / "ticks.zarr", rows=args.rows, features=args.features, seed=0)
    times: dict[str, list[float]] = {"plain": [], "dask_1_worker": []}
    cluster, _ = local_cluster(1, "cuda")
    with Client(cluster) as client:
        for name in ["plain", "dask_1_worker", "plain", "dask_1_worker"] + ["plain", "dask_1_worker"] * (
            args.repeat - 1
        ):
            kw = {"client": client, "partition_rows": args.partition_rows} if name != "plain" else {}
            r = tsconv.process(src, work / f"{name}.zarr", device="cuda", overwrite=True, **kw)
            times[name].append(r.seconds)
            print(name, f"{r.seconds:.3f} s", r.device, flush=True)
    for name in times:
        times[name] = times[name][1:]  # first run of each warms up (compile, autotune cache, allocator)
    a = np.asarray(zarr.open_group(str(work / "plain.zarr"))["values"][:])
    b = np.asarray(zarr.open_group(str(work / "dask_1_worker.zarr"))["values"][:])
    same = bool(np.array_equal(a, b, equal_nan=True))
    # The batched GPU engine centres each step on its own level, and dask tasks start steps at their
    # partition's first row: the outputs agree to float32 rounding, not bit for bit (the CPU engine's are).
    nan_same = bool(np.array_equal(np.isnan(a), np.isnan(b)))
    scale = np.nanmax(np.abs(a), axis=0, keepdims=True) + 1e-30
    rel = float(np.nanmax(np.abs(a - b) / scale))
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["dask_1_worker"] / med["plain"]
    doc = {
        "gpu": torch.cuda.get_device_name(0),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "commit": os.environ.get("TSCONV_COMMIT", "unknown"),
        "rows": args.rows,
        "features": args.features,
        "pipeline": "default",
        "partition_rows": args.partition_rows,
        "seconds": times,
        "median_seconds": med,
        "dask_over_plain": round(ratio, 3),
        "within_10_percent": ratio <= 1.10,
        "identical_output": same,
        "nan_pattern_equal": nan_same,
        "max_diff_over_column_scale": rel,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc))
    return 0 if nan_same and rel < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
