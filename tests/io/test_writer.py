"""The output writer (tsconv.io.writers.zarr_writer.OutputWriter): threaded writes, the direct chunk-file path, and crash safety.

Threads on or off, chunk files written directly or through zarr: the same store, byte for byte. rows_done
never passes a chunk that is not stored, a failed write always surfaces, and resume continues exactly.
"""

from __future__ import annotations

import errno
import os
import re
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, BytesCodec, ZstdCodec

from tsconv.errors import StoreError
from tsconv.io.digest import write_digest
from tsconv.io.readers.threads import ParallelBandReader
from tsconv.io.writers.encode import ChunkFileWriter, fast_write_reason
from tsconv.io.writers.zarr_writer import OutputWriter

from ..helpers import price_series

ROWS, FEATURES, CHUNK_ROWS = 10_000, 12, 1024  # 10 chunks, the last one partial


def _data(rows: int = ROWS, features: int = FEATURES, seed: int = 0) -> np.ndarray:
    x = price_series(rows, features, seed=seed, nan_fraction=0.02)
    x[: CHUNK_ROWS + 100] = np.nan  # warm-up rows: chunk 0 all NaN (zarr stores no file), chunk 1 partly
    x[min(rows - 1, 3 * CHUNK_ROWS + 5), 2] = -0.0
    return x


def _time(rows: int = ROWS) -> np.ndarray:
    return 1_767_346_200_000_000_000 + np.arange(rows, dtype=np.int64) * 1_000_000


def _create(path: Path, x: np.ndarray, *, time_source: np.ndarray | None = None, **kw) -> OutputWriter:
    return OutputWriter.create(
        path,
        rows=x.shape[0],
        names=tuple(f"y{j}" for j in range(x.shape[1])),
        chunk_rows=CHUNK_ROWS,
        time_source=time_source,
        attrs={"tsconv": {"complete": False, "rows": x.shape[0], "rows_done": 0}},
        **kw,
    )


def _append_all(writer: OutputWriter, x: np.ndarray, start: int = 0, step: int = 700) -> None:
    """Append in blocks that straddle chunk boundaries, reusing (and scribbling over) one caller buffer."""
    block = np.empty((step, x.shape[1]), dtype=np.float32)
    for a in range(start, x.shape[0], step):
        n = min(step, x.shape[0] - a)
        block[:n] = x[a : a + n]
        writer.append(block[:n])
        block[:] = 12345.0  # the writer must have copied the rows already


def _meta(path: Path) -> dict:
    return dict(zarr.open_group(str(path), mode="r").attrs["tsconv"])


_METADATA = {"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"}


def _files(path: Path) -> dict[str, bytes]:
    """Every chunk file of a store, by key."""
    return {
        str(p.relative_to(path)): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name not in _METADATA
    }


MODES = {
    "zarr-sync": {"threads": 0, "fast": False},  # the old behaviour
    "direct-sync": {"threads": 0},
    "direct-threads": {"threads": 4},
    "zarr-threads": {"threads": 4, "fast": False},
    "direct-threads-2-buffers": {"threads": 3, "buffers": 2},
}


def test_threads_and_direct_files_give_the_same_store(tmp_path: Path) -> None:
    x, t = _data(), _time()
    stores = {}
    for name, kw in MODES.items():
        path = tmp_path / f"{name}.zarr"
        writer = _create(path, x, time_source=t, **kw)
        assert writer.fast == (kw.get("fast", True)), writer.fallback_reason
        _append_all(writer, x)
        writer.finish()
        assert writer.rows_done == ROWS
        assert writer.busy_seconds > 0 and writer.wait_seconds >= 0
        assert _meta(path)["complete"] is True and _meta(path)["rows_done"] == ROWS
        g = zarr.open_group(str(path), mode="r")
        got = np.asarray(g["values"][:])
        np.testing.assert_array_equal(got, x)  # NaN where x is NaN
        assert np.array_equal(got.view(np.uint32), x.view(np.uint32))  # -0.0 and the NaN bits too
        np.testing.assert_array_equal(np.asarray(g["time"][:]), t)
        with ParallelBandReader(g["values"], threads=2) as reader:
            assert reader.fast
            np.testing.assert_array_equal(reader.read(0, ROWS), x)
        stores[name] = _files(path)
    want = stores.pop("zarr-sync")
    assert "values/c/0/0" not in want and "values/c/1/0" in want  # zarr keeps no all-NaN chunk
    assert not any(k.endswith(".partial") for k in want)
    for name, files in stores.items():
        assert files.keys() == want.keys(), name
        for key in want:
            assert files[key] == want[key], f"{name}: {key} differs from zarr's bytes"


class _Slots:
    """The batched engine's host slots: a few reused buffers, each lent to ``append`` until released; a
    released slot is scribbled over at once (the GPU's next copy), so a read after release shows."""

    def __init__(self, n: int, rows: int, features: int) -> None:
        self.bufs = [np.empty((rows, features), dtype=np.float32) for _ in range(n)]
        self.free = [threading.BoundedSemaphore(1) for _ in range(n)]  # released in any order
        self.releases: list[int] = []
        self._lock = threading.Lock()

    def lend(self, writer: OutputWriter, rows: np.ndarray, k: int) -> None:
        o = k % len(self.bufs)
        assert self.free[o].acquire(timeout=30)
        buf = self.bufs[o][: rows.shape[0]]
        buf[:] = rows

        def release() -> None:
            with self._lock:
                self.releases.append(k)
            buf[:] = 12345.0
            self.free[o].release()

        writer.append(buf, release=release)


def _lend_all(writer: OutputWriter, x: np.ndarray, step: int, *, start: int = 0, slots: int = 3) -> _Slots:
    lender = _Slots(slots, step, x.shape[1])
    for k, a in enumerate(range(start, x.shape[0], step)):
        lender.lend(writer, x[a : a + step], k)
    return lender


@pytest.mark.parametrize("step", [2500, CHUNK_ROWS, 3 * CHUNK_ROWS, 700])
def test_lent_blocks_give_zarrs_bytes_and_are_released_once_read(tmp_path: Path, step: int) -> None:
    x, t = _data(), _time()
    ref = tmp_path / "ref.zarr"
    w = _create(ref, x, time_source=t, threads=0, fast=False)
    _append_all(w, x)
    w.finish()
    want = _files(ref)
    for name, kw in MODES.items():
        path = tmp_path / f"{name}.zarr"
        w = _create(path, x, time_source=t, **kw)
        lender = _lend_all(w, x, step)
        w.finish()
        blocks = len(range(0, ROWS, step))
        assert sorted(lender.releases) == list(range(blocks)), name  # each block released once
        np.testing.assert_array_equal(np.asarray(zarr.open_group(str(path), mode="r")["values"][:]), x)
        assert _files(path) == want, name


