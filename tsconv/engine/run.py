"""The one place that wires a run: source -> reader -> preprocessing and stages -> head -> sink.

Every entry (a zarr output, a Parquet output, ``features()`` on arrays and frames, a dask partition) builds
a :class:`~tsconv.io.contracts.Source` and a :class:`~tsconv.io.contracts.Sink`, asks :func:`plan_run` how
the rows will be computed (the chunked engine, or on CUDA the batched engine with its rows per step and
reader), then calls :func:`run`. Planning comes first so that a pipeline that cannot fit the GPU memory
budget is refused before an entry creates or replaces anything.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from tsconv import config
from tsconv.engine import devmem
from tsconv.engine.batched import (
    DEFAULT_GPU_MEM,
    TRANSFERS,
    parse_bytes,
    plan_step_rows,
    reader_hold,
    run_batched,
)
from tsconv.engine.chunked import run_chunked
from tsconv.engine.compute import Backend
from tsconv.engine.fill import FillCarry
from tsconv.engine.report import stage_summary
from tsconv.errors import GpuError, TsconvError
from tsconv.io.contracts import BandReader, Sink, Source
from tsconv.kernels import early
from tsconv.kernels.torch_side import require_triton
from tsconv.pipeline.spec import ResolvedPipeline

__all__ = [
    "CudaOptions",
    "DECODES",
    "RunPlan",
    "batched_on",
    "begin_cuda",
    "exact_fp32",
    "plan_run",
    "reset_device",
    "resolve_device",
    "run",
    "small_for_cuda",
]

DECODES = ("gpu", "cpu")
# The GIL switch interval while a CUDA run lasts. The engine thread launches the GPU work and hands the
# GIL back and forth with the reading and writing threads; at Python's default of 5 ms it waits longer
# for it each time: 0.329 s at 5 ms, 0.302 s at 500 us, 0.300 s at 200 us for the 4.3 GB e2e job on the
# H200 (benchmarks/NOTES.md, "The batched engine").
SWITCH_INTERVAL_S = 200e-6


@dataclass(frozen=True)
class CudaOptions:
    """How a CUDA run moves and decodes its input: ``transfer`` (``pinned`` async copies from page-locked
    memory, ``mapped`` zero-copy reads of it, ``pageable`` plain copies), ``gpu_mem`` (bytes of the GPU
    the process may hold, as nvidia-smi shows it: its CUDA context and kernels, then the run's allocations
    and reservations), ``decode`` (``gpu``: stores the GPU decodes are decoded there; ``cpu``: in
    threads; None: ``gpu`` on CUDA)."""

    transfer: str = "pinned"
    gpu_mem: int = DEFAULT_GPU_MEM
    decode: str | None = None

    @classmethod
    def from_args(cls, *, transfer: str | None, gpu_mem: int | str | None, decode: str | None) -> CudaOptions:
        """Checked options from user arguments (None: the default)."""
        transfer = "pinned" if transfer is None else transfer
        if transfer not in TRANSFERS:
            raise TsconvError(
                f"unknown transfer mode {transfer!r}", hint=f"use one of {', '.join(TRANSFERS)}."
            )
        if decode is not None and decode not in DECODES:
            raise TsconvError(
                f"decode must be one of {', '.join(DECODES)}, got {decode!r}",
                hint="gpu (the default) decodes Blosc-LZ4 stores on the GPU; cpu decodes in threads.",
            )
        return cls(transfer, DEFAULT_GPU_MEM if gpu_mem is None else parse_bytes(gpu_mem), decode)


@dataclass(frozen=True)
class RunPlan:
    """How input rows [start, stop) will be computed: by the batched engine when ``step_rows`` is set (with
    the GPU reader when ``gpu_reader``), else chunk by chunk."""

    device: torch.device
    chunk: int
    warmup: str
    start: int
    stop: int
    step_rows: int | None = None
    gpu_reader: bool = False
    transfer: str = "pinned"
    gpu_outside_torch: int = 0  # bytes of --gpu-mem the process holds outside torch's allocator
    # the output's chunk rows, when steps hold whole chunks to encode on the GPU
    encode_rows: int | None = None
    gpu_batch: int | None = None  # the GPU reader's bands per decode launch
    # the GPU reader's bands per launch, or why a store the GPU could decode is decoded on the CPU
    decode_note: str | None = None
    # the CPU's engine reads an input float32 does not hold as float64 (Backend.reads_float64); False: as
    # float32, where an output's earlier rows were read so
    read_float64: bool = True


def plan_run(
    source: Source,
    plan: ResolvedPipeline,
    *,
    device: torch.device,
    chunk: int,
    warmup: str,
    start: int = 0,
    stop: int | None = None,
    cuda: CudaOptions | None = None,
    encode_rows: int | None = None,
) -> RunPlan:
    """Choose the engine, the rows per step and the reader; refuse a pipeline that does not fit the budget.

    On CUDA (or with the ``engine`` setting ``batched``, on the CPU through the Triton interpreter, for
    tests) the batched engine runs, with the GPU reader where the store allows it and its rings fit.
    ``encode_rows``: the output's chunk rows, when its chunks may be encoded on the GPU: the steps then
    hold whole chunks and the encoder's memory, where that fits the budget beside the reader chosen.
    """
    stop = source.rows if stop is None else stop
    cuda = cuda if cuda is not None else CudaOptions()
    if not batched_on(device):
        return RunPlan(device, chunk, warmup, start, stop)
    if device.type != "cuda" and not config.interpreted():
        raise TsconvError(
            "the batched engine runs on CUDA (on the CPU only under TRITON_INTERPRET=1, for tests)",
            hint="leave the engine setting at auto.",
        )

    # --gpu-mem bounds the whole process: the CUDA context and loaded kernels take their share first
    outside = devmem.outside_torch(device) if device.type == "cuda" else 0

    def step_rows(reader_bytes: int | None = None, encode: int | None = None) -> int:
        return plan_step_rows(plan, src_features=source.n_features, src_itemsize=source.dtype.itemsize,
                              budget=cuda.gpu_mem, outside=outside, chunk=chunk, transfer=cuda.transfer,
                              rows=stop - start, reader_bytes=reader_bytes, encode_rows=encode)  # fmt: skip

    def best(reader_bytes: int | None = None) -> tuple[int, int | None]:
        """(step rows, encode rows): with the GPU's encoder where it fits, else without."""
        if encode_rows:
            with contextlib.suppress(TsconvError):
                return step_rows(reader_bytes, encode_rows), encode_rows
        return step_rows(reader_bytes), None

    rows, encode = best()  # refuses a pipeline that does not fit even with the CPU reader
    # The GPU reader on CUDA by default; on the CPU (the interpreter) only when asked for.
    wanted = cuda.decode == "gpu" or (cuda.decode is None and device.type == "cuda")
    note = None
    if wanted and cuda.transfer == "pinned":
        sizes, why = source.gpu_reader()
        if why is None:
            # Fewer bands per launch where the decoder's rings at full width do not fit beside the steps, as
            # long as the steps keep at least half the rows the CPU decoder's would have (on the H200 at the
            # default --gpu-mem, 1,048,576 x 1024 LZ4, fresh processes: 9 bands with 6,144-row steps ran no
            # faster than 6 bands with 31,744; benchmarks/NOTES.md, section 4).
            for batch, nbytes in sizes.items():
                with contextlib.suppress(TsconvError):
                    steps, enc = best(nbytes)
                    if steps * 2 >= rows:
                        return RunPlan(device, chunk, warmup, start, stop, steps, True, cuda.transfer, outside,
                                       enc, batch, f"{batch} bands a launch")  # fmt: skip
            least = min(sizes.values())
            note = (f"the GPU decoder's rings ({least / 1e6:,.0f} MB or more) leave too little of --gpu-mem "
                    f"{cuda.gpu_mem / 1e9:.2f} GB for the steps")  # fmt: skip
    return RunPlan(
        device, chunk, warmup, start, stop, rows, False, cuda.transfer, outside, encode, None, note
    )


