"""Ingest tick files (Parquet, CSV, Arrow IPC) into a store that follows the store convention.

Input layouts:
- ``long``: one row per (time, feature, value); other columns are ignored. With several value columns
  (say ``px`` and ``qty``) each symbol of the feature column gives one feature per value column, named
  ``symbol.column`` (``AAPL.px``, ``AAPL.qty``: the symbol first, as in a pipeline's outputs
  ``AAPL.px.diff1``); with one value column a feature is named by its symbol alone.
- ``wide``: a time column plus one numeric column per feature. The index columns pandas declares in a
  Parquet or Arrow file's metadata (``__index_level_0__`` of a filtered frame) are left out, with a warning;
  a column with no name (the index pandas' ``to_csv`` writes by default) is refused.

Output: a zarr (format 3) group with ``values`` [T, F] (float32 or float64, NaN where a (time, feature)
cell has no value), ``time`` [T] int64 ns since the epoch (UTC), the sorted distinct timestamps of all
files, and the attribute ``features``. Features are sorted by symbol for long input (the value columns
of a symbol in the order given); for wide input they keep the column order of the first file, columns
first seen in later files being appended in order.

Rules:
- Files: globs are expanded here (the shell may not), and the whole list is sorted by path.
- Duplicate (time, feature) pairs: the last one wins, in file order (sorted paths), then row order.
  A null value is a value too: a later null overwrites an earlier number with NaN.
- Unsorted input is fine: rows are placed by their timestamp.
- Time: a time-zone-aware column is converted to UTC; naive timestamps are taken as UTC; integer time
  columns count ``time_unit`` (default ns) since the epoch; strings are parsed as ISO 8601 (polars'
  ``str.to_datetime``), an offset such as ``+02:00`` or ``Z`` converted to UTC, none taken as UTC.

How it streams (why this design): the time axis is processed in *bands* of whole output chunks, each
band at most ``_BAND_BYTES`` of dense output. Pass 1 reads the time and feature columns once to get the
distinct timestamps (8 bytes each: 10M timestamps are 80 MB) and feature names. Then, per band, every
file is scanned lazily with a filter on its time range and streamed in batches (``collect_batches``)
that are scattered into the band's dense [rows, F] buffer, which is then written as whole chunks.
Memory is one band plus a few batches, whatever the file sizes. For Parquet sorted by time (the usual
tick file), the band filter is pushed into row-group statistics, so every band reads only its own row
groups and the total read is about one pass; an unsorted or CSV input is re-read once per band. With
256 MiB bands, a 10M-row x 1024-feature input is one band (40 MB dense): one pass.

Measured (benchmarks/ingest.py, 10.1M rows x 1024 features, 2 shared cores): sorted Parquet 1.6 s in
one band, 1.8 s in three 16 MiB bands; the same rows shuffled across all row groups (no skipping, every
band re-reads the whole file) 4.2 s in one band, 4.0 s in three. Re-reading is cheap next to the work
per row (time lookup, scatter), so re-scanning per band is kept. Sorting once into a temporary Parquet
file would add a full write and read of the input, and polars' streaming sort is not guaranteed to
spill to disk; it would pay off only for many bands of unsorted (or CSV) input.
"""

from __future__ import annotations

import csv
import ctypes
import errno
import functools
import glob
import gzip
import json
import os
import re
import resource
import shlex
import shutil
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import zarr
from zarr.codecs import BloscCodec

from tsconv.errors import OutputExistsError, StoreError, TsconvWarning, disk_advice, first_line
from tsconv.io.dataframes import pandas_index_columns
from tsconv.io.lock import OutputLock
from tsconv.io.names import control_name, describe_repeats, repeated_names
from tsconv.io.objstore import is_url, location, shown
from tsconv.io.precision import float32_loss_by_feature, float32_loss_in_blocks
from tsconv.io.store import interrupted_append, is_zarr_store, open_input
from tsconv.io.timecoding import iso_utc, looks_early
from tsconv.io.writers.zarr_writer import is_metadata_temporary, write_consolidated
from tsconv.progress import progress_bar

__all__ = ["IngestReport", "ingest", "expand_files", "repair"]

INGEST_VERSION = 1
_CHUNK_BYTES = 16 << 20  # ~16 MB chunks of all features read back fastest (as tsconv.synth writes)
_BAND_BYTES = 256 << 20  # dense output rows held in memory at once; more bands = more input re-reads
_BATCH_ROWS = 1 << 20  # rows per streamed batch: ~20 MB of (time, feature, value) for long input
_NS_PER = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
# ISO 8601 as times are written: a date, optionally a time (T or a space) to any fraction, optionally Z or an offset
_ISO_8601 = (
    r"^\s*[+-]?\d{4,}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?\s*([Zz]|[+-]\d{2}(:?\d{2})?)?\s*$"  # noqa: E501
)
_SUFFIXES = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".csv.gz": "csv",
    ".arrow": "ipc",
    ".ipc": "ipc",
    ".feather": "ipc",
}
_T = "__tsconv_time_ns"  # internal column names, unlikely to clash with a feature
_F = "__tsconv_feature"
_V = "__tsconv_value"
_CSV_INFER_ROWS = 10_000
# how exports mark a missing number (R, SQL, Excel, Python): a CSV value column holding one is typed String
_MISSING_MARKERS = frozenset({"na", "n/a", "#n/a", "null", "none", "nil", "missing"})


@dataclass(frozen=True)
class IngestReport:
    """What an ingest did: rows (timestamps) and features written, time taken, peak RSS."""

    rows: int
    features: int
    seconds: float
    rows_per_s: float
    peak_rss_bytes: int
    output: str
    input_rows: int
    files: int
    appended: bool

    def summary(self) -> str:
        if self.appended and self.input_rows == 0:
            return f"{self.files} file(s) with no rows: nothing appended to {self.output}, which is as it was"
        verb = "appended to" if self.appended else "->"
        return (
            f"{self.files} file(s), {self.input_rows:,} input rows -> {self.rows:,} rows x {self.features} "
            f"features in {self.seconds:.1f} s: {self.rows_per_s:,.0f} input rows/s, "
            f"peak RSS {self.peak_rss_bytes / 2**20:.0f} MiB {verb} {self.output}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------ inputs


class _NoRowsError(StoreError):
    """An input file that holds a header or a schema only (a holiday's file in a daily glob)."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"input file {str(path)!r} has no rows", hint="remove it from the file list.")
        self.path = path


def _refuse_repeated_header(path: Path) -> None:
    """Refuse a CSV file whose header names a column twice: polars would keep both, the second renamed
    ``name_duplicated_0``, and a wide file would then store it as a feature of that invented name."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", newline="") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return  # polars' own read reports what is wrong with the file
    seen: set[str] = set()
    twice = sorted({c for c in header if c in seen or seen.add(c)})
    if twice:
        raise StoreError(
            f"input file {str(path)!r} names the column{'s' if len(twice) > 1 else ''} "
            f"{', '.join(repr(c) for c in twice)} more than once in its header",
            hint="give every column a distinct name.",
        )


def _cut_short_csv(path: Path) -> str | None:
    """The last line of a plain CSV file that does not end with a line break, else None: a writer stopped
    mid-write leaves such a file, whose last row polars reads as it finds it (``101.25`` cut to ``10``, a time
    cut to an earlier one). A .csv.gz cut short fails to decompress, and Parquet and Arrow files have footers."""
    if str(path).lower().endswith(".gz"):
        return None
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return None
            f.seek(max(0, size - 200))
            tail = f.read()
    except OSError:
        return None  # polars' own read reports what is wrong with the file
    if tail.endswith(b"\n"):
        return None
    return tail.rsplit(b"\n", 1)[-1].decode("utf-8", "replace")


def _format_of(path: Path) -> str | None:
    name = path.name.lower()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):  # .csv.gz before .gz-less matches
        if name.endswith(suffix):
            return _SUFFIXES[suffix]
    return None


