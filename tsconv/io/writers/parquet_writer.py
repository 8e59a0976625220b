"""A run's rows written as a Parquet file instead of a zarr store (the format; the run is wired in
:mod:`tsconv.engine.outputs`).

Columns: ``time`` (``timestamp[ns, UTC]``) when the input has time, then one float32 column per
pipeline output, named by the pipeline. A missing value (NaN: warm-up rows, NaN inputs) is written as a
null, so Parquet readers' aggregates (``avg``, ``mean``, ``count``) skip it; +-inf stays inf. Row groups of :data:`ROW_GROUP_ROWS` rows (fewer when that
would buffer more than 256 MiB) are written as the engine streams (memory: one row group plus the
engine's chunk). The file is written under a temporary
name beside the output (``.<name>.tsconv-<pid>.tmp``) and renamed into place at the end, so the final
name never holds a partial file; an error removes the temporary file, and the temporary file of a
killed run is removed by the next run on the same output. A run holds the output's lock
(:class:`tsconv.io.lock.OutputLock`) throughout, as zarr outputs do. The schema metadata key
``tsconv`` holds the zarr output's attributes as JSON (source, pipeline as run, chunk, warm-up, halo,
features, run id). ``resume`` is not supported (a Parquet file cannot be appended to after a crash); an
existing file is replaced only with ``overwrite`` (and only once the new file is complete), and only
when it is a Parquet file (it starts with ``PAR1``) or empty; a directory at the output path is never
replaced.

At a URL (:mod:`tsconv.io.objstore`) the file is written in place through fsspec without committing
(``autocommit=False``: on S3 a multipart upload), committed by :meth:`ParquetSink.finish` and discarded
by an error: the object appears whole at the end or not at all, and replaces the old one in the same
instant. A killed run leaves no object, but on S3 it can leave an unfinished multipart upload, which the
bucket keeps (and bills) until a lifecycle rule aborts it.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tsconv.errors import OutputExistsError, StoreError, TsconvError, disk_advice, first_line
from tsconv.io.objstore import StoreURL, overlaps, remote_error
from tsconv.io.readers.blocks import BlockReader
from tsconv.io.transpose import transpose_into

__all__ = [
    "ROW_GROUP_ROWS",
    "ParquetSink",
    "check_parquet_output",
    "is_parquet_path",
    "parquet_output_words",
    "remove_stale_temp_files",
]

ROW_GROUP_ROWS = 1 << 16
_GROUP_BYTES = 256 << 20  # at most this much buffered output (fewer rows per group beyond 1024 outputs)
_SUFFIXES = (".parquet", ".pq")
_TMP_INFIX, _TMP_SUFFIX = ".tsconv-", ".tmp"  # .<name>.tsconv-<pid>.tmp
_MAGIC = b"PAR1"  # every Parquet file starts (and ends) with it


def is_parquet_path(path: str | os.PathLike[str] | StoreURL | None) -> bool:
    return path is not None and str(path).lower().endswith(_SUFFIXES)


def parquet_output_words(path: Path) -> str | None:
    """``path`` in words if it is a Parquet file tsconv wrote (its schema metadata holds the ``tsconv`` key):
    its rows, features, pipeline and input; None for any other file."""
    try:
        with path.open("rb") as f:
            f.seek(-4, os.SEEK_END)
            if f.read(4) != b"PAR1":  # every Parquet file ends so: other files never import pyarrow
                return None
        import pyarrow.parquet as pq

        meta = pq.read_metadata(str(path))
        attrs = json.loads((meta.metadata or {}).get(b"tsconv", b"null"))
    except (OSError, ValueError, ImportError):
        return None
    if not isinstance(attrs, dict):
        return None
    features = attrs.get("features")
    n = len(features) if isinstance(features, list) else meta.num_columns
    pipeline = attrs.get("pipeline")
    name = pipeline.get("name") if isinstance(pipeline, dict) else None
    return (
        f"a tsconv output in Parquet ({meta.num_rows:,} rows x {n:,} features"
        + (f", pipeline {name!r}" if name else "")
        + (f", from {attrs['source']}" if attrs.get("source") else "")
        + ")"
    )


def _temp_path(out: Path) -> Path:
    return out.with_name(f".{out.name}{_TMP_INFIX}{os.getpid()}{_TMP_SUFFIX}")


def remove_stale_temp_files(out: Path | StoreURL) -> list[Path]:
    """Delete the temporary files killed runs left beside the Parquet output ``out``; call it holding the
    output's lock (no other run is writing one). Returns the files removed (none at a URL: no temporary
    object is made there)."""
    if isinstance(out, StoreURL):
        return []
    pattern = f".{glob.escape(out.name)}{_TMP_INFIX}*{_TMP_SUFFIX}"
    removed = []
    for tmp in out.parent.glob(pattern):
        if tmp.is_file() and not tmp.is_symlink():
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def check_parquet_output(
    out: Path | StoreURL, inp: Path | StoreURL, *, overwrite: bool, resume: bool, name: Path | None = None
) -> None:
    """Refuse what a Parquet output cannot do: resume, lie inside the input, replace a directory, or replace
    a file without ``overwrite``. ``out`` is the output resolved; ``name``, the path the finished file is
    renamed onto, where a symbolic link (even one to nothing) is replaced, not followed."""
    if resume:
        raise TsconvError(
            f"--resume is not supported for Parquet output ({out.name})",
            hint="rerun with --overwrite (the file is rewritten whole), or write a .zarr output to resume.",
        )
    if overlaps(out, inp) and not (isinstance(inp, Path) and inp.resolve().is_relative_to(out.resolve())):
        raise StoreError(
            f"output {str(out)!r} would lie inside the input store {str(inp)!r}",
            hint="choose an output path outside the input store; tsconv never writes into its input.",
        )
    if isinstance(out, StoreURL):
        try:
            is_file, there = out.is_file(), out.exists()
        except StoreError:
            raise
        except Exception as exc:
            raise remote_error(exc, out, "check the output") from None
        if there and not is_file:
            raise StoreError(
                f"output {out.url!r} holds objects below it (a directory); refusing to replace it",
                hint="remove them yourself or choose another --output.",
            )
        if there and not overwrite:
            raise OutputExistsError(
                f"output file {out.url!r} already exists", hint="pass --overwrite to replace it."
            )
        return
    # a file where a folder of the path should be: the lock file's mkdir said "File exists", and its hint
    # asked for write access (a zarr output names the file)
    blocked = next((d for d in out.parents if d.exists() and not d.is_dir()), None)
    if blocked is not None:
        raise StoreError(
            f"output {str(out)!r} cannot be made: {str(blocked)!r} is a file, not a folder",
            hint="choose an --output in a folder.",
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
    if name is not None and name.is_symlink():
        if not overwrite:
            raise OutputExistsError(
                f"output {str(name)!r} already exists: a symbolic link (to {os.readlink(name)!r}), which the "
                "file would replace",
                hint="pass --overwrite to replace the link, or name the file it points to.",
            )
        return  # the link is replaced, not the file it points to
    if out.is_file():
        _refuse_non_parquet(out)


def _refuse_non_parquet(out: Path) -> None:
    """Refuse to replace a file that is not Parquet: as a zarr output replaces only zarr data, a file someone
    named by mistake (a CSV, a script) is not tsconv's to delete. An empty file holds nothing to lose."""
    try:
        with out.open("rb") as f:
            head = f.read(len(_MAGIC))
    except OSError as exc:
        raise StoreError(
            f"cannot read the output file {str(out)!r} to check that it is a Parquet file before replacing "
            f"it: {exc.strerror or exc}",
            hint="remove it yourself or choose another --output.",
        ) from None
    if head and head != _MAGIC:
        raise StoreError(
            f"output file {str(out)!r} is not a Parquet file (it starts with {head!r}, not {_MAGIC!r}); "
            "refusing to replace it",
            hint="remove it yourself or choose another --output.",
        )


