"""The library's entries: :func:`process` (a store to an output) and :func:`features` (an in-memory series).

Both check their options, resolve the pipeline against the input's features and hand the run to
:mod:`tsconv.engine.outputs` or :func:`tsconv.engine.run.run`. Options are keyword-only and grouped: those
of the CUDA engine (``transfer``, ``gpu_mem``, ``decode``), of zarr outputs (``compression``, ``resume``)
and of dask (``workers``, ``client``, ``partition_rows``); an option given where it cannot apply is refused
with an error that names it, never ignored.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tsconv.engine.outputs import DaskOptions, refuse_time_range, to_parquet, to_zarr
from tsconv.engine.report import Report
from tsconv.engine.run import (
    CudaOptions,
    batched_on,
    cuda_errors,
    plan_run,
    reset_device,
    resolve_device,
    run,
)
from tsconv.errors import ShapeError, StoreError, TsconvError
from tsconv.io.objstore import StoreURL, location
from tsconv.io.readers.blocks import ArraySource
from tsconv.io.store import describe_repeats, open_input, repeated_names
from tsconv.io.writers.formats import output_format
from tsconv.io.writers.memory import ArraySink
from tsconv.io.writers.zarr_writer import check_compression, check_output_flags
from tsconv.pipeline.spec import Pipeline, ResolvedPipeline, as_pipeline, resolve

__all__ = ["Report", "default_output_path", "features", "process", "resolve_device"]

WARMUPS = ("nan", "zero")
PipelineLike = str | os.PathLike[str] | Pipeline | dict[str, Any] | None


@cuda_errors()
def process(
    input: str | os.PathLike[str] | StoreURL,
    output: str | os.PathLike[str] | StoreURL | None = None,
    *,
    pipeline: PipelineLike = None,
    chunk: int = 1024,
    device: str = "auto",
    warmup: str = "nan",
    overwrite: bool = False,
    resume: bool = False,
    update: bool = False,
    progress: bool = False,
    compression: str | None = None,
    transfer: str | None = None,
    gpu_mem: int | str | None = None,
    decode: str | None = None,
    workers: int | None = None,
    client: Any = None,
    partition_rows: int | None = None,
) -> Report:
    """Stream a zarr store through a pipeline into an output; returns a :class:`Report`.

    ``output``: a zarr store (default ``<input stem>.features.zarr`` beside the input) or a ``.parquet`` /
    ``.pq`` file. ``input`` and ``output`` may be URLs (``s3://bucket/ticks.zarr``, any scheme fsspec knows;
    :mod:`tsconv.io.objstore`), read and written through zarr, with credentials from the environment. An existing output is refused unless ``overwrite`` (replace) or ``resume`` (finish an
    interrupted run; refused when the input rows already computed changed since) or ``update`` is given.
    ``update`` extends a zarr output with the rows appended to its input since it was written: only those
    rows (and the output's last partial chunk) are computed, from the state the input's earlier rows give,
    so the output equals a run over the whole grown input; it refuses an input whose rows already
    computed changed, or that lost rows, and another pipeline, chunk or warm-up; with nothing new it does
    nothing (``Report.rows`` 0); a missing output is created. One run writes
    an output at a time: it holds a lock beside the output, and another run on it raises
    :class:`~tsconv.errors.OutputBusyError` at once.

    Zarr outputs: ``compression`` is the values' codec, ``auto`` (the default: lz4 where it saves at least
    10% of a sample of the first chunk holding a value, else uncompressed; dask runs keep lz4), ``lz4`` or ``none``.

    CUDA runs (the batched engine): ``transfer`` is ``pinned`` (the default), ``mapped`` or ``pageable``;
    ``gpu_mem`` (bytes, or text like ``"1.2GB"``; default 1.2 GB) bounds the GPU memory the process holds
    as nvidia-smi shows it (the CUDA context and kernels first, the run's allocations in the rest), and a
    pipeline that cannot fit is refused before anything starts; ``decode`` is ``gpu``
    (the default: Blosc-LZ4 stores are decoded on the GPU, others on the CPU) or ``cpu`` (threads).

    dask: ``workers=N`` (a local cluster) or ``client`` (a ``distributed.Client`` or a scheduler address)
    run the job as one task per time partition of ``partition_rows`` rows (see
    :mod:`tsconv.engine.distributed`); each task runs as a single process would.
    """
    t_enter = time.perf_counter()
    _check_common(chunk, warmup)
    check_output_flags(overwrite=overwrite, resume=resume, update=update)
    if not isinstance(progress, bool):
        raise TsconvError(f"progress must be True or False, got {progress!r}")
    out_loc = location(output) if output is not None else None
    parquet = output is not None and output_format(output) == "parquet"
    dask = _dask_options(workers, client, partition_rows)
    if parquet:
        _refuse({"compression": compression, "workers": workers, "client": client}, "a Parquet output")
        if resume:
            raise TsconvError(
                f"--resume is not supported for Parquet output ({out_loc.name})",
                hint="rerun with --overwrite (the file is rewritten whole), or write a .zarr output to resume.",
            )
        if update:
            raise TsconvError(
                f"--update is not supported for Parquet output ({out_loc.name}): a Parquet file's footer "
                "is rewritten to add rows, so a crash could leave neither the old file nor the new",
                hint="rerun with --overwrite (the file is rewritten whole), or write a .zarr output to update.",
            )
    if compression is not None:
        check_compression(compression)
    cuda = CudaOptions.from_args(transfer=transfer, gpu_mem=gpu_mem, decode=decode)
    # a dask run with device auto: each worker resolves it (the client needs no GPU)
    # An update or resume with device auto may be a few rows for the CPU (small_for_cuda): its GPU
    # start-up waits until the output says how many (to_zarr)
    deferred = (update or resume) and device == "auto"
    dev = None if dask is not None and device == "auto" else resolve_device(device, start=not deferred)
    if dev is not None and not batched_on(dev):
        _refuse(
            {"transfer": transfer, "gpu_mem": gpu_mem, "decode": decode},
            f"a run on the CPU (device={device!r})",
        )
    store = open_input(input)
    plan = resolve(as_pipeline(pipeline), store.features)
    _check_length(store.rows, plan, warmup, str(store.path))
    if parquet:
        assert dev is not None and out_loc is not None
        return to_parquet(store, plan, out_loc, device=dev, chunk=chunk, warmup=warmup, overwrite=overwrite,
                          progress=progress, cuda=cuda)  # fmt: skip
    if out_loc is None:
        out_path = default_output_path(store.path)
    else:
        out_path = out_loc.resolve() if isinstance(out_loc, Path) else out_loc
    return to_zarr(store, plan, out_path, device=dev, device_name=device, chunk=chunk, warmup=warmup,
                   overwrite=overwrite, resume=resume, progress=progress, cuda=cuda,
                   compression=compression or "auto", dask=dask, t_enter=t_enter, update=update)  # fmt: skip


@cuda_errors()
def features(
    x: Any,
    pipeline: PipelineLike = None,
    *,
    names: list[str] | tuple[str, ...] | None = None,
    warmup: str = "nan",
    chunk: int = 65536,
    device: str = "auto",
    time_column: str | None = "time",
    transfer: str | None = None,
    gpu_mem: int | str | None = None,
    return_names: bool = False,
) -> Any:
    """Run a pipeline on an in-memory series ``x`` [T, F] (numpy or torch); returns [T, D] float32 of the same kind.

    The computation is :func:`process`'s (on CUDA the batched engine, where ``chunk`` is not used; on the
    CPU chunks of ``chunk`` steps), so results match it on the same data. A polars DataFrame or LazyFrame
    gives a polars DataFrame: its ``time_column`` (if present) is carried over and the other columns, all
    numeric, are the named features (see :func:`tsconv.io.frames.frame_input`). ``transfer`` and ``gpu_mem``
    are the CUDA engine's, as in :func:`process`.

    ``names`` names an array's input features (default f0, f1, ...). ``return_names=True`` returns
    ``(result, output_names)``: the D output names in column order (e.g. ``"f0.ma8"``), a tuple of str, the
    same as an output store's ``features`` attribute; for a frame they are its columns without the time.
    """
    _check_common(chunk, warmup)
    cuda = CudaOptions.from_args(transfer=transfer, gpu_mem=gpu_mem, decode="cpu")
    dev = resolve_device(device)
    if not batched_on(dev):
        _refuse({"transfer": transfer, "gpu_mem": gpu_mem}, f"a run on the CPU (device={device!r})")
    if type(x).__module__.split(".")[0] == "polars":
        if names is not None:
            raise ShapeError("names= is for arrays; a frame's features are named by its columns")
        from tsconv.io.frames import frame_input, frame_output

        feature_names, source, time_series = frame_input(x, time_column=time_column, band_rows=chunk)
        plan = _plan_for(pipeline, feature_names, source.rows, warmup, "features() on polars frames")
        sink = ArraySink(source.rows, plan.n_outputs, feature_major=True)
        _run_in_memory(source, plan, sink, dev, chunk=chunk, warmup=warmup, cuda=cuda)
        frame = frame_output(plan.output_names, sink.out, time_series)
        return (frame, plan.output_names) if return_names else frame
    is_torch = isinstance(x, torch.Tensor)
    try:
        arr = x.detach().cpu().numpy() if is_torch else np.asarray(x)
    except (TypeError, ValueError) as exc:  # ragged lists, objects numpy cannot make an array of
        raise ShapeError(
            f"expected a 2-D series [T, F] (an array, a tensor or a polars frame), got {type(x).__name__}: {exc}",
            hint="pass a numpy array or torch tensor with one row per time step and one column per feature.",
        ) from None
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
    plan = _plan_for(pipeline, feature_names, arr.shape[0], warmup, "features() on arrays")
    if dev.type == "cuda" and not (arr.flags.c_contiguous and arr.flags.writeable):
        # The batched engine wraps host rows in tensors, which needs C-ordered, writeable memory (it never
        # writes to it): copy the input once if it is not.
        arr = np.array(arr, order="C")
    sink = ArraySink(arr.shape[0], plan.n_outputs)
    _run_in_memory(ArraySource(arr, band_rows=chunk), plan, sink, dev, chunk=chunk, warmup=warmup, cuda=cuda)
    y = torch.from_numpy(sink.out) if is_torch else sink.out
    return (y, plan.output_names) if return_names else y


def _run_in_memory(source: Any, plan: ResolvedPipeline, sink: ArraySink, dev: torch.device, *, chunk: int,
                   warmup: str, cuda: CudaOptions) -> None:  # fmt: skip
    # the batched engine plans its steps in 1024-row chunks; ``chunk`` is the chunked engine's
    step_chunk = 1024 if batched_on(dev) else chunk
    rp = plan_run(source, plan, device=dev, chunk=step_chunk, warmup=warmup, cuda=cuda)
    reset_device(dev)
    run(rp, source, plan, sink)


def _plan_for(pipeline: PipelineLike, names: tuple[str, ...], rows: int, warmup: str, what: str) -> ResolvedPipeline:  # fmt: skip
    plan = resolve(as_pipeline(pipeline), names)
    refuse_time_range(plan, what)
    _check_length(rows, plan, warmup, "features()")
    return plan


def default_output_path(input_path: str | os.PathLike[str] | StoreURL) -> Path | StoreURL:
    """``ticks.zarr`` -> ``ticks.features.zarr``, beside the input (a local path or a URL)."""
    p = location(input_path)
    p = p.resolve() if isinstance(p, Path) else p
    stem = p.name[: -len(".zarr")] if p.name.endswith(".zarr") else p.name
    return p.with_name(f"{stem}.features.zarr")


def _check_common(chunk: int, warmup: str) -> None:
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


def _refuse(given: dict[str, Any], where: str) -> None:
    """Options that do not apply to ``where``: an error naming the first one given."""
    for name, value in given.items():
        if value is not None:
            raise TsconvError(
                f"{name}={value!r} does not apply to {where}",
                hint=f"leave {name} out (--{name.replace('_', '-')} at the command line).",
            )


def _dask_options(workers: int | None, client: Any, partition_rows: int | None) -> DaskOptions | None:
    if workers is None and client is None:
        if partition_rows is not None:
            raise TsconvError("partition_rows needs workers or client (--workers or --scheduler)")
        return None
    if workers is not None and client is not None:
        raise TsconvError(
            "workers and client (or --workers and --scheduler) exclude each other",
            hint="--workers N starts a local cluster; --scheduler ADDRESS uses an existing one.",
        )
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise TsconvError(f"workers must be a positive integer, got {workers!r}")
    if partition_rows is not None and (
        isinstance(partition_rows, bool) or not isinstance(partition_rows, int) or partition_rows < 1
    ):
        raise TsconvError(f"partition_rows must be a positive integer, got {partition_rows!r}")
    return DaskOptions(workers, client, partition_rows)
