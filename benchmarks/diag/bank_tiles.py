"""Diagnostic: the fused bank kernel's variants side by side on the GPU (tiles, sub-tiles, warps).

Each variant runs as the batched engine calls a bank (one call per ``--step`` rows plus the halo over the
whole series), timed with CUDA events (median of ``--repeats``), against the memory floor of
``benchmarks/bank_gpu.py`` (float32 in, one float32 output per filter and input value, over the device copy
bandwidth measured in the same run). Every variant's output is compared with the first variant's: bits on
the default bank (tick-grid prices: window sums are exact in float64), the largest difference relative to
each output column's scale otherwise.

    python benchmarks/diag/bank_tiles.py --out $OUT/bank_tiles.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bank_gpu import FILTERS, _prices, _timed, hbm_gbps  # noqa: E402
from provenance import commit, machine  # noqa: E402

OTHER = ("diff:1", "std:20", "zscore:20", "ret:1", "ma:7")
# (name, fused_plan overrides); the first is the reference every other variant is compared with
VARIANTS = [
    ("scan-lanes 2x256 w4", {"sub": 0}),
    ("tiled s8 w4", {"sub": 8}),
    ("tiled s16 w4", {"sub": 16}),
    ("tiled s32 w4", {"sub": 32}),
    ("tiled s16 w2", {"sub": 16, "warps": 2}),
    ("tiled s16 w1", {"sub": 16, "warps": 1}),
    ("tiled s16 w4 r512", {"sub": 16, "rows": 512}),
    ("tiled s8 w2", {"sub": 8, "warps": 2}),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="1048576x100,262144x1024")
    ap.add_argument("--step", type=int, default=65536)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import torch

    from tsconv.kernels.filterbank import bank_halo, fused_plan
    from tsconv.kernels.filterbank_triton import run_fused
    from tsconv.pipeline.filters import filter_spec

    device = torch.device("cuda")
    bw = hbm_gbps(device)
    doc: dict[str, Any] = {
        "benchmark": "diag/bank_tiles", "date": dt.datetime.now(dt.UTC).isoformat(), "commit": commit(),
        "machine": machine(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "hbm_gbps": bw,
        "repeats": args.repeats, "step_rows": args.step, "runs": [],
    }  # fmt: skip
    for specs in (FILTERS, OTHER):
        bank = tuple(filter_spec(s) for s in specs)
        halo = bank_halo(bank, 1)
        for shape in args.shapes.split(","):
            rows, cols = map(int, shape.split("x"))
            x = _prices(rows + halo, cols, device)
            out = torch.empty((rows, cols * len(bank)), device=device)
            floor = rows * cols * 4 * (1 + len(bank)) / (bw * 1e9)
            ref = None
            for name, over in VARIANTS:
                plan = fused_plan.__wrapped__(bank, width=min(cols, 128), **over)

                def series(
                    plan: Any = plan, x: Any = x, out: Any = out, rows: int = rows, halo: int = halo
                ) -> None:
                    for s in range(0, rows, args.step):
                        e = min(s + args.step, rows)
                        run_fused(plan, x[s : e + halo], out[s:e], halo=halo, dilation=1)

                out.fill_(float("nan"))
                series()  # compiles and loads
                torch.cuda.synchronize()
                got = out.clone()
                if ref is None:
                    ref = got
                diff = torch.where(torch.isfinite(ref), (got - ref).abs(), torch.zeros_like(ref))
                scale = (
                    torch.where(torch.isfinite(ref), ref.abs(), torch.zeros_like(ref))
                    .amax(0)
                    .clamp_min(1e-30)
                )
                secs = [_timed(series, device) for _ in range(args.repeats)]
                med = statistics.median(secs)
                row = {
                    "bank": "default" if specs == FILTERS else ",".join(specs), "rows": rows, "features": cols,
                    "variant": name, "plan": repr(plan), "gpu_s": med, "gpu_all_s": secs, "floor_s": floor,
                    "over_floor": med / floor,
                    "bits_equal_first": bool(torch.equal(got.view(torch.int32), ref.view(torch.int32))),
                    "same_nan_inf": bool(torch.equal(torch.isnan(got), torch.isnan(ref))
                                         and torch.equal(torch.isinf(got), torch.isinf(ref))),
                    "max_rel_diff_first": float((diff.amax(0) / scale).max()),
                }  # fmt: skip
                doc["runs"].append(row)
                print(
                    json.dumps({k: v for k, v in row.items() if k not in ("plan", "gpu_all_s")}), flush=True
                )
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
