"""The batched engine loop: many 1024-step chunks per launch, host decode, copies and compute overlapped.

Used for CUDA runs (and, under ``TRITON_INTERPRET=1``, on CPU tensors in tests). One *step* is
``step_rows`` rows (a multiple of the chunk, sized from the GPU memory budget by
:func:`plan_step_rows`), computed in one pass: prepare (:mod:`tsconv.kernels.prepare`), every stage's conv
and the head. The halo travels from step to step on the device, so no row is read twice.

Streams and buffers (``--transfer``):

* ``pinned`` (default): the reader decodes into a pinned ring; each band is copied to a device slot on a
  copy stream, the compute stream waits for the step's copies by event, and two device slots let the
  next step's copies run under this step's compute;
* ``mapped``: no device copy of the input: the prepare kernel reads the pinned ring through the GPU's
  mapping of host memory (one read per value, over the bus);
* ``pageable``: the reader's ring is ordinary memory, copies are synchronous (the baseline).

Results go back on a third stream into a small ring of pinned host slots; a writer thread waits for each
slot's event and lends the rows to ``emit``, which frees the slot when it is done reading them (the sink's
writer threads store chunks straight from the slot), so writing overlaps everything else.

Pieces: each copy and prepare launch takes up to PIECE_BYTES of rows (an eighth of a step, but at least
MIN_PIECE_BYTES: each piece costs the engine thread launches and events): several whole bands when the
reader's ring holds them side by side (one view; fewer launches, fewer Python round trips per byte), or
part of a band when bands are larger.

Ring reuse: the reader (built with ``hold=reader_hold(...)``) rewrites the ring slot of band
``b - hold - 1`` when band ``b`` is first read, so before reading a piece whose last band is ``L`` every
copy (or mapped read) of a piece starting at or before band ``L - hold - 1`` is waited for by its event.
``hold`` is two pieces' worth of bands less one: one piece can be in flight while the next is read.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tsconv import config, trace
from tsconv.engine import devmem
from tsconv.engine.compute import Backend
from tsconv.engine.fill import FillCarry
from tsconv.engine.level import TAIL_ROWS, level_before_torch, rows_before
from tsconv.errors import TsconvError
from tsconv.io.contracts import BandReader, FrameSink
from tsconv.io.ffill import forward_fill
from tsconv.io.precision import Float32Check
from tsconv.io.readers.blocks import ColumnSource
from tsconv.kernels.filterbank import bank_bytes_per_row
from tsconv.pipeline.spec import ResolvedPipeline

__all__ = [
    "TRANSFERS",
    "check_transfer",
    "DEFAULT_GPU_MEM",
    "StageTimes",
    "plan_step_rows",
    "parse_bytes",
    "run_batched",
]

TRANSFERS = ("pinned", "mapped", "pageable")
DEFAULT_GPU_MEM = 1_200_000_000  # bytes: "about 1.2 GB", whatever the series' length or width
MAX_STEP_ROWS = 65536  # beyond this a step's launch overheads are already negligible (benchmarks/NOTES.md)
_OUT_SLOTS = 3  # pinned host result slots: one being filled, one being written, one spare
_DEVICE_RING = 4  # device slots for raw pieces: copies run up to three pieces ahead of the prepare kernel
# one piece of raw rows per copy and prepare launch (48.8 GB/s per 4 MiB copy measured)
PIECE_BYTES = 32 << 20
_PIECES_PER_STEP = 8
# A piece costs the engine thread a copy, three prepare launches and four events whatever its size: on a
# narrow store (2,097,152 x 96, steps of 9 MB) eighths of a step were 683 pieces, and that thread, not the
# GPU, bounded the loop (benchmarks/NOTES.md, "Pieces and steps"). Steps cut into pieces of at least this.
MIN_PIECE_BYTES = 4 << 20
# carries, levels, small buffers, the allocator's rounding: kept out of the step budget
_FIXED_BYTES = 48 << 20
# cuBLAS's workspace on the compute stream (32 MiB on Hopper), made by the head's torch path and kept by
# torch for the process: measured in the engine's peak (benchmarks/diag/gpu_memory.py).
_CUBLAS_BYTES = 32 << 20
# The GPU encoder of output chunks (tsconv.kernels.lz4_encode) encodes a group of chunks at a time (about
# ENCODE_GROUP_BYTES of rows: encode_group), a step's in turn: per output value of a group, the shuffled copy that its
# frames then overwrite (4 B), the compressed streams (4 B), the all-NaN test (1 B); and nvCOMP's scratch, the
# stream pointers and sizes. 32 MB of 16 KiB streams keep nvCOMP near 6 GB/s (store c: 0.68-0.72 s for 4 GB,
# H200, as two 16 MB chunks); counting the encoder per step row instead shrank trend_ema's steps on store c to one
# 5,120-row chunk.
ENCODE_GROUP_BYTES = 32 << 20
# chunks: a small output's group stays a few chunks (its buffers are planned before its steps)
ENCODE_GROUP_MAX = 8
_ENCODE_BYTES_PER_OUTPUT = 9
_ENCODE_FIXED = 8 << 20
# The share of the budget planned as allocated tensors, so that the peak *reserved* stays within it too.
_ALLOCATED_SHARE = 0.88


def encode_group(chunk_rows: int, n_outputs: int) -> int:
    """Output chunks the GPU encoder takes at a time: about ENCODE_GROUP_BYTES of float32 rows, 1 to
    ENCODE_GROUP_MAX."""
    return max(1, min(ENCODE_GROUP_MAX, ENCODE_GROUP_BYTES // (chunk_rows * n_outputs * 4)))


def check_transfer(transfer: str) -> None:
    if transfer not in TRANSFERS:
        raise TsconvError(f"unknown transfer mode {transfer!r}", hint=f"use one of {', '.join(TRANSFERS)}.")


def parse_bytes(text: str | int) -> int:
    """``1.2GB``, ``800MB``, ``512MiB``, ``2e9`` or an int -> bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        s = str(text).strip().replace(" ", "")
        units = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
        num = s.rstrip("kKmMgGiIbB")
        unit = s[len(num) :].upper()
        try:
            value = int(float(num) * units[unit])
        except (KeyError, ValueError, OverflowError):  # OverflowError: inf, 1e400
            raise TsconvError(
                f"cannot read the memory size {text!r}", hint="write it like 1.2GB, 800MB or 512MiB."
            ) from None
    if value <= 0:
        raise TsconvError(
            f"the GPU memory budget must be at least one byte, got {text!r} ({value} bytes)",
            hint="write it with a unit, like 1.2GB, 800MB or 512MiB (a bare number counts bytes).",
        )
    return value


