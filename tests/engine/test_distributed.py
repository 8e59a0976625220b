"""Scale-out on dask.distributed: a LocalCluster of 2 worker processes gives the single-process output, bit for bit."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

import tsconv

from ..helpers import price_series, read_output, spy_fill_walks, write_store

distributed = pytest.importorskip("distributed")

# T not a multiple of anything, store chunks (777 rows, features split 3 + 2) not aligned to the engine chunk.
ROWS, FEATURES, CHUNK, PART = 10_007, 5, 128, 1000  # PART -> output chunks of 1024 rows: 10 partitions
DILATED = {
    "conv": [{"filters": ["diff:1", "ma:16", "dev:8"]}, {"filters": ["ma:4", "diff:2"], "dilation": 3}]
}


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x = price_series(ROWS, FEATURES, seed=7, nan_fraction=0.05)
    x[:300, 1] = np.nan  # a feature that starts late
    return write_store(tmp_path_factory.mktemp("dist") / "in.zarr", x, chunks=(777, 3))


@pytest.fixture(scope="module")
def want(src: Path) -> dict[str, Path]:
    """The single-process outputs to compare with."""
    out = {}
    for name, pipe in (("default", None), ("dilated", DILATED)):
        out[name] = src.with_name(f"want-{name}.zarr")
        tsconv.process(src, out[name], pipeline=pipe, chunk=CHUNK)
    return out


def _same(a: Path, b: Path) -> None:
    ga, gb = zarr.open_group(str(a), mode="r"), zarr.open_group(str(b), mode="r")
    assert gb.attrs["tsconv"]["complete"] is True and gb.attrs["tsconv"]["rows_done"] == ROWS
    assert "partitions_done" not in gb.attrs["tsconv"]
    assert np.array_equal(np.asarray(ga["values"][:]), np.asarray(gb["values"][:]), equal_nan=True)
    assert np.array_equal(np.asarray(ga["time"][:]), np.asarray(gb["time"][:]))
    assert ga.attrs["features"] == gb.attrs["features"]
    _opens_with_xarray(b)


def _opens_with_xarray(path: Path) -> None:
    """The output's consolidated metadata holds its arrays' documents as they are, and xarray reads it."""
    import json
    import warnings

    xr = pytest.importorskip("xarray")
    consolidated = json.loads((path / "zarr.json").read_text())["consolidated_metadata"]["metadata"]
    for name in ("values", "time", "feature"):
        assert consolidated[name] == json.loads((path / name / "zarr.json").read_text()), name
    g = zarr.open_group(str(path), mode="r", use_consolidated=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        ds = xr.open_zarr(str(path), consolidated=True)
    assert ds["values"].dims == ("time", "feature")
    assert [str(n) for n in ds["feature"].values] == g.attrs["features"]
    np.testing.assert_array_equal(ds["time"].values.view(np.int64), np.asarray(g["time"][:]))


def _tasks_run(stream) -> list[str]:  # noqa: ANN001
    """The partition tasks that ran (keys tsconv-START-STOP-TOKEN; the scan for first values is another)."""
    return [t["key"] for t in stream.data if re.match(r"tsconv-\d+-\d+-", str(t["key"]))]


@pytest.mark.parametrize("name", ["default", "dilated"])
def test_two_workers_match_single_process(client, src: Path, want: dict[str, Path], name: str) -> None:
    out = src.with_name(f"dist-{name}.zarr")
    with distributed.get_task_stream(client) as ts:
        report = tsconv.process(
            src, out, pipeline=DILATED if name == "dilated" else None, chunk=CHUNK, client=client,
            partition_rows=PART,
        )  # fmt: skip
    assert len(_tasks_run(ts)) == 10
    assert len({t["worker"] for t in ts.data}) == 2  # both workers took part
    assert report.rows == ROWS and report.total_rows == ROWS and "2 dask workers" in report.device
    assert report.peak_rss_bytes > 0
    assert report.step_rows is None and report.decode_note is None  # CPU workers: the chunked engine
    # the tasks' phases add up to (at most) the run, with dispatch and collect the client's share
    st = report.stage_seconds
    assert set(st) == {"task_setup", "task_compute", "task_finish", "dispatch", "collect"}
    assert st["task_compute"] > 0 and all(v >= 0 for v in st.values())
    assert st["dispatch"] + st["collect"] < report.seconds
    assert "stages" not in report.summary()
    assert zarr.open_group(str(out), mode="r")["values"].chunks[0] == 1024
    _same(want[name], out)


class _KillOnce(distributed.WorkerPlugin):
    """Kill the worker process (os._exit) when it starts the task of one partition, the first time only."""

    def __init__(self, flag: str, start: int) -> None:
        self.flag, self.prefix = flag, f"tsconv-{start}-"

    def transition(self, key, start, finish, **kwargs) -> None:  # noqa: ANN001, ANN003
        if finish == "executing" and str(key).startswith(self.prefix) and not os.path.exists(self.flag):
            Path(self.flag).write_text("killed")
            os._exit(1)


def test_a_killed_worker_is_replaced_and_the_output_is_identical(
    client, src: Path, want: dict[str, Path]
) -> None:
    flag = src.with_name("killed.flag")
    client.register_plugin(_KillOnce(str(flag), 3072), name="kill-once")
    try:
        out = src.with_name("dist-killed.zarr")
        report = tsconv.process(src, out, pipeline=DILATED, chunk=CHUNK, client=client, partition_rows=PART)
    finally:
        client.unregister_worker_plugin("kill-once")
    assert flag.exists(), "the fault was not injected"
    assert report.rows == ROWS
    _same(want["dilated"], out)
    client.wait_for_workers(2, timeout=30)


def test_the_only_worker_killed_is_replaced_and_its_lost_tasks_sent_again(
    src: Path, want: dict[str, Path]
) -> None:
    # the plan scattered to it died with it: dask forgot every task that needed it and retried none, and the
    # run ended in a FutureCancelledError traceback
    cluster = distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
    )
    flag = src.with_name("killed-only.flag")
    try:
        with distributed.Client(cluster) as one:
            one.register_plugin(_KillOnce(str(flag), 3072), name="kill-once")
            out = src.with_name("dist-killed-only.zarr")
            report = tsconv.process(src, out, pipeline=DILATED, chunk=CHUNK, client=one, partition_rows=PART)
    finally:
        cluster.close()
    assert flag.exists(), "the fault was not injected"
    assert report.rows == ROWS
    _same(want["dilated"], out)


_KILLING_CLUSTER = """
import os, sys, time, distributed

