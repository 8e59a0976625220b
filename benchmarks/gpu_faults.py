"""Faults on the CUDA engine: kill -9 during a GPU run then `--resume`, GPU memory exhausted, killed mid-write.

Claim checked (issue 28, the CUDA side of tests/faultloop.py): a `tsconv process --device cuda` killed with
SIGKILL at any moment leaves an output that never reads as complete, and `--resume` finishes it to the
values of an uninterrupted run (the CUDA engine is deterministic for a given step plan; a resume starts its
steps elsewhere, so the comparison is bitwise where the rows' steps agree and within the fp32 bound
elsewhere: both are recorded); a run that cannot get the GPU memory it needs (a tiny ``--gpu-mem``, or
another process holding the GPU's memory) fails with one ``tsconv: error:`` line and no traceback.

    python benchmarks/gpu_faults.py --out $OUT/gpu_faults.json [--rounds 8] [--device cuda]

Kill times are drawn (seeded) between the bare start-up and the end of an uninterrupted run, with a few near
the end, where the writer is finishing and the metadata is being marked complete.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from provenance import commit, machine  # noqa: E402


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}


def tsconv(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tsconv", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(), cwd="/tmp")  # fmt: skip


def make_store(path: Path, rows: int, features: int) -> None:
    """Tick prices written with plain zarr (zstd, zarr's default), a few symbols starting late."""
    import zarr

    if (path / "zarr.json").exists():
        return
    rng = np.random.default_rng(28)
    x = (
        rng.uniform(20, 500, features)
        + 0.01 * np.cumsum(rng.integers(-1, 2, (rows, features), dtype=np.int8), 0, dtype=np.int32)
    ).astype(np.float32)
    x[: rows // 3, :: max(1, features // 8)] = np.nan
    g = zarr.open_group(str(path), mode="w", zarr_format=3)
    g.create_array("values", data=x, chunks=(16384, min(features, 256)))
    g.create_array("time", data=1_700_000_000_000_000_000 + np.arange(rows, dtype=np.int64) * 1000)
    g.attrs["features"] = [f"s{j}" for j in range(features)]


def read(out: Path) -> tuple[np.ndarray, dict[str, Any]]:
    import zarr

    g = zarr.open_group(str(out), mode="r")
    return np.asarray(g["values"][:]), dict(g.attrs).get("tsconv", {})


def one_line_error(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    err = p.stderr.strip().splitlines()
    return {"rc": p.returncode, "stderr": err[-3:], "one_line": p.returncode != 0 and len(err) >= 1
            and err[-1].startswith("tsconv: error:") and "Traceback" not in p.stderr}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_faults.json")
    ap.add_argument("--work", type=Path, default=Path("/tmp/tsconv-gpu-faults"))
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--rows", type=int, default=1 << 20)
    ap.add_argument("--features", type=int, default=256)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=28)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    src, ref, out = args.work / "in.zarr", args.work / "ref.zarr", args.work / "out.zarr"
    make_store(src, args.rows, args.features)
    common = ["-i", str(src), "--pipeline", "default", "--device", args.device, "-q"]
    t0 = time.perf_counter()
    p = tsconv("process", *common, "-o", str(ref), "--overwrite")
    full = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(p.stderr)
    want, want_attrs = read(ref)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch; torch.zeros(1, device='cuda')"
                    if args.device == "cuda" else "import torch"], check=True)  # fmt: skip
    startup = time.perf_counter() - t0
    doc: dict[str, Any] = {"benchmark": "gpu_faults", "date": dt.datetime.now(dt.UTC).isoformat(),
                           "commit": commit(), "machine": machine(), "device": args.device, "rows": args.rows,
                           "features": args.features, "full_run_s": full, "startup_s": startup, "kills": []}  # fmt: skip
    if args.device == "cuda":
        import torch

        doc["gpu"] = torch.cuda.get_device_name()
    doc["tiny_gpu_mem"] = one_line_error(tsconv("process", *common, "-o", str(out), "--overwrite", "--gpu-mem",
                                                "1MB"))  # fmt: skip
    if args.device == "cuda":
        # another process holds nearly all of the GPU's memory while tsconv starts
        hog = subprocess.Popen([sys.executable, "-c", "import torch, time\nfree, _ = torch.cuda.mem_get_info()\n"
                                "x = torch.empty(free - (256 << 20), dtype=torch.uint8, device='cuda')\n"
                                "print('held', flush=True)\ntime.sleep(120)"], stdout=subprocess.PIPE, text=True)  # fmt: skip
        hog.stdout.readline()
        doc["gpu_held_by_another_process"] = one_line_error(
            tsconv("process", *common, "-o", str(out), "--overwrite")
        )
        hog.kill()
        hog.wait()

    def save() -> None:
        ok = [r for r in doc["kills"] if r.get("resume_rc") == 0 and r.get("nan_pattern_equal")]
        doc["summary"] = {"rounds": len(doc["kills"]), "killed": sum(r["killed"] for r in doc["kills"]),
                          "resumed_to_reference": len(ok),
                          "bitwise": sum(bool(r.get("bitwise_equal")) for r in doc["kills"]),
                          "killed_after_complete": sum(bool(r.get("left_complete")) and r["killed"]
                                                       for r in doc["kills"])}  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")

    save()
    rng = np.random.default_rng(args.seed)
    for k in range(args.rounds):
        near_end = k % 4 == 3
        at = float(rng.uniform(0.9, 1.0) if near_end else rng.uniform(0.0, 1.0))
        when = startup + at * (full - startup)
        if out.exists():
            shutil.rmtree(out)
        child = subprocess.Popen([sys.executable, "-m", "tsconv", "process", *common, "-o", str(out)],
                                 env=_env(), cwd="/tmp", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        time.sleep(when)
        killed = child.poll() is None
        if killed:
            child.send_signal(signal.SIGKILL)
        child.wait()
        row: dict[str, Any] = {"at_s": round(when, 3), "killed": killed}
        if out.exists():
            try:
                _, attrs = read(out)
                row["left_complete"] = bool(attrs.get("complete"))
                row["left_rows_done"] = attrs.get("rows_done")
            except Exception as e:  # noqa: BLE001 - what a reader sees of the killed output
                row["left_unreadable"] = repr(e)[:200]
        r = tsconv("process", *common, "-o", str(out), "--resume")
        row["resume_rc"] = r.returncode
        row["resume_stderr"] = r.stderr.strip().splitlines()[-2:]
        if r.returncode == 0:
            got, attrs = read(out)
            same_nan = bool(np.array_equal(np.isnan(got), np.isnan(want)))
            fin = np.isfinite(want) & np.isfinite(got)
            row["complete"] = bool(attrs.get("complete"))
            row["nan_pattern_equal"] = same_nan
            row["bitwise_equal"] = bool(np.array_equal(got, want, equal_nan=True))
            row["max_abs_diff"] = float(np.abs(got[fin] - want[fin]).max()) if fin.any() else 0.0
            row["max_abs_value"] = float(np.abs(want[np.isfinite(want)]).max())
        doc["kills"].append(row)
        print(json.dumps(row), flush=True)
        save()
    print(json.dumps(doc["summary"]) + "\n" + json.dumps({k: doc.get(k) for k in ("tiny_gpu_mem",
          "gpu_held_by_another_process")}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
