"""Progress on stderr: plain lines every few seconds when it is not a terminal, tqdm's bar when it is."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import zarr
from click.testing import CliRunner
from tqdm import tqdm

from tsconv.cli import main
from tsconv.progress import PLAIN_EVERY_S, PlainProgress, progress_bar

from .helpers import price_series, write_store


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_every_few_seconds_and_a_last_one() -> None:
    out, clock = io.StringIO(), Clock()
    with progress_bar(total=1_000_000, desc="ticks.zarr", stream=out, clock=clock) as bar:
        assert isinstance(bar, PlainProgress)
        for _ in range(100):  # 100 updates over 20 s: a line at 10 s and at 20 s, none between
            clock.now += 0.2
            bar.update(10_000)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines == [
        "ticks.zarr: 500,000 of 1,000,000 rows (50%), 50.0k rows/s, about 0:10 left",
        "ticks.zarr: 1,000,000 of 1,000,000 rows (100%), 50.0k rows/s",
        "ticks.zarr: 1,000,000 rows in 0:20 (50.0k rows/s)",
    ]
    assert PLAIN_EVERY_S == 10.0


def test_a_short_run_writes_only_the_last_line() -> None:
    out, clock = io.StringIO(), Clock()
    with progress_bar(total=300, desc="ingest", stream=out, clock=clock) as bar:
        clock.now += 2.0
        bar.update(300)
    assert out.getvalue() == "ingest: 300 rows in 0:02 (150 rows/s)\n"


def test_a_run_that_stops_early_says_where_and_a_resumed_rate_counts_new_rows_only() -> None:
    out, clock = io.StringIO(), Clock()
    bar = progress_bar(total=10_000, initial=4_000, desc="x", stream=out, clock=clock)
    clock.now += 3600 * 2 + 61
    bar.update(1_000)
    out.truncate(0), out.seek(0)
    bar.close()
    bar.close()  # once only
    assert out.getvalue() == "x: stopped at 5,000 of 10,000 rows in 2:01:01 (0 rows/s)\n"


def test_a_terminal_gets_the_bar_and_disabled_is_silent() -> None:
    term = Terminal()
    with progress_bar(total=10, desc="x", stream=term) as bar:
        assert isinstance(bar, tqdm)
        bar.update(10)
    assert "\r" in term.getvalue()
    quiet = io.StringIO()
    with progress_bar(total=10, desc="x", stream=quiet, enabled=False) as bar:
        bar.update(10)
    assert quiet.getvalue() == ""


def test_the_cli_writes_plain_lines_off_a_terminal_and_nothing_with_q(tmp_path: Path) -> None:
    src = write_store(tmp_path / "in.zarr", price_series(600, 2))
    args = ["process", "-i", str(src), "-o", str(tmp_path / "o.zarr"), "--device", "cpu", "--overwrite"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "\r" not in res.stderr
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("in.zarr: 600 rows in ")]
    quiet = CliRunner().invoke(main, [*args, "-q"])
    assert quiet.exit_code == 0 and quiet.stderr == ""


_CLOSED_STDERR_RUN = """
import os, sys
from tsconv.progress import PlainProgress

PlainProgress.__init__.__kwdefaults__["every"] = 0.0  # a line at every update, as a long run writes one
if sys.argv[1] == "closed":
    os.close(2)  # `tsconv process ... 2>&-`: sys.stderr is None
    sys.stderr = None
elif sys.argv[1] == "stdout closed":
    os.close(1)  # `tsconv process ... >&-`
    sys.stdout = None
else:
    sys.stderr = open("/dev/full", "w")  # a log on a full disk
sys.argv[:2] = ["tsconv"]
from tsconv.cli import run

run()
"""


@pytest.mark.parametrize("stderr", ["closed", "full"])
def test_a_closed_or_full_stderr_loses_the_progress_lines_not_the_run(tmp_path: Path, stderr: str) -> None:
    """The first progress line into a closed stderr (AttributeError) or a full disk's log (ENOSPC) stopped
    the run part-way with exit 1, the output unfinished and no report; the lines are dropped instead."""
    if stderr == "full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    src = write_store(tmp_path / "in.zarr", price_series(3000, 2), chunks=(500, 2))
    out, report = tmp_path / "o.zarr", tmp_path / "run.json"
    args = [
        "process",
        "-i",
        str(src),
        "-o",
        str(out),
        "--device",
        "cpu",
        "--chunk",
        "256",
        "--report",
        str(report),
    ]
    res = subprocess.run(
        [sys.executable, "-c", _CLOSED_STDERR_RUN, stderr, *args], stdout=subprocess.PIPE, text=True
    )
    assert res.returncode == 0
    assert res.stdout.startswith("3,000 rows x 2 features")
    assert zarr.open_group(str(out), mode="r").attrs["tsconv"]["complete"] is True
    assert json.loads(report.read_text())["rows"] == 3000


def test_a_plain_progress_whose_stream_fails_writes_nothing_more() -> None:
    class Full(io.StringIO):
        def write(self, s: str) -> int:
            raise OSError(28, "No space left on device")

    for stream in (Full(), None):
        with PlainProgress(total=10, desc="x", stream=stream, every=0.0) as bar:
            bar.update(5)
            bar.update(5)


def test_a_closed_stdout_ends_the_command_without_a_traceback(tmp_path: Path) -> None:
    """The exit's flush of a closed stdout (None) printed 'Exception ignored in atexit callback' and a
    traceback, and left the interpreter's slow teardown to run."""
    src = write_store(tmp_path / "in.zarr", price_series(600, 2))
    args = ["process", "-i", str(src), "-o", str(tmp_path / "o.zarr"), "--device", "cpu", "-q"]
    res = subprocess.run(
        [sys.executable, "-c", _CLOSED_STDERR_RUN, "stdout closed", *args], stderr=subprocess.PIPE, text=True
    )
    assert res.returncode == 0 and res.stderr == ""
