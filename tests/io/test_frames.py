"""Polars / Arrow loaders, features() on frames, and Parquet output of process."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import zarr
from click.testing import CliRunner

import tsconv
from tsconv.cli import main
from tsconv.errors import OutputExistsError, ShapeError, StoreError, TsconvError, TsconvWarning
from tsconv.io.frames import ArrayChunk, StoreInfo
from tsconv.io.writers import parquet_writer

from ..helpers import T0, price_series, read_output, write_store

NAMES = ["x0", "x1", "x2", "x3"]
PIPE = {"conv": [{"filters": ["diff:1", "ma:16", "ema:8"]}]}


@pytest.fixture(scope="module")
def series() -> np.ndarray:
    return price_series(5000, 4, seed=3, nan_fraction=0.05)


@pytest.fixture(scope="module")
def store(tmp_path_factory, series) -> Path:
    return write_store(tmp_path_factory.mktemp("s") / "in.zarr", series, chunks=(1500, 3))


def _times(n: int) -> np.ndarray:
    return (T0 + np.arange(n, dtype=np.int64) * 1_000_000).view("datetime64[ns]")


# ------------------------------------------------------------------------------------ open_store


def test_open_store_metadata(store: Path, tmp_path: Path) -> None:
    info = tsconv.open_store(store)
    assert isinstance(info, StoreInfo)
    assert (info.rows, info.n_features, info.features) == (5000, 4, tuple(NAMES))
    assert info.dtype == np.float32 and info.chunks == (1500, 3) and info.has_time
    assert info.time_start == _times(1)[0] and info.time_end == _times(5000)[-1]
    assert "5,000 rows x 4 features" in repr(info)
    bare = tmp_path / "bare.zarr"
    zarr.create_array(str(bare), data=np.ones((10, 2), dtype=np.float64), chunks=(4, 2))
    info = tsconv.open_store(bare)
    assert info.features == ("f0", "f1") and not info.has_time and info.time_start is None
    assert info.dtype == np.float64
    with pytest.raises(StoreError, match="does not exist"):
        tsconv.open_store(tmp_path / "nope.zarr")


@pytest.mark.parametrize("value", [None, 5, b"in.zarr"])
def test_open_input_refuses_what_is_no_location(store: Path, value: object) -> None:
    """tsconv.open_input(None), of a number or of bytes raised os.fspath's bare TypeError; a StoreError says
    what it takes, as process() and open_store() say it (a Path is taken, as annotated)."""
    assert tsconv.open_input(store).features == tuple(NAMES)
    with pytest.raises(StoreError, match="must be a str path, an os.PathLike") as err:
        tsconv.open_input(value)
    assert err.value.hint and ("decode()" in err.value.hint) == isinstance(value, bytes)


# ----------------------------------------------------------------------------------- iter_chunks


@pytest.mark.parametrize("rows", [1, 999, 1500, 4096, 10_000])
def test_iter_chunks_concatenated_equal_the_store(store: Path, series: np.ndarray, rows: int) -> None:
    chunks = list(tsconv.iter_chunks(store, rows=rows if rows > 1 else 7))
    df = pl.concat(chunks)
    assert df.columns == ["time", *NAMES]
    assert df.schema["time"] == pl.Datetime("ns", "UTC")
    assert all(df.schema[n] == pl.Float32 for n in NAMES)
    np.testing.assert_array_equal(df.select(NAMES).to_numpy(), series)  # NaN where NaN
    assert df.select(pl.col(NAMES).is_null().any()).row(0) == (False,) * 4  # NaN, not null
    np.testing.assert_array_equal(df["time"].dt.replace_time_zone(None).to_numpy(), _times(5000))


def test_numpy_chunks_are_read_only_so_an_edit_cannot_reach_the_next_halo(
    store: Path, series: np.ndarray
) -> None:
    """A numpy chunk's values view the decoded band that the next chunk's halo rows also view: an edit in place
    (clipping a chunk's own rows) changed the next chunk's history, silently. They are read-only now."""
    seen = []
    for c in tsconv.iter_chunks(store, rows=500, halo=20, as_="numpy"):
        np.testing.assert_array_equal(c.values, series[c.start : c.stop])  # the history as stored
        with pytest.raises(ValueError, match="read-only"):
            c.values[c.halo :] *= -1
        with pytest.raises(ValueError, match="read-only"):
            c.time[0] = c.time[-1]
        edited = np.array(c.values)  # a copy is the user's to edit
        edited[c.halo :] *= -1
        seen.append(c.stop)
    assert seen[-1] == 5000


@pytest.mark.parametrize("halo", [0, 5, 1500, 7000])
def test_halo_rows_come_first_and_are_marked(store: Path, series: np.ndarray, halo: int) -> None:
    rows = 1024
    polars_chunks = list(tsconv.iter_chunks(store, rows=rows, halo=halo))
    arrow_chunks = list(tsconv.iter_chunks(store, rows=rows, halo=halo, as_="arrow"))
    numpy_chunks = list(tsconv.iter_chunks(store, rows=rows, halo=halo, as_="numpy"))
    assert len(polars_chunks) == len(arrow_chunks) == len(numpy_chunks) == 5
    for k, (df, batch, arr) in enumerate(zip(polars_chunks, arrow_chunks, numpy_chunks, strict=True)):
        s, e = k * rows, min((k + 1) * rows, 5000)
        a = max(0, s - halo)
        assert isinstance(batch, pa.RecordBatch) and isinstance(arr, ArrayChunk)
        assert (arr.start, arr.stop, arr.halo) == (a, e, s - a)
        np.testing.assert_array_equal(arr.values, series[a:e])
        np.testing.assert_array_equal(arr.time, _times(5000)[a:e])
        np.testing.assert_array_equal(df.select(NAMES).to_numpy(), series[a:e])
        assert pl.from_arrow(batch).equals(df)
        if halo:
            assert df.columns == ["time", "is_halo", *NAMES]
            assert df["is_halo"].to_list() == [True] * (s - a) + [False] * (e - s)
            assert batch.schema.metadata[b"tsconv.halo"] == str(s - a).encode()
            assert batch.schema.metadata[b"tsconv.start"] == str(a).encode()
        else:
            assert df.columns == ["time", *NAMES]
    # the rows proper, halo dropped, are the store again
    proper = pl.concat([df.filter(~pl.col("is_halo")) if halo else df for df in polars_chunks])
    np.testing.assert_array_equal(proper.select(NAMES).to_numpy(), series)


def test_iter_chunks_columns_and_no_time(store: Path, series: np.ndarray, tmp_path: Path) -> None:
    df = pl.concat(tsconv.open_store(store).iter_chunks(rows=1200, columns=["x3", "x0"]))
    assert df.columns == ["time", "x3", "x0"]
    np.testing.assert_array_equal(df.select("x3", "x0").to_numpy(), series[:, [3, 0]])
    df = pl.concat(tsconv.iter_chunks(store, rows=1600, columns=["x1", "x2"]))  # a contiguous slice
    np.testing.assert_array_equal(df.select("x1", "x2").to_numpy(), series[:, 1:3])
    with pytest.raises(StoreError, match="no feature named 'nope'"):
        tsconv.iter_chunks(store, columns=["x0", "nope"])
    with pytest.raises(TsconvError, match="as_ must be one of"):
        tsconv.iter_chunks(store, as_="pandas")
    bare = write_store(tmp_path / "bare.zarr", series.astype(np.float16), time=False, chunks=(700, 4))
    df = pl.concat(tsconv.iter_chunks(bare, rows=1000, halo=3))
    assert df.columns == ["step", "is_halo", *NAMES] and df.schema["x0"] == pl.Float32
    proper = df.filter(~pl.col("is_halo"))
    assert proper["step"].to_list() == list(range(5000))
    np.testing.assert_array_equal(proper.select(NAMES).to_numpy(), series.astype(np.float16))


# ------------------------------------------------------------------------------- features(frame)


def _frame(series: np.ndarray) -> pl.DataFrame:
    df = pl.DataFrame({n: series[:, j] for j, n in enumerate(NAMES)})
    return df.insert_column(0, pl.Series("time", _times(len(series))).dt.replace_time_zone("UTC"))


def test_features_of_a_polars_frame_equal_features_of_numpy(series: np.ndarray) -> None:
    df = _frame(series)
    want = tsconv.features(series, PIPE, names=NAMES, chunk=700)
    got = tsconv.features(df, PIPE, chunk=700)
    assert isinstance(got, pl.DataFrame)
    assert got.columns[0] == "time" and got["time"].equals(df["time"])
    plan_names = [f"{n}.{f}" for n in NAMES for f in ("diff1", "ma16", "ema8")]
    assert got.columns[1:] == plan_names
    assert all(got.schema[n] == pl.Float32 for n in plan_names)
    np.testing.assert_array_equal(got.drop("time").to_numpy(), want)
    lazy = tsconv.features(df.lazy().filter(pl.col("time") >= df["time"][100]), PIPE)
    np.testing.assert_array_equal(
        lazy.drop("time").to_numpy(), tsconv.features(series[100:], PIPE, names=NAMES)
    )
    no_time = tsconv.features(df.drop("time"), PIPE, chunk=700)  # same chunks: same rounding
    assert no_time.columns == plan_names
    np.testing.assert_array_equal(no_time.to_numpy(), want)
    # integer features with nulls: nulls are missing values, like NaN
    ints = pl.DataFrame({"a": [1, None, 3, 4, None, 6] * 50})
    np.testing.assert_array_equal(
        tsconv.features(ints, {"conv": [{"filters": ["diff:1"]}]}).to_numpy(),
        tsconv.features(ints.to_numpy().astype(np.float64), {"conv": [{"filters": ["diff:1"]}]}),
    )
    # numpy and torch stay as they were
    assert isinstance(tsconv.features(torch.from_numpy(series), PIPE, names=NAMES), torch.Tensor)


def test_features_of_pandas_and_arrow_frames_read_columns_by_name(series: np.ndarray) -> None:
    # a pandas frame was taken as an array: its time column computed as feature f0, its names dropped
    pd = pytest.importorskip("pandas")
    df = _frame(series)
    want = tsconv.features(df, PIPE, chunk=700)
    pdf = df.to_pandas()[["time", *reversed(NAMES)]]  # columns in another order: read by name
    got, names = tsconv.features(pdf, PIPE, chunk=700, return_names=True)
    assert isinstance(got, pd.DataFrame) and list(got.columns) == ["time", *names]
    assert list(names) == [f"{n}.{f}" for n in reversed(NAMES) for f in ("diff1", "ma16", "ema8")]
    for n in names:
        np.testing.assert_array_equal(got[n].to_numpy(), want[n].to_numpy())
    assert (got["time"] == pdf["time"]).all()
    # a DatetimeIndex is kept as the result's index; it must be strictly increasing
    indexed = pdf.drop(columns="time").set_index(pdf["time"])
    res = tsconv.features(indexed, PIPE, chunk=700)
    assert res.index.equals(indexed.index) and list(res.columns) == list(names)
    np.testing.assert_array_equal(res.to_numpy(), got[list(names)].to_numpy())
    with pytest.raises(ShapeError, match="index is not strictly increasing"):
        tsconv.features(indexed.iloc[::-1], PIPE)
    with pytest.raises(ShapeError, match="column names repeat: x0"):
        tsconv.features(pd.concat([pdf, pdf[["x0"]]], axis=1), PIPE)
    with pytest.raises(ShapeError, match="column names repeat: 1"):  # alike once named by their str
        tsconv.features(pd.DataFrame([[1.0, 2.0]] * 4, columns=[1, "1"]), PIPE)
    with pytest.raises(ShapeError, match="column names repeat: a"):
        tsconv.features(pa.table([pa.array([1.0, 2, 3, 4])] * 2, names=["a", "a"]), PIPE)
    with pytest.raises(ShapeError, match="columns have 2 levels"):
        tsconv.features(
            pd.DataFrame(np.ones((4, 2)), columns=pd.MultiIndex.from_tuples([("p", "a"), ("p", "b")])), PIPE
        )
    zones = [
        pd.Timestamp("2024-01-02 10:00", tz=z) for z in ("UTC", "Europe/London", "Asia/Tokyo", "US/Eastern")
    ]
    for decreasing in (
        pd.period_range("2024-01", periods=4, freq="M")[::-1],
        pd.timedelta_range(0, periods=4)[::-1],
        pd.Index(
            zones, dtype=object
        ),  # Timestamps of several zones stay objects: 10:00 Tokyo is before 10:00 UTC
    ):
        with pytest.raises(ShapeError, match="index is not strictly increasing"):
            tsconv.features(pd.DataFrame({"a": np.arange(4.0)}, index=decreasing), PIPE)
    table = tsconv.features(df.to_arrow(), PIPE, chunk=700)
    assert isinstance(table, pa.Table) and table.column_names == want.columns
    assert pl.from_arrow(table).equals(want)
    assert isinstance(tsconv.features(df.to_arrow().to_batches()[0], PIPE), pa.Table)


def test_the_pandas_index_a_pyarrow_table_holds_is_no_feature() -> None:
    # pa.Table.from_pandas (and pq.read_table of a pandas-written file) keeps a filtered frame's index as the
    # column __index_level_0__, which features() computed as a feature: row labels under '__index_level_0__.diff1'
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame(
        {"time": pd.date_range("2024-01-01", periods=60, freq="D"), "a": np.arange(60.0) ** 2}
    )
    rows = frame[frame.index % 3 != 0]  # its index 1, 2, 4, 5, ...: a column, not a RangeIndex
    want = pl.from_pandas(tsconv.features(rows.reset_index(drop=True), PIPE), nan_to_null=False)
    for table in (pa.Table.from_pandas(rows), pa.RecordBatch.from_pandas(rows)):
        assert "__index_level_0__" in table.schema.names
        with pytest.warns(TsconvWarning, match="left out the pandas index column.s. '__index_level_0__'"):
            got, names = tsconv.features(table, PIPE, return_names=True)
        assert names == ("a.diff1", "a.ma16", "a.ema8") and got.column_names == ["time", *names]
        assert pl.from_arrow(got).equals(want)
    # an index named as the time column is the time column, as a frame's column of that name is
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        timed = tsconv.features(pa.Table.from_pandas(rows.set_index("time")), PIPE)
    assert pl.from_arrow(timed).equals(want)


def test_a_multiindex_whose_times_repeat_is_several_series_and_refused() -> None:
    # a long frame indexed by (time, symbol) or (symbol, time) was taken row by row as one series: px.diff1
    # differenced symbol B's price against symbol A's (99, -98, ...), silently
    pd = pytest.importorskip("pandas")
    times = pd.date_range("2024-01-01", periods=20, freq="h", tz="UTC")
    long = pd.DataFrame({"time": np.repeat(times, 2), "symbol": ["A", "B"] * 20, "px": np.arange(40.0)})
    for levels in (["time", "symbol"], ["symbol", "time"]):
        with pytest.raises(ShapeError, match="level 'time' of times is not strictly increasing") as info:
            tsconv.features(long.set_index(levels).sort_index(), PIPE)
        assert "unstack('symbol')" in info.value.hint
    # one series' rows under the same levels are time steps, kept as the result's index
    one = long[long["symbol"] == "A"].set_index(["time", "symbol"])
    got = tsconv.features(one, PIPE)
    assert got.index.equals(one.index)
    want = tsconv.features(one["px"].to_numpy()[:, None], PIPE)
    np.testing.assert_array_equal(got.to_numpy(), want)


def test_a_column_of_nulls_only_is_a_feature_with_no_value_yet_and_decimals_are_told_to_cast() -> None:
    pd = pytest.importorskip("pandas")
    # polars types a column of None as Null, pandas as objects: refused as "not numeric", with a hint naming an
    # option push() does not have; its values are missing, as a numeric column's nulls are
    pipe = {"conv": [{"filters": ["diff:1"]}]}
    stream = tsconv.Stream(pipe, features=["AAPL", "NEWCO"])
    assert np.isnan(stream.push(np.array([100.0, np.nan]))).all()
    for row, step in ((pl.DataFrame([{"AAPL": 101.0, "NEWCO": None}]), 1.0),
                      (pd.DataFrame([{"AAPL": 103.0, "NEWCO": None}]), 2.0)):  # fmt: skip
        got = stream.push(row)
        assert got[0, 0] == step and np.isnan(got[0, 1])
    frame = pl.DataFrame({"AAPL": [100.0, 101.0, 103.0], "NEWCO": [None, None, None]})
    np.testing.assert_array_equal(
        tsconv.features(frame, pipe).to_numpy(), [[np.nan, np.nan], [1.0, np.nan], [2.0, np.nan]]
    )
    text = pl.DataFrame({"AAPL": [100.0, 101.0], "note": [None, "halt"]})
    with pytest.raises(ShapeError, match=r"not numeric: note \(String\)"):
        tsconv.features(text, pipe)
    dec = pl.DataFrame({"px": [100.25, 100.5]}).with_columns(pl.col("px").cast(pl.Decimal(12, 2)))
    with pytest.raises(ShapeError, match="not numeric: px") as err:
        tsconv.features(dec, pipe)
    assert "cast Decimal columns to floats" in err.value.hint
    with pytest.raises(ShapeError, match="not numeric: note") as err:
        tsconv.Stream(pipe, features=["AAPL", "note"]).push(text)
    assert "time_column" not in err.value.hint


def test_a_named_time_column_the_frame_lacks_is_refused_and_the_default_may_be_absent(
    series: np.ndarray,
) -> None:
    # a misspelt name made an integer time column a feature (time.diff1, ...) and dropped the times
    pd = pytest.importorskip("pandas")
    df = _frame(series).with_columns(pl.col("time").dt.epoch("ns"))
    for frame in (df, df.to_pandas(), df.to_arrow()):
        with pytest.raises(
            ShapeError, match=r"no time column 'timestamp' \(its columns: 'time', 'x0'"
        ) as err:
            tsconv.features(frame, PIPE, device="cpu", time_column="timestamp")
        assert "time_column=None" in err.value.hint
    bare = df.drop("time")
    assert tsconv.features(bare, PIPE, device="cpu").columns[0] == "x0.diff1"  # no 'time': no time column
    indexed = bare.to_pandas().set_index(pd.DatetimeIndex(_times(len(series)), name="timestamp"))
    got = tsconv.features(indexed, PIPE, device="cpu", time_column="timestamp")  # the index holds the times
    assert got.index.equals(indexed.index) and got.columns[0] == "x0.diff1"


def test_features_refuses_a_flat_long_frame_with_a_pivot_hint(series: np.ndarray) -> None:
    # (time, symbol, price) rows: the hints for a wide frame (drop the repeated timestamps; select the numeric
    # columns) lose other symbols' rows or difference one symbol's price against another's, silently
    pytest.importorskip("pandas")
    wide = _frame(series).select("time", "x0", "x1")
    long = wide.unpivot(index="time", variable_name="symbol", value_name="price").sort("time", "symbol")
    for frame in (long, long.to_pandas(), long.to_arrow()):
        with pytest.raises(ShapeError, match="several series stacked \\(a long frame\\)") as err:
            tsconv.features(frame, PIPE, device="cpu")
        assert "pivot_table(index='time', columns='symbol', values='price'" in err.value.hint
        assert "unique" not in err.value.hint
    one_per_time = long.unique("time", keep="first", maintain_order=True)  # ticks that never share a time
    for frame in (one_per_time, one_per_time.to_pandas().astype({"symbol": "category"})):
        with pytest.raises(ShapeError, match=r"not numeric: symbol") as err:
            tsconv.features(frame, PIPE, device="cpu")
        assert err.value.hint.startswith("if its rows stack several series (a long frame), pivot it")
    pivoted = long.pivot(on="symbol", index="time", values="price", aggregate_function="last")
    assert tsconv.features(pivoted, PIPE, device="cpu").equals(tsconv.features(wide, PIPE, device="cpu"))


def test_features_refuses_non_numeric_columns_and_bad_time(series: np.ndarray) -> None:
    df = _frame(series).with_columns(pl.lit("AAPL").alias("symbol"), pl.lit(True).alias("flag"))
    with pytest.raises(ShapeError, match=r"not numeric: symbol \(String\), flag \(Boolean\)") as err:
        tsconv.features(df, PIPE)
    assert "select the feature columns" in err.value.hint
    got = tsconv.features(df.drop("symbol", "flag"), PIPE)
    assert got.columns[0] == "time"
    with pytest.raises(ShapeError, match=r"not numeric: time \(Datetime"):
        tsconv.features(df.select(NAMES + ["time"]), PIPE, time_column=None)
    ts = _frame(series).rename({"time": "ts"})
    assert tsconv.features(ts, PIPE, time_column="ts").columns[0] == "ts"
    unsorted = _frame(series).reverse()
    with pytest.raises(ShapeError, match="not strictly increasing at row 1"):
        tsconv.features(unsorted, PIPE)
    with pytest.raises(ShapeError, match="names= is for arrays"):
        tsconv.features(_frame(series), PIPE, names=NAMES)
    with pytest.raises(ShapeError, match=r"names repeat \(2 repeats of 1 name: 'x0'\)") as err:
        tsconv.features(series, PIPE, names=["x0", "x0", "x2", "x0"])
    assert "distinct name" in err.value.hint
    with pytest.raises(TsconvError, match="pipeline|feature"):
        tsconv.features(_frame(series), {"conv": [{"weights": np.ones((2, 3, 4))}]})


# -------------------------------------------------------------------------------- Parquet output


def test_parquet_output_equals_zarr_output(store: Path, tmp_path: Path, monkeypatch) -> None:
    tsconv.process(store, tmp_path / "o.zarr", chunk=512)
    report = tsconv.process(store, tmp_path / "o.parquet", chunk=512)
    assert report.rows == 5000 and report.output == str(tmp_path / "o.parquet")
    zout = zarr.open_group(str(tmp_path / "o.zarr"), mode="r")
    df = pl.read_parquet(tmp_path / "o.parquet")
    assert df.columns == ["time", *zout.attrs["features"]]
    assert df.schema["time"] == pl.Datetime("ns", "UTC")
    assert all(dt == pl.Float32 for dt in df.drop("time").dtypes)
    np.testing.assert_array_equal(df.drop("time").to_numpy(), read_output(tmp_path / "o.zarr"))
    np.testing.assert_array_equal(df["time"].dt.replace_time_zone(None).to_numpy(), _times(5000))
    meta = json.loads(pq.read_schema(tmp_path / "o.parquet").metadata[b"tsconv"])
    assert (
        meta["features"] == zout.attrs["features"] and meta["tsconv"]["halo"] == zout.attrs["tsconv"]["halo"]
    )
    assert not list(tmp_path.glob(".*tmp"))
    # row groups as the engine streams; no time for a bare array input
    bare = write_store(tmp_path / "bare.zarr", price_series(3000, 2), time=False)
    monkeypatch.setattr(parquet_writer, "ROW_GROUP_ROWS", 1000)
    tsconv.process(bare, tmp_path / "b.pq", pipeline=PIPE, chunk=100)
    f = pq.ParquetFile(tmp_path / "b.pq")
    assert f.metadata.num_row_groups == 3 and f.schema_arrow.names[0] == "x0.diff1"


def test_parquet_round_trip_through_ingest(store: Path, tmp_path: Path) -> None:
    tsconv.process(store, tmp_path / "a.parquet", pipeline=PIPE, chunk=256)
    first = pl.read_parquet(tmp_path / "a.parquet")
    tsconv.ingest(tmp_path / "a.parquet", tmp_path / "b.zarr", layout="wide")
    info = tsconv.open_store(tmp_path / "b.zarr")
    assert info.features == tuple(first.columns[1:]) and info.rows == 5000
    back = pl.concat(info.iter_chunks(rows=2048))
    assert back["time"].equals(first["time"])
    np.testing.assert_array_equal(back.drop("time").to_numpy(), first.drop("time").to_numpy())
    pipe2 = {"conv": [{"filters": ["diff:1"]}]}
    tsconv.process(tmp_path / "b.zarr", tmp_path / "c.parquet", pipeline=pipe2, warmup="zero")
    second = pl.read_parquet(tmp_path / "c.parquet")
    assert second["time"].equals(first["time"])
    assert second.columns[1:] == [f"{n}.diff1" for n in first.columns[1:]]
    want = tsconv.features(first, pipe2, warmup="zero")
    np.testing.assert_array_equal(second.to_numpy(), want.to_numpy())


def test_parquet_output_exists_resume_and_cli(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "f.parquet"
    out.write_bytes(b"precious")
    with pytest.raises(OutputExistsError, match="already exists"):
        tsconv.process(store, out, pipeline=PIPE)
    assert out.read_bytes() == b"precious"
    runner = CliRunner()
    res = runner.invoke(main, ["process", "-i", str(store), "-o", str(out), "-q"])
    assert res.exit_code == 2 and "tsconv: error: output file" in res.output and "--overwrite" in res.output
    res = runner.invoke(main, ["process", "-i", str(store), "-o", str(out), "-q", "--resume"])
    assert res.exit_code == 2 and "--resume is not supported for Parquet" in res.output
    assert "hint: run it again" in res.output  # a stopped run left the old file or none
    assert out.read_bytes() == b"precious"
    res = runner.invoke(main, ["process", "-i", str(store), "-o", str(out), "-q", "--overwrite"])
    assert res.exit_code == 2 and "is not a Parquet file" in res.output  # --overwrite replaces Parquet only
    assert out.read_bytes() == b"precious"
    out.write_bytes(b"")  # an empty file holds nothing to lose
    res = runner.invoke(main, ["process", "-i", str(store), "-o", str(out), "-q", "--overwrite"])
    assert res.exit_code == 0, res.output
    assert "5,000 rows x 4 features -> 20 features" in res.output
    assert pl.read_parquet(out).shape == (5000, 21)
    with pytest.raises(TsconvError, match="workers=2 does not apply to a Parquet output"):
        tsconv.process(store, tmp_path / "w.parquet", workers=2)
    with pytest.raises(TsconvError, match="compression='lz4' does not apply to a Parquet output"):
        tsconv.process(store, tmp_path / "w.parquet", compression="lz4")
    with pytest.raises(TsconvError, match="client='tcp://h:8786' does not apply") as err:
        tsconv.process(store, tmp_path / "w.parquet", client="tcp://h:8786")
    assert err.value.hint == "leave client out (--scheduler at the command line)."  # there is no --client
    (tmp_path / "d.parquet").mkdir()
    with pytest.raises(StoreError, match="is a directory"):
        tsconv.process(store, tmp_path / "d.parquet", overwrite=True)
    with pytest.raises(StoreError, match="inside the input store"):
        tsconv.process(store, store / "x.parquet")
    # an error while streaming leaves neither a partial file nor the temporary one
    with pytest.raises(TsconvError, match="warm-up"):
        tsconv.process(store, tmp_path / "g.parquet", pipeline={"conv": [{"filters": ["ma:6000"]}]})
    assert not (tmp_path / "g.parquet").exists() and not list(tmp_path.glob(".*tmp"))


def test_features_reads_128_bit_integer_columns_and_refuses_a_series_without_features() -> None:
    # numpy has no 128-bit integers (polars' to_numpy raised its own error); zero columns raised numpy's
    ticks = pl.DataFrame({"a": [100 + (k * 7) % 5 for k in range(300)], "b": list(range(300))})
    pipe = {"conv": [{"filters": ["diff:1", "ma:4"]}]}
    wide = ticks.with_columns(pl.col("a").cast(pl.Int128), pl.col("b").cast(pl.UInt128))
    assert tsconv.features(wide, pipe).equals(tsconv.features(ticks, pipe))
    for empty in (np.zeros((300, 0)), torch.zeros(300, 0)):
        with pytest.raises(ShapeError, match="no features"):
            tsconv.features(empty, pipe)


def test_features_of_a_bfloat16_tensor_and_of_no_rows() -> None:
    x = torch.randn(300, 2, dtype=torch.float64).cumsum(0).add(100).to(torch.bfloat16)
    got = tsconv.features(x, PIPE, device="cpu")
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(
        got, tsconv.features(x.float(), PIPE, device="cpu"), rtol=0, atol=0, equal_nan=True
    )
    with pytest.raises(StoreError, match="empty") as err:
        tsconv.features(np.zeros((0, 2)), PIPE, device="cpu")
    assert "at least one row" in err.value.hint


def test_open_store_checks_the_time_as_a_run_does(tmp_path: Path) -> None:
    # an int64 time was passed through unchecked: a NaT first row and backwards times gave chunks
    x = price_series(50, 2, seed=8)
    for t, needle in ((np.r_[np.iinfo(np.int64).min, T0 + np.arange(1, 50)], "row 0 is missing"),
                      (T0 + np.arange(50)[::-1], "not strictly increasing at row 1")):  # fmt: skip
        src = write_store(tmp_path / f"{needle[:3]}.zarr", x)
        zarr.open_group(str(src), mode="r+")["time"][:] = t
        with pytest.raises(StoreError, match=needle):
            tsconv.open_store(src)
        with pytest.raises(StoreError, match=needle):
            next(iter(tsconv.iter_chunks(src)))


def test_iter_chunks_takes_any_sequence_of_names_native_byte_order_and_numpy_integers(tmp_path: Path) -> None:
    x = price_series(40, 3, seed=9)
    g = zarr.open_group(str(tmp_path / "be.zarr"), mode="w", zarr_format=2)
    g.create_array("values", data=x.astype(">f8"), chunks=(16, 3))
    g.attrs["features"] = ["a", "b", "c"]
    chunks = list(tsconv.iter_chunks(tmp_path / "be.zarr", rows=np.int64(16), columns=np.array(["c", "a"])))
    got = pl.concat(chunks)  # a big-endian store: Arrow holds no byte-swapped arrays
    assert got.columns == ["step", "c", "a"]
    np.testing.assert_array_equal(got.select("c", "a").to_numpy(), x[:, [2, 0]])
    assert (
        list(tsconv.iter_chunks(tmp_path / "be.zarr", columns=iter(["b"]), as_="arrow"))[0].num_columns == 2
    )
    with pytest.raises(ShapeError, match="a set"):
        tsconv.iter_chunks(tmp_path / "be.zarr", columns={"a", "b"})
    with pytest.raises(ShapeError, match="lists a feature twice: 'a'"):
        tsconv.iter_chunks(tmp_path / "be.zarr", columns=["a", "b", "a"])
    with pytest.raises(TsconvError, match="a store's path"):
        tsconv.open_store(None)


def test_an_integer_index_beside_a_time_column_is_row_labels_as_push_takes_it() -> None:
    # pd.concat of daily frames repeats the labels 0..4, sort_values('time') permutes them: features() refused
    # both as "not strictly increasing", hinting sort_index() and dropping repeats (half the rows gone)
    pd = pytest.importorskip("pandas")
    pipe = {"conv": [{"filters": ["diff:1"]}]}

    def day(d: int, seed: int) -> object:
        t = pd.date_range(f"2024-01-0{d} 09:30", periods=5, freq="min", tz="UTC")
        px = 100 + np.random.default_rng(seed).standard_normal(5).cumsum()
        return pd.DataFrame({"time": t, "px": px})

    both = pd.concat([day(2, 0), day(3, 1)])
    shuffled = pd.concat([day(3, 1), day(2, 0)], ignore_index=True).sort_values("time")
    want = np.diff(both["px"].to_numpy(), prepend=np.nan).astype(np.float32)
    for frame in (both, shuffled):
        got = tsconv.features(frame, pipe)
        assert got.index.equals(frame.index)
        np.testing.assert_array_equal(got["px.diff1"].to_numpy(), want)
        np.testing.assert_array_equal(tsconv.Stream(pipe, features=["px"]).push(frame)[:, 0], want)
    # the index is the time without a time column, or as a DatetimeIndex: still checked
    with pytest.raises(ShapeError, match="index is not strictly increasing") as err:
        tsconv.features(both.drop(columns="time"), pipe)
    assert "sort_index()" in err.value.hint
    backwards = both.set_index(both["time"].iloc[::-1].to_numpy())
    with pytest.raises(ShapeError, match="index is not strictly increasing") as err:
        tsconv.features(backwards, pipe)
    # the 'time' column is in order: sorting by the index would put the rows out of it
    assert "reset_index(drop=True)" in err.value.hint and "sort_index" not in err.value.hint


def test_a_pandas_series_is_told_to_frame_not_to_index_with_none() -> None:
    pd = pytest.importorskip("pandas")
    with pytest.raises(ShapeError, match="got 1-D") as err:
        tsconv.features(pd.Series(np.arange(10.0), name="px"), {"conv": [{"filters": ["diff:1"]}]})
    assert "series.to_frame()" in err.value.hint and "x[:, None]" not in err.value.hint


def test_pandas_columns_pyarrow_cannot_convert_are_named() -> None:
    pd = pytest.importorskip("pandas")
    pipe = {"conv": [{"filters": ["diff:1"]}]}
    # pyarrow's own errors escaped: "ArrowNotImplementedError: Unsupported numpy type 15"
    x = np.arange(10.0)
    for bad, dtype in (
        (x + 1j, "complex128"),
        (pd.arrays.SparseArray(x), "Sparse[float64"),
        (np.array([1.0, "x"] * 5, dtype=object), "object"),
    ):
        frame = pd.DataFrame({"px": x, "bad": bad})
        for run in (tsconv.Stream(pipe, features=["px", "bad"]).push, lambda f: tsconv.features(f, pipe)):
            with pytest.raises(ShapeError, match=rf"columns cannot be read: bad \({re.escape(dtype)}") as err:
                run(frame)
            assert "px" not in str(err.value) and "real numbers" in err.value.hint


def test_features_gives_a_time_column_in_seconds_its_type_back() -> None:
    """Frames pass through polars, which has no seconds: a pandas datetime64[s] column came back as [ms] and a
    pyarrow timestamp[s] as timestamp[ms] (the same instants, another type)."""
    import pandas as pd

    x = price_series(300, 2, seed=3)
    t = pd.date_range("2024-03-10", periods=300, freq="s", tz="US/Eastern").as_unit("s")
    df = pd.DataFrame({"time": t, "a": x[:, 0], "b": x[:, 1]})
    got = tsconv.features(df, "default", device="cpu")
    assert got["time"].dtype == df["time"].dtype and (got["time"] == df["time"]).all()
    table = pa.table({"time": pa.array(t.tz_convert("UTC").tz_localize(None).values, pa.timestamp("s", tz="UTC")),
                      "a": x[:, 0], "b": x[:, 1]})  # fmt: skip
    out = tsconv.features(table, "default", device="cpu")
    assert out.column("time").equals(table.column("time")) and out.column_names[0] == "time"


@pytest.mark.parametrize("kind", ["pandas", "pandas-arrow", "pyarrow"])
def test_a_time_column_at_a_fixed_offset_is_read_and_given_back(kind: str) -> None:
    """pd.to_datetime of ISO times ending in +05:30 gives datetime64[us, UTC+05:30], which polars cannot read:
    features() and push() raised polars' ComputeError ('unable to parse time zone'). The times are read as
    their instants, and the result's time column has the input's type and zone."""
    import pandas as pd

    x = price_series(50, 2, seed=2)
    t = pd.to_datetime([f"2024-01-02T09:{m:02d}:00+05:30" for m in range(50)])
    df = pd.DataFrame({"time": t, "a": x[:, 0], "b": x[:, 1]})
    if kind == "pandas-arrow":
        df = df.astype({"time": pd.ArrowDtype(pa.timestamp("ns", tz="+05:30"))})
    frame = pa.Table.from_pandas(df, preserve_index=False) if kind == "pyarrow" else df
    got = tsconv.features(frame, PIPE, device="cpu")
    want = tsconv.features(x, PIPE, names=["a", "b"], device="cpu")
    if kind == "pyarrow":
        assert got.column("time").equals(frame.column("time"))
        values = np.stack([got.column(n).to_numpy() for n in got.column_names[1:]], axis=1)
    else:
        assert got["time"].dtype == df["time"].dtype and (got["time"] == df["time"]).all()
        values = got.drop(columns="time").to_numpy()
    np.testing.assert_array_equal(values, want)
    stream = tsconv.Stream(PIPE, features=["a", "b"], device="cpu")
    np.testing.assert_array_equal(stream.push(frame), want)
    assert stream.last_time == np.datetime64("2024-01-02T04:19:00")  # 09:49 at +05:30, in UTC


@pytest.mark.parametrize("route", ["array", "pandas", "stream"])
def test_an_empty_feature_name_is_refused_on_every_route(route: str) -> None:
    """A store's empty feature name is refused when it opens; an array's names, a frame's column and a
    stream's features were taken, and their outputs named ".diff1"."""
    import pandas as pd

    x = price_series(300, 2, seed=1)
    with pytest.raises(ShapeError, match="feature 0 has an empty name"):
        if route == "array":
            tsconv.features(x, names=["", "b"], device="cpu")
        elif route == "pandas":
            tsconv.features(pd.DataFrame({"": x[:, 0], "b": x[:, 1]}), device="cpu")
        else:
            tsconv.Stream("default", features=["", "b"], device="cpu")


def _frame_kinds(df: pl.DataFrame) -> dict[str, object]:
    return {"polars": df, "pandas": df.to_pandas(), "pyarrow": df.to_arrow()}


def test_integers_beyond_2_53_in_a_frame_are_warned_of_as_in_an_array() -> None:
    # the frame's read stacked int64 columns as float64 (and polars' to_numpy turned one with a null into
    # float64) before the check of integer dtypes saw them: rounded without a word
    import pandas as pd

    big = [None] + (2**53 + 1 + 3 * np.arange(1, 300)).tolist()
    small = pl.Series("a", big[1:]).cast(pl.Float64).to_list()  # a float feature beside it
    pipe = {"conv": [{"filters": ["id", "diff:1"]}]}
    frames = {
        "polars": pl.DataFrame({"b": [1.0] + small, "a": pl.Series(big[1:] + [big[1]], dtype=pl.Int64)}),
        "polars with a null": pl.DataFrame({"b": [1.0] + small, "a": pl.Series(big, dtype=pl.Int64)}),
        "pandas Int64": pd.DataFrame({"b": [1.0] + small, "a": pd.array(big, dtype="Int64")}),
        "pyarrow uint64": pa.table({"b": [1.0] + small, "a": pa.array(big, pa.uint64())}),
    }
    said = r"feature 'a' holds integers beyond 2\^53 \(e\.g\. 9,007,199,254,74.*\), which float64 rounds"
    for kind, frame in frames.items():
        with pytest.warns(tsconv.TsconvWarning, match=said) as record:
            tsconv.features(frame, pipe, device="cpu")
        assert len([w for w in record if "2^53" in str(w.message)]) == 1, kind
        stream = tsconv.Stream(pipe, features=["b", "a"], device="cpu")
        with pytest.warns(tsconv.TsconvWarning, match=said):
            stream.push(frame)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per stream, as for arrays
            stream.push(frame)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tsconv.features(pl.DataFrame({"a": [2**53, None, -(2**53)]}), pipe, device="cpu")


def test_a_column_of_nulls_only_does_not_widen_the_read_of_the_others() -> None:
    # it was cast to Float64, so the frame read as float64 and a dense first stage gave the other columns'
    # outputs other bits than the same frame with that column Float32 (and a stream's later push switched)
    rng = np.random.default_rng(1)
    x = (np.cumsum(rng.normal(size=(600, 3)), 0) + 100).astype(np.float32)
    w = rng.normal(size=(4, 3, 5)).astype(np.float32)
    pipe = {"conv": [{"weights": np.concatenate([w, w]), "groups": 2, "weight_dtype": "float32"}]}
    typed = pl.DataFrame({k: x[:, j % 3] if j < 3 else np.full(600, np.nan, np.float32)
                          for j, k in enumerate("abcdef")}).fill_nan(None)  # fmt: skip
    want = tsconv.features(typed, pipe, device="cpu").to_numpy()
    nulls = typed.with_columns(pl.lit(None).alias("d"))
    for kind, frame in _frame_kinds(nulls).items():
        got = tsconv.features(frame, pipe, device="cpu")
        got = got.to_numpy() if kind != "pyarrow" else pl.from_arrow(got).to_numpy()
        np.testing.assert_array_equal(got, want, err_msg=kind)
    # other columns of float64 still read as float64
    wide = nulls.with_columns(pl.col("a", "b", "c").cast(pl.Float64))
    np.testing.assert_array_equal(
        tsconv.features(wide, pipe, device="cpu").to_numpy(),
        tsconv.features(wide.with_columns(pl.col("d").cast(pl.Float64)), pipe, device="cpu").to_numpy(),
    )
    # pushes with the column of nulls in the later ones equal features() of all rows
    small = {"conv": [{"weights": w, "weight_dtype": "float32"}]}
    rows = typed.select("a", "b", "c")
    stream = tsconv.Stream(small, features=["a", "b", "c"], device="cpu")
    cuts = [0, 7, 65, 300, 450, 600]
    pushed = [
        rows[a:b].with_columns(pl.lit(None).alias("c")) if a >= 300 else rows[a:b]
        for a, b in zip(cuts, cuts[1:], strict=False)
    ]
    got = np.concatenate([stream.push(p) for p in pushed])
    np.testing.assert_array_equal(
        got, tsconv.features(pl.concat(pushed, how="vertical_relaxed"), small, device="cpu").to_numpy()
    )


def test_an_output_named_as_the_time_column_is_refused_before_computing() -> None:
    # polars raised its own DuplicateError as it put the time column beside the outputs
    df = pl.DataFrame({"x.id": np.arange(50), "x": np.arange(50.0) + 100})
    for kind, frame in _frame_kinds(df).items():
        with pytest.raises(
            ShapeError, match="the output 'x.id' has the name of the frame's time column"
        ) as err:
            tsconv.features(
                frame, {"conv": [{"filters": ["id", "diff:1"]}]}, time_column="x.id", device="cpu"
            )
        assert "rename the time column or the feature" in err.value.hint, kind


def test_frame_time_centuries_apart_is_compared_not_differenced() -> None:
    # the check differenced the int64 ns times: 2200 -> 1750 wrapped to a positive step and was taken (a frame
    # running backwards computed as in order), and 1750 -> 2200 wrapped negative and was refused
    import pandas as pd

    x = np.array([100.0, 101.0, 102.0])
    back = np.array(["2200-01-01", "1750-01-01", "1750-01-02"], dtype="datetime64[ns]")
    for frame in (pl.DataFrame({"time": back, "a": x}), pd.DataFrame({"time": back, "a": x})):
        with pytest.raises(ShapeError, match="not strictly increasing at row 1"):
            tsconv.features(frame, PIPE, device="cpu")
    ahead = np.array(["1750-01-01", "2200-01-01", "2200-01-02"], dtype="datetime64[ns]")
    got = tsconv.features(pl.DataFrame({"time": ahead, "a": x}), PIPE, device="cpu")
    assert got["time"].to_numpy().astype("datetime64[ns]").tolist() == ahead.tolist()


def test_an_object_column_of_datetimes_at_a_fixed_offset_is_a_clear_error() -> None:
    # datetime objects at +05:30 in an object column: polars' ComputeError 'unable to parse time zone' escaped
    import datetime as dt

    import pandas as pd

    tz = dt.timezone(dt.timedelta(hours=5, minutes=30))
    times = [dt.datetime(2024, 1, 1, 9, 30 + k, tzinfo=tz) for k in range(3)]
    df = pd.DataFrame({"time": pd.Series(times, dtype=object), "a": [1.0, 2.0, 3.0]})
    with pytest.raises(
        tsconv.TsconvError,
        match=r"cannot be read: time \(object.*pd.to_datetime\(frame\['time'\], utc=True\)",
    ):
        tsconv.features(df, {"conv": [{"filters": ["lag:1"]}]})


def test_a_column_selection_of_a_zarr2_store_with_a_blosc_chunk_cut_short_is_a_store_error(
    tmp_path: Path,
) -> None:
    # zarr reads a zarr 2 store, and its c-blosc decoded a chunk file that lost its last bytes from the
    # memory past them: iter_chunks(columns=...) gave other numbers for the last row, without a word
    import numcodecs

    x = np.arange(3000 * 4, dtype=np.float32).reshape(3000, 4)
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=2)
    g.create_array("values", data=x, chunks=(1000, 4), compressors=numcodecs.Blosc(cname="lz4", clevel=0))
    g.attrs["features"] = ["a", "b", "c", "d"]
    chunk = tmp_path / "s.zarr" / "values" / "1.0"
    chunk.write_bytes(chunk.read_bytes()[:-16])
    with pytest.raises(
        StoreError, match=r"chunk file 1\.0 \(rows 1,000..1,999\): the Blosc frame .*cut short"
    ):
        list(tsconv.iter_chunks(tmp_path / "s.zarr", rows=1000, columns=["b", "d"], as_="numpy"))
