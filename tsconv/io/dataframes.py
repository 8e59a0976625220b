"""In-memory frames (polars, pandas, pyarrow) as a run's input and its result: what :func:`tsconv.features`
and :meth:`tsconv.Stream.push` need of a frame. Imports none of those libraries until a frame arrives, nor zarr.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np

from tsconv.errors import ShapeError, TsconvWarning
from tsconv.io.contracts import HostSource
from tsconv.io.names import repeated_names
from tsconv.io.precision import exact_in_float32

__all__ = [
    "TIME_COLUMN",
    "FrameColumns",
    "array_values",
    "frame_input",
    "frame_kind",
    "frame_output",
    "index_is_time",
    "pandas_index_columns",
    "refuse_time_clash",
    "without_pandas_index",
    "to_polars",
]


class FrameColumns(HostSource):
    """A polars frame's feature columns (as 1-D numpy arrays) as a run's source and its own reader: each
    read stacks the rows of one chunk into a [rows, F] block, float32, or float64 where a column's dtype does not
    fit float32 exactly (as a float64 array is read). ``int_range``: the least and greatest value of each
    64- or 128-bit integer column, by name, taken before any conversion, for :class:`WideIntegerCheck`."""

    where = "the frame"

    def __init__(
        self,
        columns: list[np.ndarray],
        *,
        band_rows: int = 65536,
        int_range: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        self.columns = columns
        self.int_range = int_range or {}
        self.rows = int(columns[0].shape[0])
        self.n_features = len(columns)
        self.band_rows = band_rows
        exact = all(exact_in_float32(c.dtype) for c in columns)
        self.dtype = np.dtype(np.float32 if exact else np.float64)

    def read(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((stop - start, self.n_features), dtype=self.dtype)
        for j, c in enumerate(self.columns):
            out[:, j] = c[start:stop]
        return out


# the time column's default name: a frame without it has no time column (other names are the caller's, and must be
# there)
TIME_COLUMN = "time"

_FRAMES = {
    "polars": ("DataFrame", "LazyFrame"),
    "pandas": ("DataFrame", "Series"),
    "pyarrow": ("Table", "RecordBatch"),
}


def array_values(x: Any) -> np.ndarray:
    """``np.asarray(x)``, except that a masked array's masked entries become NaN: ``asarray`` returns the data
    beneath the mask, so masked cells would be read as whatever values they hide. Integers with masked
    entries become the float type that holds them (NaN has no integer)."""
    if isinstance(x, np.ma.MaskedArray):
        mask = np.ma.getmaskarray(x)
        if mask.any():
            if x.dtype.kind not in "fiu":
                return np.asarray(x)  # refused as not numeric by the caller
            kind = x.dtype if x.dtype.kind == "f" else np.result_type(x.dtype, np.float32)
            return np.ma.filled(x.astype(kind), np.nan)
        return np.asarray(x.data)
    return np.asarray(x)


def frame_kind(x: Any) -> str | None:
    """ "polars", "pandas" or "pyarrow" for a frame read by its columns' names (a pandas Series too: one row,
    as ``df.iloc[i]`` gives it, named by its index), else None. By type name, so that none of those libraries
    is imported to ask."""
    root = type(x).__module__.split(".")[0]
    return root if type(x).__name__ in _FRAMES.get(root, ()) else None


def to_polars(frame: Any, caller: str) -> Any:
    """A polars DataFrame or LazyFrame of a polars, pandas or pyarrow frame (a pandas Series: one row). A
    pandas frame's index is not a column, and its columns are named by their ``str``; repeated names (after
    that) and a pandas frame's column levels are refused (a frame's columns are read by name). ``caller``
    begins the errors."""
    import polars as pl

    kind = frame_kind(frame)
    if kind == "pandas":
        if type(frame).__name__ == "Series":
            frame = frame.to_frame().T  # one row, its index the columns' names
        if frame.columns.nlevels > 1:
            raise ShapeError(
                f"{caller}: the frame's columns have {frame.columns.nlevels} levels; a frame's columns are read "
                "by name",
                hint="flatten them first, e.g. frame.columns = ['.'.join(map(str, c)) for c in frame.columns].",
            )
        _refuse_repeats([str(c) for c in frame.columns], caller)
        frame = _zoned_in_utc(frame.rename(columns=str), "pandas")
        try:
            return pl.from_pandas(frame)
        # pyarrow's ArrowTypeError, ArrowInvalid, ...; polars' own (a time zone it cannot parse)
        except (TypeError, ValueError, NotImplementedError, pl.exceptions.PolarsError):
            _refuse_unconvertible(frame, caller)
            raise
    if kind == "pyarrow":
        _refuse_repeats(list(frame.schema.names), caller)
        return pl.from_arrow(_zoned_in_utc(frame, "pyarrow"))
    if kind == "polars":
        return frame
    raise ShapeError(f"{caller}: expected a polars, pandas or pyarrow frame, got {type(frame).__name__}")


def _zoned_in_utc(frame: Any, kind: str) -> Any:
    """A pandas or pyarrow frame whose time-zoned timestamp columns are in UTC, the same instants: polars reads
    no fixed offset but whole hours ('+05:30', '+05', as pd.to_datetime gives ISO times with an offset) and
    raised its ComputeError on them. The result's time column gets the input's type (and zone) back."""
    if kind == "pandas":
        import pandas as pd

        def zoned(dtype: Any) -> bool:
            arrow = getattr(dtype, "pyarrow_dtype", None)  # pd.ArrowDtype(pa.timestamp(..., tz=...))
            return isinstance(dtype, pd.DatetimeTZDtype) or getattr(arrow, "tz", None) is not None

        cols = [c for c, d in frame.dtypes.items() if zoned(d)]
        if cols:
            frame = frame.copy(deep=False)  # the caller's frame keeps its columns
            for c in cols:
                frame[c] = frame[c].dt.tz_convert("UTC")
        return frame
    import pyarrow as pa

    schema = frame.schema
    cols = [
        i for i, f in enumerate(schema) if pa.types.is_timestamp(f.type) and f.type.tz not in (None, "UTC")
    ]
    for i in cols:
        schema = schema.set(i, schema.field(i).with_type(pa.timestamp(schema.field(i).type.unit, tz="UTC")))
    return frame.cast(schema) if cols else frame


def pandas_index_columns(schema: Any) -> list[str]:
    """The columns the pandas metadata of a pyarrow schema (key ``pandas``, as ``pa.Table.from_pandas`` and
    pandas' ``to_parquet`` write it) declares as the frame's index (``__index_level_0__`` of a filtered frame);
    a RangeIndex is declared as a dict and stored as no column."""
    meta = (getattr(schema, "metadata", None) or {}).get(b"pandas")
    try:
        index = json.loads(meta)["index_columns"] if meta else []
    except (ValueError, KeyError, TypeError):
        return []
    return [c for c in index if isinstance(c, str)] if isinstance(index, list) else []


def without_pandas_index(table: Any, *, time_column: str | None, caller: str) -> Any:
    """A pyarrow Table or RecordBatch without the index columns its pandas metadata declares (the time column
    excepted), with a warning naming them: row labels are not features (ingest leaves them out alike)."""
    index = [c for c in pandas_index_columns(table.schema) if c in table.schema.names and c != time_column]
    if not index:
        return table
    warnings.warn(
        f"{caller}: left out the pandas index column(s) {', '.join(map(repr, index))} of the "
        f"{type(table).__name__}: an index is not a feature; build it with pa.Table.from_pandas(frame, "
        "preserve_index=False), or write the frame with index=False, to leave it out (an index of times: name "
        "it as the time column, frame.rename_axis('time'), to carry it over)",
        TsconvWarning,
        stacklevel=4,
    )
    return table.select([c for c in table.schema.names if c not in index])


def index_is_time(index: Any, *, has_time_column: bool) -> bool:
    """Whether a pandas frame's index holds its rows' times, for features() to check and Stream.push to read:
    a DatetimeIndex does; another index (integers, mostly) only where the frame has no time column. Beside a
    time column it holds row labels, which pd.concat of daily frames repeats and sort_values('time') permutes
    while the rows are in time order."""
    import pandas as pd

    return isinstance(index, pd.DatetimeIndex) or not has_time_column


def _refuse_unconvertible(frame: Any, caller: str) -> None:
    """Raise a ShapeError naming the pandas columns pyarrow cannot convert (complex, sparse, objects mixing
    strings and numbers); returns where each converts alone, for the caller to re-raise the error it had."""
    import polars as pl

    bad = []
    for name in frame.columns:
        try:
            pl.from_pandas(frame[[name]])
        except (TypeError, ValueError, NotImplementedError, pl.exceptions.PolarsError) as exc:
            bad.append(f"{name} ({frame[name].dtype}: {str(exc)[:80]})")
    if bad:
        shown = ", ".join(bad[:5]) + (f", ... ({len(bad)} in all)" if len(bad) > 5 else "")
        raise ShapeError(
            f"{caller}: the frame's columns cannot be read: {shown}",
            hint="feature columns must be real numbers (int, uint or float; dense, not Sparse) and a time column "
            "datetimes or integers: convert or drop the others first, e.g. frame.astype({'col': 'float64'}), "
            "frame.sparse.to_dense(), or pd.to_datetime(frame['time'], utc=True) for an object column of "
            "datetimes at a UTC offset.",
        )


def _refuse_repeats(names: list[str], caller: str) -> None:
    if repeats := repeated_names(names):
        raise ShapeError(
            f"{caller}: the frame's column names repeat: {', '.join(repeats[:5])}",
            hint="a frame's columns are read by name: give each column its own name.",
        )


def _is_numeric(dtype: Any) -> bool:
    return dtype.is_numeric() and not dtype.is_decimal()


def frame_input(frame: Any, *, time_column: str | None, band_rows: int, caller: str = "features()") -> tuple[tuple[str, ...], FrameColumns, Any]:  # fmt: skip
    """A polars DataFrame or LazyFrame as (feature names, their columns as a source, the time Series or
    None): for :func:`tsconv.features` on frames.

    The column ``time_column`` (``None``: no time column; the default name :data:`TIME_COLUMN` may be absent,
    another is refused where the frame lacks it) is carried to the output (its values:
    polars holds times in ms, us or ns, so :func:`tsconv.features` gives a pandas or pyarrow column in
    seconds its type back) and
    must be strictly increasing without nulls; every other column is a feature (its name is the pipeline's
    input name) and must be numeric. Nulls count as missing values (NaN). A LazyFrame is collected first.
    ``caller`` begins the errors.
    """
    import polars as pl

    if isinstance(frame, pl.LazyFrame):
        frame = frame.collect()
    if not isinstance(frame, pl.DataFrame):
        raise ShapeError(f"expected a polars DataFrame or LazyFrame, got {type(frame).__name__}")
    time = None
    if time_column is not None and time_column not in frame.columns and time_column != TIME_COLUMN:
        # a misspelt name would otherwise make the time column a feature (its integers) and drop the times
        shown = ", ".join(map(repr, frame.columns[:8])) + (", ..." if frame.width > 8 else "")
        raise ShapeError(
            f"{caller}: the frame has no time column {time_column!r} (its columns: {shown})",
            hint="name the frame's time column with time_column=..., or pass time_column=None to treat every "
            "column as a feature.",
        )
    # a column of labels (strings) beside the values: the rows of a long frame, (time, symbol, price), which
    # following a wide frame's hints (drop the repeated times, select the numeric columns) would mix or lose
    long_hint = _long_frame_hint(frame, time_column)
    if time_column is not None and time_column in frame.columns:
        time = frame.get_column(time_column)
        _check_frame_time(time, caller, long_hint=long_hint)
    feats = frame.drop(time_column) if time is not None else frame
    # a column of nulls only has no numeric type (polars: Null; pandas' None objects: String), yet it is a
    # feature with no value yet (a symbol that has not traded): its values are missing, as a numeric column's
    # nulls are. Float32, which holds NaN, so that it does not make the other columns read as float64
    empty = [
        n
        for n, d in feats.schema.items()
        if d in (pl.Null, pl.String) and feats[n].null_count() == feats.height
    ]
    if empty:
        feats = feats.with_columns(pl.col(empty).cast(pl.Float32))
    wrong = [(n, d) for n, d in feats.schema.items() if not _is_numeric(d)]
    if wrong:
        bad = [f"{n} ({d})" for n, d in wrong]
        shown = ", ".join(bad[:5]) + (f", ... ({len(bad)} in all)" if len(bad) > 5 else "")
        if any(d.is_decimal() for _, d in wrong):
            hint = (
                "cast Decimal columns to floats first (polars: frame.with_columns(pl.col(pl.Decimal).cast(pl.Float64));"
                " pandas: frame.astype('float64'); pyarrow: table.cast(...))."
            )
        else:
            hint = (
                "select the feature columns first, e.g. frame.select('time', pl.col(pl.Float32, pl.Float64))"
                + (", or name the time column with time_column=..." if caller == "features()" else ".")
            )
            if long_hint:
                hint = f"if its rows stack several series (a long frame), {long_hint}; else {hint}"
        raise ShapeError(
            f"{caller}: every column but the time column must be numeric; not numeric: {shown}", hint=hint
        )
    if feats.width == 0:
        raise ShapeError(f"{caller}: the frame has no feature columns")
    # the read stacks int64 columns as float64, and polars' to_numpy gives one with a null as float64: values
    # beyond 2^53 are rounded before a WideIntegerCheck sees them, so their range is taken here
    int_range = {
        s.name: (int(s.min()), int(s.max()))
        for s in feats.get_columns()
        if s.dtype in (pl.Int64, pl.UInt64, pl.Int128, pl.UInt128) and s.null_count() < s.len()
    }
    # zero-copy for floats without nulls; numpy has no 128-bit integers: those are read as float64, as int64s are
    wide = (pl.Int128, pl.UInt128)
    columns = [(s.cast(pl.Float64) if s.dtype in wide else s).to_numpy() for s in feats.get_columns()]
    return tuple(feats.columns), FrameColumns(columns, band_rows=band_rows, int_range=int_range), time


def refuse_time_clash(output_names: tuple[str, ...], time: Any) -> None:
    """Refuse (before computing) an output named as the time column that :func:`frame_output` puts beside it."""
    if time is not None and time.name in output_names:
        raise ShapeError(
            f"features(): the output {time.name!r} has the name of the frame's time column; a frame's columns "
            "are read by name, so both cannot be in the result",
            hint="rename the time column or the feature (or name another time column with time_column=...).",
        )


def frame_output(names: tuple[str, ...], values: np.ndarray, time: Any) -> Any:
    """The result frame: the time Series (if any), then one float32 column per output from the
    feature-major ``values`` [D, T]."""
    import polars as pl

    result = pl.DataFrame([pl.Series(n, values[j]) for j, n in enumerate(names)])
    return result.insert_column(0, time) if time is not None else result


def _long_frame_hint(frame: Any, time_column: str | None) -> str | None:
    """How to pivot a frame with a column of labels (strings, categories) beside its values, a long frame's
    (time, symbol, price) rows, to one column per label; None for a frame without such a column."""
    import polars as pl

    labels = [
        n
        for n, d in frame.schema.items()
        if n != time_column
        and isinstance(d, (pl.String, pl.Categorical, pl.Enum))
        and frame[n].null_count() < frame.height
    ]
    if not labels:
        return None
    values = [n for n, d in frame.schema.items() if n != time_column and _is_numeric(d)]
    on, value, index = labels[0], (values[0] if values else "price"), time_column or "time"
    return (
        f"pivot it to one column per {on} first: polars frame.pivot(on={on!r}, index={index!r}, values={value!r}, "
        f"aggregate_function='last'), pandas frame.pivot_table(index={index!r}, columns={on!r}, values={value!r}, "
        "aggfunc='last'), as tsconv ingest reads a long file"
    )


def _check_frame_time(time: Any, caller: str, *, long_hint: str | None = None) -> None:
    import polars as pl

    name = time.name
    if not (time.dtype.is_temporal() or time.dtype.is_integer()) or time.dtype == pl.Time:
        raise ShapeError(
            f"{caller}: the time column {name!r} has dtype {time.dtype}, expected a datetime or integer",
            hint="pass time_column=None to treat every column as a feature, or name another time column.",
        )
    if time.null_count():
        raise ShapeError(f"{caller}: the time column {name!r} has {time.null_count()} nulls")
    if time.len() > 1:
        # compared, not differenced: ns times more than 292 years apart overflow int64 (a difference that wraps
        # took 2200 -> 1750 as increasing and refused 1750 -> 2200)
        t = time.to_physical()
        down = t.slice(1) <= t.slice(0, t.len() - 1)
        if down.any():
            row = int(down.arg_true()[0]) + 1
            if long_hint and (t.slice(1) == t.slice(0, t.len() - 1)).any():
                raise ShapeError(
                    f"{caller}: the time column {name!r} repeats times beside a column of labels: the rows are "
                    "several series stacked (a long frame), not one time step each",
                    hint=long_hint + ".",
                )
            raise ShapeError(
                f"{caller}: the time column {name!r} is not strictly increasing at row {row}",
                hint="sort the frame by time and drop duplicate timestamps (frame.sort(...).unique(...)).",
            )
