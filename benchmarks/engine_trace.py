"""Where the batched GPU engine's time goes: a timeline of every thread for one run, per variant.

Claim measured: what bounds the e2e job's loop on the GPU (benchmarks/NOTES.md, "The batched engine"), and
how each knob below moves it.

    python benchmarks/engine_trace.py --out $OUT/engine_trace.json [--rows 1048576 --features 1024]
        [--variants default,threads14,nommap] [--trace-out $OUT/trace.json]
    TRITON_INTERPRET=1 python benchmarks/engine_trace.py --device cpu --rows 8192 --features 8 --repeats 1
        # a smoke test of the script (the batched engine through Triton's interpreter)

Makes (or reuses) the issue-5 store (16 MB Blosc-lz4 chunks) and the e2e pipeline (conv K=5 -> 256 ->
head 64), then for each variant: one warm-up run, ``--repeats`` timed runs (median seconds and GB/s),
and one run under :func:`tsconv.trace.recording`. The summary per variant says, over the
traced loop: how busy the decode threads were (mean threads decoding, and the share of 5 ms bins with
fewer than half of them busy), what the engine thread spent waiting on (ring slot, decoded rows,
result slot) and launching, how busy the GPU's copy and compute streams were, and how far decode ran
ahead of the engine (median of band decoded -> band read).

Variants set tsconv's settings (``tsconv.config.override``), ``tsconv.process`` options, or (for
exploration only) module constants; ``a+b`` applies both:
``threadsN`` (decode_threads=N), ``nommap`` (mmap off), ``headP`` (head_path=P), ``pyread`` (chunk files
read by Python threads: native_read off), ``nograph`` (cuda_graph off: no CUDA graph of the steps),
``rthreadsN`` (gpu_read_threads=N: the GPU reader's file-reading threads); ``cpudecode`` (decode="cpu":
the CPU reader), ``compression-C`` (the output compression option: auto, lz4, none);
``cprioN`` / ``dprioN`` (CUDA priority -N for the compute / the GPU reader's decode streams), ``decmbN``
(the GPU reader's decoded ring of N MB), ``twarpsN`` (its target warps per decode launch), ``lspanN`` (the
decoder's literal-span variant, N bytes per step), ``rpartN`` (the native reader's parts of N KB),
``lateread`` (the GPU reader's reads started only from the engine's calls, EARLY_READS off),
``outcodec-CNAME-CLEVEL-SHUFFLE`` (the output's Blosc codec, e.g. outcodec-lz4-0-shuffle), ``notime`` /
``nometa`` (the writer skips the time column / the per-chunk ``rows_done`` update), ``outmbN`` (output
chunks of about N MB), ``encgrpN`` (the GPU encoder's group of about N MB), ``shmout`` (the output in
/dev/shm: memory, not the disk), ``pieceN`` (N MB pieces), ``ringN`` (device ring of N pieces), ``stepN`` (N-row
steps); with the CPU reader: ``prefetchN`` (reader window of N bands), ``predecoded`` (the store decoded
into one pinned buffer at open: no decode threads in the loop), and ``predecoded+threadhog`` /
``predecoded+prochog`` / ``predecoded+pyhog`` / ``predecoded+prochog+pyhog`` (beside it, 15 threads or
processes decoding chunk files in a loop, or 15 threads doing only the per-chunk Python).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from provenance import commit, machine  # noqa: E402

import tsconv  # noqa: E402
from tsconv import config, trace  # noqa: E402
from tsconv.engine import batched  # noqa: E402
from tsconv.io import source  # noqa: E402
from tsconv.io.contracts import BandReader  # noqa: E402
from tsconv.io.readers import gpu as gpudecode  # noqa: E402
from tsconv.io.readers import threads as decode  # noqa: E402
from tsconv.synth import make_ticks  # noqa: E402


class _Predecoded(BandReader):
    """Variant ``predecoded``: the whole store decoded into one pinned buffer when the engine opens it, so
    the engine's loop runs with no decode threads in the process (the read side's ceiling; compare the
    variants' ``loop_seconds``, which leave the up-front decode out)."""

    def __init__(self, array: Any, *, where: str, pin: bool, hold: int = 1, **_: Any) -> None:
        import torch

        with decode.ParallelBandReader(array, where=where, pin=False) as r:
            self.rows, self.n_features, self.band_rows = r.rows, r.n_features, r.band_rows
            self.dtype, self.threads = r.dtype, r.threads
            nbytes = self.rows * self.n_features * self.dtype.itemsize
            self._owner = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
            self._data = self._owner.numpy().view(self.dtype).reshape(self.rows, self.n_features)
            for s in range(0, self.rows, self.band_rows):
                e = min(s + self.band_rows, self.rows)
                self._data[s:e] = r.read(s, e)
        self.where, self.pinned, self.hold = where, pin, hold

    def read(self, start: int, stop: int) -> np.ndarray:
        return self._data[start:stop]

    def close(self) -> None:
        self._data = None


