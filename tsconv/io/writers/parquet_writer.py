"""``process(..., output="x.parquet")``: the engine's stream written as Parquet instead of zarr.

Columns: ``time`` (``timestamp[ns, UTC]``) when the input has time, then one float32 column per
pipeline output, named by the pipeline. Row groups of :data:`ROW_GROUP_ROWS` rows (fewer when that
would buffer more than 256 MiB) are written as the engine streams (memory: one row group plus the
engine's chunk). The file is written under a temporary
name beside the output (``.<name>.tsconv-<pid>.tmp``) and renamed into place at the end, so the final
name never holds a partial file; an error removes the temporary file, and the temporary file of a
killed run is removed by the next run on the same output. A run holds the output's lock
(:class:`tsconv.io.lock.OutputLock`) throughout, as zarr outputs do. The schema metadata key
``tsconv`` holds the zarr output's attributes as JSON (source, pipeline as run, chunk, warm-up, halo,
features, run id). ``resume`` is not supported (a Parquet file cannot be appended to after a crash); an
existing file is replaced only with ``overwrite`` (and only once the new file is complete), and a
directory at the output path is never replaced.
"""

from __future__ import annotations

import glob
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from tsconv.errors import OutputExistsError, StoreError, TsconvError
from tsconv.io.frames import transpose_into
from tsconv.io.lock import OutputLock
from tsconv.io.readers.blocks import BlockReader
from tsconv.io.writers.zarr_writer import check_output_flags

__all__ = ["is_parquet_path", "process_to_parquet", "ROW_GROUP_ROWS"]

ROW_GROUP_ROWS = 1 << 16
_GROUP_BYTES = 256 << 20  # at most this much buffered output (fewer rows per group beyond 1024 outputs)
_SUFFIXES = (".parquet", ".pq")
_TMP_INFIX, _TMP_SUFFIX = ".tsconv-", ".tmp"  # .<name>.tsconv-<pid>.tmp


def is_parquet_path(path: str | os.PathLike[str] | None) -> bool:
    return path is not None and str(path).lower().endswith(_SUFFIXES)


def _temp_path(out: Path) -> Path:
    return out.with_name(f".{out.name}{_TMP_INFIX}{os.getpid()}{_TMP_SUFFIX}")


def remove_stale_temp_files(out: Path) -> list[Path]:
    """Delete the temporary files killed runs left beside the Parquet output ``out``; call it holding the
    output's lock (no other run is writing one). Returns the files removed."""
    pattern = f".{glob.escape(out.name)}{_TMP_INFIX}*{_TMP_SUFFIX}"
    removed = []
    for tmp in out.parent.glob(pattern):
        if tmp.is_file() and not tmp.is_symlink():
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _check_output(out: Path, inp: Path, *, overwrite: bool, resume: bool) -> None:
    if resume:
        raise TsconvError(
            f"--resume is not supported for Parquet output ({out.name})",
            hint="rerun with --overwrite (the file is rewritten whole), or write a .zarr output to resume.",
        )
    if out == inp or out.is_relative_to(inp):
        raise StoreError(
            f"output {str(out)!r} would lie inside the input store {str(inp)!r}",
            hint="choose an output path outside the input store; tsconv never writes into its input.",
        )
    if out.is_dir():
        raise StoreError(
            f"output path {str(out)!r} is a directory; refusing to replace it",
            hint="remove it yourself or choose another --output.",
        )
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise OutputExistsError(
            f"output file {str(out)!r} already exists", hint="pass --overwrite to replace it."
        )


class _RowGroupWriter:
    """Buffers the engine's blocks and writes row groups of ``group_rows`` rows."""

    def __init__(self, writer: Any, names: tuple[str, ...], times: BlockReader | None, group_rows: int) -> None:  # fmt: skip
        self.writer, self.names, self.times, self.group_rows = writer, names, times, group_rows
        self.buf = np.empty((len(names), group_rows), dtype=np.float32)  # feature-major: Arrow's layout
        self.fill = 0
        self.row = 0  # first row of the buffer

    def append(self, block: np.ndarray) -> None:
        done = 0
        while done < block.shape[0]:
            n = min(block.shape[0] - done, self.group_rows - self.fill)
            transpose_into(self.buf[:, self.fill : self.fill + n], block[done : done + n])
            self.fill += n
            done += n
            if self.fill == self.group_rows:
                self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        if not self.fill:
            return
        n, a = self.fill, self.row
        arrays = [pa.array(self.buf[j, :n]) for j in range(len(self.names))]
        names = list(self.names)
        if self.times is not None:
            t = self.times.read(a, a + n).astype(np.int64, copy=False)
            arrays.insert(0, pa.array(t.view("datetime64[ns]"), type=pa.timestamp("ns", tz="UTC")))
            names.insert(0, "time")
        self.writer.write_batch(pa.RecordBatch.from_arrays(arrays, names=names), row_group_size=n)
        self.row += n
        self.fill = 0


