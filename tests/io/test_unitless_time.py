"""Integer times without units are read as int64 ns since the epoch: narrower integers are refused, and int64
times (or ingested integers) that read as 1970 (epoch seconds, milliseconds, microseconds) are warned of."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import zarr
from click.testing import CliRunner

import tsconv
from tsconv.cli import main
from tsconv.errors import StoreError, TsconvWarning
from tsconv.io.ingest import ingest

from ..helpers import T0, price_series, warned_once_then_inspected

PIPE = {"conv": [{"filters": ["diff:1"]}]}
ROWS = 300
MS = T0 // 1_000_000 + np.arange(ROWS, dtype=np.int64) * 1000  # 2026-01-02 09:30 on, in epoch milliseconds


def _store(path: Path, time: np.ndarray, units: str | None = None) -> Path:
    g = zarr.open_group(str(path), mode="w")
    g.create_array("values", data=price_series(ROWS, 2))
    t = g.create_array("time", data=time)
    if units is not None:
        t.attrs["units"] = units
    g.attrs["features"] = ["a", "b"]
    return path


@pytest.mark.parametrize("dtype", ["int32", "uint32", "int16"])
def test_narrow_integer_time_without_units_is_refused_and_its_hint_works(tmp_path: Path, dtype: str) -> None:
    seconds = (MS // 1000).astype(dtype) if dtype != "int16" else np.arange(ROWS, dtype=dtype)
    src = _store(tmp_path / "s.zarr", seconds)
    with pytest.raises(StoreError, match=rf"holds {dtype} values but has no 'units' attribute") as err:
        tsconv.open_input(src)
    assert "'seconds since 1970-01-01'" in str(err.value) and "int64" in str(err.value)
    res = CliRunner().invoke(main, ["inspect", str(src)])
    assert res.exit_code != 0 and f"{dtype} values but has no 'units'" in res.output
    # the hint: the same integers with CF units decode to the instants they count
    fixed = tsconv.open_input(_store(tmp_path / "u.zarr", seconds, units="seconds since 1970-01-01"))
    np.testing.assert_array_equal(fixed.time[:], seconds.astype(np.int64) * 1_000_000_000)


@pytest.mark.parametrize(
    "time", [MS, MS.astype(np.uint64), MS * 1000, MS // 1000], ids=["ms", "uint64-ms", "us", "s"]
)
def test_unitless_int64_times_in_1970_are_warned_by_process_and_inspect(
    tmp_path: Path, time: np.ndarray
) -> None:
    src = _store(tmp_path / "s.zarr", time)
    line = warned_once_then_inspected(
        src, tmp_path / "o.zarr", pipeline=PIPE, label="time units:",
        match=r"'time' holds u?int64 without a 'units' attribute, read as nanoseconds since the epoch: "
        r"1970-01-.*'milliseconds since 1970-01-01'",
    )  # fmt: skip
    assert "1970-01-" in line and "'milliseconds since 1970-01-01'" in line


@pytest.mark.parametrize(
    ("time", "units"),
    [(MS * 1_000_000, None), (MS, "milliseconds since 1970-01-01")],
    ids=["int64-ns", "ms-with-units"],
)
def test_no_warning_for_ns_times_or_times_with_units(
    tmp_path: Path, time: np.ndarray, units: str | None
) -> None:
    src = _store(tmp_path / "s.zarr", time, units)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TsconvWarning)
        tsconv.process(src, pipeline=PIPE, output=tmp_path / "o.zarr", device="cpu")
    assert tsconv.open_input(src).time[0] == T0
    res = CliRunner().invoke(main, ["inspect", str(src)])
    assert res.exit_code == 0, res.output
    assert "time units" not in res.output


def test_ingest_of_epoch_milliseconds_without_time_unit_warns(tmp_path: Path) -> None:
    pl.DataFrame({"time": MS[:5], "feature": "a", "value": np.arange(5.0)}).write_csv(tmp_path / "ms.csv")
    with pytest.warns(TsconvWarning, match=r"integer times, read as nanoseconds .* all lie within a year "
                      r"of 1970-01-01: 1970-01-01T00:29.*--time-unit s, ms or us"):  # fmt: skip
        ingest(tmp_path / "ms.csv", tmp_path / "ns.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TsconvWarning)
        ingest(tmp_path / "ms.csv", tmp_path / "ms.zarr", time_unit="ms")
    assert tsconv.open_input(tmp_path / "ms.zarr").time[0] == T0
