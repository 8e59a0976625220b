"""Bad inputs to ``tsconv process``: one line on stderr, a non-zero exit, no traceback, the input untouched.

Most cases run in-process through click's CliRunner. A few run the real ``python -m tsconv`` as
subprocesses; those are started together by one module fixture so their interpreter start-ups overlap.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zarr
from click.testing import CliRunner, Result

from tsconv.cli import main
from tsconv.errors import TsconvWarning
from tsconv.io.timecoding import iso_utc

from .helpers import T0, price_series, write_store

ROWS, FEATURES = 300, 3  # longer than the default pipeline's warm-up of 256 steps
DEFAULT_OUTPUTS = FEATURES * 5  # the default bank has five filters


# ----------------------------------------------------------------------------------------- helpers


def snapshot(path: Path) -> dict[str, tuple]:
    """Every file and directory under ``path`` (or the file itself): kind, bytes and mtime."""
    if not path.exists() and not path.is_symlink():
        return {}
    items = [path, *sorted(path.rglob("*"))] if path.is_dir() else [path]
    snap: dict[str, tuple] = {}
    for p in items:
        st = p.lstat()
        rel = "." if p == path else p.relative_to(path).as_posix()
        if p.is_symlink():
            snap[rel] = ("link", os.readlink(p), st.st_mtime_ns)
        elif p.is_dir():
            snap[rel] = ("dir", None, st.st_mtime_ns)
        else:
            snap[rel] = ("file", p.read_bytes(), st.st_mtime_ns)
    return snap


def good_store(root: Path, rows: int = ROWS, features: int = FEATURES, name: str = "in.zarr") -> Path:
    return write_store(root / name, price_series(rows, features))


def write_toml(root: Path, text: str, name: str = "pipe.toml") -> Path:
    p = root / name
    p.write_text(text)
    return p


def invoke(*args: str | os.PathLike[str]) -> Result:
    """``tsconv process ARGS -q`` in-process; the CLI's warning hook is undone when the test ends."""
    return CliRunner().invoke(main, ["process", *map(str, args), "-q"])


def assert_one_line_error(code: int, stdout: str, stderr: str, *needles: str) -> str:
    assert code != 0
    assert "Traceback" not in stdout + stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {stderr!r}"
    assert lines[0].startswith("tsconv: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert stdout == ""
    return lines[0]


def assert_refused(res: Result, *needles: str) -> str:
    # Anything but SystemExit escaping the command would be a traceback on a real terminal.
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    return assert_one_line_error(res.exit_code, res.stdout, res.stderr, *needles)


@pytest.fixture(autouse=True)
def _restore_warning_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CLI installs its own warnings.showwarning and never puts the old one back.
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)


# ---------------------------------------------------------------------- real subprocesses, in parallel


