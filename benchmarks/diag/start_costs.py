"""What the first GPU calls of a fresh process cost, and which of them a thread can take off the main thread.

Claim measured: the primitives behind a fresh `tsconv process`'s first-call costs (benchmarks/NOTES.md, "A
fresh `tsconv process` per run"): pinned host memory (torch's allocator against numpy pages registered with
``cudaHostRegister``), the CUDA context, cuBLAS's first matmul, Triton's driver, each timed in its own fresh
process; and for each, whether the GIL stays free while it runs (a thread counts loop turns meanwhile: turns
per second against an idle second's). GPU only.

    python benchmarks/diag/start_costs.py --out $OUT/start_costs.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from provenance import commit, machine  # noqa: E402

PRELUDE = r"""
import json, mmap, sys, threading, time
import numpy as np
import torch
n = [0]
halt = [False]
def spin():
    while not halt[0]:
        n[0] += 1
def gil_free(fn):
    # fraction of an idle loop's turns that a spinning thread made while fn ran on the main thread
    th = threading.Thread(target=spin, daemon=True); th.start(); time.sleep(0.05)
    a, t0 = n[0], time.perf_counter(); time.sleep(0.1); idle = (n[0] - a) / (time.perf_counter() - t0)
    a, t0 = n[0], time.perf_counter(); r = fn(); dt = time.perf_counter() - t0; busy = (n[0] - a) / dt
    halt[0] = True; th.join()
    return dt, round(busy / idle, 3), r
def register(nbytes, huge, touch):
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        buf.madvise(mmap.MADV_HUGEPAGE)
    a = np.frombuffer(buf, dtype=np.uint8)
    if touch:
        a[::4096] = 0
    ptr = a.ctypes.data
    err = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0)
    return int(err)
def touch(nbytes):
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(mmap.MADV_HUGEPAGE)
    np.frombuffer(buf, dtype=np.uint8)[::4096] = 0
    return 0
"""

CASES = {
    "cuda_init": "torch.cuda.init(); r = gil_free(lambda: torch.empty(1, device='cuda'))",
    "pinned_torch_72MB": "torch.empty(1, device='cuda'); r = gil_free(lambda: torch.empty(72 << 20, dtype=torch.uint8, pin_memory=True).sum().item() * 0)",
    "pinned_torch_216MB": "torch.empty(1, device='cuda'); r = gil_free(lambda: torch.empty(216 << 20, dtype=torch.uint8, pin_memory=True).data_ptr() * 0)",
    "register_216MB": "torch.empty(1, device='cuda'); r = gil_free(lambda: register(216 << 20, False, False))",
    "register_216MB_huge": "torch.empty(1, device='cuda'); r = gil_free(lambda: register(216 << 20, True, False))",
    "register_216MB_huge_touched": "torch.empty(1, device='cuda'); r = gil_free(lambda: register(216 << 20, True, True))",
    "touch_216MB_huge": "torch.empty(1, device='cuda'); r = gil_free(lambda: touch(216 << 20))",
    "pinned_torch_216MB_register_threads": "torch.cuda.memory._set_allocator_settings('pinned_use_cuda_host_register:True,pinned_num_register_threads:8'); torch.empty(1, device='cuda'); r = gil_free(lambda: torch.empty(216 << 20, dtype=torch.uint8, pin_memory=True).data_ptr() * 0)",
    "cublas_first": "x = torch.randn(4096, 256, device='cuda'); w = torch.randn(256, 64, device='cuda'); torch.cuda.synchronize(); r = gil_free(lambda: (x @ w).sum().item() * 0)",
    "cublas_after_thread_warm": "x = torch.randn(4096, 256, device='cuda'); w = torch.randn(256, 64, device='cuda'); th = threading.Thread(target=lambda: (torch.randn(64, 32, device='cuda') @ torch.randn(32, 16, device='cuda')).sum().item()); th.start(); th.join(); torch.cuda.synchronize(); r = gil_free(lambda: (x @ w).sum().item() * 0)",
    "cublas_handle_in_thread": "x = torch.randn(4096, 256, device='cuda'); w = torch.randn(256, 64, device='cuda'); th = threading.Thread(target=torch.cuda.current_blas_handle); th.start(); th.join(); torch.cuda.synchronize(); r = gil_free(lambda: (x @ w).sum().item() * 0)",
    "triton_driver": "import triton; r = gil_free(lambda: triton.runtime.driver.active.get_current_device())",
    "sort_first": "x = torch.randn(300, 1024, device='cuda'); torch.cuda.synchronize(); r = gil_free(lambda: torch.sort(x, dim=0).values.sum().item() * 0)",
    "where_isfinite_first": "x = torch.randn(300, 1024, device='cuda'); torch.cuda.synchronize(); r = gil_free(lambda: torch.where(torch.isfinite(x), x, torch.nan).sum().item() * 0)",
}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    doc = {"benchmark": "diag/start_costs", "commit": commit(), "machine": machine(), "cases": {}}
    for name, code in CASES.items():
        rows = []
        for _ in range(a.repeats):
            prog = PRELUDE + code + "\nprint(json.dumps([r[0], r[1]]))"
            p = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True)
            if p.returncode:
                rows.append({"error": p.stderr[-800:]})
                break
            dt, free = json.loads(p.stdout.strip().splitlines()[-1])
            rows.append({"seconds": round(dt, 4), "gil_free": free})
        doc["cases"][name] = rows
        print(name, rows, flush=True)
        a.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
