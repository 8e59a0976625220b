"""Incremental updates: what `tsconv process --update` costs after 1% more rows, against a full run.

Claim measured: an update's work grows with the new rows, not with history; appending 1% of the rows and
running ``--update`` costs at most 5% of a full ``tsconv process`` of the grown store (benchmarks/NOTES.md,
"Incremental updates").

    python benchmarks/update.py                         # CPU: writes benchmarks/results/update.json and .md
    python benchmarks/update.py --device cuda --out $OUT/update_h200   # on a GPU machine
    python benchmarks/update.py --render benchmarks/results/update.json # only the .md from a JSON

The store is written by plain zarr (``zarr.create_array``, its default chunks and zstd; with ``--created-rows``
it is created that long and grown to ``--rows`` as later appends grow it): ``--rows`` x
``--features`` float32 prices at levels 20..500 on a 0.01 grid, a quarter of the symbols starting late,
``--unlisted`` of them with no value at all yet (a universe lists symbols before they trade), int64 ns
times. Each repeat, every command a fresh ``python -m tsconv process`` (as a cron job runs it):

1. a full run of the store as it is (``--overwrite``), then
2. ``--append`` share of rows appended with zarr (resize, then write the new rows), then
3. ``--update`` of that output, then the store is cut back to its rows for the next repeat.

Recorded per run: wall seconds, the seconds after the start-up (the process's time once it has imported
torch and tsconv's engine and CLI, measured inside it: the wall less the start-up, which a separately
measured bare start-up gives only within its noise), the report's ``seconds`` (the engine's rows; an
update's checks of the input, before that, are in the other two only) and rows computed; the median of
the repeats and the ratios; also the median over repeats of each repeat's own update / full ratio (a shared machine's load moves
both runs of a repeat alike far more than it moves one against the other).
The update is checked against a full run of the grown store, value for value (bitwise on the CPU).
Also timed in this process: the input digest that every run takes (stat of each chunk file, and the
hash of a partial last band).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from provenance import commit, machine  # noqa: E402

T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z in ns
BAND = 1 << 16  # rows generated at once


def tick_series(rows: int, features: int, seed: int, unlisted: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    level = rng.uniform(20, 500, size=features).astype(np.float64)
    x = np.empty((rows, features), np.float32)
    for a in range(0, rows, BAND):
        b = min(a + BAND, rows)
        steps = rng.integers(-1, 2, size=(b - a, features), dtype=np.int8)
        walk = level + np.cumsum(steps, axis=0, dtype=np.int32) * 0.01
        level = walk[-1]
        x[a:b] = walk
    for j in range(0, features, 4):  # a quarter of the symbols start late
        x[: int(rng.integers(rows // 20, rows // 4)), j] = np.nan
    if unlisted:  # symbols with no value at all yet (listed in the universe, not trading)
        x[:, features - unlisted :] = np.nan
    t = T0 + np.cumsum(rng.integers(1, 10_000_000, size=rows)).astype(np.int64)
    return x, t


def write_store(path: Path, x: np.ndarray, t: np.ndarray, rows: int) -> None:
    """The first ``rows`` rows as plain zarr writes them: default chunks and codec (zstd)."""
    import zarr

    g = zarr.open_group(str(path), mode="w")
    g.create_array("values", data=x[:rows], dimension_names=["time", "feature"])
    g.create_array("time", data=t[:rows], dimension_names=["time"])
    g.attrs["features"] = [f"s{j}" for j in range(x.shape[1])]


def set_rows(path: Path, x: np.ndarray, t: np.ndarray, rows: int) -> None:
    """Grow (resize, then write the new rows) or cut the store to ``rows`` rows, as a user's writer would."""
    import zarr

    g = zarr.open_group(str(path), mode="r+")
    old = int(g["values"].shape[0])
    g["values"].resize((rows, x.shape[1]))
    g["time"].resize((rows,))
    if rows > old:
        g["values"][old:rows] = x[old:rows]
        g["time"][old:rows] = t[old:rows]


def _created(store: dict[str, Any]) -> str:
    """How the store came to its rows, where it was created smaller and grown: its old end's place in its chunks."""
    created, rows, band = store.get("created_rows", store["rows"]), store["rows"], store["chunks"][0]
    where = "inside an input chunk" if rows % band else "at an input chunk boundary"
    grown = f"; created with {created:,} rows, then grown to {rows:,}" if created != rows else ""
    return f"{grown}; its old end {where}"


