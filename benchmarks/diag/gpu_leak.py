"""What keeps an earlier run's GPU tensors alive: runs the engine a few times, then walks the referrers.

    python benchmarks/diag/gpu_leak.py --out $OUT/gpu_leak.json [--rows 65536 --features 1024 --runs 3]

After the runs (and a gc), lists every live CUDA tensor by size with the chain of objects that refer to it
(types and short reprs, up to --depth levels), and the live tsconv Backend objects with theirs.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def chain(obj: object, depth: int, seen: set[int]) -> list:
    if depth == 0:
        return []
    out = []
    for r in gc.get_referrers(obj):
        if isinstance(r, types.FrameType) or id(r) in seen or r is seen:
            continue
        if isinstance(r, list) and len(r) > 1000:  # gc.get_objects() lists of this script
            continue
        seen.add(id(r))
        desc = type(r).__module__ + "." + type(r).__qualname__
        if isinstance(r, dict):
            keys = [k for k, v in r.items() if v is obj][:3]
            desc += f" keys={keys!r:.120}"
        elif isinstance(r, types.FunctionType):
            desc += f" {r.__qualname__}"
        out.append({"ref": desc, "up": chain(r, depth - 1, seen)})
        if len(out) >= 6:
            break
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--work", default="/tmp/tsconv-leak")
    args = ap.parse_args()
    import torch
    from e2e import write_pipeline

    import tsconv
    from tsconv.engine.compute import Backend
    from tsconv.synth import make_ticks

    work = Path(args.work)
    src = work / "s.zarr"
    if not src.exists():
        make_ticks(src, rows=args.rows, features=args.features, seed=0)
    pipe = write_pipeline(work / "pipe", args.features)
    allocated = []
    for _ in range(args.runs):
        tsconv.process(src, work / "o.zarr", pipeline=pipe, device="cuda", overwrite=True)
        gc.collect()
        torch.cuda.synchronize()
        allocated.append(torch.cuda.memory_allocated())
    gc.collect()
    tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]
    backends = [o for o in gc.get_objects() if isinstance(o, Backend)]
    seen: set[int] = {id(tensors), id(backends)}
    doc = {
        "allocated_after_each_run": allocated,
        "backends": len(backends),
        "backend_referrers": [chain(b, args.depth, seen) for b in backends[:2]],
        "tensors": [
            {
                "shape": list(t.shape),
                "dtype": str(t.dtype),
                "bytes": t.untyped_storage().nbytes(),
                "referrers": chain(t, args.depth, seen),
            }
            for t in sorted(tensors, key=lambda t: -t.untyped_storage().nbytes())[:12]
        ],  # fmt: skip
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("allocated_after_each_run", "backends")}))
    print(json.dumps(doc["backend_referrers"], indent=1)[:6000])
    for t in doc["tensors"]:
        print(t["shape"], t["dtype"], t["bytes"], json.dumps(t["referrers"])[:600])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
