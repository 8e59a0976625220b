"""The default bank's GPU time against its memory floor (issue: built-in filters at their floor).

Claim measured: the default pipeline's bank (diff:1, diff:32, diff:256, dev:32, dev:256 per feature) is a
memory-bound job; its GPU time should be within 2x of its bytes (float32 in, five float32 outputs per
input) over the HBM bandwidth measured in the same run (a device-to-device copy). The bank is timed as the
batched engine calls it: one ``filter_bank`` call per step of ``--step`` rows plus the halo, over the whole
series, with CUDA events; one step is also run under torch's profiler for its kernels (count, GPU time).

    python benchmarks/bank_gpu.py --out $OUT/bank_gpu.json [--shapes 1048576x100,262144x1024] [--step 65536]
    TRITON_INTERPRET=1 python benchmarks/bank_gpu.py --device cpu --shapes 4096x4 --step 1024 --out /tmp/b.json
        # a smoke test of the script (the Triton kernels through the interpreter)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from provenance import commit, machine  # noqa: E402

FILTERS = ("diff:1", "diff:32", "diff:256", "dev:32", "dev:256")


def _prices(rows: int, cols: int, device: Any) -> Any:
    """Tick-grid random walks from 20 to 500, float32, made on the device."""
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    start = 20 + 480 * torch.rand(cols, generator=g, device=device, dtype=torch.float64)
    steps = torch.randint(-1, 2, (rows, cols), generator=g, device=device).to(torch.float64)
    return (start + 0.01 * torch.cumsum(steps, 0)).to(torch.float32)


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn: Any, device: Any) -> float:
    import torch

    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3


def hbm_gbps(device: Any, nbytes: int = 1 << 31) -> float:
    """Device-to-device copy bandwidth (read + write bytes over time), best of 5."""
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(device)
    return 2 * nbytes / min(_timed(lambda: dst.copy_(src), device) for _ in range(5)) / 1e9


def _kernel(bank: Any) -> str:
    from tsconv.kernels.filterbank import fused_plan

    plan = fused_plan(bank)
    return "ladder" if plan is None else ("running sums" if plan.run_rows else "fused")


def one_shape(rows: int, cols: int, step: int, device: Any, repeats: int, bw: float,
              filters: tuple[str, ...] = FILTERS) -> dict[str, Any]:  # fmt: skip
    from tsconv.kernels.filterbank import bank_halo, filter_bank
    from tsconv.pipeline.filters import filter_spec

    bank = tuple(filter_spec(s) for s in filters)
    halo = bank_halo(bank, 1)
    x = _prices(rows + halo, cols, device)
    starts = list(range(0, rows, step))

    def series() -> None:
        for s in starts:
            filter_bank(x[s : min(s + step, rows) + halo], bank)

    series()  # compiles and loads the kernels
    _sync(device)
    secs = [_timed(series, device) for _ in range(repeats)]
    nbytes = rows * cols * 4 * (1 + len(bank))
    med = statistics.median(secs)
    row: dict[str, Any] = {
        "rows": rows, "features": cols, "filters": list(filters), "outputs": cols * len(bank),
        "kernel": _kernel(bank) if device.type == "cuda" else "ladder",
        "step_rows": step, "steps": len(starts),
        "gpu_s": med, "gpu_all_s": secs, "bytes": nbytes, "floor_s": nbytes / (bw * 1e9),
        "over_floor": med / (nbytes / (bw * 1e9)), "effective_gbps": nbytes / med / 1e9,
    }  # fmt: skip
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            filter_bank(x[: min(step, rows) + halo], bank)
            _sync(device)
        kernels = sorted(
            ({"name": e.key[:80], "count": e.count, "gpu_us": e.device_time_total}
             for e in prof.key_averages() if e.device_time_total > 0),
            key=lambda k: -k["gpu_us"],
        )  # fmt: skip
        row["one_step_kernels"] = kernels[:12]
        row["one_step_launches"] = sum(k["count"] for k in kernels)
        row["one_step_gpu_us"] = sum(k["gpu_us"] for k in kernels)
    return row


def render(doc: dict[str, Any], md: Path) -> None:
    lines = [
        f"# Filter banks on the GPU against their memory floor ({doc['gpu']}, {doc['date'][:10]}, "
        f"commit {doc['commit']})",
        "",
        f"HBM bandwidth measured in the same run (device copy): {doc['hbm_gbps']:.0f} GB/s. Floor = float32 "
        "input plus one float32 output per filter and input value over that bandwidth. GPU time: CUDA events around "
        f"one `filter_bank` call per step, median of {doc['repeats']}.",
        "",
        "| bank | kernel | rows x features | step rows | GPU s | floor s | x floor | GB/s | launches per step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in doc["runs"]:
        bank = "default" if tuple(r.get("filters", FILTERS)) == FILTERS else ", ".join(r["filters"])
        lines.append(
            f"| {bank} | {r.get('kernel', 'ladder')} | {r['rows']:,} x {r['features']} | {r['step_rows']:,} "
            f"| {r['gpu_s']:.4f} | {r['floor_s']:.4f} "
            f"| {r['over_floor']:.1f} | {r['effective_gbps']:.0f} | {r.get('one_step_launches', '')} |"
        )
    for r in doc["runs"]:
        if r.get("one_step_kernels"):
            lines += ["", f"Kernels of one step, {r['rows']:,} x {r['features']} (GPU us, count):", ""]
            lines += [f"- {k['name']}: {k['gpu_us']:.0f} us, {k['count']}" for k in r["one_step_kernels"][:8]]
    md.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bank_gpu.json")
    ap.add_argument("--shapes", default="1048576x100,262144x1024")
    ap.add_argument("--step", type=int, default=65536)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--filters",
        action="append",
        default=None,
        help="a bank to time besides the default, comma-separated specs (repeatable)",
    )
    args = ap.parse_args()
    import torch

    device = torch.device(args.device)
    bw = hbm_gbps(device, 1 << 31 if device.type == "cuda" else 1 << 24)
    doc: dict[str, Any] = {
        "benchmark": "bank_gpu", "date": dt.datetime.now(dt.UTC).isoformat(), "commit": commit(),
        "machine": machine(), "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "hbm_gbps": bw, "repeats": args.repeats, "runs": [],
    }  # fmt: skip
    banks = [FILTERS] + [tuple(b.split(",")) for b in args.filters or []]
    for bank in banks:
        for shape in args.shapes.split(","):
            rows, cols = map(int, shape.split("x"))
            doc["runs"].append(one_shape(rows, cols, args.step, device, args.repeats, bw, bank))
            print(
                json.dumps({k: v for k, v in doc["runs"][-1].items() if k != "one_step_kernels"}), flush=True
            )
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(doc, indent=1) + "\n")
            render(doc, args.out.with_suffix(".md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
