"""Stores at URLs: s3:// against a local S3 server (moto's server mode, started here), memory://, and the
errors a user can act on. Skipped without moto and s3fs (the dev extra installs them)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import tsconv
from tsconv.cli import main
from tsconv.errors import OutputBusyError, StoreError
from tsconv.io.lock import ObjectLock
from tsconv.io.objstore import StoreURL, location, remote_error
from tsconv.io.readers.prefetch import PrefetchReader

from ..helpers import price_series, read_output, write_store

PIPE = "trend_ema"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """A bucket on a moto S3 server on a free local port, with the environment s3fs reads pointed at it;
    yields its URL."""
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    s3fs = pytest.importorskip("s3fs", reason="s3fs is not installed")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = _free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_REGION": "us-east-1",
        }.items():
            mp.setenv(name, value)
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
            mp.delenv(name, raising=False)
        s3fs.S3FileSystem.clear_instance_cache()  # instances keep the endpoint they were made with
        s3fs.S3FileSystem().mkdir("tsconv-test")
        try:
            yield "s3://tsconv-test"
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
            server.stop()


@pytest.fixture
def prefix(s3: str) -> str:
    """A fresh prefix in the bucket for one test."""
    return f"{s3}/{uuid.uuid4().hex[:8]}"


def _cli(*args: object) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def _one_error_line(res: object) -> str:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("tsconv: error: "), res.output
    assert "Traceback" not in res.output
    return lines[0]


@pytest.fixture(scope="module")
def series() -> np.ndarray:
    return price_series(2000, 4, seed=3, nan_fraction=0.01)


@pytest.fixture(scope="module")
def s3_input(s3: str, series: np.ndarray) -> str:
    """The series as a store in the bucket, written with plain zarr (every test reads it, none writes it)."""
    return str(write_store(f"{s3}/input/in.zarr", series, chunks=(1024, 4)))


@pytest.fixture(scope="module")
def local_run(series: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """The input as a local store and the output of a local run: what every URL run must equal."""
    d = tmp_path_factory.mktemp("local")
    src = write_store(d / "in.zarr", series, chunks=(1024, 4))
    tsconv.process(src, d / "out.zarr", pipeline=PIPE, device="cpu")
    return src, read_output(d / "out.zarr")


def test_process_s3_to_s3_and_to_local_equals_a_local_run(prefix, s3_input, local_run, tmp_path):
    src = s3_input
    res = _cli("process", "-i", src, "-o", f"{prefix}/out.zarr", "--pipeline", PIPE, "--device", "cpu", "-q")
    assert res.exit_code == 0, res.output
    g = zarr.open_group(f"{prefix}/out.zarr", mode="r")
    assert g.attrs["tsconv"]["complete"] and g.attrs["source"] == src
    np.testing.assert_array_equal(np.asarray(g["values"][:]), local_run[1])
    assert g.metadata.consolidated_metadata is not None  # written with the complete mark
    res = _cli("process", "-i", src, "-o", tmp_path / "out.zarr", "--pipeline", PIPE, "--device", "cpu", "-q")
    assert res.exit_code == 0, res.output
    np.testing.assert_array_equal(read_output(tmp_path / "out.zarr"), local_run[1])
    # local -> s3 through the library, replacing the first output (--overwrite)
    tsconv.process(local_run[0], f"{prefix}/out.zarr", pipeline=PIPE, device="cpu", overwrite=True)
    g = zarr.open_group(f"{prefix}/out.zarr", mode="r")
    assert g.attrs["source"] == str(local_run[0]) and g.attrs["tsconv"]["complete"]
    np.testing.assert_array_equal(np.asarray(g["values"][:]), local_run[1])
    assert not [k for k in StoreURL.parse(prefix).objects() if k.endswith(".tsconv-lock")]


def test_existing_s3_output_overwrite_and_resume(prefix, s3_input, series, local_run):
    src = s3_input
    out = f"{prefix}/out.zarr"
    tsconv.process(src, out, pipeline=PIPE, device="cpu")
    line = _one_error_line(_cli("process", "-i", src, "-o", out, "--pipeline", PIPE, "--device", "cpu", "-q"))
    assert "already exists" in line and "--overwrite" in line
    res = _cli("process", "-i", src, "-o", out, "--pipeline", PIPE, "--device", "cpu", "-q", "--resume")
    assert res.exit_code == 0 and "already complete" in res.output, res.output
    # an interrupted run (marked incomplete, nothing written): --resume computes the rows again
    g = zarr.open_group(out, mode="r+")
    g.attrs["tsconv"] = {**g.attrs["tsconv"], "complete": False, "rows_done": 0}
    line = _one_error_line(_cli("process", "-i", out, "-q", "--device", "cpu"))  # not an input yet
    assert "unfinished tsconv run" in line
    report = tsconv.process(src, out, pipeline=PIPE, device="cpu", resume=True)
    assert report.rows == series.shape[0]
    np.testing.assert_array_equal(np.asarray(zarr.open_group(out)["values"][:]), local_run[1])
    # --overwrite refuses a store holding objects that are not zarr data (the replacement itself:
    # test_process_s3_to_s3_and_to_local_equals_a_local_run)
    StoreURL.parse(out).write_bytes("notes.txt", b"mine")
    with pytest.raises(StoreError, match="not zarr data.*notes.txt"):
        tsconv.process(src, out, pipeline=PIPE, device="cpu", overwrite=True)


def test_parquet_to_s3_equals_a_local_parquet(prefix, s3_input, tmp_path):
    import pyarrow.parquet as pq

    src = s3_input
    tsconv.process(src, f"{prefix}/out.parquet", pipeline=PIPE, device="cpu")
    tsconv.process(src, tmp_path / "out.parquet", pipeline=PIPE, device="cpu")
    fs, path = StoreURL.parse(f"{prefix}/out.parquet").filesystem()
    with fs.open(path, "rb") as f:
        remote = pq.read_table(f)
    assert remote.equals(pq.read_table(tmp_path / "out.parquet"))
    with pytest.raises(tsconv.OutputExistsError):
        tsconv.process(src, f"{prefix}/out.parquet", pipeline=PIPE, device="cpu")


def test_inspect_an_s3_store(s3_input, series):
    src = s3_input
    res = _cli("inspect", src)
    assert res.exit_code == 0, res.output
    assert src in res.output and "fetched ahead" in res.output and "2,000 rows x 4 features" in res.output
    info = json.loads(_cli("inspect", src, "--json").output)
    assert info["nan_total"] == int(np.isnan(series).sum())


def test_missing_bucket_store_and_overlap_are_one_line_errors(prefix, s3_input):
    line = _one_error_line(_cli("process", "-i", "s3://no-such-bucket-tsconv/t.zarr", "-q"))
    assert "the bucket 'no-such-bucket-tsconv' does not exist" in line
    line = _one_error_line(_cli("inspect", f"{prefix}/nothing.zarr"))
    assert f"input store '{prefix}/nothing.zarr' does not exist" in line
    StoreURL.parse(prefix).write_bytes("junk/a.txt", b"x")
    assert "is not a zarr store" in _one_error_line(_cli("inspect", f"{prefix}/junk"))
    src = s3_input
    line = _one_error_line(_cli("process", "-i", src, "-o", f"{src}/inside.zarr", "-q", "--device", "cpu"))
    assert "overlap the input" in line
    # s3a:// names the same bucket: the alias had hidden the overlap, and the output was written inside
    line = _one_error_line(
        _cli(
            "process",
            "-i",
            src,
            "-o",
            f"{src.replace('s3://', 's3a://')}/inside.zarr",
            "-q",
            "--device",
            "cpu",
        )
    )
    assert "overlap the input" in line
    assert [k for k in StoreURL.parse(src).objects() if "inside" in k] == []


def test_an_output_url_inside_the_store_of_an_input_array_url_is_refused(series):
    # -i memory://.../in.zarr/values names an array inside in.zarr: the output in.zarr/feats.zarr was written
    base = f"memory://tsconv-{uuid.uuid4().hex[:8]}"
    write_store(f"{base}/in.zarr", series[:2000], chunks=(1024, 4))
    before = StoreURL.parse(f"{base}/in.zarr").objects()
    with pytest.raises(tsconv.TsconvError, match="overlap the input store 'memory://.*/in.zarr'"):
        tsconv.process(f"{base}/in.zarr/values", f"{base}/in.zarr/feats.zarr", pipeline=PIPE, device="cpu")
    assert StoreURL.parse(f"{base}/in.zarr").objects() == before
    # memory://o.zarr has no folder: its lock went inside the output, which was then "not a zarr store"
    with pytest.raises(tsconv.TsconvError, match="names no bucket or folder"):
        tsconv.process(f"{base}/in.zarr", "memory://o.zarr", pipeline=PIPE, device="cpu")
    a, b = StoreURL.parse("s3a://b/t.zarr"), StoreURL.parse("s3://b/t.zarr/x.zarr")
    assert (
        b.is_relative_to(a) and a.url == "s3a://b/t.zarr"
    )  # the scheme given is kept (fingerprints hold it)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_an_input_url_is_read_from_its_arrays_own_metadata_not_a_stale_consolidated_copy(series, zarr_format):
    # rows appended with zarr (resize, write) after consolidating: a URL input read 200 of 300 rows, silently
    base = f"memory://tsconv-{uuid.uuid4().hex[:8]}/in.zarr"
    g = zarr.open_group(base, mode="w", zarr_format=zarr_format)
    g.create_array("values", data=series[:200], chunks=(64, 4))
    g.attrs["features"] = ["a", "b", "c", "d"]
    zarr.consolidate_metadata(base)
    g = zarr.open_group(base, mode="r+", use_consolidated=False)
    g["values"].resize((300, 4))
    g["values"][200:] = series[200:300]
    renamed = ["w", "x", "y", "z"] if zarr_format == 2 else ["a", "b", "c", "d"]
    if zarr_format == 2:  # (format 3's group metadata, rewritten, drops its consolidated copy)
        g.attrs["features"] = renamed
    got, names = tsconv.features(series[:300], PIPE, device="cpu", names=renamed, return_names=True)
    out = f"memory://tsconv-{uuid.uuid4().hex[:8]}/out.zarr"
    tsconv.process(base, out, pipeline=PIPE, device="cpu")
    o = zarr.open_group(out, mode="r")
    assert o["values"].shape[0] == 300 and tuple(o.attrs["features"]) == names
    np.testing.assert_array_equal(o["values"][:], got)


def test_a_renewal_that_fails_once_keeps_the_lock_and_one_failing_past_its_ttl_loses_it(prefix, monkeypatch):
    # a network error on one renewal stopped the renewals for good: the lock went stale under a running run
    out = StoreURL.parse(f"{prefix}/out.zarr")
    lock = ObjectLock(out, run_id="mine", ttl=0.4).acquire()
    real, calls = ObjectLock._put, []

    def flaky(self, **conditions):  # noqa: ANN001, ANN003, ANN202
        calls.append(conditions)
        if len(calls) == 1:
            raise OSError("connection reset")
        return real(self, **conditions)

    try:
        monkeypatch.setattr(ObjectLock, "_put", flaky)
        time.sleep(0.45)  # the failed renewal, then one that succeeds
        assert len(calls) >= 2 and not lock.lost
        lock.check()
        monkeypatch.setattr(ObjectLock, "_put", lambda self, **c: (_ for _ in ()).throw(OSError("down")))
        time.sleep(0.7)  # renewals failing for longer than the ttl
        assert lock.lost
        with pytest.raises(StoreError, match="could not be renewed"):
            lock.check()
    finally:
        monkeypatch.undo()
        lock.release()


def test_object_lock_refuses_a_live_lock_and_takes_over_a_stale_one(prefix):
    out = StoreURL.parse(f"{prefix}/out.zarr")
    with ObjectLock(out, run_id="first", ttl=30):
        with pytest.raises(OutputBusyError, match="run first.*renewed 0 s ago"):
            ObjectLock(out, run_id="second").acquire()
    assert not out.parent.child(".out.zarr.tsconv-lock").exists()  # released: removed
    # a killed run's lock: last renewed long ago
    stale = {"pid": 1, "host": "h", "run_id": "killed", "renewed": time.time() - 120, "ttl": 60}
    out.parent.write_bytes(".out.zarr.tsconv-lock", json.dumps(stale).encode())
    lock = ObjectLock(out, run_id="third", ttl=0.4).acquire()
    try:
        time.sleep(0.3)  # renewed at least once, conditionally on its own copy
        holder = json.loads(out.parent.read_bytes(".out.zarr.tsconv-lock"))
        assert holder["run_id"] == "third" and time.time() - holder["renewed"] < 0.3 and not lock.lost
        with pytest.raises(OutputBusyError):
            ObjectLock(out, run_id="fourth").acquire()
    finally:
        lock.release()


def test_a_plain_run_on_an_output_another_run_holds_names_that_run(series) -> None:
    # refused with "already exists; hint: pass --overwrite ... --resume" (the output's check came before the lock's)
    base = f"memory://tsconv-{uuid.uuid4().hex[:8]}"
    src = write_store(f"{base}/in.zarr", series, chunks=(1024, 4))
    out = StoreURL.parse(f"{base}/out.zarr")
    tsconv.process(src, out.url, pipeline=PIPE, device="cpu")
    with ObjectLock(out, run_id="writing", ttl=30):
        with pytest.raises(OutputBusyError, match="run writing.*renewed 0 s ago"):
            tsconv.process(src, out.url, pipeline=PIPE, device="cpu")
    with pytest.raises(tsconv.OutputExistsError, match="already exists"):  # released: nobody writes it
        tsconv.process(src, out.url, pipeline=PIPE, device="cpu")


def test_a_lock_recorded_with_ttl_0_is_stale_at_once_not_read_as_the_default() -> None:
    # `holder.get("ttl") or self.ttl` read a recorded 0 as absent and kept the holder's lock for 60 s
    out = StoreURL.parse(f"memory://tsconv-{uuid.uuid4().hex[:8]}/out.zarr")
    doc = {"pid": 1, "host": "h", "run_id": "zero", "renewed": time.time(), "ttl": 0}
    out.parent.write_bytes(".out.zarr.tsconv-lock", json.dumps(doc).encode())
    lock = ObjectLock(out, run_id="next", ttl=60).acquire()
    try:
        assert json.loads(out.parent.read_bytes(".out.zarr.tsconv-lock"))["run_id"] == "next"
    finally:
        lock.release()


def test_a_run_that_stalls_past_its_lock_ttl_writes_nothing_into_the_run_that_took_over(series, monkeypatch):
    """Run A pauses (its process stopped, its machine suspended) past its lock's TTL between two chunks; run B
    takes the stale lock over (--overwrite, another pipeline) and completes. A, continued, used to write its
    rows over B's and its run id back into B's root document (kept from before), pass check_owner and mark
    the store complete: now it stops with an error at its next write, and B's store is left byte for byte."""
    import tsconv.engine.outputs
    from tsconv.io.writers.zarr_writer import OutputWriter

    monkeypatch.setattr(tsconv.engine.outputs, "output_chunk_rows", lambda chunk, n_outputs: 3 * chunk)
    monkeypatch.setenv("TSCONV_WRITE_THREADS", "1")  # chunks stored in the engine's thread, one at a time
    src = write_store(f"memory://tsconv-{uuid.uuid4().hex[:8]}/in.zarr", series, chunks=(1024, 4))
    out = f"memory://tsconv-{uuid.uuid4().hex[:8]}/out.zarr"
    locks: list[ObjectLock] = []
    acquire, store = ObjectLock.acquire, OutputWriter._store
    monkeypatch.setattr(ObjectLock, "acquire", lambda self: locks.append(self) or acquire(self))
    b_store: dict[str, bytes] = {}
    stalled: list[OutputWriter] = []

    def stall_before_the_second_chunk(self, a, b, *args, **kwargs):
        if a > 0 and not stalled:
            stalled.append(self)
            lock = locks[0]  # A's: stopped as SIGSTOP stops it, last renewed two TTLs ago
            lock._stop.set()
            lock._thread.join()
            lock._renewed = time.time() - 2 * lock.ttl
            doc = json.loads(lock.url.read_bytes())
            lock.url.write_bytes("", json.dumps({**doc, "renewed": lock._renewed}).encode())
            tsconv.process(src, out, pipeline="multiscale", device="cpu", chunk=256, overwrite=True)
            fs, root = StoreURL.parse(out).filesystem()
            b_store.update({p: fs.cat_file(p) for p in fs.find(root)})
        return store(self, a, b, *args, **kwargs)

    monkeypatch.setattr(OutputWriter, "_store", stall_before_the_second_chunk)
    with pytest.raises(StoreError, match="was taken over by another run.*the other run's output stands"):
        tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=256)
    fs, root = StoreURL.parse(out).filesystem()
    assert b_store and {p: fs.cat_file(p) for p in fs.find(root)} == b_store  # no chunk, no document of A's
    g = zarr.open_group(out, mode="r", use_consolidated=False)
    assert g.attrs["tsconv"]["complete"] and g.attrs["pipeline"]["name"] == "multiscale"


