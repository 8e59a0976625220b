"""tsconv.kernels.gemm on a GPU: a correctness pass at real sizes, then timings against cuBLAS.

Claim measured: tsconv's gemm (the projection head, float16-stored weights) is as accurate as cuBLAS in the
same precision class, and its speed against cuBLAS on square, head-shaped and off-sample products (the
engine's narrow head [65536, 256] x [256, 64]: level or faster; benchmarks/NOTES.md, "Kernels: the GEMM head").

    python benchmarks/gemm.py --out $OUT/gemm.json --cache-dir $OUT      # full run (about 3 minutes, H200)
    python benchmarks/gemm.py --quick --out $OUT/gemm.json               # a subset
    python benchmarks/gemm.py --cases square_4096,head_256x64            # chosen cases
    python benchmarks/gemm.py --device cpu --quick                       # smoke test of this script (interpreter)

Correctness (first, at the real sizes; the float64 reference covers the first ``CHECK_ROWS`` rows): "fp32"
must stay within 4x cuBLAS float32's own error (TF32 off), on price levels (random walks around 100) times
zero-sum float16 ``b`` columns (the data the default mode is for) and on plain normals; "tf32" / "fp16"
within 2x the larger of cuBLAS's own error in that precision and an emulated tensor-core product (operands
as the kernel feeds them: "tf32" a truncated to TF32 by the tensor core and b rounded to the nearest TF32;
"fp16" both rounded to float16; float32 accumulation), plus atol 1e-5, on normals.

Timing: ``triton.testing.do_bench`` medians. tsconv: ``gemm(a, b, out=out)`` with float32 ``a`` and
float16-stored ``b`` (the call a user makes: the packed copy of ``b`` is cached after the first call) and
``tsconv_packed_ms`` with ``pack_weights(b)`` made once; ``kernel_ms``: the same call replayed from a CUDA graph
(GPU time alone); ``call_wall_ms``: wall time per call of 200 back-to-back calls (host or GPU, the slower);
``noplan_ms`` / ``noplan_wall_ms``: the same two with launch plans off (every call validated, looked up in
the tuner and launched through ``kernel[grid]``: the path before plans); ``cublas_wall_ms``: cuBLAS's wall
time per call the same way. cuBLAS: ``torch.matmul`` on operands prepared outside the timed region, in the
same precision class: float32 with ``allow_tf32 = False`` vs "fp32", TF32 allowed vs "tf32", float16 ``a``
and ``b`` vs "fp16"; for "fp16" also ``cublas_with_cast_ms``, which includes ``a.half()`` (a arrives as
float32, as tsconv reads it), and ``tsconv_a16_ms``: tsconv given that float16 ``a`` (features stored in
float16), ``speedup_a16`` = cublas_ms / tsconv_a16_ms. speedup = cublas_ms / tsconv_ms.

floor_ms = max(bytes / 4.16 TB/s, FLOPs / peak): bytes = a read once (4 bytes per element) + b + out written
once; peak = cuBLAS's measured TF32 / FP16 throughput (363 / 694 TFLOP/s, FACTS.md), and 363 / 3 for "fp32"
(three TF32 products per multiply-add with float16 ``b``).

Writes JSON to --out (after every row) and a markdown table beside it (same name, .md). Imports only torch,
triton, numpy and tsconv.kernels.*.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from provenance import commit  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HBM_BYTES_PER_S = 4.16e12  # device-to-device copy, FACTS.md
PEAK_TFLOPS = {"fp32": 363.0 / 3, "tf32": 363.0, "fp16": 694.0}
CUBLAS_FP32_TFLOPS = 51.0
CHECK_ROWS = 8192
ATOL = {"fp32": 1e-7, "tf32": 1e-5, "fp16": 1e-5}
FACTOR = {"fp32": 4.0, "tf32": 2.0, "fp16": 2.0}
ALL = ("fp32", "tf32", "fp16")


@dataclass(frozen=True)
class Case:
    name: str
    M: int
    K: int
    N: int
    precisions: tuple[str, ...] = ALL
    quick: tuple[str, ...] = ()
    a_layout: str = "row"  # "row": [M, K] contiguous; "col": a transposed view (M contiguous)
    bias: bool = False
    activation: str | None = None


def cases() -> list[Case]:
    return [
        Case("square_4096", 4096, 4096, 4096, quick=("fp32", "tf32", "fp16")),
        Case("head_256x64", 65536, 256, 64, quick=ALL),
        Case("head_8192x256", 65536, 8192, 256, quick=("fp32",)),
        # off-sample shapes: every figure gets re-measured on shapes of its kind
        Case("off_head_100003_384x24", 100003, 384, 24, precisions=("fp32", "tf32")),
        Case("off_wide_4096x96", 4096, 4096, 96, precisions=("fp32", "fp16")),
        Case(
            "off_head_512x128_bias_gelu", 65536, 512, 128, precisions=("fp32",), bias=True, activation="gelu"
        ),
        Case("off_square_transposed_a", 4096, 4096, 4096, precisions=("fp32",), a_layout="col"),
    ]


def smoke_cases() -> list[Case]:
    return [
        Case("smoke_square", 96, 80, 72, quick=ALL),
        Case("smoke_head", 200, 48, 8, quick=("fp32",), bias=True, activation="gelu"),
        Case("smoke_transposed", 64, 40, 40, precisions=("fp32",), a_layout="col"),
    ]


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def markdown(res: dict) -> str:
    lines = [
        "# tsconv gemm vs cuBLAS",
        "",
        f"GPU {res['gpu']}, {res['date']}, commit {res['commit']}, torch {res['torch']}, triton {res['triton']}.",
        f"Tuning: {res.get('tune_s', 0):.1f} s in this run. Errors are max|y - ref| / max|ref| against float64 "
        "(fp32 rows: the worse of price levels x zero-sum b and plain normals). speedup = cuBLAS / tsconv "
        "(cuBLAS on operands prepared outside the timed region; fp16 'with cast' includes a.half()).",
        "",
        "| case | M x K x N | prec | config | tsconv ms | packed ms | kernel ms | wall/call ms | no-plan ms "
        "| no-plan wall ms | cuBLAS ms | cuBLAS wall ms | cuBLAS+cast ms | tsconv fp16-a ms | speedup "
        "| speedup fp16-a | TFLOP/s | floor ms | error | torch error | pass |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
        "| --- | --- | --- | --- |",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['case']} | {r['M']}x{r['K']}x{r['N']} | {r['precision']} | {r.get('config') or '-'} "
            f"| {_f(r.get('tsconv_ms'), '.3f')} | {_f(r.get('tsconv_packed_ms'), '.3f')} "
            f"| {_f(r.get('kernel_ms'), '.3f')} | {_f(r.get('call_wall_ms'), '.3f')} "
            f"| {_f(r.get('noplan_ms'), '.3f')} | {_f(r.get('noplan_wall_ms'), '.3f')} "
            f"| {_f(r.get('cublas_ms'), '.3f')} | {_f(r.get('cublas_wall_ms'), '.3f')} "
            f"| {_f(r.get('cublas_with_cast_ms'), '.3f')} | {_f(r.get('tsconv_a16_ms'), '.3f')} "
            f"| {_f(r.get('speedup'), '.2f')} | {_f(r.get('speedup_a16'), '.2f')} | {_f(r.get('tflops'), '.1f')} | {_f(r.get('floor_ms'), '.3f')} "
            f"| {_f(r.get('max_err'), '.1e')} | {_f(r.get('torch_err'), '.1e')} "
            f"| {'PASS' if r.get('pass') else ('FAIL' if r.get('pass') is False else '-')} |"
        )
    return "\n".join(lines) + "\n"


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import triton

        from tsconv.kernels import autotune, gemm

        self.torch, self.triton, self.autotune, self.gemm_mod = torch, triton, autotune, gemm
        self.args = args
        self.dev = torch.device(args.device)
        self.cuda = self.dev.type == "cuda"
        self.start = time.perf_counter()
        self.res = {
            "gpu": torch.cuda.get_device_name(self.dev) if self.cuda else "cpu (interpreter smoke test)",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "commit": commit(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "rows": [],
        }

    # ------------------------------------------------------------------------------------------ plumbing

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def bench_ms(self, fn) -> float:
        if self.cuda:
            from triton.testing import do_bench

            return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)

    def save(self) -> None:
        out: Path = self.args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        self.res["tune_s"] = round(sum(e.seconds for e in self.autotune.events()), 2)
        self.res["events"] = [
            {"space": e.space, "key": e.key, "config": e.config, "source": e.source, "seconds": e.seconds}
            for e in self.autotune.events()
        ]
        self.res["elapsed_s"] = round(time.perf_counter() - self.start, 1)
        out.write_text(json.dumps(self.res, indent=1))
        out.with_suffix(".md").write_text(markdown(self.res))

    def over_budget(self) -> bool:
        return time.perf_counter() - self.start > self.args.budget_s

    def selected(self) -> list[tuple[Case, str]]:
        pool = smoke_cases() if not self.cuda else cases()
        if self.args.cases:
            names = {n.strip() for n in self.args.cases.split(",") if n.strip()}
            unknown = names - {c.name for c in pool}
            if unknown:
                raise SystemExit(f"unknown cases {sorted(unknown)}; known: {[c.name for c in pool]}")
            pool = [c for c in pool if c.name in names]
        out = []
        for c in pool:
            precs = c.quick if self.args.quick else c.precisions
            out += [(c, p) for p in precs]
        return out

    # -------------------------------------------------------------------------------------------- data

    def data(self, case: Case, kind: str, seed: int = 0):
        """(a float32 [M, K] in the case's layout, b float16 [K, N], bias or None)."""
        torch = self.torch
        g = torch.Generator(device=self.dev).manual_seed(seed)
        shape = (case.M, case.K) if case.a_layout == "row" else (case.K, case.M)
        if kind == "prices":
            a = torch.randn(shape, generator=g, device=self.dev).mul_(0.05)
            axis = 0 if case.a_layout == "row" else 1
            a = a.cumsum(axis)
            level_shape = (1, shape[1]) if axis == 0 else (shape[0], 1)
            a += 100.0 + 20.0 * torch.rand(level_shape, generator=g, device=self.dev)
        else:
            a = torch.randn(shape, generator=g, device=self.dev)
        if case.a_layout == "col":
            a = a.T
        w = torch.randn((case.K, case.N), generator=g, device=self.dev, dtype=torch.float64)
        w -= w.mean(dim=0, keepdim=True)
        b = (w / math.sqrt(case.K)).half()
        bias = torch.randn(case.N, generator=g, device=self.dev) if case.bias else None
        return a, b, bias

    def torch_in_precision(self, a, b, bias, activation, precision: str, *, emulate: bool = False):
        torch = self.torch
        from tsconv.kernels.conv1d_reference import round_to_tf32
        from tsconv.kernels.torch_side import apply_activation

        if self.cuda and not emulate:
            flag = torch.backends.cuda.matmul.allow_tf32
            try:
                torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
                y = (a.half() @ b.half()).float() if precision == "fp16" else a.float() @ b.float()
            finally:
                torch.backends.cuda.matmul.allow_tf32 = flag
        elif precision == "tf32":
            # What the kernel computes: a as the tensor core takes it (truncated to TF32), b rounded to the
            # nearest TF32 once when packed (cuBLAS rounds a too, hence about half this error).
            a_t = (a.float().contiguous().view(torch.int32) & -8192).view(torch.float32)
            y = a_t @ round_to_tf32(b)
        elif precision == "fp16":
            y = a.half().float() @ b.half().float()
        else:
            y = a.float() @ b.float()
        if bias is not None:
            y = y + bias.float()
        return apply_activation(y, activation)

    @staticmethod
    def reference(a, b, bias, activation):
        import torch.nn.functional as F

        y = a.double() @ b.double()
        if bias is not None:
            y = y + bias.double()
        if activation == "gelu":
            y = F.gelu(y)
        elif activation == "relu":
            y = y.relu()
        elif activation == "tanh":
            y = y.tanh()
        return y

    # ------------------------------------------------------------------------------------------- passes

    def check_one(self, case: Case, precision: str, row: dict) -> None:
        from tsconv.kernels.conv1d_reference import relative_error

        kinds = ("prices", "normals") if precision == "fp32" else ("normals",)
        errs, terrs, ok = [], [], True
        for i, kind in enumerate(kinds):
            a, b, bias = self.data(case, kind, seed=i)
            out = self.torch.full((case.M, case.N), math.nan, device=self.dev)
            t = time.perf_counter()
            self.gemm_mod.gemm(a, b, bias, activation=case.activation, precision=precision, out=out)
            self.sync()
            row.setdefault("first_call_s", round(time.perf_counter() - t, 2))
            row["config"] = self.gemm_mod.last_launch.get("config")
            if self.torch.isnan(out).any():
                row["note"] = "unwritten (NaN) outputs"
                ok = False
            R = min(case.M, CHECK_ROWS)
            ref = self.reference(a[:R], b, bias, case.activation)
            err = relative_error(out[:R], ref)
            t_err = relative_error(self.torch_in_precision(a, b, bias, case.activation, precision)[:R], ref)
            if precision != "fp32" and self.cuda:
                emu = self.torch_in_precision(a[:R], b, bias, case.activation, precision, emulate=True)
                t_err = max(t_err, relative_error(emu, ref))
            ok &= err <= FACTOR[precision] * t_err + ATOL[precision]
            row[f"err_{kind}"], row[f"torch_err_{kind}"] = err, t_err
            errs.append(err)
            terrs.append(t_err)
            del a, b, bias, out
        row["max_err"], row["torch_err"], row["pass"] = max(errs), max(terrs), bool(ok)

    def time_one(self, case: Case, precision: str, row: dict) -> None:
        torch = self.torch
        a, b, bias = self.data(case, "normals", seed=7)
        out = torch.empty((case.M, case.N), device=self.dev)
        gemm, pack = self.gemm_mod.gemm, self.gemm_mod.pack_weights
        act = case.activation
        row["tsconv_ms"] = self.bench_ms(
            lambda: gemm(a, b, bias, activation=act, precision=precision, out=out)
        )
        pw = pack(b, precision)
        row["tsconv_packed_ms"] = self.bench_ms(
            lambda: gemm(a, pw, bias, activation=act, precision=precision, out=out)
        )
        if self.cuda:
            # GPU time alone (the call replayed from a CUDA graph) and the host's time per call (wall time of
            # many back-to-back calls: the larger of host and GPU time, so it shows when Python is the limit).
            from triton.testing import do_bench_cudagraph

            try:
                row["kernel_ms"] = float(
                    do_bench_cudagraph(
                        lambda: gemm(a, b, bias, activation=act, precision=precision, out=out),
                        return_mode="median",
                    )
                )
            except Exception as exc:  # noqa: BLE001 - a diagnostic only
                row["kernel_ms_note"] = f"{type(exc).__name__}: {exc}"[:200]
            self.sync()
            n = 200
            t = time.perf_counter()
            for _ in range(n):
                gemm(a, b, bias, activation=act, precision=precision, out=out)
            self.sync()
            row["call_wall_ms"] = (time.perf_counter() - t) * 1e3 / n
            self.gemm_mod._PLANS_ENABLED = False
            try:
                row["noplan_ms"] = self.bench_ms(
                    lambda: gemm(a, b, bias, activation=act, precision=precision, out=out)
                )
                self.sync()
                t = time.perf_counter()
                for _ in range(n):
                    gemm(a, b, bias, activation=act, precision=precision, out=out)
                self.sync()
                row["noplan_wall_ms"] = (time.perf_counter() - t) * 1e3 / n
            finally:
                self.gemm_mod._PLANS_ENABLED = True

        def epi(y):
            if bias is not None:
                y = y.add_(bias)
            if act == "gelu":
                y = torch.nn.functional.gelu(y)
            return y

        flag = torch.backends.cuda.matmul.allow_tf32
        try:
            if precision == "fp16":
                a16 = a.half()
                row["cublas_ms"] = self.bench_ms(lambda: epi(torch.matmul(a16, b).float()))
                # tsconv on the same float16 a (features stored in float16): like for like with cuBLAS
                row["tsconv_a16_ms"] = self.bench_ms(
                    lambda: gemm(a16, b, bias, activation=act, precision=precision, out=out)
                )
                row["speedup_a16"] = row["cublas_ms"] / row["tsconv_a16_ms"]
                del a16
                row["cublas_with_cast_ms"] = self.bench_ms(lambda: epi(torch.matmul(a.half(), b).float()))
            else:
                torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
                b32 = b.float()
                row["cublas_ms"] = self.bench_ms(lambda: epi(torch.matmul(a, b32)))
                if self.cuda:
                    self.sync()
                    t = time.perf_counter()
                    for _ in range(200):
                        epi(torch.matmul(a, b32))
                    self.sync()
                    row["cublas_wall_ms"] = (time.perf_counter() - t) * 1e3 / 200
                del b32
        finally:
            torch.backends.cuda.matmul.allow_tf32 = flag
        flops = 2.0 * case.M * case.N * case.K
        row["speedup"] = row["cublas_ms"] / row["tsconv_ms"]
        if "cublas_with_cast_ms" in row:
            row["speedup_vs_cast"] = row["cublas_with_cast_ms"] / row["tsconv_ms"]
        row["tflops"] = flops / row["tsconv_ms"] / 1e9
        nbytes = 4 * case.M * case.K + 2 * case.K * case.N + 4 * case.M * case.N
        row["floor_ms"] = max(nbytes / HBM_BYTES_PER_S, flops / (PEAK_TFLOPS[precision] * 1e12)) * 1e3
        if precision == "fp32":
            row["vs_cublas_fp32_peak"] = row["tflops"] / CUBLAS_FP32_TFLOPS

    def run(self) -> int:
        todo = self.selected()
        rows = {}
        for case, prec in todo:  # correctness first
            row = {"case": case.name, "M": case.M, "K": case.K, "N": case.N, "precision": prec}
            row.update(a_layout=case.a_layout, bias=case.bias, activation=case.activation)
            self.res["rows"].append(row)
            rows[(case.name, prec)] = row
            if self.over_budget():
                row["note"] = "skipped: over --budget-s"
                continue
            try:
                self.check_one(case, prec, row)
            except Exception as exc:  # noqa: BLE001 - a failing row is reported, the run goes on
                row["pass"], row["note"] = False, f"{type(exc).__name__}: {exc}"[:300]
            print(
                f"check {case.name} {prec}: err {row.get('max_err', math.nan):.2e} "
                f"torch {row.get('torch_err', math.nan):.2e} pass={row.get('pass')} "
                f"({row.get('config')}, first call {row.get('first_call_s')} s)",
                flush=True,
            )
            self.save()
        if not self.args.check:
            for case, prec in todo:
                row = rows[(case.name, prec)]
                if "note" in row and row["note"].startswith("skipped"):
                    continue
                if self.over_budget():
                    row["note"] = "timing skipped: over --budget-s"
                    continue
                try:
                    self.time_one(case, prec, row)
                except Exception as exc:  # noqa: BLE001
                    row["note"] = f"timing failed: {type(exc).__name__}: {exc}"[:300]
                print(
                    f"time {case.name} {prec}: tsconv {row.get('tsconv_ms', math.nan):.3f} ms "
                    f"(packed {row.get('tsconv_packed_ms', math.nan):.3f}) cuBLAS "
                    f"{row.get('cublas_ms', math.nan):.3f} ms speedup {row.get('speedup', math.nan):.2f} "
                    f"{row.get('tflops', math.nan):.1f} TFLOP/s",
                    flush=True,
                )
                self.save()
        self.save()
        print(markdown(self.res))
        return 0 if all(r.get("pass", True) for r in self.res["rows"]) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gemm.json")
    ap.add_argument("--quick", action="store_true", help="a subset of the cases")
    ap.add_argument("--cases", default=None, help="comma-separated case names")
    ap.add_argument("--check", action="store_true", help="the correctness pass only (no timings)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="start no new row after this many seconds")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: interpreter smoke test")
    ap.add_argument("--cache-dir", default=None, help="autotune cache folder (the cache_dir setting)")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ.setdefault(
            "TRITON_INTERPRET", "1"
        )  # Triton's own variable: before the first @triton.jit runs
    import contextlib

    from tsconv import config

    with config.override(cache_dir=args.cache_dir) if args.cache_dir else contextlib.nullcontext():
        return Bench(args).run()


if __name__ == "__main__":
    sys.exit(main())
