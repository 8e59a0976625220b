"""The time column's reader (tsconv.io.timecolumn): chunk files read directly equal zarr's reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, ZstdCodec

from tsconv.io.timecolumn import ShiftedTime, TimeReader

T0 = 1_767_346_200_000_000_000


@pytest.fixture(autouse=True)
def _both_readers(file_reads: str) -> None:
    """Every test with the files read by the native batch reader and by Python (conftest's file_reads)."""


def _time_array(path: Path, rows: int, chunk: int, **kw) -> zarr.Array:
    t = zarr.create_array(str(path), shape=(rows,), chunks=(chunk,), dtype="int64", **kw)
    t[:] = T0 + np.arange(rows, dtype=np.int64) * 1_000_003
    return t


@pytest.mark.parametrize(
    "codec", [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"), ZstdCodec(level=1), None]
)
def test_rows_across_chunks_equal_zarr(tmp_path: Path, codec) -> None:
    t = _time_array(tmp_path / "t.zarr", 10_000, 1024, compressors=[codec] if codec else None)
    r = TimeReader(t)
    assert r.fast, r.fallback_reason
    want = np.asarray(t[:])
    for a, b in [(0, 10_000), (0, 1024), (1000, 1100), (1023, 1025), (5000, 9999), (9990, 10_000), (7, 7)]:
        np.testing.assert_array_equal(r.read(a, b), want[a:b])
    shifted = TimeReader(ShiftedTime(t, 3000))
    np.testing.assert_array_equal(shifted.read(100, 5000), want[3100:8000])
    with pytest.raises(IndexError):
        shifted.read(0, 7001)


def test_a_missing_chunk_reads_as_the_fill_value(tmp_path: Path) -> None:
    t = _time_array(tmp_path / "t.zarr", 4096, 1024, fill_value=0)
    t[1024:2048] = 0  # zarr stores no file for an all-fill chunk
    assert not (tmp_path / "t.zarr" / "c" / "1").exists()
    r = TimeReader(t)
    assert r.fast
    np.testing.assert_array_equal(r.read(0, 4096), np.asarray(t[:]))
    assert (r.read(1024, 2048) == 0).all()


def test_layouts_the_fast_path_does_not_take_read_through_zarr(tmp_path: Path) -> None:
    v2 = zarr.create_array(
        str(tmp_path / "v2.zarr"), shape=(3000,), chunks=(500,), dtype="int64", zarr_format=2
    )
    v2[:] = T0 + np.arange(3000)
    r = TimeReader(ShiftedTime(v2, 10))
    assert not r.fast and "format 2" in r.fallback_reason
    np.testing.assert_array_equal(r.read(0, 2990), T0 + np.arange(10, 3000))
    floats = zarr.create_array(str(tmp_path / "f.zarr"), shape=(100,), chunks=(10,), dtype="float64")
    floats[:] = np.arange(100.0)
    r = TimeReader(floats)
    assert not r.fast and "dtype" in r.fallback_reason
    np.testing.assert_array_equal(r.read(5, 15), np.arange(5, 15))


def test_other_integer_dtypes_and_incompressible_chunks(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    t = zarr.create_array(str(tmp_path / "t.zarr"), shape=(5000,), chunks=(1000,), dtype="int32",
                          compressors=[BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")])  # fmt: skip
    t[:] = rng.integers(-(2**31), 2**31 - 1, 5000, dtype=np.int32)  # random: stored larger than raw
    r = TimeReader(t)
    assert r.fast
    got = r.read(0, 5000)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.asarray(t[:]).astype(np.int64))
    np.testing.assert_array_equal(r.read(999, 3001), np.asarray(t[999:3001]).astype(np.int64))


def test_a_chunk_that_decodes_to_the_wrong_size_raises(tmp_path: Path) -> None:
    t = _time_array(tmp_path / "t.zarr", 4096, 1024, compressors=[BloscCodec(cname="lz4")])
    import numcodecs

    short = numcodecs.Blosc(cname="lz4").encode(np.arange(1000, dtype=np.int64))  # 1000 of 1024 rows
    (tmp_path / "t.zarr" / "c" / "2").write_bytes(short)
    r = TimeReader(t)
    np.testing.assert_array_equal(r.read(0, 2048), np.asarray(t[:2048]))
    for a, b in [(0, 4096), (2048, 3072), (2100, 2200)]:
        with pytest.raises(ValueError, match=r"time chunk .*c/2: chunk decodes to 8000 bytes, expected 8192"):
            r.read(a, b)
