"""Which outputs the fused TMA kernel's fp16 128 x 256 tile (x cast in the kernel) leaves unwritten on the GPU.

    python benchmarks/diag/fused_fp16_tile.py --out $OUT/fused_fp16_tile.json
    compute-sanitizer --tool racecheck python benchmarks/diag/fused_fp16_tile.py --small --out ...

``--stages`` adds the failing tile at other pipeline depths (a race between pipelined shared-memory stages
and the in-kernel cast should vanish at one stage); ``--small`` runs only the smallest shape and the
failing tile (for compute-sanitizer, which is slow).

The tile left NaN outputs on the H200 (tenth session) but runs correctly in the interpreter. For a few
shapes, each tile config runs into a NaN-poisoned output; the script records the NaN fraction, which time
blocks and output columns hold them, and the error against float64 where there are none.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.kernels.test_fused import (  # noqa: E402
    _run_tma,
    head_weights,
    reference,
    relative_error,
    returns,
    vec,
    zero_sum_weights,
)
from tsconv.kernels import fused as fused_mod  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stages", default="", help="comma list of other pipeline depths for the failing tile")
    ap.add_argument("--small", action="store_true", help="the smallest shape and the failing tile only")
    ap.add_argument("--time", type=int, default=0, help="at the largest shape, median ms of this many runs")
    args = ap.parse_args()
    rows = []
    configs = [(128, 256, 64, 8, 3, 0), (128, 256, 64, 8, 3, 1), (64, 128, 64, 4, 4, 0)]
    configs += [(128, 256, 64, 8, int(s), 0) for s in args.stages.split(",") if s]
    shapes = [(1, 128, 300, 256), (4, 256, 1028, 256), (64, 1024, 1028, 256)]
    if args.small:
        configs, shapes = configs[:1], shapes[:1]
    for N, C, L, O in shapes:
        x = returns(N, L, C, seed=3).transpose(1, 2)
        w, hw = zero_sum_weights(O, C, 5), head_weights(O, 64)
        b, hb = vec(O, 1), vec(64, 2)
        ref = reference(x, w, b, hw, hb, activation="relu") if N * C <= 4 * 256 else None
        for bt, bo, bc, warps, stages, a16 in configs:
            cfg = fused_mod._tma_cfg(bt, bo, bc, warps, stages, a16)
            row = {"shape": [N, C, L, O, 64], "config": cfg.name}
            try:
                y = _run_tma(x, w, b, hw, hb, cfg, precision="fp16", activation="relu")
                torch.cuda.synchronize()
                nan = torch.isnan(y)
                row["nan_fraction"] = float(nan.float().mean())
                if nan.any():  # y and nan: [N, L_out, D]
                    steps = nan.any(dim=2).nonzero()  # (series, step) pairs with a NaN output
                    blocks = sorted({int(t) // bt for t in steps[:, 1].tolist()})
                    row["nan_time_blocks"] = blocks[:20] + (["..."] if len(blocks) > 20 else [])
                    row["nan_series"] = sorted({int(n) for n in steps[:, 0].tolist()})[:20]
                    row["nan_steps"] = sorted({int(t) for t in steps[:, 1].tolist()})[:70]
                    row["nan_columns"] = sorted({int(d) for d in nan.any(dim=1).nonzero()[:, 1].tolist()})
                if ref is not None and not nan.any():
                    row["rel_err"] = float(relative_error(y, ref))
                if args.time and N == shapes[-1][0]:
                    times = []
                    for _ in range(args.time):
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record()
                        _run_tma(x, w, b, hw, hb, cfg, precision="fp16", activation="relu")
                        e1.record()
                        e1.synchronize()
                        times.append(e0.elapsed_time(e1))
                    row["median_ms"] = sorted(times)[len(times) // 2]
            except Exception as exc:  # noqa: BLE001 - record and go on
                row["error"] = f"{type(exc).__name__}: {exc}"[:500]
            print(json.dumps(row), flush=True)
            rows.append(row)
    args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
