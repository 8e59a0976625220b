"""Where a small gemm call's host time goes: cProfile of repeated calls, launch plans on and off.

    python benchmarks/launch_profile.py --out $OUT/launch_profile.txt            # a CUDA GPU

A narrow head ([65536, 256] x [256, 64]) runs in 0.025-0.036 ms on an H200, so the host's time per call
decides what a user's loop gets. This prints, for each mode, the wall time per call of back-to-back calls
(synchronised at the end) and the functions with the most own time under cProfile (which inflates Python
time, so read it for proportions).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shape", default="65536,256,64", help="M,K,N")
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()

    import torch

    from tsconv.kernels import gemm as gemm_mod

    M, K, N = (int(v) for v in args.shape.split(","))
    dev = torch.device("cuda")
    a = torch.randn(M, K, device=dev)
    b = (torch.randn(K, N, device=dev) / K**0.5).half()
    out = torch.empty(M, N, device=dev)
    lines = [f"gemm {M}x{K}x{N} on {torch.cuda.get_device_name(dev)}, {args.calls} calls per mode"]
    for precision in ("fp32", "tf32", "fp16"):
        gemm_mod.gemm(a, b, precision=precision, out=out)  # compile, tune, record the plan
        for plans in (True, False):
            gemm_mod._PLANS_ENABLED = plans
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(args.calls):
                gemm_mod.gemm(a, b, precision=precision, out=out)
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t) / args.calls * 1e6
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.calls):
                gemm_mod.gemm(a, b, precision=precision, out=out)
            prof.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
            lines += [
                "",
                f"## {precision}, plans {'on' if plans else 'off'}: {wall:.1f} us per call",
                s.getvalue(),
            ]
        gemm_mod._PLANS_ENABLED = True
    torch.cuda.synchronize()
    t = time.perf_counter()
    b32 = b.float()
    for _ in range(args.calls):
        torch.matmul(a, b32, out=out)
    torch.cuda.synchronize()
    lines.append(
        f"torch.matmul(a, b32, out=out): {(time.perf_counter() - t) / args.calls * 1e6:.1f} us per call"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(line for line in lines if " us per call" in line or line.startswith("gemm")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
