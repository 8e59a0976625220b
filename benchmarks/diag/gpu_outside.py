"""What a fresh `tsconv process` holds on the GPU outside torch's allocator, per built-in pipeline.

Claim measured: the share of ``--gpu-mem`` planned for the CUDA context and kernels
(``tsconv.engine.devmem.outside_torch``: NVML's entry for the process at planning, beyond torch's
reservation, plus ``LATER_MODULES_BYTES`` for the kernels a run loads afterwards) covers what the process
holds outside torch at the end of its loop, for every built-in pipeline and a dense one, at the default
budget (benchmarks/NOTES.md, section 6). GPU only.

    python benchmarks/diag/gpu_outside.py --out $OUT/gpu_outside.json [--work /tmp/go]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from provenance import commit, machine  # noqa: E402

PIPELINES = ("default", "trend_ema", "multiscale", "dense_head", "returns_zscore")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tsconv-outside"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gpu-mem", default="1.2GB")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    from tsconv.engine import devmem
    from tsconv.synth import make_ticks

    src = args.work / "in.zarr"
    if not src.exists():
        make_ticks(src, rows=1 << 20, features=128, seed=5)
    result = {"benchmark": "diag/gpu_outside", "commit": commit(), "machine": machine(),
              "later_modules_bytes": devmem.LATER_MODULES_BYTES, "gpu_mem": args.gpu_mem, "runs": []}  # fmt: skip
    for pipe in PIPELINES:
        report = args.work / f"{pipe}.json"
        cmd = [sys.executable, "-m", "tsconv", "process", "-i", str(src), "-o", str(args.work / "out.zarr"),
               "--pipeline", pipe, "--device", "cuda", "--overwrite", "-q", "--gpu-mem", args.gpu_mem,
               "--report", str(report)]  # fmt: skip
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            result["runs"].append({"pipeline": pipe, "error": p.stderr[-1500:]})
            continue
        r = json.loads(report.read_text())
        held, planned, reserved = (
            r["gpu_process_bytes"],
            r["gpu_outside_torch_bytes"],
            r["peak_gpu_reserved_bytes"],
        )
        row = {"pipeline": pipe, "gpu_process_bytes": held, "gpu_outside_torch_bytes": planned,
               "peak_reserved_bytes": reserved, "seconds": r["seconds"], "step_rows": r["step_rows"]}  # fmt: skip
        if held is not None:
            row["outside_at_end_bytes"] = held - reserved
            row["loaded_after_planning_bytes"] = held - reserved - (planned - devmem.LATER_MODULES_BYTES)
        result["runs"].append(row)
        print(json.dumps(row), flush=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
