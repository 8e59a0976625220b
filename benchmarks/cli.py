"""The benchmark of record: a fresh `tsconv process` per measurement, on stores written by plain zarr.

Claim measured: a batch job that runs `tsconv process` once per store, in a fresh process, beats what a user
would otherwise write on the same store in the same run: a hand-written chunk loop over zarr with cuDNN
(``naive``), the whole series in GPU memory (``inmem``) and, for bank pipelines, polars on all cores from
reading the store to the same features written as Parquet (``polars``).

    python benchmarks/cli.py --out $OUT/cli.json [--work /tmp/tsconv-cli] [--cases a,b,e] [--merge OLD.json]
    python benchmarks/cli.py --render benchmarks/results/cli.json   # only the .md and .png from a JSON

Stores (float32 tick prices, a few symbols starting late; written with ``zarr.create_array``, not tsconv):

- ``a``: 1,048,576 x 1024, Blosc-LZ4 with shuffle, row chunks of 4096 x 1024 (16 MB), dense pipeline;
- ``b``: the same series as zarr writes it by default (zstd), chunks (16384, 256) splitting the features;
- ``c``: 2,097,152 x 96, zstd (zarr's default), the built-in ``default`` and ``trend_ema`` pipelines;
- ``d``: 262,144 x 4096, Blosc-LZ4, row chunks, dense pipeline;
- ``e``: 131,072 x 64, zstd, the ``default`` and dense pipelines (a research script's size).

The dense pipeline is a causal conv K=5 over all features to 256 channels (ReLU), then a head to 64 outputs,
FP16-stored weights. Each case: one run that fills the tuning cache, then ``--repeats`` timed runs (median);
the baselines once each (polars: median of ``--repeats``), in this process. The bare start-up of the same
interpreter (``import torch; torch.zeros(1, device="cuda")``) is measured in the same call, and one run per
call with an empty tuning cache (``cold_cache: true``). One JSON object per run under ``runs``.

Python's bytecode must be cacheable, as it is in an installed package (pip compiles it): the run that fills
the tuning cache also writes it. Where site-packages is read-only (the H200 machine), set
``PYTHONPYCACHEPREFIX`` to a writable folder; the JSON records both settings. Without a cache every process
compiles torch's, zarr's and Triton's sources again: 2.8 s of a fresh run there (cProfile).
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
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from provenance import commit, machine  # noqa: E402

CHUNK = 1024  # the naive loop's step, the engine's default chunk
ROWS_PER_BAND = 16384  # rows generated at once (and zarr's (16384, 256) chunk of case b)

CASES: dict[str, dict[str, Any]] = {
    "a": {"rows": 1 << 20, "features": 1024, "codec": "lz4", "chunks": (4096, 1024), "pipelines": ["dense"]},
    "b": {"rows": 1 << 20, "features": 1024, "codec": "zstd", "chunks": (16384, 256), "pipelines": ["dense"],
          "same_series_as": "a"},
    "c": {"rows": 1 << 21, "features": 96, "codec": "zstd", "chunks": None, "pipelines": ["default", "trend_ema"]},
    "d": {"rows": 1 << 18, "features": 4096, "codec": "lz4", "chunks": (1024, 4096), "pipelines": ["dense"]},
    "e": {"rows": 1 << 17, "features": 64, "codec": "zstd", "chunks": None, "pipelines": ["default", "dense"]},
}  # fmt: skip


# ------------------------------------------------------------------------------------------- stores


def _band(seed: int, band: int, rows: int, features: int) -> np.ndarray:
    """Tick increments of one band: int32 cumulative ticks within the band."""
    rng = np.random.default_rng([seed, band])
    steps = rng.integers(-1, 2, size=(rows, features), dtype=np.int8)
    return np.cumsum(steps, axis=0, dtype=np.int32)


def _compressors(codec: str) -> Any:
    import zarr

    if codec == "lz4":
        return [zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")]
    return "auto"  # zarr's default: zstd


def write_stores(work: Path, names: list[str], *, seed: int = 0) -> dict[str, Path]:
    """Write the stores of ``names`` (skipping those present); stores of the same series share one pass."""
    import zarr

    paths = {
        n: work / f"{n}_{CASES[n]['rows']}x{CASES[n]['features']}_{CASES[n]['codec']}.zarr" for n in names
    }
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(CASES[n].get("same_series_as", n), []).append(n)
    for lead, members in groups.items():
        todo = [n for n in members if not (paths[n] / "zarr.json").exists()]
        if not todo:
            continue
        spec = CASES[lead]
        rows, feats = spec["rows"], spec["features"]
        arrays = {}
        for n in todo:
            if paths[n].exists():
                shutil.rmtree(paths[n])
            c = CASES[n]
            g = zarr.open_group(str(paths[n]), mode="w", zarr_format=3)
            arrays[n] = g.create_array(
                "values", shape=(rows, feats), dtype="float32", chunks=c["chunks"] or "auto",
                compressors=_compressors(c["codec"]), fill_value=np.nan,
            )  # fmt: skip
            g.create_array(
                "time", data=1_700_000_000_000_000_000 + np.arange(rows, dtype=np.int64) * 1_000_000
            )
            g.attrs["features"] = [f"s{j:04d}" for j in range(feats)]
        _write_series(arrays, rows, feats, seed)
    return paths


def _write_series(arrays: dict[str, Any], rows: int, feats: int, seed: int) -> None:
    """Write one seeded tick-price series into every array of ``arrays``, bands in parallel threads."""
    rng = np.random.default_rng(seed)
    base = np.round(rng.uniform(20.0, 500.0, size=feats), 2)
    late = rng.choice(feats, size=max(1, feats // 20), replace=False)  # symbols that start late
    start = np.zeros(feats, dtype=np.int64)
    start[late] = rng.integers(rows // 10, rows // 2, size=late.size)
    band = max(ROWS_PER_BAND, *(a.chunks[0] for a in arrays.values()))

    def one(b: int, off: np.ndarray) -> None:
        s = b * band
        ticks = _band(seed, b, min(band, rows - s), feats).astype(np.int64) + off
        x = (base + 0.01 * ticks).astype(np.float32)
        x[np.arange(s, s + x.shape[0])[:, None] < start[None, :]] = np.nan
        for a in arrays.values():
            a[s : s + x.shape[0]] = x

    offset = np.zeros(feats, dtype=np.int64)
    with cf.ThreadPoolExecutor(os.cpu_count() or 4) as pool:
        futs = []
        for b in range((rows + band - 1) // band):
            futs.append(pool.submit(one, b, offset.copy()))
            offset += _band(seed, b, min(band, rows - b * band), feats)[-1]  # the band's last cumulative tick
        for f in futs:
            f.result()


def write_dense_pipeline(directory: Path, features: int) -> Path:
    """conv K=5 over all features -> 256 (ReLU), head -> 64; FP16-stored seeded weights."""
    from e2e import write_pipeline

    return write_pipeline(directory, features)


# ------------------------------------------------------------------------------------------- measuring


class SmiPeak:
    """The largest GPU memory nvidia-smi reports for one process while it runs (polled every 50 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()

    def _poll(self) -> None:
        q = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            try:
                out = subprocess.run(q, capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.SubprocessError):
                return
            for line in out.splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) == 2 and parts[0] == str(self.pid) and parts[1].isdigit():
                    self.peak = max(self.peak, int(parts[1]) << 20)
            self._stop.wait(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


def startup_s(n: int = 3) -> float:
    """Median wall time of the bare interpreter start: import torch and make a CUDA context."""
    walls = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch; torch.zeros(1, device='cuda')"], check=True)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def tsconv_run(src: Path, out: Path, pipeline: str, work: Path, cache: Path, *,
               extra: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """One fresh `python -m tsconv process` subprocess (``extra``: more of its options): its wall time, report
    and nvidia-smi peak (of the command's own process: a dask worker's is not in it)."""
    report = work / "report.json"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "tsconv", "process", "-i", str(src), "-o", str(out), "--pipeline", pipeline,
           "--device", "cuda", "--overwrite", "-q", "--report", str(report), *extra]  # fmt: skip
    env = {
        **os.environ,
        "TSCONV_CACHE_DIR": str(cache),
        # not this script's folder: its distributed.py would shadow dask's package in the child
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *(p for p in sys.path if Path(p or ".").resolve() != HERE)]
        ),
    }
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd, cwd=tempfile.gettempdir(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    smi = SmiPeak(p.pid)
    _, err = p.communicate()
    wall = time.perf_counter() - t0
    peak = smi.stop()
    if p.returncode != 0:
        raise RuntimeError(f"tsconv process failed ({p.returncode}): {err.decode()[-2000:]}")
    r = json.loads(report.read_text())
    return {"wall_s": wall, "report_s": r["seconds"], "peak_reserved_bytes": r.get("peak_gpu_reserved_bytes"),
            "smi_peak_bytes": peak, "reader": r.get("reader"), "decode_note": r.get("decode_note"), "head_path": r.get("head_path"),
            "step_rows": r.get("step_rows"), "gpu_process_bytes": r.get("gpu_process_bytes"),
            "gpu_outside_torch_bytes": r.get("gpu_outside_torch_bytes"), "bound_by": r.get("bound_by"), "compression": r.get("compression"), "stage_seconds": r.get("stage_seconds"),
            "stderr_lines": err.decode().strip().splitlines()[-3:]}  # fmt: skip


def _baseline_plan(pipeline: str, names: list[str]) -> Any:
    """The resolved pipeline the baselines compute (their stored weights: what tsconv computes with)."""
    from tsconv.pipeline.spec import load_pipeline, resolve

    plan = resolve(load_pipeline(pipeline), names)
    if plan.preprocess is not None:
        raise ValueError("the baselines run pipelines without [preprocess]")
    return plan


def _torch_layers(pipeline: str, names: list[str]) -> tuple[list[Any], Any, int]:
    """The resolved pipeline's stages as torch tensors on the GPU (the stored weights tsconv computes with)."""
    import torch

    plan = _baseline_plan(pipeline, names)
    layers = [
        (torch.from_numpy(L.weight).cuda(), None if L.bias is None else torch.from_numpy(L.bias).cuda(),
         L.dilation, L.groups, L.activation)
        for L in plan.layers
    ]  # fmt: skip
    head = None
    if plan.head is not None:
        h = plan.head
        head = (torch.from_numpy(h.weight).cuda(), None if h.bias is None else torch.from_numpy(h.bias).cuda(),
                h.activation)  # fmt: skip
    return layers, head, plan.halo


def _act(y: Any, name: str) -> Any:
    import torch.nn.functional as F

    return {"none": lambda v: v, "relu": F.relu, "gelu": F.gelu, "tanh": F.tanh}[name](y)


def _forward(x: Any, layers: list[Any], head: Any) -> Any:
    """[T + halo, F] -> [T, D]: the stages (cuDNN) and the head (cuBLAS), valid rows only."""
    import torch.nn.functional as F

    y = x.T[None]
    for w, b, dil, groups, act in layers:
        y = _act(F.conv1d(y, w, b, dilation=dil, groups=groups), act)
    y = y[0].T
    if head is not None:
        w, b, act = head
        y = _act(y @ w + (0 if b is None else b), act)
    return y


def _out_array(out: Path, rows: int, cols: int) -> Any:
    import zarr

    if out.exists():
        shutil.rmtree(out)
    g = zarr.open_group(str(out), mode="w", zarr_format=3)
    return g.create_array("values", shape=(rows, cols), chunks=(65536, min(cols, 1024)), dtype="float32",
                          compressors=_compressors("lz4"))  # fmt: skip


def export_layers(pipeline: str, names: list[str], path: Path) -> Path:
    """The resolved pipeline's stored weights as an .npz, for the hand-written script: a user's own loop
    holds its weights, so it imports no tsconv."""
    plan = _baseline_plan(pipeline, names)
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"halo": plan.halo, "layers": [], "head": None}
    for i, L in enumerate(plan.layers):
        arrays[f"w{i}"] = np.asarray(L.weight)
        if L.bias is not None:
            arrays[f"b{i}"] = np.asarray(L.bias)
        meta["layers"].append({"dilation": L.dilation, "groups": L.groups, "activation": L.activation})
    if plan.head is not None:
        arrays["hw"] = np.asarray(plan.head.weight)
        if plan.head.bias is not None:
            arrays["hb"] = np.asarray(plan.head.bias)
        meta["head"] = {"activation": plan.head.activation}
    np.savez(path, meta=np.array(json.dumps(meta)), **arrays)
    return path


