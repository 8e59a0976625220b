"""What holds the GPU engine's reserved memory at its peak: one fresh process per variant.

Claim measured: a CUDA run stays within its GPU memory budget (1.2 GB by default), allocated and reserved,
and every reserved segment at the peak is accounted for by the tsconv frame that made it
(benchmarks/NOTES.md, "GPU memory and the step budget"). GPU only.

    python benchmarks/diag/gpu_memory.py --out $OUT/gpu_memory.json [--variants default,nograph,...]
        [--rows 1048576 --features 1024]

Each variant runs in its own process (so nothing cached by an earlier one counts): one warm-up run of
``tsconv.process`` on the e2e store and pipeline, then ``--repeats`` runs (seconds, peak allocated and
reserved), the last under ``torch.cuda.memory._record_memory_history``. From that trace the script
rebuilds the reserved total over the run and lists, at its peak, each live segment (size, and the
tsconv frames of the allocation that made it) and the live blocks grouped by where they were allocated.

Variants are the child process's environment settings, or its ``tsconv.process`` options:
``nograph`` (TSCONV_CUDA_GRAPH=0), ``expandable`` (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True),
``keepcache`` (TSCONV_EMPTY_CACHE=0: no emptying of the allocator's cache at the start of a run), ``fresh``
(TSCONV_CACHE_DIR an empty autotune cache: the first run tunes), ``cpudecode`` (``decode="cpu"``: the CPU
reader); combine them with ``+``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

ENV = {
    "nograph": {"TSCONV_CUDA_GRAPH": "0"},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "keepcache": {"TSCONV_EMPTY_CACHE": "0"},
}


def variant_env(name: str) -> tuple[dict[str, str], list[str]]:
    """A variant's environment for the child process, and the child's extra arguments."""
    env: dict[str, str] = {}
    argv: list[str] = []
    for part in name.split("+"):
        if part == "default":
            continue
        if part == "cpudecode":
            argv += ["--decode", "cpu"]
        elif part == "fresh":  # an empty autotune cache: the first run tunes every kernel it launches
            import tempfile

            env["TSCONV_CACHE_DIR"] = tempfile.mkdtemp(prefix="tsconv-tune-")
        elif part in ENV:
            env.update(ENV[part])
        else:
            raise SystemExit(f"unknown variant {part!r}")
    return env, argv


def _where(frames: list[dict[str, Any]] | None) -> str:
    """The innermost tsconv frames of an allocation's stack, outermost last."""
    out = []
    for f in frames or []:
        name = f.get("filename", "")
        if "tsconv" in name and "/diag/" not in name:
            out.append(f"{name.split('tsconv/')[-1]}:{f.get('line')}:{f.get('name')}")
        if len(out) == 3:
            break
    return " < ".join(out) or "(no tsconv frame)"


def analyse(before: dict[str, Any], snap: dict[str, Any]) -> dict[str, Any]:
    """The reserved total over the traced run and what was live at its peak."""
    segs: dict[int, tuple[int, str]] = {}
    for s in before["segments"]:
        segs[s["address"]] = (s["total_size"], "before the run")
    blocks: dict[int, tuple[int, str]] = {}
    for s in before["segments"]:
        for b in s["blocks"]:
            if b["state"] == "active_allocated":
                blocks[b["address"]] = (b["size"], "before the run: " + _where(b.get("frames")))
    reserved = sum(v[0] for v in segs.values())
    peak, at_peak = reserved, (dict(segs), dict(blocks))
    start = reserved
    events = snap["device_traces"][0]
    seen = before["device_traces"][0]
    if seen and len(events) >= len(seen) and events[len(seen) - 1] == seen[-1]:
        events = events[len(seen) :]  # the trace of the earlier runs, already in ``before``'s state
    for e in events:
        act = e["action"]
        if act == "segment_alloc":
            segs[e["addr"]] = (e["size"], _where(e.get("frames")))
            reserved += e["size"]
            if reserved > peak:
                peak, at_peak = reserved, (dict(segs), dict(blocks))
        elif act == "segment_free":
            if e["addr"] in segs:
                reserved -= segs.pop(e["addr"])[0]
        elif act == "alloc":
            blocks[e["addr"]] = (e["size"], _where(e.get("frames")))
        elif act == "free_completed":
            blocks.pop(e["addr"], None)
    seg_list = sorted(({"bytes": v[0], "made_by": v[1]} for v in at_peak[0].values()),
                      key=lambda d: -d["bytes"])  # fmt: skip
    by_site: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for size, where in at_peak[1].values():
        by_site[where][0] += size
        by_site[where][1] += 1
    return {
        "reserved_at_start": start,
        "peak_reserved_traced": peak,
        "allocated_at_peak": sum(v[0] for v in at_peak[1].values()),
        "segments_at_peak": seg_list,
        "blocks_at_peak_by_site": sorted(
            ({"bytes": v[0], "count": v[1], "site": k} for k, v in by_site.items()), key=lambda d: -d["bytes"]
        ),
        "pools_at_end_of_loop": None,
    }


