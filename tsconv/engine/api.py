"""The streaming engine: store -> reader -> forward fill -> chunk + halo -> compute -> writer -> store.

This is the one module that wires every stage together, so the data path reads top to bottom here.
Each chunk of ``chunk`` steps is computed together with the ``halo`` rows before it (the pipeline's
receptive field), so memory is bounded by chunk x features whatever the series' length, and the result
equals the whole-series computation.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import resource
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tsconv.engine.batched import (
    DEFAULT_GPU_MEM,
    StageTimes,
    check_transfer,
    parse_bytes,
    plan_step_rows,
    reader_hold,
    run_batched,
)
from tsconv.engine.compute import Backend
from tsconv.engine.fill import fill_state_before, forward_fill
from tsconv.engine.level import centering_level, level_before, tail_rows
from tsconv.errors import ShapeError, StoreError, TsconvError
from tsconv.io.digest import digest_note, input_digest, read_digest, verify_input, write_digest
from tsconv.io.lock import OutputLock
from tsconv.io.readers import gpu as gpudecode
from tsconv.io.readers.blocks import ArraySource, ColumnSource, RowSource
from tsconv.io.readers.threads import ParallelBandReader
from tsconv.io.store import InputStore, check_time, describe_repeats, open_input, repeated_names
from tsconv.io.timecolumn import ShiftedTime
from tsconv.io.writers.zarr_writer import (
    FORMAT_VERSION,
    OutputWriter,
    check_compression,
    check_output_flags,
    check_output_path,
    discard_output,
    output_chunk_rows,
    prepare_output,
    remove_leftovers,
    rows_written,
)
from tsconv.pipeline.spec import (
    Pipeline,
    ResolvedPipeline,
    default_pipeline,
    load_pipeline,
    pipeline_from_dict,
    resolve,
)

__all__ = ["Report", "process", "features", "default_output_path", "resolve_device"]

WARMUPS = ("nan", "zero")
PipelineLike = str | os.PathLike[str] | Pipeline | dict[str, Any] | None


@dataclass(frozen=True)
class Report:
    """What a run did and how fast."""

    input: str
    output: str
    device: str
    rows: int  # rows computed by this run
    total_rows: int
    features_in: int
    features_out: int
    halo: int
    chunk: int
    resumed_from: int
    seconds: float
    rows_per_s: float
    input_gbps: float
    peak_rss_bytes: int
    peak_gpu_allocated_bytes: int | None
    peak_gpu_reserved_bytes: int | None
    transfer: str | None = None  # the batched (GPU) engine's transfer mode; None for the chunked engine
    step_rows: int | None = None  # rows per launch in the batched engine
    stage_seconds: dict[str, float] | None = None  # see StageTimes: read/decode, h2d, compute, d2h, write
    bound_by: str | None = None  # the stage with the most (per-thread) busy time
    reader: str | None = None  # batched engine: "gpu", "threads", "processes" or "zarr" (see reader_kind)
    head_path: str | None = None  # the last stage + head: "unfused", "gemm" or "fused"; None: no head
    # the output values' codec: "lz4", "none", or with "(auto: ...)" saying what the sample showed
    compression: str | None = None
    # batched engine: "replayed" (the steps' launches as one CUDA graph), "eager" (too few steps to capture),
    # "off" (not CUDA, or TSCONV_CUDA_GRAPH=0) or "off: why" (the capture failed)
    cuda_graph: str | None = None
    # the GPU reader: how chunk files are read, "native" (tsconv.io.readers.fileread) or "python (why not native)"
    file_reads: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        gpu = (
            f", peak GPU {self.peak_gpu_allocated_bytes / 2**20:.0f} MiB"
            if self.peak_gpu_allocated_bytes is not None
            else ""
        )
        resumed = f" (resumed at row {self.resumed_from:,})" if self.resumed_from else ""
        stages = ""
        parts = ", ".join(f"{k} {v:.3f}" for k, v in (self.stage_seconds or {}).items() if k in _SHOWN_STAGES)
        if parts:  # the engine's stages (a dask run's stage_seconds hold the tasks' phases instead)
            stages = f"; stages (s): {parts}; bound by {self.bound_by}"
            if self.head_path:
                stages += f"; head {self.head_path}"
            if self.reader:
                stages += f"; decoded by {self.reader}"
        return (
            f"{self.rows:,} rows x {self.features_in} features -> {self.features_out} features{resumed} "
            f"in {self.seconds:.2f} s on {self.device}: {self.rows_per_s:,.0f} rows/s, "
            f"{self.input_gbps:.3f} GB/s in, peak RSS {self.peak_rss_bytes / 2**20:.0f} MiB{gpu}{stages} "
            f"-> {self.output}"
        )


_SHOWN_STAGES = ("decode", "gpu_decode", "h2d", "compute", "d2h", "write")


def resolve_device(device: str) -> torch.device:
    """Map ``auto``/``cpu``/``cuda`` (or ``cuda:N``) to a torch device, or say why not."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda" or device.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise TsconvError(
                f"device {device!r} was asked for but no CUDA GPU is available",
                hint="use --device cpu or --device auto.",
            )
        return torch.device(device)
    raise TsconvError(f"unknown device {device!r}", hint="use auto, cpu or cuda.")