def _write_error(out: Path | StoreURL, what: str, exc: OSError) -> StoreError:
    """A failed write of the output named, with what to do: the old file (if any) is still there."""
    where = out.url if isinstance(out, StoreURL) else str(out)
    space = disk_advice(exc)
    return StoreError(
        f"cannot write {what} of the Parquet output {where!r}: {first_line(exc)}",
        hint=f"{space}, then rerun the command (the file is written whole; any file already at the output "
        "is kept until then).",
    )


def _nulls_for_nan(col: np.ndarray) -> Any:
    """A float32 Arrow array over the contiguous ``col`` (not copied) whose NaNs are nulls. The validity
    bitmap is packed here: ``pa.array(col, mask=...)`` and ``from_pandas=True`` copy the data and took
    5-10x as long (0.4 ms against 1.8-3.8 ms per 65,536 x 16 row group)."""
    import pyarrow as pa

    missing = np.isnan(col)
    nulls = int(np.count_nonzero(missing))
    if not nulls:
        return pa.array(col)
    valid = np.packbits(~missing, bitorder="little")  # Arrow's bitmap: bit i of byte i // 8, LSB first
    return pa.Array.from_buffers(
        pa.float32(), col.size, [pa.py_buffer(valid), pa.py_buffer(col)], null_count=nulls
    )


