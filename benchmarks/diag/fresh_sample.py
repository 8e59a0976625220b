"""Where the wall time of a fresh `tsconv process` goes, thread by thread: a sampling profile.

Claim measured: which functions, in which threads, a fresh process spends its report's seconds in that a warm
one does not (benchmarks/NOTES.md, "A fresh `tsconv process` per run"). cProfile sees the main thread only
and counts calls, not waits; this samples every thread's stack every millisecond, so the time a thread spends
blocked in a C call (a CUDA driver call, a lock, a file read) is counted where it happens. GPU only.

    python benchmarks/diag/fresh_sample.py --out $OUT/fresh_sample.json [--work /tmp/fs] [--case a:dense]

One run fills the caches; then one driver process runs the CLI twice (fresh, then warm), sampled. The JSON
holds, per call, the report's stages, the samples (time, thread, stack id) and the stacks, and a summary:
per thread, the functions (file:function, deepest first) that the most samples stood in.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "diag"))

from provenance import commit, machine  # noqa: E402

DRIVER = r"""
import json, sys, threading, time
t_first = time.perf_counter()
out_path, *args = sys.argv[1:]

class Sampler(threading.Thread):
    def __init__(self, interval):
        super().__init__(daemon=True)
        self.interval, self.samples, self.stacks, self.names, self.halt = interval, [], {}, {}, False
    def run(self):
        me = threading.get_ident()
        while not self.halt:
            t = time.perf_counter()
            names = {th.ident: th.name for th in threading.enumerate()}
            for tid, f in sys._current_frames().items():
                if tid == me:
                    continue
                st = []
                while f is not None and len(st) < 48:
                    c = f.f_code
                    st.append(f"{c.co_filename.rsplit('/site-packages/', 1)[-1]}:{f.f_lineno}({c.co_name})")
                    f = f.f_back
                name = self.names.setdefault(names.get(tid, str(tid)), len(self.names))
                self.samples.append((round(t - t_first, 5), name, self.stacks.setdefault(tuple(st), len(self.stacks))))
            time.sleep(self.interval)

s = Sampler(0.001)
s.start()
res = {}
for k in (1, 2):
    rep = out_path + f".r{k}.json"
    t0 = time.perf_counter()
    from tsconv.cli import main
    try:
        main(args + ["--report", rep], standalone_mode=False)
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    res[f"call{k}"] = {"t0": t0 - t_first, "t1": time.perf_counter() - t_first, "report": json.load(open(rep))}
s.halt = True
s.join()
res["samples"] = s.samples
res["stacks"] = [list(k) for k, _ in sorted(s.stacks.items(), key=lambda kv: kv[1])]
res["names"] = [k for k, _ in sorted(s.names.items(), key=lambda kv: kv[1])]
json.dump(res, open(out_path, "w"))
"""


def summarise(d: dict[str, Any], t0: float, t1: float, top: int = 30) -> dict[str, Any]:
    """Per thread: samples between t0 and t1 by the deepest frame outside the standard library's threading."""
    stacks = d["stacks"]
    per: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    incl: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for t, tid, sid in d["samples"]:
        if not t0 <= t <= t1:
            continue
        name = d["names"][tid]
        st = stacks[sid]
        per[name][st[0] if st else "?"] += 1
        for fr in {fr.split(":")[0] + ":" + fr.split("(")[-1] for fr in st}:
            incl[name][fr] += 1
    return {
        name: {
            "samples": sum(c.values()),
            "leaf": c.most_common(top),
            "inclusive": incl[name].most_common(top),
        }
        for name, c in per.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tsconv-fs"))
    ap.add_argument("--case", default="a:dense")
    ap.add_argument("--keep-samples", action="store_true", help="write the raw samples beside the JSON")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--store-rows", type=int, default=None, help="override the store's rows (a quick check)")
    a = ap.parse_args()
    import cli
    import fresh_costs

    fresh_costs.DEVICE = a.device

    a.work.mkdir(parents=True, exist_ok=True)
    cache = a.work / "cache"
    cache.mkdir(exist_ok=True)
    store, pipeline = a.case.split(":")
    if a.store_rows:
        cli.CASES[store]["rows"] = a.store_rows
    src = cli.write_stores(a.work, [store])[store]
    pipe = (
        str(cli.write_dense_pipeline(a.work, cli.CASES[store]["features"]))
        if pipeline == "dense"
        else pipeline
    )
    out = a.work / f"out_{store}.zarr"
    warm = fresh_costs.fresh_run(ROOT, src, out, pipe, a.work, cache)
    drv, res = a.work / "sampler.py", a.work / "sampled.json"
    drv.write_text(DRIVER)
    p = subprocess.run([sys.executable, str(drv), str(res), *fresh_costs._cmd(src, out, pipe)], cwd=tempfile.gettempdir(),
                       env=fresh_costs._env(ROOT, cache), capture_output=True)  # fmt: skip
    if p.returncode:
        raise RuntimeError(p.stderr.decode()[-3000:])
    d = json.loads(res.read_text())
    doc: dict[str, Any] = {"benchmark": "diag/fresh_sample", "commit": commit(), "machine": machine(),
                           "case": a.case, "warm_fresh_run": warm}  # fmt: skip
    for k in ("call1", "call2"):
        c = d[k]
        doc[k] = {"t0": c["t0"], "t1": c["t1"], "stage_seconds": c["report"].get("stage_seconds"),
                  "seconds": c["report"]["seconds"], "threads": summarise(d, c["t0"], c["t1"])}  # fmt: skip
    if a.keep_samples:
        a.out.with_suffix(".raw.json").write_text(json.dumps(d))
    a.out.write_text(json.dumps(doc, indent=1))
    print(a.case, "call1", round(d["call1"]["t1"] - d["call1"]["t0"], 3), "call2",
          round(d["call2"]["t1"] - d["call2"]["t0"], 3), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
