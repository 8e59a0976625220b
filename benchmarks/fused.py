"""tsconv.kernels.fused.conv1d_head on a GPU: correctness at real sizes, then fused vs unfused vs cuDNN + cuBLAS.

Claim measured: the fused conv -> head kernel is as accurate as the unfused pair, never writes the
intermediate, and how its speed compares with unfused tsconv and with cuDNN + cuBLAS (issue target 1.5x;
benchmarks/NOTES.md, "Kernels: fused conv -> head, and the engine's head path").

    python benchmarks/fused.py --out $OUT/fused.json --cache-dir $OUT      # full run (H200)
    python benchmarks/fused.py --quick --out $OUT/fused.json               # fp32 rows only
    python benchmarks/fused.py --cases chunk_k5_o256_d64                   # chosen cases
    python benchmarks/fused.py --device cpu --quick                        # smoke test of this script (interpreter)

Paths compared, per case and precision (same inputs: a time-major [N, L, C] float32 buffer seen as [N, C, L],
float16-stored conv and head weights, output [N, L_out, D] float32):

- fused: ``conv1d_head(..., out=out)``; for shapes outside its scope (the depthwise bank) it runs the unfused
  pair itself: the row's ``path`` says "unfused" and gives the reason.
- unfused tsconv: ``conv1d`` into a time-major [N, L_out, O] buffer (allocated outside the timed region),
  then ``gemm`` on its [N * L_out, O] view into ``out``.
- cuDNN + cuBLAS: ``F.conv1d`` (on a contiguous copy of x made outside the timed region) then ``torch.matmul``
  with the head weights, plus the biases and activations, in the same precision class: float32 with TF32
  off ("fp32"), TF32 allowed ("tf32"), float16 inputs and weights ("fp16", x cast outside the timed region).

Correctness first: the fused result (NaN-poisoned ``out``) against float64 (conv1d_reference and a float64
matmul) on the first ``CHECK_SERIES`` series: "fp32" within 4x the error of cuDNN + cuBLAS float32 (TF32 off)
plus 1e-7 on price levels (random walks around 100) through zero-sum filters; "tf32" / "fp16" within 2x the
larger of torch's own error in that class and an emulated tensor-core pair, plus 1e-5, on normals. The
unfused tsconv error and the fused-unfused difference are reported beside it.

Timing: ``triton.testing.do_bench`` medians (ms). Memory: ``torch.cuda.max_memory_allocated`` during one
call, less what was allocated before it (inputs, weights, ``out`` and the unfused intermediate buffer are
allocated before; the unfused rows add the [N, L_out, O] float32 intermediate, ``interm_mib``, which the
fused kernel never writes). speedup = cuDNN + cuBLAS ms / fused ms (issue target: >= 1.5).

Engine pick (CUDA, "fp32" rows): which path the engine's head chooser (``tsconv.engine.head``) takes for the
case's N * L_out rows as one engine step ([1, C, halo + rows], "valid"), from the decision cache or timed
now, and each offered path's time per step measured now (CUDA events): unfused (conv1d + torch matmul),
gemm (conv1d + tsconv gemm), fused (conv1d_head).

Writes JSON to --out (after every row) and a markdown table beside it (.md), with GPU, date and commit.
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

CHECK_SERIES = 2
ATOL = {"fp32": 1e-7, "tf32": 1e-5, "fp16": 1e-5}
FACTOR = {"fp32": 4.0, "tf32": 2.0, "fp16": 2.0}
ALL = ("fp32", "tf32", "fp16")
MIB = 2**20


@dataclass(frozen=True)
class Case:
    name: str
    N: int
    C: int
    L: int
    O: int
    K: int
    D: int
    groups: int = 1
    dilation: int = 1
    padding: str = "valid"
    activation: str | None = None
    head_activation: str | None = None
    bias: bool = True
    precisions: tuple[str, ...] = ALL
    quick: tuple[str, ...] = ("fp32",)


def cases() -> list[Case]:
    return [
        Case("chunk_k5_o256_d64", 64, 1024, 1028, 256, 5, 64, activation="gelu"),
        Case("chunk_k5_o128_d32", 64, 1024, 1028, 128, 5, 32, activation="gelu"),
        # a depthwise bank (4 filters per channel) into a head: outside the fused kernel's scope
        Case("depthwise_k16_m4_d64", 64, 1024, 1024 + 15, 4096, 16, 64, groups=1024, precisions=("fp32",)),
        # off-sample: causal, dilation, odd widths, both activations
        Case(
            "off_c384_o96_k7_d2_d24",
            32,
            384,
            2048,
            96,
            7,
            24,
            dilation=2,
            padding="causal",
            activation="relu",
            head_activation="tanh",
            precisions=("fp32", "tf32"),
            quick=(),
        ),
    ]


def smoke_cases() -> list[Case]:
    """Tiny versions for --device cpu (Triton interpreter): exercise the script, not the speed."""
    return [
        Case("smoke_dense", 2, 24, 44, 40, 5, 12, activation="gelu", quick=("fp32", "tf32")),
        Case("smoke_depthwise", 2, 8, 40, 24, 4, 10, groups=8, precisions=("fp32",)),
        Case(
            "smoke_causal",
            1,
            16,
            50,
            20,
            3,
            8,
            dilation=2,
            padding="causal",
            head_activation="tanh",
            quick=(),
        ),
    ]


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def _pick(r: dict) -> str:
    """'fused (u 1.84 / g 1.90 / f 2.47)': the engine chooser's path and each path's ms per step."""
    if not r.get("engine_pick"):
        return "-"
    ms = r.get("engine_ms") or {}
    parts = " / ".join(f"{p[0]} {_f(ms.get(p), '.3f')}" for p in ("unfused", "gemm", "fused") if p in ms)
    return f"{r['engine_pick']} ({parts})"


def markdown(res: dict) -> str:
    lines = [
        "# tsconv fused conv1d -> head vs unfused tsconv vs cuDNN + cuBLAS",
        "",
        f"GPU {res['gpu']}, {res['date']}, commit {res['commit']}, torch {res['torch']}, triton {res['triton']}.",
        f"Tuning: {res.get('tune_s', 0):.1f} s in this run. Errors: max|y - ref| / max|ref| against float64 on "
        f"the first {CHECK_SERIES} series. speedup = cuDNN+cuBLAS ms / fused ms (target >= 1.5). MiB: peak "
        "memory a call allocates beyond its inputs and output (unfused: plus the intermediate, interm MiB). "
        "engine pick: the engine's head path for these rows as one step, and ms per step of unfused (conv1d + "
        "torch matmul) / gemm (conv1d + tsconv gemm) / fused.",
        "",
        "| case | N x C x L -> O (K) -> D | prec | path | config | fused ms | unfused ms | cuDNN+cuBLAS ms "
        "| speedup | vs unfused | engine pick | fused MiB | unfused MiB | cuDNN MiB | interm MiB | error | unfused err "
        "| torch err | fused-unfused | pass |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
        "| --- | --- | --- |",
    ]
    for r in res["rows"]:
        path = r.get("path") or "-"
        if path == "unfused" and r.get("reason"):
            path = f"unfused ({r['reason']})"
        lines.append(
            f"| {r['case']} | {r['N']}x{r['C']}x{r['L']} -> {r['O']} ({r['K']}) -> {r['D']} | {r['precision']} "
            f"| {path} | {r.get('config') or '-'} | {_f(r.get('fused_ms'), '.3f')} "
            f"| {_f(r.get('unfused_ms'), '.3f')} | {_f(r.get('torch_ms'), '.3f')} | {_f(r.get('speedup'), '.2f')} "
            f"| {_f(r.get('vs_unfused'), '.2f')} | {_pick(r)} | {_f(r.get('fused_mib'), '.1f')} "
            f"| {_f(r.get('unfused_mib'), '.1f')} | {_f(r.get('torch_mib'), '.1f')} "
            f"| {_f(r.get('interm_mib'), '.1f')} | {_f(r.get('max_err'), '.1e')} "
            f"| {_f(r.get('unfused_err'), '.1e')} | {_f(r.get('torch_err'), '.1e')} "
            f"| {_f(r.get('fused_unfused_diff'), '.1e')} "
            f"| {'PASS' if r.get('pass') else ('FAIL' if r.get('pass') is False else '-')} |"
        )
    extra = [r for r in res["rows"] if r.get("fused_x16_ms") is not None]
    if extra:
        lines += [
            "",
            "fp16 rows with equal operands: cuDNN + cuBLAS get x cast to float16 outside the timed region, the "
            "fused kernel gets float32 x (and casts it itself). Here the cast is timed on both sides, or on neither:",
            "",
            "| case | cuDNN+cuBLAS ms, cast inside | fused ms (float32 x) | speedup with cast | fused ms (float16 x) "
            "| cuDNN+cuBLAS ms | speedup, both float16 x |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in extra:
            lines.append(
                f"| {r['case']} | {r['torch_cast_ms']:.3f} | {r['fused_ms']:.3f} | {r['speedup_with_cast']:.2f} "
                f"| {r['fused_x16_ms']:.3f} | {r['torch_ms']:.3f} | {r['speedup_x16']:.2f} |"
            )
    return "\n".join(lines) + "\n"


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import triton

        from tsconv.kernels import autotune, conv1d, fused, gemm

        self.torch, self.triton, self.autotune = torch, triton, autotune
        self.fused_mod, self.conv_mod, self.gemm_mod = fused, conv1d, gemm
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

    def peak_mib(self, fn) -> float | None:
        """Memory one call allocates beyond what is allocated before it (CUDA only)."""
        if not self.cuda:
            return None
        torch = self.torch
        fn()  # warm: tuning, packing caches, cuDNN workspace selection
        self.sync()
        torch.cuda.reset_peak_memory_stats(self.dev)
        base = torch.cuda.memory_allocated(self.dev)
        fn()
        self.sync()
        return (torch.cuda.max_memory_allocated(self.dev) - base) / MIB

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

    def data(self, case: Case, kind: str, seed: int = 0) -> dict:
        """x (a time-major buffer's [N, C, L] view), float16 weights and biases."""
        torch = self.torch
        g = torch.Generator(device=self.dev).manual_seed(seed)
        shape = (case.N, case.L, case.C)
        if kind == "prices":
            buf = torch.randn(shape, generator=g, device=self.dev).mul_(0.05).cumsum_(1)
            buf += 100.0 + 20.0 * torch.rand((case.N, 1, case.C), generator=g, device=self.dev)
        else:
            buf = torch.randn(shape, generator=g, device=self.dev)
        Cg = case.C // case.groups
        w = torch.randn((case.O, Cg, case.K), generator=g, device=self.dev, dtype=torch.float64)
        if Cg * case.K > 1:
            w -= w.mean(dim=(1, 2), keepdim=True)
        w = (w / math.sqrt(Cg * case.K)).half()
        hw = (torch.randn((case.O, case.D), generator=g, device=self.dev) / math.sqrt(case.O)).half()
        b = torch.randn(case.O, generator=g, device=self.dev) if case.bias else None
        hb = torch.randn(case.D, generator=g, device=self.dev) if case.bias else None
        return {"x": buf.transpose(1, 2), "w": w, "b": b, "hw": hw, "hb": hb}

    def L_out(self, case: Case) -> int:
        return case.L if case.padding == "causal" else case.L - (case.K - 1) * case.dilation

    def conv_kw(self, case: Case) -> dict:
        return {"dilation": case.dilation, "groups": case.groups, "padding": case.padding}

    def reference(self, case: Case, d: dict):
        from tsconv.kernels.conv1d_reference import conv1d_reference
        from tsconv.kernels.torch_side import apply_activation

        S = min(case.N, CHECK_SERIES)
        h = conv1d_reference(d["x"][:S], d["w"], d["b"], activation=case.activation, **self.conv_kw(case))
        y = h.transpose(1, 2) @ d["hw"].double()
        if d["hb"] is not None:
            y = y + d["hb"].double()
        return apply_activation(y, case.head_activation)

    def torch_pair(
        self, case: Case, d: dict, precision: str, *, series: int | None = None, emulate: bool = False
    ):
        """cuDNN conv1d + cuBLAS matmul in a precision class (or its CPU emulation), float32 [N, L_out, D]."""
        torch = self.torch
        from tsconv.kernels.conv1d_reference import round_to_tf32, torch_conv1d_in_precision
        from tsconv.kernels.torch_side import apply_activation

        x = d["x"] if series is None else d["x"][:series]
        h = torch_conv1d_in_precision(
            x,
            d["w"],
            d["b"],
            activation=case.activation,
            precision=precision,
            emulate=emulate,
            **self.conv_kw(case),
        ).transpose(1, 2)
        if self.cuda and not emulate:
            flag = torch.backends.cuda.matmul.allow_tf32
            try:
                torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
                y = (
                    (h.half() @ d["hw"].half()).float()
                    if precision == "fp16"
                    else h.float() @ d["hw"].float()
                )
            finally:
                torch.backends.cuda.matmul.allow_tf32 = flag
        elif precision == "tf32":
            h_t = (h.float().contiguous().view(torch.int32) & -8192).view(torch.float32)
            y = h_t @ round_to_tf32(d["hw"])
        elif precision == "fp16":
            y = h.half().float() @ d["hw"].half().float()
        else:
            y = h.float() @ d["hw"].float()
        if d["hb"] is not None:
            y = y + d["hb"].float()
        return apply_activation(y, case.head_activation)

    def unfused(self, case: Case, d: dict, precision: str, out, interm):
        """tsconv conv1d into ``interm`` ([N, L_out, O] float32), then gemm into ``out``."""
        self.conv_mod.conv1d(
            d["x"],
            d["w"],
            d["b"],
            activation=case.activation,
            precision=precision,
            out=interm.transpose(1, 2),
            **self.conv_kw(case),
        )
        rows = case.N * self.L_out(case)
        self.gemm_mod.gemm(
            interm.view(rows, case.O),
            d["hw"],
            d["hb"],
            activation=case.head_activation,
            precision=precision,
            out=out.view(rows, case.D),
        )
        return out

    def fused(self, case: Case, d: dict, precision: str, out):
        return self.fused_mod.conv1d_head(
            d["x"],
            d["w"],
            d["b"],
            d["hw"],
            d["hb"],
            activation=case.activation,
            head_activation=case.head_activation,
            precision=precision,
            out=out,
            **self.conv_kw(case),
        )

    # ------------------------------------------------------------------------------------------- passes

    def check_one(self, case: Case, precision: str, row: dict) -> None:
        from tsconv.kernels.conv1d_reference import relative_error

        torch = self.torch
        kind = "prices" if precision == "fp32" else "normals"
        d = self.data(case, kind)
        L_out, S = self.L_out(case), min(case.N, CHECK_SERIES)
        out = torch.full((case.N, L_out, case.D), math.nan, device=self.dev)
        t = time.perf_counter()
        self.fused(case, d, precision, out)
        self.sync()
        row["first_call_s"] = round(time.perf_counter() - t, 2)
        row["path"] = self.fused_mod.last_launch.get("path")
        row["config"] = self.fused_mod.last_launch.get("config")
        if self.fused_mod.last_launch.get("reason"):
            row["reason"] = self.fused_mod.last_launch["reason"]
            conv_cfg = self.conv_mod.last_launch.get("config", "torch")
            gemm_cfg = self.gemm_mod.last_launch.get("config", "torch")
            row["config"] = (
                f"conv {conv_cfg} + gemm {gemm_cfg}" if self.cuda or self.conv_mod.last_launch else None
            )
        ok = True
        if torch.isnan(out).any():
            row["note"] = "unwritten (NaN) outputs"
            ok = False
        ref = self.reference(case, d)
        err = relative_error(out[:S], ref)
        t_err = relative_error(self.torch_pair(case, d, precision, series=S), ref)
        if precision != "fp32" and self.cuda:
            t_err = max(
                t_err, relative_error(self.torch_pair(case, d, precision, series=S, emulate=True), ref)
            )
        interm = torch.empty((case.N, L_out, case.O), device=self.dev)
        un = self.unfused(case, d, precision, torch.empty_like(out), interm)
        del interm
        bound = FACTOR[precision] * t_err + ATOL[precision]
        row["unfused_err"] = relative_error(un[:S], ref)
        row["fused_unfused_diff"] = relative_error(out[:S], un[:S].double())
        row["max_err"], row["torch_err"], row["bound"] = err, t_err, bound
        row["data"] = kind
        row["pass"] = bool(ok and err <= bound and row["fused_unfused_diff"] <= bound)

    def time_one(self, case: Case, precision: str, row: dict) -> None:
        torch = self.torch
        F = torch.nn.functional
        from tsconv.kernels.torch_side import apply_activation

        d = self.data(case, "normals", seed=7)
        L_out = self.L_out(case)
        out = torch.empty((case.N, L_out, case.D), device=self.dev)
        interm = torch.empty((case.N, L_out, case.O), device=self.dev)
        row["interm_mib"] = interm.numel() * 4 / MIB

        def fused():
            self.fused(case, d, precision, out)

        def unfused():
            self.unfused(case, d, precision, out, interm)

        row["fused_mib"] = self.peak_mib(fused)
        row["fused_ms"] = self.bench_ms(fused)
        row["unfused_mib"] = self.peak_mib(unfused)
        row["unfused_ms"] = self.bench_ms(unfused)

        # cuDNN + cuBLAS on operands prepared outside the timed region (contiguous x, cast for fp16).
        half = precision == "fp16"
        x_c = d["x"].contiguous().half() if half else d["x"].contiguous()
        w_t = d["w"] if half else d["w"].float()
        hw_t = d["hw"] if half else d["hw"].float()
        b_t = None if d["b"] is None else (d["b"].half() if half else d["b"])
        pad = (case.K - 1) * case.dilation if case.padding == "causal" else 0

        def torch_pair():
            xp = F.pad(x_c, (pad, 0)) if pad else x_c
            h = F.conv1d(xp, w_t, b_t, dilation=case.dilation, groups=case.groups)
            h = apply_activation(h, case.activation)
            y = torch.matmul(h.transpose(1, 2), hw_t)
            y = y.float() if half else y
            if d["hb"] is not None:
                y = y.add_(d["hb"])
            return apply_activation(y, case.head_activation)

        flags = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        try:
            torch.backends.cudnn.allow_tf32 = precision == "tf32"
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            row["torch_mib"] = self.peak_mib(torch_pair)
            row["torch_ms"] = self.bench_ms(torch_pair)
        finally:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags
        row["speedup"] = row["torch_ms"] / row["fused_ms"]
        if half:
            # The same comparison with the operands equal: cuDNN + cuBLAS timed with x's cast inside (what a
            # caller holding float32 x pays), and the fused kernel given the float16 x cuDNN gets (no cast pass).
            x_f32 = d["x"].contiguous()
            x16 = d["x"].half()  # the time-major layout kept: [N, C, L] view of a float16 [N, L, C] buffer

            def torch_pair_cast():
                nonlocal x_c
                x_c = x_f32.half()
                return torch_pair()

            def fused_x16():
                self.fused(case, {**d, "x": x16}, precision, out)

            row["torch_cast_ms"] = self.bench_ms(torch_pair_cast)
            row["fused_x16_ms"] = self.bench_ms(fused_x16)
            row["speedup_with_cast"] = row["torch_cast_ms"] / row["fused_ms"]
            row["speedup_x16"] = row["torch_ms"] / row["fused_x16_ms"]
        row["vs_unfused"] = row["unfused_ms"] / row["fused_ms"]
        flops = 2.0 * case.N * L_out * (case.O * (case.C // case.groups) * case.K + case.O * case.D)
        row["tflops"] = flops / row["fused_ms"] / 1e9
        if self.cuda and precision == "fp32":
            self.engine_pick(case, d, row)

    def engine_pick(self, case: Case, d: dict, row: dict) -> None:
        """The engine's head chooser on this case's N * L_out rows as one step (the engine's layout)."""
        torch = self.torch
        from tsconv.engine import head

        halo = (case.K - 1) * case.dilation
        rows_in = d["x"].transpose(1, 2).reshape(-1, case.C)  # the time-major [N * L, C] buffer
        n = min(case.N * self.L_out(case), rows_in.shape[0] - halo)
        xt = rows_in[: n + halo].T.unsqueeze(0)  # [1, C, halo + n], as Backend passes it
        flag = torch.backends.cuda.matmul.allow_tf32
        try:
            torch.backends.cuda.matmul.allow_tf32 = False  # the engine's fp32 setting for torch's matmul
            res = head.measure_paths(
                xt,
                d["w"],
                d["b"],
                d["hw"],
                d["hb"],
                dilation=case.dilation,
                groups=case.groups,
                activation=case.activation,
                head_activation=case.head_activation,
            )
        finally:
            torch.backends.cuda.matmul.allow_tf32 = flag
        row["engine_rows"] = n
        row["engine_pick"] = res["pick"]
        row["engine_source"] = res["source"]
        row["engine_ms"] = res["timings_ms"]

    def run(self) -> int:
        todo = self.selected()
        rows = {}
        for case, prec in todo:  # correctness first
            row = {
                "case": case.name,
                "N": case.N,
                "C": case.C,
                "L": case.L,
                "O": case.O,
                "K": case.K,
                "D": case.D,
                "groups": case.groups,
                "dilation": case.dilation,
                "padding": case.padding,
                "activation": case.activation,
                "head_activation": case.head_activation,
                "precision": prec,
            }
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
                f"check {case.name} {prec}: path={row.get('path')} err {row.get('max_err', math.nan):.2e} "
                f"unfused {row.get('unfused_err', math.nan):.2e} torch {row.get('torch_err', math.nan):.2e} "
                f"pass={row.get('pass')} ({row.get('config')}, first call {row.get('first_call_s')} s)"
                + (f" note: {row['note']}" if row.get("note") else ""),
                flush=True,
            )
            self.save()
        if not self.args.check:
            for case, prec in todo:
                row = rows[(case.name, prec)]
                if row.get("note", "").startswith("skipped"):
                    continue
                if self.over_budget():
                    row["note"] = "timing skipped: over --budget-s"
                    continue
                try:
                    self.time_one(case, prec, row)
                except Exception as exc:  # noqa: BLE001
                    row["note"] = f"timing failed: {type(exc).__name__}: {exc}"[:300]
                print(
                    f"time {case.name} {prec}: fused {row.get('fused_ms', math.nan):.3f} ms unfused "
                    f"{row.get('unfused_ms', math.nan):.3f} cuDNN+cuBLAS {row.get('torch_ms', math.nan):.3f} "
                    f"speedup {row.get('speedup', math.nan):.2f} mem MiB fused/unfused/torch "
                    f"{row.get('fused_mib')}/{row.get('unfused_mib')}/{row.get('torch_mib')}"
                    + (f" engine pick {_pick(row)}" if row.get("engine_pick") else ""),
                    flush=True,
                )
                self.save()
        self.save()
        print(markdown(self.res))
        return 0 if all(r.get("pass", True) for r in self.res["rows"]) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fused.json")
    ap.add_argument("--quick", action="store_true", help="a subset of the rows (fp32)")
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