def naive_script(src: Path, out: Path, weights: Path) -> float:
    """The hand-written loop, as a user's script runs it (in a fresh process, see naive_loop): read the
    store's chunk rows with zarr, step through them 1024 rows at a time (carrying the halo) with torch on
    the GPU, write. (Reading 1024 rows per zarr call instead decodes each zstd chunk of (16384, 256)
    sixteen times: 53 s on store b.) Returns the loop's seconds."""
    import torch
    import zarr

    npz = np.load(weights)
    meta = json.loads(str(npz["meta"]))

    def dev(key: str) -> Any:
        return torch.from_numpy(npz[key]).cuda() if key in npz.files else None

    layers = [(dev(f"w{i}"), dev(f"b{i}"), m["dilation"], m["groups"], m["activation"])
              for i, m in enumerate(meta["layers"])]  # fmt: skip
    head = (dev("hw"), dev("hb"), meta["head"]["activation"]) if meta["head"] else None
    halo = meta["halo"]
    v = zarr.open_group(str(src), mode="r")["values"]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    rows, feats = v.shape
    carry = torch.full((halo, feats), float("nan"), device="cuda")
    ov = None
    buf = None
    band = max(CHUNK, v.chunks[0] // CHUNK * CHUNK)  # read whole chunk rows once, step through them
    block = None
    for s in range(0, rows, CHUNK):
        if s % band == 0:
            block = np.asarray(v[s : s + band])
        x = torch.from_numpy(block[s % band : s % band + CHUNK]).cuda()
        xx = torch.cat([carry, x])
        carry = xx[xx.shape[0] - halo :]
        y = _forward(xx, layers, head).cpu().numpy()
        if ov is None:
            ov = _out_array(out, rows, y.shape[1])
            buf = np.empty((65536, y.shape[1]), dtype=np.float32)
        i = s % 65536
        buf[i : i + y.shape[0]] = y
        if i + y.shape[0] == 65536 or s + y.shape[0] >= rows:
            ov[s - i : s + y.shape[0]] = buf[: i + y.shape[0]]
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def naive_loop(src: Path, out: Path, pipeline: str, work: Path) -> dict[str, float]:
    """The hand-written loop in a fresh process, as a user's script: its wall time and its loop's seconds."""
    import zarr

    names = list(zarr.open_group(str(src), mode="r").attrs["features"])
    weights = export_layers(pipeline, names, work / "naive_weights.npz")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, __file__, "--naive-script", str(src), str(out), str(weights)],
                       capture_output=True, text=True, cwd=tempfile.gettempdir(), check=False)  # fmt: skip
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"the hand-written loop failed ({p.returncode}): {p.stderr[-2000:]}")
    return {"naive_wall_s": wall, "naive_loop_s": float(p.stdout.strip().splitlines()[-1])}


