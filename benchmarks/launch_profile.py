"""Where a small gemm or conv1d call's host time goes: cProfile of repeated calls.

    python benchmarks/launch_profile.py --out $OUT/launch_profile.txt            # gemm, plans on and off
    python benchmarks/launch_profile.py --op conv1d --out $OUT/launch_profile_conv1d.txt

conv1d (``--conv-shape N,C,L,O,K,dilation``, default the off-sample dense case of conv1d.py whose tf32 /
fp16 TMA calls measured 0.34-0.55 ms of host per call on the H200 hosts, more than their kernels): per
precision, the config the tuner picked, wall time per call, host time to issue a call, and cProfile.

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
    p.add_argument("--op", choices=("gemm", "conv1d"), default="gemm")
    p.add_argument(
        "--conv-shape",
        default="32,384,2048,96,7,2;64,1024,1028,256,5,1",
        help="N,C,L,O,K,dilation; several separated by ';'",
    )
    args = p.parse_args()
    if args.op == "conv1d":
        return _conv1d(args)

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
            _, wall, stats = _profile(
                lambda p=precision: gemm_mod.gemm(a, b, precision=p, out=out), args.calls, 18
            )
            lines += ["", f"## {precision}, plans {'on' if plans else 'off'}: {wall:.1f} us per call", stats]
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


def _profile(fn, calls: int, top: int) -> tuple[float, float, str]:  # noqa: ANN001
    """``calls`` back-to-back calls of ``fn``: us to issue one, us per call (synchronised at the end), then
    the ``top`` functions by own time under cProfile over as many calls."""
    import torch

    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    issue = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / calls * 1e6
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)
    return issue, wall, s.getvalue()


def _host_us(fn, calls: int = 100) -> float:  # noqa: ANN001
    """us of host time to issue one ``fn()`` while the GPU is busy (a long sleep kernel queued first), so
    neither an idle GPU nor a full launch queue enters the figure."""
    import torch

    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(500_000_000)  # ~0.25 s at the H200's clock: longer than the calls take to issue
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return host


def _conv1d(args: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F

    from tsconv.kernels import conv1d as conv_mod
    from tsconv.kernels.autotune import gpu_ms
    from tsconv.kernels.conv1d import api as conv_api

    dev = torch.device("cuda")
    lines: list[str] = []
    for shape in args.conv_shape.split(";"):
        N, C, L, O, K, d = (int(v) for v in shape.split(","))
        x = torch.randn(N, L, C, device=dev).transpose(1, 2)  # the engine's time-major view
        w = (torch.randn(O, C, K, device=dev) / (C * K) ** 0.5).half()
        out = torch.empty(N, L, O, device=dev).transpose(1, 2)
        lines += [
            "",
            f"# conv1d [{N}, {C}, {L}] -> {O}, K={K}, dilation={d} on {torch.cuda.get_device_name(dev)}",
        ]

        def call(precision: str) -> None:
            conv_mod.conv1d(x, w, dilation=d, precision=precision, out=out)  # noqa: B023

        for precision in ("fp32", "tf32", "fp16"):
            call(precision)  # compile and tune
            fn = lambda p=precision: call(p)  # noqa: E731
            gpu = gpu_ms(fn) * 1e3
            for plans in (True, False):
                conv_api._PLANS_ENABLED = plans
                host = _host_us(fn)
                issue, wall, stats = _profile(fn, args.calls, 14)
                lines += [
                    "",
                    f"## {precision} plans {'on' if plans else 'off'} ({conv_mod.last_launch}): "
                    f"{wall:.1f} us per call back to back, host {host:.1f} us per call (GPU busy), "
                    f"GPU {gpu:.1f} us per call (graph), {issue:.1f} us to issue one back to back",
                    stats,
                ]
            conv_api._PLANS_ENABLED = True
        # the host's speed for comparison: cuDNN's calls on the same data (fp16 on pre-cast operands)
        torch.backends.cudnn.benchmark = True
        xc, wc = F.pad(x.contiguous(), ((K - 1) * d, 0)), w.float()
        x16, w16 = xc.half(), w.contiguous()
        for name, fn in (
            ("F.conv1d fp32", lambda: F.conv1d(xc, wc, dilation=d)),  # noqa: B023
            ("F.conv1d fp16", lambda: F.conv1d(x16, w16, dilation=d)),  # noqa: B023
        ):
            fn()
            gpu = gpu_ms(fn) * 1e3
            host = _host_us(fn)
            issue, wall, _ = _profile(fn, args.calls, 1)
            lines.append(
                f"{name} (pre-padded): {wall:.1f} us per call back to back, host {host:.1f} us per call, "
                f"GPU {gpu:.1f} us (graph)"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(line for line in lines if " us per call" in line or line.startswith("# conv1d")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
