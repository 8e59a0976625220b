"""Nothing mixed: one writer per output, a crash-safe ``--overwrite``, no foreign file deleted, no stale
temporary file kept.

A second process holds the lock for real (a subprocess); crashes inside the overwrite's swap are raised
from the file-system calls themselves, and one real ``kill -9`` lands during the deletion of a large old
store.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import tsconv
import tsconv.io.writers.zarr_writer as writer_module
from tsconv.cli import main
from tsconv.engine import chunked
from tsconv.errors import OutputBusyError, OutputLostError, StoreError, TsconvError
from tsconv.io.lock import OutputLock, lock_path
from tsconv.io.writers.parquet_writer import remove_stale_temp_files
from tsconv.io.writers.zarr_writer import (
    CREATING_SUFFIX,
    DISCARDED_SUFFIX,
    OutputWriter,
    check_owner,
    foreign_entries,
    store_identity,
)

from ..helpers import price_series, write_store

ROWS, FEATURES, CHUNK = 3000, 3, 256
OLD_PIPE = {"conv": [{"filters": ["ma:4", "diff:1"]}]}  # what the store being overwritten was made with
REPO = Path(tsconv.__file__).resolve().parents[1]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return write_store(tmp_path / "in.zarr", price_series(ROWS, FEATURES, seed=1), chunks=(1000, FEATURES))


def _meta(out: Path) -> dict:
    return dict(json.loads((out / "zarr.json").read_text())["attributes"]["tsconv"])


def _set_run_id(out: Path, run_id: str) -> None:
    doc = json.loads((out / "zarr.json").read_text())
    doc["attributes"]["tsconv"]["run_id"] = run_id
    (out / "zarr.json").write_text(json.dumps(doc))


def _values(out: Path) -> np.ndarray:
    return np.asarray(zarr.open_group(str(out), mode="r")["values"][:])


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tsconv-" in p.name)


# ----------------------------------------------------------------------------------- the lock

_HOLDER = """
import sys
from pathlib import Path
from tsconv.io.lock import OutputLock
OutputLock(Path(sys.argv[1]), run_id="0123456789ab" + "0" * 20).acquire()
print("held", flush=True)
sys.stdin.read()  # holds the lock until the test kills it
"""


@contextmanager
def _held_by_another_process(out: Path) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _cli(monkeypatch: pytest.MonkeyPatch, *args: str | os.PathLike[str]):  # noqa: ANN202
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # the CLI replaces it
    return CliRunner().invoke(main, ["process", *map(str, args), "-q"])


@pytest.mark.parametrize("name", ["out.zarr", "out.parquet"])
def test_a_second_writer_is_refused_at_once_naming_the_holder(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    out = tmp_path / name
    with _held_by_another_process(out) as holder:
        holder_text = f"pid {holder.pid} on {socket.gethostname()}, started 20"
        cases = [{}, {"overwrite": True}] + ([{"resume": True}] if name.endswith(".zarr") else [])
        for kw in cases:
            t0 = time.perf_counter()
            with pytest.raises(
                OutputBusyError, match=f"being written by another tsconv run \\({holder_text}"
            ):
                tsconv.process(src, out, chunk=CHUNK, **kw)
            assert time.perf_counter() - t0 < 5  # refused, not waited for
        assert not out.exists()
        res = _cli(monkeypatch, "-i", src, "-o", out, "--overwrite")
        assert res.exit_code == 2 and "Traceback" not in res.stderr
        assert res.stderr.count("\n") == 1
        assert res.stderr.startswith(
            f"tsconv: error: output {str(out.resolve())!r} is being written by another"
        )
        assert "run 0123456789ab" in res.stderr and "hint: wait for that run" in res.stderr
        # only a zarr output can be resumed (a Parquet file is written whole)
        assert ("--resume continues a stopped run" in res.stderr) == name.endswith(".zarr")
        os.kill(holder.pid, signal.SIGKILL)  # it never lets go itself: the kernel releases the lock
        holder.wait()
    assert lock_path(out).exists()  # a killed holder leaves the file; the next run reuses it
    tsconv.process(src, out, chunk=CHUNK)
    assert not lock_path(out).exists()  # a run that ends removes it


@pytest.mark.parametrize("name", ["out.zarr", "out.parquet"])
def test_a_plain_run_on_an_output_being_written_names_the_holder_not_overwrite(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The output exists (another run is writing it): the refusal names that run, as with --overwrite, and
    does not send a scheduler's retry to --overwrite or --resume."""
    out = tmp_path / name
    tsconv.process(src, out, chunk=CHUNK)
    if name.endswith(".zarr"):  # what a run still writing it shows
        g = zarr.open_group(str(out), mode="r+")
        g.attrs["tsconv"] = {**g.attrs["tsconv"], "complete": False}
    with _held_by_another_process(out) as holder:
        with pytest.raises(
            OutputBusyError, match=f"being written by another tsconv run \\(pid {holder.pid} "
        ):
            tsconv.process(src, out, chunk=CHUNK)
        res = _cli(monkeypatch, "-i", src, "-o", out)
        assert res.exit_code == 2 and "run 0123456789ab" in res.stderr
        assert "--overwrite" not in res.stderr and "hint: wait for that run" in res.stderr
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    with pytest.raises(tsconv.OutputExistsError, match="already exists"):  # no one holds it: as before
        tsconv.process(src, out, chunk=CHUNK)