def in_memory(src: Path, out: Path, pipeline: str) -> tuple[float, int]:
    """The whole series in GPU memory: read it all, pad, stages and head at once, write: (seconds, peak bytes)."""
    import torch
    import torch.nn.functional as F
    import zarr

    g = zarr.open_group(str(src), mode="r")
    layers, head, halo = _torch_layers(pipeline, list(g.attrs["features"]))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    x = torch.from_numpy(np.asarray(g["values"][:])).cuda()
    x = F.pad(x.T, (halo, 0), value=float("nan")).T
    y = _forward(x, layers, head)
    del x
    host = y.cpu().numpy()
    del y
    ov = _out_array(out, host.shape[0], host.shape[1])
    ov[:] = host
    torch.cuda.synchronize()
    return time.perf_counter() - t0, int(torch.cuda.max_memory_reserved())


def _polars_exprs(pipeline: str, names: list[str]) -> list[Any]:
    """The built-in bank pipelines as polars expressions (the same features, the same count)."""
    import polars as pl

    def bank(col: Any, spec: str) -> Any:
        kind, *p = spec.split(":")
        n = int(p[0]) if p else 0
        if kind == "diff":
            return col.diff(n)
        if kind == "dev":
            return col - col.rolling_mean(n)
        if kind == "ma":
            return col.rolling_mean(n)
        if kind == "ema":
            return col.ewm_mean(span=n, adjust=False)
        if kind == "id":
            return col
        raise ValueError(spec)

    exprs = []
    if pipeline == "default":
        for c in names:
            for f in ("diff:1", "diff:32", "diff:256", "dev:32", "dev:256"):
                exprs.append(bank(pl.col(c), f).alias(f"{c}.{f}"))
    elif pipeline == "trend_ema":
        for c in names:
            for f in ("ema:8", "ema:32", "dev:64", "diff:16"):
                y = bank(pl.col(c), f)
                exprs.append(y.alias(f"{c}.{f}"))
                exprs.append(((y + y.shift(4) + y.shift(8) + y.shift(12)) / 4).alias(f"{c}.{f}.ma4"))
    else:
        raise ValueError(f"no polars form of {pipeline!r}")
    return exprs


