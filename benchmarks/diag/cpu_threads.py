"""How the CPU engine's time moves with the bank's thread count on the host at hand.

Claim measured: on a many-core host the CPU engine runs a bank's tiles on ``torch.get_num_threads()``
threads beside the decode and write threads (benchmarks/NOTES.md, section 18); whether fewer bank threads run
faster there. Each measurement is a fresh process with ``OMP_NUM_THREADS`` set (torch's thread count):

* ``process``: ``tsconv process --device cpu`` of a 2,000,000 x 32 zstd store written by plain zarr (the
  update benchmark's store, one symbol not listed yet), the report's ``seconds``;
* ``features``: ``tsconv.features(x, "default", device="cpu")`` on 500,000 x 40 prices (the filters
  benchmark's), the median of 5 calls after one, and polars on all cores in the same process for scale.

    python benchmarks/diag/cpu_threads.py --out $OUT/cpu_threads.json [--threads 16,8,4,2] [--repeats 2]
        [--paths native,torch] [--no-process]

``--paths``: ``features`` per thread count with the compiled bank (``native``, the default where a C compiler
is) and on torch ops (``torch``: ``TSCONV_NATIVE_BANK=0``); polars runs beside the first path on the same
number of threads (``POLARS_MAX_THREADS``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))

import update as U  # noqa: E402
from provenance import commit, machine  # noqa: E402

_FEATURES = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import filters as F
import numpy as np
import tsconv, torch
from tsconv.kernels import filterbank_native
x = F.price_series(500_000, 40)
tsconv.features(x, "default", device="cpu")
runs = []
for _ in range(5):
    t = time.perf_counter(); tsconv.features(x, "default", device="cpu"); runs.append(time.perf_counter() - t)
out = {"torch_threads": torch.get_num_threads(), "native": filterbank_native.native_bank() is not None, "features_s": statistics.median(runs), "features_runs_s": runs}
if sys.argv[2] == "polars":
    import polars as pl
    frame = pl.DataFrame({f"c{i}": x[:, i] for i in range(x.shape[1])})
    F.run_polars(frame)
    pr = []
    for _ in range(5):
        t = time.perf_counter(); F.run_polars(frame); pr.append(time.perf_counter() - t)
    out["polars_s"] = statistics.median(pr)
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", default="16,8,4,2")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tsconv-cpu-threads"))
    ap.add_argument("--paths", default="native", help="bank paths for features: native, torch or both")
    ap.add_argument("--no-process", action="store_true", help="features only")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    src, out, report = args.work / "ticks.zarr", args.work / "out.zarr", args.work / "report.json"
    if not args.no_process:
        x, t = U._series(2_000_000, 32, seed=0, unlisted=1)
        U.write_store(src, x, t, 2_000_000)
    result = {"benchmark": "diag/cpu_threads", "commit": commit(), "machine": machine(), "process": [],
              "features": []}  # fmt: skip
    for n in [int(v) for v in args.threads.split(",")]:
        env = {**os.environ, "OMP_NUM_THREADS": str(n), "POLARS_MAX_THREADS": str(n)}
        secs = []
        for _ in range(0 if args.no_process else args.repeats):
            subprocess.run([sys.executable, "-m", "tsconv", "process", "-i", str(src), "-o", str(out), "--pipeline",
                            "default", "--device", "cpu", "--overwrite", "-q", "--report", str(report)],
                           cwd=ROOT, env=env, check=True)  # fmt: skip
            secs.append(json.loads(report.read_text())["seconds"])
        if secs:
            result["process"].append({"omp_threads": n, "report_s": statistics.median(secs), "runs_s": secs})
        for k, path in enumerate(args.paths.split(",")):
            polars = "polars" if k == 0 else "-"
            penv = {**env, "TSCONV_NATIVE_BANK": "0" if path == "torch" else "1"}
            got = subprocess.run([sys.executable, "-c", _FEATURES, str(HERE.parent), polars],
                                 cwd=ROOT, env=penv, check=True, capture_output=True, text=True)  # fmt: skip
            result["features"].append({"omp_threads": n, "path": path,
                                       **json.loads(got.stdout.strip().splitlines()[-1])})  # fmt: skip
            print(json.dumps({"threads": n, "process_s": statistics.median(secs) if secs else None,
                              **result["features"][-1]}), flush=True)  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
