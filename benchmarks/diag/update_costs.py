"""Where a fresh `tsconv process --update` spends its time after start-up, profiled in its own process.

Claim measured: the fixed costs of an update of 1% more rows (benchmarks/NOTES.md, "Incremental updates"),
taken apart on the machine at hand: for each ``--device``, a fresh process runs the CLI's update under
cProfile (after the same start-up imports as ``benchmarks/update.py`` measures from), then a fresh no-op
update, each with its report and its slowest functions.

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

_PROFILED = r"""
import cProfile, json, pstats, sys, time
import torch, tsconv.engine.api, tsconv.cli
if "cuda" in sys.argv or ("auto" in sys.argv and torch.cuda.is_available()):
    torch.zeros(1, device="cuda")
pr = cProfile.Profile()
t1 = time.perf_counter()
pr.enable()
try:
    tsconv.cli.main(sys.argv[2:], prog_name="tsconv")
except SystemExit:
    pass
pr.disable()
after = time.perf_counter() - t1
st = pstats.Stats(pr)
rows = []
for (f, line, name), (cc, nc, tt, ct, _) in st.stats.items():
    rows.append([round(ct, 4), round(tt, 4), nc, f"{f.split('site-packages/')[-1]}:{line}({name})"])
top = {"cumulative": sorted(rows, reverse=True)[:60], "tottime": sorted(rows, key=lambda r: -r[1])[:40]}
json.dump({"after_startup_s": after, "profile": top}, open(sys.argv[1], "w"))
"""


def _profiled(src: Path, out: Path, device: str, work: Path) -> dict:
    prof, report = work / "prof.json", work / "report.json"
    cmd = [sys.executable, "-c", _PROFILED, str(prof), "process", "-i", str(src), "-o", str(out), "--pipeline",
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
        for kind in ("update", "noop"):
            out = work / f"{device}.features.zarr"
            if kind == "update":
                shutil.rmtree(out, ignore_errors=True)
                shutil.copytree(base, out)
            got = _profiled(src, out, device, work)
            result["runs"].append({"device": device, "kind": kind, **got})
            print(f"{device} {kind}: {got['after_startup_s']:.3f} s after start-up (profiled)", flush=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