# A few rows on a GPU host with device auto: what a fresh process pays before its first CUDA step (the
# context, Triton's driver, each kernel's first load) was 0.8-0.9 s on the H200 machine for a 23,200-row
# update (benchmarks/results/update_h200.md), against 0.2-0.3 s for the same rows on the 2-core CPU
# machine. Work under this many multiply-adds (about 0.4 s at the default bank's rate on two cores) and
# these rows runs on the CPU instead.
SMALL_MACS = 1e8
SMALL_ROWS = 1 << 16


def small_for_cuda(plan: ResolvedPipeline, rows: int) -> bool:
    """Whether ``rows`` rows of ``plan`` cost less on the CPU than a fresh process's CUDA start-up: an
    estimate from the stages' multiply-adds per row (a built-in bank: a few per output)."""
    per_row = sum(L.weight.shape[0] * (8 if L.structured else L.weight.shape[1] * L.weight.shape[2])
                  for L in plan.layers)  # fmt: skip
    if plan.head is not None:
        per_row += plan.head.weight.size
    return rows <= SMALL_ROWS and rows * per_row <= SMALL_MACS


def batched_on(device: torch.device) -> bool:
    """Whether a run on ``device`` uses the batched engine: on CUDA, unless the ``engine`` setting says
    otherwise (``batched`` on the CPU runs it through the Triton interpreter, for tests)."""
    engine = config.current().engine
    return engine == "batched" or (engine == "auto" and device.type == "cuda")


