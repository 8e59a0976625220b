"""Where the batched engine thread's host time goes: cProfile of the main thread over warm runs.

    python benchmarks/engine_profile.py --out $OUT/engine_profile.txt [--rows 1048576 --features 1024]

Makes (or reuses) the issue-5 store and the e2e pipeline (as benchmarks/engine_trace.py), runs the job
once to warm the page cache, the kernels and the tuning cache, then ``--runs`` runs with cProfile on the
calling thread (the engine's loop; the reading and writing threads are not profiled). Writes the
functions with the most own time and the most cumulative time. cProfile inflates Python time: read the
proportions, and the run times printed without the profiler beside them.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import tsconv  # noqa: E402
from tsconv.synth import make_ticks  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tsconv-e2e"))
    ap.add_argument("--rows", type=int, default=1 << 20)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--top", type=int, default=45)
    args = ap.parse_args()
    from e2e import write_pipeline

    args.work.mkdir(parents=True, exist_ok=True)
    src = args.work / f"ticks_{args.rows}x{args.features}_16mb.zarr"
    if not src.exists():
        make_ticks(src, rows=args.rows, features=args.features, seed=0)
    pipe = write_pipeline(args.work / "pipe", args.features)
    out = args.work / "profile_out.zarr"
    kw = {"device": "cuda", "overwrite": True, "pipeline": pipe}
    tsconv.process(src, out, **kw)
    plain = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        tsconv.process(src, out, **kw)
        plain.append(time.perf_counter() - t0)
    prof = cProfile.Profile()
    profiled = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        prof.enable()
        tsconv.process(src, out, **kw)
        prof.disable()
        profiled.append(time.perf_counter() - t0)
    buf = io.StringIO()
    buf.write(f"runs without the profiler: {', '.join(f'{s:.3f}' for s in plain)} s\n")
    buf.write(f"runs with it: {', '.join(f'{s:.3f}' for s in profiled)} s\n\n")
    for key in ("tottime", "cumulative"):
        buf.write(f"===== by {key}\n")
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(args.top)
    args.out.write_text(buf.getvalue())
    print(buf.getvalue()[:3000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
