"""The engine end to end with the GPU reader (TSCONV_GPU_DECODE=1) against the CPU reader, same process.

    python benchmarks/engine_gpu_decode.py --out $OUT/engine_gpu_decode.json [--repeats 3]

On e2e.py's 1,048,576 x 1024 float32 Blosc-lz4 store (16 MB chunks; generated into --work if missing) and
pipeline (conv K=5 -> 256, ReLU, head -> 64, fp32): one warm-up run (tuning), then the two readers
alternately, --repeats times each. Correctness: the two outputs compared (NaN pattern equal, max difference
relative to the output's scale; the readers feed the same bytes, so they should agree exactly).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
import zarr

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from e2e import STEPS, make_ticks, run_engine, write_pipeline  # noqa: E402
from provenance import commit  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tsconv-e2e"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--threads", default="", help="more GPU-reader variants: reading-thread counts (comma list)"
    )
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    src = args.work / f"ticks_{STEPS}x1024_16mb.zarr"
    if not src.exists():
        make_ticks(src, rows=STEPS, features=1024, seed=0)
    pipe = write_pipeline(args.work / "pipe", 1024)
    outs = {"cpu": args.work / "out_cpu.zarr", "gpu": args.work / "out_gpu.zarr"}
    doc: dict = {
        "benchmark": "engine_gpu_decode",
        "gpu": torch.cuda.get_device_name(0),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "store": src.name,
        "runs": {"cpu": [], "gpu": []},
    }
    os.environ["TSCONV_GPU_DECODE"] = "0"
    doc["warmup_seconds"] = run_engine(src, outs["cpu"], pipe)["wall_seconds"]
    os.environ["TSCONV_GPU_DECODE"] = "1"
    doc["warmup_gpu_seconds"] = run_engine(src, outs["gpu"], pipe)["wall_seconds"]
    keep = ("seconds", "wall_seconds", "input_gbps", "peak_gpu_allocated_bytes", "peak_gpu_reserved_bytes",
            "base_gpu_bytes", "stage_seconds", "bound_by", "step_rows")  # fmt: skip
    variants = [("cpu", "0", ""), ("gpu", "1", "")] + [
        (f"gpu_t{t}", "1", t) for t in args.threads.split(",") if t
    ]
    for name, _, _ in variants:
        doc["runs"].setdefault(name, [])
    for _ in range(args.repeats):
        for name, flag, threads in variants:
            os.environ["TSCONV_GPU_DECODE"] = flag
            os.environ["TSCONV_GPU_DECODE_THREADS"] = threads
            rep = run_engine(src, outs.get(name, args.work / f"out_{name}.zarr"), pipe)
            row = {k: rep.get(k) for k in keep}
            doc["runs"][name].append(row)
            print(name, f"{rep['seconds']:.3f} s", f"{rep.get('input_gbps', 0):.2f} GB/s",
                  f"peak {rep['peak_gpu_allocated_bytes'] / 2**20:.0f} MiB", rep.get("bound_by"), flush=True)  # fmt: skip
    a = np.asarray(zarr.open_group(str(outs["cpu"]), mode="r")["values"][:])
    b = np.asarray(zarr.open_group(str(outs["gpu"]), mode="r")["values"][:])
    nan_equal = bool(np.array_equal(np.isnan(a), np.isnan(b)))
    fin = np.isfinite(a) & np.isfinite(b)
    scale = float(np.abs(a[fin]).max()) if fin.any() else 0.0
    diff = float(np.abs(a[fin] - b[fin]).max()) if fin.any() else 0.0
    doc["check"] = {"nan_equal": nan_equal, "max_abs_diff": diff, "scale": scale,
                    "pass": nan_equal and diff <= 1e-6 * max(scale, 1.0)}  # fmt: skip
    med = {k: statistics.median(r["seconds"] for r in v) for k, v in doc["runs"].items()}
    doc["median_seconds"] = med
    doc["speedup"] = med["cpu"] / med["gpu"]
    print("check", doc["check"], "median s", med, f"speedup {doc['speedup']:.2f}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 0 if doc["check"]["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
