"""A live series: :class:`Stream` computes a pipeline's features of rows as they arrive, state kept in memory.

The chunked engine (:mod:`tsconv.engine.chunked`) computes chunk by chunk from a carry of the last prepared
input rows, the forward-fill state and each chunk's centring level; a resumed run rebuilds them from the input.
A stream keeps the same state between pushes, only a little more of it: a push's rows are computed by one
:meth:`~tsconv.engine.compute.Backend.run` call per chunk they fall in (chunks of ``chunk`` steps counted from
step 0, as in :func:`tsconv.features`), whose input starts where
:meth:`~tsconv.engine.compute.Backend.window_start` says, on the chunk's block grid, with the level the chunk
has. So the rows equal a batch run over everything pushed, and a push costs its rows plus at most
``Backend.window_lookback`` rows before them for each chunk they fall in, whatever the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tsconv.engine.compute import CHECK_ROWS_MIN, Backend, ShortCallSample
from tsconv.engine.inmemory import check_index_levels, coordinate_holds, dataarray_dims
from tsconv.engine.level import TAIL_ROWS, centering_level, level_before
from tsconv.engine.options import check_chunk, check_warmup, refuse_time_range
from tsconv.engine.run import cuda_errors, exact_fp32, resolve_device
from tsconv.errors import ShapeError, TsconvError
from tsconv.io.dataframes import array_values, frame_input, frame_kind, index_is_time, to_polars
from tsconv.io.ffill import forward_fill
from tsconv.io.names import describe_repeats, ordered_names, repeated_names
from tsconv.io.precision import Float32Check, WideIntegerCheck, exact_in_float32
from tsconv.pipeline.spec import as_pipeline, resolve

__all__ = ["Stream"]


class Stream:
    """A pipeline over a live series: ``push`` rows as they arrive, get the features of exactly those rows.

    ``Stream(pipeline, features=F)`` (F input features named f0, f1, ...; or ``features=["AAPL", "MSFT"]``
    names them, as :func:`tsconv.features`'s ``names``) holds the pipeline's weights on ``device``
    (``auto``, ``cpu`` or ``cuda``) and the state of the series in memory. ``push(rows)`` takes [n, F] rows
    (or [F], one row; numpy or torch, any real dtype, or a polars, pandas or pyarrow frame whose columns are taken
    by the features' names and whose 'time' column, if any, gives the times, or an xarray DataArray read as
    :func:`tsconv.features` reads it, its datetime coordinate giving the times: read as float32, or on the CPU as float64 from the first
    push whose dtype float32 does not hold, as :func:`tsconv.features` reads it) and returns their [n, D] float32
    features (a torch tensor for a tensor), the columns named by :attr:`output_names`.

    Guarantee: the rows returned by any sequence of pushes equal ``tsconv.features(all rows pushed, pipeline,
    warmup=..., chunk=...)`` with the same options, bit for bit on the CPU for pipelines whose only dense
    stage, if any, is the first and reads raw (or log) levels: every built-in pipeline, a dense head included.
    A dense stage after another stage, or after returns or a z-score, is computed by torch's conv, whose
    rounding depends on the length of the call: it matches within float32 rounding. On CUDA the push runs the
    Triton kernels and matches within the engine's float32 bound. During each output's own warm-up (the steps
    before its filters have a full window: one step for ``diff:1``, up to ``halo`` for the longest) its rows
    are NaN with ``warmup="nan"``, as in a batch run (which refuses a series no longer than its shortest
    warm-up; a stream returns its NaN rows), or computed on zero history with ``warmup="zero"``.

    Cost: a push of n rows computes n + at most :attr:`lookback` rows for each chunk of ``chunk`` steps it
    touches (n + lookback within one chunk of the default 65,536, n + 2 x lookback across a chunk boundary; a
    small ``chunk`` makes pushes cost more); the state kept is lookback rows plus a few per-feature vectors,
    never the history. Missing values are forward-filled (or not, by
    ``[preprocess] fill``) across pushes, and a feature may start late (NaN until its first value).

    ``push(rows, time=...)``: optional timestamps of the rows (a 1-D integer or datetime64 array of n),
    checked to increase strictly within and across pushes (:attr:`last_time`); they are not returned. A push
    that raises, part-way too (an interrupt, a warning turned into an error), leaves the stream as it was.
    Not thread-safe: push from one thread.
    """

    def __init__(
        self,
        pipeline: str | Any = None,
        *,
        features: int | Sequence[str],
        warmup: str = "nan",
        chunk: int = 65536,
        device: str = "auto",
    ) -> None:
        """``pipeline``: a built-in's name, a TOML path, a dict or a :class:`tsconv.Pipeline` (None: the
        default). ``chunk`` and ``warmup`` as in :func:`tsconv.features` (the batch run this equals)."""
        chunk = check_chunk(chunk, default=65536)
        check_warmup(warmup)
        names = _feature_names(features)
        self._names = names
        plan = resolve(as_pipeline(pipeline), names)
        refuse_time_range(plan, "tsconv.Stream")
        self.plan = plan
        self.warmup = warmup
        self.chunk = chunk
        self.device = resolve_device(device)
        self.n_features = len(names)
        self._columns = None if plan.columns is None else list(plan.columns)
        self._rounding = Float32Check(plan.input_names)
        self._wide_ints = WideIntegerCheck(plan.input_names)  # int64 beyond 2^53, as run_chunked
        self._last: np.ndarray | None = None  # the last row pushed, as given, while the rounding check runs
        self._fill = plan.preprocess is None or plan.preprocess.fill == "ffill"
        self._warm = plan.warmup_groups() if warmup == "nan" else []
        self._backend = Backend(plan, self.device)
        # The FP16-storage check samples a push of as many rows (after the halo) as a batch run's first sample,
        # and shorter ones on the rows they gather (ShortCallSample): a one-row push's single row gave a
        # scale of one row, and pushes of 127 rows, each sampled alone, left a late symbol unjudged where
        # features() warned
        self._backend.min_check_rows = max(CHECK_ROWS_MIN, self._backend.check_rows)
        nf = len(plan.input_names)
        # The last prepared rows (filled, unless fill = "none"), those before step 0 zeros: the zero history.
        self._rows_kept = np.zeros((self._backend.window_lookback, nf), dtype=np.float32)
        self._state = np.full(nf, np.nan, dtype=np.float32)  # the forward-fill state
        self._level = np.full(nf, np.nan, dtype=np.float32)  # this chunk's level, NaN: not known yet
        self._zscore_level: torch.Tensor | None = None  # this chunk's z-score level, on the device
        self._pushed = 0
        self.last_time: Any = None
        # Rows of pushes each too short for the FP16-storage check, gathered until it can judge them: a one-row
        # push at a time was never checked
        self._sample = ShortCallSample(self._backend, plan.halo)

    @property
    def output_names(self) -> tuple[str, ...]:
        """The D output columns' names, in order (as ``features(..., return_names=True)`` gives them)."""
        return self.plan.output_names

    @property
    def input_names(self) -> tuple[str, ...]:
        """The features the stages read (after a ``[preprocess]`` selection)."""
        return self.plan.input_names

    @property
    def halo(self) -> int:
        """The warm-up: steps before an output that it reads."""
        return self.plan.halo

    @property
    def rows(self) -> int:
        """Rows pushed so far."""
        return self._pushed

    @property
    def lookback(self) -> int:
        """Rows the stream keeps, and recomputes at most before a push's first row."""
        return self._rows_kept.shape[0]

    @cuda_errors()
    def push(self, rows: Any, time: Any = None) -> Any:
        """The features [n, D] float32 of ``rows`` [n, F] (or [F]: one row), the next steps of the series."""
        is_torch = isinstance(rows, torch.Tensor)
        saved = self._saved()  # before a frame's read too, whose wide-integer check may warn
        try:
            out, last_time = self._taken(rows, time)
        except BaseException:  # an interrupt or a warning made an error, part-way: nothing of the push taken
            self._restore(saved)
            raise
        self.last_time = last_time
        return torch.from_numpy(out) if is_torch else out

    def _taken(self, rows: Any, time: Any) -> tuple[np.ndarray, Any]:
        """The features of ``rows``, the state advanced past them, and the last time pushed once they are."""
        if type(rows).__module__.split(".")[0] == "xarray":
            rows, coord_time = self._dataarray_rows(rows)
            if time is None:
                time = coord_time  # as a pandas frame's DatetimeIndex: time= given wins
        elif (kind := frame_kind(rows)) is not None:
            frame = rows
            rows, frame_time = self._frame_rows(frame)
            timed = frame_time is not None
            index_time = _index_times(frame, has_time_column=timed) if kind == "pandas" else None
            if not timed and time is None:
                time = index_time  # as features() checks a pandas frame's index, and keeps it
            elif frame_time is not None:
                if time is not None:
                    raise ShapeError(
                        "push(): the frame has a 'time' column and time= was given too",
                        hint="give the times once: in the frame's 'time' column, or as time= with a frame without one.",
                    )
                time = frame_time
        x = self._checked(rows)
        last_time = self._checked_time(time, x.shape[0]) if time is not None else self.last_time
        return self._push(x), last_time

    def _saved(self) -> tuple[Any, ...]:
        """What a push changes, to restore where it does not complete (the checks that warn included: one
        whose warning was made an error counted itself done, and the rows pushed again went unwarned)."""
        z, r = self._zscore_level, self._rounding
        return (self._rows_kept, self._state.copy(), self._level.copy(), None if z is None else z.clone(),
                self._pushed, self._last, r.pending.copy(), r.checks, r.warned, self._sample.state(),
                self._wide_ints.warned,
                self._backend.storage_check_state())  # fmt: skip

    def _restore(self, saved: tuple[Any, ...]) -> None:
        (self._rows_kept, self._state, self._level, self._zscore_level, self._pushed, self._last,
         self._rounding.pending, self._rounding.checks, self._rounding.warned, sample,
         self._wide_ints.warned, check) = saved  # fmt: skip
        self._sample.restore(sample)
        self._backend.restore_storage_check(check)

    def _push(self, x: np.ndarray) -> np.ndarray:
        """The features of rows ``x`` (checked), the state advanced past them."""
        if self._columns is not None:
            x = x[:, self._columns]
        # an empty push switches too: all rows pushed, concatenated, are then of its dtype
        wide = not exact_in_float32(x.dtype)
        if wide and self._backend.reads_float64 and self._rows_kept.dtype == np.float32:
            # float64 from here on, as the batch run reads rows of such a dtype (run_chunked), the rows pushed
            # before included: the rows kept and the fill state hold their float32 values exactly
            self._rows_kept = self._rows_kept.astype(np.float64)
            self._state = self._state.astype(np.float64)
        if self._rows_kept.dtype == np.float32 and wide and x.shape[0] and not self._rounding.done:
            # a short push with the row pushed before (as given), so that pushes of one row have steps to judge by
            short = self._last is not None and x.shape[0] < 1024
            self._rounding.see(np.concatenate([self._last, x]) if short else x)
            self._last = x[-1:].copy()
        if self._rows_kept.dtype == np.float64:
            self._wide_ints.see(x)
        x = np.asarray(x, dtype=self._rows_kept.dtype)
        out = np.empty((x.shape[0], self.plan.n_outputs), dtype=np.float32)
        begin = self._pushed
        with torch.no_grad(), exact_fp32(self.device):
            pos = begin
            while pos < begin + x.shape[0]:
                stop = min((pos // self.chunk + 1) * self.chunk, begin + x.shape[0])
                out[pos - begin : stop - begin] = self._compute(x[pos - begin : stop - begin], pos)
                pos = stop
        self._pushed = begin + x.shape[0]
        self._backend.finish()  # the FP16-storage check's warnings, once its first chunk has been seen
        return out

    def _compute(self, raw: np.ndarray, pos: int) -> np.ndarray:
        """Rows [pos, pos + n) of one chunk, as the chunked engine computes that chunk."""
        halo, kept = self.halo, self._rows_kept
        s = pos // self.chunk * self.chunk
        reads_level = self._backend.reads_level
        if pos == s:  # a new chunk: its level from the rows before it, as run_chunked takes it
            tail = min(TAIL_ROWS, s, kept.shape[0])  # the rows before the chunk run_chunked's level takes
            if reads_level:
                self._level = level_before(kept[kept.shape[0] - tail :], self._state)
            if self._backend.pre is not None and self._backend.pre.zscore is not None:
                self._zscore_level = torch.full(
                    (kept.shape[1],), torch.nan, dtype=torch.float64, device=self.device
                )
        filled, self._state = forward_fill(raw, self._state)
        if reads_level:
            # A feature without a level takes its first finite value in the chunk, which may come in a later
            # push; until then its outputs are NaN whatever the level, so 0 stands in and the chunk's stays
            # unknown.
            level = centering_level(self._level, filled)
            self._level = np.where(np.isnan(self._level) & ~np.isfinite(filled).any(axis=0), np.nan, level)
        else:  # a bank reads none (run_chunked's rule)
            level = np.zeros(raw.shape[1], dtype=np.float32)
        prepared = filled if self._fill else raw
        start = self._backend.window_start(s - halo, pos)
        x = np.concatenate([kept[kept.shape[0] - (pos - start) :], prepared], axis=0)
        dev = self.device
        y = self._backend.run(torch.from_numpy(x).to(dev), start, torch.from_numpy(level).to(dev),
                              zscore_level=self._zscore_level)  # fmt: skip
        self._sample.see(x, start, prepared, level, zscore_level=self._zscore_level)
        out = y[pos - start - halo :]
        out = out.cpu().numpy() if dev.type != "cpu" else out.numpy()
        for w, cols in self._warm:  # each output's own warm-up rows
            if pos < w:
                out[: min(w - pos, out.shape[0]), cols] = np.nan
        self._rows_kept = np.concatenate([kept, prepared], axis=0)[-kept.shape[0] :]
        return out

    def _frame_rows(self, frame: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """A polars, pandas or pyarrow frame's rows, its columns taken by the stream's feature names (not by
        position), and its 'time' column's stamps (None without one)."""
        import polars as pl

        series = frame_kind(frame) == "pandas" and type(frame).__name__ == "Series"
        frame = to_polars(frame, "push()")
        if isinstance(frame, pl.LazyFrame):
            frame = frame.collect()
        names = self._names
        if series:
            # A Series has one dtype for all its values: iterrows() gives a row whose features are all NaN beside
            # a datetime as datetime64, the NaNs as NaT, which were refused as "not numeric". Missing values.
            nat = [n for n in names if n in frame.columns and frame.schema[n].is_temporal()
                   and frame[n].null_count() == frame.height]  # fmt: skip
            frame = frame.with_columns(pl.col(nat).cast(pl.Float32)) if nat else frame
        have = set(frame.columns)
        missing = [n for n in names if n not in have]
        if missing:
            shown = ", ".join(map(repr, missing[:5])) + (
                f", ... ({len(missing)} in all)" if len(missing) > 5 else ""
            )
            what = (
                "a pandas Series is taken as one row, its index naming the features"
                if series
                else "a frame's columns are read by name"
            )
            raise ShapeError(
                f"push(): {what}, and this one has no {'feature' if series else 'column'} {shown} of the "
                f"stream's features (its {'index' if series else 'columns'}: "
                f"{', '.join(map(repr, frame.columns[:8]))}{', ...' if frame.width > 8 else ''})",
                hint="for one feature over time (df['a']), push series.to_frame(), a column named as the "
                "feature; for one row, index the Series by the stream's feature names."
                if series
                else "name the frame's columns as Stream(features=[...]) names the features, or push "
                "frame.to_numpy() with its columns in that order.",
            )
        time_column = "time" if "time" in have and "time" not in names else None
        wanted = set(names)
        extra = [c for c in frame.columns if c not in wanted and c != time_column]
        if extra:
            raise ShapeError(
                f"push(): the frame's columns {', '.join(map(repr, extra[:5]))} are not features of this stream",
                hint="select the stream's features (and 'time', if any) first: frame.select(...).",
            )
        if time_column is not None:
            self._check_time_dtype(frame.schema[time_column], series=series)
        cols = [*names, *([time_column] if time_column else [])]
        _, source, t = frame_input(frame.select(cols), time_column=time_column, band_rows=1, caller="push()")
        self._wide_ints.see_ranges(source.int_range)
        return source.read(0, source.rows), None if t is None else t.to_numpy()

    @staticmethod
    def _check_time_dtype(dtype: Any, *, series: bool) -> None:
        """Refuse a frame's 'time' column that holds no times, with push()'s own hints: frame_input's name
        features()'s ``time_column=None``, an option push() lacks, and a renamed column is refused as no feature."""
        import polars as pl

        if (dtype.is_temporal() and dtype not in (pl.Duration, pl.Time)) or dtype.is_integer():
            return
        what = "a duration" if dtype == pl.Duration else "a time of day" if dtype == pl.Time else "not a time"
        if series:
            hint = (
                "a pandas Series holds one dtype for all its values, so a row of a frame (df.iloc[i], iterrows()) "
                "has its integer times as floats: push df.iloc[[i]], a one-row frame, which keeps each column's "
                "dtype, or give the rows without 'time' and time= as integers."
            )
        else:
            hint = (
                "cast the column to datetimes or integers, or drop it (frame.drop('time')) and give the times as "
                "time= (datetime64 or integers)."
            )
        raise ShapeError(f"push(): the frame's 'time' column is {what} ({dtype}), expected datetimes or integers",
                         hint=hint)  # fmt: skip

    def _checked(self, rows: Any) -> np.ndarray:
        if isinstance(rows, torch.Tensor):
            t = rows.detach().cpu()
            if t.is_floating_point() and t.dtype not in (torch.float16, torch.float32, torch.float64):
                t = t.float()  # bfloat16 and float8, which numpy lacks: float32 holds their values exactly
            try:
                arr = t.numpy()
            except (TypeError, RuntimeError) as exc:
                raise ShapeError(
                    f"push() expects a tensor of real numbers, got dtype {t.dtype}: {exc}",
                    hint="convert with .float().",
                ) from None
        else:
            arr = self._as_array(rows)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[1] != self.n_features:
            raise ShapeError(
                f"push() expects rows [n, {self.n_features}] (or [{self.n_features}] for one row), the "
                f"{self.n_features} features the stream was made for, got shape {list(np.shape(rows))}",
                hint="one row per time step, one column per feature in the order given to Stream(features=...).",
            )
        if arr.dtype.kind not in "fiu":
            raise ShapeError(
                f"push() expects real numbers, got dtype {arr.dtype}", hint="convert with .astype('float32')."
            )
        return arr

    def _as_array(self, rows: Any) -> np.ndarray:
        try:
            return array_values(rows)
        except (TypeError, ValueError) as exc:
            raise ShapeError(
                f"push() expects rows [n, {self.n_features}] (an array or a tensor), got {type(rows).__name__}: {exc}",
                hint="pass a numpy array or torch tensor with one row per time step and one column per feature.",
            ) from None

    def _dataarray_rows(self, da: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """An xarray DataArray's rows, read as features() reads it (either dimension order, the features by
        its feature coordinate's names, by position without one), and its time coordinate's stamps where it
        holds datetimes (None otherwise: numbers there are as often row labels, as a pandas frame's index)."""
        if getattr(da, "ndim", None) == 1 and "time" not in da.dims:
            # one row, as [F] is: da.isel(time=i), whose scalar time becomes the new dimension's coordinate
            da = da.expand_dims("time")
        tdim, fdim = dataarray_dims(da, time_column="time", caller="push()")
        da = da.transpose(tdim, fdim)
        arr = self._as_array(da.values)
        if fdim in da.coords:
            have = [str(v) for v in da.coords[fdim].values]
            missing = [n for n in self._names if n not in have]
            extra = [n for n in have if n not in self._names]
            if missing or extra or repeated_names(have):
                raise ShapeError(
                    f"push(): a DataArray's features are read by its {fdim!r} coordinate, which has "
                    f"{', '.join(map(repr, have[:8]))}{', ...' if len(have) > 8 else ''}; the stream's features "
                    f"are {', '.join(map(repr, self._names[:8]))}{', ...' if len(self._names) > 8 else ''}",
                    hint=f"select or rename them to the stream's features: da.sel({fdim}=[...]), or push "
                    "da.values with its columns in the order of Stream(features=...).",
                )
            arr = arr[:, [have.index(n) for n in self._names]]
        if tdim not in da.indexes or coordinate_holds(da.coords[tdim]) != "datetimes":
            return arr, None
        import pandas as pd

        index = da.indexes[tdim]
        if isinstance(index, pd.PeriodIndex):
            index = index.to_timestamp()
        # tz-aware times, and datetime objects of several zones, in UTC, as a pandas frame's index is taken
        index = pd.DatetimeIndex(pd.to_datetime(index, utc=True)).tz_localize(None)
        return arr, index.to_numpy()  # its own unit: ns wraps times past 2262 or before 1677

    def _checked_time(self, time: Any, n: int) -> Any:
        """The last of ``time``'s ``n`` stamps (the last time pushed, for n = 0), once they are checked to
        increase strictly from the last time pushed."""
        t = time.detach().cpu().numpy() if isinstance(time, torch.Tensor) else np.asarray(time)
        if t.ndim == 0:
            t = t[None]
        if t.ndim != 1 or t.shape[0] != n or t.dtype.kind not in "iuM":
            right_shape = t.ndim == 1 and t.shape[0] == n
            raise ShapeError(
                f"push(rows, time): time must be {n} integer or datetime64 stamps, one per row, "
                f"got shape {list(t.shape)} {t.dtype}",
                hint="convert the times to datetime64 or int64 (a time-zone-aware pandas column: "
                "its .to_numpy('datetime64[ns]') after tz_convert('UTC'))."
                if right_shape
                else "pass time as a 1-D array as long as rows, or leave it out.",
            )
        if n == 0:
            return self.last_time
        if t.dtype.kind == "M" and np.isnat(t).any():
            i = int(np.flatnonzero(np.isnat(t))[0])
            raise TsconvError(
                f"push(): row {i} of this push has no time (NaT)",
                hint="give every row its timestamp; nothing of this push was taken.",
            )
        if t.dtype.kind in "iu":
            if t.dtype.kind == "u" and t.size and int(t.max()) > np.iinfo(np.int64).max:
                raise ShapeError(
                    f"push(): time {int(t.max())} is beyond int64", hint="give times as int64 or datetime64."
                )
            t = t.astype(np.int64)  # any integer width: compared as int64
        if self.last_time is not None:
            before = np.asarray(self.last_time).dtype
            if (t.dtype.kind == "M") != (before.kind == "M"):
                raise ShapeError(
                    f"push(): time is {t.dtype}, earlier pushes gave {before}",
                    hint="give every push's times the same way: all datetime64 or all integers.",
                )
            if t.dtype != before:  # datetime64 of another unit: in the first push's, where it holds them
                with np.errstate(over="ignore"):
                    same = t.astype(before)
                if (same.astype(t.dtype) != t).any():
                    # a coarser unit fails only where the times lie beyond the earlier unit's span
                    coarser = np.promote_types(t.dtype, before) == before
                    why = (
                        f"beyond the span {before} holds (that of earlier pushes)"
                        if coarser
                        else (f"finer than the {before} of earlier pushes")
                    )
                    raise ShapeError(
                        f"push(): time is {t.dtype}, {why}",
                        hint=f"give times {before} holds exactly, as the first push did.",
                    )
                t = same
        seq = t if self.last_time is None else np.concatenate([np.asarray(self.last_time)[None], t])
        bad = np.flatnonzero(seq[1:] <= seq[:-1])
        if bad.size:
            i = int(bad[0]) + (0 if self.last_time is None else -1)
            before = "the last time pushed" if i < 0 else f"row {i}'s"
            raise TsconvError(
                f"push(): time must increase strictly; row {i + 1} of this push ({seq[bad[0] + 1]}) is not after "
                f"{before} ({seq[bad[0]]})",
                hint="push rows in time order, one row per timestamp; nothing of this push was taken.",
            )
        return t[-1]


def _index_times(frame: Any, *, has_time_column: bool) -> np.ndarray | None:
    """A pandas DataFrame's DatetimeIndex as the rows' times (datetime64 in UTC), where :func:`index_is_time`
    (features()'s rule) takes its index as the times; None for a Series (its index names the features) and
    other indexes: without a time column too, as integers are as often row labels, [0] in every push."""
    import pandas as pd

    if not isinstance(frame, pd.DataFrame) or not index_is_time(frame.index, has_time_column=has_time_column):
        return None
    if isinstance(frame.index, pd.MultiIndex):  # a long frame's (time, symbol) rows: several series, refused
        check_index_levels(frame.index, "the frame's index", caller="push()")
    if not isinstance(frame.index, pd.DatetimeIndex):
        return None
    index = frame.index
    if index.tz is not None:
        index = index.tz_convert("UTC").tz_localize(None)
    return index.to_numpy()  # its own unit, as a time column's: ns wraps times past 2262 or before 1677


def _feature_names(features: int | Sequence[str]) -> tuple[str, ...]:
    if isinstance(features, (int, np.integer)) and not isinstance(features, (bool, np.bool_)):
        count: int | None = int(features)
    else:
        count = None
    names = None
    if count is None:
        names = ordered_names(features)
        if names is None and not isinstance(features, (str, bytes, set, frozenset, dict)):
            try:  # a 0-d integer array or tensor: a count
                arr = np.asarray(features.detach().cpu() if isinstance(features, torch.Tensor) else features)
            except (TypeError, ValueError):
                arr = None
            if arr is not None and arr.ndim == 0 and arr.dtype.kind in "iu":
                count = int(arr)
    if count is not None:
        if count < 1:
            raise ShapeError(f"features must be a positive count or a list of names, got {features!r}")
        return tuple(f"f{j}" for j in range(count))
    if not names:
        raise ShapeError(
            f"features must be a count or an ordered list of names, got {type(features).__name__}: "
            f"{str(features)[:80]}",
            hint="Stream(pipeline, features=3) for f0, f1, f2, or features=['AAPL', 'MSFT'] (a list, in the "
            "order of the rows' columns).",
        )
    if dups := repeated_names(names):
        raise ShapeError(
            f"Stream(): feature names repeat ({describe_repeats(names, dups)})",
            hint="give every feature a distinct name: a pipeline selects features by name.",
        )
    return names
