"""Decoding in worker processes (tsconv.io.procdecode.ProcessBandReader): the thread reader's results."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from zarr.codecs import BloscCodec, ZstdCodec

import tsconv
from tsconv.errors import StoreError
from tsconv.io import procdecode
from tsconv.io.procdecode import ProcessBandReader

from .helpers import price_series, read_output, write_store
from .test_decode import _array, _check_all_reads, _corrupt, _data

pytestmark = pytest.mark.skipif(procdecode.supported() is not None, reason=str(procdecode.supported()))

CODECS = {
    "blosc": BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
    "zstd": ZstdCodec(level=1),
    "none": None,
}


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize(("chunks", "hold"), [((1000, 7), 1), ((1000, 3), 3), ((777, 7), 2)])
def test_reads_equal_the_data(tmp_path: Path, codec: str, chunks: tuple[int, int], hold: int) -> None:
    """Forward windows, random reads and resume-style backward reads, whole or split-column chunks."""
    x = _data(9_500, 7, "float32")
    a = _array(tmp_path / "a.zarr", x, chunks, compressors=CODECS[codec])
    with ProcessBandReader(a, workers=3, hold=hold) as r:
        assert r.fast and r.workers == 3
        _check_all_reads(r, x)
        assert r.busy_seconds > 0
    with pytest.raises(ValueError, match="closed"):
        r.read(0, 10)
    r.close()  # idempotent


@pytest.mark.parametrize("fill", [np.nan, 7.5])
def test_missing_chunk_files_are_the_fill_value(tmp_path: Path, fill: float) -> None:
    x = _data(4000, 4, "float32")
    a = _array(tmp_path / "a.zarr", x, (1000, 2), fill_value=fill)
    (tmp_path / "a.zarr" / "c" / "2" / "1").unlink()
    want = x.copy()
    want[2000:3000, 2:] = fill
    with ProcessBandReader(a, workers=2) as r:
        np.testing.assert_array_equal(r.read(0, 4000), want)


def test_a_corrupt_chunk_is_a_store_error(tmp_path: Path) -> None:
    x = _data(4000, 6, "float32")
    a = _array(tmp_path / "a.zarr", x, (1000, 3), compressors=BloscCodec(cname="lz4"))
    _corrupt(tmp_path / "a.zarr" / "c" / "2" / "1", "garbage")
    prefix = re.escape("cannot read rows 2,000..3,000 of in.zarr: ")
    with ProcessBandReader(a, workers=2, where="in.zarr") as r:
        np.testing.assert_array_equal(r.read(0, 1900), x[:1900])  # band 2 is being prefetched: no error yet
        with pytest.raises(StoreError, match=prefix + r"\w+(Error|Exception)?: .+; hint: "):
            r.read(1500, 2500)
        np.testing.assert_array_equal(r.read(3000, 4000), x[3000:])  # the other bands still read


def test_workers_and_ring_are_kept_for_the_next_reader(tmp_path: Path) -> None:
    x = _data(3000, 2, "float32")
    a = _array(tmp_path / "a.zarr", x, (1000, 2))
    procdecode._stop_idle_workers()  # none kept from earlier tests
    with ProcessBandReader(a, workers=2) as r:
        first, segment = {w.pid for w in r._workers}, r._seg.path
        np.testing.assert_array_equal(r.read(0, 3000), x)
    with ProcessBandReader(a, workers=2) as r:  # the same workers and shared segment, rewritten
        assert {w.pid for w in r._workers} == first and r._seg.path == segment
        np.testing.assert_array_equal(r.read(500, 2500), x[500:2500])


def test_engine_output_equal_with_decode_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x = price_series(12_345, 5, seed=3, nan_fraction=0.05)
    src = write_store(tmp_path / "in.zarr", x, chunks=(1500, 5))
    pipe = {"conv": [{"filters": ["diff:1", "ma:16", "ema:32"]}, {"filters": ["ma:4"]}]}
    tsconv.process(src, tmp_path / "threads.zarr", pipeline=pipe, chunk=1024)
    monkeypatch.setenv("TSCONV_DECODE_PROCS", "2")
    made: list = []
    real = ProcessBandReader

    def spy(*args, **kw):
        made.append(real(*args, **kw))
        return made[-1]

    monkeypatch.setattr(tsconv.engine, "ProcessBandReader", spy)
    tsconv.process(src, tmp_path / "procs.zarr", pipeline=pipe, chunk=1024)
    assert made and made[0].workers == 2
    a, b = read_output(tmp_path / "threads.zarr"), read_output(tmp_path / "procs.zarr")
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))  # bitwise, NaNs included


def test_workers_exit_when_the_reader_process_dies(tmp_path: Path) -> None:
    """A reader process killed mid-run (no close, no atexit) leaves no decode workers polling behind it."""
    import subprocess
    import sys
    import textwrap
    import time

    code = textwrap.dedent(f"""
        import os, zarr
        from tsconv.io.procdecode import ProcessBandReader
        a = zarr.create_array({str(tmp_path / "a.zarr")!r}, shape=(4000, 4), chunks=(1000, 4), dtype="f4")
        a[:] = 1.0
        r = ProcessBandReader(zarr.open_array({str(tmp_path / "a.zarr")!r}, mode="r"), workers=2)
        r.read(0, 10)
        print(" ".join(str(w.pid) for w in r._workers), flush=True)
        os._exit(0)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2, out.stderr

    def running(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 5
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(running(p) for p in pids)
