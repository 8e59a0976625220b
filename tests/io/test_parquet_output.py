"""Parquet outputs: missing values (warm-up rows, NaN inputs) are nulls, so Parquet readers aggregate over
the values that are there; +-inf stays inf; tsconv reads the file back (ingest) with NaN where it was."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

import tsconv
from tsconv.io.writers.parquet_writer import ParquetSink

from ..helpers import price_series, read_output, write_store

ROWS = 700
PIPE = {"conv": [{"filters": ["ma:8", "diff:1"]}]}


@pytest.fixture
def outputs(tmp_path: Path) -> tuple[Path, np.ndarray, list[str]]:
    """A Parquet output of a store with NaN inputs (one feature starting late), and the same run's values
    as a zarr output."""
    x = price_series(ROWS, 3, seed=5, nan_fraction=0.02)
    x[:150, 1] = np.nan
    src = write_store(tmp_path / "in.zarr", x, chunks=(256, 3))
    out = tmp_path / "out.parquet"
    tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=256)
    tsconv.process(src, tmp_path / "out.zarr", pipeline=PIPE, device="cpu", chunk=256)
    names = [c for c in pq.read_schema(out).names if c != "time"]
    return out, read_output(tmp_path / "out.zarr"), names


def test_missing_values_are_nulls_and_polars_aggregates_skip_them(outputs) -> None:  # noqa: ANN001
    out, want, names = outputs
    missing = np.isnan(want)
    assert (
        missing[:1].all() and missing[100:149, 2:4].all() and not missing[200:].any()
    )  # warm-up, late start
    table = pq.read_table(out)
    for j, name in enumerate(names):
        col = table[name]
        assert col.null_count == int(missing[:, j].sum())
        assert not np.isnan(col.drop_null().to_numpy()).any()
    frame = pl.read_parquet(out)
    got = frame.select([pl.col(n).mean() for n in names]).row(0)
    counts = frame.select([pl.col(n).count() for n in names]).row(0)
    np.testing.assert_allclose(got, np.nanmean(want.astype(np.float64), axis=0), rtol=1e-6)
    assert list(counts) == [int((~missing[:, j]).sum()) for j in range(len(names))]
    np.testing.assert_array_equal(frame.select(names).to_numpy(), want)  # nulls read as NaN


def test_duckdb_aggregates_skip_the_missing_values(outputs) -> None:  # noqa: ANN001
    duckdb = pytest.importorskip("duckdb")
    out, want, names = outputs
    cols = ", ".join(f'avg("{n}"), count("{n}")' for n in names)
    row = duckdb.sql(f"SELECT {cols}, count(*) FROM read_parquet('{out}')").fetchall()[0]
    for j in range(len(names)):
        ok = want[~np.isnan(want[:, j]), j].astype(np.float64)
        assert row[2 * j] == pytest.approx(ok.mean(), rel=1e-6)
        assert row[2 * j + 1] == ok.size
    assert row[-1] == ROWS


def test_only_nan_becomes_null_and_infinities_stay(tmp_path: Path) -> None:
    block = np.array([[np.nan, 1.0], [np.inf, np.nan], [-np.inf, 2.5], [0.0, -0.0]], dtype=np.float32)
    out = tmp_path / "x.parquet"
    sink = ParquetSink(out, names=("a", "b"), time_source=None, metadata={}, row_group_rows=3)
    sink.append(block[:1])
    sink.append(block[1:])
    sink.finish()
    table = pq.read_table(out)
    assert table.num_rows == 4 and table["a"].null_count == 1 and table["b"].null_count == 1
    assert table["a"].to_pylist() == [None, float("inf"), float("-inf"), 0.0]
    assert table["b"].to_pylist() == [1.0, None, 2.5, -0.0]
    assert pq.ParquetFile(out).metadata.num_row_groups == 2


def test_ingest_reads_a_parquet_output_back_with_nan_where_values_are_missing(
    outputs, tmp_path: Path
) -> None:  # noqa: ANN001
    out, want, names = outputs
    back = tmp_path / "back.zarr"
    tsconv.ingest(str(out), back, layout="wide")
    store = tsconv.open_input(back)
    assert list(store.features) == names
    np.testing.assert_array_equal(np.asarray(store.values[:]), want)


def test_an_input_changed_during_the_run_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as for a zarr output: the rows read must still be the input's when the file takes its name
    import zarr

    from tsconv.io.writers import parquet_writer

    src = write_store(tmp_path / "in.zarr", price_series(3000, 3, seed=2), chunks=(500, 3))
    out = tmp_path / "out.parquet"
    tsconv.process(src, out, pipeline="default")
    before = out.read_bytes()
    flush = parquet_writer.ParquetSink._flush

    def changing(self) -> None:  # the last rows go out; the input changes before the file is named
        flush(self)
        g = zarr.open_group(str(src), mode="r+")
        g["values"][10:11] = np.asarray(g["values"][10:11]) + 1

    monkeypatch.setattr(parquet_writer.ParquetSink, "_flush", changing)
    with pytest.raises(
        tsconv.TsconvError, match=r"changed while the output was computed.*no file was written"
    ):
        tsconv.process(src, out, pipeline="default", overwrite=True)
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "in.zarr",
        "out.parquet",
    ]


def test_a_link_to_nothing_at_the_output_is_replaced_only_with_overwrite(tmp_path: Path) -> None:
    # the finished file is renamed onto the name, replacing a link there: one to nothing was replaced silently
    from tsconv.errors import OutputExistsError

    src = write_store(tmp_path / "in.zarr", price_series(ROWS, 2, seed=6), chunks=(256, 2))
    out = tmp_path / "out.parquet"
    out.symlink_to(tmp_path / "nowhere" / "f.parquet")
    with pytest.raises(OutputExistsError, match="a symbolic link") as err:
        tsconv.process(src, out, pipeline=PIPE, device="cpu")
    assert "--overwrite" in err.value.hint and out.is_symlink()
    tsconv.process(src, out, pipeline=PIPE, device="cpu", overwrite=True)
    assert out.is_file() and not out.is_symlink() and pq.read_table(out).num_rows == ROWS


def test_names_equal_but_for_case_are_warned_of(tmp_path: Path) -> None:
    # duckdb, which reads these files, takes names case-insensitively: "Aapl.diff1" read AAPL.diff1's numbers
    import warnings

    import zarr

    src = write_store(tmp_path / "in.zarr", price_series(200, 3))
    zarr.open_group(str(src), mode="r+").attrs["features"] = ["AAPL", "Aapl", "MSFT"]
    pipe = {"conv": [{"filters": ["diff:1"]}]}
    with pytest.warns(
        tsconv.TsconvWarning, match=r"'AAPL.diff1' and 'Aapl.diff1' differ only in case.*rename"
    ):
        tsconv.process(src, tmp_path / "out.parquet", pipeline=pipe, device="cpu")
    zarr.open_group(str(src), mode="r+").attrs["features"] = ["AAPL", "MSFT", "GOOG"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", tsconv.TsconvWarning)
        tsconv.process(src, tmp_path / "ok.parquet", pipeline=pipe, device="cpu")


def test_inspect_and_plot_of_a_parquet_output_say_what_it_is(tmp_path: Path) -> None:
    # they said "ingest other files into one first", advice for someone else's file, not tsconv's own output
    from click.testing import CliRunner

    from tsconv.cli import main

    src = write_store(tmp_path / "in.zarr", price_series(300, 2, seed=1), chunks=(256, 2))
    out = tmp_path / "out.parquet"
    tsconv.process(src, out, pipeline=PIPE, device="cpu", progress=False)
    for args in (["inspect", str(out)], ["plot", str(out), "-f", "*", "-o", str(tmp_path / "p.png")]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2 and "Traceback" not in res.output
        assert "is a tsconv output in Parquet (300 rows x 4 features" in res.stderr
        assert "polars, pandas or duckdb" in res.stderr and "ingest" not in res.stderr
    other = tmp_path / "other.parquet"
    pq.write_table(pq.read_table(out).replace_schema_metadata(None), other)
    assert "ingest other files into one first" in CliRunner().invoke(main, ["inspect", str(other)]).stderr


def test_a_full_disk_names_the_parquet_file_and_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it printed only "[Errno 28] Error writing bytes to file. Detail: ..."
    import errno

    from click.testing import CliRunner

    from tsconv.cli import main

    def full(self, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    src = write_store(tmp_path / "in.zarr", price_series(ROWS, 2, seed=6), chunks=(256, 2))
    out = tmp_path / "out.parquet"
    monkeypatch.setattr(pq.ParquetWriter, "write_batch", full)
    res = CliRunner().invoke(main, ["process", "-i", str(src), "-o", str(out), "-q"])
    assert res.exit_code != 0 and "Traceback" not in res.stderr
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"tsconv: error: cannot write rows 0..{ROWS:,} of the Parquet output '{out}'")
    assert "Error writing bytes" in line and "hint: free space on its disk, then rerun" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.zarr"]  # no temporary file left


def test_a_disk_full_before_the_first_row_names_the_parquet_file_and_keeps_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the file's first bytes (pyarrow writes them as the writer opens) failed with a bare "[Errno 28] Error
    # writing bytes to file" naming no file, and the temporary file stayed beside the output
    import errno

    from click.testing import CliRunner

    from tsconv.cli import main

    def full(self, where, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        Path(where).write_bytes(b"")  # opened, then its first write fails
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    src = write_store(tmp_path / "in.zarr", price_series(ROWS, 2, seed=6), chunks=(256, 2))
    out = tmp_path / "out.parquet"
    out.write_bytes(b"PAR1 an earlier run's file")
    monkeypatch.setattr(pq.ParquetWriter, "__init__", full)
    res = CliRunner().invoke(main, ["process", "-i", str(src), "-o", str(out), "-q", "--overwrite"])
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"tsconv: error: cannot write the header of the Parquet output '{out}'"), line
    assert "hint: free space on its disk, then rerun" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.zarr", "out.parquet"]  # no temporary file
    assert out.read_bytes() == b"PAR1 an earlier run's file"


def test_overwrite_replaces_only_a_parquet_file_or_an_empty_one(tmp_path: Path) -> None:
    # --overwrite replaced any file at the path, while a zarr output replaces nothing but zarr data
    from tsconv.errors import StoreError

    src = write_store(tmp_path / "in.zarr", price_series(ROWS, 2, seed=6), chunks=(256, 2))
    out = tmp_path / "out.parquet"
    out.write_text("time,a\n1,2\n")
    with pytest.raises(StoreError, match=r"is not a Parquet file \(it starts with b'time'") as err:
        tsconv.process(src, out, pipeline=PIPE, device="cpu", overwrite=True)
    assert str(out) in str(err.value) and "remove it yourself" in err.value.hint
    assert out.read_text() == "time,a\n1,2\n"
    out.write_bytes(b"")  # nothing there to lose
    tsconv.process(src, out, pipeline=PIPE, device="cpu", overwrite=True)
    before = pq.read_table(out)
    tsconv.process(src, out, pipeline=PIPE, device="cpu", overwrite=True)  # a Parquet file is replaced
    assert pq.read_table(out).num_rows == before.num_rows == ROWS


def test_an_output_below_a_file_names_the_file(tmp_path: Path) -> None:
    # it said "cannot create the lock file ... File exists" and asked for write access to the directory
    from tsconv.errors import StoreError

    src = write_store(tmp_path / "in.zarr", price_series(ROWS, 2, seed=6), chunks=(256, 2))
    (tmp_path / "notes.txt").write_text("x")
    out = tmp_path / "notes.txt" / "sub" / "out.parquet"
    with pytest.raises(StoreError, match=r"cannot be made: '.*notes\.txt' is a file, not a folder") as err:
        tsconv.process(src, out, pipeline=PIPE, device="cpu")
    assert "choose an --output in a folder" in err.value.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.zarr", "notes.txt"]


def test_a_time_range_is_refused_with_what_to_do_instead(tmp_path: Path) -> None:
    # the hint said "it selects output rows of a store with time in tsconv.process(); slice the result
    # instead", to a user of tsconv.process()
    src = write_store(tmp_path / "in.zarr", price_series(ROWS, 2, seed=6), chunks=(256, 2))
    pipe = {"preprocess": {"time_range": ["2026-01-01", "2026-01-02"]}, **PIPE}
    with pytest.raises(tsconv.TsconvError, match="time_range is not supported by Parquet output") as err:
        tsconv.process(src, tmp_path / "out.parquet", pipeline=pipe, device="cpu")
    assert "tsconv.process()" not in err.value.hint
    assert "write a .zarr output" in err.value.hint and "filter the Parquet file" in err.value.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.zarr"]
