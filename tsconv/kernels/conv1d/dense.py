"""conv1d's dense family: the implicit GEMM on tensor cores, its TMA variant, their launcher and weights.

For dense and grouped convs with at least 16 input and 16 output channels per group.

- ``_conv1d_dense_kernel``: output tile [BLOCK_T steps, BLOCK_O channels]; the reduction runs over taps and
  BLOCK_C channel chunks; the A tile is ``x[n, c0:c0+BC, t + k*d - pad]`` read in place (causal zeros come
  from load masks, never from a padded copy); the B tile comes from weights rearranged once per weight tensor
  to [groups, K, O/groups, C/groups] (:func:`prepare_dense_weights`) so that it is contiguous along the
  reduction (channels).
  Precision "fp32" (see ``common.dot_fp32``): float32 x is split into three TF32 parts (x_hi + x_mid + x_lo,
  each exact in TF32, so with float16 weights, exact in TF32, the three tensor-core products are exact);
  float32 weights add a TF32 low part (five products). Each reduction step's products go into a fresh
  tensor-core accumulator that is then added to the running float32 sum on the CUDA cores ("flush"). Why:
  tensor cores truncate float32 operands to TF32 and round each accumulation step toward zero (Fasi et al.
  2021; Khattak and Mikaitis 2025), so on raw price levels through zero-sum filters, where the running sum is
  ~100x the result, accumulating in the tensor core gave errors growing linearly with C*K (H200: 5.7x / 9x /
  20x cuDNN's float32 error at K = 5 / 16 / 64). ``conv1d_reference.emulate_tensor_cores`` models this
  arithmetic in the interpreter; under it the unflushed scheme fails and this one passes (tests). "tf32" uses
  one TF32 product: weights rounded to TF32 once per weight tensor; float32 x rounded to TF32 (ties to even)
  by a memory-bound pre-pass into a float32 copy in x's layout (``common.round_tf32_into``), which the kernel
  reads as loaded, so both operands stay in shared memory and the tensor core's truncation finds nothing to
  drop (feeding x unrounded, truncated, doubled the error on the H200). "fp16": float16 weights; float32 x is
  either cast once by the launcher into a time-major float16 copy (configs ``*_a16``, :func:`a16_buffer`) or
  converted in registers (the tuner picks). Accumulation is always float32. ``GROUP_T``: grouped program
  ordering.
- ``_conv1d_dense_tma_kernel`` (Hopper; "tf32" / "fp16", groups = 1, time-major x with 16-byte aligned rows):
  the same implicit GEMM with x tiles (and, ``W_TMA``, weight tiles) loaded by the TMA through a 3-D
  [N, L, C] descriptor (:func:`dense_descriptors`): the copy engine zero-fills the causal history, the series
  end and channels past C (no masks in the loop), and for "tf32" rounds float32 x to TF32 on the way
  (``tsconv.kernels.tma``), so the pre-pass above is not needed. Its candidates sit in the same tuning space
  as the pointer kernel's. Its tile loop (:func:`tma_conv_tile`) is the fused conv -> head TMA kernel's too.

The figures behind these choices: benchmarks/NOTES.md, "Precision" and "Kernels: conv1d (dense)".
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tsconv.kernels import autotune, tma, torch_side
from tsconv.kernels.checks import INT32_MAX as _INT32_MAX
from tsconv.kernels.checks import PREC_CODE as _PREC_CODE
from tsconv.kernels.checks import dtype_name as _dtype_name
from tsconv.kernels.common import (
    activate,
    check_grid,
    dot_fp32,
    grouped,
    level,
    level_fallback,
    max_offset,
    round_tf32_into,
    tf32_buffer,
)
from tsconv.kernels.conv1d import state
from tsconv.kernels.conv1d.spec import ConvSpec, layout
from tsconv.kernels.launch import LaunchPlan, extent, launch_recorded
from tsconv.kernels.torch_side import WEIGHTS, recenter_sums, round_tf32_torch

__all__ = [
    "a16_buffer",
    "dense_descriptors",
    "dense_weights",
    "launch_dense",
    "prepare_dense_weights",
    "replay",
    "tma_conv_tile",
]


# --------------------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------------------


# Sizes, offsets and block counts are not specialised on (divisibility by 16, == 1): that would compile a new
# variant for every series length and tap count; strides and channel counts still are (they set vector widths).
@triton.jit(do_not_specialize=["L_in", "L_out", "G", "K", "dilation", "pad", "lv_min", "n_tblk", "n_oblk"])
def _conv1d_dense_kernel(
    x_ptr,
    w_ptr,
    wlo_ptr,
    b_ptr,
    s_ptr,
    f_ptr,
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
    FALLBACK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_C: tl.constexpr,
    GROUP_T: tl.constexpr,
):
    # Program order within a series: GROUP_T time blocks sweep all (group, output-channel) blocks together
    # (grouped), so the x rows and weight blocks a wave of programs touches stay in L2. GROUP_T = 1:
    # output-channel blocks fastest (they share the same x rows), then time.
    pid = tl.program_id(0)
    n_go = G * n_oblk
    per_n = n_tblk * n_go
    n = pid // per_n
    pid_t, pid_go = grouped(pid % per_n, n_tblk, n_go, GROUP_T)
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
    # recenter: each channel's level is its value at the block's first output step (see common.level)
    t_lvl = pid_t * BLOCK_T - pad + (K - 1) * dilation
    if INDEX64:
        t_lvl = t_lvl.to(tl.int64)
    lv_ptrs = x_base + offs_c * stride_xc
    f_base = f_ptr + g * Cg  # the group's channels' fallback levels
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
                fb = level_fallback(f_base + c0, offs_c, c_ok, FALLBACK)
                lv = level(lv_ptrs + c0 * stride_xc, t_lvl, lv_min, dilation, stride_xt, L_in, c_ok, fb, 5)
                a = a - lv[None, :]
            acc = dot_fp32(a, b, wlo_ptrs + w_off, w_mask, acc, A_SPLIT, W_SPLIT, FLUSH)
        elif PREC == 1:
            # x as loaded (no rounding in registers): the launcher's pre-pass already rounded float32 x to
            # TF32 (ties to even), so the tensor core's truncation to TF32 changes nothing, and an operand
            # straight from memory stays in shared memory (async copies pipelined ahead, wgmma reading both
            # operands from shared memory). Weights were rounded once per call.
            acc = tl.dot(a.to(tl.float32), b, acc, input_precision="tf32")
        else:
            # float16 x (the launcher's pre-cast copy, or float16 input) goes to shared memory as loaded.
            acc = tl.dot(a.to(tl.float16), b, acc)

    if RECENTER:  # + sum over channels of level * tap sum (float64 [O, Cg]; see torch_side.recenter_sums), on the CUDA cores
        addback = tl.full((BLOCK_O,), 0.0, tl.float64)
        for c0 in range(0, Cg, BLOCK_C):
            c_ok = offs_c < Cg - c0
            fb = level_fallback(f_base + c0, offs_c, c_ok, FALLBACK)
            lv = level(lv_ptrs + c0 * stride_xc, t_lvl, lv_min, dilation, stride_xt, L_in, c_ok, fb, 5)
            s_ptrs = s_ptr + (g * Og + offs_o)[None, :].to(tl.int64) * Cg + (c0 + offs_c)[:, None]
            s = tl.load(s_ptrs, mask=c_ok[:, None] & o_mask[None, :], other=0.0)
            addback += tl.sum(s * lv.to(tl.float64)[:, None], axis=0)
        acc = acc + addback.to(tl.float32)[None, :]
    if HAS_BIAS:
        bias = tl.load(b_ptr + g * Og + offs_o, mask=o_mask, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    acc = activate(acc, ACT)
    y_ptrs = (
        y_ptr
        + n.to(tl.int64) * stride_yn
        + (g * Og).to(tl.int64) * stride_yo
        + offs_o[None, :] * stride_yo
        + offs_t[:, None] * stride_yt
    )
    tl.store(y_ptrs, acc, mask=(offs_t < L_out)[:, None] & o_mask[None, :])


@triton.jit
def tma_conv_tile(
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
    pid_t, pid_o = grouped(pid % per_n, n_tblk, n_oblk, GROUP_T)

    t0 = pid_t * BLOCK_T
    offs_o = pid_o * BLOCK_O + tl.arange(0, BLOCK_O)
    offs_c = tl.arange(0, BLOCK_C)
    o_mask = offs_o < O
    w_ptrs = w_ptr + offs_o[None, :] * stride_wo + offs_c[:, None]

    acc = tma_conv_tile(
        x_desc, w_desc, w_ptrs, n, t0, pid_o * BLOCK_O, pad, dilation, K, C, O, offs_c, o_mask, stride_wk,
        PREC, W_TMA, BLOCK_T, BLOCK_O, BLOCK_C,
    )  # fmt: skip

    offs_t = t0 + tl.arange(0, BLOCK_T)
    if HAS_BIAS:
        bias = tl.load(b_ptr + offs_o, mask=o_mask, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    acc = activate(acc, ACT)
    y_ptrs = (
        y_ptr
        + n.to(tl.int64) * stride_yn
        + offs_o.to(tl.int64)[None, :] * stride_yo
        + offs_t.to(tl.int64)[:, None] * stride_yt
    )
    tl.store(y_ptrs, acc, mask=(offs_t < L_out)[:, None] & o_mask[None, :])


# --------------------------------------------------------------------------------------------------------
# weights and operands
# --------------------------------------------------------------------------------------------------------


def prepare_dense_weights(
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
    hi = round_tf32_torch(wp)
    lo = None
    if precision == "fp32" and weight.dtype == torch.float32:
        lo = round_tf32_torch(wp - hi)
    return hi, lo


def dense_weights(weight: torch.Tensor, spec: ConvSpec) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The dense kernels' weights for this call (:func:`prepare_dense_weights`, cached per weight tensor)."""
    G, precision = spec.groups, spec.precision
    return WEIGHTS.get(weight, ("dense", G, precision), lambda w: prepare_dense_weights(w, G, precision))