def test_a_password_or_query_in_a_url_is_refused_and_never_shown(series):
    # memory://user:hunter2@b/in.zarr was read and its password recorded in the output's `source`; s3://KEY:hunter2@b
    # and ?token=hunter2 were echoed in the error line
    bucket = f"tsconv-{uuid.uuid4().hex[:8]}"
    src = str(write_store(f"memory://user:hunter2@{bucket}/in.zarr", series[:500], chunks=(256, 4)))
    out = StoreURL.parse(f"memory://{bucket}-out/out.zarr")
    with pytest.raises(StoreError, match=r"'memory://user:\*\*\*@.*' holds a password") as err:
        tsconv.process(src, out.url, pipeline=PIPE, device="cpu")
    assert "hunter2" not in str(err.value) and not out.exists()
    for url in (
        "s3://KEY:hUn/ter2@bkt/t.zarr",
        "memory://b/t.zarr?token=hunter2",
        "http://u:hunter2@h:80/t?sig=hunter2",
    ):
        line = _one_error_line(_cli("inspect", url))
        assert "ter2" not in line and ("holds a password" in line or "holds a query" in line), line
    assert location("az://container@account/t.zarr").url == "az://container@account/t.zarr"  # no password
    assert location("http://host:8080/a@b/t.zarr").url == "http://host:8080/a@b/t.zarr"  # a port


