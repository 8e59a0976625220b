"""Triton helpers shared by conv1d's kernel families, the GEMM and the fused conv -> head kernel.

One copy of each, so that every kernel computes with the same arithmetic: TF32 rounding in registers
(``round_tf32``, ``round_tf32_rne``) and the split-TF32 product behind precision "fp32" (``dot_fp32``; why:
benchmarks/NOTES.md, "Precision"); the memory-bound pre-pass that writes a TF32-rounded copy of an operand
(``round_tf32_into``, into ``tf32_buffer``); the activations in kernels (``activate``); grouped program
ordering (``grouped``); the re-centering level of ``recenter=True`` (``level``); the launch checks
(``check_grid``, ``max_offset``).

This module imports Triton: only the kernel modules import it. What their torch paths share with them
(``apply_activation``, ``round_tf32_torch``, ``recenter_sums``, ``WEIGHTS``, ``custom_op``, ``INTERPRETED``)
lives in :mod:`tsconv.kernels.torch_side`, which a CPU run without Triton imports alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tsconv.errors import ShapeError
from tsconv.kernels.checks import INT32_MAX as _INT32_MAX

__all__ = [
    "activate",
    "check_grid",
    "dot_first",
    "dot_fp32",
    "level_fallback",
    "grouped",
    "level",
    "max_offset",
    "round_tf32",
    "round_tf32_into",
    "round_tf32_rne",
    "tanh",
    "tf32_buffer",
]


# --------------------------------------------------------------------------------------------------------
# jit helpers
# --------------------------------------------------------------------------------------------------------


@triton.jit
def round_tf32(v):
    """Round float32 to the nearest TF32 value (10-bit mantissa; ties away from zero), kept as float32."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x1000) & -8192
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def round_tf32_rne(v):
    """Round float32 to the nearest TF32 value, ties to even (IEEE round-to-nearest-even on a 10-bit
    mantissa), kept as float32 with the low 13 bits zero. NaN stays NaN (quiet, sign kept), +-inf stays +-inf,
    finite values at or above the midpoint between the largest TF32 (0x7F7FE000) and 2^128 become +-inf,
    subnormals round on TF32's subnormal grid (2^-136), -0.0 stays -0.0.

    Integer arithmetic on the bit pattern: adding 0xFFF plus bit 13 (the lowest kept bit) to the 13 dropped
    bits carries into the kept ones exactly when the dropped part is above half, or exactly half with an odd
    kept part; a carry out of the mantissa bumps the exponent, which is the right result (up to infinity).
    The same instructions on the GPU and in the interpreter, so the interpreter tests pin the GPU's bits
    (PTX ``cvt.rn.tf32.f32``, sm_90+, rounds finite values the same way; in a memory-bound pre-pass the few
    integer instructions cost nothing).
    """
    bits = v.to(tl.int32, bitcast=True)
    rounded = (bits + (0x0FFF + ((bits >> 13) & 1))) & -8192
    # NaN: the add could carry its payload into the exponent (inf) or wrap; keep the sign and high payload,
    # set the quiet bit and clear the low 13 bits, so it stays a NaN when the tensor core drops them.
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = tl.where(is_nan, (bits | 0x00400000) & -8192, rounded)
    return rounded.to(tl.float32, bitcast=True)


