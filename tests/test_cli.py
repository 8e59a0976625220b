"""The command line on good input: demo, process with a report, inspect, python -m tsconv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from tsconv.cli import main

from .helpers import price_series, read_output, write_store


def test_demo_creates_the_store_then_processes_it(tmp_path: Path) -> None:
    runner = CliRunner()
    args = [
        "demo",
        "--rows",
        "3000",
        "--features",
        "6",
        "--dir",
        str(tmp_path),
        "-q",
        "--report",
        str(tmp_path / "r.json"),
    ]
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "creating" in res.output and "3,000 rows x 6 features -> 30 features" in res.output
    out = zarr.open_group(str(tmp_path / "ticks-3000x6.features.zarr"), mode="r")
    assert out["values"].shape == (3000, 30) and out.attrs["tsconv"]["complete"]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["rows"] == 3000 and report["features_out"] == 30 and report["rows_per_s"] > 0
    again = runner.invoke(main, args)  # the store exists now: reused, output replaced
    assert again.exit_code == 0 and "creating" not in again.output


def test_process_then_inspect(tmp_path: Path) -> None:
    x = price_series(4000, 3, seed=0, nan_fraction=0.05)
    src = write_store(tmp_path / "in.zarr", x, chunks=(1500, 2))
    runner = CliRunner()
    res = runner.invoke(
        main, ["process", "-i", str(src), "-o", str(tmp_path / "o.zarr"), "--chunk", "512", "-q"]
    )
    assert res.exit_code == 0, res.output
    assert "4,000 rows x 3 features -> 15 features" in res.output
    res = runner.invoke(main, ["inspect", str(src), "--json"])
    info = json.loads(res.output)
    assert info["rows"] == 4000 and info["features"] == ["x0", "x1", "x2"] and info["chunks"] == [1500, 2]
    assert info["nan_total"] == int(np.isnan(x).sum())
    assert info["nan_counts"]["x1"] == int(np.isnan(x[:, 1]).sum())
    assert info["time_span"].startswith("2026-01-02T09:30:00")
    # zarr's default codec (zstd): the threaded reader, not the GPU decoder
    assert info["reader"].startswith("tsconv's native reader")
    assert info["gpu_decoding"].startswith("no: on CUDA, chunks are decoded on the CPU")
    assert "not Blosc-compressed" in info["gpu_decoding"]
    text = runner.invoke(main, ["inspect", str(tmp_path / "o.zarr")]).output
    assert "tsconv output: complete" in text and "4,000 rows x 15 features, float32" in text
    assert "warm-up NaNs" in text and "NaNs: none in the data\n" in text


def test_process_with_a_built_in_pipeline_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = write_store(tmp_path / "in.zarr", price_series(600, 2, seed=1))
    monkeypatch.chdir(tmp_path)  # no pipelines/ folder here: the name finds the shipped file
    res = CliRunner().invoke(
        main, ["process", "-i", str(src), "-o", "o.zarr", "--pipeline", "trend_ema", "-q"]
    )
    assert res.exit_code == 0, res.output
    out = zarr.open_group("o.zarr", mode="r")
    assert out.attrs["pipeline"]["name"] == "trend_ema" and out["values"].shape == (600, 16)


def test_process_writes_a_markdown_report_for_a_md_name(tmp_path: Path) -> None:
    src = write_store(tmp_path / "in.zarr", price_series(600, 2, seed=2))
    out, md = tmp_path / "o.zarr", tmp_path / "Summary.MD"
    res = CliRunner().invoke(
        main,
        ["process", "-i", str(src), "-o", str(out), "--pipeline", "trend_ema", "-q", "--report", str(md)],
    )
    assert res.exit_code == 0, res.output
    text = md.read_text()
    assert text.startswith("# tsconv run\n")
    cells = dict(
        line.strip("|").split(" | ", 1)
        for line in text.splitlines()
        if line.startswith("| ") and " | " in line
    )
    cells = {k.strip(): v.strip() for k, v in cells.items()}
    assert cells["input"] == f"`{src.resolve()}`" and cells["output"] == f"`{out.resolve()}`"
    assert cells["pipeline"] == "trend_ema"
    assert cells["rows"] == "600 of 600" and cells["features"] == "2 in, 16 out"
    assert float(cells["seconds"]) > 0 and int(cells["rows/s"].replace(",", "")) > 0
    assert cells["device"].startswith("cpu") and cells["peak GPU memory"] == "not measured (CPU run)"
    assert cells["peak RSS"].endswith(" MiB")
    json_report = tmp_path / "r.json"  # any other name: JSON, as before, now naming the pipeline too
    res = CliRunner().invoke(
        main, ["process", "-i", str(src), "-o", str(out), "--overwrite", "-q", "--report", str(json_report)]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(json_report.read_text())["pipeline"] == "default"


def test_python_dash_m_runs_the_cli() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "tsconv", "--help"], capture_output=True, text=True, check=True
    )
    assert "process" in res.stdout and "inspect" in res.stdout and "demo" in res.stdout


_RUN = """
import atexit, sys
from tsconv import cli