def test_a_failed_write_at_a_url_names_it_leaves_it_unfinished_and_resumes_to_a_full_run(series, monkeypatch):
    # the error named the output "<FsspecStore(AsyncFileSystemWrapper, /tsconv-.../out.zarr)>", not its URL
    import tsconv.engine.outputs
    from tsconv.io.writers.zarr_writer import OutputWriter

    monkeypatch.setattr(tsconv.engine.outputs, "output_chunk_rows", lambda chunk, n_outputs: 3 * chunk)
    base = f"memory://tsconv-{uuid.uuid4().hex[:8]}"
    src = write_store(f"{base}/in.zarr", series, chunks=(1024, 4))
    write, calls = OutputWriter._write, []

    def fail_the_second(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append(args)
        if len(calls) == 2:
            raise OSError("connection reset")
        return write(self, *args, **kwargs)

    monkeypatch.setattr(OutputWriter, "_write", fail_the_second)
    with pytest.raises(
        StoreError, match=f"cannot write rows 768..1,536 of the output store '{base}/out.zarr'"
    ):
        tsconv.process(src, f"{base}/out.zarr", pipeline=PIPE, device="cpu", chunk=256)
    monkeypatch.setattr(OutputWriter, "_write", write)
    with pytest.raises(StoreError, match="unfinished tsconv run"):
        tsconv.process(f"{base}/out.zarr", f"{base}/o2.zarr", pipeline=PIPE, device="cpu")
    report = tsconv.process(src, f"{base}/out.zarr", pipeline=PIPE, device="cpu", chunk=256, resume=True)
    tsconv.process(src, f"{base}/full.zarr", pipeline=PIPE, device="cpu", chunk=256)
    assert report.resumed_from == 768
    np.testing.assert_array_equal(read_output(f"{base}/out.zarr"), read_output(f"{base}/full.zarr"))


def test_memory_urls_round_trip(series, local_run):
    """Another fsspec scheme: no server, the generic paths (the lock without ETags, plain PUTs)."""
    base = f"memory://tsconv-{uuid.uuid4().hex[:8]}"
    src = write_store(f"{base}/in.zarr", series, chunks=(1024, 4))
    tsconv.process(src, f"{base}/out.zarr", pipeline=PIPE, device="cpu")
    np.testing.assert_array_equal(np.asarray(zarr.open_group(f"{base}/out.zarr")["values"][:]), local_run[1])


def test_an_output_at_a_url_updates_as_a_local_one(series, tmp_path, monkeypatch):
    """``--update`` into an object store: the output's documents are replaced whole, as a local one's."""
    import tsconv.engine.outputs

    from ..helpers import T0

    # output chunks of 3 engine chunks: the update keeps rows 768..1280 of the chunk it writes again, read back
    # through zarr
    monkeypatch.setattr(tsconv.engine.outputs, "output_chunk_rows", lambda chunk, n_outputs: 3 * chunk)
    src = write_store(tmp_path / "in.zarr", series[:1500], chunks=(1024, 4))
    out = f"memory://tsconv-{uuid.uuid4().hex[:8]}/out.zarr"
    tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=256)
    g = zarr.open_group(str(src), mode="r+")
    g["values"].resize(series.shape)
    g["values"][1500:] = series[1500:]
    g["time"].resize((series.shape[0],))
    g["time"][1500:] = T0 + np.arange(1500, series.shape[0], dtype=np.int64) * 1_000_000
    report = tsconv.process(src, out, pipeline=PIPE, device="cpu", chunk=256, update=True)
    assert (report.updated_from, report.resumed_from) == (1500, 1280)
    tsconv.process(src, tmp_path / "want.zarr", pipeline=PIPE, device="cpu", chunk=256)
    got = zarr.open_group(out, mode="r")
    assert got.attrs["tsconv"]["complete"] and got.metadata.consolidated_metadata is not None
    np.testing.assert_array_equal(np.asarray(got["values"][:]), read_output(tmp_path / "want.zarr"))
    np.testing.assert_array_equal(np.asarray(got["time"][:]), np.asarray(g["time"][:]))


