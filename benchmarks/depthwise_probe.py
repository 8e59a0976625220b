"""Where does the depthwise (direct) kernel's time go? Variants of its tap loop on the H200.

A probe, not a product path: the same tile and tap loop as ``tsconv.kernels.conv1d.direct._conv1d_direct_kernel``
(CG = 1, time-major x and output), with switches that take one cost away at a time:

- ``X_ONCE``: x loaded once before the tap loop instead of once per tap (no per-tap x traffic);
- ``W_ONCE``: the weight tile loaded once instead of once per tap;
- ``STORE``: 0 skips the output store (kept alive through a conditional store that never fires).

Usage: ``python benchmarks/depthwise_probe.py --out results/depthwise_probe.json`` (GPU only).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["stride_xc", "stride_wg"])
def _probe_kernel(
    x_ptr, w_ptr, y_ptr, L_out, G, K, pad, n_tblk, n_gblk,
    stride_xn, stride_xc, stride_xt, stride_wk, stride_wm, stride_wg, stride_yn, stride_yt,
    OG: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_M: tl.constexpr,
    UNROLL: tl.constexpr, X_ONCE: tl.constexpr, W_ONCE: tl.constexpr, STORE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    pid_g = pid % n_gblk
    rest = pid // n_gblk
    pid_t = rest % n_tblk
    n = rest // n_tblk
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_g = pid_g * BLOCK_G + tl.arange(0, BLOCK_G)
    offs_m = tl.arange(0, BLOCK_M)
    t_base = offs_t - pad
    x_ptrs = (
        x_ptr
        + n.to(tl.int64) * stride_xn
        + t_base[:, None, None] * stride_xt
        + (offs_g * stride_xc)[None, :, None]
    )
    w_ptrs = w_ptr + offs_m[None, :] * stride_wm + offs_g[:, None] * stride_wg
    live = (t_base >= 0)[:, None, None]
    acc = tl.full((BLOCK_T, BLOCK_G, BLOCK_M), 0.0, tl.float32)
    x0 = tl.load(x_ptrs + pad * stride_xt)
    w0 = tl.load(w_ptrs)
    for k0 in range(0, K, UNROLL):
        for j in tl.static_range(UNROLL):
            k = k0 + j
            if X_ONCE:
                xv = x0 + k  # a per-tap value without a load (keeps the FMA count)
            else:
                xv = tl.load(x_ptrs + k * stride_xt, mask=live, other=0.0)
            if W_ONCE:
                wv = w0
            else:
                wv = tl.load(w_ptrs + k * stride_wk)
            acc += xv * wv[None, :, :]
    o = offs_g[:, None] * OG + offs_m[None, :]
    y_ptrs = y_ptr + n.to(tl.int64) * stride_yn + o[None, :, :] + offs_t[:, None, None] * stride_yt
    if STORE:
        tl.store(y_ptrs, acc, mask=(offs_t < L_out)[:, None, None])
    else:
        tl.store(y_ptrs, acc, mask=(acc == 12345.678) & (offs_t < 0)[:, None, None])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    dev = torch.device("cuda")
    from triton.testing import do_bench

    rows = []
    for K, M in ((16, 4), (64, 8), (256, 4)):
        N, C, L = 64, 1024, 1024
        x = (100 + torch.randn(N, L + K - 1, C, device=dev).cumsum(1) * 0.05).contiguous()
        w = torch.randn(K, M, C, device=dev)  # [K, M, G]: channels contiguous
        y = torch.empty(N, L, C * M, device=dev)
        for bt, bg, warps, unroll in ((128, 16, 4, 8), (128, 16, 4, 1), (128, 32, 8, 4)):
            for x_once, w_once, store in ((0, 0, 1), (1, 0, 1), (0, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 0)):
                n_tblk, n_gblk = triton.cdiv(L, bt), triton.cdiv(C, bg)
                grid = (N * n_tblk * n_gblk,)

                run = functools.partial(
                    _probe_kernel[grid],
                    x, w, y, L, C, K, K - 1, n_tblk, n_gblk, x.stride(0), x.stride(2), x.stride(1),
                    w.stride(0), w.stride(1), w.stride(2), y.stride(0), y.stride(1), OG=M, BLOCK_T=bt, BLOCK_G=bg, BLOCK_M=M,
                    UNROLL=unroll, X_ONCE=x_once, W_ONCE=w_once, STORE=store, num_warps=warps,
                )  # fmt: skip
                run()
                ms = do_bench(run, warmup=20, rep=100)
                flops = 2 * N * L * C * M * K
                row = dict(K=K, M=M, tile=f"t{bt}_g{bg}_w{warps}_u{unroll}", x_once=x_once, w_once=w_once,
                           store=store, ms=round(ms, 4), tflops=round(flops / ms / 1e9, 1))  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    commit = (
        os.environ.get("TSCONV_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    )
    meta = {"gpu": torch.cuda.get_device_name(dev), "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "commit": commit, "triton": triton.__version__, "rows": rows}  # fmt: skip
    args.out.write_text(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
