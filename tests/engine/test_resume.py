"""Nothing lost: a run killed with SIGKILL at any moment and resumed gives the uninterrupted output; and
nothing mixed: a resume refuses an input whose rows already computed have changed since."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr

import tsconv

from ..helpers import price_series, write_store


def _rows_done(out: Path) -> int | None:
    try:
        return int(zarr.open_group(str(out), mode="r").attrs["tsconv"]["rows_done"])
    except Exception:
        return None


def _run_until_done(
    args: list[str], out: Path, *, startup_kill: float, midway_kills: int
) -> list[int | None]:
    """Run the CLI again and again: killed once after ``startup_kill`` s, then ``midway_kills`` times as soon
    as its ``rows_done`` has advanced (so each kill lands mid-run however fast the machine is), then to the
    end. Returns rows_done seen after each kill."""
    import time

    seen: list[int | None] = []
    plan: list[float | str | None] = [startup_kill, *["midway"] * midway_kills, None]
    for step in plan:
        before = _rows_done(out)
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 120
        killed = False
        while proc.poll() is None and time.monotonic() < deadline:
            if step is None:
                time.sleep(0.05)
                continue
            if step == "midway":
                now = _rows_done(out)
                due = now is not None and now > (before or 0)
            else:
                due = time.monotonic() > deadline - 120 + float(step)
            if due:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                killed = True
                break
            time.sleep(0.005)
        if killed:
            seen.append(_rows_done(out))
            continue
        _, err = proc.communicate()
        assert proc.returncode == 0, err.decode()
        if step is None:
            return seen
        seen.append(_rows_done(out))  # it finished before the kill was due
    return seen


@pytest.mark.slow
def test_kill_9_then_resume_gives_identical_output(tmp_path: Path) -> None:
    x = price_series(150_000, 48, seed=3, nan_fraction=0.01)
    src = write_store(tmp_path / "in.zarr", x, chunks=(5000, 48))
    want = tmp_path / "uninterrupted.zarr"
    tsconv.process(src, want, chunk=1024)

    out = tmp_path / "out.zarr"
    args = [
        sys.executable,
        "-m",
        "tsconv",
        "process",
        "--input",
        str(src),
        "--output",
        str(out),
        "--resume",
        "-q",
    ]
    # Kills land during start-up and, polled, right after rows_done advances; each restart resumes.
    seen = _run_until_done(args, out, startup_kill=0.2, midway_kills=3)
    rows = x.shape[0]
    midway = [r for r in seen if r is not None and 0 < r < rows]
    assert len(midway) >= 2, f"kills did not land mid-run often enough: rows_done after each kill {seen}"

    a, b = zarr.open_group(str(want), mode="r"), zarr.open_group(str(out), mode="r")
    assert b.attrs["tsconv"]["complete"] is True
    np.testing.assert_array_equal(np.asarray(a["values"][:]), np.asarray(b["values"][:]))
    np.testing.assert_array_equal(np.asarray(a["time"][:]), np.asarray(b["time"][:]))
    assert a.attrs["features"] == b.attrs["features"]
    assert not list(tmp_path.glob(".*.tsconv-*"))  # no store being created, no lock file


def test_partial_output_is_marked_and_refused_as_input(tmp_path: Path, small_chunks: None) -> None:
    x = price_series(5000, 3, seed=1)
    src = write_store(tmp_path / "in.zarr", x, chunks=(1000, 3))
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=256)
    g = zarr.open_group(str(out), mode="r+")
    meta = dict(g.attrs["tsconv"])
    complete_values = np.asarray(g["values"][:])
    # Turn it back into what a killed run leaves: complete=False, rows_done short, garbage after it.
    rows_done = 3 * int(g["values"].chunks[0])
    assert rows_done == 768
    g["values"][rows_done:] = 12345.0
    g.attrs["tsconv"] = {**meta, "complete": False, "rows_done": rows_done}
    with pytest.raises(tsconv.TsconvError, match="unfinished"):
        tsconv.open_input(out)
    with pytest.raises(tsconv.TsconvError, match="already exists"):
        tsconv.process(src, out, chunk=256)
    report = tsconv.process(src, out, chunk=256, resume=True)
    assert report.resumed_from == rows_done and report.rows == 5000 - rows_done
    np.testing.assert_array_equal(np.asarray(zarr.open_group(str(out))["values"][:]), complete_values)


def test_resume_refuses_a_different_pipeline_or_chunk(tmp_path: Path) -> None:
    x = price_series(3000, 2, seed=2)
    src = write_store(tmp_path / "in.zarr", x)
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=512)
    with pytest.raises(tsconv.TsconvError, match="different input, pipeline or chunk"):
        tsconv.process(src, out, chunk=256, resume=True)
    with pytest.raises(tsconv.TsconvError, match="different input, pipeline or chunk"):
        tsconv.process(src, out, chunk=512, resume=True, pipeline={"conv": [{"filters": ["ma:4"]}]})
    assert tsconv.process(src, out, chunk=512, resume=True).rows == 0  # complete: nothing to do


def test_a_resume_refusal_names_what_differs(tmp_path: Path) -> None:
    # it said "a different input, pipeline or chunk size (or warm-up)" whatever changed
    src = write_store(tmp_path / "in.zarr", price_series(3000, 2, seed=2))
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=512, pipeline={"conv": [{"filters": ["ma:4"]}]})
    with pytest.raises(tsconv.TsconvError, match="what differs: chunk: 512 then, 256 now;"):
        tsconv.process(src, out, chunk=256, resume=True, pipeline={"conv": [{"filters": ["ma:4"]}]})
    with pytest.raises(
        tsconv.TsconvError,
        match=re.escape("""what differs: the pipeline's [[conv]] stage 1 filters: ["ma:4"] then"""),
    ):
        tsconv.process(src, out, chunk=512, resume=True, pipeline={"conv": [{"filters": ["ma:8"]}]})


