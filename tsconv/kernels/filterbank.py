"""Banks of built-in filters computed from their definitions (:mod:`tsconv.pipeline.filters`).

Every filter of a bank is computed by its structure, in float64, and rounded once to float32: lags and
differences from two rows; window sums (ma, dev, std, zscore) and the EMA's geometrically weighted window
from a *ladder* of pairwise sums, ``E_{j+1}(t) = r^h E_j(t - h d) + E_j(t)`` with ``h = 2^j`` (r = 1 for
plain sums), a window of W steps being the sum of the ladder levels of W's binary digits, newest first.
Why pairwise sums: each output is a fixed sequence of float64 operations over exactly the values of its
own window, so

- it does not depend on where a chunk, tile or step starts (chunked equals whole bit for bit on the CPU),
- a value outside the window never touches it (no running sum subtracts a huge or infinite value that
  left the window), and NaN and infinities spread exactly as in a direct sum,
- rounding grows with log2(W), and float64 keeps price levels and long windows exact to float32.

std and zscore carry each level's sum of squared deviations from its own mean alongside (the pairwise
update of Chan, Golub and LeVeque): no sum of squares of raw prices, so no cancellation on price levels,
and a flat window gives exactly 0.

The same operations run as torch ops (the CPU, and any device) or as the Triton kernels of
:mod:`tsconv.kernels.filterbank_triton` (CUDA, or CPU tensors under ``TRITON_INTERPRET=1``; imported only
when a bank runs them, so a CPU run needs no Triton), over tiles of rows and channels sized to stay in cache
(CPU) or within a bounded scratch (GPU).
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from tsconv.errors import ShapeError
from tsconv.kernels.checks import is_activation, overlap
from tsconv.kernels.cpu_tiles import run_parts, run_tiles
from tsconv.kernels.filterbank_native import NativeBank, native_bank
from tsconv.kernels.torch_side import apply_activation, custom_op
from tsconv.kernels.weight_cache import writes_out
from tsconv.pipeline.filters import Filter, filter_spec

__all__ = [
    "FUSED_KINDS",
    "FusedPlan",
    "bank_bytes_per_row",
    "bank_halo",
    "filter_bank",
    "fused_plan",
    "window_moments",
]

# Elements (rows x channels) of one float64 tile: about 1 MiB on the CPU (a core's L2 holds the live
# levels of the default bank), 16 MiB per array on CUDA.
_CPU_TILE = 1 << 17
_CUDA_TILE = 1 << 21
_CPU_CHANNELS = 64  # channels per CPU tile: wide inputs are cut by channel, so tiles keep many rows
_LIVE = 6  # float64 arrays of a tile's size live at once, besides the kept ladder levels (an estimate)

_WINDOWED = ("ma", "dev", "std", "zscore")
_MOMENTS = ("std", "zscore")


# Kinds the fused CUDA kernel computes (filterbank_triton's generator knows the same ones; a test checks it); a
# bank with any other (the EMA) runs on the ladder's three kernels.
FUSED_KINDS = frozenset({"id", "lag", "diff", "ret", "ma", "dev", "std", "zscore"})
# A window of W steps uses sub-blocks of b = 2^floor(log2 W) rows held in registers: W < 1024 keeps them
# at 512 rows or fewer; longer windows run on the ladder's kernels.
FUSED_MAX_WINDOW = 1023
# Kinds the running-sum kernel computes (sums, no moments): a bank of these only runs there first.
RUNNING_KINDS = frozenset({"id", "lag", "diff", "ret", "ma", "dev"})


@dataclass(frozen=True)
class FusedPlan:
    """A bank's fused kernel: what it computes (from validated filters: integers and kinds only) and its
    tile: ``rows`` output steps x ``channels`` input channels per program."""

    kinds: tuple[str, ...]
    params: tuple[int, ...]  # L for lag / diff / ret, W for windows, 0 for id
    rows: int
    channels: int
    warps: int
    # The running-sum kernel's tile (banks of RUNNING_KINDS only; 0 rows: none): ``run_rows`` steps (a power of
    # two) x ``run_channels`` channels (a multiple of ``channels``) a program, its loop unrolled
    # ``run_unroll`` times; the fused kernel above then recomputes only the tiles it flags.
    run_rows: int = 0
    run_channels: int = 0
    run_warps: int = 1
    run_unroll: int = 1

    @property
    def name(self) -> str:
        body = "_".join(f"{k}{p}" for k, p in zip(self.kinds, self.params, strict=True))
        return f"_bank_{body}_r{self.rows}_c{self.channels}"


@functools.cache  # asked once per bank call (every engine step): the plan of a bank never changes
def fused_plan(filters: tuple[Filter, ...], *, channels: int | None = None, warps: int | None = None,
               rows: int | None = None, running: tuple[int, int, int, int] | None = None) -> FusedPlan | None:  # fmt: skip
    """The fused kernel's plan for a bank, or None where the bank needs the ladder's kernels (an EMA, or a
    window of 1024 steps or more). ``channels``, ``warps`` and ``rows`` override the tile, ``running`` the
    running-sum kernel's (rows, channels, warps, unroll; rows 0: none) (benchmarks)."""
    if not filters or any(f.kind not in FUSED_KINDS for f in filters):
        return None
    windows = [f.taps for f in filters if f.kind in _WINDOWED]
    if any(w > FUSED_MAX_WINDOW for w in windows):
        return None
    sub = max((1 << (w.bit_length() - 1) for w in windows), default=1)
    bt = rows or max(64, sub)
    mp = 1 << (len(filters) - 1).bit_length()
    # about 4k float32 output values a program on 4 warps (the interleaved tile): on the H200 the default bank
    # ran 10-15% faster so (2 channels x 256 steps) than with 16k on 8 warps (NOTES, 20)
    bc = channels or max(1, min(32, 4096 // (bt * mp)))
    params = tuple(
        0 if f.kind == "id" else (f.n if f.kind in ("lag", "diff", "ret") else f.taps) for f in filters
    )
    kinds = tuple(f.kind for f in filters)
    if running is None and all(k in RUNNING_KINDS for k in kinds):
        # Steps a program: about four times its longest window (the window's first sum re-reads that many rows
        # before the tile), 64 to 256; fewer steps give a narrow step's grid more programs. Measured on an H100
        # (NOTES, 20): 256 steps, loop unrolled twice, for the default bank; 64-128 for windows of 20 or less.
        longest = max(windows, default=1)
        steps = min(256, max(64, 1 << (4 * longest - 1).bit_length()))
        running = (steps, 32, 1, 2 if steps == 256 else 1)
    elif running is None:
        running = (0, 0, 1, 1)
    run_rows, run_channels, run_warps, unroll = running
    if run_rows:
        # the tiles it flags are whole fused programs' or a whole number of them: one of the two tiles' steps
        # divides the other's (both powers of two), and its channels are a whole number of the fused tile's
        run_rows = 1 << max(run_rows - 1, 0).bit_length()
        run_channels = -(-max(run_channels, bc) // bc) * bc
    return FusedPlan(kinds, params, bt, bc, warps or 4, run_rows, run_channels, run_warps, unroll)


def bank_halo(filters: tuple[Filter, ...], dilation: int) -> int:
    """Rows before its first output that a bank reads: the longest filter's warm-up times the dilation."""
    return max(f.halo for f in filters) * dilation


def bank_bytes_per_row(filters: tuple[Filter, ...], channels: int, *, cuda: bool = False) -> int:
    """Working memory of a bank per input row beyond its output, an upper estimate: none for the fused CUDA
    kernel; else float64 tiles (the live arrays and the kept ladder levels), which never exceed
    ``_CUDA_TILE`` elements, so for long steps it over-counts."""
    if cuda and fused_plan(filters) is not None:
        return 0
    kept = sum(f.taps.bit_count() for f in filters if f.kind in _WINDOWED + ("ema",))
    return 8 * channels * (_LIVE + 2 * kept)


@custom_op("tsconv::filter_bank", __name__)
def _filter_bank_op(
    x: torch.Tensor, specs: str, dilation: int, activation: str, triton_kernels: bool | None
) -> torch.Tensor:
    """``torch.ops.tsconv.filter_bank``: :func:`filter_bank` with the filters as their specs, comma-joined."""
    bank = tuple(filter_spec(s) for s in specs.split(","))
    return filter_bank(x, bank, dilation=dilation, activation=activation, triton_kernels=triton_kernels)


@_filter_bank_op.register_fake
def _filter_bank_fake(
    x: torch.Tensor, specs: str, dilation: int, activation: str, triton_kernels: bool | None
) -> torch.Tensor:
    bank = tuple(filter_spec(s) for s in specs.split(","))
    rows = torch.sym_max(x.shape[0] - bank_halo(bank, dilation), 0)
    return x.new_empty((rows, x.shape[1] * len(bank)), dtype=torch.float32)


@writes_out  # its kernels (Triton, the native bank) write out= unseen by torch's version counter
def filter_bank(
    x: torch.Tensor,
    filters: tuple[Filter, ...],
    *,
    dilation: int = 1,
    activation: str = "none",
    triton_kernels: bool | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The bank on ``x`` [L, C] (time-major, any strides, float32; or float64 on the CPU, computed from its own
    values) in "valid" mode: [L - halo, C * M] float32, time-major, output ``c * M + m`` being filter ``m`` of input channel ``c``, through
    ``activation``. ``triton_kernels`` defaults to CUDA tensors. ``out``: a float32 tensor of that shape on
    x's device to write into and return, contiguous or feature-major (each column contiguous: rows of a polars
    frame's columns, which the CPU's compiled bank writes directly) (an engine reusing one buffer for every chunk: a fresh
    52 MB output per chunk cost the 2-core VM 8-9 ms of page faults each). Under ``torch.compile`` the call is the
    custom op ``torch.ops.tsconv.filter_bank`` (one graph node: the tiles and worker threads are not traced)."""
    if torch.compiler.is_compiling() and out is None:
        specs = ",".join(f.spec for f in filters)  # an op takes no list of str: specs hold no comma
        return _filter_bank_op(x, specs, dilation, activation or "none", triton_kernels)
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ShapeError(f"x must be a [L, C] tensor, got {got}", hint="pass a time-major [L, C] tensor.")
    if isinstance(dilation, bool) or not isinstance(dilation, int | np.integer) or dilation < 1:
        # 0 read every tap at the current row (diff:1 all zeros), a negative one failed inside torch
        raise ShapeError(
            f"dilation must be an int >= 1, got {dilation!r}", hint="use dilation=1 for adjacent taps."
        )
    dilation = int(dilation)
    if not is_activation(activation):
        raise ShapeError(
            f"activation must be one of None, 'none', 'relu', 'gelu', 'tanh', got {activation!r}",
            hint="use activation='none' for the filters' own values.",
        )
    use_triton = x.is_cuda if triton_kernels is None else triton_kernels
    n_in, channels = x.shape
    halo = bank_halo(filters, dilation)
    m = len(filters)
    n = max(n_in - halo, 0)
    if out is not None:
        if (
            out.shape != (n, channels * m)
            or out.dtype != torch.float32
            or out.device != x.device
            or not (out.is_contiguous() or (out.stride(0) == 1 and out.stride(1) >= n))
        ):
            msg = (f"out must be a float32 [{n}, {channels * m}] tensor on {x.device}, contiguous or with "
                   f"contiguous columns, got {out.dtype} {tuple(out.shape)} {out.stride()} on {out.device}")  # fmt: skip
            raise ShapeError(msg, hint="pass out=None for a fresh result.")
        if overlap(out, x):  # the bank's tiles would read rows of x its earlier tiles had overwritten
            raise ShapeError("out overlaps x in memory", hint="write the result to a separate buffer.")
    elif x.device.type == "cpu":
        # numpy's allocation (madvised for transparent huge pages where the kernel offers them): a fresh torch
        # one of this size faulted in 4 KB pages, 30-100 ms per 52 MB chunk output on the 2-core VM against
        # about 10 ms, a third of the bank's time on a default-pipeline chunk.
        out = torch.from_numpy(np.empty((n, channels * m), dtype=np.float32))
    else:
        out = torch.empty((n, channels * m), dtype=torch.float32, device=x.device)
    if n == 0 or channels == 0:
        return out
    if not use_triton and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        native = native_bank() if NativeBank.covers(filters, channels) else None
        if native is not None:
            # one compiled pass per block of rows and channels, the torch path's bits (filterbank_native.py)
            native.run(x, filters, dilation=dilation, halo=halo, out=out, workers=torch.get_num_threads(),
                       run_parts=run_parts)  # fmt: skip
            return _activated(out, activation)
    if not out.is_contiguous():  # feature-major: the paths below write whole rows, so into rows, then copied
        return out.copy_(filter_bank(x, filters, dilation=dilation, activation=activation,
                                     triton_kernels=triton_kernels))  # fmt: skip
    plan = fused_plan(filters) if use_triton else None
    if plan is not None:
        # one kernel for the whole bank: each program reads its rows once and writes every filter's output
        # for them contiguously (the ladder's kernels took 93-98x the memory floor on the H200: NOTES, 20)
        from tsconv.kernels.filterbank_triton import run_fused

        run_fused(plan, x, out, halo=halo, dilation=dilation)
        return _activated(out, activation)
    if use_triton:
        # Tiles keep at least 4 halos (and 1024) of rows, cut by channel when the input is wide: all channels
        # in one tile would leave a 16,384-feature input with one-row tiles, each re-reading its halo.
        rows_min = max(4 * halo, 1024)
        ct = max(1, min(channels, _CUDA_TILE // (rows_min + halo)))
        rt = max(rows_min, _CUDA_TILE // ct - halo)
    else:
        ct = min(channels, _CPU_CHANNELS)
        rt = max(2 * halo, _CPU_TILE // ct - halo, 64)
    ops: _Ops = _triton_ops() if use_triton else _TorchOps()
    out3 = out.view(n, channels, m)

    # Float64 tile buffers, one per thread at a time, reused from tile to tile: a fresh 1 MB tile cost the
    # 2-core VM up to 0.25 ms of page faults beside 0.71 ms of work; the default bank per 65,536 x 40 chunk
    # took 17.7-18.1 ms with reuse against 18.5-19.3 ms without (benchmarks/NOTES.md, section 20).
    spare: list[torch.Tensor] = []
    spare_lock = threading.Lock()
    tile_elems = (min(rt, n) + halo) * min(ct, channels)

    def run(c0: int, r0: int) -> None:
        c1, r1 = min(c0 + ct, channels), min(r0 + rt, n)
        src = x[r0 : r1 + halo, c0:c1]
        with spare_lock:
            buf = spare.pop() if spare else None
        if buf is None:
            buf = torch.empty(tile_elems, dtype=torch.float64, device=x.device)
        tile = buf[: src.numel()].view(src.shape)
        tile.copy_(src)
        _bank_tile(tile, filters, dilation, halo, out3[r0:r1, c0:c1], ops, raw=src)
        with spare_lock:
            spare.append(buf)

    tiles = [(c0, r0) for c0 in range(0, channels, ct) for r0 in range(0, n, rt)]
    if x.device.type == "cpu" and not use_triton:
        run_tiles(run, tiles)  # tiles are independent: each output reads its own window only
    else:
        for tile in tiles:
            run(*tile)
    return _activated(out, activation)


def _activated(out: torch.Tensor, activation: str | None) -> torch.Tensor:
    """``out`` through ``activation``, in place (gelu's result copied back), so a caller's ``out`` holds it."""
    if activation in (None, "none"):
        return out
    res = apply_activation(out, activation)
    if res.data_ptr() != out.data_ptr():
        out.copy_(res)
    return out


@functools.cache
def _triton_ops() -> _Ops:
    """The bank's Triton operations, imported at the first bank that runs them (a CPU run may lack Triton);
    cached, not imported again per step."""
    from tsconv.kernels.filterbank_triton import TritonOps

    return TritonOps()


@dataclass
class _Level:
    """Window sums over 2^j steps ending at each row ``start + i`` of the tile (``s[i]``), and for std the
    sums of squared deviations from each window's mean (``m``; None at j = 0, where they are 0)."""

    s: torch.Tensor
    m: torch.Tensor | None
    start: int


def _ladder(x: torch.Tensor, d: int, ops: _Ops, *, top: int, keep: set[int], r: float | None,
            moments_top: int = -1) -> dict[int, _Level]:  # fmt: skip
    """Levels 0..top of the ladder over the tile ``x`` (weights r^k, None: 1), keeping those in ``keep``;
    sums of squared deviations up to level ``moments_top``."""
    kept: dict[int, _Level] = {}
    cur = _Level(x, None, 0)
    for j in range(top + 1):
        if j in keep:
            kept[j] = cur
        if j == top:
            break
        h = 1 << j
        sh = h * d
        k = cur.s.shape[0] - sh
        older, newer = cur.s[:k], cur.s[sh:]
        s = ops.axpy(older, newer, None if r is None else r**h)
        m = None
        if j < moments_top:
            m = ops.merge(older, None if cur.m is None else cur.m[:k], newer,
                          None if cur.m is None else cur.m[sh:], 1.0 / h, 1.0 / h, h / 2.0)  # fmt: skip
        cur = _Level(s, m, cur.start + sh)
    return kept


def _window(kept: dict[int, _Level], w: int, d: int, lo: int, hi: int, ops: _Ops, *, r: float | None,
            moments: bool) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """The window of ``w`` steps ending at tile rows [lo, hi): its (weighted) sum and, with ``moments``,
    its sum of squared deviations from its mean. Segments are the binary digits of w, newest first."""
    acc_s = acc_m = acc_mu = None
    acc_n = off = 0
    for j in range(w.bit_length()):
        if not w >> j & 1:
            continue
        level = kept[j]
        a, b = lo - off * d - level.start, hi - off * d - level.start
        seg_s = level.s[a:b]
        seg_m = None if level.m is None else level.m[a:b]
        size = 1 << j
        if acc_s is None:
            acc_s, acc_m = seg_s, seg_m
            acc_mu = seg_s
        else:
            if moments:
                acc_m, acc_mu = _join_moments(ops, seg_s, seg_m, acc_mu, acc_m, size, acc_n, last=w >> j == 1)
            acc_s = ops.axpy(seg_s, acc_s, None if r is None else r**off)
        acc_n += size
        off += size
    return acc_s, acc_m


def _join_moments(ops: _Ops, seg_s: torch.Tensor, seg_m: torch.Tensor | None, acc_mu: torch.Tensor,
                  acc_m: torch.Tensor | None, size: int, acc_n: int, *,
                  last: bool) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """A window's segment of ``size`` steps (its sum ``seg_s``, moments ``seg_m``) joined to the newer steps
    summed so far (``acc_n`` of them: their moments ``acc_m`` and mean ``acc_mu``; for a power of two, their
    sum): the joined moments and, unless ``last``, mean.

    The newer steps' mean is carried rather than taken as their sum / acc_n: of a flat float64 window (every
    value v) that sum is rounded once acc_n is not a power of two (3v, say), and the mean it gave was an ulp
    off v, so the join saw a nonzero deviation and a flat window of 7, 31 or 255 steps got a standard deviation
    of 1e-14 and a finite z-score. A carried mean moves only by a segment's nonzero deviation: v stays v."""
    ib = 1.0 / acc_n if acc_n & (acc_n - 1) == 0 else 1.0  # a sum (the first segment alone), else a mean
    m = ops.merge(seg_s, seg_m, acc_mu, acc_m, 1.0 / size, ib, size * acc_n / (size + acc_n))
    if last:
        return m, None
    return m, ops.mean_join(acc_mu, ib, seg_s, 1.0 / size, size / (size + acc_n))


def _bank_tile(x: torch.Tensor, filters: tuple[Filter, ...], d: int, halo: int, out3: torch.Tensor,
               ops: _Ops, *, raw: torch.Tensor | None = None) -> None:  # fmt: skip
    """Every filter on the float64 tile ``x`` [halo + n, c] into ``out3`` [n, c, M] (float32). ``raw``: the
    same rows in float32, from which the torch path takes id, lag and diff (a float32 difference of two
    float32 values is the correctly rounded one, as float64 then rounding would give)."""
    rows = x.shape[0]
    cur = x[halo:]
    windows = {f.taps for f in filters if f.kind in _WINDOWED}
    moment_windows = {f.taps for f in filters if f.kind in _MOMENTS}
    sums: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
    if windows:
        keep = {j for w in windows for j in range(w.bit_length()) if w >> j & 1}
        top = max(w.bit_length() for w in windows) - 1
        moments_top = max((w.bit_length() - 1 for w in moment_windows), default=-1)
        kept = _ladder(x, d, ops, top=top, keep=keep, r=None, moments_top=moments_top)
        for w in sorted(windows):
            sums[w] = _window(kept, w, d, halo, rows, ops, r=None, moments=w in moment_windows)
        del kept
    for m, f in enumerate(filters):
        kind = f.kind
        dest = out3[:, :, m]
        if kind in ("id", "lag", "diff") and raw is not None and isinstance(ops, _TorchOps):
            now = raw[halo:]
            if kind == "id":
                dest.copy_(now)
            elif kind == "lag":
                dest.copy_(raw[halo - f.n * d : rows - f.n * d])
            else:
                torch.sub(now, raw[halo - f.n * d : rows - f.n * d], out=dest)
        elif kind == "id":
            ops.finish(kind, dest, cur)
        elif kind in ("lag", "diff", "ret"):
            ops.finish(kind, dest, cur, x[halo - f.n * d : rows - f.n * d])
        elif kind in _WINDOWED:
            s, ss = sums[f.taps]
            ops.finish(kind, dest, cur, s, ss, window=f.taps)
        else:  # ema: the weighted window over its taps, renormalised to sum 1
            r = 1.0 - f.alpha
            if f.taps == 1:  # one tap: the current value
                ops.finish("id", dest, cur)
                continue
            # alpha = 1: the current value, but NaN or +-inf where its window holds one, as any EMA
            if r == 0.0:
                if f.taps in sums:
                    total = sums[f.taps][0]
                else:
                    bits = {j for j in range(f.taps.bit_length()) if f.taps >> j & 1}
                    kept = _ladder(x, d, ops, top=f.taps.bit_length() - 1, keep=bits, r=None)
                    total, _ = _window(kept, f.taps, d, halo, rows, ops, r=None, moments=False)
                # the window's mean is NaN / +-inf exactly where the window holds them; told from the float64
                # sum, not the float32 mean, which a finite float64 print beyond float32's range makes inf
                ops.finish("ma", dest, cur, total, window=f.taps)
                torch.where(torch.isfinite(total), cur.to(dest.dtype), dest, out=dest)
                continue
            bits = {j for j in range(f.taps.bit_length()) if f.taps >> j & 1}
            kept = _ladder(x, d, ops, top=f.taps.bit_length() - 1, keep=bits, r=r)
            s, _ = _window(kept, f.taps, d, halo, rows, ops, r=r, moments=False)
            gain = f.alpha / -math.expm1(f.taps * math.log(r))  # alpha / (1 - r^K)
            ops.finish(kind, dest, cur, s, gain=gain)


# -------------------------------------------------------------------------------------------- torch


class _Ops(Protocol):
    """The three operations a bank is made of (float64 in; ``finish`` writes float32): :class:`_TorchOps`
    here, ``TritonOps`` in :mod:`tsconv.kernels.filterbank_triton`."""

    def axpy(self, a: torch.Tensor, b: torch.Tensor, w: float | None) -> torch.Tensor:
        """``w * a + b`` (``a + b`` for w None), as two rounded operations."""
        raise NotImplementedError

    def merge(self, sa: torch.Tensor, ma: torch.Tensor | None, sb: torch.Tensor, mb: torch.Tensor | None,
              ia: float, ib: float, coef: float) -> torch.Tensor:  # fmt: skip
        """Sum of squared deviations of two adjacent windows joined: ``(ma + mb) + (sb ib - sa ia)^2 coef``
        (ia, ib: 1 / the windows' lengths; coef: na nb / (na + nb)); None stands for zeros."""
        raise NotImplementedError

    def mean_join(self, mu: torch.Tensor, mi: float, s: torch.Tensor, i: float, w: float) -> torch.Tensor:
        """The mean ``mu mi`` moved towards a segment's mean ``s i`` by the segment's weight ``w``:
        ``mu mi - (mu mi - s i) w``, as rounded operations (``mu mi`` and ``s i`` exact: mi is 1 or, like i,
        1 over a power of two)."""
        raise NotImplementedError

    def finish(self, kind: str, dest: torch.Tensor, cur: torch.Tensor, y: torch.Tensor | None = None,
               m: torch.Tensor | None = None, *, window: int = 1, gain: float = 1.0) -> None:  # fmt: skip
        """One filter's output from the current rows ``cur``, the second operand ``y`` (the lagged rows, or
        the window's sum) and ``m`` (its sum of squared deviations), rounded into ``dest`` (float32).
        Means divide by ``window`` (exactly rounded; a float32 1 / W would move a deviation on price levels
        by up to level x 2^-24), and the EMA's sum is scaled by ``gain``."""
        raise NotImplementedError


class _TorchOps(_Ops):
    def axpy(self, a, b, w):  # noqa: ANN001, ANN201
        return torch.add(a, b) if w is None else torch.mul(a, w).add_(b)

    def merge(self, sa, ma, sb, mb, ia, ib, coef):  # noqa: ANN001, ANN201
        delta = torch.mul(sb, ib).sub_(torch.mul(sa, ia))
        sq = delta.mul_(delta).mul_(coef)
        if ma is not None and mb is not None:
            return sq.add_(torch.add(ma, mb))
        if ma is not None or mb is not None:
            return sq.add_(ma if mb is None else mb)
        return sq

    def mean_join(self, mu, mi, s, i, w):  # noqa: ANN001, ANN201
        mu = torch.mul(mu, mi)
        return torch.sub(mu, torch.sub(mu, torch.mul(s, i)).mul_(w))

    def finish(self, kind, dest, cur, y=None, m=None, *, window=1, gain=1.0):  # noqa: ANN001, ANN201
        if kind == "id":
            dest.copy_(cur)
        elif kind == "lag":
            dest.copy_(y)
        elif kind == "diff":
            torch.sub(cur, y, out=dest)
        elif kind == "ret":
            ok = (cur > 0) & (y > 0)
            dest.copy_(torch.where(ok, torch.log(torch.div(cur, y)), torch.nan))
        elif kind == "ema":
            dest.copy_(torch.mul(y, gain))
        elif kind == "ma":
            dest.copy_(_mean(y, window))
        elif kind == "dev":
            # float64 contiguous, then one cast into the strided float32 output: casting ops that write a
            # strided output directly ran 2x slower on the VM. A power-of-two window's 1 / W scales exactly,
            # so one pass (x - s / W with alpha) rounds once, as the two passes do: the same bits, 22% faster
            if window & (window - 1) == 0:
                dest.copy_(torch.sub(cur, y, alpha=1.0 / window))
            else:
                dest.copy_(torch.sub(cur, _mean(y, window)))
        else:
            sd = torch.sqrt(torch.div(m, max(window - 1, 1)))
            if kind == "std":
                dest.copy_(torch.where(torch.isfinite(y), sd, torch.nan))
            else:
                z = torch.sub(cur, _mean(y, window)).div_(sd)
                # an infinite sd (squares past float64's range, values beyond about 1e154) would give 0
                dest.copy_(torch.where((sd > 0) & (sd < torch.inf), z, torch.nan))


def _mean(s: torch.Tensor, w: int) -> torch.Tensor:
    """``s / w`` rounded once: a multiplication where 1 / w is exact (a power of two; faster), else a division."""
    return torch.mul(s, 1.0 / w) if w & (w - 1) == 0 else torch.div(s, w)


def window_moments(x: torch.Tensor, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums and sums of squared deviations from the mean of ``x`` [L, C] (float64) over the windows of ``w``
    rows ending at rows w-1 .. L-1: two [L - w + 1, C] tensors, from the ladder's pairwise sums and Chan's
    merges as the banks compute std, so no sum of squares of the raw values cancels, each output is a fixed
    sequence of operations over its own window's values (the same wherever a chunk starts), and a flat
    window gives exactly 0.

    The operations of :func:`_ladder` then :func:`_window`, in their order (the same bits), but each level
    joins the window as soon as it is built, so no level is kept: about 10 arrays of ``x``'s size live at
    once, where keeping a level per binary digit of ``w`` took up to 19 (w = 255)."""
    n = x.shape[0]
    if n < w:
        empty = x[:0]
        return empty, empty.clone()
    ops = _TorchOps()
    top = w.bit_length() - 1
    cur_s, cur_m, start = x, None, 0
    acc_s = acc_m = None
    acc_n = off = 0
    for j in range(top + 1):
        size = 1 << j
        if w >> j & 1:  # this level's segment: the window's rows ``off`` to ``off + size`` back
            a, b = w - 1 - off - start, n - off - start
            seg_s, seg_m = cur_s[a:b], None if cur_m is None else cur_m[a:b]
            if acc_s is None:
                acc_s, acc_m, acc_mu = seg_s, seg_m, seg_s
            else:
                acc_m, acc_mu = _join_moments(ops, seg_s, seg_m, acc_mu, acc_m, size, acc_n, last=w >> j == 1)
                acc_s = ops.axpy(seg_s, acc_s, None)
            acc_n += size
            off += size
        if j == top:
            break
        k = cur_s.shape[0] - size
        older, newer = cur_s[:k], cur_s[size:]
        nxt_s = ops.axpy(older, newer, None)
        nxt_m = ops.merge(older, None if cur_m is None else cur_m[:k], newer,
                          None if cur_m is None else cur_m[size:], 1.0 / size, 1.0 / size, size / 2.0)  # fmt: skip
        cur_s, cur_m, start = nxt_s, nxt_m, start + size
    assert acc_s is not None
    return acc_s, (torch.zeros_like(acc_s) if acc_m is None else acc_m)