# S (the unit-stride extent) is specialised on: its divisibility by 16 lets the masked rows use 16-byte
# vector loads and stores (at most two variants: S % 16 == 0 or not).
@triton.jit(do_not_specialize=["R", "n_rblk", "n_sblk"])
def _round_tf32_kernel(
    src_ptr,
    dst_ptr,
    R,
    S,
    n_rblk,
    n_sblk,
    stride_sb,
    stride_sr,
    stride_ss,
    stride_db,
    stride_dr,
    stride_ds,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """dst[b, r, s] = tf32_rne(src[b, r, s]) over [B, R, S] views; S is dst's unit-stride dimension."""
    pid = tl.program_id(0)
    per_b = n_rblk * n_sblk
    b = (pid // per_b).to(tl.int64)
    pid_r = (pid % per_b) // n_sblk
    pid_s = pid % n_sblk
    offs_r = pid_r.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_s = pid_s.to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    mask = (offs_r < R)[:, None] & (offs_s < S)[None, :]
    v = tl.load(
        src_ptr + b * stride_sb + offs_r[:, None] * stride_sr + offs_s[None, :] * stride_ss,
        mask=mask,
        other=0.0,
    )
    d = dst_ptr + b * stride_db + offs_r[:, None] * stride_dr + offs_s[None, :] * stride_ds
    tl.store(d, round_tf32_rne(v), mask=mask)


@triton.jit
def dot_first(a, b, acc, FLUSH: tl.constexpr):
    if FLUSH:
        return tl.dot(a, b, input_precision="tf32")  # a fresh tensor-core accumulator
    return tl.dot(a, b, acc, input_precision="tf32")


@triton.jit
def dot_fp32(a, b, wlo_ptrs, w_mask, acc, A_SPLIT: tl.constexpr, W_SPLIT: tl.constexpr, FLUSH: tl.constexpr):
    """:func:`dot_split` with the TF32 remainder of the weights loaded from ``wlo_ptrs`` when W_SPLIT."""
    if W_SPLIT:
        b_lo = tl.load(wlo_ptrs, mask=w_mask, other=0.0)
    else:
        b_lo = b
    return dot_split(a, b, b_lo, acc, A_SPLIT, W_SPLIT, FLUSH)


@triton.jit
def dot_split(a, b, b_lo, acc, A_SPLIT: tl.constexpr, W_SPLIT: tl.constexpr, FLUSH: tl.constexpr):
    """acc + a @ b to float32 accuracy on TF32 tensor cores (precision "fp32":
    :mod:`tsconv.kernels.conv1d.dense` says why; benchmarks/NOTES.md, "Precision").

    a: float32 [BT, BC]; b: [BC, BO] TF32-exact weights (float16, or the TF32 high part of float32 weights,
    whose TF32 remainder is ``b_lo`` when W_SPLIT; ignored otherwise). A_SPLIT: 1 = a is TF32-exact (float16 /
    bfloat16 input); 3 = a = a_hi + a_mid + a_lo, each exact in TF32 (the default for float32 inputs); 2 = a_hi
    + a_r with a 13-bit remainder that the tensor core truncates (kept to show it fails under the emulation
    tests). Products are added smallest first. FLUSH: the products of this step are summed in a fresh
    tensor-core accumulator and added to ``acc`` on the CUDA cores (round to nearest), so the tensor core's
    round-toward-zero never acts on the running sum.
    """
    if A_SPLIT >= 2:
        a_hi = round_tf32(a)
        a_r = tl.where(a_hi == a, 0.0, a - a_hi)  # exact; the where() keeps +-inf inputs from making NaN
        if A_SPLIT == 3:
            a_mid = round_tf32(a_r)
            a_lo = a_r - a_mid  # exact, at most 3 significant bits: exact in TF32
            p = dot_first(a_lo, b, acc, FLUSH)
            if W_SPLIT:
                p = tl.dot(a_mid, b_lo, p, input_precision="tf32")
            p = tl.dot(a_mid, b, p, input_precision="tf32")
        else:
            p = dot_first(a_r, b, acc, FLUSH)
        if W_SPLIT:
            # +-inf times a zero low part would be NaN: infinities reach the sum through the high part only
            p = tl.dot(tl.where(tl.abs(a_hi) < float("inf"), a_hi, 0.0), b_lo, p, input_precision="tf32")
        p = tl.dot(a_hi, b, p, input_precision="tf32")
    elif W_SPLIT:
        p = dot_first(tl.where(tl.abs(a) < float("inf"), a, 0.0), b_lo, acc, FLUSH)  # as above
        p = tl.dot(a, b, p, input_precision="tf32")
    else:
        p = dot_first(a, b, acc, FLUSH)
    if FLUSH:
        p = acc + p
    return p


@triton.jit
def tanh(v):
    # exp-based: libdevice is unavailable in the interpreter. A short odd series near zero avoids the
    # cancellation of 1 - exp(-2|v|) there (truncation error below 1e-7 relative for |v| < 0.3).
    a = tl.abs(v)
    e = tl.exp(-2.0 * a)
    big = (1.0 - e) / (1.0 + e)
    a2 = a * a
    small = a * (
        1.0
        + a2
        * (
            -0.3333333333333333
            + a2 * (0.13333333333333333 + a2 * (-0.05396825396825397 + a2 * 0.021869488536155203))
        )
    )
    r = tl.where(a < 0.3, small, big)
    return tl.where(v < 0.0, -r, r)


@triton.jit
def activate(v, ACT: tl.constexpr):
    if ACT == 1:
        v = tl.where(v < 0.0, 0.0, v)  # keeps NaN, as torch.relu does
    elif ACT == 2:
        v = 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))
    elif ACT == 3:
        v = tanh(v)
    return v


