"""How the batched engine's error grows with its step: one centering level per feature and step (CPU only).

The batched (GPU) engine centers each step's input on one level per feature (the last value before the
step) and folds the level back into the first stage's bias; the chunked CPU engine does the same per
1024-row chunk. Over a long step a random walk drifts far from its level, and a long zero-sum filter
(``dev:256`` in the default pipeline) then sums larger values and loses digits. This script runs the
batched engine's loop on CPU tensors (its prepare kernel through the Triton interpreter, the convs on
torch's float32 CPU path, so no GPU kernel is involved) at several step sizes, on the store and pipeline
of ``gpu_engine_check.py``, and prints each run's error against float64 next to the CPU engine's, with
that script's metric (max |y - ref| over each column's max |ref|). The CUDA engine no longer shows this
error: its first stage runs conv1d with ``recenter=True`` (per-block levels, benchmarks/NOTES.md, seventh
session), which torch's CPU convs here do not do, so this script measures the step-level centering alone.

    python benchmarks/batched_centering.py --rows 70000 --steps 1024,16384,65536   # about 15 min on 2 cores
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the prepare kernel runs on CPU tensors

import numpy as np  # noqa: E402
import torch  # noqa: E402
import zarr  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from gpu_engine_check import _rel_err  # noqa: E402

import tsconv  # noqa: E402
from tsconv.engine.batched import run_batched  # noqa: E402
from tsconv.engine.compute import Backend  # noqa: E402
from tsconv.io.readers.blocks import ArraySource  # noqa: E402
from tsconv.kernels import common  # noqa: E402
from tsconv.kernels.reference import pipeline_reference  # noqa: E402
from tsconv.pipeline.spec import load_pipeline, resolve  # noqa: E402
from tsconv.synth import make_ticks  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=70_000)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--pipeline", default="default", help="a pipelines/ name")
    ap.add_argument("--steps", default="1024,16384,65536", help="comma-separated step_rows")
    args = ap.parse_args()
    common.INTERPRETED = False  # the convs take torch's CPU path: only the engine's arithmetic differs

    work = Path(tempfile.mkdtemp(prefix="tsconv-centering-"))
    src = make_ticks(work / "ticks.zarr", rows=args.rows, features=args.features, seed=0)
    x = np.asarray(zarr.open_group(str(src))["values"][:])
    names = zarr.open_group(str(src)).attrs["features"]
    pipe = load_pipeline(HERE.parent / "pipelines" / f"{args.pipeline}.toml")
    plan = resolve(pipe, names)
    ref = pipeline_reference(x, plan)
    tsconv.process(src, work / "cpu.zarr", pipeline=pipe, device="cpu")
    y_cpu = np.asarray(zarr.open_group(str(work / "cpu.zarr"))["values"][:])
    print(f"CPU engine (1024-row chunks): {_rel_err(y_cpu, ref):.3g}", flush=True)
    for step in (int(s) for s in args.steps.split(",")):
        out: list[np.ndarray] = []
        backend = Backend(plan, torch.device("cpu"))
        run_batched(ArraySource(x, band_rows=4096), plan, backend, lambda a, out=out: out.append(a.copy()),
                    start=0, step_rows=step, warmup="nan")  # fmt: skip
        print(f"batched engine, step_rows={step}: {_rel_err(np.concatenate(out), ref):.3g}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
