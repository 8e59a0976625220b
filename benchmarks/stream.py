"""tsconv.Stream: microseconds per row of live pushes against a batch ``features()`` run over the same rows.

Claim measured: a push of n rows costs about n + lookback rows of the batch engine's work plus a fixed
per-push overhead, whatever the history (benchmarks/NOTES.md, "Streaming"). For each pipeline, on a
tick-grid price series of ROWS x FEATURES: 10,000 pushes of 1 row, 100 pushes of 1024 rows, and one
``features()`` call over the same rows; the pushes' rows are checked equal to the batch run's (bit for bit
on the CPU). The first and the last tenth of the 1-row pushes are timed apart: equal figures mean no growth
with history.

    python benchmarks/stream.py                       # default and dense_head, on the CPU
    python benchmarks/stream.py --device cuda --name stream_h200

Writes benchmarks/results/NAME.json and NAME.md (``--name``, default stream).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
import warnings
from pathlib import Path

import numpy as np
from provenance import commit, machine

import tsconv

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def _prices(rows: int, features: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    ticks = np.round(rng.uniform(20, 500, size=features) * 100)
    return ((ticks + np.cumsum(rng.choice([-1, 0, 0, 1], size=(rows, features)), axis=0)) / 100).astype(
        np.float32
    )


def _case(pipeline: str, features: int, device: str) -> dict:
    names = [f"x{j}" for j in range(features)]
    x = _prices(102_400 + 10_000, features)
    res: dict = {"pipeline": pipeline, "features": features}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tsconv.TsconvWarning)
        # warm: the first calls in a process build torch's kernels and thread pools
        tsconv.features(x[:2000], pipeline, names=names, device=device)
        warm = tsconv.Stream(pipeline, features=names, device=device)
        for i in range(50):
            warm.push(x[i])
        t0 = time.perf_counter()
        batch = tsconv.features(x, pipeline, names=names, device=device)
        res["features_us_per_row"] = (time.perf_counter() - t0) / x.shape[0] * 1e6
        stream = tsconv.Stream(pipeline, features=names, device=device)
        res["lookback_rows"] = stream.lookback
        outs, laps = [], []
        for i in range(10_000):
            t0 = time.perf_counter()
            outs.append(stream.push(x[i]))
            laps.append(time.perf_counter() - t0)
        laps_us = np.array(laps) * 1e6
        res["push_1_us_per_row"] = float(laps_us.mean())
        res["push_1_us_first_tenth"] = float(laps_us[:1000].mean())
        res["push_1_us_last_tenth"] = float(laps_us[-1000:].mean())
        t0 = time.perf_counter()
        for i in range(10_000, x.shape[0], 1024):
            outs.append(stream.push(x[i : i + 1024]))
        res["push_1024_us_per_row"] = (time.perf_counter() - t0) / (x.shape[0] - 10_000) * 1e6
    got = np.concatenate(outs)
    res["equal_to_batch"] = bool(np.array_equal(got, batch, equal_nan=True))
    finite = np.isfinite(batch)
    res["max_abs_diff"] = float(np.abs(got - batch)[finite].max()) if finite.any() else 0.0
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--name", default="stream")
    args = ap.parse_args()
    cases = [_case("default", 8, args.device), _case("dense_head", 64, args.device)]
    doc = {
        "benchmark": "stream",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "machine": machine(),
        "device": args.device,
        "rows": "10,000 pushes of 1 row, then 100 of 1024 rows; features() over the same 112,400 rows",
        "cases": cases,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    m = doc["machine"]
    lines = [
        f"# tsconv.Stream ({args.device})",
        "",
        f"{doc['date']}, commit {doc['commit']}, {m['cpu']} ({m['cores']} cores), Python {m['python']}.",
        f"{doc['rows']}. Written by `benchmarks/stream.py`.",
        "",
        "| pipeline | features | lookback rows | features() us/row | 1-row push us | first / last tenth | "
        "1024-row push us/row | equal to batch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        lines.append(
            f"| {c['pipeline']} | {c['features']} | {c['lookback_rows']} | {c['features_us_per_row']:.2f} | "
            f"{c['push_1_us_per_row']:.0f} | {c['push_1_us_first_tenth']:.0f} / {c['push_1_us_last_tenth']:.0f} | "
            f"{c['push_1024_us_per_row']:.2f} | {c['equal_to_batch']} (max diff {c['max_abs_diff']:.1e}) |"
        )
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