def test_a_lent_block_is_released_when_its_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = _data()
    bad = 3 * CHUNK_ROWS

    def hook(a: int) -> None:
        if a == bad:
            raise OSError(28, "No space left on device")

    _patch_write(monkeypatch, hook)
    w = _create(tmp_path / "out.zarr", x, threads=3)
    step = 2 * CHUNK_ROWS
    lender, lent = _Slots(3, step, x.shape[1]), []
    with pytest.raises(StoreError, match="No space left"):  # from a later append, or from finish
        with w:
            for k, a in enumerate(range(0, ROWS, step)):
                lent.append(k)
                lender.lend(w, x[a : a + step], k)
            w.finish()
    assert len(lent) >= 2 and sorted(lender.releases) == lent  # every lent block, also the one that raised


def test_close_releases_lent_blocks_whose_writes_never_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = _data()
    gate = threading.Event()
    _patch_write(monkeypatch, lambda a: gate.wait(30))
    w = _create(tmp_path / "out.zarr", x, threads=2)
    released: list[int] = []
    blocks = [
        np.ascontiguousarray(x[a : a + 2 * CHUNK_ROWS]) for a in range(0, 8 * CHUNK_ROWS, 2 * CHUNK_ROWS)
    ]
    for k, b in enumerate(blocks):  # 8 chunk writes queued behind 2 blocked threads
        w.append(b, release=lambda k=k: released.append(k))
    assert released == []
    threading.Timer(0.2, gate.set).start()  # the two running writes finish; close() drops the rest
    w.close()
    assert sorted(released) == [0, 1, 2, 3]
    assert _meta(tmp_path / "out.zarr")["complete"] is False


def test_direct_path_overwrites_an_old_chunk_and_removes_an_emptied_one(tmp_path: Path) -> None:
    x = _data()
    path = tmp_path / "out.zarr"
    w = _create(path, x, threads=2)
    _append_all(w, np.nan_to_num(x, nan=1.0))
    w.finish()
    assert (path / "values/c/0/0").exists()
    # A second run over the same rows (what --resume does after rows_done) replaces every chunk.
    w = OutputWriter.reopen(path, time_source=None, start=0, threads=2)
    _append_all(w, x)
    w.finish()
    assert not (path / "values/c/0/0").exists()
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(path / "values"), mode="r")[:]), x)


def test_fast_write_reason(tmp_path: Path) -> None:
    x = _data(rows=3000, features=6)
    w = _create(tmp_path / "out.zarr", x)
    assert fast_write_reason(w.values) is None and w.fast
    w.close()

    def array(name: str, **kw) -> zarr.Array:
        g = zarr.open_group(str(tmp_path / f"{name}.zarr"), mode="w", zarr_format=kw.pop("zarr_format", 3))
        return g.create_array("values", shape=x.shape, dtype="float32", fill_value=np.nan, **kw)

    reasons = {
        "zstd": array("zstd", chunks=(1024, 6), compressors=[ZstdCodec()]),
        "raw": array("raw", chunks=(1024, 6), compressors=None),
        "split": array("split", chunks=(1024, 4), compressors=[BloscCodec(cname="lz4")]),
        "v2": array("v2", chunks=(1024, 6), zarr_format=2),
        "sharded": array("sharded", chunks=(512, 6), shards=(1024, 6), compressors=[BloscCodec()]),
    }
    for name, arr in reasons.items():
        assert fast_write_reason(arr) is not None, name
    assert "ZstdCodec" in fast_write_reason(reasons["zstd"])
    assert "columns" in fast_write_reason(reasons["split"])
    # Blosc with other settings is still written directly, with those settings.
    other = array(
        "zlib", chunks=(1024, 6), compressors=[BloscCodec(cname="zlib", clevel=3, shuffle="bitshuffle")]
    )
    assert fast_write_reason(other) is None
    assert ChunkFileWriter(other).codec.get_config()["cname"] == "zlib"


@pytest.mark.parametrize("layout", ["zstd", "split", "v2", "blosc-zlib"])
def test_other_layouts_are_written_by_zarr_from_the_threads(tmp_path: Path, layout: str) -> None:
    x = _data(rows=5000, features=6)
    kw: dict = {
        "zstd": {"chunks": (1024, 6), "compressors": [ZstdCodec()]},
        "split": {"chunks": (1024, 4), "compressors": [BloscCodec(cname="lz4")]},
        "v2": {"chunks": (1024, 6)},
        "blosc-zlib": {"chunks": (1024, 6), "compressors": [BloscCodec(cname="zlib", clevel=1)]},
    }[layout]
    outs = []
    for threads in (0, 3):
        path = tmp_path / f"{layout}-{threads}.zarr"
        g = zarr.open_group(str(path), mode="w", zarr_format=2 if layout == "v2" else 3)
        g.create_array("values", shape=x.shape, dtype="float32", fill_value=np.nan, **kw)
        g.create_array("time", shape=(x.shape[0],), chunks=(700,), dtype="int64")  # not aligned: takes turns
        w = OutputWriter(
            zarr.open_group(str(path), mode="r+"), time_source=_time(5000), start=0, threads=threads
        )
        assert w.fast == (layout == "blosc-zlib")
        _append_all(w, x, step=333)
        w.finish()
        g = zarr.open_group(str(path), mode="r")
        np.testing.assert_array_equal(np.asarray(g["values"][:]), x)
        np.testing.assert_array_equal(np.asarray(g["time"][:]), _time(5000))
        outs.append(_files(path))
    assert outs[0] == outs[1]


def _patch_write(monkeypatch: pytest.MonkeyPatch, hook) -> None:
    """Run ``hook(a)`` before the real write of the chunk starting at row ``a`` (it may block or raise)."""
    real = OutputWriter._write

    def write(self: OutputWriter, a: int, b: int, buf: np.ndarray, *rest: int) -> None:
        hook(a)
        real(self, a, b, buf, *rest)

    monkeypatch.setattr(OutputWriter, "_write", write)


