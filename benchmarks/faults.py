"""Faults: tsconv's CLI killed with SIGKILL at seeded points, recovered, and compared, round after round.

Claim checked: nothing lost, nothing mixed (issue 28). A kill -9 at any file-system change of ``process``,
``process --resume``, ``process --overwrite``, ``ingest`` or ``ingest --append`` leaves a store that never
reads as complete unless it is the old or the finished data, and the next step a user takes
(``--resume``, ``--overwrite`` again, ``--append`` again or ``tsconv repair``) ends with exactly the
uninterrupted result (benchmarks/NOTES.md, "The writer": "Killed at any change").

The loop is tests/faultloop.py (tests/test_faults.py runs a few of its rounds); this script runs many on
the CPU and records the counts by operation and kill point, and every failure with its seed and round.

    python benchmarks/faults.py                       # 200 rounds, seed 28: benchmarks/results/faults.json
    python benchmarks/faults.py --rounds 20 --seed 3  # a quick run
    python benchmarks/faults.py --minutes 15          # stop starting rounds after 15 minutes
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
sys.path.insert(0, str(ROOT))

from provenance import commit, machine  # noqa: E402

from tests.faultloop import run_loop  # noqa: E402


def main() -> None:
    """Run the loop, print a summary, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--seed", type=int, default=28)
    ap.add_argument("--minutes", type=float, default=None, help="start no round after this many minutes")
    ap.add_argument("--exec", action="store_true", help="a fresh interpreter per step (slow: seconds each)")
    ap.add_argument("--out", type=Path, default=RESULTS / "faults.json")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="tsconv-faults-"))
    deadline = time.monotonic() + 60 * args.minutes if args.minutes else None
    summary = run_loop(tmp / "w", rounds=args.rounds, seed=args.seed, exec=args.exec, deadline=deadline)
    kept = bool(summary["failures"])  # a failed round's directory stays for a look
    if not kept:
        shutil.rmtree(tmp, ignore_errors=True)
    doc = {
        "benchmark": "faults",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "machine": machine(),
        "note": "each round: one op killed (SIGKILL) right before or after its n-th file-system change "
        "(os.replace/rename/unlink/rmdir; n, before/after, write threads 0 or 2 and the recovery drawn from "
        "(seed, round)), then recovered and compared with an uninterrupted run; steps run as forked "
        "children of one server process that imported tsconv"
        + (" (here: a fresh interpreter each)" if args.exec else ""),
        **summary,
    }
    if kept:
        doc["failed_rounds_kept_in"] = str(tmp / "w")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{summary['rounds']} rounds ({summary['rounds_asked']} asked), {summary['kills']} kills, "
          f"{len(summary['failures'])} failures in {summary['seconds']} s -> {args.out}")  # fmt: skip
    for f in summary["failures"]:
        print(f"  FAILED round {f['round']} (seed {f['seed']}) {f['op']}: {f['error']}")
    sys.exit(1 if summary["failures"] else 0)


if __name__ == "__main__":
    main()
