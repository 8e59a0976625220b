"""The library's store entry, :func:`process` (a store to an output; :mod:`tsconv.engine.inmemory` has
:func:`~tsconv.engine.inmemory.features` for in-memory series).

It checks its options, resolves the pipeline against the input's features and hands the run to
:mod:`tsconv.engine.outputs`. Options are keyword-only and grouped: those
of the CUDA engine (``transfer``, ``gpu_mem``, ``decode``), of zarr outputs (``compression``, ``resume``)
and of dask (``workers``, ``client``, ``partition_rows``); an option given where it cannot apply is refused
with an error that names it, never ignored.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from tsconv import config
from tsconv.engine.cluster import check_workers, gpus_here
from tsconv.engine.options import check_chunk, check_length, check_warmup, refuse
from tsconv.engine.outputs import DaskOptions, to_parquet, to_zarr
from tsconv.engine.report import Report
from tsconv.engine.run import (
    CudaOptions,
    batched_on,
    cuda_errors,
    resolve_device,
)
from tsconv.errors import StoreError, TsconvError
from tsconv.io.objstore import StoreURL, location, refuse_inside
from tsconv.io.store import open_input, warn_absent_chunks, warn_unitless_early_time
from tsconv.io.writers.formats import output_format
from tsconv.io.writers.zarr_writer import check_compression, check_output_flags
from tsconv.pipeline.spec import PipelineLike, as_pipeline, resolve

__all__ = ["Report", "default_output_path", "process", "resolve_device"]


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
    _check_location(input, "input")
    if output is not None:
        _check_location(output, "output")
    chunk = check_chunk(chunk, default=1024)
    check_warmup(warmup)
    check_output_flags(overwrite=overwrite, resume=resume, update=update)
    if not isinstance(progress, bool):
        raise TsconvError(f"progress must be True or False, got {progress!r}")
    # the native libraries and tuned kernels are written into the cache directory during the run
    refuse_inside(
        config.cache_dir(),
        [("input", input), *([("output", output)] if output is not None else [])],
        flag="the cache directory (TSCONV_CACHE_DIR)",
    )
    out_loc = location(output) if output is not None else None
    if isinstance(out_loc, StoreURL) and "/" not in out_loc.key:
        # the lock and the temporary objects go beside the output: it needs a folder (a bucket) to be in
        raise StoreError(
            f"output {out_loc.url!r} names no bucket or folder to hold it",
            hint=f"write it as {out_loc.protocol}://bucket/{out_loc.key}.",
        )
    parquet = output is not None and output_format(output) == "parquet"
    dask = _dask_options(workers, client, partition_rows)
    if parquet:
        refuse({"compression": compression, "workers": workers, "client": client}, "a Parquet output")
        if resume:
            raise TsconvError(
                f"--resume is not supported for Parquet output ({out_loc.name})",
                hint="run it again: a Parquet file is written whole, so a stopped run left the file there before "
                "(replace it with --overwrite) or none; or write a .zarr output to resume.",
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
        refuse(
            {"transfer": transfer, "gpu_mem": gpu_mem, "decode": decode},
            f"a run on the CPU (device={device!r})",
        )
    elif (
        dev is None
        and workers is not None
        and any(v is not None for v in (transfer, gpu_mem, decode))  # the GPU probe only where it decides
        and not gpus_here(device)
        and not batched_on(resolve_device("cpu"))
    ):
        # a local cluster's workers run on this host, so they meet no GPU either. An external client's workers
        # may be on other hosts with GPUs: there each worker's resolve decides, and this process cannot tell
        refuse(
            {"transfer": transfer, "gpu_mem": gpu_mem, "decode": decode},
            f"a run on the CPU (workers={workers}, device={device!r}, and no CUDA GPU on this host)",
        )
    store = open_input(input)
    warn_absent_chunks(store)
    if not (update or resume):  # the run that made the output warned; a no-op update reads no input rows
        warn_unitless_early_time(store)
    plan = resolve(as_pipeline(pipeline), store.features)
    check_length(store.rows, plan, warmup, str(store.path))
    if parquet:
        assert dev is not None and out_loc is not None
        return to_parquet(store, plan, out_loc, device=dev, chunk=chunk, warmup=warmup, overwrite=overwrite,
                          progress=progress, cuda=cuda)  # fmt: skip
    if out_loc is None:
        out_path = default_output_path(store.path, root=store.root)
    else:
        out_path = out_loc.resolve() if isinstance(out_loc, Path) else out_loc
    return to_zarr(store, plan, out_path, device=dev, device_name=device, chunk=chunk, warmup=warmup,
                   overwrite=overwrite, resume=resume, progress=progress, cuda=cuda,
                   compression=compression, dask=dask, t_enter=t_enter, update=update)  # fmt: skip


def default_output_path(
    input_path: str | os.PathLike[str] | StoreURL, *, root: Path | StoreURL | None = None
) -> Path | StoreURL:
    """``ticks.zarr`` -> ``ticks.features.zarr``, beside the input (a local path or a URL). A local input inside
    a larger zarr hierarchy ``root`` (``ticks.zarr/eq/daily``) gets its output beside that hierarchy
    (``ticks.eq.daily.features.zarr``): beside the input it would lie among the hierarchy's files, which tsconv
    never writes into."""
    p = location(input_path)
    p = p.resolve() if isinstance(p, Path) else p
    if isinstance(p, Path) and isinstance(root, Path) and root != p and p.is_relative_to(root):
        stem = ".".join((_stem(root.name), *p.relative_to(root).parts))
        return root.with_name(f"{stem}.features.zarr")
    return p.with_name(f"{_stem(p.name)}.features.zarr")


def _stem(name: str) -> str:
    return name[: -len(".zarr")] if name.endswith(".zarr") else name


def _check_location(value: Any, role: str) -> None:
    """A store location is text: a str, a str os.PathLike or a StoreURL (bytes reached pathlib's TypeError)."""
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(text, str | StoreURL):
        if hasattr(value, "shape"):  # an array, a frame, a tensor: data in memory, not a store's location
            raise TsconvError(
                f"{role} must be a store's location (a str path, an os.PathLike or a URL), got a "
                f"{type(value).__module__.split('.')[0]} {type(value).__name__} of shape {tuple(value.shape)}",
                hint="for data in memory call tsconv.features(data, pipeline), which returns the features; "
                "process() streams a zarr store into an output store.",
            )
        raise TsconvError(
            f"{role} must be a str path, an os.PathLike (pathlib.Path) or a URL, got {type(value).__name__} "
            f"{value!r}"[:300],
            hint=f"pass the {role} as text, e.g. {role}='ticks.zarr' or Path('ticks.zarr')"
            + (f" ({role}.decode() for bytes)." if isinstance(text, bytes) else "."),
        )
    # a path of '' is the current directory: an unset variable would name wherever the job runs
    if text == "":
        raise TsconvError(
            f"{role} '' names no store (as a path it means the current directory)",
            hint=f"pass the {role}'s path; in a script, check that the variable it comes from is set.",
        )


def _dask_options(workers: int | None, client: Any, partition_rows: int | None) -> DaskOptions | None:
    if workers is None and client is None:
        if partition_rows is not None:
            raise TsconvError(
                "partition_rows needs workers or client (--workers or --scheduler)",
                hint="add --workers N for a local dask cluster, or drop --partition-rows.",
            )
        return None
    if workers is not None and client is not None:
        raise TsconvError(
            "workers and client (or --workers and --scheduler) exclude each other",
            hint="--workers N starts a local cluster; --scheduler ADDRESS uses an existing one.",
        )
    if workers is not None:
        check_workers(workers)
    if partition_rows is not None and (
        isinstance(partition_rows, bool) or not isinstance(partition_rows, int) or partition_rows < 1
    ):
        raise TsconvError(f"partition_rows must be a positive integer, got {partition_rows!r}")
    return DaskOptions(workers, client, partition_rows)