def polars_run(src: Path, out: Path, pipeline: str) -> float:
    """polars on all cores: read the store into a DataFrame, compute the features, write them as Parquet."""
    import polars as pl
    import zarr

    t0 = time.perf_counter()
    g = zarr.open_group(str(src), mode="r")
    names = list(g.attrs["features"])
    df = pl.from_numpy(np.asarray(g["values"][:]), schema=names)
    df.select(_polars_exprs(pipeline, names)).write_parquet(out)
    return time.perf_counter() - t0


def decode_ceiling(src: Path) -> dict[str, Any]:
    """Decoded GB/s of the store's values with numcodecs alone on every core (chunk files read from cache)."""
    import numcodecs
    import zarr

    v = zarr.open_group(str(src), mode="r")["values"]
    files = [f for f in (src / "values" / "c").rglob("*") if f.is_file()]
    blobs = [f.read_bytes() for f in files]
    codec = v.metadata.codecs[-1].to_dict()
    name = codec["name"]
    if name == "blosc":
        numcodecs.blosc.use_threads = False
        dec = numcodecs.Blosc().decode
    elif name == "zstd":
        dec = numcodecs.Zstd().decode
    else:
        return {"decoder": name, "decode_ceiling_gbps": None}
    nbytes = 0
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(os.cpu_count() or 4) as pool:
        for d in pool.map(dec, blobs):
            nbytes += len(d)
    s = time.perf_counter() - t0
    return {"decoder": f"numcodecs {name}, {os.cpu_count()} threads", "decode_ceiling_gbps": nbytes / s / 1e9}


