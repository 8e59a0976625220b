"""The fast reader (tsconv.io.readers.threads.ParallelBandReader): equal to zarr reads on every layout, fast path or not."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, BytesCodec, ZstdCodec

import tsconv
import tsconv.io.source as engine
from tsconv.errors import StoreError
from tsconv.io.readers.blocks import BlockReader
from tsconv.io.readers.threads import ParallelBandReader, fast_path_reason

from ..helpers import price_series, read_output, write_store


def _data(rows: int, features: int, dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        x = 100.0 + np.cumsum(rng.choice([-1, 0, 0, 1], size=(rows, features)), axis=0) * 0.01
        x[rng.random(x.shape) < 0.01] = np.nan
        return x.astype(dt)
    info = np.iinfo(dt)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), size=(rows, features)).astype(dt)


def _array(path: Path, x: np.ndarray, chunks: tuple[int, int], **kw) -> zarr.Array:
    a = zarr.create_array(str(path), shape=x.shape, chunks=chunks, dtype=x.dtype, **kw)
    a[:] = x
    return zarr.open_array(str(path), mode="r")


def _windows(reader, rows: int, step: int = 1024) -> np.ndarray:
    return np.concatenate([np.array(reader.read(a, min(a + step, rows))) for a in range(0, rows, step)])


def _check_all_reads(reader, x: np.ndarray, seed: int = 0) -> None:
    """Forward 1024-row windows, random-order windows and resume-style backward band reads equal ``x``."""
    rows, band = x.shape[0], reader.band_rows
    np.testing.assert_array_equal(_windows(reader, rows), x)
    rng = np.random.default_rng(seed)
    for _ in range(40):
        a = int(rng.integers(0, rows))
        b = int(min(rows, a + 1 + rng.integers(0, 2 * band)))
        np.testing.assert_array_equal(reader.read(a, b), x[a:b])
    stop = rows - 7
    while stop > 0:  # as fill_state_before walks back
        start = (stop - 1) // band * band
        np.testing.assert_array_equal(reader.read(start, stop), x[start:stop])
        stop = start


COMPRESSORS = {
    "blosc-lz4-shuffle": BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
    "blosc-lz4-noshuffle": BloscCodec(cname="lz4", clevel=5, shuffle="noshuffle"),
    "blosc-zstd-shuffle": BloscCodec(cname="zstd", clevel=3, shuffle="shuffle"),
    "blosc-zstd-bitshuffle": BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle"),
    "zstd": ZstdCodec(level=0),
    "zstd-checksum": ZstdCodec(level=3, checksum=True),
    "none": None,
}


@pytest.mark.parametrize("name", list(COMPRESSORS))
@pytest.mark.parametrize(
    ("rows", "features", "chunks"),
    [(5000, 23, (1000, 23)), (4321, 23, (777, 7)), (3000, 5, (4096, 8))],
    ids=["whole-rows", "features-split", "chunk-wider-and-longer"],
)
def test_fast_path_equals_zarr(tmp_path: Path, name: str, rows: int, features: int, chunks) -> None:
    x = _data(rows, features, "float32")
    a = _array(tmp_path / "a.zarr", x, chunks, compressors=COMPRESSORS[name])
    with ParallelBandReader(a, threads=3) as r:
        assert r.fast, r.fallback_reason
        _check_all_reads(r, np.asarray(a[:]))


@pytest.mark.parametrize("dtype", ["float64", "float16", "int32", "int64", "uint16", "int8", "uint8"])
def test_dtypes(tmp_path: Path, dtype: str) -> None:
    x = _data(2500, 9, dtype)
    a = _array(tmp_path / "a.zarr", x, (600, 4), compressors=BloscCodec(cname="lz4", shuffle="shuffle"))
    with ParallelBandReader(a, threads=2, prefetch=1) as r:
        assert r.fast, r.fallback_reason
        got = _windows(r, x.shape[0])
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("fill", [0.0, np.nan, 7.5])
def test_missing_chunk_files_are_the_fill_value(tmp_path: Path, fill: float) -> None:
    x = _data(3000, 10, "float32")
    a = _array(tmp_path / "a.zarr", x, (700, 4), fill_value=fill)
    for key in ("c/1/0", "c/2/1", "c/4/2", "c/0/0"):
        (tmp_path / "a.zarr" / key).unlink()
    expect = np.asarray(zarr.open_array(str(tmp_path / "a.zarr"), mode="r")[:])
    assert np.isnan(expect[700:1400, :4]).all() if np.isnan(fill) else (expect[700:1400, :4] == fill).all()
    with ParallelBandReader(a, threads=2) as r:
        assert r.fast
        _check_all_reads(r, expect)


def _big_endian(path: Path, x: np.ndarray) -> zarr.Array:
    return _array(path, x, (500, 6), serializer=BytesCodec(endian="big"))


def _sharded(path: Path, x: np.ndarray) -> zarr.Array:
    return _array(path, x, (250, 6), shards=(1000, 6))


def _format2(path: Path, x: np.ndarray) -> zarr.Array:
    return _array(path, x, (500, 4), zarr_format=2)


def _memory(path: Path, x: np.ndarray) -> zarr.Array:
    a = zarr.create_array(zarr.storage.MemoryStore(), shape=x.shape, chunks=(500, 6), dtype=x.dtype)
    a[:] = x
    return a


def _filters(path: Path, x: np.ndarray) -> zarr.Array:
    return _array(path, x, (500, 6), compressors=(BloscCodec(cname="lz4"), ZstdCodec()))


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_big_endian, "endian"),
        (_sharded, "sharded"),
        (_format2, "format 2"),
        (_memory, "MemoryStore"),
        (_filters, "codecs"),
    ],
)
def test_other_layouts_fall_back_to_zarr_reads(tmp_path: Path, make, reason: str) -> None:
    x = _data(2300, 6, "float32")
    a = make(tmp_path / "a.zarr", x)
    assert reason in (fast_path_reason(a) or "")
    with ParallelBandReader(a, threads=2) as r:
        assert not r.fast and reason in r.fallback_reason
        _check_all_reads(r, x)
        assert r.bands_decoded > 0


def test_one_dimensional_and_stand_ins_fall_back(tmp_path: Path) -> None:
    t = np.arange(5000, dtype=np.int64)
    a = zarr.create_array(str(tmp_path / "t.zarr"), shape=t.shape, chunks=(1024,), dtype=t.dtype)
    a[:] = t
    r = ParallelBandReader(a)
    assert not r.fast and r.n_features == 1
    np.testing.assert_array_equal(r.read(1000, 3000), t[1000:3000])
    assert fast_path_reason(np.zeros((3, 3))) == "not a zarr array"


def test_each_band_decoded_once_in_a_forward_pass(tmp_path: Path) -> None:
    x = _data(10_000, 12, "float32")
    a = _array(tmp_path / "a.zarr", x, (1500, 5))
    for step in (1024, 1, 333, 4000):
        with ParallelBandReader(a, threads=2, prefetch=2) as r:
            np.testing.assert_array_equal(_windows(r, x.shape[0], step) if step > 1 else r.read(0, 10_000), x)
            assert r.bands_decoded == 7  # ceil(10000 / 1500)


def test_read_ahead_decodes_from_a_band_on_before_the_first_read(tmp_path: Path) -> None:
    x = _data(10_000, 12, "float32")
    a = _array(tmp_path / "a.zarr", x, (1500, 5))
    with ParallelBandReader(a, threads=2, prefetch=2) as r:
        r.read_ahead(4600)  # band 3, then 4 and 5 ahead
        assert r.bands_decoded == 3
        # a later band first, then the earlier one: both from the ring, nothing decoded again
        np.testing.assert_array_equal(r.read(7600, 8000), x[7600:8000])
        np.testing.assert_array_equal(r.read(4500, 6000), x[4500:6000])
        np.testing.assert_array_equal(r.read(6000, 10_000), x[6000:])
        assert r.bands_decoded == 7 - 3  # bands 3 to 6
        r.read_ahead(0)  # reading has begun: no effect
        assert r.bands_decoded == 4
        np.testing.assert_array_equal(r.read(0, 100), x[:100])  # a read behind the ring
        assert r.bands_decoded == 5


def test_a_store_source_hands_its_early_reader_to_a_run_that_asks_for_the_same(tmp_path: Path) -> None:
    src = write_store(tmp_path / "in.zarr", price_series(3000, 4), chunks=(1000, 4))
    source = engine.StoreSource(tsconv.open_input(src))
    early = source.early_reader()
    assert early is source.early_reader()
    assert source.open(device=None, pinned=False, hold=1, gpu=False, threads=None) is early
    early.close()
    other = source.early_reader()
    assert other is not early
    with source.open(device=None, pinned=False, hold=3, gpu=False, threads=None) as r:
        assert r is not other and r.hold == 3
    with pytest.raises(ValueError, match="closed"):  # closed when a run asks for another reader
        other.read(0, 1)
    last = source.early_reader()
    source.close()  # no run took it
    with pytest.raises(ValueError, match="closed"):
        last.read(0, 1)


def test_views_stay_valid_until_two_bands_further(tmp_path: Path) -> None:
    x = _data(6000, 4, "float32")
    a = _array(tmp_path / "a.zarr", x, (1000, 4))
    with ParallelBandReader(a, threads=2, prefetch=1) as r:  # ring of 3 bands
        v0 = r.read(0, 500)
        assert not v0.flags.owndata  # a view of the ring
        v1 = r.read(1200, 1300)  # band 1: band 0 is kept
        np.testing.assert_array_equal(v0, x[:500])
        np.testing.assert_array_equal(v1, x[1200:1300])
        spanning = r.read(1900, 2100)  # spans bands 1 and 2: a fresh array
        assert spanning.flags.owndata
        r.read(3000, 3100)  # band 3: band 0's slot is reused, band 2 is kept
        np.testing.assert_array_equal(spanning, x[1900:2100])
        np.testing.assert_array_equal(r.read(2000, 2500), x[2000:2500])
        np.testing.assert_array_equal(r.read(0, 100), x[:100])  # behind the ring: decoded again
    assert r.prefetch == 1


def test_pin_without_cuda_is_plain_memory(tmp_path: Path) -> None:
    x = _data(3000, 8, "float32")
    a = _array(tmp_path / "a.zarr", x, (1000, 8))
    with ParallelBandReader(a, pin=True, threads=1) as r:
        np.testing.assert_array_equal(_windows(r, 3000), x)
        import torch

        assert r.pinned == torch.cuda.is_available()


def _corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncated" else b"\x00garbage" * 40)


@pytest.mark.parametrize("how", ["truncated", "garbage"])
@pytest.mark.parametrize("compressor", ["blosc", "zstd", "none"])
def test_a_corrupt_chunk_is_a_store_error_like_block_reader(
    tmp_path: Path, how: str, compressor: str
) -> None:
    x = _data(4000, 6, "float32")
    codec = {"blosc": BloscCodec(cname="lz4"), "zstd": ZstdCodec(), "none": None}[compressor]
    a = _array(tmp_path / "a.zarr", x, (1000, 3), compressors=codec)
    _corrupt(tmp_path / "a.zarr" / "c" / "2" / "1", how)
    prefix = re.escape("cannot read rows 2,000..3,000 of in.zarr: ")
    with pytest.raises(StoreError, match=prefix):
        BlockReader(a, where="in.zarr").read(1500, 2500)
    with ParallelBandReader(a, threads=2, where="in.zarr") as r:
        np.testing.assert_array_equal(r.read(0, 1900), x[:1900])  # band 2 is being prefetched: no error yet
        with pytest.raises(StoreError, match=prefix + r"\w+(Error|Exception)?: .+; hint: "):
            r.read(1500, 2500)
        np.testing.assert_array_equal(r.read(3000, 4000), x[3000:])  # the other bands still read


@pytest.mark.parametrize("mmap", [True, False])
def test_a_blosc_chunk_cut_short_is_a_store_error_not_other_bytes(tmp_path: Path, mmap: bool) -> None:
    """c-blosc trusts the frame's header for its stored size: a chunk file that lost its last bytes was
    decoded from whatever lay past them (zeros of the mapping's last page, or the previous chunk's bytes in
    the read buffer), silently. Blosc at level 0 (``--compression none``) stores the values as they are."""
    from tsconv import config

    x = _data(4000, 6, "float32")
    a = _array(tmp_path / "a.zarr", x, (1000, 6), compressors=BloscCodec(cname="lz4", clevel=0))
    chunk = tmp_path / "a.zarr" / "c" / "2" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-96])  # the last four rows
    with config.override(mmap=mmap), ParallelBandReader(a, threads=1, prefetch=0, where="in.zarr") as r:
        np.testing.assert_array_equal(r.read(0, 2000), x[:2000])
        with pytest.raises(StoreError, match=r"rows 2,000..3,000 of in.zarr: .*cut short"):
            r.read(2000, 3000)


def test_corrupt_chunk_in_engine_is_a_store_error(tmp_path: Path) -> None:
    x = price_series(9000, 3, seed=1)
    src = write_store(tmp_path / "in.zarr", x, chunks=(4096, 3))
    _corrupt(src / "values" / "c" / "1" / "0", "garbage")
    with pytest.raises(StoreError, match=r"cannot read rows 4,096..8,192 of .*in\.zarr: "):
        tsconv.process(src, tmp_path / "out.zarr", chunk=1000)


class _PlainReader(BlockReader):
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


@pytest.mark.parametrize(("chunks", "chunk"), [((4096, 5), 1000), ((1500, 2), 1024), ((3000, 5), 5000)])
def test_engine_output_unchanged(tmp_path: Path, monkeypatch, chunks, chunk: int) -> None:
    x = price_series(12_345, 5, seed=3, nan_fraction=0.05)
    src = write_store(tmp_path / "in.zarr", x, chunks=chunks)
    pipe = {"conv": [{"filters": ["diff:1", "ma:16", "ema:32"]}, {"filters": ["ma:4"]}]}
    made: list = []

    def fast(array, **kw):
        made.append(ParallelBandReader(array, prefetch=1, **{**kw, "threads": 2}))
        return made[-1]

    monkeypatch.setattr(engine, "ParallelBandReader", fast)
    tsconv.process(src, tmp_path / "fast.zarr", pipeline=pipe, chunk=chunk)
    assert made[0].fast
    monkeypatch.setattr(
        engine, "ParallelBandReader", lambda array, **kw: _PlainReader(array, where=kw["where"])
    )
    tsconv.process(src, tmp_path / "zarr.zarr", pipeline=pipe, chunk=chunk)
    a, b = read_output(tmp_path / "fast.zarr"), read_output(tmp_path / "zarr.zarr")
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))  # bitwise, NaNs included


def test_a_reader_holding_bands_serves_adjacent_bands_as_one_view(tmp_path: Path) -> None:
    x = _data(12_000, 4, "float32")
    a = _array(tmp_path / "a.zarr", x, (1000, 4))
    with ParallelBandReader(a, threads=2, prefetch=2, hold=3) as r:  # ring of 2 + 1 + 3 = 6 bands
        assert r.ring_bands == 6
        v0 = r.read(0, 2000)  # bands 0-1, adjacent slots: one view, no copy
        assert not v0.flags.owndata and np.shares_memory(v0, r._ring)
        v1 = r.read(2000, 4000)  # bands 2-3: bands 0-1 are held
        assert not v1.flags.owndata
        np.testing.assert_array_equal(v0, x[:2000])
        np.testing.assert_array_equal(v1, x[2000:4000])
        r.read(4000, 4500)  # band 4: bands 1-3 held, band 0's slot reused
        np.testing.assert_array_equal(v1, x[2000:4000])
        wrap = r.read(5500, 6500)  # bands 5 and 6 lie in slots 5 and 0: across the wrap, a fresh array
        assert wrap.flags.owndata
        np.testing.assert_array_equal(wrap, x[5500:6500])
        four = r.read(6000, 10_000)  # bands 6-9 = hold + 1 bands in slots 0-3: a view
        assert not four.flags.owndata
        np.testing.assert_array_equal(four, x[6000:10_000])
        five = r.read(7000, 12_000)  # 5 bands, more than hold + 1: copied
        assert five.flags.owndata
        np.testing.assert_array_equal(five, x[7000:])


@pytest.mark.parametrize("hold", [1, 2])
def test_a_view_lives_until_a_read_reaches_hold_plus_one_bands_past_it(tmp_path: Path, hold: int) -> None:
    # the docstring said until a read *starts* that far: a read starting in the view's band and reaching
    # band 3 overwrote it (the rule the engines follow is where a read ends)
    x = _data(3000, 4, "float32")
    a = _array(tmp_path / "a.zarr", x, (500, 4))
    with ParallelBandReader(a, threads=2, prefetch=1, hold=hold) as r:
        v = r.read(0, 100)
        r.read(100, 500 * (hold + 1))  # reaches band hold: band 0 is kept
        np.testing.assert_array_equal(v, x[:100])
        np.testing.assert_array_equal(
            r.read(0, 100), x[:100]
        )  # band 0 again: from the ring or read behind it


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_blosc_chunk_cut_short_read_by_zarr_is_a_store_error_not_other_bytes(
    tmp_path: Path, zarr_format: int
) -> None:
    """The layouts zarr reads (zarr 2, which zarr-python 2 wrote with Blosc-LZ4 by default; others the native
    reader does not take): c-blosc decoded a file that lost its last bytes from the memory past them, so a
    run computed features of other numbers, without a word."""
    import numcodecs

    x = price_series(3000, 4, seed=2)
    g = zarr.open_group(str(tmp_path / "in.zarr"), mode="w", zarr_format=zarr_format)
    if zarr_format == 2:
        kw: dict = {"compressors": numcodecs.Blosc(cname="lz4", clevel=0)}
    else:
        kw = {"compressors": BloscCodec(cname="lz4", clevel=0), "chunk_key_encoding": {"name": "v2"}}
    g.create_array("values", data=x, chunks=(1000, 4), **kw)
    g.attrs["features"] = ["a", "b", "c", "d"]
    chunk = tmp_path / "in.zarr" / "values" / "1.0"
    chunk.write_bytes(chunk.read_bytes()[:-16])  # the last row
    assert fast_path_reason(zarr.open_group(str(tmp_path / "in.zarr"), mode="r")["values"]) is not None
    match = r"chunk file 1\.0 \(rows 1,000..1,999\): the Blosc frame declares \d+ stored bytes.*cut short"
    with pytest.raises(StoreError, match=match):
        tsconv.process(tmp_path / "in.zarr", tmp_path / "out.zarr", pipeline="trend_ema", device="cpu")


def test_a_shard_file_cut_short_with_its_index_first_is_a_store_error_not_other_bytes(tmp_path: Path) -> None:
    """zarr reads each inner chunk at the byte range the index (written first) gives: the last ones reached
    past the end of a shard file that lost its last bytes, and c-blosc decoded them from the memory there."""
    x = np.arange(3000 * 4, dtype=np.float32).reshape(3000, 4)
    g = zarr.open_group(str(tmp_path / "in.zarr"), mode="w")
    shards = {"shape": (1000, 4), "index_location": "start"}
    g.create_array(
        "values", data=x, chunks=(500, 4), shards=shards, compressors=BloscCodec(cname="lz4", clevel=0)
    )
    g.attrs["features"] = ["a", "b", "c", "d"]
    shard = tmp_path / "in.zarr" / "values" / "c" / "1" / "0"
    shard.write_bytes(shard.read_bytes()[:-16])  # the last row
    match = r"shard file c/1/0 \(rows 1,000..1,999\) holds \d+ bytes, less than its index says .*cut short"
    with pytest.raises(StoreError, match=match):
        tsconv.process(tmp_path / "in.zarr", tmp_path / "out.zarr", pipeline="trend_ema", device="cpu")
