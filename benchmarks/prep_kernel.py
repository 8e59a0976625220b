"""The batched engine's input preparation (tsconv.kernels.prepare.prepare) alone on the GPU: kernel time per
piece, in one segment or split into row segments, against the bytes it must move.

    python benchmarks/prep_kernel.py --out $OUT/prep_kernel.json

Pieces of one band (4,096 rows) and of a whole step (65,536 rows) of 1,024 float32 features, price-like
with NaN gaps. Each variant's output is checked equal to the one-segment result first. Timed with CUDA
events around ``--repeats`` back-to-back calls (GPU time per call, host launch cost included when the
GPU outruns the host), and the host time per call alone.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from provenance import commit, machine  # noqa: E402

from tsconv.kernels.prepare import prepare  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--halo", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    dev = torch.device("cuda")
    C, halo = args.features, args.halo
    rng = np.random.default_rng(0)
    doc: dict = {"benchmark": "prep_kernel", "gpu": torch.cuda.get_device_name(0), "commit": commit(),
                 "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "machine": machine(),
                 "features": C, "halo": halo, "cases": []}  # fmt: skip
    for rows in (4096, 65536):
        x = (100 + np.cumsum(rng.normal(0, 0.01, size=(rows, C)), axis=0)).astype(np.float32)
        x[rng.random((rows, C)) < 0.02] = np.nan
        src = torch.from_numpy(x).to(dev)
        st0 = torch.full((C,), 100.0, device=dev)
        outs = {}
        for split in (False, True):
            xc = torch.full((halo + rows, C), float("nan"), device=dev)
            st, lv = st0.clone(), st0.clone()
            cin = torch.zeros((halo, C), device=dev)
            cout = torch.zeros((halo, C), device=dev)

            call = functools.partial(prepare, src, xc=xc, state=st, level=lv, carry_in=cin, carry_out=cout,
                                     off=0, n_step=rows, split=split)  # fmt: skip
            call()
            torch.cuda.synchronize()
            outs[split] = (xc.clone(), st.clone(), lv.clone(), cout.clone())
            ms = []
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                st.copy_(st0)
                lv.copy_(st0)
                a.record()
                t0 = time.perf_counter()
                for _ in range(args.repeats):
                    call()
                host = (time.perf_counter() - t0) / args.repeats
                b.record()
                b.synchronize()
                ms.append(a.elapsed_time(b) / args.repeats)
            moved = rows * C * 4 * 2  # read the piece, write xc (the split variant reads it twice)
            case = {"rows": rows, "split": split, "gpu_ms": statistics.median(ms), "host_ms": host * 1e3,
                    "floor_ms": moved / 4.0e12 * 1e3}  # fmt: skip
            case["gbps"] = rows * C * 4 / case["gpu_ms"] / 1e6
            doc["cases"].append(case)
            print(case, flush=True)
        same = all(torch.equal(a, b) or (a.isnan() == b.isnan()).all() and torch.equal(a.nan_to_num(), b.nan_to_num())
                   for a, b in zip(outs[False], outs[True], strict=True))  # fmt: skip
        doc.setdefault("equal", {})[rows] = bool(same)
        print("equal", rows, same, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if all(doc["equal"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