@triton.jit
def grouped(pid, n_rows, n_cols, GROUP: tl.constexpr):
    """(row block, column block) of program ``pid`` in grouped ordering (the Triton matmul tutorial): GROUP
    row blocks sweep all column blocks together, so the rows and columns a wave of programs touches stay in
    L2. GROUP = 1: column blocks fastest, then rows."""
    in_group = GROUP * n_cols
    first = (pid // in_group) * GROUP
    group = tl.minimum(n_rows - first, GROUP)
    return first + (pid % in_group) % group, (pid % in_group) // group


@triton.jit
def _level_sample(row0_ptrs, row, j, lv_min, dilation, stride_t, L_in, mask, fb):
    """x at ``row - j * d`` for :func:`level`, ``fb`` where not finite; a row before row 0 is ``row`` itself."""
    r = tl.maximum(tl.where(row - j * dilation >= 0, row - j * dilation, row), lv_min)
    v = tl.load(row0_ptrs + r * stride_t, mask=mask & (r < L_in), other=0.0).to(tl.float32)
    return tl.where(tl.abs(v) < float("inf"), v, fb)


@triton.jit
def level_fallback(f_ptr, offs, mask, FALLBACK: tl.constexpr):
    """Each channel's level where its samples are not finite (``conv1d(recenter_fallback=)``), else 0."""
    if FALLBACK:
        return tl.load(f_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    return offs.to(tl.float32) * 0.0


@triton.jit
def level(row0_ptrs, row, lv_min, dilation, stride_t, L_in, mask, fb, SAMPLES: tl.constexpr):
    """The re-centering level of a block of outputs (``recenter=True``).

    ``row`` is the input row of the last tap of the block's first output (in "causal" padding that output's
    own step): the latest row no later than any of the block's outputs, so re-centering stays causal. The
    level is the median of x at ``row``, ``row - d``, ..., ``row - (SAMPLES - 1) d`` (d the dilation; SAMPLES
    1, 3 or 5; every kernel takes 5), so two bad prints in a row are never taken for the level: a block whose
    level is a print of 1e8 computes every output it holds as conv(x - 1e8), off by hundreds of times the
    outputs' scale. A sample before row 0 is ``row`` itself (clamped to row 0 it counted that row again).
    Rows before ``lv_min`` are the caller's zero history (the engine's first step;
    ``conv1d(recenter_from=)``): samples there move to ``lv_min``, the first row of data (outputs whose own
    step is before it are the history's, which the engine discards). A sample that is not finite counts as
    ``fb`` (:func:`level_fallback`: the caller's level of the channel, e.g. the engine's chunk level, else 0), so
    NaN and inf still reach exactly the outputs whose taps read them, and a block where a series starts (its
    samples NaN) is centred near the series' first values, not on 0. ``row0_ptrs`` point at input row 0.
    """
    v = _level_sample(row0_ptrs, row, 0, lv_min, dilation, stride_t, L_in, mask, fb)
    if SAMPLES >= 3:
        v1 = _level_sample(row0_ptrs, row, 1, lv_min, dilation, stride_t, L_in, mask, fb)
        v2 = _level_sample(row0_ptrs, row, 2, lv_min, dilation, stride_t, L_in, mask, fb)
        if SAMPLES == 5:
            v3 = _level_sample(row0_ptrs, row, 3, lv_min, dilation, stride_t, L_in, mask, fb)
            v4 = _level_sample(row0_ptrs, row, 4, lv_min, dilation, stride_t, L_in, mask, fb)
            # median of five: the median of v4 and the middle pair of (v, v1) and (v2, v3)
            lo = tl.maximum(tl.minimum(v, v1), tl.minimum(v2, v3))
            hi = tl.minimum(tl.maximum(v, v1), tl.maximum(v2, v3))
            v, v1, v2 = v4, lo, hi
        v = tl.maximum(tl.minimum(v, v1), tl.minimum(tl.maximum(v, v1), v2))
    return v


# --------------------------------------------------------------------------------------------------------
# launches
# --------------------------------------------------------------------------------------------------------


def check_grid(n_programs: int) -> None:
    if n_programs > _INT32_MAX:
        msg = f"the conv needs {n_programs} programs, more than one launch allows ({_INT32_MAX})."
        raise ShapeError(msg, hint="split the batch (N) or the series length into several calls.")


def max_offset(t: torch.Tensor) -> int:
    return sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True) if s > 0)


