"""The default pipeline's five features through tsconv's CPU engine against polars on the same cores.

Both compute, per feature column of a price series, ``x - x[t-1]``, ``x - x[t-32]``, ``x - x[t-256]``,
``x - mean of the last 32`` and ``x - mean of the last 256`` into float32: tsconv as
``tsconv.features(x, "default")`` (numpy in, numpy [T, 5F] out), polars as one ``select`` of shift and
``rolling_mean`` expressions over a frame of the columns (its own threads: the machine's cores).

The figure of record is a fresh process per measurement, as a script runs it: each side in a child process
of its own loads the series (a ``.npy`` in the page cache; polars then builds its frame), computes once on
4,096 rows (imports and first-call set-up, timed apart as ``setup``), then once on the whole series (timed:
``call``); the sides take turns, ``--repeats`` children each, each after ``--pause`` seconds (as a job on an idle machine
starts), medians. Each call writes its result into memory
the process has not touched before, as a script's one call does. Beside it, a diagnostic: both sides called
again and again in this process, taking turns (there polars' allocator hands each call the pages of the
result before, while numpy maps and faults in a fresh result each time). tsconv's children run a second time
in each round with numpy's huge-page advice off (``NUMPY_MADVISE_HUGEPAGE=0``): on VMs whose host takes back
free memory, a fresh process's huge pages wait for the host at their first write. A fourth child per round
calls ``tsconv.features`` on the same polars frame polars computes on (a frame in, a frame out: what a polars
user calls). Outputs are compared once (largest
difference relative to each feature's scale, NaN pattern). Writes ``results/filters.json`` and ``filters.md``.

    python benchmarks/filters.py [--shapes 500000x40,1048576x32,750000x56] [--repeats 9]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import commit, machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = ((500_000, 40), (1_048_576, 32), (750_000, 56))
FILTERS = ("diff:1", "diff:32", "diff:256", "dev:32", "dev:256")


def price_series(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Multiplicative random walks from 20 to 500 on a 0.01 grid, float32."""
    rng = np.random.default_rng(seed)
    start = rng.uniform(np.log(20.0), np.log(500.0), size=cols)
    logp = start + np.cumsum(rng.normal(scale=5e-4, size=(rows, cols)), axis=0)
    return np.round(np.exp(logp), 2).astype(np.float32)


def run_tsconv(x: np.ndarray) -> np.ndarray:
    import tsconv

    return tsconv.features(x, "default", device="cpu")


def run_polars(frame) -> np.ndarray:  # noqa: ANN001
    import polars as pl

    exprs = []
    for name in frame.columns:
        s = pl.col(name)
        exprs += [
            (s - s.shift(1)).alias(f"{name}.diff1"),
            (s - s.shift(32)).alias(f"{name}.diff32"),
            (s - s.shift(256)).alias(f"{name}.diff256"),
            (s - s.rolling_mean(32)).alias(f"{name}.dev32"),
            (s - s.rolling_mean(256)).alias(f"{name}.dev256"),
        ]
    return frame.select(exprs)


def _timed(fn) -> tuple[float, object]:  # noqa: ANN001
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _alternating(a, b, repeats: int) -> tuple[list[float], list[float], object, object]:  # noqa: ANN001
    """``a`` and ``b`` in turn, ``repeats`` times each: both sides see the same moments of a shared
    machine (the VM's speed moved 2x between back-to-back blocks of runs)."""
    ta, tb, out_a, out_b = [], [], None, None
    for _ in range(repeats):
        out_a = out_b = None
        t, out_a = _timed(a)
        ta.append(t)
        t, out_b = _timed(b)
        tb.append(t)
    return ta, tb, out_a, out_b