def _as_pipeline(pipeline: PipelineLike) -> Pipeline:
    if pipeline is None:
        return default_pipeline()
    if isinstance(pipeline, Pipeline):
        return pipeline
    if isinstance(pipeline, dict):
        return pipeline_from_dict(pipeline)
    return load_pipeline(pipeline)


def default_output_path(input_path: str | os.PathLike[str]) -> Path:
    """``ticks.zarr`` -> ``ticks.features.zarr``, beside the input."""
    p = Path(input_path).expanduser().resolve()
    stem = p.name[: -len(".zarr")] if p.name.endswith(".zarr") else p.name
    return p.with_name(f"{stem}.features.zarr")


def _check_options(chunk: int, warmup: str) -> None:
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise TsconvError(f"chunk must be a positive integer, got {chunk!r}", hint="the default is 1024.")
    if warmup not in WARMUPS:
        raise TsconvError(f"warmup must be one of {', '.join(WARMUPS)}, got {warmup!r}")


def _check_length(rows: int, plan: ResolvedPipeline, warmup: str, where: str) -> None:
    if rows == 0:
        raise StoreError(f"{where}: the series is empty (0 steps)")
    if warmup == "nan" and rows <= plan.halo:
        raise StoreError(
            f"{where}: the series has {rows} steps but the pipeline's warm-up is {plan.halo} steps, "
            "so every output would be NaN",
            hint="use a longer series, shorter filters, or warmup='zero' (--warmup zero) for zero history.",
        )


@contextlib.contextmanager
def _exact_fp32(device: torch.device) -> Iterator[None]:
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


# The GIL switch interval during a GPU run. The engine thread launches the GPU work and hands the GIL back
# and forth with the reading and writing threads; at Python's default 5 ms it waits longer for it each time.
# Measured on the H200 (benchmarks/engine_trace.py, eleventh session, GPU reader): 0.329 s at 5 ms, 0.302 s
# at 500 us, 0.300 s at 200 us for the 4.3 GB e2e job.
SWITCH_INTERVAL_US = 200