# ------------------------------------------------------------------------------------------- report


def _commits(doc: dict[str, Any]) -> str:
    """The commit of each row's call, with its stores when the rows come from more than one."""
    by: dict[str, list[str]] = {}
    for r in doc["runs"]:
        stores = by.setdefault(r.get("commit", doc["commit"]), [])
        if r["store"] not in stores:
            stores.append(r["store"])
    if len(by) <= 1:
        return next(iter(by), doc["commit"])
    return " and ".join(f"{c} (stores {', '.join(st)})" for c, st in by.items())


def _startup(r: dict[str, Any], doc: dict[str, Any]) -> float:
    """The bare start-up measured in the row's own call (rows merged from older calls keep theirs)."""
    return r.get("run_startup_s") or r.get("startup_s") or doc["startup_s"]


def _naive(r: dict[str, Any]) -> str:
    """The naive loop's cell: wall - start-up (its loop alone); rows measured in-process show the loop only."""
    if r.get("naive_s") is None:
        return ""
    if r.get("naive_loop_s") is None:
        return f"({r['naive_s']:.2f})"
    return f"{r['naive_s']:.2f} ({r['naive_loop_s']:.2f})"


def _decoded_by(r: dict[str, Any]) -> str:
    """The run's reader ("gpu" or "threads"), with its note (bands a launch, or why not the GPU)."""
    reader = r.get("reader") or ""
    return f"{reader} ({r['decode_note']})" if r.get("decode_note") else reader