@pytest.mark.parametrize("fast", [True, False])
def test_rows_done_waits_for_a_slow_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast: bool
) -> None:
    x = _data()
    release, others_done = threading.Event(), threading.Event()
    stored: list[int] = []
    slow = 2 * CHUNK_ROWS

    def hook(a: int) -> None:
        if a == slow:
            assert release.wait(30)
        else:
            stored.append(a)
            if len(stored) >= 5:
                others_done.set()

    _patch_write(monkeypatch, hook)
    path = tmp_path / "out.zarr"
    w = _create(path, x, time_source=_time(), threads=4, buffers=8, fast=fast)
    _append_all(w, x[: 8 * CHUNK_ROWS])
    assert others_done.wait(30)
    deadline = time.monotonic() + 30
    while _meta(path)["rows_done"] < slow and time.monotonic() < deadline:  # recorded after it advances
        time.sleep(0.01)
    time.sleep(0.2)  # chunks after the slow one are stored by now, or about to be
    # rows_done stops before the slow chunk although later chunks are stored...
    assert w.rows_done == slow and _meta(path)["rows_done"] == slow
    # ... and everything it covers reads back.
    done = _meta(path)["rows_done"]
    np.testing.assert_array_equal(
        np.asarray(zarr.open_array(str(path / "values"), mode="r")[:done]), x[:done]
    )
    release.set()
    _append_all(w, x, start=8 * CHUNK_ROWS)
    w.finish()
    assert _meta(path) == {"complete": True, "rows": ROWS, "rows_done": ROWS}
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(path / "values"), mode="r")[:]), x)


def test_threads_store_on_while_one_of_them_records_rows_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow attribute write (an object store's PUT, a busy disk) is made by one thread at a time, outside
    the lock, for the latest prefix: the other threads' chunks do not queue behind one write each."""
    x = _data(rows=32 * CHUNK_ROWS)
    real, recorded, at_once, lock = OutputWriter._set_meta, [], [0, 0], threading.Lock()

    def slow(self: OutputWriter, **changes: object) -> None:
        with lock:
            at_once[0] += 1
            at_once[1] = max(at_once)
        time.sleep(0.03)
        real(self, **changes)
        with lock:
            at_once[0] -= 1
        if "complete" not in changes:
            recorded.append(changes["rows_done"])

    path = tmp_path / "out.zarr"
    w = _create(path, x, time_source=_time(32 * CHUNK_ROWS), threads=4, buffers=8)
    monkeypatch.setattr(OutputWriter, "_set_meta", slow)
    _append_all(w, x)
    w.finish()
    assert recorded == sorted(recorded) and len(recorded) < 16, recorded  # 32 chunks; coalesced
    assert at_once[1] == 1
    assert _meta(path) == {"complete": True, "rows": x.shape[0], "rows_done": x.shape[0]}
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(path / "values"), mode="r")[:]), x)


def test_a_failed_record_of_rows_done_fails_the_writer_naming_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = _data(rows=8 * CHUNK_ROWS)
    real = OutputWriter._set_meta

    def full(self: OutputWriter, **changes: object) -> None:
        if changes.get("rows_done", 0) >= 2 * CHUNK_ROWS and "complete" not in changes:
            raise OSError(28, "No space left on device")
        real(self, **changes)

    path = tmp_path / "out.zarr"
    w = _create(path, x, time_source=_time(8 * CHUNK_ROWS), threads=4)
    monkeypatch.setattr(OutputWriter, "_set_meta", full)
    with pytest.raises(
        StoreError, match=r"cannot record the rows stored in .*tsconv.rows_done = .*No space left"
    ):
        with w:
            _append_all(w, x)
            w.finish()
    meta = _meta(path)
    assert meta["complete"] is False and meta["rows_done"] < 2 * CHUNK_ROWS
    assert not [th for th in threading.enumerate() if th.name.startswith("tsconv-write")]


@pytest.mark.parametrize(("threads", "fast"), [(4, True), (4, False), (0, True)])
def test_a_failed_write_surfaces_and_resume_finishes_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int, fast: bool
) -> None:
    x, t = _data(), _time()
    bad = 5 * CHUNK_ROWS

    def hook(a: int) -> None:
        if a == bad:
            raise OSError(28, "No space left on device")

    _patch_write(monkeypatch, hook)
    path = tmp_path / "out.zarr"
    w = _create(path, x, time_source=t, threads=threads, fast=fast)
    with pytest.raises(StoreError, match=rf"rows {bad:,}\.\.{bad + CHUNK_ROWS:,} of .*No space left") as err:
        with w:
            _append_all(w, x)
            w.finish()
    assert isinstance(err.value.__cause__, OSError)
    assert not [th for th in threading.enumerate() if th.name.startswith("tsconv-write")]
    meta = _meta(path)
    assert meta["complete"] is False
    assert meta["rows_done"] == w.rows_done == bad  # the chunks before it finished; none after counts
    with pytest.raises(ValueError, match="closed"):
        w.append(x[:10])

    monkeypatch.undo()
    w = OutputWriter.reopen(path, time_source=t, start=meta["rows_done"], threads=threads, fast=fast)
    _append_all(w, x, start=meta["rows_done"])
    w.finish()
    g = zarr.open_group(str(path), mode="r")
    assert g.attrs["tsconv"]["complete"] is True
    np.testing.assert_array_equal(np.asarray(g["values"][:]), x)
    np.testing.assert_array_equal(np.asarray(g["time"][:]), t)