def _hog_loop(paths: list[str], stop: Any, offset: int) -> None:
    """Decode the chunk files round-robin into a private buffer until ``stop`` is set."""
    import numcodecs

    codec = numcodecs.Blosc()
    out = None
    i = offset
    while not stop.is_set():
        data = np.fromfile(paths[i % len(paths)], dtype=np.uint8)
        nbytes = int.from_bytes(bytes(data[4:8]), "little")
        if out is None or out.size < nbytes:
            out = np.empty(nbytes, dtype=np.uint8)
        codec.decode(data, out=out[:nbytes])
        i += 1


class _Hog:
    """15 workers decoding the e2e store's chunk files in a loop (threads, or spawned processes)."""

    workers = 15
    paths: list[str] = []

    def __init__(self, *, procs: bool) -> None:
        import multiprocessing as mp
        import threading

        self.procs = procs
        self.ctx = mp.get_context("spawn") if procs else None
        self.stop_event = self.ctx.Event() if procs else threading.Event()
        self.running: list[Any] = []

    def start(self) -> None:
        import threading

        for k in range(self.workers):
            args = (self.paths, self.stop_event, k * 7)
            if self.procs:
                w = self.ctx.Process(target=_hog_loop, args=args)
            else:
                w = threading.Thread(target=_hog_loop, args=args)
            w.start()
            self.running.append(w)
        time.sleep(10.0 if self.procs else 0.5)  # spawned interpreters re-import this script (torch) first

    def stop(self) -> None:
        self.stop_event.set()
        for w in self.running:
            w.join()


