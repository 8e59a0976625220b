"""The running-sum bank kernel against the fused kernel alone, on the GPU: bits, then time per tile.

Correctness first: each variant's output equals the CPU ladder's bits on tick-grid prices (late starts, gaps,
+-inf prints), and stays within 2e-6 of each output's scale of it with a 1e30 print and a column spanning
1e-3 to 1e5 (tiles the running kernel flags, recomputed by the fused kernel). Then each variant is timed as
the batched engine calls a bank (one ``run_fused`` per 65,536-row step plus the halo, CUDA events, median of
5) against its floor: float32 in plus one float32 output per filter over the device-copy bandwidth measured
in the same run.

    python benchmarks/diag/bank_running.py --out $OUT/bank_running.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bank_gpu import _prices, _timed, hbm_gbps  # noqa: E402
from provenance import commit, machine  # noqa: E402

from tsconv.kernels import filterbank_triton  # noqa: E402
from tsconv.kernels.filterbank import bank_halo, filter_bank, fused_plan  # noqa: E402
from tsconv.kernels.filterbank_triton import run_fused  # noqa: E402
from tsconv.pipeline.filters import filter_spec  # noqa: E402

BANKS = {
    "default": ("diff:1", "diff:32", "diff:256", "dev:32", "dev:256"),
    "short": ("diff:1", "ret:1", "ma:7", "dev:20", "lag:5"),
}
TILES = [None, "auto", (256, 32, 1, 1), (128, 32, 1, 1), (64, 32, 1, 1)]  # None: the fused kernel alone


def _plan(fs, tile):  # noqa: ANN001, ANN202
    if tile == "auto":
        return fused_plan.__wrapped__(fs)
    return fused_plan.__wrapped__(fs, running=(0, 0, 1, 1) if tile is None else tile)


def _run(plan, x, halo):  # noqa: ANN001, ANN202
    out = torch.full((x.shape[0] - halo, x.shape[1] * len(plan.kinds)), float("nan"), device=x.device)
    run_fused(plan, x, out, halo=halo, dilation=1)
    return out


def correctness(dev: torch.device) -> list[dict]:
    rng = np.random.default_rng(3)
    rows, cols = 200_000, 40
    base = 20 + 480 * rng.random(cols)
    x = (base + 0.01 * np.cumsum(rng.integers(-1, 2, (rows, cols)), 0)).astype(np.float32)
    x[: rows // 3, 1] = np.nan
    x[5000:5030, 2] = np.nan
    x[[700, 90_000], 3] = np.inf
    x[1234, 3] = -np.inf
    wild = x.copy()
    wild[100_000, 5] = 1e30
    wild[150_000:, 7] = np.where(np.arange(150_000, rows) % 7 == 0, 1e-3, 1e5)
    out = []
    for bank, specs in BANKS.items():
        fs = tuple(filter_spec(s) for s in specs)
        halo = bank_halo(fs, 1)
        for name, data in (("prices", x), ("wild", wild)):
            want = filter_bank(torch.from_numpy(data), fs, triton_kernels=False).numpy()
            scale = np.nanmax(np.where(np.isfinite(want), np.abs(want), np.nan), axis=0)
            xd = torch.from_numpy(data).to(dev)
            for tile in TILES:
                got = _run(_plan(fs, tile), xd, halo).cpu().numpy()
                same_nan = bool(np.array_equal(np.isnan(got), np.isnan(want)))
                fin = np.isfinite(want)
                err = float(np.max(np.where(fin, np.abs(got - want), 0) / np.maximum(scale, 1e-30)))
                bits = bool(np.array_equal(got, want, equal_nan=True))
                out.append({"bank": bank, "data": name, "tile": tile, "bits_equal_cpu": bits,
                            "same_nan": same_nan, "max_err_over_scale": err})  # fmt: skip
                print(out[-1], flush=True)
    return out


def _tile(text: str):  # noqa: ANN202
    """'fused' (the fused kernel alone), 'auto' (the plan's own tile) or rows x channels x warps x unroll,
    each with an optional 'rN': the running kernel compiled with at most N registers a thread (maxnreg)."""
    text, _, reg = text.partition("r")
    if text in ("fused", "auto"):
        tile = None if text == "fused" else "auto"
    else:
        tile = tuple(int(v) for v in text.split("x"))
    return (tile, int(reg) if reg else None)


class _Running:
    """The running kernel launched with ``maxnreg`` (None: Triton's choice); records its registers and spills."""

    seen: dict = {}

    def __init__(self, real, maxnreg):  # noqa: ANN001
        self.real, self.maxnreg = real, maxnreg

    def __call__(self, plan):  # noqa: ANN001, ANN204
        kernel, maxnreg = self.real(plan), self.maxnreg

        class _Launch:
            def __getitem__(self, grid):  # noqa: ANN001, ANN204
                def launch(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                    if maxnreg is not None:
                        kwargs["maxnreg"] = maxnreg
                    k = kernel[grid](*args, **kwargs)
                    _Running.seen["regs"] = getattr(k, "n_regs", None)
                    _Running.seen["spills"] = getattr(k, "n_spills", None)
                    return k

                return launch

        return _Launch()


def timing(dev: torch.device, bw: float, shapes, step: int, repeats: int, tiles) -> list[dict]:  # noqa: ANN001
    out = []
    real_running = filterbank_triton.running_kernel
    for rows, cols in shapes:
        for bank, specs in BANKS.items():
            fs = tuple(filter_spec(s) for s in specs)
            halo = bank_halo(fs, 1)
            x = _prices(rows + halo, cols, dev)
            starts = list(range(0, rows, step))
            nbytes = rows * cols * 4 * (1 + len(fs))
            for tile, maxnreg in tiles:
                plan = _plan(fs, tile)
                filterbank_triton.running_kernel = _Running(real_running, maxnreg)
                _Running.seen = {}
                width = cols * len(fs)
                bufs = [torch.empty((min(s + step, rows) - s, width), device=dev) for s in starts[:2]]

                def series(
                    plan=plan, bufs=bufs, x=x, halo=halo, starts=starts, rows=rows, width=width
                ) -> None:  # noqa: ANN001
                    for i, s in enumerate(starts):
                        e = min(s + step, rows)
                        o = bufs[i % 2] if e - s == step else torch.empty((e - s, width), device=dev)
                        run_fused(plan, x[s : e + halo], o, halo=halo, dilation=1)

                series()
                torch.cuda.synchronize()
                secs = [_timed(series, dev) for _ in range(repeats)]
                med = statistics.median(secs)
                floor = nbytes / (bw * 1e9)
                out.append({"rows": rows, "features": cols, "bank": bank, "tile": tile, "maxnreg": maxnreg,
                            "gpu_s": med, "all_s": secs, "floor_s": floor, "over_floor": med / floor,
                            "running_regs": _Running.seen.get("regs"), "running_spills": _Running.seen.get("spills")})  # fmt: skip
                filterbank_triton.running_kernel = real_running
                print(out[-1], flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="1048576x100,262144x1024,2097152x96")
    ap.add_argument("--step", type=int, default=65536)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tiles", default="fused,auto,256x32x1x1,128x32x1x1,64x32x1x1",
                    help="timed variants: fused, auto, or rows x channels x warps x unroll; rN: maxnreg N")  # fmt: skip
    ap.add_argument("--no-correctness", action="store_true")
    a = ap.parse_args()
    dev = torch.device("cuda")
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    tiles = [_tile(t) for t in a.tiles.split(",")]
    doc = {
        "machine": machine(),
        "commit": commit(),
        "correctness": [] if a.no_correctness else correctness(dev),
    }
    bw = hbm_gbps(dev)
    doc["hbm_gbps"] = bw
    doc["timing"] = timing(dev, bw, shapes, a.step, a.repeats, tiles)
    a.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
