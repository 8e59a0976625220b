"""Where a fresh `tsconv process --update` spends its time after start-up, timed in its own process.

Claim measured: the fixed costs of an update of 1% more rows (benchmarks/NOTES.md, "Incremental updates"),
taken apart on the machine at hand: for each ``--device``, a fresh process runs the CLI's update under
cProfile (after the same start-up imports as ``benchmarks/update.py`` measures from), then a fresh no-op
update, each with its report, its steps and the engine's trace spans.

    python benchmarks/diag/update_costs.py --out $OUT/update_costs.json [--devices auto,cpu]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import update as U  # noqa: E402
from provenance import commit, machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

_TIMED = r"""
import functools, importlib, json, sys, time
import torch, tsconv.engine.api, tsconv.cli
from tsconv import trace
if "cuda" in sys.argv or ("auto" in sys.argv and torch.cuda.is_available()):
    torch.zeros(1, device="cuda")
steps = []
def timed(mod, qual):
    owner = importlib.import_module(mod)
    *path, name = qual.split(".")
    for p in path:
        owner = getattr(owner, p)
    f = getattr(owner, name)
    @functools.wraps(f)
    def w(*a, **k):
        s = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            steps.append([qual, round(s - t0, 4), round(time.perf_counter() - s, 4)])
    setattr(owner, name, w)
for mod, qual in json.loads(sys.argv[2]):
    timed(mod, qual)
t0 = time.perf_counter()
with trace.recording() as spans:
    try:
        tsconv.cli.main(sys.argv[3:], prog_name="tsconv")
    except SystemExit:
        pass
after = time.perf_counter() - t0
kinds = {}
for name, _, a, b, _ in spans:
    k = kinds.setdefault(name, {"n": 0, "sum_s": 0.0, "first_s": 1e9, "last_s": 0.0})
    k["n"] += 1; k["sum_s"] += b - a; k["first_s"] = min(k["first_s"], a - t0); k["last_s"] = max(k["last_s"], b - t0)
json.dump({"after_startup_s": after, "steps": sorted(steps, key=lambda r: r[1]), "spans": kinds}, open(sys.argv[1], "w"))
"""
# Wall-clock wrappers (not cProfile, which slows the threads it does not see): each step's start and length
# after start-up, and the engine's trace spans (decode, writes) summed by kind.
_STEPS = [["tsconv.engine.outputs", "_prepare_update"], ["tsconv.io.digest", "verify_input"],
          ["tsconv.io.digest", "input_digest"], ["tsconv.io.store", "open_input"],
          ["tsconv.io.writers.zarr_writer", "OutputWriter.reopen"], ["tsconv.engine.outputs", "_record_fill"],
          ["tsconv.io.writers.zarr_writer", "OutputWriter.finish"], ["tsconv.io.digest", "write_digest"]]  # fmt: skip


def _timed(src: Path, out: Path, device: str, work: Path) -> dict:
    prof, report = work / "prof.json", work / "report.json"
    cmd = [sys.executable, "-c", _TIMED, str(prof), json.dumps(_STEPS), "process", "-i", str(src), "-o", str(out), "--pipeline",
           "default", "--device", device, "--update", "-q", "--report", str(report)]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True)
    got = json.loads(prof.read_text())
    got["report"] = json.loads(report.read_text()) if report.exists() else None
    report.unlink(missing_ok=True)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--devices", default="auto,cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tsconv-update-costs"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    grown = args.rows + args.rows // 100
    x, t = U.tick_series(grown, args.features, seed=0, unlisted=1)
    src, base = work / "ticks.zarr", work / "base.features.zarr"
    U.write_store(src, x, t, args.rows)
    subprocess.run([sys.executable, "-m", "tsconv", "process", "-i", str(src), "-o", str(base), "--pipeline",
                    "default", "--device", "cpu", "-q"], cwd=ROOT, check=True)  # fmt: skip
    U.set_rows(src, x, t, grown)
    result = {"benchmark": "diag/update_costs", "commit": commit(), "machine": machine(), "runs": []}
    for device in args.devices.split(","):
        for kind in ["update", "noop"] * args.repeats:
            out = work / f"{device}.features.zarr"
            if kind == "update":
                shutil.rmtree(out, ignore_errors=True)
                shutil.copytree(base, out)
            got = _timed(src, out, device, work)
            result["runs"].append({"device": device, "kind": kind, **got})
            steps = " ".join(f"{q.split('.')[-1]}@{t0:.3f}+{dt:.3f}" for q, t0, dt in got["steps"])
            spans = " ".join(
                f"{k}:{v['n']}x/{v['sum_s']:.3f}s@{v['first_s']:.3f}-{v['last_s']:.3f}"
                for k, v in got["spans"].items()
            )
            print(
                f"{device} {kind}: {got['after_startup_s']:.3f} s after start-up; {steps}; {spans}",
                flush=True,
            )
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
