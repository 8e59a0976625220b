"""The GPU reader's bands per decode launch under the default `--gpu-mem`: which batch, or the CPU decoder,
gives the fastest fresh `tsconv process` on Blosc-LZ4 stores. GPU only.

Claim measured: since `--gpu-mem` bounds the whole process (CUDA context included), the GPU decoder's rings at
their usual batch (12 bands of 16 MB, about 580 MB) no longer fit beside the steps, and runs fell back to the CPU
decoder. A smaller batch fits but keeps fewer LZ4 streams in flight (one warp each). Each variant is a fresh
process running the CLI (`tsconv.cli.run`) after capping the batch (`MAX_DECODED_BYTES`); the planner takes the
largest batch up to the cap that fits. Variants take turns; one untimed run each first (bytecode, tuning).
Also: what a bare CUDA context holds (NVML) with the default stack-size limit and a smaller one.

    python benchmarks/diag/gpu_reader_batch.py --out $OUT/gpu_reader_batch.json [--cases a,d] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import cli  # noqa: E402
from provenance import commit, machine  # noqa: E402

DRIVER = r"""
import sys
cap, *argv = sys.argv[1:]
import tsconv.cli as c
if cap != "none":
    import tsconv.io.readers.gpu as g
    g.MAX_DECODED_BYTES = int(cap)
sys.argv = ["tsconv", *argv]
c.run()
"""

CONTEXT = r"""
import ctypes, json, os, sys, torch, pynvml
stack = int(sys.argv[1])
torch.zeros(1, device="cuda")
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
def held():
    return max((p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h) if p.pid == os.getpid())
cuda = ctypes.CDLL("libcuda.so.1")
v = ctypes.c_size_t()
out = {"after_context": held()}
limits = {}
for name, code in (("stack", 0), ("printf_fifo", 1), ("malloc_heap", 2)):
    cuda.cuCtxGetLimit(ctypes.byref(v), code); limits[name] = v.value
out["limits"] = limits
if stack:
    rc = cuda.cuCtxSetLimit(0, ctypes.c_size_t(stack)); out["set_rc"] = rc
    out["after_set"] = held()
x = torch.randn(4096, 4096, device="cuda"); (x @ x).sum().item()
out["after_matmul"] = held()
print(json.dumps(out))
"""


def run_variant(src: Path, out: Path, pipeline: str, cap: int | None, extra: list[str], work: Path) -> dict:
    report = work / "report.json"
    report.unlink(missing_ok=True)
    argv = ["process", "-i", str(src), "-o", str(out), "--pipeline", pipeline, "--device", "cuda",
            "--overwrite", "-q", "--report", str(report), *extra]  # fmt: skip
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TSCONV_CACHE_DIR": str(work / "cache"), "PYTHONPATH": path}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", DRIVER, str(cap) if cap else "none", *argv], env=env,
                       cwd=tempfile.gettempdir(), capture_output=True, text=True)  # fmt: skip
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return {"error": p.stderr[-1500:]}
    r = json.loads(report.read_text())
    st = r.get("stage_seconds") or {}
    return {"wall_s": wall, "report_s": r["seconds"], "reader": r.get("reader"), "decode_note": r.get("decode_note"),
            "step_rows": r.get("step_rows"), "gpu_process_bytes": r.get("gpu_process_bytes"),
            "gpu_outside_torch_bytes": r.get("gpu_outside_torch_bytes"), "bound_by": r.get("bound_by"),
            "stages": {k: round(v, 4) for k, v in st.items() if k in ("loop", "gpu_decode", "h2d", "compute", "decode",
                       "decode_busy", "read_wait", "prepare", "open_reader", "backend")}}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tsconv-cli"))
    ap.add_argument("--cases", default="a,d")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", default="2,3,4,6,8")
    ap.add_argument("--sweep", default="a", help="cases that try every batch (the others: cpu, auto, 2GB)")
    a = ap.parse_args()
    result: dict = {
        "benchmark": "diag/gpu_reader_batch",
        "commit": commit(),
        "machine": machine(),
        "context": {},
    }
    for stack in (0, 256, 1):
        p = subprocess.run([sys.executable, "-c", CONTEXT, str(stack)], capture_output=True, text=True)
        result["context"][f"stack_{stack or 'default'}"] = (
            json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else p.stderr[-800:]
        )
    print(json.dumps(result["context"]), flush=True)
    a.work.mkdir(parents=True, exist_ok=True)
    names = a.cases.split(",")
    stores = cli.write_stores(a.work, names)
    pipe = {n: str(cli.write_dense_pipeline(a.work, cli.CASES[n]["features"])) for n in names}
    result["cases"] = {}
    for n in names:
        spec = cli.CASES[n]
        band = spec["chunks"][0] * spec["features"] * 4
        variants: dict[str, tuple[int | None, list[str]]] = {"cpu": (None, ["--decode", "cpu"])}
        for b in (int(x) for x in a.batches.split(",")) if n in a.sweep.split(",") else ():
            variants[f"gpu_b{b}"] = (2 * band * b, [])
        variants["gpu_auto"] = (None, [])
        variants["gpu_2GB"] = (None, ["--gpu-mem", "2GB"])
        out = a.work / f"out_{n}.zarr"
        runs: dict[str, list[dict]] = {v: [] for v in variants}
        for cap, extra in variants.values():  # untimed: bytecode, tuning cache
            run_variant(stores[n], out, pipe[n], cap, extra, a.work)
        for _ in range(a.repeats):
            for v, (cap, extra) in variants.items():
                runs[v].append(run_variant(stores[n], out, pipe[n], cap, extra, a.work))
        summary = {}
        for v, rs in runs.items():
            ok = [r for r in rs if "error" not in r]
            if ok:
                summary[v] = {"report_s": statistics.median(r["report_s"] for r in ok),
                              "wall_s": statistics.median(r["wall_s"] for r in ok),
                              "reader": ok[0]["reader"], "decode_note": ok[0]["decode_note"],
                              "step_rows": ok[0]["step_rows"], "gpu_process_bytes": max(r["gpu_process_bytes"] or 0 for r in ok)}  # fmt: skip
            else:
                summary[v] = {"error": rs[0]["error"]}
            print(n, v, json.dumps(summary[v]), flush=True)
        result["cases"][n] = {"summary": summary, "runs": runs}
        a.out.write_text(json.dumps(result, indent=1))
    a.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
