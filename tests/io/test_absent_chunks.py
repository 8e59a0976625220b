"""Chunk files never written read as the fill value: a fill other than NaN is warned of, by process and inspect."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import tsconv
from tsconv.cli import main
from tsconv.errors import TsconvWarning

from ..helpers import T0, price_series, warned_once_then_inspected

PIPE = {"conv": [{"filters": ["diff:1"]}]}


def _store(path: Path, *, fill: float | None, partial: bool, zarr_format: int = 3) -> Path:
    """``values`` [300, 3] in chunks of 50 rows; ``partial``: rows 100-199 never written, as by a writer
    that died part-way through a region write."""
    x = price_series(300, 3)
    g = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    kw = {} if fill is None else {"fill_value": fill}  # None: zarr's default, 0.0 for a float array
    v = g.create_array("values", shape=x.shape, dtype=x.dtype, chunks=(50, 3), **kw)
    if not partial:
        v[:] = x
    else:
        v[0:100] = x[0:100]
        v[200:300] = x[200:300]
    g.create_array("time", data=T0 + np.arange(300, dtype=np.int64) * 1_000_000, chunks=(50,))
    g.attrs["features"] = ["a", "b", "c"]
    return path


@pytest.mark.parametrize("zarr_format", [3, 2])
def test_absent_chunks_of_a_zero_fill_are_warned_by_process_and_inspect(
    tmp_path: Path, zarr_format: int
) -> None:
    src = _store(tmp_path / "s.zarr", fill=None, partial=True, zarr_format=zarr_format)
    line = warned_once_then_inspected(
        src, tmp_path / "o.zarr", pipeline=PIPE, label="absent chunks:",
        match=r"2 of 6 chunk files .* never written \(the first: rows 100\.\.149\).*fill value 0.*rewrite "
        r"those rows.*ignore this",
    )  # fmt: skip
    assert "2 of 6 chunk files" in line and "rows 100..149" in line and "fill value 0" in line


@pytest.mark.parametrize("index_location", ["end", "start"])
def test_inner_chunks_never_written_in_a_shard_are_warned_by_process_and_inspect(
    tmp_path: Path, index_location: str
) -> None:
    # 420 rows in chunks of 50 inside shards of 150: rows 100..149 never written in the first shard (its
    # file exists), the second shard file never written; the last shard's inner chunk past row 420 is
    # absent from its index but outside the array, so not counted.
    x = price_series(420, 3)
    src = tmp_path / "s.zarr"
    g = zarr.open_group(str(src), mode="w")
    shards = {"shape": (150, 3), "index_location": index_location}
    v = g.create_array("values", shape=x.shape, dtype=x.dtype, chunks=(50, 3), shards=shards, fill_value=0.0)
    v[0:100] = x[0:100]
    v[300:420] = x[300:420]
    g.create_array("time", data=T0 + np.arange(420, dtype=np.int64) * 1_000_000, chunks=(50,))
    g.attrs["features"] = ["a", "b", "c"]
    assert (src / "values" / "c" / "0" / "0").is_file()  # the partly written shard is there
    line = warned_once_then_inspected(
        src, tmp_path / "o.zarr", pipeline=PIPE, label="absent chunks:",
        match=r"4 of 9 chunks .* never written \(the first: rows 100\.\.149\).*fill value 0",
    )  # fmt: skip
    assert "4 of 9 chunks" in line and "rows 100..149" in line


@pytest.mark.parametrize(
    ("fill", "partial"), [(np.nan, True), (None, False)], ids=["nan-fill-with-absent-chunks", "complete"]
)
def test_no_warning_for_a_nan_fill_or_a_complete_store(
    tmp_path: Path, fill: float | None, partial: bool
) -> None:
    src = _store(tmp_path / "s.zarr", fill=fill, partial=partial)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TsconvWarning)
        tsconv.process(src, pipeline=PIPE, output=tmp_path / "o.zarr", device="cpu")
    res = CliRunner().invoke(main, ["inspect", str(src)])
    assert res.exit_code == 0, res.output
    assert "absent chunks" not in res.output and "never written" not in res.output


@pytest.mark.parametrize("sharded", [False, True], ids=["chunks", "shards"])
def test_a_store_declaring_10_to_the_15_rows_is_inspected_not_out_of_memory(
    tmp_path: Path, sharded: bool
) -> None:
    # A few bytes of metadata declare 976 billion chunks: every chunk key was listed (np.ndindex over them:
    # a MemoryError, told as 'out of host memory' with the hint to lower --chunk); sharded, a flag per
    # inner chunk (909 GiB). They are counted from the files there.
    src = tmp_path / "s.zarr"
    g = zarr.open_group(str(src), mode="w")
    kw = {"shards": (2048, 3)} if sharded else {}
    v = g.create_array("values", shape=(10**15, 3), dtype="float32", chunks=(1024, 3), fill_value=0.0, **kw)
    v[:2048] = 1.0
    v[4096:5120] = 1.0
    g.attrs["features"] = ["a", "b", "c"]
    res = CliRunner().invoke(main, ["inspect", "--no-nan-count", str(src)])
    assert res.exit_code == 0, res.output
    of = 10**15 // (2048 if sharded else 1024)
    written = 2 if sharded else 3
    assert f"{of - written:,} of {of:,} chunk files" in res.output
    first = "2,048..4,095" if sharded else "2,048..3,071"
    assert f"the first: rows {first})" in res.output


def _store_missing_time(path: Path, *, zarr_format: int = 3, sharded: bool = False, rows: int = 300) -> Path:
    """``values`` complete, ``time`` [rows] in chunks of 50 with rows 50..99 never written, as a writer that
    died part-way leaves it."""
    x = price_series(rows, 3)
    g = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    g.create_array("values", data=x, chunks=(50, 3))
    kw = {"shards": (150,)} if sharded else {}
    t = g.create_array("time", shape=(rows,), dtype="int64", chunks=(50,), **kw)
    times = T0 + np.arange(rows, dtype=np.int64) * 1_000_000
    t[:50] = times[:50]
    t[100:] = times[100:]
    g.attrs["features"] = ["a", "b", "c"]
    return path


@pytest.mark.parametrize(
    ("zarr_format", "sharded"), [(3, False), (2, False), (3, True)], ids=["zarr3", "zarr2", "sharded"]
)
def test_time_chunks_never_written_are_an_incomplete_store_not_an_unsorted_one(
    tmp_path: Path, zarr_format: int, sharded: bool
) -> None:
    # zarr reads them as the fill value 0: the error said "not strictly increasing at row 50 (0 after ...)"
    # with the hint to sort the series, which cannot mend a store that lacks its times
    src = _store_missing_time(tmp_path / "s.zarr", zarr_format=zarr_format, sharded=sharded)
    match = r"incomplete: 1 of the 6 chunks .*never written \(the first: rows 50\.\.99\).*fill value 0"
    with pytest.raises(tsconv.StoreError, match=match) as err:
        tsconv.process(src, pipeline=PIPE, output=tmp_path / "o.zarr", device="cpu")
    assert "sort" not in str(err.value) + (err.value.hint or "")
    with pytest.raises(tsconv.StoreError, match=match):
        tsconv.open_store(src)
    res = CliRunner().invoke(main, ["inspect", str(src)])
    assert res.exit_code == 2 and re.search(match, res.output) and "sort" not in res.output, res.output


def test_time_chunks_of_rows_appended_and_never_written_are_refused_by_update(tmp_path: Path) -> None:
    # another writer resized the arrays for 100 more rows and died before writing their times
    src = _store_missing_time(tmp_path / "s.zarr")
    g = zarr.open_group(str(src), mode="r+")
    g["time"][50:100] = T0 + np.arange(50, 100, dtype=np.int64) * 1_000_000
    out = tmp_path / "o.zarr"
    tsconv.process(src, pipeline=PIPE, output=out, device="cpu", chunk=64)
    g["values"].resize((400, 3))
    g["values"][300:] = price_series(100, 3, seed=1)
    g["time"].resize((400,))
    with pytest.raises(
        tsconv.StoreError, match=r"incomplete: 2 of .*never written \(the first: rows 300\.\.349\)"
    ):
        tsconv.process(src, pipeline=PIPE, output=out, device="cpu", chunk=64, update=True)


def test_a_last_time_chunk_of_one_row_equal_to_the_fill_value_is_read(tmp_path: Path) -> None:
    # zarr does not write a chunk that equals its fill value: a last chunk holding one row may be that
    x = price_series(301, 3)
    times = T0 + np.arange(301, dtype=np.int64) * 1_000_000
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    g.create_array("values", data=x, chunks=(50, 3))
    g.create_array("time", data=times, chunks=(50,), fill_value=int(times[-1]))
    g.attrs["features"] = ["a", "b", "c"]
    assert not (tmp_path / "s.zarr" / "time" / "c" / "6").exists()
    info = tsconv.open_store(tmp_path / "s.zarr")
    assert info.time_end == np.datetime64(int(times[-1]), "ns")