def main():
    atexit.register(lambda: open(sys.argv[1], "w").write("ran"))  # a command's cleanup
    for i in range(1000):  # 3.9 KB, under the buffer of a pipe's stdout: none written yet
        print(i)
    if sys.argv[2] == "raise":
        raise RuntimeError("a bug")
    sys.exit(int(sys.argv[2]))

cli.main = main
cli.run()
"""


@pytest.mark.parametrize("how", ["0", "3", "raise"])
def test_the_command_exits_fast_with_its_code_after_its_cleanups(tmp_path: Path, how: str) -> None:
    """run() skips the interpreter's teardown, not the atexit handlers, the buffered output or the code."""
    marker = tmp_path / "cleanup"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered, as by default
    res = subprocess.run(
        [sys.executable, "-c", _RUN, str(marker), how], capture_output=True, text=True, env=env
    )
    assert res.stdout.split() == [str(i) for i in range(1000)]
    assert marker.read_text() == "ran"
    if how == "raise":  # a bug: the interpreter's own traceback and exit
        assert res.returncode == 1 and "RuntimeError: a bug" in res.stderr
    else:
        assert res.returncode == int(how) and res.stderr == ""


def test_a_reader_closing_the_pipe_ends_the_command_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    """`tsconv filters | head -1`: the write into the closed pipe ends the run like SIGPIPE, no error line."""
    import tsconv.cli as cli

    def closed(*args: object, **kw: object) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli.click, "echo", closed)
    res = CliRunner().invoke(main, ["filters"])
    assert res.exit_code == 141
    assert "error" not in res.output


