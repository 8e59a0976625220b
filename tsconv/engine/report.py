"""What a run reports: rows, time, throughput, memory, and on CUDA where the time went."""

from __future__ import annotations

import resource
from dataclasses import asdict, dataclass
from typing import Any

import torch

from tsconv.engine.batched import StageTimes
from tsconv.io.contracts import BandReader, Sink

__all__ = ["Report", "make_report", "peak_rss", "stage_summary"]


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
    reader: str | None = None  # batched engine: "gpu", "threads", "memory" or "zarr" (see reader_kind)
    # the GPU reader's bands per decode launch, or why a store the GPU could decode was decoded on the CPU
    decode_note: str | None = None
    head_path: str | None = None  # the last stage + head: "unfused", "gemm" or "fused"; None: no head
    # the output values' codec: "lz4", "none", or with "(auto: ...)" saying what the sample showed
    compression: str | None = None
    # batched engine: "replayed" (the steps' launches as one CUDA graph), "eager" (too few steps to capture),
    # "off" (not CUDA, or the cuda_graph setting off) or "off: why" (the capture failed)
    cuda_graph: str | None = None
    # the GPU reader: how chunk files are read, "native" (tsconv.io.readers.fileread) or "python (why not native)"
    file_reads: str | None = None
    pipeline: str | None = None  # the pipeline's name
    updated_from: int | None = None  # an update (``update=True``): the output's rows before it
    # CUDA runs: what the process held on the GPU at the end of the loop as nvidia-smi shows it (NVML; None
    # where it cannot say), and the share of --gpu-mem planned for its context and kernels
    gpu_process_bytes: int | None = None
    gpu_outside_torch_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def _decode_note(self) -> str:
        return f" ({self.decode_note})" if self.decode_note else ""

    def markdown(self) -> str:
        """A short Markdown summary of the run: what went in and out, how much and how fast."""
        rows = f"{self.rows:,} of {self.total_rows:,}"
        if self.updated_from is not None:
            rows += f" (updated from {self.updated_from:,} rows, computed from row {self.resumed_from:,})"
        elif self.resumed_from:
            rows += f" (resumed at row {self.resumed_from:,})"
        device = self.device + (f", decoded by {self.reader}{self._decode_note()}" if self.reader else "")
        if self.peak_gpu_allocated_bytes is not None:
            gpu = f"{self.peak_gpu_allocated_bytes / 2**20:,.0f} MiB allocated"
            if self.peak_gpu_reserved_bytes is not None:
                gpu += f", {self.peak_gpu_reserved_bytes / 2**20:,.0f} MiB reserved"
            if self.gpu_process_bytes is not None:
                gpu += f", {self.gpu_process_bytes / 2**20:,.0f} MiB for the whole process (nvidia-smi)"
        else:
            gpu = "not measured (CPU run)"
        table = [
            ("input", f"`{self.input}`"),
            ("output", f"`{self.output}`"),
            ("pipeline", self.pipeline or "not recorded"),
            ("rows", rows),
            ("features", f"{self.features_in:,} in, {self.features_out:,} out"),
            ("seconds", f"{self.seconds:.2f}"),
            ("rows/s", f"{self.rows_per_s:,.0f}"),
            ("input GB/s", f"{self.input_gbps:.3f}"),
            ("device", device),
            ("peak RSS", f"{self.peak_rss_bytes / 2**20:,.0f} MiB"),
            ("peak GPU memory", gpu),
        ]
        if self.bound_by:
            table.append(("bound by", self.bound_by))
        lines = ["# tsconv run", "", "| | |", "|---|---|"]
        lines += [f"| {k} | {_cell(v)} |" for k, v in table]
        return "\n".join(lines) + "\n"

    def summary(self) -> str:
        gpu = (
            f", peak GPU {self.peak_gpu_allocated_bytes / 2**20:.0f} MiB"
            if self.peak_gpu_allocated_bytes is not None
            else ""
        )
        resumed = f" (resumed at row {self.resumed_from:,})" if self.resumed_from else ""
        if self.updated_from is not None:
            resumed = f" (updated from {self.updated_from:,} rows, computed from row {self.resumed_from:,})"
        stages = ""
        parts = ", ".join(f"{k} {v:.3f}" for k, v in (self.stage_seconds or {}).items() if k in _SHOWN_STAGES)
        if parts:  # the engine's stages (a dask run's stage_seconds hold the tasks' phases instead)
            stages = f"; stages (s): {parts}; bound by {self.bound_by}"
            if self.head_path:
                stages += f"; head {self.head_path}"
            if self.reader:
                stages += f"; decoded by {self.reader}{self._decode_note()}"
        return (
            f"{self.rows:,} rows x {self.features_in} features -> {self.features_out} features{resumed} "
            f"in {self.seconds:.2f} s on {self.device}: {self.rows_per_s:,.0f} rows/s, "
            f"{self.input_gbps:.3f} GB/s in, peak RSS {self.peak_rss_bytes / 2**20:.0f} MiB{gpu}{stages} "
            f"-> {self.output}"
        )