def test_a_full_disk_before_any_row_names_the_store_and_leaves_nothing_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full disk while a new store was laid out, or while a resume took its store over, stopped `tsconv
    # process` with a bare "[Errno 28] No space left on device" naming no file (a file's close raises it
    # so), and creation left the half-made store beside the output.
    x, t = _data(), _time()
    path = tmp_path / "out.zarr"

    def full(self: Path, *args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full)
    space = r"No space left on device; hint: free space on its disk"
    with pytest.raises(
        StoreError, match=rf"cannot create the output store '{re.escape(str(path))}': .*{space}"
    ):
        _create(path, x, time_source=t, input_digest={"version": 1})
    assert list(tmp_path.iterdir()) == []

    monkeypatch.undo()
    with _create(path, x, time_source=t) as w:  # closed unfinished: an output to resume
        _append_all(w, x[: 3 * CHUNK_ROWS])
    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(
        StoreError, match=rf"cannot continue the output store '{re.escape(str(path))}': .*{space}"
    ):
        OutputWriter.reopen(path, time_source=t, start=_meta(path)["rows_done"], run_id="r" * 32)
    with pytest.raises(StoreError, match=rf"cannot record the input's digest in the output store .*{space}"):
        write_digest(path, {"version": 1})
    assert _meta(path)["complete"] is False


def test_a_failure_in_the_last_chunk_surfaces_at_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = _data()
    last = (ROWS // CHUNK_ROWS) * CHUNK_ROWS

    def hook(a: int) -> None:
        if a == last:
            time.sleep(0.2)  # fails after the last append has returned
            raise OSError("disk gone")

    _patch_write(monkeypatch, hook)
    path = tmp_path / "out.zarr"
    w = _create(path, x, threads=2)
    _append_all(w, x)  # no error yet
    with pytest.raises(StoreError, match=rf"rows {last:,}\.\.{ROWS:,} .*disk gone"):
        w.finish()
    assert _meta(path) == {"complete": False, "rows": ROWS, "rows_done": last}


def test_close_after_an_engine_error_stops_threads_and_leaves_the_store_incomplete(tmp_path: Path) -> None:
    x = _data()
    path = tmp_path / "out.zarr"
    with pytest.raises(ZeroDivisionError), _create(path, x, threads=3) as w:
        _append_all(w, x[: 4 * CHUNK_ROWS + 10])
        1 / 0  # noqa: B018 (the engine failing mid-run)
    assert not [th for th in threading.enumerate() if th.name.startswith("tsconv-write")]
    meta = _meta(path)
    assert meta["complete"] is False and meta["rows_done"] == w.rows_done
    assert meta["rows_done"] % CHUNK_ROWS == 0 and meta["rows_done"] <= 4 * CHUNK_ROWS
    done = meta["rows_done"]
    np.testing.assert_array_equal(
        np.asarray(zarr.open_array(str(path / "values"), mode="r")[:done]), x[:done]
    )


def test_buffers_are_bounded_and_append_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x = _data()
    _patch_write(monkeypatch, lambda a: time.sleep(0.05))
    w = _create(tmp_path / "out.zarr", x, threads=2, buffers=3)
    _append_all(w, x)
    w.finish()
    assert w._allocated == 3
    assert w.wait_seconds > 0.1  # 10 chunks of 50 ms on 2 threads: append had to wait for buffers
    assert w.busy_seconds >= 10 * 0.05
    np.testing.assert_array_equal(
        np.asarray(zarr.open_array(str(tmp_path / "out.zarr/values"), mode="r")[:]), x
    )


@pytest.mark.parametrize(
    "start, kept", [(4 * CHUNK_ROWS, 300), (0, 500), (9 * CHUNK_ROWS, ROWS - 9 * CHUNK_ROWS)]
)
@pytest.mark.parametrize("mode", ["direct-threads", "zarr-sync"])
def test_rows_kept_at_a_reopen_are_read_back_and_stored_with_the_new_ones(
    tmp_path: Path, mode: str, start: int, kept: int
) -> None:
    # An update computes from the engine chunk holding the old end: the rows of the output chunk before it
    # are kept as stored (chunk 0 has no file: all NaN), the chunk written again with the rows after them.
    x, t = _data(), _time()
    path, want = tmp_path / "out.zarr", tmp_path / "want.zarr"
    with _create(path, x, time_source=t, **MODES[mode]) as w:
        _append_all(w, x)
        w.finish()
    y = x.copy()
    y[start + kept :] += 1.0
    with _create(want, y, time_source=t, **MODES[mode]) as w:
        _append_all(w, y)
        w.finish()
    w = OutputWriter.reopen(path, time_source=t, start=start, **MODES[mode])
    w.keep(kept)
    _append_all(w, y, start=start + kept)
    w.finish()
    assert np.asarray(zarr.open_group(str(path), mode="r")["values"][:]).tobytes() == y.tobytes()
    assert _files(path) == _files(want)
    with pytest.raises(RuntimeError, match="not within one chunk"):
        with OutputWriter.reopen(path, time_source=t, start=start, **MODES[mode]) as w:
            w.keep(CHUNK_ROWS + 1)


def test_a_kill_mid_write_leaves_the_old_chunk_and_reopen_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = _data()
    path = tmp_path / "out.zarr"
    w = _create(path, x, threads=0)
    _append_all(w, x[: 3 * CHUNK_ROWS])
    w.close()
    before = (path / "values/c/2/0").read_bytes()

    def torn_replace(src, dst) -> None:  # the process dies between writing the file and renaming it
        raise KeyboardInterrupt

    w = OutputWriter.reopen(path, time_source=None, start=2 * CHUNK_ROWS, threads=0)
    monkeypatch.setattr(os, "replace", torn_replace)
    with pytest.raises(KeyboardInterrupt):
        w.append(x[2 * CHUNK_ROWS : 3 * CHUNK_ROWS] + 1)
    monkeypatch.undo()
    assert (path / "values/c/2/0").read_bytes() == before  # never torn
    (path / "values/c/2/0.deadbeef.partial").write_bytes(b"half a chunk")  # what a real kill -9 leaves
    (path / "zarr.json.deadbeef.partial").write_text('{"half": ')  # ... or one during a progress update
    w = OutputWriter.reopen(path, time_source=None, start=2 * CHUNK_ROWS, threads=2)
    assert not list(path.rglob("*.partial"))
    _append_all(w, x, start=2 * CHUNK_ROWS)
    w.finish()
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(path / "values"), mode="r")[:]), x)


def test_reopening_searches_for_temporary_files_only_from_its_start(tmp_path: Path) -> None:
    """Rows before a resume's start are stored whole, so a kill left nothing there: only the chunk
    directories from the start on are searched (what reopening costs does not grow with the history)."""
    from tsconv.io.writers.encode import remove_partial_files

    x = _data()
    path = tmp_path / "out.zarr"
    w = _create(path, x, threads=0)
    _append_all(w, x[: 6 * CHUNK_ROWS])
    w.close()
    planted = ["values/c/1/0.a.partial", "values/c/4/0.b.partial", "values/c/7/0.c.partial", "values/c/9/0.d.partial",
               "values/zarr.json.f.partial"]  # fmt: skip
    for name in planted:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(b"half a chunk")
    g = zarr.open_group(str(path), mode="r+")
    assert remove_partial_files(g["values"], from_row=4 * CHUNK_ROWS + 5) == 4  # bands 4, 7, 9; the doc
    assert sorted(str(p.relative_to(path)) for p in path.rglob("*.partial")) == ["values/c/1/0.a.partial"]
    assert remove_partial_files(g["values"]) == 1  # from row 0: all of them


