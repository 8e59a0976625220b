"""Stores written by xarray (``Dataset.to_zarr``): values, feature names and CF-encoded time read as xarray
means them, copied to the output as int64 ns, and the refusals for what tsconv cannot decode."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import tsconv
from tsconv.cli import main
from tsconv.errors import ShapeError, StoreError

from ..helpers import price_series

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")

ROWS, FEATURES = 600, 3  # longer than the default pipeline's warm-up of 256 steps
PIPE = {"conv": [{"filters": ["ma:4", "diff:1"]}]}


def _ns(times) -> np.ndarray:  # noqa: ANN001
    """pandas datetimes as int64 ns (pandas may hold them in another resolution)."""
    return np.asarray(times).astype("datetime64[ns]").view(np.int64)


def _write(ds, path: Path, **kw) -> Path:  # noqa: ANN001
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr: fixed-length strings and consolidated metadata in format 3
        ds.to_zarr(str(path), **kw)
    return path


def _dataset(times, *, var: str = "values", dims: tuple[str, str] = ("time", "feature"), names=None):  # noqa: ANN001, ANN202
    x = price_series(len(times), FEATURES, seed=3)
    names = [f"s{j}" for j in range(FEATURES)] if names is None else names
    return xr.Dataset({var: (dims, x)}, coords={dims[0]: times, dims[1]: names}), x


CASES = {
    # name: (times, time encoding, data variable, dimensions)
    "seconds": (pd.date_range("2026-01-02 09:30", periods=ROWS, freq="s"), {}, "values", ("time", "feature")),
    "days": (
        pd.date_range("1999-12-01", periods=ROWS, freq="D"),
        {"units": "days since 1990-06-15"},
        "px",
        ("t", "sensor"),
    ),
    "float days, offset": (
        pd.date_range("2026-01-02 09:30", periods=ROWS, freq="min"),
        {"units": "days since 2026-01-01T00:00:00+01:00", "dtype": "float64"},
        "values",
        ("time", "sensor"),
    ),
}


@pytest.mark.parametrize("zarr_format", [3, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_process_copies_the_decoded_time_and_names_features_from_the_coordinate(
    tmp_path: Path, case: str, zarr_format: int
) -> None:
    times, enc, var, dims = CASES[case]
    ds, x = _dataset(times, var=var, dims=dims)
    src = _write(ds, tmp_path / "in.zarr", zarr_format=zarr_format, encoding={dims[0]: enc})
    store = tsconv.open_input(src)
    assert store.features == ("s0", "s1", "s2") and store.time is not None and not store.time.plain
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=256)
    g = zarr.open_group(str(out), mode="r")
    np.testing.assert_array_equal(np.asarray(g["time"][:]), _ns(times))
    assert g.attrs["features"] == [f"s{j}.{f}" for j in range(FEATURES) for f in ("ma4", "diff1")]
    want = tsconv.features(x, PIPE, names=["s0", "s1", "s2"])
    np.testing.assert_array_equal(np.asarray(g["values"][:]), want)


def test_inspect_shows_the_decoded_span_and_the_coordinate_names(tmp_path: Path) -> None:
    times = pd.date_range("2026-01-02 09:30", periods=ROWS, freq="s")
    src = _write(_dataset(times, dims=("time", "instrument"))[0], tmp_path / "in.zarr", zarr_format=3)
    info = json.loads(CliRunner().invoke(main, ["inspect", str(src), "--json"]).output)
    assert info["time_span"] == "2026-01-02T09:30:00+00:00 .. 2026-01-02T09:39:59+00:00"
    assert info["features"] == ["s0", "s1", "s2"]
    assert "seconds since" in info["time_encoding"]
    chunk = next(tsconv.open_store(src).iter_chunks(rows=100))
    assert chunk.columns == ["time", "s0", "s1", "s2"]
    np.testing.assert_array_equal(chunk["time"].dt.epoch("ns").to_numpy(), _ns(times[:100]))


def test_nanosecond_units_bytes_names_and_a_non_time_first_coordinate(tmp_path: Path) -> None:
    times = pd.date_range("2026-01-02", periods=ROWS, freq="ns")
    ds, _ = _dataset(times, names=np.array([b"a", b"bb", b"c"]))
    src = _write(
        ds, tmp_path / "ns.zarr", zarr_format=2, encoding={"time": {"units": "nanoseconds since 1970-01-01"}}
    )
    store = tsconv.open_input(src)
    assert store.features == ("a", "bb", "c")
    np.testing.assert_array_equal(store.time[:], _ns(times))
    # an integer index coordinate is not a time: no time, and a name from it is still read
    step = xr.Dataset(
        {"values": (("step", "feature"), np.zeros((10, 2)))},
        coords={"step": np.arange(10), "feature": ["p", "q"]},
    )
    store = tsconv.open_input(_write(step, tmp_path / "step.zarr", zarr_format=3))
    assert store.time is None and store.features == ("p", "q")


def test_a_missing_time_is_refused_naming_its_row(tmp_path: Path) -> None:
    times = pd.date_range("2026-01-02", periods=ROWS, freq="s").to_numpy().copy()
    times[417] = np.datetime64("NaT")
    src = _write(_dataset(times)[0], tmp_path / "in.zarr", zarr_format=3)
    with pytest.raises(StoreError, match="the time of row 417 is missing"):
        tsconv.process(src, tmp_path / "out.zarr", pipeline=PIPE, device="cpu")
    assert not (tmp_path / "out.zarr").exists()
    v2 = _write(
        _dataset(times)[0], tmp_path / "v2.zarr", zarr_format=2
    )  # xarray's _FillValue: the fill value
    with pytest.raises(StoreError, match="the time of row 417 is missing"):
        tsconv.process(v2, tmp_path / "out.zarr", pipeline=PIPE, device="cpu")


def test_a_plain_zarr_2_time_may_hold_zarrs_default_fill_value(tmp_path: Path) -> None:
    # "days since" the first day holds 0 at row 0, zarr 2's default fill value: it was refused as missing
    g = zarr.open_group(str(tmp_path / "in.zarr"), mode="w", zarr_format=2)
    g.create_array("values", data=price_series(50, 2, seed=5))
    t = g.create_array("time", data=np.arange(50, dtype="int64"))
    t.attrs.update({"units": "days since 2026-01-02", "calendar": "standard"})
    assert t.metadata.fill_value == 0
    tsconv.process(tmp_path / "in.zarr", tmp_path / "out.zarr", pipeline=PIPE, device="cpu")
    got = zarr.open_group(str(tmp_path / "out.zarr"), mode="r")["time"][:]
    np.testing.assert_array_equal(got, _ns(pd.date_range("2026-01-02", periods=50, freq="D")))


def test_a_calendar_other_than_gregorian_is_refused(tmp_path: Path) -> None:
    times = pd.date_range("2026-01-02", periods=ROWS, freq="s")
    src = _write(_dataset(times)[0], tmp_path / "in.zarr", zarr_format=3, consolidated=False)
    zarr.open_array(str(src / "time"), mode="r+").attrs["calendar"] = "noleap"
    res = CliRunner().invoke(main, ["inspect", str(src)])
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert "calendar 'noleap'" in res.output and "convert_calendar" in res.output


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_packed_time_is_refused_not_decoded_without_its_scale(tmp_path: Path, zarr_format: int) -> None:
    # half-hours stored as int32 with scale_factor 0.5 and units of hours: xarray unpacks before decoding the
    # dates (00:00, 00:30, ...); decoded without the scale, every time came back twice as far from the reference
    g = zarr.open_group(str(tmp_path / "in.zarr"), mode="w", zarr_format=zarr_format)
    dims = {"dimension_names": ["time"]} if zarr_format == 3 else {}
    t = g.create_array("time", shape=(ROWS,), dtype="i4", chunks=(ROWS,), **dims)
    t[:] = np.arange(ROWS)
    t.attrs.update({"units": "hours since 2026-01-02", "scale_factor": 0.5, "_ARRAY_DIMENSIONS": ["time"]})
    v = g.create_array("values", shape=(ROWS, FEATURES), dtype="f4", chunks=(ROWS, FEATURES))
    v[:] = np.ones((ROWS, FEATURES), np.float32)
    res = CliRunner().invoke(main, ["inspect", str(tmp_path / "in.zarr")])
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert "the time array is CF-packed (scale_factor=0.5)" in res.output


def test_a_features_attribute_that_disagrees_with_the_coordinate_is_refused(tmp_path: Path) -> None:
    # xarray keeps a Dataset's attributes through sortby: the attribute's order then labelled the columns
    # sorted by the coordinate, so MSFT's features were GOOG's
    times = pd.date_range("2026-01-02", periods=ROWS, freq="s")
    x = np.stack([np.arange(ROWS) * f for f in (1.0, 10.0, 100.0)], 1).astype(np.float32)
    ds = xr.Dataset({"values": (("time", "feature"), x)}, coords={"time": times, "feature": ["AAPL", "MSFT", "GOOG"]},
                    attrs={"features": ["AAPL", "MSFT", "GOOG"]})  # fmt: skip
    agree = _write(ds, tmp_path / "agree.zarr", zarr_format=3)
    assert tsconv.open_input(agree).features == ("AAPL", "MSFT", "GOOG")
    src = _write(ds.sortby("feature"), tmp_path / "sorted.zarr", zarr_format=3)
    with pytest.raises(StoreError, match="column 1 is 'MSFT' in the attribute and 'GOOG' in the coordinate"):
        tsconv.open_input(src)


def test_a_scalar_time_coordinate_leaves_the_time_to_the_dated_dimension(tmp_path: Path) -> None:
    # ds.assign_coords(time=run_time) beside a 'date' dimension: the store was refused as having no data
    # variable along 'time'
    dates = pd.date_range("2026-01-02", periods=ROWS, freq="D")
    ds, x = _dataset(dates)
    ds = ds.rename({"time": "date"}).assign_coords(time=np.datetime64("2026-06-01"))
    store = tsconv.open_input(_write(ds, tmp_path / "in.zarr", zarr_format=3))
    assert store.values.shape == (ROWS, FEATURES)
    assert (np.asarray(store.time[:]) == _ns(dates)).all()


def test_a_data_variable_with_time_second_is_refused_with_the_transpose(tmp_path: Path) -> None:
    times = pd.date_range("2026-01-02", periods=ROWS, freq="s")
    ds, _ = _dataset(times, var="px")
    src = _write(ds.transpose("feature", "time"), tmp_path / "in.zarr", zarr_format=3)
    with pytest.raises(
        StoreError, match="'px' has dimensions \\('feature', 'time'\\): time is its second"
    ) as err:
        tsconv.open_input(src)
    assert "ds.transpose('time', 'feature')" in err.value.hint


def test_several_data_variables_are_refused_listing_them(tmp_path: Path) -> None:
    times = pd.date_range("2026-01-02", periods=ROWS, freq="s")
    ds, x = _dataset(times, var="bid")
    ds["ask"] = (("time", "feature"), x + 1)
    ds["note"] = ("feature", ["u", "v", "w"])  # not along time: never a candidate
    src = _write(ds, tmp_path / "in.zarr", zarr_format=3)
    with pytest.raises(StoreError, match="2 2-D data variables along 'time': ask, bid; expected one") as err:
        tsconv.open_input(src)
    assert "ds[['name']]" in err.value.hint
    one = _write(ds[["bid"]], tmp_path / "one.zarr", zarr_format=3)
    assert tsconv.open_input(one).values.basename == "bid"


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_values_variable_with_time_second_is_refused_not_read_transposed(
    tmp_path: Path, zarr_format: int
) -> None:
    # 8 steps of 8 symbols, (symbol, time): read as [T, F] it was the transpose, silently
    times = pd.date_range("2026-01-02", periods=8, freq="min")
    x = price_series(8, 8, seed=4)
    names = [f"s{j}" for j in range(8)]
    ds = xr.Dataset({"values": (("symbol", "time"), x.T)}, coords={"symbol": names, "time": times})
    ds.attrs["features"] = names
    src = _write(ds, tmp_path / "in.zarr", zarr_format=zarr_format)
    with pytest.raises(
        StoreError, match=r"'values' has dimensions \('symbol', 'time'\): time is its second"
    ) as err:
        tsconv.open_input(src)
    assert "ds.transpose('time', 'symbol')" in err.value.hint
    ok = _write(ds.transpose("time", "symbol"), tmp_path / "ok.zarr", zarr_format=zarr_format)
    np.testing.assert_array_equal(tsconv.open_input(ok).values[:], x)


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("var", ["values", "px"])
def test_time_second_is_refused_when_the_time_dimension_has_no_coordinate(
    tmp_path: Path, zarr_format: int, var: str
) -> None:
    # no 'time' array is written: 3 symbols were read as 3 steps and 200 steps as features f0..f199
    x = price_series(200, 3, seed=5)
    da = xr.DataArray(x.T, dims=("sym", "time"), coords={"sym": ["a", "b", "c"]}, name=var)
    src = _write(da.to_dataset(), tmp_path / "in.zarr", zarr_format=zarr_format)
    with pytest.raises(
        StoreError, match=rf"'{var}' has dimensions \('sym', 'time'\): time is its second"
    ) as err:
        tsconv.open_input(src)
    assert "ds.transpose('time', 'sym')" in err.value.hint
    ok = _write(da.transpose("time", "sym").to_dataset(), tmp_path / "ok.zarr", zarr_format=zarr_format)
    store = tsconv.open_input(ok)
    assert store.features == ("a", "b", "c") and store.time is None
    np.testing.assert_array_equal(store.values[:], x)


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("dates", [None, "yyyymmdd", "steps"])
def test_a_variable_whose_first_coordinate_names_the_features_is_refused_not_read_transposed(
    tmp_path: Path, zarr_format: int, dates: str | None
) -> None:
    # (sym, date) with ticker names on sym: without a date coordinate, 3 symbols were read as 3 steps and 200
    # dates as features f0..f199, silently; with integer dates the hint said to make them strings, which gave
    # that same transposed read. features() of the same DataArray reads it as (date, sym).
    x = price_series(200, 3, seed=6)
    coords: dict = {"sym": ["a", "b", "c"]}
    if dates == "yyyymmdd":
        coords["date"] = 20240101 + np.arange(200)
    elif dates == "steps":
        coords["date"] = np.arange(200)
    da = xr.DataArray(x.T, dims=("sym", "date"), coords=coords, name="px")
    src = _write(da.to_dataset(), tmp_path / "in.zarr", zarr_format=zarr_format)
    with pytest.raises(
        StoreError,
        match=r"'px' has dimensions \('sym', 'date'\) and the coordinate of its first, 'sym', holds names",
    ) as err:
        tsconv.open_input(src)
    assert "ds.transpose('date', 'sym')" in err.value.hint
    assert tsconv.features(da, PIPE, device="cpu").dims == ("date", "output")
    ok = _write(da.transpose("date", "sym").to_dataset(), tmp_path / "ok.zarr", zarr_format=zarr_format)
    store = tsconv.open_input(ok)
    assert store.features == ("a", "b", "c") and store.time is None
    np.testing.assert_array_equal(store.values[:], x)


@pytest.mark.parametrize("zarr_format", [3, 2])
def test_one_variable_per_symbol_is_refused_with_the_stack_that_reads_it(
    tmp_path: Path, zarr_format: int
) -> None:
    # xr.Dataset({"AAPL": series, ...}): the refusal said only what a group should hold, not how to get there
    times = pd.date_range("2026-01-02", periods=ROWS, freq="s")
    x = price_series(ROWS, FEATURES, seed=3)
    names = ["MSFT", "AAPL", "GOOG"]
    ds = xr.Dataset({n: ("time", x[:, j]) for j, n in enumerate(names)}, coords={"time": times})
    src = _write(ds, tmp_path / "per.zarr", zarr_format=zarr_format)
    res = CliRunner().invoke(main, ["inspect", str(src)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "3 1-D data variables along 'time' (AAPL, GOOG, MSFT), one per feature" in res.output
    with pytest.raises(StoreError) as err:
        tsconv.open_input(src)
    hint = err.value.hint
    assert "ds.to_dataarray('feature').transpose('time', 'feature').to_dataset(name='values')" in hint
    stacked = _write(  # the hint's stack, as given
        ds.to_dataarray("feature").transpose("time", "feature").to_dataset(name="values"),
        tmp_path / "stacked.zarr",
        zarr_format=zarr_format,
    )
    store = tsconv.open_input(stacked)
    assert store.features == tuple(names)
    np.testing.assert_array_equal(store.values[:], x)


def test_a_store_of_xarray_groups_is_refused_naming_them(tmp_path: Path) -> None:
    # ds.to_zarr(path, group="fx"): the root holds groups only, and was said to have "nothing"
    ds, x = _dataset(pd.date_range("2026-01-02", periods=ROWS, freq="s"))
    src = _write(ds, tmp_path / "in.zarr", zarr_format=3, group="fx")
    _write(ds, src, zarr_format=3, group="eq/daily")
    res = CliRunner().invoke(main, ["inspect", str(src)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "it holds the groups 'eq', 'fx'" in res.output and f"{src}/eq" in res.output
    np.testing.assert_array_equal(tsconv.open_input(src / "fx").values[:], x)


def test_repeated_coordinate_names_and_packed_values_are_refused(tmp_path: Path) -> None:
    times = pd.date_range("2026-01-02", periods=ROWS, freq="s")
    src = _write(_dataset(times, names=["a", "b", "a"])[0], tmp_path / "dup.zarr", zarr_format=3)
    with pytest.raises(StoreError, match=r"feature names repeat \(1 repeat of 1 name: 'a'\)"):
        tsconv.open_input(src)
    ds, _ = _dataset(times)
    ds["values"].encoding.update(scale_factor=0.01, dtype="int16")
    src = _write(ds, tmp_path / "packed.zarr", zarr_format=3)
    with pytest.raises(StoreError, match="'values' is CF-packed"):
        tsconv.open_input(src)


@pytest.mark.parametrize("zarr_format", [3, 2])
@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_a_scale_of_one_and_an_offset_of_zero_are_read_not_refused_as_packing(
    tmp_path: Path, zarr_format: int, dtype: str
) -> None:
    # xarray keeps scale_factor=1, add_offset=0 in the encoding of a variable read from netCDF and writes them to
    # zarr again: the stored values are the values (xarray reads the same numbers), and were refused as CF-packed
    ds, x = _dataset(pd.date_range("2026-01-02", periods=ROWS, freq="s"))
    x = np.round(x * 100) if dtype == "int16" else x
    ds["values"] = (("time", "feature"), x.astype(dtype))
    ds["values"].encoding.update(scale_factor=1.0, add_offset=0.0)
    src = _write(ds, tmp_path / "s.zarr", zarr_format=zarr_format)
    assert zarr.open_group(str(src), mode="r")["values"].attrs["scale_factor"] == 1.0
    np.testing.assert_array_equal(xr.open_zarr(src)["values"].values, x.astype(dtype))
    np.testing.assert_array_equal(tsconv.open_input(src).values[:], x.astype(dtype))
    ds["values"].encoding.update(scale_factor=1.0, add_offset=0.5)  # an offset alone moves every value
    src = _write(ds, tmp_path / "offset.zarr", zarr_format=zarr_format)
    with pytest.raises(StoreError, match=r"'values' is CF-packed \(add_offset=0.5\)"):
        tsconv.open_input(src)


@pytest.mark.parametrize("zarr_format", [3, 2])
@pytest.mark.parametrize(
    ("dtype", "encoding", "attrs", "refused"),
    [
        ("float32", {"_FillValue": -9999.0}, {}, "marks missing values with (_FillValue|fill_value) = -9999"),
        ("int32", {"_FillValue": -1}, {}, "marks missing values with (_FillValue|fill_value) = -1"),
        ("float32", {}, {"missing_value": -999.0}, "marks missing values with missing_value = -999"),
        # a netCDF attribute copied over: a list of markers, each read as NaN
        (
            "float32",
            {},
            {"missing_value": [-9999.0, -8888.0]},
            r"marks missing values with missing_value\[0\] = -9999",
        ),
        ("float32", {}, {"missing_value": [float("nan"), -8888.0]}, r"missing_value\[1\] = -8888"),
        ("int8", {}, {"_Unsigned": "true"}, "int8 values marked _Unsigned='true'.*as unsigned"),
        (
            "uint8",
            {},
            {"_Unsigned": "false"},
            "uint8 values marked _Unsigned='false'.*as signed",
        ),  # netCDF's bytes
        ("float32", {}, {}, None),  # NaN is xarray's own marker for floats: read
        ("int32", {}, {}, None),
        ("uint8", {}, {"_Unsigned": "true"}, None),  # says what the dtype says
    ],
    ids=[
        "float-fill",
        "int-fill",
        "missing-value",
        "missing-list",
        "missing-list-nan",
        "unsigned",
        "signed",
        "float",
        "int",
        "unsigned-agrees",
    ],  # fmt: skip
)
def test_values_xarray_would_decode_are_refused_not_read_as_data(
    tmp_path: Path, zarr_format: int, dtype: str, encoding: dict, attrs: dict, refused: str | None
) -> None:
    # xarray reads cells equal to a _FillValue / missing_value as NaN, and _Unsigned bytes as unsigned: read as
    # stored, -9999 would have entered the features as a price
    times = pd.date_range("2026-01-02", periods=ROWS, freq="s")
    ds, x = _dataset(times)
    ds["values"] = ds["values"].astype(dtype)
    ds["values"].attrs.update(attrs)
    if encoding:
        ds["values"].encoding.update(encoding)
    src = _write(ds, tmp_path / "s.zarr", zarr_format=zarr_format)
    if refused is None:
        assert tsconv.open_input(src).values.shape == (ROWS, FEATURES)
        return
    with pytest.raises(StoreError, match=refused):
        tsconv.open_input(src)


def test_an_array_inside_a_store_is_read_bare_with_a_warning_and_its_cf_markers_refused(
    tmp_path: Path,
) -> None:
    # -i STORE/values: no time, f0.. names (the store's own are one level up), said; a -9999 fill marker on the
    # array itself is refused as it is for the store
    from tsconv.errors import TsconvWarning

    times = pd.date_range("2026-01-02", periods=ROWS, freq="s")
    ds, _ = _dataset(times)
    src = _write(ds, tmp_path / "s.zarr", zarr_format=3)
    with pytest.warns(
        TsconvWarning, match="is an array inside the store .*read bare, with no time column"
    ) as seen:
        store = tsconv.open_input(src / "values")
    # the advice holds for every command: `tsconv inspect` takes the store as its argument, it has no -i
    assert f"give the store itself, {str(src)!r}," in str(seen[0].message)
    assert store.time is None and store.features[0] == "f0"
    ds["values"].encoding.update(_FillValue=-9999.0)
    marked = _write(ds, tmp_path / "m.zarr", zarr_format=3)
    with pytest.raises(StoreError, match="marks missing values with _FillValue = -9999"):
        tsconv.open_input(marked / "values")


def test_an_array_of_a_nested_group_read_bare_names_its_group_not_the_root(tmp_path: Path) -> None:
    # to_zarr(group="eq/daily"): the root holds no series, so the warning sent the user to an error; it names
    # the group holding the array, which reads with its time and names
    from tsconv.errors import TsconvWarning

    times = pd.date_range("2026-01-02", periods=ROWS, freq="s")
    src = _write(_dataset(times)[0], tmp_path / "s.zarr", zarr_format=3, group="eq/daily")
    with pytest.warns(TsconvWarning, match="read bare") as seen:
        tsconv.open_input(src / "eq" / "daily" / "values")
    group = src / "eq" / "daily"
    assert f"give the store itself, {str(group)!r}," in str(seen[0].message)
    store = tsconv.open_input(group)  # what the warning names reads as the series it is
    assert store.time is not None and store.features[0] != "f0"


def test_ingest_does_not_append_to_an_xarray_store(tmp_path: Path) -> None:
    import polars as pl

    from tsconv.io.ingest import ingest

    times = pd.date_range("2026-01-02", periods=ROWS, freq="s")
    src = _write(_dataset(times)[0], tmp_path / "in.zarr", zarr_format=3)
    later = int(_ns(times)[-1]) + 10**9
    pl.DataFrame({"time": [later], "feature": ["s0"], "value": [1.0]}).write_parquet(tmp_path / "new.parquet")
    with pytest.raises(StoreError, match="not in tsconv's own layout .*seconds since 2026-01-02"):
        ingest(tmp_path / "new.parquet", src, append=True)


def test_features_of_a_dataarray_in_either_order_names_by_its_coordinate() -> None:
    # a (symbol, time) DataArray went through np.asarray: 3 symbols read as 3 steps, names f0...
    times = pd.date_range("2026-01-02", periods=ROWS, freq="min")
    ds, x = _dataset(times, dims=("time", "symbol"))
    da = ds["values"]
    want, names = tsconv.features(x, PIPE, names=["s0", "s1", "s2"], device="cpu", return_names=True)
    for arr in (da, da.T):
        got = tsconv.features(arr, PIPE, device="cpu")
        assert isinstance(got, xr.DataArray) and got.dims == ("time", "output")
        assert tuple(got["output"].values) == names and (got["time"].values == times.values).all()
        np.testing.assert_array_equal(got.values, want)
    dated = xr.DataArray(
        x.T, dims=("sym", "date"), coords={"sym": ["s0", "s1", "s2"], "date": 20240101 + np.arange(ROWS)}
    )
    got = tsconv.features(dated, PIPE, device="cpu")  # integer dates: the names' dimension is the features'
    assert got.dims == ("date", "output") and tuple(got["output"].values) == names
    np.testing.assert_array_equal(got.values, want)
    bare = xr.DataArray(x.T, dims=("sym", "t"))  # no coordinates: the first dimension is time
    assert tsconv.features(bare, PIPE, device="cpu").shape == (FEATURES, 2 * ROWS)
    framed = xr.DataArray(pd.DataFrame(x))  # a pandas frame's default index and columns: 0..n-1 on both
    np.testing.assert_array_equal(tsconv.features(framed, PIPE, device="cpu").values, want)
    # coordinates of one kind on both dimensions (dates read as strings, or yyyymmdd and permno integers):
    # the first dimension was taken as time, 3 symbols computed as 3 steps; refused unless named
    for sym, date in ((["s0", "s1", "s2"], [f"2024-01-{d:02d}" for d in range(1, ROWS + 1)]),
                      ([10107, 14593, 90319], 20240101 + np.arange(ROWS))):  # fmt: skip
        both = xr.DataArray(x.T, dims=("sym", "date"), coords={"sym": sym, "date": date})
        for arr in (both, both.T):
            with pytest.raises(
                ShapeError, match="which of the DataArray's dimensions .* is time is ambiguous"
            ):
                tsconv.features(arr, PIPE, device="cpu")
            got = tsconv.features(arr, PIPE, device="cpu", time_column="date")
            assert got.dims == ("date", "output") and got.shape == (ROWS, 2 * FEATURES)
            np.testing.assert_array_equal(got.values, want)
    # a time_column no dimension has was ignored, and the rules above picked one
    with pytest.raises(ShapeError, match=r"no dimension 'Date' \(its dimensions: \('sym', 'date'\)\)"):
        tsconv.features(dated, PIPE, device="cpu", time_column="Date")
    with pytest.raises(ShapeError, match="time coordinate is not strictly increasing"):
        tsconv.features(da.isel(time=slice(None, None, -1)), PIPE, device="cpu")
    with pytest.raises(ShapeError, match="one xarray DataArray"):
        tsconv.features(ds, PIPE, device="cpu")
    with pytest.raises(ShapeError, match="named by its 'symbol' coordinate"):
        tsconv.features(da, PIPE, device="cpu", names=["a", "b", "c"])


def test_a_dataarray_dated_by_date_objects_tz_aware_times_or_periods_is_read_as_its_pandas_frame() -> None:
    # date objects (groupby(ts.dt.date)) counted as names: integer permnos were taken as time, each symbol
    # computed across symbols, silently; string tickers refused as "both hold names"; tz-aware and Period
    # coordinates raised numpy's TypeError, time_column given or not
    import datetime as dt

    x = price_series(ROWS, FEATURES, seed=5)
    days = pd.Index([dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(ROWS)], name="date")
    frames = [
        pd.DataFrame(x, index=days, columns=pd.Index(10000 + np.arange(FEATURES), name="permno")),
        pd.DataFrame(x, index=days, columns=pd.Index(["AAPL", "MSFT", "IBM"], name="sym")),
        pd.DataFrame(
            x,
            index=pd.date_range(
                "2024-01-02 09:30", periods=ROWS, freq="min", tz="America/New_York", name="at"
            ),
            columns=pd.Index(["AAPL", "MSFT", "IBM"], name="sym"),
        ),
        pd.DataFrame(
            x, index=pd.period_range("1980-01", periods=ROWS, freq="M", name="month"), columns=["a", "b", "c"]
        ),
    ]
    for frame in frames:
        want = tsconv.features(frame, PIPE, device="cpu")
        tdim = frame.index.name
        da = xr.DataArray(frame)
        for arr, kw in ((da, {}), (da.T, {}), (da.T, {"time_column": tdim})):
            got = tsconv.features(arr, PIPE, device="cpu", **kw)
            assert got.dims == (tdim, "output") and list(got["output"].values) == list(want.columns)
            assert got.indexes[tdim].equals(want.index) and got.indexes[tdim].dtype == want.index.dtype
            np.testing.assert_array_equal(got.values, want.to_numpy())
