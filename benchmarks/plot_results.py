"""Plots from the benchmark JSON files in benchmarks/results (run on any machine with matplotlib).

Claim shown (measures nothing itself): conv1d.py's figures, tsconv against cuDNN as the taps grow
(benchmarks/NOTES.md, "Kernels: conv1d" and "depthwise banks"). e2e.png comes from
``python benchmarks/e2e.py --render results/e2e.json``.

    python benchmarks/plot_results.py                   # writes results/conv1d.png from results/conv1d.json
    python benchmarks/plot_results.py --out-dir /tmp    # the same figure elsewhere

conv1d.png: time against K, tsconv vs cuDNN, for the dense chunk batches [64, 1024, 1024+K-1] -> 256
in each precision and for the depthwise banks, from results/conv1d.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def plot_conv1d(out_dir: Path = RESULTS) -> Path | None:
    src = RESULTS / "conv1d.json"
    if not src.exists():
        return None
    doc = json.loads(src.read_text())
    cases = doc["cases"]
    fig, (ax_dense, ax_dw) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {"fp32": "tab:blue", "tf32": "tab:orange", "fp16": "tab:green"}
    for prec, color in colors.items():
        rows = sorted(
            (c for c in cases if c["case"].startswith("chunk_k") and c["precision"] == prec),
            key=lambda c: c["K"],
        )
        if not rows:
            continue
        ks = [c["K"] for c in rows]
        ax_dense.plot(ks, [c["tsconv_ms"] for c in rows], "o-", color=color, label=f"tsconv {prec}")
        ax_dense.plot(ks, [c["cudnn_ms"] for c in rows], "s--", color=color, alpha=0.6, label=f"cuDNN {prec}")
    ax_dense.set(xscale="log", yscale="log", xlabel="K (taps)", ylabel="ms (median)")
    ax_dense.set_title("dense [64, 1024, 1024+K-1] -> 256")
    ax_dense.legend(fontsize=7)
    dw = sorted((c for c in cases if c["case"].startswith("depthwise_")), key=lambda c: c["K"])
    if dw:
        ks = [c["K"] for c in dw]
        ax_dw.plot(ks, [c["tsconv_ms"] for c in dw], "o-", label="tsconv fp32")
        ax_dw.plot(ks, [c["cudnn_ms"] for c in dw], "s--", label="cuDNN fp32")
        ax_dw.plot(ks, [c["floor_ms"] for c in dw], ":", color="gray", label="floor")
        for c in dw:
            ax_dw.annotate(
                f"M={c['O'] // c['C']}",
                (c["K"], c["tsconv_ms"]),
                fontsize=7,
                xytext=(4, -10),
                textcoords="offset points",
            )
    ax_dw.set(xscale="log", yscale="log", xlabel="K (taps)", ylabel="ms (median)")
    ax_dw.set_title("depthwise banks [64, 1024, 1024+K-1], M filters/feature")
    ax_dw.legend(fontsize=7)
    fig.suptitle(f"conv1d on {doc['gpu']}, {doc['date'][:10]}, commit {doc['commit']}", fontsize=9)
    fig.tight_layout()
    out = out_dir / "conv1d.png"
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=RESULTS, help="where the figures go (default: results/)")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for made in [plot_conv1d(args.out_dir)]:
        if made:
            print(f"wrote {made}")