# ------------------------------------------------------------------- the state a resume carries over

LONG_PIPE = {"conv": [{"filters": ["ma:64", "diff:32"]}]}  # halo 63: the carry reaches a chunk back
STOP_AFTER = 5  # output chunks of 256 rows stored when the run is stopped: it resumes at row 1,280


def _nan_runs_across(resume_at: int, halo: int) -> np.ndarray:
    """3000 x 3 prices whose NaN runs make the fill state matter at ``resume_at``: feature 0 is NaN from
    before the halo to past the resume point (its halo rows take a value from before the halo), feature 1
    from inside the halo, feature 2 has none (only the halo rows carry it)."""
    x = price_series(3000, 3, seed=7)
    begin = resume_at - halo
    x[begin - 120 : resume_at + 100, 0] = np.nan
    x[begin + 20 : resume_at + 30, 1] = np.nan
    return x


def _stopped_then_resumed(tmp_path: Path) -> tuple[Path, Path, tsconv.Report]:
    """(the uninterrupted output, the output of a run stopped right after it recorded STOP_AFTER chunks
    and then resumed, the resume's report)."""
    from tests.io import crashpoints
    from tsconv import config

    class Stop(BaseException):
        """The run dying here (no ``except Exception`` handles it)."""

    chunk = 256
    x = _nan_runs_across(STOP_AFTER * chunk, halo=63)
    src = write_store(tmp_path / "in.zarr", x, chunks=(500, 3))
    want, out = tmp_path / "want.zarr", tmp_path / "out.zarr"
    with config.override(write_threads=0):  # chunks stored in order, by the engine's thread
        log, undo = crashpoints.install_fs(10**9, lambda what: None)
        try:
            tsconv.process(src, want, chunk=chunk, pipeline=LONG_PIPE)
        finally:
            undo()
        # the change that records rows_done after chunk STOP_AFTER - 1, as the same run on ``out`` makes it
        marks = [i for i, what in enumerate(log) if what == f"replace {want / 'zarr.json'}"]

        def stop(what: str) -> None:
            assert what == f"replace {out / 'zarr.json'}"
            raise Stop

        _, undo = crashpoints.install_fs(marks[STOP_AFTER - 1], stop)
        try:
            with pytest.raises(Stop):
                tsconv.process(src, out, chunk=chunk, pipeline=LONG_PIPE)
        finally:
            undo()
    meta = zarr.open_group(str(out), mode="r").attrs["tsconv"]
    assert (meta["complete"], meta["rows_done"]) == (False, STOP_AFTER * chunk)
    stored = sorted(p.parent.name for p in (out / "values" / "c").glob("*/0"))
    assert stored == [str(i) for i in range(STOP_AFTER)]  # whole chunks up to rows_done, none after
    report = tsconv.process(src, out, chunk=chunk, pipeline=LONG_PIPE, resume=True)
    return want, out, report