def test_a_kept_chunk_cut_short_is_a_store_error_not_other_rows(tmp_path: Path) -> None:
    """An update reads its output's last chunk back (keep): a chunk file that lost its last bytes was decoded
    from whatever lay past them (c-blosc takes the frame's length from its header) and those rows were
    stored again as the output's own, silently (Blosc at level 0, --compression none, stores the values as
    they are)."""
    x = _data()
    path = tmp_path / "out.zarr"
    with _create(path, x, compression="none", threads=0) as w:
        _append_all(w, x)
        w.finish()
    file = path / "values" / "c" / "3" / "0"
    file.write_bytes(file.read_bytes()[:-480])  # its last ten rows
    with OutputWriter.reopen(path, time_source=None, start=3 * CHUNK_ROWS, threads=0) as w:
        with pytest.raises(
            StoreError, match=r"rows 3,072..4,096 of .* back .*cut short.*; hint: .*--overwrite"
        ):
            w.keep(CHUNK_ROWS)


def _encode_cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    prices = (100 + np.cumsum(rng.integers(-1, 2, size=(6000, 131)), axis=0) * 0.01).astype(np.float32)
    padded = np.full_like(prices, np.nan)
    padded[:4700] = prices[:4700]  # an edge chunk, as the writer pads it
    return {  # 2.3-4.8 MB: two to four parts of whole MiBs and a leftover
        "prices": prices,
        "noise": rng.random((6000, 131)).astype(np.float32),  # next to incompressible
        "zeros": np.zeros((6000, 131), np.float32),
        "nan-padded": padded,
        "int64": np.arange(300_001, dtype=np.int64) * 3,
        "float64": np.cumsum(rng.normal(size=(3001, 200)), axis=0),
    }


@pytest.mark.parametrize(
    "cname, levels",
    [("lz4", (1, 5, 9)), ("zstd", (1, 5)), pytest.param("blosclz", (1, 5, 9), marks=pytest.mark.slow),
     pytest.param("lz4hc", (1, 5, 9), marks=pytest.mark.slow), pytest.param("zstd", (9,), marks=pytest.mark.slow),
     pytest.param("zlib", (1, 5, 9), marks=pytest.mark.slow)],
)  # fmt: skip
def test_a_chunk_encoded_in_parts_is_the_single_thread_encode_byte_for_byte(
    cname: str, levels: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tsconv.io.writers.encode import encode_in_parts

    # the reference: one thread's encode (in the main thread numcodecs would use c-blosc's threads,
    # which order the blocks as they finish)
    monkeypatch.setattr(numcodecs.blosc, "use_threads", False)
    joined = 0
    for name, x in _encode_cases().items():
        for clevel in levels:
            for shuffle in (0, 1, 2):
                codec = numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=shuffle, typesize=x.itemsize)
                want = bytes(codec.encode(x))
                for parts in (2, 3, 8):
                    got = encode_in_parts(codec, x, parts)
                    assert b"".join(bytes(p) for p in got) == want, (name, clevel, shuffle, parts)
                    joined += len(got) > 1
                    assert np.array_equal(
                        codec.decode(b"".join(got), out=np.empty_like(x)), x, equal_nan=True
                    )
    assert joined >= 8 * len(levels)  # most cases are joined from parts, not the fallback's single encode