def test_locations_and_actionable_errors(tmp_path):
    assert location("s3://b//a/t.zarr/") == StoreURL("s3://b/a/t.zarr")
    assert location(f"file://{tmp_path}/t.zarr") == tmp_path / "t.zarr"  # local: the fast readers
    assert location("t.zarr") == Path.cwd() / "t.zarr"
    assert location("file://localhost/tmp/t.zarr") == Path("/tmp/t.zarr")
    assert location("file:///tmp/run%201/a#b.zarr") == Path(
        "/tmp/run 1/a#b.zarr"
    )  # '#': a name, as fsspec has it
    # file://~/t.zarr and file://data/t.zarr were read as /t.zarr (the "host" dropped): a run wrote there
    for text, path in (("file://~/t.zarr", "'~/t.zarr'"), ("file://data/t.zarr", "'data/t.zarr'")):
        with pytest.raises(StoreError, match=f"names the host .*write the path itself \\({path}\\)"):
            location(text)
    url = StoreURL.parse("s3://b/t.zarr")
    assert url.name == "t.zarr" and url.parent == StoreURL("s3://b") and url.with_name("u").url == "s3://b/u"
    err = remote_error(PermissionError("Access Denied"), url, "open")
    assert "access denied" in str(err) and "AWS_ACCESS_KEY_ID" in str(err)
    no_creds = type("NoCredentialsError", (Exception,), {})("Unable to locate credentials")
    assert "no credentials found" in str(remote_error(no_creds, url, "open"))
    missing = remote_error(ImportError("Install s3fs to access S3"), url, "open")
    assert "pip install 'tsconv-features[s3]'" in str(missing)
    # http's filesystem path is the whole URL: its 'bucket' was "http:" (the bucket 'http:' does not exist)
    assert str(StoreURL.parse("http://127.0.0.1:9/t.zarr").missing("input store")).startswith(
        "input store 'http://127.0.0.1:9/t.zarr' does not exist"
    )


