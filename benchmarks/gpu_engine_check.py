"""GPU check of the engine: `process(device="cuda")` equals the CPU engine and the float64 reference.

    python benchmarks/gpu_engine_check.py --out $OUT/gpu_engine_check.json [--rows 200000 --features 64]

For each pipeline: runs the CPU and the CUDA engine on the same synthetic store, compares both with the
float64 whole-series reference (NaN pattern identical, max error relative to each column's scale), and
records seconds, rows/s and peak GPU memory. Exits non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import zarr

import tsconv
from tsconv.kernels.reference import pipeline_reference
from tsconv.pipeline.spec import load_pipeline, resolve
from tsconv.synth import make_ticks

ROOT = Path(__file__).resolve().parents[1]


def _rel_err(y: np.ndarray, ref: np.ndarray) -> float:
    ok = ~np.isnan(ref)
    scale = np.nanmax(np.abs(ref), axis=0, keepdims=True) + 1e-30
    return float(np.max(np.abs(y.astype(np.float64) - ref)[ok] / np.broadcast_to(scale, ref.shape)[ok]))


def _worst_columns(y: np.ndarray, ref: np.ndarray, names: tuple[str, ...], n: int = 3) -> list[list]:
    """The ``n`` output columns with the largest error (the metric of ``_rel_err``, per column)."""
    scale = np.nanmax(np.abs(ref), axis=0) + 1e-30
    err = np.abs(y.astype(np.float64) - ref) / scale
    per_col = np.nanmax(np.where(np.isnan(ref), np.nan, err), axis=0)
    order = np.argsort(np.nan_to_num(per_col, nan=-1.0))[::-1][:n]
    return [[names[j], float(per_col[j])] for j in order]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_engine_check.json")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--pipelines", default="default,trend_ema,multiscale,dense_head", help="comma list")
    ap.add_argument(
        "--no-recenter",
        action="store_true",
        help="A/B: the CUDA engine without conv1d's per-block recentering",
    )
    args = ap.parse_args()
    if args.no_recenter:
        from tsconv.engine.compute import Backend

        init = Backend.__init__

        def no_recenter(self, *a, **kw) -> None:  # noqa: ANN001, ANN002, ANN003
            init(self, *a, **kw)
            self.recenter_first = False

        Backend.__init__ = no_recenter
    work = Path(tempfile.mkdtemp(prefix="tsconv-gpu-"))
    src = make_ticks(work / "ticks.zarr", rows=args.rows, features=args.features, seed=0)
    x = np.asarray(zarr.open_group(str(src))["values"][:])
    names = zarr.open_group(str(src)).attrs["features"]
    results, ok = [], True
    for name in args.pipelines.split(","):
        if name == "dense_head" and args.features != 64:
            continue
        pipe = load_pipeline(ROOT / "pipelines" / f"{name}.toml")
        plan = resolve(pipe, names)
        ref = pipeline_reference(x, plan)
        rec = {"pipeline": name, "rows": args.rows, "features": args.features, "outputs": plan.n_outputs,
               "recenter": not args.no_recenter}  # fmt: skip
        outs = {}
        for device in ["cpu", "cuda"]:
            out = work / f"{name}-{device}.zarr"
            tsconv.process(src, out, pipeline=pipe, device=device)  # warm-up run (allocator, cuDNN plans)
            r = tsconv.process(src, out, pipeline=pipe, device=device, overwrite=True)
            y = np.asarray(zarr.open_group(str(out))["values"][:])
            outs[device] = y
            same_nan = bool(np.array_equal(np.isnan(y), np.isnan(ref)))
            rec[device] = {
                "seconds": round(r.seconds, 3),
                "rows_per_s": round(r.rows_per_s),
                "rel_err_vs_float64": _rel_err(y, ref),
                "nan_pattern_equal": same_nan,
                "worst_columns": _worst_columns(y, ref, plan.output_names),
                "peak_gpu_allocated_mib": None
                if r.peak_gpu_allocated_bytes is None
                else round(r.peak_gpu_allocated_bytes / 2**20, 1),
            }
            ok &= same_nan
        rec["cuda_vs_cpu_rel"] = _rel_err(outs["cuda"], outs["cpu"].astype(np.float64))
        passed = rec["cuda"]["rel_err_vs_float64"] <= max(4 * rec["cpu"]["rel_err_vs_float64"], 1e-6)
        rec["pass"] = bool(passed and rec["cuda"]["nan_pattern_equal"])
        ok &= rec["pass"]
        results.append(rec)
        print(("PASS " if rec["pass"] else "FAIL ") + json.dumps(rec), flush=True)
        _write(args.out, results)  # after every pipeline: a timeout keeps what was checked
    return 0 if ok else 1


def _write(path: str, results: list[dict]) -> None:
    commit = os.environ.get("TSCONV_COMMIT")
    if not commit:
        try:
            commit = subprocess.check_output(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True
            ).strip()
        except Exception:  # noqa: BLE001
            commit = "unknown"
    doc = {
        "gpu": torch.cuda.get_device_name(0),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit,
        "torch": torch.__version__,
        "results": results,
    }
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