def expand_files(files: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Expand globs, check every file exists and has a known suffix; return the sorted, distinct paths."""
    found: set[Path] = set()
    for item in files:
        text = os.path.expanduser(str(item))
        if text.lower().startswith("file://"):
            text = str(location(text))
        if glob.has_magic(text):
            matches = [Path(m) for m in glob.glob(text, recursive=True) if Path(m).is_file()]
            if not matches:
                raise StoreError(
                    f"no file matches {text!r}", hint="check the pattern; quote it so that tsconv expands it."
                )
            found.update(m.resolve() for m in matches)
            continue
        p = Path(text)
        if not p.exists():
            raise StoreError(f"input file {text!r} does not exist", hint="check the path.")
        if p.is_dir():
            raise StoreError(
                f"input {text!r} is a directory, expected a file",
                hint=f"pass a glob such as '{text.rstrip('/')}/*.parquet'.",
            )
        found.add(p.resolve())
    if not found:
        raise StoreError("no input files given", hint="pass one or more files or globs.")
    paths = sorted(found)
    for p in paths:
        if _format_of(p) is None:
            raise StoreError(
                f"{str(p)!r}: unknown file format",
                hint="use .parquet/.pq, .csv/.csv.gz or .arrow/.ipc/.feather (Arrow IPC).",
            )
    return paths


# What reading a file can raise: polars' errors, the OS's, and a panic in polars' Rust code (a BaseException,
# not an Exception), which a time zone it cannot parse, such as a fixed "+05:30" offset, raised.
_READ_ERRORS = (pl.exceptions.PolarsError, pl.exceptions.PanicException, OSError)
_ZONE_HINT = (
    "write the time column in UTC, or with a named zone (such as Asia/Kolkata) rather than an offset."
)
_WHOLE_HOUR_OFFSET = re.compile(r"[+-]([01][0-9]|2[0-3]):?00")


def _polars_reads_zone(tz: str) -> bool:
    """Whether polars reads a time column in zone ``tz``: an IANA name as spelled there (and "utc"), or an
    offset of whole hours ("+02:00", "+0200"); "Z", "+05:30", "+05", "UTC+2" and "europe/paris" make it
    panic."""
    if tz == "utc" or _WHOLE_HOUR_OFFSET.fullmatch(tz):
        return True
    names = _zone_names()  # empty without a zone database: polars has its own, let it judge
    return not names or tz in names


@functools.cache
def _zone_names() -> frozenset[str]:
    """The IANA zone names (9-20 ms a listing; an ingest asks once per file with a zoned time column)."""
    import zoneinfo

    return frozenset(zoneinfo.available_timezones())


def _read_error(path: Path, fmt: str, exc: BaseException, *, time_column: str | None = None) -> StoreError:
    kind = {"parquet": "Parquet", "csv": "CSV", "ipc": "Arrow IPC"}[fmt]
    if isinstance(exc, pl.exceptions.NoDataError) or (path.exists() and path.stat().st_size == 0):
        return StoreError(f"input file {str(path)!r} is empty", hint="remove it from the file list.")
    msg = first_line(exc)
    column = re.search(r"could not parse .* at column '(.*)' \(column number", msg)
    if column and column[1] == time_column:
        # the type was guessed from the first rows: a later time in another form (or with a fraction) fails
        hint = (
            f"write every time of column {time_column!r} in one form: whole numbers counting --time-unit, "
            "or ISO 8601 strings such as 2026-01-02T09:30:00Z."
        )
    elif column:
        hint = f"every value of column {column[1]!r} must be a number (or empty for a missing value)."
    elif "could not parse" in msg:
        hint = "every value of a value column must be a number (or empty for a missing value)."
    elif "time zone" in msg:
        hint = _ZONE_HINT
    else:
        hint = "check that the file is complete and that its suffix matches its format."
    return StoreError(f"cannot read {str(path)!r} as {kind}: {msg}", hint=hint)


def _is_numeric(dt: pl.DataType) -> bool:
    return dt.is_numeric() or dt == pl.Null


class _Source:
    """One input file: its lazy scan, its time column converted to int64 ns, and a pushdown filter."""

    def __init__(self, path: Path, *, layout: str, time_column: str, feature_column: str,
                 value_columns: tuple[str, ...], time_unit: str, dtype: pl.DataType) -> None:  # fmt: skip
        self.path = path
        self.fmt = _format_of(path) or "parquet"
        self.layout = layout
        self.time_column = time_column
        self.feature_column = feature_column
        self.value_columns = value_columns
        self.dtype = dtype
        schema = self._schema()
        # pandas' index (row numbers once a frame is filtered) is not data: as a wide file's feature it was
        # stored, and processed, as one
        self.index_columns: list[str] = []
        if layout == "wide":
            self.index_columns = [c for c in self._pandas_index() if c in schema and c != time_column]
            schema = {c: t for c, t in schema.items() if c not in self.index_columns}
        self._overrides: dict[str, pl.DataType] = {}
        # a CSV value column left String: its first cell that is no number, named in the refusal
        self._not_a_number: dict[str, str] = {}
        if self.fmt == "csv":
            _refuse_repeated_header(path)
            schema = self._pin_csv_types(schema)
        self._check_columns(schema)
        self.lf = self._scan(schema_overrides=self._overrides) if self.fmt == "csv" else self._scan()
        self.schema = schema
        self.time_dtype = schema[time_column]
        self.features_in_file = [c for c in schema if c != time_column] if layout == "wide" else []
        self.time_ns = self._time_expr(self.time_dtype, time_unit)
        self.unit = time_unit

    def _scan(self, **csv_options: Any) -> pl.LazyFrame:
        p = str(self.path)
        if self.fmt == "parquet":
            return pl.scan_parquet(p)
        if self.fmt == "ipc":
            return pl.scan_ipc(p)
        lf = pl.scan_csv(p, infer_schema_length=_CSV_INFER_ROWS, **csv_options)
        # a blank line (one at the end, most often) is a row of nulls, which was refused as a time missing
        return lf.filter(~pl.all_horizontal(pl.all().is_null()))

    def _schema(self) -> dict[str, pl.DataType]:
        self._refuse_ipc_stream()
        self._refuse_repeated_columns()
        self._refuse_unreadable_zone()
        try:
            return dict(self._scan().collect_schema())
        except _READ_ERRORS as exc:
            raise self._read_error(exc) from None

    def _arrow_schema(self) -> Any:
        """The pyarrow schema of a Parquet or Arrow file, with its metadata; None for CSV or an unreadable file."""
        if self.fmt == "csv":
            return None
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            if self.fmt == "parquet":
                return pq.read_schema(str(self.path))
            with pa.memory_map(str(self.path)) as f:
                return pa.ipc.open_file(f).schema
        except Exception:  # noqa: BLE001 - not such a file: polars' read says why
            return None

    def _pandas_index(self) -> list[str]:
        """The columns pandas' metadata declares as the frame's index (:func:`pandas_index_columns`)."""
        return pandas_index_columns(self._arrow_schema())

    def _refuse_ipc_stream(self) -> None:
        """Refuse an Arrow IPC stream (pa.ipc.new_stream, polars' write_ipc_stream), which polars' scan does not
        read: it failed with 'InvalidFooter' and a hint that the file was incomplete or misnamed."""
        if self.fmt != "ipc":
            return
        try:
            with open(self.path, "rb") as f:
                magic = f.read(6)
        except OSError:
            return  # polars' read says why
        if not magic or magic == b"ARROW1":
            return
        import pyarrow as pa

        try:
            with pa.memory_map(str(self.path)) as f:
                pa.ipc.open_stream(f).schema  # noqa: B018 - reads the stream's schema message only
        except Exception:  # noqa: BLE001 - not a stream either: polars' read says why
            return
        raise StoreError(
            f"input file {str(self.path)!r} is an Arrow IPC stream; tsconv reads the Arrow IPC file format "
            "(the one with a footer: pa.ipc.new_file, polars' write_ipc)",
            hint="write the file again in the file format (pyarrow: batches read with pa.ipc.open_stream written "
            "with pa.ipc.new_file; polars: pl.read_ipc_stream(src).write_ipc(dst)).",
        )

    def _refuse_repeated_columns(self) -> None:
        """Refuse a Parquet or Arrow file that names a column twice (pyarrow writes such a table): polars
        refused the Parquet file with a hint that it was damaged, and panicked reading the Arrow file (Rust's
        panic and backtrace on stderr)."""
        schema = self._arrow_schema()
        twice = repeated_names(list(schema.names)) if schema is not None else []
        if twice:
            raise StoreError(
                f"input file {str(self.path)!r} names the column{'s' if len(twice) > 1 else ''} "
                f"{', '.join(repr(c) for c in twice)} more than once",
                hint="give every column a distinct name (pyarrow: table.rename_columns([...])) and write the "
                "file again.",
            )

    def _refuse_unreadable_zone(self) -> None:
        """Refuse a Parquet or Arrow time column whose time zone polars cannot parse ("+05:30", as pandas
        writes a fixed offset; "Z"): polars panics reading the file, and Rust prints the panic on stderr."""
        schema = self._arrow_schema()
        try:
            tz = schema.field(self.time_column).type.tz
        except Exception:  # noqa: BLE001 - not such a column or file: polars' read says why
            return
        if tz and not _polars_reads_zone(tz):
            raise StoreError(
                f"the time column {self.time_column!r} of {str(self.path)!r} has the time zone {tz!r}, "
                "which polars cannot read (a zone name it does not know, or an offset of part of an hour)",
                hint=_ZONE_HINT,
            )

    def _read_error(self, exc: BaseException) -> StoreError:
        return _read_error(self.path, self.fmt, exc, time_column=self.time_column)

    def _pin_csv_types(self, schema: dict[str, pl.DataType]) -> dict[str, pl.DataType]:
        """A CSV file's schema with its value columns Float64 and a long file's other columns (feature
        column included) String, the types every read of the file uses (``self._overrides``). polars guesses
        from the first rows only: integers there fail on a later decimal, and ``nan`` or ``Inf`` there guess
        String though the Float64 parser reads them. A value column stays String, to be refused as not numeric, only where a cell of
        those rows is no number; text further down fails the read, naming the file."""
        if self.layout == "long":
            values = [c for c in self.value_columns if c in schema]
            # columns a long file's ingest does not use are read as text: a guessed integer type there
            # failed the whole file on a later decimal
            used = {self.time_column, *values}
            self._overrides.update({c: pl.String for c in schema if c not in used})
        else:
            values = [c for c in schema if c != self.time_column]
        strings = [c for c in values if schema[c] == pl.String]
        self._overrides.update({c: pl.Float64 for c in values if _is_numeric(schema[c])})
        if strings:
            try:
                head = (
                    self._scan(schema_overrides=self._overrides)
                    .head(_CSV_INFER_ROWS)
                    .select(strings)
                    .collect()
                )
            except _READ_ERRORS as exc:
                raise self._read_error(exc) from None
            # the CSV parser skips leading blanks before a number, the cast does not
            numbers = head.select(pl.col(strings).str.strip_chars_start().cast(pl.Float64, strict=False))
            for c in strings:
                text = head[c].filter(head[c].is_not_null() & numbers[c].is_null())
                if text.len():
                    self._not_a_number[c] = str(text[0])
                else:
                    self._overrides[c] = pl.Float64
        return {**schema, **self._overrides}

    def _missing(self, column: str, option: str, schema: dict[str, pl.DataType]) -> StoreError:
        present = ", ".join(repr(c) for c in schema) or "none"
        return StoreError(
            f"{str(self.path)!r} has no column {column!r} (columns: {present})",
            hint=f"name the right column with {option}.",
        )

    def _check_columns(self, schema: dict[str, pl.DataType]) -> None:
        if self.time_column not in schema:
            raise self._missing(self.time_column, "--time-column", schema)
        if self.fmt == "csv":
            # A CSV file with a header only has every column typed String: say it is empty instead.
            try:
                empty = self._scan(schema_overrides=self._overrides).head(1).collect().height == 0
            except _READ_ERRORS as exc:
                raise self._read_error(exc) from None
            if empty:
                if any("\r" in c for c in schema):
                    # lines ended by a carriage return alone (Excel for Mac's "CSV (Macintosh)"): polars reads
                    # the whole file as its header, and the file, rows and all, was left out as holding none
                    raise StoreError(
                        f"the lines of {str(self.path)!r} end with a carriage return alone (\\r, old Mac line "
                        "endings), which tsconv does not read: the whole file reads as its header",
                        hint="convert its line endings to \\n (or \\r\\n), e.g. `tr '\\r' '\\n' < in.csv > out.csv`, "
                        "or save it as 'CSV UTF-8'.",
                    )
                raise _NoRowsError(self.path)
        elif self._row_count() == 0:
            # a schema only: checked before its columns' types, which such a file need not carry (pandas'
            # DataFrame(columns=[...]) writes every column as Null), as a header-only CSV's are not
            raise _NoRowsError(self.path)
        if self.layout == "long":
            if self.feature_column not in schema:
                raise self._missing(self.feature_column, "--feature-column", schema)
            names = schema[self.feature_column]
            if names.is_nested() or isinstance(names, pl.Duration):
                # a struct's text ('{"AAPL",1}') became a feature's name, silently; a list failed the read
                # with a hint that the file was damaged
                raise StoreError(
                    f"feature column {self.feature_column!r} of {str(self.path)!r} holds {names}, not names",
                    hint="the feature column holds one name per row (strings, categories or integers); name "
                    "another column with --feature-column, or unnest the column first.",
                )
            for col in self.value_columns:
                if col not in schema:
                    raise self._missing(col, "--value-column", schema)
                if not _is_numeric(schema[col]):
                    raise StoreError(
                        f"value column {col!r} of {str(self.path)!r} is not numeric "
                        + self._what_type(col, schema[col]),
                        hint=self._missing_hint(col)
                        or "values must be numbers; name another column with --value-column.",
                    )
            return
        features = [c for c in schema if c != self.time_column]
        if "" in features:
            # checked before the store is written: every reader refuses a store with an empty feature name
            raise StoreError(
                f"column {list(schema).index('')} of {str(self.path)!r} has no name, and a wide file's columns "
                "besides the time column are features: likely a pandas index written by to_csv",
                hint="write the file with index=False (df.to_csv(path, index=False)), or name the column in "
                "the header.",
            )
        if not features:
            raise StoreError(
                f"{str(self.path)!r} has no feature columns besides {self.time_column!r}",
                hint="wide input has a time column plus one numeric column per feature; use --layout long "
                "for (time, feature, value) rows.",
            )
        bad = [c for c in features if not _is_numeric(schema[c])]
        if bad:
            raise StoreError(
                f"column {bad[0]!r} of {str(self.path)!r} is not numeric {self._what_type(bad[0], schema[bad[0]])}"
                + (f", nor are {len(bad) - 1} more" if len(bad) > 1 else ""),
                hint=self._missing_hint(bad[0])
                or "wide input has a time column plus numeric feature columns only; is this long input "
                "(--layout long)?",
            )

    def _row_count(self) -> int:
        """A Parquet or Arrow file's rows, from its metadata (polars counts them without reading the data)."""
        try:
            return int(self._scan().select(pl.len()).collect().item())
        except _READ_ERRORS as exc:
            raise self._read_error(exc) from None

    def _what_type(self, column: str, dtype: pl.DataType) -> str:
        """'(String)', or for a CSV value column typed String by a cell that is no number, that cell:
        '(it holds 'NA', which is no number)'."""
        text = self._not_a_number.get(column)
        return f"({dtype})" if text is None else f"(it holds {text[:40]!r}, which is no number)"

    def _missing_hint(self, column: str) -> str | None:
        """The hint for a CSV value column that a missing-value marker (R's NA, SQL's NULL) made String:
        the column is numbers, and told to name another column (or, wide, to read the file as long input),
        the user was sent the wrong way."""
        text = self._not_a_number.get(column)
        if text is None or text.strip().lower() not in _MISSING_MARKERS:
            return None
        return (
            f"tsconv reads an empty cell (or NaN) as a missing value, not {text.strip()!r}: write the file with "
            "empty cells for missing values (R: write.csv(..., na = ''); pandas' to_csv writes them), or "
            "convert it to Parquet first (polars: pl.read_csv(path, null_values=[...]).write_parquet(...))."
        )

    def _time_expr(self, dt: pl.DataType, unit: str) -> pl.Expr:
        c = pl.col(self.time_column)
        if isinstance(dt, pl.Datetime):
            return c.dt.epoch("ns")  # tz-aware columns are stored as UTC; naive ones are taken as UTC
        if dt == pl.Date:
            return c.cast(pl.Datetime("ns")).dt.epoch("ns")
        if dt.is_integer():
            return c.cast(pl.Int64) * _NS_PER[unit]
        if dt == pl.String:
            return c.str.to_datetime(time_unit="ns", time_zone="UTC").dt.epoch("ns")
        raise StoreError(
            f"time column {self.time_column!r} of {str(self.path)!r} has type {dt}, expected timestamps, "
            "integers or ISO 8601 strings",
            hint="store times as timestamps, or as integers with --time-unit.",
        )

    def band_filter(self, lo_ns: int, hi_ns: int) -> pl.Expr:
        """Rows with lo_ns <= time <= hi_ns, on the raw column where possible so that Parquet row-group
        statistics can skip the rest of the file."""
        dt, c = self.time_dtype, pl.col(self.time_column)
        if isinstance(dt, pl.Datetime):
            per = _NS_PER[dt.time_unit or "us"]
            lo, hi = -(-lo_ns // per), hi_ns // per
            return c.is_between(pl.lit(lo).cast(dt), pl.lit(hi).cast(dt))
        if dt.is_integer():
            per = _NS_PER[self.unit]
            return c.is_between(-(-lo_ns // per), hi_ns // per)
        return self.time_ns.is_between(lo_ns, hi_ns)

    def collect(self, lf: pl.LazyFrame) -> pl.DataFrame:
        try:
            return lf.collect(engine="streaming")
        except _READ_ERRORS as exc:
            raise self._read_error(exc) from None

    def batches(self, lf: pl.LazyFrame) -> Iterator[pl.DataFrame]:
        try:
            yield from lf.collect_batches(chunk_size=_BATCH_ROWS, maintain_order=True)
        except _READ_ERRORS as exc:
            raise self._read_error(exc) from None

    def distinct_times(self) -> np.ndarray:
        """Sorted distinct timestamps (int64 ns). Distinct raw values are converted, not every row."""
        raw = self.collect(self.lf.select(pl.col(self.time_column).unique()))
        if raw.height == 0:
            raise _NoRowsError(self.path)
        if raw[self.time_column].null_count():
            raise StoreError(
                f"time column {self.time_column!r} of {str(self.path)!r} has empty (null) values",
                hint="every row needs a timestamp.",
            )
        if self.time_dtype.is_integer():
            lim = np.iinfo(np.int64).max // _NS_PER[self.unit]
            col = raw[self.time_column]
            if col.max() > lim or col.min() < -lim:  # type: ignore[operator]
                raise StoreError(
                    f"integer times of {str(self.path)!r} overflow int64 nanoseconds as {self.unit}",
                    hint="pass the unit they count with --time-unit s|ms|us|ns.",
                )
        if self.time_dtype == pl.String:
            # polars guesses a format from the first value: "01/02/2024" (a US export) was read day first, as
            # 1 February, silently, unless a later day past 12 happened to be the one it guessed from
            odd = raw.filter(~pl.col(self.time_column).str.contains(_ISO_8601))
            if odd.height:
                raise StoreError(
                    f"time {odd[self.time_column][0]!r} in {str(self.path)!r} is not in the ISO 8601 form tsconv "
                    "reads (YYYY-MM-DD, then optionally THH:MM[:SS[.fraction]] and Z or +HH:MM)",
                    hint="write the times as ISO 8601, or parse them with their format first (polars: "
                    "str.to_datetime('%m/%d/%Y %H:%M'); pandas: to_datetime(..., format=...)) and write a "
                    "Parquet file.",
                )
            # polars takes the form of one time for the whole column: times with an offset (Z, +02:00) beside
            # times without one, both forms tsconv reads, failed the parse with the hint to write ISO 8601
            zoned = pl.col(self.time_column).str.extract(_ISO_8601, 4).is_not_null()
            forms = raw.select(pl.col(self.time_column).filter(zoned).first().alias("with"),
                               pl.col(self.time_column).filter(~zoned).first().alias("without"))  # fmt: skip
            with_offset, without = forms["with"][0], forms["without"][0]
            if with_offset is not None and without is not None:
                raise StoreError(
                    f"the time column {self.time_column!r} of {str(self.path)!r} holds times with an offset "
                    f"({with_offset!r}) and times without one ({without!r}), which are not read together",
                    hint="write every time with its offset (Z for UTC), or every time without one (read as UTC).",
                )
        try:
            # in ns, a string or date past 2262 wraps around silently, and a datetime column's cast gives null:
            # checked in us, naming the time
            c = pl.col(self.time_column)
            if self.time_dtype == pl.String:
                as_us = c.str.to_datetime(time_unit="us", time_zone="UTC").dt.epoch("us")
            elif self.time_dtype in (pl.Datetime, pl.Date):
                as_us = c.dt.epoch("us")
            else:
                as_us = None
            if as_us is not None:
                us = raw.lazy().select(c, as_us.alias(_T)).collect()
                lim = np.iinfo(np.int64).max // 1000
                out = us.filter((pl.col(_T) > lim) | (pl.col(_T) < -lim))
                if out.height:
                    # polars' own text of the time: a Python datetime holds no year past 9999
                    shown = out.head(1).select(pl.col(self.time_column).cast(pl.String))[self.time_column][0]
                    raise StoreError(
                        f"time {shown!r} in {str(self.path)!r} lies outside what int64 "
                        "nanoseconds since 1970 hold (1677-09-21 to 2262-04-11)",
                        hint="check the time column: tsconv stores times as int64 nanoseconds (numpy's datetime64[ns]).",
                    )
            ns = raw.lazy().select(self.time_ns.alias(_T)).collect()[_T]
        except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as exc:
            raise StoreError(
                f"cannot parse the time column {self.time_column!r} of {str(self.path)!r}: {first_line(exc)}",
                hint="times must be ISO 8601 strings (e.g. 2026-01-02T09:30:00.000001Z), timestamps or integers.",
            ) from None
        if ns.null_count():
            raise StoreError(f"cannot parse some times in column {self.time_column!r} of {str(self.path)!r}")
        return np.unique(ns.to_numpy())

    def distinct_features(self) -> list[str]:
        df = self.collect(self.lf.select(pl.col(self.feature_column).cast(pl.String).unique()))
        col = df[self.feature_column]
        if col.null_count() or (col == "").any():  # a store's empty feature name is refused by every reader
            raise StoreError(
                f"feature column {self.feature_column!r} of {str(self.path)!r} has empty (null) names",
                hint="every row needs a feature name.",
            )
        return col.to_list()


# ------------------------------------------------------------------------------------------ output


def _chunk_rows(features: int, itemsize: int) -> int:
    rows = max(1, _CHUNK_BYTES // (features * itemsize))
    return rows // 1024 * 1024 if rows >= 1024 else rows


def _codec() -> BloscCodec:
    return BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _check_output(out: Path, inputs: Sequence[Path], *, append: bool, overwrite: bool) -> None:
    for p in inputs:
        if p == out or p.is_relative_to(out):
            raise StoreError(
                f"output {str(out)!r} is, or contains, the input file {str(p)!r}",
                hint="choose an output path that is not one of the inputs.",
            )
    if append:
        if not out.exists():
            raise StoreError(
                f"cannot append: store {str(out)!r} does not exist", hint="drop --append to create it."
            )
        if not is_zarr_store(out):
            raise StoreError(f"cannot append: {str(out)!r} is not a zarr store")
        return
    if out.exists() or out.is_symlink():
        if not is_zarr_store(out):
            raise StoreError(
                f"output path {str(out)!r} exists and is not a zarr store; refusing to replace it",
                hint="remove it yourself or choose another --output.",
            )
        if not overwrite:
            raise OutputExistsError(
                f"output store {str(out)!r} already exists",
                hint="pass --overwrite to replace it or --append to add later rows to it.",
            )


def _scatter_last(buf: np.ndarray, flat: np.ndarray, values: np.ndarray) -> None:
    """buf.flat[flat] = values where, for a repeated index, the last value wins.

    numpy leaves the winner of a repeated index in a fancy assignment unspecified, so duplicates are
    resolved explicitly: a stable sort keeps equal indices in row order and the last of each run is kept.
    """
    order = np.argsort(flat, kind="stable")
    s = flat[order]
    keep = np.empty(s.shape[0], dtype=bool)
    keep[:-1] = s[1:] != s[:-1]
    keep[-1:] = True
    if keep.all():
        buf.reshape(-1)[flat] = values
    else:
        sel = order[keep]
        buf.reshape(-1)[flat[sel]] = values[sel]


def _last_rows(rows: np.ndarray) -> np.ndarray:
    """Positions of the last occurrence of each row index, for wide input with repeated timestamps."""
    order = np.argsort(rows, kind="stable")
    s = rows[order]
    keep = np.empty(s.shape[0], dtype=bool)
    keep[:-1] = s[1:] != s[:-1]
    keep[-1:] = True
    return order[keep]


def feature_name(symbol: str, column: str, value_columns: Sequence[str]) -> str:
    """The feature of ``symbol``'s ``column`` in long input: the symbol alone with one value column, else
    ``symbol.column``."""
    return symbol if len(value_columns) == 1 else f"{symbol}.{column}"


def _fill_band(buf: np.ndarray, times: np.ndarray, sources: Sequence[_Source], symbols: Sequence[str],
               col_index: dict[str, int], layout: str) -> int:  # fmt: skip
    """Fill ``buf`` (NaN-initialised, one row per timestamp in ``times``) from every file; input rows read.
    ``symbols``: long input's distinct feature-column values, every one of them in the files."""
    lo, hi = int(times[0]), int(times[-1])
    n_features = buf.shape[1]
    read = 0
    enum = pl.Enum(list(symbols))
    for src in sources:  # files in sorted order, so a later file overwrites an earlier one
        lf = src.lf.filter(src.band_filter(lo, hi))
        if layout == "long":
            vcols = src.value_columns
            # the output column of (symbol code, value column j)
            out_col = np.array(
                [[col_index[feature_name(s, c, vcols)] for c in vcols] for s in symbols], dtype=np.int64
            ).reshape(len(symbols), len(vcols))
            lf = lf.select(
                src.time_ns.alias(_T),
                # an Enum's physical code is the symbol's position in ``symbols``
                pl.col(src.feature_column).cast(pl.String).cast(enum).to_physical().alias(_F),
                *[pl.col(c).cast(src.dtype).alias(f"{_V}{j}") for j, c in enumerate(vcols)],
            )
            for batch in src.batches(lf):
                if batch.height == 0:
                    continue
                read += batch.height
                rows = np.searchsorted(times, batch[_T].to_numpy()) * n_features
                codes = batch[_F].to_numpy().astype(np.int64)
                # one block per value column, each in row order: a repeated cell's last value still wins
                flat = np.concatenate([rows + out_col[codes, j] for j in range(len(vcols))])
                vals = np.concatenate([batch[f"{_V}{j}"].to_numpy() for j in range(len(vcols))])
                _scatter_last(buf, flat, vals)
        else:
            cols = src.features_in_file
            idx = np.array([col_index[c] for c in cols], dtype=np.int64)
            contiguous = idx.size == n_features and bool((idx == np.arange(n_features)).all())
            lf = lf.select(src.time_ns.alias(_T), *[pl.col(c).cast(src.dtype) for c in cols])
            for batch in src.batches(lf):
                if batch.height == 0:
                    continue
                read += batch.height
                rows = np.searchsorted(times, batch[_T].to_numpy())
                vals = batch.select(cols).to_numpy().astype(buf.dtype, copy=False)
                last = _last_rows(rows)
                if last.size != rows.size:
                    rows, vals = rows[last], vals[last]
                if contiguous:
                    buf[rows] = vals
                else:
                    buf[np.ix_(rows, idx)] = vals
    return read


def _write_rows(values: zarr.Array, time_arr: zarr.Array, start: int, times: np.ndarray,
                sources: Sequence[_Source], names: Sequence[str], symbols: Sequence[str], layout: str,
                bar: Any) -> int:  # fmt: skip
    """Write ``times`` and their values at rows ``start..``, band by band; return the input rows read.
    ``names``: the store's features in order; ``symbols``: long input's (see :func:`_fill_band`)."""
    n_features = len(names)
    itemsize = np.dtype(values.dtype).itemsize
    crows = int(values.chunks[0])
    band = crows * max(1, _BAND_BYTES // (crows * n_features * itemsize))
    col_index = {n: j for j, n in enumerate(names)}
    buf = np.empty((min(band, times.size), n_features), dtype=values.dtype)
    read = 0
    # Bands end on chunk boundaries of the store, so every write but an append's first covers whole chunks.
    a = 0
    while a < times.size:
        b = min(times.size, a + band - (start + a) % crows)
        part = buf[: b - a]
        part.fill(np.nan)
        read += _fill_band(part, times[a:b], sources, symbols, col_index, layout)
        values[start + a : start + b] = part
        time_arr[start + a : start + b] = times[a:b]
        bar.update(b - a)
        a = b
    return read


def _new_store(path: Path, *, times: np.ndarray, names: Sequence[str], dtype: str, attrs: dict[str, Any]) -> tuple[zarr.Array, zarr.Array, zarr.Group]:  # fmt: skip
    # Chunks of the full size even for a first ingest with fewer rows: the chunk grid is fixed at creation,
    # and a 10-row first day grew by --append to 200,010 rows in 20,001 chunk files.
    crows = _chunk_rows(len(names), np.dtype(dtype).itemsize)
    group = zarr.open_group(zarr.storage.LocalStore(path), mode="w-", zarr_format=3)
    values = group.create_array(
        "values",
        shape=(times.size, len(names)),
        chunks=(crows, len(names)),
        dtype=dtype,
        compressors=[_codec()],
        fill_value=np.nan,
        dimension_names=("time", "feature"),
    )
    time_arr = group.create_array(
        "time",
        shape=(times.size,),
        chunks=(crows,),
        dtype="int64",
        compressors=[_codec()],
        fill_value=0,
        dimension_names=("time",),
    )
    group.attrs.update({"features": list(names), **attrs})
    return values, time_arr, group


# -------------------------------------------------------------------------------------------- main


def _value_columns(value_column: str | Sequence[str], *, layout: str, time_column: str, feature_column: str) -> tuple[str, ...]:  # fmt: skip
    """The value columns as a tuple of distinct names, checked (and, for long input, that the feature column
    is not the time column)."""
    cols = (value_column,) if isinstance(value_column, str) else tuple(value_column)
    if not cols or not all(isinstance(c, str) and c for c in cols):
        raise StoreError(
            f"value_column must be a column name or a list of them, got {value_column!r}",
            hint="name the value column(s) with --value-column (repeat it for several).",
        )
    if dups := repeated_names(cols):
        raise StoreError(
            f"the value column {dups[0]!r} is given more than once", hint="name each value column once."
        )
    if layout == "long":
        if feature_column == time_column:
            raise StoreError(
                f"the feature column {feature_column!r} is also the time column",
                hint="name the column of symbols (feature names) with --feature-column.",
            )
        for c in cols:
            if c in (time_column, feature_column):
                raise StoreError(
                    f"the value column {c!r} is also the {'time' if c == time_column else 'feature'} column",
                    hint="name a column of numbers with --value-column.",
                )
    return cols


def _refuse_url(output: object) -> None:
    """ingest and repair write local stores only: a URL would otherwise be taken as a relative path; and a path
    of '' (an unset variable) would be the current directory."""
    if isinstance(output, str) and output == "":
        raise StoreError(
            "output '' names no store (as a path it means the current directory)",
            hint="pass the store's path; in a script, check that the variable it comes from is set.",
        )
    if is_url(output):
        raise StoreError(
            f"{shown(output)!r}: tsconv ingest and repair write local stores only, not object stores",
            hint="ingest into a local store, then copy it (or run tsconv process on it straight to the URL).",
        )


def ingest(
    files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    layout: str = "long",
    time_column: str = "time",
    feature_column: str | None = None,
    value_column: str | Sequence[str] | None = None,
    append: bool = False,
    overwrite: bool = False,
    dtype: str | None = None,
    time_unit: str | None = None,
    progress: bool = False,
) -> IngestReport:
    """Ingest Parquet/CSV/Arrow IPC files (paths or globs) into the zarr store ``output``.

    A new store is built under a temporary name beside ``output`` and renamed into place when complete.
    ``append`` adds rows strictly after the store's last time (the store's dtype and feature order are
    kept); see the module docstring for the rules on duplicates, ordering and time zones. Long input:
    ``feature_column`` (default ``feature``) names the symbols; ``value_column`` (default ``value``) is one
    column, or several (a list), which name the features ``symbol.column``. Both are refused for wide input.
    ``dtype``: the values' dtype, float32 (the default for a new store) or float64; an append keeps the
    store's and refuses another. Storing float64 source values as float32 warns where that rounding moves them
    by more than :data:`tsconv.io.precision.WARN_AT` of their typical step. ``time_unit``: the unit of integer
    time columns (default ns); refused where no file's time column holds integers.
    """
    t0 = time.perf_counter()
    if layout not in ("long", "wide"):
        raise StoreError(f"layout must be 'long' or 'wide', got {layout!r}", hint="use --layout long|wide.")
    if dtype is not None and dtype not in ("float32", "float64"):
        raise StoreError(f"dtype must be float32 or float64, got {dtype!r}", hint="use --dtype float32.")
    unit_given, time_unit = time_unit is not None, time_unit or "ns"
    if time_unit not in _NS_PER:
        raise StoreError(
            f"time unit must be one of s, ms, us, ns, got {time_unit!r}", hint="use --time-unit ns."
        )
    if append and overwrite:
        raise StoreError(
            "--append and --overwrite exclude each other",
            hint="--append adds rows to the store; --overwrite replaces it.",
        )
    if layout == "wide":
        for name, given in (("feature_column", feature_column), ("value_column", value_column)):
            if given is not None:
                flag = "--" + name.replace("_", "-")
                raise StoreError(
                    f"{name}={given!r} applies to long input only, not to layout='wide' (where every column but "
                    "the time column is a feature)",
                    hint=f"leave {name} out ({flag} at the command line), or ingest long input (--layout long).",
                )
    feature_column = "feature" if feature_column is None else feature_column
    value_column = "value" if value_column is None else value_column
    value_columns = _value_columns(value_column, layout=layout, time_column=time_column,
                                   feature_column=feature_column)  # fmt: skip
    paths = expand_files([files] if isinstance(files, str | os.PathLike) else files)
    _refuse_url(output)
    # resolved: one store reached through a symlink is the same store, under the same lock; a file:// URL is
    # its path (Path() made file:///d/t.zarr the relative folder 'file:/d/t.zarr')
    out = location(output).resolve()
    _check_output(out, paths, append=append, overwrite=overwrite)

    pl_dtype = pl.Float64 if dtype == "float64" else pl.Float32
    sources: list[_Source] = []
    empty: list[_NoRowsError] = []  # files with a header or schema only: they add nothing
    for p in paths:
        try:
            sources.append(_Source(p, layout=layout, time_column=time_column, feature_column=feature_column,
                                   value_columns=value_columns, time_unit=time_unit, dtype=pl_dtype))  # fmt: skip
        except _NoRowsError as exc:
            empty.append(exc)
    # Pass 1: distinct timestamps (small next to the data); a file whose scan finds no rows adds nothing
    distinct: list[np.ndarray] = []
    with_rows: list[_Source] = []
    for src in sources:
        try:
            distinct.append(src.distinct_times())
        except _NoRowsError as exc:
            empty.append(exc)
            continue
        with_rows.append(src)
    sources = with_rows
    if empty and not sources:
        if not append:
            raise empty[0]
        return _nothing_to_append(out, files=len(paths), t0=t0)
    if empty:
        # a daily job's glob that takes in a holiday's file (a header only) goes on with the others
        warnings.warn(
            f"left out {len(empty)} of {len(paths)} input files that hold no rows (first {str(empty[0].path)!r})",
            TsconvWarning,
            stacklevel=2,
        )

    if unit_given and not any(s.time_dtype.is_integer() for s in sources):
        # it counts integers only: datetimes and ISO text carry their own unit, and the option did nothing
        raise StoreError(
            f"--time-unit {time_unit} applies to integer time columns, and the time column of "
            f"{str(sources[0].path)!r} holds {sources[0].time_dtype}",
            hint="leave --time-unit out (time_unit= in Python): these times carry their own unit.",
        )
    if layout == "wide" and (indexed := [s for s in sources if s.index_columns]):
        cols = dict.fromkeys(c for s in indexed for c in s.index_columns)
        warnings.warn(
            f"left out the pandas index column(s) {', '.join(map(repr, cols))} of {len(indexed)} file(s) "
            f"(first {str(indexed[0].path)!r}): an index is not a feature; write with index=False (pandas) "
            "to leave it out of the file",
            TsconvWarning,
            stacklevel=2,
        )
    cut = [(s.path, line) for s in sources if s.fmt == "csv" and (line := _cut_short_csv(s.path)) is not None]
    if cut:
        warnings.warn(
            f"{len(cut)} CSV file(s) do not end with a line break (first {str(cut[0][0])!r}, whose last line "
            f"reads {cut[0][1]!r}): a file whose writer stopped mid-write ends so, and its cut last row is "
            "ingested as it reads; check that the file is complete (a file written in full ends with a line break)",
            TsconvWarning,
            stacklevel=2,
        )
    times = np.unique(np.concatenate(distinct))
    if time_unit == "ns" and any(s.time_dtype.is_integer() for s in sources):
        _warn_early_integers(times)
    symbols: list[str] = []
    if layout == "long":
        symbols = sorted({n for s in sources for n in s.distinct_features()})
        names = [feature_name(s, c, value_columns) for s in symbols for c in value_columns]
        if dups := repeated_names(names):
            raise StoreError(
                f"the features named symbol.column repeat ({describe_repeats(names, dups)})",
                hint="a symbol contains a dot and the name of a value column: rename the symbol or the column.",
            )
    else:
        seen: dict[str, None] = {}
        for s in sources:
            seen.update(dict.fromkeys(s.features_in_file))
        names = list(seen)
    if (bad := control_name(names)) is not None:
        raise StoreError(
            f"the feature name {bad!r} holds a control character", hint="rename the symbol or the column."
        )

    if append:
        return _append(out, paths, sources, times, names, symbols, layout, progress, t0, dtype=dtype)
    dtype = dtype or "float32"
    if dtype == "float32":
        _warn_rounding(sources)

    attrs = {"ingest": {"complete": False, "rows": int(times.size), "layout": layout, "version": INGEST_VERSION,
                        "files": [str(p) for p in paths]}}  # fmt: skip
    if layout == "long":
        attrs["ingest"]["value_columns"] = list(value_columns)
    tmp = out.with_name(f".{out.name}.ingest-{os.getpid()}")
    aside = out.with_name(f".{out.name}.ingest-{os.getpid()}.old")  # the replaced store, deleted last
    out.parent.mkdir(parents=True, exist_ok=True)
    # One ingest into an output at a time; while this one holds it, a temporary store of an earlier ingest
    # into the same output can only be a killed run's leftover (its name holds a dead process's id).
    with OutputLock(out, run_id=f"ingest-{os.getpid()}"):
        for stale in out.parent.glob(f".{glob.escape(out.name)}.ingest-*"):
            shutil.rmtree(stale, ignore_errors=True)
        try:
            values, time_arr, group = _new_store(tmp, times=times, names=names, dtype=dtype, attrs=attrs)
            with progress_bar(total=times.size, enabled=progress, desc="ingest") as bar:
                read = _write_rows(values, time_arr, 0, times, sources, names, symbols, layout, bar)
            group.attrs["ingest"] = {**attrs["ingest"], "complete": True}
            if (
                out.exists() or out.is_symlink()
            ):  # only a zarr store gets here (checked above), with overwrite
                if _exchange(tmp, out):  # one step: the output path never lacks a store
                    aside = tmp
                else:
                    # renamed aside first, then deleted: a kill while deleting it in place left a half-deleted
                    # store at the output path, its attributes still saying complete, and the new one removed
                    # as a leftover by the next ingest
                    os.replace(out, aside)
                    os.replace(tmp, out)
            else:
                os.replace(tmp, out)
        except BaseException as exc:
            if (aside.exists() or aside.is_symlink()) and not (out.exists() or out.is_symlink()):
                os.replace(aside, out)  # interrupted between the two renames: the old store back
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, OSError):
                raise _write_error(
                    f"the new store {str(out)!r}",
                    exc,
                    then="rerun the command (no store was made; one already at the output is kept)",
                ) from exc
            raise
        if aside.is_symlink():
            aside.unlink()
        elif aside.exists():
            shutil.rmtree(aside, ignore_errors=True)  # what is left, the next ingest into it removes
    return _report(times.size, len(names), t0, out, read, len(paths), appended=False)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the entries at ``a`` and ``b`` in one step (Linux's ``renameat2(RENAME_EXCHANGE)``, which Python
    does not wrap); False where the system or the filesystem cannot, the caller then renaming twice. Two
    renames leave a moment with nothing at ``b``: an ingest --overwrite killed there left no store at the
    output path, and the next ingest deleted both the old one and the new one as leftovers."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):  # not on this filesystem
        return False
    raise OSError(err, os.strerror(err), str(b))


def _report(rows: int, features: int, t0: float, out: Path, read: int, files: int, *, appended: bool) -> IngestReport:  # fmt: skip
    seconds = time.perf_counter() - t0
    return IngestReport(
        rows=int(rows),
        features=int(features),
        seconds=seconds,
        rows_per_s=read / seconds if seconds > 0 else 0.0,
        peak_rss_bytes=_peak_rss(),
        output=str(out),
        input_rows=int(read),
        files=files,
        appended=appended,
    )


def _nothing_to_append(out: Path, *, files: int, t0: float) -> IngestReport:
    """The report of an ``--append`` whose files all hold no rows: the store is left as it is, but for the
    roll-back of an interrupted append that every ``--append`` makes first (:func:`_append`)."""
    with OutputLock(out, run_id=f"ingest-append-{os.getpid()}"):
        group = _open_group(out)
        if _roll_back(out, group) is None:
            _remove_metadata_temporaries(out)
        store = open_input(out)
    return IngestReport(rows=0, features=store.n_features, seconds=time.perf_counter() - t0, rows_per_s=0.0,
                        peak_rss_bytes=_peak_rss(), output=str(out), input_rows=0, files=files,
                        appended=True)  # fmt: skip


def _append(out: Path, paths: Sequence[Path], sources: Sequence[_Source], times: np.ndarray,
            names: Sequence[str], symbols: Sequence[str], layout: str, progress: bool, t0: float, *,
            dtype: str | None) -> IngestReport:  # fmt: skip
    """Append rows to an existing store. Everything is checked before the first write.

    Crash safety (a kill at any instant): the attribute ``ingest`` is set to ``complete: false`` with
    ``rows_before`` (the committed rows) before either array is resized, and back to ``complete: true``
    only after both arrays are resized and every new row is written. Until then readers refuse the store
    (:func:`tsconv.io.store.open_input`) and the next ``--append`` or :func:`repair` cuts both arrays back
    to ``rows_before``, whatever their lengths, so the old rows are never touched.
    """
    with OutputLock(out, run_id=f"ingest-append-{os.getpid()}"):  # a repair must not cut a running append
        group = _open_group(out)
        if _roll_back(out, group) is None:
            _remove_metadata_temporaries(out)
        return _append_locked(
            out, group, paths, sources, times, names, symbols, layout, progress, t0, dtype=dtype
        )


def _append_locked(out: Path, group: zarr.Group, paths: Sequence[Path], sources: Sequence[_Source],
                   times: np.ndarray, names: Sequence[str], symbols: Sequence[str], layout: str, progress: bool,
                   t0: float, *, dtype: str | None) -> IngestReport:  # fmt: skip
    meta = dict(group.attrs.get("ingest", {}))
    store = open_input(out, allow_incomplete=True)
    if store.time is None:
        raise StoreError(f"cannot append to {str(out)!r}: it has no 'time' array")
    if not store.time.plain or store.values.basename != "values" or store.time.array.basename != "time":
        # e.g. a store written by xarray: new rows would be written in tsconv's encoding
        raise StoreError(
            f"cannot append to {str(out)!r}: it is not in tsconv's own layout ('values', and 'time' as int64 "
            f"ns; its time is {store.time.coding.description})",
            hint="append to a store made by `tsconv ingest`, or write the combined series with the tool that made it.",
        )
    old_rows = store.rows
    last = int(np.asarray(store.time[old_rows - 1])) if old_rows else None
    if last is not None and times[0] <= last:
        raise StoreError(
            f"cannot append: the new times start at {iso_utc(int(times[0]))}, not after the store's last time "
            f"{iso_utc(last)} ({int(np.searchsorted(times, last, side='right')):,} new timestamps are not later)",
            hint="append only rows later than the store's last time; re-ingest everything to insert earlier rows.",
        )
    recorded = meta.get("value_columns")
    given = list(sources[0].value_columns)
    if layout == "long" and isinstance(recorded, list) and sorted(recorded) != sorted(given):
        raise StoreError(
            f"cannot append: {str(out)!r} was ingested with the value column(s) {', '.join(map(repr, recorded))}, "
            f"not {', '.join(map(repr, given))}",
            hint="append with the same --value-column options as the store was made with.",
        )
    known = set(store.features)
    new = [n for n in names if n not in known]
    if new:
        shown = ", ".join(repr(n) for n in new[:5]) + (f" and {len(new) - 5} more" if len(new) > 5 else "")
        raise StoreError(
            f"cannot append: {len(new)} feature(s) not in {str(out)!r}: {shown}",
            hint="a store's features are fixed; re-ingest all files into a new store to add features.",
        )
    store_names = list(store.features)
    values, time_arr = group["values"], group["time"]
    held = np.dtype(values.dtype).name
    if held not in ("float32", "float64"):
        # the rows are read as float32 with NaN for a missing cell: an integer array cannot hold a NaN (a
        # traceback, after the store was marked) and truncates 1.5 to 1; float16 turns 70000 into inf
        raise StoreError(
            f"cannot append to {str(out)!r}: it holds {held} values, and an append writes float32 or float64 "
            "(NaN where a time has no value for a feature)",
            hint="ingest all the files into a new store (float32, or --dtype float64), or store the values "
            "as float32 or float64 first.",
        )
    if dtype is not None and dtype != held:
        raise StoreError(
            f"cannot append with --dtype {dtype}: {str(out)!r} holds {held} values, which an append keeps",
            hint="leave --dtype out to append in the store's dtype, or ingest everything into a new store.",
        )
    for s in sources:  # values are read in the store's precision (float64 only when the store has it)
        s.dtype = pl.Float64 if held == "float64" else pl.Float32
    if held == "float32":
        _warn_rounding(
            sources, stacklevel=5
        )  # ingest -> _append -> _append_locked -> here: the caller's line
    total = old_rows + int(times.size)
    marker = {**meta, "complete": False, "rows_before": old_rows, "rows": total}
    consolidated = _has_consolidated(out)
    if (
        consolidated
    ):  # written again from the arrays' own metadata once the append is committed or rolled back
        marker["consolidated"] = True
    # Every check passed: from here on the store changes. The marker goes first, the commit last.
    try:
        group.attrs["ingest"] = marker
        values.resize((total, values.shape[1]))
        time_arr.resize((total,))
        with progress_bar(total=times.size, enabled=progress, desc="append") as bar:
            read = _write_rows(values, time_arr, old_rows, times, sources, store_names, symbols, layout, bar)
        group.attrs["ingest"] = {**meta, "complete": True, "rows": total, "version": INGEST_VERSION}
    except Exception as exc:
        # An error while writing (e.g. a bad value deep in a CSV file): take the new rows away again.
        try:
            _roll_back(out, group)
        except Exception:
            if not isinstance(exc, OSError):
                raise
            # on a full disk the roll back's own metadata write can fail too: the record stays for repair
            then = f"`tsconv repair {shlex.quote(str(out))}` (or append again) to cut it back to its {old_rows:,} rows"
            raise _write_error(f"the appended rows of {str(out)!r}", exc, then=then) from exc
        if isinstance(exc, OSError):
            then = f"append again (the store was rolled back to its {old_rows:,} rows)"
            raise _write_error(f"the appended rows of {str(out)!r}", exc, then=then) from exc
        raise
    if consolidated:
        _consolidate(out, group)
    return _report(times.size, len(store_names), t0, out, read, len(paths), appended=True)


# Value column types float32 does not hold: their values are judged before they are stored as float32.
_WIDE_TYPES = (pl.Float64, pl.Int32, pl.Int64, pl.UInt32, pl.UInt64, pl.Int128, pl.UInt128, pl.Decimal)
_SAMPLE_FILES, _SAMPLE_ROWS = 16, 20_000


def _warn_early_integers(times: np.ndarray) -> None:
    """Warn where integer times taken as ns all lie within a year of the epoch: epoch seconds,
    milliseconds or microseconds ingested without their unit."""
    lo, hi = int(times[0]), int(times[-1])
    if looks_early(lo, hi):
        warnings.warn(
            "the integer times, read as nanoseconds (--time-unit ns, the default), all lie within a year of "
            f"1970-01-01: {iso_utc(lo)} .. {iso_utc(hi)}; if they count seconds, milliseconds or microseconds since the "
            "epoch, ingest again with --time-unit s, ms or us (time_unit= in Python)",
            TsconvWarning,
            stacklevel=3,
        )


def _warn_rounding(sources: Sequence[_Source], *, stacklevel: int = 3) -> None:
    """Warn, once, where storing source values as float32 moves them by more than WARN_AT of their typical
    step: judged on the first rows of each of the first files, per symbol of long input and per column of
    wide input, in time order (a sample: the values are cast as they are read, band by band)."""
    context = "the source values are {dtype} and the store's float32 (--dtype, dtype= in Python)"
    advice = "--dtype float64 (dtype='float64') keeps them"
    for source in sources[:_SAMPLE_FILES]:
        long = source.layout == "long"
        cols = [c for c in (source.value_columns if long else source.features_in_file)
                if source.schema.get(c) in _WIDE_TYPES]  # fmt: skip
        if not cols:
            continue
        if not long:
            try:
                message = float32_loss_in_blocks(_wide_blocks(source, cols), context=context, advice=advice)
            except _READ_ERRORS:
                return  # a file the ingest cannot read: its own read says why, naming the file
        else:
            try:
                df = (
                    source.lf.select(
                        source.time_ns.alias("__t"),
                        pl.col(source.feature_column).cast(pl.String),
                        *(pl.col(c).cast(pl.Float64) for c in cols),
                    )
                    .head(_SAMPLE_ROWS)
                    .collect()
                    .sort("__t")
                )
            except _READ_ERRORS:
                return
            values = df.select(cols).to_numpy().astype(np.float64)
            # each symbol's rows together, in time order; symbols in the order they first appear
            symbols = df[source.feature_column].to_numpy().astype(str)
            seen, first, inverse = np.unique(symbols, return_index=True, return_inverse=True)
            by_first = np.argsort(first)
            rank = np.empty(seen.size, dtype=np.int64)
            rank[by_first] = np.arange(seen.size)
            groups = rank[inverse.reshape(-1)]
            order = np.argsort(groups, kind="stable")
            values, groups = values[order], groups[order]
            names = [feature_name(str(sym), c, source.value_columns) for sym in seen[by_first] for c in cols]
            # every symbol in one pass (one check per symbol took 6.9 s for 16 files of 10,000 symbols)
            message, _ = float32_loss_by_feature(values, names, context=context, advice=advice, groups=groups)
        if message is not None:
            warnings.warn(message, TsconvWarning, stacklevel=stacklevel)
            return


# Cells of a wide file's rounding sample (128 MB of float64): its rows shrink with its width past 838 columns
# (to at least 1,024, the rows the readers' checks take); its columns go through the check a block of
# _BLOCK_CELLS at a time, whose copies there are a few times its 8 MB
_SAMPLE_CELLS = 16 << 20
_SAMPLE_MIN_ROWS = 1024
_BLOCK_CELLS = 1 << 20


def _wide_blocks(source: _Source, cols: list[str]) -> Iterator[tuple[np.ndarray, list[str]]]:
    """The first rows of ``cols`` of a wide file, in time order, a block of columns at a time: a file of
    8,000 float64 columns had its 20,000 rows judged at once, 9.2 GB with the check's copies, where the
    ingest itself holds one band."""
    rows = max(_SAMPLE_MIN_ROWS, min(_SAMPLE_ROWS, _SAMPLE_CELLS // len(cols)))
    df = (
        source.lf.select(source.time_ns.alias("__t"), *(pl.col(c).cast(pl.Float64) for c in cols))
        .head(rows)
        .collect()
    )
    order = np.argsort(df["__t"].to_numpy(), kind="stable")
    per = max(1, _BLOCK_CELLS // max(len(df), 1))
    for i in range(0, len(cols), per):
        block = cols[i : i + per]
        yield df.select(block).to_numpy().astype(np.float64)[order], block


def repair(output: str | os.PathLike[str]) -> int | None:
    """Roll back an interrupted ``tsconv ingest --append`` on ``output``: cut ``values`` and ``time``
    back to the rows committed before it. Returns those rows, or None when there was nothing to repair."""
    _refuse_url(output)
    out = location(output).resolve()  # as ingest locks it, through any symlink
    if not out.exists():
        raise StoreError(f"cannot repair: store {str(out)!r} does not exist", hint="check the path.")
    if not is_zarr_store(out):
        raise StoreError(f"cannot repair: {str(out)!r} is not a zarr store")
    with OutputLock(out, run_id=f"ingest-repair-{os.getpid()}"):
        try:
            group = _open_group(out)
        except Exception as exc:
            raise StoreError(f"cannot repair {str(out)!r}: it is not a zarr group ({exc})") from None
        kept = _roll_back(out, group)
        if kept is None:
            _remove_metadata_temporaries(out)
            _check_lengths(out, group)
        return kept


def _check_lengths(out: Path, group: zarr.Group) -> None:
    """Refuse a store whose arrays disagree without the record of an interrupted append."""
    arrays = dict(group.arrays())
    if (
        "values" in arrays
        and "time" in arrays
        and arrays["time"].ndim  # a scalar time coordinate (xarray's) is not the rows' times
        and arrays["values"].shape[0] != arrays["time"].shape[0]
    ):
        raise StoreError(
            f"cannot repair {str(out)!r}: 'values' has {arrays['values'].shape[0]:,} rows and 'time' "
            f"{arrays['time'].shape[0]:,}, but the store holds no record of an interrupted `tsconv ingest "
            "--append` that says which rows are complete",
            hint="re-create the store from its source files (`tsconv ingest FILES -o STORE --overwrite`).",
        )


def _roll_back(out: Path, group: zarr.Group) -> int | None:
    """Cut both arrays back to the committed rows when an append did not finish; the committed rows, or
    None when none was pending. Safe to interrupt: the record of the append is cleared last."""
    keep = interrupted_append(group.attrs)
    if keep is None:
        return None
    values, time_arr = (_append_array(out, group, key, keep) for key in ("values", "time"))
    shortest = min(int(values.shape[0]), int(time_arr.shape[0]))
    if keep > shortest:  # the committed rows are gone: nothing here can bring them back
        raise StoreError(
            f"cannot repair {str(out)!r}: an interrupted append recorded {keep:,} committed rows, but "
            f"'values' has {values.shape[0]:,} and 'time' {time_arr.shape[0]:,}",
            hint="re-create the store from its source files (`tsconv ingest FILES -o STORE --overwrite`).",
        )
    if values.shape[0] != keep:
        values.resize((keep, values.shape[1]))
    if time_arr.shape[0] != keep:
        time_arr.resize((keep,))
    _remove_partial_files(out)
    meta = dict(group.attrs["ingest"])
    meta.pop("rows_before")
    consolidated = meta.pop("consolidated", False)
    group.attrs["ingest"] = {**meta, "complete": True, "rows": keep}
    if consolidated is True:
        _consolidate(out, group)
    return keep


def _open_group(out: Path) -> zarr.Group:
    """The store's root group to append to or repair, its arrays read from their own metadata: a consolidated
    copy (zarr.consolidate_metadata, xarray) is stale once rows were appended, and gave the arrays' lengths
    before them (a later interrupted append was refused as having lost its committed rows)."""
    return zarr.open_group(str(out), mode="r+", use_consolidated=False)


def _has_consolidated(out: Path) -> bool:
    """Whether the store holds consolidated metadata: in its root zarr.json (format 3) or .zmetadata (2)."""
    if (out / ".zmetadata").is_file():
        return True
    try:
        doc = json.loads((out / "zarr.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("consolidated_metadata") is not None


def _consolidate(out: Path, group: zarr.Group) -> None:
    """Write the store's consolidated metadata again, from its arrays' own (their new lengths): readers that
    use it (xarray by default) saw the rows before the append only."""
    write_consolidated(out, zarr_format=group.metadata.zarr_format)


def _append_array(out: Path, group: zarr.Group, key: str, keep: int) -> zarr.Array:
    """The array ``key`` of a store to roll back, refused (before anything is changed) where it is missing
    or its metadata cannot be read: then no cut can make the store whole."""
    hint = (
        f"restore {str(out / key)!r} from a copy of the store, then run `tsconv repair {shlex.quote(str(out))}` again (the rows "
        f"committed before the append: {keep:,}); or re-create the store from its source files "
        "(`tsconv ingest FILES -o STORE --overwrite`)."
    )
    try:
        node = group[key]
    except KeyError:
        raise StoreError(
            f"cannot roll back the interrupted append to {str(out)!r}: it has no {key!r} array", hint=hint
        ) from None
    except Exception as exc:  # noqa: BLE001 - its zarr.json / .zarray damaged (JSON, shape, dtype)
        raise StoreError(
            f"cannot roll back the interrupted append to {str(out)!r}: the metadata of its {key!r} array "
            f"cannot be read ({type(exc).__name__}: {first_line(exc)})"[:500],
            hint=hint,
        ) from None
    if not isinstance(node, zarr.Array):
        raise StoreError(f"cannot repair {str(out)!r}: {key!r} is a group, not an array", hint=hint)
    return node


def _write_error(what: str, exc: OSError, *, then: str) -> StoreError:
    """A failed write (a full disk, most often) with the store it was for and what to do next."""
    space = disk_advice(exc)
    return StoreError(f"cannot write {what}: {first_line(exc)}", hint=f"{space}, then {then}.")


def _remove_partial_files(out: Path) -> None:
    # zarr writes every file under a temporary name and renames it into place: a killed write leaves that
    # temporary file behind ('<name>.<32 hex>.partial'), which nothing reads.
    for p in out.rglob("*.partial"):
        tag = p.name[: -len(".partial")].rsplit(".", 1)[-1]
        if len(tag) == 32 and all(c in "0123456789abcdef" for c in tag) and p.is_file():
            p.unlink()


def _remove_metadata_temporaries(out: Path) -> None:
    # With no append pending, a killed append can only have died writing its marker into the root's
    # zarr.json (before that nothing is written): its temporary file makes zarr warn on every later open.
    # Only the root and the arrays' directories are searched, so an append's cost does not grow with the
    # chunk files (listing the group's members is what warns).
    for node in [out, *(Path(e.path) for e in os.scandir(out) if e.is_dir(follow_symlinks=False))]:
        for entry in os.scandir(node):
            if is_metadata_temporary(entry.name) and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)


def _iso(ns: int) -> str:
    return str(np.datetime64(ns, "ns")) + "Z"