def _bands_per_piece(band_bytes: int, piece_bytes: int | None = None) -> int:
    return max(1, (PIECE_BYTES if piece_bytes is None else piece_bytes) // max(band_bytes, 1))


def _piece_bytes(step_rows: int, row_bytes: int) -> int:
    """Raw bytes per copy and prepare launch: a step in _PIECES_PER_STEP pieces where each holds at least
    MIN_PIECE_BYTES, else in fewer (a whole step when it is smaller), at most PIECE_BYTES, at least one row."""
    step = step_rows * row_bytes
    n = max(1, min(_PIECES_PER_STEP, step // MIN_PIECE_BYTES))
    return max(row_bytes, min(PIECE_BYTES, -(-step // n)))


def _ring_slots(step_rows: int, row_bytes: int) -> int:
    """Device slots for raw pieces: _DEVICE_RING, or 2 where a step has fewer pieces (one piece copied
    while the one before it is prepared; more would only hold memory)."""
    pieces = -(-step_rows * row_bytes // _piece_bytes(step_rows, row_bytes))
    return min(_DEVICE_RING, max(2, pieces))


def reader_hold(band_bytes: int) -> int:
    """Bands the reader must keep intact behind the one being read (``ParallelBandReader(hold=...)``)."""
    return 2 * _bands_per_piece(band_bytes) - 1


def _bytes_per_row(plan: ResolvedPipeline) -> int:
    """GPU bytes a step holds per row: the prepared input, live stage outputs, results in flight."""
    c = len(plan.input_names)
    per = 4 * c  # xc
    widths = [layer.out_channels for layer in plan.layers]
    pairs = [widths[0]] + [a + b for a, b in zip(widths, widths[1:], strict=False)]
    per += 4 * max(pairs)
    # a bank's working memory: none for the fused kernel, else its float64 tiles (an upper bound)
    per += max((bank_bytes_per_row(layer.filters, layer.in_channels, cuda=True) for layer in plan.layers
                if layer.structured),
               default=0)  # fmt: skip
    # the device result slots (one per host slot) plus the step's own result before it is copied there
    per += 4 * plan.n_outputs * (_OUT_SLOTS + 1)
    if plan.preprocess is not None and plan.preprocess.computes:
        # float64 working copies: a few for the transform, up to 16 live at once for a rolling z-score (its
        # window sums, counts and moments; benchmarks/NOTES.md, "GPU memory and the step budget")
        per += 8 * c * (16 if plan.preprocess.zscore is not None else 6)
    return per


def weight_bytes(plan: ResolvedPipeline) -> int:
    """GPU bytes of a pipeline's weights in every form the engine keeps: per conv stage the stored copy
    (float16 or float32), the kernels' prepared float32 copy and two float64 tap-sum tables; for the head
    float32, float16 and packed copies. At 4096 features -> 256 -> 64 that is 48 MB measured (20 + 10 + 8
    + 8 MiB for the stage), which an estimate of the float32 weights alone (21 MB) undercounted."""
    total = 0
    for layer in plan.layers:
        if layer.structured:  # no weights (its float64 tiles are counted per row: _bytes_per_row)
            continue
        o, cg, k = layer.weight.shape
        total += (2 if layer.weight_dtype == "float16" else 4) * o * cg * k + 4 * o * cg * k + 16 * o * cg
        total += 8 * o * 2  # bias, float32 and float64
    if plan.head is not None:
        total += 16 * plan.head.weight.size + 8 * plan.head.weight.shape[1]
    return total


def plan_step_rows(
    plan: ResolvedPipeline,
    *,
    src_features: int,
    src_itemsize: int,
    budget: int,
    chunk: int,
    transfer: str,
    rows: int,
    reader_bytes: int | None = None,
    outside: int = 0,
    encode_rows: int | None = None,
) -> int:
    """Rows per step: the most chunks (up to MAX_STEP_ROWS rows) that fit ``budget`` bytes of GPU memory,
    of which ``outside`` are the process's own outside torch's allocator (its CUDA context and kernels:
    :func:`tsconv.engine.devmem.outside_torch`).

    ``encode_rows``: the output's chunks are encoded on the GPU (:mod:`tsconv.kernels.lz4_encode`): a step
    is a multiple of these rows and the encoder's buffers (:func:`encode_group` chunks) are counted; raises when not
    one chunk fits beside them.

    ``reader_bytes``: GPU memory of a reader that decodes on the device (its rings replace the device ring of
    raw pieces). Raises before anything starts when even one chunk plus the halo does not fit.
    """
    whole, budget = budget, budget - outside
    held = (
        f", of which this process's CUDA context and kernels hold about {outside / 1e6:,.0f} MB"
        if outside else ""
    )  # fmt: skip
    per = _bytes_per_row(plan)
    encoder = (
        (_ENCODE_BYTES_PER_OUTPUT * plan.n_outputs + 16)
        * encode_rows
        * encode_group(encode_rows, plan.n_outputs)
        + _ENCODE_FIXED
        if encode_rows
        else 0
    )
    row_bytes = src_features * src_itemsize
    weights = weight_bytes(plan) + (_CUBLAS_BYTES if plan.head is not None else 0)
    halo_bytes = (
        (plan.halo + 2 * rows_before(plan.halo)) * 4 * len(plan.input_names)
    )  # xc's halo, two carries
    # The rest of the budget is the allocator's: segment rounding, medium blocks in 20 MiB segments and the
    # step graph's pool held 51-76 MB of reserved memory above the allocated peak (diag/gpu_memory.py).
    avail = int(budget * _ALLOCATED_SHARE) - _FIXED_BYTES - weights - halo_bytes

    def ring(step: int) -> int:
        """The raw input's device memory beside a step of ``step`` rows: the GPU reader's rings, or the
        device ring's pieces (_ring_slots, _piece_bytes), none when the kernels read mapped host memory."""
        if reader_bytes is not None:
            return reader_bytes
        return 0 if transfer == "mapped" else _ring_slots(step, row_bytes) * _piece_bytes(step, row_bytes)

    def fitting(room: int) -> int:
        """The most rows that fit ``room`` bytes beside their own ring (which grows with the step)."""
        lo, hi = 0, max(0, room // per)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if per * mid + ring(mid) <= room else (lo, mid - 1)
        return lo

    fit = fitting(avail)

    def least_rows(unit: int) -> int:
        """The fewest rows a step of whole ``unit``-row chunks holds: one chunk, and the next step's halo
        where there is a next step (rows that one step covers need no room for another's halo)."""
        return min(max(unit, -(-plan.halo // unit) * unit), -(-max(rows, 1) // unit) * unit)

    least = least_rows(chunk)
    if fit < least:
        need = (_FIXED_BYTES + weights + halo_bytes + ring(least) + per * least) / _ALLOCATED_SHARE
        if least == chunk:
            what, other = f"one {chunk}-step chunk", "use a smaller --chunk"
        elif least < plan.halo:  # one step for every row, shorter than the warm-up
            what, other = f"one step of its {rows} rows", "shorten the filters"
        else:
            what = f"a step of {least} rows (the warm-up of {plan.halo} steps, in whole {chunk}-step chunks)"
            other = "shorten the filters"
        raise TsconvError(
            f"the pipeline does not fit the GPU memory budget: {what} of "
            f"{len(plan.input_names)} features needs about {need / 1e6:,.0f} MB, the budget is "
            f"{whole / 1e6:,.0f} MB{held}",
            hint=f"raise --gpu-mem (to at least {math.ceil((need + outside) / 1e7) / 100:.2f}GB), {other}, "
            "or select fewer features.",
        )
    if encode_rows:  # the encoder's buffers beside the step
        fit = fitting(avail - encoder)
    unit = encode_rows or chunk
    if fit < unit:
        raise TsconvError(
            f"one output chunk of {unit} rows and its encoding do not fit the GPU memory budget"
        )
    step = min(fit // unit * unit, max(MAX_STEP_ROWS // unit, 1) * unit)
    # A step split into fewer pieces holds a larger ring (a 2-piece step's ring is half a 1-piece one's just
    # below it): the step chosen must fit beside its own ring, not only beside the ring of ``fit`` rows.
    while step > unit and per * step + ring(step) + (encoder if encode_rows else 0) > avail:
        step -= unit
    step = max(step, least_rows(unit))  # a step must hold the next step's halo
    if step > fit:
        raise TsconvError(
            f"the pipeline's warm-up of {plan.halo} steps does not fit the GPU memory budget of "
            f"{whole / 1e6:,.0f} MB at {len(plan.input_names)} features{held}",
            hint="raise --gpu-mem or shorten the filters.",
        )
    return min(step, -(-max(rows, 1) // unit) * unit)


@dataclass
class StageTimes:
    """Seconds spent per stage. GPU stages are event-timed sums; threaded host stages are busy seconds."""

    read_wait: float = 0.0  # the main thread waiting for decoded rows
    h2d: float = 0.0
    compute: float = 0.0
    d2h: float = 0.0
    write: float = 0.0  # the writer thread inside emit()
    steps: int = 0
    step_rows: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    graph: str = "off"  # the steps' CUDA graph (_StepGraph.status): off, eager, replayed or "off: why"
    # what NVML showed for the process at the end of the loop (nothing is freed during a run: its peak)
    gpu_process_bytes: int | None = None
    gpu_encoded: bool = False  # the output's chunks were encoded on the GPU (frames to the sink)


log = logging.getLogger("tsconv.batched")


class _StepGraph:
    """A step's conv and head launches, captured once as a CUDA graph and replayed for every later step.

    Why: issuing a step's launches (conv, head, the bias: a few dozen Triton and torch calls)
    took the engine thread 1.7 ms per step on a fast H200 host and 5.5 ms on a slow one
    (``launch_step`` in benchmarks/results/engine_trace_*.json), while the thread was busy 86-95% of the
    loop. A replay is one launch. Every step from the second on has the same buffers and shapes (a short
    last step is computed at full size, and ``xc``, ``level`` and the weights never move), so the launches
    differ only for steps whose rows start inside the warm-up history (``first_row < 0``), which run eagerly.

    The first eligible step runs eagerly (it compiles, tunes, packs weights); the second is captured
    (``thread_local``: the reader's and writer's threads keep using CUDA meanwhile), then replayed. If the
    capture fails (a launch that synchronizes, say) every later step runs eagerly; ``status`` says why.
    """

    def __init__(self, fn: Callable[[int], torch.Tensor], stream: Any, *, enabled: bool) -> None:
        self.fn, self.stream = fn, stream  # fn(first_row): the step's output rows
        self.status = "eager" if enabled else "off"  # then "replayed", or "off: why" after a failed capture
        self._warm = False  # an eligible step ran eagerly (compiled, tuned, packed)
        self._graph: Any = None
        self._out: torch.Tensor | None = None

    def __call__(self, first_row: int) -> torch.Tensor:
        if first_row < 0:  # rows of the warm-up history: launches that differ (zeroed history)
            return self.fn(first_row)
        if self._graph is not None:
            self._graph.replay()
            return self._out  # type: ignore[return-value]
        if self.status != "eager" or not self._warm:
            self._warm = True
            return self.fn(first_row)
        # The eager steps' cached blocks are freed before the capture, which allocates the same intermediates
        # again in the graph's own pool: 1.13 GB peak reserved against 1.21-1.23 GB when they were kept, at
        # the same speed (benchmarks/NOTES.md, "GPU memory and the step budget").
        torch.cuda.empty_cache()
        graph = torch.cuda.CUDAGraph()
        try:
            out = self._capture(graph, first_row)
        except Exception as exc:  # noqa: BLE001 - any capture failure: the steps run as before
            self.status = f"off: the capture failed ({type(exc).__name__}: {exc})"
            log.warning("CUDA graph of the step not used: %s", exc)
            return self.fn(first_row)
        self._graph, self._out = graph, out
        self.status = "replayed"
        graph.replay()
        return out

    def release(self) -> bool:
        """Drop the graph and its output; True if there was one (its memory pool is then freeable)."""
        had = self._graph is not None
        self._graph = self._out = None
        return had

    def _capture(self, graph: Any, first_row: int) -> torch.Tensor:
        # Not torch.cuda.graph(): it synchronizes the device and empties the allocator's caches (cudaFree
        # synchronizes too), which would drain the decode and compute queued behind this step.
        # ``thread_local``: the reader's and writer's threads keep using CUDA meanwhile.
        with torch.cuda.stream(self.stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                out = self.fn(first_row)
            except BaseException:
                with contextlib.suppress(Exception):
                    graph.capture_end()
                raise
            graph.capture_end()
        return out


_STREAMS: dict[tuple[str, int], tuple[Any, Any, Any]] = {}
# CUDA priority of the compute stream (0: the default; lower is higher) beside the GPU reader's decode
# streams (tsconv.io.readers.gpu.DECODE_STREAM_PRIORITY); benchmarks/engine_trace.py's cprioN variants
COMPUTE_STREAM_PRIORITY = 0


class _Gpu:
    """Streams and events on CUDA; immediate no-ops on the CPU (interpreter tests).

    The streams are made once per device and process: cuBLAS keeps a workspace (32 MiB on Hopper) for
    every stream it has run on, so fresh streams per run would pile those up in a long-lived process.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.copy = self.compute = self.back = None
        if self.cuda:
            key = (str(torch.device(device.type, device.index if device.index is not None else 0)),
                   COMPUTE_STREAM_PRIORITY)  # fmt: skip
            if key not in _STREAMS:
                _STREAMS[key] = (
                    torch.cuda.Stream(device),
                    torch.cuda.Stream(device, priority=COMPUTE_STREAM_PRIORITY),
                    torch.cuda.Stream(device),
                )
            self.copy, self.compute, self.back = _STREAMS[key]

    def event(self, stream: Any) -> Any:
        if not self.cuda:
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return ev

    def on(self, stream: Any) -> Any:
        return torch.cuda.stream(stream) if self.cuda else contextlib.nullcontext()

    def wait(self, stream: Any, ev: Any) -> None:
        if self.cuda and ev is not None:
            stream.wait_event(ev)

    @staticmethod
    def sync(ev: Any) -> None:
        if ev is not None:
            ev.synchronize()

    @staticmethod
    def elapsed(a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1e3 if a is not None and b is not None else 0.0


class _MappedRows:
    """Pinned host rows as a Triton pointer argument (what the prepare kernel needs of a tensor)."""

    def __init__(self, view: np.ndarray) -> None:
        self.view = view  # keeps the memory alive while the launch is queued
        self.shape = view.shape
        self.dtype = torch.from_numpy(view[:0]).dtype
        self._strides = tuple(s // view.itemsize for s in view.strides)

    def data_ptr(self) -> int:
        return self.view.ctypes.data

    def stride(self, dim: int) -> int:
        return self._strides[dim]


def _mapped(view: np.ndarray, device: torch.device) -> Any:
    """The rows of a pinned ring buffer, readable by a kernel on ``device`` through the GPU's mapping
    of host memory (unified addressing: the host pointer is valid on the device). No device copy."""

    class _Iface:
        __cuda_array_interface__ = {
            "shape": view.shape,
            "typestr": view.dtype.str,
            "data": (view.ctypes.data, False),
            "strides": view.strides,
            "version": 2,
        }

    # Which of the two served the measured mapped runs was not recorded, so both stay.
    try:
        with torch.cuda.device(device):
            return torch.as_tensor(_Iface(), device=device)
    except (RuntimeError, TypeError, ValueError):  # a torch that refuses host pointers: Triton takes them
        return _MappedRows(view)


def run_batched(
    source: BandReader,
    plan: ResolvedPipeline,
    backend: Backend,
    emit: Callable[..., None],
    *,
    start: int,
    stop: int | None = None,
    step_rows: int,
    warmup: str,
    transfer: str = "pinned",
    on_rows: Callable[[int], None] | None = None,
    fill_carry: FillCarry | None = None,
    frames: FrameSink | None = None,
) -> StageTimes:
    """Compute rows [start, stop) in steps of ``step_rows`` and hand each step's rows to ``emit`` in order.

    ``emit(rows, release=...)`` runs on a writer thread; ``rows`` is a reused host slot, lent until it calls
    ``release()`` (exactly once, from any thread, also after a failure; a sink's ``append`` does).
    ``frames``: a sink that stores chunks encoded here; where its chunks divide the step and the GPU can
    encode them (:func:`tsconv.kernels.lz4_encode.encode_reason`), each step's rows go to it as Blosc-LZ4
    frames made on the device instead (``times.gpu_encoded``), and to ``emit`` otherwise.
    Equals the chunked engine's (:func:`tsconv.engine.chunked.run_chunked`) within float32 rounding (the
    level a first stage's re-centring falls back on is the same rule applied per step instead of per chunk).
    """
    # imports Triton, which a CPU run (the chunked engine) may lack
    from tsconv.kernels.prepare import prepare

    check_transfer(transfer)
    dev = backend.device
    gpu = _Gpu(dev)
    rows = source.rows if stop is None else stop
    backend.series_end = rows
    halo, n_feat = plan.halo, len(plan.input_names)
    fill = plan.preprocess is None or plan.preprocess.fill == "ffill"
    # a bank's steps read no level: its per-step torch ops cost the engine thread 1-2 ms a step for nothing
    # (benchmarks/NOTES.md, "Pieces and steps")
    needs_level = backend.reads_level
    times = StageTimes(step_rows=step_rows)
    t_setup = time.perf_counter()
    if transfer == "mapped" and gpu.cuda and not source.pinned:
        why = source.fallback_reason or "its reader does not decode into pinned memory"
        raise TsconvError(
            f"--transfer mapped needs the fast reader's pinned ring, which this store cannot use ({why})",
            hint="use --transfer pinned (the default).",
        )

    # Start state, as the chunked engine builds it: the fill state and raw filled rows before `start`. The
    # carries hold the halo and at least the TAIL_ROWS the next step's level reads (rows_before).
    sel: BandReader = ColumnSource(source, plan.columns) if plan.columns is not None else source
    kept = rows_before(halo)
    begin = max(0, start - kept)
    state0 = (fill_carry or FillCarry()).state_before(sel, begin)
    carry0 = np.zeros((kept - (start - begin), n_feat), dtype=np.float32)
    if start > begin:
        raw = np.asarray(sel.read(begin, start), dtype=np.float32)
        prefix, state0 = forward_fill(raw, state0)
        carry0 = np.concatenate([carry0, prefix if fill else raw], axis=0)

    # the first host rows read (rows the GPU decoder decodes stay on the device and are not checked)
    rounding = Float32Check(plan.input_names)
    f32 = torch.float32
    state = torch.from_numpy(state0).to(dev)
    level = torch.full_like(state, float("nan"))
    carries = [
        torch.from_numpy(np.ascontiguousarray(carry0)).to(dev),
        torch.zeros((kept, n_feat), device=dev),
    ]
    cols = None if plan.columns is None else torch.tensor(plan.columns, dtype=torch.int64, device=dev)
    xc = torch.empty((halo + step_rows, n_feat), dtype=f32, device=dev)
    # torch holds native byte order only: big-endian rows (a zarr 2 store's '>f4', an array's) are swapped
    # on the host as they are read (below)
    native = np.dtype(source.dtype).newbyteorder("=")
    src_dtype = torch.from_numpy(np.empty(0, dtype=native)).dtype
    band_rows = max(1, source.band_rows)
    # A reader that decodes on the device (tsconv.io.readers.gpu) hands out device views of its own ring.
    on_device = source.on_device
    mapped = transfer == "mapped" and gpu.cuda and not on_device
    # Pieces: the rows of one band, cut to at most PIECE_BYTES, each copied into a small device ring
    # and prepared from there, so the raw input never needs a step-sized device buffer.
    row_bytes = max(1, source.n_features * src_dtype.itemsize)
    hold = max(1, source.hold)
    ring_bands = source.ring_bands
    # bands per piece: as many as fit PIECE_BYTES and the reader's hold lets stay intact with one in flight
    piece_bytes = _piece_bytes(step_rows, row_bytes)
    if on_device:  # no copy to size: as many bands as the reader serves in one view (fewer launches)
        k = max(1, source.piece_bands)
    else:
        k = min((hold + 1) // 2, _bands_per_piece(band_rows * row_bytes, piece_bytes)) if ring_bands else 1
    if k > 1:
        piece_rows = min(k * band_rows, step_rows)
    else:
        piece_rows = max(1, min(band_rows, step_rows, piece_bytes // row_bytes))
    ring = (
        []
        if mapped or on_device
        else [
            torch.empty((piece_rows, source.n_features), dtype=src_dtype, device=dev)
            for _ in range(_ring_slots(step_rows, row_bytes))
        ]
    )
    ring_free: list[Any] = [None] * len(ring)  # event: the prepare that read the slot is done
    n_out = plan.n_outputs
    # A run of fewer steps than slots (a small store is one step) allocates only the slots it uses: pinned
    # host memory is slow to allocate (every page is locked), and a fresh process pays it each run.
    slots = min(_OUT_SLOTS, len(range(start, rows, step_rows)))
    layout = _frame_layout(frames, step_rows=step_rows, n_out=n_out, device=dev)
    chunk_rows = layout.chunk_bytes // (4 * n_out) if layout else 0  # the sink's chunk, in rows
    per_step = step_rows // chunk_rows if layout else 0  # chunks a step encodes
    slot_bytes = step_rows * n_out * 4
    if layout is not None:  # a slot holds a step's frames (each up to 16 bytes over its chunk) or its rows
        slot_bytes = max(slot_bytes, per_step * layout.frame_bytes)
    host_bytes = torch.empty((slots, slot_bytes), dtype=torch.uint8, pin_memory=gpu.cuda)
    host_out = host_bytes[:, : step_rows * n_out * 4].view(f32).view(slots, step_rows, n_out)
    host_empty = torch.empty((slots, per_step), dtype=torch.bool, pin_memory=gpu.cuda) if layout else None
    enc: Any = None  # made once the sink's codec is settled (from the first step's rows) as LZ4
    undecided = layout is not None
    dev_out = torch.empty((slots, step_rows, n_out), dtype=f32, device=dev)
    # One flag per slot: the sink's threads release lent slots in any order. Bounded: a slot released twice
    # would be a bug, and raises.
    free_out = [threading.BoundedSemaphore(1) for _ in range(slots)]
    pending_bands: deque[tuple[int, Any]] = deque()  # (band, event after its last reader on the GPU)
    step_events: list[tuple[Any, ...]] = []
    copy_events: list[tuple[Any, Any]] = []  # each piece's copy, for the pure H2D time
    prep_events: list[tuple[Any, Any]] = []  # each piece's prepare kernel
    extra = times.extra
    times.extra["setup"] = time.perf_counter() - t_setup
    tracing = trace.on
    base = None
    if tracing and gpu.cuda:  # a reference event on an idle device: GPU spans on the host clock
        torch.cuda.synchronize(dev)
        base = gpu.event(gpu.compute)
        base.synchronize()
        base_t = time.perf_counter()
    warm = [
        (w, sel if isinstance(sel, slice) else torch.from_numpy(sel).to(dev))
        for w, sel in (plan.warmup_groups() if warmup == "nan" else [])
    ]
    graph = _StepGraph(
        lambda first_row: backend.run(xc, first_row, level),
        gpu.compute,
        enabled=gpu.cuda and config.current().cuda_graph,
    )
    t_loop = time.perf_counter()
    cpu_loop = time.thread_time()
    writer = _Writer(emit, host_out, free_out, on_rows, times, verify=source.verify,
                     frames=(frames, host_bytes, host_empty, layout.frame_bytes) if layout else None)  # fmt: skip
    writer.start()
    q = 0  # pieces so far (the device ring position)
    try:
        for i, s in enumerate(range(start, rows, step_rows)):
            e = min(s + step_rows, rows)
            n = e - s
            if needs_level:
                with gpu.on(gpu.compute):
                    level_before_torch(carries[i % 2][kept - min(TAIL_ROWS, s) :], state, level)
            pieces = _pieces(s, e, band_rows, piece_rows, ring_bands)
            for j, (lo, hi) in enumerate(pieces):
                band = lo // band_rows
                t0 = time.perf_counter()
                # Reading up to band L rewrites the slots of bands <= L - hold - 1: their readers must finish.
                last_band = (hi - 1) // band_rows
                while pending_bands and pending_bands[0][0] <= last_band - hold - 1:
                    gpu.sync(pending_bands.popleft()[1])
                t1 = time.perf_counter()
                if on_device:
                    src, ready = source.read_device(lo, hi)
                else:
                    view = np.asarray(source.read(lo, hi))
                    rounding.see(view, plan.columns)
                    if not view.flags.c_contiguous or view.dtype != native:
                        # a strided in-memory source or big-endian rows; ring views are contiguous and native
                        view = np.ascontiguousarray(view, dtype=native)
                t2 = time.perf_counter()
                extra["ring_wait"] = extra.get("ring_wait", 0.0) + t1 - t0
                times.read_wait += t2 - t1
                if mapped:  # (never with on_device)
                    src = _mapped(view, dev)
                    ready = None
                elif not on_device:
                    r = q % len(ring)
                    with gpu.on(gpu.copy):
                        gpu.wait(gpu.copy, ring_free[r])
                        c0 = gpu.event(gpu.copy)
                        src = ring[r][: hi - lo]
                        t_copy = time.perf_counter()
                        src.copy_(torch.from_numpy(view), non_blocking=gpu.cuda and transfer == "pinned")
                        t_copied = time.perf_counter()
                        ready = gpu.event(gpu.copy)
                        copy_events.append((c0, ready))
                        pending_bands.append((band, ready))
                    if tracing:
                        trace.add("copy_call", t_copy, t_copied, band)
                with gpu.on(gpu.compute):
                    gpu.wait(gpu.compute, ready)
                    p0 = gpu.event(gpu.compute)
                    t_prep = time.perf_counter()
                    prepare(
                        src, xc=xc[: halo + n], state=state, level=level, carry_in=carries[i % 2],
                        carry_out=carries[(i + 1) % 2], off=lo - s, n_step=n, cols=cols, fill=fill,
                        last=j == len(pieces) - 1, split=not mapped,
                    )  # fmt: skip
                    done = gpu.event(gpu.compute)
                    prep_events.append((p0, done))
                if tracing:
                    trace.add("prepare_call", t_prep, time.perf_counter(), band)
                    trace.add("ring_wait", t0, t1, band)
                    trace.add("read_wait", t1, t2, band)
                    trace.add("launch_piece", t2, time.perf_counter(), band)
                if on_device:
                    source.release(band, done)
                elif mapped:
                    pending_bands.append((band, done))
                else:
                    ring_free[q % len(ring)] = done
                q += 1
            t_launch = time.perf_counter()
            with gpu.on(gpu.compute):
                t_comp0 = gpu.event(gpu.compute)
                # A short last step is computed at full size (every stage is causal, so rows past n do not
                # reach rows before it, and they are dropped): one shape per run, so no kernel is tuned for
                # a new shape class mid-run (tuning briefly holds a 256 MB buffer: 1.33 GB peaks at 4096
                # features when the last step of a 1M-row store was tuned, against 1.14 GB otherwise).
                backend.valid_rows = halo + n  # a short last step runs at full size: the rest is not data
                y = graph(s - halo)
                if graph.status == "replayed" and backend.pre is None:
                    # a replayed step runs no Python of the stages: their FP16-storage check is given the
                    # step's input here (with a [preprocess], its later checks are not made)
                    backend.check_storage(xc[: halo + n], s - halo, level, centered=False)
                for w, warm_cols in warm:  # each output's own warm-up rows
                    if s < w:
                        y[: min(w - s, n), warm_cols] = float("nan")
            t0 = time.perf_counter()
            o = i % slots
            # Host slot o (and device slot o) are free once the sink is done with it; a writer thread that
            # died holding a slot is seen here instead of waiting for it forever.
            while not free_out[o].acquire(timeout=0.25):
                writer.check()
            t1 = time.perf_counter()
            extra["slot_wait"] = extra.get("slot_wait", 0.0) + t1 - t0
            if tracing:
                trace.add("launch_step", t_launch, t0, i)
                trace.add("slot_wait", t0, t1, i)
            writer.check()
            with gpu.on(gpu.compute):
                # The result goes to a fixed device slot on the compute stream, so the step's own tensors
                # are freed in stream order (no cross-stream lifetimes, nothing left pending after the run).
                dev_out[o, :n].copy_(y[:n])
                del y
                t_comp1 = gpu.event(gpu.compute)
            gpu.wait(gpu.back, t_comp1)
            if undecided:
                # The sink samples the first chunk's rows, as its threads would; where they are all NaN it
                # decides later, from a chunk the writer threads store (this step's rows go to them meanwhile).
                assert frames is not None and layout is not None
                first = None
                if i == 0:
                    with gpu.on(gpu.back):
                        first = dev_out[o, : min(n, chunk_rows)].cpu().numpy()
                verdict = frames.decide_compression(first)
                if verdict is not None:
                    undecided = False
                if verdict:
                    from tsconv.kernels.lz4_encode import BloscEncoder

                    enc = BloscEncoder(
                        layout, max_chunks=min(encode_group(chunk_rows, n_out), per_step), device=dev
                    )
                # False: stored uncompressed, which the host writes at memory speed
            with gpu.on(gpu.back):
                t_back0 = gpu.event(gpu.back)
                k = 0
                if enc is not None:
                    fb = layout.frame_bytes
                    k = -(-n // chunk_rows)
                    # zarr pads the store's last chunk with the fill value
                    dev_out[o, n : k * chunk_rows] = float("nan")
                    # a group at a time through the encoder's buffers; in stream order, a group's frames are
                    # copied out before the next group's shuffle overwrites them
                    for g0 in range(0, k, enc.max_chunks):
                        g1 = min(g0 + enc.max_chunks, k)
                        grp = dev_out[o, g0 * chunk_rows : g1 * chunk_rows]
                        host_bytes[o, g0 * fb : g1 * fb].view(g1 - g0, fb).copy_(
                            enc.encode(grp), non_blocking=gpu.cuda
                        )
                        empty = torch.isnan(grp.view(g1 - g0, -1)).all(1)
                        host_empty[o, g0:g1].copy_(empty, non_blocking=gpu.cuda)
                else:
                    host_out[o, :n].copy_(dev_out[o, :n], non_blocking=gpu.cuda)
                t_back1 = gpu.event(gpu.back)
            step_events.append((t_comp0, t_comp1, t_back0, t_back1))
            writer.put((t_back1, o, n, e, k))
            times.steps += 1
        if on_device:
            source.finish()  # a damaged chunk raises here, before the output is finished
        extra["loop"] = time.perf_counter() - t_loop
        times.graph = graph.status
        extra["loop_cpu"] = time.thread_time() - cpu_loop  # the main thread's own CPU time in the loop
        writer.put(None)
        writer.join_checked()
        extra["drain"] = time.perf_counter() - t_loop - extra["loop"]
    except BaseException:
        writer.abort()
        graph.release()  # its pool is freed by the next run's emptying of the cache
        raise
    finally:
        backend.valid_rows = None
    if gpu.cuda:
        torch.cuda.synchronize(dev)
        times.gpu_process_bytes = devmem.after_run(dev)
        if graph.release():
            # A dead graph's private memory pool stays reserved until the cache is emptied: 70-80 MB more
            # per run in a long-lived process. Sharing one pool between runs trips an allocator assert in
            # torch 2.11 (benchmarks/NOTES.md, "A CUDA graph per step"). The device is idle here: cheap.
            torch.cuda.empty_cache()
        for p0, p1, b0, b1 in step_events:
            times.compute += gpu.elapsed(p0, p1)
            times.d2h += gpu.elapsed(b0, b1)  # with frames: the encode and the copy of what it gave
        times.h2d = sum(gpu.elapsed(c0, c1) for c0, c1 in copy_events)
        extra["prepare"] = sum(gpu.elapsed(a, b) for a, b in prep_events)
        times.compute += extra["prepare"]
        if base is not None:

            def at(ev: Any) -> float:
                return base_t + gpu.elapsed(base, ev)

            for k, (c0, c1) in enumerate(copy_events):
                trace.add("gpu_copy", at(c0), at(c1), k, thread=-1)
            for k, (a, b) in enumerate(prep_events):
                trace.add("gpu_prepare", at(a), at(b), k, thread=-2)
            for k, (p0, p1, b0, b1) in enumerate(step_events):
                trace.add("gpu_compute", at(p0), at(p1), k, thread=-2)
                trace.add("gpu_d2h", at(b0), at(b1), k, thread=-3)
    times.gpu_encoded = enc is not None
    if fill_carry is not None:  # the state at ``rows`` (the start's when there was no step to run)
        with gpu.on(gpu.compute):  # after the last piece's prepare, which wrote the state leaving it
            fill_carry.end = (rows, state.cpu().numpy().copy())
    return times


def _frame_layout(frames: FrameSink | None, *, step_rows: int, n_out: int, device: torch.device) -> Any:
    """How the GPU frames the sink's chunks (:class:`tsconv.kernels.lz4_encode.FrameLayout`), or None
    where a step does not hold whole chunks, the chunks cannot be framed or the device cannot encode:
    the host's threads encode then."""
    chunk_rows = frames.frame_rows() if frames is not None else None
    if not chunk_rows or step_rows % chunk_rows:
        return None
    from tsconv.kernels import lz4_encode

    if lz4_encode.encode_reason(device) is not None:
        return None
    try:
        return lz4_encode.frame_layout(chunk_rows=chunk_rows, row_bytes=4 * n_out)
    except ValueError:
        return None


def _pieces(
    s: int, e: int, band_rows: int, piece_rows: int, ring_bands: int | None = None
) -> list[tuple[int, int]]:
    """[s, e) in pieces whose reads are views of the reader's ring.

    ``piece_rows`` below a band: pieces of at most that many rows within one band. Otherwise (``ring_bands``
    set) pieces of up to ``piece_rows // band_rows`` bands, ending at band boundaries and never spanning
    the ring's wrap (band index a multiple of ``ring_bands``).
    """
    out = []
    lo = s
    k = piece_rows // band_rows if ring_bands and piece_rows >= band_rows else 0
    while lo < e:
        b = lo // band_rows
        if k:
            end_band = min(b + k, (b // ring_bands + 1) * ring_bands)
            hi = min(e, end_band * band_rows)
        else:
            hi = min(e, (b + 1) * band_rows, lo + piece_rows)
        out.append((lo, hi))
        lo = hi
    return out


class _Writer(threading.Thread):
    """Waits for each result slot's copy and lends its rows to ``emit``, whose ``release`` frees the slot.

    ``verify(stop)`` (the GPU reader's): raise if an input chunk before row ``stop`` did not decode. It runs
    before a step's rows are emitted, once the step's copy is done (so the decodes it read are too): rows
    computed from a damaged chunk never reach the output, and ``rows_done`` never covers them."""

    def __init__(self, emit, host_out, free_out, on_rows, times, *, verify=None, frames=None) -> None:  # noqa: ANN001
        super().__init__(name="tsconv-emit", daemon=True)
        self.verify = verify
        self.frames = frames  # (sink, host slots as bytes, empty flags, frame bytes) for steps sent as frames
        self.emit, self.host_out, self.free_out, self.on_rows, self.times = (
            emit,
            host_out,
            free_out,
            on_rows,
            times,
        )
        self.queue: queue.Queue[Any] = queue.Queue()
        self.error: BaseException | None = None
        self._halt = False

    def run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None or self._halt:
                return
            ev, o, n, stop, k = item
            lent = False
            try:
                if ev is not None:
                    ev.synchronize()
                if self.verify is not None:
                    self.verify(stop)
                t0 = time.perf_counter()
                lent = True
                if k:
                    sink, host_bytes, host_empty, frame_bytes = self.frames
                    sink.append_frames(host_bytes[o, : k * frame_bytes].view(k, frame_bytes).numpy(), rows=n,
                                       empty=host_empty[o, :k].numpy(), release=self.free_out[o].release)  # fmt: skip
                else:
                    self.emit(self.host_out[o, :n].numpy(), release=self.free_out[o].release)
                t1 = time.perf_counter()
                self.times.write += t1 - t0
                if trace.on:
                    trace.add("emit", t0, t1, n)
                if self.on_rows is not None:
                    self.on_rows(n)
            except BaseException as exc:  # surfaced on the main thread by check()/join_checked()
                self.error = exc
                if not lent:  # a lent slot is freed by emit's release
                    self.free_out[o].release()
                return

    def put(self, item: Any) -> None:
        self.check()
        self.queue.put(item)

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def join_checked(self) -> None:
        self.join()
        self.check()

    def abort(self) -> None:
        self._halt = True
        self.queue.put(None)
        self.join(timeout=60)