class KillAlways(distributed.WorkerPlugin):
    # kill the worker whenever it starts partition 0's task (one that needs more memory than a worker has)
    def transition(self, key, start, finish, **kwargs):
        if finish == "executing" and str(key).startswith("tsconv-0-"):
            os._exit(1)

if __name__ == "__main__":
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    distributed.Client(cluster).register_plugin(KillAlways())
    print(cluster.scheduler_address, flush=True)
    sys.stdin.read()
"""


@pytest.mark.slow  # a cluster whose workers die dozens of times: about a minute on 2 cores
def test_a_partition_that_kills_every_worker_ends_in_one_error_not_a_hang(src: Path, tmp_path: Path) -> None:
    # The plan was scattered under a key hashed from its content, the same in every attempt: scattered again
    # after dask had lost it, the scheduler could list it on a worker that had dropped it, and the tasks waited
    # for it for good (4 runs of 6 hung, the scheduler in a process of its own). Each scatter has a key of its own.
    import threading

    script = tmp_path / "cluster.py"
    script.write_text(_KILLING_CLUSTER)
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=tmp_path)  # fmt: skip
    try:
        address = proc.stdout.readline().strip()
        for attempt in range(3):
            failed: list[BaseException] = []

            def go(out: Path = tmp_path / f"o{attempt}.zarr", failed: list[BaseException] = failed) -> None:
                try:
                    tsconv.process(src, out, chunk=CHUNK, client=address, partition_rows=PART, progress=False)
                except BaseException as exc:  # noqa: BLE001 - checked below
                    failed.append(exc)

            thread = threading.Thread(target=go, daemon=True)
            thread.start()
            thread.join(90)
            assert not thread.is_alive(), f"run {attempt + 1} hung"
            # "dask lost the workers ... 3 times", or no worker back in time: one line either way
            assert len(failed) == 1 and isinstance(failed[0], tsconv.TsconvError), failed
    finally:
        proc.stdin.close()
        proc.wait(60)


def test_a_scheduler_without_workers_is_refused_before_the_output_is_made(
    tmp_path: Path, src: Path, monkeypatch
) -> None:  # noqa: ANN001
    from tsconv.engine import distributed as dist

    monkeypatch.setattr(dist, "_WORKERS_WAIT_S", 0.5)
    with distributed.LocalCluster(
        n_workers=0, processes=False, dashboard_address=":0"
    ) as empty, distributed.Client(empty) as none:  # fmt: skip
        with pytest.raises(tsconv.TsconvError, match="has no workers") as err:
            tsconv.process(src, tmp_path / "o.zarr", client=none)
    assert "dask worker ADDRESS" in err.value.hint
    assert not (tmp_path / "o.zarr").exists()


def _interrupt(out: Path, done: list[list[int]]) -> None:
    """Make ``out`` look like a distributed run killed with ``done`` partitions stored."""
    g = zarr.open_group(str(out), mode="r+")
    rows_done = done[0][1] if done and done[0][0] == 0 else 0
    g.attrs["tsconv"] = {
        **g.attrs["tsconv"],
        "complete": False,
        "rows_done": rows_done,
        "partitions_done": done,
    }
    keep = np.zeros(ROWS, dtype=bool)
    for a, b in done:
        keep[a:b] = True
    v = np.asarray(g["values"][:])
    v[~keep] = 12345.0  # garbage where no partition finished
    g["values"][:] = v


def test_resume_runs_only_unfinished_partitions(client, src: Path, want: dict[str, Path]) -> None:
    out = src.with_name("dist-resume.zarr")
    tsconv.process(src, out, pipeline=DILATED, chunk=CHUNK, client=client, partition_rows=PART)
    _interrupt(out, [[0, 2048], [4096, 7168]])
    with pytest.raises(tsconv.TsconvError, match="unfinished"):
        tsconv.open_input(out)
    with distributed.get_task_stream(client) as ts:
        report = tsconv.process(
            src, out, pipeline=DILATED, chunk=CHUNK, client=client, partition_rows=PART, resume=True
        )
    ran = sorted(_tasks_run(ts), key=lambda k: int(k.split("-")[1]))
    assert [k.split("-")[1:3] for k in ran] == [
        ["2048", "3072"], ["3072", "4096"], ["7168", "8192"], ["8192", "9216"], ["9216", "10007"]
    ]  # fmt: skip
    # "resumed at row" the first row not done (it said 5,120: the count of rows done, which is no row here)
    assert report.rows == ROWS - 5120 and report.resumed_from == 2048
    _same(want["dilated"], out)
    # Complete: a further resume does nothing and needs no cluster.
    assert tsconv.process(src, out, pipeline=DILATED, chunk=CHUNK, client=client, resume=True).rows == 0


def test_a_resume_removes_the_killed_workers_temporary_chunk_files(
    client, src: Path, want: dict[str, Path]
) -> None:
    out = src.with_name("dist-resume-partial.zarr")
    tsconv.process(src, out, chunk=CHUNK, client=client, partition_rows=PART)
    _interrupt(out, [[0, 2048], [4096, 7168]])
    # what a worker killed mid-write leaves: its chunk's temporary file, never renamed in
    planted = [out / "values" / "c" / band / "0.0123abcd.partial" for band in ("2", "8")]
    planted.append(out / "zarr.json.0123abcd.partial")  # and a progress update cut short
    for tmp in planted:
        tmp.write_bytes(b"half a chunk")
    tsconv.process(src, out, chunk=CHUNK, client=client, partition_rows=PART, resume=True)
    assert sorted(out.rglob("*.partial")) == []
    _same(want["default"], out)


def test_a_partition_done_in_part_computes_only_the_rest() -> None:
    from tsconv.engine.distributed import missing, partitions

    parts = partitions(10_007, 1024, 3)  # [0, 3072), [3072, 6144), [6144, 9216), [9216, 10007)
    assert missing(parts, []) == parts
    assert missing(parts, [(0, 10_007)]) == []
    # an update's old rows up to an output chunk inside the second partition
    assert missing(parts, [(0, 5120)]) == [(5120, 6144), (6144, 9216), (9216, 10_007)]
    # a resume with holes: partitions split around what an earlier run finished
    assert missing(parts, [(0, 1024), (2048, 4096), (7168, 8192)]) == [
        (1024, 2048), (4096, 6144), (6144, 7168), (8192, 9216), (9216, 10_007)
    ]  # fmt: skip


def test_single_process_resume_of_a_distributed_run(client, src: Path, want: dict[str, Path]) -> None:
    out = src.with_name("dist-then-single.zarr")
    tsconv.process(src, out, chunk=CHUNK, client=client, partition_rows=PART)
    _interrupt(out, [[0, 3072], [5120, 6144]])
    report = tsconv.process(src, out, chunk=CHUNK, resume=True)  # recomputes everything after rows_done
    assert report.resumed_from == 3072 and report.rows == ROWS - 3072
    _same(want["default"], out)


def test_distributed_resume_of_a_single_process_run(client, src: Path, want: dict[str, Path]) -> None:
    out = src.with_name("single-then-dist.zarr")
    tsconv.process(src, out, chunk=CHUNK)
    g = zarr.open_group(str(out), mode="r+")
    chunk_rows = int(g["values"].chunks[0])
    assert chunk_rows >= ROWS  # one output chunk: nothing is done before it
    g.attrs["tsconv"] = {**g.attrs["tsconv"], "complete": False, "rows_done": 0}
    report = tsconv.process(src, out, chunk=CHUNK, client=client, resume=True)
    assert report.rows == ROWS
    _same(want["default"], out)


def _output_of_a_grown_input(client, tmp_path: Path) -> tuple[Path, Path]:  # noqa: ANN001
    """The module's input, its first 6,001 rows computed by dask into an output, then grown to all of them:
    (input, output)."""
    from ..helpers import T0

    x = price_series(ROWS, FEATURES, seed=7, nan_fraction=0.05)
    x[:300, 1] = np.nan
    src = write_store(tmp_path / "in.zarr", x[:6001], chunks=(777, 3))
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK, client=client, partition_rows=PART)
    g = zarr.open_group(str(src), mode="r+")
    g["values"].resize((ROWS, FEATURES))
    g["values"][6001:] = x[6001:]
    g["time"].resize((ROWS,))
    g["time"][6001:] = T0 + np.arange(6001, ROWS, dtype=np.int64) * 1_000_000
    return src, out


def test_distributed_update_computes_the_new_partitions_only(
    client, tmp_path: Path, want: dict[str, Path]
) -> None:
    src, out = _output_of_a_grown_input(client, tmp_path)
    with distributed.get_task_stream(client) as ts:
        report = tsconv.process(src, out, chunk=CHUNK, client=client, partition_rows=PART, update=True)
    assert (report.updated_from, report.resumed_from) == (6001, 5120)
    ran = sorted(_tasks_run(ts), key=lambda k: int(k.split("-")[1]))
    assert [k.split("-")[1] for k in ran] == ["5120", "6144", "7168", "8192", "9216"]
    _same(want["default"], out)
    assert tsconv.process(src, out, chunk=CHUNK, client=client, update=True).rows == 0


@pytest.mark.parametrize("resized", [(), ("values",)], ids=["no-array-extended", "values-extended-not-time"])
def test_a_distributed_run_finishes_an_update_killed_inside_its_grow(
    client, tmp_path: Path, want: dict[str, Path], monkeypatch: pytest.MonkeyPatch, resized: tuple[str, ...]
) -> None:
    """An update marks its target rows, then extends each array: killed between, the next run extends them
    (a dask client too, which had failed on the values' old shape, or marked the output complete with a time
    column of the old rows, silently)."""
    import tsconv.io.writers.zarr_writer as zw

    src, out = _output_of_a_grown_input(client, tmp_path)

    class Killed(BaseException):
        pass

    def killed(path, rows):  # noqa: ANN001, ANN202
        for name in resized:
            doc = zw._read_doc(path, f"{name}/zarr.json")
            doc["shape"][0] = rows
            zw._write_doc(path, f"{name}/zarr.json", doc)
        raise Killed

    monkeypatch.setattr(zw, "_resize_arrays", killed)
    with pytest.raises(Killed):
        tsconv.process(src, out, chunk=CHUNK, update=True)
    monkeypatch.undo()
    tsconv.process(src, out, chunk=CHUNK, client=client, partition_rows=PART, update=True)
    _same(want["default"], out)


@pytest.mark.parametrize(
    "pipeline",
    [None, {"preprocess": {"select": ["x1", "x2", "x4"]}, "conv": [{"filters": ["diff:1", "dev:8"]}]}],
    ids=["default", "three-columns-selected"],
)
def test_a_distributed_update_hands_the_recorded_fill_state_to_its_tasks(
    client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pipeline: object
) -> None:
    """A symbol with no value yet sent every task's walk for its start's fill state back to row 0 (each
    task decoding all the input before it). A dask run now records the fill state at its end, as a single
    process does; an update's tasks get it and stop their walks at the old end; the output is a full run's."""
    import json

    from ..helpers import T0

    x = price_series(ROWS, FEATURES, seed=9, nan_fraction=0.02)
    x[:, 2] = np.nan  # listed, not trading
    src = write_store(tmp_path / "in.zarr", x[:6001], chunks=(777, 3))
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, pipeline=pipeline, chunk=CHUNK, client=client, partition_rows=PART)
    rec = json.loads((out / "values" / ".tsconv-input.json").read_text())["fill"]
    cols = [1, 2, 4] if pipeline else list(range(FEATURES))  # one value per selected feature
    assert rec["row"] == 6001 and len(rec["state"]) == len(cols) and rec["state"][cols.index(2)] is None
    assert rec["state"][0] == float(x[:6001, cols[0]][~np.isnan(x[:6001, cols[0]])][-1])
    g = zarr.open_group(str(src), mode="r+")
    g["values"].resize((ROWS, FEATURES))
    g["values"][6001:] = x[6001:]
    g["time"].resize((ROWS,))
    g["time"][6001:] = T0 + np.arange(6001, ROWS, dtype=np.int64) * 1_000_000
    handed: list[object] = []
    real_submit = client.submit
    monkeypatch.setattr(
        client, "submit", lambda *a, **kw: (handed.append(kw.get("fill")), real_submit(*a, **kw))[1]
    )
    tsconv.process(src, out, pipeline=pipeline, chunk=CHUNK, client=client, partition_rows=PART, update=True)
    monkeypatch.undo()
    assert len(handed) == 5 and all(f == rec for f in handed), handed
    assert json.loads((out / "values" / ".tsconv-input.json").read_text())["fill"]["row"] == ROWS
    full = tmp_path / "full.zarr"
    tsconv.process(src, full, pipeline=pipeline, chunk=CHUNK)
    _same(full, out)


def test_a_first_distributed_run_hands_each_features_first_row_to_its_tasks(
    client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fill state recorded yet: one task reads forward for each feature's first value (the whole input,
    for a symbol not trading yet) and every partition's walk stops there, not at row 0."""
    x = price_series(ROWS, FEATURES, seed=9, nan_fraction=0.02)
    x[:, 2] = np.nan  # listed, not trading
    x[:7000, 4] = np.nan  # trades late
    src = write_store(tmp_path / "in.zarr", x, chunks=(777, 3))
    handed: list[object] = []
    real_submit = client.submit

    def spy(fn, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        if fn.__name__ == "run_partition":
            handed.append(kw.get("first"))
        return real_submit(fn, *a, **kw)

    monkeypatch.setattr(client, "submit", spy)
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK, client=client, partition_rows=PART)
    monkeypatch.undo()
    first = [int(np.flatnonzero(~np.isnan(x[:, j]))[0]) if j != 2 else ROWS for j in range(FEATURES)]
    assert len(handed) == 10 and len({id(f) for f in handed}) == 1  # one scan, a task of its own, for all
    assert handed[0].result() == first
    one = tmp_path / "one.zarr"
    tsconv.process(src, one, chunk=CHUNK)
    _same(one, out)


