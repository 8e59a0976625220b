"""A conv1d followed by a projection head, fused: the [steps, O] intermediate never reaches GPU memory.

``conv1d_head(x, weight, bias, head_weight, head_bias)`` computes, per series and step,
``head_act(act(conv1d(x) + bias) @ head_weight + head_bias)`` (conv as in :func:`tsconv.kernels.conv1d.conv1d`,
head as in :func:`tsconv.kernels.gemm.gemm`) and writes a float32 [N, L_out, D] result through any strides.

Kernel (``_conv1d_head_kernel``): one program per (series, BLOCK_T steps); it owns the whole [BLOCK_T,
BLOCK_D] output tile (BLOCK_D = D rounded up to a power of two, 16 to 256) in a float32 accumulator. It loops
over blocks of BLOCK_O conv output channels (one block when O <= BLOCK_O); per block it computes the conv tile
[BLOCK_T, BLOCK_O] exactly as conv1d's ``_conv1d_dense_kernel`` does (implicit GEMM over taps and BLOCK_C
channel chunks, x read in place through its strides, causal zeros from load masks, weights rearranged by
:func:`~tsconv.kernels.conv1d.dense.prepare_dense_weights` and kept in conv1d's cache, ``torch_side.WEIGHTS``),
adds the bias, applies the activation and multiplies the tile, still in registers, by
``head_weight[o0:o0+BLOCK_O, :]``: ``out_acc += act(conv_tile) @ W[o_blk, :]``, valid because the activation
acts per conv channel. The head epilogue (bias, activation) runs once on ``out_acc``, which is then stored.

Precision (accumulation is always float32):

- "fp32" (default): both products use ``common.dot_fp32``, as conv1d does: float32 operands split three ways
  into TF32-exact parts, float16 weights exact in TF32, float32 weights split once per call into a TF32 high
  and low part, and each reduction step's products summed in a fresh tensor-core accumulator then added to the
  running float32 sum on the CUDA cores (Hopper tensor cores round partial sums toward zero; see
  benchmarks/NOTES.md, "Precision"). The conv step is one (tap, BLOCK_C channels) chunk; the head step is one
  BLOCK_O block of the conv tile (float32, split in three), so "fp32" configs keep BLOCK_O <= 64, the flush
  granularity the GEMM head uses.
- "tf32": single TF32 products, weights rounded to TF32 once per call; float32 x rounded to TF32 (ties to
  even) by conv1d's pre-pass (``common.round_tf32_into``: one read and one write of x, so the conv's A tiles
  still go to the tensor cores straight from shared memory, and the tensor core's truncation finds nothing
  to drop), and the conv tile, already in registers, rounded there (``round_tf32_rne``) before the head
  product, as conv1d and gemm do. "fp16": float16 operands (x and the conv tile rounded in registers,
  weights stored as float16).

Scope: dense convs (groups = 1) with O up to ``_MAX_FUSED_O`` (1024) and D up to ``_MAX_BLOCK_D`` (256).
Other shapes (grouped or depthwise banks, wider convs or heads) fall back to the unfused pair:
:func:`~tsconv.kernels.conv1d.conv1d` into a time-major [N, L_out, O] float32 buffer, then
:func:`~tsconv.kernels.gemm.gemm` on its [N * L_out, O] view; :func:`fused_path` says which path a call
takes and why, and ``last_launch`` records it.

On CUDA tensors the fused kernel runs with block shapes tuned per GPU and shape class (cached on disk, see
:mod:`tsconv.kernels.autotune`; the space is :func:`conv1d_head_space`). On CPU tensors it runs through the
Triton interpreter when ``TRITON_INTERPRET=1`` was set before import; otherwise CPU tensors take the torch
paths of conv1d and gemm (the unfused pair), with the same semantics.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tsconv.errors import ShapeError
from tsconv.kernels import autotune, tma, torch_side
from tsconv.kernels import conv1d as _conv
from tsconv.kernels import gemm as _gemm
from tsconv.kernels.checks import ACT_CODE as _ACT_CODE
from tsconv.kernels.checks import ACT_NAME as _ACT_NAME
from tsconv.kernels.checks import INT32_MAX as _INT32_MAX
from tsconv.kernels.checks import PREC_CODE as _PREC_CODE
from tsconv.kernels.checks import check_out, is_activation
from tsconv.kernels.checks import describe as _shape
from tsconv.kernels.checks import dtype_name as _dtype_name
from tsconv.kernels.common import (
    activate,
    dot_fp32,
    level,
    level_fallback,
    max_offset,
    round_tf32_into,
    round_tf32_rne,
    tf32_buffer,
)
from tsconv.kernels.conv1d.dense import a16_buffer, dense_descriptors, prepare_dense_weights, tma_conv_tile
from tsconv.kernels.conv1d.spec import ConvSpec, check_fallback, check_tap_sums, validate
from tsconv.kernels.torch_side import WEIGHTS, custom_op, recenter_sums, round_tf32_torch
from tsconv.kernels.weight_cache import writes_out

__all__ = ["ACTIVATIONS", "PADDINGS", "PRECISIONS", "conv1d_head", "conv1d_head_space", "fused_path"]

ACTIVATIONS = _conv.ACTIVATIONS
PADDINGS = _conv.PADDINGS
PRECISIONS = _conv.PRECISIONS

_HW_DTYPES = (torch.float16, torch.float32, torch.bfloat16)

# Module switches (tests flip them).
_MAX_BLOCK_O = 256  # the largest conv-channel tile kept in registers; larger O loops over O blocks
_MAX_FUSED_O = 1024  # beyond this the unfused pair runs
_MAX_BLOCK_D = 256  # the head output tile is whole per program: D above this runs unfused
_FORCE_INDEX64 = False
_FLUSH = True
_A_SPLIT = 3
# "tf32": round x (pre-pass) and the conv tile (registers) to TF32; False: the tensor core truncates (old).
_ROUND_TF32 = True
# The TMA variant of the fused kernel ("tf32" / "fp16", Hopper) joins the tuner's candidates (tests turn
# it off). On the H200 its winners took 0.61 / 0.44 ms where the pointer kernel's took 1.00 / 0.78 ms
# ([64, 1024, 1028] -> 256 -> 64, tf32 / fp16; benchmarks/NOTES.md, "Kernels: fused conv -> head, and the
# engine's head path").
_TMA_ENABLED = True
# What the last call did (benchmarks report it): {"path": "fused" | "unfused", "config": ..., "reason": ...}.
last_launch: dict[str, str] = {}


# --------------------------------------------------------------------------------------------------------
# kernel
# --------------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["L_in", "L_out", "K", "dilation", "pad", "lv_min", "n_tblk"])
def _conv1d_head_kernel(
    x_ptr,
    w_ptr,
    wlo_ptr,
    b_ptr,
    s_ptr,
    f_ptr,
    hw_ptr,
    hwlo_ptr,
    hb_ptr,
    y_ptr,
    L_in,
    L_out,
    C,
    O,
    D,
    K,
    dilation,
    pad,
    lv_min,
    n_tblk,
    stride_xn,
    stride_xc,
    stride_xt,
    stride_wk,
    stride_wo,
    stride_hd,
    stride_yn,
    stride_yt,
    stride_yd,
    HAS_BIAS: tl.constexpr,
    HAS_HBIAS: tl.constexpr,
    ACT: tl.constexpr,
    HEAD_ACT: tl.constexpr,
    PREC: tl.constexpr,
    A_SPLIT: tl.constexpr,
    H_SPLIT: tl.constexpr,
    W_SPLIT: tl.constexpr,
    HW_SPLIT: tl.constexpr,
    FLUSH: tl.constexpr,
    ROUND_H: tl.constexpr,
    INDEX64: tl.constexpr,
    RECENTER: tl.constexpr,
    FALLBACK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    n = pid // n_tblk
    pid_t = pid % n_tblk

    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_ob = tl.arange(0, BLOCK_O)
    offs_c = tl.arange(0, BLOCK_C)
    offs_d = tl.arange(0, BLOCK_D)
    if INDEX64:
        offs_t = offs_t.to(tl.int64)
        offs_ob = offs_ob.to(tl.int64)
        offs_c = offs_c.to(tl.int64)
        offs_d = offs_d.to(tl.int64)
    d_mask = offs_d < D
    t_base = offs_t - pad
    a_ptrs = x_ptr + n.to(tl.int64) * stride_xn + t_base[:, None] * stride_xt + offs_c[None, :] * stride_xc
    n_cb = (C + BLOCK_C - 1) // BLOCK_C
    # recenter (as in conv1d): each channel's level is its value at the block's first output step
    t_lvl = pid_t * BLOCK_T - pad + (K - 1) * dilation
    if INDEX64:
        t_lvl = t_lvl.to(tl.int64)
    lv_ptrs = x_ptr + n.to(tl.int64) * stride_xn + offs_c * stride_xc

    out_acc = tl.full((BLOCK_T, BLOCK_D), 0.0, tl.float32)
    for o0 in range(0, O, BLOCK_O):
        if INDEX64:
            o0 = tl.cast(o0, tl.int64)
        offs_o = o0 + offs_ob
        o_mask = offs_o < O
        w_ptrs = w_ptr + offs_o[None, :] * stride_wo + offs_c[:, None]
        wlo_ptrs = wlo_ptr + offs_o[None, :] * stride_wo + offs_c[:, None]

        # The conv tile [BLOCK_T, BLOCK_O], as in _conv1d_dense_kernel (taps fastest, then channel chunks).
        acc = tl.full((BLOCK_T, BLOCK_O), 0.0, tl.float32)
        for it in range(0, K * n_cb):
            k = it % K
            c0 = (it // K) * BLOCK_C
            if INDEX64:
                k = tl.cast(k, tl.int64)
                c0 = tl.cast(c0, tl.int64)
            shift = k * dilation
            t_ok = (t_base >= -shift) & (t_base < L_in - shift)
            c_ok = offs_c < C - c0
            a = tl.load(
                a_ptrs + (shift * stride_xt + c0 * stride_xc), mask=t_ok[:, None] & c_ok[None, :], other=0.0
            )
            w_off = k * stride_wk + c0
            w_mask = c_ok[:, None] & o_mask[None, :]
            b = tl.load(w_ptrs + w_off, mask=w_mask, other=0.0)
            if PREC == 0:
                a = a.to(tl.float32)
                if RECENTER:
                    fb = level_fallback(f_ptr + c0, offs_c, c_ok, FALLBACK)
                    lv = level(
                        lv_ptrs + c0 * stride_xc, t_lvl, lv_min, dilation, stride_xt, L_in, c_ok, fb, 5
                    )
                    a = a - lv[None, :]
                acc = dot_fp32(a, b, wlo_ptrs + w_off, w_mask, acc, A_SPLIT, W_SPLIT, FLUSH)
            elif PREC == 1:  # float32 x was rounded to TF32 by the launcher's pre-pass (see conv1d)
                acc = tl.dot(a.to(tl.float32), b, acc, input_precision="tf32")
            else:
                acc = tl.dot(a.to(tl.float16), b, acc)

        if RECENTER:  # + sum over channels of level * tap sum (float64 [O, C], as in conv1d)
            addback = tl.full((BLOCK_O,), 0.0, tl.float64)
            for c0 in range(0, C, BLOCK_C):
                c_ok = offs_c < C - c0
                fb = level_fallback(f_ptr + c0, offs_c, c_ok, FALLBACK)
                lv = level(lv_ptrs + c0 * stride_xc, t_lvl, lv_min, dilation, stride_xt, L_in, c_ok, fb, 5)
                s_ptrs = s_ptr + offs_o[None, :].to(tl.int64) * C + (c0 + offs_c)[:, None]
                sums = tl.load(s_ptrs, mask=c_ok[:, None] & o_mask[None, :], other=0.0)
                addback += tl.sum(sums * lv.to(tl.float64)[:, None], axis=0)
            acc = acc + addback.to(tl.float32)[None, :]
        out_acc = _head_block(
            acc, out_acc, b_ptr, hw_ptr, hwlo_ptr, offs_o, o_mask, offs_d, d_mask, stride_hd,
            HAS_BIAS, ACT, PREC, H_SPLIT, HW_SPLIT, FLUSH, ROUND_H,
        )  # fmt: skip

    _head_store(
        out_acc, hb_ptr, y_ptr + n.to(tl.int64) * stride_yn, offs_t, offs_d, d_mask, L_out, stride_yt, stride_yd,
        HAS_HBIAS, HEAD_ACT,
    )  # fmt: skip


@triton.jit
def _head_block(
    acc, out_acc, b_ptr, hw_ptr, hwlo_ptr, offs_o, o_mask, offs_d, d_mask, stride_hd,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, PREC: tl.constexpr, H_SPLIT: tl.constexpr,
    HW_SPLIT: tl.constexpr, FLUSH: tl.constexpr, ROUND_H: tl.constexpr,
):  # fmt: skip
    """``out_acc + act(conv tile + bias) @ W[o block, :]``: one O block's conv tile (registers) through the
    conv epilogue and the head product (shared by the pointer and TMA kernels)."""
    if HAS_BIAS:
        bias = tl.load(b_ptr + offs_o, mask=o_mask, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    acc = activate(acc, ACT)
    # columns past O: exact zeros (padded channels, and in the TMA kernel products with the next tap's rows)
    acc = tl.where(o_mask[None, :], acc, 0.0)
    hw_off = offs_d[None, :] * stride_hd + offs_o[:, None]  # [BLOCK_O, BLOCK_D], O contiguous
    hw_mask = o_mask[:, None] & d_mask[None, :]
    hw = tl.load(hw_ptr + hw_off, mask=hw_mask, other=0.0)
    if PREC == 0:
        out_acc = dot_fp32(acc, hw, hwlo_ptr + hw_off, hw_mask, out_acc, H_SPLIT, HW_SPLIT, FLUSH)
    elif PREC == 1:
        if ROUND_H:  # the tile is in registers already: rounding it costs a few integer ops, no traffic
            out_acc = tl.dot(round_tf32_rne(acc), hw, out_acc, input_precision="tf32")
        else:
            out_acc = tl.dot(acc, hw, out_acc, input_precision="tf32")
    else:
        out_acc = tl.dot(acc.to(tl.float16), hw, out_acc)
    return out_acc


@triton.jit
def _head_store(
    out_acc, hb_ptr, y_base, offs_t, offs_d, d_mask, L_out, stride_yt, stride_yd,
    HAS_HBIAS: tl.constexpr, HEAD_ACT: tl.constexpr,
):  # fmt: skip
    """The head's bias and activation, then the [BLOCK_T, BLOCK_D] tile stored at ``y_base`` (one series)."""
    if HAS_HBIAS:
        hbias = tl.load(hb_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        out_acc = out_acc + hbias[None, :]
    out_acc = activate(out_acc, HEAD_ACT)
    y_ptrs = y_base + offs_t[:, None] * stride_yt + offs_d[None, :] * stride_yd
    tl.store(y_ptrs, out_acc, mask=(offs_t < L_out)[:, None] & d_mask[None, :])


@triton.jit(do_not_specialize=["L_in", "L_out", "K", "dilation", "pad", "n_tblk"])
def _conv1d_head_tma_kernel(
    x_desc,
    w_desc,
    b_ptr,
    hw_ptr,
    hb_ptr,
    y_ptr,
    L_in,
    L_out,
    C,
    O,
    D,
    K,
    dilation,
    pad,
    n_tblk,
    stride_hd,
    stride_yn,
    stride_yt,
    stride_yd,
    HAS_BIAS: tl.constexpr,
    HAS_HBIAS: tl.constexpr,
    ACT: tl.constexpr,
    HEAD_ACT: tl.constexpr,
    PREC: tl.constexpr,
    ROUND_H: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """``_conv1d_head_kernel`` for "tf32" / "fp16" with the conv operands loaded by the TMA (Hopper), as in
    conv1d's ``_conv1d_dense_tma_kernel``: x tiles from the time-major [N, L, C] view (causal zeros, the
    series end and channels past C zero-filled by the copy engine; "tf32" float32 x rounded to TF32 by the
    descriptor, so no rounding pre-pass and no copy of x), weight tiles [BLOCK_O, BLOCK_C] from the packed
    [K * O, C padded] view. The head product and epilogue are the pointer kernel's."""
    pid = tl.program_id(0)
    n = pid // n_tblk
    pid_t = pid % n_tblk
    t0 = pid_t * BLOCK_T
    offs_t = t0 + tl.arange(0, BLOCK_T)
    offs_ob = tl.arange(0, BLOCK_O)
    offs_c = tl.arange(0, BLOCK_C)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D

    out_acc = tl.full((BLOCK_T, BLOCK_D), 0.0, tl.float32)
    for o0 in range(0, O, BLOCK_O):
        offs_o = o0 + offs_ob
        o_mask = offs_o < O
        acc = tma_conv_tile(
            x_desc, w_desc, b_ptr, n, t0, o0, pad, dilation, K, C, O, offs_c, o_mask, 0,
            PREC, True, BLOCK_T, BLOCK_O, BLOCK_C,
        )  # weights by descriptor: the pointer arguments are unused  # fmt: skip
        out_acc = _head_block(
            acc, out_acc, b_ptr, hw_ptr, hw_ptr, offs_o, o_mask, offs_d, d_mask, stride_hd,
            HAS_BIAS, ACT, PREC, 1, False, False, ROUND_H,
        )  # fmt: skip

    _head_store(
        out_acc, hb_ptr, y_ptr + n.to(tl.int64) * stride_yn, offs_t.to(tl.int64), offs_d.to(tl.int64), d_mask,
        L_out, stride_yt, stride_yd, HAS_HBIAS, HEAD_ACT,
    )  # fmt: skip


def _check_grid(n_programs: int) -> None:
    if n_programs > _INT32_MAX:
        msg = f"the fused conv needs {n_programs} programs, more than one launch allows ({_INT32_MAX})."
        raise ShapeError(msg, hint="split the batch (N) or the series length into several calls.")


def _tma_ok(x: torch.Tensor, w_hi: torch.Tensor, c: ConvSpec) -> bool:
    """Can ``_conv1d_head_tma_kernel`` run this call? x's time-major [N, L, C] view usable by a TMA kernel in
    this precision (``tma.usable``: "tf32" / "fp16", channels contiguous, 16-byte aligned) and no
    recentering (an "fp32" option)."""
    return not c.recenter and tma.usable(x.transpose(1, 2), c.precision) and tma.fits(w_hi)


# --------------------------------------------------------------------------------------------------------
# config space
# --------------------------------------------------------------------------------------------------------


def _cfg(bt: int, bo: int, bc: int, warps: int, stages: int) -> autotune.Config:
    meta = {"BLOCK_T": bt, "BLOCK_O": bo, "BLOCK_C": bc}
    return autotune.Config(f"t{bt}_o{bo}_c{bc}_w{warps}_s{stages}", meta, num_warps=warps, num_stages=stages)


def _tma_cfg(bt: int, bo: int, bc: int, warps: int, stages: int, a16: int = 0) -> autotune.Config:
    meta = {"BLOCK_T": bt, "BLOCK_O": bo, "BLOCK_C": bc, "TMA": 1}
    name = f"t{bt}_o{bo}_c{bc}_w{warps}_s{stages}"
    if a16:
        meta["A16"] = 1  # launcher-level, as in conv1d: x cast to a padded float16 copy first ("fp16")
        name += "_a16"
    return autotune.Config(name + "_tma", meta, num_warps=warps, num_stages=stages)


def conv1d_head_space(precision: str, C: int, O: int, D: int, *, tma: bool = False) -> autotune.ConfigSpace:
    """Candidate tiles for the fused kernel: [BLOCK_T steps, BLOCK_O conv channels], reduction chunk BLOCK_C.

    BLOCK_D is not tuned (D rounded up to a power of two, 16 to 256). Registers hold the conv tile and the
    [BLOCK_T, BLOCK_D] head accumulator at once (in "fp32" each with its flush partial), so candidates are
    filtered by float32 values per thread (ptxas for sm_90, tests/kernels/test_fused.py): "fp32" at most 32
    of each (64 x 64 per 4 warps uses 252 registers; 64 x 256 heads need 32-step tiles), "tf32" / "fp16" at
    most 64 conv values and 96 in all (128 x 256 conv tiles per 8 warps spill about 1 KB). "fp32" keeps
    BLOCK_O <= 64, the head product's flush granularity (see the module docstring). Timings unverified: the
    candidates are a first guess for the tuner. ``tma`` ("tf32" / "fp16" calls that ``_tma_ok``): the TMA
    kernel's candidates join them (the space's name says so, which keeps their winners apart in the cache),
    allowed 128 conv values and 160 in all: its conv tile lives in wgmma accumulators, and 128 x 256 per 8
    warps, which spills 0.3-0.7 KB with the head (sm_90 ptxas), was still the fastest tf32 tile on the H200.
    """
    pb = autotune.pow2_bucket
    tma = tma and precision != "fp32"
    return _space(precision, max(16, pb(C)), max(16, pb(O)), min(256, max(16, pb(D))), _MAX_BLOCK_O, tma)


@functools.lru_cache(maxsize=256)
def _space(precision: str, C: int, O: int, D: int, max_bo: int, tma: bool = False) -> autotune.ConfigSpace:
    if precision == "fp32":
        cands = [
            _cfg(64, 64, 32, 8, 3),
            _cfg(128, 64, 32, 8, 3),
            _cfg(64, 64, 32, 4, 3),
            _cfg(128, 32, 32, 8, 3),
            _cfg(64, 32, 32, 4, 3),
            _cfg(64, 64, 16, 8, 4),
            _cfg(32, 64, 32, 8, 3),
        ]
        conv_max, total_max = 32, 64
    else:
        bc = 64 if precision == "fp16" else 32
        cands = [
            _cfg(64, 128, 32, 8, 3),
            _cfg(64, 256, 32, 8, 3),
            _cfg(128, 128, 32, 8, 3),
            _cfg(128, 64, 32, 8, 3),
            _cfg(64, 64, 32, 4, 4),
            _cfg(64, 128, bc, 8, 4),
            _cfg(32, 64, 32, 8, 3),
        ]
        conv_max, total_max = 64, 96
        if tma:  # after the pointer candidates: the untuned default stays the pointer kernel
            for a16 in (1, 0) if precision == "fp16" else (0,):
                cands += [
                    _tma_cfg(64, 256, bc, 8, 3, a16),
                    _tma_cfg(128, 128, bc, 8, 3, a16),
                    _tma_cfg(64, 128, bc, 4, 4, a16),
                    _tma_cfg(64, 128, bc, 8, 4, a16),
                    _tma_cfg(128, 128, bc, 8, 4, a16),
                ]
                if precision == "tf32":
                    # The standalone TMA conv's winning tile at O = 256: 0.53 ms against 0.61 (H200, 86d9179).
                    # Its fp16 twin (x cast in the kernel) left outputs unwritten there: not offered.
                    cands.append(_tma_cfg(128, 256, bc, 8, 3, a16))
    bo_cap = max(16, min(O, max_bo))
    out: list[autotune.Config] = []
    for c in cands:
        m = c.meta
        make = functools.partial(_tma_cfg, a16=m.get("A16", 0)) if m.get("TMA") else _cfg
        new = make(m["BLOCK_T"], min(m["BLOCK_O"], bo_cap), min(m["BLOCK_C"], C), c.num_warps, c.num_stages)
        threads = 32 * c.num_warps
        conv = new.meta["BLOCK_T"] * new.meta["BLOCK_O"] // threads
        head = new.meta["BLOCK_T"] * D // threads
        if precision == "fp32":
            fits = conv <= conv_max and head <= conv_max and conv + head <= total_max
        elif m.get("TMA"):
            fits = conv <= 128 and conv + head <= 160  # see the docstring
        else:
            fits = conv <= conv_max and conv + head <= total_max
        if fits and all(o.name != new.name for o in out):
            out.append(new)
    if not out:
        out.append(_cfg(32, min(32, bo_cap), min(32, C), 8, 2))
    interp = _cfg(64, min(64, bo_cap), min(32, C), 4, 1)
    # v2 of the TMA space: two larger tiles joined it (a cache tuned over v1's candidates is not reused).
    name = f"conv1d_head_v2_{precision}_tma" if tma else f"conv1d_head_v1_{precision}"
    return autotune.ConfigSpace(name, tuple(out), out[0], interp)


# --------------------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    conv: ConvSpec
    D: int
    head_act: int

    @property
    def precision(self) -> str:
        return self.conv.precision


def _validate(
    x: object,
    weight: object,
    bias: object,
    head_weight: object,
    head_bias: object,
    out: object,
    *,
    dilation: object,
    groups: object,
    padding: object,
    activation: object,
    head_activation: object,
    precision: object,
    recenter: object = False,
    recenter_from: object = 0,
) -> _Spec:
    conv = validate(
        x,
        weight,
        bias,
        None,
        dilation=dilation,
        groups=groups,
        padding=padding,
        activation=activation,
        precision=precision,
        recenter=recenter,
        recenter_from=recenter_from,
    )
    assert isinstance(x, torch.Tensor)
    if not isinstance(head_weight, torch.Tensor):
        msg = f"head_weight must be a torch.Tensor, got {type(head_weight).__name__}."
        raise ShapeError(msg, hint="pass a [O, D] tensor (conv channels in, head outputs out).")
    if head_weight.dim() != 2 or head_weight.shape[0] != conv.O:
        msg = f"head_weight must be [O, D] with O = {conv.O} (the conv's output channels), got {_shape(head_weight)}."
        raise ShapeError(msg, hint="a [D, O] weight (torch.nn.Linear layout) is passed as w.T.")
    if head_weight.dtype not in _HW_DTYPES:
        msg = f"head_weight must be float16 or float32 (or bfloat16), got {head_weight.dtype}."
        raise ShapeError(msg, hint="store head weights as float16 or float32.")
    if head_weight.device != x.device:
        msg = f"head_weight is on {head_weight.device} but x is on {x.device}."
        raise ShapeError(msg, hint="move the weights to x's device with head_weight.to(x.device).")
    D = int(head_weight.shape[1])
    if not is_activation(head_activation):
        msg = f"head_activation must be one of None, 'none', 'relu', 'gelu', 'tanh', got {head_activation!r}."
        raise ShapeError(msg, hint="use head_activation=None for a plain projection.")
    if head_bias is not None:
        if not isinstance(head_bias, torch.Tensor):
            msg = f"head_bias must be a torch.Tensor or None, got {type(head_bias).__name__}."
            raise ShapeError(msg, hint="[D].")
        if head_bias.dim() != 1 or head_bias.shape[0] != D:
            raise ShapeError(
                f"head_bias must be [D] = [{D}], got {_shape(head_bias)}.", hint="one per output."
            )
        if head_bias.dtype not in _HW_DTYPES:
            raise ShapeError(
                f"head_bias must be a float tensor, got {head_bias.dtype}.", hint="head_bias.float()."
            )
        if head_bias.device != x.device:
            msg = f"head_bias is on {head_bias.device} but x is on {x.device}."
            raise ShapeError(msg, hint="head_bias.to(x.device).")
    if out is not None:
        check_out(
            out,
            shape=(conv.N, conv.L_out, D),
            expected=f"[N, L_out, D] = {(conv.N, conv.L_out, D)} ({_padding_name(conv)} padding)",
            shape_hint="the result is time-major: [N, L_out, D]; for a [N, D, L_out] buffer pass buf.transpose(1, 2).",
            view_example="buf.transpose(1, 2)",
            owner=("x", x),
            inputs={
                "x": x,
                "weight": weight,
                "bias": bias,
                "head_weight": head_weight,
                "head_bias": head_bias,
            },
        )
    return _Spec(conv, D, _ACT_CODE[head_activation])


def _padding_name(conv: ConvSpec) -> str:
    return "causal" if conv.causal else "valid"


def _unfused_reason(spec: _Spec) -> str | None:
    c = spec.conv
    if c.groups != 1:
        return f"groups={c.groups}: only dense convs (groups=1) are fused"
    if c.O > _MAX_FUSED_O:
        return f"O={c.O} > {_MAX_FUSED_O} conv channels"
    if spec.D > _MAX_BLOCK_D:
        return f"D={spec.D} > {_MAX_BLOCK_D} head outputs"
    if c.O == 0 or c.C == 0:
        return "no channels"
    return None


def fused_path(
    x: torch.Tensor,
    weight: torch.Tensor,
    head_weight: torch.Tensor,
    *,
    groups: int = 1,
    padding: str = "causal",
    dilation: int = 1,
) -> tuple[bool, str]:
    """(True, "") when :func:`conv1d_head` would run the fused kernel for these shapes, else (False, why).

    On CPU tensors without the interpreter both paths are the torch pair; this reports the shape rule.
    """
    spec = _validate(
        x,
        weight,
        None,
        head_weight,
        None,
        None,
        dilation=dilation,
        groups=groups,
        padding=padding,
        activation=None,
        head_activation=None,
        precision="fp32",
    )
    reason = _unfused_reason(spec)
    return reason is None, reason or ""


# --------------------------------------------------------------------------------------------------------
# public entry point
# --------------------------------------------------------------------------------------------------------


@writes_out
def conv1d_head(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    head_weight: torch.Tensor,
    head_bias: torch.Tensor | None = None,
    *,
    dilation: int = 1,
    groups: int = 1,
    padding: str = "causal",
    activation: str | None = None,
    head_activation: str | None = None,
    precision: str = "fp32",
    out: torch.Tensor | None = None,
    recenter: bool = False,
    recenter_from: int = 0,
    tap_sums: torch.Tensor | None = None,
    recenter_fallback: torch.Tensor | None = None,
) -> torch.Tensor:
    """``head_act(act(conv1d(x) + bias) @ head_weight + head_bias)`` per step; returns float32 [N, L_out, D].

    Args:
        x: [N, C, L] float32 (float16 / bfloat16 accepted) with any strides, e.g. ``buf.transpose(1, 2)`` of a
            time-major [N, L, C] buffer.
        weight: conv weights [O, C/groups, K], float16 (float32 / bfloat16 accepted), used at stored values.
        bias: optional [O] conv bias, added before ``activation``.
        head_weight: [O, D] float16 (float32 / bfloat16 accepted).
        head_bias: optional [D], added before ``head_activation``.
        dilation, groups, padding, activation: as in :func:`tsconv.kernels.conv1d.conv1d`.
        head_activation: None/"none", "relu", "gelu" (exact erf form) or "tanh".
        precision: "fp32" (default; float32-accurate 3xTF32 on tensor cores for both products), or the opt-in
            "tf32" / "fp16" (10-bit mantissas; unfit for raw price levels).
        out: optional float32 [N, L_out, D] destination with any non-overlapping strides; it must not share
            memory with the inputs. Without it a contiguous [N, L_out, D] tensor is allocated.
        recenter, recenter_from, tap_sums, recenter_fallback: the conv's per-block re-centering for raw levels, as in
            :func:`tsconv.kernels.conv1d.conv1d` ("fp32" only).

    Fused for dense convs (groups = 1) with O <= 1024 and D <= 256 (see :func:`fused_path`); other shapes
    (grouped and depthwise banks, wider convs or heads) run conv1d then gemm, with a [N, L_out, O] float32
    intermediate. Asynchronous on CUDA and not differentiable; the first call of a shape class on a GPU
    tunes the tiles (launches into ``out``), so make it before any CUDA graph capture.

    Raises:
        ShapeError: a shape, dtype, device, stride or option that does not fit.

    Under ``torch.compile`` the call is the custom op ``torch.ops.tsconv.conv1d_head`` (one node of the
    graph; ``out`` is filled by a copy).
    """
    if torch.compiler.is_compiling():
        # one graph node instead of a trace into the tuner and Triton's launcher
        y = _conv1d_head_op(x, weight, bias, head_weight, head_bias, dilation, groups, padding, activation,
                            head_activation, precision, recenter, recenter_from, tap_sums,
                            recenter_fallback)  # fmt: skip
        return y if out is None else out.copy_(y)
    spec = _validate(
        x,
        weight,
        bias,
        head_weight,
        head_bias,
        out,
        dilation=dilation,
        groups=groups,
        padding=padding,
        activation=activation,
        head_activation=head_activation,
        precision=precision,
        recenter=recenter,
        recenter_from=recenter_from,
    )
    c = spec.conv
    check_tap_sums(tap_sums, weight, c)
    check_fallback(recenter_fallback, x, c)
    if out is None:
        out = torch.empty((c.N, c.L_out, spec.D), dtype=torch.float32, device=x.device)
    if out.numel() == 0:
        return out
    reason = _unfused_reason(spec)
    if reason is None and not x.is_cuda and not torch_side.INTERPRETED:
        reason = "CPU tensors without the Triton interpreter take the torch path"
    with torch.no_grad():
        if reason is not None:
            last_launch.clear()
            last_launch.update(path="unfused", reason=reason)
            _unfused(x, weight, bias, head_weight, head_bias, out, spec, tap_sums, recenter_fallback)
        elif x.is_cuda:
            with torch.cuda.device(x.device):  # Triton launches on the current device and stream
                _fused_triton(x, weight, bias, head_weight, head_bias, out, spec, tap_sums=tap_sums,
                              fallback=recenter_fallback)  # fmt: skip
        else:
            _fused_triton(x, weight, bias, head_weight, head_bias, out, spec, tap_sums=tap_sums,
                          fallback=recenter_fallback)  # fmt: skip
    return out


@custom_op("tsconv::conv1d_head", __name__)
def _conv1d_head_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    head_weight: torch.Tensor,
    head_bias: torch.Tensor | None,
    dilation: int,
    groups: int,
    padding: str,
    activation: str | None,
    head_activation: str | None,
    precision: str,
    recenter: bool,
    recenter_from: int,
    tap_sums: torch.Tensor | None,
    recenter_fallback: torch.Tensor | None,
) -> torch.Tensor:
    """``torch.ops.tsconv.conv1d_head``: :func:`conv1d_head` without ``out``."""
    return conv1d_head(x, weight, bias, head_weight, head_bias, dilation=dilation, groups=groups,
                       padding=padding, activation=activation, head_activation=head_activation,
                       precision=precision, recenter=recenter, recenter_from=recenter_from, tap_sums=tap_sums,
                       recenter_fallback=recenter_fallback)  # fmt: skip


@_conv1d_head_op.register_fake
def _conv1d_head_fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    head_weight: torch.Tensor,
    head_bias: torch.Tensor | None,
    dilation: int,
    groups: int,
    padding: str,
    activation: str | None,
    head_activation: str | None,
    precision: str,
    recenter: bool,
    recenter_from: int,
    tap_sums: torch.Tensor | None,
    recenter_fallback: torch.Tensor | None,
) -> torch.Tensor:
    # the same checks as a real call, so a misfit fails while tracing with conv1d_head's message
    spec = _validate(x, weight, bias, head_weight, head_bias, None, dilation=dilation, groups=groups,
                     padding=padding, activation=activation, head_activation=head_activation,
                     precision=precision, recenter=recenter, recenter_from=recenter_from)  # fmt: skip
    check_tap_sums(tap_sums, weight, spec.conv)
    check_fallback(recenter_fallback, x, spec.conv)
    return x.new_empty((spec.conv.N, spec.conv.L_out, head_weight.shape[1]), dtype=torch.float32)


