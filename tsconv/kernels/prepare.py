"""Input preparation on the GPU: upcast, forward fill, the step's level and the halo, in one pass over the input.

The batched engine (:mod:`tsconv.engine.batched`) hands the raw rows of a step (or of one band of it) to
:func:`prepare`, which writes the first stage's input ``xc`` [halo + n, C] float32, time-major:

* rows ``halo ..``: the step's rows, upcast to float32, forward filled (NaN takes the feature's last
  value, carried across steps in ``state``);
* rows ``0 .. halo``: the previous rows (the last of ``carry_in``, raw filled values kept exactly), written by
  the step's last piece.

It also completes the step's ``level``, the one the CPU engine takes per chunk (:mod:`tsconv.engine.level`):
the batched engine sets it before the step from the last rows before it and the fill state; a feature
without one takes its first finite value in the step (earlier rows of it are not finite), else 0. The
first stage's re-centring falls back on it where a block has no finite sample of a feature
(``conv1d(recenter_fallback=)``). The rows are not centred on it: x - level rounded every row that moved
more than about 2x from it at the level's resolution (benchmarks/NOTES.md, "Centring levels").

Up to three launches per piece. The rows are cut into segments (up to 32) so that a piece runs on enough
programs: one program per (block of 16 features, segment). The first kernel summarises each segment (its
last non-NaN and first finite value per feature); the second fills and centres each segment, starting from the
piece's fill state folded with the summaries of the segments before it; the third writes the state and
level leaving the piece, and after a step's last piece the halo rows. Why: one program per feature block
walking every row (64 programs at 1024 features) ran at about 43 GB/s on the H200, 0.1 s of GPU time per
4.3 GB (benchmarks/NOTES.md, "Host-device transfer and input preparation"); the segments read the input twice
and run at memory speed. In ``--transfer mapped`` mode the input is host memory read over PCIe: one segment there
(``split``), read once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["prepare"]

_BT = 64  # rows per tile
_BC = 16  # features per program block: each tile row is 64 contiguous bytes
_SEG = 256  # rows per segment at least (4 tiles)
_MAX_SEGS = 32  # segments per piece at most: each program folds the summaries of the ones before it


@triton.jit
def _last_valid(a, b):
    # Associative: the later of two values unless it is NaN (x != x only for NaN).
    return tl.where(b == b, b, a)


@triton.jit
def _tile(src_ptr, stride_sr, stride_sc, scol, r, m):
    """A float32 tile, NaN outside ``m``: set after the upcast, because an integer load's ``other`` cannot
    hold NaN (it read as 0 or the type's minimum, which the fill took for the feature's last value)."""
    ptrs = src_ptr + r[:, None].to(tl.int64) * stride_sr + scol[None, :] * stride_sc
    return tl.where(m, tl.load(ptrs, mask=m, other=0).to(tl.float32), float("nan"))


@triton.jit
def _columns(cols_ptr, cidx, cmask, HAS_COLS: tl.constexpr):
    if HAS_COLS:
        return tl.load(cols_ptr + cidx, mask=cmask, other=0).to(tl.int64)
    return cidx.to(tl.int64)


@triton.jit
def _first_valid(vals, valid, rows, BT: tl.constexpr):
    """Per column of a [BT, BC] tile, the first value where ``valid`` (NaN: none), by order-free reductions."""
    first_row = tl.min(tl.where(valid, rows[:, None], BT), axis=0)
    first = tl.sum(tl.where(valid & (rows[:, None] == first_row[None, :]), vals, 0.0), axis=0)
    return tl.where(first_row < BT, first, float("nan"))


@triton.jit
def _summary_kernel(
    src_ptr, stride_sr, stride_sc, cols_ptr, n, C, seg_rows, summ_ptr, nseg,
    HAS_COLS: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """Per (segment, feature): the last non-NaN and the first finite value of the segment's raw rows (NaN:
    none)."""
    pid = tl.program_id(0)
    s = tl.program_id(1)
    cidx = pid * BC + tl.arange(0, BC)
    cmask = cidx < C
    scol = _columns(cols_ptr, cidx, cmask, HAS_COLS)
    rows = tl.arange(0, BT)
    last = tl.full((BC,), float("nan"), tl.float32)
    first = tl.full((BC,), float("nan"), tl.float32)
    r0 = s * seg_rows
    r1 = tl.minimum(r0 + seg_rows, n)
    for t0 in range(r0, r1, BT):
        r = t0 + rows
        m = (r < r1)[:, None] & cmask[None, :]
        x = _tile(src_ptr, stride_sr, stride_sc, scol, r, m)
        valid = x == x
        # order-free reductions (see _prep_kernel): the row index of the last / first valid value
        last_row = tl.max(tl.where(valid, rows[:, None], -1), axis=0)
        t_last = tl.sum(tl.where(valid & (rows[:, None] == last_row[None, :]), x, 0.0), axis=0)
        last = tl.where(last_row >= 0, t_last, last)
        first = tl.where(first == first, first, _first_valid(x, tl.abs(x) < float("inf"), rows, BT))
    tl.store(summ_ptr + s * C + cidx, last, mask=cmask)
    tl.store(summ_ptr + (nseg + s) * C + cidx, first, mask=cmask)


@triton.jit
def _entering(state_ptr, level_ptr, summ_ptr, cidx, cmask, s, nseg, C):
    """The fill state and the level entering segment ``s``: the piece's, then each earlier segment's."""
    state = tl.load(state_ptr + cidx, mask=cmask, other=float("nan"))
    lvl = tl.load(level_ptr + cidx, mask=cmask, other=0.0)  # NaN: not known yet
    for k in range(0, s):
        last = tl.load(summ_ptr + k * C + cidx, mask=cmask, other=float("nan"))
        first = tl.load(summ_ptr + (nseg + k) * C + cidx, mask=cmask, other=float("nan"))
        state = tl.where(last == last, last, state)
        lvl = tl.where(lvl == lvl, lvl, first)
    return state, lvl


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
    kept,
    C,
    state_ptr,
    level_ptr,
    summ_ptr,
    nseg,
    seg_rows,
    carry_out_ptr,
    xc_ptr,
    stride_xr,
    FILL: tl.constexpr,
    HAS_COLS: tl.constexpr,
    ONE_SEGMENT: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
):
    pid = tl.program_id(0)
    s = tl.program_id(1)
    cidx = pid * BC + tl.arange(0, BC)
    cmask = cidx < C
    scol = _columns(cols_ptr, cidx, cmask, HAS_COLS)
    state, lvl = _entering(state_ptr, level_ptr, summ_ptr, cidx, cmask, s, nseg, C)
    rows = tl.arange(0, BT)
    keep_from = n_step - kept  # step rows at or after this one are carried to the next step
    r0 = s * seg_rows
    r1 = tl.minimum(r0 + seg_rows, n)
    for t0 in range(r0, r1, BT):
        r = t0 + rows
        m = (r < r1)[:, None] & cmask[None, :]
        x = _tile(src_ptr, stride_sr, stride_sc, scol, r, m)
        # A scan keeps the order of its operands; a reduction need not (GPU reductions combine lanes in
        # butterfly order), so "last valid" and "first valid" below use order-free sums and minima.
        scanned = tl.associative_scan(x, 0, _last_valid)
        last = tl.sum(tl.where(rows[:, None] == BT - 1, scanned, 0.0), axis=0)  # NaN: none in this tile
        filled = tl.where(scanned == scanned, scanned, state[None, :])
        state = tl.where(last == last, last, state)
        lvl = tl.where(lvl == lvl, lvl, _first_valid(filled, tl.abs(filled) < float("inf"), rows, BT))
        v = filled if FILL else x
        g = off + r  # row within the step
        xrow = (halo + g).to(tl.int64)
        tl.store(xc_ptr + xrow[:, None] * stride_xr + cidx[None, :], v, mask=m)
        if kept > 0:
            crow = (g - keep_from).to(tl.int64)
            cm = m & (g >= keep_from)[:, None]
            tl.store(carry_out_ptr + crow[:, None] * C + cidx[None, :], v, mask=cm)
    if ONE_SEGMENT:  # no summary kernel ran: this program's state and level leaving the piece stand for it
        tl.store(summ_ptr + cidx, state, mask=cmask)
        tl.store(summ_ptr + C + cidx, lvl, mask=cmask)


@triton.jit
def _finish_kernel(
    state_ptr, level_ptr, summ_ptr, nseg, C, halo, kept, carry_in_ptr, xc_ptr, stride_xr,
    LAST: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    """After every segment: the fill state and level leaving the piece; after a step's last piece, the
    halo rows (the last ``halo`` of the ``kept`` carried raw filled rows) and the final level."""
    pid = tl.program_id(0)
    cidx = pid * BC + tl.arange(0, BC)
    cmask = cidx < C
    state, lvl = _entering(state_ptr, level_ptr, summ_ptr, cidx, cmask, nseg, nseg, C)
    tl.store(state_ptr + cidx, state, mask=cmask)
    if LAST:
        lvl = tl.where(lvl == lvl, lvl, 0.0)
        rows = tl.arange(0, BT)
        for h0 in range(0, halo, BT):
            h = h0 + rows
            hm = (h < halo)[:, None] & cmask[None, :]
            c = tl.load(carry_in_ptr + (kept - halo + h)[:, None].to(tl.int64) * C + cidx[None, :], mask=hm,
                        other=0.0)  # fmt: skip
            tl.store(xc_ptr + h[:, None].to(tl.int64) * stride_xr + cidx[None, :], c, mask=hm)
    tl.store(level_ptr + cidx, lvl, mask=cmask)


def _segments(n: int, split: bool) -> tuple[int, int]:
    """(rows per segment, segments): whole tiles, at least _SEG rows, at most _MAX_SEGS segments (one
    unless ``split``)."""
    if not split:
        return max(n, 1), 1
    seg = max(_SEG, -(-n // _MAX_SEGS))
    seg = -(-seg // _BT) * _BT
    return seg, max(1, -(-n // seg))


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
    last: bool = True,
    split: bool = True,
) -> None:
    """Prepare rows ``off .. off + len(src)`` of a step of ``n_step`` rows into ``xc`` (see the module doc).

    ``src`` [n, F_src] any float/int dtype and strides (device memory, or mapped host memory), ``cols``
    the int64 source column of each of the C prepared features (None: the first C). ``state`` [C]
    (fill state, updated), ``level`` [C] (set before a step's first piece by
    :func:`tsconv.engine.level.level_before_torch`; NaN where unknown; final after the ``last`` piece),
    ``carry_in``/``carry_out`` [kept, C] float32 contiguous, kept >= halo (the previous step's last raw filled
    rows, and this step's: the halo and the rows the next step's level reads), ``xc`` [halo + n_step, C] float32 with unit column stride. Pieces of one step must be prepared in order, on one stream. ``split=False``
    reads ``src`` once, in one segment (for mapped host memory, where each read crosses PCIe).
    """
    C = xc.shape[1]
    halo = xc.shape[0] - n_step
    kept = carry_out.shape[0]
    n = src.shape[0]
    if n == 0 and not last:
        return
    if kept < halo or carry_in.shape[0] != kept:
        msg = f"carries of {carry_in.shape[0]} and {kept} rows for a halo of {halo}"
        raise ValueError(msg)
    if kept == 0:  # no carry rows: any valid pointer will do, the kernels never touch them
        carry_in = carry_out = state
    seg, nseg = _segments(n, split)
    summ = torch.empty((2, nseg, C), dtype=torch.float32, device=xc.device)
    fb = triton.cdiv(C, _BC)
    cols_arg = cols if cols is not None else state
    common = dict(HAS_COLS=cols is not None, BT=_BT, BC=_BC, num_warps=2)
    if n:
        if nseg > 1:
            _summary_kernel[(fb, nseg)](
                src, src.stride(0), src.stride(1), cols_arg, n, C, seg, summ, nseg, **common
            )  # fmt: skip
        _prep_kernel[(fb, nseg)](
            src, src.stride(0), src.stride(1), cols_arg, n, off, n_step, halo, kept, C, state, level, summ,
            nseg, seg, carry_out, xc, xc.stride(0), FILL=fill, ONE_SEGMENT=nseg == 1, **common,
        )  # fmt: skip
    else:
        summ.fill_(float("nan"))
    _finish_kernel[(fb,)](
        state, level, summ, nseg, C, halo, kept, carry_in, xc, xc.stride(0), LAST=last, BT=_BT,
        BC=_BC, num_warps=2,
    )  # fmt: skip
