"""What conv1d's ``recenter=True`` costs and buys: time and error with and without it, same process and data.

    python benchmarks/recenter_cost.py --out $OUT/recenter_cost.json [--quick]

The engine's first stage on CUDA runs with ``recenter=True`` (per block of outputs, x minus the channel's
value at the block's first output step, plus that value times the tap sum). For each shape (the conv1d
benchmark's depthwise banks and dense chunk batch, and the engine's dense step) this times both settings
(triton's do_bench, median) and measures each one's error against a float64 reference on raw price levels
(max |y - ref| over max |ref|), beside torch's float32 error; ``--level`` moves the series away from 100
(a stale centering level in the engine is the same thing). Writes JSON with gpu, date and commit, and a
table beside it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from provenance import commit  # noqa: E402

from tsconv.kernels.conv1d import conv1d, last_launch  # noqa: E402

# name, N, C, L_out, O, K, groups (None: depthwise, O = M * C)
CASES = [
    ("depthwise K16 M4", 64, 1024, 1024, 4, 16, None),
    ("depthwise K64 M8", 64, 1024, 1024, 8, 64, None),
    ("depthwise K256 M4", 64, 1024, 1024, 4, 256, None),
    ("dense chunk K5", 64, 1024, 1024, 256, 5, 1),
    ("engine step dense K5", 1, 1024, 16384, 256, 5, 1),
]


def _data(case, level: float, dev: torch.device):
    name, N, C, L_out, O_or_M, K, groups = case
    g = torch.Generator(device=dev).manual_seed(0)
    L = L_out + K - 1
    walk = 0.05 * torch.randn((N, L, C), generator=g, device=dev, dtype=torch.float64)
    x = (level + walk.cumsum(1)).float().transpose(1, 2)  # [N, C, L] view of a time-major buffer
    depthwise = groups is None
    groups = C if depthwise else groups
    O = O_or_M * C if depthwise else O_or_M
    w = torch.randn((O, C // groups, K), generator=g, device=dev, dtype=torch.float64)
    w -= w.mean(dim=(1, 2), keepdim=True)  # zero-sum filters: the case levels hurt
    w = (w / (C // groups * K) ** 0.5).half()
    return x, w, groups


def _measure(case, level: float, dev: torch.device, do_bench) -> dict:  # noqa: ANN001
    x, w, groups = _data(case, level, dev)
    kw = dict(groups=groups, padding="valid")
    ref = F.conv1d(x.double(), w.double(), groups=groups)
    scale = ref.abs().max().item()
    err_torch = (F.conv1d(x, w.float(), groups=groups).double() - ref).abs().max().item() / scale
    out = torch.empty((x.shape[0], ref.shape[2], w.shape[0]), device=dev).transpose(1, 2)
    rec = {"case": case[0], "N": x.shape[0], "C": x.shape[1], "L": x.shape[2], "O": w.shape[0],
           "K": w.shape[2], "groups": groups, "level": level, "torch_fp32_err": err_torch}  # fmt: skip
    for rc in (False, True):
        conv1d(x, w, out=out, recenter=rc, **kw)  # tunes on first use (the same config for both)
        torch.cuda.synchronize()
        err = (out.double() - ref).abs().max().item() / scale
        ms = float(do_bench(lambda rc=rc: conv1d(x, w, out=out, recenter=rc, **kw), warmup=25, rep=100,
                            return_mode="median"))  # fmt: skip
        tag = "recenter" if rc else "plain"
        rec[f"{tag}_ms"], rec[f"{tag}_err"] = ms, err
        rec[f"{tag}_config"] = (
            f"{last_launch.get('path')} {last_launch.get('config')}"  # to compare with conv1d.md
        )
    rec["time_ratio"] = rec["recenter_ms"] / rec["plain_ms"]
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "recenter_cost.json")
    ap.add_argument("--quick", action="store_true", help="the first depthwise case and the engine step only")
    ap.add_argument("--level", type=float, default=100.0, help="the series' level (100: like prices)")
    args = ap.parse_args()
    from triton.testing import do_bench

    dev = torch.device("cuda")
    torch.backends.cudnn.allow_tf32 = False  # torch's error in true float32 (its default lets cuDNN use TF32)
    cases = [CASES[0], CASES[-1]] if args.quick else CASES
    rows = []
    for case in cases:
        rec = _measure(case, args.level, dev, do_bench)
        rows.append(rec)
        print(json.dumps(rec), flush=True)
        torch.cuda.empty_cache()
    doc = {
        "gpu": torch.cuda.get_device_name(0),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit(),
        "torch": torch.__version__,
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        f"# conv1d recenter: cost and error ({doc['gpu']}, {doc['date']}, {doc['commit']})",
        "",
        f"Price levels around {args.level:g} (0.05 steps), zero-sum float16 filters, valid padding, fp32.",
        "",
        "| case | plain ms | recenter ms | ratio | plain err | recenter err | torch fp32 err |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['plain_ms']:.3f} | {r['recenter_ms']:.3f} | {r['time_ratio']:.3f} "
            f"| {r['plain_err']:.2e} | {r['recenter_err']:.2e} | {r['torch_fp32_err']:.2e} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
