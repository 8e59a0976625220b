"""Blosc-LZ4 encode on the GPU (nvCOMP + tsconv's framing) against c-blosc on the host's cores, on
default-bank-like features; then what store c's run gives with its output uncompressed (the ceiling of
taking the encode off the host).

Claim measured: the GPU encodes an output chunk of wide float32 features faster than the host's 16 threads
of c-blosc, to a similar size, and its frames decode to the same rows (benchmarks/NOTES.md, "The writer").

    python benchmarks/diag/gpu_lz4.py --out $OUT/gpu_lz4.json [--store-c] [--work /tmp/w]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numcodecs
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from provenance import commit, machine  # noqa: E402

from tsconv.io.writers.zarr_writer import output_chunk_rows  # noqa: E402
from tsconv.kernels import lz4_encode as le  # noqa: E402
from tsconv.kernels.blosc_header import parse_header  # noqa: E402


def bank_like(rows: int, feats: int, seed: int = 0) -> torch.Tensor:
    """diff:1, diff:32, diff:256, dev:32, dev:256 of tick-grid random walks (float64 sums), as float32."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    steps = torch.randint(-1, 2, (rows + 256, feats), generator=g, device="cuda").double() * 0.01
    p = 50 + torch.rand(feats, generator=g, device="cuda").double() * 400 + steps.cumsum(0)
    c = torch.cat([torch.zeros(1, feats, device="cuda", dtype=torch.float64), p.cumsum(0)])
    out = []
    for w in (1, 32, 256):
        out.append(p[256:] - p[256 - w : p.shape[0] - w])
    for w in (32, 256):
        mean = (c[257:] - c[257 - w : c.shape[0] - w]) / w
        out.append(p[256:] - mean)
    return torch.stack(out, 2).reshape(rows, feats * 5).float().contiguous()


def cpu_blosc(host: np.ndarray, chunk_rows: int, threads: int) -> tuple[float, int]:
    codec = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    chunks = [host[i : i + chunk_rows] for i in range(0, host.shape[0], chunk_rows)]
    with cf.ThreadPoolExecutor(threads) as ex:
        list(ex.map(codec.encode, chunks[:threads]))  # warm
        t0 = time.perf_counter()
        sizes = list(ex.map(lambda c: len(codec.encode(c)), chunks))
        return time.perf_counter() - t0, sum(sizes)


def gpu_encode(x: torch.Tensor, chunk_rows: int, k: int, reps: int = 5, block: int | None = None) -> dict:
    lay = le.frame_layout(chunk_rows=chunk_rows, row_bytes=x.shape[1] * 4, block=block)
    enc = le.BloscEncoder(lay, max_chunks=k, device=x.device)
    n_chunks = x.shape[0] // chunk_rows
    total, times = 0, []
    for r in range(reps):
        torch.cuda.synchronize()
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        sizes = []
        for c0 in range(0, n_chunks - k + 1, k):
            out = enc.encode(x[c0 * chunk_rows : (c0 + k) * chunk_rows])
            if r == 0:
                sizes.append(out[:, 12:16].contiguous().view(torch.int32).cpu().clone())
        b.record()
        torch.cuda.synchronize()
        if r == 0:
            total = int(torch.cat(sizes).sum())
        else:
            times.append(a.elapsed_time(b) / 1e3)
    nbytes = (n_chunks // k) * k * lay.chunk_bytes
    return {"k": k, "blocksize": lay.blocksize, "streams_per_chunk": lay.streams, "gpu_s": statistics.median(times),
            "gbps": nbytes / statistics.median(times) / 1e9, "ratio": total / nbytes,
            "encoder_device_bytes": enc.held_bytes}  # fmt: skip


def verify(x: torch.Tensor, chunk_rows: int) -> dict:
    lay = le.frame_layout(chunk_rows=chunk_rows, row_bytes=x.shape[1] * 4)
    k = min(8, x.shape[0] // chunk_rows)
    enc = le.BloscEncoder(lay, max_chunks=k, device=x.device)
    part = x[: k * chunk_rows]
    host, want = enc.encode(part).cpu().numpy(), part.cpu().numpy()
    bad = 0
    for c in range(k):
        f = host[c, : parse_header(host[c]).cbytes].tobytes()
        got = np.frombuffer(numcodecs.Blosc().decode(f), np.float32)
        bad += int(
            (
                got.view(np.uint32) != want[c * chunk_rows : (c + 1) * chunk_rows].reshape(-1).view(np.uint32)
            ).sum()
        )
    return {"chunks": k, "mismatched_values": bad}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", type=int, default=262144)
    ap.add_argument("--feats", type=int, default=96)
    a = ap.parse_args()
    doc: dict = {"commit": os.environ.get("TSCONV_COMMIT") or commit(), "machine": machine(),
                 "gpu": torch.cuda.get_device_name(), "nvcomp": le.nvcomp_reason() or "ok", "cases": []}  # fmt: skip
    for feats in (a.feats, 1024):
        rows = a.rows if feats == a.feats else a.rows // 8
        x = bank_like(rows, feats)
        chunk_rows = output_chunk_rows(1024, x.shape[1])
        case = {"rows": rows, "cols": x.shape[1], "chunk_rows": chunk_rows, "bytes": x.numel() * 4}
        case["verify"] = verify(x, chunk_rows)
        host = x.cpu().numpy()
        for th in (1, 16):
            t, size = cpu_blosc(host, chunk_rows, th)
            case[f"cpu_{th}"] = {"s": t, "gbps": host.nbytes / t / 1e9, "ratio": size / host.nbytes}
        blocks = (1 << 14, 1 << 15, 1 << 16, 1 << 18) if feats == a.feats else (1 << 16, 1 << 18)
        case["gpu"] = [
            {**gpu_encode(x, chunk_rows, k, block=b), "block": b} for b in blocks for k in (1, 2, 3, 4, 8)
        ]
        doc["cases"].append(case)
        print(json.dumps(case), flush=True)
    a.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