def _on_cuda(device: str) -> bool:
    """Whether runs on ``device`` start CUDA (auto does on a GPU host; its start-up counts it too)."""
    if device == "auto":
        import torch

        return torch.cuda.is_available()
    return device == "cuda"


def _gpu_name(device: str) -> str | None:
    """The GPU the runs could use (None on a CPU-only host or with --device cpu)."""
    if not _on_cuda(device):
        return None
    import torch

    return torch.cuda.get_device_name()


def startup_s(device: str, n: int = 3) -> float:
    """Median wall time of ``n`` bare starts: the interpreter importing torch and tsconv's engine (and on
    CUDA making a context)."""
    cuda = "; torch.zeros(1, device='cuda')" if _on_cuda(device) else ""
    code = "import torch, tsconv.engine.api" + cuda
    walls = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


# ``python -m tsconv process ...`` with the time after its start-up imports measured in the process itself:
# subtracting a separately measured bare start-up is noisy on a loaded machine (samples 3.0-4.9 s).
_TIMED = """
import sys, time
import torch, tsconv.engine.api, tsconv.cli  # the start-up
if "cuda" in sys.argv or ("auto" in sys.argv and torch.cuda.is_available()):
    torch.zeros(1, device="cuda")
t1 = time.perf_counter()
try:
    tsconv.cli.main(sys.argv[2:], prog_name="tsconv")
finally:
    open(sys.argv[1], "w").write(repr(time.perf_counter() - t1))
"""


