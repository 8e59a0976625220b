"""Nothing lost: a run killed with SIGKILL at any moment and resumed gives the uninterrupted output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

import tsconv

from .helpers import price_series, write_store


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
    assert not list(tmp_path.glob(".*.creating"))


def test_partial_output_is_marked_and_refused_as_input(tmp_path: Path) -> None:
    x = price_series(5000, 3, seed=1)
    src = write_store(tmp_path / "in.zarr", x, chunks=(1000, 3))
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=256)
    g = zarr.open_group(str(out), mode="r+")
    meta = dict(g.attrs["tsconv"])
    complete_values = np.asarray(g["values"][:])
    # Turn it back into what a killed run leaves: complete=False, rows_done short, garbage after it.
    rows_done = int(g["values"].chunks[0]) if g["values"].chunks[0] < 5000 else 0
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
