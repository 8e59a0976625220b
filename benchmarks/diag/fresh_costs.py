"""Where a fresh `tsconv process` spends what a warm process does not, and what the output writer costs.

Claim measured: the fixed costs of a fresh GPU process (benchmarks/NOTES.md, "A fresh `tsconv process` per
run") and the writer's share of a wide output, taken apart on the lent machine. GPU only.

    python benchmarks/diag/fresh_costs.py --out $OUT/fresh_costs.json [--work /tmp/fc]
        [--cases e:default,e:dense,c:default] [--trees NAME=DIR[:VAR=VALUE...],...]

Per case (stores and pipelines of ``benchmarks/cli.py``): for this tree and each of ``--trees`` (another
tree's root, with environment settings of its own), one run that fills the tuning and bytecode caches,
then ``--repeats`` fresh `python -m tsconv process` runs (wall, report, stages), the trees taking turns;
then one driver process that runs the CLI twice under cProfile: the
first call (what a batch job pays) and a second, warm one, each with its report, its slowest functions,
the engine's timeline (``tsconv.trace``) and the interpreter's own start and exit around them.
``writer``: the chunk files of a 4 GB output written by 1-16 threads from one real 16 MB chunk of the
default bank's output (raw file writes, Blosc clevel 0, Blosc-LZ4), and the removal of such an output.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from provenance import commit, machine  # noqa: E402

DRIVER = r"""
import cProfile, io, json, pstats, sys, time
t_first = time.time()
out_path, report1, report2, *args = sys.argv[1:]

def top(pr, n=45):
    st = pstats.Stats(pr)
    rows = []
    for (f, line, name), (cc, nc, tt, ct, _) in st.stats.items():
        rows.append((ct, tt, nc, f"{f.rsplit('/site-packages/', 1)[-1]}:{line}({name})"))
    rows.sort(reverse=True)
    by_tt = sorted(rows, key=lambda r: -r[1])[:25]
    return {"cumulative": [[round(c, 4), round(t, 4), n, s] for c, t, n, s in rows[:n]],
            "tottime": [[round(c, 4), round(t, 4), n, s] for c, t, n, s in by_tt]}

def spans_summary(spans, t0):
    out = {}
    for name, thread, a, b, arg in spans:
        d = out.setdefault(name, {"n": 0, "total": 0.0, "first": 1e9, "last_end": 0.0})
        d["n"] += 1; d["total"] += b - a; d["first"] = min(d["first"], a - t0); d["last_end"] = max(d["last_end"], b - t0)
    return {k: {kk: round(vv, 4) if isinstance(vv, float) else vv for kk, vv in v.items()} for k, v in out.items()}

res = {"t_first_line_epoch": t_first}
for k, rep in enumerate((report1, report2)):
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    from tsconv import trace
    from tsconv.cli import main
    with trace.recording() as spans:
        try:
            main(args + ["--report", rep], standalone_mode=False)
        except SystemExit as e:
            if e.code not in (0, None):
                raise
    pr.disable()
    t1 = time.perf_counter()
    res[f"call{k + 1}"] = {"seconds": t1 - t0, "profile": top(pr), "spans": spans_summary(spans, t0),
                           "report": json.load(open(rep))}