def cli(src: Path, out: Path, flag: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One fresh ``tsconv process`` with ``flag``: wall seconds, seconds after its start-up imports, report."""
    report, after = work / "report.json", work / "after_startup.txt"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-c", _TIMED, str(after), "process", "-i", str(src), "-o", str(out), "--pipeline",
           args.pipeline, "--device", args.device, flag, "-q", "--report", str(report)]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[3:])} failed: {done.stderr.strip()}")
    r = json.loads(report.read_text())
    return {"wall_s": wall, "after_startup_s": float(after.read_text()), "report_s": r["seconds"],
            "rows": r["rows"], "resumed_from": r["resumed_from"], "ran_on": r["device"],
            "stdout": done.stdout.strip()}  # fmt: skip


def _digest_s(src: Path) -> float:
    import tsconv
    from tsconv.io.digest import input_digest

    store = tsconv.open_input(src)
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        input_digest(store)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def _same(a: Path, b: Path, device: str) -> str:
    import zarr

    va = np.asarray(zarr.open_group(str(a), mode="r")["values"][:])
    vb = np.asarray(zarr.open_group(str(b), mode="r")["values"][:])
    if va.shape != vb.shape:
        return f"shapes differ: {va.shape} vs {vb.shape}"
    if va.tobytes() == vb.tobytes():
        return "bitwise equal"
    if _on_cuda(device):
        diff = np.nanmax(np.abs(va - vb)) if np.isfinite(va).any() else 0.0
        same_nan = bool((np.isnan(va) == np.isnan(vb)).all())
        return f"max abs difference {diff:.3g}, NaN pattern {'equal' if same_nan else 'DIFFERS'}"
    return "DIFFERENT"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--append", type=float, default=0.01, help="rows appended, as a share of --rows")
    ap.add_argument(
        "--created-rows",
        type=int,
        default=None,
        help="rows the store was created with, zarr choosing its chunks for them, before it grew to --rows "
        "(default --rows: zarr's chunks then divide --rows, so the old end lies at a chunk boundary)",
    )
    ap.add_argument("--pipeline", default="default")
    ap.add_argument(
        "--unlisted",
        type=int,
        default=1,
        help="features with no value at all yet (the last ones: symbols listed, not trading)",
    )
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda", "auto"],
        default="cpu",
        help="auto: as users run it (on a GPU host, a few rows of an update go to the CPU)",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tsconv-update-bench"))
    ap.add_argument("--out", type=Path, default=RESULTS / "update", help="writes OUT.json and OUT.md")
    ap.add_argument("--note", default="", help="a line about the machine, kept in the results")
    ap.add_argument("--render", type=Path, help="only write the .md (and the ratios) from this JSON")
    args = ap.parse_args()
    if args.render is not None:
        result = json.loads(args.render.read_text())
        result["per_repeat_ratio"] = per_repeat(result)
        args.render.write_text(json.dumps(result, indent=2) + "\n")
        args.render.with_suffix(".md").write_text(render(result))
        return

    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    grown_rows = args.rows + int(round(args.rows * args.append))
    x, t = tick_series(grown_rows, args.features, seed=0, unlisted=args.unlisted)
    src, out = work / "ticks.zarr", work / "ticks.features.zarr"
    created = args.rows if args.created_rows is None else args.created_rows
    if not 0 < created <= args.rows:
        ap.error("--created-rows must be between 1 and --rows")
    write_store(src, x, t, created)
    set_rows(src, x, t, args.rows)  # earlier appends, if any: the old end then lies where they left it
    import zarr

    chunks = list(zarr.open_group(str(src), mode="r")["values"].chunks)

    startups = [startup_s(args.device)]
    runs: list[dict[str, Any]] = []
    cli(src, out, "--overwrite", args, work)  # warm-up: the page cache, a CUDA run's tuning cache
    for i in range(args.repeats):
        set_rows(src, x, t, args.rows)
        full = cli(src, out, "--overwrite", args, work)
        set_rows(src, x, t, grown_rows)
        upd = cli(src, out, "--update", args, work)
        runs += [{"repeat": i, "kind": "full", **full}, {"repeat": i, "kind": "update", **upd}]
        startups.append(startup_s(args.device, n=1))  # beside each repeat: the machine's load varies
        print(f"repeat {i}: full {full['wall_s']:.2f} s wall ({full['report_s']:.2f} s report), "
              f"update {upd['wall_s']:.2f} s wall ({upd['report_s']:.3f} s report, {upd['rows']:,} rows)", flush=True)  # fmt: skip
    noop = cli(src, out, "--update", args, work)  # nothing new: the checks alone
    startup = statistics.median(startups)
    digest = _digest_s(src)
    # the update against a full run of the grown store
    full_grown = cli(src, work / "grown.features.zarr", "--overwrite", args, work)
    check = _same(out, work / "grown.features.zarr", args.device)

    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["kind"] == kind)

    full_wall, upd_wall = med("full", "wall_s"), med("update", "wall_s")
    full_rep, upd_rep = med("full", "report_s"), med("update", "report_s")
    result = {
        "benchmark": "update",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": machine(),
        "note": args.note,
        "device": args.device,
        "gpu": _gpu_name(args.device),
        "store": {
            "rows": args.rows,
            "created_rows": created,
            "appended_rows": grown_rows - args.rows,
            "features": args.features,
            "chunks": chunks,
            "codec": "zstd (zarr's default)",
            "pipeline": args.pipeline,
            "unlisted_features": args.unlisted,
        },  # fmt: skip
        "startup_s": startup,
        "startup_samples_s": startups,
        "median": {
            "full_wall_s": full_wall,
            "full_report_s": full_rep,
            "update_wall_s": upd_wall,
            "update_report_s": upd_rep,
            "update_rows": int(med("update", "rows")),
            "full_wall_minus_startup_s": full_wall - startup,
            "update_wall_minus_startup_s": upd_wall - startup,
            "full_after_startup_s": med("full", "after_startup_s"),
            "update_after_startup_s": med("update", "after_startup_s"),
        },
        "ratio": {
            "report_s": upd_rep / full_rep,
            "wall_s": upd_wall / full_wall,
            "wall_minus_startup_s": (upd_wall - startup) / (full_wall - startup),
            "after_startup_s": med("update", "after_startup_s") / med("full", "after_startup_s"),
        },
        "noop_update": {
            "wall_s": noop["wall_s"],
            "wall_minus_startup_s": noop["wall_s"] - startup,
            "after_startup_s": noop["after_startup_s"],
            "stdout": noop["stdout"],
        },  # fmt: skip
        "digest_s": digest,
        "full_run_of_grown_store": {"wall_s": full_grown["wall_s"], "report_s": full_grown["report_s"]},
        "check": check,
        "runs": runs,
    }
    result["per_repeat_ratio"] = per_repeat(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(render(result))
    print(render(result))


def per_repeat(r: dict[str, Any]) -> dict[str, float]:
    """The median over repeats of each repeat's update / full ratio (report s, and s after start-up)."""
    pairs = _pairs(r["runs"])
    rep = [u["report_s"] / f["report_s"] for _, f, u in pairs]
    after = [u["after_startup_s"] / f["after_startup_s"] for _, f, u in pairs]
    return {"report_s": statistics.median(rep), "after_startup_s": statistics.median(after)}


def _pairs(runs: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    by = {(x["repeat"], x["kind"]): x for x in runs}
    return [(i, by[i, "full"], by[i, "update"]) for i in sorted({x["repeat"] for x in runs})]


def _ran_on(r: dict[str, Any], kind: str) -> str:
    seen = sorted({x.get("ran_on", r["device"]).split(",")[0] for x in r["runs"] if x["kind"] == kind})
    return " / ".join(seen) or "-"


def render(r: dict[str, Any]) -> str:
    m, q, s = r["median"], r["ratio"], r["store"]
    mach = r["machine"]
    lines = [
        "# Incremental update: `tsconv process --update` after 1% more rows",
        "",
        f"{r['date']}, commit {r['commit']}, {mach['cpu']} ({mach['cores']} cores, {mach['ram_gib']} GiB), "
        f"device {r['device']}{', GPU ' + r['gpu'] if r.get('gpu') else ''}. {r['note']}".rstrip(),
        "",
        f"Store: {s['rows']:,} x {s['features']} float32 written by plain zarr (chunks {s['chunks']}, "
        f"{s['codec']}{_created(s)}), {s.get('unlisted_features', 0)} of its features with no value yet, pipeline "
        f"`{s['pipeline']}`; {s['appended_rows']:,} rows appended (resize + write). "
        f"Each command a fresh `tsconv process` process; median of {len(r['runs']) // 2}.",
        "",
        f"Ran on: full {_ran_on(r, 'full')}, update {_ran_on(r, 'update')} (`--device {r['device']}`).",
        "",
        "| run | rows computed | wall s | after start-up s | report s |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| full (`--overwrite`) | {s['rows']:,} | {m['full_wall_s']:.2f} | {m['full_after_startup_s']:.2f} | "
        f"{m['full_report_s']:.2f} |",
        f"| `--update` | {m['update_rows']:,} | {m['update_wall_s']:.2f} | {m['update_after_startup_s']:.3f} | "
        f"{m['update_report_s']:.3f} |",
        f"| `--update`, nothing new | 0 | {r['noop_update']['wall_s']:.2f} | "
        f"{r['noop_update']['after_startup_s']:.3f} | |",
        f"| **update / full** (of the medians) | | {q['wall_s']:.1%} | **{q['after_startup_s']:.1%}** | "
        f"**{q['report_s']:.1%}** |",
        f"| update / full, median of each repeat's | | | {r['per_repeat_ratio']['after_startup_s']:.1%} | "
        f"{r['per_repeat_ratio']['report_s']:.1%} |",
        "",
        "After start-up: the command's time after its interpreter imported torch, tsconv's engine and CLI, "
        "measured in the process (the wall less the start-up, without subtracting a separate, noisy "
        f"measurement: the bare start-up alone took {r['startup_s']:.2f} s, median of "
        f"{len(r['startup_samples_s'])} samples from {min(r['startup_samples_s']):.2f} to "
        f"{max(r['startup_samples_s']):.2f} s). Report s: the report's `seconds`, the engine's rows only; an "
        "update's checks of its input and its grow of the output come before them.",
        "",
        "Each repeat (the machine's load moved between them):",
        "",
        "| repeat | full wall s | full after start-up s | full report s | update wall s | update after start-up s "
        "| update report s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *[
            f"| {i} | {f['wall_s']:.2f} | {f['after_startup_s']:.2f} | {f['report_s']:.2f} | {u['wall_s']:.2f} | "
            f"{u['after_startup_s']:.3f} | {u['report_s']:.3f} |"
            for i, f, u in _pairs(r["runs"])
        ],
        "",
        f"Input digest (every run takes it; stat of each chunk file, hash of a partial last band): "
        f"{r['digest_s'] * 1e3:.1f} ms. The updated output against a full run of the grown store: {r['check']}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