def a16_buffer(x: torch.Tensor, spec: ConvSpec) -> torch.Tensor:
    """An uninitialised float16 [N, C, L] view of a time-major buffer, rows padded to 16 bytes.

    The "fp16" A16 configs cast x into it in one bandwidth-bound pass; the kernel then reads half the bytes
    and both tl.dot operands go to shared memory as loaded (no conversion in registers). The padding lets a
    TMA descriptor read the copy whatever C is."""
    c_pad = -(-spec.C // 8) * 8
    buf = torch.empty((spec.N, spec.L, c_pad), dtype=torch.float16, device=x.device)
    return buf[..., : spec.C].transpose(1, 2)


def dense_descriptors(x_k: torch.Tensor, w_hi: torch.Tensor, blocks: tuple) -> tuple[object, object]:
    """The TMA kernel's x descriptor (over the time-major view of ``x_k``) and weight operand: a descriptor
    over the [K * O, C padded] view of the packed weights, or the packed weights themselves (pointer loads)."""
    x_block, w_block, round_tf32 = blocks
    x_desc = tma.descriptor(x_k.transpose(1, 2), x_block, round_tf32=round_tf32)
    if w_block is None:
        return x_desc, w_hi
    K, Og = w_hi.shape[1], w_hi.shape[2]
    return x_desc, tma.descriptor(w_hi.view(K * Og, w_hi.shape[-1]), w_block)


# --------------------------------------------------------------------------------------------------------
# launcher
# --------------------------------------------------------------------------------------------------------


def _dense_tma_ok(x: torch.Tensor, spec: ConvSpec) -> bool:
    """Can ``_conv1d_dense_tma_kernel`` run this call? groups = 1 and the time-major [N, L, C] view of x
    usable by a TMA kernel (``tma.usable``: channels contiguous, 16-byte aligned base and strides)."""
    return spec.groups == 1 and tma.usable(x.transpose(1, 2), spec.precision)


def launch_dense(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    spec: ConvSpec,
    config: autotune.Config | None,
    *,
    plan_key: tuple | None = None,
    tap_sums: torch.Tensor | None = None,
    fallback: torch.Tensor | None = None,
) -> object:
    """Launch a dense kernel for ``spec``: with ``config`` (tests), else with the tuner's pick for the shape
    class. ``plan_key``: record the launch as a plan (:func:`replay`). ``fallback``: conv1d's
    ``recenter_fallback``. Returns what the launch returned."""
    G, K = spec.groups, spec.K
    Cg, Og = spec.C // G, spec.O // G
    w_hi, w_lo = dense_weights(weight, spec)
    stride_wk, stride_wo = w_hi.stride(1), w_hi.stride(2)
    # "tf32": float32 x rounded to TF32 by a pre-pass (float16 / bfloat16 x is exact in TF32). Why a
    # pre-pass and not rounding in registers before tl.dot: the A tile of every (tap, channel block) step
    # goes to wgmma straight from shared memory (async copies pipelined ahead); an elementwise op between
    # the load and the dot would route it through registers on every step, and each x value is loaded
    # K * n_oblk times (once per tap and output-channel block), so it would be rounded K * n_oblk times and
    # lose the shared-memory operand path (worth tf32 K=16 0.72x -> 0.91x cuDNN; benchmarks/NOTES.md,
    # "Kernels: conv1d (dense)"). The pre-pass costs one read and one write of x (memory-bound, ~8% of a chunk
    # batch's conv) and leaves the kernel's loop alone: the tensor core's truncation of an already rounded
    # value drops nothing. Rounding errors are
    # within +-1/2 ulp instead of truncation's [0, 1) ulp: half the RMS error on normalised returns.
    round_x = spec.precision == "tf32" and x.dtype == torch.float32 and state.ROUND_X_TF32
    # the pre-cast float16 copy / the rounded float32 copy are dense: their offsets reach numel - 1
    cast_numel = spec.N * spec.L * spec.C if (spec.precision == "fp16" or round_x) else 0
    index64 = (
        state.FORCE_INDEX64 or max(max_offset(x), max_offset(out), w_hi.numel(), cast_numel) > _INT32_MAX
    )
    pad = (K - 1) * spec.dilation if spec.causal else 0
    meta = {
        "HAS_BIAS": bias is not None,
        "ACT": spec.act,
        "PREC": _PREC_CODE[spec.precision],
        # x minus a level is not TF32-exact even for float16 x: recentering always splits
        "A_SPLIT": state.A_SPLIT if x.dtype == torch.float32 or spec.recenter else 1,
        "W_SPLIT": w_lo is not None,
        "FLUSH": state.FLUSH,
        "INDEX64": index64,
        "RECENTER": spec.recenter,
        "FALLBACK": fallback is not None,
    }
    sums = recenter_sums(weight, tap_sums) if spec.recenter else w_hi

    cast: dict[str, torch.Tensor] = {}
    recorded: dict[str, object] = {}

    def launch(cfg: autotune.Config) -> object:
        kw = cfg.launch_kwargs()
        kw.setdefault("GROUP_T", 1)
        a16 = kw.pop("A16", 0) and spec.precision == "fp16" and x.dtype != torch.float16
        use_tma = kw.pop("TMA", 0)
        x_k = x
        prep = state.PREP_NONE
        if a16:
            if "x" not in cast:
                cast["x"] = a16_buffer(x, spec)
            x_k = cast["x"]
            x_k.copy_(x)
            prep = state.PREP_A16
        if use_tma:
            return launch_tma(x_k, kw, prep)
        if round_x and not a16:  # in every launch, so the tuner's timings include it (all tf32 configs alike)
            if "x" not in cast:
                cast["x"] = tf32_buffer(x)
            x_k = cast["x"]
            round_tf32_into(x, x_k)
            prep = state.PREP_ROUND
        n_tblk = triton.cdiv(spec.L_out, kw["BLOCK_T"])
        n_oblk = triton.cdiv(Og, kw["BLOCK_O"])
        grid = (spec.N * n_tblk * G * n_oblk,)
        check_grid(grid[0])
        sx = x_k.stride()
        so = out.stride()
        args = {
            "x_ptr": x_k,
            "w_ptr": w_hi,
            "wlo_ptr": w_hi if w_lo is None else w_lo,
            "b_ptr": w_hi if bias is None else bias,
            "s_ptr": sums,
            "f_ptr": sums if fallback is None else fallback,
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
        x_desc, w_desc = dense_descriptors(x_k, w_hi, blocks)
        n_tblk = triton.cdiv(spec.L_out, bt)
        n_oblk = triton.cdiv(Og, bo)
        grid = (spec.N * n_tblk * n_oblk,)
        check_grid(grid[0])
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
            f"{spec.precision}|x={_dtype_name(x)}|w={_dtype_name(weight)}|in={layout(x)}|out={layout(out)}"
            f"|G={'1' if G == 1 else 'n'}|Cg={autotune.pow2_bucket(Cg)}|Og={autotune.pow2_bucket(Og)}"
            f"|K={autotune.pow2_bucket(K)}|NL={autotune.pow2_bucket(spec.N * spec.L_out)}"
        )
        config = autotune.select(space, key, launch, device=x.device, interpreted=torch_side.INTERPRETED)
    state.last_launch.update(path="dense", config=config.name)
    ret = launch(config)
    if plan_key is not None:
        slots = state.TMA_SLOTS if recorded["tma"] is not None else state.POINTER_SLOTS
        plan = LaunchPlan(recorded["fn"], recorded["ret"], recorded["grid"], recorded["args"], slots)
        extents = (extent(out), extent(x), extent(weight), extent(bias))
        entry = state.ConvPlan(
            plan, "dense", config.name, spec, extents, None, recorded["prep"], recorded["tma"]
        )
        state.PLANS.put(plan_key, entry)
    return ret


def replay(
    entry: state.ConvPlan,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    tap_sums: torch.Tensor | None = None,
    fallback: torch.Tensor | None = None,
) -> None:
    """Launch the plan :func:`launch_dense` recorded with this call's tensors: the weights from the cache, the
    copy of x made by the recorded pass (``state.PREP_*``), the TMA descriptors built afresh."""
    spec = entry.spec
    w_hi, w_lo = dense_weights(weight, spec)
    b = w_hi if bias is None else bias.contiguous()
    x_k = x
    if entry.prep == state.PREP_A16:
        x_k = a16_buffer(x, spec)
        x_k.copy_(x)
    elif entry.prep == state.PREP_ROUND:
        x_k = tf32_buffer(x)
        round_tf32_into(x, x_k)
    if entry.tma is not None:
        x_desc, w_desc = dense_descriptors(x_k, w_hi, entry.tma)
        entry.plan.launch((x_desc, w_desc, w_hi, b, out))
    else:
        sums = recenter_sums(weight, tap_sums) if spec.recenter else w_hi
        f = sums if fallback is None else fallback
        entry.plan.launch((x_k, w_hi, w_hi if w_lo is None else w_lo, b, sums, f, out))