def resolve_device(device: str, *, start: bool = True) -> torch.device:
    """Map ``auto``/``cpu``/``cuda`` (or ``cuda:N``) to a torch device, or say why not. ``start``: begin the
    GPU start-up of a CUDA device now (else :func:`begin_cuda` does, once the run knows it needs the GPU; then
    ``auto`` is CUDA where the driver lists a GPU, which the caller confirms with ``torch.cuda.is_available``)."""
    if not isinstance(device, str):
        raise TsconvError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if device == "auto":
        if not start:
            # CUDA's initialisation (torch.cuda.is_available: 0.05-0.2 s of a fresh process) waits until the run
            # knows it needs the GPU: an update of a few rows runs on the CPU without it. The caller checks
            # torch.cuda.is_available() before it keeps a CUDA device.
            return torch.device("cuda") if early.gpu_present() else torch.device("cpu")
        if not torch.cuda.is_available():
            return torch.device("cpu")
        # no quiet fall back to the CPU without Triton (begin_cuda says so): on a GPU host that is a run
        # many times slower
        return begin_cuda(torch.device("cuda"), asked=device)
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda" or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise TsconvError(
                f"device {device!r} was asked for but no CUDA GPU is available",
                hint="use --device cpu or --device auto.",
            )
        return begin_cuda(torch.device(device), asked=device) if start else torch.device(device)
    raise TsconvError(f"unknown device {device!r}", hint="use auto, cpu or cuda.")


def begin_cuda(dev: torch.device, *, asked: str = "cuda") -> torch.device:
    """``dev``, with the process's GPU start-up begun (:mod:`tsconv.kernels.early`; once per process) and
    torch's pinned host memory allocated the faster way. Refuses a host without Triton, naming the device
    the user ``asked`` for."""
    require_triton(f"device {asked}" + (" (a CUDA GPU is available)" if asked == "auto" else ""))
    early.start(device_index=dev.index)
    _fast_pinned()
    return dev


def _fast_pinned() -> None:
    """Have torch's pinned allocator lock pages with ``cudaHostRegister`` over several threads rather than
    ``cudaHostAlloc``: 0.05-0.06 s against 0.14-0.17 s for 216 MB on the H200 machine
    (``benchmarks/diag/start_costs.py``), which a fresh run pays for its host rings. The setting has no public
    API in torch (``PYTORCH_CUDA_ALLOC_CONF`` is read once, at start-up); where it is missing, torch's default
    allocation stays."""
    threads = max(1, min(8, os.cpu_count() or 1))
    # torch 2.11 deprecated the CUDA spelling with a FutureWarning that a CLI run would print on every run
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is None:
        setter = getattr(torch.cuda.memory, "_set_allocator_settings", None)
    try:
        setter(f"pinned_use_cuda_host_register:True,pinned_num_register_threads:{threads}")
    except (TypeError, RuntimeError):  # TypeError: neither exists
        pass


# What CUDA says when memory is short: an allocation (torch's OutOfMemoryError) or the context itself,
# which another process's allocations can leave no room for ("CUDA error: out of memory").
_CUDA_SHORT = ("out of memory", "cudaErrorMemoryAllocation", "busy or unavailable")


@contextlib.contextmanager
def cuda_errors() -> Iterator[None]:
    """Turn a CUDA failure a user can act on (memory short, the GPU busy) into one :class:`GpuError`;
    other errors, CUDA's included, pass through with their traceback."""
    try:
        yield
    except RuntimeError as exc:  # torch.OutOfMemoryError and torch.AcceleratorError are RuntimeErrors
        text = str(exc)
        if not isinstance(exc, torch.cuda.OutOfMemoryError) and not any(s in text for s in _CUDA_SHORT):
            raise
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        raise GpuError(
            f"the GPU has too little free memory for this run ({first})",
            hint="see what holds it with nvidia-smi and free it, lower --gpu-mem, or use --device cpu.",
        ) from exc


def reset_device(device: torch.device) -> None:
    """Before a CUDA run: free the allocator's unused cached blocks (unless the ``empty_cache`` setting is
    off) and start the peak-memory counters afresh. Blocks cached by earlier work in the process are reused
    out of order: a second 4096-feature run peaked at 1.60 GB reserved against 1.28 GB for the first
    (benchmarks/NOTES.md, "GPU memory and the step budget")."""
    if device.type != "cuda":
        return
    if config.current().empty_cache:
        with torch.cuda.device(device):
            torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)