def _cell(text: str) -> str:
    """``text`` as a Markdown table cell: its pipes escaped."""
    return text.replace("|", "\\|")


_SHOWN_STAGES = ("decode", "gpu_decode", "h2d", "compute", "d2h", "write")


def make_report(
    *,
    input: str,
    output: str,
    device: torch.device,
    features_in: int,
    features_out: int,
    halo: int,
    row_bytes: int,
    rows: int,
    total_rows: int,
    chunk: int,
    resumed_from: int,
    seconds: float,
    stages: dict[str, Any] | None = None,
    pipeline: str | None = None,
) -> Report:
    """The report of a run that computed ``rows`` rows of ``row_bytes`` input bytes each in ``seconds``.

    ``stages``: the batched engine's fields (``transfer``, ``step_rows``, ``stage_seconds``, ``bound_by``,
    ``reader``, ``cuda_graph``, ``file_reads``), ``head_path`` and ``compression``; ``pipeline``: its name.
    """
    cuda = device.type == "cuda"
    return Report(
        input=input,
        output=output,
        device=str(device),
        rows=rows,
        total_rows=total_rows,
        features_in=features_in,
        features_out=features_out,
        halo=halo,
        chunk=chunk,
        resumed_from=resumed_from,
        seconds=seconds,
        rows_per_s=rows / seconds if seconds > 0 else 0.0,
        input_gbps=rows * row_bytes / seconds / 1e9 if seconds > 0 else 0.0,
        peak_rss_bytes=peak_rss(),
        peak_gpu_allocated_bytes=int(torch.cuda.max_memory_allocated(device)) if cuda else None,
        peak_gpu_reserved_bytes=int(torch.cuda.max_memory_reserved(device)) if cuda else None,
        pipeline=pipeline,
        **(stages or {}),
    )


def peak_rss() -> int:
    """This process's peak resident memory, in bytes: Linux's VmHWM, which counts the program since its exec
    (``ru_maxrss`` also keeps the RSS of the process it was forked from: a CLI run from a large Python process
    reported that process's size)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux, bytes on macOS


def stage_summary(times: StageTimes, *, transfer: str, reader: BandReader, sink: Sink) -> dict[str, Any]:
    """The report's stage fields: seconds per stage and the one that bound the run.

    GPU stages are event-timed; host stages (the reader's decode, the sink's writes) are busy seconds
    summed over their threads, so they are compared per thread (a stage using 16 threads for 16 s bounds
    a run like one taking 1 s).
    """
    decode_busy, decode_threads = reader.busy_seconds, reader.threads
    write_busy, write_threads = sink.busy_seconds, max(sink.threads, 1)
    stage = {
        "decode": decode_busy / max(decode_threads, 1),
        "h2d": times.h2d,
        "compute": times.compute,
        "d2h": times.d2h,
        "write": write_busy / max(write_threads, 1),
    }
    if reader.on_device:  # the GPU reader: "decode" is its reading threads; its copies and decodes are events
        stage["h2d"] += reader.gpu_stage_seconds["h2d"]
        stage["gpu_decode"] = reader.gpu_stage_seconds["gpu_decode"]
    bound = max(stage, key=stage.get)
    seconds = {**stage, "decode_busy": decode_busy, "write_busy": write_busy, "read_wait": times.read_wait,
               "emit": times.write, **times.extra}  # fmt: skip
    return {"transfer": transfer, "step_rows": times.step_rows, "stage_seconds": seconds, "bound_by": bound,
            "reader": reader.kind, "cuda_graph": times.graph, "file_reads": reader.file_reads,
            "gpu_process_bytes": times.gpu_process_bytes}  # fmt: skip