@contextlib.contextmanager
def _gil_switch(device: torch.device) -> Iterator[None]:
    """A short GIL switch interval while the engine runs on CUDA (``TSCONV_SWITCH_INTERVAL_US``; 0 leaves
    the interpreter's own). Process-wide while it lasts, restored after."""
    env = os.environ.get("TSCONV_SWITCH_INTERVAL_US", "").strip()
    try:
        us = float(env) if env else SWITCH_INTERVAL_US
    except ValueError:
        raise TsconvError(
            f"TSCONV_SWITCH_INTERVAL_US must be a number of microseconds, got {env!r}",
            hint=f"unset it (default {SWITCH_INTERVAL_US}), or 0 to keep Python's own.",
        ) from None
    if device.type != "cuda" or us <= 0:
        yield
        return
    old = sys.getswitchinterval()
    sys.setswitchinterval(us * 1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def _stream(
    source: RowSource,
    plan: ResolvedPipeline,
    backend: Backend,
    emit: Callable[[np.ndarray], None],
    *,
    start: int,
    chunk: int,
    warmup: str,
    on_rows: Callable[[int], None] | None = None,
    stop: int | None = None,
) -> None:
    """Compute rows [start, stop) (default: to T) chunk by chunk and hand each result block to ``emit`` in order.

    ``source`` holds all the features the plan was resolved against; ``[preprocess]`` selection is applied
    here, and its transform and z-score in the backend.
    """
    if plan.columns is not None:
        source = ColumnSource(source, plan.columns)
    fill = plan.preprocess is None or plan.preprocess.fill == "ffill"
    halo, rows, nf = plan.halo, source.rows if stop is None else stop, source.n_features
    # The carry is the halo: the prepared (filled) input rows just before the next chunk, with rows
    # before step 0 as zeros (the first stage's zero history).
    begin = max(0, start - halo)
    state = fill_state_before(source, begin, np.dtype(np.float32))
    carry = np.zeros((halo - (start - begin), nf), dtype=np.float32)
    if start > begin:
        raw = np.asarray(source.read(begin, start), dtype=np.float32)
        prefix, state = forward_fill(raw, state)
        carry = np.concatenate([carry, prefix if fill else raw], axis=0)
    device = backend.device
    for s in range(start, rows, chunk):
        e = min(s + chunk, rows)
        before = level_before(carry[halo - tail_rows(halo, s) :], state)
        # ``raw`` may be a view of the reader's buffers, valid only until a later read (ParallelBandReader
        # reuses its ring): it, ``filled`` (``raw`` itself when it has no NaN) and ``x`` (``filled`` when
        # halo is 0) are used before the next read; the carry is a slice of a concatenation (a copy).
        raw = np.asarray(source.read(s, e), dtype=np.float32)
        # With fill = "none" the fill state still gives the centering level (a value no later than the
        # outputs it touches), but the backend gets the NaNs as they are.
        filled, state = forward_fill(raw, state)
        level = centering_level(before, filled)
        if not fill:
            filled = raw
        x = np.concatenate([carry, filled], axis=0) if halo else filled
        y = backend.run(torch.from_numpy(x).to(device), s - halo, torch.from_numpy(level).to(device))
        out = y.cpu().numpy() if device.type != "cpu" else y.numpy()
        if warmup == "nan" and s < halo:
            out[: min(halo - s, e - s)] = np.nan
        emit(out)
        if halo:
            carry = x[x.shape[0] - halo :]
        if on_rows is not None:
            on_rows(e - s)


def make_report(
    store: InputStore,
    plan: ResolvedPipeline,
    output: Path,
    dev: torch.device,
    *,
    rows: int,
    total_rows: int,
    chunk: int,
    resumed_from: int,
    seconds: float,
    stages: dict[str, Any] | None = None,
) -> Report:
    """The report of a run that computed ``rows`` rows in ``seconds`` (input GB/s counts every decoded column).

    ``stages``: the batched engine's ``transfer``, ``step_rows``, ``stage_seconds`` and ``bound_by``; ``head_path``.
    """
    cuda = dev.type == "cuda"
    return Report(
        input=str(store.path),
        output=str(output),
        device=str(dev),
        rows=rows,
        total_rows=total_rows,
        features_in=len(plan.input_names),
        features_out=plan.n_outputs,
        halo=plan.halo,
        chunk=chunk,
        resumed_from=resumed_from,
        seconds=seconds,
        rows_per_s=rows / seconds if seconds > 0 else 0.0,
        input_gbps=rows * store.n_features * store.dtype.itemsize / seconds / 1e9 if seconds > 0 else 0.0,
        peak_rss_bytes=_peak_rss(),
        peak_gpu_allocated_bytes=int(torch.cuda.max_memory_allocated(dev)) if cuda else None,
        peak_gpu_reserved_bytes=int(torch.cuda.max_memory_reserved(dev)) if cuda else None,
        **(stages or {}),
    )


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def process(
    input: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    pipeline: PipelineLike = None,
    chunk: int = 1024,
    device: str = "auto",
    overwrite: bool = False,
    resume: bool = False,
    warmup: str = "nan",
    progress: bool = False,
    workers: int | None = None,
    client: Any = None,
    partition_rows: int | None = None,
    transfer: str = "pinned",
    gpu_mem: int | str = DEFAULT_GPU_MEM,
    batched: bool | None = None,
    decode: str | None = None,
    compression: str = "auto",
) -> Report:
    """Stream a zarr store through a pipeline into an output store; returns a :class:`Report`.

    ``output`` defaults to ``<input stem>.features.zarr`` beside the input. An existing output is
    refused unless ``overwrite`` (replace) or ``resume`` (finish an interrupted run; refused when the input
    rows already computed changed since) is given. One run writes an output at a time: it holds a lock
    beside the output, and another run on it raises :class:`~tsconv.errors.OutputBusyError` at once.
    ``workers=N`` (a local dask cluster) or ``client`` (a ``distributed.Client`` or a scheduler address)
    run the job as one dask task per time partition (see :mod:`tsconv.engine.distributed`).
    An output ending in ``.parquet``/``.pq`` is written as Parquet (see :mod:`tsconv.io.writers.parquet_writer`).

    On CUDA the batched engine runs (:mod:`tsconv.engine.batched`): ``transfer`` is ``pinned``
    (default), ``mapped`` or ``pageable``; ``gpu_mem`` (bytes, or text like ``"1.2GB"``) bounds the GPU
    memory the run allocates and reserves (what the process already held aside; unused cached blocks are
    freed at the start, ``TSCONV_EMPTY_CACHE=0`` keeps them), and a pipeline that cannot fit is refused
    before anything starts.
    ``batched`` forces the engine (True: batched, False: chunk by chunk); on the CPU the batched engine
    needs the Triton interpreter (``TRITON_INTERPRET=1``) and exists for tests. ``decode``: where the
    batched engine decodes the input, ``"gpu"`` (Blosc-LZ4 stores with pinned transfers,
    :mod:`tsconv.io.readers.gpu`; other stores fall back to the CPU) or ``"cpu"`` (threads); None: gpu
    unless ``TSCONV_GPU_DECODE=0``.
    The report's ``reader`` says which reader ran. ``compression``: the output values' codec, ``auto``
    (lz4 where it saves at least 10% of a sample of the first chunk, else uncompressed; dask runs keep lz4),
    ``lz4`` or ``none`` (see :meth:`tsconv.io.writers.zarr_writer.OutputWriter.create`); the report says which was used.
    """
    t_enter = time.perf_counter()
    check_compression(compression)
    check_output_flags(overwrite=overwrite, resume=resume)
    if output is not None and str(output).lower().endswith((".parquet", ".pq")):
        if compression != "auto":
            raise TsconvError(
                f"compression={compression!r} is for zarr outputs", hint="leave it out for Parquet outputs."
            )
        from tsconv.io.writers.parquet_writer import process_to_parquet

        return process_to_parquet(input, output, pipeline=pipeline, chunk=chunk, device=device,
                                  overwrite=overwrite, resume=resume, warmup=warmup, progress=progress,
                                  distributed=workers is not None or client is not None)  # fmt: skip
    _check_options(chunk, warmup)
    check_transfer(transfer)
    check_decode(decode)
    budget = parse_bytes(gpu_mem)
    dev = resolve_device(device)
    store = open_input(input)
    pipe = _as_pipeline(pipeline)
    plan = resolve(pipe, store.features)
    _check_length(store.rows, plan, warmup, str(store.path))
    use_batched = _use_batched(dev, batched)
    step_rows, gpu_reader = None, False
    if use_batched:
        plan_rows = functools.partial(plan_step_rows, plan, src_features=store.n_features,
                                      src_itemsize=store.dtype.itemsize, budget=budget, chunk=chunk,
                                      transfer=transfer, rows=store.rows)  # fmt: skip
        step_rows = plan_rows()  # refuses a pipeline that does not fit even with the CPU reader
        if _gpu_decode(store, dev, transfer, decode):
            try:
                step_rows, gpu_reader = plan_rows(reader_bytes=gpudecode.device_bytes(store.values)), True
            except TsconvError:  # the GPU reader's rings do not fit beside the pipeline: decode on the CPU
                pass
    check_time(store)
    r0, r1 = _time_rows(store, plan, distributed=workers is not None or client is not None)
    out_path = Path(output).expanduser().resolve() if output is not None else default_output_path(store.path)
    check_output_path(out_path, input_path=store.path, overwrite=overwrite, resume=resume)
    run_id = uuid.uuid4().hex
    # One run owns the output from here to the end (creation, an overwrite's swap, every write, the final
    # mark); a dask run's client holds it for its workers.
    with OutputLock(out_path, run_id=run_id):
        remove_leftovers(out_path)
        fingerprint = _fingerprint(store, plan, chunk, warmup)
        action, start = prepare_output(
            out_path, input_path=store.path, overwrite=overwrite, resume=resume, fingerprint=fingerprint
        )
        digest = None
        if action in ("create", "replace"):
            digest = input_digest(store)
            if action == "replace":
                discard_output(out_path)  # before t0: deleting the old store is not the run's time
        else:  # rows computed from the input so far: output rows [0, n) come from input rows [0, r0 + n)
            current = verify_input(out_path, store, before=r0 + rows_written(out_path))
            if action == "resume" and current != read_digest(out_path):
                # the rows still to compute come from the input as it is now: record that
                write_digest(out_path, current)
        if (workers is not None or client is not None) and action != "done":
            from tsconv.engine.distributed import run_distributed

            return run_distributed(
                store, plan, out_path, action=action, rows_done=start, chunk=chunk, device=device,
                warmup=warmup, attrs=_output_attrs(store, plan, chunk, warmup, fingerprint, run_id, digest),
                progress=progress, workers=workers, client=client, partition_rows=partition_rows,
                transfer=transfer, gpu_mem=budget, compression="lz4" if compression == "auto" else compression,
                run_id=run_id, input_digest=digest,
            )  # fmt: skip
        t0 = time.perf_counter()
        if dev.type == "cuda":
            if os.environ.get("TSCONV_EMPTY_CACHE", "1") != "0":
                # Blocks cached by earlier work in the process (an earlier run's rings, freed in another order)
                # are reused imperfectly: a second 4096-feature run peaked at 1.60 GB reserved against 1.28 GB
                # for the first (benchmarks/NOTES.md, fifteenth session). Only unused cached blocks are freed.
                with torch.cuda.device(dev):
                    torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        rows = r1 - r0  # output rows: the whole store, or the rows of its time_range
        stages = None
        if action != "done":
            time_source = store.time if r0 == 0 or store.time is None else ShiftedTime(store.time, r0)
            if action in ("create", "replace"):
                attrs = _output_attrs(store, plan, chunk, warmup, fingerprint, run_id, digest)
                if (r0, r1) != (0, store.rows):
                    attrs["tsconv"].update(rows=rows, input_rows=[r0, r1])
                writer = OutputWriter.create(
                    out_path,
                    rows=rows,
                    names=plan.output_names,
                    chunk_rows=output_chunk_rows(chunk, plan.n_outputs),
                    time_source=time_source,
                    attrs=attrs,
                    compression=compression,
                    input_digest=digest,
                )
            else:
                writer = OutputWriter.reopen(out_path, time_source=time_source, start=start, run_id=run_id)
            t_run = time.perf_counter()
            stages = _run_store(
                store,
                plan,
                writer,
                dev,
                start=start,
                chunk=chunk,
                warmup=warmup,
                progress=progress,
                rows=(r0, r1),
                step_rows=step_rows,
                transfer=transfer,
                gpu_reader=gpu_reader,
            )
            if stages is not None and "stage_seconds" in stages:
                stages["stage_seconds"]["before_run"] = t_run - t0
                # opening and checking the input, planning, the input's digest, clearing an old output: before
                # ``seconds`` starts
                stages["stage_seconds"]["open"] = t0 - t_enter
            stages = {**(stages or {}), "compression": writer.compression}
        seconds = time.perf_counter() - t0
    done = rows - start if action != "done" else 0
    return make_report(
        store, plan, out_path, dev, rows=done, total_rows=rows, chunk=chunk,
        resumed_from=start if action not in ("create", "replace") else 0, seconds=seconds, stages=stages,
    )  # fmt: skip


def _use_batched(dev: torch.device, batched: bool | None) -> bool:
    if batched is None:
        return dev.type == "cuda"
    if batched and dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise TsconvError(
            "the batched engine runs on CUDA (on the CPU only under TRITON_INTERPRET=1, for tests)",
            hint="leave batched unset.",
        )
    return bool(batched)


def stage_summary(times: StageTimes, *, transfer: str, reader: Any, writer: OutputWriter) -> dict[str, Any]:
    """The report's stage fields: seconds per stage and the one that bound the run.

    GPU stages are event-timed; host stages (the reader's decode, the writer's writes) are busy seconds
    summed over their threads, so they are compared per thread (a stage using 16 threads for 16 s bounds
    a run like one taking 1 s).
    """
    decode_busy, decode_threads = reader.busy_seconds, reader.threads
    write_busy, write_threads = writer.busy_seconds, max(writer.threads, 1)
    stage = {
        "decode": decode_busy / max(decode_threads, 1),
        "h2d": times.h2d,
        "compute": times.compute,
        "d2h": times.d2h,
        "write": write_busy / max(write_threads, 1),
    }
    gpu_stages = getattr(reader, "gpu_stage_seconds", None)
    if (
        gpu_stages
    ):  # GPU reader: "decode" is its reading threads; its H2D copies and decode launches are events
        stage["h2d"] += gpu_stages["h2d"]
        stage["gpu_decode"] = gpu_stages["gpu_decode"]
    bound = max(stage, key=stage.get)
    seconds = {**stage, "decode_busy": decode_busy, "write_busy": write_busy, "read_wait": times.read_wait,
               "emit": times.write, **times.extra}  # fmt: skip
    return {"transfer": transfer, "step_rows": times.step_rows, "stage_seconds": seconds, "bound_by": bound,
            "reader": reader_kind(reader), "cuda_graph": times.graph,
            "file_reads": getattr(reader, "file_reads", None)}  # fmt: skip


def reader_kind(reader: Any) -> str:
    """How the input was read: "gpu" (decoded on the GPU), "processes", "threads" or "zarr" (fallback)."""
    if isinstance(reader, gpudecode.GpuBandReader):
        return "gpu"
    if not getattr(reader, "fast", False):
        return "zarr"
    return "threads"


def _run_store(
    store: InputStore,
    plan: ResolvedPipeline,
    writer: OutputWriter,
    dev: torch.device,
    *,
    start: int,
    chunk: int,
    warmup: str,
    progress: bool,
    rows: tuple[int, int] | None = None,
    step_rows: int | None = None,
    transfer: str = "pinned",
    gpu_reader: bool = False,
) -> dict[str, Any] | None:
    """Compute input rows [r0 + start, r1) (``rows`` = (r0, r1), default the whole store) into ``writer``.

    ``step_rows`` set: the batched engine, returning the report's stage fields; else chunk by chunk.
    On an error the writer is closed (queued chunk writes dropped; the store stays incomplete, resumable).
    """
    from tqdm import tqdm

    r0, r1 = rows if rows is not None else (0, store.rows)
    setup: dict[str, float] = {}  # seconds before compute_rows, for the report's stage_seconds
    backend = _timed(setup, "backend", Backend, plan, dev)
    stages = None
    with (
        tqdm(
            total=r1 - r0,
            initial=start,
            unit="rows",
            unit_scale=True,
            disable=not progress,
            desc=store.path.name,
            dynamic_ncols=True,
        ) as bar,
        _exact_fp32(dev),
        _gil_switch(dev),
        writer,  # closed on the way out; after finish() that is a no-op
        # Chunk files decoded ahead in threads into a reused ring (pinned on CUDA unless pageable transfers
        # are asked for); zarr reads (BlockReader) for layouts the fast path does not handle.
        _timed(
            setup,
            "open_reader",
            _open_reader,
            store,
            dev,
            transfer=transfer,
            batched=step_rows is not None,
            gpu=gpu_reader,
        ) as reader,
    ):
        times = compute_rows(
            reader, plan, backend, writer.append, start=r0 + start, stop=r1, chunk=chunk, warmup=warmup,
            step_rows=step_rows, transfer=transfer, on_rows=bar.update,
        )  # fmt: skip
        if times is not None:
            stages = stage_summary(times, transfer=transfer, reader=reader, writer=writer)
            stages["stage_seconds"].update(setup)
        t0 = time.perf_counter()
        writer.finish()
        if stages is not None:
            stages["stage_seconds"]["finish"] = time.perf_counter() - t0
    return {**(stages or {}), "head_path": backend.head_path}


def _timed(into: dict[str, float], key: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, its seconds kept in ``into[key]``."""
    t0 = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    finally:
        into[key] = time.perf_counter() - t0


DECODE_CHOICES = ("cpu", "gpu")


def check_decode(decode: str | None) -> None:
    if decode is not None and decode not in DECODE_CHOICES:
        raise TsconvError(
            f"decode must be one of {', '.join(DECODE_CHOICES)}, got {decode!r}",
            hint="gpu (the default) decodes Blosc-LZ4 stores on the GPU; cpu decodes in threads.",
        )


def _gpu_decode(store: InputStore, dev: torch.device, transfer: str, decode: str | None = None) -> bool:
    """Decode on the GPU (tsconv.io.readers.gpu): not turned off (``decode="cpu"``, or TSCONV_GPU_DECODE=0
    when ``decode`` is None), pinned transfers, and a Blosc-LZ4 store the GPU decoder handles; otherwise
    the CPU reader runs."""
    mode = gpudecode.requested() if decode is None else ("1" if decode == "gpu" else "")
    if not mode or transfer != "pinned" or (dev.type != "cuda" and mode != "force"):
        return False
    return gpudecode.unsupported_reason(store.values) is None


def _open_reader(
    store: InputStore, dev: torch.device, *, transfer: str, batched: bool, gpu: bool = False
) -> Any:
    """The reader for ``store``: on the GPU (``gpu``: chosen by :func:`process`), in processes or threads."""
    if batched and gpu:
        return gpudecode.GpuBandReader(store.values, device=dev, where=str(store.path))
    return ParallelBandReader(
        store.values,
        where=str(store.path),
        pin=dev.type == "cuda" and transfer != "pageable",
        hold=reader_hold_for(store, batched=batched),
    )


def reader_hold_for(store: InputStore, *, batched: bool) -> int:
    """The reader's ``hold`` (bands kept intact behind the one being read): the batched engine's multi-band
    pieces need more than the chunked engine's one."""
    if not batched:
        return 1
    band_rows = int(getattr(store.values, "chunks", (1,))[0])
    return reader_hold(band_rows * store.n_features * store.dtype.itemsize)


def compute_rows(
    reader: RowSource,
    plan: ResolvedPipeline,
    backend: Backend,
    emit: Callable[[np.ndarray], None],
    *,
    start: int,
    stop: int,
    chunk: int,
    warmup: str,
    step_rows: int | None,
    transfer: str = "pinned",
    on_rows: Callable[[int], None] | None = None,
) -> StageTimes | None:
    """Rows [start, stop) to ``emit``: the batched engine when ``step_rows`` is set (its stage times), else
    chunk by chunk (``_stream`` uses each block before its next read)."""
    if step_rows is not None:
        return run_batched(reader, plan, backend, emit, start=start, stop=stop, step_rows=step_rows,
                           warmup=warmup, transfer=transfer, on_rows=on_rows)  # fmt: skip
    _stream(reader, plan, backend, emit, start=start, stop=stop, chunk=chunk, warmup=warmup, on_rows=on_rows)
    return None


def _lower_bound(time: Any, rows: int, value: int) -> int:
    """The first row whose time is >= ``value`` (bisection: a few point reads)."""
    lo, hi = 0, rows
    while lo < hi:
        mid = (lo + hi) // 2
        if int(np.asarray(time[mid : mid + 1]).astype(np.int64)[0]) < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _time_rows(store: InputStore, plan: ResolvedPipeline, *, distributed: bool) -> tuple[int, int]:
    """Input rows [r0, r1) whose output ``[preprocess] time_range`` asks for (default: all)."""
    span = plan.preprocess.time_range_ns() if plan.preprocess is not None else None
    if span is None:
        return 0, store.rows
    where = f"{plan.pipeline.origin}: [preprocess] time_range"
    if store.time is None:
        raise TsconvError(
            f"{where}: the store {str(store.path)!r} has no time array",
            hint="remove time_range, or ingest the series with its timestamps.",
        )
    if distributed:
        raise TsconvError(
            f"{where} is not supported with dask (workers/client)",
            hint="run it without workers=/client=, or remove time_range.",
        )
    r0 = _lower_bound(store.time, store.rows, span[0])
    r1 = _lower_bound(store.time, store.rows, span[1])
    if r1 <= r0:
        raise StoreError(
            f"{where}: no rows of {str(store.path)!r} lie in {plan.preprocess.time_range[0]} .. "
            f"{plan.preprocess.time_range[1]}",
            hint="the store's time span is shown by `tsconv inspect`.",
        )
    return r0, r1


def _refuse_time_range(plan: ResolvedPipeline, what: str) -> None:
    if plan.preprocess is not None and plan.preprocess.time_range is not None:
        raise TsconvError(
            f"{plan.pipeline.origin}: [preprocess] time_range is not supported by {what}",
            hint="it selects output rows of a store with time in tsconv.process(); slice the result instead.",
        )


def _fingerprint(store: InputStore, plan: ResolvedPipeline, chunk: int, warmup: str) -> str:
    blob = json.dumps(
        {
            "pipeline": plan.fingerprint(),
            "input": str(store.path),
            "shape": [store.rows, store.n_features],
            "dtype": str(store.dtype),
            "chunk": chunk,
            "warmup": warmup,
            "format": FORMAT_VERSION,
        },
        sort_keys=True,
    ).encode()
    return hashlib.sha256(blob).hexdigest()


def _output_attrs(
    store: InputStore,
    plan: ResolvedPipeline,
    chunk: int,
    warmup: str,
    fingerprint: str,
    run_id: str,
    digest: dict[str, Any] | None,
) -> dict[str, Any]:
    """A new output's attributes; ``tsconv.run_id`` names the run that owns it (OutputWriter.finish checks
    it), ``tsconv.input_digest`` where the input's digest is kept (or why there is none)."""
    from tsconv import __version__

    return {
        "source": str(store.path),
        "pipeline": plan.as_run(),
        "tsconv": {
            "version": __version__,
            "format": FORMAT_VERSION,
            "complete": False,
            "rows": store.rows,
            "rows_done": 0,
            "chunk": chunk,
            "warmup": warmup,
            "halo": plan.halo,
            "fingerprint": fingerprint,
            "run_id": run_id,
            "input_digest": digest_note(digest) if digest is not None else None,
        },
    }


def features(
    x: Any,
    pipeline: PipelineLike = None,
    *,
    names: list[str] | tuple[str, ...] | None = None,
    warmup: str = "nan",
    chunk: int = 65536,
    device: str = "cpu",
    time_column: str | None = "time",
) -> Any:
    """Run a pipeline on an in-memory series ``x`` [T, F] (numpy or torch); returns [T, D] float32 of the same kind.

    The computation is the streaming engine's, so results match ``process`` on the same data (on CUDA the
    batched engine runs, as in ``process``, and ``chunk`` is not used).
    A polars DataFrame or LazyFrame gives a polars DataFrame: its ``time_column`` (if present) is
    carried over and the other columns, all numeric, are the named features (see
    :func:`tsconv.io.frames.features_frame`).
    """
    if type(x).__module__.split(".")[0] == "polars":
        if names is not None:
            raise ShapeError("names= is for arrays; a frame's features are named by its columns")
        from tsconv.io.frames import features_frame

        return features_frame(x, pipeline, time_column=time_column, warmup=warmup, chunk=chunk, device=device)
    _check_options(chunk, warmup)
    is_torch = isinstance(x, torch.Tensor)
    arr = x.detach().cpu().numpy() if is_torch else np.asarray(x)
    if arr.ndim != 2:
        raise ShapeError(
            f"expected a 2-D series [T, F] (time-major), got {arr.ndim}-D with shape {list(arr.shape)}",
            hint="pass one row per time step and one column per feature; reshape a 1-D series with x[:, None].",
        )
    if arr.dtype.kind not in "fiu":
        raise ShapeError(f"expected a real numeric array, got dtype {arr.dtype}")
    feature_names = tuple(names) if names is not None else tuple(f"f{j}" for j in range(arr.shape[1]))
    if len(feature_names) != arr.shape[1]:
        raise ShapeError(f"{len(feature_names)} names given for {arr.shape[1]} features")
    if dups := repeated_names(feature_names):
        raise ShapeError(
            f"features(): names repeat ({describe_repeats(feature_names, dups)})",
            hint="give every feature a distinct name: a pipeline selects features by name.",
        )
    plan = resolve(_as_pipeline(pipeline), feature_names)
    _refuse_time_range(plan, "features() on arrays")
    _check_length(arr.shape[0], plan, warmup, "features()")
    dev = resolve_device(device)
    out = np.empty((arr.shape[0], plan.n_outputs), dtype=np.float32)
    pos = 0

    def emit(block: np.ndarray) -> None:
        nonlocal pos
        out[pos : pos + block.shape[0]] = block
        pos += block.shape[0]

    with _exact_fp32(dev):
        if dev.type == "cuda":
            # The batched engine, as process() runs on CUDA; it wraps host rows in tensors, which needs
            # C-ordered, writeable memory (it never writes to it): copy the input once if it is not.
            src = arr if arr.flags.c_contiguous and arr.flags.writeable else np.array(arr, order="C")
            step = plan_step_rows(plan, src_features=src.shape[1], src_itemsize=src.dtype.itemsize,
                                  budget=DEFAULT_GPU_MEM, chunk=1024, transfer="pinned", rows=src.shape[0])  # fmt: skip
            run_batched(
                ArraySource(src), plan, Backend(plan, dev), emit, start=0, step_rows=step, warmup=warmup
            )
        else:
            _stream(ArraySource(arr), plan, Backend(plan, dev), emit, start=0, chunk=chunk, warmup=warmup)
    return torch.from_numpy(out) if is_torch else out
