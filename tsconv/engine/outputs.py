"""The entries that write a store's features to an output: a zarr store (one process, or dask) or Parquet.

Each holds the output's lock from its first check to its final mark, prepares the output (create, replace,
resume), builds the sink and runs :func:`tsconv.engine.run.run` (or the dask partitions, each of which does).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tsconv.engine.report import Report, make_report
from tsconv.engine.run import CudaOptions, RunPlan, plan_run, reset_device, run
from tsconv.errors import StoreError, TsconvError
from tsconv.io.digest import digest_note, input_digest, read_digest, verify_input, write_digest
from tsconv.io.lock import output_lock
from tsconv.io.objstore import StoreURL
from tsconv.io.source import StoreSource
from tsconv.io.store import InputStore, check_time
from tsconv.io.timecolumn import ShiftedTime
from tsconv.io.writers.parquet_writer import ParquetSink, check_parquet_output, remove_stale_temp_files
from tsconv.io.writers.zarr_writer import (
    FORMAT_VERSION,
    OutputWriter,
    check_output_path,
    discard_output,
    output_chunk_rows,
    prepare_output,
    remove_leftovers,
    rows_written,
)
from tsconv.pipeline.spec import ResolvedPipeline

__all__ = ["DaskOptions", "refuse_time_range", "to_parquet", "to_zarr"]


@dataclass(frozen=True)
class DaskOptions:
    """A run on dask: ``workers`` (a local cluster of N processes) or ``client`` (a ``distributed.Client``
    or a scheduler address), ``partition_rows`` rows per task (None: about 8 tasks per worker)."""

    workers: int | None = None
    client: Any = None
    partition_rows: int | None = None


def _report(
    store: InputStore, plan: ResolvedPipeline, out: Path | StoreURL, dev: torch.device, **kw: Any
) -> Report:
    return make_report(input=str(store.path), output=str(out), device=dev, features_in=len(plan.input_names),
                       features_out=plan.n_outputs, halo=plan.halo, pipeline=plan.pipeline.name,
                       row_bytes=store.n_features * store.dtype.itemsize, **kw)  # fmt: skip


def to_zarr(
    store: InputStore,
    plan: ResolvedPipeline,
    out_path: Path | StoreURL,
    *,
    device: torch.device | None,
    device_name: str,
    chunk: int,
    warmup: str,
    overwrite: bool,
    resume: bool,
    progress: bool,
    cuda: CudaOptions,
    compression: str,
    dask: DaskOptions | None,
    t_enter: float,
) -> Report:
    """Compute ``store`` through ``plan`` into the zarr output ``out_path`` (see :func:`tsconv.process`).

    ``device`` None: a dask run whose workers each resolve ``device_name``."""
    source = StoreSource(store)
    if dask is not None and (store.remote or isinstance(out_path, StoreURL)):
        raise TsconvError(
            "dask runs (workers/client) read and write local stores only, not object stores",
            hint="run without --workers/--scheduler, or copy the store to a shared file system.",
        )
    r0, r1 = _time_rows(store, plan, distributed=dask is not None)
    # planned before the output is touched: a pipeline that cannot fit the GPU budget changes nothing
    rp = (
        None
        if dask is not None
        else plan_run(source, plan, device=device, chunk=chunk, warmup=warmup, cuda=cuda)
    )
    check_time(store)
    check_output_path(out_path, input_path=store.path, overwrite=overwrite, resume=resume)
    run_id = uuid.uuid4().hex
    # One run owns the output from here to the end (creation, an overwrite's swap, every write, the final
    # mark); a dask run's client holds it for its workers.
    with output_lock(out_path, run_id=run_id):
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
        attrs = _output_attrs(store, plan, chunk, warmup, fingerprint, run_id, digest)
        if dask is not None and action != "done":
            from tsconv.engine.distributed import run_distributed

            return run_distributed(
                store, plan, out_path, action=action, rows_done=start, chunk=chunk, device=device_name,
                warmup=warmup, attrs=attrs, progress=progress, workers=dask.workers, client=dask.client,
                partition_rows=dask.partition_rows, cuda=cuda, compression="lz4" if compression == "auto" else compression,
                run_id=run_id, input_digest=digest,
            )  # fmt: skip
        if action == "done":
            return _report(store, plan, out_path, device or torch.device("cpu"), rows=0, total_rows=r1 - r0,
                           chunk=chunk, resumed_from=start, seconds=0.0)  # fmt: skip
        assert device is not None and rp is not None
        t0 = time.perf_counter()
        reset_device(device)
        rows = r1 - r0  # output rows: the whole store, or the rows of its time_range
        time_source = store.time if r0 == 0 or store.time is None else ShiftedTime(store.time, r0)
        if action in ("create", "replace"):
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
        rp = RunPlan(rp.device, chunk, warmup, r0 + start, r1, rp.step_rows, rp.gpu_reader, rp.transfer)
        stages = run(rp, source, plan, writer, progress=progress, desc=store.path.name)
        if "stage_seconds" in stages:
            stages["stage_seconds"]["before_run"] = t_run - t0
            # opening and checking the input, planning, the input's digest, clearing an old output:
            # before ``seconds`` starts
            stages["stage_seconds"]["open"] = t0 - t_enter
        stages["compression"] = writer.compression
        seconds = time.perf_counter() - t0
    return _report(store, plan, out_path, device, rows=rows - start, total_rows=rows, chunk=chunk,
                   resumed_from=start if action not in ("create", "replace") else 0, seconds=seconds,
                   stages=stages)  # fmt: skip


def to_parquet(
    store: InputStore,
    plan: ResolvedPipeline,
    out: Path | StoreURL,
    *,
    device: torch.device,
    chunk: int,
    warmup: str,
    overwrite: bool,
    progress: bool,
    cuda: CudaOptions,
) -> Report:
    """Compute ``store`` through ``plan`` into the Parquet file ``out`` (see :func:`tsconv.process`)."""
    from tsconv import __version__

    source = StoreSource(store)
    # Checked before the lock file is made beside ``out`` (never inside the input), and again holding it.
    resolved = out.resolve() if isinstance(out, Path) else out
    check_parquet_output(resolved, store.path, overwrite=overwrite, resume=False)
    refuse_time_range(plan, "Parquet output")
    rp = plan_run(source, plan, device=device, chunk=chunk, warmup=warmup, cuda=cuda)
    check_time(store)
    if store.time is not None and "time" in plan.output_names:
        raise StoreError(
            "the pipeline has an output named 'time', which the Parquet file's time column uses",
            hint="rename that output, or write a .zarr output.",
        )
    run_id = uuid.uuid4().hex
    # The name the finished file is renamed onto (a symlink there is replaced, not followed) is what the
    # lock and the temporary files belong to.
    target = out.parent.resolve() / out.name if isinstance(out, Path) else out
    with output_lock(target, run_id=run_id):
        remove_stale_temp_files(target)
        check_parquet_output(resolved, store.path, overwrite=overwrite, resume=False)
        meta = {
            "source": str(store.path),
            "features": list(plan.output_names),
            "pipeline": plan.as_run(),
            "tsconv": {"version": __version__, "rows": store.rows, "chunk": chunk, "warmup": warmup,
                       "halo": plan.halo, "warmups": list(plan.warmups), "complete": True, "run_id": run_id},
        }  # fmt: skip
        t0 = time.perf_counter()
        reset_device(device)
        sink = ParquetSink(out, names=plan.output_names, time_source=store.time, metadata=meta,
                           where=str(store.path))  # fmt: skip
        stages = run(rp, source, plan, sink, progress=progress, desc=store.path.name)
        seconds = time.perf_counter() - t0
    return _report(store, plan, out, device, rows=store.rows, total_rows=store.rows, chunk=chunk,
                   resumed_from=0, seconds=seconds, stages=stages)  # fmt: skip


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


def refuse_time_range(plan: ResolvedPipeline, what: str) -> None:
    """``[preprocess] time_range`` selects output rows of a store with time; refuse it elsewhere."""
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
            "warmups": list(plan.warmups),  # each output's own warm-up rows (tsconv inspect counts them)
            "fingerprint": fingerprint,
            "run_id": run_id,
            "input_digest": digest_note(digest) if digest is not None else None,
        },
    }