def test_resume_carries_the_halo_and_the_fill_state(tmp_path: Path, small_chunks: None) -> None:
    want, out, report = _stopped_then_resumed(tmp_path)
    assert (report.resumed_from, report.rows, report.halo) == (1280, 3000 - 1280, 63)
    assert _chunk_files(out) == _chunk_files(want)  # every values and time chunk, byte for byte
    b = zarr.open_group(str(out), mode="r")
    assert b.attrs["tsconv"]["complete"] is True
    # the rows after the resume point that the carried state decides are real values, not warm-up NaN
    assert np.isfinite(np.asarray(b["values"][1280 : 1280 + 63])).all()


def _halo_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resume that does not read the halo rows before its first row (zeros instead)."""
    import tsconv.engine.run

    real = tsconv.engine.run.run_chunked

    class NoHalo:
        def __init__(self, source: object, start: int, halo: int) -> None:
            self._source, self._skip = source, (start - halo, start)

        def __getattr__(self, name: str) -> object:
            return getattr(self._source, name)

        def read(self, a: int, b: int) -> np.ndarray:
            if (a, b) == self._skip:
                return np.zeros((b - a, self._source.n_features), np.float32)
            return self._source.read(a, b)

    def run_chunked(source, plan, *args, start, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        return real(NoHalo(source, start, plan.halo) if start else source, plan, *args, start=start, **kw)

    monkeypatch.setattr(tsconv.engine.run, "run_chunked", run_chunked)


def _fill_state_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resume that starts the forward fill afresh (every feature NaN) at its first row."""
    import tsconv.engine.fill

    monkeypatch.setattr(
        tsconv.engine.fill,
        "fill_state_before",
        lambda source, row, dtype, **_: np.full(source.n_features, np.nan, dtype=dtype),
    )


@pytest.mark.parametrize("broken", [_halo_not_read, _fill_state_reset])
def test_the_resume_check_fails_when_the_carried_state_is_dropped(
    tmp_path: Path,
    small_chunks: None,
    monkeypatch: pytest.MonkeyPatch,
    broken: Callable[[pytest.MonkeyPatch], None],
) -> None:
    # The test above guards both: either state dropped, and the resumed bytes differ.
    broken(monkeypatch)
    want, out, report = _stopped_then_resumed(tmp_path)
    assert report.resumed_from == 1280
    assert _chunk_files(out) != _chunk_files(want)


# ------------------------------------------------------------------------ the input changed under it