def test_a_task_given_a_fill_state_reads_nothing_far_before_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_partition itself, in this process: with the recorded state its walk stops there."""
    import dataclasses

    from tsconv import config
    from tsconv.engine.distributed import run_partition
    from tsconv.engine.fill import fill_record
    from tsconv.engine.run import CudaOptions
    from tsconv.pipeline.spec import as_pipeline, resolve

    x = price_series(ROWS, FEATURES, seed=9, nan_fraction=0.02)
    x[:, 2] = np.nan
    src = write_store(tmp_path / "in.zarr", x, chunks=(777, 3))
    out = tmp_path / "out.zarr"
    import tsconv.engine.outputs

    monkeypatch.setattr(tsconv.engine.outputs, "output_chunk_rows", lambda chunk, n_outputs: 8 * chunk)
    tsconv.process(src, out, chunk=CHUNK)
    want = np.asarray(zarr.open_group(str(out), mode="r")["values"][:])
    state = np.array([x[:8000, j][~np.isnan(x[:8000, j])][-1] if j != 2 else np.nan for j in range(FEATURES)])
    plan = resolve(as_pipeline(None), tsconv.open_input(src).features)
    lowest = spy_fill_walks(monkeypatch)
    g = zarr.open_group(str(out), mode="r+")
    g["values"][8192:9216] = np.nan  # what the task writes again
    for given, floor in ((fill_record(8000, state.astype(np.float32)), 8000 - 800), (None, 0)):
        lowest.clear()
        run_partition(str(src), str(out), plan, start=8192, stop=9216, chunk=CHUNK, warmup="nan", device="cpu",
                      cuda=CudaOptions(), settings=dataclasses.replace(config.current()), fill=given)  # fmt: skip
        assert min(lowest) >= floor if given else min(lowest) == 0, (given is not None, min(lowest))
        got = np.asarray(zarr.open_group(str(out), mode="r")["values"][8192:9216])
        assert np.array_equal(got, want[8192:9216], equal_nan=True)


def test_workers_and_client_exclude_each_other(client, src: Path) -> None:
    with pytest.raises(tsconv.TsconvError, match="exclude each other"):
        tsconv.process(src, src.with_name("x.zarr"), chunk=CHUNK, client=client, workers=2)


@pytest.mark.slow
def test_cli_workers_end_to_end(src: Path, want: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "cli.zarr"
    report = tmp_path / "report.json"
    args = [sys.executable, "-m", "tsconv", "process", "-i", str(src), "-o", str(out), "--chunk", str(CHUNK)]
    args += ["--workers", "2", "--partition-rows", str(PART), "-q", "--report", str(report)]
    res = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "2 dask workers" in res.stdout
    _same(want["default"], out)
    assert '"rows": 10007' in report.read_text()
    assert '"compression": "lz4"' in report.read_text()  # it said null


def test_a_failed_task_is_one_line_at_the_cli(src: Path, tmp_path: Path) -> None:
    # its worker logged the task's traceback ("distributed.worker - ERROR - Compute Failed") before that line
    bad = tmp_path / "bad.zarr"
    shutil.copytree(src, bad)
    chunk = sorted(p for p in (bad / "values" / "c").rglob("*") if p.is_file())[-1]
    data = bytearray(chunk.read_bytes())
    data[40:200] = b"\xff" * 160
    chunk.write_bytes(data)
    args = [sys.executable, "-m", "tsconv", "process", "-i", str(bad), "-o", str(tmp_path / "o.zarr"), "-q"]
    res = subprocess.run(
        [*args, "--workers", "2", "--device", "cpu"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2 and res.stderr.startswith("tsconv: error: cannot read rows"), res.stderr
    assert res.stderr.count("\n") == 1, res.stderr


def test_a_worker_process_leaves_ctrl_c_to_the_command() -> None:
    # Ctrl-C reaches the terminal's whole process group: each worker process printed a traceback of its own
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        assert pool.apply(_sigint_after_setup) == "ignored"
    assert _sigint_after_setup() == "default"  # the command's own process (a GPU worker in it) keeps it


def _sigint_after_setup() -> str:
    import signal

    from tsconv.engine.worker_init import dask_setup

    before = signal.getsignal(signal.SIGINT)
    try:
        dask_setup.callback(None, gpu=False)
        return "ignored" if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else "default"
    finally:
        signal.signal(signal.SIGINT, before)


_PRELOAD_ORDER = """
import sys
import tsconv.engine.worker_init as wi
assert "torch" not in sys.modules, "dask imports the preload when it creates the worker: nothing heavy then"
seen = []
wi.early.start = lambda **kw: seen.append("tsconv.engine.distributed" in sys.modules)
wi.dask_setup.callback(None, gpu=True)
assert seen == [False] and "tsconv.engine.distributed" in sys.modules, seen
"""


def test_a_gpu_worker_begins_its_gpu_start_up_before_the_engines_imports() -> None:
    # begun after them, a GPU worker's first task waited 0.13 s for its CUDA context (H100)
    import subprocess

    res = subprocess.run([sys.executable, "-c", _PRELOAD_ORDER], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_tasks_let_glibc_keep_freed_buffers(monkeypatch) -> None:
    import ctypes.util

    from tsconv.engine import distributed as dist

    if ctypes.util.find_library("c") and sys.platform.startswith("linux"):
        assert dist._reuse_freed_memory() is True  # glibc accepted both settings


def test_gpu_partitions_are_few_and_large():
    from tsconv.engine.distributed import _rows_per_partition

    # 400k x 64 float32 (100 MB): one task on one GPU, where CPU workers get about 8 per worker
    cpu = _rows_per_partition(400_000, 12_288, 256, 320, 1, None)
    gpu = _rows_per_partition(400_000, 12_288, 256, 320, 1, None, gpu=True, row_bytes=256)
    assert cpu * 12_288 < 100_000 and gpu * 12_288 >= 400_000
    # 8M x 1024 (34 GB) on 2 GPUs: about 2 tasks per GPU, each at least 8 GiB of input
    per = _rows_per_partition(8 << 20, 65_536, 4, 64, 2, None, gpu=True, row_bytes=4096)
    assert per * 65_536 == 2 << 20
    # an explicit request wins
    assert _rows_per_partition(8 << 20, 65_536, 4, 64, 2, 100_000, gpu=True, row_bytes=4096) == 2


class _SwapStore(distributed.WorkerPlugin):
    """When the task of one partition starts, put a copy of the output in its place (another writer's
    store renamed in over it, as its --overwrite would)."""

    def __init__(self, out: str, start: int) -> None:
        self.out, self.prefix = out, f"tsconv-{start}-"

    def transition(self, key, start, finish, **kwargs) -> None:  # noqa: ANN001, ANN003
        out = Path(self.out)
        aside = out.with_name("ours-aside.zarr")
        if finish == "executing" and str(key).startswith(self.prefix) and not aside.exists():
            import shutil

            # the run's writers rename their ``.partial`` files away while the copy walks the store: a
            # vanished one fails the copy, and with it the swap (the likely cause of a rare "DID NOT RAISE")
            shutil.copytree(out, out.with_name("theirs.zarr"), ignore=shutil.ignore_patterns("*.partial"))
            os.rename(out, aside)
            os.rename(out.with_name("theirs.zarr"), out)
            out.with_name("theirs-files.json").write_text(json.dumps(_files(out)))


def _files(store: Path) -> dict[str, list[int]]:
    """Each file of ``store``: its inode and modification time (a chunk stored again is a new file)."""
    return {str(p.relative_to(store)): [p.stat().st_ino, p.stat().st_mtime_ns] for p in store.rglob("*")
            if p.is_file()}  # fmt: skip


def test_the_client_does_not_mark_a_replaced_store_complete(client, src: Path) -> None:
    out = src.with_name("dist-swapped.zarr")
    client.register_plugin(_SwapStore(str(out), 3072), name="swap-store")
    try:
        with pytest.raises(tsconv.TsconvError, match="was replaced while this run .*another directory"):
            tsconv.process(src, out, pipeline=DILATED, chunk=CHUNK, client=client, partition_rows=PART)
    finally:
        client.unregister_worker_plugin("swap-store")
    assert src.with_name("ours-aside.zarr").exists(), "the store was not swapped"
    assert zarr.open_group(str(out), mode="r").attrs["tsconv"]["complete"] is False
    # the run's tasks, which run on after the client's cancel (as after a Ctrl-C), stored no chunk in the store
    # put in its place
    _wait_until_no_task_runs(client)
    assert _files(out) == json.loads(out.with_name("theirs-files.json").read_text())


def _wait_until_no_task_runs(client, timeout: float = 60.0) -> None:  # noqa: ANN001
    """Until no worker's thread runs a task, cancelled ones included (the scheduler has forgotten those)."""
    import time

    end = time.monotonic() + timeout
    while any(client.run(lambda dask_worker: len(dask_worker.state.all_running_tasks)).values()):
        assert time.monotonic() < end, "tasks still running"
        time.sleep(0.1)


