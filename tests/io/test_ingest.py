"""`tsconv ingest`: Parquet/CSV/IPC files in long or wide layout -> a store that follows the convention."""

from __future__ import annotations

import errno
import gzip
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import zarr
from click.testing import CliRunner, Result

import tsconv
from tsconv.cli import main
from tsconv.errors import OutputBusyError, StoreError, TsconvWarning
from tsconv.io.ingest import ingest, repair
from tsconv.io.lock import OutputLock
from tsconv.io.store import check_time, open_input

T0 = 1_767_346_200_000_000_000  # 2026-01-02 09:30 UTC in ns
SEC = 1_000_000_000


# ----------------------------------------------------------------------------------------- helpers


def long_frame(times: list[int], names: list[str], seed: int = 0, drop: float = 0.2) -> pl.DataFrame:
    """Long rows for every (time, name) pair but a random ``drop`` fraction; times as int64 ns."""
    rng = np.random.default_rng(seed)
    t = np.repeat(np.asarray(times, dtype=np.int64), len(names))
    f = np.tile(np.asarray(names, dtype=object), len(times))
    v = np.round(100 + rng.normal(size=t.size).cumsum() * 0.01, 2)
    keep = rng.random(t.size) >= drop
    return pl.DataFrame({"time": t[keep], "feature": f[keep].tolist(), "value": v[keep]})