@pytest.mark.parametrize("parts", [4, 8])
def test_a_forced_block_size_larger_than_a_part_is_the_single_thread_encode(
    parts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block size set in the codec (zarr's BloscCodec(blocksize=...)) that c-blosc keeps whole (values too
    wide to split into streams) is cut to a part's size when the part is smaller: the frame was joined from
    2 or 1 MiB blocks where one encode makes 4 MiB ones (other bytes, the same values)."""
    from tsconv.io.writers.encode import encode_in_parts

    monkeypatch.setattr(numcodecs.blosc, "use_threads", False)
    x = np.cumsum(np.random.default_rng(3).normal(size=(1 << 21, 1)), axis=0).astype(np.float32)  # 8 MiB
    codec = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1, blocksize=1 << 22, typesize=32)
    want = bytes(codec.encode(x))
    assert struct.unpack_from("<I", want, 8)[0] == 1 << 22
    assert b"".join(bytes(p) for p in encode_in_parts(codec, x, parts)) == want


def _uneven_blocks() -> np.ndarray:
    """4 MB whose first blocks are noise and whose last are zeros: c-blosc's own threads finish the zero
    blocks first and would store them first."""
    noise = np.random.default_rng(0).random(500_000).astype(np.float32)
    return np.concatenate([noise, np.zeros(500_000, np.float32)]).reshape(-1, 100)


@pytest.mark.parametrize("parts", [1, 3])
def test_an_encode_from_the_main_thread_is_the_single_thread_frame(
    parts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tsconv.io.writers.encode import encode_in_parts

    x = _uneven_blocks()
    codec = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1, typesize=4)
    monkeypatch.setattr(numcodecs.blosc, "use_threads", False)
    want = bytes(codec.encode(x))
    monkeypatch.setattr(numcodecs.blosc, "use_threads", None)  # numcodecs' own default (zarr sets False)
    assert threading.current_thread() is threading.main_thread()
    for _ in range(10):
        assert b"".join(bytes(p) for p in encode_in_parts(codec, x, parts)) == want


@pytest.mark.parametrize("threads", [0, 1])
def test_a_writer_without_worker_threads_writes_the_same_bytes_each_run(
    tmp_path: Path, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # zarr turns numcodecs' use of c-blosc's threads off when it is imported; a script may turn it back on
    monkeypatch.setattr(numcodecs.blosc, "use_threads", None)
    x = np.concatenate([_uneven_blocks()] * 4)
    runs = []
    for run in range(3):
        path = tmp_path / f"out-{run}.zarr"
        w = OutputWriter.create(path, rows=len(x), names=tuple(f"y{j}" for j in range(100)), chunk_rows=len(x) // 4,
                                time_source=None, attrs={"tsconv": {"complete": False}}, threads=threads)  # fmt: skip
        _append_all(w, x, step=len(x) // 4)
        w.finish()
        runs.append([(path / "values" / "c" / str(band) / "0").read_bytes() for band in range(4)])
    assert runs[1] == runs[0] and runs[2] == runs[0]
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(tmp_path / "out-0.zarr" / "values"))[:]), x)


def test_a_failure_in_a_part_is_raised_as_the_encode_would_raise_it() -> None:
    from tsconv.io.writers.encode import encode_in_parts

    class Failing(numcodecs.Blosc):
        def encode(self, buf):  # noqa: ANN001, ANN202
            if np.asarray(buf).size < 400_000:  # the pieces of 1 MiB, encoded in other threads
                raise MemoryError("no room for the frame")
            return super().encode(buf)

    x = np.arange(1_000_000, dtype=np.float32)  # 4 MB: pieces of 1 MiB, 1 MiB and the rest
    with pytest.raises(MemoryError, match="no room"):
        encode_in_parts(Failing(cname="lz4", clevel=5, shuffle=1, typesize=4), x, 3)


def test_a_chunk_alone_is_encoded_in_parts_and_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last chunk with no other write in flight (an update's only chunk) is encoded by every writer
    thread; chunks among others by one each."""
    import tsconv.io.writers.encode as encode

    seen: list[int] = []
    real = encode.encode_in_parts
    monkeypatch.setattr(
        encode, "encode_in_parts", lambda c, x, parts: (seen.append(parts), real(c, x, parts))[1]
    )
    x = np.cumsum(np.random.default_rng(2).normal(size=(16_000, 48)), axis=0).astype(np.float32)
    for rows, want in ((16_000, [3]), (16_384 * 3, [1, 1])):
        path = tmp_path / f"out-{rows}.zarr"
        data = np.concatenate([x] * 4)[:rows]
        w = OutputWriter.create(path, rows=rows, names=tuple(f"y{j}" for j in range(48)), chunk_rows=16_384,
                                time_source=None, attrs={"tsconv": {"complete": False}}, threads=3)  # fmt: skip
        seen.clear()
        _append_all(w, data, step=20_000)
        w.finish()
        assert seen[: len(want)] == want, seen
        np.testing.assert_array_equal(np.asarray(zarr.open_array(str(path / "values"), mode="r")[:]), data)


def test_rows_computed_where_reserve_put_them_are_stored_without_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tsconv.io.writers.zarr_writer as zw

    x = _data()
    w = _create(tmp_path / "out.zarr", x, threads=2)
    in_place: list[bool] = []
    real = zw.is_rows_of
    monkeypatch.setattr(zw, "is_rows_of", lambda *a: (in_place.append(real(*a)), in_place[-1])[1])
    pos = 0
    while pos < ROWS:
        place = w.reserve(1500)  # more than a chunk's room is cut at the chunk's end
        assert place is not None and place.shape == (
            min(1500, CHUNK_ROWS - pos % CHUNK_ROWS, ROWS - pos),
            FEATURES,
        )
        place[:] = x[pos : pos + place.shape[0]]
        w.append(place)
        pos += place.shape[0]
    assert w.reserve(1) is None  # no rows left
    w.finish()
    assert in_place and all(in_place)
    np.testing.assert_array_equal(
        np.asarray(zarr.open_array(str(tmp_path / "out.zarr" / "values"), mode="r")[:]), x
    )


def test_a_cpu_bank_run_computes_into_the_writers_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CPU engine computes a bank pipeline's rows in the output writer's own chunk buffers (no copy of
    every output byte), in calls cut at each chunk's end; the output is the same as computed by the
    in-memory path."""
    import tsconv
    import tsconv.engine.outputs
    import tsconv.io.writers.zarr_writer as zw

    from ..helpers import write_store

    x = price_series(5000, 6)
    src = write_store(tmp_path / "in.zarr", x, chunks=(700, 6))
    monkeypatch.setattr(tsconv.engine.outputs, "output_chunk_rows", lambda chunk, n_outputs: 3 * chunk)
    hits: list[bool] = []
    real = zw.is_rows_of
    monkeypatch.setattr(zw, "is_rows_of", lambda *a: (hits.append(real(*a)), hits[-1])[1])
    tsconv.process(src, tmp_path / "out.zarr", pipeline="default", chunk=128, device="cpu")
    assert hits and all(hits), hits
    got = np.asarray(zarr.open_group(str(tmp_path / "out.zarr"), mode="r")["values"][:])
    want = tsconv.features(x, "default", chunk=128, device="cpu")
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def test_region_writers_leave_the_attributes_alone(tmp_path: Path) -> None:
    x = _data()
    path = tmp_path / "out.zarr"
    _create(path, x).close()
    for a, b in [(4 * CHUNK_ROWS, ROWS), (0, 4 * CHUNK_ROWS)]:
        w = OutputWriter.region(path, time_source=None, start=a, stop=b, threads=3)
        _append_all(w, x[:b], start=a)
        w.finish()
        assert w.rows_done == b
    assert _meta(path) == {"complete": False, "rows": ROWS, "rows_done": 0}
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(path / "values"), mode="r")[:]), x)


_KILLED_WRITER = """
import os, signal, sys, time
import numpy as np
from pathlib import Path
from tsconv.io.writers.zarr_writer import OutputWriter

x, path, kill_row = np.load(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
real = OutputWriter._write

def write(self, a, b, buf, *rest):
    if a == kill_row:
        time.sleep(0.3)  # let the other threads store (or half-store) later chunks first
        os.kill(os.getpid(), signal.SIGKILL)
    real(self, a, b, buf, *rest)

OutputWriter._write = write
w = OutputWriter.create(path, rows=x.shape[0], names=tuple(f"y{j}" for j in range(x.shape[1])),
                        chunk_rows=int(sys.argv[4]), time_source=None,
                        attrs={"tsconv": {"complete": False, "rows": x.shape[0], "rows_done": 0}}, threads=4)
for a in range(0, x.shape[0], 500):
    w.append(x[a : a + 500])
w.finish()
"""


def test_kill_9_during_threaded_writes_then_resume(tmp_path: Path) -> None:
    x = _data()
    np.save(tmp_path / "x.npy", x)
    want = tmp_path / "want.zarr"
    w = _create(want, x, threads=0, fast=False)
    _append_all(w, x)
    w.finish()

    path, kill_row = tmp_path / "out.zarr", 3 * CHUNK_ROWS
    args = [
        sys.executable,
        "-c",
        _KILLED_WRITER,
        str(tmp_path / "x.npy"),
        str(path),
        str(kill_row),
        str(CHUNK_ROWS),
    ]
    proc = subprocess.run(args, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()
    done = _meta(path)["rows_done"]
    assert done <= kill_row and done % CHUNK_ROWS == 0 and _meta(path)["complete"] is False
    assert (path / "values/c/4/0").exists()  # a later chunk was stored, yet rows_done did not pass the gap
    stored = np.asarray(zarr.open_array(str(path / "values"), mode="r")[:done])
    np.testing.assert_array_equal(stored, x[:done])

    w = OutputWriter.reopen(path, time_source=None, start=done, threads=4)
    _append_all(w, x, start=done)
    w.finish()
    assert _meta(path)["complete"] is True
    assert _files(path) == _files(want)  # byte for byte what an uninterrupted zarr run writes


def _noise(rows: int = ROWS, features: int = FEATURES, seed: int = 1) -> np.ndarray:
    """Float features LZ4 cannot shrink much (the e2e pipeline's outputs save about 7%)."""
    return np.random.default_rng(seed).standard_normal((rows, features)).astype(np.float32)


def _values_clevel(path: Path) -> int:
    codecs = zarr.open_group(str(path), mode="r")["values"].metadata.codecs
    return int(next(c for c in codecs if isinstance(c, BloscCodec)).clevel)


@pytest.mark.parametrize("threads", [0, 4])
def test_auto_compression_stores_values_lz4_cannot_shrink_uncompressed(tmp_path: Path, threads: int) -> None:
    x, t = _noise(), _time()
    path = tmp_path / "auto.zarr"
    w = _create(path, x, time_source=t, threads=threads)  # compression="auto", the default
    _append_all(w, x)
    w.finish()
    assert w.compression.startswith("none (auto: lz4 saved"), w.compression
    assert _values_clevel(path) == 0  # the metadata says how the chunks are stored
    g = zarr.open_group(str(path), mode="r")
    assert np.array_equal(np.asarray(g["values"][:]).view(np.uint32), x.view(np.uint32))
    np.testing.assert_array_equal(np.asarray(g["time"][:]), t)
    with ParallelBandReader(g["values"], threads=2) as reader:
        assert reader.fast
        np.testing.assert_array_equal(reader.read(0, ROWS), x)
    # every chunk file holds the bytes zarr writes for that codec; the time column stays lz4
    ref = tmp_path / "ref.zarr"
    rw = _create(ref, x, time_source=t, threads=0, fast=False, compression="none")
    _append_all(rw, x)
    rw.finish()
    assert _files(path) == _files(ref)
    time_codec = next(c for c in g["time"].metadata.codecs if isinstance(c, BloscCodec))
    assert int(time_codec.clevel) == 5
    assert sum(len(v) for k, v in _files(path).items() if k.startswith("values")) > x.nbytes


def test_auto_compression_keeps_lz4_where_it_pays(tmp_path: Path) -> None:
    x = price_series(ROWS, FEATURES, seed=4)  # prices on a tick grid: LZ4 with shuffle saves a lot
    path = tmp_path / "auto.zarr"
    w = _create(path, x, threads=3)
    _append_all(w, x)
    w.finish()
    assert w.compression.startswith("lz4 (auto: it saved"), w.compression
    assert _values_clevel(path) == 5
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(path / "values"), mode="r")[:]), x)
    assert sum(len(v) for v in _files(path).values()) < 0.8 * x.nbytes


