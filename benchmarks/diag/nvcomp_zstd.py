"""nvCOMP's batched Zstd decode of zarr-default chunks, alone and beside numcodecs on every core (a diagnostic).

Claim measured: how many decoded GB/s a second decoder on the GPU could add to the host's threads for store b of
the benchmark of record (zstd, (16384, 256) float32 chunks of tick prices), at the numbers of chunks in flight that
fit the 1.2 GB budget. The chunks are compressed here by numcodecs' Zstd at zarr's default level, from the same
kind of series as ``benchmarks/cli.py`` writes; each batch's output is checked against numcodecs' decode.

    python benchmarks/diag/nvcomp_zstd.py --out $OUT/nvcomp_zstd.json [--chunks 64] [--batches 1,8,16,32,64]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from provenance import commit, machine  # noqa: E402


class _Opts(ctypes.Structure):  # nvcompBatchedZstdDecompressOpts_t (nvcomp/zstd.h)
    _fields_ = [("backend", ctypes.c_int), ("reserved", ctypes.c_char * 60)]


class _Align(ctypes.Structure):  # nvcompAlignmentRequirements_t (nvcomp/shared_types.h)
    _fields_ = [("input", ctypes.c_size_t), ("output", ctypes.c_size_t), ("temp", ctypes.c_size_t)]


def _chunks(n: int, rows: int, cols: int) -> list[bytes]:
    import numcodecs

    codec = numcodecs.Zstd(level=0)  # zarr 3's default Zstd codec level
    out = []
    for i in range(n):
        rng = np.random.default_rng([7, i])
        ticks = np.cumsum(rng.integers(-1, 2, size=(rows, cols), dtype=np.int8), axis=0, dtype=np.int32)
        prices = (100.0 + 0.01 * ticks).astype(np.float32)
        out.append(codec.encode(np.ascontiguousarray(prices)))
    return out


def main() -> None:
    import numcodecs
    import torch
    from nvidia.libnvcomp.load import load_library  # type: ignore[import-not-found]

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--batches", default="1,8,16,32,64")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    rows, cols = 16384, 256
    raw = rows * cols * 4
    blobs = _chunks(args.chunks, rows, cols)
    ratio = sum(map(len, blobs)) / (raw * len(blobs))
    lib = load_library()
    opts = _Opts(0)
    align = _Align()
    assert lib.nvcompBatchedZstdDecompressGetRequiredAlignments(opts, ctypes.byref(align)) == 0
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream()
    threads = os.cpu_count() or 4
    ref = [np.frombuffer(numcodecs.Zstd().decode(b), dtype=np.uint8) for b in blobs[:4]]

    def gpu_batch(n: int) -> dict:
        sel = [blobs[i % len(blobs)] for i in range(n)]
        cap = max(map(len, sel))
        cap = -(-cap // 256) * 256
        comp = torch.zeros((n, cap), dtype=torch.uint8, device=dev)
        for i, b in enumerate(sel):
            comp[i, : len(b)].copy_(torch.frombuffer(bytearray(b), dtype=torch.uint8))
        outb = torch.empty((n, raw), dtype=torch.uint8, device=dev)
        cptr = torch.tensor([comp[i].data_ptr() for i in range(n)], dtype=torch.int64, device=dev)
        optr = torch.tensor([outb[i].data_ptr() for i in range(n)], dtype=torch.int64, device=dev)
        csz = torch.tensor([len(b) for b in sel], dtype=torch.int64, device=dev)
        osz = torch.full((n,), raw, dtype=torch.int64, device=dev)
        got = torch.zeros((n,), dtype=torch.int64, device=dev)
        st = torch.zeros((n,), dtype=torch.int32, device=dev)
        temp = ctypes.c_size_t(0)
        rc = lib.nvcompBatchedZstdDecompressGetTempSize(
            ctypes.c_size_t(n),
            ctypes.c_size_t(raw),
            opts,
            ctypes.byref(temp),
            ctypes.c_size_t(n * raw),
            ctypes.c_void_p(stream.cuda_stream),
        )
        assert rc == 0, rc
        tmp = torch.empty((max(temp.value, 1),), dtype=torch.uint8, device=dev)

        def launch() -> None:
            rc = lib.nvcompBatchedZstdDecompressAsync(
                ctypes.c_void_p(cptr.data_ptr()),
                ctypes.c_void_p(csz.data_ptr()),
                ctypes.c_void_p(osz.data_ptr()),
                ctypes.c_void_p(got.data_ptr()),
                ctypes.c_size_t(n),
                ctypes.c_void_p(tmp.data_ptr()),
                ctypes.c_size_t(temp.value),
                ctypes.c_void_p(optr.data_ptr()),
                opts,
                ctypes.c_void_p(st.data_ptr()),
                ctypes.c_void_p(stream.cuda_stream),
            )
            assert rc == 0, rc

        launch()
        torch.cuda.synchronize()
        ok = bool((st == 0).all()) and bool((got == raw).all())
        for i in range(min(n, 4)):
            ok = ok and np.array_equal(outb[i].cpu().numpy(), ref[i % len(ref)])
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            launch()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        s = statistics.median(times)
        mem = comp.numel() + outb.numel() + tmp.numel()
        return {
            "chunks": n,
            "seconds": s,
            "gbps": n * raw / s / 1e9,
            "temp_bytes": temp.value,
            "device_bytes": mem,
            "equal": ok,
            "launch": launch,
        }

    def cpu_all(n: int) -> float:
        dec = numcodecs.Zstd().decode
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(threads) as pool:
            for _ in pool.map(dec, [blobs[i % len(blobs)] for i in range(n)]):
                pass
        return time.perf_counter() - t0

    res: dict = {
        "commit": commit(),
        "machine": machine(),
        "gpu": torch.cuda.get_device_name(),
        "chunk": [rows, cols],
        "compressed_ratio": ratio,
        "threads": threads,
        "gpu_alone": [],
        "both": [],
    }
    cpu_n = 4 * threads
    cpu_s = statistics.median(cpu_all(cpu_n) for _ in range(args.repeats))
    res["cpu_alone"] = {"chunks": cpu_n, "seconds": cpu_s, "gbps": cpu_n * raw / cpu_s / 1e9}
    print("cpu alone", res["cpu_alone"], flush=True)
    for n in [int(x) for x in args.batches.split(",")]:
        r = gpu_batch(n)
        launch = r.pop("launch")
        res["gpu_alone"].append(r)
        print("gpu", r, flush=True)
        # both at once: the GPU batch in flight while the threads decode the CPU's chunks
        t0 = time.perf_counter()
        launch()
        tc = cpu_all(cpu_n)
        torch.cuda.synchronize()
        tb = time.perf_counter() - t0
        both = {
            "gpu_chunks": n,
            "cpu_chunks": cpu_n,
            "cpu_seconds": tc,
            "seconds": tb,
            "gbps": (n + cpu_n) * raw / tb / 1e9,
        }
        res["both"].append(both)
        print("both", both, flush=True)
        torch.cuda.empty_cache()
    args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