def dense(df: pl.DataFrame, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The expected [T, F] (float64, NaN for missing cells; last duplicate wins) and times."""
    times = np.unique(df["time"].to_numpy())
    out = np.full((times.size, len(names)), np.nan)
    col = {n: j for j, n in enumerate(names)}
    for t, f, v in df.select("time", "feature", "value").iter_rows():
        out[np.searchsorted(times, t), col[f]] = np.nan if v is None else v
    return out, times


def as_datetime(df: pl.DataFrame, tz: str | None = "UTC") -> pl.DataFrame:
    return df.with_columns(pl.col("time").cast(pl.Datetime("ns", "UTC")).dt.convert_time_zone(tz or "UTC"))


def write(df: pl.DataFrame, path: Path) -> Path:
    name = path.name
    if name.endswith((".parquet", ".pq")):
        df.write_parquet(path)
    elif name.endswith(".csv.gz"):
        with gzip.open(path, "wb") as fh:
            fh.write(df.write_csv().encode())
    elif name.endswith(".csv"):
        df.write_csv(path)
    else:
        df.write_ipc(path)
    return path


def read(path: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    g = zarr.open_group(str(path), mode="r")
    return np.asarray(g["values"][:]), np.asarray(g["time"][:]), list(g.attrs["features"])


def snapshot(path: Path) -> dict[str, tuple]:
    if not path.exists():
        return {}
    items = [path, *sorted(path.rglob("*"))] if path.is_dir() else [path]
    # Directories count by name only: a temporary store created and removed again changes their mtime.
    return {
        str(p.relative_to(path.parent)): (None, None)
        if p.is_dir()
        else (p.read_bytes(), p.stat().st_mtime_ns)
        for p in items
    }


def cli(*args: str | os.PathLike[str]) -> Result:
    return CliRunner().invoke(main, ["ingest", *map(str, args), "-q"])


def assert_refused(res: Result, *needles: str) -> str:
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code != 0
    assert "Traceback" not in res.stdout + res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {res.stderr!r}"
    assert lines[0].startswith("tsconv: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert res.stdout == ""
    return lines[0]


@pytest.fixture(autouse=True)
def _restore_warning_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # the CLI replaces it


NAMES = ["px_b", "px_a", "vol_a", "1234"]  # "1234" looks like a number in a CSV: it must stay a name
SORTED = sorted(NAMES)
TIMES = [T0 + k * 250_000_000 + (k % 3) * 7 for k in range(40)]


# ------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("suffix", [".parquet", ".pq", ".csv", ".csv.gz", ".arrow", ".ipc", ".feather"])
def test_long_round_trip(tmp_path: Path, suffix: str) -> None:
    df = long_frame(TIMES, NAMES)
    src = write(as_datetime(df) if suffix != ".csv" else df, tmp_path / f"ticks{suffix}")
    rep = ingest(src, tmp_path / "out.zarr")
    values, times, names = read(tmp_path / "out.zarr")
    exp, exp_t = dense(df, SORTED)
    assert names == SORTED
    np.testing.assert_array_equal(times, exp_t)
    np.testing.assert_array_equal(values, exp.astype(np.float32))  # NaN where a cell is missing
    assert np.isnan(values).any()
    assert values.dtype == np.float32 and times.dtype == np.int64
    assert (rep.rows, rep.features, rep.input_rows) == (len(TIMES), len(NAMES), df.height)
    store = open_input(tmp_path / "out.zarr")
    assert check_time(store) == (TIMES[0], TIMES[-1])


def test_file_urls_name_the_local_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # -o file:///d/out.zarr was built as the relative folder ./file:/d/out.zarr (exit 0), and a file:// input
    # file "did not exist"; process and inspect read both as the local paths
    monkeypatch.chdir(tmp_path)
    df = long_frame(TIMES, NAMES)
    src = write(df, tmp_path / "ticks.parquet")
    res = CliRunner().invoke(main, ["ingest", f"file://{src}", "-o", f"file://{tmp_path}/out.zarr"])
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "file:").exists()
    np.testing.assert_array_equal(read(tmp_path / "out.zarr")[0], dense(df, SORTED)[0].astype(np.float32))
    assert repair(f"file://{tmp_path}/out.zarr") is None  # nothing to repair, at the same store


def test_a_killed_ingests_temporary_store_is_removed_by_the_next_and_a_second_writer_is_refused(
    tmp_path: Path,
) -> None:
    src = write(as_datetime(long_frame(TIMES, NAMES)), tmp_path / "ticks.parquet")
    out = tmp_path / "out.zarr"
    stale = tmp_path / ".out.zarr.ingest-999999"  # what a kill -9 during ingest leaves
    (stale / "values").mkdir(parents=True)
    (stale / "zarr.json").write_text("{}")
    other = tmp_path / ".other.zarr.ingest-999999"  # another output's: not this run's to remove
    other.mkdir()
    ingest(src, out)
    assert not stale.exists() and other.exists()
    assert read(out)[2] == SORTED
    with OutputLock(out, run_id="f" * 32):
        with pytest.raises(OutputBusyError, match="being written by another tsconv run") as busy:
            ingest(src, out, overwrite=True)
        assert "--resume" not in busy.value.hint  # ingest has none
    assert read(out)[2] == SORTED
    # the same store through a symlink is under the same lock (two appends, one through a link, each took
    # the other's in-progress marker for a killed append and cut its rows), and --overwrite through the link
    # replaces the store it points to
    link = tmp_path / "link.zarr"
    link.symlink_to(out)
    with OutputLock(out, run_id="f" * 32):
        for kw in ({"append": True}, {"overwrite": True}):
            with pytest.raises(OutputBusyError, match="being written by another tsconv run"):
                ingest(src, link, **kw)
        with pytest.raises(OutputBusyError):
            repair(link)
    ingest(src, link, overwrite=True)
    assert link.is_symlink() and read(link)[2] == SORTED


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".arrow"])
def test_wide_round_trip_keeps_column_order(tmp_path: Path, suffix: str) -> None:
    df = long_frame(TIMES, NAMES, drop=0.1)
    wide = df.pivot(on="feature", index="time", values="value").select("time", *NAMES)
    src = write(as_datetime(wide) if suffix != ".csv" else wide, tmp_path / f"wide{suffix}")
    ingest(src, tmp_path / "out.zarr", layout="wide", dtype="float64")
    values, times, names = read(tmp_path / "out.zarr")
    exp, exp_t = dense(df, NAMES)
    assert names == NAMES  # wide input keeps the column order
    assert values.dtype == np.float64
    np.testing.assert_array_equal(times, exp_t)
    np.testing.assert_array_equal(values, exp)


def test_wide_several_files_append_new_columns_in_order(tmp_path: Path) -> None:
    a = pl.DataFrame({"time": [T0, T0 + 2], "z": [1.0, 2.0], "b": [3, 4]})
    b = pl.DataFrame({"time": [T0 + 1, T0 + 2], "c": [5.0, None], "b": [6.0, 7.0], "a": [8.0, 9.0]})
    write(a, tmp_path / "a.parquet")
    write(b, tmp_path / "b.parquet")
    ingest([tmp_path / "b.parquet", tmp_path / "a.parquet"], tmp_path / "out.zarr", layout="wide")
    values, times, names = read(tmp_path / "out.zarr")
    assert names == ["z", "b", "c", "a"]  # first file's order (a.parquet: sorted paths), then new ones
    np.testing.assert_array_equal(times, [T0, T0 + 1, T0 + 2])
    nan = np.nan
    np.testing.assert_array_equal(
        values, np.array([[1, 3, nan, nan], [nan, 6, 5, 8], [2, 7, nan, 9]], dtype=np.float32)
    )


def test_several_files_and_globs_unsorted(tmp_path: Path) -> None:
    df = long_frame(TIMES, NAMES, seed=3)
    shuffled = df.sample(fraction=1.0, shuffle=True, seed=1)  # unsorted input is fine
    parts = [shuffled[i::3] for i in range(3)]
    for i, part in enumerate(parts):
        write(as_datetime(part), tmp_path / f"part{i}.parquet")
    write(parts[0], tmp_path / "other.csv")  # not matched by the glob
    rep = ingest(str(tmp_path / "part*.parquet"), tmp_path / "out.zarr")
    assert rep.files == 3
    values, times, names = read(tmp_path / "out.zarr")
    exp, exp_t = dense(df, SORTED)
    np.testing.assert_array_equal(times, exp_t)
    np.testing.assert_array_equal(values, exp.astype(np.float32))
    # The CLI expands quoted globs itself and mixes globs and paths.
    res = cli(tmp_path / "part[01].parquet", tmp_path / "part2.parquet", "--output", tmp_path / "cli.zarr")
    assert res.exit_code == 0, res.stderr
    assert "3 file(s)" in res.stdout
    np.testing.assert_array_equal(read(tmp_path / "cli.zarr")[0], values)


def test_duplicates_last_wins_in_file_then_row_order(tmp_path: Path) -> None:
    a = pl.DataFrame({"time": [T0, T0, T0 + 1], "feature": ["x", "x", "y"], "value": [1.0, 2.0, 3.0]})
    b = pl.DataFrame({"time": [T0 + 1, T0 + 1, T0], "feature": ["y", "y", "y"], "value": [4.0, None, 5.0]})
    write(a, tmp_path / "a.csv")
    write(b, tmp_path / "b.csv")
    ingest([tmp_path / "b.csv", tmp_path / "a.csv"], tmp_path / "out.zarr")
    values, _, names = read(tmp_path / "out.zarr")
    assert names == ["x", "y"]
    # x@T0: 2 (last row of a); y@T0+1: a says 3, b says 4 then null -> NaN (b comes later, null is a value)
    np.testing.assert_array_equal(values, np.array([[2.0, 5.0], [np.nan, np.nan]], dtype=np.float32))


def test_duplicates_across_batches_and_bands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tsconv.io.ingest as ing

    monkeypatch.setattr(ing, "_BATCH_ROWS", 7)  # duplicates straddle batch boundaries
    monkeypatch.setattr(ing, "_BAND_BYTES", 1)  # one chunk per band
    monkeypatch.setattr(ing, "_CHUNK_BYTES", 5 * 8 * 2)  # 5 rows per chunk of 2 float64 features
    rng = np.random.default_rng(5)
    n = 400
    df = pl.DataFrame(
        {
            "time": rng.integers(0, 23, size=n) * SEC,
            "feature": rng.choice(["p", "q"], size=n).tolist(),
            "value": rng.normal(size=n),
        }
    )
    write(df, tmp_path / "d.parquet")
    ingest(tmp_path / "d.parquet", tmp_path / "out.zarr", dtype="float64")
    g = zarr.open_group(str(tmp_path / "out.zarr"), mode="r")
    assert g["values"].chunks == (5, 2)
    exp, exp_t = dense(df, ["p", "q"])
    np.testing.assert_array_equal(np.asarray(g["values"][:]), exp)
    np.testing.assert_array_equal(np.asarray(g["time"][:]), exp_t)


def test_time_zones_and_iso_strings(tmp_path: Path) -> None:
    # 09:30 in New York on 2 Jan 2026 is 14:30 UTC.
    ny = pl.DataFrame({"time": ["2026-01-02 09:30:00"], "feature": ["a"], "value": [1.0]}).with_columns(
        pl.col("time").str.to_datetime(time_unit="us").dt.replace_time_zone("America/New_York")
    )
    write(ny, tmp_path / "a.parquet")
    (tmp_path / "b.csv").write_text(
        "time,feature,value\n2026-01-02T15:30:00+01:00,b,2\n2026-01-02T14:30:00.000000001Z,b,3\n"
    )
    naive = pl.DataFrame({"time": ["2026-01-02 14:30:00.000000002"], "feature": ["c"], "value": [4]})
    write(naive.with_columns(pl.col("time").str.to_datetime(time_unit="ns")), tmp_path / "c.arrow")
    ingest(str(tmp_path / "[abc].*"), tmp_path / "out.zarr")
    values, times, names = read(tmp_path / "out.zarr")
    t = int(np.datetime64("2026-01-02T14:30:00", "ns").astype(np.int64))
    np.testing.assert_array_equal(times, [t, t + 1, t + 2])
    nan = np.nan
    np.testing.assert_array_equal(
        values, np.array([[1, 2, nan], [nan, 3, nan], [nan, nan, 4]], dtype=np.float32)
    )


@pytest.mark.parametrize("when", ["2300-01-01T00:00:00", "1600-06-01T12:00:00"])
def test_iso_times_past_int64_nanoseconds_are_refused_not_wrapped(tmp_path: Path, when: str) -> None:
    # parsed to ns, 2300-01-01 had wrapped to 1715-06-13 and the rows were stored out of their order
    (tmp_path / "a.csv").write_text(f"time,feature,value\n2026-01-01T00:00:00,a,1\n{when},a,2\n")
    with pytest.raises(StoreError, match=f"time '{when}' in .* lies outside what int64 nanoseconds"):
        ingest(str(tmp_path / "a.csv"), tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize("dtype", [pl.Datetime("us"), pl.Datetime("ms", "UTC"), pl.Date])
def test_datetime_and_date_columns_past_int64_nanoseconds_name_the_time(tmp_path: Path, dtype) -> None:  # noqa: ANN001
    # "cannot parse some times", with no hint and no time named
    import datetime as dt

    t = pl.Series([dt.datetime(2026, 1, 1), dt.datetime(2300, 1, 1)]).cast(dtype)
    write(pl.DataFrame({"time": t, "feature": ["a", "a"], "value": [1.0, 2.0]}), tmp_path / "a.parquet")
    with pytest.raises(StoreError, match=r"time .*2300.* lies outside what int64 nanoseconds"):
        ingest(tmp_path / "a.parquet", tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize(("unit", "scale"), [("s", SEC), ("ms", 1_000_000), ("us", 1_000), ("ns", 1)])
def test_integer_times_with_time_unit(tmp_path: Path, unit: str, scale: int) -> None:
    base = T0 // SEC
    df = pl.DataFrame({"ts": [base + 2, base, base + 1], "sym": ["a", "a", "b"], "px": [3, 1, 2]})
    write(df, tmp_path / "i.csv")
    res = cli(tmp_path / "i.csv", "-o", tmp_path / "out.zarr", "--time-column", "ts", "--feature-column", "sym",
              "--value-column", "px", "--time-unit", unit)  # fmt: skip
    assert res.exit_code == 0, res.stderr
    values, times, _ = read(tmp_path / "out.zarr")
    np.testing.assert_array_equal(times, np.array([base, base + 1, base + 2]) * scale)
    np.testing.assert_array_equal(values, np.array([[1, np.nan], [np.nan, 2], [3, np.nan]], dtype=np.float32))


# ----------------------------------------------------------------------------------------- append


def _two_halves(tmp_path: Path) -> tuple[pl.DataFrame, Path, Path]:
    df = long_frame(TIMES, NAMES, seed=7)
    write(df.filter(pl.col("time") < TIMES[25]), tmp_path / "a.parquet")
    write(df.filter(pl.col("time") >= TIMES[25], pl.col("feature") != "vol_a"), tmp_path / "b.csv")
    return df, tmp_path / "a.parquet", tmp_path / "b.csv"


def test_append_matches_one_ingest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tsconv.io.ingest as ing

    monkeypatch.setattr(ing, "_CHUNK_BYTES", 16 * 4 * 4)  # 16-row chunks: the append starts mid-chunk
    df, a, b = _two_halves(tmp_path)
    out = tmp_path / "out.zarr"
    ingest(a, out)
    assert zarr.open_group(str(out), mode="r")["values"].shape == (25, 4)
    res = cli(b, "-o", out, "--append")
    assert res.exit_code == 0, res.stderr
    ingest([a, b], tmp_path / "once.zarr")
    v1, t1, n1 = read(out)
    v2, t2, n2 = read(tmp_path / "once.zarr")
    assert n1 == n2 == SORTED
    np.testing.assert_array_equal(t1, t2)
    np.testing.assert_array_equal(v1, v2)
    assert np.isnan(v1[25:, SORTED.index("vol_a")]).all()  # a feature missing from the new rows is NaN
    assert zarr.open_group(str(out), mode="r").attrs["ingest"]["complete"] is True


def test_a_small_first_ingest_keeps_full_size_chunks_for_the_appends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # the chunk grid is fixed when the store is made: a 10-row first day grew into 20,001 chunk files
    import tsconv.io.ingest as ing

    monkeypatch.setattr(ing, "_CHUNK_BYTES", 64 * 4 * 4)  # 64-row chunks for 4 features
    df, a, b = _two_halves(tmp_path)  # 25 rows, then the rest
    out = tmp_path / "out.zarr"
    ingest(a, out)
    assert cli(b, "-o", out, "--append").exit_code == 0
    g = zarr.open_group(str(out), mode="r")
    assert g["values"].chunks == (64, 4) and g["time"].chunks == (64,)
    v, t, _ = read(out)
    ingest([a, b], tmp_path / "once.zarr")
    v2, t2, _ = read(tmp_path / "once.zarr")
    np.testing.assert_array_equal(t, t2)
    np.testing.assert_array_equal(v, v2)


def test_append_rolls_back_an_interrupted_append(tmp_path: Path) -> None:
    df, a, b = _two_halves(tmp_path)
    out = tmp_path / "out.zarr"
    ingest(a, out)
    # What a crash mid-append leaves: the attribute says incomplete and the arrays are already longer.
    g = zarr.open_group(str(out), mode="r+")
    g.attrs["ingest"] = {**g.attrs["ingest"], "complete": False, "rows_before": 25, "rows": 99}
    g["values"].resize((99, 4))
    g["time"].resize((99,))
    ingest(b, out, append=True)
    ingest([a, b], tmp_path / "once.zarr")
    np.testing.assert_array_equal(read(out)[0], read(tmp_path / "once.zarr")[0])
    np.testing.assert_array_equal(read(out)[1], read(tmp_path / "once.zarr")[1])


# Stores of 16-row chunks, appended in 16-row bands: the append of b (14 rows after 25) starts mid-chunk and
# writes in two bands (rows 25..32, 32..39), so that a crash can land between any two of its store changes.
_CRASH_CHUNK_BYTES, _CRASH_BAND_BYTES = 16 * 4 * 4, 1
# The append's store changes: the marker, both resizes, (values, time) per band, the commit.
_APPEND_CHANGES = (
    ["attrs ingest", "resize values", "resize time"] + ["write values", "write time"] * 2 + ["attrs ingest"]
)


class _Crash(BaseException):
    """A crash in-process: not an Exception, so no handler of tsconv's runs, as after a kill -9."""


def _files(root: Path) -> dict[str, bytes]:
    """Every file of a store by relative path: the store byte for byte."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _crash_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path, Path]:
    """(a, b, the store of a, the store of a with b appended uninterrupted)."""
    import tsconv.io.ingest as ing

    monkeypatch.setattr(ing, "_CHUNK_BYTES", _CRASH_CHUNK_BYTES)
    monkeypatch.setattr(ing, "_BAND_BYTES", _CRASH_BAND_BYTES)
    _, a, b = _two_halves(tmp_path)
    ref = tmp_path / "ref.zarr"
    ingest(a, ref)
    base = tmp_path / "base.zarr"
    shutil.copytree(ref, base)
    ingest(b, ref, append=True)
    return a, b, base, ref


def _assert_crashed_store_handled(out: Path, after: int, ref: Path, tmp_path: Path) -> None:
    """After a crash right after change ``after``: readers refuse the store with the fix, or (after the
    commit) read it as complete; a further --append then gives exactly the uninterrupted store."""
    if after == len(_APPEND_CHANGES) - 1:
        assert _files(out) == _files(ref)
        return
    with pytest.raises(StoreError, match="did not finish") as info:
        open_input(out)
    assert f"tsconv repair {out}" in str(info.value)
    res = CliRunner().invoke(main, ["inspect", str(out)])
    assert_refused(res, "--append", "did not finish", "the rows before it: 25", "tsconv repair")
    assert cli(tmp_path / "b.csv", "-o", out, "--append").exit_code == 0
    assert _files(out) == _files(ref)
    assert check_time(open_input(out)) is not None


def test_append_change_points_are_the_crash_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The crash tests below stop an append after each of these changes: check they are all of them.
    from tests.io import crashpoints

    _, b, base, ref = _crash_setup(tmp_path, monkeypatch)
    log, undo = crashpoints.install(10**9, lambda: None)
    try:
        ingest(b, base, append=True)
    finally:
        undo()
    assert log == _APPEND_CHANGES
    assert _files(base) == _files(ref)


@pytest.mark.parametrize("after", range(len(_APPEND_CHANGES)))
def test_append_crash_at_every_change_then_append_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: int
) -> None:
    from tests.io import crashpoints

    _, b, out, ref = _crash_setup(tmp_path, monkeypatch)

    def crash() -> None:
        raise _Crash

    log, undo = crashpoints.install(after, crash)
    try:
        with pytest.raises(_Crash):
            ingest(b, out, append=True)
    finally:
        undo()
    assert log == _APPEND_CHANGES[: after + 1]
    _assert_crashed_store_handled(out, after, ref, tmp_path)


@pytest.mark.slow
def test_append_killed_at_points_of_the_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real kill -9 (SIGKILL) of `ingest --append` in a subprocess: after the marker, after each resize,
    # mid-write (values of a band written, not its time), after the last write and after the commit.
    _, b, base, ref = _crash_setup(tmp_path, monkeypatch)
    root = Path(tsconv.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    points = [0, 1, 2, 3, 6, 7]
    procs = {}
    for k in points:
        out = tmp_path / f"killed{k}.zarr"
        shutil.copytree(base, out)
        args = [str(k), str(_CRASH_CHUNK_BYTES), str(_CRASH_BAND_BYTES), str(b), str(out)]
        procs[k] = subprocess.Popen(
            [sys.executable, "-m", "tests.io.crashpoints", *args],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    for k, proc in procs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGKILL, err
        _assert_crashed_store_handled(tmp_path / f"killed{k}.zarr", k, ref, tmp_path)


def test_repair_rolls_back_an_interrupted_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.io import crashpoints

    _, b, out, ref = _crash_setup(tmp_path, monkeypatch)
    before = read(out), dict(zarr.open_group(str(out), mode="r").attrs)
    res = CliRunner().invoke(main, ["repair", str(out)])
    assert res.exit_code == 0 and "nothing to repair" in res.stdout
    log, undo = crashpoints.install(1, lambda: (_ for _ in ()).throw(_Crash()))
    try:
        with pytest.raises(_Crash):
            ingest(b, out, append=True)
    finally:
        undo()
    g = zarr.open_group(str(out), mode="r")
    total = zarr.open_group(str(ref), mode="r")["values"].shape[0]
    assert (g["values"].shape[0], g["time"].shape[0]) == (total, 25)  # the state the crash left
    res = CliRunner().invoke(main, ["process", "-i", str(out), "-o", str(tmp_path / "f.zarr"), "-q"])
    assert_refused(res, "did not finish", f"'values' has {total} rows, 'time' has 25 rows", "tsconv repair")
    assert not (tmp_path / "f.zarr").exists()
    res = CliRunner().invoke(main, ["repair", str(out)])
    assert res.exit_code == 0, res.stderr
    assert "keeps its 25 rows" in res.stdout
    after = read(out), dict(zarr.open_group(str(out), mode="r").attrs)
    np.testing.assert_array_equal(after[0][0], before[0][0])
    np.testing.assert_array_equal(after[0][1], before[0][1])
    assert after[1] == before[1]
    ingest(b, out, append=True)
    assert _files(out) == _files(ref)


def test_repair_refuses_a_mismatch_it_has_no_record_of(tmp_path: Path) -> None:
    _, a, _ = _two_halves(tmp_path)
    out = tmp_path / "out.zarr"
    ingest(a, out)
    zarr.open_group(str(out), mode="r+")["values"].resize((30, 4))
    before = snapshot(out)
    res = CliRunner().invoke(main, ["repair", str(out)])
    assert_refused(res, "'values' has 30 rows and 'time' 25", "no record", "--overwrite")
    assert snapshot(out) == before
    assert_refused(CliRunner().invoke(main, ["repair", str(tmp_path / "nope.zarr")]), "does not exist")


def _interrupt_append(out: Path, rows_before: int, rows: int) -> None:
    """Leave ``out`` as an append killed right after its resize leaves it: marker set, arrays longer."""
    g = zarr.open_group(str(out), mode="r+")
    g.attrs["ingest"] = {**g.attrs["ingest"], "complete": False, "rows_before": rows_before, "rows": rows}
    g["values"].resize((rows, g["values"].shape[1]))
    g["time"].resize((rows,))


def test_an_array_of_a_store_with_an_unfinished_append_is_refused_read_bare(tmp_path: Path) -> None:
    # the store was refused, but `-i out.zarr/values` computed (and inspect showed) the 74 uncommitted rows
    _, a, _ = _two_halves(tmp_path)
    out = tmp_path / "out.zarr"
    ingest(a, out)
    _interrupt_append(out, 25, 99)
    with pytest.raises(StoreError, match="did not finish") as info:
        open_input(out / "values")
    assert f"tsconv repair {out}" in str(info.value)
    res = CliRunner().invoke(
        main, ["process", "-i", str(out / "values"), "-o", str(tmp_path / "f.zarr"), "-q"]
    )
    assert_refused(res, f"{out / 'values'} is an array inside the store {out}", "did not finish",
                   "the rows before it: 25", f"tsconv repair {out}")  # fmt: skip
    assert not (tmp_path / "f.zarr").exists()
    res = CliRunner().invoke(main, ["inspect", str(out / "values")])
    assert_refused(res, "did not finish", "the rows before it: 25", f"tsconv repair {out}")
    assert CliRunner().invoke(main, ["repair", str(out)]).exit_code == 0
    with pytest.warns(TsconvWarning, match="read bare"):
        assert open_input(out / "values").rows == 25


@pytest.mark.parametrize("damage", ["truncated", "missing"])
@pytest.mark.parametrize("command", ["repair", "append"])
def test_an_unfinished_append_with_a_damaged_array_is_refused_untouched(
    tmp_path: Path, damage: str, command: str
) -> None:
    # a JSONDecodeError / KeyError traceback, while inspect told the user to run repair on this very store
    _, a, b = _two_halves(tmp_path)
    out = tmp_path / "out.zarr"
    ingest(a, out)
    _interrupt_append(out, 25, 99)
    meta = out / "values" / "zarr.json"
    if damage == "truncated":
        meta.write_bytes(meta.read_bytes()[:200])
    else:
        shutil.rmtree(out / "values")
    before = snapshot(out)
    args = (
        ["repair", str(out)] if command == "repair" else ["ingest", str(b), "-o", str(out), "--append", "-q"]
    )
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2
    what = (
        "its 'values' array cannot be read (JSONDecodeError" if damage == "truncated" else "no 'values' array"
    )
    assert_refused(res, what, f"restore {str(out / 'values')!r}", "committed before the append: 25")
    assert snapshot(out) == before


def test_times_past_year_9999_are_named_not_a_traceback(tmp_path: Path) -> None:
    # ns counts labelled us: Python's datetime (year <= 9999) failed while the message naming them was built
    ns = [1_767_605_400_000_000_000, 1_767_605_401_000_000_000]
    t = pl.Series(ns, dtype=pl.Int64).cast(pl.Datetime("us"))
    write(pl.DataFrame({"time": t, "feature": ["a", "a"], "value": [1.0, 2.0]}), tmp_path / "a.parquet")
    res = CliRunner().invoke(main, ["ingest", str(tmp_path / "a.parquet"), "-o", str(tmp_path / "out.zarr")])
    assert_refused(res, "time '+57983-03-09", "lies outside what int64 nanoseconds since 1970 hold")
    assert not (tmp_path / "out.zarr").exists()


def test_append_refused_overlap_and_new_features(tmp_path: Path) -> None:
    df, a, b = _two_halves(tmp_path)
    out = tmp_path / "out.zarr"
    ingest(b, out)
    before, stored = snapshot(out), read(out)
    assert_refused(cli(a, "-o", out, "--append"), "cannot append", "not after the store's last time")
    assert snapshot(out) == before
    extra = write(
        pl.DataFrame({"time": [TIMES[-1] + 1], "feature": ["new_px"], "value": [1.0]}), tmp_path / "x.pq"
    )
    assert_refused(cli(extra, "-o", out, "--append"), "new_px", "hint: ")
    assert snapshot(out) == before
    # An error found only while writing (text deep in a CSV file) takes the new rows away again.
    late = "".join(f"{TIMES[-1] + k},px_a,{k}.5\n" for k in range(1, 20_001))
    (tmp_path / "late.csv").write_text(f"time,feature,value\n{late}{TIMES[-1] + 20_001},px_a,oops\n")
    assert_refused(cli(tmp_path / "late.csv", "-o", out, "--append"), "cannot read", "oops")
    np.testing.assert_array_equal(read(out)[1], stored[1])
    np.testing.assert_array_equal(read(out)[0], stored[0])
    assert zarr.open_group(str(out), mode="r").attrs["ingest"]["complete"] is True
    assert_refused(cli(extra, "-o", tmp_path / "nope.zarr", "--append"), "does not exist")
    assert not (tmp_path / "nope.zarr").exists()


# ------------------------------------------------------------------------------------ with process


def test_process_runs_on_an_ingested_store(tmp_path: Path) -> None:
    times = [T0 + k * SEC for k in range(300)]  # longer than the default pipeline's warm-up
    df = long_frame(times, ["a", "b"], seed=2, drop=0.05)
    write(as_datetime(df), tmp_path / "t.parquet")
    ingest(tmp_path / "t.parquet", tmp_path / "in.zarr")
    rep = tsconv.process(tmp_path / "in.zarr", tmp_path / "feats.zarr")
    ingested = read(tmp_path / "in.zarr")[1]
    assert rep.rows == ingested.size == df["time"].n_unique()
    g = zarr.open_group(str(tmp_path / "feats.zarr"), mode="r")
    np.testing.assert_array_equal(np.asarray(g["time"][:]), ingested)
    res = CliRunner().invoke(main, ["process", "-i", tmp_path / "in.zarr", "-o", tmp_path / "f2.zarr", "-q"])
    assert res.exit_code == 0, res.stderr


# ------------------------------------------------------------------------------------- bad inputs


def _good(tmp_path: Path, name: str = "good.parquet") -> Path:
    return write(as_datetime(long_frame(TIMES[:5], NAMES)), tmp_path / name)


def _bad_cases(tmp_path: Path) -> dict[str, tuple[list, tuple[str, ...]]]:
    good = _good(tmp_path)
    out = tmp_path / "out.zarr"
    (tmp_path / "empty.csv").write_bytes(b"")
    (tmp_path / "header.csv").write_text("time,feature,value\n")
    write(long_frame(TIMES[:2], NAMES).clear(), tmp_path / "norows.parquet")
    (tmp_path / "corrupt.parquet").write_bytes(b"PAR1 this is not parquet at all")
    (tmp_path / "corrupt.arrow").write_bytes(b"\x00" * 64)
    (tmp_path / "text.csv").write_text("time,feature,value\n1,a,1.5\n2,a,oops\n")
    late = "".join(f"{k},a,{k}.5\n" for k in range(20_000))  # beyond the CSV type inference
    (tmp_path / "late.csv").write_text(f"time,feature,value\n{late}20000,a,oops\n")
    write(pl.DataFrame({"time": [T0], "feature": ["a"], "value": ["1.5"]}), tmp_path / "strval.parquet")
    write(pl.DataFrame({"time": [T0], "sym": ["a"], "value": [1.0]}), tmp_path / "nofeat.parquet")
    write(pl.DataFrame({"time": [T0], "a": [1.0], "b": ["x"]}), tmp_path / "widestr.parquet")
    (tmp_path / "badtime.csv").write_text("time,feature,value\nyesterday,a,1\n")
    # a symbol '' made a store whose reader refuses its empty feature name
    write(
        pl.DataFrame({"time": [T0, T0], "feature": ["", "a"], "value": [1.0, 2.0]}),
        tmp_path / "emptyname.parquet",
    )
    (tmp_path / "usdate.csv").write_text("time,feature,value\n01/02/2024 09:30,a,1\n01/03/2024 09:30,a,2\n")
    (tmp_path / "ticks.txt").write_text("time,feature,value\n")
    (tmp_path / "exists.zarr").mkdir()
    zarr.open_group(str(tmp_path / "exists.zarr"), mode="w")
    (tmp_path / "plain").write_text("not a store")
    return {
        "missing file": ([tmp_path / "nope.parquet", "-o", out], ("does not exist", "nope.parquet")),
        "glob without match": ([str(tmp_path / "*.nothing"), "-o", out], ("no file matches", "*.nothing")),
        "empty csv": ([tmp_path / "empty.csv", "-o", out], ("is empty", "empty.csv")),
        "header only csv": ([tmp_path / "header.csv", "-o", out], ("has no rows", "header.csv")),
        "parquet without rows": ([tmp_path / "norows.parquet", "-o", out], ("has no rows",)),
        "corrupt parquet": ([tmp_path / "corrupt.parquet", "-o", out], ("cannot read", "as Parquet")),
        "corrupt ipc": ([tmp_path / "corrupt.arrow", "-o", out], ("cannot read", "as Arrow IPC")),
        "text in csv values": ([tmp_path / "text.csv", "-o", out], ("'value'", "not numeric", "text.csv")),
        "text in csv values, late": ([tmp_path / "late.csv", "-o", out], ("cannot read", "late.csv", "oops")),
        "string value column": (
            [tmp_path / "strval.parquet", "-o", out],
            ("'value'", "not numeric", "strval"),
        ),
        "missing column": (
            [good, tmp_path / "nofeat.parquet", "-o", out],
            ("no column 'feature'", "nofeat.parquet", "'sym'", "--feature-column"),
        ),
        "missing wide time column": (
            [good, "-o", out, "--layout", "wide", "--time-column", "ts"],
            ("no column 'ts'", "'time', 'feature', 'value'"),
        ),
        "non-numeric wide column": (
            [tmp_path / "widestr.parquet", "-o", out, "--layout", "wide"],
            ("column 'b'", "not numeric"),
        ),
        "empty feature name": (
            [tmp_path / "emptyname.parquet", "-o", out],
            ("empty (null) names", "emptyname"),
        ),
        "unparseable time": (
            [tmp_path / "badtime.csv", "-o", out],
            ("'yesterday'", "is not in the ISO 8601 form", "badtime.csv"),
        ),
        # a US export: polars guessed day first from the first value, and 01/02 became 1 February, silently
        "month-first time": (
            [tmp_path / "usdate.csv", "-o", out],
            ("'01/02/2024 09:30'", "is not in the ISO 8601 form"),
        ),
        "unknown suffix": ([tmp_path / "ticks.txt", "-o", out], ("unknown file format",)),
        "output exists": ([good, "-o", tmp_path / "exists.zarr"], ("already exists", "--overwrite")),
        "output is a plain file": ([good, "-o", tmp_path / "plain", "--overwrite"], ("not a zarr store",)),
        "output is an input": ([good, "-o", good, "--overwrite"], ("is, or contains, the input",)),
        "append and overwrite": ([good, "-o", out, "--append", "--overwrite"], ("exclude each other",)),
    }


def test_bad_inputs_one_line_no_traceback_inputs_untouched(tmp_path: Path) -> None:
    cases = _bad_cases(tmp_path)
    before = snapshot(tmp_path)
    for name, (args, needles) in cases.items():
        res = cli(*args)
        try:
            assert_refused(res, *needles)
        except AssertionError as exc:
            raise AssertionError(f"case {name!r}: {exc}\nstderr: {res.stderr!r}") from None
        assert snapshot(tmp_path) == before, f"case {name!r} changed the directory"


def test_library_raises_tsconv_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        ingest(tmp_path / "nope.csv", tmp_path / "o.zarr")
    good = _good(tmp_path)
    with pytest.raises(tsconv.TsconvError, match="layout"):
        ingest(good, tmp_path / "o.zarr", layout="tall")
    with pytest.raises(tsconv.TsconvError, match="time unit"):
        ingest(good, tmp_path / "o.zarr", time_unit="h")
    assert not (tmp_path / "o.zarr").exists()


@pytest.mark.parametrize(
    ("first", "second", "ns"),
    [
        (
            "2024-01-02T09:30:00.123456789Z",
            "2024-01-02T09:30:01.5Z",
            (1704187800123456789, 1704187801500000000),
        ),
        ("2024-01-02 09:30:00+0530", "2024-01-02 09:31:00+0530", (1704168000000000000, 1704168060000000000)),
        ("2024-01-02T09:30", "2024-01-02T09:31", (1704187800000000000, 1704187860000000000)),
        ("2024-01-02T09:30:00z", "2024-01-02T09:31:00z", (1704187800000000000, 1704187860000000000)),
        ("2024-01-02", "2024-01-03", (1704153600000000000, 1704240000000000000)),
    ],
)
def test_iso_8601_time_strings_in_their_usual_forms_are_read(
    tmp_path: Path, first: str, second: str, ns
) -> None:
    src = tmp_path / "iso.csv"
    src.write_text(f"time,feature,value\n{first},a,1\n{second},a,2\n")
    ingest(src, tmp_path / "iso.zarr")
    _, times, _ = read(tmp_path / "iso.zarr")
    assert times.tolist() == list(ns)


def test_repair_of_a_store_with_a_scalar_time_coordinate_finds_nothing_to_repair(tmp_path: Path) -> None:
    # its values' rows were compared with a 0-d time's shape[0]: an IndexError traceback
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=3)
    g.create_array("values", data=np.ones((5, 2), np.float32))
    g.create_array("time", data=np.array(1_700_000_000_000_000_000, np.int64))
    assert repair(tmp_path / "s.zarr") is None


def test_a_csv_with_blank_lines_is_read_without_them(tmp_path: Path) -> None:
    # a blank line (at the end, most often) was a row of nulls, refused as a time missing
    src = tmp_path / "blank.csv"
    src.write_text("time,feature,value\n2024-01-01T00:00:01Z,A,1.5\n\n2024-01-01T00:00:02Z,A,2.5\n\n")
    ingest(src, tmp_path / "b.zarr")
    values, times, names = read(tmp_path / "b.zarr")
    assert names == ["A"] and len(times) == 2 and values[:, 0].tolist() == [1.5, 2.5]


def test_overwrite_replaces_a_store(tmp_path: Path) -> None:
    good = _good(tmp_path)
    out = tmp_path / "out.zarr"
    ingest(good, out)
    other = write(as_datetime(long_frame(TIMES[10:13], ["q"], drop=0)), tmp_path / "other.parquet")
    ingest(other, out, overwrite=True)
    values, times, names = read(out)
    assert names == ["q"] and times.tolist() == TIMES[10:13]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary store left


def test_a_kill_while_the_replaced_store_is_deleted_leaves_the_new_one(tmp_path: Path, monkeypatch) -> None:
    # the old store was deleted in place: a kill part-way left it half-deleted at the output path, its
    # attributes still saying complete, and the next ingest removed the new one as a leftover
    import tsconv.io.ingest as ingest_module

    good = _good(tmp_path)
    out = tmp_path / "out.zarr"
    ingest(good, out)
    other = write(as_datetime(long_frame(TIMES[10:13], ["q"], drop=0)), tmp_path / "other.parquet")
    real = shutil.rmtree

    def killed(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if Path(path).name.startswith(".out.zarr.ingest-"):  # the replaced store, swapped or renamed aside
            next(p for p in Path(path).rglob("*") if p.is_file()).unlink()  # part of it gone, then the kill
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(ingest_module.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        ingest(other, out, overwrite=True)
    monkeypatch.undo()
    values, times, names = read(out)
    assert names == ["q"] and times.tolist() == TIMES[10:13]
    assert tsconv.open_input(out).values.shape == (3, 1)
    ingest(good, tmp_path / "x.zarr")
    ingest(other, out, overwrite=True)  # the next ingest into it removes what the kill left beside it
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def _exchange_supported(where: Path) -> bool:
    from tsconv.io.ingest import _exchange

    a, b = where / ".xa", where / ".xb"
    a.mkdir(), b.mkdir()
    try:
        return _exchange(a, b)
    finally:
        a.rmdir(), b.rmdir()


_KILL_AT_A_RENAME = """
import os, sys
from pathlib import Path
from tsconv.io.ingest import ingest
out = Path(sys.argv[2]).absolute()
real = os.replace
def replace(src, dst):
    if Path(src).absolute() == out:  # the old store moved aside, then killed, before the new one is in place
        real(src, dst)
        os._exit(9)
    return real(src, dst)
os.replace = replace
ingest(sys.argv[1], out, overwrite=True)
"""


def test_a_kill_while_an_overwrite_puts_the_new_store_in_place_leaves_a_store_there(tmp_path: Path) -> None:
    # two renames (old aside, new in place): a kill between them left nothing at the output path, and the next
    # ingest into it deleted the old store and the new one as leftovers
    if not _exchange_supported(tmp_path):
        pytest.skip("this filesystem has no renameat2(RENAME_EXCHANGE): the overwrite renames twice here")
    good = _good(tmp_path)
    out = tmp_path / "out.zarr"
    ingest(good, out)
    other = write(as_datetime(long_frame(TIMES[10:13], ["q"], drop=0)), tmp_path / "other.parquet")
    res = subprocess.run([sys.executable, "-c", _KILL_AT_A_RENAME, str(other), str(out)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    values, times, names = read(out)
    assert names == ["q"] and times.tolist() == TIMES[10:13]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------------------- several value columns


def _px_qty(tmp_path: Path, name: str = "t.csv") -> tuple[pl.DataFrame, Path]:
    df = pl.DataFrame(
        {
            "time": [T0 + 2, T0, T0 + 1, T0, T0 + 2],
            "sym": ["MSFT", "AAPL", "AAPL", "MSFT", "MSFT"],
            "px": [20.5, 10.0, 10.5, 20.0, 21.0],  # MSFT at T0 + 2 twice: the last row wins
            "qty": [5, 1, None, 3, 7],
        }
    )
    return df, write(df, tmp_path / name)


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_several_value_columns_name_features_symbol_dot_column(tmp_path: Path, suffix: str) -> None:
    _, src = _px_qty(tmp_path, f"t.{suffix}")
    res = cli(src, "-o", tmp_path / "out.zarr", "--feature-column", "sym", "--value-column", "px",
              "--value-column", "qty")  # fmt: skip
    assert res.exit_code == 0, res.stderr
    assert "3 rows x 4 features" in res.stdout
    values, times, names = read(tmp_path / "out.zarr")
    assert names == ["AAPL.px", "AAPL.qty", "MSFT.px", "MSFT.qty"]
    np.testing.assert_array_equal(times, [T0, T0 + 1, T0 + 2])
    nan = np.nan
    want = [[10.0, 1, 20.0, 3], [10.5, nan, nan, nan], [nan, nan, 21.0, 7]]
    np.testing.assert_array_equal(values, np.array(want, dtype=np.float32))
    # the value columns of a symbol in the order given; the names as a pipeline selects them
    ingest(src, tmp_path / "rev.zarr", feature_column="sym", value_column=["qty", "px"])
    assert read(tmp_path / "rev.zarr")[2] == ["AAPL.qty", "AAPL.px", "MSFT.qty", "MSFT.px"]
    y, cols = tsconv.features(open_input(tmp_path / "out.zarr").values[:], names=names, return_names=True,
                              pipeline={"conv": [{"filters": ["diff:1"]}]}, warmup="zero")  # fmt: skip
    assert cols[0] == "AAPL.px.diff1" and y.shape == (3, 4)


def test_one_value_column_keeps_the_symbols_as_names(tmp_path: Path) -> None:
    df, src = _px_qty(tmp_path)
    for args in (["--value-column", "px"], ["--value-column", "qty"]):
        out = tmp_path / f"{args[1]}.zarr"
        res = cli(src, "-o", out, "--feature-column", "sym", *args)
        assert res.exit_code == 0, res.stderr
        assert read(out)[2] == ["AAPL", "MSFT"]
    np.testing.assert_array_equal(
        read(tmp_path / "px.zarr")[0], [[10.0, 20.0], [10.5, np.nan], [np.nan, 21.0]]
    )
    # the default value column, as a string or a one-column list: the same store
    renamed = write(df.rename({"px": "value"}).drop("qty"), tmp_path / "v.csv")
    ingest(renamed, tmp_path / "a.zarr", feature_column="sym")
    ingest(renamed, tmp_path / "b.zarr", feature_column="sym", value_column=["value"])
    for path in (tmp_path / "a.zarr", tmp_path / "b.zarr"):
        values, _, names = read(path)
        assert names == ["AAPL", "MSFT"]
        np.testing.assert_array_equal(values, read(tmp_path / "px.zarr")[0])


def test_several_value_columns_append_and_refusals(tmp_path: Path) -> None:
    df, src = _px_qty(tmp_path)
    out = tmp_path / "out.zarr"
    args = ["--feature-column", "sym", "--value-column", "px", "--value-column", "qty"]
    assert cli(src, "-o", out, *args).exit_code == 0
    later = write(df.with_columns(pl.col("time") + 10), tmp_path / "later.csv")
    assert cli(later, "-o", out, "--append", *args).exit_code == 0
    values, times, names = read(out)
    assert names == ["AAPL.px", "AAPL.qty", "MSFT.px", "MSFT.qty"] and times.size == 6
    np.testing.assert_array_equal(values[3:], values[:3])
    more = write(df.with_columns(pl.col("time") + 20), tmp_path / "more.csv")
    line = assert_refused(cli(more, "-o", out, "--append", "--feature-column", "sym", "--value-column", "px"),
                          "ingested with the value column(s) 'px', 'qty'", "--value-column")  # fmt: skip
    assert "not 'px'" in line
    assert_refused(
        cli(src, "-o", tmp_path / "x.zarr", *args, "--value-column", "px"), "'px' is given more than once"
    )
    assert_refused(cli(src, "-o", tmp_path / "x.zarr", *args, "--value-column", "size"), "no column 'size'")
    assert_refused(cli(src, "-o", tmp_path / "x.zarr", "--feature-column", "sym", "--value-column", "sym"),
                   "also the feature column")  # fmt: skip
    assert not (tmp_path / "x.zarr").exists()


def test_long_layout_options_with_wide_input_and_a_feature_column_that_is_the_time_column_are_refused(
    tmp_path: Path,
) -> None:
    # wide input ingested every column whatever value_column named, and feature_column=time made one feature
    # per timestamp
    times = [T0 + i * 1_000_000_000 for i in range(3)]
    wide = write(pl.DataFrame({"time": times, "px_a": [1.0, 2.0, 3.0], "px_b": [4.0, 5.0, 6.0]}),
                 tmp_path / "wide.parquet")  # fmt: skip
    long = write(pl.DataFrame({"time": times, "feature": ["A"] * 3, "value": [1.0, 2.0, 3.0]}),
                 tmp_path / "long.parquet")  # fmt: skip
    out = tmp_path / "x.zarr"
    for option, flag in (
        ({"value_column": "px_a"}, "--value-column"),
        ({"feature_column": "sym"}, "--feature-column"),
    ):
        name, value = next(iter(option.items()))
        with pytest.raises(
            StoreError, match=f"{name}=.* applies to long input only, not to layout='wide'"
        ) as err:
            ingest(wide, out, layout="wide", **option)
        assert flag in err.value.hint
        assert_refused(
            cli(wide, "-o", out, "--layout", "wide", flag, value), f"{name}=", "layout='wide'", flag
        )
    with pytest.raises(StoreError, match="the feature column 'time' is also the time column"):
        ingest(long, out, feature_column="time")
    assert_refused(
        cli(long, "-o", out, "--feature-column", "time"), "the feature column 'time' is also the time"
    )
    assert not out.exists()
    ingest(wide, out, layout="wide")  # the defaults of the long layout's options are not given options
    assert read(out)[2] == ["px_a", "px_b"]


def test_float64_sources_stored_as_float32_warn_and_an_append_keeps_the_stores_dtype(tmp_path: Path) -> None:
    from tsconv.errors import TsconvWarning
    from tsconv.io.ingest import ingest

    n = 300
    v = 400 + np.cumsum(np.random.default_rng(4).normal(0, 0.01, n))  # float64 prices float32 does not hold
    df = pl.DataFrame(
        {"time": T0 + np.arange(n, dtype=np.int64) * 1_000_000_000, "feature": ["px"] * n, "value": v}
    )
    first, more = write(df[:200], tmp_path / "a.parquet"), write(df[200:], tmp_path / "b.parquet")
    with pytest.warns(
        TsconvWarning, match=r"rounding the values of 'px'.*--dtype float64 \(dtype='float64'\) keeps them"
    ):
        ingest(first, tmp_path / "s32.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TsconvWarning)
        ingest(first, tmp_path / "s64.zarr", dtype="float64")
        ingest(more, tmp_path / "s64.zarr", append=True)  # the store's float64 kept
        # prices on a 0.01 grid near 100: float32 moves them by 3.8e-6 at most, under 5e-4 of a step
        ingest(
            write(df.with_columns(pl.col("value").round(2) - 300), tmp_path / "c.parquet"),
            tmp_path / "g.zarr",
        )
    values, _, _ = read(tmp_path / "s64.zarr")
    assert values.dtype == np.float64 and values[:, 0].tobytes() == v.tobytes()
    assert_refused(
        cli(more, "-o", tmp_path / "s32.zarr", "--append", "--dtype", "float64"), "holds float32 values"
    )
    assert read(tmp_path / "s32.zarr")[0].shape == (200, 1)  # refused before any change


def test_the_rounding_of_any_symbol_or_column_is_seen(tmp_path: Path) -> None:
    # a second symbol at 400 behind one at 20; a wide column that starts late; integer ticks beyond 2^24
    from tsconv.errors import TsconvWarning
    from tsconv.io.ingest import ingest

    n = 3000
    rng = np.random.default_rng(7)
    t = T0 + np.arange(n, dtype=np.int64) * 1_000_000_000
    low, high = 20 + np.cumsum(rng.normal(0, 0.01, n)), 400 + np.cumsum(rng.normal(0, 0.01, n))
    long = pl.DataFrame({"time": np.r_[t, t], "feature": ["a"] * n + ["b"] * n, "value": np.r_[low, high]})
    late = np.where(np.arange(n) < 2500, np.nan, high)
    wide = pl.DataFrame({"time": t, "lo": low, "hi": late})
    ticks = pl.DataFrame(
        {"time": t, "feature": ["x"] * n, "value": np.round(high * 100).astype(np.int64) + (1 << 26)}
    )
    for name, df, layout, who in (("long", long, "long", "'b'"), ("wide", wide, "wide", "'hi'"),
                                  ("ticks", ticks, "long", "'x'")):  # fmt: skip
        with pytest.warns(TsconvWarning, match=f"rounding the values of {who}"):
            ingest(write(df, tmp_path / f"{name}.parquet"), tmp_path / f"{name}.zarr", layout=layout)


@pytest.mark.parametrize("kind", ["datetime", "iso text"])
def test_a_time_unit_for_times_that_carry_their_own_is_refused(tmp_path: Path, kind: str) -> None:
    # --time-unit s on a datetime or ISO time column did nothing, without a word
    t = T0 + np.arange(3, dtype=np.int64) * 1_000_000_000
    df = pl.DataFrame({"time": t, "a": [1.0, 2.0, 3.0]}).with_columns(
        pl.col("time").cast(pl.Datetime("ns", "UTC"))
    )
    if kind == "iso text":
        df = df.with_columns(pl.col("time").dt.strftime("%Y-%m-%dT%H:%M:%SZ"))
    src = write(df, tmp_path / "d.parquet")
    res = cli(src, "-o", tmp_path / "d.zarr", "--layout", "wide", "--time-unit", "s")
    assert_refused(res, "--time-unit s applies to integer time columns", "leave --time-unit out")
    assert not (tmp_path / "d.zarr").exists()
    assert (
        cli(src, "-o", tmp_path / "d.zarr", "--layout", "wide").exit_code == 0
    )  # without it: read as written
    ints = write(pl.DataFrame({"time": t // 1_000_000_000, "a": [1.0, 2.0, 3.0]}), tmp_path / "i.parquet")
    assert cli(ints, "-o", tmp_path / "i.zarr", "--layout", "wide", "--time-unit", "s").exit_code == 0
    assert read(tmp_path / "i.zarr")[1].tolist() == read(tmp_path / "d.zarr")[1].tolist()


def test_a_wide_files_rounding_is_judged_in_bounded_blocks_as_one(tmp_path: Path, monkeypatch) -> None:
    # the check held the first 20,000 rows of every float64 column at once, with its copies: 9.2 GB for a
    # file of 8,000 columns, where the ingest itself holds a band; the blocks' warning is the whole sample's
    import tsconv.io.ingest as ingest_module
    from tsconv.io.precision import float32_loss_by_feature

    n, f = 3000, 300
    rng = np.random.default_rng(3)
    t = T0 + np.arange(n, dtype=np.int64) * 1_000_000_000
    scale = 0.01 * (1 + np.arange(f))  # wider steps to the right: the first column's rounding matters most
    x = 400 + np.cumsum(rng.normal(0, 1, (n, f)) * scale, axis=0)
    df = pl.DataFrame({"time": t, **{f"c{j}": x[:, j] for j in range(f)}})
    src = write(df, tmp_path / "w.parquet")
    want, _ = float32_loss_by_feature(x, [f"c{j}" for j in range(f)], groups=np.zeros(n, dtype=np.int64),
                                      context="{dtype}", advice="")  # fmt: skip
    assert want is not None and "(and " in want
    seen: list[int] = []
    real = ingest_module._wide_blocks

    def blocks(source, cols):  # noqa: ANN001, ANN202
        for block in real(source, cols):
            seen.append(block[0].size)
            yield block

    monkeypatch.setattr(ingest_module, "_BLOCK_CELLS", 20_000)
    monkeypatch.setattr(ingest_module, "_wide_blocks", blocks)
    with pytest.warns(TsconvWarning) as got:
        ingest(src, tmp_path / "w.zarr", layout="wide")
    message = next(str(w.message) for w in got if "rounding the values" in str(w.message))
    assert message.split(": ", 1)[1].split("; --dtype")[0] == want.split(": ", 1)[1].rstrip("; ")
    assert len(seen) > 40 and max(seen) <= 20_000 + 3000  # a block of columns, never the whole width


def test_the_rounding_of_a_symbol_past_the_first_256_and_of_decimals_is_seen(tmp_path: Path) -> None:
    # the check looked at the first 256 symbols of a file only, and not at Decimal columns: 0.0019 stored on a
    # 0.01 grid without a word
    from decimal import Decimal

    from tsconv.errors import TsconvWarning
    from tsconv.io.ingest import ingest

    k = np.arange(20)
    exact = pl.DataFrame({
        "time": np.tile(T0 + k * 1_000_000_000, 300), "feature": np.repeat([f"S{j:03d}" for j in range(300)], 20),
        "value": np.tile(100.0 + k * 0.25, 300),  # float32 holds these
    })  # fmt: skip
    last = exact["feature"] == "S299"
    many = exact.with_columns(
        pl.when(last).then(40000.0 + pl.col("value") * 0.04).otherwise("value").alias("value")
    )
    with pytest.warns(TsconvWarning, match="rounding the values of 'S299'"):
        ingest(write(many, tmp_path / "many.parquet"), tmp_path / "many.zarr")
    prices = [Decimal(40000) + Decimal(j) / 100 for j in range(50)]
    dec = pl.DataFrame(
        {"time": T0 + np.arange(50) * 1_000_000_000, "feature": ["px"] * 50, "value": prices},
        schema_overrides={"value": pl.Decimal(18, 2)},
    )
    with pytest.warns(TsconvWarning, match="rounding the values of 'px'"):
        ingest(write(dec, tmp_path / "dec.parquet"), tmp_path / "dec.zarr")


@pytest.mark.parametrize("layout", ["wide", "long"])
def test_a_csv_column_empty_in_its_first_rows_is_read_as_its_parquet_twin(
    tmp_path: Path, layout: str
) -> None:
    # polars types a CSV column empty over the rows it infers from as String: a symbol listed after 10,000 rows
    # (or a column empty throughout) was refused as "not numeric"
    n = 10_100
    t = T0 + np.arange(n, dtype=np.int64) * 1_000_000
    late = np.where(np.arange(n) < 10_050, np.nan, 7.5)
    if layout == "wide":
        df = pl.DataFrame({"time": t, "old": np.full(n, 1.25), "new": late, "none": np.full(n, np.nan)})
        df = df.with_columns(pl.col("new", "none").fill_nan(None))
        args: dict = {}
    else:
        df = pl.DataFrame({"time": t, "feature": ["a"] * n, "px": np.full(n, 1.25), "qty": late})
        df = df.with_columns(pl.col("qty").fill_nan(None))
        args = {"value_column": ["px", "qty"]}
    ingest(write(df, tmp_path / "t.parquet"), tmp_path / "p.zarr", layout=layout, **args)
    ingest(write(df, tmp_path / "t.csv"), tmp_path / "c.zarr", layout=layout, **args)
    (pv, pt, pn), (cv, ct, cn) = read(tmp_path / "p.zarr"), read(tmp_path / "c.zarr")
    assert cn == pn and np.array_equal(ct, pt) and np.array_equal(cv, pv, equal_nan=True)
    assert np.nanmax(cv) == 7.5
    (tmp_path / "bad.csv").write_text("time,a,b\n" + "1,1.0,\n" * 10_001 + "2,1.0,x\n")
    with pytest.raises(StoreError, match="bad.csv"):  # text past the rows inferred: refused, naming the file
        ingest(str(tmp_path / "bad.csv"), tmp_path / "bad.zarr", layout="wide", time_unit="s")


@pytest.mark.parametrize("layout", ["long", "wide"])
def test_a_csv_value_column_is_read_as_floats_whatever_its_first_rows_hold(
    tmp_path: Path, layout: str
) -> None:
    # polars types a CSV column from its first 10,000 rows: whole numbers there made it i64, and a later
    # 101.25 was refused; a 'nan' (as Python's csv module writes it) or 'Inf' there made it String, refused
    # as not numeric, though the same cell further down was read as NaN
    whole = [str(100 + k % 7) for k in range(20_000)]
    for name, cells in {
        "late": [*whole, "101.25", "nan", ".5", "1E5"],
        "early": ["nan", "Inf", "-nan", *whole, "101.25"],
    }.items():
        head = "time,feature,value" if layout == "long" else "time,a"
        rows = [f"{k},a,{v}" if layout == "long" else f"{k},{v}" for k, v in enumerate(cells)]
        path = tmp_path / f"{name}.csv"
        path.write_text("\n".join([head, *rows]) + "\n")
        ingest(str(path), tmp_path / f"{name}.zarr", layout=layout, time_unit="s", dtype="float64")
        values, times, features = read(tmp_path / f"{name}.zarr")
        assert features == ["a"] and np.array_equal(times, np.arange(len(cells)) * SEC)
        assert np.array_equal(values[:, 0], [float(v) for v in cells], equal_nan=True)


@pytest.mark.parametrize("layout", ["long", "wide"])
def test_a_csv_missing_value_marker_is_named_with_how_to_write_it(tmp_path: Path, layout: str) -> None:
    # R's write.csv writes NA for a missing price (SQL exports NULL): the column of numbers was refused as
    # "not numeric (String)" with no cell named, and told to name another value column (wide: that the file
    # was long input)
    head, row = ("time,feature,value", "{k},a,{v}") if layout == "long" else ("time,a", "{k},{v}")
    for marker in ["NA", "NULL"]:
        cells = ["100.5", marker, "100.75"]
        path = tmp_path / f"{marker}.csv"
        path.write_text("\n".join([head, *(row.format(k=k, v=v) for k, v in enumerate(cells))]) + "\n")
        args = [path, "-o", tmp_path / f"{marker}.zarr", "--time-unit", "s", "--layout", layout]
        line = assert_refused(cli(*args), f"it holds {marker!r}", "empty cells for missing values")
        assert "--value-column" not in line and "--layout long" not in line
    # text that is no missing-value marker is named too, and keeps the hint it had
    path = tmp_path / "text.csv"
    path.write_text(f"{head}\n" + row.format(k=1, v="AAPL") + "\n")
    line = assert_refused(
        cli(path, "-o", tmp_path / "t.zarr", "--time-unit", "s", "--layout", layout), "'AAPL'"
    )
    assert ("--value-column" if layout == "long" else "--layout long") in line


def test_a_long_csv_column_ingest_does_not_use_cannot_fail_the_file(tmp_path: Path) -> None:
    # an unused column was still parsed with the type guessed from its first rows: 20,000 whole quantities
    # then 2.5 refused the whole file
    rows = [f"{k},a,{k}.25,{k % 9}" for k in range(20_000)] + ["20000,a,7.5,2.5"]
    path = tmp_path / "t.csv"
    path.write_text("time,feature,value,qty\n" + "\n".join(rows) + "\n")
    ingest(str(path), tmp_path / "t.zarr", time_unit="s", dtype="float64")
    values, times, features = read(tmp_path / "t.zarr")
    assert features == ["a"] and np.array_equal(times, np.arange(20_001) * SEC)
    assert np.array_equal(values[:, 0], [k + 0.25 for k in range(20_000)] + [7.5])


def test_a_bad_csv_time_cell_is_told_the_time_forms_not_the_value_rule(tmp_path: Path) -> None:
    # the hint was chosen on "could not parse" whatever the column: a time cell past the rows polars types
    # from was told that "every value of a value column must be a number"
    ok = "".join(f"{1_767_312_000 + k},a,{k}.5\n" for k in range(11_000))
    for name, bad in {"iso": "2026-01-02T09:30:00Z", "fraction": "1767323000.5"}.items():
        path = tmp_path / f"{name}.csv"
        path.write_text(f"time,feature,value\n{ok}{bad},a,1.5\n")
        line = assert_refused(
            cli(path, "-o", tmp_path / f"{name}.zarr", "--time-unit", "s"), bad, "--time-unit", "ISO 8601"
        )
        assert "value column" not in line and not (tmp_path / f"{name}.zarr").exists()


def test_iso_times_with_and_without_an_offset_in_one_file_are_refused_naming_both(tmp_path: Path) -> None:
    # both forms are read (no offset: UTC), but polars reads a column in one form: a file mixing them was
    # refused with polars' conversion error and the hint that times must be ISO 8601 strings, which they were
    for name, times in {
        "z": ["2026-01-02T09:30:00Z", "2026-01-02T09:30:01"],
        "date": ["2026-01-02", "2026-01-02T09:30:00+02:00"],
    }.items():
        path = tmp_path / f"{name}.csv"
        path.write_text("time,feature,value\n" + "".join(f"{t},a,1.5\n" for t in times))
        line = assert_refused(
            cli(path, "-o", tmp_path / f"{name}.zarr"), *map(repr, times), "every time with"
        )
        assert "must be ISO 8601" not in line and not (tmp_path / f"{name}.zarr").exists()
    # offsets written in different forms are all offsets: read, each converted to UTC
    path = tmp_path / "offsets.csv"
    path.write_text("time,feature,value\n2026-01-02T09:30:00Z,a,1\n2026-01-02T11:30:01+02:00,a,2\n")
    ingest(str(path), tmp_path / "offsets.zarr")
    assert np.array_equal(read(tmp_path / "offsets.zarr")[1], [T0, T0 + SEC])


def test_a_time_zone_of_a_fixed_part_hour_offset_is_refused_in_one_line(tmp_path: Path) -> None:
    # polars panics reading '+05:30' (a BaseException): the command died with a traceback
    import pyarrow as pa
    import pyarrow.parquet as pq

    times = pa.array([T0 // 1000, T0 // 1000 + 1], type=pa.timestamp("us", tz="+05:30"))
    pq.write_table(
        pa.table({"time": times, "feature": ["N", "N"], "value": [1.0, 2.0]}), tmp_path / "ist.parquet"
    )
    line = assert_refused(cli(tmp_path / "ist.parquet", "-o", tmp_path / "ist.zarr"), "'+05:30'", "UTC")
    assert "ist.parquet" in line and not (tmp_path / "ist.zarr").exists()


@pytest.mark.parametrize("zone", ["Z", "+0530", "UTC+2", "europe/paris"])
def test_a_time_zone_polars_cannot_read_is_refused_before_it_panics(
    tmp_path: Path, zone: str, capfd: pytest.CaptureFixture[str]
) -> None:
    # only "+05:30" was caught before the read: other zones reached polars, whose panic Rust printed on
    # stderr (several lines, a backtrace hint) before the one-line refusal
    import pyarrow as pa
    import pyarrow.parquet as pq

    times = pa.array([T0 // 1000, T0 // 1000 + 1], type=pa.timestamp("us", tz=zone))
    pq.write_table(
        pa.table({"time": times, "feature": ["N", "N"], "value": [1.0, 2.0]}), tmp_path / "z.parquet"
    )
    with pytest.raises(StoreError, match="time zone") as err:
        ingest(str(tmp_path / "z.parquet"), tmp_path / "z.zarr")
    assert repr(zone) in str(err.value) and "panicked" not in capfd.readouterr().err
    assert not (tmp_path / "z.zarr").exists()


def test_whole_hour_offsets_and_zone_names_polars_reads_are_ingested(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    for zone in ["+02:00", "-0500", "UTC", "utc", "Zulu", "America/New_York"]:
        times = pa.array([T0 // 1000, T0 // 1000 + 1], type=pa.timestamp("us", tz=zone))
        pq.write_table(
            pa.table({"time": times, "feature": ["N", "N"], "value": [1.0, 2.0]}), tmp_path / "z.parquet"
        )
        ingest(str(tmp_path / "z.parquet"), tmp_path / "z.zarr", overwrite=True)
        assert np.array_equal(read(tmp_path / "z.zarr")[1], [T0, T0 + 1000])


@pytest.mark.parametrize("layout", ["wide", "long"])
def test_a_csv_header_naming_a_column_twice_is_refused(tmp_path: Path, layout: str) -> None:
    # polars keeps both columns, the second as 'a_duplicated_0': a wide file stored a feature of that made-up name
    head = "time,a,a" if layout == "wide" else "time,feature,value,value"
    row = "2026-01-01T00:00:00,1,2" if layout == "wide" else "2026-01-01T00:00:00,a,1,2"
    (tmp_path / "d.csv").write_text(f"{head}\n{row}\n")
    twice = "'a'" if layout == "wide" else "'value'"
    with pytest.raises(StoreError, match=f"names the column {twice} more than once in its header"):
        ingest(str(tmp_path / "d.csv"), tmp_path / "out.zarr", layout=layout)
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize(
    "names",
    [
        pl.Series([{"s": "a", "x": 1}, {"s": "a", "x": 2}]),
        pl.Series([["a"], ["b"]]),
        pl.Series([[1, 2], [3, 4]], dtype=pl.Array(pl.Int64, 2)),
    ],
    ids=["struct", "list", "array"],
)
@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_a_nested_feature_column_is_refused_naming_its_type(
    tmp_path: Path, names: pl.Series, suffix: str
) -> None:
    # a struct's text became the features' names ('{"a",1}', '{"a",2}'), silently; a list failed the read
    # with a hint that the file was damaged
    df = pl.DataFrame({"time": [T0, T0 + SEC], "feature": names, "value": [1.0, 2.0]})
    src = write(df, tmp_path / f"n{suffix}")
    with pytest.raises(
        StoreError, match="feature column 'feature' of .* holds (Struct|List|Array).*, not names"
    ):
        ingest(src, tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()
    assert_refused(cli(src, "-o", tmp_path / "out.zarr"), "not names")


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_an_arrow_ipc_stream_is_refused_as_a_stream_not_as_a_damaged_file(
    tmp_path: Path, compression: str | None
) -> None:
    # polars' scan reads the file format only: a stream failed with 'InvalidFooter' and the hint to check
    # that the file was complete and its suffix right
    df = long_frame(TIMES, NAMES)
    src = tmp_path / "s.arrow"
    df.write_ipc_stream(src, compression=compression or "uncompressed")
    with pytest.raises(
        StoreError, match="is an Arrow IPC stream; tsconv reads the Arrow IPC file format"
    ) as err:
        ingest(src, tmp_path / "out.zarr")
    assert "write_ipc(dst)" in (err.value.hint or "")
    assert not (tmp_path / "out.zarr").exists()
    # as the hint says, the file format of the same rows is read
    pl.read_ipc_stream(src).write_ipc(tmp_path / "f.arrow")
    ingest(tmp_path / "f.arrow", tmp_path / "out.zarr", dtype="float64")
    values, _, names = read(tmp_path / "out.zarr")
    np.testing.assert_array_equal(values, dense(df, names)[0])


@pytest.mark.parametrize("layout", ["wide", "long"])
@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_a_parquet_or_arrow_file_naming_a_column_twice_is_refused(
    tmp_path: Path, layout: str, suffix: str
) -> None:
    # pyarrow writes such a table: polars refused the Parquet file with a hint that it was damaged, and
    # panicked reading the Arrow file (a Rust backtrace on stderr, then polars' JoinError text)
    pa = pytest.importorskip("pyarrow")
    times = pa.array([T0, T0 + SEC]).cast(pa.timestamp("ns"))
    if layout == "wide":
        table = pa.Table.from_arrays(
            [times, pa.array([1.0, 2.0]), pa.array([3.0, 4.0])], names=["time", "a", "a"]
        )
    else:
        cols = [times, pa.array(["x", "y"]), pa.array([1.0, 2.0]), pa.array([3.0, 4.0])]
        table = pa.Table.from_arrays(cols, names=["time", "feature", "value", "value"])
    src = tmp_path / f"d{suffix}"
    if suffix == ".parquet":
        pytest.importorskip("pyarrow.parquet").write_table(table, src)
    else:
        with pa.ipc.new_file(src, table.schema) as writer:
            writer.write_table(table)
    twice = "'a'" if layout == "wide" else "'value'"
    root = Path(tsconv.__file__).resolve().parents[1]
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    res = subprocess.run(  # in a subprocess: Rust prints a panic on the process's own stderr
        [sys.executable, "-m", "tsconv", "ingest", str(src), "-o", str(tmp_path / "out.zarr"), "-q",
         "--layout", layout],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path, "RUST_BACKTRACE": "0"},
    )  # fmt: skip
    assert res.returncode != 0
    assert res.stderr.splitlines() == [res.stderr.splitlines()[0]], res.stderr  # one line, no panic
    assert f"names the column {twice} more than once" in res.stderr, res.stderr
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize("layout", ["wide", "long"])
def test_a_feature_name_with_a_control_character_is_refused(tmp_path: Path, layout: str) -> None:
    # the store it wrote was refused by process and inspect (a newline or an escape forges terminal lines)
    head = 'time,"a\x1b[31m"' if layout == "wide" else "time,feature,value"
    row = "2026-01-01T00:00:00,1" if layout == "wide" else '2026-01-01T00:00:00,"A\nB",1'
    (tmp_path / "d.csv").write_text(f"{head}\n{row}\n")
    with pytest.raises(StoreError, match="holds a control character"):
        ingest(str(tmp_path / "d.csv"), tmp_path / "out.zarr", layout=layout)
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_a_pandas_index_in_a_wide_file_is_left_out_with_a_warning(tmp_path: Path, suffix: str) -> None:
    # a filtered frame (its rows no longer a range) written with pandas' defaults keeps its index as the
    # column '__index_level_0__', which was stored as a feature of row numbers
    pd = pytest.importorskip("pandas")
    import pyarrow as pa

    def to_file(frame: object, path: Path) -> Path:
        if suffix == ".parquet":
            frame.to_parquet(path)  # type: ignore[attr-defined]
        else:
            table = pa.Table.from_pandas(frame)
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
                w.write_table(table)
        return path

    t = pd.date_range("2026-01-05 09:30", periods=8, freq="s", tz="UTC")
    df = pd.DataFrame({"time": t, "AAPL": np.arange(8.0) + 100, "MSFT": np.arange(8.0) + 200})
    first = to_file(df[df.AAPL.isin([100.0, 101.0, 103.0])], tmp_path / f"a{suffix}")
    out = tmp_path / "out.zarr"
    with pytest.warns(TsconvWarning, match="pandas index column.*'__index_level_0__'"):
        ingest(first, out, layout="wide")
    values, times, names = read(out)
    assert names == ["AAPL", "MSFT"]
    np.testing.assert_array_equal(values, [[100, 200], [101, 201], [103, 203]])
    later = to_file(df[df.AAPL.isin([104.0, 105.0, 107.0])], tmp_path / f"b{suffix}")
    with pytest.warns(TsconvWarning, match="__index_level_0__"):
        ingest(later, out, layout="wide", append=True)
    values, times, names = read(out)
    assert names == ["AAPL", "MSFT"]
    np.testing.assert_array_equal(values[3:], [[104, 204], [105, 205], [107, 207]])
    # the time column as the frame's index is the time column still
    ingest(to_file(df.set_index("time"), tmp_path / f"t{suffix}"), tmp_path / "t.zarr", layout="wide")
    assert read(tmp_path / "t.zarr")[2] == ["AAPL", "MSFT"]


def test_a_wide_csv_column_with_no_name_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    # pandas' default to_csv writes its index under an empty header: the store got a feature named '', which
    # inspect and process then refused
    rows = "".join(f"{k},2026-01-05 09:30:0{k}+00:00,{100 + k}.0,{200 + k}.0\n" for k in range(5))
    (tmp_path / "w.csv").write_text(",time,AAPL,MSFT\n" + rows)
    out = tmp_path / "out.zarr"
    assert_refused(
        cli(tmp_path / "w.csv", "-o", out, "--layout", "wide"), "column 0", "no name", "index=False"
    )
    assert not out.exists()
    (tmp_path / "ok.csv").write_text("time,AAPL,MSFT\n2026-01-05 09:29:00+00:00,1.0,2.0\n")
    ingest(tmp_path / "ok.csv", out, layout="wide")
    before = snapshot(out)
    assert_refused(cli(tmp_path / "w.csv", "-o", out, "--layout", "wide", "--append"), "column 0", "no name")
    assert snapshot(out) == before


# --------------------------------------------------------------------- leftovers and a full disk


def _kill_at_marker(monkeypatch: pytest.MonkeyPatch, out: Path, b: Path) -> Path:
    """An append killed as zarr renames its marker's zarr.json into place: the temporary file zarr wrote it
    under stays, the store is unchanged (no append is recorded pending). Returns that file."""
    real = Path.replace

    def killed(self: Path, target: str | os.PathLike[str]) -> Path:
        if Path(target).name == "zarr.json" and self.name.endswith(".partial"):
            raise _Crash
        return real(self, target)

    monkeypatch.setattr(Path, "replace", killed)
    with pytest.raises(_Crash):
        ingest(b, out, append=True)
    monkeypatch.setattr(Path, "replace", real)
    (left,) = out.glob("*.partial")
    return left


def test_a_metadata_temporary_file_of_a_killed_append_is_removed_by_repair_and_the_next_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it was removed only when an append was recorded pending: every later open warned that it "is not
    # recognized as a component of a Zarr hierarchy", and `process -o STORE --overwrite` refused the store
    _, b, out, ref = _crash_setup(tmp_path, monkeypatch)
    left = _kill_at_marker(monkeypatch, out, b)
    assert left.name.startswith("zarr.") and left.name != "zarr.json.partial"  # zarr's own name for it
    kept = out / "zarr.notes.partial"  # not a temporary file's name: not tsconv's to delete
    kept.write_text("mine")
    res = CliRunner().invoke(main, ["repair", str(out)])
    assert res.exit_code == 0 and "nothing to repair" in res.stdout
    assert not left.exists() and kept.read_text() == "mine"
    kept.unlink()
    assert _files(out) == _files(tmp_path / "base.zarr")

    left = _kill_at_marker(monkeypatch, out, b)  # again, and this time append straight away
    res = CliRunner().invoke(main, ["ingest", str(b), "-o", str(out), "--append", "-q"])
    assert res.exit_code == 0 and "warning" not in res.stderr, res.stderr
    assert not left.exists() and _files(out) == _files(ref)
    res = CliRunner().invoke(main, ["inspect", str(out)])
    assert res.exit_code == 0 and "warning" not in res.stderr, res.stderr


def test_overwrite_takes_a_metadata_temporary_file_as_zarr_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, b, out, ref = _crash_setup(tmp_path, monkeypatch)
    _kill_at_marker(monkeypatch, out, b)
    res = CliRunner().invoke(main, ["process", "-i", str(ref), "-o", str(out), "--overwrite", "-q"])
    assert res.exit_code == 0, res.stderr
    assert not list(out.glob("*.partial")) and zarr.open_group(str(out), mode="r")["values"].shape[0] == 39


def _no_space(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_names_the_new_store_and_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it printed only "[Errno 28] No space left on device"
    import tsconv.io.ingest as ing

    _, a, _ = _two_halves(tmp_path)
    out = tmp_path / "out.zarr"
    monkeypatch.setattr(ing, "_write_rows", _no_space)
    res = cli(a, "-o", out)
    assert_refused(res, f"cannot write the new store '{out}'", "No space left on device", "hint: free space",
                   "rerun the command")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.parquet", "b.csv"]


@pytest.mark.parametrize("roll_back_fails", [False, True])
def test_a_full_disk_during_an_append_names_the_store_and_the_rows_it_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, roll_back_fails: bool
) -> None:
    import tsconv.io.ingest as ing

    _, b, out, ref = _crash_setup(tmp_path, monkeypatch)
    monkeypatch.setattr(ing, "_write_rows", _no_space)
    if roll_back_fails:  # its own metadata write fails on the full disk too
        monkeypatch.setattr(ing, "_remove_partial_files", _no_space)
    res = cli(b, "-o", out, "--append")
    if roll_back_fails:
        assert_refused(res, f"the appended rows of '{out}'", "No space left", "hint: free space",
                       f"`tsconv repair {out}`", "its 25 rows")  # fmt: skip
        monkeypatch.undo()
        assert repair(out) == 25
    else:
        assert_refused(res, f"the appended rows of '{out}'", "No space left", "hint: free space",
                       "append again", "rolled back to its 25 rows")  # fmt: skip
        monkeypatch.undo()
    assert _files(out) == _files(tmp_path / "base.zarr")
    ingest(b, out, append=True)
    assert _files(out) == _files(ref)


@pytest.mark.parametrize("held", ["int32", "uint8", "float16"])
def test_an_append_to_a_store_of_integer_or_float16_values_is_refused_untouched(
    tmp_path: Path, held: str
) -> None:
    # an int32 store failed with numpy's "cannot convert float NaN to integer" traceback (exit 1) once marked,
    # and values without a NaN were truncated (1.5 stored as 1); a float16 store turned 70000 into inf
    out = tmp_path / "plain.zarr"
    g = zarr.open_group(str(out), mode="w", zarr_format=3)
    g.create_array("values", shape=(3, 2), chunks=(2, 2), dtype=held)[:] = np.arange(6).reshape(3, 2)
    g.create_array("time", shape=(3,), chunks=(2,), dtype="int64")[:] = T0 + np.arange(3) * SEC
    g.attrs["features"] = ["a", "b"]
    new = write(
        pl.DataFrame({"time": [T0 + 3 * SEC] * 2, "feature": ["a", "b"], "value": [1.5, 70000.0]}),
        tmp_path / "new.parquet",
    )
    before = snapshot(out)
    assert_refused(cli(new, "-o", out, "--append"), f"holds {held} values", "float32 or float64", "new store")
    assert snapshot(out) == before


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_consolidated_store_is_appended_to_and_repaired_by_its_arrays_own_metadata(
    tmp_path: Path, zarr_format: int
) -> None:
    # A store with consolidated metadata (zarr.consolidate_metadata, xarray): the copy kept the lengths of before
    # the first append (xarray read those rows only), and an interrupted second append was refused by repair and
    # --append as having lost the first one's committed rows ("'values' has 10"), the store left unreadable.
    from tests.io import crashpoints

    df = long_frame(TIMES, NAMES, seed=3, drop=0.0)
    parts = [write(df.filter(pl.col("time").is_in(TIMES[a:b])), tmp_path / f"p{a}.parquet")
             for a, b in ((0, 10), (10, 25), (25, 40))]  # fmt: skip
    ref = tmp_path / "ref.zarr"
    ingest(parts, ref)
    out = tmp_path / "out.zarr"
    ingest(parts[0], tmp_path / "made.zarr")
    made = zarr.open_group(str(tmp_path / "made.zarr"), mode="r")
    g = zarr.open_group(str(out), mode="w", zarr_format=zarr_format)
    for key in ("values", "time"):
        src = made[key]
        g.create_array(key, shape=src.shape, chunks=(16, *src.shape[1:]), dtype=src.dtype)[:] = src[:]
    g.attrs.update(dict(made.attrs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # format 3: "not part of the specification"
        zarr.consolidate_metadata(str(out))

    def consolidated_rows() -> tuple[int, int]:
        view = zarr.open_group(str(out), mode="r", use_consolidated=True)
        return view["values"].shape[0], view["time"].shape[0]

    ingest(parts[1], out, append=True)
    assert consolidated_rows() == (25, 25)
    log, undo = crashpoints.install(1, lambda: (_ for _ in ()).throw(_Crash()))  # after the values' resize
    try:
        with pytest.raises(_Crash):
            ingest(parts[2], out, append=True)
    finally:
        undo()
    res = CliRunner().invoke(main, ["repair", str(out)])
    assert res.exit_code == 0, res.stderr
    assert "keeps its 25 rows" in res.stdout
    assert consolidated_rows() == (25, 25)
    ingest(parts[2], out, append=True)
    assert consolidated_rows() == (40, 40)
    got, want = read(out), read(ref)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_an_empty_output_path_is_refused_not_taken_for_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # '' (an unset variable) is the current directory: ingest(..., "", overwrite=True) run inside a store replaced it
    src = tmp_path / "ticks.parquet"
    pl.DataFrame({"time": [1, 2, 3], "a": [1.0, 2.0, 3.0]}).write_parquet(src)
    job = tmp_path / "job.zarr"
    zarr.open_group(str(job), mode="w").create_array("values", data=np.zeros((3, 1), np.float32))
    monkeypatch.chdir(job)
    before = sorted(p.name for p in job.rglob("*"))
    for call in (lambda: ingest(str(src), "", layout="wide", overwrite=True), lambda: repair("")):
        with pytest.raises(StoreError, match="output '' names no store"):
            call()
    assert sorted(p.name for p in job.rglob("*")) == before


def test_a_csv_cut_short_mid_line_is_warned_of_naming_its_last_line(tmp_path: Path) -> None:
    """A CSV whose writer stopped mid-write was ingested without a word, its cut last row as it read
    (101.25 stored as 10); a file that does not end with a line break is warned of, one written in full is not."""
    whole = "time,feature,value\n2026-01-02T09:30:00Z,AAPL,100.5\n2026-01-02T09:30:01Z,AAPL,101.25\n"
    done, cut = tmp_path / "done.csv", tmp_path / "cut.csv"
    done.write_text(whole)
    cut.write_text(whole[: whole.rindex("101.25") + 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error", TsconvWarning)
        ingest(done, tmp_path / "done.zarr")
        windows = tmp_path / "crlf.csv"
        windows.write_bytes(whole.replace("\n", "\r\n").encode())
        ingest(windows, tmp_path / "crlf.zarr")
    with pytest.warns(
        TsconvWarning,
        match=r"do not end with a line break \(first '.*cut\.csv', whose last line reads '2026-01-02T09:30:01Z,AAPL,10'\)",
    ):
        ingest(cut, tmp_path / "cut.zarr")


def test_files_without_rows_in_a_daily_glob_add_nothing_and_an_append_of_only_such_files_changes_nothing(
    tmp_path: Path,
) -> None:
    """A holiday's file (a header, or a schema, only) in a daily glob stopped the whole ingest ("has no rows;
    remove it from the file list"), and a daily --append of that day alone failed the job. Such files are left
    out with a warning, and an --append of only such files leaves the store as it was."""
    day1 = write(long_frame(TIMES[:20], NAMES), tmp_path / "d1.parquet")
    (tmp_path / "d2.csv").write_text("time,feature,value\n")
    write(long_frame(TIMES[:2], NAMES).clear(), tmp_path / "d3.parquet")
    ingest(day1, tmp_path / "alone.zarr")
    with pytest.warns(
        TsconvWarning, match=r"left out 2 of 3 input files that hold no rows \(first '.*d2\.csv'\)"
    ):
        ingest([day1, tmp_path / "d2.csv", tmp_path / "d3.parquet"], tmp_path / "out.zarr")
    want = read(tmp_path / "alone.zarr")
    got = read(tmp_path / "out.zarr")
    assert (
        np.array_equal(got[0], want[0], equal_nan=True)
        and np.array_equal(got[1], want[1])
        and got[2] == want[2]
    )
    before = {
        p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "out.zarr").rglob("*") if p.is_file()
    }
    res = CliRunner().invoke(
        main,
        [
            "ingest",
            str(tmp_path / "d2.csv"),
            str(tmp_path / "d3.parquet"),
            "-o",
            str(tmp_path / "out.zarr"),
            "--append",
        ],
    )
    assert res.exit_code == 0 and "2 file(s) with no rows: nothing appended to" in res.output, res.output
    rep = ingest(tmp_path / "d2.csv", tmp_path / "out.zarr", append=True)
    assert (rep.rows, rep.input_rows, rep.appended) == (0, 0, True)
    assert "nothing appended" in rep.summary()
    after = {
        p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "out.zarr").rglob("*") if p.is_file()
    }
    assert after == before
    with pytest.raises(StoreError, match="d2.csv' has no rows"):  # a new store from no rows at all
        ingest([tmp_path / "d2.csv", tmp_path / "d3.parquet"], tmp_path / "none.zarr")


def test_the_rounding_warning_of_a_new_store_and_of_an_append_points_at_the_callers_line(
    tmp_path: Path,
) -> None:
    # an --append's warning pointed into tsconv/io/ingest.py (the call inside the append), not at the script
    n = 3000
    t = T0 + np.arange(2 * n, dtype=np.int64) * 1_000_000_000
    px = 400 + np.cumsum(np.random.default_rng(7).normal(0, 0.01, 2 * n))
    first = write(
        pl.DataFrame({"time": t[:n], "feature": ["b"] * n, "value": px[:n]}), tmp_path / "1.parquet"
    )
    later = write(
        pl.DataFrame({"time": t[n:], "feature": ["b"] * n, "value": px[n:]}), tmp_path / "2.parquet"
    )
    for files, kw in ((first, {}), (later, {"append": True})):
        with pytest.warns(TsconvWarning, match="rounding the values of 'b'") as caught:
            ingest(files, tmp_path / "s.zarr", **kw)
        assert [w.filename for w in caught if "rounding" in str(w.message)] == [__file__]


def test_a_schema_only_parquet_with_untyped_columns_is_left_out_as_a_header_only_csv_is(
    tmp_path: Path,
) -> None:
    """A holiday's Parquet file written from pandas' DataFrame(columns=[...]) carries its columns as Null (no
    rows gave them a type) and was refused for its time column's type, where a header-only CSV was left out."""
    day1 = write(long_frame(TIMES[:20], NAMES), tmp_path / "d1.parquet")
    untyped = tmp_path / "d2.parquet"
    pl.DataFrame({"time": [], "feature": [], "value": []}).write_parquet(untyped)
    assert pl.read_parquet_schema(untyped)["time"] == pl.Null
    ingest(day1, tmp_path / "alone.zarr")
    with pytest.warns(
        TsconvWarning, match=r"left out 1 of 2 input files that hold no rows \(first '.*d2\.parquet'\)"
    ):
        ingest([day1, untyped], tmp_path / "out.zarr")
    want, got = read(tmp_path / "alone.zarr"), read(tmp_path / "out.zarr")
    assert np.array_equal(got[0], want[0], equal_nan=True) and np.array_equal(got[1], want[1])
    assert ingest(untyped, tmp_path / "out.zarr", append=True).input_rows == 0


def test_a_csv_whose_lines_end_with_a_carriage_return_alone_is_refused_not_left_out_as_empty(
    tmp_path: Path,
) -> None:
    """A CSV with old Mac line endings (\\r alone: Excel for Mac's "CSV (Macintosh)") reads as one header line and
    no rows: since files with no rows are left out, an --append of such a day's file exited 0 with its rows
    dropped ('nothing appended'). It is refused, naming the line endings."""
    store = tmp_path / "out.zarr"
    ingest(write(long_frame(TIMES[:20], NAMES), tmp_path / "d1.parquet"), store)
    mac = tmp_path / "d2.csv"
    mac.write_bytes(b"time,feature,value\r2026-03-02T09:30:00Z,AAPL,1.5\r2026-03-02T09:30:01Z,AAPL,2.5\r")
    with pytest.raises(StoreError, match=r"d2\.csv' end with a carriage return alone"):
        ingest(mac, store, append=True)
    (tmp_path / "hdr.csv").write_bytes(b"time,feature,value\r")  # a header only, ended by \r: still no rows
    assert ingest(tmp_path / "hdr.csv", store, append=True).input_rows == 0


def test_an_append_of_only_files_without_rows_rolls_back_an_interrupted_append_as_any_append_does(
    tmp_path: Path,
) -> None:
    # it refused the store with the hint to run the append again, which refused again: only repair worked
    _, a, _ = _two_halves(tmp_path)
    out = tmp_path / "out.zarr"
    ingest(a, out)
    want = read(out)
    _interrupt_append(out, 25, 99)
    (tmp_path / "holiday.csv").write_text("time,feature,value\n")
    rep = ingest(tmp_path / "holiday.csv", out, append=True)
    assert (rep.rows, rep.input_rows) == (0, 0)
    got = read(out)
    assert np.array_equal(got[0], want[0], equal_nan=True) and np.array_equal(got[1], want[1])
    assert open_input(out).rows == 25
