"""conv1d's direct family: FMAs in float32 registers, for depthwise filter banks and few channels per group.

For any conv with fewer than 16 input or output channels per group (depthwise banks: groups = C, M filters
per channel). The FLOPs are few, so these kernels aim at memory bandwidth; they compute in float32 whatever
``precision`` says.

- ``_conv1d_direct_kernel``: a program owns a [BLOCK_T steps, BLOCK_G groups, BLOCK_M filters] tile and loads
  each input value once per tap; the tap loop runs in compile-time chunks of ``UNROLL`` taps (several taps'
  loads in flight) plus a tail.
- ``_conv1d_bank_kernel`` (one input channel per group): the same sums over several time blocks per program,
  the blocks inside the series without masks.
- For one input channel per group the tuner's first candidates are the generated register-window kernels of
  :mod:`tsconv.kernels.conv1d.window`, which :func:`launch_direct` runs for configs with ``WINDOW``: each x
  value is loaded once and feeds all its thread's rows and filters (2.5-5x the direct and bank kernels on the
  H200; benchmarks/NOTES.md, "Kernels: depthwise banks").
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from tsconv.kernels import autotune, torch_side
from tsconv.kernels.checks import INT32_MAX as _INT32_MAX
from tsconv.kernels.checks import dtype_name as _dtype_name
from tsconv.kernels.common import activate, check_grid, level, level_fallback, max_offset
from tsconv.kernels.conv1d import state
from tsconv.kernels.conv1d.spec import ConvSpec, layout
from tsconv.kernels.conv1d.window import launch_window
from tsconv.kernels.launch import LaunchPlan, extent, launch_recorded
from tsconv.kernels.torch_side import WEIGHTS, recenter_sums

__all__ = ["launch_direct"]


# --------------------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------------------


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
    f_ptr,
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
    FALLBACK: tl.constexpr,
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
    # recenter: each input channel's level is its value at the block's first output step (see common.level)
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
            fb = level_fallback(f_ptr + ci, offs_g * CG, g_mask, FALLBACK)
            lv1 = level(lv_ptrs, t_lvl, lv_min, dilation, stride_xt, L_in, g_mask, fb, 5)
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
    acc = activate(acc, ACT)
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
    f_ptr,
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
    FALLBACK: tl.constexpr,
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
    # 8-filter bank, 5.30 -> 3.81 ms at K = 64, and lost the 4-filter ones: benchmarks/NOTES.md, "Kernels:
    # depthwise banks").
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
        fb = level_fallback(f_ptr, offs_g, g_mask, FALLBACK)[None, :, None]
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
            if RECENTER:  # the level: each channel's x at this block's first output step (see common.level)
                lv = level(
                    x_base,
                    t0 - pad + (K - 1) * dilation,
                    lv_min,
                    dilation,
                    stride_xt,
                    L_in,
                    g_mask[None, :, None],
                    fb,
                    5,
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
            tl.store(y_ptrs, activate(acc, ACT), mask=(offs_t < L_out)[:, None, None] & gm_mask[None, :, :])


# --------------------------------------------------------------------------------------------------------
# launchers
# --------------------------------------------------------------------------------------------------------


def _direct_weights(weight: torch.Tensor, *, G: int, Og: int, Cg: int, K: int) -> torch.Tensor:
    """[O, Cg, K] -> [Cg, K, O/G, G] for the direct and bank kernels (cached per weight tensor): channels
    contiguous like x, upcast to float32 once here (the bank is small; converting float16 in the tap loop
    would cost one instruction per weight per tap, half as many as FMAs)."""
    return WEIGHTS.get(
        weight,
        ("direct", G),
        lambda w: w.reshape(G, Og, Cg, K).permute(2, 3, 1, 0).to(torch.float32).contiguous(),
    )


def launch_direct(
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
    """Launch a direct, bank or window kernel for ``spec`` (the config says which): with ``config`` (tests),
    else with the tuner's pick for the shape class. ``plan_key``: record the launch as a plan, with the
    function that packs a weight tensor for that kernel. ``fallback``: conv1d's ``recenter_fallback``.
    Returns what the launch returned."""
    G, K = spec.groups, spec.K
    Cg, Og = spec.C // G, spec.O // G
    # Packed only when a direct or bank config runs: the window kernel packs its own layout.
    pack_direct = functools.partial(_direct_weights, G=G, Og=Og, Cg=Cg, K=K)
    recorded: dict[str, object] = {}

    block_m = min(autotune.pow2_bucket(Og), 16)
    index64 = state.FORCE_INDEX64 or max(max_offset(x), max_offset(out), weight.numel()) > _INT32_MAX
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
        "FALLBACK": fallback is not None,
        "BLOCK_M": block_m,
    }

    def launch(cfg: autotune.Config) -> object:
        kw = cfg.launch_kwargs()
        if kw.pop("WINDOW", 0):
            return launch_window(x, weight, bias, out, spec, index64, kw, recorded, tap_sums, fallback)
        kw.setdefault("UNROLL", 1)
        wp = pack_direct(weight)
        sums = recenter_sums(weight, tap_sums) if spec.recenter else wp
        f = sums if fallback is None else fallback
        recorded["pack"] = pack_direct
        if kw.pop("BANK", 0):
            return _launch_bank(x, wp, bias, sums, f, out, spec, meta, kw, recorded)
        n_tblk = triton.cdiv(spec.L_out, kw["BLOCK_T"])
        n_gblk = triton.cdiv(G, kw["BLOCK_G"])
        n_mblk = triton.cdiv(Og, block_m)
        grid = (spec.N * n_tblk * n_gblk * n_mblk,)
        check_grid(grid[0])
        args = (
            x,
            wp,
            wp if bias is None else bias,
            sums,
            f,
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
            f"x={_dtype_name(x)}|w={_dtype_name(weight)}|in={layout(x)}|out={layout(out)}"
            f"|G={autotune.pow2_bucket(G)}|Cg={autotune.pow2_bucket(Cg)}|Og={autotune.pow2_bucket(Og)}"
            f"|K={autotune.pow2_bucket(K)}|NL={autotune.pow2_bucket(spec.N * spec.L_out)}"
        )
        config = autotune.select(space, key, launch, device=x.device, interpreted=torch_side.INTERPRETED)
    path = "window" if config.meta.get("WINDOW") else "bank" if config.meta.get("BANK") else "direct"
    state.last_launch.update(path=path, config=config.name)
    ret = launch(config)
    if plan_key is not None:
        plan = LaunchPlan(
            recorded["fn"], recorded["ret"], recorded["grid"], recorded["args"], state.DIRECT_SLOTS
        )
        extents = (extent(out), extent(x), extent(weight), extent(bias))
        state.PLANS.put(plan_key, state.ConvPlan(plan, path, config.name, spec, extents, recorded["pack"]))
    return ret


def _launch_bank(
    x: torch.Tensor,
    wp: torch.Tensor,
    bias: torch.Tensor | None,
    sums: torch.Tensor,
    f: torch.Tensor,
    out: torch.Tensor,
    spec: ConvSpec,
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
    check_grid(grid[0])
    bank_meta = {k: v for k, v in meta.items() if k != "CG"}
    bank_meta["EVEN"] = G % kw["BLOCK_G"] == 0 and Og % block_m == 0
    args = (
        x,
        wp,
        wp if bias is None else bias,
        sums,
        f,
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
