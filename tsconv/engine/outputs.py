"""The entries that write a store's features to an output: a zarr store (one process, or dask) or Parquet.

Each holds the output's lock from its first check to its final mark, prepares the output (create, replace,
resume, or extend it for an update), builds the sink and runs :func:`tsconv.engine.run.run` (or the dask partitions, each of which does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tsconv import config
from tsconv.engine.fill import FillCarry, fill_record, parse_fill_record
from tsconv.engine.level import rows_before
from tsconv.engine.options import refuse_time_range
from tsconv.engine.report import Report, make_report
from tsconv.engine.run import CudaOptions, batched_on, begin_cuda, plan_run, reset_device, run, small_for_cuda
from tsconv.errors import OutputExistsError, StoreError, TsconvError, TsconvWarning
from tsconv.io.contracts import BandReader
from tsconv.io.digest import (
    digest_note,
    first_change,
    input_arrays,
    input_digest,
    read_digest,
    verify_input,
    write_digest,
)
from tsconv.io.lock import check_free, output_lock
from tsconv.io.names import case_repeat
from tsconv.io.objstore import StoreURL
from tsconv.io.precision import Float32Check, exact_in_float32
from tsconv.io.readers.threads import ParallelBandReader
from tsconv.io.source import StoreSource
from tsconv.io.store import MAX_FEATURES, InputStore, check_time
from tsconv.io.tail import InputTail, read_tail, remove_tail, tail_digest, tail_rows_to_keep, write_tail
from tsconv.io.timecolumn import ShiftedTime
from tsconv.io.writers.parquet_writer import ParquetSink, check_parquet_output, remove_stale_temp_files
from tsconv.io.writers.zarr_writer import (
    FORMAT_VERSION,
    OutputWriter,
    auto_pending,
    check_kept_compression,
    check_output_path,
    discard_output,
    grow_output,
    output_chunk_rows,
    output_meta,
    prepare_output,
    refuse_foreign,
    remove_leftovers,
    rows_written,
)
from tsconv.pipeline.spec import ResolvedPipeline

__all__ = ["DaskOptions", "to_parquet", "to_zarr"]


@dataclass(frozen=True)
class DaskOptions:
    """A run on dask: ``workers`` (a local cluster of N processes) or ``client`` (a ``distributed.Client``
    or a scheduler address), ``partition_rows`` rows per task (None: about 8 tasks per worker)."""

    workers: int | None = None
    client: Any = None
    partition_rows: int | None = None


def _report(
    store: InputStore,
    plan: ResolvedPipeline,
    out: Path | StoreURL,
    dev: torch.device,
    *,
    updated_from: int | None = None,
    **kw: Any,
) -> Report:
    report = make_report(input=str(store.path), output=str(out), device=dev, features_in=len(plan.input_names),
                       features_out=plan.n_outputs, halo=plan.halo, pipeline=plan.pipeline.name,
                       row_bytes=store.n_features * store.dtype.itemsize, **kw)  # fmt: skip
    return report if updated_from is None else dataclasses.replace(report, updated_from=updated_from)


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
    compression: str | None,
    dask: DaskOptions | None,
    t_enter: float,
    update: bool = False,
) -> Report:
    """Compute ``store`` through ``plan`` into the zarr output ``out_path`` (see :func:`tsconv.process`).

    ``device`` None: a dask run whose workers each resolve ``device_name``. ``compression`` None: not asked
    (auto for a new output; a continued one keeps its codec, which another asked for is refused)."""
    asked, compression = compression, compression or "auto"
    source = StoreSource(store)
    if dask is not None and (store.remote or isinstance(out_path, StoreURL)):
        raise TsconvError(
            "dask runs (workers/client) read and write local stores only, not object stores",
            hint="run without --workers/--scheduler, or copy the store to a shared file system.",
        )
    r0, r1 = _time_rows(store, plan, distributed=dask is not None)
    # a store float32 does not hold: how its output's rows were read (float64 on the CPU, float32 by the GPU's
    # engine), which the rest follow; the CPU reads either, the GPU float32 only
    recorded = _recorded_read(out_path) if (update or resume) and not exact_in_float32(store.dtype) else None
    if recorded == "float64" and device_name == "auto" and device is not None and device.type == "cuda":
        device = torch.device("cpu")  # its rows were read as float64: the rest are too
    elif (
        (update or resume)
        and dask is None
        and device_name == "auto"
        and device is not None
        and device.type == "cuda"
        and small_for_cuda(plan, _rows_left(out_path, rows=r1 - r0))
    ):
        # an update's or a resume's few rows: the CPU computes them before CUDA would have started, and
        # nothing of the GPU's (Triton, its reader, its plan) need be loaded
        device = torch.device("cpu")
    if (
        device is not None
        and device.type == "cuda"
        and device_name == "auto"
        and not torch.cuda.is_available()
    ):
        device = torch.device("cpu")  # resolve_device left auto to the driver's word, and CUDA cannot start
    read = _input_read(store, device, device_name)
    if recorded == "float64" and read == "float32" and _rows_left(out_path, rows=r1 - r0):
        raise StoreError(
            f"cannot {'update' if update else 'resume'} {str(out_path)!r}: its rows were read as float64 (on the "
            f"CPU), and the GPU's engine reads the input ({store.dtype}) as float32: the two would mix in one output",
            hint="run it with --device cpu, or use --overwrite to compute it again on the GPU.",
        )
    read = recorded or read  # the CPU reads as the output's earlier rows were read
    if device is not None and device.type == "cuda":
        begin_cuda(device, asked=device_name)  # where resolve_device left it to the run (else a no-op)
    if plan.n_outputs > MAX_FEATURES:  # an output tsconv's own readers (inspect, a run on it) would refuse
        raise StoreError(
            f"the pipeline gives {plan.n_outputs:,} outputs ({len(plan.input_names):,} features in); a store "
            f"tsconv writes or reads holds at most {MAX_FEATURES:,} features",
            hint="select fewer features ([preprocess] select) or split them over several runs.",
        )
    # planned before the output is touched: a pipeline that cannot fit the GPU budget changes nothing
    rp = (
        None
        if dask is not None
        else plan_run(
            source,
            plan,
            device=device,
            chunk=chunk,
            warmup=warmup,
            cuda=cuda,
            encode_rows=_encode_rows(device, plan, chunk, compression, out_path, rows=r1 - r0),
        )  # fmt: skip
    )
    if not update:  # an update checks the rows it adds (_prepare_update): the others were checked before
        check_time(store)
    try:
        check_output_path(out_path, input_path=store.root, overwrite=overwrite, resume=resume or update)
    except OutputExistsError:
        # another run is writing it: the hint's --overwrite or --resume would not be the way, waiting is
        check_free(out_path, resumable=True)
        raise
    run_id = uuid.uuid4().hex
    # One run owns the output from here to the end (creation, an overwrite's swap, every write, the final
    # mark); a dask run's client holds it for its workers.
    with output_lock(out_path, run_id=run_id, resumable=True) as lock, contextlib.ExitStack() as pending:
        # an object store's lock can be lost to another run while this one stalls, a local one when another
        # process removes its file: every write checks it first
        check_lock = lock.check
        remove_leftovers(out_path)
        fingerprint = _fingerprint(store, plan, chunk, warmup)
        action, start = prepare_output(
            out_path, input_path=store.root, overwrite=overwrite, resume=resume, update=update,
            fingerprint=fingerprint,
            legacy=lambda rows: _fingerprint(store, plan, chunk, warmup, rows=rows, with_sums=False),
            run=lambda: {"source": str(store.path), "pipeline": plan.as_run(),
                         "tsconv": {"chunk": chunk, "warmup": warmup, "input": _input_record(store, plan)}},
        )  # fmt: skip
        if action not in ("create", "replace"):
            kept = check_kept_compression(out_path, asked, verb="update" if update else "resume")
            # an update that builds a small output again writes it with the codec it had, or chooses one as
            # its first run would have where that run's "auto" chose none yet
            undecided = auto_pending(out_path)
            compression = asked or ("auto" if undecided else kept if kept in ("lz4", "none") else "auto")
        rows = r1 - r0  # output rows: the whole store, or the rows of its time_range
        digest = updated_from = None
        fill_carry = FillCarry()
        tail: InputTail | None = None  # input rows kept with the output by the run before (an update's)
        compute = start
        if action == "create" and update:
            check_time(store)
        if action in ("create", "replace"):
            digest = input_digest(store)
        # The files at the input's path now (the digest's; a resume's or update's is checked against the one
        # recorded) must be the store's whose features, rows and chunks the run was planned from: a store renamed
        # onto the path since it was opened gave an output of its rows under the old one's names.
        store.check_unreplaced()
        if action == "replace":
            # the old store's files go in a thread beside the run, which the lock outlasts
            pending.callback(discard_output(out_path, background=True))
        elif action != "create":  # output rows [0, n) come from input rows [0, r0 + n)
            before = r0 + rows_written(out_path)
            fill_carry.known = _fill_known(out_path, plan, before=before)
            if update and dask is None and not store.remote:
                tail = read_tail(out_path, stop=before, n_features=source.n_features, dtype=source.dtype,
                                 n_inputs=len(plan.input_names), fingerprint=fingerprint,
                                 digest=(read_digest(out_path) or {}).get("tail"))  # fmt: skip
            step = (
                functools.partial(
                    _prepare_update, tail=tail, full_rows=output_chunk_rows(chunk, plan.n_outputs)
                )
                if update
                else _prepare_resume
            )
            # the checks read the input's rows through the run's own reader: the bands they decode
            # are the ones the run starts in (source.open hands the reader over)
            pending.callback(source.close)
            action, start, compute, rows, digest, updated_from = step(
                out_path,
                store,
                r0=r0,
                r1=r1,
                action=action,
                start=start,
                chunk=chunk,
                fingerprint=fingerprint,
                reader=source.early_reader() if dask is None else None,
                halo=rows_before(plan.halo),  # the rows before its start a CPU run reads
            )
        # the codec asked for (dask runs store lz4 for auto): a continued output whose auto chose none yet
        # chooses as one run would (auto_pending)
        codec = "lz4" if dask is not None and compression == "auto" else compression
        attrs = _output_attrs(
            store, plan, chunk, warmup, fingerprint, run_id, digest, read=read, compression=codec
        )
        if action in ("done", "current"):
            return _report(store, plan, out_path, device or torch.device("cpu"), rows=0, total_rows=rows,
                           chunk=chunk, resumed_from=start, seconds=0.0, updated_from=updated_from)  # fmt: skip
        # the digest of the input the rows come from (a new output's, or the one a resume or update checked and
        # recorded), which the input must still match when the output is marked complete
        unchanged = _input_unchanged(
            store, digest if digest is not None else read_digest(out_path), stop=r0 + rows
        )
        if dask is not None:
            from tsconv.engine.distributed import run_distributed

            def end(reader: BandReader | None) -> None:  # every partition written: before marking complete
                unchanged()
                _record_end(out_path, fill_carry, reader, stop=r0 + rows, fingerprint=fingerprint)

            if start < rows and read == "float32":  # GPU workers read float32; CPU workers read float64
                # the workers' warnings stay in their logs: the client checks the first rows
                a = r0 + start
                Float32Check(plan.input_names).see(
                    np.asarray(store.values[a : min(r0 + rows, a + 1024)]), plan.columns
                )

            report = run_distributed(
                store, plan, out_path, action=action, rows_done=start, chunk=chunk, device=device_name,
                warmup=warmup, attrs=attrs, progress=progress, workers=dask.workers, client=dask.client,
                partition_rows=dask.partition_rows, cuda=cuda, compression="lz4" if compression == "auto" else compression,
                run_id=run_id, input_digest=digest, rows=rows, fill_carry=fill_carry,
                before_finish=end,
                read_float64=read != "float32",
            )  # fmt: skip
            return dataclasses.replace(report, updated_from=updated_from)
        assert device is not None and rp is not None
        extends = action not in ("create", "replace")
        if (
            extends
            and device_name == "auto"
            and device.type == "cuda"
            and small_for_cuda(plan, rows - compute)
        ):
            # few rows after all, as the checks settled them (_rows_left above read the metadata alone)
            device = torch.device("cpu")
            rp = plan_run(source, plan, device=device, chunk=chunk, warmup=warmup, cuda=cuda)
        chunked_cpu = device.type == "cpu" and not batched_on(device)
        if (
            tail is not None
            and chunked_cpu
            and updated_from is not None
            and tail.start <= max(0, r0 + compute - rows_before(plan.halo))
        ):
            # the rows before the output's end that this run reads, checked unchanged by _prepare_update
            source.use_tail(tail)
            fill_carry.known = (tail.start, tail.state)
        if chunked_cpu and not isinstance(out_path, StoreURL):
            # the input rows the next update reads, kept by _keep_tail
            keep = tail_rows_to_keep(output_rows=rows, chunk=chunk, halo=rows_before(plan.halo))
            fill_carry.mark = max(0, r0 + rows - keep)
        t0 = time.perf_counter()
        reset_device(device)
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
            if rp.encode_rows is not None:  # chunks encoded on the GPU are whole: none is partly kept
                compute = start
            writer.keep(compute - start)
        writer.before_complete = unchanged
        writer.check_lock = check_lock

        def record_end(reader: BandReader) -> None:
            if check_lock is not None:
                check_lock()
            _record_end(out_path, fill_carry, reader, stop=r0 + rows, fingerprint=fingerprint)

        t_run = time.perf_counter()
        rp = dataclasses.replace(rp, chunk=chunk, warmup=warmup, start=r0 + compute, stop=r0 + rows,
                                 read_float64=read != "float32")  # fmt: skip
        stages = run(rp, source, plan, writer, progress=progress, desc=store.path.name, fill_carry=fill_carry,
                     before_finish=record_end)  # fmt: skip
        if "stage_seconds" in stages:
            stages["stage_seconds"]["before_run"] = t_run - t0
            # opening and checking the input, planning, the input's digest, renaming an old output aside:
            # before ``seconds`` starts
            stages["stage_seconds"]["open"] = t0 - t_enter
        on_gpu = stages.pop("gpu_encoded", False)
        stages["compression"] = writer.compression + ("; encoded on the GPU (nvCOMP)" if on_gpu else "")
        seconds = time.perf_counter() - t0
    return _report(store, plan, out_path, device, rows=rows - compute, total_rows=rows, chunk=chunk,
                   resumed_from=compute if action not in ("create", "replace") else 0, seconds=seconds,
                   stages=stages, updated_from=updated_from)  # fmt: skip


def _encode_rows(
    device: torch.device | None,
    plan: ResolvedPipeline,
    chunk: int,
    compression: str,
    out: Path | StoreURL,
    *,
    rows: int,
) -> int | None:
    """The output's chunk rows when its LZ4 chunks may be encoded on the GPU (a local store, a codec not
    forced to none, an output of ``rows`` rows of MIN_OUTPUT_BYTES or more, nvCOMP on a CUDA device), else
    None."""
    if device is None or compression == "none" or isinstance(out, StoreURL):
        return None
    if device.type != "cuda" and not config.interpreted():  # the CPU engine; and a CPU host may lack Triton
        return None
    from tsconv.kernels import lz4_encode

    if (
        rows * plan.n_outputs * 4 < lz4_encode.MIN_OUTPUT_BYTES
        or lz4_encode.encode_reason(device) is not None
    ):
        return None
    return output_chunk_rows(chunk, plan.n_outputs)


# (action, the output's rows_done to write from, the row computing starts at (the rows between are kept as
# stored), the output's rows, a digest to record in a rebuilt output, the output's rows before an update)
_Prepared = tuple[str, int, int, int, "dict[str, Any] | None", "int | None"]


def _rows_left(out_path: Path | StoreURL, *, rows: int) -> int:
    """What an update or a resume of ``out_path`` to ``rows`` output rows would compute, read from the
    output's metadata before anything is checked (``rows`` where there is no readable output: a full run).
    The checks come later, holding the lock; this only picks the device."""
    try:
        written = rows_written(out_path)
    except Exception:  # noqa: BLE001 - no output, or not one of tsconv's: the checks will say which
        return rows
    return max(0, rows - written)


def _fill_known(out_path: Path | StoreURL, plan: ResolvedPipeline, *, before: int) -> tuple[int, Any] | None:
    """The fill state an earlier run recorded with the output's input digest, where it is for input rows
    the output still holds (``before``: those the digest check covers), else None. It lets a resume or an
    update start without walking back to row 0 for a feature with no value yet (a symbol not listed)."""
    doc = read_digest(out_path)
    known = parse_fill_record(doc.get("fill") if doc else None, len(plan.input_names))
    return known if known is not None and known[0] <= before else None


def _same_input(current: dict[str, Any], recorded: dict[str, Any] | None) -> bool:
    """Whether the recorded digest describes the input as it is now (its fill record and kept rows aside)."""
    return recorded is not None and current == {
        k: v for k, v in recorded.items() if k not in ("fill", "tail")
    }


def _input_unchanged(
    store: InputStore,
    digest: dict[str, Any] | None,
    *,
    stop: int,
    left: str = "the output is left incomplete",
) -> Callable[[], None]:
    """A check for the moment before the output is marked complete: the input's rows [0, ``stop``) are still
    those of ``digest``, taken when the run started (rows appended meanwhile are not a change). A store
    replaced during the run (``ingest --overwrite``) had left an output marked complete whose values came from
    the old store and whose time from the new. No check for an input without a digest (remote). ``left``
    says what the output is then."""

    def check() -> None:
        if digest is None or "arrays" not in digest:
            return
        now = input_digest(store, known=digest)
        change = first_change(digest, now, before=stop, arrays=input_arrays(store))
        if change is not None:
            raise StoreError(
                f"the input {str(store.path)!r} changed while the output was computed, first at {change}: "
                f"{left}",
                hint="once the input is settled, compute the output again with --overwrite.",
            )

    return check


def _record_end(
    out_path: Path | StoreURL, carry: FillCarry, reader: BandReader | None, *, stop: int, fingerprint: str
) -> None:
    """What a later run of the output starts from, kept before the output is marked complete: the fill
    state at the run's last row (:func:`_record_fill`) and the input rows its next update reads
    (:func:`_keep_tail`)."""
    kept = _keep_tail(out_path, carry, reader, stop=stop, fingerprint=fingerprint)
    _record_fill(out_path, carry, tail=kept)


def _keep_tail(
    out_path: Path | StoreURL, carry: FillCarry, reader: BandReader | None, *, stop: int, fingerprint: str
) -> InputTail | None:
    """Keep input rows [``carry.mark``, ``stop``) with the output, and the fill state at the mark, where the
    run's engine found that state (the CPU's chunked engine) and ``reader`` still holds the rows (they are
    in its last bands); else drop any kept by an earlier run, which no longer end at the output's end.
    Returns what was kept."""
    if reader is None or reader.on_device or carry.mark is None or carry.at_mark is None or stop < carry.mark:
        remove_tail(out_path)
        return None
    rows = (
        np.array(reader.read(carry.mark, stop))
        if stop > carry.mark
        else np.empty((0, reader.n_features), reader.dtype)
    )
    tail = InputTail(carry.mark, rows, carry.at_mark, fingerprint)
    return tail if write_tail(out_path, tail) else None


def _record_fill(out_path: Path | StoreURL, carry: FillCarry, *, tail: InputTail | None = None) -> None:
    """Keep the fill state at the run's last row, and the hash of the input rows kept with the output
    (``tail``), beside the input digest that covers those rows (a run with no digest, or one skipped,
    records none: an update then reads no kept rows). Written after the rows are kept and before the output
    is marked complete, so a complete output has them whichever kills and resumes led there."""
    doc = read_digest(out_path)
    if carry.end is None or doc is None or "arrays" not in doc:
        return
    doc = {k: v for k, v in doc.items() if k not in ("fill", "tail")}  # in one order, whatever came before
    doc["fill"] = fill_record(*carry.end)
    if tail is not None:
        doc["tail"] = tail_digest(tail)
    write_digest(out_path, doc)


def _recorded(out_path: Path | StoreURL, store: InputStore, *, r0: int, r1: int, verb: str) -> dict[str, Any]:
    """The output's ``tsconv`` attributes, once its input is known to still hold the rows it was computed
    from: not fewer rows, the same first row of a time_range."""
    meta = output_meta(out_path)
    recorded = int(meta["rows"])
    first = int((meta.get("input_rows") or [0])[0])
    if r0 != first:
        raise StoreError(
            f"cannot {verb} {str(out_path)!r}: its time_range now starts at input row {r0:,}, the output's at "
            f"row {first:,}: the input's time column changed",
            hint="use --overwrite to compute the output again from the current input.",
        )
    if r1 - r0 < recorded:
        raise StoreError(
            f"cannot {verb} {str(out_path)!r}: it holds {recorded:,} rows but its input {str(store.path)!r} "
            f"now has {r1 - r0:,}{' in the time range' if (r0, r1) != (0, store.rows) else ''}: rows were removed",
            hint="use --overwrite to compute the output again from the current input.",
        )
    return meta


def _prepare_resume(
    out_path: Path | StoreURL, store: InputStore, *, r0: int, r1: int, action: str, start: int, chunk: int,
    fingerprint: str, reader: ParallelBandReader | None = None, halo: int = 0,
) -> _Prepared:  # fmt: skip
    """``--resume``: check the input still holds the rows computed so far; the output keeps its rows
    (rows appended to the input since are for ``--update``). ``reader``: the run's reader, through which
    the checks read input rows, decoding from the run's first band (``halo``: rows it reads before its
    start)."""
    meta = _recorded(out_path, store, r0=r0, r1=r1, verb="resume into")
    read = None
    if reader is not None:
        reader.read_ahead(max(0, r0 + start - halo))
        read = reader.read
    current = verify_input(
        out_path, store, before=r0 + rows_written(out_path), read_values=read, note=meta.get("input_digest")
    )
    if action == "resume" and not _same_input(current, read_digest(out_path)):
        # the rows still to compute come from the input as it is now: record that
        write_digest(out_path, current)
    recorded = int(meta["rows"])
    if r1 - r0 > recorded:
        warnings.warn(
            f"{str(out_path)!r} {'is complete with' if action == 'done' else 'is finished to'} the {recorded:,} "
            f"rows it was started with; its input has {r1 - r0 - recorded:,} more since: --update adds them",
            TsconvWarning,
            stacklevel=2,
        )
    return action, start, start, recorded, None, None


def _prepare_update(
    out_path: Path | StoreURL, store: InputStore, *, r0: int, r1: int, action: str, start: int, chunk: int,
    fingerprint: str, reader: ParallelBandReader | None = None, halo: int = 0, tail: InputTail | None = None,
    full_rows: int | None = None,
) -> _Prepared:  # fmt: skip
    """``--update`` of an existing output: refuse an input whose rows already computed changed, else
    extend the output to the input's rows (:func:`grow_output`) and say where to compute from.

    The rows are computed again from the engine chunk holding the output's end: the engine's chunks, and each
    chunk's centring level (``tsconv.engine.level``), then fall where a run over the whole grown input puts
    them, so the bytes are the same. The output's chunk there is written again, its rows before that engine
    chunk kept as stored (``rows_done`` goes back to the chunk's start, so a kill leaves an output that
    ``--update`` or ``--resume`` finishes). An interrupted update's output has no known end beyond
    ``rows_done``: it continues from there. Returns :data:`_Prepared`. ``reader``, ``halo``: as for
    :func:`_prepare_resume`; ``tail``: input rows kept with the output, which the reader need not decode.
    ``full_rows``: the rows of a full output chunk (:func:`output_chunk_rows`); an output that is one chunk
    of fewer was smaller than one chunk, chunked by its rows, and is built again whole."""
    meta = _recorded(out_path, store, r0=r0, r1=r1, verb="update")
    recorded, rows = int(meta["rows"]), r1 - r0
    out_rows = int(_read_json(out_path, "values/zarr.json")["chunk_grid"]["configuration"]["chunk_shape"][0])
    # chunked by its rows: not on engine chunks, or one chunk of whole engine chunks holding all its rows,
    # short of a full output chunk (1,024 rows at --chunk 128 kept 1,024-row chunks through every update,
    # where a full run writes larger ones; a dask run's partitions chunk an output smaller on purpose)
    small = bool(out_rows % chunk) or (full_rows is not None and recorded <= out_rows < full_rows)
    begin = min(start if action == "resume" else recorded, recorded // out_rows * out_rows)
    compute = begin if action == "resume" else recorded // chunk * chunk
    read = None
    if reader is not None:
        if rows > recorded and not small:
            # the hashes of the old and the new last band, the fill state and the run read from here on;
            # rows kept with the output (``tail``) are not decoded
            first = max(0, r0 + compute - halo)
            reader.read_ahead(tail.stop if tail is not None and tail.start <= first else first)
        read = reader.read
    current = verify_input(
        out_path,
        store,
        before=r0 + rows_written(out_path),
        verb="update",
        read_values=read,
        note=meta.get("input_digest"),
    )
    # an interrupted run's output (a first run's or an update's) says "updated from" the rows it holds done,
    # not the size it was started with or grown to
    done = start if action == "resume" else recorded
    if rows == recorded:  # nothing new: finish an interrupted run, or nothing at all
        if action == "resume" and not _same_input(current, read_digest(out_path)):
            write_digest(out_path, current)
        return ("resume" if action == "resume" else "current"), start, start, rows, None, done
    if small:
        # a store smaller than one output chunk, chunked by its rows: built again whole (it is small),
        # chunked as a run over the grown input would chunk it
        refuse_foreign(out_path, what="rebuild for --update (it is smaller than one output chunk)")
        check_time(store)
        discard_output(out_path)
        return "replace", 0, 0, rows, current, done
    check_time(store, start=max(0, r0 + begin - 1), stop=r1)
    parts = [[a, min(b, begin)] for a, b in meta.get("partitions_done") or [] if a < begin]
    write_digest(out_path, current)  # what the rows to compute come from; the kept rows are unchanged
    grow_output(
        out_path, rows=rows, start=begin,
        changes={"fingerprint": fingerprint, "input_rows": [r0, r1] if (r0, r1) != (0, store.rows) else None,
                 "partitions_done": parts or None},
    )  # fmt: skip
    return "resume", begin, compute, rows, None, done


def _read_json(root: Path | StoreURL, key: str) -> dict[str, Any]:
    raw = root.read_bytes(key) if isinstance(root, StoreURL) else (Path(root) / key).read_bytes()
    if raw is None:
        raise StoreError(f"{str(root)!r} has no {key}", hint="use --overwrite to write the output again.")
    return json.loads(raw)


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
    # The name the finished file is renamed onto (a symlink there is replaced, not followed) is what the
    # lock and the temporary files belong to.
    target = out.parent.resolve() / out.name if isinstance(out, Path) else out
    named = target if isinstance(target, Path) else None
    try:
        check_parquet_output(resolved, store.root, overwrite=overwrite, resume=False, name=named)
    except OutputExistsError:
        check_free(target)  # another run is writing it: waiting is the way, not --overwrite
        raise
    # the default hint sent a user of tsconv process (or process()) to tsconv.process()
    refuse_time_range(
        plan,
        "Parquet output",
        hint="write a .zarr output, which keeps the span's rows only; or remove time_range and filter the "
        "Parquet file on its time column.",
    )
    rp = plan_run(source, plan, device=device, chunk=chunk, warmup=warmup, cuda=cuda)
    check_time(store)
    if store.time is not None and "time" in plan.output_names:
        raise StoreError(
            "the pipeline has an output named 'time', which the Parquet file's time column uses",
            hint="rename that output, or write a .zarr output.",
        )
    columns = (("time",) if store.time is not None else ()) + tuple(plan.output_names)
    if pair := case_repeat(columns):
        warnings.warn(
            f"the Parquet file's columns {pair[0]!r} and {pair[1]!r} differ only in case: SQL readers such as "
            "duckdb take names case-insensitively and read one for the other; hint: rename the features",
            TsconvWarning,
            stacklevel=3,
        )
    run_id = uuid.uuid4().hex
    with output_lock(target, run_id=run_id):
        remove_stale_temp_files(target)
        check_parquet_output(resolved, store.root, overwrite=overwrite, resume=False, name=named)
        digest = input_digest(store)  # the rows read must still be these when the file takes its name
        store.check_unreplaced()  # and be the store's whose features and rows the run was planned from
        meta = {
            "source": str(store.path),
            "features": list(plan.output_names),
            "pipeline": plan.as_run(),
            "tsconv": {"version": __version__, "rows": store.rows, "chunk": chunk, "warmup": warmup,
                       "halo": plan.halo, "warmups": list(plan.warmups), "pre_halo": plan.pre_halo,
                       "complete": True, "run_id": run_id},
        }  # fmt: skip
        t0 = time.perf_counter()
        reset_device(device)
        if (read := _input_read(store, device, device.type)) is not None:
            meta["tsconv"]["read"] = (
                read  # how an input float32 does not hold was read, as a zarr output says
            )
        sink = ParquetSink(out, names=plan.output_names, time_source=store.time, metadata=meta,
                           where=str(store.path))  # fmt: skip
        sink.before_complete = _input_unchanged(
            store, digest, stop=store.rows, left="no file was written (one already there is kept)"
        )
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
            f"{where} is not supported with dask (--workers/--scheduler; workers=/client= in Python)",
            hint="run it in one process (without --workers/--scheduler), or remove time_range.",
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


def _fingerprint(
    store: InputStore, plan: ResolvedPipeline, chunk: int, warmup: str, *, rows: int | None = None,
    with_sums: bool = True,
) -> str:  # fmt: skip
    """What an output is computed from and how: the input (path, features, dtype), the pipeline, chunk and
    warm-up. Not the input's row count, which ``--update`` grows (the digest tells changed rows apart).
    ``rows``: the fingerprint outputs written before had, with the input's shape (rows x features);
    ``with_sums=False``: outputs written before the first stage's tap sums entered the pipeline's fingerprint
    (they are continued as before: which weights they were computed with cannot be told)."""
    pipeline = plan.fingerprint(with_sums=with_sums)
    what: dict[str, Any] = {"pipeline": pipeline, "input": str(store.path), "dtype": str(store.dtype),
                            "chunk": chunk, "warmup": warmup, "format": FORMAT_VERSION}  # fmt: skip
    if rows is None:
        what["features"] = store.n_features
    else:
        what["shape"] = [rows, store.n_features]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def _input_record(store: InputStore, plan: ResolvedPipeline) -> dict[str, Any]:
    """What the fingerprint holds of the input besides its path, for a refusal to name what changed: its
    dtype, feature count and the pipeline's input names (a hash: a store may have a million)."""
    names = hashlib.sha256(json.dumps(list(plan.input_names)).encode()).hexdigest()
    return {"dtype": str(store.dtype), "features": store.n_features, "names_sha256": names}