class ParquetSink:
    """Rows appended in order, written as row groups of ``group_rows`` rows into ``out``'s temporary file,
    which :meth:`finish` renames onto ``out`` (:meth:`close` unfinished removes it). ``time_source``: the
    input's time column (int64 ns), written as the first column."""

    threads = 0

    def __init__(
        self,
        out: Path | StoreURL,
        *,
        names: tuple[str, ...],
        time_source: Any | None,
        metadata: dict[str, Any],
        row_group_rows: int | None = None,
        where: str = "the input",
    ) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.out, self.names = out, names
        # called once every row is written, before the file takes its name (an error leaves the old file):
        # the run's check that its input did not change meanwhile
        self.before_complete: Callable[[], None] | None = None
        fields = [pa.field(n, pa.float32()) for n in names]
        if time_source is not None:
            fields.insert(0, pa.field("time", pa.timestamp("ns", tz="UTC")))
        schema = pa.schema(fields, metadata={"tsconv": json.dumps(metadata)})
        self._file: Any = None  # at a URL: fsspec's file, committed by finish()
        if isinstance(out, StoreURL):
            self.tmp = None
            fs, path = out.filesystem()
            try:
                self._file = fs.open(path, "wb", autocommit=False)
            except Exception as exc:
                raise remote_error(exc, out, "write") from None
            self.writer = pq.ParquetWriter(self._file, schema)
        else:
            self.tmp = _temp_path(out)
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.writer = pq.ParquetWriter(str(self.tmp), schema)
            except OSError as exc:
                # the file's first bytes: on a full disk this was a bare "[Errno 28] Error writing bytes to
                # file" naming no file, and the temporary file stayed beside the output
                with contextlib.suppress(OSError):
                    self.tmp.unlink(missing_ok=True)
                raise _write_error(out, "the header", exc) from exc
        self.times = BlockReader(time_source, where=where) if time_source is not None else None
        cap = max(1024, _GROUP_BYTES // (4 * len(names)))  # bound the buffer for wide outputs
        self.group_rows = min(ROW_GROUP_ROWS if row_group_rows is None else row_group_rows, cap)
        self.buf = np.empty((len(names), self.group_rows), dtype=np.float32)  # feature-major: Arrow's layout
        self.fill = 0
        self.row = 0  # first row of the buffer
        self.busy_seconds = 0.0
        self._done = False

    def reserve(self, n: int) -> np.ndarray | None:
        """No rows computed in place: each append is encoded from its block."""
        return None

    def append(self, block: np.ndarray, *, release: Callable[[], None] | None = None) -> None:
        t0 = time.perf_counter()
        done = 0
        try:
            while done < block.shape[0]:
                n = min(block.shape[0] - done, self.group_rows - self.fill)
                transpose_into(self.buf[:, self.fill : self.fill + n], block[done : done + n])
                self.fill += n
                done += n
                if self.fill == self.group_rows:
                    self._flush()
        finally:
            if release is not None:  # the rows are in our buffer (or the write failed)
                release()
        self.busy_seconds += time.perf_counter() - t0

    def finish(self) -> None:
        self._flush()
        try:
            self.writer.close()
        except OSError as exc:
            raise _write_error(self.out, "the footer", exc) from exc
        if self.before_complete is not None:
            self.before_complete()  # an error: close() discards the file
        if self._file is not None:
            self._file.close()
            self._file.commit()  # the object appears now, whole
        else:
            os.replace(self.tmp, self.out)
        self._done = True

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self.writer.close()
        except OSError:
            pass  # the file is deleted anyway; a full disk failing its footer again must not hide the first error
        finally:
            if self._file is not None:
                self._file.discard()
            else:
                self.tmp.unlink(missing_ok=True)

    def _flush(self) -> None:
        import pyarrow as pa

        if not self.fill:
            return
        n, a = self.fill, self.row
        arrays = [_nulls_for_nan(self.buf[j, :n]) for j in range(len(self.names))]
        names = list(self.names)
        if self.times is not None:
            t = self.times.read(a, a + n).astype(np.int64, copy=False)
            arrays.insert(0, pa.array(t.view("datetime64[ns]"), type=pa.timestamp("ns", tz="UTC")))
            names.insert(0, "time")
        try:
            self.writer.write_batch(pa.RecordBatch.from_arrays(arrays, names=names), row_group_size=n)
        except OSError as exc:
            raise _write_error(self.out, f"rows {a:,}..{a + n:,}", exc) from exc
        self.row += n
        self.fill = 0