def _unfused(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    head_weight: torch.Tensor,
    head_bias: torch.Tensor | None,
    out: torch.Tensor,
    spec: _Spec,
    tap_sums: torch.Tensor | None = None,
    fallback: torch.Tensor | None = None,
) -> None:
    """conv1d into a time-major [N, L_out, O] buffer, then gemm on its [N * L_out, O] view."""
    c = spec.conv
    y = torch.empty((c.N, c.L_out, c.O), dtype=torch.float32, device=x.device)
    _conv.conv1d(
        x,
        weight,
        bias,
        dilation=c.dilation,
        groups=c.groups,
        padding=_padding_name(c),
        activation=_ACT_NAME[c.act],
        precision=c.precision,
        out=y.transpose(1, 2),
        recenter=c.recenter,
        recenter_from=c.recenter_from,
        tap_sums=tap_sums,
        recenter_fallback=fallback,
    )
    rows = c.N * c.L_out
    try:
        out2 = out.view(rows, spec.D)
    except RuntimeError:  # strides that do not merge (N, L_out): a temporary, then one copy
        out2 = None
    target = out2 if out2 is not None else torch.empty((rows, spec.D), dtype=torch.float32, device=x.device)
    _gemm.gemm(
        y.view(rows, c.O),
        head_weight,
        head_bias,
        activation=_ACT_NAME[spec.head_act],
        precision=c.precision,
        out=target,
    )
    if out2 is None:
        out.copy_(target.view(c.N, c.L_out, spec.D))


