"""The Triton kernels of a filter bank (:mod:`tsconv.kernels.filterbank`): its three operations over
[rows, channels] float64 tiles, for CUDA tensors (and CPU tensors under ``TRITON_INTERPRET=1``).

The bank imports this module only when it runs these kernels, so a CPU run needs no Triton. The operations
are the torch path's (``_TorchOps`` there), in float64 as there; what each computes is documented on the
bank's ``_Ops``. One difference in rounding: a Python float argument reaches a compiled kernel as float32
(Triton's interpreter keeps float64), so the EMA's ladder weights and gain and the std merge's coefficient
are float32 values on the GPU. Emulated on the torch path over 60,000 steps of prices, that moved the EMA
from 5.9e-8 to at most 1.3e-7 of its scale off the exact recursion (the promise is 1e-6); window lengths and
degrees of freedom are whole numbers, exact either way. A device tensor would carry them exactly but costs
a copy per call, which a captured CUDA graph cannot hold.
"""

from __future__ import annotations

import functools
import linecache

import torch
import triton
import triton.language as tl

__all__ = [
    "RUNNING_KINDS",
    "TritonOps",
    "fused_kernel",
    "fused_source",
    "run_fused",
    "running_kernel",
    "running_source",
]

_KIND = {"id": 0, "lag": 1, "diff": 2, "ret": 3, "ma": 4, "dev": 5, "std": 6, "zscore": 7, "ema": 8}

_BLOCK_T = 64
_BLOCK_C = 32