res["t_end_epoch"] = time.time()
json.dump(res, open(out_path, "w"))
"""


def _env(root: Path, cache: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {
        **os.environ,
        "TSCONV_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join([str(root.resolve()), *sys.path]),
        **(extra or {}),
    }


DEVICE = "cuda"  # --device cpu: a check of the script itself on a machine without a GPU


def _cmd(src: Path, out: Path, pipeline: str) -> list[str]:
    return ["process", "-i", str(src), "-o", str(out), "--pipeline", pipeline, "--device", DEVICE,
            "--overwrite", "-q"]  # fmt: skip


def fresh_run(
    root: Path,
    src: Path,
    out: Path,
    pipeline: str,
    work: Path,
    cache: Path,
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    report = work / "report.json"
    report.unlink(missing_ok=True)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "tsconv", *_cmd(src, out, pipeline), "--report", str(report)],
                       cwd=tempfile.gettempdir(), env=_env(root, cache, extra), capture_output=True)  # fmt: skip
    wall = time.perf_counter() - t0
    if p.returncode:
        raise RuntimeError(p.stderr.decode()[-2000:])
    r = json.loads(report.read_text())
    return {"wall_s": wall, "report_s": r["seconds"], "compression": r.get("compression"),
            "stage_seconds": {k: round(v, 4) for k, v in (r.get("stage_seconds") or {}).items()}}  # fmt: skip


def profiled_run(root: Path, src: Path, out: Path, pipeline: str, work: Path, cache: Path) -> dict[str, Any]:
    drv, res = work / "driver.py", work / "driver.json"
    drv.write_text(DRIVER)
    t0 = time.time()
    p = subprocess.run([sys.executable, "-X", "importtime", str(drv), str(res), str(work / "r1.json"),
                        str(work / "r2.json"), *_cmd(src, out, pipeline)],
                       cwd=tempfile.gettempdir(), env=_env(root, cache), capture_output=True)  # fmt: skip
    t_exit = time.time()
    if p.returncode:
        raise RuntimeError(p.stderr.decode()[-3000:])
    d = json.loads(res.read_text())
    d["interpreter_to_first_line_s"] = d.pop("t_first_line_epoch") - t0
    d["end_to_exit_s"] = t_exit - d.pop("t_end_epoch")
    d["wall_s"] = t_exit - t0
    imports = []
    for line in p.stderr.decode().splitlines():
        if line.startswith("import time:") and "|" in line:
            parts = [x.strip() for x in line[len("import time:") :].split("|")]
            if parts[0].isdigit():
                imports.append((int(parts[1]), int(parts[0]), parts[2]))
    imports.sort(reverse=True)
    d["imports_top_us"] = [[c, s, n] for c, s, n in imports[:40]]
    return d


def startup(n: int = 3) -> dict[str, float]:
    out = {}
    for name, code in (("python", "pass"), ("torch", "import torch"),
                       ("torch_cuda", f"import torch; torch.zeros(1, device='{DEVICE}')")):  # fmt: skip
        walls = []
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            walls.append(time.perf_counter() - t0)
        out[name] = statistics.median(walls)
    return out


def writer_diag(work: Path, total_bytes: int) -> dict[str, Any]:
    """Chunk files of a 4 GB output from threads: raw writes, Blosc clevel 0 and Blosc-LZ4 (shuffle)."""
    import numcodecs
    from cli import _band

    import tsconv

    rows = (16 << 20) // (480 * 4)
    x = (100 + 0.01 * _band(0, 0, rows + 300, 96)).astype(np.float32)
    y = np.ascontiguousarray(tsconv.features(x, "default", device="cpu")[300:], dtype=np.float32)
    chunks = total_bytes // y.nbytes
    codecs = {"raw": None, "blosc0": numcodecs.Blosc("lz4", 0, numcodecs.Blosc.SHUFFLE),
              "lz4": numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE)}  # fmt: skip
    res: dict[str, Any] = {"chunk_bytes": int(y.nbytes), "chunks": int(chunks), "ratio": {}}
    for name, c in codecs.items():
        if c is not None:
            res["ratio"][name] = y.nbytes / len(c.encode(y))
    for threads in (1, 8, 16):
        for name, c in codecs.items():
            d = work / "wdiag"
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)

            def one(k: int, c: Any = c, d: Path = d) -> None:
                data = y if c is None else c.encode(y)
                with open(d / f"{k}", "wb") as f:
                    f.write(data)

            t0 = time.perf_counter()
            with cf.ThreadPoolExecutor(threads) as pool:
                list(pool.map(one, range(chunks)))
            secs = time.perf_counter() - t0
            t0 = time.perf_counter()
            shutil.rmtree(d)
            rm = time.perf_counter() - t0
            res[f"{name}_t{threads}"] = {
                "seconds": secs,
                "gbps": chunks * y.nbytes / secs / 1e9,
                "rmtree_s": rm,
            }
            print(name, threads, round(secs, 3), round(rm, 3), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tsconv-fc"))
    ap.add_argument("--cases", default="e:default,e:dense,c:default")
    ap.add_argument("--trees", default="", help="NAME=DIR[:VAR=VALUE...],... (DIR '.': this tree)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-writer", action="store_true")
    ap.add_argument("--no-profile", action="store_true", help="skip the profiled driver runs")
    ap.add_argument("--writer-gb", type=float, default=4.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--store-rows", type=int, default=None, help="override the stores' rows (a quick check)")
    a = ap.parse_args()
    global DEVICE
    DEVICE = a.device
    import cli

    a.work.mkdir(parents=True, exist_ok=True)
    cache = a.work / "cache"
    cache.mkdir(exist_ok=True)
    cases = [c.split(":") for c in a.cases.split(",")]
    if a.store_rows:
        for s in {s for s, _ in cases}:
            cli.CASES[s]["rows"] = a.store_rows
    stores = cli.write_stores(a.work, sorted({s for s, _ in cases}))
    doc: dict[str, Any] = {"benchmark": "diag/fresh_costs", "commit": commit(), "machine": machine(),
                           "date": dt.datetime.now(dt.UTC).isoformat(), "runs": []}  # fmt: skip
    doc["startup_s"] = startup()
    print("startup", doc["startup_s"], flush=True)
    for store, pipeline in cases:
        src = stores[store]
        pipe = pipeline
        if pipeline == "dense":
            pipe = str(cli.write_dense_pipeline(a.work, cli.CASES[store]["features"]))
        out = a.work / f"out_{store}.zarr"
        run: dict[str, Any] = {"store": store, "pipeline": pipeline}
        trees = {"head": (ROOT, {})}
        for spec in filter(None, a.trees.split(",")):
            name, rest = spec.split("=", 1)
            path, *env = rest.split(":")
            trees[name] = (ROOT if path == "." else Path(path).resolve(), dict(e.split("=", 1) for e in env))
        for root, extra in trees.values():
            fresh_run(root, src, out, pipe, a.work, cache, extra)  # fills the caches
        run["trees"] = {
            name: {"root": str(root), "env": extra, "runs": []} for name, (root, extra) in trees.items()
        }
        for _ in range(a.repeats):
            for name, (root, extra) in trees.items():
                run["trees"][name]["runs"].append(fresh_run(root, src, out, pipe, a.work, cache, extra))
        for name, t in run["trees"].items():

            def stage(key: str, t: dict[str, Any] = t) -> list[float]:
                return [round(r["stage_seconds"].get(key, 0.0), 3) for r in t["runs"]]

            print(store, pipeline, name, "wall", [round(r["wall_s"], 2) for r in t["runs"]],
                  "report", [round(r["report_s"], 3) for r in t["runs"]], "loop", stage("loop"),
                  "d2h", stage("d2h"), "write_busy", stage("write_busy"), "decode_busy", stage("decode_busy"),
                  "|", t["runs"][-1].get("compression"), flush=True)  # fmt: skip
        if not a.no_profile:
            run["profiled"] = prof = profiled_run(ROOT, src, out, pipe, a.work, cache)
            print(store, pipeline, "profiled: call1", round(prof["call1"]["seconds"], 3), "call2",
                  round(prof["call2"]["seconds"], 3), "start", round(prof["interpreter_to_first_line_s"], 3),
                  "exit", round(prof["end_to_exit_s"], 3), flush=True)  # fmt: skip
        doc["runs"].append(run)
        a.out.write_text(json.dumps(doc, indent=1))
    if not a.no_writer:
        doc["writer"] = writer_diag(a.work, int(a.writer_gb * (1 << 30)))
    a.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