ROWS, FEATURES, CHUNK, BAND = 5000, 3, 256, 1000  # input chunks of 1000 rows; output chunks of 256 rows
DONE = 2048  # rows an interrupted run had stored: input bands 0, 1 and part of 2


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Output chunks of one engine chunk, so an interrupted run can stop between chunks of a small store."""
    import tsconv.engine.outputs

    monkeypatch.setattr(tsconv.engine.outputs, "output_chunk_rows", lambda chunk, n_outputs: chunk)


def _interrupted(tmp_path: Path, x: np.ndarray, *, done: int = DONE) -> tuple[Path, Path]:
    """An input store and an output that looks like a run killed after ``done`` rows (garbage after)."""
    src = write_store(tmp_path / "in.zarr", x, chunks=(BAND, FEATURES))
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK)
    g = zarr.open_group(str(out), mode="r+")
    assert int(g["values"].chunks[0]) == CHUNK
    g["values"][done:] = 12345.0
    g.attrs["tsconv"] = {**g.attrs["tsconv"], "complete": False, "rows_done": done}
    return src, out


def _chunk_files(path: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(path)): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name not in ("zarr.json", ".tsconv-input.json")
    }


def _snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("how", ["resume", "update"])
def test_an_output_linking_into_the_input_is_refused_and_the_input_left_alone(
    tmp_path: Path, small_chunks: None, how: str
) -> None:
    # An output directory is not to be trusted: a chunk directory the run writes in, linked to one of the
    # input's, took the output's chunk in place of the input's (the run then found its input changed).
    x = price_series(ROWS, FEATURES, seed=4)
    if how == "resume":
        src, out = _interrupted(tmp_path, x)
    else:
        src = write_store(tmp_path / "in.zarr", x[:DONE], chunks=(BAND, FEATURES))
        out = tmp_path / "out.zarr"
        tsconv.process(src, out, chunk=CHUNK)
        g = zarr.open_group(str(src), mode="r+")
        g["values"].resize((ROWS, FEATURES))
        g["values"][DONE:] = x[DONE:]
        g["time"].resize((ROWS,))
        g["time"][DONE:] = np.asarray(g["time"][DONE - 1]) + np.arange(1, ROWS - DONE + 1) * 10**9
    shutil.rmtree(out / "values" / "c" / str(DONE // CHUNK), ignore_errors=True)
    (out / "values" / "c" / str(DONE // CHUNK)).symlink_to(
        src / "values" / "c" / "2", target_is_directory=True
    )
    before = _snapshot(src)
    with pytest.raises(
        tsconv.TsconvError, match=r"values/c/8 in it is a symbolic link \(to '.*in\.zarr/values/c/2'\)"
    ):
        tsconv.process(src, out, chunk=CHUNK, **{how: True})
    assert _snapshot(src) == before


def test_resume_refuses_an_input_rewritten_with_other_data_of_the_same_shape(
    tmp_path: Path, small_chunks: None
) -> None:
    src, out = _interrupted(tmp_path, price_series(ROWS, FEATURES, seed=4))
    before = _snapshot(out)
    write_store(src, price_series(ROWS, FEATURES, seed=5), chunks=(BAND, FEATURES))  # same shape and names
    with pytest.raises(tsconv.TsconvError) as err:
        tsconv.process(src, out, chunk=CHUNK, resume=True)
    msg = str(err.value)
    assert "changed since the output was started, first at rows 0..1,000 (values chunk files)" in msg
    assert "(up to row 2,048)" in msg and "hint: use --overwrite" in msg
    assert _snapshot(out) == before  # refused before anything was written


@pytest.mark.parametrize(
    "rows, refused",
    [
        ((1000, 2000), "rows 1,000..2,000 (values chunk files)"),
        ((2000, 2001), "rows 2,000..3,000 (values chunk"),
    ],
)
def test_resume_refuses_a_change_in_rows_already_computed(
    tmp_path: Path, small_chunks: None, rows: tuple[int, int], refused: str
) -> None:
    src, out = _interrupted(tmp_path, price_series(ROWS, FEATURES, seed=4))
    g = zarr.open_group(str(src), mode="r+")
    g["values"][rows[0] : rows[1]] = np.asarray(g["values"][rows[0] : rows[1]]) + 1  # one band rewritten
    with pytest.raises(tsconv.TsconvError, match=re.escape(f"first at {refused}")):
        tsconv.process(src, out, chunk=CHUNK, resume=True)


def test_resume_refuses_a_changed_time_column(tmp_path: Path, small_chunks: None) -> None:
    src, out = _interrupted(tmp_path, price_series(ROWS, FEATURES, seed=4))
    g = zarr.open_group(str(src), mode="r+")
    g["time"][:1000] = np.asarray(g["time"][:1000]) - 1  # still increasing, other timestamps
    with pytest.raises(tsconv.TsconvError, match="first at rows 0..1,000 \\(time chunk files\\)"):
        tsconv.process(src, out, chunk=CHUNK, resume=True)


def test_resume_takes_a_change_in_rows_not_yet_computed(tmp_path: Path, small_chunks: None) -> None:
    from tsconv.io.digest import input_digest, read_digest

    src, out = _interrupted(tmp_path, price_series(ROWS, FEATURES, seed=4))
    g = zarr.open_group(str(src), mode="r+")
    g["values"][3000:4000] = np.asarray(g["values"][3000:4000]) + 1  # after every row already computed
    report = tsconv.process(src, out, chunk=CHUNK, resume=True)
    assert report.resumed_from == DONE
    want = tmp_path / "want.zarr"
    tsconv.process(src, want, chunk=CHUNK)  # the new input from scratch
    assert _chunk_files(out) == _chunk_files(want)
    recorded = read_digest(out)
    assert recorded.pop("fill")["row"] == ROWS  # the fill state at the run's last row, beside the digest
    assert len(recorded.pop("tail")) == 32  # the hash of the input rows kept for the next update
    assert recorded == input_digest(tsconv.open_input(src))  # what the output now comes from


def test_resume_of_an_unchanged_input_gives_the_uninterrupted_bytes(
    tmp_path: Path, small_chunks: None
) -> None:
    x = price_series(ROWS, FEATURES, seed=4, nan_fraction=0.01)
    src, out = _interrupted(tmp_path, x)
    meta = zarr.open_group(str(out), mode="r").attrs["tsconv"]
    assert meta["input_digest"] == "values/.tsconv-input.json"
    report = tsconv.process(src, out, chunk=CHUNK, resume=True)
    assert report.resumed_from == DONE and report.rows == ROWS - DONE
    want = tmp_path / "want.zarr"
    tsconv.process(src, want, chunk=CHUNK)
    assert _chunk_files(out) == _chunk_files(want)
    assert (out / "values" / ".tsconv-input.json").read_bytes() == (
        want / "values" / ".tsconv-input.json"
    ).read_bytes()


def test_resume_of_a_complete_output_refuses_a_changed_input(tmp_path: Path) -> None:
    x = price_series(ROWS, FEATURES, seed=4)
    src = write_store(tmp_path / "in.zarr", x, chunks=(BAND, FEATURES))
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK)
    assert tsconv.process(src, out, chunk=CHUNK, resume=True).rows == 0  # unchanged: nothing to do
    g = zarr.open_group(str(src), mode="r+")
    g["values"][4500:] = np.asarray(g["values"][4500:]) + 1
    with pytest.raises(tsconv.TsconvError, match="first at rows 4,000..5,000 \\(values chunk files\\)"):
        tsconv.process(src, out, chunk=CHUNK, resume=True)


def test_a_dask_resume_refuses_a_change_before_its_furthest_partition(
    tmp_path: Path, small_chunks: None
) -> None:
    src, out = _interrupted(tmp_path, price_series(ROWS, FEATURES, seed=4), done=0)
    g = zarr.open_group(str(out), mode="r+")
    g.attrs["tsconv"] = {**g.attrs["tsconv"], "partitions_done": [[3072, 4096]]}  # a dask run's later task
    s = zarr.open_group(str(src), mode="r+")
    s["values"][2500:2600] = np.asarray(s["values"][2500:2600]) + 1
    for kw in ({}, {"workers": 2}):  # refused before any cluster starts
        with pytest.raises(tsconv.TsconvError, match="first at rows 2,000..3,000 .*\\(up to row 4,096\\)"):
            tsconv.process(src, out, chunk=CHUNK, resume=True, **kw)


def test_resume_without_a_recorded_digest_checks_the_fingerprint_only(
    tmp_path: Path, small_chunks: None
) -> None:
    from tsconv.io.digest import input_digest, write_digest

    src, out = _interrupted(tmp_path, price_series(ROWS, FEATURES, seed=4))
    write_digest(out, {"version": 1, "skipped": "values: MemoryStore (not a local directory)"})
    g = zarr.open_group(str(src), mode="r+")
    g["values"][:1000] = np.asarray(g["values"][:1000]) + 1
    assert tsconv.process(src, out, chunk=CHUNK, resume=True).resumed_from == DONE

    class Remote:  # an input whose arrays live in a store that is not a directory
        path = src
        values = zarr.create_array(zarr.storage.MemoryStore(), shape=(10, 2), chunks=(5, 2), dtype="f4")
        time = None

    assert input_digest(Remote()) == {"version": 1, "skipped": "values: MemoryStore (not a local directory)"}


def test_the_digest_is_small_per_band_and_cheap(tmp_path: Path) -> None:
    import time

    from tsconv.io.digest import changed_bands, input_digest

    src = write_store(tmp_path / "in.zarr", price_series(ROWS, FEATURES, seed=4), chunks=(BAND, FEATURES))
    store = tsconv.open_input(src)
    t0 = time.perf_counter()
    d = input_digest(store)
    assert time.perf_counter() - t0 < 0.5
    assert set(d["arrays"]) == {"values", "time"}
    assert d["arrays"]["values"]["band_rows"] == BAND and len(d["arrays"]["values"]["bands"]) == 5
    assert all(len(b) == 16 for b in d["arrays"]["values"]["bands"])
    g = zarr.open_group(str(src), mode="r+")
    g["values"][4500:] = np.asarray(g["values"][4500:]) + 1  # the last band rewritten
    assert changed_bands(d, input_digest(store)) == {"time": [], "values": [4]}
    # Rows appended (a later --update's case): the old bands compare, the metadata digest ignores the shape.
    d = input_digest(store)
    for name, more in (("values", price_series(700, FEATURES, seed=6)), ("time", None)):
        a = g[name]
        a.resize((ROWS + 700, *a.shape[1:]))
        a[ROWS:] = more if more is not None else np.asarray(a[ROWS - 1 : ROWS]) + 1 + np.arange(700)
    grown = input_digest(tsconv.open_input(src))
    assert changed_bands(d, grown) == {"time": [], "values": []}
    assert len(grown["arrays"]["values"]["bands"]) == 6


def test_an_update_of_an_interrupted_first_run_over_a_grown_input_says_where_its_rows_were_done(
    tmp_path: Path, small_chunks: None
) -> None:
    # it said "updated from 4,000 rows", the size the killed run was started with
    x = price_series(ROWS, FEATURES, seed=4)
    src, out = _interrupted(tmp_path, x[:4000])
    g = zarr.open_group(str(src), mode="r+")  # the input grows by 1,000 rows
    g["values"].resize((ROWS, FEATURES))
    g["values"][4000:] = x[4000:]
    if "time" in g:
        t = g["time"][:]
        g["time"].resize((ROWS,))
        g["time"][4000:] = t[-1] + (t[1] - t[0]) * np.arange(1, ROWS - 4000 + 1)
    report = tsconv.process(src, out, chunk=CHUNK, update=True)
    assert report.updated_from == DONE and report.resumed_from == DONE
    want = tsconv.features(x, "default", chunk=CHUNK)
    np.testing.assert_array_equal(zarr.open_group(str(out), mode="r")["values"][:], want)