def _dense_order(t: torch.Tensor) -> list[int]:
    """``t``'s dimensions from outermost to innermost in memory (size-1 dimensions, whose stride is arbitrary,
    first); the last one is the unit-stride dimension of a dense tensor."""
    return sorted(range(t.dim()), key=lambda d: (t.shape[d] != 1, -t.stride(d), d))


def tf32_buffer(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised dense float32 tensor shaped like ``t`` (2-D or 3-D) with its dimensions in the memory
    order of ``t``'s strides: a time-major view gets a time-major buffer, so the kernel reading the rounded
    copy sees the same layout (and autotune key) as it would for ``t``."""
    order = _dense_order(t)
    buf = torch.empty([t.shape[d] for d in order], dtype=torch.float32, device=t.device)
    return buf.permute([order.index(d) for d in range(t.dim())])


def round_tf32_into(src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst = src`` rounded to TF32 (ties to even; see ``round_tf32_rne``): one pass reading ``src`` through
    its strides and writing ``dst`` (same shape, 2-D or 3-D, from :func:`tf32_buffer`). Memory-bound: one
    read and one write of float32 (about 0.13 ms for a [64, 1024, 1039] batch at 4 TB/s)."""
    order = _dense_order(dst)
    s3, d3 = src.permute(order), dst.permute(order)
    while d3.dim() < 3:
        s3, d3 = s3.unsqueeze(0), d3.unsqueeze(0)
    B, R, S = d3.shape
    if d3.numel() == 0:
        return
    block_s = max(16, min(256, triton.next_power_of_2(S)))
    block_r = max(1, min(triton.next_power_of_2(R), 4096 // block_s))
    n_rblk, n_sblk = triton.cdiv(R, block_r), triton.cdiv(S, block_s)
    grid = (B * n_rblk * n_sblk,)
    check_grid(grid[0])
    _round_tf32_kernel[grid](
        s3,
        d3,
        R,
        S,
        n_rblk,
        n_sblk,
        *s3.stride(),
        *d3.stride(),
        BLOCK_R=block_r,
        BLOCK_S=block_s,
        num_warps=4,
    )