def run(
    rp: RunPlan,
    source: Source,
    plan: ResolvedPipeline,
    sink: Sink,
    *,
    progress: bool = False,
    desc: str = "",
    threads: int | None = None,
    fill_carry: FillCarry | None = None,
    before_finish: Callable[[BandReader], None] | None = None,
    storage_notes: list[tuple[str, float, str]] | None = None,
    read_notes: list[str] | None = None,
) -> dict[str, Any]:
    """Compute the planned rows of ``source`` through ``plan`` into ``sink``, then finish the sink.

    Returns the report's engine fields: ``head_path``, and for the batched engine its stage fields. On an
    error the sink is closed unfinished (a zarr output stays incomplete and resumable). ``threads``: decode
    threads for the reader (None: the default). ``fill_carry``: the fill state to start from and, after the
    run, the one at its end (:class:`tsconv.engine.fill.FillCarry`). ``before_finish``: called with the reader
    (still open) once the rows are computed, before the sink is finished (a zarr output marked complete).
    ``storage_notes``: where given, the FP16-storage check's warnings are appended there as (stage, move,
    message) instead of given (a dask task's, which the client gives once); ``read_notes``: likewise the
    CPU read's warning of int64 values beyond 2^53, as its message.
    """
    from tsconv.progress import progress_bar

    dev = rp.device
    setup: dict[str, float] = {}  # seconds before the loop, for the report's stage_seconds
    backend = _timed(setup, "backend", Backend, plan, dev)
    backend.notes = storage_notes
    if dev.type == "cuda":
        _timed(setup, "triton_start", early.wait_triton)  # the reader's open may launch the GPU decoder
        _timed(setup, "cuda_start", early.wait_cuda)  # its launches done before the loop captures a graph
    batched = rp.step_rows is not None
    band_bytes = source.band_rows * source.n_features * source.dtype.itemsize
    stages: dict[str, Any] | None = None
    with (
        progress_bar(total=rp.stop - rp.start, desc=desc, enabled=progress) as bar,
        exact_fp32(dev),
        _gil_switch(dev),
        contextlib.closing(sink),  # closed on the way out; after finish() that is a no-op
        _timed(setup, "open_reader", source.open, device=dev, pinned=dev.type == "cuda" and rp.transfer != "pageable",
               hold=reader_hold(band_bytes) if batched else 1, gpu=rp.gpu_reader, threads=threads,
               batch=rp.gpu_batch) as reader,
    ):  # fmt: skip
        if batched:
            times = run_batched(reader, plan, backend, sink.append, start=rp.start, stop=rp.stop,
                                step_rows=rp.step_rows, warmup=rp.warmup, transfer=rp.transfer,
                                on_rows=bar.update, fill_carry=fill_carry,
                                frames=sink if rp.encode_rows else None)  # type: ignore[arg-type]  # fmt: skip
        else:
            run_chunked(reader, plan, backend, sink.append, start=rp.start, stop=rp.stop, chunk=rp.chunk,
                        read_float64=rp.read_float64, read_notes=read_notes,
                        warmup=rp.warmup, on_rows=bar.update, fill_carry=fill_carry, emit_copies=True, reserve=sink.reserve)  # fmt: skip
        backend.finish()
        if before_finish is not None:
            before_finish(reader)
        t0 = time.perf_counter()
        sink.finish()
        t_finish = time.perf_counter() - t0
        if batched:
            # after finish(): the chunks still queued when the loop ended are written there, and count in the
            # write stage (all of an output of a few chunks, whose report said write 0.000)
            stages = stage_summary(times, transfer=rp.transfer, reader=reader, sink=sink)
            stages["stage_seconds"].update(setup)
            stages["stage_seconds"]["finish"] = t_finish
            stages["gpu_outside_torch_bytes"] = rp.gpu_outside_torch
            stages["decode_note"] = rp.decode_note
            if rp.encode_rows:
                stages["gpu_encoded"] = times.gpu_encoded
    return {**(stages or {}), "head_path": backend.head_path}


@contextlib.contextmanager
def exact_fp32(device: torch.device) -> Iterator[None]:
    """cuDNN and cuBLAS may use TF32 by default, which cannot resolve price levels: keep fp32."""
    if device.type != "cuda":
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@contextlib.contextmanager
def _gil_switch(device: torch.device) -> Iterator[None]:
    """A short GIL switch interval while the engine runs on CUDA; process-wide while it lasts, restored after."""
    if device.type != "cuda":
        yield
        return
    old = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def _timed(into: dict[str, float], key: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, its seconds kept in ``into[key]``."""
    t0 = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    finally:
        into[key] = time.perf_counter() - t0