# --------------------------------------------------------------------------------------------------------
# Triton launcher
# --------------------------------------------------------------------------------------------------------


def _prepare_head_weights(hw: torch.Tensor, precision: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[O, D] -> [D, O padded to 16], contiguous along the reduction (O), like the conv weights.

    fp32/tf32: float32 TF32 high part (exact for float16 weights) and, for float32 weights in "fp32", the
    TF32 low part; fp16: float16.
    """
    O, D = hw.shape
    o_pad = -(-O // 16) * 16
    dtype = torch.float16 if precision == "fp16" else torch.float32
    buf = torch.zeros((D, o_pad), dtype=dtype, device=hw.device)
    buf[:, :O] = hw.t()
    if precision == "fp16":
        return buf, None
    hi = round_tf32_torch(buf)
    lo = None
    if precision == "fp32" and hw.dtype == torch.float32:
        lo = round_tf32_torch(buf - hi)
    return hi, lo


def _layout3(t: torch.Tensor, channel_dim: int) -> str:
    if t.stride(channel_dim) == 1:
        return "chan"
    if t.stride(3 - channel_dim) == 1:
        return "time"
    return "st"


def _fused_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    head_weight: torch.Tensor,
    head_bias: torch.Tensor | None,
    out: torch.Tensor,
    spec: _Spec,
    *,
    config: autotune.Config | None = None,
    tap_sums: torch.Tensor | None = None,
    fallback: torch.Tensor | None = None,
) -> object:
    """Run the fused kernel; ``config`` (tests only) bypasses the tuner; ``fallback``: conv1d_head's
    ``recenter_fallback``. Returns the last launch's result."""
    c = spec.conv
    w_hi, w_lo = WEIGHTS.get(  # [1, K, O, C padded to 16], shared with conv1d's cache
        weight, ("dense", 1, c.precision), lambda w: prepare_dense_weights(w, 1, c.precision)
    )
    h_hi, h_lo = WEIGHTS.get(  # cached: building it takes three small kernels and an allocation
        head_weight, ("head", c.precision), lambda hw: _prepare_head_weights(hw, c.precision)
    )
    b = None if bias is None else bias.contiguous()
    hb = None if head_bias is None else head_bias.contiguous()
    block_d = max(16, autotune.pow2_bucket(spec.D))
    x_copy = x.numel() if c.precision == "tf32" else 0  # the rounded copy of x is dense (see round_x)
    index64 = (
        _FORCE_INDEX64 or max(max_offset(x), x_copy, max_offset(out), w_hi.numel(), h_hi.numel()) > _INT32_MAX
    )
    pad = (c.K - 1) * c.dilation if c.causal else 0
    meta = {
        "HAS_BIAS": b is not None,
        "HAS_HBIAS": hb is not None,
        "ACT": c.act,
        "HEAD_ACT": spec.head_act,
        "PREC": _PREC_CODE[c.precision],
        "A_SPLIT": _A_SPLIT if x.dtype == torch.float32 or c.recenter else 1,
        "H_SPLIT": _A_SPLIT,
        "W_SPLIT": w_lo is not None,
        "HW_SPLIT": h_lo is not None,
        "FLUSH": _FLUSH,
        "ROUND_H": c.precision == "tf32" and _ROUND_TF32,
        "INDEX64": index64,
        "RECENTER": c.recenter,
        "FALLBACK": fallback is not None,
        "BLOCK_D": block_d,
    }
    sums = recenter_sums(weight, tap_sums) if c.recenter else w_hi
    # "tf32": float32 x rounded to TF32 once, as conv1d does (the conv loop loads each x value K times per
    # O block, so rounding it in registers there would cost K times and lose the shared-memory operand path).
    round_x = c.precision == "tf32" and x.dtype == torch.float32 and _ROUND_TF32
    cast: dict[str, torch.Tensor] = {}

    def launch(cfg: autotune.Config) -> object:
        kw = cfg.launch_kwargs()
        kw["BLOCK_O"] = max(16, min(kw["BLOCK_O"], _MAX_BLOCK_O, autotune.pow2_bucket(c.O)))
        if kw.pop("TMA", 0):
            return launch_tma(kw)
        x_k = x
        if round_x:  # per launch, so the tuner's timings include it
            if "x" not in cast:
                cast["x"] = tf32_buffer(x)
            x_k = cast["x"]
            round_tf32_into(x, x_k)
        n_tblk = triton.cdiv(c.L_out, kw["BLOCK_T"])
        grid = (c.N * n_tblk,)
        _check_grid(grid[0])
        return _conv1d_head_kernel[grid](
            x_k,
            w_hi,
            w_hi if w_lo is None else w_lo,
            w_hi if b is None else b,
            sums,
            sums if fallback is None else fallback,
            h_hi,
            h_hi if h_lo is None else h_lo,
            h_hi if hb is None else hb,
            out,
            c.L,
            c.L_out,
            c.C,
            c.O,
            spec.D,
            c.K,
            c.dilation,
            pad,
            c.recenter_from,
            n_tblk,
            *x_k.stride(),
            w_hi.stride(1),
            w_hi.stride(2),
            h_hi.stride(0),
            *out.stride(),
            **meta,
            **kw,
        )

    def launch_tma(kw: dict[str, int]) -> object:
        a16 = kw.pop("A16", 0) and c.precision == "fp16" and x.dtype != torch.float16
        x_k = x
        if a16:
            if "a16" not in cast:
                cast["a16"] = a16_buffer(x, c)
            x_k = cast["a16"]
            x_k.copy_(x)
        bt, bo, bc = kw.pop("BLOCK_T"), kw.pop("BLOCK_O"), kw.pop("BLOCK_C")
        round_tf32 = c.precision == "tf32" and x_k.dtype == torch.float32
        x_desc, w_desc = dense_descriptors(x_k, w_hi, ([1, bt, bc], [bo, bc], round_tf32))
        n_tblk = triton.cdiv(c.L_out, bt)
        grid = (c.N * n_tblk,)
        _check_grid(grid[0])
        return _conv1d_head_tma_kernel[grid](
            x_desc,
            w_desc,
            w_hi if b is None else b,
            h_hi,
            h_hi if hb is None else hb,
            out,
            c.L,
            c.L_out,
            c.C,
            c.O,
            spec.D,
            c.K,
            c.dilation,
            pad,
            n_tblk,
            h_hi.stride(0),
            *out.stride(),
            HAS_BIAS=b is not None,
            HAS_HBIAS=hb is not None,
            ACT=c.act,
            HEAD_ACT=spec.head_act,
            PREC=_PREC_CODE[c.precision],
            ROUND_H=c.precision == "tf32" and _ROUND_TF32,
            BLOCK_T=bt,
            BLOCK_O=bo,
            BLOCK_C=bc,
            BLOCK_D=block_d,
            **kw,
        )

    if config is None:
        use_tma = _TMA_ENABLED and _tma_ok(x, w_hi, c)
        space = conv1d_head_space(c.precision, c.C, c.O, spec.D, tma=use_tma)
        key = (
            f"{c.precision}|x={_dtype_name(x)}|w={_dtype_name(weight)}|hw={_dtype_name(head_weight)}"
            f"|in={_layout3(x, 1)}|out={_layout3(out, 2)}|C={autotune.pow2_bucket(c.C)}"
            f"|O={autotune.pow2_bucket(c.O)}|D={autotune.pow2_bucket(spec.D)}|K={autotune.pow2_bucket(c.K)}"
            f"|NL={autotune.pow2_bucket(c.N * c.L_out)}"
        )
        config = autotune.select(space, key, launch, device=x.device, interpreted=torch_side.INTERPRETED)
    last_launch.clear()
    last_launch.update(path="fused", config=config.name)
    return launch(config)