@pytest.mark.parametrize("args", [["--version"], ["-h"]])
def test_the_groups_own_options_end_quietly_on_a_closed_pipe_and_in_one_line_on_a_full_disk(
    args: list[str],
) -> None:
    """`tsconv --version | head -0` exited 1 (click's own handling), and `tsconv -h >/dev/full` printed a
    traceback: the group's options act before a command runs, outside its error handling."""
    command = [sys.executable, "-m", "tsconv", *args]
    read, write = os.pipe()
    os.close(read)  # a reader that has gone: the first write fails with EPIPE
    try:
        res = subprocess.run(command, stdout=write, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert (res.returncode, res.stderr) == (141, "")
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        res = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.splitlines() == ["tsconv: error: [Errno 28] No space left on device"]


def test_an_unknown_option_of_the_group_is_one_line() -> None:
    # click printed "Usage: ...", "Try 'tsconv --help' for help." and "Error: ..." on three lines
    res = CliRunner().invoke(main, ["--bogus"])
    assert res.exit_code == 2
    assert res.stderr.splitlines() == ["tsconv: error: No such option '--bogus'. (see `tsconv --help`)"]


def test_filters_lists_every_built_in_filter() -> None:
    from tsconv.pipeline.filters import FILTER_KINDS, parse_filter

    res = CliRunner().invoke(main, ["filters"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split() == ["filter", "taps", "warm-up", "meaning"]
    for syntax in ("ma:W", "diff:L", "dev:W", "ema:S[:K]", "std:W", "zscore:W", "lag:L", "ret:L", "id"):
        assert any(line.startswith(syntax + " ") for line in lines[1:10]), syntax
    assert "mean of the last W values" in res.output and "1 to 65,536" in res.output
    rows = json.loads(CliRunner().invoke(main, ["filters", "--json"]).output)
    assert [r["kind"] for r in rows] == list(FILTER_KINDS)
    for r in rows:  # every example is a filter a pipeline may name, of the kind it documents
        assert r["example"].split(":")[0] == r["kind"] and parse_filter(r["example"]).size >= 1


def test_pipelines_lists_the_built_ins_and_each_runs_by_name() -> None:
    from tsconv.pipeline.spec import builtin_descriptions, load_pipeline

    res = CliRunner().invoke(main, ["pipelines"])
    assert res.exit_code == 0, res.output
    names = ["default", "dense_head", "multiscale", "returns_zscore", "trend_ema"]
    assert [line.split()[0] for line in res.output.splitlines()[: len(names)]] == names
    assert builtin_descriptions()["default"] in res.output
    rows = json.loads(CliRunner().invoke(main, ["pipelines", "--json"]).output)
    assert [r["name"] for r in rows] == names
    for r in rows:
        assert Path(r["path"]).is_file() and r["description"]
        assert load_pipeline(r["name"]).name == r["name"]


def test_version_needs_no_distribution_metadata() -> None:
    import tsconv

    # the distribution is tsconv-features; the version comes from the package itself
    res = CliRunner().invoke(main, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"tsconv, version {tsconv.__version__}"


def test_an_update_with_device_auto_leaves_the_gpu_start_up_to_the_run(tmp_path, monkeypatch):
    """The CLI begins the GPU start-up beside its imports, except for an update or resume with device auto:
    a few rows then run on the CPU, which the threads would only slow."""
    from tsconv.kernels import early

    starts: list[bool] = []
    monkeypatch.setattr(early, "gpu_present", lambda: True)
    monkeypatch.setattr(early, "start", lambda **kw: starts.append(kw.get("cuda", True)))
    src = write_store(tmp_path / "in.zarr", price_series(600, 3, seed=2), chunks=(128, 3))
    out = str(tmp_path / "out.zarr")
    runner = CliRunner()
    res = runner.invoke(main, ["process", "-i", str(src), "-o", out, "-q", "--chunk", "128"])
    assert res.exit_code == 0, res.output
    assert starts == [True]  # a fresh run with device auto on a GPU host: started
    for flag in ("--update", "--resume"):
        res = runner.invoke(main, ["process", "-i", str(src), "-o", out, "-q", "--chunk", "128", flag])
        assert res.exit_code == 0, res.output
    assert starts == [True]
    res = runner.invoke(main, ["process", "-i", str(src), "-o", out, "-q", "--chunk", "128", "--overwrite",
                               "--device", "cpu"])  # fmt: skip
    assert res.exit_code == 0 and starts == [True]


@pytest.mark.parametrize(("workers", "gpus", "cuda"), [(None, ["0"], True), (1, ["0"], True), (1, ["0", "1"], True),
                                                     (2, ["0", "1"], False), (2, ["0"], True)])  # fmt: skip
def test_the_gpu_start_up_begins_beside_the_imports_where_this_process_computes(
    monkeypatch, workers, gpus, cuda
):
    """One GPU's dask worker runs in the command's process, so its CUDA context starts with the command's
    imports as a single process's does; worker processes of several GPUs start their own."""
    from tsconv import cli
    from tsconv.engine import cluster
    from tsconv.kernels import early

    starts: list[bool] = []
    monkeypatch.setattr(early, "gpu_present", lambda: True)
    monkeypatch.setattr(early, "start", lambda **kw: starts.append(kw.get("cuda", True)))
    monkeypatch.setattr(cluster, "_driver_gpus", lambda: gpus)
    monkeypatch.setattr(cluster, "start_early", lambda *a, **kw: None)
    cli._start_process("in.zarr", None, report_path=None, options={"device": "auto", "workers": workers})
    assert starts == [cuda]


_GC = """
import gc, json, sys
from tsconv import cli
import tsconv.engine.api as api

run = api.process

def process(*args, **kw):
    print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}), file=sys.stderr)
    return run(*args, **kw)

api.process = process
cli.run()
"""


def test_the_command_runs_with_its_imports_frozen_out_of_collections(tmp_path: Path) -> None:
    """`tsconv process` in its own process: the imports' objects are left out of the collector's passes, and
    the collector runs during the computation; a caller's process keeps its collector as it was."""
    import gc

    src = tmp_path / "in.zarr"
    write_store(src, price_series(300, 3, seed=1))
    args = ["process", "-i", str(src), "-o", str(tmp_path / "a.zarr"), "--device", "cpu", "-q"]
    res = subprocess.run([sys.executable, "-c", _GC, *args], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stderr.splitlines()[-1])
    assert seen["enabled"] and seen["frozen"] > 10_000

    frozen = gc.get_freeze_count()
    args[4] = str(tmp_path / "b.zarr")
    assert CliRunner().invoke(main, args).exit_code == 0
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_the_command_does_not_import_cupy_for_zarr(tmp_path: Path) -> None:
    """zarr imports cupy wherever it is installed (GPU buffers, 0.25 s of a fresh process on a GPU machine); the
    command never uses it, so its own process leaves it out, and zarr runs as without cupy."""
    fake = tmp_path / "site" / "cupy"
    fake.mkdir(parents=True)
    marker = tmp_path / "imported"
    (fake / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    src = tmp_path / "in.zarr"
    write_store(src, price_series(300, 3, seed=1))
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])
    )
    probe = subprocess.run([sys.executable, "-c", "import zarr"], env=env, cwd=tmp_path, capture_output=True)
    assert probe.returncode == 0 and marker.exists()  # the fake is what zarr would import
    marker.unlink()
    args = ["process", "-i", str(src), "-o", str(tmp_path / "a.zarr"), "--device", "cpu", "-q"]
    res = subprocess.run(
        [sys.executable, "-m", "tsconv", *args], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert not marker.exists()
    assert read_output(tmp_path / "a.zarr").shape == (300, 15)
