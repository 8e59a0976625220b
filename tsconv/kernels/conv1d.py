"""Causal (or valid) conv1d with a fused bias + activation epilogue, as Triton kernels.

``conv1d(x, weight, bias)`` computes ``F.conv1d(F.pad(x, ((K - 1) * dilation, 0)), weight, bias,
dilation=dilation, groups=groups)`` ("causal"; "valid" skips the padding) followed by an activation, reading
``x`` through any strides (in particular the [N, C, L] view of a time-major [N, L, C] buffer) and writing a
float32 result through any strides (``out=`` may be the [N, O, L] view of a time-major [N, L, O] buffer).

Three kernels (and the depthwise bank variant of the direct one), and generated ones for depthwise banks:

- ``_conv1d_dense_kernel``: an implicit GEMM on tensor cores for dense and grouped convs with at least 16
  input and 16 output channels per group. Output tile [BLOCK_T steps, BLOCK_O channels]; the reduction runs
  over taps and BLOCK_C channel chunks; the A tile is ``x[n, c0:c0+BC, t + k*d - pad]`` read in place (causal
  zeros come from load masks, never from a padded copy); the B tile comes from weights rearranged once per
  call to [groups, K, O/groups, C/groups] so that it is contiguous along the reduction (channels).
  Precision "fp32" (see ``_dot_fp32``): float32 x is split into three TF32 parts (x_hi + x_mid + x_lo, each
  exact in TF32, so with float16 weights, exact in TF32, the three tensor-core products are exact); float32
  weights add a TF32 low part (five products). Each reduction step's products go into a fresh tensor-core
  accumulator that is then added to the running float32 sum on the CUDA cores ("flush"). Why: tensor cores
  truncate float32 operands to TF32 and round each accumulation step toward zero (Fasi et al. 2021; Khattak
  and Mikaitis 2025), so on raw price levels through zero-sum filters, where the running sum is ~100x the
  result, accumulating in the tensor core gave errors growing linearly with C*K (H200: 5.7x / 9x / 20x
  cuDNN's float32 error at K = 5 / 16 / 64). ``conv1d_reference.emulate_tensor_cores`` models this
  arithmetic in the interpreter; under it the old scheme fails and this one passes (tests). "tf32" uses one
  TF32 product: weights rounded to TF32 once per call; float32 x rounded to TF32 (ties to even) by a
  memory-bound pre-pass into a float32 copy in x's layout (``_round_tf32_into``), which the kernel reads as
  loaded, so both operands stay in shared memory and the tensor core's truncation finds nothing to drop
  (feeding x unrounded, truncated, doubled the error on the H200). "fp16": float16 weights; float32 x is
  either cast once by the launcher into a time-major float16 copy (configs ``*_a16``) or converted in
  registers (the tuner picks). Accumulation is always float32. ``GROUP_T``: grouped program ordering.
- ``_conv1d_dense_tma_kernel`` (Hopper; "tf32" / "fp16", groups = 1, time-major x with 16-byte aligned rows):
  the same implicit GEMM with x tiles (and, ``W_TMA``, weight tiles) loaded by the TMA through a 3-D
  [N, L, C] descriptor: the copy engine zero-fills the causal history, the series end and channels past C
  (no masks in the loop), and for "tf32" rounds float32 x to TF32 on the way (``tsconv.kernels.tma``), so
  the pre-pass above is not needed. Its candidates sit in the same tuning space as the pointer kernel's.
- ``_conv1d_direct_kernel``: FMAs in float32 registers for depthwise filter banks (groups = C, M filters
  per channel) and any conv with fewer than 16 input or output channels per group. A program owns a
  [BLOCK_T steps, BLOCK_G groups, BLOCK_M filters] tile and loads each input value once per tap; the tap
  loop runs in compile-time chunks of ``UNROLL`` taps (several taps' loads in flight) plus a tail. The FLOPs
  are few, so it aims at memory bandwidth; it computes in float32 whatever ``precision`` says.
- For one input channel per group (depthwise banks), the tuner's first candidates are the generated
  register-window kernels of :mod:`tsconv.kernels.window` (``_launch_window``): one thread per channel keeps
  a sliding window of x in registers, so each x value is loaded once and feeds all its thread's rows and
  filters (2.5-5x the direct and bank kernels on the H200; benchmarks/NOTES.md).

``recenter=True`` (every kernel above but the TMA one, "fp32"): each program subtracts a per-channel level
read at its first output step (``_level``: the median of three taps in the depthwise kernels) from the x
it loads and adds ``level * tap sum`` back in float64 before the bias, so on raw levels the rounding scales
with the moves a block sees, not with the level or its drift (the engine's first stage; benchmarks/NOTES.md).

On CUDA tensors the Triton kernels run, with block shapes tuned per GPU and shape class and cached on disk
(see :mod:`tsconv.kernels.autotune`). On CPU tensors they run through the Triton interpreter when
``TRITON_INTERPRET=1`` was set before this module was imported; otherwise CPU tensors take a torch path
(F.conv1d in float32, weights upcast from their stored dtype) with the same semantics.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tsconv.errors import ShapeError
from tsconv.kernels import autotune, tma, window
from tsconv.kernels.activations import apply_activation
from tsconv.kernels.checks import ACT_CODE as _ACT_CODE
from tsconv.kernels.checks import ACT_NAME as _ACT_NAME
from tsconv.kernels.checks import INT32_MAX as _INT32_MAX
from tsconv.kernels.checks import PREC_CODE as _PREC_CODE
from tsconv.kernels.checks import check_out, is_activation
from tsconv.kernels.checks import describe as _shape
from tsconv.kernels.checks import dtype_name as _dtype_name
from tsconv.kernels.launch import (
    LaunchPlan,
    PlanCache,
    extent,
    launch_recorded,
    overlaps,
    plans_enabled_by_env,
    tensor_key,
)
from tsconv.kernels.weight_cache import WeightCache

__all__ = ["ACTIVATIONS", "PADDINGS", "PRECISIONS", "clear_weight_cache", "conv1d"]

ACTIVATIONS = (None, "none", "relu", "gelu", "tanh")
PADDINGS = ("causal", "valid")
PRECISIONS = ("fp32", "tf32", "fp16")

_X_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_W_DTYPES = (torch.float16, torch.float32, torch.bfloat16)

# Tests set this to exercise the 64-bit indexing variant on small tensors.
_FORCE_INDEX64 = False
# The rearranged weights of recent calls (tsconv.kernels.weight_cache): a steady-state call with the same
# weights launches no rearranging kernels.
_WEIGHTS = WeightCache(16)


def clear_weight_cache() -> None:
    """Forget the rearranged weights :func:`conv1d` keeps (needed only after writes that bypass torch's
    version counter, e.g. through ``.data``)."""
    _WEIGHTS.clear()


_FLUSH = True
_A_SPLIT = 3
# "tf32": round float32 x to TF32 (ties to even) in a pre-pass; tests switch it off to get the old truncation.
_ROUND_X_TF32 = True
# Which kernel and config the last Triton launch used (benchmarks report it): {"path": ..., "config": ...}.
last_launch: dict[str, str] = {}


# --------------------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------------------


@triton.jit
def _round_tf32(v):
    """Round float32 to the nearest TF32 value (10-bit mantissa; ties away from zero), kept as float32."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x1000) & -8192
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _round_tf32_rne(v):
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
    tl.store(d, _round_tf32_rne(v), mask=mask)


@triton.jit
def _dot_first(a, b, acc, FLUSH: tl.constexpr):
    if FLUSH:
        return tl.dot(a, b, input_precision="tf32")  # a fresh tensor-core accumulator
    return tl.dot(a, b, acc, input_precision="tf32")


@triton.jit
def _dot_fp32(a, b, wlo_ptrs, w_mask, acc, A_SPLIT: tl.constexpr, W_SPLIT: tl.constexpr, FLUSH: tl.constexpr):
    """acc + a @ b to float32 accuracy on TF32 tensor cores (see "precision fp32" in the module docstring).

    a: float32 [BT, BC]; b: [BC, BO] TF32-exact weights (float16, or the TF32 high part of float32 weights,
    whose TF32 remainder is at ``wlo_ptrs`` when W_SPLIT). A_SPLIT: 1 = a is TF32-exact (float16 / bfloat16
    input); 3 = a = a_hi + a_mid + a_lo, each exact in TF32 (the default for float32 inputs); 2 = a_hi + a_r
    with a 13-bit remainder that the tensor core truncates (the old scheme, kept for the emulation tests).
    Products are added smallest first. FLUSH: the products of this step are summed in a fresh tensor-core
    accumulator and added to ``acc`` on the CUDA cores (round to nearest), so the tensor core's
    round-toward-zero never acts on the running sum.
    """
    if A_SPLIT >= 2:
        a_hi = _round_tf32(a)
        a_r = tl.where(a_hi == a, 0.0, a - a_hi)  # exact; the where() keeps +-inf inputs from making NaN
        if W_SPLIT:
            b_lo = tl.load(wlo_ptrs, mask=w_mask, other=0.0)
        if A_SPLIT == 3:
            a_mid = _round_tf32(a_r)
            a_lo = a_r - a_mid  # exact, at most 3 significant bits: exact in TF32
            p = _dot_first(a_lo, b, acc, FLUSH)
            if W_SPLIT:
                p = tl.dot(a_mid, b_lo, p, input_precision="tf32")
            p = tl.dot(a_mid, b, p, input_precision="tf32")
        else:
            p = _dot_first(a_r, b, acc, FLUSH)
        if W_SPLIT:
            # +-inf times a zero low part would be NaN: infinities reach the sum through the high part only
            p = tl.dot(tl.where(tl.abs(a_hi) < float("inf"), a_hi, 0.0), b_lo, p, input_precision="tf32")
        p = tl.dot(a_hi, b, p, input_precision="tf32")
    elif W_SPLIT:
        b_lo = tl.load(wlo_ptrs, mask=w_mask, other=0.0)
        p = _dot_first(tl.where(tl.abs(a) < float("inf"), a, 0.0), b_lo, acc, FLUSH)  # as above
        p = tl.dot(a, b, p, input_precision="tf32")
    else:
        p = _dot_first(a, b, acc, FLUSH)
    if FLUSH:
        p = acc + p
    return p


