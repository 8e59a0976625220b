"""GPU: the engine inside dask workers against the plain engine on one GPU, same output.

Claim measured: one dask worker runs within 10% of the plain engine, N workers (one per GPU) scale the
throughput, and the outputs agree (benchmarks/NOTES.md, "dask and several GPUs"). GPU only.

    python benchmarks/gpu_dask_check.py --out $OUT/gpu_dask_check.json [--rows 400000 --features 64]
    python benchmarks/gpu_dask_check.py --workers 2 --src STORE --pipeline TOML --out ...   # 2 GPUs

One worker (issue 7): within 10% of the plain engine. N workers, one per GPU (issue 8): throughput
against one GPU (``speedup_over_one_gpu``), with each task's engine stages in ``dask_phases``.

Runs `tsconv.process(device="cuda")` plain and with `workers=1` (a one-GPU local cluster started before
timing, so cluster start-up is excluded, as the report does), each warmed up once then timed `--repeat`
times; records medians and checks the outputs are bitwise identical.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import zarr

# benchmarks/distributed.py would shadow the real `distributed` package.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]


def commit() -> str:
    """benchmarks/provenance.py's commit(), loaded by path (this folder is off sys.path, see above)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("provenance", Path(__file__).with_name("provenance.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.commit()


import tsconv  # noqa: E402
from tsconv.engine.cluster import local_cluster  # noqa: E402
from tsconv.synth import make_ticks  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_dask_check.json")
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1, help="dask workers, one per GPU (2 on a 2-GPU machine)")
    ap.add_argument("--src", type=Path, default=None, help="an existing store (default: generate one)")
    ap.add_argument("--pipeline", type=Path, default=None, help="pipeline file (default: the default one)")
    ap.add_argument(
        "--partition-rows", type=int, default=None, help="rows per dask task (default: the engine's)"
    )
    args = ap.parse_args()
    from distributed import Client

    work = Path(tempfile.mkdtemp(prefix="tsconv-dask-gpu-"))
    src = args.src or make_ticks(work / "ticks.zarr", rows=args.rows, features=args.features, seed=0)
    dname = "dask_1_worker" if args.workers == 1 else f"dask_{args.workers}_workers"
    names = ["plain", "plain_thread", dname] if args.workers == 1 else ["plain", dname]
    times: dict[str, list[float]] = {k: [] for k in names}
    phases: dict[str, list[dict]] = {k: [] for k in names}  # a dask run's task phases, dispatch, collect
    cluster, _ = local_cluster(args.workers, "cuda")
    with Client(cluster) as client:
        order = [n for n in names if n != dname] * (args.repeat + 1)
        order += ["plain", dname] * (args.repeat + 1)
        for name in order:
            kw = {"client": client, "partition_rows": args.partition_rows} if name.startswith("dask") else {}
            out = work / f"{name}.zarr"
            if name == "plain_thread":  # the plain engine in a non-main thread, as a dask task runs
                with ThreadPoolExecutor(1) as pool:
                    r = pool.submit(tsconv.process, src, out, device="cuda", overwrite=True,
                                    pipeline=args.pipeline).result()  # fmt: skip
            else:
                r = tsconv.process(src, out, device="cuda", overwrite=True, pipeline=args.pipeline, **kw)
            times[name].append(r.seconds)
            if name.startswith("dask"):
                phases[name].append(r.stage_seconds)
            print(name, f"{r.seconds:.3f} s", r.device, flush=True)
    for name in times:
        times[name] = times[name][1:]  # first run of each warms up (compile, autotune cache, allocator)
    a = np.asarray(zarr.open_group(str(work / "plain.zarr"))["values"][:])
    b = np.asarray(zarr.open_group(str(work / f"{dname}.zarr"))["values"][:])
    same = bool(np.array_equal(a, b, equal_nan=True))
    # The batched GPU engine centres each step on its own level, and dask tasks start steps at their
    # partition's first row: the outputs agree to float32 rounding, not bit for bit (the CPU engine's are).
    nan_same = bool(np.array_equal(np.isnan(a), np.isnan(b)))
    scale = np.nanmax(np.abs(a), axis=0, keepdims=True) + 1e-30
    rel = float(np.nanmax(np.abs(a - b) / scale))
    med = {k: statistics.median(v) for k, v in times.items()}
    v = zarr.open_group(str(src), mode="r")["values"]
    nbytes = int(v.shape[0]) * int(v.shape[1]) * v.dtype.itemsize
    ratio = med[dname] / med["plain"]
    speedup = med["plain"] / med[dname]
    doc = {
        "gpu": torch.cuda.get_device_name(0),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "commit": commit(),
        "input": str(src),
        "input_bytes": nbytes,
        "pipeline": str(args.pipeline) if args.pipeline else "default",
        "partition_rows": args.partition_rows,
        "seconds": times,
        "median_seconds": med,
        "dask_phases": phases,
        "workers": args.workers,
        "gpus": torch.cuda.device_count(),
        "dask_over_plain": round(ratio, 3),
        "speedup_over_one_gpu": round(speedup, 3),
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