def test_a_distributed_output_records_its_run_and_input(client, src: Path) -> None:
    out = src.with_name("dist-owned.zarr")
    tsconv.process(src, out, chunk=CHUNK, client=client, partition_rows=PART)
    meta = zarr.open_group(str(out), mode="r").attrs["tsconv"]
    assert len(meta["run_id"]) == 32 and meta["input_digest"] == "values/.tsconv-input.json"
    assert (out / "values" / ".tsconv-input.json").is_file()
    first = meta["run_id"]
    g = zarr.open_group(str(out), mode="r+")
    g.attrs["tsconv"] = {**meta, "complete": False, "rows_done": 0, "partitions_done": [[0, 5120]]}
    tsconv.process(src, out, chunk=CHUNK, client=client, partition_rows=PART, resume=True)
    meta = zarr.open_group(str(out), mode="r").attrs["tsconv"]
    assert (
        meta["complete"] is True and len(meta["run_id"]) == 32 and meta["run_id"] != first
    )  # resumed: its own


def test_the_plan_goes_to_the_workers_once_not_in_every_task(client, tmp_path: Path) -> None:
    """A pipeline's weights travel to each worker once: in every task of the graph they made dask warn of a
    "large graph" (17 MB a task for a 1024-feature dense pipeline) and were sent once per partition."""
    import warnings

    import dask

    x = price_series(600, 5, seed=3)
    src = write_store(tmp_path / "in.zarr", x, chunks=(100, 5))
    pipe = {"conv": [{"filters": ["diff:1", "dev:8"]}],
            "head": {"weights": np.random.default_rng(0).normal(size=(10, 40_000))}}  # 3.2 MB  # fmt: skip
    want = tmp_path / "want.zarr"
    single = tsconv.process(src, want, pipeline=pipe, chunk=CHUNK)
    out = tmp_path / "out.zarr"
    with dask.config.set({"distributed.admin.large-graph-warning-threshold": "2MB"}):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = tsconv.process(src, out, pipeline=pipe, chunk=CHUNK, client=client, partition_rows=200)
    assert not [w for w in caught if "large graph" in str(w.message)]
    # the path that computed the head is named, as a single process's report names it (it said None: no head)
    assert report.head_path == single.head_path == "unfused"
    a, b = zarr.open_group(str(want), mode="r"), zarr.open_group(str(out), mode="r")
    assert np.array_equal(np.asarray(a["values"][:]), np.asarray(b["values"][:]), equal_nan=True)