def test_an_output_at_an_unknown_scheme_is_said_once(series):
    # "cannot write the output 'nosuch://b/o.zarr': StoreError: cannot open 'nosuch://b/o.zarr': fsspec knows..."
    src = write_store(f"memory://tsconv-{uuid.uuid4().hex[:8]}/in.zarr", series[:300], chunks=(256, 4))
    line = _one_error_line(_cli("process", "-i", src, "-o", "nosuch://b/o.zarr", "-q", "--device", "cpu"))
    assert "StoreError" not in line and line.count("nosuch://b/o.zarr") == 1 and "knows no scheme" in line, (
        line
    )


def test_an_s3_output_without_credentials_is_one_line(series, tmp_path, monkeypatch):
    """The output URL's first listing (check_output_path) raised botocore's traceback; an input's is one line."""
    s3fs = pytest.importorskip("s3fs", reason="s3fs is not installed")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    s3fs.S3FileSystem.clear_instance_cache()
    src = write_store(tmp_path / "in.zarr", series, chunks=(1024, 4))
    try:
        line = _one_error_line(
            _cli("process", "-i", src, "-o", "s3://bkt/o.zarr", "--pipeline", PIPE, "--device", "cpu")
        )
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    assert (
        "cannot write the output 's3://bkt/o.zarr': no credentials found" in line
        and "AWS_ACCESS_KEY_ID" in line
    )