def _pyhog_loop(paths: list[str], stop: Any, offset: int) -> None:
    """Per chunk file: the reader's Python-side steps (open, map, header, close), then 10 ms asleep."""
    import mmap

    i = offset
    while not stop.is_set():
        with open(paths[i % len(paths)], "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mapped = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        data = np.frombuffer(mapped, dtype=np.uint8)
        _ = int.from_bytes(bytes(data[4:8]), "little") + size
        del data
        mapped.close()
        time.sleep(0.010)
        i += 1


class _PyHog:
    """15 threads doing :func:`_pyhog_loop` (no decoding: the per-chunk Python only)."""

    def __init__(self) -> None:
        import threading

        self.stop_event = threading.Event()
        self.running = [
            threading.Thread(target=_pyhog_loop, args=(_Hog.paths, self.stop_event, k * 7)) for k in range(15)
        ]

    def start(self) -> None:
        for t in self.running:
            t.start()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.running:
            t.join()


# compound names that are one variant (not split at "+")
_HOG_VARIANTS = ("predecoded+pyhog", "predecoded+prochog+pyhog", "predecoded+threadhog", "predecoded+prochog")


@contextlib.contextmanager
def variant(name: str):  # noqa: ANN201
    """Apply one variant's knobs for the duration of the block; ``a+b`` applies both."""
    if "+" in name and name not in _HOG_VARIANTS:
        with contextlib.ExitStack() as stack:
            merged: dict[str, Any] = {}
            for part in name.split("+"):
                merged.update(stack.enter_context(variant(part)))
            yield merged
        return
    settings: dict[str, Any] = {}  # tsconv.config.override(...)
    extra: dict[str, Any] = {}  # tsconv.process keyword arguments
    patches: list[tuple[Any, str, Any]] = []
    hog = None
    pyhog = None
    if name.startswith("threads"):
        settings["decode_threads"] = int(name[7:])
    elif name.startswith("head"):
        settings["head_path"] = name[4:]
    elif name == "nommap":
        settings["mmap"] = False
    elif name == "cpudecode":  # the CPU reader (decode threads) instead of the GPU reader
        extra["decode"] = "cpu"
    elif name.startswith("ring"):
        patches.append((batched, "_DEVICE_RING", int(name[4:])))
    elif name.startswith("piece"):
        patches.append((batched, "PIECE_BYTES", int(name[5:]) << 20))
    elif name.startswith("step"):
        patches.append((batched, "MAX_STEP_ROWS", int(name[4:])))
    elif name.startswith("cprio"):  # the compute stream's CUDA priority -N (higher than the default 0)
        patches.append((batched, "COMPUTE_STREAM_PRIORITY", -int(name[5:])))
    elif name.startswith("dprio"):  # the GPU reader's decode streams' priority -N
        patches.append((gpudecode, "DECODE_STREAM_PRIORITY", -int(name[5:])))
    elif name.startswith("outcodec-"):  # the output's Blosc codec: outcodec-CNAME-CLEVEL-SHUFFLE
        from zarr.codecs import BloscCodec

        from tsconv.io.writers import zarr_writer as writer_mod

        _, cname, clevel, shuffle = name.split("-")
        codec = BloscCodec(cname=cname, clevel=int(clevel), shuffle=shuffle)
        patches.append((writer_mod, "_codec", lambda clevel=5: codec))
        extra["compression"] = "lz4"  # as patched, never switched by auto
    elif name.startswith("compression-"):  # tsconv.process(compression=...): auto, lz4 or none
        extra["compression"] = name.split("-", 1)[1]
    elif name.startswith("rpart"):  # the native reader's parts: N KB
        from tsconv.io.readers import fileread

        patches.append((fileread, "PART_BYTES", int(name[5:]) << 10))
    elif name == "lateread":  # the GPU reader's reads scheduled only from the engine's read_device calls
        patches.append((gpudecode, "EARLY_READS", False))
    elif name == "pyread":  # chunk and time files read by Python threads, not the native reader
        settings["native_read"] = False
    elif name == "nograph":  # the steps' launches issued one by one (no CUDA graph)
        settings["cuda_graph"] = False
    elif name.startswith("rthreads"):  # the GPU reader's file-reading threads
        settings["gpu_read_threads"] = int(name[8:])
    elif name.startswith("lspan"):  # the decoder's literal-span variant, N bytes per step
        from tsconv.kernels import blosc_lz4

        patches.append((blosc_lz4, "LITERAL_SPAN", int(name[5:])))
    elif name.startswith("twarps"):  # the GPU reader's target warps per decode launch
        patches.append((gpudecode, "TARGET_WARPS", int(name[6:])))
    elif name.startswith("decmb"):  # the GPU reader's decoded ring: N MB (both halves)
        patches.append((gpudecode, "MAX_DECODED_BYTES", int(name[5:]) << 20))
    elif name in ("notime", "nometa", "notime+nometa"):  # exploration: the writer's zarr calls left out
        from tsconv.io.writers import zarr_writer as writer_mod

        cls = writer_mod.OutputWriter
        if "notime" in name:
            init = cls.__init__

            def init_notime(self: Any, *a: Any, **kw: Any) -> None:
                init(self, *a, **kw)
                self.time_out = None

            patches.append((cls, "__init__", init_notime))
        if "nometa" in name:
            set_meta = cls._set_meta

            def set_meta_final(self: Any, **changes: Any) -> None:
                if "complete" in changes:
                    set_meta(self, **changes)

            patches.append((cls, "_set_meta", set_meta_final))
    elif name.startswith("encgrp"):  # the GPU encoder's group: about N MB of rows, up to 32 chunks
        patches.append((batched, "ENCODE_GROUP_BYTES", int(name[6:]) << 20))
        patches.append((batched, "ENCODE_GROUP_MAX", 32))
    elif name == "shmout":  # the output in /dev/shm (memory), not on the disk: handled by main()
        pass
    elif name.startswith("outmb"):  # output chunks of about N MB (the writer's target; default 16)
        from tsconv.io.writers import zarr_writer as writer_mod

        patches.append((writer_mod, "_TARGET_CHUNK_BYTES", int(name[5:]) << 20))
    elif name.startswith("prefetch"):
        n = int(name[8:])
        base = decode.ParallelBandReader

        class Reader(base):  # type: ignore[misc, valid-type]
            def __init__(self, *a: Any, **kw: Any) -> None:
                kw.setdefault("prefetch", n)
                kw.setdefault("max_ring_bytes", 8 << 30)
                super().__init__(*a, **kw)

        patches.append((source, "ParallelBandReader", Reader))
        extra["decode"] = "cpu"
    elif name == "predecoded":
        patches.append((source, "ParallelBandReader", _Predecoded))
        extra["decode"] = "cpu"
    elif name in ("predecoded+pyhog", "predecoded+prochog+pyhog"):
        # The reader's per-chunk Python work without its decoding (15 threads: open, map, header, close,
        # then 10 ms asleep instead of decoding), alone or beside the decoding processes: what a parent
        # that hands chunks to decode processes would still do in this process.
        patches.append((source, "ParallelBandReader", _Predecoded))
        extra["decode"] = "cpu"
        hog = _Hog(procs=True) if "prochog" in name else None
        pyhog = _PyHog()
    elif name in ("predecoded+threadhog", "predecoded+prochog"):
        # The same decode work as the reader's threads (Blosc chunk files, 15 workers, in a loop), done next
        # to a predecoded run: in threads of this process, or in processes. Same CPU load either way; only
        # the threads share this process's GIL with the engine thread.
        patches.append((source, "ParallelBandReader", _Predecoded))
        extra["decode"] = "cpu"
        hog = _Hog(procs=name.endswith("prochog"))
    elif name != "default":
        raise SystemExit(f"unknown variant {name!r}")
    old = [(mod, attr, getattr(mod, attr)) for mod, attr, _ in patches]
    for mod, attr, value in patches:
        setattr(mod, attr, value)
    if hog is not None:
        hog.start()
    if pyhog is not None:
        pyhog.start()
    try:
        with config.override(**settings):
            yield extra
    finally:
        if pyhog is not None:
            pyhog.stop()
        if hog is not None:
            hog.stop()
        for mod, attr, value in old:
            setattr(mod, attr, value)


class _DirtySampler:
    """The peaks of /proc/meminfo's Dirty and Writeback (MB) while a run writes, sampled every 20 ms."""

    def __init__(self) -> None:
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            try:
                for line in Path("/proc/meminfo").read_text().splitlines():
                    key, val = line.split(":", 1)
                    if key in ("Dirty", "Writeback"):
                        self.peaks[key] = max(self.peaks.get(key, 0.0), int(val.split()[0]) / 1024)
            except OSError:
                return

    def __enter__(self) -> _DirtySampler:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def summarise(spans: list[tuple[str, int, float, float, Any]], threads: int) -> dict[str, Any]:
    """The traced run in a few numbers (see the module docstring)."""
    by: dict[str, list[tuple[int, float, float, Any]]] = defaultdict(list)
    for name, tid, t0, t1, arg in spans:
        by[name].append((tid, t0, t1, arg))
    eng = [s for k in ("ring_wait", "read_wait", "launch_piece", "launch_step", "slot_wait") for s in by[k]]
    if not eng:
        return {"error": "no engine spans (not the batched engine?)"}
    lo = min(t0 for _, t0, _, _ in eng)
    hi = max(t1 for _, _, t1, _ in eng)
    loop = hi - lo
    out: dict[str, Any] = {"loop_seconds": loop}
    for k in ("ring_wait", "read_wait", "launch_piece", "copy_call", "prepare_call", "launch_step", "slot_wait",
              "emit", "write", "write_time", "write_record"):  # fmt: skip
        out[f"{k}_seconds"] = sum(t1 - t0 for _, t0, t1, _ in by[k])
    out["engine_busy_share"] = sum(t1 - t0 for _, t0, t1, _ in eng) / loop if loop > 0 else 0.0
    dec = by["decode"]
    if dec:
        bins = np.zeros(max(1, int(np.ceil(loop / 0.005))))
        for _, t0, t1, _ in dec:
            a, b = max(t0, lo), min(t1, hi)
            if b <= a:
                continue
            i0, i1 = int((a - lo) / 0.005), int((b - lo) / 0.005)
            for i in range(i0, min(i1, len(bins) - 1) + 1):
                s, e = lo + i * 0.005, lo + (i + 1) * 0.005
                bins[i] += max(0.0, min(b, e) - max(a, s)) / 0.005
        out["decode_threads_busy_mean"] = float(bins.mean())
        out["decode_bins_under_half"] = float((bins < threads / 2).mean())
        per = [t1 - t0 for _, t0, t1, _ in dec]
        out["decode_chunk_ms_median"] = 1e3 * statistics.median(per)
        done = defaultdict(float)
        for _, _, t1, band in dec:
            done[band] = max(done[band], t1)
        read = {}
        for _, t0, _, band in by["read_wait"]:
            read.setdefault(band, t0)
        lead = [read[b] - done[b] for b in read if b in done]
        if lead:
            out["decode_lead_ms_median"] = 1e3 * statistics.median(lead)
            out["bands_read_before_decoded"] = float(np.mean([x < 0 for x in lead]))
    for k in ("gpu_copy", "gpu_prepare", "gpu_compute", "gpu_d2h", "gpu_stored_h2d", "gpu_decode"):
        if by[k]:
            out[f"{k}_busy_share"] = sum(t1 - t0 for _, t0, t1, _ in by[k]) / loop
    for k in ("reader_wait_files", "reader_launch"):
        if by[k]:
            out[f"{k}_seconds"] = sum(t1 - t0 for _, t0, t1, _ in by[k])
    if by[
        "gpu_decode"
    ]:  # how much of the loop the GPU ran decode and the engine's kernels, apart and together
        step = 1e-4
        n = max(1, int(np.ceil(loop / step)))

        def mask(keys: tuple[str, ...]) -> np.ndarray:
            m = np.zeros(n, dtype=bool)
            for k in keys:
                for _, t0, t1, _ in by[k]:
                    m[max(0, int((t0 - lo) / step)) : max(0, int((t1 - lo) / step))] = True
            return m

        d, c = mask(("gpu_decode",)), mask(("gpu_prepare", "gpu_compute"))
        out["gpu_share"] = {"decode_only": float((d & ~c).mean()), "engine_only": float((c & ~d).mean()),
                            "both": float((d & c).mean()), "idle": float((~d & ~c).mean())}  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="engine_trace.json")
    ap.add_argument("--trace-out", default=None, help="raw spans of the first variant's traced run")
    ap.add_argument("--work", default="/tmp/tsconv-e2e")
    ap.add_argument("--rows", type=int, default=1 << 20)
    ap.add_argument("--features", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default="default")
    ap.add_argument("--pipeline", default=None, help="a built-in pipeline (default: the e2e dense one)")
    ap.add_argument("--device", default="cuda", help="cpu only for a smoke test under TRITON_INTERPRET=1")
    ap.add_argument(
        "--store", default=None, help="trace this store (e.g. one of cli.py's) instead of making one"
    )
    args = ap.parse_args()
    if args.device == "cpu" and not config.interpreted():
        raise SystemExit(
            "--device cpu runs the batched engine through Triton's interpreter: set TRITON_INTERPRET=1"
        )
    from e2e import write_pipeline

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"ticks_{args.rows}x{args.features}_16mb.zarr"
    if args.store is not None:
        import zarr

        src = Path(args.store)
        args.rows, args.features = zarr.open_group(str(src), mode="r")["values"].shape
    elif not src.exists():
        t0 = time.perf_counter()
        make_ticks(src, rows=args.rows, features=args.features, seed=0)
        print(f"generated {src.name} in {time.perf_counter() - t0:.1f} s", flush=True)
    pipe = args.pipeline or write_pipeline(work / "pipe", args.features)
    _Hog.paths = sorted(str(p) for p in (src / "values").rglob("*") if p.is_file() and p.name != "zarr.json")
    out = work / "trace_out.zarr"
    nbytes = args.rows * args.features * 4
    kw: dict[str, Any] = {"device": args.device, "overwrite": True, "pipeline": pipe}

    # on the CPU (a smoke test) the batched engine is asked for, through Triton's interpreter
    def cpu() -> contextlib.AbstractContextManager[Any]:
        return config.override(engine="batched") if args.device == "cpu" else contextlib.nullcontext()

    import datetime as dt

    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    doc: dict[str, Any] = {"gpu": gpu, "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                           "commit": commit(), **machine(), "store": src.name, "rows": args.rows,
                           "features": args.features,
                           "variants": {}}  # fmt: skip
    with cpu():
        tsconv.process(src, out, **kw)  # compile, autotune cache, page cache
    names = args.variants.split(",")
    for i, name in enumerate(names):
        key = name if names[:i].count(name) == 0 else f"{name}#{names[:i].count(name) + 1}"  # a repeat
        kw["output"] = Path("/dev/shm/tsconv_trace_out.zarr") if "shmout" in name else out
        with cpu(), variant(name) as extra:
            # a new variant's first run (workers start)
            first = tsconv.process(src, **kw, **extra).seconds
            secs, reps = [], []
            for _ in range(args.repeats):
                r = tsconv.process(src, **kw, **extra)
                secs.append(r.seconds)
                reps.append(r.to_dict())
            with trace.recording() as spans, _DirtySampler() as dirty:
                r = tsconv.process(src, **kw, **extra)
            threads = decode.default_threads()  # the decode threads in force for this variant
        med = statistics.median(secs)
        doc["variants"][key] = {
            "first_seconds": first,
            "seconds": secs,
            "median_seconds": med,
            "input_gbps": nbytes / med / 1e9,
            "traced_seconds": r.seconds,
            "dirty_max_mb": dirty.peaks,
            "step_rows": reps[-1].get("step_rows"),
            "stage_seconds": reps[-1].get("stage_seconds"),
            "loop_seconds": statistics.median(
                (rep.get("stage_seconds") or {}).get("loop", float("nan")) for rep in reps
            ),
            "cuda_graph": reps[-1].get("cuda_graph"),
            "compression": reps[-1].get("compression"),
            "file_reads": reps[-1].get("file_reads"),
            "peak_gpu_allocated_bytes": max(rep["peak_gpu_allocated_bytes"] or 0 for rep in reps),
            "peak_gpu_reserved_bytes": max(rep["peak_gpu_reserved_bytes"] or 0 for rep in reps),
            "summary": summarise(spans, threads),
        }
        loop = doc["variants"][key]["loop_seconds"]
        print(
            key,
            json.dumps(doc["variants"][key]["summary"]),
            f"median {med:.3f} s, loop {loop:.3f} s",
            flush=True,
        )
        if i == 0 and args.trace_out:
            Path(args.trace_out).write_text(json.dumps([list(s) for s in spans]))
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
