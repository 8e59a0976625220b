"""What a smaller `--gpu-mem` costs a fresh `tsconv process`, and what nvidia-smi shows for it.

Claim measured: whether the targets of the benchmark of record hold when torch's share of the budget leaves room
for the CUDA context and modules (benchmarks/NOTES.md, section 6: nvidia-smi showed 0.7 GB beyond torch's
reserved memory). For each store of ``benchmarks/cli.py`` named and each budget, fresh `tsconv process` runs
(one to warm the caches, then ``--repeats``): wall, report, torch's peak reserved, nvidia-smi's peak for the
process, rows per step. GPU only.

    python benchmarks/diag/gpu_mem_sweep.py --out $OUT/gpu_mem_sweep.json [--cases a,d] [--budgets 1.2GB,0.5GB]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cli  # noqa: E402
from provenance import commit, machine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="a,d")
    ap.add_argument("--budgets", default="1.2GB,0.7GB,0.5GB,0.4GB")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tsconv-cli"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    cache = args.work / "tuning-cache"
    cache.mkdir(exist_ok=True)
    names = args.cases.split(",")
    stores = cli.write_stores(args.work, names)
    result = {"benchmark": "diag/gpu_mem_sweep", "commit": commit(), "machine": machine(), "runs": []}
    out = args.work / "sweep.zarr"
    for n in names:
        pipe = str(cli.write_dense_pipeline(args.work / "pipe", cli.CASES[n]["features"]))
        for budget in args.budgets.split(","):
            extra = ("--gpu-mem", budget)
            cli.tsconv_run(stores[n], out, pipe, args.work, cache, extra=extra)
            reps = [
                cli.tsconv_run(stores[n], out, pipe, args.work, cache, extra=extra)
                for _ in range(args.repeats)
            ]
            row = {
                "store": n, "gpu_mem": budget,
                **{k: statistics.median(r[k] for r in reps) for k in ("wall_s", "report_s")},
                "peak_reserved_bytes": max(r["peak_reserved_bytes"] or 0 for r in reps),
                "smi_peak_bytes": max(r["smi_peak_bytes"] for r in reps),
                "step_rows": reps[-1]["step_rows"],
                "gpu_process_bytes": max(r["gpu_process_bytes"] or 0 for r in reps) or None,
                "gpu_outside_torch_bytes": reps[-1]["gpu_outside_torch_bytes"],
                "stage_seconds": reps[-1]["stage_seconds"],
            }  # fmt: skip
            result["runs"].append(row)
            print(json.dumps({k: row[k] for k in ("store", "gpu_mem", "wall_s", "report_s", "smi_peak_bytes",
                                                  "peak_reserved_bytes", "gpu_process_bytes", "gpu_outside_torch_bytes")}),
                  flush=True)  # fmt: skip
            args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