def test_a_float64_store_on_workers_reads_as_a_single_process_does(
    client, tmp_path: Path, monkeypatch
) -> None:
    # CPU workers read float64 as a single process does, with nothing to warn of; where the workers would be
    # GPUs (which read float32) the client checks the first rows itself: the workers' warnings stay in their logs
    import warnings

    from tsconv.errors import TsconvWarning

    rng = np.random.default_rng(3)
    x = 400 + np.cumsum(rng.normal(0, 0.01, size=(3000, 2)), axis=0)  # float64, not float32-exact
    src = write_store(tmp_path / "in64.zarr", x, chunks=(1000, 2))
    returns = {"preprocess": {"transform": "diff"}, "conv": [{"filters": ["ma:4"]}]}
    for name, pipe in (("default", None), ("returns", returns)):
        with warnings.catch_warnings():
            warnings.simplefilter("error", TsconvWarning)
            d, one = tmp_path / f"d-{name}.zarr", tmp_path / f"s-{name}.zarr"
            tsconv.process(
                src, d, pipeline=pipe, chunk=CHUNK, client=client, partition_rows=1000, device="cpu"
            )
            tsconv.process(src, one, pipeline=pipe, chunk=CHUNK, device="cpu")
        assert read_output(d).tobytes() == read_output(one).tobytes()
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # the client's view: GPU workers
    with pytest.warns(TsconvWarning, match="float64.*rounding the values of"):
        tsconv.process(src, tmp_path / "g.zarr", chunk=CHUNK, client=client, partition_rows=1000)