def process_to_parquet(
    input: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    pipeline: Any = None,
    chunk: int = 1024,
    device: str = "auto",
    overwrite: bool = False,
    resume: bool = False,
    warmup: str = "nan",
    progress: bool = False,
    row_group_rows: int = ROW_GROUP_ROWS,
    distributed: bool = False,
) -> Any:
    """Like :func:`tsconv.process` but writes the Parquet file ``output``; returns a ``Report``."""
    if distributed:
        raise TsconvError(
            "Parquet output is written by one process; workers/client (dask) are not supported for it",
            hint="write a .zarr output with dask, or leave workers/client out for Parquet.",
        )
    from tsconv.engine import api as engine
    from tsconv.io.store import check_time, open_input

    check_output_flags(overwrite=overwrite, resume=resume)
    engine._check_options(chunk, warmup)
    out = Path(output).expanduser().absolute()
    dev = engine.resolve_device(device)
    store = open_input(input)
    # Checked before the lock file is made beside ``out`` (never inside the input), and again holding it.
    _check_output(out.resolve(), store.path, overwrite=overwrite, resume=resume)
    plan = engine.resolve(engine._as_pipeline(pipeline), store.features)
    engine._refuse_time_range(plan, "Parquet output")
    engine._check_length(store.rows, plan, warmup, str(store.path))
    check_time(store)
    if store.time is not None and "time" in plan.output_names:
        raise StoreError(
            "the pipeline has an output named 'time', which the Parquet file's time column uses",
            hint="rename that output, or write a .zarr output.",
        )
    run_id = uuid.uuid4().hex
    # The name the finished file is renamed onto (a symlink there is replaced, not followed) is what the
    # lock and the temporary files belong to.
    target = out.parent.resolve() / out.name
    with OutputLock(target, run_id=run_id):
        remove_stale_temp_files(target)
        _check_output(out.resolve(), store.path, overwrite=overwrite, resume=resume)
        return _write_parquet(store, plan, out, dev, chunk=chunk, warmup=warmup, progress=progress,
                              row_group_rows=row_group_rows, run_id=run_id)  # fmt: skip


def _write_parquet(
    store: Any,
    plan: Any,
    out: Path,
    dev: Any,
    *,
    chunk: int,
    warmup: str,
    progress: bool,
    row_group_rows: int,
    run_id: str,
) -> Any:
    """Stream ``store`` through ``plan`` into the Parquet file ``out`` (the caller holds its lock)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from tqdm import tqdm

    from tsconv import __version__
    from tsconv.engine import api as engine

    fields = [pa.field(n, pa.float32()) for n in plan.output_names]
    if store.time is not None:
        fields.insert(0, pa.field("time", pa.timestamp("ns", tz="UTC")))
    meta = {
        "source": str(store.path),
        "features": list(plan.output_names),
        "pipeline": plan.as_run(),
        "tsconv": {"version": __version__, "rows": store.rows, "chunk": chunk, "warmup": warmup,
                   "halo": plan.halo, "complete": True, "run_id": run_id},
    }  # fmt: skip
    schema = pa.schema(fields, metadata={"tsconv": json.dumps(meta)})
    tmp = _temp_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    try:
        with pq.ParquetWriter(str(tmp), schema) as writer:
            times = BlockReader(store.time, where=str(store.path)) if store.time is not None else None
            cap = max(1024, _GROUP_BYTES // (4 * plan.n_outputs))  # bound the buffer for wide outputs
            groups = _RowGroupWriter(writer, plan.output_names, times, min(row_group_rows, cap))
            with (
                tqdm(total=store.rows, unit="rows", unit_scale=True, disable=not progress,
                     desc=store.path.name, dynamic_ncols=True) as bar,
                engine._exact_fp32(dev),
            ):  # fmt: skip
                engine._stream(
                    BlockReader(store.values, where=str(store.path)),
                    plan,
                    engine.Backend(plan, dev),
                    groups.append,
                    start=0,
                    chunk=chunk,
                    warmup=warmup,
                    on_rows=bar.update,
                )
            groups.flush()
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    seconds = time.perf_counter() - t0
    return engine.make_report(
        store,
        plan,
        out,
        dev,
        rows=store.rows,
        total_rows=store.rows,
        chunk=chunk,
        resumed_from=0,
        seconds=seconds,
    )