def test_a_scheme_without_its_package_is_one_line(tmp_path):
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401

        pytest.skip("gcsfs is installed")
    except ImportError:
        pass
    line = _one_error_line(_cli("inspect", "gs://bucket/t.zarr"))
    assert "gs:// needs a package" in line and "gcsfs" in line


def test_ingest_and_repair_refuse_urls():
    """They write local stores only; a URL must not become a relative directory named 's3:'."""
    assert "local stores only" in _one_error_line(_cli("repair", "s3://bucket/t.zarr"))


class _SlowArray:
    """A 2-D stand-in for a remote zarr array: each read takes 30 ms and records how many run at once."""

    def __init__(self, rows: int, band: int) -> None:
        self.shape, self.chunks, self.ndim, self.dtype = (rows, 2), (band, 2), 2, np.dtype(np.float32)
        self.active = self.most = 0
        self._lock = threading.Lock()

    def __getitem__(self, key: slice) -> np.ndarray:
        with self._lock:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(0.03)
        with self._lock:
            self.active -= 1
        return np.arange(key.start, key.stop, dtype=np.float32)[:, None].repeat(2, axis=1)


def test_prefetch_reader_fetches_bands_concurrently():
    arr = _SlowArray(rows=16 * 100, band=100)
    t0 = time.perf_counter()
    with PrefetchReader(arr, ahead=8) as reader:
        got = np.concatenate([reader.read(a, min(a + 64, arr.shape[0])) for a in range(0, arr.shape[0], 64)])
        back = reader.read(50, 250)  # behind the window (a resume): read again, same rows
    seconds = time.perf_counter() - t0
    np.testing.assert_array_equal(got[:, 0], np.arange(arr.shape[0], dtype=np.float32))
    np.testing.assert_array_equal(back[:, 0], np.arange(50, 250, dtype=np.float32))
    assert arr.most >= 4  # bands were fetched at once
    assert seconds < 16 * 0.03 * 0.6  # sequential reads would take 0.48 s