def test_the_tasks_fp16_warnings_reach_the_client_once_a_stage(client, src: Path) -> None:
    """Each task checks FP16 storage on its own rows: each gave its own warning (23 near-copies on a 2-worker
    run, on the workers' terminals). The client now gives one a stage, the largest move any task saw."""
    rng = np.random.default_rng(5)
    pipe = {
        "conv": [
            {
                "weights": rng.normal(size=(4, FEATURES, 3)) / 3,
                "activation": "relu",
                "weight_dtype": "float32",
            },
            {"weights": rng.normal(size=(3, 4, 3)) / 3, "weight_dtype": "float16"},
        ]
    }
    with pytest.warns(tsconv.TsconvWarning) as single:
        tsconv.process(src, src.with_name("fp16-single.zarr"), pipeline=pipe, chunk=CHUNK)
    assert [str(w.message) for w in single if "float16" in str(w.message)]  # the data does move it
    with pytest.warns(tsconv.TsconvWarning) as caught:
        tsconv.process(src, src.with_name("fp16-dist.zarr"), pipeline=pipe, chunk=CHUNK, client=client,
                       partition_rows=PART)  # fmt: skip
    fp16 = [str(w.message) for w in caught if "storing its weights as float16" in str(w.message)]
    assert len(fp16) == 1 and "[[conv]] #2" in fp16[0], fp16


