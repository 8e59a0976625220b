"""The chunked engine: each chunk of ``chunk`` steps computed together with the halo rows before it.

The CPU's engine (and the reference the batched engine is tested against): memory is bounded by
(chunk + halo) x features whatever the series' length, and the result equals the whole-series
computation. The carry between chunks is the halo: the prepared input rows just before the next chunk.
A pipeline whose outputs do not depend on how rows are split into calls (banks only) takes several chunks
per call on the CPU, up to a fixed output size: the same bits, fewer per-call costs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from tsconv.engine.compute import CHECK_ROWS_MIN, Backend, ShortCallSample
from tsconv.engine.fill import FillCarry
from tsconv.engine.level import TAIL_ROWS, centering_level, level_before, rows_before
from tsconv.io.contracts import BandReader
from tsconv.io.ffill import forward_fill
from tsconv.io.precision import Float32Check, WideIntegerCheck, exact_in_float32
from tsconv.io.readers.blocks import ColumnSource
from tsconv.pipeline.spec import ResolvedPipeline

__all__ = ["run_chunked"]


def run_chunked(
    source: BandReader,
    plan: ResolvedPipeline,
    backend: Backend,
    emit: Callable[[np.ndarray], None],
    *,
    start: int,
    chunk: int,
    warmup: str,
    on_rows: Callable[[int], None] | None = None,
    stop: int | None = None,
    fill_carry: FillCarry | None = None,
    emit_copies: bool = False,
    reserve: Callable[[int], np.ndarray | None] | None = None,
    read_float64: bool = True,
    read_notes: list[str] | None = None,
) -> None:
    """Compute rows [start, stop) (default: to T) chunk by chunk (or several chunks a call, where that gives
    the same bits: :func:`_chunks_per_call`) and hand each result block to ``emit`` in order.

    ``emit_copies``: ``emit`` copies the rows it keeps before it returns (a sink's ``append`` does), so on the
    CPU a bank pipeline's chunks can all be computed into one reused buffer; otherwise each block is fresh.
    ``reserve``: the sink's :meth:`~tsconv.io.contracts.Sink.reserve`, where such a chunk is computed in place
    when the sink has room for it (``features()``'s result: no copy at all). ``read_float64``: an input float32
    does not hold is read as float64 where the backend takes it (else as float32, as an output's earlier
    rows were). ``read_notes``: where given, the wide-integer check's warning is appended there instead of
    given (:class:`tsconv.io.precision.WideIntegerCheck`).

    ``source`` holds all the features the plan was resolved against; ``[preprocess]`` selection is applied
    here, and its transform and z-score in the backend.
    """
    if plan.columns is not None:
        source = ColumnSource(source, plan.columns)
    fill = plan.preprocess is None or plan.preprocess.fill == "ffill"
    halo, rows, nf = plan.halo, source.rows if stop is None else stop, source.n_features
    backend.series_end = rows
    # The carry is the halo: the prepared (filled) input rows just before the next chunk, with rows
    # before step 0 as zeros (the first stage's zero history). ``recent``: the last TAIL_ROWS prepared data
    # rows before it, which the first stage's level reads whatever the halo (a halo of one row made one bad
    # print there the next chunk's level).
    begin = max(0, start - rows_before(halo))
    # rows as the pipeline reads them: float64 where float32 would round the input and the backend takes float64
    wide = read_float64 and backend.reads_float64 and not exact_in_float32(source.dtype)
    dt = np.dtype(np.float64 if wide else np.float32)
    state = (fill_carry or FillCarry()).state_before(source, begin, dt)
    carry = np.zeros((max(0, halo - (start - begin)), nf), dtype=dt)
    recent = carry[:0]
    mark = None if fill_carry is None else fill_carry.mark
    if mark is not None and mark <= begin:
        fill_carry.at_mark = state.astype(np.float64) if mark == begin else None
    if start > begin:
        raw = np.asarray(source.read(begin, start), dtype=dt)
        if mark is not None and begin < mark <= start:
            fill_carry.at_mark = forward_fill(raw[: mark - begin], state)[1].astype(np.float64)
        prefix, state = forward_fill(raw, state)
        recent = prefix if fill else raw
        carry = np.concatenate([carry, recent], axis=0)
        carry, recent = carry[carry.shape[0] - halo :], recent[-TAIL_ROWS:].copy()
    device = backend.device
    warm = plan.warmup_groups() if warmup == "nan" else []
    into: torch.Tensor | None = None
    unread = torch.zeros(nf, dtype=torch.float32, device=backend.device)  # the level of a run that reads none
    rounding = Float32Check(plan.input_names)
    wide_ints = WideIntegerCheck(
        plan.input_names, notes=read_notes
    )  # int64 beyond 2^53, which the float64 read rounds
    step = chunk * _chunks_per_call(backend, chunk)
    # calls of fewer rows than the check samples: their rows are gathered for it (a first call of a default
    # --chunk, whose zero history leaves it a halo short, is sampled on its own rows)
    least = backend.min_check_rows
    sampled = (
        ShortCallSample(backend, halo)
        if backend.storage_check_pending and step < backend.check_rows
        else None
    )
    if sampled is not None:
        backend.min_check_rows = max(CHECK_ROWS_MIN, backend.check_rows)
    in_place = emit_copies and device.type == "cpu" and backend.out_width is not None
    s = start
    while s < rows:
        e = min(s + step, rows)
        dest = None
        if in_place:
            # a bank pipeline's rows land in the sink's own rows (as many as it has room for: the call's
            # rows do not change its bits), or in one buffer reused by every chunk (``emit`` copies them out):
            # fresh 52 MB per chunk cost 8-9 ms of page faults each on the VM
            place = reserve(e - s) if reserve is not None else None
            if place is not None and (place.shape[0] == e - s or backend.call_invariant):
                dest = torch.from_numpy(place)
                e = s + place.shape[0]
            else:
                if into is None:
                    into = torch.from_numpy(np.empty((e - s, backend.out_width), dtype=np.float32))
                dest = into[: e - s]
        before = level_before(recent, state) if backend.reads_level else None
        # ``raw`` may be a view of the reader's buffers, valid only until a later read (ParallelBandReader
        # reuses its ring): it, ``filled`` (``raw`` itself when it has no NaN) and ``x`` (``filled`` when
        # halo is 0) are used before the next read; the carry is a slice of a concatenation (a copy).
        block = source.read(s, e)
        if dt == np.float32:
            rounding.see(block)
        else:
            wide_ints.see(block)
        raw = np.asarray(block, dtype=dt)
        # With fill = "none" the fill state still gives the centering level (a value no later than the
        # outputs it touches), but the backend gets the NaNs as they are.
        if mark is not None and s < mark <= e:
            fill_carry.at_mark = forward_fill(raw[: mark - s], state)[1].astype(np.float64)
        filled, state = forward_fill(raw, state)
        level = unread if before is None else torch.from_numpy(centering_level(before, filled)).to(device)
        if not fill:
            filled = raw
        x = np.concatenate([carry, filled], axis=0) if halo else filled
        y = backend.run(torch.from_numpy(x).to(device), s - halo, level, out=dest)
        if sampled is not None:
            sampled.see(x, s - halo, filled, level)
        out = y.cpu().numpy() if device.type != "cpu" else y.numpy()
        for w, cols in warm:  # each output's own warm-up rows (a bank's filters each have theirs)
            if s < w:
                out[: min(w - s, e - s), cols] = np.nan
        emit(out)
        if halo:
            carry = x[x.shape[0] - halo :]
        if backend.reads_level:  # a copy: ``filled`` may be the reader's buffer
            recent = np.concatenate([recent, filled], axis=0)[-TAIL_ROWS:]
        if on_rows is not None:
            on_rows(e - s)
        s = e
    if sampled is not None:  # the rows gathered since the last sample, judged by the check's own rules
        backend.min_check_rows = least
        sampled.flush()
    if fill_carry is not None:  # the state at ``rows``: after the last chunk, or the start's with none to do
        fill_carry.end = (rows, state.copy())


# Output bytes one call of a call-invariant pipeline may produce when several chunks go together, and the most
# chunks a call takes. The default bank on 2,000,000 x 32 (zstd) on the 2-core VM: 5.61 s in 1,024-row calls,
# 3.72 s in 8 chunks a call, 3.62 s in 16, the output the same bits (benchmarks/NOTES.md, section 18).
_CALL_BYTES = 32 << 20
_MAX_CHUNKS_PER_CALL = 16


def _chunks_per_call(backend: Backend, chunk: int) -> int:
    """Chunks computed in one backend call on the CPU: one, unless the outputs do not depend on how rows
    are split into calls (``Backend.call_invariant``); then as many as keep a call's output within
    ``_CALL_BYTES`` (the per-call costs of torch ops and tiles amortised over more rows)."""
    if backend.device.type != "cpu" or not backend.call_invariant or backend.out_width is None:
        return 1
    per_chunk = chunk * backend.out_width * 4
    return max(1, min(_MAX_CHUNKS_PER_CALL, _CALL_BYTES // max(per_chunk, 1)))