@triton.jit
def _tanh(v):
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
def _grouped(pid, n_rows, n_cols, GROUP: tl.constexpr):
    """(row block, column block) of program ``pid`` in grouped ordering (the Triton matmul tutorial): GROUP
    row blocks sweep all column blocks together, so the rows and columns a wave of programs touches stay in
    L2. GROUP = 1: column blocks fastest, then rows."""
    in_group = GROUP * n_cols
    first = (pid // in_group) * GROUP
    group = tl.minimum(n_rows - first, GROUP)
    return first + (pid % in_group) % group, (pid % in_group) // group


@triton.jit
def _activate(v, ACT: tl.constexpr):
    if ACT == 1:
        v = tl.where(v < 0.0, 0.0, v)  # keeps NaN, as torch.relu does
    elif ACT == 2:
        v = 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))
    elif ACT == 3:
        v = _tanh(v)
    return v


# Sizes, offsets and block counts are not specialised on (divisibility by 16, == 1): that would compile a new
# variant for every series length and tap count; strides and channel counts still are (they set vector widths).
@triton.jit(do_not_specialize=["L_in", "L_out", "G", "K", "dilation", "pad", "lv_min", "n_tblk", "n_oblk"])
def _conv1d_dense_kernel(
    x_ptr,
    w_ptr,
    wlo_ptr,
    b_ptr,
    s_ptr,
    y_ptr,
    L_in,
    L_out,
    G,
    Cg,
    Og,
    K,
    dilation,
    pad,
    lv_min,
    n_tblk,
    n_oblk,
    stride_xn,
    stride_xc,
    stride_xt,
    stride_wk,
    stride_wo,
    stride_yn,
    stride_yo,
    stride_yt,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    PREC: tl.constexpr,
    A_SPLIT: tl.constexpr,
    W_SPLIT: tl.constexpr,
    FLUSH: tl.constexpr,
    INDEX64: tl.constexpr,
    RECENTER: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_C: tl.constexpr,
    GROUP_T: tl.constexpr,
):
    # Program order within a series: GROUP_T time blocks sweep all (group, output-channel) blocks together
    # (_grouped), so the x rows and weight blocks a wave of programs touches stay in L2. GROUP_T = 1:
    # output-channel blocks fastest (they share the same x rows), then time.
    pid = tl.program_id(0)
    n_go = G * n_oblk
    per_n = n_tblk * n_go
    n = pid // per_n
    pid_t, pid_go = _grouped(pid % per_n, n_tblk, n_go, GROUP_T)
    g = pid_go // n_oblk
    pid_o = pid_go % n_oblk

    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_o = pid_o * BLOCK_O + tl.arange(0, BLOCK_O)
    offs_c = tl.arange(0, BLOCK_C)
    if INDEX64:
        offs_t = offs_t.to(tl.int64)
        offs_o = offs_o.to(tl.int64)
        offs_c = offs_c.to(tl.int64)
    o_mask = offs_o < Og
    x_base = x_ptr + n.to(tl.int64) * stride_xn + (g * Cg).to(tl.int64) * stride_xc
    t_base = offs_t - pad
    a_ptrs = x_base + t_base[:, None] * stride_xt + offs_c[None, :] * stride_xc  # tap 0, channel block 0
    w_ptrs = w_ptr + g.to(tl.int64) * K * stride_wk + offs_o[None, :] * stride_wo + offs_c[:, None]
    wlo_ptrs = wlo_ptr + g.to(tl.int64) * K * stride_wk + offs_o[None, :] * stride_wo + offs_c[:, None]

    acc = tl.full((BLOCK_T, BLOCK_O), 0.0, tl.float32)
    n_cb = (Cg + BLOCK_C - 1) // BLOCK_C
    # recenter: each channel's level is its value at the block's first output step (see _level)
    t_lvl = pid_t * BLOCK_T - pad + (K - 1) * dilation
    if INDEX64:
        t_lvl = t_lvl.to(tl.int64)
    lv_ptrs = x_base + offs_c * stride_xc
    # One flat loop over (channel block, tap), taps fastest (consecutive A tiles overlap in time), so the
    # software pipeline spans all K * n_cb steps.
    for it in range(0, K * n_cb):
        k = it % K
        c0 = (it // K) * BLOCK_C
        if INDEX64:
            k = tl.cast(k, tl.int64)
            c0 = tl.cast(c0, tl.int64)
        shift = k * dilation
        t_ok = (t_base >= -shift) & (t_base < L_in - shift)  # causal zeros and the tail come from masks
        c_ok = offs_c < Cg - c0
        a = tl.load(
            a_ptrs + (shift * stride_xt + c0 * stride_xc), mask=t_ok[:, None] & c_ok[None, :], other=0.0
        )
        w_off = k * stride_wk + c0
        w_mask = c_ok[:, None] & o_mask[None, :]
        b = tl.load(w_ptrs + w_off, mask=w_mask, other=0.0)
        if PREC == 0:
            a = a.to(tl.float32)
            if RECENTER:  # exact where x is near its level (the case it is for); masked zeros become -level
                lv = _level(lv_ptrs + c0 * stride_xc, t_lvl, lv_min, dilation, stride_xt, L_in, c_ok, 1)
                a = a - lv[None, :]
            acc = _dot_fp32(a, b, wlo_ptrs + w_off, w_mask, acc, A_SPLIT, W_SPLIT, FLUSH)
        elif PREC == 1:
            # x as loaded (no rounding in registers): the launcher's pre-pass already rounded float32 x to
            # TF32 (ties to even), so the tensor core's truncation to TF32 changes nothing, and an operand
            # straight from memory stays in shared memory (async copies pipelined ahead, wgmma reading both
            # operands from shared memory). Weights were rounded once per call.
            acc = tl.dot(a.to(tl.float32), b, acc, input_precision="tf32")
        else:
            # float16 x (the launcher's pre-cast copy, or float16 input) goes to shared memory as loaded.
            acc = tl.dot(a.to(tl.float16), b, acc)

    if RECENTER:  # + sum over channels of level * tap sum (float64 [O, Cg]; see _tap_sums), on the CUDA cores
        addback = tl.full((BLOCK_O,), 0.0, tl.float64)
        for c0 in range(0, Cg, BLOCK_C):
            c_ok = offs_c < Cg - c0
            lv = _level(lv_ptrs + c0 * stride_xc, t_lvl, lv_min, dilation, stride_xt, L_in, c_ok, 1)
            s_ptrs = s_ptr + (g * Og + offs_o)[None, :].to(tl.int64) * Cg + (c0 + offs_c)[:, None]
            s = tl.load(s_ptrs, mask=c_ok[:, None] & o_mask[None, :], other=0.0)
            addback += tl.sum(s * lv.to(tl.float64)[:, None], axis=0)
        acc = acc + addback.to(tl.float32)[None, :]
    if HAS_BIAS:
        bias = tl.load(b_ptr + g * Og + offs_o, mask=o_mask, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    acc = _activate(acc, ACT)
    y_ptrs = (
        y_ptr
        + n.to(tl.int64) * stride_yn
        + (g * Og).to(tl.int64) * stride_yo
        + offs_o[None, :] * stride_yo
        + offs_t[:, None] * stride_yt
    )
    tl.store(y_ptrs, acc, mask=(offs_t < L_out)[:, None] & o_mask[None, :])


@triton.jit
def _tma_conv_tile(
    x_desc, w_desc, w_ptrs, n, t0, o0, pad, dilation, K, C, O, offs_c, o_mask, stride_wk,
    PREC: tl.constexpr, W_TMA: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """The [BLOCK_T, BLOCK_O] conv tile of series ``n`` from step ``t0`` and output channel ``o0`` with x loaded
    by the TMA ("tf32" / "fp16"; shared by the conv and the fused conv -> head TMA kernels). ``W_TMA``: weight
    tiles through ``w_desc`` over the packed [K * O, C padded] view, else masked loads at ``w_ptrs``."""
    acc = tl.full((BLOCK_T, BLOCK_O), 0.0, tl.float32)
    n_cb = (C + BLOCK_C - 1) // BLOCK_C
    for it in range(0, K * n_cb):  # taps fastest, as in the pointer kernel
        k = it % K
        c0 = (it // K) * BLOCK_C
        a = x_desc.load([n, t0 - pad + k * dilation, c0]).reshape(BLOCK_T, BLOCK_C)
        if W_TMA:
            # rows past O belong to the next tap (or are zero-filled after the last): they only feed output
            # columns >= O, which callers never store; channels past C are zero (padding, then zero-fill)
            b = w_desc.load([k * O + o0, c0]).T
        else:
            w_mask = (offs_c < C - c0)[:, None] & o_mask[None, :]
            b = tl.load(w_ptrs + (k * stride_wk + c0), mask=w_mask, other=0.0)
        if PREC == 1:
            acc = tl.dot(a, b, acc, input_precision="tf32")
        else:
            acc = tl.dot(a.to(tl.float16), b, acc)
    return acc


@triton.jit(do_not_specialize=["L_in", "L_out", "K", "dilation", "pad", "n_tblk", "n_oblk"])
def _conv1d_dense_tma_kernel(
    x_desc,
    w_desc,
    w_ptr,
    b_ptr,
    y_ptr,
    L_in,
    L_out,
    C,
    O,
    K,
    dilation,
    pad,
    n_tblk,
    n_oblk,
    stride_wk,
    stride_wo,
    stride_yn,
    stride_yo,
    stride_yt,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    PREC: tl.constexpr,
    W_TMA: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_C: tl.constexpr,
    GROUP_T: tl.constexpr,
):
    """The dense (groups = 1) "tf32" / "fp16" conv with x tiles loaded by the TMA (Hopper) from the
    time-major [N, L, C] input: a tap's [BLOCK_T, BLOCK_C] tile lands in shared memory and goes to wgmma from
    there; steps before the series start (the causal zeros), past its end and channels past C are zero-filled
    by the copy engine, so the loop has no masks on x. For "tf32" the descriptor rounds float32 x to TF32 on
    the way (no pre-pass). Weights ([K, O, C padded]): ``W_TMA`` loads [BLOCK_O, BLOCK_C] tiles through a
    descriptor over the [K * O, C padded] view, else masked pointer loads as in the pointer kernel."""
    pid = tl.program_id(0)
    per_n = n_tblk * n_oblk
    n = pid // per_n
    pid_t, pid_o = _grouped(pid % per_n, n_tblk, n_oblk, GROUP_T)

    t0 = pid_t * BLOCK_T
    offs_o = pid_o * BLOCK_O + tl.arange(0, BLOCK_O)
    offs_c = tl.arange(0, BLOCK_C)
    o_mask = offs_o < O
    w_ptrs = w_ptr + offs_o[None, :] * stride_wo + offs_c[:, None]

    acc = _tma_conv_tile(
        x_desc, w_desc, w_ptrs, n, t0, pid_o * BLOCK_O, pad, dilation, K, C, O, offs_c, o_mask, stride_wk,
        PREC, W_TMA, BLOCK_T, BLOCK_O, BLOCK_C,
    )  # fmt: skip

    offs_t = t0 + tl.arange(0, BLOCK_T)
    if HAS_BIAS:
        bias = tl.load(b_ptr + offs_o, mask=o_mask, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    acc = _activate(acc, ACT)
    y_ptrs = (
        y_ptr
        + n.to(tl.int64) * stride_yn
        + offs_o.to(tl.int64)[None, :] * stride_yo
        + offs_t.to(tl.int64)[:, None] * stride_yt
    )
    tl.store(y_ptrs, acc, mask=(offs_t < L_out)[:, None] & o_mask[None, :])


@triton.jit
def _level(row0_ptrs, row, lv_min, dilation, stride_t, L_in, mask, SAMPLES: tl.constexpr):
    """The re-centering level of a block of outputs (``recenter=True``).

    ``row`` is the input row of the last tap of the block's first output (in "causal" padding that output's
    own step): the latest row no later than any of the block's outputs, so re-centering stays causal. With
    SAMPLES = 3 the level is the median of x at ``row``, ``row - d`` and ``row - 2d`` (d the dilation), so
    one spike (a volume print) is not taken for the level; SAMPLES = 1 reads ``row`` only (the dense
    kernels, where each extra read is one more load per pipelined step). Rows before ``lv_min`` are
    the caller's zero history (the engine's first step; ``conv1d(recenter_from=)``): samples there move to
    ``lv_min``, the first row of data (outputs whose own step is before it are the history's, which the
    engine discards). A sample that is not finite counts as 0, so NaN and inf still reach exactly the
    outputs whose taps read them. ``row0_ptrs`` point at input row 0.
    """
    r = tl.maximum(row, lv_min)
    v = tl.load(row0_ptrs + r * stride_t, mask=mask & (r < L_in), other=0.0).to(tl.float32)
    v = tl.where(tl.abs(v) < float("inf"), v, 0.0)
    if SAMPLES == 3:
        r1 = tl.maximum(row - dilation, lv_min)
        v1 = tl.load(row0_ptrs + r1 * stride_t, mask=mask & (r1 < L_in), other=0.0).to(tl.float32)
        v1 = tl.where(tl.abs(v1) < float("inf"), v1, 0.0)
        r2 = tl.maximum(row - 2 * dilation, lv_min)
        v2 = tl.load(row0_ptrs + r2 * stride_t, mask=mask & (r2 < L_in), other=0.0).to(tl.float32)
        v2 = tl.where(tl.abs(v2) < float("inf"), v2, 0.0)
        v = tl.maximum(tl.minimum(v, v1), tl.minimum(tl.maximum(v, v1), v2))
    return v


@triton.jit
def _direct_tap(
    acc, x_ptrs, w_ptrs, k, t_base, x_live, gm_mask, dilation, stride_xt, stride_wk, lv, RECENTER: tl.constexpr
):  # fmt: skip
    """acc + one tap k of the depthwise/direct conv: x [BLOCK_T, BLOCK_G, 1] times w [BLOCK_G, BLOCK_M]."""
    shift = k * dilation
    xv = tl.load(x_ptrs + shift * stride_xt, mask=(t_base >= -shift)[:, None, None] & x_live, other=0.0)
    xv = xv.to(tl.float32)
    if RECENTER:
        xv = xv - lv  # a masked (zero-history) value becomes 0 - level, as it must
    # no other=: masked-off lanes only feed accumulators that are never stored
    wv = tl.load(w_ptrs + k * stride_wk, mask=gm_mask)
    return acc + xv * wv.to(tl.float32)[None, :, :]  # contracted to FMAs


@triton.jit(
    do_not_specialize=["L_in", "L_out", "K", "dilation", "pad", "lv_min", "n_tblk", "n_gblk", "n_mblk"]
)
def _conv1d_direct_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    s_ptr,
    y_ptr,
    L_in,
    L_out,
    G,
    K,
    dilation,
    pad,
    lv_min,
    n_tblk,
    n_gblk,
    n_mblk,
    stride_xn,
    stride_xc,
    stride_xt,
    stride_wc,
    stride_wk,
    stride_wm,
    stride_yn,
    stride_yo,
    stride_yt,
    CG: tl.constexpr,
    OG: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    INDEX64: tl.constexpr,
    RECENTER: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    UNROLL: tl.constexpr,
):
    # Program order: filter blocks fastest (same x), then groups, then time, then series.
    pid = tl.program_id(0)
    pid_m = pid % n_mblk
    rest = pid // n_mblk
    pid_g = rest % n_gblk
    rest = rest // n_gblk
    pid_t = rest % n_tblk
    n = rest // n_tblk

    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_g = pid_g * BLOCK_G + tl.arange(0, BLOCK_G)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if INDEX64:
        offs_t = offs_t.to(tl.int64)
        offs_g = offs_g.to(tl.int64)
        offs_m = offs_m.to(tl.int64)
    g_mask = offs_g < G
    m_mask = offs_m < OG
    t_base = offs_t - pad
    # Layout notes (checked on sm_90 TTGIR): x is loaded through a [BLOCK_T, BLOCK_G, 1] pointer tile, so its
    # coalesced layout (vectors along the contiguous channels) becomes the accumulator's layout with all
    # BLOCK_M filters of a channel in the same thread: each x value is loaded once per tap and feeds BLOCK_M
    # FMAs with no shuffling. The weights are rearranged to [CG, K, OG, G] (channels contiguous, like x) and
    # their [BLOCK_G, BLOCK_M] tile stays below one element per thread (the configs ensure it), so the
    # compiler reloads it in the accumulator's layout instead of shuffling it through shared memory.
    x_ptrs = (
        x_ptr
        + n.to(tl.int64) * stride_xn
        + t_base[:, None, None] * stride_xt
        + (offs_g * CG)[None, :, None] * stride_xc
    )
    w_ptrs = w_ptr + offs_m[None, :] * stride_wm + offs_g[:, None]  # [BLOCK_G, BLOCK_M]
    gm_mask = g_mask[:, None] & m_mask[None, :]
    # Lanes past L_out are never stored; masking them also keeps every tap's read below L_in (t < L_out
    # implies t - pad + k * dilation < L_in for both paddings), so the per-tap mask is the causal bound only.
    x_live = (offs_t < L_out)[:, None, None] & g_mask[None, :, None]

    acc = tl.full((BLOCK_T, BLOCK_G, BLOCK_M), 0.0, tl.float32)
    o = offs_g[:, None] * OG + offs_m[None, :]  # [BLOCK_G, BLOCK_M] output channels
    # recenter: each input channel's level is its value at the block's first output step (see _level)
    t_lvl = pid_t * BLOCK_T - pad + (K - 1) * dilation
    if INDEX64:
        t_lvl = t_lvl.to(tl.int64)
    lv_ptrs = x_ptr + n.to(tl.int64) * stride_xn + (offs_g * CG) * stride_xc
    addback = tl.full((BLOCK_G, BLOCK_M), 0.0, tl.float64)
    lv = tl.full((1, BLOCK_G, 1), 0.0, tl.float32)
    # Taps in chunks of UNROLL (a compile-time unroll: several taps' loads in flight before their FMAs), then
    # a tail of K % UNROLL single taps.
    k_main = K - K % UNROLL
    for ci in range(0, CG):
        if RECENTER:
            lv1 = _level(lv_ptrs, t_lvl, lv_min, dilation, stride_xt, L_in, g_mask, 3)
            lv = lv1[None, :, None]
            # the level times each filter's tap sum (float64 [O, CG]), added back before the bias
            s = tl.load(s_ptr + o * CG + ci, mask=gm_mask, other=0.0)
            addback += lv1.to(tl.float64)[:, None] * s
            lv_ptrs += stride_xc
        for k0 in range(0, k_main, UNROLL):
            for j in tl.static_range(UNROLL):
                kk = k0 + j
                if INDEX64:
                    kk = tl.cast(kk, tl.int64)
                acc = _direct_tap(
                    acc, x_ptrs, w_ptrs, kk, t_base, x_live, gm_mask, dilation, stride_xt, stride_wk, lv,
                    RECENTER,
                )  # fmt: skip
        if UNROLL > 1:
            for k in range(k_main, K):
                kk = k
                if INDEX64:
                    kk = tl.cast(k, tl.int64)
                acc = _direct_tap(
                    acc, x_ptrs, w_ptrs, kk, t_base, x_live, gm_mask, dilation, stride_xt, stride_wk, lv,
                    RECENTER,
                )  # fmt: skip
        x_ptrs += stride_xc
        w_ptrs += stride_wc

    if RECENTER:
        acc = acc + addback.to(tl.float32)[None, :, :]
    if HAS_BIAS:
        bias = tl.load(b_ptr + o, mask=gm_mask, other=0.0).to(tl.float32)
        acc = acc + bias[None, :, :]
    acc = _activate(acc, ACT)
    y_ptrs = (
        y_ptr + n.to(tl.int64) * stride_yn + o[None, :, :] * stride_yo + offs_t[:, None, None] * stride_yt
    )
    tl.store(y_ptrs, acc, mask=(offs_t < L_out)[:, None, None] & gm_mask[None, :, :])


@triton.jit
def _bank_tap(
    acc, x_ptrs, w_ptrs, k, t_base, x_live, gm_mask, dilation, stride_xt, stride_wk, lv, MASKED: tl.constexpr,
    RECENTER: tl.constexpr,
):  # fmt: skip
    """One tap of the bank kernel: the direct kernel's masked tap, or (interior) the same without masks."""
    if MASKED:
        return _direct_tap(
            acc, x_ptrs, w_ptrs, k, t_base, x_live, gm_mask, dilation, stride_xt, stride_wk, lv, RECENTER
        )
    xv = tl.load(x_ptrs + (k * dilation) * stride_xt).to(tl.float32)
    if RECENTER:
        xv = xv - lv
    return acc + xv * tl.load(w_ptrs + k * stride_wk)[None, :, :]


@triton.jit
def _bank_taps(acc, x_ptrs, w_ptrs, t_base, x_live, gm_mask, K, dilation, stride_xt, stride_wk, lv,
               MASKED: tl.constexpr, UNROLL: tl.constexpr, RECENTER: tl.constexpr):  # fmt: skip
    """acc + all K taps on one [BLOCK_T, BLOCK_G, BLOCK_M] time block, in chunks of UNROLL taps plus a tail.

    MASKED=False is the interior of the series (every tap's rows exist, whole channel and filter blocks):
    no masks, so no predicates or zero-filled registers in the loop."""
    k_main = K - K % UNROLL
    for k0 in range(0, k_main, UNROLL):
        for j in tl.static_range(UNROLL):
            acc = _bank_tap(
                acc, x_ptrs, w_ptrs, k0 + j, t_base, x_live, gm_mask, dilation, stride_xt, stride_wk, lv, MASKED,
                RECENTER,
            )  # fmt: skip
    for k in range(k_main, K):
        acc = _bank_tap(
            acc, x_ptrs, w_ptrs, k, t_base, x_live, gm_mask, dilation, stride_xt, stride_wk, lv, MASKED, RECENTER
        )  # fmt: skip
    return acc


@triton.jit(
    do_not_specialize=["L_in", "L_out", "K", "dilation", "pad", "lv_min", "n_tprog", "n_gblk", "n_mblk"]
)
def _conv1d_bank_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    s_ptr,
    y_ptr,
    L_in,
    L_out,
    G,
    K,
    dilation,
    pad,
    lv_min,
    n_tprog,
    n_gblk,
    n_mblk,
    stride_xn,
    stride_xc,
    stride_xt,
    stride_wk,
    stride_wm,
    stride_yn,
    stride_yo,
    stride_yt,
    OG: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    INDEX64: tl.constexpr,
    RECENTER: tl.constexpr,
    EVEN: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    T_ITERS: tl.constexpr,
    UNROLL: tl.constexpr,
):
    # One input channel per group (depthwise banks: groups = C, OG = M filters per channel). A program owns
    # BLOCK_G channels x BLOCK_M filters over T_ITERS consecutive time blocks of BLOCK_T steps; the blocks
    # inside the series (the most) run their taps without masks. Same tap order and arithmetic as
    # _conv1d_direct_kernel; the tuner picks between the two per shape class (on the H200 this one won the
    # 8-filter bank, 5.30 -> 3.81 ms at K = 64, and lost the 4-filter ones: benchmarks/NOTES.md).
    pid = tl.program_id(0)
    pid_m = pid % n_mblk
    rest = pid // n_mblk
    pid_g = rest % n_gblk
    rest = rest // n_gblk
    pid_t = rest % n_tprog
    n = rest // n_tprog

    offs_g = pid_g * BLOCK_G + tl.arange(0, BLOCK_G)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if INDEX64:
        offs_g = offs_g.to(tl.int64)
        offs_m = offs_m.to(tl.int64)
        stride_xt = stride_xt.to(tl.int64)  # the taps' offsets k * dilation * stride_xt
        stride_wk = stride_wk.to(tl.int64)
    g_mask = offs_g < G
    m_mask = offs_m < OG
    gm_mask = g_mask[:, None] & m_mask[None, :]
    x_base = x_ptr + n.to(tl.int64) * stride_xn + (offs_g * stride_xc)[None, :, None]
    w_ptrs = w_ptr + offs_m[None, :] * stride_wm + offs_g[:, None]  # weights [K, OG, G]: channels contiguous
    o = offs_g[:, None] * OG + offs_m[None, :]
    if HAS_BIAS:
        bias = tl.load(b_ptr + o, mask=gm_mask, other=0.0).to(tl.float32)
    if RECENTER:
        tap_sums = tl.load(s_ptr + o, mask=gm_mask, other=0.0)
    lv = tl.full((1, BLOCK_G, 1), 0.0, tl.float32)
    for it in range(T_ITERS):
        t0 = (pid_t * T_ITERS + it) * BLOCK_T
        if t0 < L_out:
            offs_t = t0 + tl.arange(0, BLOCK_T)
            if INDEX64:
                offs_t = offs_t.to(tl.int64)
            t_base = offs_t - pad
            x_ptrs = x_base + t_base[:, None, None] * stride_xt
            # tl.full, not tl.zeros (a jit function the interpreter cannot call when triton was imported before
            # TRITON_INTERPRET was set, as in benchmarks/conv1d.py --device cpu)
            acc = tl.full((BLOCK_T, BLOCK_G, BLOCK_M), 0.0, tl.float32)
            y_ptrs = (
                y_ptr
                + n.to(tl.int64) * stride_yn
                + o[None, :, :] * stride_yo
                + offs_t[:, None, None] * stride_yt
            )
            if EVEN:
                interior_end = L_out
            else:
                interior_end = 0  # ragged channel or filter blocks: every block takes the masked path
            x_live = (offs_t < L_out)[:, None, None] & g_mask[None, :, None]
            if RECENTER:  # the level: each channel's x at this block's first output step (see _level)
                lv = _level(
                    x_base,
                    t0 - pad + (K - 1) * dilation,
                    lv_min,
                    dilation,
                    stride_xt,
                    L_in,
                    g_mask[None, :, None],
                    3,
                )
            if (t0 >= pad) & (t0 + BLOCK_T <= interior_end):
                acc = _bank_taps(
                    acc,
                    x_ptrs,
                    w_ptrs,
                    t_base,
                    x_live,
                    gm_mask,
                    K,
                    dilation,
                    stride_xt,
                    stride_wk,
                    lv,
                    False,
                    UNROLL,
                    RECENTER,
                )
            else:
                # lanes past L_out are never stored and keep every tap's read below L_in (see the direct kernel)
                acc = _bank_taps(
                    acc,
                    x_ptrs,
                    w_ptrs,
                    t_base,
                    x_live,
                    gm_mask,
                    K,
                    dilation,
                    stride_xt,
                    stride_wk,
                    lv,
                    True,
                    UNROLL,
                    RECENTER,
                )
            if RECENTER:
                acc = acc + (lv.to(tl.float64) * tap_sums[None, :, :]).to(tl.float32)
            if HAS_BIAS:
                acc = acc + bias[None, :, :]
            tl.store(y_ptrs, _activate(acc, ACT), mask=(offs_t < L_out)[:, None, None] & gm_mask[None, :, :])


def _kernels_interpreted() -> bool:
    return type(_conv1d_dense_kernel).__name__ == "InterpretedFunction"


# True when TRITON_INTERPRET=1 was set before import: CPU tensors then run the Triton kernels.
_INTERPRETED = _kernels_interpreted()


# --------------------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    N: int
    C: int
    L: int
    O: int
    K: int
    groups: int
    dilation: int
    causal: bool
    L_out: int
    act: int
    precision: str
    recenter: bool = False
    recenter_from: int = 0


def _int_arg(name: str, value: object) -> int:
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # int, numpy integers
        except TypeError:
            pass
    msg = f"{name} must be an int, got {value!r} ({type(value).__name__})."
    raise ShapeError(msg, hint=f"pass {name} as a Python int.")


def _validate(
    x: object,
    weight: object,
    bias: object,
    out: object,
    *,
    dilation: object,
    groups: object,
    padding: object,
    activation: object,
    precision: object,
    recenter: object = False,
    recenter_from: object = 0,
) -> _Spec:
    if not isinstance(x, torch.Tensor):
        raise ShapeError(
            f"x must be a torch.Tensor, got {type(x).__name__}.", hint="pass a [N, C, L] tensor."
        )
    if not isinstance(weight, torch.Tensor):
        msg = f"weight must be a torch.Tensor, got {type(weight).__name__}."
        raise ShapeError(msg, hint="pass a [O, C/groups, K] tensor.")
    if x.dim() != 3:
        msg = f"x must be [N, C, L] (3 dims), got shape {_shape(x)}."
        raise ShapeError(
            msg,
            hint="for a time-major [N, L, C] buffer pass buf.transpose(1, 2); for one series use x[None].",
        )
    if weight.dim() != 3:
        msg = f"weight must be [O, C/groups, K] (3 dims), got shape {_shape(weight)}."
        raise ShapeError(msg, hint="for a depthwise bank of M filters per channel use shape [C*M, 1, K].")
    if x.dtype not in _X_DTYPES:
        msg = f"x must be float32, float16 or bfloat16, got {x.dtype}."
        raise ShapeError(msg, hint="convert with x.float().")
    if weight.dtype not in _W_DTYPES:
        msg = f"weight must be float16 or float32 (or bfloat16), got {weight.dtype}."
        raise ShapeError(msg, hint="store filter banks as float16 or float32.")
    if x.device.type not in ("cuda", "cpu"):
        msg = f"x must be on a CUDA device or the CPU, got {x.device}."
        raise ShapeError(msg, hint="move it with x.cuda() or x.cpu().")
    if weight.device != x.device:
        msg = f"weight is on {weight.device} but x is on {x.device}."
        raise ShapeError(msg, hint="move the weights to x's device with weight.to(x.device).")

    dilation = _int_arg("dilation", dilation)
    groups = _int_arg("groups", groups)
    N, C, L = x.shape
    O, Cg, K = weight.shape
    if dilation < 1:
        raise ShapeError(f"dilation must be >= 1, got {dilation}.", hint="use dilation=1 for adjacent taps.")
    if groups < 1:
        raise ShapeError(f"groups must be >= 1, got {groups}.", hint="use groups=1 for a dense conv.")
    if K < 1:
        raise ShapeError(f"weight must have at least one tap, got shape {_shape(weight)}.", hint="K >= 1.")
    if C % groups != 0:
        msg = f"groups={groups} must divide the input channels C={C} of x {_shape(x)}."
        raise ShapeError(msg, hint="use groups=C for a depthwise conv, or a divisor of C.")
    if O % groups != 0:
        msg = f"groups={groups} must divide the output channels O={O} of weight {_shape(weight)}."
        raise ShapeError(msg, hint="a depthwise bank of M filters per channel has O = C*M rows.")
    if Cg != C // groups:
        msg = (
            f"weight must be [O, C/groups, K] = [{O}, {C // groups}, {K}] for x with C={C} and "
            f"groups={groups}, got {_shape(weight)}."
        )
        raise ShapeError(msg, hint="check groups; a depthwise weight is [C*M, 1, K] with groups=C.")

    if padding not in PADDINGS:
        raise ShapeError(
            f"padding must be 'causal' or 'valid', got {padding!r}.", hint="use padding='causal'."
        )
    causal = padding == "causal"
    L_out = L if causal else L - (K - 1) * dilation
    if not causal and L_out < 1:
        msg = f"padding='valid' needs L >= (K-1)*dilation + 1 = {(K - 1) * dilation + 1} steps, x has L={L}."
        raise ShapeError(msg, hint="pass a longer input (with its halo) or use padding='causal'.")
    if not is_activation(activation):
        msg = f"activation must be one of None, 'none', 'relu', 'gelu', 'tanh', got {activation!r}."
        raise ShapeError(msg, hint="use activation=None for a plain conv.")
    if precision not in PRECISIONS:
        msg = f"precision must be 'fp32', 'tf32' or 'fp16', got {precision!r}."
        raise ShapeError(msg, hint="'fp32' is the default and the only mode fit for raw price levels.")
    if not isinstance(recenter, bool):
        raise ShapeError(f"recenter must be True or False, got {recenter!r}.", hint="pass recenter=True.")
    recenter_from = _int_arg("recenter_from", recenter_from)
    if recenter_from < 0:
        msg = f"recenter_from must be >= 0 (an input row), got {recenter_from}."
        raise ShapeError(msg, hint="pass the number of zero-history rows at the start of x, or 0.")
    if recenter and precision != "fp32":
        msg = f"recenter=True is for precision='fp32', got precision={precision!r}."
        raise ShapeError(
            msg, hint="use precision='fp32' (the tensor-core modes are unfit for raw levels anyway)."
        )

    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise ShapeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}.", hint="[O].")
        if bias.dim() != 1 or bias.shape[0] != O:
            raise ShapeError(
                f"bias must be [O] = [{O}], got {_shape(bias)}.", hint="one bias per output channel."
            )
        if bias.dtype not in _W_DTYPES:
            raise ShapeError(f"bias must be a float tensor, got {bias.dtype}.", hint="use bias.float().")
        if bias.device != x.device:
            raise ShapeError(f"bias is on {bias.device} but x is on {x.device}.", hint="bias.to(x.device).")

    if out is not None:
        check_out(
            out,
            shape=(N, O, L_out),
            expected=f"[N, O, L_out] = {(N, O, L_out)} ({padding} padding)",
            shape_hint="for a time-major [N, L, O] buffer pass buf.transpose(1, 2).",
            view_example="buf.transpose(1, 2)",
            owner=("x", x),
            inputs={"x": x, "weight": weight, "bias": bias},
        )

    return _Spec(
        N,
        C,
        L,
        O,
        K,
        groups,
        dilation,
        causal,
        L_out,
        _ACT_CODE[activation],
        precision,
        recenter,
        recenter_from,
    )


# --------------------------------------------------------------------------------------------------------
# public entry point
# --------------------------------------------------------------------------------------------------------


def conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    dilation: int = 1,
    groups: int = 1,
    padding: str = "causal",
    activation: str | None = None,
    precision: str = "fp32",
    out: torch.Tensor | None = None,
    recenter: bool = False,
    recenter_from: int = 0,
    tap_sums: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal conv1d with fused bias and activation; returns the float32 [N, O, L_out] result.

    Args:
        x: [N, C, L] float32 (float16, bfloat16 accepted) with any strides, e.g. ``buf.transpose(1, 2)`` of a
            time-major [N, L, C] buffer.
        weight: [O, C/groups, K] float16 or float32 (bfloat16 accepted); used at its stored values (upcast
            exactly; in precision "fp16" float32 weights are rounded to float16).
        bias: optional [O] added before the activation.
        dilation: spacing between taps (>= 1).
        groups: 1 for dense, C for depthwise banks (O = M*C, output channel c*M + m is filter m of input
            channel c), or any divisor of C and O.
        padding: "causal" (output length L; the value at step t depends on steps t-(K-1)*dilation .. t, with
            zeros before the first step) or "valid" (length L - (K-1)*dilation: no padding).
        activation: None/"none", "relu", "gelu" (exact erf form) or "tanh".
        precision: "fp32" (default; float32-accurate via a 3xTF32 split on tensor cores), or the opt-in
            tensor-core modes "tf32" and "fp16" (10-bit mantissas: unfit for raw price levels, where a 0.05
            move at 100 is below their resolution; fine on normalised returns). Depthwise and
            few-channel-per-group convs compute in float32 in every mode.
        out: optional float32 [N, O, L_out] destination with any non-overlapping strides, e.g. the
            ``transpose(1, 2)`` view of a time-major [N, L_out, O] buffer. Without it, the result is
            allocated time-major when ``x`` is a time-major view (channel stride 1) and contiguous otherwise.
        recenter: for raw levels (prices) through zero-sum or near-zero-sum filters, with "fp32": each block
            of outputs computes ``conv(x - v) + v * (sum of taps)`` with ``v`` a level of the channel read at
            the block's first output step (the median of that step and the two taps before it for depthwise
            and few-channel convs, that step alone for dense ones; causal, and skipped where not finite), so
            the float32 rounding scales with the moves within a block's reach instead of with the level or
            its drift. 3-19% more time on the H200 (benchmarks/results/recenter_cost.md); the Triton kernels
            only (the torch path on CPU tensors computes as ``F.conv1d``).
        recenter_from: with ``recenter``, the number of rows at the start of ``x`` that are zero history
            rather than data (the engine's first step passes its history rows this way); levels are never
            read there. Default 0.
        tap_sums: with ``recenter``, float64 [O, C/groups]: the per-filter sums over taps that the level is
            added back with (default: the stored weight's own). Pass the sums of the weights as given
            before rounding them to float16, so that the rounding does not add level x (rounded sum - true
            sum) to every output.

    The call is asynchronous on CUDA (the current stream of ``x``'s device) and not differentiable. The first
    call for a new shape class on a GPU tunes the block shapes (several launches into ``out``, a few seconds;
    the winner is cached on disk), so make it before any CUDA graph capture. ``out`` must not share memory
    with ``x``, ``weight`` or ``bias``.

    Raises:
        ShapeError: a shape, dtype, device, stride or option that does not fit.
    """
    options = (dilation, groups, padding, activation, precision, recenter, recenter_from)
    key = _plan_key(x, weight, bias, out, options, tap_sums)
    if key is not None:
        y = _planned(key, x, weight, bias, out, tap_sums)
        if y is not None:
            return y
    spec = _validate(
        x,
        weight,
        bias,
        out,
        dilation=dilation,
        groups=groups,
        padding=padding,
        activation=activation,
        precision=precision,
        recenter=recenter,
        recenter_from=recenter_from,
    )
    _check_tap_sums(tap_sums, weight, spec)
    if out is None:
        out = _allocate_out(x, spec)
    if out.numel() == 0:
        return out
    with torch.no_grad():
        if x.is_cuda:
            if key is not None:  # x is on the current device (_plan_key)
                _conv1d_triton(x, weight, bias, out, spec, plan_key=key, tap_sums=tap_sums)
            else:
                with torch.cuda.device(x.device):  # Triton launches on the current device and stream
                    _conv1d_triton(x, weight, bias, out, spec, tap_sums=tap_sums)
        elif _INTERPRETED:
            _conv1d_triton(x, weight, bias, out, spec, plan_key=key, tap_sums=tap_sums)
        else:
            _conv1d_torch(x, weight, bias, out, spec)
    return out


def _allocate_out(x: torch.Tensor, spec: _Spec) -> torch.Tensor:
    if x.stride(1) == 1 and x.stride(2) != 1 and spec.O > 1:
        return torch.empty((spec.N, spec.L_out, spec.O), dtype=torch.float32, device=x.device).transpose(1, 2)
    return torch.empty((spec.N, spec.O, spec.L_out), dtype=torch.float32, device=x.device)


def _conv1d_torch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor, spec: _Spec
) -> None:
    xf = x.float()
    if spec.causal and spec.K > 1:
        xf = F.pad(xf, ((spec.K - 1) * spec.dilation, 0))
    b = None if bias is None else bias.float()
    y = F.conv1d(xf, weight.float(), b, dilation=spec.dilation, groups=spec.groups)
    out.copy_(apply_activation(y, _ACT_NAME[spec.act]))


# --------------------------------------------------------------------------------------------------------
# Triton launchers
# --------------------------------------------------------------------------------------------------------


def _max_offset(t: torch.Tensor) -> int:
    return sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True) if s > 0)


def _layout(t: torch.Tensor) -> str:
    """'tm' for time-major views (channel stride 1), 'cm' for channel-major (time stride 1), else 'st'."""
    if t.stride(1) == 1:
        return "tm"
    if t.stride(2) == 1:
        return "cm"
    return "st"


def _round_tf32_torch(w: torch.Tensor) -> torch.Tensor:
    """Round float32 to the nearest TF32 value, as ``_round_tf32`` does in the kernels."""
    bits = w.contiguous().view(torch.int32)
    return ((bits + 0x1000) & -8192).view(torch.float32)


def _dense_order(t: torch.Tensor) -> list[int]:
    """``t``'s dimensions from outermost to innermost in memory (size-1 dimensions, whose stride is arbitrary,
    first); the last one is the unit-stride dimension of a dense tensor."""
    return sorted(range(t.dim()), key=lambda d: (t.shape[d] != 1, -t.stride(d), d))


def _tf32_buffer(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised dense float32 tensor shaped like ``t`` (2-D or 3-D) with its dimensions in the memory
    order of ``t``'s strides: a time-major view gets a time-major buffer, so the kernel reading the rounded
    copy sees the same layout (and autotune key) as it would for ``t``."""
    order = _dense_order(t)
    buf = torch.empty([t.shape[d] for d in order], dtype=torch.float32, device=t.device)
    return buf.permute([order.index(d) for d in range(t.dim())])


def _round_tf32_into(src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst = src`` rounded to TF32 (ties to even; see ``_round_tf32_rne``): one pass reading ``src`` through
    its strides and writing ``dst`` (same shape, 2-D or 3-D, from :func:`_tf32_buffer`). Memory-bound: one
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
    _check_grid(grid[0])
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


def _check_tap_sums(tap_sums: object, weight: torch.Tensor, spec: _Spec) -> None:
    if tap_sums is None:
        return
    if not spec.recenter:
        raise ShapeError("tap_sums is for recenter=True.", hint="pass recenter=True, or leave tap_sums out.")
    want = (spec.O, spec.C // spec.groups)
    if (
        not isinstance(tap_sums, torch.Tensor)
        or tuple(tap_sums.shape) != want
        or tap_sums.dtype != torch.float64
        or tap_sums.device != weight.device
        or not tap_sums.is_contiguous()
    ):
        got = _shape(tap_sums) if isinstance(tap_sums, torch.Tensor) else type(tap_sums).__name__
        raise ShapeError(
            f"tap_sums must be a contiguous float64 tensor of shape {list(want)} on {weight.device}, got {got}.",
            hint="pass weight.double().sum(dim=2) of the weights as given.",
        )


def _recenter_sums(weight: torch.Tensor, tap_sums: torch.Tensor | None) -> torch.Tensor:
    """The tap sums the level is added back with: the caller's, else the stored weight's own."""
    return tap_sums if tap_sums is not None else _tap_sums(weight)


def _tap_sums(weight: torch.Tensor) -> torch.Tensor:
    """float64 [O, C/groups], contiguous: each filter's sum over taps, which ``recenter`` multiplies by the
    level it subtracted. float64, and the add-back summed in float64: a dense filter that is zero-sum over
    channels and taps together has per-channel tap sums that cancel only across channels, and float32 sums
    of level-sized terms would bring back the very error recentering removes (measured in the interpreter)."""
    return _WEIGHTS.get(weight, ("tap_sums",), lambda w: w.double().sum(dim=2).contiguous())


def _uses_gemm(Cg: int, Og: int) -> bool:
    """Tensor cores need at least 16 reduction and 16 output channels per group to pay off."""
    return Cg >= 16 and Og >= 16


def _conv1d_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    spec: _Spec,
    *,
    config: autotune.Config | None = None,
    plan_key: tuple | None = None,
    tap_sums: torch.Tensor | None = None,
) -> object:
    """Run the Triton path; ``config`` (tests only) bypasses the tuner and fixes the block shapes.
    ``plan_key``: record the launch as a plan under this key (see :func:`_planned`).

    Returns what the last kernel launch returned (on a GPU the compiled kernel, whose ``asm`` holds its IR).
    """
    Cg, Og = spec.C // spec.groups, spec.O // spec.groups
    b = None if bias is None else bias.contiguous()
    if _uses_gemm(Cg, Og):
        return _launch_dense(x, weight, b, out, spec, config, plan_key=plan_key, tap_sums=tap_sums)
    return _launch_direct(x, weight, b, out, spec, config, plan_key=plan_key, tap_sums=tap_sums)


def _prepare_dense_weights(
    weight: torch.Tensor, groups: int, precision: str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[O, Cg, K] -> [groups, K, O/groups, Cg padded to 16], contiguous along the reduction (Cg).

    fp32/tf32: float32, rounded to TF32 (exact for float16/bfloat16 weights); for "fp32" with float32 weights
    also the TF32-rounded remainder (the 3xTF32 low part). fp16: float16.
    """
    O, Cg, K = weight.shape
    Og = O // groups
    cg_pad = -(-Cg // 16) * 16
    dtype = torch.float16 if precision == "fp16" else torch.float32
    wp = torch.zeros((groups, K, Og, cg_pad), dtype=dtype, device=weight.device)
    wp[..., :Cg] = weight.reshape(groups, Og, Cg, K).permute(0, 3, 1, 2)
    if precision == "fp16":
        return wp, None
    hi = _round_tf32_torch(wp)
    lo = None
    if precision == "fp32" and weight.dtype == torch.float32:
        lo = _round_tf32_torch(wp - hi)
    return hi, lo


def _launch_dense(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    spec: _Spec,
    config: autotune.Config | None,
    *,
    plan_key: tuple | None = None,
    tap_sums: torch.Tensor | None = None,
) -> object:
    G, K = spec.groups, spec.K
    Cg, Og = spec.C // G, spec.O // G
    w_hi, w_lo = _dense_weights(weight, spec)
    stride_wk, stride_wo = w_hi.stride(1), w_hi.stride(2)
    # "tf32": float32 x rounded to TF32 by a pre-pass (float16 / bfloat16 x is exact in TF32). Why a
    # pre-pass and not rounding in registers before tl.dot: the A tile of every (tap, channel block) step
    # goes to wgmma straight from shared memory (async copies pipelined ahead); an elementwise op between
    # the load and the dot would route it through registers on every step, and each x value is loaded
    # K * n_oblk times (once per tap and output-channel block), so it would be rounded K * n_oblk times and
    # lose the shared-memory operand path that run 3 gained (tf32 K=16 0.72x -> 0.91x cuDNN). The pre-pass
    # costs one read and one write of x (memory-bound, ~8% of a chunk batch's conv) and leaves the kernel
    # as it was: the tensor core's truncation of an already rounded value drops nothing. Rounding errors are
    # within +-1/2 ulp instead of truncation's [0, 1) ulp: half the RMS error on normalised returns.
    round_x = spec.precision == "tf32" and x.dtype == torch.float32 and _ROUND_X_TF32
    # the pre-cast float16 copy / the rounded float32 copy are dense: their offsets reach numel - 1
    cast_numel = spec.N * spec.L * spec.C if (spec.precision == "fp16" or round_x) else 0
    index64 = _FORCE_INDEX64 or max(_max_offset(x), _max_offset(out), w_hi.numel(), cast_numel) > _INT32_MAX
    pad = (K - 1) * spec.dilation if spec.causal else 0
    meta = {
        "HAS_BIAS": bias is not None,
        "ACT": spec.act,
        "PREC": _PREC_CODE[spec.precision],
        # x minus a level is not TF32-exact even for float16 x: recentering always splits
        "A_SPLIT": _A_SPLIT if x.dtype == torch.float32 or spec.recenter else 1,
        "W_SPLIT": w_lo is not None,
        "FLUSH": _FLUSH,
        "INDEX64": index64,
        "RECENTER": spec.recenter,
    }
    sums = _recenter_sums(weight, tap_sums) if spec.recenter else w_hi

    cast: dict[str, torch.Tensor] = {}
    recorded: dict[str, object] = {}

    def launch(cfg: autotune.Config) -> object:
        kw = cfg.launch_kwargs()
        kw.setdefault("GROUP_T", 1)
        a16 = kw.pop("A16", 0) and spec.precision == "fp16" and x.dtype != torch.float16
        use_tma = kw.pop("TMA", 0)
        x_k = x
        prep = _PREP_NONE
        if a16:
            if "x" not in cast:
                cast["x"] = _a16_buffer(x, spec)
            x_k = cast["x"]
            x_k.copy_(x)
            prep = _PREP_A16
        if use_tma:
            return launch_tma(x_k, kw, prep)
        if round_x and not a16:  # in every launch, so the tuner's timings include it (all tf32 configs alike)
            if "x" not in cast:
                cast["x"] = _tf32_buffer(x)
            x_k = cast["x"]
            _round_tf32_into(x, x_k)
            prep = _PREP_ROUND
        n_tblk = triton.cdiv(spec.L_out, kw["BLOCK_T"])
        n_oblk = triton.cdiv(Og, kw["BLOCK_O"])
        grid = (spec.N * n_tblk * G * n_oblk,)
        _check_grid(grid[0])
        sx = x_k.stride()
        so = out.stride()
        args = {
            "x_ptr": x_k,
            "w_ptr": w_hi,
            "wlo_ptr": w_hi if w_lo is None else w_lo,
            "b_ptr": w_hi if bias is None else bias,
            "s_ptr": sums,
            "y_ptr": out,
            "L_in": spec.L,
            "L_out": spec.L_out,
            "G": G,
            "Cg": Cg,
            "Og": Og,
            "K": K,
            "dilation": spec.dilation,
            "pad": pad,
            "lv_min": spec.recenter_from,
            "n_tblk": n_tblk,
            "n_oblk": n_oblk,
            "stride_xn": sx[0],
            "stride_xc": sx[1],
            "stride_xt": sx[2],
            "stride_wk": stride_wk,
            "stride_wo": stride_wo,
            "stride_yn": so[0],
            "stride_yo": so[1],
            "stride_yt": so[2],
            **meta,
            **kw,
        }
        recorded.update(prep=prep, tma=None)
        return launch_recorded(recorded, _conv1d_dense_kernel, grid, (), args)

    def launch_tma(x_k: torch.Tensor, kw: dict[str, int], prep: int) -> object:
        bt, bo, bc = kw.pop("BLOCK_T"), kw.pop("BLOCK_O"), kw.pop("BLOCK_C")
        round_tf32 = spec.precision == "tf32" and x_k.dtype == torch.float32
        w_tma = bool(kw.pop("W_TMA", 0))
        blocks = ([1, bt, bc], [bo, bc] if w_tma else None, round_tf32)
        x_desc, w_desc = _dense_descriptors(x_k, w_hi, blocks)
        n_tblk = triton.cdiv(spec.L_out, bt)
        n_oblk = triton.cdiv(Og, bo)
        grid = (spec.N * n_tblk * n_oblk,)
        _check_grid(grid[0])
        so = out.stride()
        args = {
            "x_desc": x_desc,
            "w_desc": w_desc,
            "w_ptr": w_hi,
            "b_ptr": w_hi if bias is None else bias,
            "y_ptr": out,
            "L_in": spec.L,
            "L_out": spec.L_out,
            "C": spec.C,
            "O": spec.O,
            "K": K,
            "dilation": spec.dilation,
            "pad": pad,
            "n_tblk": n_tblk,
            "n_oblk": n_oblk,
            "stride_wk": stride_wk,
            "stride_wo": stride_wo,
            "stride_yn": so[0],
            "stride_yo": so[1],
            "stride_yt": so[2],
            "HAS_BIAS": bias is not None,
            "ACT": spec.act,
            "PREC": _PREC_CODE[spec.precision],
            "W_TMA": w_tma,
            "BLOCK_T": bt,
            "BLOCK_O": bo,
            "BLOCK_C": bc,
            **kw,
        }
        recorded.update(prep=prep, tma=blocks)
        return launch_recorded(recorded, _conv1d_dense_tma_kernel, grid, (), args)

    if config is None:
        use_tma = _dense_tma_ok(x, spec) and not spec.recenter
        space = autotune.conv1d_dense_space(spec.precision, K, Cg, Og, tma=use_tma)
        key = (
            f"{spec.precision}|x={_dtype_name(x)}|w={_dtype_name(weight)}|in={_layout(x)}|out={_layout(out)}"
            f"|G={'1' if G == 1 else 'n'}|Cg={autotune.pow2_bucket(Cg)}|Og={autotune.pow2_bucket(Og)}"
            f"|K={autotune.pow2_bucket(K)}|NL={autotune.pow2_bucket(spec.N * spec.L_out)}"
        )
        config = autotune.select(space, key, launch, device=x.device, interpreted=_INTERPRETED)
    last_launch.update(path="dense", config=config.name)
    ret = launch(config)
    if plan_key is not None:
        slots = _TMA_SLOTS if recorded["tma"] is not None else _POINTER_SLOTS
        plan = LaunchPlan(recorded["fn"], recorded["ret"], recorded["grid"], recorded["args"], slots)
        extents = (extent(out), extent(x), extent(weight), extent(bias))
        entry = _ConvPlan(plan, "dense", config.name, spec, extents, None, recorded["prep"], recorded["tma"])
        _PLANS.put(plan_key, entry)
    return ret


def _dense_weights(weight: torch.Tensor, spec: _Spec) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The dense kernels' weights for this call (:func:`_prepare_dense_weights`, cached per weight tensor)."""
    G, precision = spec.groups, spec.precision
    return _WEIGHTS.get(weight, ("dense", G, precision), lambda w: _prepare_dense_weights(w, G, precision))


def _a16_buffer(x: torch.Tensor, spec: _Spec) -> torch.Tensor:
    """An uninitialised float16 [N, C, L] view of a time-major buffer, rows padded to 16 bytes.

    The "fp16" A16 configs cast x into it in one bandwidth-bound pass; the kernel then reads half the bytes
    and both tl.dot operands go to shared memory as loaded (no conversion in registers). The padding lets a
    TMA descriptor read the copy whatever C is."""
    c_pad = -(-spec.C // 8) * 8
    buf = torch.empty((spec.N, spec.L, c_pad), dtype=torch.float16, device=x.device)
    return buf[..., : spec.C].transpose(1, 2)


def _dense_descriptors(x_k: torch.Tensor, w_hi: torch.Tensor, blocks: tuple) -> tuple[object, object]:
    """The TMA kernel's x descriptor (over the time-major view of ``x_k``) and weight operand: a descriptor
    over the [K * O, C padded] view of the packed weights, or the packed weights themselves (pointer loads)."""
    x_block, w_block, round_tf32 = blocks
    x_desc = tma.descriptor(x_k.transpose(1, 2), x_block, round_tf32=round_tf32)
    if w_block is None:
        return x_desc, w_hi
    K, Og = w_hi.shape[1], w_hi.shape[2]
    return x_desc, tma.descriptor(w_hi.view(K * Og, w_hi.shape[-1]), w_block)


# --------------------------------------------------------------------------------------------------------
# launch plans: the repeated call's short path (tsconv.kernels.launch)
# --------------------------------------------------------------------------------------------------------

# A tf32 / fp16 dense call through the TMA kernel cost 0.12-0.30 ms of host time on the H200 hosts with the
# full path (validation, the tuner lookup, Triton's argument binding; benchmarks/NOTES.md, ninth session),
# more than its kernel for small batches; a plan replays the recorded launch with the call's tensors.
_PREP_NONE, _PREP_A16, _PREP_ROUND = 0, 1, 2
_POINTER_SLOTS = ("x_ptr", "w_ptr", "wlo_ptr", "b_ptr", "s_ptr", "y_ptr")
_DIRECT_SLOTS = ("x_ptr", "w_ptr", "b_ptr", "s_ptr", "y_ptr")  # the direct, bank and window kernels
_TMA_SLOTS = ("x_desc", "w_desc", "w_ptr", "b_ptr", "y_ptr")
_PLANS = PlanCache(64)
autotune.on_clear(_PLANS.clear)  # plans embody the tuner's winners
_PLANS_ENABLED = plans_enabled_by_env()


@dataclass(frozen=True)
class _ConvPlan:
    plan: LaunchPlan
    path: str  # last_launch's path: "dense", "direct", "bank" or "window"
    config: str
    spec: _Spec
    extents: tuple[int, int, int, int]  # byte extents of (out, x, weight, bias): see launch.extent
    # direct, bank and window kernels: weight tensor -> the kernel's packed copy (cached per tensor)
    pack: Callable[[torch.Tensor], torch.Tensor] | None = None
    prep: int = 0  # dense: _PREP_*, the pass that makes the kernel's copy of x, if any
    tma: tuple | None = None  # dense: (x block, weight block or None, round_tf32) for the TMA kernel


def _plan_key(
    x: object, weight: object, bias: object, out: object, options: tuple, tap_sums: object = None
) -> tuple | None:
    """Everything validation, the tuner's key and the kernels' specialization read from a call, or None (no
    plan: plans off, x not a plain tensor on the current CUDA device or interpreted on the CPU).

    Equal keys pass or fail the same checks, except the pointer-dependent overlap of ``out`` with the inputs
    that :func:`_planned` repeats. Option values are keyed with their types, so ``dilation=True`` does not
    share ``dilation=1``'s plan (validation refuses it)."""
    if not _PLANS_ENABLED or type(x) is not torch.Tensor or not isinstance(weight, torch.Tensor):
        return None
    if not (x.is_cuda or (_INTERPRETED and x.device.type == "cpu")):
        return None
    if x.is_cuda and x.device.index != torch.cuda.current_device():
        return None
    return (
        tensor_key(x),
        tensor_key(weight),
        tensor_key(bias) if isinstance(bias, torch.Tensor) else bias is None,
        tensor_key(out) if isinstance(out, torch.Tensor) else out is None,
        tuple((type(v), v) for v in options),
        tensor_key(tap_sums) if isinstance(tap_sums, torch.Tensor) else tap_sums is None,
        (_A_SPLIT, _FLUSH, _ROUND_X_TF32, _FORCE_INDEX64),  # module knobs the launch reads (tests set them)
    )


def _planned(
    key: tuple,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
    tap_sums: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Replay the launch recorded under ``key`` with this call's tensors; None when there is none, or when
    ``out`` overlaps an input (the full path raises the error)."""
    entry = _PLANS.get(key)
    if entry is None:
        return None
    spec = entry.spec
    if out is None:
        out = _allocate_out(x, spec)
    else:
        e_out, e_x, e_w, e_b = entry.extents
        o = out.data_ptr()
        if overlaps(o, e_out, x, e_x) or overlaps(o, e_out, weight, e_w) or overlaps(o, e_out, bias, e_b):
            return None
    with torch.no_grad():
        if entry.pack is not None:  # direct, bank, window: (x, packed weights, bias, tap sums, out)
            wp = entry.pack(weight)
            sums = _recenter_sums(weight, tap_sums) if spec.recenter else wp
            entry.plan.launch((x, wp, wp if bias is None else bias.contiguous(), sums, out))
            last_launch.update(path=entry.path, config=entry.config)
            return out
        w_hi, w_lo = _dense_weights(weight, spec)
        b = w_hi if bias is None else bias.contiguous()
        x_k = x
        if entry.prep == _PREP_A16:
            x_k = _a16_buffer(x, spec)
            x_k.copy_(x)
        elif entry.prep == _PREP_ROUND:
            x_k = _tf32_buffer(x)
            _round_tf32_into(x, x_k)
        if entry.tma is not None:
            x_desc, w_desc = _dense_descriptors(x_k, w_hi, entry.tma)
            entry.plan.launch((x_desc, w_desc, w_hi, b, out))
        else:
            sums = _recenter_sums(weight, tap_sums) if spec.recenter else w_hi
            entry.plan.launch((x_k, w_hi, w_hi if w_lo is None else w_lo, b, sums, out))
    last_launch.update(path="dense", config=entry.config)
    return out


def _dense_tma_ok(x: torch.Tensor, spec: _Spec) -> bool:
    """Can ``_conv1d_dense_tma_kernel`` run this call? groups = 1 and the time-major [N, L, C] view of x
    usable by a TMA kernel (``tma.usable``: channels contiguous, 16-byte aligned base and strides)."""
    return spec.groups == 1 and tma.usable(x.transpose(1, 2), spec.precision)


def _launch_direct(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    spec: _Spec,
    config: autotune.Config | None,
    *,
    plan_key: tuple | None = None,
    tap_sums: torch.Tensor | None = None,
) -> object:
    G, K = spec.groups, spec.K
    Cg, Og = spec.C // G, spec.O // G
    # Packed only when a direct or bank config runs: the window kernel packs its own layout.
    pack_direct = functools.partial(_direct_weights, G=G, Og=Og, Cg=Cg, K=K)
    recorded: dict[str, object] = {}

    block_m = min(autotune.pow2_bucket(Og), 16)
    index64 = _FORCE_INDEX64 or max(_max_offset(x), _max_offset(out), weight.numel()) > _INT32_MAX
    pad = (K - 1) * spec.dilation if spec.causal else 0
    # The channel counts per group are compile-time constants here: small, few distinct values per bank, and
    # known multiples let the compiler vectorise the weight loads and the output stores (o = g * OG + m).
    meta = {
        "CG": Cg,
        "OG": Og,
        "HAS_BIAS": bias is not None,
        "ACT": spec.act,
        "INDEX64": index64,
        "RECENTER": spec.recenter,
        "BLOCK_M": block_m,
    }

    def launch(cfg: autotune.Config) -> object:
        kw = cfg.launch_kwargs()
        if kw.pop("WINDOW", 0):
            return _launch_window(x, weight, bias, out, spec, index64, kw, recorded, tap_sums)
        kw.setdefault("UNROLL", 1)
        wp = pack_direct(weight)
        sums = _recenter_sums(weight, tap_sums) if spec.recenter else wp
        recorded["pack"] = pack_direct
        if kw.pop("BANK", 0):
            return _launch_bank(x, wp, bias, sums, out, spec, meta, kw, recorded)
        n_tblk = triton.cdiv(spec.L_out, kw["BLOCK_T"])
        n_gblk = triton.cdiv(G, kw["BLOCK_G"])
        n_mblk = triton.cdiv(Og, block_m)
        grid = (spec.N * n_tblk * n_gblk * n_mblk,)
        _check_grid(grid[0])
        args = (
            x,
            wp,
            wp if bias is None else bias,
            sums,
            out,
            spec.L,
            spec.L_out,
            G,
            K,
            spec.dilation,
            pad,
            spec.recenter_from,
            n_tblk,
            n_gblk,
            n_mblk,
            *x.stride(),
            wp.stride(0),
            wp.stride(1),
            wp.stride(2),
            *out.stride(),
        )
        return launch_recorded(recorded, _conv1d_direct_kernel, grid, args, {**meta, **kw})

    if config is None:
        space = autotune.conv1d_direct_space(block_m, G, one_channel=Cg == 1, filters=Og)
        key = (
            f"x={_dtype_name(x)}|w={_dtype_name(weight)}|in={_layout(x)}|out={_layout(out)}"
            f"|G={autotune.pow2_bucket(G)}|Cg={autotune.pow2_bucket(Cg)}|Og={autotune.pow2_bucket(Og)}"
            f"|K={autotune.pow2_bucket(K)}|NL={autotune.pow2_bucket(spec.N * spec.L_out)}"
        )
        config = autotune.select(space, key, launch, device=x.device, interpreted=_INTERPRETED)
    path = "window" if config.meta.get("WINDOW") else "bank" if config.meta.get("BANK") else "direct"
    last_launch.update(path=path, config=config.name)
    ret = launch(config)
    if plan_key is not None:
        plan = LaunchPlan(recorded["fn"], recorded["ret"], recorded["grid"], recorded["args"], _DIRECT_SLOTS)
        extents = (extent(out), extent(x), extent(weight), extent(bias))
        _PLANS.put(plan_key, _ConvPlan(plan, path, config.name, spec, extents, recorded["pack"]))
    return ret


def _direct_weights(weight: torch.Tensor, *, G: int, Og: int, Cg: int, K: int) -> torch.Tensor:
    """[O, Cg, K] -> [Cg, K, O/G, G] for the direct and bank kernels (cached per weight tensor): channels
    contiguous like x, upcast to float32 once here (the bank is small; converting float16 in the tap loop
    would cost one instruction per weight per tap, half as many as FMAs)."""
    return _WEIGHTS.get(
        weight,
        ("direct", G),
        lambda w: w.reshape(G, Og, Cg, K).permute(2, 3, 1, 0).to(torch.float32).contiguous(),
    )


def _window_weights(weight: torch.Tensor, *, G: int, block_g: int, taps: int) -> torch.Tensor:
    """The window kernel's packed bank (:func:`window.pack_weights`, cached per weight tensor)."""
    return _WEIGHTS.get(
        weight,
        ("window", G, block_g, taps),
        lambda w: window.pack_weights(w, groups=G, block_g=block_g, taps=taps),
    )


def _launch_window(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    spec: _Spec,
    index64: bool,
    kw: dict[str, int],
    recorded: dict[str, object],
    tap_sums: torch.Tensor | None = None,
) -> object:
    """The generated register-window kernel (:mod:`tsconv.kernels.window`; one input channel per group)."""
    G, Og, d = spec.groups, spec.O // spec.groups, spec.dilation
    rows, taps, block_g = kw.pop("ROWS"), kw.pop("TAPS"), kw.pop("BLOCK_G")
    pack = functools.partial(_window_weights, G=G, block_g=block_g, taps=taps)
    wp = pack(weight)
    recorded["pack"] = pack
    n_tblk = triton.cdiv(spec.L_out, rows * d) * d  # d phases per block of rows * d steps
    n_gblk = triton.cdiv(G, block_g)
    grid = (spec.N * n_tblk * n_gblk,)
    _check_grid(grid[0])
    fn = window.kernel(rows, Og, taps)
    args = (
        x,
        wp,
        wp if bias is None else bias,
        _recenter_sums(weight, tap_sums) if spec.recenter else wp,
        out,
        spec.L,
        spec.L_out,
        spec.N,
        G,
        spec.K // taps,  # whole tap steps; the kernel's TAIL runs the rest
        d,
        (spec.K - 1) * d if spec.causal else 0,
        spec.recenter_from,
        n_tblk,
        wp.stride(0),
        *x.stride(),
        *out.stride(),
    )
    meta = {
        "HAS_BIAS": bias is not None,
        "ACT": spec.act,
        "INDEX64": index64 or wp.numel() > _INT32_MAX,
        "VEC_STORE": out.stride(1) == 1,  # the generator uses it only for power-of-two filter counts
        "RECENTER": spec.recenter,
        "BLOCK_G": block_g,
        "TAIL": spec.K % taps,
    }
    return launch_recorded(recorded, fn, grid, args, {**meta, **kw})


def _launch_bank(
    x: torch.Tensor,
    wp: torch.Tensor,
    bias: torch.Tensor | None,
    sums: torch.Tensor,
    out: torch.Tensor,
    spec: _Spec,
    meta: dict[str, object],
    kw: dict[str, int],
    recorded: dict[str, object],
) -> object:
    """``_conv1d_bank_kernel`` with ``wp`` the direct kernel's [1, K, O/G, G] weights (one channel a group)."""
    G, Og = spec.groups, spec.O // spec.groups
    block_m = int(meta["BLOCK_M"])
    n_tblk = triton.cdiv(spec.L_out, kw["BLOCK_T"])
    n_tprog = triton.cdiv(n_tblk, kw["T_ITERS"])
    n_gblk = triton.cdiv(G, kw["BLOCK_G"])
    n_mblk = triton.cdiv(Og, block_m)
    grid = (spec.N * n_tprog * n_gblk * n_mblk,)
    _check_grid(grid[0])
    bank_meta = {k: v for k, v in meta.items() if k != "CG"}
    bank_meta["EVEN"] = G % kw["BLOCK_G"] == 0 and Og % block_m == 0
    args = (
        x,
        wp,
        wp if bias is None else bias,
        sums,
        out,
        spec.L,
        spec.L_out,
        G,
        spec.K,
        spec.dilation,
        (spec.K - 1) * spec.dilation if spec.causal else 0,
        spec.recenter_from,
        n_tprog,
        n_gblk,
        n_mblk,
        *x.stride(),
        wp.stride(1),
        wp.stride(2),
        *out.stride(),
    )
    return launch_recorded(recorded, _conv1d_bank_kernel, grid, args, {**bank_meta, **kw})


def _check_grid(n_programs: int) -> None:
    if n_programs > _INT32_MAX:
        msg = f"the conv needs {n_programs} programs, more than one launch allows ({_INT32_MAX})."
        raise ShapeError(msg, hint="split the batch (N) or the series length into several calls.")