def test_a_tasks_warning_of_int64_beyond_2_53_reaches_the_client_once(client, tmp_path: Path) -> None:
    """A CPU run warns where int64 rows hold values beyond 2^53 (float64 rounds them); a task gave that warning
    in its worker's log only (the client, e.g. `--scheduler`, said nothing, exit 0). The client now gives it
    once, as a single process does, from the task of the first rows holding such values."""
    import warnings

    rng = np.random.default_rng(0)
    x = np.cumsum(rng.integers(-3, 4, size=(3000, 3)), axis=0).astype(np.int64) + 1000
    x[2000:, 1] += 1_767_346_200_000_000_000  # nanosecond timestamps as a feature, from row 2,000 on
    src = write_store(tmp_path / "int.zarr", x, chunks=(500, 3))
    with pytest.warns(tsconv.TsconvWarning, match="beyond 2") as single:
        tsconv.process(src, tmp_path / "s.zarr", chunk=CHUNK, device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tsconv.process(src, tmp_path / "d.zarr", chunk=CHUNK, device="cpu", client=client, partition_rows=500)
    wide = [str(w.message) for w in caught if "beyond 2^53" in str(w.message)]
    assert len(wide) == 1 and "'x1'" in wide[0], wide
    assert wide[0] == next(str(w.message) for w in single if "beyond 2^53" in str(w.message))
    assert read_output(tmp_path / "d.zarr").tobytes() == read_output(tmp_path / "s.zarr").tobytes()


def test_workers_paused_for_memory_are_said_to_be_so_not_missing(
    tmp_path: Path, src: Path, monkeypatch
) -> None:  # noqa: ANN001
    # dask counts running workers only: a cluster whose workers all sat paused (their processes past 80% of their
    # memory limit) was refused as one with "no workers (none connected within 10 s)", hint "start workers"
    import dask
    from distributed.core import Status

    from tsconv.engine import distributed as dist

    monkeypatch.setattr(dist, "_WORKERS_WAIT_S", 0.5)
    # the worker paused as dask's memory monitor pauses it (on its loop, which tells the scheduler), that monitor
    # kept from resuming it: this process's own memory is the in-process worker's
    with dask.config.set({"distributed.worker.memory.pause": False}), distributed.LocalCluster(
        n_workers=1, processes=False, dashboard_address=":0", memory_limit="300MB"
    ) as small, distributed.Client(small) as c:  # fmt: skip
        c.run(lambda dask_worker: setattr(dask_worker, "status", Status.paused))
        for _ in range(200):  # told to the scheduler within a few of the worker's heartbeats
            if [w["status"] for w in c.scheduler_info()["workers"].values()] == ["paused"]:
                break
            time.sleep(0.05)
        with pytest.raises(tsconv.TsconvError, match=r"1 worker is paused for lack of memory") as err:
            tsconv.process(src, tmp_path / "o.zarr", client=c)
    assert "of its 286 MiB limit" in str(err.value) and "--memory-limit" in err.value.hint
    assert not (tmp_path / "o.zarr").exists()


def test_a_time_range_with_workers_is_refused_in_the_clis_words_before_a_cluster_starts(
    tmp_path: Path,
) -> None:
    """The refusal's hint read "run it without workers=/client=", the library's names, at the CLI too."""
    src = write_store(tmp_path / "in.zarr", price_series(100, 2, seed=1), chunks=(50, 2))
    pipe = {
        "preprocess": {"time_range": ["1970-01-01", "2100-01-01"]},
        "conv": [{"name": "b", "filters": ["diff:1"]}],
    }
    with pytest.raises(tsconv.TsconvError) as err:
        tsconv.process(src, tmp_path / "out.zarr", pipeline=pipe, workers=2)
    msg = str(err.value)
    assert "not supported with dask (--workers/--scheduler; workers=/client= in Python)" in msg
    assert "hint: run it in one process (without --workers/--scheduler), or remove time_range." in msg
    assert not (tmp_path / "out.zarr").exists()