def child(side: str, path: str) -> None:
    """One fresh-process measurement: prints {"setup": s, "call": s} as JSON (setup: the import and a
    4,096-row call). Sides: ``tsconv`` (numpy in and out), ``polars`` and ``tsconv_frame`` (the same polars frame
    in, a frame out; the frame is built between the two timings, untimed, as a polars user has it)."""
    x = np.load(path)
    t0 = time.perf_counter()
    if side == "tsconv":
        run_tsconv(x[:4096])
        t1 = t2 = time.perf_counter()
        run_tsconv(x)
    else:
        import polars as pl

        def frame_of(a: np.ndarray) -> object:
            return pl.DataFrame({f"x{j}": a[:, j] for j in range(a.shape[1])})

        if side == "polars":
            fn = run_polars
        else:
            import tsconv

            def fn(f: object) -> object:
                return tsconv.features(f, "default", device="cpu")

        fn(frame_of(x[:4096]))
        t1 = time.perf_counter()
        frame = frame_of(x)
        t2 = time.perf_counter()
        fn(frame)
    t3 = time.perf_counter()
    print(json.dumps({"setup": t1 - t0, "call": t3 - t2}))


def _fresh(side: str, path: str) -> dict:
    """A child's measurement; ``tsconv_4k``: tsconv with numpy's huge-page advice off (4 KB pages)."""
    env = dict(os.environ)
    if side == "tsconv_4k":
        side, env["NUMPY_MADVISE_HUGEPAGE"] = "tsconv", "0"
    out = subprocess.run(
        [sys.executable, __file__, "--child", side, path], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _med(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def _pair(ts: list[float], pl: list[float]) -> dict:
    """Both sides' runs and medians, polars' median over tsconv's, and the median of each round's ratio (the two
    run back to back)."""
    return {
        "tsconv_s": _med(ts),
        "tsconv_runs_s": [round(v, 3) for v in ts],
        "polars_s": _med(pl),
        "polars_runs_s": [round(v, 3) for v in pl],
        "speedup": round(statistics.median(pl) / statistics.median(ts), 2),
        "speedup_paired": round(statistics.median(b / a for a, b in zip(ts, pl, strict=True)), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(f"{r}x{c}" for r, c in SHAPES))
    ap.add_argument("--repeats", type=int, default=9, help="fresh processes per side and shape")
    ap.add_argument("--in-process-repeats", type=int, default=9, help="calls per side in the diagnostic loop")
    ap.add_argument(
        "--pause", type=float, default=3.0,
        help="seconds before each child, as a job on an idle machine starts (a VM's host may take back free memory "
        "within seconds: without a pause a child finds the pages the one before it freed, or not, by its order)",
    )  # fmt: skip
    ap.add_argument("--child", nargs=2, metavar=("SIDE", "NPY"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    import polars as pl
    import torch

    rows_out = []
    tmp = Path(tempfile.mkdtemp(prefix="tsconv-filters-"))
    for shape in args.shapes.split(","):
        rows, cols = (int(v) for v in shape.split("x"))
        x = price_series(rows, cols)
        path = tmp / f"{rows}x{cols}.npy"
        np.save(path, x)
        fresh: dict[str, list[dict]] = {"tsconv": [], "polars": [], "tsconv_4k": [], "tsconv_frame": []}
        for _ in range(args.repeats):
            for side in fresh:
                time.sleep(args.pause)
                fresh[side].append(_fresh(side, str(path)))
        call_ts = [r["call"] for r in fresh["tsconv"]]
        call_pl = [r["call"] for r in fresh["polars"]]
        call_4k = [r["call"] for r in fresh["tsconv_4k"]]
        call_fr = [r["call"] for r in fresh["tsconv_frame"]]
        # the in-process diagnostic, and the outputs compared
        frame = pl.DataFrame({f"x{j}": x[:, j] for j in range(cols)})
        run_tsconv(x[:4096])
        run_polars(frame.head(4096))
        all_ts, all_pl, y, p = _alternating(
            lambda x=x: run_tsconv(x), lambda f=frame: run_polars(f), args.in_process_repeats
        )
        ref = p.to_numpy()  # [T, 5F] in the same column order
        ok = np.isfinite(ref)
        nan_same = bool(np.array_equal(np.isnan(y), np.isnan(ref)))
        scale = np.nanmax(np.abs(np.where(ok, ref, np.nan)), axis=0)
        rel = float(np.nanmax(np.abs(np.where(ok, y - ref, np.nan)) / scale))
        del p, y, ref, frame
        path.unlink()
        rows_out.append(
            {
                "rows": rows,
                "features": cols,
                "outputs": 5 * cols,
                **_pair(call_ts, call_pl),
                "tsconv_min_s": round(min(call_ts), 3),
                "polars_min_s": round(min(call_pl), 3),
                "tsconv_4k_s": _med(call_4k),
                "tsconv_4k_runs_s": [round(v, 3) for v in call_4k],
                "speedup_4k": round(statistics.median(call_pl) / statistics.median(call_4k), 2),
                "tsconv_frame_s": _med(call_fr),
                "tsconv_frame_runs_s": [round(v, 3) for v in call_fr],
                "speedup_frame": round(statistics.median(call_pl) / statistics.median(call_fr), 2),
                "tsconv_setup_s": _med([r["setup"] for r in fresh["tsconv"]]),
                "polars_setup_s": _med([r["setup"] for r in fresh["polars"]]),
                "in_process": _pair(all_ts, all_pl),
                "tsconv_rows_per_s": int(rows / statistics.median(call_ts)),
                "same_nan_pattern": nan_same,
                "max_diff_of_scale": rel,
            }
        )
        print(json.dumps(rows_out[-1]), flush=True)
    tmp.rmdir()
    meta = {
        "benchmark": "filters",
        "machine": machine(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "commit": commit(),
        "torch_threads": torch.get_num_threads(),
        "polars": pl.__version__,
        "polars_threads": pl.thread_pool_size(),
        "pipeline": "default: " + ", ".join(FILTERS) + " per feature",
        "pause_s": args.pause,
        "method": "fresh process per measurement, sides taking turns, each after a pause; call = the whole series after a 4,096-row "
        "call (setup: imports and first-call set-up); in_process: repeated calls in one process (a diagnostic)",
        "load": os.environ.get("BENCH_LOAD", "shared 2-core VM, other jobs possible"),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "filters.json").write_text(json.dumps({**meta, "results": rows_out}, indent=2) + "\n")
    m = meta["machine"]
    lines = [
        f"# Default filters: tsconv CPU engine against polars ({m['cpu']}, {m['cores']} cores, {meta['date']}, "
        f"commit {meta['commit']})",
        "",
        f"A fresh process per measurement, as a script runs it, the sides taking turns, each after a {args.pause:g} s "
        f"pause (as on an idle machine), medians of {args.repeats}: "
        "each child loads the series, calls once on 4,096 rows (setup: imports and first-call set-up), then once "
        f"on the whole series (call). polars {meta['polars']} on {meta['polars_threads']} threads, torch on "
        f"{meta['torch_threads']}. Same five features ({', '.join(FILTERS)}) per price column, float32 out. "
        f"In one process (a diagnostic): both called {args.in_process_repeats} times in turn, where polars' "
        "allocator reuses the pages of its previous result. 4 KB pages: tsconv's children with numpy's huge-page "
        "advice off (`NUMPY_MADVISE_HUGEPAGE=0`), in the same rounds; a polars frame in and out: "
        "`tsconv.features(frame)` on polars' own frame, in the same rounds.",
        "",
        "| rows x features | outputs | tsconv call s (min) | polars call s (min) | speedup | paired "
        "| tsconv, 4 KB pages: s, speedup | tsconv, a polars frame in and out: s, speedup | setup s (tsconv / polars) "
        "| in one process: tsconv / polars s, speedup | same NaNs | max diff / scale |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows_out:
        ip = r["in_process"]
        lines.append(
            f"| {r['rows']:,} x {r['features']} | {r['outputs']} | {r['tsconv_s']:.3f} ({r['tsconv_min_s']:.3f}) | "
            f"{r['polars_s']:.3f} ({r['polars_min_s']:.3f}) | "
            f"**{r['speedup']:.2f}x** | {r['speedup_paired']:.2f}x | {r['tsconv_4k_s']:.3f}, {r['speedup_4k']:.2f}x | "
            f"{r['tsconv_frame_s']:.3f}, {r['speedup_frame']:.2f}x | "
            f"{r['tsconv_setup_s']:.2f} / {r['polars_setup_s']:.2f} | "
            f"{ip['tsconv_s']:.3f} / {ip['polars_s']:.3f}, {ip['speedup']:.2f}x | {r['same_nan_pattern']} | "
            f"{r['max_diff_of_scale']:.2g} |"
        )
    (RESULTS / "filters.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