def render(doc: dict[str, Any], md: Path, png: Path | None) -> None:
    """A table of every run (and a bar plot of wall time against the baselines) from the JSON."""
    rows = [r for r in doc["runs"] if not r.get("cold_cache")]
    colds = [r for r in doc["runs"] if r.get("cold_cache")]
    lines = [
        f"# `tsconv process`, fresh process per run ({doc['gpu']}, {doc['date']}, commit {_commits(doc)})",
        "",
        f"Bare start-up (`import torch; torch.zeros(1, device='cuda')`), at the start of each call: "
        f"{', '.join(f'{v:.2f} s' for v in doc.get('startup_s_by_call', {'': doc['startup_s']}).values())}; "
        "rows with a start-up column measured one beside each timed run (its median), which their wall - "
        "start-up uses. "
        "Wall = the whole command; report = the run's own `seconds`; medians of the timed runs. "
        "naive = a hand-written 1024-step loop over zarr with cuDNN/cuBLAS, run as a script (a fresh process: "
        "its wall - start-up, and in brackets its loop alone); inmem = the whole series in GPU memory; polars = "
        "read the store, the same features on all cores, written as Parquet (both in this process).",
        "",
        "| store | codec, chunks | pipeline | wall s | start-up s | wall - start-up s | report s | GB/s | naive s "
        "| inmem s | polars s | decode ceiling GB/s | torch peak GB | nvidia-smi peak GB | decoded by |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def f(v: Any, p: int = 2) -> str:
        return "" if v is None else f"{v:.{p}f}"

    for r in rows:
        gbps = r["rows"] * r["features"] * 4 / r["report_s"] / 1e9
        start = _startup(r, doc)
        lines.append(
            f"| {r['store']} ({r['rows']:,} x {r['features']}) | {r['codec']}, {r['chunks']} | {r['pipeline']} "
            f"| {f(r['wall_s'])} | {f(r.get('run_startup_s'))} | {f(r['wall_s'] - start)} | {f(r['report_s'], 3)} "
            f"| {gbps:.2f} "
            f"| {_naive(r)} | {f(r.get('inmem_s'))} | {f(r.get('polars_s'))} "
            f"| {f(r.get('decode_ceiling_gbps'))} | {f((r['peak_reserved_bytes'] or 0) / 1e9)} "
            f"| {f(r['smi_peak_bytes'] / 1e9)} | {_decoded_by(r)} |"
        )
    for r in colds:
        lines.append(
            f"\nEmpty tuning cache, {r['store']} {r['pipeline']} (commit {r.get('commit', doc['commit'])}): wall "
            f"{r['wall_s']:.2f} s, report {r['report_s']:.2f} s (the warm median of its call: "
            f"{r.get('warm_wall_s', float('nan')):.2f} s)."
        )
    for r in doc.get("dask", []):
        lines.append(
            f"\nOne dask GPU worker (`--workers 1`), {r['store']} {r['pipeline']}: wall {r['wall_s']:.2f} s against "
            f"{r['plain_wall_s']:.2f} s in one process ({r['wall_ratio']:.2f}x), report {r['report_s']:.3f} s "
            f"against {r['plain_report_s']:.3f} s ({r['report_ratio']:.2f}x)."
        )
    if doc.get("note"):
        lines.append("\n" + doc["note"])
    md.write_text("\n".join(lines) + "\n")
    if png is None:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    labels = [f"{r['store']}\n{r['pipeline']}" for r in rows]
    series = [("tsconv wall - start-up", [r["wall_s"] - _startup(r, doc) for r in rows]),
              ("naive script - start-up", [r.get("naive_s") if r.get("naive_loop_s") is not None else None for r in rows]), ("in GPU memory", [r.get("inmem_s") for r in rows]),
              ("polars", [r.get("polars_s") for r in rows])]  # fmt: skip
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows)), 4))
    width = 0.2
    for i, (name, vals) in enumerate(series):
        xs = [j + (i - 1.5) * width for j, v in enumerate(vals) if v is not None]
        ax.bar(xs, [v for v in vals if v is not None], width, label=name)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("seconds")
    ax.set_title(f"fresh `tsconv process` vs baselines, {doc['gpu']}, {doc['commit']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cli.json")
    ap.add_argument("--work", type=Path, default=Path("/tmp/tsconv-cli"))
    ap.add_argument("--cases", default="a,b,c,d,e")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cold", default="e:default", help="STORE:PIPELINE run once with an empty tuning cache")
    ap.add_argument(
        "--dask", default="", help="STORE:PIPELINE,... also run with `--workers 1` (one dask GPU worker)"
    )
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--merge", type=Path, default=None, help="keep this JSON's runs of other cases")
    ap.add_argument("--render", type=Path, default=None, help="only write the .md and .png beside this JSON")
    ap.add_argument("--naive-script", nargs=3, metavar=("SRC", "OUT", "WEIGHTS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.naive_script is not None:  # the hand-written loop's own process (naive_loop)
        print(naive_script(*map(Path, args.naive_script)))
        return 0
    if args.render is not None:
        doc = json.loads(args.render.read_text())
        render(doc, args.render.with_suffix(".md"), args.render.with_suffix(".png"))
        return 0

    import torch

    names = args.cases.split(",")
    args.work.mkdir(parents=True, exist_ok=True)
    cache = args.work / "tuning-cache"  # the runs' own cache; with tuning off they take the shipped winners
    cache.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    stores = write_stores(args.work, names)
    print(f"stores in {time.perf_counter() - t0:.0f} s", flush=True)
    doc: dict[str, Any] = {
        "benchmark": "cli", "gpu": torch.cuda.get_device_name(), "date": dt.datetime.now(dt.UTC).isoformat(),
        "commit": commit(), "machine": machine(), "torch": torch.__version__, "startup_s": startup_s(),
        "repeats": args.repeats, "runs": [],
        "bytecode": {"pycache_prefix": sys.pycache_prefix, "dont_write_bytecode": sys.dont_write_bytecode},
    }  # fmt: skip
    call = f"{doc['commit']} ({', '.join(names)})"  # this call's start-up, named by commit and stores
    doc["startup_s_by_call"] = {call: doc["startup_s"]}
    if args.merge is not None and args.merge.exists():
        # the other stores' runs, from the same GPU only: the table is one machine's
        old = json.loads(args.merge.read_text())
        for key in ("runs", "dask"):
            for r in old.get(key, []):
                r.setdefault("commit", old.get("commit"))
                r.setdefault("gpu", old.get("gpu"))
            doc[key] = [r for r in old.get(key, []) if r["store"] not in names and r["gpu"] == doc["gpu"]]
            dropped = sorted(
                {r["store"] for r in old.get(key, []) if r["store"] not in names}
                - {r["store"] for r in doc[key]}
            )
            if dropped:
                print(
                    f"--merge: {key} of stores {', '.join(dropped)} ran on another GPU; left out", flush=True
                )
        kept = {(r["commit"], r["store"]) for r in doc["runs"]}
        by_call = {
            c: v
            for c, v in old.get("startup_s_by_call", {}).items()
            # keys "COMMIT (STORES)", or a bare COMMIT in results written before calls named their stores
            if any((c.split(" ")[0], st) in kept for st in _stores_of(c, kept))
        }
        doc["startup_s_by_call"] = {**by_call, call: doc["startup_s"]}
    print(f"start-up {doc['startup_s']:.2f} s", flush=True)

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        render(doc, args.out.with_suffix(".md"), args.out.with_suffix(".png"))

    out = args.work / "out.zarr"
    for n in names:
        spec, src = CASES[n], stores[n]
        ceiling = decode_ceiling(src)
        for pipe in spec["pipelines"]:
            p = str(write_dense_pipeline(args.work / "pipe", spec["features"])) if pipe == "dense" else pipe
            first = tsconv_run(src, out, p, args.work, cache)  # fills the tuning cache
            reps, starts = [], []
            for _ in range(args.repeats):  # a bare start-up beside each run: the machine's load moves both
                starts.append(startup_s(n=1))
                reps.append(tsconv_run(src, out, p, args.work, cache))
            med = sorted(reps, key=lambda r: r["wall_s"])[len(reps) // 2]
            row = {
                "store": n, "pipeline": pipe, "commit": doc["commit"], "gpu": doc["gpu"], "codec": spec["codec"],
                "rows": spec["rows"], "features": spec["features"], "chunks": list(zarr_chunks(src)), "fresh_process": True,
                "cold_cache": False, **med, "wall_s": statistics.median(r["wall_s"] for r in reps),
                "report_s": statistics.median(r["report_s"] for r in reps),
                "wall_all_s": [r["wall_s"] for r in reps], "report_all_s": [r["report_s"] for r in reps],
                "first_wall_s": first["wall_s"], "startup_s": doc["startup_s"],
                "run_startup_s": statistics.median(starts), "run_startup_all_s": starts, **ceiling,
            }  # fmt: skip
            if not args.no_baselines:
                row |= naive_loop(src, args.work / "naive.zarr", p, args.work)
                row["naive_s"] = row["naive_wall_s"] - row["run_startup_s"]  # as tsconv's: wall - start-up
                row["naive_reads"] = "chunk rows"
                row["inmem_s"], row["inmem_peak_bytes"] = in_memory(src, args.work / "inmem.zarr", p)
                if pipe in ("default", "trend_ema"):
                    row["polars_s"] = statistics.median(
                        polars_run(src, args.work / "polars.parquet", pipe) for _ in range(args.repeats)
                    )
            doc["runs"].append(row)
            print(json.dumps({k: row[k] for k in ("store", "pipeline", "wall_s", "report_s") if k in row}
                             | {k: row.get(k) for k in ("naive_s", "inmem_s", "polars_s")}), flush=True)  # fmt: skip
            save()
            if f"{n}:{pipe}" in args.dask.split(","):
                one = ("--workers", "1")
                tsconv_run(
                    src, out, p, args.work, cache, extra=one
                )  # the worker's tuning, as the plain first run
                dreps = [tsconv_run(src, out, p, args.work, cache, extra=one) for _ in range(args.repeats)]
                wall, rep = (statistics.median(r[k] for r in dreps) for k in ("wall_s", "report_s"))
                doc.setdefault("dask", []).append({
                    "store": n, "pipeline": pipe, "commit": doc["commit"], "gpu": doc["gpu"], "workers": 1, "fresh_process": True,
                    "wall_s": wall, "report_s": rep, "wall_all_s": [r["wall_s"] for r in dreps],
                    "report_all_s": [r["report_s"] for r in dreps], "plain_wall_s": row["wall_s"],
                    "plain_report_s": row["report_s"], "wall_ratio": wall / row["wall_s"],
                    "report_ratio": rep / row["report_s"],
                    # to take the overhead apart: the tasks' phases, dispatch and collect of each run
                    "stage_seconds_all": [r["stage_seconds"] for r in dreps],
                    "plain_stage_seconds": row.get("stage_seconds"), "step_rows_all": [r["step_rows"] for r in dreps],
                    "plain_step_rows": row.get("step_rows"),
                })  # fmt: skip
                print(json.dumps(doc["dask"][-1]), flush=True)
                save()
            if args.cold == f"{n}:{pipe}":
                with tempfile.TemporaryDirectory() as empty:
                    r = tsconv_run(src, out, p, args.work, Path(empty))
                doc["runs"].append({"store": n, "pipeline": pipe, "commit": doc["commit"], "gpu": doc["gpu"], "codec": spec["codec"], "rows": spec["rows"],
                                    "features": spec["features"], "chunks": row["chunks"], "fresh_process": True,
                                    "cold_cache": True, **r, "warm_wall_s": row["wall_s"]})  # fmt: skip
                save()
    return 0


def _stores_of(call: str, kept: set[tuple[str, str]]) -> list[str]:
    """The stores a call's start-up key names ("COMMIT (a, b)"); for a bare commit, every store kept."""
    if "(" in call:
        return call.partition("(")[2].rstrip(")").split(", ")
    return sorted({store for _, store in kept})


def zarr_chunks(src: Path) -> tuple[int, ...]:
    import zarr

    return tuple(zarr.open_group(str(src), mode="r")["values"].chunks)


if __name__ == "__main__":
    sys.exit(main())