@pytest.mark.parametrize("threads", [0, 3])
def test_auto_compression_decides_from_values_not_from_leading_all_nan_chunks(
    tmp_path: Path, threads: int
) -> None:
    """Symbols that start late leave an output's first chunks all NaN: they are not stored, and a sample of
    them would say LZ4 "saved 100%". The codec is chosen from the first chunk that holds a value, past the rows
    without one: noise there is stored uncompressed, prices compressed."""
    for name, body, want in (
        ("noise", _noise(), "none (auto"),
        ("prices", price_series(ROWS, FEATURES, seed=4), "lz4 (auto"),
    ):
        x = body.copy()
        x[: 2 * CHUNK_ROWS + 300] = np.nan  # two chunks of nothing, then 300 NaN rows in the third
        path = tmp_path / f"{name}.zarr"
        w = _create(path, x, threads=threads)
        _append_all(w, x)
        w.finish()
        assert w.compression.startswith(want) and "100%" not in w.compression, (name, w.compression)
        assert _values_clevel(path) == (0 if name == "noise" else 5)
        got = np.asarray(zarr.open_array(str(path / "values"), mode="r")[:])
        assert np.array_equal(got.view(np.uint32), x.view(np.uint32))
        assert not (
            path / "values" / "c" / "0" / "0"
        ).exists()  # an all-NaN chunk is left out, as zarr leaves it


@pytest.mark.parametrize(("compression", "clevel"), [("lz4", 5), ("none", 0)])
def test_forced_compression_is_kept_whatever_the_data(tmp_path: Path, compression: str, clevel: int) -> None:
    x = _noise() if compression == "lz4" else price_series(ROWS, FEATURES, seed=4)
    path = tmp_path / f"{compression}.zarr"
    w = _create(path, x, threads=2, compression=compression)
    _append_all(w, x)
    w.finish()
    assert w.compression == compression and _values_clevel(path) == clevel
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(path / "values"), mode="r")[:]), x)


def test_a_resumed_writer_keeps_the_codec_auto_chose(tmp_path: Path) -> None:
    x = _noise()
    path = tmp_path / "out.zarr"
    w = _create(path, x, threads=2)
    _append_all(w, x[: 4 * CHUNK_ROWS])
    w._drain()
    w.close()
    assert _values_clevel(path) == 0
    r = OutputWriter.reopen(path, time_source=None, start=4 * CHUNK_ROWS, threads=2)
    assert r.compression == "none"
    _append_all(r, x, start=4 * CHUNK_ROWS)
    r.finish()
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(path / "values"), mode="r")[:]), x)


def test_an_unknown_compression_is_refused(tmp_path: Path) -> None:
    from tsconv.errors import TsconvError

    with pytest.raises(TsconvError, match="unknown output compression 'zip'"):
        _create(tmp_path / "o.zarr", _noise(), compression="zip")
    assert not (tmp_path / "o.zarr").exists()