def test_a_dask_run_is_refused_before_any_cluster_starts(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.zarr"
    with _held_by_another_process(out):
        t0 = time.perf_counter()
        with pytest.raises(OutputBusyError):
            tsconv.process(src, out, chunk=CHUNK, workers=2)
        assert time.perf_counter() - t0 < 5
    assert not out.exists()


def test_one_lock_per_output_within_a_process_too(tmp_path: Path) -> None:
    out = tmp_path / "out.zarr"
    with OutputLock(out, run_id="a" * 32) as lock:
        assert lock.held and json.loads(lock_path(out).read_text())["run_id"] == "a" * 32
        with pytest.raises(OutputBusyError, match=f"pid {os.getpid()}"):
            OutputLock(out, run_id="b" * 32).acquire()
        OutputLock(tmp_path / "other.zarr", run_id="c" * 32).acquire().release()  # another output is free
    assert not lock_path(out).exists()
    OutputLock(out, run_id="d" * 32).acquire().release()


def test_a_full_disk_does_not_fail_the_lock(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The holder record is all the lock writes: on a full disk it failed every command that takes the lock
    # with a bare "[Errno 28] No space left on device" naming no file (`tsconv repair` included), and left
    # its file behind. The lock is held without the record; the refusal says so.
    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    out = tmp_path / "out.zarr"
    with OutputLock(out, run_id="a" * 32) as lock:
        assert lock.held
        with pytest.raises(OutputBusyError, match="holder details not yet written"):
            OutputLock(out, run_id="b" * 32).acquire()
    assert not lock_path(out).exists()
    result = CliRunner().invoke(main, ["repair", str(src)])
    assert result.exit_code == 0 and "nothing to repair" in result.output, result.output


def test_a_lock_file_removed_mid_run_stops_the_run_and_spares_the_next_runs_lock(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The flock holds the file, not the path: another process removing it (a clean-up of dot files) let a
    # second run lock a new file and write the same output beside this one (an --overwrite with another
    # pipeline then ended complete with both runs' chunks), and this run's end removed the second run's lock.
    out = tmp_path / "out.zarr"
    other: list[OutputLock] = []
    real_write = writer_module.OutputWriter._write

    def write(self: OutputWriter, a: int, b: int, *rest: object) -> None:
        real_write(self, a, b, *rest)
        if a == 0:
            lock_path(out).unlink()
            other.append(OutputLock(out, run_id="b" * 32).acquire())  # a second run takes the output

    monkeypatch.setattr(writer_module.OutputWriter, "_write", write)
    monkeypatch.setattr("tsconv.engine.outputs.output_chunk_rows", lambda chunk, n_outputs: CHUNK)
    with (
        tsconv.config.override(write_threads=0),  # one chunk at a time: none in flight past its check
        pytest.raises(OutputLostError, match=r"lock file of the output .* was removed or replaced"),
    ):
        tsconv.process(src, out, pipeline=OLD_PIPE, chunk=CHUNK, device="cpu", progress=False)
    assert _meta(out)["complete"] is False and _meta(out)["rows_done"] <= CHUNK
    assert other[0].held and lock_path(out).exists()  # the second run's lock stays
    with pytest.raises(OutputBusyError):
        OutputLock(out, run_id="c" * 32).acquire()
    other[0].release()


# ----------------------------------------------------------------------- the store replaced mid-run


def test_a_store_replaced_mid_run_is_not_marked_complete(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, calls = tmp_path / "out.zarr", []
    real_append = OutputWriter.append

    def append(self: OutputWriter, block: np.ndarray) -> None:
        calls.append(block.shape[0])
        if len(calls) == 3:  # another writer's store renamed in over ours (as its --overwrite would)
            shutil.copytree(out, tmp_path / "theirs.zarr")
            _set_run_id(tmp_path / "theirs.zarr", "f" * 32)
            os.rename(out, tmp_path / "ours.zarr")
            os.rename(tmp_path / "theirs.zarr", out)
        real_append(self, block)

    monkeypatch.setattr(OutputWriter, "append", append)
    # one chunk an append (a bank pipeline may take several a call), so the swap falls between appends
    monkeypatch.setattr(chunked, "_chunks_per_call", lambda backend, chunk: 1)
    with pytest.raises(
        StoreError, match="was replaced while this run .*: another directory is at that path now; not marking"
    ):
        tsconv.process(src, out, chunk=CHUNK)
    assert len(calls) > 3
    assert _meta(out)["complete"] is False and _meta(tmp_path / "ours.zarr")["complete"] is False


def test_a_run_whose_run_id_changed_on_disk_is_not_marked_complete(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out.zarr"
    monkeypatch.setenv("TSCONV_WRITE_THREADS", "0")  # every chunk and its progress are stored by append
    real_finish = OutputWriter.finish

    def finish(self: OutputWriter) -> None:
        _set_run_id(out, "e" * 32)  # another run took the store after our last chunk
        real_finish(self)

    monkeypatch.setattr(OutputWriter, "finish", finish)
    with pytest.raises(StoreError, match="its metadata names run eeeeeeeeeeee; not marking it complete"):
        tsconv.process(src, out, chunk=CHUNK)
    assert _meta(out)["complete"] is False and _meta(out)["rows_done"] == ROWS


def test_check_owner(tmp_path: Path, src: Path) -> None:
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK)
    run_id, identity = _meta(out)["run_id"], store_identity(out)
    assert len(run_id) == 32
    check_owner(out, run_id=run_id, identity=identity)
    with pytest.raises(StoreError, match="its metadata names run"):
        check_owner(out, run_id="9" * 32, identity=identity)
    shutil.copytree(out, tmp_path / "copy.zarr")
    with pytest.raises(StoreError, match="another directory is at that path now"):
        check_owner(tmp_path / "copy.zarr", run_id=run_id, identity=identity)
    resumed = tsconv.process(src, out, chunk=CHUNK, resume=True)
    assert resumed.rows == 0 and _meta(out)["run_id"] == run_id  # nothing to do: nothing rewritten


def _region_store(path: Path, run_id: str, fill: float) -> np.ndarray:
    """A new output store of run ``run_id`` holding ``fill`` in every row, as ``run_id``'s writer left it."""
    x = np.full((ROWS, FEATURES), fill, dtype=np.float32)
    attrs = {"tsconv": {"complete": False, "rows": ROWS, "rows_done": 0, "run_id": run_id}}
    w = OutputWriter.create(path, rows=ROWS, names=("a", "b", "c"), chunk_rows=CHUNK, time_source=None,
                            attrs=attrs, threads=0, compression="lz4")  # fmt: skip
    w.append(x)
    w.finish()
    return x


def _files(store: Path) -> dict[str, int]:
    return {str(p.relative_to(store)): p.stat().st_ino for p in sorted((store / "values").rglob("*"))}


@pytest.mark.parametrize("fast", [True, False], ids=["chunk-files", "through-zarr"])
@pytest.mark.parametrize("how", ["swapped", "run-id"])
def test_a_dask_task_stores_no_chunk_once_its_store_is_another_runs(
    tmp_path: Path, how: str, fast: bool
) -> None:
    """A task outlives a client stopped by Ctrl-C: its writer must not store the old run's rows in the store
    another run (--overwrite, or --resume in place) made of the output meanwhile."""
    out, ours = tmp_path / "out.zarr", "a" * 32
    _region_store(out, ours, 1.0)
    w = OutputWriter.region(out, time_source=None, start=0, stop=ROWS, threads=0, fast=fast, run_id=ours,
                            identity=store_identity(out))  # fmt: skip
    w.append(np.full((CHUNK, FEATURES), 2.0, dtype=np.float32))  # one chunk stored while the store is ours
    if how == "swapped":
        os.rename(out, tmp_path / "aside.zarr")
        want = _region_store(out, "b" * 32, 3.0)
    else:
        _set_run_id(out, "b" * 32)
        want = _values(out)
    before = _files(out)
    with pytest.raises(OutputLostError, match=r"was replaced while this run \(run aaaaaaaaaaaa\).*this task "
                       r"\(rows 0..3,000\) stores no more chunks"):  # fmt: skip
        w.append(np.full((ROWS - CHUNK, FEATURES), 2.0, dtype=np.float32))
        w.finish()
    w.close()
    assert _files(out) == before and np.array_equal(_values(out), want)


@pytest.mark.skipif(os.rename not in os.supports_dir_fd, reason="no directory descriptors here")
def test_a_dask_tasks_chunk_renamed_in_as_its_store_is_replaced_lands_in_the_old_store(
    tmp_path: Path,
) -> None:
    """The store renamed aside between a chunk's check and its rename: the chunk goes to the discarded store,
    which the task opened, not to the new one at the path; the next chunk is refused."""
    out, aside = tmp_path / "out.zarr", tmp_path / "aside.zarr"
    _region_store(out, "a" * 32, 1.0)
    w = OutputWriter.region(out, time_source=None, start=0, stop=ROWS, threads=0, run_id="a" * 32,
                            identity=store_identity(out))  # fmt: skip
    assert w._chunks is not None
    checked, real = [], w._chunks._guard
    assert real is not None

    def guard() -> None:
        real()
        checked.append(1)
        if len(checked) == 2:  # the second chunk's check passed: now the other run's --overwrite
            os.rename(out, aside)
            _region_store(out, "b" * 32, 3.0)

    w._chunks._guard = guard
    with pytest.raises(OutputLostError, match="another directory is at that path now"):
        w.append(np.full((ROWS, FEATURES), 2.0, dtype=np.float32))
        w.finish()
    w.close()
    assert np.array_equal(_values(out), np.full((ROWS, FEATURES), 3.0, dtype=np.float32))
    old = _values(aside)
    assert (old[: 2 * CHUNK] == 2.0).all() and (old[2 * CHUNK :] == 1.0).all()


# ---------------------------------------------------------------------------- overwrite crash safety


class _Crash(BaseException):
    """The process dying here (a BaseException: no ``except Exception`` handles it)."""


def _half_rmtree(real):  # noqa: ANN001, ANN202
    def rmtree(path, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        if str(path).endswith(DISCARDED_SUFFIX):
            for i, f in enumerate(sorted(p for p in Path(path).rglob("*") if p.is_file())):
                if i % 2 == 0:
                    f.unlink()  # killed halfway through the deletion
            raise _Crash
        real(path, *args, **kwargs)

    return rmtree


def _failing_rename(real, when):  # noqa: ANN001, ANN202
    def rename(a, b, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        if when(str(a), str(b)):
            raise _Crash
        real(a, b, *args, **kwargs)

    return rename


def _raise(*args: object, **kwargs: object) -> None:
    raise _Crash


# step -> what the output path may hold right after a crash there
_STEPS = {
    "rename the old store aside": "old",
    # the deletion runs beside the new store's build and is waited for at the end: the new store is whole
    "delete the old store": "new, complete",
    "lay out the new store": "nothing",
    "rename the new store in": "nothing",
    "store the first chunk": "new, incomplete",
    "mark it complete": "new, incomplete",
}


def _crash_at(step: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if step == "rename the old store aside":
        monkeypatch.setattr(
            os, "rename", _failing_rename(os.rename, lambda a, b: b.endswith(DISCARDED_SUFFIX))
        )
    elif step == "delete the old store":
        monkeypatch.setattr(shutil, "rmtree", _half_rmtree(shutil.rmtree))
    elif step == "lay out the new store":
        monkeypatch.setattr(writer_module, "write_digest", _raise)
    elif step == "rename the new store in":
        monkeypatch.setattr(
            os, "rename", _failing_rename(os.rename, lambda a, b: a.endswith(CREATING_SUFFIX))
        )
    elif step == "store the first chunk":
        monkeypatch.setattr(OutputWriter, "append", _raise)
    elif step == "mark it complete":
        monkeypatch.setattr(writer_module, "check_owner", _raise)


def _state(out: Path, old: np.ndarray, old_features: list[str], new_features: list[str]) -> str:
    """What ``out`` holds; reading it must never fail halfway."""
    if not out.exists():
        return "nothing"
    g = zarr.open_group(str(out), mode="r")
    values, meta, features = np.asarray(g["values"][:]), dict(g.attrs["tsconv"]), g.attrs["features"]
    if features == old_features and meta["complete"] is True:
        assert np.array_equal(values, old, equal_nan=True)
        return "old"
    assert features == new_features and values.shape[1] == len(new_features)
    return "new, incomplete" if meta["complete"] is False else "new, complete"


@pytest.mark.parametrize("step", list(_STEPS))
def test_overwrite_crashing_at_any_step_leaves_old_nothing_or_new_incomplete(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    want = tmp_path / "want.zarr"
    tsconv.process(src, want, chunk=CHUNK)
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK, pipeline=OLD_PIPE)
    old, old_features = _values(out), zarr.open_group(str(out), mode="r").attrs["features"]
    new_features = zarr.open_group(str(want), mode="r").attrs["features"]

    with monkeypatch.context() as m:
        _crash_at(step, m)
        with pytest.raises(_Crash):
            tsconv.process(src, out, chunk=CHUNK, overwrite=True)
    assert _state(out, old, old_features, new_features) == _STEPS[step]

    # The next run on the output tidies what the crash left and finishes the job.
    again = {"overwrite": True} if _STEPS[step] == "old" else {"resume": True}
    tsconv.process(src, out, chunk=CHUNK, **again)
    assert _state(out, old, old_features, new_features) == "new, complete"
    np.testing.assert_array_equal(_values(out), _values(want))
    assert _leftovers(tmp_path) == []


def test_the_old_store_is_deleted_beside_the_new_run_and_gone_when_it_returns(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK, pipeline=OLD_PIPE)
    created = threading.Event()
    real_create, real_rmtree = OutputWriter.create.__func__, shutil.rmtree
    seen: dict[str, bool] = {}

    def create(cls, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        created.set()
        return real_create(cls, *args, **kwargs)

    def rmtree(path, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        if str(path).endswith(DISCARDED_SUFFIX):
            # a deletion in the run's own thread would wait here for a store it has not begun
            seen["new store begun first"] = created.wait(timeout=20)
            with pytest.raises(OutputBusyError):
                OutputLock(out, run_id="f" * 32).acquire()
            seen["lock held"] = True
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(OutputWriter, "create", classmethod(create))
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    report = tsconv.process(src, out, chunk=CHUNK, overwrite=True)
    assert seen == {"new store begun first": True, "lock held": True}
    assert _leftovers(tmp_path) == []  # the old store is gone by the time the call returns
    assert report.rows == ROWS and _state(out, np.empty(0), ["a", "b"], _features(out)) == "new, complete"


def _features(path: Path) -> list[str]:
    return zarr.open_group(str(path), mode="r").attrs["features"]


def _old_store_of_many_chunks(path: Path, chunks: int = 4000) -> np.ndarray:
    """A complete-looking old output whose deletion takes a while: ``chunks`` chunk files (copies of one)."""
    block = np.random.default_rng(0).standard_normal((10, 2)).astype(np.float32)
    g = zarr.open_group(str(path), mode="w")
    g.create_array("values", shape=(10 * chunks, 2), chunks=(10, 2), dtype="float32")[:10] = block
    g.attrs.update(
        features=["a", "b"], tsconv={"complete": True, "rows": 10 * chunks, "rows_done": 10 * chunks}
    )
    first = path / "values" / "c" / "0" / "0"
    for i in range(1, chunks):
        (path / "values" / "c" / str(i)).mkdir()
        shutil.copyfile(first, path / "values" / "c" / str(i) / "0")
    return np.tile(block, (chunks, 1))


@pytest.mark.slow
def test_kill_9_during_overwrite_leaves_a_store_that_resume_finishes(src: Path, tmp_path: Path) -> None:
    want = tmp_path / "want.zarr"
    tsconv.process(src, want, chunk=CHUNK)
    out = tmp_path / "out.zarr"
    old = _old_store_of_many_chunks(out)
    args = [sys.executable, "-m", "tsconv", "process", "-i", str(src), "-o", str(out), "--chunk", str(CHUNK)]
    proc = subprocess.Popen([*args, "--overwrite", "-q", "--device", "cpu"], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    aside = tmp_path / f".out.zarr{DISCARDED_SUFFIX}"
    deadline, seen = time.monotonic() + 120, False
    while proc.poll() is None and time.monotonic() < deadline:
        if aside.exists():  # the old store is being deleted: kill it now
            seen = True
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.0005)
    proc.communicate()
    assert seen, "the kill never landed during the deletion of the old store"
    assert proc.returncode == -9
    new_features = zarr.open_group(str(want), mode="r").attrs["features"]
    assert _state(out, old, ["a", "b"], new_features) in ("old", "nothing", "new, incomplete")

    report = tsconv.process(src, out, chunk=CHUNK, resume=True)
    assert report.rows == ROWS
    np.testing.assert_array_equal(_values(out), _values(want))
    assert _leftovers(tmp_path) == []


# ------------------------------------------------------------------------------------ foreign files


@pytest.mark.parametrize(
    "foreign, named",
    [
        ({"notes.txt": "mine"}, "notes.txt"),
        ({"sub/notes.txt": "mine"}, "sub/"),
        ({"values/README": "mine"}, "values/README"),
        ({"values/c/0/notes": "mine"}, "values/c/0/notes"),
        ({"time/c/0.bak": "mine"}, "time/c/0.bak"),
    ],
)
def test_overwrite_refuses_a_store_holding_foreign_files(
    src: Path, tmp_path: Path, foreign: dict[str, str], named: str
) -> None:
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK, pipeline=OLD_PIPE)
    for rel, text in foreign.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    with pytest.raises(StoreError, match=f"not zarr data \\({named}\\); hint: move them out"):
        tsconv.process(src, out, chunk=CHUNK, overwrite=True)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
    assert all((out / rel).read_text() == text for rel, text in foreign.items())


def test_foreign_entries_are_named_and_zarr_data_is_not(tmp_path: Path, src: Path) -> None:
    assert foreign_entries(src) == []  # a plain zarr store: metadata and chunk files only
    v2 = write_store(tmp_path / "v2.zarr", price_series(100, 2), chunks=(10, 2), zarr_format=2)
    assert foreign_entries(v2) == []
    nested = zarr.open_group(str(tmp_path / "nested.zarr"), mode="w")
    nested.create_group("a").create_array("b", data=np.ones((20, 2), np.float32), chunks=(5, 2))
    assert foreign_entries(tmp_path / "nested.zarr") == []
    out = tmp_path / "out.zarr"
    tsconv.process(src, out, chunk=CHUNK)
    (out / "values" / "c" / "0" / "0.1f2e.partial").write_bytes(b"a killed writer's chunk")
    (out / "zarr.json.5a5a.partial").write_text("{")
    (out / "values" / f"zarr.{'6b' * 16}.partial").write_text("{")  # zarr's, named by Path.with_suffix
    assert foreign_entries(out) == []  # tsconv's own layout, its digest and leftovers of a kill
    (out / "a.txt").write_text("x")
    (out / "b").mkdir()
    (out / "link").symlink_to(src)
    assert foreign_entries(out) == ["a.txt", "b/", "link"]
    assert len(foreign_entries(out, limit=2)) == 2
    tsconv.process(src, v2, chunk=CHUNK, overwrite=True)  # another program's zarr store may be replaced
    assert zarr.open_group(str(v2), mode="r").attrs["tsconv"]["complete"] is True


# -------------------------------------------------------------------------------- Parquet temp files


def test_the_next_parquet_run_removes_a_killed_runs_temporary_file(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.parquet"
    stale = tmp_path / ".x.parquet.tsconv-99999.tmp"
    stale.write_bytes(b"PAR1 and half a row group")
    kept = [
        tmp_path / ".x.parquet.notes",
        tmp_path / ".y.parquet.tsconv-99999.tmp",
        tmp_path / "x.parquet.tmp",
    ]
    for p in kept:
        p.write_text("not this run's")
    tsconv.process(src, out, chunk=CHUNK)
    assert not stale.exists() and all(p.exists() for p in kept)
    import pyarrow.parquet as pq

    meta = json.loads(pq.read_schema(out).metadata[b"tsconv"])
    assert len(meta["tsconv"]["run_id"]) == 32
    assert remove_stale_temp_files(out) == []


@pytest.mark.slow
def test_kill_9_of_a_parquet_run_then_the_next_run_cleans_up(tmp_path: Path) -> None:
    src = write_store(tmp_path / "in.zarr", price_series(100_000, 4, seed=2), chunks=(25_000, 4))
    out = tmp_path / "x.parquet"
    args = [
        sys.executable,
        "-m",
        "tsconv",
        "process",
        "-i",
        str(src),
        "-o",
        str(out),
        "-q",
        "--device",
        "cpu",
    ]
    proc = subprocess.Popen(args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline, tmp = time.monotonic() + 120, None
    while proc.poll() is None and time.monotonic() < deadline and tmp is None:
        tmp = next(iter(tmp_path.glob(".x.parquet.tsconv-*.tmp")), None)
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert tmp is not None and tmp.exists() and not out.exists(), "the kill did not land mid-write"
    tsconv.process(src, out, chunk=1024)
    assert not tmp.exists() and out.exists()
    assert _leftovers(tmp_path) == []


# ------------------------------------------------------------------------------------ library options


@pytest.mark.parametrize("name", ["out.zarr", "out.parquet"])
@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"overwrite": True, "resume": True}, "overwrite=True and resume=True exclude each other"),
        ({"overwrite": "no"}, "overwrite must be True or False, got 'no'"),
        ({"resume": 1}, "resume must be True or False, got 1"),
    ],
)
def test_contradictory_or_non_bool_output_flags_are_refused(
    src: Path, tmp_path: Path, name: str, kw: dict, needle: str
) -> None:
    out = tmp_path / name
    tsconv.process(src, out, chunk=CHUNK)
    before = out.stat().st_mtime_ns
    with pytest.raises(TsconvError, match=needle):
        tsconv.process(src, out, chunk=CHUNK, **kw)
    assert out.stat().st_mtime_ns == before


# ------------------------------------------------------------------------------ a scheduler's stop

_STOPPED = """
import os, signal, sys, threading
import tsconv.io.writers.zarr_writer as w
from tsconv.cli import run

signums = [int(n) for n in sys.argv[1].split(",")]  # a second one reaches the clean-up
calls = []

def counted(rows_of):
    def call(self, arg, *args, **kwargs):
        calls.append(rows_of(arg))
        if sum(calls) >= 3 * 26_214:  # past three output chunks (4 MB of 40 outputs): a run part-way
            calls[:] = [-1e9]
            # from another thread, so that all are pending before the main thread handles one (it
            # handles pending signals lowest number first)
            kills = threading.Thread(target=lambda: [os.kill(os.getpid(), n) for n in signums])
            kills.start()
            kills.join()
        return original[call](self, arg, *args, **kwargs)
    return call

original = {}
for name, rows_of in (("keep", int), ("append", len)):
    wrapped = counted(rows_of)
    original[wrapped] = getattr(w.OutputWriter, name)
    setattr(w.OutputWriter, name, wrapped)
sys.argv = ["tsconv", *sys.argv[2:]]
run()
"""


@pytest.mark.parametrize(
    "signums",
    [[signal.SIGTERM], [signal.SIGHUP], [signal.SIGHUP, signal.SIGTERM], [signal.SIGINT, signal.SIGTERM]],
    ids=["term", "hup", "hup+term", "int+term"],
)
def test_sigterm_and_sighup_stop_a_run_as_ctrl_c_does(tmp_path: Path, signums: list[int]) -> None:
    # a batch scheduler stops a job with SIGTERM: the run died at once (status -15, no advice, the lock file
    # and temporary files left); a second signal during Ctrl-C's clean-up broke it off ("Aborted!", status 1)
    src = write_store(tmp_path / "big.zarr", price_series(200_000, 8, seed=2), chunks=(50_000, 8))
    want, out = tmp_path / "want.zarr", tmp_path / "out.zarr"
    tsconv.process(src, want, device="cpu")
    args = ["process", "-i", str(src), "-o", str(out), "--device", "cpu", "-q"]
    signum, times = min(signums), len(signums)
    proc = subprocess.run([sys.executable, "-c", _STOPPED, ",".join(map(str, signums)), *args], env=_env(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 128 + signum, proc.stderr  # 130 for Ctrl-C, as before
    name = signal.Signals(signum).name
    lines = proc.stderr.splitlines()
    said = {"SIGTERM": "terminated (SIGTERM)", "SIGHUP": "hung up (SIGHUP)", "SIGINT": "interrupted"}[name]
    assert lines[-1] == f"tsconv: error: {said}; rerun with --resume to continue where it stopped", (
        proc.stderr
    )
    assert len(lines) == times and "Traceback" not in proc.stderr
    if times == 2:
        assert lines[0] == "tsconv: finishing the clean-up first; interrupt again to stop at once"
    assert not lock_path(out).exists() and _leftovers(tmp_path) == []
    assert not _meta(out)["complete"] and 0 < _meta(out)["rows_done"] < 200_000
    tsconv.process(src, out, device="cpu", resume=True)
    np.testing.assert_array_equal(_values(out), _values(want))
