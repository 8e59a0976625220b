"""How long the *host* is held by one non-blocking host-to-device copy, and by the GIL, on the GPU machine.

    python benchmarks/h2d_call.py --out $OUT/h2d_call.json

The batched engine's thread spent ~1 ms per 16 MB piece inside the copy/prepare launches (a time that grew
with the piece's bytes, benchmarks/NOTES.md). This times ``dst.copy_(src, non_blocking=True)`` as the
calling thread sees it (median of 20, 32 MB), for a source that is: ``torch.from_numpy`` of a view of a
pinned buffer (what the engine does), a slice of the pinned torch tensor itself, and ordinary memory;
each alone and while 15 threads decode Blosc-lz4 chunks as the reader does. It also records the longest
gap a Python loop on the main thread sees while those threads run (the GIL's hand-off latency).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import numcodecs
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import commit, machine  # noqa: E402


def call_ms(dst: torch.Tensor, src: torch.Tensor, n: int = 20) -> dict[str, float]:
    stream = torch.cuda.Stream()
    out = []
    with torch.cuda.stream(stream):
        for _ in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            out.append((t1 - t0, t2 - t0))
    return {
        "call_ms": 1e3 * statistics.median(a for a, _ in out),
        "done_ms": 1e3 * statistics.median(b for _, b in out),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="h2d_call.json")
    ap.add_argument("--mb", type=int, default=32)
    args = ap.parse_args()
    nbytes = args.mb << 20
    owner = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    view = owner.numpy().view(np.float32).reshape(-1, 1024)
    view[:] = np.random.default_rng(0).standard_normal(view.shape, dtype=np.float32)
    srcs = {
        "from_numpy_of_pinned": torch.from_numpy(view),
        "pinned_tensor_slice": owner[:nbytes].view(torch.float32).view(view.shape),
        "pageable": torch.from_numpy(view.copy()),
    }
    dst = torch.empty(view.shape, dtype=torch.float32, device="cuda")
    doc = {
        "gpu": torch.cuda.get_device_name(0),
        "commit": commit(),
        **machine(),
        "mb": args.mb,
        "idle": {},
        "busy": {},
    }
    doc["is_pinned"] = {k: bool(v.is_pinned()) for k, v in srcs.items()}
    for k, v in srcs.items():
        doc["idle"][k] = call_ms(dst, v)
    chunk = (
        np.random.default_rng(1).standard_normal(4 << 20).astype(np.float32).cumsum()
    )  # 16 MB, compressible
    blob = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE).encode(chunk)
    stop = threading.Event()

    def decode_loop() -> None:
        codec = numcodecs.Blosc()
        out = np.empty(chunk.nbytes, dtype=np.uint8)
        while not stop.is_set():
            codec.decode(blob, out=out)

    threads = [threading.Thread(target=decode_loop, daemon=True) for _ in range(15)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    for k, v in srcs.items():
        doc["busy"][k] = call_ms(dst, v)
    gaps = []
    t_end = time.perf_counter() + 1.0
    last = time.perf_counter()
    while last < t_end:
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    doc["busy_python_loop_gap_ms"] = {"max": 1e3 * max(gaps), "p99": 1e3 * float(np.percentile(gaps, 99)),
                                      "iterations": len(gaps)}  # fmt: skip
    stop.set()
    for t in threads:
        t.join()
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
