"""Blosc-LZ4 decoded on the GPU (tsconv.kernels.blosc_lz4) against the CPU decode threads, on a real store.

Claim measured: the GPU decoder turns the stored bytes into decoded rows on the GPU faster than the CPU
decode threads plus the H2D copy, byte for byte as numcodecs decodes them (benchmarks/NOTES.md, "The GPU
Blosc-LZ4 decoder"). GPU only.

    python benchmarks/gpu_decode.py --store /tmp/tsconv-e2e/ticks_1048576x1024_16mb.zarr --out $OUT/gpu_decode.json

Stages, each timed alone (medians of --repeats) and then overlapped as an engine would run them:
- read: the chunk files' stored bytes into one pinned host buffer, ``--threads`` threads (``readinto``);
- h2d: that buffer to the GPU;
- gpu decode: every chunk decoded on the GPU (one launch; and in batches of ``--batch`` chunks), CUDA events;
- pipelined: read a batch of chunks into a pinned slot, copy it on a side stream, decode it on the main
  stream, double-buffered: compressed bytes in, decoded bytes on the GPU;
- baseline: tsconv's ParallelBandReader (16 decode threads into a pinned ring) plus the H2D of each band:
  decoded bytes on the GPU the way the CPU reader gets them to the engine (its threads at nice +5, as there).

Correctness first: every chunk decoded on the GPU is compared byte for byte with numcodecs' decode.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import functools
import json
import statistics
import sys
import time
from pathlib import Path

import numcodecs
import numpy as np
import torch
import zarr

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from provenance import commit, machine  # noqa: E402

from tsconv.io.readers.threads import ParallelBandReader  # noqa: E402
from tsconv.kernels import blosc_header  # noqa: E402
from tsconv.kernels import blosc_lz4 as bl  # noqa: E402


def _chunk_files(store: Path) -> tuple[zarr.Array, list[Path]]:
    node = zarr.open(str(store), mode="r")
    arr = node["values"] if isinstance(node, zarr.Group) else node
    root = Path(arr.store_path.store.root) / arr.store_path.path
    enc = arr.metadata.chunk_key_encoding.encode_chunk_key
    nb = -(-arr.shape[0] // arr.chunks[0])
    nc = -(-arr.shape[1] // arr.chunks[1])
    return arr, [root / enc((b, c)) for b in range(nb) for c in range(nc)]


def _read_all(files: list[Path], buf: np.ndarray, offs: list[int], pool: cf.ThreadPoolExecutor) -> None:
    def one(i: int) -> None:
        with open(files[i], "rb", buffering=0) as f:
            f.readinto(memoryview(buf[offs[i] : offs[i + 1]]))

    list(pool.map(one, range(len(files))))


def _cuda_ms(fn, repeats: int) -> list[float]:  # noqa: ANN001
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument(
        "--batch", type=int, default=8, help="chunks per launch in the batched and pipelined runs"
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batches", type=lambda v: [int(x) for x in v.split(",")], default=[8, 12, 32],
                    help="batch sizes (chunks per launch) to time the kernel at")  # fmt: skip
    ap.add_argument("--variants", type=lambda v: [x for x in v.split(",") if x], default=[],
                    help="also check and time the current kernel at other GROUPxWxT[xWINDOW[xLITERAL_WIDTH[xLITERAL_SPAN]]], e.g. 32x8x32x128x8x256")  # fmt: skip
    args = ap.parse_args()

    arr, files = _chunk_files(args.store)
    sizes = [f.stat().st_size for f in files]
    offs = [0]
    for s in sizes:
        offs.append(offs[-1] + -(-s // 16) * 16)
    total_stored = sum(sizes)
    chunk_bytes = arr.chunks[0] * arr.chunks[1] * arr.dtype.itemsize
    decoded_bytes = arr.nbytes
    n = len(files)
    doc: dict = {
        "benchmark": "gpu_decode",
        "gpu": torch.cuda.get_device_name(0),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": machine(),
        "store": str(args.store),
        "chunks": n,
        "chunk_shape": list(arr.chunks),
        "stored_bytes": total_stored,
        "decoded_bytes": decoded_bytes,
        "threads": args.threads,
        "batch": args.batch,
    }

    host = torch.empty(offs[-1], dtype=torch.uint8, pin_memory=True)
    hbuf = host.numpy()
    pool = cf.ThreadPoolExecutor(args.threads)
    _read_all(files, hbuf, offs, pool)  # page cache warm
    read_s = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        _read_all(files, hbuf, offs, pool)
        read_s.append(time.perf_counter() - t0)
    doc["read_s"] = read_s

    # headers on the host: what the GPU path accepts
    headers = [blosc_header.parse_header(hbuf[offs[i] : offs[i] + 16]) for i in range(n)]
    reasons = {
        blosc_header.unsupported_reason(h, nbytes=chunk_bytes, size=sizes[i], typesize=arr.dtype.itemsize)
        for i, h in enumerate(headers)
    }
    doc["unsupported"] = sorted(r for r in reasons if r)
    ts = headers[0].typesize
    max_blocks = max(h.nblocks for h in headers)
    doc["header0"] = vars(headers[0]) if hasattr(headers[0], "__dict__") else str(headers[0])
    print("headers", headers[0], "unsupported:", doc["unsupported"], flush=True)

    dev = torch.empty(offs[-1], dtype=torch.uint8, device="cuda")
    doc["h2d_ms"] = _cuda_ms(lambda: dev.copy_(host, non_blocking=True), args.repeats)
    d_off = torch.tensor(offs[:-1], dtype=torch.int64, device="cuda")
    d_len = torch.tensor(sizes, dtype=torch.int64, device="cuda")
    out = torch.empty((n, chunk_bytes), dtype=torch.uint8, device="cuda")

    t0 = time.perf_counter()
    err = bl.decode_chunks(dev, d_off, d_len, out, typesize=ts, max_blocks=max_blocks)
    torch.cuda.synchronize()
    doc["first_call_s"] = time.perf_counter() - t0
    doc["errors_flagged"] = int(err.sum())

    # correctness: every chunk against numcodecs
    codec = numcodecs.Blosc()
    mism = []

    def ref(i: int) -> np.ndarray:
        dst = np.empty(chunk_bytes, dtype=np.uint8)
        codec.decode(hbuf[offs[i] : offs[i] + sizes[i]], out=dst)
        return dst

    refs = torch.empty((n, chunk_bytes), dtype=torch.uint8, pin_memory=True)
    for i, r in enumerate(pool.map(ref, range(n))):
        refs[i].numpy()[:] = r
    ref_dev = refs.to("cuda")
    for i in range(n):
        if not torch.equal(out[i], ref_dev[i]):
            mism.append(i)
    # variants of the kernel: checked the same way, then timed below (the one-sequence-at-a-time kernel
    # it replaced, ae7787a, was timed beside it in results/gpu_decode_{edd7490,4d069c3,e964f2f}.json)
    others: dict = {}
    for v in args.variants:
        g, w, t, *more = (int(x) for x in v.split("x"))
        others[v] = functools.partial(bl.decode_chunks, group=g, tile=(w, t), window=more[0] if more else bl.WINDOW,
                                      literal_width=more[1] if len(more) > 1 else bl.LITERAL_WIDTH,
                                      literal_span=more[2] if len(more) > 2 else 0)  # fmt: skip
    doc["other_kernels"] = {}
    for name, fn in others.items():
        out.fill_(0xAB)
        e = fn(dev, d_off, d_len, out, typesize=ts, max_blocks=max_blocks)
        bad = [i for i in range(n) if not torch.equal(out[i], ref_dev[i])]
        doc["other_kernels"][name] = {"mismatched_chunks": bad, "errors_flagged": int(e.sum())}
        mism += [f"{name}:{i}" for i in bad] + ([f"{name}:flagged"] if int(e.sum()) else [])
    del ref_dev
    doc["mismatched_chunks"] = mism
    doc["check"] = "PASS" if not mism and not doc["errors_flagged"] else "FAIL"
    print("check", doc["check"], "mismatched", mism[:10], "flagged", doc["errors_flagged"], flush=True)

    doc["decode_all_ms"] = _cuda_ms(
        lambda: bl.decode_chunks(dev, d_off, d_len, out, typesize=ts, max_blocks=max_blocks), args.repeats
    )
    B = args.batch

    def batched(fn=bl.decode_chunks, B: int = B) -> None:  # noqa: ANN001
        for a in range(0, n, B):
            fn(dev, d_off[a : a + B], d_len[a : a + B], out[a : a + B], typesize=ts, max_blocks=max_blocks)

    doc["decode_batched_ms"] = _cuda_ms(batched, args.repeats)
    doc["decode_batches_ms"] = {b: _cuda_ms(lambda b=b: batched(B=b), args.repeats) for b in args.batches}
    for b, ms in doc["decode_batches_ms"].items():
        print(f"batches of {b}: {decoded_bytes / statistics.median(ms) / 1e6:.1f} GB/s", flush=True)
    for name, fn in others.items():
        doc["other_kernels"][name]["decode_all_ms"] = _cuda_ms(
            lambda fn=fn: fn(dev, d_off, d_len, out, typesize=ts, max_blocks=max_blocks), args.repeats
        )
        doc["other_kernels"][name]["decode_batched_ms"] = _cuda_ms(lambda fn=fn: batched(fn), args.repeats)
        o = doc["other_kernels"][name]
        print(f"{name} kernel: all {decoded_bytes / statistics.median(o['decode_all_ms']) / 1e6:.1f} GB/s, "
              f"batches of {B} {decoded_bytes / statistics.median(o['decode_batched_ms']) / 1e6:.1f} GB/s",
              flush=True)  # fmt: skip

    # phases of the current kernel, timed alone (their output is incomplete): parsing only, then parsing and
    # the literals; the rest of a full decode is the matches
    def probe(mode: int, fn_b: int) -> None:
        for a in range(0, n, fn_b):
            m = min(fn_b, n - a)
            bl._blosc_lz4_kernel[(max_blocks * ts, m)](
                dev, d_off[a : a + m], d_len[a : a + m], out[a : a + m], torch.zeros(m, dtype=torch.int32,
                device="cuda"), out.stride(0), TS=ts, V=bl.LONG_STEP, G=bl.GROUP, W=bl.TILE[0], T=bl.TILE[1], B=bl.WINDOW, WL=bl.LITERAL_WIDTH, LS=0,
                PROBE=mode, num_warps=1)  # fmt: skip

    doc["probe_ms"] = {
        f"{name}_batches_of_{b}": _cuda_ms(lambda mode=mode, b=b: probe(mode, b), args.repeats)
        for name, mode in (("parse", 1), ("parse_literals", 2))
        for b in (B, n)
    }
    for key, ms in doc["probe_ms"].items():
        print(f"probe {key}: {statistics.median(ms):.2f} ms", flush=True)

    # pipelined: read a batch into a pinned slot, copy it on a side stream, decode on the main stream
    slot_bytes = max(offs[a + min(B, n - a)] - offs[a] for a in range(0, n, B))
    slots = [torch.empty(slot_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(3)]
    dslots = [torch.empty(slot_bytes, dtype=torch.uint8, device="cuda") for _ in range(2)]
    copy_stream = torch.cuda.Stream()
    band_out = torch.empty((B, chunk_bytes), dtype=torch.uint8, device="cuda")

    def read_batch(a: int, slot: torch.Tensor) -> None:
        sb = slot.numpy()
        base = offs[a]
        idx = range(a, min(a + B, n))

        def one(i: int) -> None:
            with open(files[i], "rb", buffering=0) as f:
                f.readinto(memoryview(sb[offs[i] - base : offs[i] - base + sizes[i]]))

        list(pool.map(one, idx))

    def pipelined() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        starts = list(range(0, n, B))
        reader = cf.ThreadPoolExecutor(1)
        copied: list[torch.cuda.Event] = []
        decoded: list[torch.cuda.Event] = []
        fut = reader.submit(read_batch, starts[0], slots[0])
        for j, a in enumerate(starts):
            fut.result()
            if j + 1 < len(starts):
                if j >= 2:  # host slot (j + 1) % 3 was last copied from at batch j - 2
                    copied[j - 2].synchronize()
                fut = reader.submit(read_batch, starts[j + 1], slots[(j + 1) % 3])
            m = min(B, n - a)
            nbytes = offs[a + m] - offs[a]
            ds = dslots[j % 2]
            with torch.cuda.stream(copy_stream):
                if j >= 2:  # device slot j % 2 was last decoded from at batch j - 2
                    copy_stream.wait_event(decoded[j - 2])
                ds[:nbytes].copy_(slots[j % 3][:nbytes], non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(copy_stream)
                copied.append(ev)
            torch.cuda.current_stream().wait_event(copied[j])
            lo = torch.tensor([offs[i] - offs[a] for i in range(a, a + m)], dtype=torch.int64).to("cuda")
            bl.decode_chunks(ds, lo, d_len[a : a + m], band_out[:m], typesize=ts, max_blocks=max_blocks)
            ev = torch.cuda.Event()
            ev.record()
            decoded.append(ev)
        torch.cuda.synchronize()
        reader.shutdown()
        return time.perf_counter() - t0

    pipelined()
    doc["pipelined_s"] = [pipelined() for _ in range(args.repeats)]

    def baseline() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        band = torch.empty((arr.chunks[0], arr.shape[1]), dtype=torch.float32, device="cuda")
        with ParallelBandReader(arr, pin=True) as r:
            for a in range(0, arr.shape[0], arr.chunks[0]):
                v = r.read(a, min(a + arr.chunks[0], arr.shape[0]))
                band[: v.shape[0]].copy_(torch.from_numpy(v), non_blocking=False)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    baseline()
    doc["baseline_cpu_decode_s"] = [baseline() for _ in range(args.repeats)]

    def gbps(secs: list[float], nbytes: int) -> float:
        return nbytes / statistics.median(secs) / 1e9

    doc["summary"] = {
        "read_stored_gbps": gbps(read_s, total_stored),
        "read_as_decoded_gbps": gbps(read_s, decoded_bytes),
        "h2d_stored_gbps": gbps([m / 1e3 for m in doc["h2d_ms"]], total_stored),
        "gpu_decode_all_gbps": gbps([m / 1e3 for m in doc["decode_all_ms"]], decoded_bytes),
        "gpu_decode_batched_gbps": gbps([m / 1e3 for m in doc["decode_batched_ms"]], decoded_bytes),
        "pipelined_gbps": gbps(doc["pipelined_s"], decoded_bytes),
        "baseline_cpu_decode_gbps": gbps(doc["baseline_cpu_decode_s"], decoded_bytes),
    }
    for k, v in doc["summary"].items():
        print(f"{k:28s} {v:7.2f} GB/s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    pool.shutdown()
    return 0 if doc["check"] == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