@pytest.mark.parametrize(
    ("compression", "with_time", "rows"), [("lz4", True, 1000), ("none", False, 50), ("auto", True, 300)]
)
def test_the_new_stores_metadata_equals_zarrs_own(tmp_path: Path, compression, with_time, rows) -> None:
    """create() writes the metadata files and the feature names itself (writer._write_layout): the files zarr
    would write."""
    import json

    names = ("f0", "f1", "f2")
    attrs = {"tsconv": {"format": 1, "rows_done": 0, "x": [1.5, None]}, "pipeline": {"conv": [{"k": 3}]},
             "source": "ticks.zarr"}  # fmt: skip
    src = None
    if with_time:
        src = zarr.create_array(str(tmp_path / "t.zarr"), shape=(rows,), chunks=(64,), dtype="int64")
        src[:] = _time(rows)
    OutputWriter.create(tmp_path / "ours.zarr", rows=rows, names=names, chunk_rows=128, time_source=src,
                        attrs=attrs, compression=compression).close()  # fmt: skip
    g = zarr.open_group(str(tmp_path / "zarr.zarr"), mode="w-", zarr_format=3)
    codec = BloscCodec(cname="lz4", clevel=0 if compression == "none" else 5, shuffle="shuffle")
    g.create_array("values", shape=(rows, 3), chunks=(min(128, rows), 3), dtype="float32", compressors=[codec],
                   fill_value=np.nan, dimension_names=("time", "feature"))  # fmt: skip
    if with_time:
        g.create_array("time", shape=(rows,), chunks=(min(128, rows),), dtype="int64",
                       compressors=[BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")], dimension_names=("time",),
                       attributes={"units": "nanoseconds since 1970-01-01", "calendar": "proleptic_gregorian"})  # fmt: skip
    g.create_array(
        "feature", shape=(3,), chunks=(3,), dtype=str, compressors=None, dimension_names=("feature",)
    )
    g["feature"][:] = np.array(names)
    g.attrs.update({**attrs, "features": list(names)})
    files = ["zarr.json", "values/zarr.json", "feature/zarr.json", "feature/c/0"]
    files += ["time/zarr.json"] if with_time else []
    assert sorted(str(p.relative_to(tmp_path / "ours.zarr")) for p in (tmp_path / "ours.zarr").rglob("*")
                  if p.is_file()) == sorted(files)  # fmt: skip
    for rel in files:
        ours, theirs = (
            (tmp_path / "ours.zarr" / rel).read_bytes(),
            (tmp_path / "zarr.zarr" / rel).read_bytes(),
        )
        assert (json.loads(ours) == json.loads(theirs)) if rel.endswith(".json") else ours == theirs, rel
    ours = zarr.open_group(str(tmp_path / "ours.zarr"), mode="r")
    assert ours["values"].shape == (rows, 3) and np.isnan(ours["values"][:5]).all()


def test_consolidating_silences_zarrs_one_message_not_other_warnings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Consolidating silenced every UserWarning of the process while zarr ran (catch_warnings swaps the process's
    filters): another thread's TsconvWarning went unseen, and two such blocks interleaved left the filter for
    good. Only zarr's message about format 3 is silenced, and the filters are as they were after."""
    import warnings

    from tsconv.errors import TsconvWarning
    from tsconv.io.writers import zarr_writer

    zarr.open_group(str(tmp_path / "g.zarr"), mode="w").create_array("a", data=np.zeros(3, np.float32))
    real = zarr.consolidate_metadata

    def noisy(*args: object, **kwargs: object) -> object:
        warnings.warn(
            "Consolidated metadata is currently not part in the Zarr format 3 spec", UserWarning, stacklevel=1
        )
        warnings.warn("another thread's warning", TsconvWarning, stacklevel=1)
        return real(*args, **kwargs)

    monkeypatch.setattr(zarr_writer.zarr, "consolidate_metadata", noisy)
    before = list(warnings.filters)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        zarr_writer.write_consolidated(tmp_path / "g.zarr")
    assert [str(w.message) for w in seen] == ["another thread's warning"]
    assert warnings.filters == before
    assert zarr.open_consolidated(str(tmp_path / "g.zarr")).metadata.consolidated_metadata is not None


@pytest.mark.parametrize(
    ("codecs", "want"),
    [
        ("lz4", "lz4"),
        ("clevel0", "none"),
        ("zstd", None),  # not Blosc: the codecs' names, as zarr's open gives them
    ],
)
def test_stored_compression_reads_the_values_document_as_zarr_does(tmp_path, codecs, want) -> None:
    from tsconv.io.writers import zarr_writer

    compressors = {
        "lz4": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
        "clevel0": [BloscCodec(cname="lz4", clevel=0, shuffle="shuffle")],
        "zstd": [ZstdCodec()],
    }[codecs]
    g = zarr.open_group(str(tmp_path / "o.zarr"), mode="w")
    g.create_array("values", shape=(8, 2), chunks=(4, 2), dtype="float32", serializer=BytesCodec(),
                   compressors=compressors)  # fmt: skip
    through_zarr = zarr_writer._compression_of(zarr.open_group(str(tmp_path / "o.zarr"), mode="r")["values"])
    got = zarr_writer.stored_compression(tmp_path / "o.zarr")
    assert got == through_zarr
    if want is not None:
        assert got == want


def test_auto_compression_decides_from_the_first_chunk_whichever_writer_thread_stores_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first chunk holding a value decides, not the one a writer thread happens to store first: a run's
    1-row last chunk stored before its first chunk decided "none" (LZ4 cannot shrink 48 bytes) for prices LZ4
    halves, so the same run's output was stored compressed or not by the threads' timing."""
    x = price_series(CHUNK_ROWS + 1, FEATURES, seed=4)
    store = OutputWriter._store

    def first_chunk_late(self: OutputWriter, a: int, *args: object, **kw: object) -> None:
        if a == 0:
            time.sleep(0.3)  # the first chunk's thread is slow: the last chunk's stores first
        store(self, a, *args, **kw)

    monkeypatch.setattr(OutputWriter, "_store", first_chunk_late)
    path = tmp_path / "auto.zarr"
    w = _create(path, x, threads=2)
    _append_all(w, x)
    w.finish()
    assert w.compression.startswith("lz4 (auto: it saved"), w.compression
    assert _values_clevel(path) == 5
    np.testing.assert_array_equal(np.asarray(zarr.open_array(str(path / "values"), mode="r")[:]), x)
