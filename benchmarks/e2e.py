"""End to end on the GPU: `tsconv process --device cuda` against the naive loop and the whole series in GPU memory.

Claim measured: the engine streams a 4.3 GB store through the e2e pipeline many times faster than a naive
chunk loop and faster than the whole series held in GPU memory, within its 1.2 GB GPU memory budget at any
length, with output matching the CPU engine and float64 (benchmarks/NOTES.md, "The batched engine").

    python benchmarks/e2e.py --out $OUT/e2e.json [--work /tmp/tsconv-e2e] [--quick] [--sections gen,check,modes]
    python benchmarks/e2e.py --render benchmarks/results/e2e.json   # only the .md and .png from a JSON

What it does, in one process (H200 machine; warm page cache unless stated):

1. writes a 1,048,576 x 1024 float32 Blosc-lz4 tick store with the generator's default 16 MB chunks
   (4096 rows) and the same series with 64 MB chunks (16384 rows);
2. the pipeline is the one the baselines in ../shared/FACTS.md ran: a dense causal conv K=5 over all
   features to 256 channels, then a projection head to 64 outputs (FP16-stored weights, fp32 compute);
3. checks the GPU output against the CPU engine and a float64 reference on a prefix (NaN pattern
   identical, error within the fp32 bound of tests/helpers.py), with several steps per run;
4. times the engine (median of repeats) in each transfer mode, the naive loop (once: 17-20 s) and the
   in-memory run (median of repeats);
5. longer stores (2M, 4M, 8M steps) and a 4096-feature store, made by hard-linking the chunk files of
   the generated ones cyclically (the same bytes repeat; the page cache holds them once), for the GPU
   memory and time against length; a cold-cache run after evicting the chunk files (posix_fadvise);
6. (section ``tune``) decode and write threads, with the CPU reader.

One JSON object per run in ``runs`` (keys: steps, features, input_gbps, seconds, peak_gpu_bytes,
naive_gbps, in_memory_gbps, transfer, stage_seconds, gpu, date, commit, ...), the same gpu, date and
commit at the top. The
results are written after every section, so a timeout keeps what was measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import zarr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import commit  # noqa: E402

import tsconv  # noqa: E402
from tsconv.synth import make_ticks  # noqa: E402

STEPS = 1 << 20
CHUNK = 1024


def _mode(row: dict[str, Any]) -> str:
    """The transfer column: the transfer mode, and "GPU decode" for runs whose input was decoded on the GPU."""
    codec = (row.get("compression") or "").split(" ")[0]  # absent in older rows
    return (row["transfer"] + (", GPU decode" if row.get("reader") == "gpu" else "")
            + (f", output {codec}" if codec else ""))  # fmt: skip


def write_pipeline(directory: Path, features: int, *, out: int = 256, k: int = 5, head: int = 64) -> Path:
    """conv K over all features -> ``out`` channels (ReLU), head -> ``head`` outputs; seeded weights."""
    rng = np.random.default_rng(7)
    directory.mkdir(parents=True, exist_ok=True)
    w = (rng.standard_normal((out, features, k)) / np.sqrt(features * k)).astype(np.float32)
    hw = (rng.standard_normal((out, head)) / np.sqrt(out)).astype(np.float32)
    np.save(directory / f"conv_{features}.npy", w)
    np.save(directory / f"head_{features}.npy", hw)
    path = directory / f"e2e_{features}.toml"
    path.write_text(
        f'name = "e2e_{features}"\nweight_dtype = "float16"\n\n[[conv]]\nname = "mix"\n'
        f'weights = "conv_{features}.npy"\nactivation = "relu"\n\n[head]\nweights = "head_{features}.npy"\n'
    )
    return path


def linked_store(src: Path, dst: Path, rows: int) -> Path:
    """A store of ``rows`` rows whose chunk files are hard links to ``src``'s, repeated cyclically."""
    if dst.exists():
        shutil.rmtree(dst)
    g = zarr.open_group(str(src), mode="r")
    v = g["values"]
    band = v.chunks[0]
    n_src = v.shape[0] // band
    if rows % band or v.shape[0] % band or v.chunks[1] != v.shape[1]:
        raise ValueError("linked_store needs whole bands spanning all features")
    out = zarr.open_group(str(dst), mode="w", zarr_format=3)
    out.create_array("values", shape=(rows, v.shape[1]), chunks=v.chunks, dtype=v.dtype,
                     compressors=v.compressors, fill_value=v.fill_value)  # fmt: skip
    t = np.asarray(g["time"][:2]).astype(np.int64)
    out.create_array(
        "time", data=t[0] + np.arange(rows, dtype=np.int64) * int(t[1] - t[0]), chunks=(band * 16,)
    )
    out.attrs.update(dict(g.attrs))
    for b in range(rows // band):
        target = dst / "values" / "c" / str(b) / "0"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(src / "values" / "c" / str(b % n_src) / "0", target)
    return dst


def evict(store: Path) -> str:
    """Drop a store's chunk files from the page cache (drop_caches when permitted, else fadvise)."""
    try:
        subprocess.run(["sync"], check=False)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches"
    except OSError:
        pass
    for f in (store / "values").rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return "posix_fadvise(DONTNEED) per chunk file"


def run_engine(src: Path, out: Path, pipe: Path, **kw: Any) -> dict[str, Any]:
    import gc

    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()  # what this process holds before the run (counted in the peak)
    t0 = time.perf_counter()
    rep = tsconv.process(src, out, pipeline=pipe, device="cuda", overwrite=True, **kw)
    wall = time.perf_counter() - t0
    d = rep.to_dict()
    d["wall_seconds"] = wall
    d["base_gpu_bytes"] = base
    return d


def naive_loop(src: Path, out: Path, w: torch.Tensor, hw: torch.Tensor) -> float:
    """Read each 1024-step chunk (+ halo) with zarr, to the GPU, conv, head, back, write: seconds."""
    g = zarr.open_group(str(src), mode="r")
    v = g["values"]
    T, Fn = v.shape
    halo = w.shape[2] - 1
    if out.exists():
        shutil.rmtree(out)
    o = zarr.open_group(str(out), mode="w", zarr_format=3)
    ov = o.create_array("values", shape=(T, hw.shape[1]), chunks=(65536, hw.shape[1]), dtype="float32")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    carry = torch.zeros((halo, Fn), device="cuda")
    buf = np.empty((65536, hw.shape[1]), dtype=np.float32)
    for s in range(0, T, CHUNK):
        x = torch.from_numpy(np.asarray(v[s : s + CHUNK])).cuda()
        xx = torch.cat([carry, x])
        carry = xx[-halo:]
        y = torch.relu(F.conv1d(xx.T[None], w))[0].T @ hw
        i = s % 65536
        buf[i : i + CHUNK] = y.cpu().numpy()
        if i + CHUNK == 65536 or s + CHUNK >= T:
            ov[s + CHUNK - (i + CHUNK) : s + CHUNK] = buf[: i + CHUNK]
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def in_memory(src: Path, out: Path, w: torch.Tensor, hw: torch.Tensor) -> tuple[float, int]:
    """Read the whole series, pad, conv, head on the GPU, write: (seconds, peak GPU bytes)."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    x = torch.from_numpy(np.asarray(zarr.open_group(str(src), mode="r")["values"][:])).cuda()
    y = torch.relu(F.conv1d(F.pad(x.T[None], (w.shape[2] - 1, 0)), w))[0].T @ hw
    del x
    host = y.cpu().numpy()
    if out.exists():
        shutil.rmtree(out)
    o = zarr.open_group(str(out), mode="w", zarr_format=3)
    o.create_array("values", data=host, chunks=(65536, host.shape[1]))
    torch.cuda.synchronize()
    return time.perf_counter() - t0, int(torch.cuda.max_memory_allocated())


def check_prefix(src: Path, out: Path, pipe: Path, rows: int) -> dict[str, Any]:
    """GPU output rows [0, rows) against the CPU engine and the float64 reference on the same prefix."""
    from tests.helpers import error_bound
    from tsconv.kernels.reference import pipeline_reference
    from tsconv.pipeline.spec import load_pipeline, resolve

    g = zarr.open_group(str(src), mode="r")
    x = np.asarray(g["values"][:rows])
    names = list(g.attrs["features"])
    plan = resolve(load_pipeline(pipe), names)
    gpu = np.asarray(zarr.open_group(str(out), mode="r")["values"][:rows])
    t0 = time.perf_counter()
    cpu = tsconv.features(x, load_pipeline(pipe), names=names, device="cpu")
    cpu_s = time.perf_counter() - t0
    ref = pipeline_reference(x, plan)
    bound = error_bound(x, plan)
    ok = ~np.isnan(ref)
    res: dict[str, Any] = {"rows": rows, "cpu_engine_seconds": cpu_s}
    for name, y in (("gpu", gpu), ("cpu", cpu)):
        err = np.abs(y.astype(np.float64) - ref)
        res[f"{name}_nan_pattern_equal"] = bool(np.array_equal(np.isnan(y), np.isnan(ref)))
        res[f"{name}_max_err_over_bound"] = float(np.max(err[ok] / bound[ok]))
        res[f"{name}_max_rel_err"] = float(np.max(err[ok]) / np.max(np.abs(ref[ok])))
    diff = np.abs(gpu.astype(np.float64) - cpu)
    res["gpu_vs_cpu_max_abs"] = float(np.nanmax(diff))
    res["gpu_vs_cpu_within_bound"] = bool(np.all(diff[ok] <= 2 * bound[ok]))
    res["pass"] = bool(
        res["gpu_nan_pattern_equal"]
        and res["gpu_max_err_over_bound"] <= 1.0
        and res["gpu_vs_cpu_within_bound"]
    )
    return res


def _peaks(r: dict[str, Any]) -> str:
    alloc, res = r.get("peak_gpu_bytes"), r.get("peak_gpu_reserved_bytes")
    return " / ".join("?" if v is None else f"{v / 1e6:,.0f}" for v in (alloc, res))


def render(doc: dict[str, Any], md: Path, png: Path | None) -> None:
    """A readable table (and, with matplotlib, a plot of time and GPU memory against steps) from the JSON."""
    b = doc.get("baselines", {})
    lines = [
        "# End to end on the GPU: `tsconv process --device cuda`",
        "",
        f"GPU {doc['gpu']}, {doc['date']}, commit {doc['commit']}, torch {doc.get('torch', '?')}, "
        f"{doc.get('cpus', '?')} CPU cores. Pipeline: dense causal conv K=5 over all features -> 256 (ReLU), "
        "head -> 64; FP16-stored weights, fp32 compute. Warm page cache unless stated. `peak GPU MB`: "
        "`max_memory_allocated` / `max_memory_reserved` during the run (10^6 bytes; the budget is 1,200), "
        "what the process already held included (`held before`: cuBLAS workspaces of earlier work).",
        "",
        f"Baselines on the 1,048,576 x 1024 store (16 MB chunks), same process: naive loop "
        f"{b.get('naive_seconds', float('nan')):.2f} s ({b.get('naive_gbps', float('nan')):.2f} GB/s), whole series in "
        f"GPU memory {b.get('in_memory_seconds', float('nan')):.2f} s ({b.get('in_memory_gbps', float('nan')):.2f} GB/s, "
        f"{b.get('in_memory_peak_gpu_bytes', 0) / 2**30:.1f} GiB of GPU memory).",
        "",
        "| store | steps | features | chunks | transfer | cache | seconds | wall s | GB/s in | vs naive "
        "| vs in-memory | peak GPU MB allocated / reserved | held before MB | step rows | bound by "
        "| decode / h2d / compute / write (s) | commit |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in doc["runs"] + doc.get("earlier_runs", []):
        st = r["stage_seconds"]
        own = r.get("own_peak_gpu_bytes")
        wall = f"{r['wall_seconds']:.3f}" if "wall_seconds" in r else ""
        lines.append(
            f"| {r['store']} | {r['steps']:,} | {r['features']} | {r.get('chunk_mb', '?')} MB | {_mode(r)} "
            f"| {r.get('cache', 'warm')} | {r['seconds']:.3f} | {wall} | {r['input_gbps']:.2f} "
            f"| {r['input_gbps'] / b['naive_gbps']:.1f}x | {r['input_gbps'] / b['in_memory_gbps']:.1f}x "
            f"| {_peaks(r)} | {r.get('base_gpu_bytes', 0) / 1e6:.0f} | {r['step_rows']:,} | {r['bound_by']} | {st['decode']:.3f} / {st['h2d']:.3f} / "
            f"{st['compute']:.3f} / {st['write']:.3f} | {r['commit']} |"
            if own is not None and b
            else f"| {r['store']} | {r['steps']:,} | {r['features']} | {r.get('chunk_mb', '?')} MB | {_mode(r)} "
            f"| {r.get('cache', 'warm')} | {r['seconds']:.3f} | {wall} | {r['input_gbps']:.2f} | | | {_peaks(r)} | "
            f"| {r['step_rows']:,} | {r['bound_by']} | {st['decode']:.3f} / {st['h2d']:.3f} / {st['compute']:.3f} / "
            f"{st['write']:.3f} | {r['commit']} |"
        )
    lines += ["", "`seconds`: the report's (from creating the output to its end); `wall s`: the whole tsconv.process "
              "call, opening and checking the input and removing the previous output included. Stage seconds: decode and write are busy seconds per thread; h2d, "
              "compute (prepare kernel + stages) and d2h are GPU event times. `output`: the values' codec "
              "(`--compression auto` keeps lz4 only where it saves 10% of a sample; these outputs save about "
              "5-7%); the baselines write with zarr's default codec.", ""]  # fmt: skip
    md.write_text("\n".join(lines) + "\n")
    if png is None:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for feats, marker, color in ((1024, "o", "C0"), (4096, "s", "C1")):
        rows = [r for r in doc["runs"] + doc.get("earlier_runs", [])
                if r["features"] == feats and r["transfer"] == "pinned" and r.get("cache", "warm") == "warm"
                and r.get("chunk_mb") == 16]  # fmt: skip
        # the default run: the GPU reader where it ran, the output codec chosen by auto (not forced)
        default = [
            r
            for r in rows
            if r.get("reader") in (None, "gpu") and "auto" in str(r.get("compression") or "auto")
        ]
        rows = default or rows
        pts = sorted({r["steps"]: r["seconds"] for r in rows}.items())
        ax1.plot([p[0] / 2**20 for p in pts], [p[1] for p in pts], marker=marker, color=color,
                 label=f"{feats} features")  # fmt: skip
        for key, style, what in (
            ("peak_gpu_bytes", "-", "allocated"),
            ("peak_gpu_reserved_bytes", ":", "reserved"),
        ):
            mem = sorted({r["steps"]: r.get(key) for r in doc["runs"] if r in rows and r.get(key)}.items())
            ax2.plot([p[0] / 2**20 for p in mem], [p[1] / 1e6 for p in mem], marker=marker, linestyle=style,
                     color=color, label=f"{feats} features, {what}")  # fmt: skip
    ax1.set(xlabel="steps (Mi)", ylabel="seconds", title="time against length (warm cache)")
    ax2.axhline(1200, color="red", linestyle="--", label="1.2 GB budget")
    ax2.set(
        xlabel="steps (Mi)", ylabel="peak GPU MB (10^6 B)", title="GPU memory against length", ylim=(0, 1400)
    )
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "e2e.json"))
    ap.add_argument("--work", default="/tmp/tsconv-e2e")
    ap.add_argument("--quick", action="store_true", help="fewer repeats, no 8M / 4096-feature runs")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--render", type=Path, default=None, help="only write the .md and .png beside this JSON")
    ap.add_argument(
        "--sections", default="all", help="comma list: gen,check,modes,baselines,big,scale,wide,tune,cold"
    )
    args = ap.parse_args()
    if args.render is not None:
        doc = json.loads(args.render.read_text())
        render(doc, args.render.with_suffix(".md"), args.render.with_suffix(".png"))
        return 0
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    sections = set(args.sections.split(",")) if args.sections != "all" else None

    def want(name: str) -> bool:
        return sections is None or name in sections

    doc: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "runs": [],
        "checks": [],
        "setup": {},
        "errors": [],
    }
    out_json = Path(args.out)

    def save() -> None:
        out_json.parent.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps(doc, indent=2) + "\n")

    def section(name: str, fn) -> None:  # noqa: ANN001
        if not want(name):
            return
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # keep going: record and continue with the other sections
            import traceback

            doc["errors"].append({"section": name, "error": f"{type(exc).__name__}: {exc}",
                                  "trace": traceback.format_exc()[-3000:]})  # fmt: skip
            print(f"[{name}] FAILED: {exc}", flush=True)
        print(f"[{name}] {time.perf_counter() - t0:.1f} s", flush=True)
        save()

    a16 = work / f"ticks_{STEPS}x1024_16mb.zarr"
    a64 = work / f"ticks_{STEPS}x1024_64mb.zarr"
    pipe = write_pipeline(work / "pipe", 1024)
    outp = work / "out.zarr"

    def gen() -> None:
        for path, chunk_rows in ((a16, None), (a64, 16384)):
            if not path.exists():
                t0 = time.perf_counter()
                make_ticks(path, rows=STEPS, features=1024, seed=0, chunk_rows=chunk_rows)
                doc["setup"][path.name] = {"generate_seconds": time.perf_counter() - t0}
        t0 = time.perf_counter()
        doc["first_run"] = run_engine(a16, outp, pipe)  # autotune (disk cache), allocator, page cache
        doc["first_run"]["note"] = "first call in the process: includes Triton compile/tuning"
        print("first run", doc["first_run"]["seconds"], flush=True)

    section("gen", gen)

    def record(src: Path, rep: dict[str, Any], reps: list[float], **extra: Any) -> dict[str, Any]:
        secs = statistics.median(reps)
        steps, feats = rep["total_rows"], rep["features_in"]
        row = {
            "store": src.name,
            "steps": steps,
            "features": feats,
            "seconds": secs,
            "seconds_all": reps,
            "wall_seconds": statistics.median(rep.get("wall_seconds_all") or [rep["wall_seconds"]]),
            "input_gbps": steps * feats * 4 / secs / 1e9,
            "peak_gpu_bytes": rep["peak_gpu_allocated_bytes"],
            "peak_gpu_reserved_bytes": rep["peak_gpu_reserved_bytes"],
            "base_gpu_bytes": rep["base_gpu_bytes"],
            "own_peak_gpu_bytes": rep["peak_gpu_allocated_bytes"] - rep["base_gpu_bytes"],
            "commit": doc["commit"],
            "gpu": doc["gpu"],
            "date": doc["date"],
            "transfer": rep["transfer"],
            "step_rows": rep["step_rows"],
            "stage_seconds": rep["stage_seconds"],
            "bound_by": rep["bound_by"],
            "reader": rep.get("reader"),
            # the same process's baselines, for rows recorded after them (earlier rows get them there)
            **(
                {
                    "naive_gbps": doc["baselines"]["naive_gbps"],
                    "in_memory_gbps": doc["baselines"]["in_memory_gbps"],
                }
                if "baselines" in doc
                else {}
            ),
            "compression": rep.get("compression"),
            "cuda_graph": rep.get("cuda_graph"),
            "file_reads": rep.get("file_reads"),
            **extra,
        }
        doc["runs"].append(row)
        print(json.dumps({k: row[k] for k in ("store", "transfer", "seconds", "input_gbps", "peak_gpu_bytes",
                                               "bound_by")}), flush=True)  # fmt: skip
        return row

    def timed(src: Path, pipe_path: Path, n: int, **kw: Any) -> tuple[dict[str, Any], list[float]]:
        reps, walls, rep = [], [], None
        for _ in range(n):
            rep = run_engine(src, outp, pipe_path, **kw)
            reps.append(rep["seconds"])
            walls.append(rep["wall_seconds"])
        rep["wall_seconds_all"] = walls  # the whole tsconv.process call (opening the input included)
        return rep, reps

    def check() -> None:
        for budget, decode in (("200MB", "cpu"), ("1.2GB", "cpu"), ("1.2GB", "gpu")):
            rep = run_engine(a16, outp, pipe, gpu_mem=budget, decode=decode)
            res = check_prefix(a16, outp, pipe, 16384 if args.quick else 20480)
            res.update(gpu_mem=budget, step_rows=rep["step_rows"], reader=rep.get("reader"))
            doc["checks"].append(res)
            print("check", json.dumps(res), flush=True)

    section("check", check)

    def modes() -> None:
        for transfer in ("pinned", "mapped", "pageable"):  # the CPU reader in each transfer mode
            n = args.repeats if transfer == "pinned" else max(1, args.repeats - 1)
            rep, reps = timed(a16, pipe, n, transfer=transfer, decode="cpu")
            record(a16, rep, reps, chunk_mb=16)
        for src, mb in ((a16, 16), (a64, 64)):  # the default: the GPU reader, pinned
            rep, reps = timed(src, pipe, args.repeats)
            record(src, rep, reps, chunk_mb=mb)
        # the default's output codec is "auto" (this pipeline's outputs: uncompressed); lz4 forced, beside it
        rep, reps = timed(a16, pipe, args.repeats, compression="lz4")
        record(a16, rep, reps, chunk_mb=16)

    section("modes", modes)

    def baselines() -> None:
        from tsconv.pipeline.spec import load_pipeline, resolve

        names = list(zarr.open_group(str(a16), mode="r").attrs["features"])
        plan = resolve(load_pipeline(pipe), names)
        w = torch.from_numpy(plan.layers[0].weight.astype(np.float32)).cuda()
        hw = torch.from_numpy(plan.head.weight.astype(np.float32)).cuda()
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            torch.backends.cuda.matmul.allow_tf32 = False
            naive = naive_loop(a16, work / "naive.zarr", w, hw)
            # the in-memory run, like tsconv's, as a median (one run moved 1.31-1.58 GB/s between machines)
            mem = [in_memory(a16, work / "inmem.zarr", w, hw) for _ in range(args.repeats)]
            mem_s, mem_peak = statistics.median(m[0] for m in mem), max(m[1] for m in mem)
        gb = STEPS * 1024 * 4 / 1e9
        doc["baselines"] = {"naive_seconds": naive, "naive_gbps": gb / naive, "in_memory_seconds": mem_s,
                            "in_memory_seconds_all": [m[0] for m in mem],
                            "in_memory_gbps": gb / mem_s, "in_memory_peak_gpu_bytes": mem_peak}  # fmt: skip
        print("baselines", doc["baselines"], flush=True)
        for row in doc["runs"]:
            row["naive_gbps"] = gb / naive
            row["in_memory_gbps"] = gb / mem_s

    section("baselines", baselines)

    def big_chunks() -> None:
        rep, reps = timed(a64, pipe, args.repeats)
        record(a64, rep, reps, chunk_mb=64)

    section("big", big_chunks)

    def scale() -> None:
        for mult in (2, 4) if args.quick else (2, 4, 8):
            dst = linked_store(a16, work / f"linked_{mult}m.zarr", STEPS * mult)
            rep, reps = timed(dst, pipe, 1)
            record(dst, rep, reps, chunk_mb=16, linked=True)
            shutil.rmtree(dst)

    section("scale", scale)

    def wide() -> None:
        c = work / "ticks_262144x4096.zarr"
        if not c.exists():
            make_ticks(c, rows=262144, features=4096, seed=1)
        p4 = write_pipeline(work / "pipe", 4096)
        run_engine(c, outp, p4)  # tune the 4096-wide shape class
        rep, reps = timed(c, p4, 2)
        record(c, rep, reps, chunk_mb=16)
        for rows in (STEPS,) if args.quick else (STEPS, 2 * STEPS):
            dst = linked_store(c, work / f"linked_4096_{rows}.zarr", rows)
            rep, reps = timed(dst, p4, 1)
            record(dst, rep, reps, chunk_mb=16, linked=True)
            shutil.rmtree(dst)

    section("wide", wide)

    def tune() -> None:
        # decode and write threads with the CPU reader (whose threads they are), each config twice, in this
        # one process (the I/O threads' nice value and the GIL switch interval are fixed since they were tuned)
        doc["tune"] = []
        for dec, wr in ((16, 8), (16, 4), (14, 4), (15, 2)):
            with tsconv.config.override(decode_threads=dec, write_threads=wr):
                reps = [run_engine(a16, outp, pipe, decode="cpu") for _ in range(2)]
            best = min(reps, key=lambda r: r["seconds"])
            row = {"decode_threads": dec, "write_threads": wr, "reader": best.get("reader"),
                   "seconds": [r["seconds"] for r in reps], "stage_seconds": best["stage_seconds"]}  # fmt: skip
            doc["tune"].append(row)
            st = best["stage_seconds"]
            print("tune", dec, wr, [round(r["seconds"], 3) for r in reps],
                  {k: round(st[k], 3) for k in ("loop", "loop_cpu", "read_wait", "ring_wait", "decode", "prepare",
                                                "compute", "h2d") if k in st}, flush=True)  # fmt: skip

    section("tune", tune)

    def cold() -> None:
        how = evict(a16)
        rep = run_engine(a16, outp, pipe)
        record(a16, rep, [rep["seconds"]], chunk_mb=16, cache="cold", evicted_by=how)

    section("cold", cold)
    save()
    return 0 if not doc["errors"] and all(c["pass"] for c in doc["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
