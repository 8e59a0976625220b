"""The time column's reader (tsconv.io.timecolumn): chunk files read directly equal zarr's reads; and
the decoding of CF and datetime64 times to int64 ns (tsconv.io.timecoding)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, ZstdCodec

from tsconv.errors import StoreError
from tsconv.io.timecoding import time_coding
from tsconv.io.timecolumn import ShiftedTime, TimeColumn, TimeReader

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


def test_bands_of_one_large_chunk_decode_it_once(tmp_path: Path, monkeypatch) -> None:
    """Readers and writers ask for a band at a time; a time chunk spanning many bands (zarr's default
    chunking of a long int64 column) is decoded once, not once per band, and every band stays right."""
    t = _time_array(tmp_path / "t.zarr", 20_000, 8192, compressors=[ZstdCodec(level=1)])
    r = TimeReader(t)
    decoded: list[int] = []
    real = TimeReader._decode
    monkeypatch.setattr(
        TimeReader, "_decode", lambda self, c, data, raw: (decoded.append(c), real(self, c, data, raw))
    )
    want = np.asarray(t[:])
    got = [r.read(a, min(a + 1000, 20_000)) for a in range(0, 20_000, 1000)]
    np.testing.assert_array_equal(np.concatenate(got), want)
    assert sorted(decoded) == [0, 1, 2], decoded
    np.testing.assert_array_equal(r.read(8000, 17000), want[8000:17000])  # a whole chunk among partial ones
    assert decoded.count(1) <= 2


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
        with pytest.raises(
            ValueError, match=r"chunk 2 \(file .*c/2\) of .*: chunk decodes to 8000 bytes, expected 8192"
        ):
            r.read(a, b)


# ------------------------------------------------------------------ decoded time (tsconv.io.timecoding)

_S = 1_000_000_000


@pytest.mark.parametrize(
    ("units", "ref_ns"),
    [
        ("seconds since 1970-01-01", 0),
        ("seconds since 2026-01-02 09:30:00", T0 // _S * _S),
        ("second since 2026-01-02T09:30", T0),
        ("seconds since 2026-01-02 10:30:00+01:00", T0),
        ("seconds since 2026-01-02T04:00:00-0530", T0),
        ("seconds since 2026-01-02 09:30:00Z", T0),
        ("seconds since 2026-01-02 09:30:00.5 UTC", T0 + _S // 2),
        ("seconds since 2026-1-2", T0 - (9 * 3600 + 1800) * _S),
    ],
)
def test_reference_dates_with_and_without_time_and_offset(tmp_path: Path, units: str, ref_ns: int) -> None:
    t = zarr.create_array(str(tmp_path / "t.zarr"), shape=(100,), chunks=(32,), dtype="int32")
    t[:] = np.arange(100, dtype=np.int32) * 3
    t.attrs.update(units=units, calendar="proleptic_gregorian")
    col = TimeColumn(t)
    want = ref_ns + np.arange(100, dtype=np.int64) * 3 * _S
    np.testing.assert_array_equal(col[:], want)
    r = TimeReader(ShiftedTime(col, 10))
    assert r.fast, r.fallback_reason  # CF-encoded times take the chunk-file path too
    np.testing.assert_array_equal(r.read(5, 80), want[15:90])


@pytest.mark.parametrize(
    ("unit", "ns"),
    [("days", 86_400 * _S), ("hours", 3_600 * _S), ("minutes", 60 * _S), ("milliseconds", 10**6),
     ("microseconds", 1_000), ("nanoseconds", 1)],
)  # fmt: skip
def test_every_unit_with_integers_and_floats(tmp_path: Path, unit: str, ns: int) -> None:
    for dtype, values in [("int64", np.arange(50)), ("float64", np.arange(50) + 0.25)]:
        t = zarr.create_array(str(tmp_path / f"{dtype}.zarr"), shape=(50,), chunks=(16,), dtype=dtype)
        t[:] = values
        t.attrs.update(units=f"{unit} since 2000-01-01")
        ref = 946_684_800 * _S
        np.testing.assert_array_equal(
            TimeReader(TimeColumn(t)).read(0, 50), ref + np.rint(values * ns).astype(np.int64)
        )


def test_datetime64_arrays_and_nat(tmp_path: Path) -> None:
    want = np.datetime64("2026-01-02T09:30") + np.arange(40) * np.timedelta64(7, "s")
    for unit in ("s", "ms", "ns"):
        t = zarr.create_array(
            str(tmp_path / f"{unit}.zarr"), shape=(40,), chunks=(16,), dtype=f"datetime64[{unit}]"
        )
        t[:] = want.astype(f"datetime64[{unit}]")
        col = TimeColumn(t)
        np.testing.assert_array_equal(
            TimeReader(col).read(0, 40), want.astype("datetime64[ns]").view(np.int64)
        )
        t[33] = np.datetime64("NaT")
        with pytest.raises(StoreError, match="the time of row 33 is missing"):
            TimeReader(ShiftedTime(col, 3)).read(20, 37)


def test_nat_nan_and_fill_values_are_missing_rows() -> None:
    cf = time_coding(_Attrs(np.zeros(1, np.int64), units="seconds since 2000-01-01"))
    with pytest.raises(StoreError, match="the time of row 12 is missing"):
        cf.decode(np.array([0, 1, np.iinfo(np.int64).min]), 10)
    floats = time_coding(
        _Attrs(np.zeros(1), units="hours since 2000-01-01", _FillValue="AAAAAAAA8L8=")
    )  # -1.0
    with pytest.raises(StoreError, match="the time of row 1 is missing"):
        floats.decode(np.array([0.5, np.nan]))
    with pytest.raises(StoreError, match="the time of row 2 is missing"):
        floats.decode(np.array([0.5, 1.0, -1.0]))
    # without units: tsconv's own int64 ns, passed through as stored
    plain = time_coding(_Attrs(np.zeros(1, np.int64)))
    assert plain.identity and plain.decode(np.array([-5, 7])).tolist() == [-5, 7]


def test_ranges_and_calendars_that_cannot_be_decoded() -> None:
    big = time_coding(_Attrs(np.zeros(1, np.uint64)))
    with pytest.raises(StoreError, match="row 5 holds 9223372036854775808, above the int64 maximum"):
        big.decode(np.array([1, 2, 3, 4, 2**63], dtype=np.uint64), 1)
    days = time_coding(_Attrs(np.zeros(1, np.int64), units="days since 2262-04-01"))
    assert days.decode(np.array([10]))[0] == np.datetime64("2262-04-11", "ns").view(np.int64)
    with pytest.raises(StoreError, match="row 0 holds 11 .* outside the int64 nanosecond range"):
        days.decode(np.array([11]))
    old = time_coding(_Attrs(np.zeros(1), units="days since 0001-01-01", calendar="proleptic_gregorian"))
    assert old.decode(np.array([739_251.5]))[0] == np.datetime64("2025-01-01T12:00", "ns").view(np.int64)
    with pytest.raises(StoreError, match="before 1582-10-15, where that calendar is Julian"):
        time_coding(_Attrs(np.zeros(1), units="days since 0001-01-01", calendar="standard"))
    for cal in ("noleap", "360_day", "julian", "all_leap"):
        with pytest.raises(StoreError, match=f"calendar '{cal}'"):
            time_coding(_Attrs(np.zeros(1), units="days since 2000-01-01", calendar=cal))
    for units in ("days", "days since yesterday", "days since 2000-13-01", "weeks since 2000-01-01"):
        with pytest.raises(StoreError, match="cannot read the time units"):
            time_coding(_Attrs(np.zeros(1), units=units))


class _Attrs:
    """A stand-in array: a dtype and attributes, all time_coding looks at."""

    def __init__(self, a: np.ndarray, **attrs: object) -> None:
        self.dtype, self.attrs = a.dtype, attrs


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_blosc_time_chunk_cut_short_read_by_zarr_is_a_store_error_not_other_bytes(
    tmp_path: Path, zarr_format: int
) -> None:
    # zarr 2 arrays and sharded ones are read through zarr, whose c-blosc decoded a frame that lost its
    # last bytes from the memory past them: the last time of the chunk silently another number. Level 0
    # stores the times as they are, so every byte cut is read from past the end.
    import numcodecs

    if zarr_format == 2:
        kw = {"compressors": numcodecs.Blosc(cname="lz4", clevel=0), "zarr_format": 2}
        chunk = tmp_path / "t.zarr" / "1"
    else:  # the native path's check covers a plain layout: this one goes through zarr
        kw = {"compressors": BloscCodec(cname="lz4", clevel=0), "chunk_key_encoding": {"name": "v2"}}
        chunk = tmp_path / "t.zarr" / "1"
    t = _time_array(tmp_path / "t.zarr", 3000, 1000, **kw)
    chunk.write_bytes(chunk.read_bytes()[:-16])  # the last two times
    col = TimeColumn(zarr.open_array(str(tmp_path / "t.zarr"), mode="r"))
    assert not TimeReader(col).fast
    np.testing.assert_array_equal(TimeReader(col).read(0, 1000), np.asarray(t[:1000]))
    with pytest.raises(
        StoreError,
        match=r"chunk file 1 \(rows 1,000..1,999\): the Blosc frame declares \d+ stored bytes.*cut short",
    ):
        TimeReader(col).read(500, 1500)


def test_a_time_shard_file_cut_short_with_its_index_first_is_a_store_error(tmp_path: Path) -> None:
    # read through zarr, which took the last inner chunk's bytes from past the file's end: other times
    shards = {"shape": (2000,), "index_location": "start"}
    _time_array(
        tmp_path / "t.zarr", 3000, 1000, shards=shards, compressors=[BloscCodec(cname="lz4", clevel=0)]
    )
    shard = tmp_path / "t.zarr" / "c" / "0"
    shard.write_bytes(shard.read_bytes()[:-16])
    col = TimeColumn(zarr.open_array(str(tmp_path / "t.zarr"), mode="r"))
    with pytest.raises(StoreError, match=r"shard file c/0 \(rows 0..1,999\) holds \d+ bytes.*cut short"):
        TimeReader(col).read(0, 3000)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_an_infinite_float_time_is_refused_without_numpys_warnings(dtype: type) -> None:
    # a float16 time past 65504 is stored as inf: refused, but numpy's "invalid value" warnings came first
    hours = time_coding(_Attrs(np.zeros(1, dtype), units="hours since 2000-01-01"))
    with pytest.raises(StoreError, match=r"row 2 holds inf .*outside the int64 nanosecond range"):
        hours.decode(np.array([0.5, 1.0, np.inf], dtype=dtype))