@triton.jit
def _axpy_kernel(a_ptr, b_ptr, o_ptr, n, C, sa, sb, so, w, WEIGHTED: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    mask = (rows < n) & (cols < C)
    a = tl.load(a_ptr + rows * sa + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + rows * sb + cols, mask=mask, other=0.0)
    if WEIGHTED:
        a = a * w
    tl.store(o_ptr + rows * so + cols, a + b, mask=mask)


@triton.jit
def _merge_kernel(sa_ptr, ma_ptr, sb_ptr, mb_ptr, o_ptr, n, C, s_sa, s_ma, s_sb, s_mb, so, ia, ib, coef,
                  HAS_MA: tl.constexpr, HAS_MB: tl.constexpr, BLOCK_T: tl.constexpr,
                  BLOCK_C: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    mask = (rows < n) & (cols < C)
    sa = tl.load(sa_ptr + rows * s_sa + cols, mask=mask, other=0.0)
    sb = tl.load(sb_ptr + rows * s_sb + cols, mask=mask, other=0.0)
    delta = sb * ib - sa * ia
    acc = delta * delta * coef
    if HAS_MA and HAS_MB:
        acc += tl.load(ma_ptr + rows * s_ma + cols, mask=mask, other=0.0) + tl.load(
            mb_ptr + rows * s_mb + cols, mask=mask, other=0.0
        )
    elif HAS_MA:
        acc += tl.load(ma_ptr + rows * s_ma + cols, mask=mask, other=0.0)
    elif HAS_MB:
        acc += tl.load(mb_ptr + rows * s_mb + cols, mask=mask, other=0.0)
    tl.store(o_ptr + rows * so + cols, acc, mask=mask)


@triton.jit
def _finish_kernel(x_ptr, y_ptr, m_ptr, o_ptr, n, C, sx, sy, sm, so_t, so_c, window, dof, gain,
                   KIND: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    mask = (rows < n) & (cols < C)
    x = tl.load(x_ptr + rows * sx + cols, mask=mask, other=0.0)
    if KIND != 0:
        y = tl.load(y_ptr + rows * sy + cols, mask=mask, other=1.0)
    if KIND == 0:  # id
        v = x
    elif KIND == 1:  # lag
        v = y
    elif KIND == 2:  # diff
        v = x - y
    elif KIND == 3:  # ret
        v = tl.where((x > 0) & (y > 0), tl.log(x / y), float("nan"))
    # window and dof are whole numbers (exact in the float32 a Python float argument becomes): divisions by
    # them round once, as the torch path's; a float32 1 / W would not be exact
    elif KIND == 8:  # ema
        v = y * gain
    elif KIND == 4:  # ma
        v = y / window
    elif KIND == 5:  # dev
        v = x - y / window
    else:  # std, zscore
        mm = tl.load(m_ptr + rows * sm + cols, mask=mask, other=1.0)
        sd = tl.sqrt(mm / dof)
        if KIND == 6:
            v = tl.where(y - y == 0, sd, float("nan"))  # y - y is 0 exactly where y is finite
        else:
            z = (x - y / window) / sd
            v = tl.where((sd > 0) & (sd < float("inf")), z, float("nan"))
    tl.store(o_ptr + rows * so_t + cols * so_c, v.to(tl.float32), mask=mask)


def _grid(n: int, c: int) -> tuple[int, int]:
    return (triton.cdiv(n, _BLOCK_T), triton.cdiv(c, _BLOCK_C))


class TritonOps:
    """The same operations as Triton kernels over [rows, channels] float64 tiles (rows contiguous)."""

    def axpy(self, a, b, w):  # noqa: ANN001, ANN201
        n, c = a.shape
        out = torch.empty((n, c), dtype=torch.float64, device=a.device)
        _axpy_kernel[_grid(n, c)](a, b, out, n, c, a.stride(0), b.stride(0), out.stride(0),
                                  1.0 if w is None else float(w), WEIGHTED=w is not None,
                                  BLOCK_T=_BLOCK_T, BLOCK_C=_BLOCK_C)  # fmt: skip
        return out

    def merge(self, sa, ma, sb, mb, ia, ib, coef):  # noqa: ANN001, ANN201
        n, c = sa.shape
        out = torch.empty((n, c), dtype=torch.float64, device=sa.device)
        _merge_kernel[_grid(n, c)](
            sa, sa if ma is None else ma, sb, sb if mb is None else mb, out, n, c,
            sa.stride(0), sa.stride(0) if ma is None else ma.stride(0), sb.stride(0),
            sb.stride(0) if mb is None else mb.stride(0), out.stride(0), float(ia), float(ib), float(coef),
            HAS_MA=ma is not None, HAS_MB=mb is not None, BLOCK_T=_BLOCK_T, BLOCK_C=_BLOCK_C,
        )  # fmt: skip
        return out

    def mean_join(self, mu, mi, s, i, w):  # noqa: ANN001, ANN201
        # torch's elementwise ops on the device: a kernel of its own would save one pass of three, once per
        # window of three or more binary digits that a std or z-score reads
        mu = torch.mul(mu, mi)
        return torch.sub(mu, torch.sub(mu, torch.mul(s, i)).mul_(w))

    def finish(self, kind, dest, cur, y=None, m=None, *, window=1, gain=1.0):  # noqa: ANN001, ANN201
        n, c = cur.shape
        y_ = cur if y is None else y
        m_ = cur if m is None else m
        _finish_kernel[_grid(n, c)](
            cur, y_, m_, dest, n, c, cur.stride(0), y_.stride(0), m_.stride(0), dest.stride(0),
            dest.stride(1), float(window), float(max(window - 1, 1)), float(gain), KIND=_KIND[kind], BLOCK_T=_BLOCK_T,
            BLOCK_C=_BLOCK_C,
        )  # fmt: skip


# ------------------------------------------------------------------------------------ one fused kernel

# What the fused kernel writes for each kind ({p}: the filter's parameter), from the loaded rows (cur, lag{p})
# and the window sums (w{p}_s; w{p}_sd and w{p}_dz: the standard deviation and x - mean from shifted sums).
_EXPR = {
    "id": "cur",
    "lag": "lag{p}",
    "diff": "cur - lag{p}",
    "ret": "tl.where((cur > 0) & (lag{p} > 0), tl.log(cur / lag{p}), float('nan'))",
    "ma": "w{p}_s {div}",
    "dev": "cur - w{p}_s {div}",
    "std": "w{p}_sd",
    "zscore": "tl.where((w{p}_sd > 0.0) & (w{p}_sd < float('inf')), w{p}_dz / w{p}_sd, float('nan'))",
}
FUSED_KINDS = frozenset(_EXPR)


def _div(w: int) -> str:
    """Division by a window in the kernel: a literal 1 / W is a float32 constant in Triton, exact only for a
    power of two (then a multiplication); else a float64 division, rounded once."""
    return f"* {1.0 / w!r}" if w & (w - 1) == 0 else f"/ {w}"


def fused_source(plan) -> tuple[str, str]:  # noqa: ANN001 - filterbank.FusedPlan (not imported: no cycle)
    """(function name, source) of the fused kernel for ``plan`` (:class:`tsconv.kernels.filterbank.FusedPlan`):
    generated from integers and the fixed kind names of ``_EXPR`` only, never from user text."""
    BT, BC = plan.rows, plan.channels
    M = len(plan.kinds)
    MP = 1 << (M - 1).bit_length()
    for k in plan.kinds:
        if k not in _EXPR:
            raise ValueError(f"kind {k!r} is not fused")
    for p in plan.params:
        if not isinstance(p, int) or isinstance(p, bool) or p < 0:
            raise ValueError(f"bad filter parameter {p!r}")
    for v in (BT, BC):
        if v < 1 or v & (v - 1):
            raise ValueError(f"tile sizes must be powers of two, got {BT} x {BC}")
    lags = sorted({p for k, p in zip(plan.kinds, plan.params, strict=True) if k in ("lag", "diff", "ret")})
    raw = sorted({p for k, p in zip(plan.kinds, plan.params, strict=True) if k in ("ma", "dev")})
    mom = sorted({p for k, p in zip(plan.kinds, plan.params, strict=True) if k in ("std", "zscore")})
    name = plan.name

    def rowx(u: str) -> str:  # offsets of input rows for output steps u (3-d)
        return f"(({u}) + halo).to(tl.int64) * sx_t + ccol[None, None, :]"

    ln: list[str] = []
    add = ln.append
    add('@triton.jit(do_not_specialize=["n", "n_in", "C", "sx_t", "sx_c", "so", "halo"])')
    add(
        f"def {name}(x_ptr, o_ptr, f_ptr, n, n_in, C, sx_t, sx_c, so, halo, D: tl.constexpr, RT: tl.constexpr,"
    )
    add("           FK: tl.constexpr, FC: tl.constexpr, FLAGS: tl.constexpr):")
    add(f"    # generated by tsconv.kernels.filterbank_triton.fused_source: {plan}")
    add("    pid = tl.program_id(0)")
    add(f"    base = (pid // D) * ({BT} * D) + pid % D  # output row of local step 0; steps are D rows apart")
    head, ln = ln, []
    add = ln.append
    # the tile's body, on channel tile cb; emitted once per branch below
    add(f"    c = cb * {BC} + tl.arange(0, {BC})")
    add("    cok = c < C")
    add("    ccol = c.to(tl.int64) * sx_c")
    add(f"    t2 = base + tl.arange(0, {BT})[:, None] * D")
    add("    ok2 = (t2 < n) & cok[None, :]")
    add("    cur = tl.load(x_ptr + (t2 + halo).to(tl.int64) * sx_t + ccol[None, :], mask=ok2, other=0.0)")
    add("    cur = cur.to(tl.float64)")
    for L in lags:
        add(
            f"    lag{L} = tl.load(x_ptr + (t2 + halo - {L} * D).to(tl.int64) * sx_t + ccol[None, :], mask=ok2,"
        )
        add("                     other=1.0).to(tl.float64)")
    for W in sorted(set(raw) | set(mom)):
        b = 1 << (W.bit_length() - 1)
        nb = BT // b
        add(
            f"    # window {W}: sub-blocks of {b} steps; step i of a sub-block starting at s sums x[s-{W}+1+i .. s-1]"
        )
        add(
            "    # (a reverse scan of the rows before s) and x[s .. s+i] (a scan): only the window's own values"
        )
        add(f"    w{W}_q = tl.arange(0, {nb})[:, None, None] * {b}")
        add(f"    w{W}_i = tl.arange(0, {b})[None, :, None]")
        add(f"    w{W}_t = base + (w{W}_q + w{W}_i) * D")
        add(f"    w{W}_ok = (w{W}_t < n) & cok[None, None, :]")
        # the rows before a sub-block serve all its steps: masked by the sub-block's start, not by their index
        add(f"    w{W}_sok = (base + w{W}_q * D < n) & cok[None, None, :]")
        add(f"    w{W}_xb = tl.load(x_ptr + {rowx(f'w{W}_t')}, mask=w{W}_ok, other=0.0).to(tl.float64)")
        add(f"    w{W}_lo = tl.load(x_ptr + {rowx(f'base + (w{W}_q - {W - 1} + w{W}_i) * D')},")
        add(f"                    mask=w{W}_sok & (w{W}_i < {W - 1}), other=0.0).to(tl.float64)")
        hi = W - 1 - b  # rows of the reverse part past the sub-block's first b
        if hi > 0:
            add(f"    w{W}_hi = tl.load(x_ptr + {rowx(f'base + (w{W}_q - {W - 1} + {b} + w{W}_i) * D')},")
            add(f"                    mask=w{W}_sok & (w{W}_i < {hi}), other=0.0).to(tl.float64)")
        if W in raw:
            tail = f" + tl.sum(w{W}_hi, axis=1, keep_dims=True)" if hi > 0 else ""
            add(f"    w{W}_s = (tl.cumsum(w{W}_lo, axis=1, reverse=True){tail}) + tl.cumsum(w{W}_xb, axis=1)")
            add(f"    w{W}_s = tl.reshape(w{W}_s, ({BT}, {BC}))")
        if W in mom:
            # sums of y = x - x[s]: x[s] lies in every window of the sub-block, so a flat window gives 0
            # exactly, and the squares stay at the window's range, not the price level
            add(f"    w{W}_c = tl.load(x_ptr + {rowx(f'base + w{W}_q * D')},")
            add(f"                   mask=w{W}_sok, other=0.0).to(tl.float64)")
            add(f"    ylo, yb = tl.where(w{W}_i < {W - 1}, w{W}_lo - w{W}_c, 0.0), w{W}_xb - w{W}_c")
            tail = ""
            if hi > 0:
                add(f"    yhi = tl.where(w{W}_i < {hi}, w{W}_hi - w{W}_c, 0.0)")
            for sq, fn in (("sy", "{}"), ("qy", "{0} * {0}")):
                tail_ = f" + tl.sum({fn.format('yhi')}, axis=1, keep_dims=True)" if hi > 0 else ""
                add(
                    f"    w{W}_{sq} = (tl.cumsum({fn.format('ylo')}, axis=1, reverse=True){tail_}) + "
                    f"tl.cumsum({fn.format('yb')}, axis=1)"
                )
            add(f"    m2 = w{W}_qy - w{W}_sy * w{W}_sy {_div(W)}")
            add(
                f"    w{W}_sd = tl.sqrt(tl.where(m2 < 0.0, 0.0, m2) {_div(max(W - 1, 1))})  # the where keeps NaN"
            )
            add(f"    w{W}_dz = yb - w{W}_sy {_div(W)}")
            add(f"    w{W}_sd = tl.reshape(w{W}_sd, ({BT}, {BC}))")
            add(f"    w{W}_dz = tl.reshape(w{W}_dz, ({BT}, {BC}))")
    # every filter's output for the tile as one [steps, channels, filters] store, contiguous per step: one
    # strided store per filter measured 1.4-1.6x slower on the H200 (NOTES, 20)
    add(f"    mi = tl.arange(0, {MP})[None, None, :]")
    add(f"    res = tl.zeros(({BT}, {BC}, {MP}), dtype=tl.float32)")
    for m, (k, p) in enumerate(zip(plan.kinds, plan.params, strict=True)):
        v = _EXPR[k].format(p=p, div=_div(p) if k in ("ma", "dev") else "")
        add(f"    v = ({v}).to(tl.float32)")
        add(f"    res = tl.where(mi == {m}, v[:, :, None], res)")
    add(f"    optr = o_ptr + t2[:, :, None].to(tl.int64) * so + c[None, :, None] * {M} + mi")
    add(f"    tl.store(optr, res, mask=ok2[:, :, None] & (mi < {M}))")
    body = ["    " + line for line in ln]
    ln = head
    add = ln.append
    add("    if FLAGS:")
    # only the tiles the running-sum kernel flagged, one program per tile of its own (looping over its FC
    # channel tiles of this kernel's): a program per channel tile of this kernel's, most of them returning at
    # once, took 13% of a step on an H100 (NOTES, 20); one of RT and this tile's steps divides the other (FK
    # of them a program: this tile's steps / RT, at least 1)
    add(f"        first = (pid // D) * {BT} // RT")
    add("        col = tl.program_id(1)")
    add("        flag = 0")
    # the running kernel's tiles of steps: a last program of FK of them can reach past them (no flag there)
    add("        n_rt = tl.cdiv(n, RT * D) * D")
    add("        for j in tl.static_range(FK):")
    add("            r = (first + j) * D + pid % D")
    add(
        "            flag = tl.maximum(flag, tl.load(f_ptr + r * tl.num_programs(1) + col, mask=r < n_rt, other=0))"
    )
    add("        if flag == 0:")
    add("            return")
    add("        for cj in range(FC):")
    add("            cb = col * FC + cj")
    ln.extend("    " + line for line in body)
    add("    else:")
    add("        cb = tl.program_id(1)")
    ln.extend(body)
    return name, "\n".join(ln) + "\n"


# ----------------------------------------------------------------------- the running-sum kernel

# The kinds the running-sum kernel computes (filterbank.RUNNING_KINDS, checked by a test), with _EXPR's
# expressions over its own names (w{p}_s: the window's sum with NaN and infinities as a direct sum has them), so
# both kernels give the same bits from the same sums.
RUNNING_KINDS = frozenset({"id", "lag", "diff", "ret", "ma", "dev"})
# Rows before a program's first step read at once to start a window's sum (16: 96 registers a thread on sm_90;
# 64-row blocks took 234 and capped the SM at 8 warps).
_START_BLOCK = 16
_COUNT_BITS = 10
_COUNT_MASK = (1 << _COUNT_BITS) - 1


def running_source(plan) -> tuple[str, str]:  # noqa: ANN001 - filterbank.FusedPlan (not imported: no cycle)
    """(function name, source) of the running-sum kernel for ``plan``: each thread owns a channel and walks
    ``plan.run_rows`` steps, adding the row that enters each window and subtracting the one that leaves, in
    float64. Such sums are exact, so in any order equal to the ladder's and the fused kernel's, when every
    value a program sums is a multiple of its smallest one's float32 spacing and the sums stay under 2^53 of
    it: ``amax * 2 (W + 1) <= amin * 2^30`` (amin, amax over its finite non-zero values, W its longest
    window); NaN and infinities are counted, not summed, and give the window what a direct sum gives. A
    program where that does not hold writes 1 to its flag, and the fused kernel recomputes its tile.
    Generated from integers and the fixed kind names of ``_EXPR`` only, never from user text."""
    T, BC, U = plan.run_rows, plan.run_channels, plan.run_unroll
    M = len(plan.kinds)
    for k in plan.kinds:
        if k not in RUNNING_KINDS:
            raise ValueError(f"kind {k!r} is not summed by the running kernel")
    for v in (T, BC, U, *plan.params):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"bad running-kernel parameter {v!r}")
    if T < 1 or BC < 1 or BC & (BC - 1) or U < 1:
        raise ValueError(f"bad running tile {T} x {BC}, unroll {U}")
    pairs = list(zip(plan.kinds, plan.params, strict=True))
    lags = sorted({p for k, p in pairs if k in ("lag", "diff", "ret")})
    wins = sorted({p for k, p in pairs if k in ("ma", "dev")})
    if any(w < 1 or w > _COUNT_MASK for w in wins):
        raise ValueError(f"windows of 1 to {_COUNT_MASK} steps only, got {wins}")
    wmax = max(wins, default=1)
    body = "_".join(f"{k}{p}" for k, p in pairs)
    name = f"_runbank_{body}_t{T}_c{BC}_u{U}"
    inf, nan = "float('inf')", "float('nan')"
    # a window's NaN, +inf and -inf counts packed in one int32, 10 bits each (windows under 1024 steps)
    sh, mk = _COUNT_BITS, _COUNT_MASK

    def counts(v: str) -> str:
        return (f"(({v} != {v}).to(tl.int32) + (({v} == {inf}).to(tl.int32) << {sh}) + "
                f"(({v} == -{inf}).to(tl.int32) << {2 * sh}))")  # fmt: skip

    ln: list[str] = []
    add = ln.append
    add('@triton.jit(do_not_specialize=["n", "C", "sx_t", "sx_c", "so", "halo"])')
    add(f"def {name}(x_ptr, o_ptr, f_ptr, n, C, sx_t, sx_c, so, halo, D: tl.constexpr):")
    add(f"    # generated by tsconv.kernels.filterbank_triton.running_source: {plan}")
    add("    pid = tl.program_id(0)")
    add(f"    base = (pid // D) * ({T} * D) + pid % D  # output row of local step 0; steps are D rows apart")
    add(f"    c = tl.program_id(1) * {BC} + tl.arange(0, {BC})")
    add("    cok = c < C")
    add("    ccol = c.to(tl.int64) * sx_c")
    add("    live = base < n")
    # the range of the values summed, in float32 (their own type: exact)
    add(f"    amax = tl.zeros(({BC},), dtype=tl.float32)")
    add(f"    amin = tl.full(({BC},), {inf}, dtype=tl.float32)")
    for W in wins:
        # the window's sum before step 0: its W - 1 rows before the first step's row
        add(f"    s{W} = tl.zeros(({BC},), dtype=tl.float64)")
        add(f"    k{W} = tl.zeros(({BC},), dtype=tl.int32)")
        if W > 1:
            kb = min(_START_BLOCK, 1 << (W - 2).bit_length())
            add(f"    for k0 in range(0, {W - 1}, {kb}):")
            add(f"        k = k0 + 1 + tl.arange(0, {kb})[:, None]")
            add("        v = tl.load(x_ptr + (base + halo - k * D).to(tl.int64) * sx_t + ccol[None, :],")
            add(f"                    mask=(k < {W}) & cok[None, :] & live, other=0.0)")
            add("        fin = v - v == 0.0")
            add("        a = tl.where(fin, tl.abs(v), 0.0)")
            add("        amax = tl.maximum(amax, tl.max(a, axis=0))")
            add(f"        amin = tl.minimum(amin, tl.min(tl.where(a > 0.0, a, {inf}), axis=0))")
            add(f"        s{W} += tl.sum(tl.where(fin, v, 0.0).to(tl.float64), axis=0)")
            add(f"        k{W} += tl.sum({counts('v')}, axis=0)")
    # every row a step reads, by its distance before the step's row: its own, the lags', and the row leaving
    # each window after the step (W - 1 back); loaded a step ahead (the loop's loads then overlap a step's
    # work), and each filter stored from its own vector: an interleaved [channels, filters] store costs a
    # layout change through shared memory and five barriers a step (NOTES, 20)
    offs = sorted({0} | set(lags) | {w - 1 for w in wins if w > 1})

    def loads(i: str, ok: str, indent: str) -> None:
        add(f"{indent}rp = x_ptr + (base + ({i}) * D + halo).to(tl.int64) * sx_t + ccol")
        for o in offs:
            other = "1.0" if o in lags else "0.0"
            add(f"{indent}r{o} = tl.load(rp - {o} * D * sx_t, mask={ok}, other={other})")

    loads("0", "cok & live", "    ")
    add(f"    for i in tl.range(0, {T}, loop_unroll_factor={U}):")
    add("        t = base + i * D")
    add("        ok = cok & (t < n)")
    add("        " + ", ".join(f"x{o}" for o in offs) + " = " + ", ".join(f"r{o}" for o in offs))
    loads("i + 1", f"cok & (t + D < n) & (i + 1 < {T})", "        ")
    add("        cur = x0.to(tl.float64)")
    for L in lags:
        add(f"        lag{L} = x{L}.to(tl.float64)")
    if wins:
        add("        fin = x0 - x0 == 0.0")
        add("        a = tl.where(fin, tl.abs(x0), 0.0)")
        add("        amax = tl.maximum(amax, a)")
        add(f"        amin = tl.minimum(amin, tl.where(a > 0.0, a, {inf}))")
        add("        cz = tl.where(fin, cur, 0.0)")
        add(f"        ck = {counts('x0')}")
    for W in wins:
        add(f"        s{W} += cz")
        add(f"        k{W} += ck")
        # what a direct sum of the window gives: NaN from a NaN or from +inf and -inf, else the infinity
        add(f"        pos, neg = ((k{W} >> {sh}) & {mk}) > 0, (k{W} >> {2 * sh}) > 0")
        add(f"        w{W}_s = tl.where(((k{W} & {mk}) > 0) | (pos & neg), {nan},")
        add(f"                         tl.where(pos, {inf}, tl.where(neg, -{inf}, s{W})))")
    add(f"        op = o_ptr + t.to(tl.int64) * so + c * {M}")
    for m, (k, p) in enumerate(pairs):
        v = _EXPR[k].format(p=p, div=_div(p) if k in ("ma", "dev") else "")
        add(f"        tl.store(op + {m}, ({v}).to(tl.float32), mask=ok)")
    for W in wins:
        old = f"x{W - 1}"
        add(f"        s{W} -= tl.where({old} - {old} == 0.0, {old}, 0.0).to(tl.float64)")
        add(f"        k{W} -= {counts(old)}")
    add("    big, small = amax.to(tl.float64), amin.to(tl.float64)")
    add(f"    exact = (big * {2.0 * (wmax + 1)!r} <= small * 1073741824.0) | (big == 0.0)")
    add(
        "    tl.store(f_ptr + pid * tl.num_programs(1) + tl.program_id(1), tl.max(tl.where(exact, 0, 1), axis=0))"
    )
    return name, "\n".join(ln) + "\n"


def _built(name: str, src: str) -> triton.runtime.JITFunction:
    filename = f"<tsconv.kernels.filterbank_triton {name}>"
    # Triton reads a kernel's source through inspect/linecache: register the generated text under its name.
    linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
    namespace = {"triton": triton, "tl": tl, "__name__": __name__}
    exec(compile(src, filename, "exec"), namespace)  # noqa: S102 (our own template, integers and kind names)
    return namespace[name]


@functools.cache
def running_kernel(plan) -> triton.runtime.JITFunction:  # noqa: ANN001 - a FusedPlan (hashable)
    """The generated running-sum kernel for ``plan``, built once per process."""
    return _built(*running_source(plan))


@functools.cache
def fused_kernel(plan) -> triton.runtime.JITFunction:  # noqa: ANN001 - a FusedPlan (hashable)
    """The generated fused kernel for ``plan``, built once per process."""
    return _built(*fused_source(plan))


def run_fused(plan, x: torch.Tensor, out: torch.Tensor, *, halo: int, dilation: int) -> None:
    """Every filter of the bank on ``x`` [n + halo, C] (float32, any strides) into ``out`` [n, C * M]."""
    n_in, c = x.shape
    n = out.shape[0]
    flags, rt, fc = out, 1, 1
    if plan.run_rows:
        # the running sums first; the fused kernel then recomputes the tiles whose sums were not exact
        rgrid = (triton.cdiv(n, plan.run_rows * dilation) * dilation, triton.cdiv(c, plan.run_channels))
        flags = torch.empty(rgrid[0] * rgrid[1], dtype=torch.int32, device=x.device)
        running_kernel(plan)[rgrid](x, out, flags, n, c, x.stride(0), x.stride(1), out.stride(0), halo,
                                    D=dilation, num_warps=plan.run_warps)  # fmt: skip
        rt, fc = plan.run_rows, plan.run_channels // plan.channels
    cols = triton.cdiv(c, plan.run_channels) if plan.run_rows else triton.cdiv(c, plan.channels)
    grid = (triton.cdiv(n, plan.rows * dilation) * dilation, cols)
    fused_kernel(plan)[grid](x, out, flags, n, n_in, c, x.stride(0), x.stride(1), out.stride(0), halo, D=dilation,
                             RT=rt, FK=max(1, plan.rows // rt), FC=fc, FLAGS=bool(plan.run_rows), num_warps=plan.warps)  # fmt: skip
