"""The library's in-memory entry: :func:`features` runs a pipeline on a numpy array, torch tensor or a polars,
pandas or pyarrow frame and returns the result in memory.

The computation is :func:`tsconv.process`'s engine (:func:`tsconv.engine.run.run`) on an in-memory source and
sink. Kept apart from the store entry so that a script on in-memory data imports neither zarr nor the output
writers (about 0.2 s of a fresh process).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch.autograd.graph import increment_version

from tsconv.engine.options import check_chunk, check_length, check_warmup, refuse, refuse_time_range
from tsconv.engine.run import (
    CudaOptions,
    batched_on,
    cuda_errors,
    plan_run,
    reset_device,
    resolve_device,
    run,
)
from tsconv.errors import ShapeError
from tsconv.io.dataframes import (
    TIME_COLUMN,
    array_values,
    frame_input,
    frame_kind,
    frame_output,
    index_is_time,
    refuse_time_clash,
    to_polars,
    without_pandas_index,
)
from tsconv.io.names import describe_repeats, ordered_names, repeated_names
from tsconv.io.precision import WideIntegerCheck
from tsconv.io.readers.blocks import ArraySource
from tsconv.io.writers.memory import ArraySink
from tsconv.pipeline.spec import PipelineLike, ResolvedPipeline, as_pipeline, resolve

__all__ = ["check_index_levels", "coordinate_holds", "dataarray_dims", "features"]


@cuda_errors()
def features(
    x: Any,
    pipeline: PipelineLike = None,
    *,
    names: list[str] | tuple[str, ...] | None = None,
    warmup: str = "nan",
    chunk: int = 65536,
    device: str = "auto",
    time_column: str | None = TIME_COLUMN,
    transfer: str | None = None,
    gpu_mem: int | str | None = None,
    return_names: bool = False,
    out: Any = None,
) -> Any:
    """Run a pipeline on an in-memory series ``x`` [T, F] (numpy or torch); returns [T, D] float32 of the same kind.

    The computation is :func:`process`'s (on CUDA the batched engine, where ``chunk`` is not used; on the
    CPU chunks of ``chunk`` steps), so results match it on the same data. On the CPU: bit for bit at the
    same ``chunk`` (:func:`process`'s default is 1,024, this one's 65,536), and for built-in filters at any;
    weights stages re-centre in blocks counted from each chunk's first row, so at another ``chunk`` they agree
    within float32 rounding. A frame gives a frame of its kind
    (polars DataFrame or LazyFrame: a polars DataFrame; pandas DataFrame: a pandas DataFrame with the same
    index; pyarrow Table or RecordBatch: a Table): its columns are read by name, its ``time_column`` (the
    default ``time`` if present; another name must be a column, or a pandas index's name) is carried over
    and the other columns, all numeric, are the named features (see :func:`tsconv.io.dataframes.frame_input`; a
    pyarrow table's pandas index columns are left out with a warning). An xarray DataArray of two dimensions, in either order, gives
    a DataArray [time, output] (see :func:`_dataarray_features`). ``transfer`` and ``gpu_mem`` are the CUDA
    engine's, as in :func:`process`.

    ``names`` names an array's input features (default f0, f1, ...). ``return_names=True`` returns
    ``(result, output_names)``: the D output names in column order (e.g. ``"f0.ma8"``), a tuple of str, the
    same as an output store's ``features`` attribute; for a frame they are its columns without the time.

    ``out``: an array of the result's shape [T, D] (numpy float32, or a CPU float32 tensor for a tensor input),
    C-contiguous, writeable and apart from ``x``, to write the result into and return (a loop over same-sized
    batches then reuses one buffer instead of having a fresh one mapped and zeroed for each call).
    """
    chunk = check_chunk(chunk, default=65536)
    check_warmup(warmup)
    cuda = CudaOptions.from_args(transfer=transfer, gpu_mem=gpu_mem, decode="cpu")
    dev = resolve_device(device)
    if not batched_on(dev):
        refuse({"transfer": transfer, "gpu_mem": gpu_mem}, f"a run on the CPU (device={device!r})")
    if type(x).__module__.split(".")[0] == "xarray":
        return _dataarray_features(
            x, pipeline, names=names, warmup=warmup, chunk=chunk, device=device, time_column=time_column,
            transfer=transfer, gpu_mem=gpu_mem, return_names=return_names, out=out,
        )  # fmt: skip
    if isinstance(x, str | bytes | os.PathLike):  # numpy made a 0-D array of it: "got 0-D with shape []"
        got = f"got the path {os.fsdecode(x)!r}"[:200]
        raise ShapeError(
            f"features() computes on a series in memory (an array, a tensor or a frame), {got}",
            hint="for a store, run tsconv.process(path, output) to write its features (tsconv.iter_chunks(path) "
            "reads a store into frames).",
        )
    kind = frame_kind(x)
    is_series = kind == "pandas" and type(x).__name__ == "Series"
    if is_series:
        kind = None  # one series: an array of one feature, as numpy gives it
    if kind is not None:
        if out is not None:
            raise ShapeError("out= is for arrays and tensors; a frame's result is a new frame")
        if names is not None:
            raise ShapeError("names= is for arrays; a frame's features are named by its columns")
        index = x.index if kind == "pandas" else None
        # an index of that name holds the times (index_is_time), kept as the result's index: no column to find
        if (
            index is not None
            and time_column is not None
            and index.name == time_column
            and time_column not in x
        ):
            time_column = None
        if kind == "pyarrow":  # a table of a pandas frame holds its index as columns, named in its metadata
            x = without_pandas_index(x, time_column=time_column, caller="features()")
        feature_names, source, time_series = frame_input(
            to_polars(x, "features()"), time_column=time_column, band_rows=chunk
        )
        timed = time_series is not None
        if index is not None and index_is_time(index, has_time_column=timed):
            _check_index(index, "the frame's index", time_column=time_column if timed else None)
        plan = _plan_for(pipeline, feature_names, source.rows, warmup, f"features() on {kind} frames")
        refuse_time_clash(plan.output_names, time_series)
        WideIntegerCheck(plan.input_names).see_ranges(source.int_range)
        sink = ArraySink(source.rows, plan.n_outputs, feature_major=True)
        _run_in_memory(source, plan, sink, dev, chunk=chunk, warmup=warmup, cuda=cuda)
        frame = frame_output(plan.output_names, sink.out, time_series)
        # polars holds times in ms, us or ns: a pandas or pyarrow time column in seconds gets its type back
        if kind == "pandas":
            frame = frame.to_pandas()
            frame.index = index
            if timed and frame[time_column].dtype != x[time_column].dtype:
                frame[time_column] = frame[time_column].astype(x[time_column].dtype)
        elif kind == "pyarrow":
            frame = frame.to_arrow()
            given = x.schema.field(time_column).type if timed else None
            if timed and frame.schema.field(time_column).type != given:
                i = frame.schema.get_field_index(time_column)
                frame = frame.set_column(i, time_column, frame.column(i).cast(given))
        return (frame, plan.output_names) if return_names else frame
    is_torch = isinstance(x, torch.Tensor)
    try:
        if is_torch and x.dtype == torch.bfloat16:
            x = x.float()  # numpy has no bfloat16; float32 holds every bfloat16 value exactly
        arr = x.detach().cpu().numpy() if is_torch else array_values(x)
    except (TypeError, ValueError) as exc:  # ragged lists, objects numpy cannot make an array of
        raise ShapeError(
            f"expected a 2-D series [T, F] (an array, a tensor or a frame), got {type(x).__name__}: {exc}",
            hint="pass a numpy array or torch tensor with one row per time step and one column per feature.",
        ) from None
    if arr.ndim != 2:
        # x[:, None] raises on a pandas Series (pandas 3): it becomes a frame of one column instead
        reshape = "series.to_frame()" if is_series else "x[:, None]"
        raise ShapeError(
            f"expected a 2-D series [T, F] (time-major), got {arr.ndim}-D with shape {list(arr.shape)}",
            hint=f"pass one row per time step and one column per feature; reshape a 1-D series with {reshape}.",
        )
    if arr.dtype.kind not in "fiu":
        raise ShapeError(
            f"expected a real numeric array, got dtype {arr.dtype}",
            hint="pass float or integer values (e.g. x.astype(numpy.float64)); booleans, complex numbers, "
            "strings and objects are not read as prices.",
        )
    if arr.shape[1] == 0:
        raise ShapeError(
            f"the series has no features (shape {list(arr.shape)})", hint="pass at least one feature column."
        )
    if names is None:
        feature_names = tuple(f"f{j}" for j in range(arr.shape[1]))
    elif (given := ordered_names(names)) is None:
        raise ShapeError(
            f"names must be an ordered list of the columns' names, got {type(names).__name__}: {str(names)[:80]}",
            hint="names=['AAPL', 'MSFT'], in the order of the array's columns (not a set or a dict, whose "
            "order is not the columns').",
        )
    else:
        feature_names = given
    if len(feature_names) != arr.shape[1]:
        # the README promises a hint with every error: say which side to change
        raise ShapeError(
            f"features(): {len(feature_names)} names given for the {arr.shape[1]} columns of x "
            f"(shape {list(arr.shape)})",
            hint="give one name per column of x, in column order (names=[...] of length "
            f"{arr.shape[1]}), or select the columns the names are for.",
        )
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
    into = None if out is None else _checked_out(out, arr, (arr.shape[0], plan.n_outputs), is_torch)
    sink = ArraySink(arr.shape[0], plan.n_outputs, into=into)
    _run_in_memory(ArraySource(arr, band_rows=chunk), plan, sink, dev, chunk=chunk, warmup=warmup, cuda=cuda)
    if is_torch and out is not None:
        # written through numpy, which autograd does not see: bumped as torch's out= ops bump it (a product
        # saved for backward before the next batch filled ``out`` gave that batch's gradient, silently)
        increment_version(out)
    y = out if out is not None else torch.from_numpy(sink.out) if is_torch else sink.out
    return (y, plan.output_names) if return_names else y


def _checked_out(out: Any, x: np.ndarray, shape: tuple[int, int], is_torch: bool) -> np.ndarray:
    """``out`` as the numpy array the result is written into, or a ShapeError saying what it must be."""
    kind = "a CPU float32 torch tensor" if is_torch else "a float32 numpy array"
    if is_torch:
        ok = isinstance(out, torch.Tensor) and out.device.type == "cpu" and out.dtype == torch.float32
        if ok and out.requires_grad and torch.is_grad_enabled():  # as torch's own out= ops refuse it
            raise ShapeError(
                "out= requires grad: tsconv's features are computed outside autograd and cannot be written into "
                "a tensor whose writes it would have to record",
                hint="pass a tensor that does not require grad (out.detach(), or torch.empty(...)), or call "
                "inside torch.no_grad().",
            )
        arr = out.detach().numpy() if ok else None
    else:
        arr = out if isinstance(out, np.ndarray) and out.dtype == np.float32 else None
    if arr is None:
        got = f"{type(out).__name__} of dtype {getattr(out, 'dtype', '?')}"
        raise ShapeError(f"out= must be {kind} (the kind of x), got {got}",
                         hint="pass None to get a new result, or an array made like numpy.empty((T, D), numpy.float32).")  # fmt: skip
    if arr.shape != shape:
        raise ShapeError(f"out= must have the result's shape {list(shape)} (T steps x D outputs), got {list(arr.shape)}",
                         hint="D is the pipeline's number of outputs: len(output_names) with return_names=True.")  # fmt: skip
    if not (arr.flags.c_contiguous and arr.flags.writeable):
        raise ShapeError("out= must be C-contiguous and writeable",
                         hint="make it with numpy.empty((T, D), numpy.float32) (or torch.empty), not a slice or a view.")  # fmt: skip
    if np.may_share_memory(arr, x):
        raise ShapeError("out= shares memory with x: the result would overwrite the rows it is computed from",
                         hint="give out= a buffer of its own.")  # fmt: skip
    return arr


def _run_in_memory(source: Any, plan: ResolvedPipeline, sink: ArraySink, dev: torch.device, *, chunk: int,
                   warmup: str, cuda: CudaOptions) -> None:  # fmt: skip
    # the batched engine plans its steps in 1024-row chunks; ``chunk`` is the chunked engine's
    step_chunk = 1024 if batched_on(dev) else chunk
    rp = plan_run(source, plan, device=dev, chunk=step_chunk, warmup=warmup, cuda=cuda)
    reset_device(dev)
    run(rp, source, plan, sink)


def dataarray_dims(da: Any, *, time_column: str | None, caller: str) -> tuple[str, str]:
    """The time and feature dimensions of an xarray DataArray [time, feature] in either order, by
    :func:`_dataarray_features`' rule (``Stream.push`` reads a DataArray by the same). ``caller`` begins the
    errors."""
    import xarray as xr

    if not isinstance(da, xr.DataArray):
        raise ShapeError(
            f"{caller} takes one xarray DataArray [time, feature], got {type(da).__name__}",
            hint="pass one variable, e.g. ds['px'], or ds.to_dataarray('feature') to stack several.",
        )
    if da.ndim != 2:
        raise ShapeError(
            f"{caller} expects a 2-D DataArray [time, feature], got dimensions {da.dims}",
            hint="select or stack to two dimensions, time and feature.",
        )
    dims = tuple(str(d) for d in da.dims)
    held = {d: coordinate_holds(da.coords[d]) for d in dims if d in da.coords}
    dated = [d for d in dims if held.get(d) == "datetimes"]
    # a dimension whose coordinate holds names (strings) is the features' (a date coordinate of integers, such
    # as 20240102, holds no datetimes)
    named = [d for d in dims if held.get(d) == "names"]
    if time_column is not None and time_column not in dims and time_column != TIME_COLUMN:
        # another dimension would be taken for time by the rules below, and the misspelt name go unnoticed
        raise ShapeError(
            f"features(): the DataArray has no dimension {time_column!r} (its dimensions: {dims})",
            hint=f"name its time dimension: time_column={dims[0]!r} or time_column={dims[1]!r}, or leave "
            "time_column out.",
        )
    if time_column in dims:
        tdim = time_column
    elif "time" in dims:
        tdim = "time"
    elif len(dated) == 1:
        tdim = dated[0]
    elif len(named) == 1:
        tdim = dims[1] if named[0] == dims[0] else dims[0]
    elif all(d in da.coords for d in dims) and not all(_default_range(da.coords[d].values) for d in dims):
        kinds = "datetimes" if dated else "names" if named else "numbers"
        raise ShapeError(
            f"{caller}: which of the DataArray's dimensions {dims} is time is ambiguous: both coordinates "
            f"hold {kinds}",
            hint=f"name it: time_column={dims[0]!r} or time_column={dims[1]!r} (or rename it 'time')."
            if caller == "features()"  # push() has no time_column: its frames' time column is 'time'
            else f"rename it 'time': da.rename({{{dims[0]!r}: 'time'}}).",
        )
    else:
        tdim = dims[0]
    return tdim, dims[1] if tdim == dims[0] else dims[0]


def _dataarray_features(da: Any, pipeline: PipelineLike, *, names: Any, time_column: str | None, out: Any, return_names: bool, **options: Any) -> Any:  # fmt: skip
    """:func:`features` of an xarray DataArray [time, feature] in either order: a DataArray [time, output].

    The time dimension is ``time_column``'s, else one named ``time``, else the one dimension whose coordinate
    holds datetimes (numpy or tz-aware datetimes, Periods, date or datetime objects), else the one whose
    coordinate does not hold names (strings), else the first (an array's convention) where at most one
    dimension has a coordinate or both are 0..n-1 (a pandas frame's defaults); other coordinates of the same
    kind on both (strings, or numbers such as yyyymmdd dates and integer ids) are refused as ambiguous. The
    other dimension's coordinate names the features. Its time coordinate, which the result keeps, must be strictly increasing."""
    import xarray as xr

    tdim, fdim = dataarray_dims(da, time_column=time_column, caller="features()")
    if out is not None:
        raise ShapeError("out= is for arrays and tensors; a DataArray's result is a new DataArray")
    da = da.transpose(tdim, fdim)
    if fdim in da.coords:
        if names is not None:
            raise ShapeError(
                f"names= is for arrays; this DataArray's features are named by its {fdim!r} coordinate"
            )
        names = [str(v) for v in da.coords[fdim].values]
    if tdim in da.indexes:
        _check_index(da.indexes[tdim], "the DataArray's time coordinate")
    result, out_names = features(np.asarray(da.values), pipeline, names=names, return_names=True, **options)
    coords = {"output": list(out_names)}
    if tdim in da.indexes:
        # the index, not .values, which turns tz-aware times into naive UTC objects and Periods into objects
        coords[tdim] = da.indexes[tdim]
    elif tdim in da.coords:
        coords[tdim] = da.coords[tdim].values
    frame = xr.DataArray(result, dims=(tdim, "output"), coords=coords, name=da.name)
    return (frame, out_names) if return_names else frame


_DATED_OBJECTS = ("datetime", "datetime64", "date", "period")


def coordinate_holds(coord: Any) -> str:
    """``"datetimes"``, ``"names"`` (strings) or ``"other"``: what a DataArray coordinate's values are.

    By the values, not only the dtype: xarray keeps ``datetime.date`` keys (``groupby(ts.dt.date)``) as an
    object coordinate, and pandas' tz-aware and Period dtypes, which numpy cannot interpret, as they are."""
    import pandas as pd

    dtype = coord.dtype
    if pd.api.types.is_datetime64_any_dtype(dtype) or isinstance(dtype, pd.PeriodDtype):
        return "datetimes"
    if getattr(dtype, "kind", "O") in "US":
        return "names"
    if getattr(dtype, "kind", "O") != "O":
        return "other"
    inferred = pd.api.types.infer_dtype(np.asarray(coord.values).ravel(), skipna=True)
    if inferred in ("string", "bytes"):
        return "names"
    return "datetimes" if inferred in _DATED_OBJECTS else "other"


def _default_range(values: np.ndarray) -> bool:
    """Whether a coordinate is 0, 1, ..., n-1: what xarray gives a pandas frame's default index and columns,
    which say nothing about which dimension is time."""
    return values.dtype.kind in "iu" and bool(np.array_equal(values, np.arange(values.size)))


_ORDERED_OBJECTS = (
    "datetime",
    "datetime64",
    "date",
    "integer",
    "floating",
    "mixed-integer-float",
    "timedelta",
)


def _check_index(index: Any, what: str, *, time_column: str | None = None) -> None:
    """A datetime or numeric index other than the default range must be strictly increasing, as a time
    column must: the rows are time steps, taken in order. ``time_column``: the frame's time column, in order
    already, so that the hint does not sort the rows out of its order."""
    import pandas as pd

    if isinstance(index, pd.MultiIndex):
        check_index_levels(index, what, caller="features()")
        return
    ordered = (
        pd.api.types.is_datetime64_any_dtype(index.dtype)
        or pd.api.types.is_numeric_dtype(index.dtype)
        or pd.api.types.is_timedelta64_dtype(index.dtype)
        or isinstance(index, pd.PeriodIndex)
        # objects that are all instants or numbers (Timestamps of several time zones, after a concat)
        or (index.dtype == object and pd.api.types.infer_dtype(index, skipna=False) in _ORDERED_OBJECTS)
    )
    if isinstance(index, pd.RangeIndex) or not ordered:
        return
    if index.hasnans or not (index.is_monotonic_increasing and index.is_unique):
        if time_column is not None:
            hint = (
                f"the {time_column!r} column is strictly increasing: if it holds the times, drop the index "
                "(frame.reset_index(drop=True)); else make the two agree."
            )
        else:
            hint = (
                "sort by time and drop repeated timestamps (pandas: frame.sort_index() and "
                "frame[~frame.index.duplicated(keep='last')]; xarray: da.sortby('time').drop_duplicates('time'))."
            )
        raise ShapeError(
            f"features(): {what} is not strictly increasing (its rows are taken as time steps, in order)",
            hint=hint,
        )


def check_index_levels(index: Any, what: str, *, caller: str) -> None:
    """A pandas MultiIndex's levels of times must each increase strictly: a level whose times repeat or go back
    (``set_index(['time', 'symbol'])`` of a long frame) says that the rows are several series stacked, not one
    time step each, which the convolutions would run across (one symbol's first row differenced against
    another's last). ``caller`` begins the error."""
    for level, name in enumerate(index.names):
        values = index.get_level_values(level)
        if coordinate_holds(values) != "datetimes" or (values.is_monotonic_increasing and values.is_unique):
            continue
        label = repr(name) if name is not None else f"number {level}"
        others = [n for n in index.names if n != name]
        series = repr(others[0]) if others and others[0] is not None else "level"
        raise ShapeError(
            f"{caller}: {what} has {index.nlevels} levels, and its level {label} of times is not strictly "
            "increasing: its rows are not one time step each but several series stacked (a long frame)",
            hint=f"give each series its own column, e.g. frame.unstack({series}) with the columns flattened "
            "('.'.join), or pass one series' rows (frame.xs(key, level=...)); where the levels together "
            "hold each row's time, combine them into one DatetimeIndex.",
        )


def _plan_for(pipeline: PipelineLike, names: tuple[str, ...], rows: int, warmup: str, what: str) -> ResolvedPipeline:  # fmt: skip
    plan = resolve(as_pipeline(pipeline), names)
    refuse_time_range(plan, what)
    check_length(rows, plan, warmup, "features()", empty_hint="pass at least one row, one per time step.")
    return plan