def _output_attrs(
    store: InputStore,
    plan: ResolvedPipeline,
    chunk: int,
    warmup: str,
    fingerprint: str,
    run_id: str,
    digest: dict[str, Any] | None,
    *,
    read: str | None,
    compression: str | None = None,
) -> dict[str, Any]:
    """A new output's attributes; ``tsconv.run_id`` names the run that owns it (OutputWriter.finish checks
    it), ``tsconv.input_digest`` where the input's digest is kept (or why there is none), ``tsconv.read`` how
    an input float32 does not hold was read (:func:`_input_read`), ``tsconv.compression`` the codec asked
    for (:func:`tsconv.io.writers.zarr_writer.auto_pending`)."""
    from tsconv import __version__

    attrs = {
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
            "pre_halo": plan.pre_halo,  # the [preprocess]'s NaN steps, warm-up NaNs with --warmup zero too
            "fingerprint": fingerprint,
            "run_id": run_id,
            "input_digest": digest_note(digest) if digest is not None else None,
            "input": _input_record(store, plan),
        },
    }
    if read is not None:
        attrs["tsconv"]["read"] = read
    if compression is not None:
        attrs["tsconv"]["compression"] = compression
    return attrs


def _input_read(store: InputStore, device: torch.device | None, device_name: str) -> str | None:
    """How a run reads a store float32 does not hold: "float64" on the CPU (``Backend.reads_float64``),
    "float32" on CUDA; None for a store float32 holds. ``device`` None: a dask run's workers, by name."""
    if exact_in_float32(store.dtype):
        return None
    if device is not None:
        batched = batched_on(device)  # the GPU's engine (on the CPU: its tests, through the interpreter)
    else:
        batched = device_name.startswith("cuda") or (device_name == "auto" and torch.cuda.is_available())
    return "float32" if batched else "float64"


def _recorded_read(out_path: Path | StoreURL) -> str | None:
    """How an output of a store float32 does not hold was read: its ``tsconv.read``, or float32 for one
    written before outputs recorded it (every run read float32 then); None where there is no readable output
    (the checks say why later)."""
    try:
        return output_meta(out_path).get("read", "float32")
    except Exception:  # noqa: BLE001 - no output, or not one of tsconv's
        return None