def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from e2e import write_pipeline

    import tsconv
    from tsconv.engine import batched

    work = Path(args.work)
    src = work / f"ticks_{args.rows}x{args.features}.zarr"
    pipe = write_pipeline(work / "pipe", args.features)
    out = work / "out.zarr"

    pools: list[Any] = []
    release = batched._StepGraph.release

    def spy(self: Any) -> bool:  # the pools live at the end of the loop, before the graph is dropped
        if not pools:
            pools.append(
                sorted(
                    ({"pool": str(s.get("segment_pool_id")), "bytes": s["total_size"],
                      "allocated": s["allocated_size"]} for s in torch.cuda.memory_snapshot()),
                    key=lambda d: -d["bytes"],
                )
            )  # fmt: skip
        return release(self)

    batched._StepGraph.release = spy  # type: ignore[method-assign]

    def run() -> dict[str, Any]:
        rep = tsconv.process(
            src, out, pipeline=pipe, device="cuda", overwrite=True, decode=args.decode
        ).to_dict()
        return {k: rep.get(k) for k in ("seconds", "peak_gpu_allocated_bytes", "peak_gpu_reserved_bytes",
                                         "step_rows", "cuda_graph", "reader")}  # fmt: skip

    # recorded from the start, so the blocks that outlive a run carry the frames that made them
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    first = run()
    reps = [run() for _ in range(args.repeats)]
    torch.cuda.synchronize()
    before = torch.cuda.memory._snapshot()
    pools.clear()
    traced = run()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    res = analyse(before, snap)
    res["pools_at_end_of_loop"] = pools[0] if pools else None
    return {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "first_run": first,
        "runs": reps,
        "traced_run": traced,
        "seconds_median": statistics.median(r["seconds"] for r in reps),
        "peak_allocated_max": max(r["peak_gpu_allocated_bytes"] for r in reps),
        "peak_reserved_max": max(r["peak_gpu_reserved_bytes"] for r in reps),
        "trace": res,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default="default,nograph,expandable")
    ap.add_argument("--rows", type=int, default=1 << 20)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", default="/tmp/tsconv-e2e")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--decode", default=None, help=argparse.SUPPRESS)  # the child's process(decode=...)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0
    from provenance import commit, machine

    from tsconv.synth import make_ticks

    work = Path(args.work)
    src = work / f"ticks_{args.rows}x{args.features}.zarr"
    if not src.exists():
        t0 = time.perf_counter()
        make_ticks(src, rows=args.rows, features=args.features, seed=0)
        print(f"generated {src.name} in {time.perf_counter() - t0:.1f} s", flush=True)
    doc: dict[str, Any] = {"machine": machine(), "commit": commit(), "rows": args.rows,
                           "features": args.features, "variants": {}}  # fmt: skip
    for v in args.variants.split(","):
        extra_env, extra_argv = variant_env(v)
        env = {**os.environ, **extra_env}
        cmd = [sys.executable, __file__, "--child", "--out", args.out, "--rows", str(args.rows),
               "--features", str(args.features), "--repeats", str(args.repeats), "--work", args.work,
               *extra_argv]  # fmt: skip
        t0 = time.perf_counter()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            doc["variants"][v] = {"error": (p.stderr or p.stdout)[-3000:]}
            print(v, "FAILED", (p.stderr or "")[-800:], flush=True)
        else:
            r = json.loads(line[7:])
            doc["variants"][v] = r
            t = r["trace"]
            print(f"{v}: {r['seconds_median']:.3f} s, allocated {r['peak_allocated_max']:,}, reserved "
                  f"{r['peak_reserved_max']:,} (traced {t['peak_reserved_traced']:,}), {r['runs'][0]['cuda_graph']}, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
            for s in t["segments_at_peak"][:12]:
                print(f"    seg {s['bytes'] / 2**20:8.1f} MiB  {s['made_by']}", flush=True)
            for b in t["blocks_at_peak_by_site"][:16]:
                print(f"    blk {b['bytes'] / 2**20:8.1f} MiB x{b['count']}  {b['site']}", flush=True)
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