class _Evil:
    """Unpickling this creates the file ``marker``: proof that a weights file was unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):  # noqa: ANN204
        return (open, (self.marker, "w"))


def _setup_missing(root: Path) -> list[str]:
    return ["-i", str(root / "nope.zarr")]


def _setup_pickled(root: Path) -> list[str]:
    good_store(root)
    arr = np.empty((2, 3, 2), dtype=object)
    arr[...] = 0.5
    arr[0, 0, 0] = _Evil(root / "UNPICKLED")
    np.save(root / "w.npy", arr, allow_pickle=True)
    write_toml(root, '[[conv]]\nweights = "w.npy"\n')
    return ["-i", str(root / "in.zarr"), "-o", str(root / "out.zarr"), "--pipeline", str(root / "pipe.toml")]


def _setup_fp16_warning(root: Path) -> list[str]:
    good_store(root)
    head = np.random.default_rng(0).normal(size=(2 * FEATURES, 3))
    np.save(root / "head.npy", head - head.mean(axis=0))  # zero-sum columns over price-level inputs
    write_toml(root, '[[conv]]\nfilters = ["ma:16", "ma:4"]\n[head]\nweights = "head.npy"\n')
    return ["-i", str(root / "in.zarr"), "-o", str(root / "out.zarr"), "--pipeline", str(root / "pipe.toml")]


_REAL: dict[str, Callable[[Path], list[str]]] = {
    "missing_store": _setup_missing,
    "pickled_weights": _setup_pickled,
    "fp16_warning": _setup_fp16_warning,
}


@dataclass
class RealRun:
    root: Path
    code: int
    stdout: str
    stderr: str
    before: dict[str, tuple]  # the whole working directory
    before_input: dict[str, tuple]  # in.zarr alone


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RealRun]:
    """Run ``python -m tsconv process`` for every case in ``_REAL`` at once; results by case name."""
    started = {}
    for name, setup in _REAL.items():
        root = tmp_path_factory.mktemp(name)
        args = setup(root)
        before = snapshot(root), snapshot(root / "in.zarr")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tsconv", "process", *args, "-q"],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started[name] = (root, proc, before)
    runs = {}
    for name, (root, proc, before) in started.items():
        out, err = proc.communicate(timeout=300)
        runs[name] = RealRun(root, proc.returncode, out, err, *before)
    return runs


def test_real_missing_store(real_runs: dict[str, RealRun]) -> None:
    r = real_runs["missing_store"]
    assert_one_line_error(r.code, r.stdout, r.stderr, "does not exist", str(r.root / "nope.zarr"))
    assert snapshot(r.root) == r.before  # in particular no default output beside the missing input


def test_real_pickled_weights_refused_without_unpickling(real_runs: dict[str, RealRun]) -> None:
    r = real_runs["pickled_weights"]
    assert_one_line_error(r.code, r.stdout, r.stderr, "cannot read weights file", "w.npy")
    assert not (r.root / "UNPICKLED").exists(), "the object array was unpickled"
    assert snapshot(r.root) == r.before


def test_real_fp16_storage_warning_is_one_line(real_runs: dict[str, RealRun]) -> None:
    r = real_runs["fp16_warning"]
    assert r.code == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("tsconv: warning: ")
    assert "[head]: storing its weights as float16 moves output" in lines[0] and "pipe.toml" in lines[0]
    assert (r.root / "out.zarr" / "zarr.json").is_file()
    assert r.before_input and snapshot(r.root / "in.zarr") == r.before_input


# ------------------------------------------------------------------------------------- input stores


def _plain_file(root: Path) -> Path:
    p = root / "in.zarr"
    p.write_bytes(b"time,price\n1,100.0\n")
    return p


def _plain_dir(root: Path) -> Path:
    p = root / "in.zarr"
    p.mkdir()
    (p / "data.csv").write_text("time,price\n1,100.0\n")
    return p


def _bare_array(data: np.ndarray) -> Callable[[Path], Path]:
    def make(root: Path) -> Path:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zarr warns that fixed-length strings have no v3 spec
            zarr.create_array(str(root / "in.zarr"), data=data)
        return root / "in.zarr"

    return make


def _group(values: np.ndarray, **attrs: object) -> Callable[[Path], Path]:
    def make(root: Path) -> Path:
        g = zarr.open_group(str(root / "in.zarr"), mode="w")
        g.create_array("values", data=values, chunks=tuple(max(1, n) for n in values.shape))
        g.attrs.update(attrs)
        return root / "in.zarr"

    return make


def _group_without_values(root: Path) -> Path:
    g = zarr.open_group(str(root / "in.zarr"), mode="w")
    g.create_array("time", data=np.arange(10, dtype=np.int64))
    return root / "in.zarr"


def _time_of_wrong_length(root: Path) -> Path:
    p = good_store(root, rows=ROWS)
    g = zarr.open_group(str(p), mode="r+")
    del g["time"]
    g.create_array("time", data=T0 + np.arange(ROWS - 1, dtype=np.int64))
    return p


def _time_array(data: np.ndarray, **attrs: object) -> Callable[[Path], Path]:
    """A good store whose 'time' is replaced by ``data`` with ``attrs`` (e.g. CF units)."""

    def make(root: Path) -> Path:
        p = good_store(root, rows=ROWS)
        g = zarr.open_group(str(p), mode="r+")
        del g["time"]
        g.create_array("time", data=data).attrs.update(attrs)
        return p

    return make


def _feature_major(root: Path) -> Path:
    """A store of 'values' [F, T] without dimension names, beside 'time' [T]: it was called damaged."""
    p = good_store(root, rows=ROWS)
    g = zarr.open_group(str(p), mode="r+")
    x = np.asarray(g["values"][:])
    del g["values"]
    g.create_array("values", data=np.ascontiguousarray(x.T))
    return p


def _two_data_variables(root: Path) -> Path:
    """An xarray-like group (dimension names, a 'time' coordinate) with two candidate variables."""
    g = zarr.open_group(str(root / "in.zarr"), mode="w")
    g.create_array("time", data=T0 + np.arange(ROWS, dtype=np.int64), dimension_names=["time"])
    for name in ("bid", "ask"):
        g.create_array(name, data=price_series(ROWS, FEATURES), dimension_names=["time", "feature"])
    return root / "in.zarr"


_SECONDS = {"units": "seconds since 2026-01-02 00:00:00", "calendar": "standard"}

STORE_CASES = {
    "plain file": (_plain_file, ["is not a zarr store (a file)"]),
    "directory without zarr metadata": (
        _plain_dir,
        ["is not a zarr store (a directory without zarr metadata)"],
    ),
    "1-D array": (_bare_array(np.arange(ROWS, dtype=np.float32)), ["expected a 2-D array", "got 1-D"]),
    "3-D array": (_bare_array(np.zeros((ROWS, 3, 2), np.float32)), ["expected a 2-D array", "got 3-D"]),
    "group with 3-D values": (_group(np.zeros((ROWS, 3, 2), np.float32)), ["got 3-D"]),
    "strings": (_bare_array(np.array([["a", "b"]] * ROWS)), ["values have dtype <U1", "real numeric dtype"]),
    "bool": (_bare_array(np.ones((ROWS, 2), dtype=bool)), ["values have dtype bool"]),
    "complex": (_bare_array(np.ones((ROWS, 2), dtype=np.complex64)), ["values have dtype complex64"]),
    "empty series": (_group(np.zeros((0, 3), np.float32)), ["the series is empty (0 steps)"]),
    "no features": (_group(np.zeros((ROWS, 0), np.float32)), ["no features (0 columns)"]),
    "group without values": (_group_without_values, ["the group has no 'values' array (it has: time)"]),
    "features attribute of wrong length": (
        _group(np.zeros((ROWS, 3), np.float32), features=["a", "b"]),
        ["attribute 'features' names 2 features but values have 3 columns"],
    ),
    "time of wrong length": (
        _time_of_wrong_length,
        [f"'time' has {ROWS - 1} rows but the values have {ROWS}", "re-create it"],
    ),
    # feature-major values [F, T] read as [T, F]: the store was called damaged, the attribute wrong
    "feature-major values beside a time": (
        _feature_major,
        [f"the values [{FEATURES}, {ROWS}] look feature-major", f"'time' holds {ROWS} times", "x.T"],
    ),
    "feature-major values with names": (
        _group(np.zeros((3, ROWS), np.float32), features=["a", "b", "c"]),
        [f"the values [3, {ROWS}] look feature-major", "attribute 'features' names 3, as many as their rows"],
    ),
    "repeated feature names": (
        _group(np.zeros((ROWS, 16), np.float32), features=["px"] * 16),
        ["feature names repeat (15 repeats of 1 name: 'px')", "hint: give every feature a distinct name"],
    ),
    "uint64 time above 2^63": (
        _time_array(np.uint64(2**63 - 10) + np.arange(ROWS, dtype=np.uint64)),
        ["'time': row 10 holds 9223372036854775808, above the int64 maximum 2^63-1"],
    ),
    "noleap calendar": (
        _time_array(np.arange(ROWS, dtype=np.int64), units="days since 2000-01-01", calendar="noleap"),
        ["calendar 'noleap'", "standard, gregorian, proleptic_gregorian", "convert_calendar"],
    ),
    "unreadable time units": (
        _time_array(np.arange(ROWS, dtype=np.int64), units="fortnights since 2000-01-01"),
        ["cannot read the time units 'fortnights since 2000-01-01'"],
    ),
    "time past 2262": (
        _time_array(np.arange(ROWS, dtype=np.int64) * 100_000, units="days since 2000-01-01"),
        ["'time': row 1 holds 100000", "outside the int64 nanosecond range"],
    ),
    "missing CF time": (
        _time_array(np.where(np.arange(ROWS) == 123, -1, np.arange(ROWS)), _FillValue=-1, **_SECONDS),
        ["the time of row 123 is missing"],
    ),
    "float time without units": (
        _time_array(np.arange(ROWS, dtype=np.float64)),
        ["holds floats (float64) but has no 'units' attribute"],
    ),
    "two data variables": (
        _two_data_variables,
        ["2 2-D data variables along 'time': ask, bid; expected one"],
    ),
}


@pytest.mark.parametrize("case", list(STORE_CASES))
def test_bad_input_store(tmp_path: Path, case: str) -> None:
    make, needles = STORE_CASES[case]
    src = make(tmp_path)
    before = snapshot(tmp_path)
    assert before
    res = invoke("-i", src, "-o", tmp_path / "out.zarr")
    assert_refused(res, str(src), *needles, "; hint: ")  # every refusal says what to do
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("report", "needle"),
    [
        ("in.zarr/zarr.json", "lies inside the input store"),
        ("in.zarr/values/x.json", "lies inside the input store"),
        ("out.zarr/zarr.json", "lies inside the output"),
        ("missing/r.json", "its folder"),
    ],
)
def test_a_report_path_tsconv_must_not_or_cannot_write_is_refused_before_the_run(
    tmp_path: Path, report: str, needle: str
) -> None:
    # --report in.zarr/zarr.json had replaced the store's group document (its feature names gone), and a
    # missing folder failed the command after the whole run was written
    src = good_store(tmp_path)
    before = snapshot(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--report", tmp_path / report)
    assert_refused(res, f"--report {str(tmp_path / report)!r}", needle)
    if "input" in needle:  # the input as a file:// URL is the same store
        res = invoke("-i", f"file://{src}", "-o", tmp_path / "out.zarr", "--report", tmp_path / report)
        assert_refused(res, f"--report {str(tmp_path / report)!r}", needle)
    assert snapshot(tmp_path) == before  # nothing written: no output, the input as it was


@pytest.mark.parametrize(
    ("inner", "default"), [((), "in.features.zarr"), (("values",), "in.values.features.zarr")]
)
def test_a_report_inside_the_default_output_is_refused_before_the_run(
    tmp_path: Path, inner: tuple[str, ...], default: str
) -> None:
    # without -o, --report in.features.zarr/zarr.json replaced the output's root document with the JSON
    # report (its tsconv metadata gone: a --resume then called it another run's), exit 0
    src = good_store(tmp_path)
    assert invoke("-i", src.joinpath(*inner)).exit_code == 0
    report = tmp_path / default / "zarr.json"
    before = snapshot(tmp_path)
    res = invoke("-i", src.joinpath(*inner), "--overwrite", "--report", report)
    assert_refused(res, f"--report {str(report)!r}", "lies inside the output", str(tmp_path / default))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("report", ["p.toml", "w.npy", "sub/../w.npy"])
def test_a_report_over_the_pipelines_own_files_is_refused_before_the_run(tmp_path: Path, report: str) -> None:
    # --report w.npy replaced the run's weight file with the JSON report; the next run failed on it
    src = good_store(tmp_path)
    (tmp_path / "sub").mkdir()
    np.save(tmp_path / "w.npy", np.full((2, FEATURES, 3), 0.25, dtype=np.float32))
    (tmp_path / "p.toml").write_text('[[conv]]\nweights = "w.npy"\n', encoding="utf-8-sig")  # a BOM too
    before = snapshot(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--pipeline", tmp_path / "p.toml", "--report",
                 tmp_path / report)  # fmt: skip
    assert_refused(res, "a file the pipeline is read from")
    assert snapshot(tmp_path) == before
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--pipeline", tmp_path / "p.toml", "--report",
                 tmp_path / "r.json")  # fmt: skip
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("inner", [("values",), ("eq", "daily")])
def test_an_input_inside_a_store_gets_its_default_output_beside_the_store(
    tmp_path: Path, inner: tuple[str, ...]
) -> None:
    # -i in.zarr/eq/daily with no -o: beside the input, in.zarr/eq/daily.features.zarr, the default lay among
    # the store's files, and the run was refused as overlapping its input, for a path the user never chose
    root = tmp_path / "in.zarr"
    if inner == ("values",):
        good_store(tmp_path)
    else:
        zarr.open_group(str(root), mode="w").create_group("eq")
        write_store(root / "eq" / "daily", price_series(ROWS, FEATURES))
    before = snapshot(root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TsconvWarning)  # a bare array's read is said too
        res = invoke("-i", root.joinpath(*inner))
    assert res.exit_code == 0, res.output
    assert snapshot(root) == before
    out = zarr.open_group(str(tmp_path / f"in.{'.'.join(inner)}.features.zarr"), mode="r")
    assert out["values"].shape[0] == ROWS


@pytest.mark.parametrize("where", [0, 7, ROWS - 1])
def test_a_missing_time_anywhere_is_refused_naming_its_row(tmp_path: Path, where: int) -> None:
    # NaT is the int64 minimum: beside it a difference overflows, so a NaT in the last row had passed
    src = good_store(tmp_path)
    g = zarr.open_group(str(src), mode="r+")
    t = np.asarray(g["time"][:])
    t[where] = np.iinfo(np.int64).min
    g["time"][:] = t
    before = snapshot(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr")
    assert_refused(res, f"'time': the time of row {where:,} is missing (NaT, the int64 minimum)")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("where", "row", "what"), [(5, 5, "duplicate"), (7, 7, "decreasing"), (ROWS - 1, ROWS - 1, "decreasing")]
)
def test_non_increasing_time(tmp_path: Path, where: int, row: int, what: str) -> None:
    src = good_store(tmp_path)
    g = zarr.open_group(str(src), mode="r+")
    t = np.asarray(g["time"][:])
    t[where] = t[where - 1] if what == "duplicate" else t[where - 1] - 1
    g["time"][:] = t
    before = snapshot(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr")
    # the times as instants, not as the int64 nanoseconds they are stored as
    assert_refused(res, f"'time' is not strictly increasing at row {row:,} "
                        f"({iso_utc(t[where])} after {iso_utc(t[where - 1])})")  # fmt: skip
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(("filters", "rows", "shortest"), [(None, 1, 1), (["ma:256", "dev:32"], 10, 31),
                                                         (["ma:256", "dev:32"], 31, 31)])  # fmt: skip
def test_series_no_longer_than_warmup(
    tmp_path: Path, filters: list[str] | None, rows: int, shortest: int
) -> None:
    src = good_store(tmp_path, rows=rows)
    args: list[Any] = ["-i", src, "-o", tmp_path / "out.zarr"]  # warmup nan
    if filters is not None:
        (tmp_path / "p.toml").write_text(f"[[conv]]\nfilters = {json.dumps(filters)}\n")
        args += ["--pipeline", tmp_path / "p.toml"]
    before, before_input = snapshot(tmp_path), snapshot(src)
    res = invoke(*args)
    assert_refused(
        res,
        f"the series has {rows} steps but the pipeline's shortest warm-up is {shortest} steps",
        "--warmup zero",
    )
    assert snapshot(tmp_path) == before

    res = invoke(*args, "--warmup", "zero", "--overwrite")
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    out = np.asarray(zarr.open_group(str(tmp_path / "out.zarr"), mode="r")["values"][:])
    assert out.shape[0] == rows and np.isfinite(out).all()
    assert snapshot(src) == before_input


@pytest.mark.parametrize("warmup", ["nan", "zero"])
def test_a_series_within_the_preprocess_warmup_is_refused_whatever_the_warmup(
    tmp_path: Path, warmup: str
) -> None:
    # a [preprocess]'s first steps are NaN whatever --warmup: a zero run skipped the check and wrote an
    # all-NaN output with exit 0, and the refusal's hint sent the user to --warmup zero
    src = good_store(tmp_path, rows=200)
    (tmp_path / "p.toml").write_text(
        '[preprocess]\ntransform = "log_return"\nzscore = 256\n\n[[conv]]\nfilters = ["id", "ma:4"]\n'
    )
    before = snapshot(tmp_path)
    res = invoke(
        "-i", src, "-o", tmp_path / "out.zarr", "--pipeline", tmp_path / "p.toml", "--warmup", warmup
    )
    line = assert_refused(
        res, "the series has 200 steps but the pipeline's shortest warm-up is 256 steps", "[preprocess]"
    )
    assert "--warmup zero" not in line and snapshot(tmp_path) == before


def test_a_series_shorter_than_the_longest_warm_up_gives_the_short_filters(tmp_path: Path) -> None:
    """9 steps of lag:1 and ma:10 had been refused ("every output would be NaN"): lag:1 has 8 values."""
    src = good_store(tmp_path, rows=9, features=1)
    (tmp_path / "p.toml").write_text('[[conv]]\nfilters = ["lag:1", "ma:10"]\n')
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--pipeline", tmp_path / "p.toml", "--device", "cpu")
    assert res.exit_code == 0, res.output
    y = np.asarray(zarr.open_group(str(tmp_path / "out.zarr"), mode="r")["values"][:])
    x = np.asarray(zarr.open_group(str(src), mode="r")["values"][:])
    np.testing.assert_array_equal(y[1:, 0], x[:-1, 0])
    assert np.isnan(y[0, 0]) and np.isnan(y[:, 1]).all()


def test_series_one_step_longer_than_warmup_runs(tmp_path: Path) -> None:
    src = good_store(tmp_path, rows=257)
    before = snapshot(src)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr")
    assert res.exit_code == 0, res.output
    out = np.asarray(zarr.open_group(str(tmp_path / "out.zarr"), mode="r")["values"][:])
    # diff256 (every 5th output from 2) warms up over 256 rows, the shorter filters over theirs
    assert np.isnan(out[:256, 2::5]).all() and np.isfinite(out[256]).all()
    assert snapshot(src) == before


# ---------------------------------------------------------------------------------------- pipelines


def _npy(name: str, arr: np.ndarray) -> Callable[[Path], None]:
    return lambda root: np.save(root / name, arr)


def _raw(name: str, data: bytes) -> Callable[[Path], None]:
    return lambda root: (root / name).write_bytes(data)


def _truncated_npy(root: Path) -> None:
    np.save(root / "w.npy", np.ones((4, 3, 5)))
    data = (root / "w.npy").read_bytes()
    (root / "w.npy").write_bytes(data[: len(data) - 40])


def _two_tensors(root: Path) -> None:
    from safetensors.numpy import save_file

    save_file(
        {"a": np.ones((2, 3, 2), np.float32), "b": np.ones((2,), np.float32)}, str(root / "w.safetensors")
    )


def _npy_claiming(
    shape: tuple[int, ...], descr: str = "<f8", body: bytes = b"\0" * 64, name: str = "w.npy"
) -> Callable[[Path], None]:
    """A .npy file whose header declares ``shape`` but whose data are only ``body``; beside it, for a
    file other than w.npy, good stage weights w.npy of shape [4, 3, 2]."""

    def make(root: Path) -> None:
        if name != "w.npy":
            np.save(root / "w.npy", np.ones((4, 3, 2)))
        with open(root / name, "wb") as f:
            np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": shape})
            f.write(body)

    return make


W_TOML = '[[conv]]\nweights = "w.npy"\n'

PIPELINE_CASES = {
    "unknown key in [[conv]]": ('[[conv]]\nfilters = ["ma:4"]\nstride = 2\n', None, ["unknown key 'stride'"]),
    "unknown top-level key": (
        'nmae = "x"\n[[conv]]\nfilters = ["ma:4"]\n',
        None,
        ["top level: unknown key 'nmae'", "did you mean 'name'?"],
    ),
    "dilation 0": (
        '[[conv]]\nfilters = ["ma:4"]\ndilation = 0\n',
        None,
        ["dilation must be an integer from 1 to 1,048,576, got 0", "hint: write a whole number"],
    ),
    "dilation -1": (
        '[[conv]]\nfilters = ["ma:4"]\ndilation = -1\n',
        None,
        ["dilation must be an integer from 1 to 1,048,576, got -1", "hint: write a whole number"],
    ),
    "groups not dividing C": (
        W_TOML + "groups = 2\n",
        _npy("w.npy", np.ones((2, 1, 3))),
        ["groups = 2 does not divide the 3 input channels"],
    ),
    "groups not dividing O": (
        W_TOML + "groups = 2\n",
        _npy("w.npy", np.ones((3, 1, 3))),
        ["groups = 2 does not divide the 3 output channels"],
    ),
    "weights C differs from F": (
        W_TOML,
        _npy("w.npy", np.ones((4, 5, 3))),
        ["weights of shape [4, 5, 3] with groups = 1 expect 5 input channels, but the stage receives 3"],
    ),
    "corrupt npy (random bytes)": (
        W_TOML,
        _raw("w.npy", bytes(range(256)) * 4),
        ["cannot read weights file", "w.npy"],
    ),
    "corrupt npy (magic, garbage header)": (
        W_TOML,
        _raw("w.npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': <f8', }\n" + b"\0" * 64),
        ["cannot read weights file", "w.npy"],
    ),
    "corrupt npy (truncated)": (W_TOML, _truncated_npy, ["cannot read weights file", "w.npy"]),
    "npy header claiming 8 GiB, tiny body": (
        W_TOML,
        _npy_claiming((1024, 1024, 1024)),
        [
            "w.npy",
            "declares shape [1024, 1024, 1024] float64 (8.0 GiB of data) but it holds 64 bytes",
            "truncated",
        ],
    ),
    "npy header with an overflowing shape": (
        W_TOML,
        _npy_claiming((2**62, 2**62, 4)),
        ["w.npy", "declares shape", "but it holds 64 bytes"],
    ),
    "npy of Python objects, refused by its header": (
        W_TOML,
        _npy_claiming((2, 3, 2), descr="|O"),
        ["w.npy", "holds Python objects", "never unpickles"],
    ),
    "npy of the wrong rank, refused by its header": (
        W_TOML,
        _npy_claiming((2**20, 2**20)),
        ["w.npy", "has shape [1048576, 1048576], expected 3-D"],
    ),
    "npy bias of the wrong length, refused by its header": (
        W_TOML + 'bias = "b.npy"\n',
        _npy_claiming((2**30,), body=b"", name="b.npy"),  # header only: its data are never read
        ["b.npy", "bias has 1073741824 values but weights have 4 output channels", "data were not read"],
    ),
    "npy head weights not fitting the last stage, refused by its header": (
        W_TOML + '[head]\nweights = "head.npy"\n',
        _npy_claiming((2**20, 2), name="head.npy"),
        [
            "[head]",
            "head.npy",
            "weights of shape [1048576, 2] expect 1048576 inputs, but the last stage gives 4",
        ],
    ),
    "safetensors with two tensors, no weights_key": (
        '[[conv]]\nweights = "w.safetensors"\n',
        _two_tensors,
        ["w.safetensors", "holds 2 tensors (a, b)", "weights_key"],
    ),
    "missing weights file": (W_TOML, None, ["weights file", "w.npy", "does not exist"]),
    "unknown filter foo:3": ('[[conv]]\nfilters = ["ma:4", "foo:3"]\n', None, ["unknown filter 'foo:3'"]),
    "filter without parameter": ('[[conv]]\nfilters = ["ma"]\n', None, ["filter 'ma' needs a parameter"]),
    "filter with zero window": ('[[conv]]\nfilters = ["ma:0"]\n', None, ["parameter must be between 1 and"]),
    "bad TOML syntax": (
        '[[conv]\nfilters = ["ma:4"\n',
        None,
        ["not valid TOML", "hint: fix the file at that line"],
    ),
    "no filters": ("[[conv]]\nfilters = []\n", None, ["non-empty list of strings", "hint: e.g. filters = ["]),
    "both weights and filters": (
        '[[conv]]\nweights = "w.npy"\nfilters = ["ma:4"]\n',
        _npy("w.npy", np.ones((3, 3, 2))),
        ["give exactly one of 'weights'", "or 'filters'"],
    ),
    "neither weights nor filters": ("[[conv]]\ndilation = 2\n", None, ["give exactly one of 'weights'"]),
    "no [[conv]] at all": ('name = "x"\n', None, ["no [[conv]] stage"]),
    "head weights of the wrong width": (
        '[[conv]]\nfilters = ["diff:1", "diff:2", "dev:4", "dev:8", "ma:8"]\n[head]\nweights = "head.npy"\n',
        _npy("head.npy", np.ones((7, 2))),
        ["[head]", "weights of shape [7, 2] expect 7 inputs, but the last stage gives 15"],
    ),
}


@pytest.mark.parametrize("case", list(PIPELINE_CASES))
def test_bad_pipeline(tmp_path: Path, case: str) -> None:
    text, make_files, needles = PIPELINE_CASES[case]
    src = good_store(tmp_path)
    toml = write_toml(tmp_path, text)
    if make_files is not None:
        make_files(tmp_path)
    before = snapshot(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--pipeline", toml)
    # every message names the pipeline file it is about
    assert_refused(res, str(toml), *needles)
    assert snapshot(tmp_path) == before


def test_missing_pipeline_file(tmp_path: Path) -> None:
    src = good_store(tmp_path)
    before = snapshot(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--pipeline", tmp_path / "nope.toml")
    assert_refused(res, "pipeline file", "nope.toml", "does not exist")
    assert snapshot(tmp_path) == before


def test_unknown_bare_pipeline_name(tmp_path: Path) -> None:
    src = good_store(tmp_path)
    before = snapshot(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--pipeline", "trend")
    assert_refused(res, "'trend' is neither a pipeline file nor a built-in", "trend_ema", "tsconv pipelines")
    assert snapshot(tmp_path) == before


def test_pipeline_file_not_utf8(tmp_path: Path) -> None:
    src = good_store(tmp_path)
    toml = tmp_path / "pipe.toml"
    toml.write_bytes(b'name = "caf\xe9"\n[[conv]]\nfilters = ["ma:4"]\n')  # latin-1, as some editors save
    before = snapshot(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--pipeline", toml)
    assert_refused(res, str(toml), "not a UTF-8 text file", "hint: check that the path names the pipeline's")
    assert snapshot(tmp_path) == before


# --------------------------------------------------------------------------------------- warnings


@pytest.mark.parametrize(
    "pipeline",
    [
        None,  # the default pipeline: power-of-two windows, exact in FP16
        '[[conv]]\nfilters = ["ma:5"]\nweight_dtype = "float32"\n',
        'weight_dtype = "float32"\n[[conv]]\nfilters = ["ma:5", "ema:3"]\n',
        '[[conv]]\nfilters = ["ma:4", "dev:16", "diff:3"]\n',
    ],
)
def test_no_fp16_warning_when_weights_are_exact(tmp_path: Path, pipeline: str | None) -> None:
    src = good_store(tmp_path)
    extra = [] if pipeline is None else ["--pipeline", write_toml(tmp_path, pipeline)]
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", *extra)
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    assert "tsconv: warning" not in res.output


def test_fp16_warning_in_process_is_one_line(tmp_path: Path) -> None:
    src = good_store(tmp_path)
    # a rounded bank alone is fine (its level term uses the exact sums): no warning
    toml = write_toml(tmp_path, '[[conv]]\nname = "smooth"\nfilters = ["ma:4", "ma:5"]\n')
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--pipeline", toml)
    assert res.exit_code == 0 and res.stderr == "", res.output
    # a zero-sum mix of the averages (price levels) is moved by its rounded weights: warned, named
    w = np.random.default_rng(3).normal(size=(4, 2 * FEATURES, 3))
    np.save(tmp_path / "mix.npy", w - w.mean(axis=(1, 2), keepdims=True))
    toml.write_text(toml.read_text() + '[[conv]]\nname = "mix"\nweights = "mix.npy"\n')
    res = invoke("-i", src, "-o", tmp_path / "out2.zarr", "--pipeline", toml)
    assert res.exit_code == 0, res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("tsconv: warning: ")
    assert "[[conv]] #2 (mix): storing its weights as float16 moves output" in lines[0]


# ----------------------------------------------------------------------------------------- outputs


def test_output_equal_to_input_is_refused(tmp_path: Path) -> None:
    src = good_store(tmp_path)
    before = snapshot(tmp_path)
    for extra in ([], ["--overwrite"], ["--resume"]):
        res = invoke("-i", src, "-o", src, *extra)
        assert_refused(res, "would overlap the input store")
        assert snapshot(tmp_path) == before


@pytest.mark.parametrize("inner", ["sub.zarr", "values", "time", "values/c"])
def test_output_inside_the_input_is_refused(tmp_path: Path, inner: str) -> None:
    src = good_store(tmp_path)
    before = snapshot(tmp_path)
    for extra in ([], ["--overwrite"]):
        res = invoke("-i", src, "-o", src / inner, *extra)
        assert_refused(res, "would overlap the input store")
        assert snapshot(tmp_path) == before


def test_output_containing_the_input_is_refused(tmp_path: Path) -> None:
    """The input is the bare array g.zarr/values; overwriting g.zarr would delete it."""
    good_store(tmp_path, name="g.zarr")
    before = snapshot(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TsconvWarning)  # the bare array's read is said too
        res = invoke("-i", tmp_path / "g.zarr" / "values", "-o", tmp_path / "g.zarr", "--overwrite")
    assert_refused(res, "would overlap the input store")
    assert snapshot(tmp_path) == before


def test_output_symlink_to_the_input_is_refused(tmp_path: Path) -> None:
    src = good_store(tmp_path)
    (tmp_path / "link.zarr").symlink_to(src, target_is_directory=True)
    before = snapshot(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "link.zarr", "--overwrite")
    assert_refused(res, "would overlap the input store")
    assert snapshot(tmp_path) == before


def test_existing_output_refused_then_replaced_with_overwrite(tmp_path: Path) -> None:
    src = good_store(tmp_path)
    out = write_store(tmp_path / "out.zarr", np.zeros((7, 2), np.float32))
    (out / "stale.txt").write_text("from an older run")
    before = snapshot(tmp_path)
    res = invoke("-i", src, "-o", out)
    assert_refused(res, "already exists", "--overwrite", "--resume")
    assert snapshot(tmp_path) == before

    before_out = snapshot(out)  # a file that is not zarr data is not tsconv's to delete
    res = invoke("-i", src, "-o", out, "--overwrite")
    assert_refused(res, "refusing to overwrite", "not zarr data (stale.txt)", "remove the store yourself")
    assert snapshot(out) == before_out

    (out / "stale.txt").unlink()
    before_input = snapshot(src)
    res = invoke("-i", src, "-o", out, "--overwrite")
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    assert snapshot(src) == before_input
    g = zarr.open_group(str(out), mode="r")
    assert g["values"].shape == (ROWS, DEFAULT_OUTPUTS)
    assert g.attrs["features"][:5] == ["x0.diff1", "x0.diff32", "x0.diff256", "x0.dev32", "x0.dev256"]
    assert g.attrs["tsconv"]["complete"] is True
    np.testing.assert_array_equal(np.asarray(g["time"][:]), np.asarray(zarr.open_group(str(src))["time"][:]))


@pytest.mark.parametrize("kind", ["directory", "empty directory", "file"])
def test_existing_non_zarr_output_is_never_replaced(tmp_path: Path, kind: str) -> None:
    src = good_store(tmp_path)
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("precious\n")
    else:
        out.mkdir()
        if kind == "directory":
            (out / "notes.txt").write_text("precious\n")
            (out / "sub").mkdir()
    before = snapshot(tmp_path)
    for extra in ([], ["--overwrite"], ["--resume"]):
        res = invoke("-i", src, "-o", out, *extra)
        assert_refused(res, "exists and is not a zarr store; refusing to replace it")
        assert snapshot(tmp_path) == before


def test_overwrite_with_resume_is_refused(tmp_path: Path) -> None:
    src = good_store(tmp_path)
    before = snapshot(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--overwrite", "--resume")
    assert res.exit_code != 0
    assert isinstance(res.exception, SystemExit)
    assert "Traceback" not in res.output
    assert "--overwrite and --resume exclude each other" in res.stderr
    assert res.stdout == ""
    assert snapshot(tmp_path) == before


def test_overwrite_with_resume_is_one_tsconv_error_line(tmp_path: Path) -> None:
    src = good_store(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--overwrite", "--resume")
    assert_refused(res, "--overwrite and --resume")


# ------------------------------------------------------------------------------------------ devices


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda(tmp_path: Path) -> None:
    src = good_store(tmp_path)
    before = snapshot(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--device", "cuda")
    assert_refused(res, "'cuda'", "no CUDA GPU is available", "--device cpu")
    assert snapshot(tmp_path) == before


def test_weights_too_big_for_memory_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What numpy raises when the memory limit is below the array's size (its _ArrayMemoryError is a
    # MemoryError), without allocating gigabytes here.
    src = good_store(tmp_path)
    np.save(tmp_path / "w.npy", np.ones((4, 3, 2)))
    toml = write_toml(tmp_path, W_TOML)

    def no_memory(*args: object, **kwargs: object) -> np.ndarray:
        raise MemoryError(
            "Unable to allocate 8.00 GiB for an array with shape (1073741824,) and data type float64"
        )

    monkeypatch.setattr(np, "load", no_memory)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--pipeline", toml)
    assert_refused(res, str(toml), "not enough memory to load weights file", "w.npy", "hint: ")
    assert not (tmp_path / "out.zarr").exists()


# ------------------------------------------------------------------------------- damaged input data


def test_corrupt_chunk_in_input(tmp_path: Path) -> None:
    src = write_store(tmp_path / "in.zarr", price_series(ROWS, FEATURES), chunks=(100, FEATURES))
    chunk = src / "values" / "c" / "2" / "0"
    assert chunk.is_file()
    chunk.write_bytes(b"not a zstd frame")
    before = snapshot(src)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr")
    assert_refused(res, str(src))
    assert snapshot(src) == before


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
@pytest.mark.parametrize("zarr_format", [3, 2])
def test_damaged_time_chunk_in_input(tmp_path: Path, file_reads: str, damage: str, zarr_format: int) -> None:
    src = write_store(
        tmp_path / "in.zarr", price_series(ROWS, FEATURES), chunks=(100, FEATURES), zarr_format=zarr_format
    )
    chunk = src / "time" / ("c/1" if zarr_format == 3 else "1")
    assert chunk.is_file()
    data = chunk.read_bytes()
    chunk.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"not a zstd frame" * 4)
    before = snapshot(src)
    needles = [str(src), "'time'", "chunk", "damaged or truncated", "--overwrite"]
    line = assert_refused(invoke("-i", src, "-o", tmp_path / "out.zarr"), *needles)
    assert "rows 100" in line or "chunk 1 " in line  # the damaged chunk is named
    res = CliRunner().invoke(main, ["inspect", str(src)])
    assert_refused(res, *needles)
    assert snapshot(src) == before
    assert not (tmp_path / "out.zarr").exists()


def test_huge_dilation_with_zero_warmup(tmp_path: Path) -> None:
    src = good_store(tmp_path)
    toml = write_toml(tmp_path, '[[conv]]\nfilters = ["diff:1"]\ndilation = 1000000000000\n')
    before = snapshot(src)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--pipeline", toml, "--warmup", "zero")
    assert snapshot(src) == before
    assert_refused(res, "dilation")


@pytest.mark.parametrize("option", [["--chunk", "0"], ["--device", "tpu"], ["--warmup", "maybe"]])
def test_bad_options_get_one_line(tmp_path: Path, option: list[str]) -> None:
    src = good_store(tmp_path)
    before = snapshot(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", *option)
    assert_refused(res, option[0])
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--gpu-mem", "lots"], ["cannot read the memory size 'lots'", "hint:"]),
        (["--gpu-mem", "0"], ["must be at least one byte, got '0' (0 bytes)"]),
        (
            ["--gpu-mem", "0.5"],
            ["must be at least one byte, got '0.5' (0 bytes)", "a bare number counts bytes"],
        ),
        (["--gpu-mem", "infGB"], ["cannot read the memory size 'infGB'"]),
        (["--gpu-mem", "1e400"], ["cannot read the memory size '1e400'"]),
        (["--transfer", "carrier-pigeon"], ["carrier-pigeon"]),
        (["--decode", "fpga"], ["fpga"]),
    ],
)
def test_bad_gpu_options(tmp_path: Path, args: list[str], needles: list[str]) -> None:
    src = write_store(tmp_path / "in.zarr", price_series(300, 2))
    res = invoke("--input", src, "--output", tmp_path / "out.zarr", "--device", "cpu", *args)
    if args[0] in ("--transfer", "--decode"):  # click's own choice check: usage error, exit 2, no traceback
        assert res.exit_code == 2 and "Traceback" not in res.output and needles[0] in res.output
    else:
        assert_refused(res, *needles)
    assert not (tmp_path / "out.zarr").exists()


def test_compression_for_a_parquet_output_is_refused(tmp_path: Path) -> None:
    src = good_store(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "out.parquet", "--compression", "lz4")
    assert_refused(res, "compression='lz4' does not apply to a Parquet output")
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_the_compression_asked_for_is_used_and_reported(tmp_path: Path, compression: str) -> None:
    import json

    src = good_store(tmp_path)
    report = tmp_path / "report.json"
    res = CliRunner().invoke(main, ["process", "-i", str(src), "-o", str(tmp_path / "out.zarr"), "-q",
                                    "--device", "cpu", "--compression", compression, "--report", str(report)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(report.read_text())["compression"] == compression
    codecs = zarr.open_group(str(tmp_path / "out.zarr"), mode="r")["values"].metadata.codecs
    assert [int(c.clevel) for c in codecs if hasattr(c, "clevel")] == [0 if compression == "none" else 5]


@pytest.mark.parametrize(
    "raised",
    [
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 92.00 MiB"),
        RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
    ],
)
def test_gpu_memory_taken_by_another_process_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raised: RuntimeError
) -> None:
    """A GPU whose memory another process holds fails at the CUDA context or the first allocation: one
    line that says so and what to do, not CUDA's traceback (the H200 gave a traceback before)."""
    import tsconv.engine.api as api

    src = good_store(tmp_path)

    def fail(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise raised

    monkeypatch.setattr(api, "to_zarr", fail)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--device", "cpu")
    line = assert_refused(res, "GPU has too little free memory", "nvidia-smi")
    assert "out of memory" in line.lower()


def test_other_cuda_errors_keep_their_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a shortage a user can act on becomes one line: a kernel fault is a bug and keeps its traceback."""
    import tsconv.engine.api as api

    src = good_store(tmp_path)
    monkeypatch.setattr(
        api,
        "to_zarr",
        lambda *a, **k: (_ for _ in ()).throw(
            RuntimeError("CUDA error: an illegal memory access was encountered")
        ),
    )
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--device", "cpu")
    assert isinstance(res.exception, RuntimeError) and "illegal memory access" in str(res.exception)


@pytest.mark.parametrize("name", ["feats.csv", "feats.txt", "out.zarr.bak"])
def test_an_output_of_no_format_tsconv_writes_is_refused_before_the_engine_loads(
    tmp_path: Path, name: str
) -> None:
    src = good_store(tmp_path)
    p = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tsconv", "process", "-i", str(src), "-o", str(tmp_path / name)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    imported = {
        line.split("|")[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")
    }
    errors = [line for line in p.stderr.splitlines() if not line.startswith("import time:")]
    assert p.returncode == 2 and len(errors) == 1, p.stderr[-2000:]
    assert (
        f"output '{tmp_path / name}' names no format tsconv writes" in errors[0] and ".parquet" in errors[0]
    )
    assert "torch" not in imported and not (tmp_path / name).exists()
    import tsconv

    with pytest.raises(tsconv.TsconvError, match="names no format tsconv writes"):
        tsconv.process(src, tmp_path / name)


@pytest.mark.parametrize(
    ("args", "advice"),
    [
        (["process", "-i", "in.zarr", "-o", "out.zarr"], "rerun with --resume"),
        (["process", "-i", "in.zarr", "-o", "out.zarr", "--update"], "rerun with --update"),
        (
            ["process", "-i", "in.zarr", "-o", "out.parquet"],
            "the Parquet file was not written: rerun the command",
        ),
        # .pq is Parquet too: it said "rerun with --resume", which a Parquet output refuses
        (
            ["process", "-i", "in.zarr", "--output=out.PQ"],
            "the Parquet file was not written: rerun the command",
        ),
        # click's other spellings of -o: they said "rerun with --resume", which a Parquet output refuses
        (
            ["process", "-i", "in.zarr", "-oout.parquet"],
            "the Parquet file was not written: rerun the command",
        ),
        (
            ["process", "-i", "in.zarr", "-qo", "out.parquet"],
            "the Parquet file was not written: rerun the command",
        ),
        # --resume beside --overwrite is refused
        (
            ["process", "-i", "in.zarr", "-o", "out.zarr", "--overwrite"],
            "rerun with --resume in place of --overwrite",
        ),
        (["ingest", "a.csv", "-o", "s.zarr"], "no store was made"),
        (["ingest", "a.csv", "-o", "s.zarr", "--append"], "`tsconv repair STORE`"),
    ],
)
def test_ctrl_c_says_what_to_do_for_the_command_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], advice: str
) -> None:
    # every command had said "rerun with --resume", which ingest and a Parquet output do not take
    import tsconv.engine.api
    import tsconv.io.ingest

    def stop(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tsconv.engine.api, "process", stop)
    monkeypatch.setattr(tsconv.io.ingest, "ingest", stop)
    monkeypatch.chdir(tmp_path)
    good_store(tmp_path)
    (tmp_path / "a.csv").write_text("time,feature,value\n2026-01-01T00:00:00,a,1\n")
    res = CliRunner().invoke(main, [*args, "-q"])
    assert res.exit_code == 130 and "Traceback" not in res.output
    assert f"interrupted; {advice}" in res.stderr


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("rows_done", "abc", "its tsconv attributes are damaged (tsconv.rows_done='abc')"),
        ("rows", "abc", "its tsconv attributes are damaged (tsconv.rows='abc')"),
        ("rows_done", 10**30, "beyond its"),
        (
            "digest",
            {"version": 1, "arrays": "x"},
            "its input digest (values/.tsconv-input.json) is missing or unreadable",
        ),
    ],
)
def test_an_output_with_damaged_bookkeeping_is_refused_in_one_line(
    tmp_path: Path, key: str, value: object, needle: str
) -> None:
    # these had ended in ValueError, IndexError or AttributeError tracebacks
    src = good_store(tmp_path)
    out = tmp_path / "out.zarr"
    assert invoke("-i", src, "-o", out, "--device", "cpu").exit_code == 0
    if key == "digest":
        (out / "values" / ".tsconv-input.json").write_text(json.dumps(value))
        flag = "--update"
    else:
        g = zarr.open_group(str(out), mode="r+")
        g.attrs["tsconv"] = {**g.attrs["tsconv"], key: value, "complete": False}
        flag = "--resume"
    res = invoke("-i", src, "-o", out, "--device", "cpu", flag)
    assert_refused(res, needle, "hint: use --overwrite")


def test_an_output_under_a_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    # it had failed at the lock file with "File exists" and a hint about write access
    src = good_store(tmp_path)
    (tmp_path / "afile").write_text("not a folder")
    before = snapshot(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "afile" / "x.zarr")
    assert_refused(
        res, f"{str(tmp_path / 'afile')!r} is a file, not a folder", "hint: choose an --output in a folder"
    )
    assert snapshot(tmp_path) == before


def _damaged_store(root: Path, how: str) -> Path:
    src = write_store(root / "in.zarr", price_series(300, 2))
    meta = src / "values" / "zarr.json"
    if how == "not json":
        meta.write_text("{bad json")
        return src
    doc = json.loads(meta.read_text())
    if how == "negative shape":
        doc["shape"] = [-5, 2]
    elif how == "zero chunks":
        doc["chunk_grid"]["configuration"]["chunk_shape"] = [0, 2]
    elif how == "huge chunk":  # no chunk file: read as fill values, a chunk at a time
        doc["shape"] = doc["chunk_grid"]["configuration"]["chunk_shape"] = [1_000_000, 100_000]
    elif how == "billion features":
        doc["shape"] = [300, 1_000_000_000]
    elif how in ("control character", "empty name"):
        group = json.loads((src / "zarr.json").read_text())
        group["attributes"]["features"] = ["a\nb", "c\x1b[31m"] if how == "control character" else ["a", ""]
        (src / "zarr.json").write_text(json.dumps(group))
        return src
    meta.write_text(json.dumps(doc))
    return src


@pytest.mark.parametrize(
    ("how", "needle"),
    [
        ("not json", "an array's metadata cannot be read (JSONDecodeError"),
        ("negative shape", "an array's metadata cannot be read (ValueError"),
        ("zero chunks", "declares chunks [0, 2]; each must be at least 1"),
        ("huge chunk", "of 372.5 GiB decoded; tsconv reads chunks of at most 2 GiB"),
        ("billion features", "values declare 1,000,000,000 features; tsconv reads at most 1,048,576"),
        ("control character", "feature name 'a\\nb' holds a control character"),
        ("empty name", "feature 1 has an empty name"),  # polars renamed it column_1 in iter_chunks
    ],
)
def test_a_damaged_store_is_refused_in_one_line(tmp_path: Path, how: str, needle: str) -> None:
    src = _damaged_store(tmp_path, how)
    assert_refused(invoke("-i", src, "-o", tmp_path / "out.zarr", "--device", "cpu"), needle)
    assert_refused(CliRunner().invoke(main, ["inspect", str(src)]), needle)


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ('[[conv]]\nweights = "w.npy\\u0000x"\n', "holds a NUL character"),
        ('[[conv]]\nfilters = ["ma:' + "9" * 5000 + '"]\n', "unknown filter"),
        ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "nest too deeply"),
    ],
    ids=["nul", "digits", "nesting"],
)
def test_a_hostile_pipeline_file_is_refused_in_one_line(tmp_path: Path, toml: str, needle: str) -> None:
    src = write_store(tmp_path / "in.zarr", price_series(300, 2))
    pipe = tmp_path / "p.toml"
    pipe.write_text(toml)
    assert_refused(
        invoke("-i", src, "-o", tmp_path / "out.zarr", "--pipeline", pipe, "--device", "cpu"), needle
    )


def test_a_scheduler_address_dask_cannot_parse_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    src = write_store(tmp_path / "in.zarr", price_series(300, 2))
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--scheduler", "garbage", "--device", "cpu")
    assert_refused(res, "cannot reach the dask scheduler at 'garbage'")


def test_a_scheduler_address_where_another_service_answers_is_refused_in_one_line(tmp_path: Path) -> None:
    # dask read an HTTP server's reply as a frame length and failed allocating exabytes: a traceback
    pytest.importorskip("distributed")
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    try:
        src = write_store(tmp_path / "in.zarr", price_series(300, 2))
        address = f"tcp://127.0.0.1:{port}"
        res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--scheduler", address, "--device", "cpu")
        assert_refused(res, f"cannot reach the dask scheduler at '{address}'")
    finally:
        server.close()


def test_a_scheduler_address_that_accepts_and_never_answers_is_refused_in_time(
    tmp_path: Path, monkeypatch
) -> None:
    # dask's timeout covers the connection, not the handshake: a silent port held the command for good
    pytest.importorskip("distributed")
    import socket

    from tsconv.engine import distributed

    monkeypatch.setattr(distributed, "CONNECT_TIMEOUT_S", 3.0)
    server = socket.create_server(("127.0.0.1", 0))  # the kernel accepts into its backlog; nothing answers
    try:
        src = write_store(tmp_path / "in.zarr", price_series(300, 2))
        address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
        res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--scheduler", address, "--device", "cpu")
        assert_refused(res, f"cannot reach the dask scheduler at '{address}': no answer within 3 s")
        res = invoke(
            "-i", src, "-o", tmp_path / "out.zarr", "--scheduler", "ucx://127.0.0.1:1", "--device", "cpu"
        )
        assert_refused(res, "cannot reach the dask scheduler at 'ucx://127.0.0.1:1'")
    finally:
        server.close()


def test_more_workers_than_a_local_cluster_starts_are_refused_at_once(tmp_path: Path) -> None:
    """--workers 100000 on 2 cores had dask create worker directories until the run was killed."""
    from tsconv.engine.cluster import max_workers

    src = write_store(tmp_path / "in.zarr", price_series(300, 2))
    before = snapshot(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--workers", max_workers() + 1, "--device", "cpu")
    assert_refused(
        res, f"workers={max_workers() + 1:,} is more than a local cluster starts here", "--scheduler"
    )
    assert snapshot(tmp_path) == before


def test_a_report_in_a_folder_that_cannot_be_written_is_refused_before_the_run(tmp_path, monkeypatch) -> None:
    """Found only after the whole run had written its output (a read-only mount)."""
    src = write_store(tmp_path / "in.zarr", price_series(300, 2))
    (tmp_path / "ro").mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path / "ro" else real(p, mode))
    res = invoke(
        "-i", src, "-o", tmp_path / "out.zarr", "--report", tmp_path / "ro" / "r.json", "--device", "cpu"
    )
    assert_refused(res, "cannot be written")
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize(
    "exc",
    [
        MemoryError("Unable to allocate 916. MiB for an array with shape (2000, 3, 20000) and data type float64"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                     "you tried to allocate 960000000 bytes. Error code 12 (Cannot allocate memory)"),
    ],
)  # fmt: skip
def test_running_out_of_host_memory_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc) -> None:  # noqa: ANN001
    # a pipeline whose weights loaded but whose copies did not fit printed numpy's or torch's traceback
    import tsconv.engine.api as api

    def short(*args: object, **kwargs: object) -> None:
        raise exc

    monkeypatch.setattr(api, "process", short)
    res = invoke("-i", good_store(tmp_path), "-o", tmp_path / "out.zarr")
    assert_refused(res, "out of host memory", "smaller --chunk")
    monkeypatch.setattr(api, "process", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    assert isinstance(
        invoke("-i", good_store(tmp_path, name="b.zarr"), "-o", tmp_path / "o.zarr").exception, RuntimeError
    )


def test_the_report_is_written_before_the_summary_line(tmp_path: Path) -> None:
    # a closed stdout (`tsconv process ... --report r.json | head -0`) ended the command at the summary line,
    # and the report a batch job reads was never written
    import subprocess
    import sys

    src = good_store(tmp_path)
    code = (
        "import sys; from tsconv.cli import main\n"
        "sys.stdout.close()\n"  # as a pipe whose reader has gone
        "main([*sys.argv[1:]], prog_name='tsconv')\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code, "process", "-i", str(src), "-o", str(tmp_path / "o.zarr"), "--device", "cpu",
         "-q", "--report", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (tmp_path / "r.json").is_file(), res.stderr
    assert json.loads((tmp_path / "r.json").read_text())["rows"] == ROWS


def test_a_mistyped_command_names_the_help_to_read() -> None:
    res = CliRunner().invoke(main, ["proces", "-i", "x.zarr"])
    assert "(see `tsconv --help`)" in res.stderr


def test_a_report_named_dash_is_refused_not_written_as_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    res = invoke("-i", good_store(tmp_path), "-o", tmp_path / "out.zarr", "--report", "-")
    assert_refused(res, "--report '-': name a file")
    assert not (tmp_path / "-").exists() and not (tmp_path / "out.zarr").exists()


def test_a_report_or_figure_at_a_url_is_refused_not_written_under_a_folder_named_s3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Path("s3://bkt/r/run.json") is the relative 's3:/bkt/r/run.json': written there where such a folder was
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s3:" / "bkt" / "r").mkdir(parents=True)
    src = good_store(tmp_path)
    res = invoke("-i", src, "-o", tmp_path / "out.zarr", "--report", "s3://bkt/r/run.json", "--device", "cpu")
    assert_refused(res, "--report 's3://bkt/r/run.json' is a URL", "--report run.json")
    res = CliRunner().invoke(main, ["plot", str(src), "-f", "*", "-o", "s3://bkt/r/fig.png"])
    assert_refused(res, "--output 's3://bkt/r/fig.png' is a URL", "local file")
    assert not any((tmp_path / "s3:").rglob("*.*")) and not (tmp_path / "out.zarr").exists()


def test_an_empty_report_name_is_refused_before_the_run(tmp_path: Path) -> None:
    # `--report "$REPORT"` with REPORT unset: the run ended with exit 0 and no report, and no error
    res = invoke("-i", good_store(tmp_path), "-o", tmp_path / "out.zarr", "--report", "", "--device", "cpu")
    assert_refused(res, "Invalid value for '--report': '' names no path", "variable")
    assert res.exit_code == 2 and not (tmp_path / "out.zarr").exists()


def test_an_empty_path_is_refused_not_taken_for_the_current_directory(tmp_path: Path, monkeypatch) -> None:
    # `-o "$OUT"` with OUT unset: '' is the current directory, so `tsconv process -o '' --overwrite` run from inside
    # a store replaced it, exit 0; every path option refuses '' before anything is read or written
    src = good_store(tmp_path)
    job = tmp_path / "job"
    job.mkdir()
    (job / "keep.txt").write_text("the job's own file")
    monkeypatch.chdir(job)
    before = snapshot(job)
    for args in (
        ["process", "-i", str(src), "-o", "", "--overwrite", "--device", "cpu", "-q"],
        ["process", "-i", "", "-o", str(tmp_path / "out.zarr"), "--device", "cpu", "-q"],
        ["ingest", str(tmp_path / "missing.csv"), "-o", ""],
        ["inspect", ""],
    ):
        res = CliRunner().invoke(main, args)
        assert_refused(res, "'' names no path", "variable")
        assert res.exit_code == 2, args
    assert snapshot(job) == before and not (tmp_path / "out.zarr").exists()


def test_a_report_that_cannot_be_written_names_it_after_the_summary(tmp_path: Path) -> None:
    # --report /dev/full printed only "[Errno 28] No space left on device", no file named and no summary line
    full = Path("/dev/full")
    if not full.exists():
        pytest.skip("no /dev/full here")
    res = invoke("-i", good_store(tmp_path), "-o", tmp_path / "out.zarr", "--report", full, "--device", "cpu")
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert f"{ROWS:,} rows x {FEATURES} features" in res.stdout
    line = res.stderr.strip()
    assert line.startswith(
        "tsconv: error: --report '/dev/full' could not be written (No space left on device)"
    )
    assert "the output" in line and "is complete" in line and "hint:" in line
    assert zarr.open_group(tmp_path / "out.zarr", mode="r").attrs["tsconv"]["complete"]


def test_a_report_cut_short_by_a_full_disk_leaves_the_previous_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the report was written in place: a disk that filled mid-write left half a JSON file where a batch
    # job's previous, whole report had been
    report = tmp_path / "report.json"
    report.write_text('{"previous": true}\n')
    real = Path.write_text

    def half_then_full(self: Path, text: str, *args: object, **kwargs: object) -> int:
        if self.parent == tmp_path and text.startswith("{"):
            real(self, text[: len(text) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", half_then_full)
    res = invoke(
        "-i", good_store(tmp_path), "-o", tmp_path / "out.zarr", "--report", report, "--device", "cpu"
    )
    assert res.exit_code == 2 and "could not be written (No space left on device)" in res.stderr
    assert report.read_text() == '{"previous": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.zarr", "out.zarr", "report.json"]
    monkeypatch.undo()
    res = invoke("-i", good_store(tmp_path / "again"), "-o", tmp_path / "out2.zarr", "--report", report,
                 "--device", "cpu")  # fmt: skip
    assert res.exit_code == 0 and json.loads(report.read_text())["rows"] == ROWS


def test_an_output_name_too_long_for_the_files_beside_it_is_refused_up_front(tmp_path: Path) -> None:
    # a 241-byte Parquet name is legal, but its temporary ".<name>.tsconv-<pid>.tmp" is not: pyarrow's raw
    # "File name too long" named a file the user never gave
    src = tmp_path / "in.zarr"
    write_store(src, price_series(64, 2, seed=1), chunks=(64, 2))
    name = "a" * 233 + ".parquet"
    res = CliRunner().invoke(
        main, ["process", "-i", str(src), "-o", str(tmp_path / name), "--device", "cpu", "-q"]
    )
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "the output's name is 241 bytes" in res.output and "at most 235 bytes" in res.output
    ok = "a" * 227 + ".parquet"
    res = CliRunner().invoke(
        main, ["process", "-i", str(src), "-o", str(tmp_path / ok), "--device", "cpu", "-q"]
    )
    assert res.exit_code == 0, res.output
