"""tsconv.kernels.conv1d on a GPU: a correctness pass at real sizes, then timings against cuDNN.

Claim measured: tsconv's conv1d (dense and depthwise banks, in fp32 / tf32 / fp16) is as accurate as cuDNN in
the same precision class and faster than it at the engine's shapes (benchmarks/NOTES.md, "Kernels: conv1d"
and "depthwise banks").

    python benchmarks/conv1d.py --out $OUT/conv1d.json            # full run (about 4-6 minutes on an H200)
    python benchmarks/conv1d.py --quick --out $OUT/conv1d.json    # a subset
    python benchmarks/conv1d.py --check                           # the correctness pass only
    python benchmarks/conv1d.py --cases depthwise,chunk_k16 --precisions fp32 --budget-s 200 --out ...
        # a subset by case name or prefix; --budget-s stops starting new cases before the deadline
        # (the JSON and markdown are rewritten after every case, so a timeout still leaves data)
    python benchmarks/conv1d.py --device cpu --quick              # smoke test of this script (interpreter)

Correctness: every case is compared against a float64 torch reference (on the first few series of the
batch), next to torch's own error in the same precision class: "fp32" must stay within 4x cuDNN's float32
error (TF32 off), "tf32" and "fp16" within 2x the larger of cuDNN's TF32 / float16 error and that of an
emulated tensor-core product (operands rounded to TF32 / float16, float32 accumulation: cuDNN may pick a
float32 algorithm even with TF32 allowed), plus a small atol. "fp32" cases run
on raw price levels (random walks around 100) through zero-sum (difference-like) filters, the data the
default mode is for; "tf32" / "fp16" cases run on normalised returns, the only data they are fit for.

Timing: ``triton.testing.do_bench`` medians of tsconv (time-major [N, L, C] input view and [N, L, O] output
view, the engine's layout) against torch F.conv1d with ``cudnn.benchmark = True`` on contiguous [N, C, L]
(cuDNN's own layout; causal cases pre-padded outside the timed region), in the same precision class:
fp32 with ``cudnn.allow_tf32 = False`` vs tsconv "fp32"; TF32 allowed vs "tf32"; float16 inputs and
weights vs "fp16". The first tsconv call of each shape class tunes (the time is printed) and writes the
winner to the disk cache; a subprocess then checks that a fresh process reuses it.

floor_ms = max(bytes moved / 4.16 TB/s, flops / peak): bytes = x read once + weights + output written once;
peak = the measured fp32 FMA (CUDA-core) peak for "fp32" rows (so a 3xTF32 kernel on tensor cores can beat
that floor) and cuBLAS's measured TF32 / FP16 throughput on the H200 (363 / 694 TFLOP/s, FACTS.md) for
"tf32" / "fp16" rows.

Writes JSON to --out and a markdown table beside it (same name, .md). Imports only torch, triton, numpy and
tsconv.kernels.* (the GPU machine has no zarr / polars).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import triton
import triton.language as tl
from provenance import commit  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HBM_BYTES_PER_S = 4.16e12  # device-to-device copy, FACTS.md
TC_PEAK_TFLOPS = {"tf32": 363.0, "fp16": 694.0}  # cuBLAS 4096^3 on the H200, FACTS.md
NOMINAL_FP32_TFLOPS = 67.0
N_CHECK = 4  # series of the batch compared against the float64 reference
ATOL = {"fp32": 1e-7, "tf32": 1e-5, "fp16": 1e-5}
FACTOR = {"fp32": 4.0, "tf32": 2.0, "fp16": 2.0}


def _make_fma_peak_kernel():
    """A Triton kernel of independent FMA chains (4 per element), to measure the CUDA-core fp32 peak."""

    @triton.jit
    def _fma_peak_kernel(out_ptr, a, b, iters, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x0 = offs.to(tl.float32) * 1e-9
        x1 = x0 + 1.0
        x2 = x0 + 2.0
        x3 = x0 + 3.0
        for _ in range(iters):
            x0 = x0 * a + b
            x1 = x1 * a + b
            x2 = x2 * a + b
            x3 = x3 * a + b
        tl.store(out_ptr + offs, x0 + x1 + x2 + x3)

    return _fma_peak_kernel


@dataclass(frozen=True)
class Case:
    name: str
    N: int
    C: int
    L: int
    O: int
    K: int
    groups: int = 1
    dilation: int = 1
    padding: str = "valid"
    precisions: tuple[str, ...] = ("fp32",)
    layout: str = "tm"  # "tm": time-major views in and out (the engine's layout); "cm": contiguous [N, C, L]
    activation: str | None = None
    quick: tuple[str, ...] = ()  # precisions kept by --quick


def cases() -> list[Case]:
    out = [
        Case(
            "classic",
            16,
            256,
            16384,
            256,
            5,
            padding="causal",
            precisions=("fp32", "tf32", "fp16"),
            quick=("fp32", "tf32"),
        ),
    ]
    for K in (5, 16, 64):
        out.append(
            Case(
                f"chunk_k{K}",
                64,
                1024,
                1024 + K - 1,
                256,
                K,
                precisions=("fp32", "tf32", "fp16"),
                quick=("fp16",) if K == 16 else (),
            )
        )
    for K, M in ((16, 4), (64, 8), (256, 4)):
        out.append(
            Case(
                f"depthwise_k{K}_m{M}",
                64,
                1024,
                1024 + K - 1,
                1024 * M,
                K,
                groups=1024,
                quick=("fp32",) if K == 64 else (),
            )
        )
    out += [
        # off-sample shapes: every figure gets re-measured on shapes of its kind
        Case(
            "offsample_dense_c384_o96_k7_d2",
            32,
            384,
            2048,
            96,
            7,
            dilation=2,
            padding="causal",
            precisions=("fp32", "tf32", "fp16"),
        ),
        Case(
            "offsample_depthwise_k32_m3_d4", 32, 512, 2048, 1536, 32, groups=512, dilation=4, padding="causal"
        ),
        Case("offsample_grouped_g8_k8", 32, 1024, 1031, 512, 8, groups=8, precisions=("fp32",)),
        Case("offsample_chunk_k5_gelu", 64, 1024, 1028, 256, 5, activation="gelu", precisions=("fp32",)),
        Case(
            "offsample_classic_channel_major",
            16,
            256,
            16384,
            256,
            5,
            padding="causal",
            layout="cm",
            precisions=("fp32",),
        ),
    ]
    return out


def smoke_cases() -> list[Case]:
    """Tiny versions for --device cpu (Triton interpreter): exercise the script, not the speed."""
    return [
        Case("classic", 1, 24, 70, 20, 5, padding="causal", precisions=("fp32", "tf32", "fp16")),
        Case("chunk_k16", 1, 32, 64 + 15, 16, 16, precisions=("fp32",)),
        Case("depthwise_k16_m4", 1, 16, 64 + 15, 64, 16, groups=16),
        Case("offsample_depthwise_k32_m3_d4", 1, 8, 60, 24, 32, groups=8, dilation=4, padding="causal"),
        Case("offsample_classic_channel_major", 1, 16, 50, 16, 5, padding="causal", layout="cm"),
    ]


@dataclass
class Row:
    case: str
    N: int
    C: int
    L: int
    O: int
    K: int
    groups: int
    dilation: int
    precision: str
    padding: str = ""
    layout: str = ""
    activation: str | None = None
    path: str = ""
    config: str = ""
    tune_s: float | None = None
    first_call_ms: float | None = None
    tsconv_ms: float | None = None
    kernel_ms: float | None = None
    call_wall_ms: float | None = None
    cudnn_ms: float | None = None
    speedup: float | None = None
    tflops: float | None = None
    gbps: float | None = None
    floor_ms: float | None = None
    peak_used: str = ""
    max_err: float | None = None
    torch_err: float | None = None
    torch_emulated_err: float | None = None
    bound: float | None = None
    pass_: bool | None = None
    error: str | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        return d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "conv1d.json")
    ap.add_argument("--quick", action="store_true", help="a subset of the cases")
    ap.add_argument("--check", action="store_true", help="the correctness pass only (no timings)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: interpreter smoke test")
    ap.add_argument("--dump-ir", type=Path, default=None, help="write each tuned kernel's TTGIR and PTX here")
    ap.add_argument("--no-subprocess", action="store_true", help="skip the cross-process cache check")
    ap.add_argument(
        "--cache-dir",
        default=None,
        help="autotune cache folder (sets TSCONV_CACHE_DIR, which the replay child reads too)",
    )
    ap.add_argument(
        "--cases", default=None, help="comma-separated case names or prefixes (e.g. depthwise,chunk_k16)"
    )
    ap.add_argument("--precisions", default=None, help="comma-separated precisions to keep (e.g. fp32,tf32)")
    ap.add_argument(
        "--budget-s", type=float, default=None, help="stop starting new work after this many seconds"
    )
    ap.add_argument("--replay", default=None, help=argparse.SUPPRESS)  # CASE:PRECISION, used by that check
    args = ap.parse_args()

    if args.cache_dir:
        os.environ["TSCONV_CACHE_DIR"] = str(Path(args.cache_dir).resolve())
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # read when tsconv's kernels are defined (imported below)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on the GPU machine, or use --device cpu for a smoke test", file=sys.stderr)
        return 2
    bench = Bench(args)
    if args.replay:
        return bench.replay(args.replay)
    return bench.run()


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import triton

        from tsconv.kernels import autotune
        from tsconv.kernels import conv1d as conv1d_mod
        from tsconv.kernels.conv1d import api as conv1d_api
        from tsconv.kernels.conv1d import spec as conv1d_spec

        self.args = args
        self.torch = torch
        self.triton = triton
        self.autotune = autotune
        self.mod = conv1d_mod
        self.api, self.spec = conv1d_api, conv1d_spec
        self.dev = torch.device(args.device)
        self.gpu = (
            torch.cuda.get_device_name(self.dev) if self.dev.type == "cuda" else "cpu (Triton interpreter)"
        )
        self.rows: list[Row] = []
        self.t0 = time.perf_counter()
        self.fp32_peak, self.peak_note = NOMINAL_FP32_TFLOPS, "not measured yet"

    # ---------------------------------------------------------------------------------------- helpers

    def sync(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize(self.dev)

    def bench_ms(self, fn) -> float:
        if self.dev.type == "cuda":
            from triton.testing import do_bench

            return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return sorted(times)[1]

    def data(self, case: Case, precision: str):
        """x as [N, C, L] (a time-major view for layout 'tm'), fp16 zero-sum weights, a small bias."""
        torch = self.torch
        g = torch.Generator(device=self.dev).manual_seed(0)
        shape = (case.N, case.L, case.C)
        if precision == "fp32":  # raw price levels: random walks around 100
            steps = torch.randn(shape, generator=g, device=self.dev, dtype=torch.float32).mul_(0.05)
            buf = steps.cumsum_(1).add_(100.0)
        else:  # normalised returns
            buf = torch.randn(shape, generator=g, device=self.dev, dtype=torch.float32)
        x = buf.transpose(1, 2)
        if case.layout == "cm":
            x = x.contiguous()
        Cg = case.C // case.groups
        w = torch.randn((case.O, Cg, case.K), generator=g, device=self.dev, dtype=torch.float64)
        if Cg * case.K > 1:
            w -= w.mean(dim=(1, 2), keepdim=True)
        w = (w / math.sqrt(Cg * case.K)).to(torch.float16)
        b = (0.01 * torch.randn(case.O, generator=g, device=self.dev)).float()
        return x, w, b

    def out_buffer(self, case: Case):
        L_out = case.L if case.padding == "causal" else case.L - (case.K - 1) * case.dilation
        if case.layout == "cm":
            out = self.torch.empty((case.N, case.O, L_out), device=self.dev)
        else:
            out = self.torch.empty((case.N, L_out, case.O), device=self.dev).transpose(1, 2)
        return out, L_out

    def measure_fp32_peak(self) -> tuple[float, str]:
        if self.dev.type != "cuda":
            return NOMINAL_FP32_TFLOPS, "nominal (no GPU)"
        try:
            _fma_peak_kernel = _make_fma_peak_kernel()

            sms = self.torch.cuda.get_device_properties(self.dev).multi_processor_count
            block, iters = 1024, 4096
            grid = (sms * 16,)
            out = self.torch.empty(grid[0] * block, device=self.dev)

            def run():
                _fma_peak_kernel[grid](out, 0.999, 0.001, iters, BLOCK=block, num_warps=4)

            run()
            ms = self.bench_ms(run)
            tflops = 2 * 4 * iters * block * grid[0] / (ms * 1e-3) / 1e12
            if not 20.0 <= tflops <= 120.0:
                return (
                    NOMINAL_FP32_TFLOPS,
                    f"nominal {NOMINAL_FP32_TFLOPS} (measured {tflops:.1f} implausible)",
                )
            return tflops, "measured (Triton FMA loop)"
        except Exception as exc:  # noqa: BLE001
            return NOMINAL_FP32_TFLOPS, f"nominal {NOMINAL_FP32_TFLOPS} (measurement failed: {exc})"

    def tsconv_call(self, case: Case, x, w, b, out, precision: str):
        from tsconv.kernels.conv1d import conv1d

        return lambda: conv1d(
            x,
            w,
            b,
            dilation=case.dilation,
            groups=case.groups,
            padding=case.padding,
            activation=case.activation,
            precision=precision,
            out=out,
        )

    def cudnn_call(self, case: Case, x, w, b, precision: str):
        torch = self.torch
        import torch.nn.functional as F

        xc = x.contiguous()
        if case.padding == "causal":
            xc = F.pad(xc, ((case.K - 1) * case.dilation, 0))
        if precision == "fp16":
            xc, wc, bc = xc.half(), w.half(), b.half()
        else:
            wc, bc = w.float(), b.float()
        act = {None: None, "relu": torch.relu, "gelu": F.gelu, "tanh": torch.tanh}[case.activation]

        def run():
            y = F.conv1d(xc, wc, bc, dilation=case.dilation, groups=case.groups)
            return act(y) if act is not None else y

        return run

    def set_cudnn_precision(self, precision: str) -> None:
        if self.dev.type == "cuda":
            self.torch.backends.cudnn.benchmark = True
            self.torch.backends.cudnn.allow_tf32 = precision == "tf32"

    # -------------------------------------------------------------------------------------------- passes

    def selected(self) -> list[tuple[Case, str]]:
        cs = smoke_cases() if self.dev.type == "cpu" else cases()
        if self.args.cases:
            names = [n.strip() for n in self.args.cases.split(",") if n.strip()]
            cs = [c for c in cs if any(c.name == n or c.name.startswith(n) for n in names)]
        if self.args.quick:
            if self.dev.type == "cpu":
                todo = [(c, p) for c in cs[:3] for p in c.precisions[:1]]
            else:
                todo = [(c, p) for c in cs for p in c.quick]
        else:
            todo = [(c, p) for c in cs for p in c.precisions]
        if self.args.precisions:
            keep = {p.strip() for p in self.args.precisions.split(",")}
            todo = [(c, p) for c, p in todo if p in keep]
        return todo

    def out_of_time(self, reserve_s: float = 0.0) -> bool:
        budget = self.args.budget_s
        return budget is not None and time.perf_counter() - self.t0 > budget - reserve_s

    def check_pass(self, todo: list[tuple[Case, str]]) -> None:
        torch = self.torch
        print(f"== correctness pass ({len(todo)} cases) on {self.gpu}", flush=True)
        for case, precision in todo:
            if self.out_of_time(reserve_s=20.0):
                print(f"budget reached: skipping {case.name} [{precision}] and later cases", flush=True)
                break
            row = Row(
                case.name,
                case.N,
                case.C,
                case.L,
                case.O,
                case.K,
                case.groups,
                case.dilation,
                precision,
                padding=case.padding,
                layout=case.layout,
                activation=case.activation,
            )
            self.rows.append(row)
            try:
                self.check_one(case, precision, row)
            except Exception as exc:  # noqa: BLE001 - report and continue
                row.pass_ = False
                row.error = f"{type(exc).__name__}: {exc}"
                print(f"FAIL {case.name} [{precision}]: {row.error}", flush=True)
            if self.dev.type == "cuda":
                torch.cuda.empty_cache()
            self.write_results(partial=True)

    def check_one(self, case: Case, precision: str, row: Row) -> None:
        from tsconv.kernels.conv1d_reference import (
            conv1d_reference,
            relative_error,
            torch_conv1d_in_precision,
        )

        torch = self.torch
        x, w, b = self.data(case, precision)
        out, _ = self.out_buffer(case)
        out.fill_(math.nan)
        n_events = len(self.autotune.events())
        call = self.tsconv_call(case, x, w, b, out, precision)
        self.sync()
        t = time.perf_counter()
        call()
        self.sync()
        row.first_call_ms = (time.perf_counter() - t) * 1e3
        tuned = [e for e in self.autotune.events()[n_events:] if e.source == "tuned"]
        row.tune_s = round(sum(e.seconds for e in tuned), 3)
        row.path = self.mod.last_launch.get("path", "")
        row.config = self.mod.last_launch.get("config", "")
        n = min(N_CHECK, case.N)
        kw = dict(
            dilation=case.dilation, groups=case.groups, padding=case.padding, activation=case.activation
        )
        ref = conv1d_reference(x[:n], w, b, **kw)
        self.set_cudnn_precision(precision)
        yt = torch_conv1d_in_precision(x[:n], w, b, precision=precision, **kw)
        unwritten = int(torch.isnan(out).sum().item())
        row.max_err = relative_error(out[:n], ref)
        row.torch_err = relative_error(yt, ref)
        yardstick = row.torch_err
        if precision != "fp32":  # cuDNN may pick a float32 algorithm even with TF32 allowed: also emulate
            ye = torch_conv1d_in_precision(x[:n], w, b, precision=precision, emulate=True, **kw)
            row.torch_emulated_err = relative_error(ye, ref)
            yardstick = max(yardstick, row.torch_emulated_err)
        row.bound = FACTOR[precision] * yardstick + ATOL[precision]
        row.pass_ = unwritten == 0 and row.max_err <= row.bound
        if unwritten:
            row.error = f"{unwritten} outputs not written (NaN poison left)"
        tune = f", tuned in {row.tune_s:.1f} s" if row.tune_s else ""
        print(
            f"{'PASS' if row.pass_ else 'FAIL'} {case.name} [{precision}]: error {row.max_err:.2e}, "
            f"torch {row.torch_err:.2e}, bound {row.bound:.2e} ({row.path} {row.config}, first call "
            f"{row.first_call_ms:.0f} ms{tune})" + (f" {row.error}" if row.error else ""),
            flush=True,
        )
        if self.args.dump_ir is not None:
            self.dump_ir(case, x, w, b, out, precision)

    def dump_ir(self, case: Case, x, w, b, out, precision: str) -> None:
        spec = self.spec.validate(
            x,
            w,
            b,
            out,
            dilation=case.dilation,
            groups=case.groups,
            padding=case.padding,
            activation=case.activation,
            precision=precision,
        )
        compiled = self.api._conv1d_triton(x, w, b, out, spec)
        asm = getattr(compiled, "asm", None)
        if not asm:
            return
        self.args.dump_ir.mkdir(parents=True, exist_ok=True)
        for kind in ("ttgir", "ptx"):
            if kind in asm:
                (self.args.dump_ir / f"{case.name}_{precision}.{kind}").write_text(str(asm[kind]))

    def time_pass(self, fp32_peak: float) -> None:
        torch = self.torch
        print("== timings (do_bench medians)", flush=True)
        for row in self.rows:
            case = next(
                c for c in (smoke_cases() if self.dev.type == "cpu" else cases()) if c.name == row.case
            )
            precision = row.precision
            if row.error and "not written" not in row.error:
                continue
            if self.out_of_time(reserve_s=10.0):
                print(f"budget reached: not timing {row.case} [{precision}] and later rows", flush=True)
                break
            try:
                self.time_one(case, precision, row, fp32_peak)
            except Exception as exc:  # noqa: BLE001
                row.error = (row.error + "; " if row.error else "") + f"timing: {type(exc).__name__}: {exc}"
                print(f"timing failed for {row.case} [{precision}]: {row.error}", flush=True)
            if self.dev.type == "cuda":
                torch.cuda.empty_cache()
            self.write_results(partial=True)

    def time_one(self, case: Case, precision: str, row: Row, fp32_peak: float) -> None:
        x, w, b = self.data(case, precision)
        out, L_out = self.out_buffer(case)
        ts = self.tsconv_call(case, x, w, b, out, precision)
        ts()
        row.tsconv_ms = self.bench_ms(ts)
        if self.dev.type == "cuda":  # is a call bound by its host side? (GPU time alone vs wall per call)
            from tsconv.kernels.autotune import gpu_ms

            try:
                row.kernel_ms = gpu_ms(ts, warmup_ms=10, rep_ms=50)
            except Exception as exc:  # noqa: BLE001 - the row stands without it
                print(f"kernel_ms for {row.case} [{precision}]: {type(exc).__name__}: {exc}", flush=True)
            self.sync()
            t, n = time.perf_counter(), 200
            for _ in range(n):
                ts()
            self.sync()
            row.call_wall_ms = (time.perf_counter() - t) * 1e3 / n
        self.set_cudnn_precision(precision)
        cd = self.cudnn_call(case, x, w, b, precision)
        cd()
        self.sync()
        row.cudnn_ms = self.bench_ms(cd)
        Cg = case.C // case.groups
        flops = 2.0 * case.N * case.O * L_out * Cg * case.K
        nbytes = x.numel() * x.element_size() + w.numel() * w.element_size() + case.N * case.O * L_out * 4
        cuda_cores = precision == "fp32" or row.path in ("direct", "bank", "window")
        peak = fp32_peak if cuda_cores else TC_PEAK_TFLOPS[precision]
        row.peak_used = (
            f"fp32 FMA {fp32_peak:.1f} TFLOP/s" if cuda_cores else f"{precision} TC {peak:.0f} TFLOP/s"
        )
        row.floor_ms = max(nbytes / HBM_BYTES_PER_S, flops / (peak * 1e12)) * 1e3
        row.speedup = row.cudnn_ms / row.tsconv_ms
        row.tflops = flops / (row.tsconv_ms * 1e-3) / 1e12
        row.gbps = nbytes / (row.tsconv_ms * 1e-3) / 1e9
        print(
            f"{row.case} [{precision}]: tsconv {row.tsconv_ms:.3f} ms, cuDNN {row.cudnn_ms:.3f} ms, "
            f"{row.speedup:.2f}x, {row.tflops:.1f} TFLOP/s, {row.gbps:.0f} GB/s, floor {row.floor_ms:.3f} ms "
            f"(at {row.floor_ms / row.tsconv_ms:.0%} of the floor's speed)",
            flush=True,
        )

    def cross_process_check(self) -> dict:
        """A fresh process runs the first case again: it must read the tuned config from disk, not re-tune."""
        if self.dev.type != "cuda" or not self.rows or self.args.no_subprocess:
            return {"checked": False}
        row = self.rows[0]
        cmd = [sys.executable, str(Path(__file__).resolve()), "--replay", f"{row.case}:{row.precision}"]
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            res = json.loads(lines[-1]) if lines else {"stderr": proc.stderr[-2000:]}
        except (subprocess.SubprocessError, OSError, ValueError) as exc:
            res = {"error": str(exc)}
        res["checked"] = True
        res["wall_s"] = round(time.perf_counter() - t, 2)
        res["reused"] = res.get("sources") == ["disk"]
        shown = {k: v for k, v in res.items() if k != "stderr"}
        print(
            f"cross-process cache: {'reused (no re-tuning)' if res['reused'] else 'NOT reused'} {shown}",
            flush=True,
        )
        if "stderr" in res:
            print(res["stderr"], flush=True)
        return res

    def replay(self, what: str) -> int:
        """--replay CASE:PRECISION: one first call in this (fresh) process; prints where its config came from."""
        name, precision = what.rsplit(":", 1)
        case = next(c for c in cases() if c.name == name)
        x, w, b = self.data(case, precision)
        out, _ = self.out_buffer(case)
        self.sync()
        t = time.perf_counter()
        self.tsconv_call(case, x, w, b, out, precision)()
        self.sync()
        ms = (time.perf_counter() - t) * 1e3
        print(
            json.dumps({"sources": [e.source for e in self.autotune.events()], "first_call_ms": round(ms, 1)})
        )
        return 0

    # ------------------------------------------------------------------------------------------ driver

    def tuning_records(self) -> list[dict]:
        """The tuner's decisions so far, with each candidate's timing when it was tuned in this run."""
        return [
            {
                "space": e.space,
                "key": e.key,
                "config": e.config,
                "source": e.source,
                "seconds": e.seconds,
                "timings_ms": dict(e.timings_ms),
            }
            for e in self.autotune.events()
        ]

    def write_results(self, *, partial: bool, xproc: dict | None = None) -> dict:
        """Write the JSON and markdown results so far (after every case, so a timeout still leaves data)."""
        torch = self.torch
        tuning = self.tuning_records()
        tune_total = sum(e["seconds"] for e in tuning if e["source"] == "tuned")
        n_pass = sum(1 for r in self.rows if r.pass_)
        cache = str(self.autotune.cache_path(self.dev)) if self.dev.type == "cuda" else None
        result = {
            "gpu": self.gpu,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "commit": commit(),
            "torch": torch.__version__,
            "triton": self.triton.__version__,
            "partial": partial,
            "fp32_peak_tflops": round(self.fp32_peak, 2),
            "fp32_peak_note": self.peak_note,
            "hbm_bytes_per_s": HBM_BYTES_PER_S,
            "tc_peak_tflops": TC_PEAK_TFLOPS,
            "autotune_cache": cache,
            "tuning": tuning,
            "tuning_seconds": round(tune_total, 2),
            "cross_process_cache": xproc or {"checked": False},
            "passed": n_pass,
            "failed": len(self.rows) - n_pass,
            "wall_s": round(time.perf_counter() - self.t0, 1),
            "cases": [r.to_json() for r in self.rows],
        }
        out = self.args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=1))
        os.replace(tmp, out)
        out.with_suffix(".md").write_text(markdown(result))
        if cache and Path(cache).is_file():  # keep the tuned winners beside the results
            (out.parent / f"{out.stem}_{Path(cache).name}").write_text(Path(cache).read_text())
        return result

    def run(self) -> int:
        import torch

        todo = self.selected()
        cache = str(self.autotune.cache_path(self.dev)) if self.dev.type == "cuda" else None
        print(
            f"tsconv conv1d benchmark on {self.gpu}; torch {torch.__version__}, triton {self.triton.__version__}; "
            f"autotune cache {cache}",
            flush=True,
        )
        fp32_peak, peak_note = self.measure_fp32_peak()
        self.fp32_peak, self.peak_note = fp32_peak, peak_note
        print(f"fp32 FMA peak: {fp32_peak:.1f} TFLOP/s ({peak_note})", flush=True)
        self.check_pass(todo)
        tuning = self.tuning_records()
        tune_total = sum(e["seconds"] for e in tuning if e["source"] == "tuned")
        print(
            f"tuning: {sum(e['source'] == 'tuned' for e in tuning)} shape classes tuned in {tune_total:.1f} s, "
            f"{sum(e['source'] == 'disk' for e in tuning)} read from the disk cache",
            flush=True,
        )
        if not self.args.check:
            self.time_pass(fp32_peak)
        xproc = {"checked": False} if self.out_of_time(reserve_s=15.0) else self.cross_process_check()
        result = self.write_results(partial=False, xproc=xproc)
        n_pass = result["passed"]
        print(
            f"{n_pass}/{len(self.rows)} cases pass; wrote {self.args.out} and {self.args.out.with_suffix('.md')} "
            f"in {result['wall_s']:.0f} s",
            flush=True,
        )
        return 0 if n_pass == len(self.rows) else 1


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def markdown(res: dict) -> str:
    lines = [
        "# tsconv conv1d vs cuDNN",
        "",
        f"GPU {res['gpu']}, {res['date']}, commit {res['commit']}, torch {res['torch']}, triton {res['triton']}.",
        f"fp32 FMA peak {res['fp32_peak_tflops']} TFLOP/s ({res['fp32_peak_note']}); HBM 4.16 TB/s; "
        f"tf32/fp16 floors use cuBLAS's {res['tc_peak_tflops']['tf32']}/{res['tc_peak_tflops']['fp16']} TFLOP/s.",
        f"Tuning: {res['tuning_seconds']} s in this run; cross-process cache reuse: "
        f"{res['cross_process_cache'].get('reused', 'not checked')}.",
        "",
        "tsconv reads the time-major [N, L, C] view and writes a time-major [N, L, O] view (layout tm) unless the "
        "layout is cm; cuDNN runs on contiguous [N, C, L]. kernel ms: the GPU time of a tsconv call "
        "alone (calls replayed from a CUDA graph); wall/call: 200 back-to-back calls (host or GPU, the slower). "
        "Errors are max|y - ref| / max|ref| against float64; "
        "fp32 rows on raw price levels, tf32/fp16 rows on normalised returns.",
        "",
        "| case | N x C x L | O | K | groups | dil | prec | path / config | tsconv ms | kernel ms | wall/call ms | "
        "cuDNN ms | speedup | TFLOP/s | GB/s | floor ms | error | torch error | pass |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
        "| --- |",
    ]
    for r in res["cases"]:
        lines.append(
            f"| {r['case']} | {r['N']}x{r['C']}x{r['L']} | {r['O']} | {r['K']} | {r['groups']} | {r['dilation']} | "
            f"{r['precision']} | {r['path']} {r['config']} | {_f(r['tsconv_ms'], '.3f')} | "
            f"{_f(r.get('kernel_ms'), '.3f')} | {_f(r.get('call_wall_ms'), '.3f')} | {_f(r['cudnn_ms'], '.3f')} | "
            f"{_f(r['speedup'], '.2f')} | {_f(r['tflops'], '.1f')} | {_f(r['gbps'], '.0f')} | "
            f"{_f(r['floor_ms'], '.3f')} | {_f(r['max_err'], '.1e')} | {_f(r['torch_err'], '.1e')} | "
            f"{'PASS' if r['pass'] else 'FAIL'} |"
        )
    errors = [r for r in res["cases"] if r.get("error")]
    if errors:
        lines += ["", "Errors:", ""] + [f"- {r['case']} [{r['precision']}]: {r['error']}" for r in errors]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
