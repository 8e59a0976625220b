"""Input preparation on the GPU: upcast, forward fill, centering and the halo, in one pass over the input.

The batched engine (:mod:`tsconv.stream.batched`) hands the raw rows of a step (or of one band of it) to
:func:`prepare`, which writes the first stage's input ``xc`` [halo + n, C] float32, time-major:

* rows ``halo ..``: the step's rows, upcast to float32, forward filled (NaN takes the feature's last
  value, carried across steps in ``state``), minus a per-feature level;
* rows ``0 .. halo``: the previous rows (``carry_in``, raw filled values kept exactly) minus the level,
  written by the step's last piece once the level is final.

The level is the one the CPU engine uses (see ``Backend._first_stage``): the last value before the step,
or, for a feature that has none yet, its first value in the step (earlier rows are NaN anyway), else 0.
Subtracting it is the same float32 operation the CPU engine performs, so the conv sees the same numbers.

Reading the input once matters: in ``--transfer mapped`` mode ``src`` is host memory mapped into the
GPU's address space and this kernel is its only reader. One program owns a block of features and walks
the rows in tiles, so the fill carry stays in registers; a few dozen programs suffice to reach the
bandwidth this pass needs (a step's conv costs several times more).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["prepare"]

_BT = 64  # rows per tile
_BC = 16  # features per program: 64 programs at 1024 features; each tile row is 64 contiguous bytes


@triton.jit
def _last_valid(a, b):
    # Associative: the later of two values unless it is NaN (x != x only for NaN).
    return tl.where(b == b, b, a)


@triton.jit
def _prep_kernel(
    src_ptr,
    stride_sr,
    stride_sc,
    cols_ptr,
    n,
    off,
    n_step,
    halo,
    C,
    state_ptr,
    level_ptr,
    carry_in_ptr,
    carry_out_ptr,
    xc_ptr,
    stride_xr,
    FILL: tl.constexpr,
    CENTER: tl.constexpr,
    LAST: tl.constexpr,
    HAS_COLS: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
):
    pid = tl.program_id(0)
    cidx = pid * BC + tl.arange(0, BC)
    cmask = cidx < C
    if HAS_COLS:
        scol = tl.load(cols_ptr + cidx, mask=cmask, other=0).to(tl.int64)
    else:
        scol = cidx.to(tl.int64)
    state = tl.load(state_ptr + cidx, mask=cmask, other=float("nan"))
    lvl = tl.load(level_ptr + cidx, mask=cmask, other=0.0)  # NaN: not known yet
    rows = tl.arange(0, BT)
    keep_from = n_step - halo  # step rows at or after this one are the next step's halo
    for t0 in range(0, n, BT):
        r = t0 + rows
        m = (r < n)[:, None] & cmask[None, :]
        ptrs = src_ptr + r[:, None].to(tl.int64) * stride_sr + scol[None, :] * stride_sc
        x = tl.load(ptrs, mask=m, other=float("nan")).to(tl.float32)
        # A scan keeps the order of its operands; a reduction need not (GPU reductions combine lanes in
        # butterfly order), so "last valid" and "first valid" below use order-free sums and minima.
        scanned = tl.associative_scan(x, 0, _last_valid)
        last = tl.sum(tl.where(rows[:, None] == BT - 1, scanned, 0.0), axis=0)  # NaN: none in this tile
        filled = tl.where(scanned == scanned, scanned, state[None, :])
        state = tl.where(last == last, last, state)
        valid = filled == filled
        first_row = tl.min(tl.where(valid, rows[:, None], BT), axis=0)
        first = tl.sum(tl.where(valid & (rows[:, None] == first_row[None, :]), filled, 0.0), axis=0)
        first = tl.where(first_row < BT, first, float("nan"))
        lvl = tl.where(lvl == lvl, lvl, first)
        v = filled if FILL else x
        g = off + r  # row within the step
        if CENTER:
            y = v - lvl[None, :]
        else:
            y = v
        xrow = (halo + g).to(tl.int64)
        tl.store(xc_ptr + xrow[:, None] * stride_xr + cidx[None, :], y, mask=m)
        if halo > 0:
            crow = (g - keep_from).to(tl.int64)
            cm = m & (g >= keep_from)[:, None]
            tl.store(carry_out_ptr + crow[:, None] * C + cidx[None, :], v, mask=cm)
    tl.store(state_ptr + cidx, state, mask=cmask)
    if LAST:
        lvl = tl.where(lvl == lvl, lvl, 0.0)
        for h0 in range(0, halo, BT):
            h = h0 + rows
            hm = (h < halo)[:, None] & cmask[None, :]
            c = tl.load(carry_in_ptr + h[:, None].to(tl.int64) * C + cidx[None, :], mask=hm, other=0.0)
            if CENTER:
                c = c - lvl[None, :]
            tl.store(xc_ptr + h[:, None].to(tl.int64) * stride_xr + cidx[None, :], c, mask=hm)
    tl.store(level_ptr + cidx, lvl, mask=cmask)


def prepare(
    src: torch.Tensor,
    *,
    xc: torch.Tensor,
    state: torch.Tensor,
    level: torch.Tensor,
    carry_in: torch.Tensor,
    carry_out: torch.Tensor,
    off: int,
    n_step: int,
    cols: torch.Tensor | None = None,
    fill: bool = True,
    center: bool = True,
    last: bool = True,
) -> None:
    """Prepare rows ``off .. off + len(src)`` of a step of ``n_step`` rows into ``xc`` (see the module doc).

    ``src`` [n, F_src] any float/int dtype and strides (device memory, or mapped host memory), ``cols``
    the int64 source column of each of the C prepared features (None: the first C). ``state`` [C]
    (fill state, updated), ``level`` [C] (set it to ``state`` before a step's first piece; NaN where
    unknown; final after the ``last`` piece), ``carry_in``/``carry_out`` [halo, C] float32 contiguous
    (the previous step's last raw filled rows, and this step's), ``xc`` [halo + n_step, C] float32 with
    unit column stride. Pieces of one step must be prepared in order, on one stream.
    """
    C = xc.shape[1]
    halo = xc.shape[0] - n_step
    n = src.shape[0]
    if n == 0 and not last:
        return
    if halo == 0:  # no carry rows: any valid pointer will do, the kernel never touches them
        carry_in = carry_out = state
    grid = (triton.cdiv(C, _BC),)
    _prep_kernel[grid](
        src,
        src.stride(0),
        src.stride(1),
        cols if cols is not None else state,
        n,
        off,
        n_step,
        halo,
        C,
        state,
        level,
        carry_in,
        carry_out,
        xc,
        xc.stride(0),
        FILL=fill,
        CENTER=center,
        LAST=last,
        HAS_COLS=cols is not None,
        BT=_BT,
        BC=_BC,
        num_warps=2,
    )
